// qkgeom Python extension (qkgeom._qkgeom) — declarations shared by its
// translation units (docs/python.md). The heavy engines are instantiated once,
// in the compiled part the module links (qkgeom::compiled, docs/building.md
// "Compile model"); every unit sees them as extern.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/float16.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/stats/moments.hpp>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace qkgeom_py {

namespace py = pybind11;

/// \brief A 2-D NumPy array of rows read in place (never copied): f64, f32,
/// f16, or bf16 bits (int16/uint16 tagged "bf16"), any strides. One type for
/// every dtype, so each analysis is instantiated once; the dtype is
/// dispatched once per row (the row loop itself is matrix_view's).
/// A plain view (copied freely while the GIL is released): the caller keeps
/// the array alive (`held<array_rows>`).
class array_rows {
public:
    using views = std::variant<qkgeom::matrix_view<double>, qkgeom::matrix_view<float>,
                               qkgeom::matrix_view<qkgeom::float16>, qkgeom::matrix_view<qkgeom::bfloat16>>;
    array_rows() = default;
    explicit array_rows(views v) : v_(v) {}

    [[nodiscard]] qkgeom::index_t rows() const noexcept {
        return std::visit([](auto const& m) { return m.rows(); }, v_);
    }
    [[nodiscard]] qkgeom::index_t cols() const noexcept {
        return std::visit([](auto const& m) { return m.cols(); }, v_);
    }
    [[nodiscard]] std::string_view dtype() const noexcept {
        return std::visit([](auto const& m) { return m.dtype(); }, v_);
    }
    void read_row(qkgeom::index_t i, double* out) const noexcept {
        std::visit([&](auto const& m) { m.read_row(i, out); }, v_);
    }

private:
    views v_;
};

/// \brief A 1-D NumPy integer array (int64 or int32, any stride) read in
/// place; a plain view like array_rows.
class array_indices {
public:
    array_indices() = default;
    array_indices(void const* data, qkgeom::index_t size, qkgeom::index_t stride, bool is64)
        : data_(data), size_(size), stride_(stride), is64_(is64) {}
    [[nodiscard]] qkgeom::index_t size() const noexcept { return size_; }
    [[nodiscard]] std::int64_t operator[](qkgeom::index_t i) const noexcept {
        return is64_ ? static_cast<std::int64_t const*>(data_)[i * stride_]
                     : static_cast<std::int64_t>(static_cast<std::int32_t const*>(data_)[i * stride_]);
    }

private:
    void const* data_ = nullptr;
    qkgeom::index_t size_ = 0, stride_ = 1;
    bool is64_ = true;
};

/// \brief A view with the array that owns its buffer (the owner is held, with
/// the GIL, for as long as the view is used).
template <class View>
struct held {
    py::object owner;
    View view;
};

// --- locks (arrays.cpp) --------------------------------------------------------

/// \brief The lock of a C++ object that bound methods modify or read with the
/// GIL released (HeadMoments): two Python threads using one object are
/// serialised, different objects run in parallel (a table of striped mutexes).
std::mutex& object_lock(void const* object) noexcept;
/// \brief Locks of two objects at once, without deadlock (one lock when they share a stripe).
class pair_lock {
public:
    pair_lock(void const* a, void const* b);
    pair_lock(pair_lock const&) = delete;
    pair_lock& operator=(pair_lock const&) = delete;
    ~pair_lock();

private:
    std::mutex* first_;
    std::mutex* second_;
};

// --- conversions (arrays.cpp) ------------------------------------------------

/// Rows from a NumPy array, a (array, dtype_tag) pair or anything
/// qkgeom._arrays.as_rows accepts (torch CPU tensors). `name` is the
/// argument's name in messages (TypeError / ValueError naming dtype and shape).
held<array_rows> rows_of(py::handle x, std::string_view name);
/// An integer vector (int64/int32 array in place; torch tensors and
/// sequences through qkgeom._arrays.as_indices). `name` as above.
held<array_indices> indices_of(py::handle x, std::string_view name);
/// The values of an integer vector, copied (head_capture's owning arrays).
std::vector<std::int64_t> index_values(py::handle x, std::string_view name);
/// An owning 1-D int64 NumPy array holding `v` (moved, no copy).
py::array_t<std::int64_t> to_numpy(std::vector<std::int64_t>&& v);
/// An owning n x d float64 NumPy array holding `m` (moved, no copy).
py::array_t<double> to_numpy(qkgeom::row_matrix&& m);

/// "query"/"q" -> kind::query, "key"/"k" -> kind::key; ValueError naming `name` otherwise.
qkgeom::kind kind_of(std::string_view s, std::string_view name = "kind");
/// "uniform" | "log" | "all".
qkgeom::bucket_scheme scheme_of(std::string_view s);
/// "full_attention_only" | "all_layers".
qkgeom::layer_eligibility eligibility_of(std::string_view s);

