// Runtime tests of the bucket schemes and deterministic capture sampling
// (method §0.1, core/buckets.hpp) and of the synthetic GQA layer generator
// (capture/synthetic.hpp): planted structure, its ground truth, and that sample
// estimates computed here with plain Eigen approach the truth within stated
// sampling bounds.
#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/core/buckets.hpp>

#include <catch2/catch.hpp>

#include "test_util.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_synthetic_test {

using qkgeom_test::invalid_argument_of;

namespace {

namespace syn = qkgeom::synthetic;
using qkgeom::bucket_scheme;
using qkgeom::bucket_spec;
using qkgeom::index_t;
using qkgeom::kind;

// --- independent re-implementation of the documented keep hash (docs/buckets.md) ---
std::uint64_t ref_splitmix(std::uint64_t x) {
    std::uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

std::uint64_t ref_hash(std::uint64_t seed, std::int64_t e, std::int64_t layer, int k, std::int64_t t) {
    std::uint64_t h = ref_splitmix(seed);
    for (std::uint64_t v : {static_cast<std::uint64_t>(e), static_cast<std::uint64_t>(layer),
                            static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(t)})
        h = ref_splitmix(h ^ v);
    return h;
}

// --- naive bucket reference: loops instead of bit tricks ---
std::int64_t ref_bucket(bucket_spec const& s, std::int64_t t) {
    if (s.scheme != bucket_scheme::log) return t / s.width;
    std::int64_t i_min = 0;
    while ((std::int64_t{1} << i_min) < s.width) ++i_min;  // smallest i with 2^i >= B_min
    std::int64_t i = 0;
    while (((t + 1) >> (i + 1)) != 0) ++i;  // largest i with 2^i <= t + 1
    return std::max(i_min, i);
}

/// OLS of every column of x on t: slope, intercept, standard error of the
/// slope s_j/√Sxx with s_j² = Σ e²/(n−2).
struct ols_fit {
    Eigen::VectorXd slope, intercept, se_slope, resid_var;
    double mean_t = 0, sxx = 0;
    index_t n = 0;
};

ols_fit ols(Eigen::MatrixXd const& x, std::vector<std::int64_t> const& pos) {
    ols_fit f;
    f.n = x.rows();
    Eigen::VectorXd t(f.n);
    for (index_t i = 0; i < f.n; ++i) t(i) = static_cast<double>(pos[static_cast<std::size_t>(i)]);
    f.mean_t = t.mean();
    Eigen::VectorXd const tc = t.array() - f.mean_t;
    f.sxx = tc.squaredNorm();
    Eigen::RowVectorXd const xbar = x.colwise().mean();
    Eigen::MatrixXd const xc = x.rowwise() - xbar;
    f.slope = xc.transpose() * tc / f.sxx;
    f.intercept = xbar.transpose() - f.slope * f.mean_t;
    Eigen::MatrixXd const e = xc - tc * f.slope.transpose();
    f.resid_var = e.colwise().squaredNorm().transpose() / static_cast<double>(f.n - 2);
    f.se_slope = (f.resid_var / f.sxx).cwiseSqrt();
    return f;
}

double max_abs(Eigen::MatrixXd const& m) { return m.cwiseAbs().maxCoeff(); }

/// A one-pair layer with mixing, a ramped noise and non-trivial bucket means.
syn::layer_spec test_layer(index_t d = 32, index_t rd = 16) {
    syn::layer_spec L;
    L.d = d;
    L.rotary_dims = rd;
    L.mix = true;
    L.n_q_heads = 1;
    L.n_kv_heads = 1;
    L.layer = 3;
    L.model_seed = 11;
    syn::q_head_params q = syn::default_q_head();
    q.query.noise_sd_ramp = 0.5;
    q.query.centroid = Eigen::VectorXd::LinSpaced(d - rd, -1.0, 1.0);
    syn::kv_head_params k = syn::default_kv_head();
    k.key.centroid = Eigen::VectorXd::Constant(d - rd, 0.3);
    k.drift = Eigen::VectorXd::LinSpaced(d - rd, 1.0, 2.0);
    L.q_heads = {q};
    L.kv_heads = {k};
    return L;
}

}  // namespace

// ===========================================================================
// core/buckets.hpp
// ===========================================================================

TEST_CASE("buckets: bucket_of hand cases for the three schemes", "[buckets]") {
    bucket_spec const u{bucket_scheme::uniform, 128, 1.0};
    CHECK(qkgeom::bucket_of(u, 0) == 0);
    CHECK(qkgeom::bucket_of(u, 127) == 0);
    CHECK(qkgeom::bucket_of(u, 128) == 1);
    CHECK(qkgeom::bucket_of(u, 4095) == 31);

    bucket_spec const a{bucket_scheme::all, 64, 1.0};
    CHECK(qkgeom::bucket_of(a, 63) == 0);
    CHECK(qkgeom::bucket_of(a, 64) == 1);

    bucket_spec const l16{bucket_scheme::log, 16, 1.0};  // i_min = 4
    CHECK(qkgeom::min_bucket(l16) == 4);
    CHECK(qkgeom::bucket_of(l16, 0) == 4);
    CHECK(qkgeom::bucket_of(l16, 30) == 4);  // ⌊log2 31⌋ = 4
    CHECK(qkgeom::bucket_of(l16, 31) == 5);  // ⌊log2 32⌋ = 5
    CHECK(qkgeom::bucket_of(l16, 62) == 5);
    CHECK(qkgeom::bucket_of(l16, 63) == 6);
    CHECK(qkgeom::bucket_of(l16, 1023) == 10);

    bucket_spec const l1{bucket_scheme::log, 1, 1.0};  // i_min = 0
    CHECK(qkgeom::min_bucket(l1) == 0);
    CHECK(qkgeom::bucket_of(l1, 0) == 0);
    CHECK(qkgeom::bucket_of(l1, 1) == 1);
    CHECK(qkgeom::bucket_of(l1, 2) == 1);
    CHECK(qkgeom::bucket_of(l1, 3) == 2);
    // Exact integer log2 at the top of the range: ⌊log2(2^63)⌋ = 63, no overflow.
    CHECK(qkgeom::bucket_of(l1, std::numeric_limits<std::int64_t>::max()) == 63);
    CHECK(qkgeom::bucket_of(l1, (std::int64_t{1} << 53) - 2) == 52);  // 2^53 − 1: a float log2 rounds up here
    CHECK(qkgeom::bucket_of(l1, (std::int64_t{1} << 53) - 1) == 53);

    bucket_spec const l17{bucket_scheme::log, 17, 1.0};  // ⌈log2 17⌉ = 5
    CHECK(qkgeom::min_bucket(l17) == 5);
    CHECK(qkgeom::bucket_of(l17, 0) == 5);
    CHECK(qkgeom::bucket_of(l17, 62) == 5);
    CHECK(qkgeom::bucket_of(l17, 63) == 6);
    CHECK(qkgeom::min_bucket(bucket_spec{bucket_scheme::log, 2, 1.0}) == 1);
    CHECK(qkgeom::min_bucket(bucket_spec{bucket_scheme::log, 3, 1.0}) == 2);
    CHECK(qkgeom::min_bucket(bucket_spec{bucket_scheme::log, 4, 1.0}) == 2);
}

TEST_CASE("buckets: bucket_of agrees with a brute-force loop", "[buckets]") {
    for (auto scheme : {bucket_scheme::uniform, bucket_scheme::log, bucket_scheme::all})
        for (std::int64_t w : {1, 2, 3, 5, 16, 17, 100, 128, 1000, 5000}) {
            bucket_spec const s{scheme, w, 1.0};
            for (std::int64_t t = 0; t <= 5000; ++t) {
                if (qkgeom::bucket_of(s, t) != ref_bucket(s, t)) {
                    FAIL("scheme " << qkgeom::bucket_scheme_name(scheme) << " width " << w << " position " << t
                                   << ": got " << qkgeom::bucket_of(s, t) << ", expected " << ref_bucket(s, t));
                }
            }
        }
}

TEST_CASE("buckets: keep_probability", "[buckets]") {
    CHECK(qkgeom::keep_probability({bucket_scheme::uniform, 128, 1.0}, 5) == 1.0 / 128);
    CHECK(qkgeom::keep_probability({bucket_scheme::uniform, 128, 3.0}, 5000) == 3.0 / 128);
    CHECK(qkgeom::keep_probability({bucket_scheme::uniform, 128, 200.0}, 0) == 1.0);
    bucket_spec const l{bucket_scheme::log, 16, 1.0};
    CHECK(qkgeom::keep_probability(l, 0) == 1.0 / 16);    // bucket 4
    CHECK(qkgeom::keep_probability(l, 100) == 1.0 / 64);  // bucket 6
    CHECK(qkgeom::keep_probability({bucket_scheme::log, 16, 4.0}, 0) == 0.25);
    CHECK(qkgeom::keep_probability({bucket_scheme::log, 1, 4.0}, 0) == 1.0);  // bucket 0: min(1, 4)
    CHECK(qkgeom::keep_probability({bucket_scheme::all, 128, 1.0}, 77) == 1.0);
}

TEST_CASE("buckets: the keep hash is the documented splitmix64 chain", "[buckets]") {
    CHECK(qkgeom::detail::splitmix64(0) == 0xE220A8397B1DCDAFULL);  // first output of splitmix64 seeded 0
    CHECK(ref_splitmix(0) == 0xE220A8397B1DCDAFULL);
    // Golden values, also listed in docs/buckets.md (cross-checked with a Python implementation).
    CHECK(qkgeom::keep_hash(0, 0, 0, kind::query, 0) == 0x78AE5A9A6B5FD45EULL);
    CHECK(qkgeom::keep_hash(1, 0, 0, kind::query, 0) == 0x348C3D1AF8BEC8E5ULL);
    CHECK(qkgeom::keep_hash(1, 3, 2, kind::key, 4095) == 0x1928B246362D9FE7ULL);
    CHECK(qkgeom::keep_hash(42, -1, 7, kind::query, 123456) == 0xC42D70E427856C43ULL);
    CHECK(qkgeom::keep_uniform(1, 3, 2, kind::key, 4095) == 0x1928B246362D9FE7ULL / 2048 * 0x1.0p-53);
    std::mt19937_64 g(5);
    bucket_spec const s{bucket_scheme::uniform, 4, 1.0};
    for (int i = 0; i < 1000; ++i) {
        std::uint64_t const seed = g();
        auto const e = static_cast<std::int64_t>(g() % 1000) - 10;  // negative ids are two's complement
        auto const layer = static_cast<std::int64_t>(g() % 80);
        int const k = static_cast<int>(g() % 2);
        auto const t = static_cast<std::int64_t>(g() % 200000);
        std::uint64_t const h = ref_hash(seed, e, layer, k, t);
        REQUIRE(qkgeom::keep_hash(seed, e, layer, static_cast<kind>(k), t) == h);
        double const u = static_cast<double>(h >> 11) / 9007199254740992.0;
        REQUIRE(qkgeom::keep_uniform(seed, e, layer, static_cast<kind>(k), t) == u);
        REQUIRE(qkgeom::keep_token(s, seed, e, layer, static_cast<kind>(k), t) == (u < 0.25));
    }
}

TEST_CASE("buckets: keep decisions are deterministic and differ across kinds, examples, layers, seeds", "[buckets]") {
    bucket_spec const s{bucket_scheme::uniform, 32, 1.0};
    auto const base = qkgeom::kept_positions(s, 7, 3, 2, kind::query, 4096);
    CHECK(base == qkgeom::kept_positions(s, 7, 3, 2, kind::query, 4096));
    CHECK(base != qkgeom::kept_positions(s, 7, 3, 2, kind::key, 4096));
    CHECK(base != qkgeom::kept_positions(s, 7, 4, 2, kind::query, 4096));
    CHECK(base != qkgeom::kept_positions(s, 7, 3, 3, kind::query, 4096));
    CHECK(base != qkgeom::kept_positions(s, 8, 3, 2, kind::query, 4096));
    // kept_positions is exactly the keep_token filter.
    std::vector<std::int64_t> manual;
    for (std::int64_t t = 0; t < 4096; ++t)
        if (qkgeom::keep_token(s, 7, 3, 2, kind::query, t)) manual.push_back(t);
    CHECK(base == manual);
    // p = 1 keeps everything.
    auto const all = qkgeom::kept_positions({bucket_scheme::all, 32, 1.0}, 7, 3, 2, kind::key, 100);
    REQUIRE(all.size() == 100);
    CHECK(all.back() == 99);
    CHECK(qkgeom::kept_positions(s, 7, 3, 2, kind::key, 0).empty());
}

TEST_CASE("buckets: empirical keep fraction matches keep_probability within 4 sd", "[buckets]") {
    struct cse {
        bucket_spec s;
        std::int64_t length;
    };
    for (auto const& c : {cse{{bucket_scheme::uniform, 16, 1.0}, 4096}, cse{{bucket_scheme::uniform, 128, 3.0}, 4096},
                          cse{{bucket_scheme::log, 8, 2.0}, 4096}}) {
        // Per bucket: trials and expected kept count, over 200 examples.
        double kept = 0, expected = 0, var = 0;
        for (std::int64_t e = 0; e < 200; ++e)
            for (std::int64_t t = 0; t < c.length; ++t) {
                double const p = qkgeom::keep_probability(c.s, t);
                expected += p;
                var += p * (1 - p);
                kept += qkgeom::keep_token(c.s, 99, e, 1, kind::query, t) ? 1.0 : 0.0;
            }
        INFO("scheme " << qkgeom::bucket_scheme_name(c.s.scheme) << " width " << c.s.width << " rate " << c.s.rate
                       << ": kept " << kept << ", expected " << expected << ", sd " << std::sqrt(var));
        CHECK(std::abs(kept - expected) <= 4.0 * std::sqrt(var));
    }
    // The largest log bucket alone (p = 2/2048, about 1 token per example).
    bucket_spec const l{bucket_scheme::log, 8, 2.0};
    double kept = 0, expected = 0, var = 0;
    for (std::int64_t e = 0; e < 2000; ++e)
        for (std::int64_t t = 2047; t < 4095; ++t) {
            double const p = qkgeom::keep_probability(l, t);
            expected += p;
            var += p * (1 - p);
            kept += qkgeom::keep_token(l, 4, e, 0, kind::key, t) ? 1.0 : 0.0;
        }
    CHECK(std::abs(kept - expected) <= 4.0 * std::sqrt(var));
}

TEST_CASE("buckets: invalid arguments throw std::invalid_argument naming the value", "[buckets]") {
    using Catch::Matchers::Contains;
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::bucket_of({bucket_scheme::uniform, 0, 1.0}, 1); }),
               Contains("qkgeom::bucket_of") && Contains("width") && Contains("value 0"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::bucket_of({bucket_scheme::log, -3, 1.0}, 1); }),
               Contains("width") && Contains("-3"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::keep_probability({bucket_scheme::uniform, 4, 0.0}, 1); }),
               Contains("rate"));
    CHECK_THAT(invalid_argument_of([] {
                   (void)qkgeom::keep_token({bucket_scheme::uniform, 4, std::nan("")}, 1, 0, 0, kind::query, 1);
               }),
               Contains("rate"));
    CHECK_THAT(invalid_argument_of([] {
                   (void)qkgeom::keep_token({bucket_scheme::uniform, 4, INFINITY}, 1, 0, 0, kind::query, 1);
               }),
               Contains("rate"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::bucket_of({}, -1); }), Contains("position") && Contains("-1"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::keep_token({}, 1, 0, 0, kind::key, -5); }),
               Contains("qkgeom::keep_token") && Contains("position") && Contains("-5"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::kept_positions({}, 1, 0, 0, kind::key, -2); }), Contains("length"));
}

