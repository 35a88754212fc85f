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
#include <new>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

namespace qkgeom {

/// \brief A source of task indices: the next index to work on, or
/// std::nullopt when none is left. Called concurrently by the workers of
/// `parallel_for_handed`; it must be thread-safe.
using task_source = std::function<std::optional<std::size_t>()>;

/// \brief Runs `work(i)` for every index `next()` hands out, on up to `jobs`
/// threads (the calling thread is one of them; jobs = 0 means 1), one task
/// at a time per thread. The source decides which indices this process
/// works on: the program under mpirun hands the heads of a run out across
/// processes with it (docs/scale.md). After the first exception no new task
/// is taken; the exception is rethrown once all threads have stopped.
/// \param[in] jobs the most threads to use, including the caller; 0 means 1.
/// \param[in] most the most tasks the source can hand out (no more threads
/// than that are started).
/// \param[in] next the source of indices.
/// \param[in] work the task body; it must be safe to call concurrently.
/// \throws whatever the first failing `work(i)` or `next()` threw. When an
/// extra thread cannot be started (std::system_error), the loop goes on with
/// the threads already started (at least the caller).
inline void parallel_for_handed(unsigned jobs, std::size_t most, task_source const& next,
                                std::function<void(std::size_t)> const& work) {
    std::atomic<bool> stop{false};
    std::exception_ptr err;
    std::mutex em;
    auto worker = [&] {
        while (!stop) {
            try {
                auto const i = next();
                if (!i) return;
                work(*i);
            } catch (...) {
                std::lock_guard lock(em);
                if (!err) err = std::current_exception();
                stop = true;
            }
        }
    };
    std::vector<std::thread> pool;
    std::size_t const want = std::min<std::size_t>(std::max(jobs, 1U), most);
    try {
        pool.reserve(want > 0 ? want - 1 : 0);
        for (std::size_t t = 1; t < want; ++t) pool.emplace_back(worker);
    } catch (std::system_error const&) {
        // fewer threads than asked for: the started ones and the caller share the work
    } catch (std::bad_alloc const&) {
    }
    if (most > 0) worker();
    for (auto& t : pool) t.join();
    if (err) std::rethrow_exception(err);
}

/// \brief Runs `work(i)` for every i in [0, n) on up to `jobs` threads (the
/// calling thread is one of them; jobs = 0 means 1). Tasks are taken in
/// ascending order, one at a time, so a worker holds one task's memory.
/// After the first exception no new task starts; the exception is rethrown
/// once all threads have stopped. Catch inside `work` to keep going instead.
/// \param[in] n number of tasks; n = 0 runs nothing.
/// \param[in] jobs the most threads to use, including the caller; 0 means 1.
/// Never more than n threads are started.
/// \param[in] work the task body, called once per index; it must be safe to
/// call concurrently from several threads.
/// \throws whatever the first failing `work(i)` threw (rethrown unchanged).
/// When an extra thread cannot be started (std::system_error), the loop goes
/// on with the threads already started (at least the caller): the work is
/// done with fewer threads, nothing is lost and nothing terminates.
inline void parallel_for(std::size_t n, unsigned jobs, std::function<void(std::size_t)> const& work) {
    std::atomic<std::size_t> counter{0};
    parallel_for_handed(jobs, n, [&]() -> std::optional<std::size_t> {
        std::size_t const i = counter++;
        if (i < n) return i;
        return std::nullopt;
    }, work);
}

}  // namespace qkgeom
