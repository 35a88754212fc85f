// qkgeom — the one scheduling loop used to analyse many heads at once: each
// head is an independent task (method §1: heads share nothing), handed out
// dynamically to `jobs` threads. Used by the `qkgeom` program and the
// whole-model benchmarks, so both measure the same thing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qkgeom {

/// \brief Runs `work(i)` for every i in [0, n) on up to `jobs` threads (the
/// calling thread is one of them; jobs = 0 means 1). Tasks are taken in
/// ascending order, one at a time, so a worker holds one task's memory.
/// After the first exception no new task starts; the exception is rethrown
/// once all threads have stopped. Catch inside `work` to keep going instead.
inline void parallel_for(std::size_t n, unsigned jobs, std::function<void(std::size_t)> const& work) {
    std::atomic<std::size_t> next{0};
    std::exception_ptr err;
    std::mutex em;
    auto worker = [&] {
        for (std::size_t i = next++; i < n; i = next++) {
            try {
                work(i);
            } catch (...) {
                std::lock_guard lock(em);
                if (!err) err = std::current_exception();
                next = n;
            }
        }
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < std::min<std::size_t>(std::max(jobs, 1U), n); ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    if (err) std::rethrow_exception(err);
}

}  // namespace qkgeom
