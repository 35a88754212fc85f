// qkgeom program — the ranks of a run under mpirun (ranks.hpp), with MPI.
// Every MPI call is made under one mutex (MPI_THREAD_SERIALIZED): the
// analysis threads of a rank take their next head through hand_out.
#include "ranks.hpp"

#include <qkgeom/simd/dispatch.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <mutex>
#include <string>
#include <stdexcept>

namespace qkgeom_app::ranks {

namespace {

bool started = false;
int my_rank = 0, n_ranks = 1;
std::mutex mpi_mutex;

/// Whether a launcher (mpirun, srun) started this process as one of a job.
bool launched_by_mpi() {
    for (char const* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
        if (std::getenv(v) != nullptr) return true;  // NOLINT(concurrency-mt-unsafe): before any thread
    return false;
}

void check(int rc, char const* what) {
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        throw std::runtime_error(std::string("MPI: ") + what + " failed on " + name(my_rank) + ": " + std::string(text, len));
    }
}

constexpr std::size_t chunk = std::size_t{1} << 30;  // bytes per message (MPI counts are int)

void send_bytes(std::string const& b, int to) {
    auto const n = static_cast<std::uint64_t>(b.size());
    check(MPI_Send(&n, 1, MPI_UINT64_T, to, 1, MPI_COMM_WORLD), "MPI_Send");
    for (std::size_t at = 0; at < b.size(); at += chunk)
        check(MPI_Send(b.data() + at, static_cast<int>(std::min(chunk, b.size() - at)), MPI_BYTE, to, 2,
                       MPI_COMM_WORLD),
              "MPI_Send");
}

std::string receive_bytes(int from) {
    std::uint64_t n = 0;
    check(MPI_Recv(&n, 1, MPI_UINT64_T, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    std::string b(static_cast<std::size_t>(n), '\0');
    for (std::size_t at = 0; at < b.size(); at += chunk)
        check(MPI_Recv(b.data() + at, static_cast<int>(std::min(chunk, b.size() - at)), MPI_BYTE, from, 2,
                       MPI_COMM_WORLD, MPI_STATUS_IGNORE),
              "MPI_Recv");
    return b;
}

/// Every rank runs the lowest instruction-set level any rank supports: the
/// kernels' bits then cannot depend on which rank analysed a head.
void pin_isa() {
    int const mine = static_cast<int>(qkgeom::simd::active());
    int lowest = mine, highest = mine;
    check(MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
    check(MPI_Allreduce(&mine, &highest, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    auto const level = static_cast<qkgeom::simd::isa>(lowest);
    qkgeom::simd::set_limit(level);
    if (my_rank == 0 && lowest != highest)
        std::cerr << "qkgeom: note: the ranks run different instruction-set levels (" << qkgeom::simd::isa_name(level)
                  << " to " << qkgeom::simd::isa_name(static_cast<qkgeom::simd::isa>(highest))
                  << "): every rank uses " << qkgeom::simd::isa_name(level) << "\n";
}

}  // namespace

void start(int& argc, char**& argv) {
    if (!launched_by_mpi()) return;
    int provided = 0;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    started = true;
    if (provided < MPI_THREAD_SERIALIZED)
        throw std::runtime_error("MPI: this MPI library does not offer MPI_THREAD_SERIALIZED (the analysis threads of a rank "
                        "take their heads through MPI); run with -j 1 or use an MPI built with thread support");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &my_rank), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &n_ranks), "MPI_Comm_size");
    pin_isa();
}

void stop() {
    if (started) MPI_Finalize();
    started = false;
}

int rank() { return my_rank; }
int size() { return n_ranks; }

struct hand_out::impl {
    std::size_t n = 0;
    MPI_Win win = MPI_WIN_NULL;
    std::uint64_t* counter = nullptr;
    std::atomic<std::size_t> local{0};  // one process: no window
};

hand_out::hand_out(std::size_t n) : p_(std::make_unique<impl>()) {
    p_->n = n;
    if (n_ranks == 1) return;
    std::lock_guard lock(mpi_mutex);
    MPI_Aint const bytes = my_rank == 0 ? MPI_Aint(sizeof(std::uint64_t)) : 0;
    check(MPI_Win_allocate(bytes, sizeof(std::uint64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &p_->counter, &p_->win),
          "MPI_Win_allocate");
    if (my_rank == 0) *p_->counter = 0;
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    check(MPI_Win_lock_all(0, p_->win), "MPI_Win_lock_all");
}

hand_out::~hand_out() {
    if (p_->win == MPI_WIN_NULL) return;
    std::lock_guard lock(mpi_mutex);
    MPI_Win_unlock_all(p_->win);
    MPI_Win_free(&p_->win);  // collective: every rank has taken its last index
}

std::optional<std::size_t> hand_out::next() {
    if (p_->win == MPI_WIN_NULL) {
        std::size_t const i = p_->local++;
        if (i < p_->n) return i;
        return std::nullopt;
    }
    std::uint64_t const one = 1;
    std::uint64_t got = 0;
    {
        std::lock_guard lock(mpi_mutex);
        check(MPI_Fetch_and_op(&one, &got, MPI_UINT64_T, 0, 0, MPI_SUM, p_->win), "MPI_Fetch_and_op");
        check(MPI_Win_flush(0, p_->win), "MPI_Win_flush");
    }
    if (got < p_->n) return static_cast<std::size_t>(got);
    return std::nullopt;
}

std::vector<std::string> gather(std::string const& mine) {
    if (n_ranks == 1) return {mine};
    std::lock_guard lock(mpi_mutex);
    if (my_rank != 0) {
        send_bytes(mine, 0);
        return {};
    }
    std::vector<std::string> all{mine};
    for (int r = 1; r < n_ranks; ++r) all.push_back(receive_bytes(r));
    return all;
}

std::string broadcast(std::string const& s) {
    if (n_ranks == 1) return s;
    std::lock_guard lock(mpi_mutex);
    if (my_rank == 0) {
        for (int r = 1; r < n_ranks; ++r) send_bytes(s, r);
        return s;
    }
    return receive_bytes(0);
}

}  // namespace qkgeom_app::ranks
