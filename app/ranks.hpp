// qkgeom program — the processes of one run under mpirun (docs/scale.md).
//
// Built with MPI (CMake option QKGEOM_WITH_MPI, ranks_mpi.cpp) and started by
// mpirun, the program is N processes ("ranks"): every rank reads the input
// and analyses the heads (analyze) or runs (study) handed out to it, one at
// a time, by a counter on rank 0; rank 0 gathers every rank's results in
// plan order and alone writes the reports, so they are the same bytes for
// any N. Without MPI (ranks_none.cpp), or started without mpirun, the
// program is one process and every function below is the trivial one.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qkgeom_app::ranks {

/// Starts MPI when the program was launched by mpirun (the launcher's
/// environment says so) and was built with it; else nothing. Then pins the
/// instruction-set level of the kernels to the lowest any rank runs, so
/// that every rank computes the same bits (docs/scale.md#determinism).
void start(int& argc, char**& argv);
/// Ends MPI when start began it.
void stop();
/// This process's rank (0 without MPI).
int rank();
/// The number of ranks (1 without MPI).
int size();
/// "rank R of N" (for messages).
std::string name(int r);

/// Hands out the indices [0, n) across every rank and thread of the run,
/// each exactly once, in ascending order of request (a counter on rank 0
/// that every rank increments with one atomic operation). Collective:
/// every rank constructs and destroys it at the same point of the run.
class hand_out {
public:
    explicit hand_out(std::size_t n);
    ~hand_out();
    hand_out(hand_out const&) = delete;
    hand_out& operator=(hand_out const&) = delete;
    /// The next index, or std::nullopt when all are handed out (thread-safe).
    std::optional<std::size_t> next();

private:
    struct impl;
    std::unique_ptr<impl> p_;
};

/// Rank 0: every rank's `mine`, in rank order. The others: empty.
/// Collective.
std::vector<std::string> gather(std::string const& mine);
/// Every rank: rank 0's `s`. Collective.
std::string broadcast(std::string const& s);

/// Thrown on the ranks other than 0 when the run stops for a reason rank 0
/// reports: main returns `status` and prints nothing.
struct quiet_stop {
    int status;
};

/// What one rank's part of a phase ended with: nothing (`ok`), an
/// interruption, or an error (its message and, on rank 0, the exception).
struct outcome {
    int signal = 0;
    std::string error;
    std::exception_ptr thrown;
    bool ok() const { return signal == 0 && error.empty(); }
};
/// Runs `step`, catching what it throws into an outcome.
outcome attempt(std::function<void()> const& step);

/// Makes every rank agree on the outcomes of a phase (collective): when
/// every rank's is ok, returns; else rank 0 rethrows its own failure, or
/// throws run_error naming the first failed rank and its message (or
/// `interrupted`), and every other rank throws quiet_stop.
void agree(outcome const& mine);

/// A phase every rank takes part in: `step` runs on every rank, then agree.
inline void on_every_rank(std::function<void()> const& step) { agree(attempt(step)); }
/// A phase of rank 0 alone (checks of OUT, ...): the others wait for its verdict.
inline void on_rank_zero(std::function<void()> const& step) {
    agree(rank() == 0 ? attempt(step) : outcome{});
}

/// A phase whose results rank 0 gathers: `step` returns this rank's bytes;
/// rank 0 gets every rank's, in rank order, when every rank succeeded (else
/// as agree). The other ranks get an empty vector and are done.
std::vector<std::string> gather_results(std::function<std::string()> const& step);

}  // namespace qkgeom_app::ranks
