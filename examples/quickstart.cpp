#include <qkgeom/plasticity.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <utility>
#include <vector>

int main() {
    // Your own post-RoPE rows of one head (d = 64): 8 examples of 1,024 tokens, a query
    // row per token and a key row per 4th token. Any tensor type works (Eigen here).
    int const d = 64, examples = 8, tokens = 1024, key_every = 4;
    qkgeom::bucket_spec const buckets{.scheme = qkgeom::bucket_scheme::all, .width = 128};
    Eigen::MatrixXf q(examples * tokens, d), k(examples * tokens / key_every, d);
    std::vector<std::int64_t> q_pos, q_bucket, k_pos, k_bucket, k_example;
    std::mt19937 rng(1);
    std::normal_distribution<float> content(0.0f, 1.0f);
    for (int e = 0; e < examples; ++e)
        for (int t = 0; t < tokens; ++t) {
            auto const i = static_cast<Eigen::Index>(q_pos.size());
            for (int j = 0; j < d; ++j) q(i, j) = content(rng);
            q(i, 0) += 2.0f;  // planted: the queries lean on coordinate 0 (mean 2) ...
            q_pos.push_back(t);
            q_bucket.push_back(qkgeom::bucket_of(buckets, t));
            if (t % key_every != 0) continue;
            auto const r = static_cast<Eigen::Index>(k_pos.size());
            for (int j = 0; j < d; ++j) k(r, j) = content(rng);
            k(r, 0) += 0.01f * static_cast<float>(t);  // ... and the keys drift along it with position
            k_pos.push_back(t);
            k_bucket.push_back(qkgeom::bucket_of(buckets, t));
            k_example.push_back(e);
        }

    // One head as one value: its identity, its capture facts, and the rows of each kind
    // with typed annotations (positions, buckets and example ids cannot be swapped).
    qkgeom::head_capture<Eigen::MatrixXf> const head{
        .id = {.layer = 3, .q_head = 5, .k_head = 1},
        .facts = {.buckets = buckets, .context_length = tokens, .rope = std::nullopt},  // no RoPE recorded
        .queries = {std::move(q), qkgeom::token_positions(std::move(q_pos)),
                    qkgeom::token_buckets(std::move(q_bucket)), {}},  // query example ids: optional
        .keys = {std::move(k), qkgeom::token_positions(std::move(k_pos)),
                 qkgeom::token_buckets(std::move(k_bucket)), qkgeom::example_ids(std::move(k_example))}};
    qkgeom::head_analysis const h = qkgeom::analyze_head(head);  // PCA, rotation, Householder, plasticity ...

    std::printf("bias_strength %.4f (planted 2 x 0.01 = 0.02), position_r %.3f\n", h.rotation.bias_strength,
                h.rotation.position_r);
    std::printf("ap_overall %.3f, ap_drop %.3f, taxonomy %s, flags '%s'\n", h.plasticity.ap_overall,
                h.plasticity.ap_drop, qkgeom::to_string(h.pca.taxonomy).data(),
                qkgeom::head_flags_text(h).c_str());
    bool const bias_found = std::abs(h.rotation.bias_strength - 0.02) < 0.002;
    return bias_found && h.flags == 0 && std::isfinite(h.plasticity.ap_drop) ? 0 : 1;
}