// ===========================================================================
// capture/synthetic.hpp
// ===========================================================================

TEST_CASE("synthetic: RoPE preserves norms and the rotary dot product depends only on t_k - t_q",
          "[synthetic]") {
    syn::normal_stream rng(42);
    for (auto pairing : {syn::rope_pairing::rotate_half, syn::rope_pairing::interleaved}) {
        for (int trial = 0; trial < 20; ++trial) {
            Eigen::VectorXd rq(32), rk(32);
            for (index_t i = 0; i < 32; ++i) {
                rq(i) = rng();
                rk(i) = rng();
            }
            double const tq = std::floor(5000 * rng.uniform()), tk = std::floor(5000 * rng.uniform());
            Eigen::VectorXd a = rq, b = rk;
            syn::rope_rotate(a, tq, 10000.0, pairing);
            syn::rope_rotate(b, tk, 10000.0, pairing);
            CHECK(std::abs(a.norm() - rq.norm()) <= 1e-12 * rq.norm());
            CHECK(std::abs(b.norm() - rk.norm()) <= 1e-12 * rk.norm());
            double const dot = a.dot(b);
            for (double shift : {1.0, 17.0, 1000.0, 100000.0}) {
                Eigen::VectorXd a2 = rq, b2 = rk;
                syn::rope_rotate(a2, tq + shift, 10000.0, pairing);
                syn::rope_rotate(b2, tk + shift, 10000.0, pairing);
                // angles up to ~1e5 rad: cos/sin carry ~1e5·eps absolute error
                CHECK(std::abs(a2.dot(b2) - dot) <= 1e-9 * rq.norm() * rk.norm());
            }
            // ... and it really is rotated (not the identity): the dot changes with t_k - t_q.
            Eigen::VectorXd b3 = rk;
            syn::rope_rotate(b3, tk + 1, 10000.0, pairing);
            CHECK(std::abs(a.dot(b3) - dot) > 1e-6);
        }
    }
    // Pair layout: e_0 rotated by t = 1 at frequency θ_0 = 1.
    Eigen::VectorXd v = Eigen::VectorXd::Unit(8, 0);
    syn::rope_rotate(v, 1.0, 10000.0, syn::rope_pairing::rotate_half);
    CHECK(std::abs(v(0) - std::cos(1.0)) < 1e-15);
    CHECK(std::abs(v(4) - std::sin(1.0)) < 1e-15);
    v = Eigen::VectorXd::Unit(8, 0);
    syn::rope_rotate(v, 1.0, 10000.0, syn::rope_pairing::interleaved);
    CHECK(std::abs(v(0) - std::cos(1.0)) < 1e-15);
    CHECK(std::abs(v(1) - std::sin(1.0)) < 1e-15);
    // θ_i = theta^(-2i/rotary_dims)
    Eigen::VectorXd const f = syn::rope_frequencies(8, 10000.0);
    CHECK(std::abs(f(1) - std::pow(10000.0, -0.25)) < 1e-15);
    v = Eigen::VectorXd::Unit(8, 2);  // interleaved pair (2, 3) has frequency θ_1
    syn::rope_rotate(v, 3.0, 10000.0, syn::rope_pairing::interleaved);
    CHECK(std::abs(v(3) - std::sin(3.0 * f(1))) < 1e-15);
}

