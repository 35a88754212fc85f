#include <qkgeom/plasticity.hpp>

#include <cstdio>
#include <vector>

int main() {
    // 2,000 query rows of a d = 64 head: any tensor type works (Eigen here).
    Eigen::MatrixXf q = Eigen::MatrixXf::Random(2000, 64);
    std::vector<int> position(2000), bucket(2000);
    for (int i = 0; i < 2000; ++i) {
        position[i] = i;
        bucket[i] = i / 128;  // uniform buckets of width 128
        q(i, 0) += 0.01f * static_cast<float>(i);  // a positional drift on coordinate 0
    }
    qkgeom::head_moments head(64, {.layer = 3, .q_head = 5, .k_head = 1});
    head.add(qkgeom::kind::query, q, position, bucket);  // stream, shard, merge...
    qkgeom::moments const all = head.q.pooled();
    Eigen::VectorXd const beta = all.cov_xt() / all.var_t();  // OLS slope per coordinate (method §4)
    std::printf("buckets %zu, rows %lld, beta[0] = %.4f\n", head.q.buckets.size(),
                static_cast<long long>(all.n), beta(0));
    return beta(0) > 0.009 && beta(0) < 0.011 ? 0 : 1;
}