// --- validation (bind_options.cpp): the program's checks (qkgeom/core/validate.hpp) -------

/// ValueError "where: Options.<name> = <value>: expected <range>" when an
/// option is outside its documented range or low > high (NaN refused).
void check_options(qkgeom::analysis_options const& o, std::string_view where);
/// `jobs` (0: every core, else 1..4096), `context` (0..2^62; 0 = the capture's)
/// and `window` (0..2^62; `none_value` = the capture's) as the program's
/// -j, --context and --window (qkgeom/core/validate.hpp): ValueError naming
/// `where`, the argument and its range.
unsigned checked_run_args(std::string_view where, std::int64_t jobs, std::int64_t context, std::int64_t window,
                          std::int64_t none_value);
/// The options given (or the defaults), checked as check_options.
qkgeom::analysis_options options_or_default(std::optional<qkgeom::analysis_options> const& o, std::string_view where);

// --- interruption (KeyboardInterrupt) -------------------------------------------

/// Thrown by a head analyzer at a safe point (a head's start) once a signal
/// has arrived: not a std::exception, so the libraries' per-head handlers
/// (which record a std::exception as the head's failure) let it through and
/// the run unwinds as the program's does on SIGINT.
struct stop_requested {};

/// \brief Runs `work()` (GIL released, on a worker thread) while the calling
/// thread waits, taking the GIL every 50 ms to run Python's signal handlers
/// (PyErr_CheckSignals). When a handler raises (Ctrl-C: KeyboardInterrupt),
/// `stop` is set, so the work's safe points throw stop_requested and the heads
/// in progress end; then that exception is raised and the result dropped.
/// Otherwise returns work()'s result, or rethrows what it threw. Only the
/// main thread runs signal handlers: called from another thread it just waits.
template <class F>
auto run_interruptible(std::atomic<bool>& stop, F&& work) -> decltype(work()) {
    using result_t = decltype(work());
    std::optional<result_t> result;
    std::exception_ptr failure;
    std::optional<py::error_already_set> raised;
    {
        py::gil_scoped_release nogil;
        std::mutex mu;
        std::condition_variable cv;
        bool done = false;
        std::thread worker([&] {
            try {
                result.emplace(work());
            } catch (...) {
                failure = std::current_exception();
            }
            std::lock_guard lock(mu);
            done = true;
            cv.notify_all();
        });
        for (;;) {
            std::unique_lock lock(mu);
            if (cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; })) break;
            lock.unlock();
            if (raised) continue;
            py::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() != 0) {
                raised.emplace();  // fetches the exception (KeyboardInterrupt)
                stop = true;
            }
        }
        worker.join();
    }
    if (raised) throw std::move(*raised);
    if (failure) std::rethrow_exception(failure);
    return std::move(*result);
}

/// MemoryError "what: out of memory (...)" in place of a bare std::bad_alloc.
[[noreturn]] void out_of_memory(std::string const& what);

// --- the analyses over zero-copy rows (analysis_rows.cpp; the caller
// releases the GIL) -----------------------------------------------------------

/// analyze_head(head_capture) over zero-copy rows.
qkgeom::head_analysis analyze_rows(qkgeom::head_capture<array_rows, array_rows> const& head,
                                   qkgeom::analysis_options const& opt);
/// analyze_head(head_moments, keys, facts) over zero-copy key rows.
qkgeom::head_analysis analyze_moment_rows(qkgeom::head_moments const& hm, qkgeom::token_rows<array_rows> const& keys,
                                          qkgeom::capture_facts const& facts, qkgeom::analysis_options const& opt);
/// analyze_rows over views of a head's row-major double rows (no copy; reading
/// a row is the same memcpy as from the row_matrix itself): the analyzer of
/// analyze_dataset and run_study, so the library's default analyzer
/// (analyze_head on row_matrix) is never instantiated in the module
/// (bind_dataset.cpp).
qkgeom::head_analysis analyze_matrix_head(qkgeom::head_capture<qkgeom::row_matrix> const& h,
                                          qkgeom::analysis_options const& opt);
/// analyze_matrix_head with a safe point before each head: throws
/// stop_requested once `stop` is set (run_interruptible). `stop` outlives it.
std::function<qkgeom::head_analysis(qkgeom::head_capture<qkgeom::row_matrix> const&, qkgeom::analysis_options const&)>
interruptible_analyzer(std::atomic<bool> const& stop);

// --- registration, one per translation unit --------------------------------
void bind_errors(py::module_& m);
void bind_moments(py::module_& m);
void bind_sampler(py::module_& m);
void bind_options(py::module_& m);
void bind_analysis(py::module_& m);
void bind_analyze(py::module_& m);
void bind_io(py::module_& m);
void bind_dataset(py::module_& m);
void bind_study(py::module_& m);

}  // namespace qkgeom_py