TEST_CASE("synthetic: mixing M is orthogonal, identity without mixing", "[synthetic]") {
    syn::capture_spec cap;
    cap.n_examples = 2;
    cap.context_length = 512;
    syn::layer_spec L;
    L.mix = true;
    auto const hs = syn::generate_layer(L, cap);
    Eigen::MatrixXd const& m = hs[0].truth.mixing;
    Eigen::MatrixXd const id = Eigen::MatrixXd::Identity(L.d, L.d);
    CHECK(max_abs(m.transpose() * m - id) < 1e-12);
    CHECK(max_abs(m * m.transpose() - id) < 1e-12);
    CHECK(max_abs(m - id) > 0.1);
    CHECK(std::abs(hs[0].truth.drift.norm() - 1.0) < 1e-12);
    L.mix = false;
    CHECK(syn::generate_head(L, cap).truth.mixing == id);
}

TEST_CASE("synthetic: GQA mapping, query heads of a group share identical key rows", "[synthetic]") {
    CHECK(syn::kv_head_of(0, 8, 2) == 0);
    CHECK(syn::kv_head_of(3, 8, 2) == 0);
    CHECK(syn::kv_head_of(4, 8, 2) == 1);
    CHECK(syn::kv_head_of(7, 8, 2) == 1);
    CHECK(syn::kv_head_of(5, 6, 6) == 5);
    CHECK(syn::kv_head_of(5, 6, 1) == 0);
    CHECK_THAT(invalid_argument_of([] { (void)syn::kv_head_of(0, 6, 4); }), Catch::Matchers::Contains("n_q_heads"));

    syn::layer_spec L;
    L.mix = true;
    L.n_q_heads = 6;
    L.n_kv_heads = 2;
    L.d = 16;
    L.rotary_dims = 8;
    syn::capture_spec cap;
    cap.n_examples = 4;
    cap.context_length = 1024;
    auto const hs = syn::generate_layer(L, cap);
    REQUIRE(hs.size() == 6);
    for (std::int64_t h = 0; h < 6; ++h) {
        auto const& c = hs[static_cast<std::size_t>(h)];
        CHECK(c.id.q_head == h);
        CHECK(c.id.k_head == h / 3);
        CHECK(c.id.layer == L.layer);
        // The facts carry the capture's bucket scheme and context length (no window).
        CHECK(c.facts.buckets == cap.buckets);
        CHECK(c.facts.context_length == cap.context_length);
        CHECK(c.facts.sliding_window == 0);
        CHECK(c.queries.vectors.rows() == static_cast<index_t>(c.queries.position.size()));
        CHECK(c.keys.vectors.rows() == static_cast<index_t>(c.keys.position.size()));
        CHECK(c.queries.vectors.cols() == 16);
        // Same positions for every head of one (layer, kind) (method §0.1).
        CHECK(c.queries.position == hs[0].queries.position);
        CHECK(c.queries.example_id == hs[0].queries.example_id);
        CHECK(c.keys.position == hs[0].keys.position);
        // Keys: identical within a group, shared drift and mixing.
        auto const& lead = hs[static_cast<std::size_t>(3 * (h / 3))];
        CHECK(c.keys.vectors == lead.keys.vectors);
        CHECK(c.truth.mixing == lead.truth.mixing);
        CHECK(c.truth.drift == lead.truth.drift);
        CHECK(c.truth.m_k == lead.truth.m_k);
    }
    CHECK(hs[0].queries.vectors != hs[1].queries.vectors);  // query heads differ
    CHECK(hs[0].keys.vectors != hs[3].keys.vectors);        // kv heads differ
    CHECK(hs[0].queries.position != hs[0].keys.position);  // kinds are sampled independently
    // bucket ids follow bucket_of.
    for (index_t i = 0; i < hs[0].queries.position.size(); ++i)
        REQUIRE(hs[0].queries.bucket[i] == qkgeom::bucket_of(cap.buckets, hs[0].queries.position[i]));
    // Kept positions are keep_token's.
    std::vector<std::int64_t> ex0;
    for (index_t i = 0; i < hs[0].keys.position.size(); ++i)
        if (hs[0].keys.example_id[i] == 2) ex0.push_back(hs[0].keys.position[i]);
    CHECK(ex0 == qkgeom::kept_positions(cap.buckets, cap.seed, 2, L.layer, kind::key, cap.context_length));
}

