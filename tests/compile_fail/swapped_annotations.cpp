// Must not compile: the bucket array in the position slot (and the position
// array in the bucket slot) of a head's rows. Positions, buckets and example
// ids are distinct types (qkgeom/core/head.hpp), so swapped arrays are a compile
// error, for token_rows and for a whole head_capture. The diagnostic names
// both meanings (bucket_tag, position_tag). With QKGEOM_CF_CONTROL the same
// aggregates in the right order compile (so the failure is the intended one).
#include <qkgeom/core/head.hpp>

int main() {
    Eigen::MatrixXd const X = Eigen::MatrixXd::Zero(3, 2);
    qkgeom::token_positions const positions{0, 5, 9};
    qkgeom::token_buckets const buckets{0, 1, 2};
    qkgeom::example_ids const examples{0, 0, 1};
    qkgeom::capture_facts const facts;
#ifdef QKGEOM_CF_CONTROL
    qkgeom::token_rows<Eigen::MatrixXd> const rows{X, positions, buckets, examples};
    qkgeom::head_capture<Eigen::MatrixXd> const head{{0, 1, 0}, facts, {X, positions, buckets, {}}, rows};
#else
    qkgeom::token_rows<Eigen::MatrixXd> const rows{X, buckets, positions, examples};
    qkgeom::head_capture<Eigen::MatrixXd> const head{{0, 1, 0}, facts, {X, buckets, positions, {}}, rows};
#endif
    return static_cast<int>(rows.position.size() + head.queries.bucket.size());
}
