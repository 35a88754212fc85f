// One small head analysed end to end (moments, Householder model, plasticity
// with the empirical check): the numbers both test_package programs print, the
// header-only one and the one linked with qkgeom::compiled (compare_modes.cmake
// hands the first's to the second, which requires the same head).
#pragma once
#include <qkgeom/plasticity.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>

struct head_numbers {
    double ap_overall = 0, gaussian_gap = 0;
    long long n_pairs = 0;
};

// Prints "ap_overall n_pairs gaussian_gap" (into `out` too) and returns whether
// they are valid: AP in [0, 1], pairs counted, the empirical check run (finite gap).
inline bool print_head_check(head_numbers& out) {
    constexpr int n = 600, d = 32;
    std::mt19937_64 rng(20261125);
    std::normal_distribution<double> g;
    qkgeom::head_capture<Eigen::MatrixXd> head;
    head.id = {.layer = 1, .q_head = 2, .k_head = 0};
    head.facts.buckets = qkgeom::bucket_spec{.width = 100};
    head.queries.vectors.resize(n, d);
    head.keys.vectors.resize(n, d);
    for (int i = 0; i < n; ++i) {
        for (int l = 0; l < d; ++l) {
            head.queries.vectors(i, l) = g(rng) + (l == 0 ? 0.01 * i : 0.0);  // a positional drift
            head.keys.vectors(i, l) = g(rng) + (l == 0 ? 0.005 * i : 0.0);
        }
        head.queries.position.values().push_back(i);
        head.queries.bucket.values().push_back(i / 100);
        head.keys.position.values().push_back(i);
        head.keys.bucket.values().push_back(i / 100);
        head.keys.example_id.values().push_back(i / 300);  // two sequences
    }
    qkgeom::head_analysis const a = qkgeom::analyze_head(head);
    auto const& p = a.plasticity;
    out = {p.ap_overall, p.gaussian_gap, static_cast<long long>(p.n_pairs)};
    std::printf("%.17g %lld %.17g\n", out.ap_overall, out.n_pairs, out.gaussian_gap);
    return p.ap_overall >= 0 && p.ap_overall <= 1 && p.n_pairs > 0 && std::isfinite(p.gaussian_gap);
}