TEST_CASE("synthetic: generation is deterministic, generate_head equals generate_layer", "[synthetic]") {
    syn::layer_spec L;
    L.mix = true;
    L.d = 16;
    L.rotary_dims = 6;
    L.pairing = syn::rope_pairing::interleaved;
    syn::capture_spec cap;
    cap.n_examples = 8;
    cap.context_length = 2048;
    auto const a = syn::generate_layer(L, cap);
    auto const b = syn::generate_layer(L, cap);
    for (std::size_t h = 0; h < a.size(); ++h) {
        CHECK(a[h].queries.vectors == b[h].queries.vectors);
        CHECK(a[h].keys.vectors == b[h].keys.vectors);
        auto const one = syn::generate_head(L, cap, static_cast<std::int64_t>(h));
        CHECK(one.queries.vectors == a[h].queries.vectors);
        CHECK(one.keys.vectors == a[h].keys.vectors);
        CHECK(one.queries.position == a[h].queries.position);
        CHECK(one.id.k_head == a[h].id.k_head);
        CHECK(one.truth.m_q == a[h].truth.m_q);
        CHECK(one.truth.beta == a[h].truth.beta);
    }
    syn::capture_spec cap2 = cap;
    cap2.seed = 2;
    auto const c = syn::generate_head(L, cap2);
    CHECK(c.queries.position != a[0].queries.position);
    CHECK(c.truth.m_q == a[0].truth.m_q);  // the model does not depend on the capture seed
    syn::layer_spec L2 = L;
    L2.model_seed = 5;
    auto const d = syn::generate_head(L2, cap);
    CHECK(d.queries.position == a[0].queries.position);  // ... nor the sampling on the model seed
    CHECK(d.truth.m_q != a[0].truth.m_q);
    CHECK(d.truth.mixing != a[0].truth.mixing);
}

