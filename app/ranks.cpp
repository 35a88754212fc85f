// qkgeom program — how the ranks of a run agree (ranks.hpp): the part that is
// the same with and without MPI (ranks_mpi.cpp / ranks_none.cpp move the bytes).
#include "ranks.hpp"

#include "program.hpp"

#include <qkgeom/core/bytes.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace qkgeom_app::ranks {

namespace {

/// One rank's report of a phase (the bytes gathered on rank 0).
struct report {
    std::int32_t signal = 0;
    std::string error;
    std::string payload;
};

/// Rank 0's verdict over every rank's report: throws for the first failure
/// (its own first, then interruptions, then the lowest failed rank). The
/// verdict text broadcast to the others: "" when every rank succeeded.
std::string verdict_text(std::vector<report> const& all) {
    for (std::size_t r = 0; r < all.size(); ++r)
        if (all[r].signal != 0 || !all[r].error.empty()) return "stop";
    return "";
}

[[noreturn]] void throw_failure(outcome const& mine, std::vector<report> const& all) {
    if (!mine.ok() && mine.thrown) std::rethrow_exception(mine.thrown);
    for (auto const& r : all)
        if (r.signal != 0) throw interrupted{r.signal};
    for (std::size_t r = 0; r < all.size(); ++r)
        if (!all[r].error.empty()) throw run_error(name(static_cast<int>(r)) + ": " + all[r].error);
    throw run_error(name(0) + ": failed");
}

std::vector<report> gather_reports(outcome const& mine, std::string payload) {
    report me{mine.signal, mine.error, std::move(payload)};
    std::vector<report> all;
    for (auto const& b : gather(qkgeom::to_bytes(me))) all.push_back(qkgeom::from_bytes<report>(b));
    return all;
}

}  // namespace

std::string name(int r) { return "rank " + std::to_string(r) + " of " + std::to_string(size()); }

outcome attempt(std::function<void()> const& step) {
    outcome o;
    try {
        step();
    } catch (interrupted const& i) {
        o.signal = i.signal;
        o.thrown = std::current_exception();
    } catch (std::exception const& e) {
        o.error = e.what();
        if (o.error.empty()) o.error = "failed";
        o.thrown = std::current_exception();
    } catch (quiet_stop const&) {
        throw;
    }
    return o;
}

void agree(outcome const& mine) {
    if (size() == 1) {
        if (!mine.ok()) std::rethrow_exception(mine.thrown);
        return;
    }
    auto const all = gather_reports(mine, {});
    std::string const verdict = broadcast(rank() == 0 ? verdict_text(all) : std::string());
    if (verdict.empty()) return;
    if (rank() != 0) throw quiet_stop{1};
    throw_failure(mine, all);
}

std::vector<std::string> gather_results(std::function<std::string()> const& step) {
    if (size() == 1) return {step()};
    std::string payload;
    outcome const mine = attempt([&] { payload = step(); });
    auto all = gather_reports(mine, std::move(payload));
    if (rank() != 0) return {};
    if (!verdict_text(all).empty()) throw_failure(mine, all);
    std::vector<std::string> out;
    out.reserve(all.size());
    for (auto& r : all) out.push_back(std::move(r.payload));
    return out;
}

}  // namespace qkgeom_app::ranks
