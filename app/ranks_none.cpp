// qkgeom program — one process: the ranks of a program built without MPI
// (ranks.hpp; ranks_mpi.cpp is the MPI build's).
#include "ranks.hpp"

#include <atomic>

namespace qkgeom_app::ranks {

void start(int&, char**&) {}
void stop() {}
int rank() { return 0; }
int size() { return 1; }

struct hand_out::impl {
    std::size_t n;
    std::atomic<std::size_t> next{0};
};

hand_out::hand_out(std::size_t n) : p_(std::make_unique<impl>()) { p_->n = n; }
hand_out::~hand_out() = default;

std::optional<std::size_t> hand_out::next() {
    std::size_t const i = p_->next++;
    if (i < p_->n) return i;
    return std::nullopt;
}

std::vector<std::string> gather(std::string const& mine) { return {mine}; }
std::string broadcast(std::string const& s) { return s; }

}  // namespace qkgeom_app::ranks