TEST_CASE("synthetic: per-bucket means add no linear position trend (exact, population)", "[synthetic]") {
    struct cse {
        qkgeom::bucket_spec b;
        std::int64_t length;
    };
    // Uniform with a partial last bucket (τ_b not affine in b) and log buckets.
    for (auto const& c : {cse{{bucket_scheme::uniform, 128, 1.0}, 4000}, cse{{bucket_scheme::log, 16, 2.0}, 4096},
                          cse{{bucket_scheme::all, 256, 1.0}, 3000}}) {
        syn::layer_spec L = test_layer();
        syn::capture_spec cap;
        cap.n_examples = 2;
        cap.context_length = c.length;
        cap.buckets = c.b;
        auto const h = syn::generate_head(L, cap);
        auto const& tr = h.truth;
        INFO("scheme " << qkgeom::bucket_scheme_name(c.b.scheme));
        index_t const nb = static_cast<index_t>(tr.buckets.size());
        REQUIRE(nb >= 5);
        REQUIRE(tr.m_q.rows() == nb);
        Eigen::VectorXd const w = tr.bucket_weight / tr.bucket_weight.sum();
        Eigen::VectorXd bid(nb);
        for (index_t j = 0; j < nb; ++j) bid(j) = static_cast<double>(tr.buckets[static_cast<std::size_t>(j)]);
        Eigen::VectorXd const bc = bid.array() - w.dot(bid);
        Eigen::VectorXd const tc = tr.tau.array() - w.dot(tr.tau);
        double const sd_b = std::sqrt(w.dot(bc.cwiseProduct(bc))), sd_tau = std::sqrt(w.dot(tc.cwiseProduct(tc)));
        for (Eigen::MatrixXd const* m : {&tr.m_q, &tr.m_k}) {
            CHECK(m->norm() > 0.1 * std::sqrt(static_cast<double>(nb)));  // non-trivial means
            Eigen::RowVectorXd const mean = w.transpose() * *m;
            Eigen::RowVectorXd const cov_b = (w.cwiseProduct(bc)).transpose() * *m;
            Eigen::RowVectorXd const cov_tau = (w.cwiseProduct(tc)).transpose() * *m;
            CHECK(mean.cwiseAbs().maxCoeff() < 1e-12);
            CHECK(cov_b.cwiseAbs().maxCoeff() / sd_b < 1e-12);
            CHECK(cov_tau.cwiseAbs().maxCoeff() / sd_tau < 1e-12);
            CHECK((*m * tr.a).cwiseAbs().maxCoeff() < 1e-12);  // orthogonal to the drift
        }
        // Population OLS slope of Q on t, over every position weighted by its
        // keep probability, is exactly beta: the m(b) contribution vanishes.
        double sw = 0, st = 0;
        for (std::int64_t t = 0; t < c.length; ++t) {
            double const p = qkgeom::keep_probability(c.b, t);
            sw += p;
            st += p * static_cast<double>(t);
        }
        double const et = st / sw;
        Eigen::VectorXd cov = Eigen::VectorXd::Zero(L.d);
        double var = 0;
        for (std::int64_t t = 0; t < c.length; ++t) {
            double const p = qkgeom::keep_probability(c.b, t) / sw;
            auto const j = static_cast<index_t>(qkgeom::bucket_of(c.b, t) - tr.buckets.front());
            Eigen::VectorXd const ex = tr.alpha + tr.beta * static_cast<double>(t) + tr.m_q.row(j).transpose();
            cov += p * (static_cast<double>(t) - et) * ex;
            var += p * (static_cast<double>(t) - et) * (static_cast<double>(t) - et);
        }
        CHECK(max_abs(cov / var - tr.beta) < 1e-12);
        // Bucket table: τ is the mean position, weight = n_examples·count·p.
        CHECK(tr.buckets.front() == qkgeom::bucket_of(c.b, 0));
        CHECK(tr.buckets.back() == qkgeom::bucket_of(c.b, c.length - 1));
    }
}

