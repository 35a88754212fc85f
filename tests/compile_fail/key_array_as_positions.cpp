// Must not compile: a key array where the key positions belong. Neither the
// key vectors (an Eigen matrix) nor the key bucket array converts to
// qkgeom::token_positions (qkgeom/core/head.hpp): not in a token_rows aggregate,
// not by copy-initialisation, not even explicitly. The diagnostics name
// position_tag with the matrix, then with bucket_tag. With QKGEOM_CF_CONTROL
// the same statements with the key positions compile (so the failure is the
// intended one).
#include <qkgeom/core/head.hpp>

int main() {
    Eigen::MatrixXd const K = Eigen::MatrixXd::Zero(3, 2);  // key vectors
    qkgeom::token_positions const key_positions{0, 5, 9};
    qkgeom::token_buckets const key_buckets{0, 1, 2};
    qkgeom::example_ids const key_examples{0, 0, 1};
#ifdef QKGEOM_CF_CONTROL
    qkgeom::token_rows<Eigen::MatrixXd> const keys{K, key_positions, key_buckets, key_examples};
    qkgeom::token_positions const p = key_positions;
    qkgeom::token_positions const p2(key_positions);
#else
    qkgeom::token_rows<Eigen::MatrixXd> const keys{K, K, key_buckets, key_examples};
    qkgeom::token_positions const p = key_buckets;
    qkgeom::token_positions const p2(key_buckets);
#endif
    return static_cast<int>(keys.position.size() + p.size() + p2.size());
}
