// qkgeom — stopping a long analysis from outside: a caller that may want to
// stop (Ctrl-C in Python, a signal in a program) sets a flag; the analysis
// checks it at its safe points and throws qkgeom::cancelled.
//
//   std::atomic<bool> stop{false};          // set from another thread
//   {
//       qkgeom::scoped_cancel guard(stop);  // this thread's analyses watch `stop`
//       auto r = qkgeom::analyze_head(head);  // throws qkgeom::cancelled once stop is set
//   }
//
// The safe points: analyze_head between its stages (closed forms,
// diagnostics, plasticity, ranks, RoPE bands), attention plasticity before
// each query bucket, the rank analysis before each query bucket. So a head
// stops within one bucket's work, never mid-way through a result. The flag
// is watched per thread (a thread_local pointer set by scoped_cancel): the
// threads an analysis starts itself (analyze_dataset's workers) install
// their own guard.
#pragma once

#include <atomic>
#include <stdexcept>

namespace qkgeom {

/// \brief Thrown at a safe point of an analysis once the flag of the
/// innermost scoped_cancel of its thread is set.
struct cancelled : std::runtime_error {
    cancelled() : std::runtime_error("qkgeom: analysis cancelled (its stop flag was set)") {}
};

namespace detail {
/// The flag the analyses of this thread watch (nullptr: none).
inline std::atomic<bool> const*& cancel_slot() noexcept {
    thread_local std::atomic<bool> const* slot = nullptr;
    return slot;
}
}  // namespace detail

/// \brief While alive, the analyses run by this thread check `flag` at their
/// safe points (check_cancelled); scopes nest (the innermost wins).
class scoped_cancel {
public:
    /// \param[in] flag the stop flag; it must outlive the scope.
    explicit scoped_cancel(std::atomic<bool> const& flag) noexcept : previous_(detail::cancel_slot()) {
        detail::cancel_slot() = &flag;
    }
    scoped_cancel(scoped_cancel const&) = delete;
    scoped_cancel& operator=(scoped_cancel const&) = delete;
    ~scoped_cancel() { detail::cancel_slot() = previous_; }

private:
    std::atomic<bool> const* previous_;
};

/// \brief A safe point: throws qkgeom::cancelled when this thread's flag is
/// set; otherwise nothing (one thread-local load and one relaxed atomic load).
/// \throws qkgeom::cancelled
inline void check_cancelled() {
    auto const* f = detail::cancel_slot();
    if (f != nullptr && f->load(std::memory_order_relaxed)) throw cancelled();
}

}  // namespace qkgeom