TEST_CASE("synthetic: OLS slope of Q on position approaches truth.beta", "[synthetic]") {
    syn::layer_spec const L = test_layer();
    syn::capture_spec cap;
    cap.n_examples = 256;
    cap.context_length = 4096;
    auto const h = syn::generate_head(L, cap);
    auto const& tr = h.truth;
    REQUIRE(tr.n_q > 6000);
    ols_fit const f = ols(h.queries.vectors, h.queries.position.values());
    // Per coordinate: se_j = s_j / (sd(t)·√n) — with s_j the residual sd of the
    // coordinate (noise s(b), rotary rope_sd and bucket means m(b), mixed by M).
    // For an unmixed plain coordinate with noise_sd = 1 this is about
    // 1.2 / (1183·√8000) ≈ 1.1e-5, against a planted slope of 1e-3.
    Eigen::VectorXd const z = (f.slope - tr.beta).cwiseQuotient(f.se_slope);
    INFO("max |z| = " << z.cwiseAbs().maxCoeff() << ", se ~ " << f.se_slope.mean());
    CHECK(z.cwiseAbs().maxCoeff() < 5.0);
    CHECK(f.se_slope.maxCoeff() < 0.05 * tr.beta_pos);  // the test has power
    CHECK(tr.beta_pos == std::abs(L.q_heads[0].query.slope));
    CHECK(std::abs(tr.beta.norm() - tr.beta_pos) < 1e-15);
    // Intercept: se = s_j · sqrt(1/n + t̄²/Sxx).
    double const k_a = 1.0 / static_cast<double>(f.n) + f.mean_t * f.mean_t / f.sxx;
    Eigen::VectorXd const se_a = (f.resid_var * k_a).cwiseSqrt();
    CHECK((f.intercept - tr.alpha).cwiseQuotient(se_a).cwiseAbs().maxCoeff() < 5.0);
}

