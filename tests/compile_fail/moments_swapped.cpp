// Must not compile: the streaming accumulator given a bucket array where the
// positions belong and a position array where the buckets belong (the typed
// arrays of qkgeom/core/head.hpp). Plain integer vectors stay accepted there; a
// typed array of the other meaning is a compile error naming the argument.
// With QKGEOM_CF_CONTROL the same call in the right order compiles.
#include <qkgeom/stats/moments.hpp>

int main() {
    Eigen::MatrixXd const X = Eigen::MatrixXd::Ones(3, 2);
    qkgeom::token_positions const positions{0, 5, 9};
    qkgeom::token_buckets const buckets{0, 1, 2};
    qkgeom::head_moments hm(2);
#ifdef QKGEOM_CF_CONTROL
    hm.add(qkgeom::kind::query, X, positions, buckets);
#else
    hm.add(qkgeom::kind::query, X, buckets, positions);
#endif
    return static_cast<int>(hm.q.count());
}