TEST_CASE("synthetic: rotation truth (a, mu_q_a, alpha_k, bias_strength) against sample estimates", "[synthetic]") {
    for (double sign : {1.0, -1.0}) {
        syn::layer_spec L = test_layer();
        L.q_heads[0].query.slope *= sign;
        L.kv_heads[0].key.slope *= sign;
        syn::capture_spec cap;
        cap.n_examples = 256;
        auto const h = syn::generate_head(L, cap);
        auto const& tr = h.truth;
        REQUIRE(tr.a_defined);
        CHECK(tr.a.dot(tr.drift) == Approx(sign));
        CHECK(tr.alpha_k == Approx(std::abs(L.kv_heads[0].key.slope)));  // same-sign slopes: a points along them
        CHECK(tr.bias_strength == tr.mu_q_a * tr.alpha_k);

        auto const n_q = static_cast<double>(h.queries.vectors.rows());
        auto const n_k = static_cast<double>(h.keys.vectors.rows());
        // Pooled sample Cov(x, t) points along a (method §3), up to the sampling offset term.
        Eigen::MatrixXd pool(h.queries.vectors.rows() + h.keys.vectors.rows(), L.d);
        pool << h.queries.vectors, h.keys.vectors;
        std::vector<std::int64_t> tpool = h.queries.position.values();
        tpool.insert(tpool.end(), h.keys.position.begin(), h.keys.position.end());
        ols_fit const fp = ols(pool, tpool);
        Eigen::VectorXd const a_hat = fp.slope.normalized();
        CHECK(a_hat.dot(tr.a) > 0.98);

        // mean of q·a: given the positions, only the noise s(b)·ε is random: se = sqrt(sigma2_pos / n).
        Eigen::VectorXd const qa = h.queries.vectors * tr.a, ka = h.keys.vectors * tr.a;
        double const se_mu = std::sqrt(tr.sigma2_pos / n_q);
        CHECK(std::abs(qa.mean() - tr.mu_q_a) < 5 * se_mu);
        CHECK(std::abs(ka.mean() - tr.mu_k_a) < 5 * std::sqrt(1.0 / n_k));  // key noise_sd = 1, no ramp
        // slopes of the a-projections.
        ols_fit const fq = ols(h.queries.vectors * tr.a, h.queries.position.values());
        ols_fit const fk = ols(h.keys.vectors * tr.a, h.keys.position.values());
        CHECK(std::abs(fq.slope(0) - tr.alpha_q) < 5 * fq.se_slope(0));
        CHECK(std::abs(fk.slope(0) - tr.alpha_k) < 5 * fk.se_slope(0));
        double const bias_hat = qa.mean() * fk.slope(0);
        double const se_bias = std::abs(tr.alpha_k) * se_mu + std::abs(tr.mu_q_a) * fk.se_slope(0);
        CHECK(std::abs(bias_hat - tr.bias_strength) < 5 * se_bias);
        // Pearson r of q·a with t.
        Eigen::VectorXd tq(h.queries.vectors.rows());
        for (index_t i = 0; i < tq.size(); ++i)
            tq(i) = static_cast<double>(h.queries.position[i]);
        Eigen::VectorXd const qc = qa.array() - qa.mean(), tc = tq.array() - tq.mean();
        double const r_hat = qc.dot(tc) / (qc.norm() * tc.norm());
        CHECK(std::abs(r_hat - tr.r_q_a) < 5 * (1 - tr.r_q_a * tr.r_q_a) / std::sqrt(n_q));
        // b: unit, orthogonal to a, oriented so (mu_q - mu_k)·b >= 0.
        REQUIRE(tr.b_defined);
        CHECK(std::abs(tr.b.norm() - 1) < 1e-12);
        CHECK(std::abs(tr.b.dot(tr.a)) < 1e-12);
        CHECK((tr.mu_q - tr.mu_k).dot(tr.b) > 0);
    }
    // Opposite slopes: the sign of a follows n·slope·Var(t) of the larger side.
    syn::layer_spec L = test_layer();
    L.q_heads[0].query.slope = 1e-3;
    L.kv_heads[0].key.slope = -3e-3;
    auto const h = syn::generate_head(L, {});
    CHECK(h.truth.a.dot(h.truth.drift) == Approx(-1.0));
    CHECK(h.truth.alpha_q < 0);
    CHECK(h.truth.alpha_k > 0);
    // Zero slopes: a is undefined.
    L.q_heads[0].query.slope = 0;
    L.kv_heads[0].key.slope = 0;
    auto const z = syn::generate_head(L, {});
    CHECK_FALSE(z.truth.a_defined);
    CHECK(std::isnan(z.truth.bias_strength));
    CHECK(std::isnan(z.truth.alpha_pos));
    CHECK(z.truth.beta_pos == 0);
}

TEST_CASE("synthetic: Householder truth (beta_pos, alpha_pos, sigma2_pos) on the beta-hat projection",
          "[synthetic]") {
    syn::layer_spec const L = test_layer();
    syn::capture_spec cap;
    cap.n_examples = 256;
    auto const h = syn::generate_head(L, cap);
    auto const& tr = h.truth;
    auto const& qp = L.q_heads[0].query;
    Eigen::VectorXd const bhat = tr.beta / tr.beta_pos;
    // alpha_pos = sign(slope)(δ·c + intercept), δ normalised.
    Eigen::VectorXd const delta = L.kv_heads[0].drift.normalized();
    CHECK(tr.alpha_pos == Approx(delta.dot(qp.centroid) + qp.intercept).epsilon(1e-12));
    CHECK(tr.alpha_pos == Approx(bhat.dot(tr.alpha)).epsilon(1e-12));
    // sigma2_pos = mean over queries of s(b_i)².
    double s2 = 0;
    for (auto b : h.queries.bucket) {
        double const s = tr.sigma_q(static_cast<index_t>(b - tr.buckets.front()));
        s2 += s * s;
    }
    CHECK(tr.sigma2_pos == Approx(s2 / static_cast<double>(tr.n_q)).epsilon(1e-12));
    CHECK(tr.sigma_q(0) == qp.noise_sd);
    CHECK(tr.sigma_q(tr.sigma_q.size() - 1) == Approx(qp.noise_sd * (1 + qp.noise_sd_ramp)));
    // The projection y = β̂·q is exactly alpha_pos + beta_pos t + s(b)ε.
    ols_fit const f = ols(h.queries.vectors * bhat, h.queries.position.values());
    double const n = static_cast<double>(f.n);
    CHECK(std::abs(f.slope(0) - tr.beta_pos) < 5 * f.se_slope(0));
    CHECK(std::abs(f.intercept(0) - tr.alpha_pos) <
          5 * std::sqrt(f.resid_var(0) * (1 / n + f.mean_t * f.mean_t / f.sxx)));
    // Residual variance: se ≈ sqrt(2·E[s⁴]/n) ≤ sqrt(2/n)·max s².
    double const smax2 = tr.sigma_q.maxCoeff() * tr.sigma_q.maxCoeff();
    CHECK(std::abs(f.resid_var(0) - tr.sigma2_pos) < 5 * std::sqrt(2.0 / n) * smax2);
}

TEST_CASE("synthetic: conditional means and covariances match the sample moments", "[synthetic]") {
    syn::layer_spec const L = test_layer(16, 8);
    syn::capture_spec cap;
    cap.n_examples = 256;
    auto const h = syn::generate_head(L, cap);
    auto const& tr = h.truth;
    for (int kindi = 0; kindi < 2; ++kindi) {
        Eigen::MatrixXd const& x = kindi == 0 ? h.queries.vectors : h.keys.vectors;
        auto const& pos = kindi == 0 ? h.queries.position.values() : h.keys.position.values();
        Eigen::VectorXd const& mu = kindi == 0 ? tr.mu_q : tr.mu_k;
        Eigen::MatrixXd const& cov = kindi == 0 ? tr.cov_q : tr.cov_k;
        Eigen::VectorXd const& cov_t = kindi == 0 ? tr.cov_qt : tr.cov_kt;
        auto const n = static_cast<double>(x.rows());
        Eigen::VectorXd const xbar = x.colwise().mean().transpose();
        // se of a mean coordinate <= sqrt(Var_j / n) (conditional noise variance <= total).
        CHECK((xbar - mu).cwiseQuotient((cov.diagonal() / n).cwiseSqrt()).cwiseAbs().maxCoeff() < 5.0);
        Eigen::MatrixXd const xc = x.rowwise() - xbar.transpose();
        Eigen::MatrixXd const s = xc.transpose() * xc / (n - 1);
        // se(S_ij) ≈ sqrt((C_ii C_jj + C_ij²)/n)
        Eigen::MatrixXd z(L.d, L.d);
        for (index_t i = 0; i < L.d; ++i)
            for (index_t j = 0; j < L.d; ++j)
                z(i, j) = (s(i, j) - cov(i, j)) / std::sqrt((cov(i, i) * cov(j, j) + cov(i, j) * cov(i, j)) / n);
        CHECK(z.cwiseAbs().maxCoeff() < 6.0);
        ols_fit const f = ols(x, pos);
        double const var_t = f.sxx / (n - 1);
        Eigen::VectorXd const zt = (f.slope * var_t - cov_t).cwiseQuotient(f.se_slope * var_t);
        CHECK(zt.cwiseAbs().maxCoeff() < 5.0);
        CHECK(var_t == Approx(kindi == 0 ? tr.var_t_q : tr.var_t_k).epsilon(1e-12));
    }
    // mu_q = alpha + beta·t̄_q exactly.
    CHECK(max_abs(tr.mu_q - (tr.alpha + tr.beta * tr.mean_t_q)) < 1e-12);
}

TEST_CASE("synthetic: invalid layer and capture specs throw naming the field", "[synthetic]") {
    using Catch::Matchers::Contains;
    syn::capture_spec cap;
    cap.n_examples = 1;
    cap.context_length = 64;
    auto err = [&](syn::layer_spec const& L) { return invalid_argument_of([&] { (void)syn::generate_layer(L, cap); }); };
    {
        syn::layer_spec L;
        L.n_q_heads = 6;
        L.n_kv_heads = 4;
        CHECK_THAT(err(L), Contains("qkgeom::synthetic::generate_layer") && Contains("n_q_heads") &&
                               Contains("value 6"));
    }
    {
        syn::layer_spec L;
        L.rotary_dims = 33;
        CHECK_THAT(err(L), Contains("rotary_dims") && Contains("even") && Contains("33"));
    }
    {
        syn::layer_spec L;
        L.d = 34;
        L.rotary_dims = 34;
        CHECK_THAT(err(L), Contains("rotary_dims") && Contains(">= 2"));
        L.rotary_dims = 32;  // d - rotary_dims = 2: fine
        CHECK_NOTHROW(syn::generate_layer(L, cap));
        L.rotary_dims = 0;  // no rotary block: fine
        CHECK_NOTHROW(syn::generate_layer(L, cap));
    }
    {
        syn::layer_spec L;
        L.q_heads.assign(4, syn::default_q_head());
        L.q_heads[2].query.centroid = Eigen::VectorXd::Zero(5);
        CHECK_THAT(err(L), Contains("q_heads[2].query.centroid") && Contains("value 5"));
    }
    {
        syn::layer_spec L;
        L.kv_heads.assign(2, syn::default_kv_head());
        L.kv_heads[1].key.centroid = Eigen::VectorXd::Zero(31);
        CHECK_THAT(err(L), Contains("kv_heads[1].key.centroid"));
        L.kv_heads[1].key.centroid.resize(0);
        L.kv_heads[1].drift = Eigen::VectorXd::Zero(32);
        CHECK_THAT(err(L), Contains("kv_heads[1].drift"));
        L.kv_heads[1].drift = Eigen::VectorXd::Ones(3);
        CHECK_THAT(err(L), Contains("kv_heads[1].drift"));
    }
    {
        syn::layer_spec L;
        L.q_heads.assign(3, syn::default_q_head());
        CHECK_THAT(err(L), Contains("q_heads") && Contains("size"));
    }
    {
        syn::layer_spec L;
        L.q_heads.assign(4, syn::default_q_head());
        L.q_heads[0].query.noise_sd = -1;
        CHECK_THAT(err(L), Contains("q_heads[0].query.noise_sd"));
    }
    {
        syn::layer_spec L;
        CHECK_THAT(invalid_argument_of([&] { (void)syn::generate_head(L, cap, 4); }),
                   Contains("qkgeom::synthetic::generate_head") && Contains("q_head"));
        syn::capture_spec bad = cap;
        bad.n_examples = 0;
        CHECK_THAT(invalid_argument_of([&] { (void)syn::generate_head(L, bad); }), Contains("n_examples"));
        bad = cap;
        bad.buckets.width = 0;
        CHECK_THAT(invalid_argument_of([&] { (void)syn::generate_head(L, bad); }), Contains("width"));
    }
}

}  // namespace qkgeom_tests_synthetic_test
