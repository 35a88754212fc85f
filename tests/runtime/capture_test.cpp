// Runtime tests of the capture protocol components (capture/protocol.hpp, method §0,
// §0.1): GQA mapping against its definition, eligibility, seeded head
// sampling (without replacement, uniform inclusion within a binomial bound,
// deterministic per seed), the step sampler (kept fraction per bucket within a
// binomial bound, the same tokens for every head of a (layer, kind), different
// tokens across seeds), the row store (kept rows equal the input rows) and
// capture_store::head (a planned head as one head_capture).
#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/parallel.hpp>

#include <catch2/catch.hpp>

#include "test_util.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_capture_test {

using qkgeom_test::invalid_argument_of;

namespace {

using qkgeom::bucket_scheme;
using qkgeom::bucket_spec;
using qkgeom::head_id;
using qkgeom::kind;
using qkgeom::layer_eligibility;
using Catch::Matchers::Contains;

}  // namespace

TEST_CASE("capture: GQA mapping is floor(h_q / (n_q / n_kv)) (method §0)", "[capture]") {
    for (std::int64_t n_kv = 1; n_kv <= 8; ++n_kv)
        for (std::int64_t g = 1; g <= 6; ++g) {
            std::int64_t const n_q = n_kv * g;
            CHECK(qkgeom::gqa_group_size(n_q, n_kv) == g);
            std::vector<std::int64_t> per_kv(static_cast<std::size_t>(n_kv), 0);
            for (std::int64_t h = 0; h < n_q; ++h) {
                auto const k = qkgeom::key_head_of(h, n_q, n_kv);
                REQUIRE(k == h / (n_q / n_kv));
                REQUIRE(k >= 0);
                REQUIRE(k < n_kv);
                ++per_kv[static_cast<std::size_t>(k)];
            }
            // Every key head serves exactly g query heads, contiguous blocks.
            for (auto c : per_kv) CHECK(c == g);
        }
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::gqa_group_size(12, 5); }),
               Contains("n_q_heads = 12") && Contains("multiple of n_kv_heads") && Contains("value 5"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::key_head_of(8, 8, 2); }), Contains("q_head") && Contains("value 8"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::key_head_of(-1, 8, 2); }), Contains("value -1"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::gqa_group_size(8, 0); }), Contains("n_kv_heads") && Contains("value 0"));
}

TEST_CASE("capture: layout validation names the layer and field", "[capture]") {
    auto m = qkgeom::uniform_layout(3, 8, 2, 64);
    CHECK_NOTHROW(qkgeom::check_layout(m));
    m.layers[2].n_kv_heads = 3;
    CHECK_THAT(invalid_argument_of([&] { qkgeom::check_layout(m); }), Contains("layers[2].n_q_heads = 8") && Contains("value 3"));
    m.layers[2].n_kv_heads = 2;
    m.layers[1].sliding_window = 0;
    CHECK_THAT(invalid_argument_of([&] { qkgeom::check_layout(m); }), Contains("layers[1].sliding_window") && Contains("value 0"));
    m.layers[1].sliding_window.reset();
    m.head_dim = 0;
    CHECK_THAT(invalid_argument_of([&] { qkgeom::check_layout(m); }), Contains("head_dim") && Contains("value 0"));
    CHECK_THAT(invalid_argument_of([] { (void)qkgeom::uniform_layout(0, 8, 2, 64); }), Contains("n_layers"));
}

TEST_CASE("capture: eligibility keeps full-attention layers unless asked (method §0.1)", "[capture]") {
    // Gemma-style: every other layer is sliding-window; heads differ per layer.
    qkgeom::model_layout m{32, {{4, 2, std::nullopt}, {4, 2, 512}, {6, 3, std::nullopt}, {6, 1, 1024}}};
    auto const full = qkgeom::eligible_heads(m);
    auto const all = qkgeom::eligible_heads(m, layer_eligibility::all_layers);
    CHECK(full.size() == 4 + 6);
    CHECK(all.size() == 4 + 4 + 6 + 6);
    for (auto const& h : full) CHECK((h.layer == 0 || h.layer == 2));
    CHECK(std::is_sorted(all.begin(), all.end()));
    for (auto const& h : all) {
        auto const& L = m.layers[static_cast<std::size_t>(h.layer)];
        CHECK(h.k_head == qkgeom::key_head_of(h.q_head, L.n_q_heads, L.n_kv_heads));
    }
    // All layers sliding: nothing is eligible by default.
    auto const sw = qkgeom::uniform_layout(2, 4, 4, 16, 128);
    CHECK(qkgeom::eligible_heads(sw).empty());
    CHECK(qkgeom::sample_heads(sw, 3, 1).empty());
}

TEST_CASE("capture: head sampling is seeded, without replacement, uniform (method §0.1)", "[capture]") {
    auto m = qkgeom::uniform_layout(6, 8, 2, 64);
    m.layers[3].sliding_window = 256;  // 5 eligible layers × 8 heads = 40
    auto const pool = qkgeom::eligible_heads(m);
    REQUIRE(pool.size() == 40);
    std::set<head_id> const pool_set(pool.begin(), pool.end());

    // Fewer eligible than asked: all of them.
    CHECK(qkgeom::sample_heads(m, 40, 9) == pool);
    CHECK(qkgeom::sample_heads(m, 1000, 9) == pool);
    CHECK(qkgeom::sample_heads(m, 0, 9).empty());
    CHECK_THAT(invalid_argument_of([&] { (void)qkgeom::sample_heads(m, -1, 9); }), Contains("count") && Contains("value -1"));

    // Deterministic per seed, different across seeds, sorted, distinct, eligible.
    auto const a = qkgeom::sample_heads(m, 12, 2024);
    CHECK(a == qkgeom::sample_heads(m, 12, 2024));
    CHECK(a != qkgeom::sample_heads(m, 12, 2025));
    CHECK(a.size() == 12);
    CHECK(std::is_sorted(a.begin(), a.end()));
    CHECK(std::set<head_id>(a.begin(), a.end()).size() == 12);
    for (auto const& h : a) CHECK(pool_set.count(h) == 1);

    // Uniform without replacement: each head is included with probability
    // count/N = 12/40; over S seeds its inclusion count is Binomial(S, 0.3).
    // 40 heads at 4.5 sd: a false alarm has probability < 40 · 7e-6.
    // Pairs are included with probability (12·11)/(40·39): check one pair too.
    constexpr int S = 4000;
    std::map<head_id, int> inc;
    int pair_both = 0;
    for (int s = 0; s < S; ++s) {
        auto const smp = qkgeom::sample_heads(m, 12, static_cast<std::uint64_t>(s));
        REQUIRE(smp.size() == 12);
        for (auto const& h : smp) ++inc[h];
        bool const has0 = std::binary_search(smp.begin(), smp.end(), pool[0]);
        bool const has39 = std::binary_search(smp.begin(), smp.end(), pool[39]);
        pair_both += (has0 && has39) ? 1 : 0;
    }
    double const p = 12.0 / 40.0, sd = std::sqrt(S * p * (1 - p));
    REQUIRE(inc.size() == 40);
    for (auto const& [h, c] : inc) {
        INFO("layer " << h.layer << " q_head " << h.q_head << ": included " << c << " times, expected " << S * p);
        CHECK(std::abs(c - S * p) <= 4.5 * sd);
    }
    double const pp = (12.0 * 11.0) / (40.0 * 39.0), sdp = std::sqrt(S * pp * (1 - pp));
    CHECK(std::abs(pair_both - S * pp) <= 4.5 * sdp);

    // Sliding-window layers are sampled only when asked.
    for (auto const& h : qkgeom::sample_heads(m, 30, 5)) CHECK(h.layer != 3);
    bool saw3 = false;
    for (int s = 0; s < 20; ++s)
        for (auto const& h : qkgeom::sample_heads(m, 30, static_cast<std::uint64_t>(s), layer_eligibility::all_layers))
            saw3 = saw3 || h.layer == 3;
    CHECK(saw3);
}

TEST_CASE("capture: the step sampler keeps ~rate/B per bucket (binomial bound, method §0.1)", "[capture]") {
    // Steps of T tokens from E examples; per bucket the kept count over all
    // examples is a sum of independent Bernoulli(p_b) trials.
    struct cse {
        bucket_spec s;
        std::int64_t T;
    };
    for (auto const& c : {cse{{bucket_scheme::uniform, 32, 1.0}, 1024}, cse{{bucket_scheme::uniform, 64, 4.0}, 1024},
                          cse{{bucket_scheme::log, 16, 3.0}, 2048}}) {
        qkgeom::capture_sampler const smp{c.s, 77};
        constexpr std::int64_t E = 300;
        std::map<std::int64_t, double> kept, trials, prob;
        for (std::int64_t e = 0; e < E; ++e) {
            std::vector<std::int64_t> pos(static_cast<std::size_t>(c.T)), ex(static_cast<std::size_t>(c.T), e);
            for (std::int64_t t = 0; t < c.T; ++t) pos[static_cast<std::size_t>(t)] = t;
            for (auto i : smp.select(pos, ex, 5, kind::key)) kept[smp.bucket(pos[static_cast<std::size_t>(i)])] += 1;
            for (auto t : pos) {
                trials[smp.bucket(t)] += 1;
                prob[smp.bucket(t)] = qkgeom::keep_probability(c.s, t);  // constant within a bucket
            }
        }
        for (auto const& [b, n] : trials) {
            double const p = prob[b];
            double const expect = n * p, sd = std::sqrt(n * p * (1 - p));
            INFO("scheme " << qkgeom::bucket_scheme_name(c.s.scheme) << " bucket " << b << ": kept " << kept[b]
                           << " of " << n << ", expected " << expect << " (p = " << p << ")");
            // rate / B kept per token (≈ rate per bucket per sequence).
            if (c.s.scheme == bucket_scheme::uniform) CHECK(p == c.s.rate / static_cast<double>(c.s.width));
            CHECK(std::abs(kept[b] - expect) <= 4.5 * sd + 1e-9);
        }
    }
}

TEST_CASE("capture: the same tokens for every head of a (layer, kind), different across seeds", "[capture]") {
    auto const layout = qkgeom::uniform_layout(2, 4, 2, 8);
    auto const heads = qkgeom::eligible_heads(layout);
    bucket_spec const spec{bucket_scheme::uniform, 16, 2.0};
    auto run = [&](std::uint64_t seed) {
        qkgeom::capture_store<double> st(layout, heads, {spec, seed});
        std::mt19937_64 gen(seed + 1);
        std::normal_distribution<double> nd;
        for (std::int64_t step = 0; step < 3; ++step) {
            // A chunked batch: positions start at an offset, two examples.
            std::vector<std::int64_t> pos, ex;
            for (std::int64_t e = 0; e < 2; ++e)
                for (std::int64_t t = 0; t < 200; ++t) {
                    pos.push_back(step * 200 + t);
                    ex.push_back(10 + e);
                }
            for (std::int64_t l = 0; l < 2; ++l)
                for (kind k : {kind::query, kind::key})
                    for (std::int64_t h = 0; h < (k == kind::query ? 4 : 2); ++h) {
                        Eigen::MatrixXd x(static_cast<Eigen::Index>(pos.size()), 8);
                        for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = nd(gen);
                        st.add(l, k, h, x, pos, ex);
                    }
        }
        return st;
    };
    auto const st = run(1);
    for (std::int64_t l = 0; l < 2; ++l)
        for (kind k : {kind::query, kind::key}) {
            auto const& ref = st.rows(l, k, 0);
            CHECK(ref.rows() > 0);
            for (std::int64_t h = 1; h < (k == kind::query ? 4 : 2); ++h) {
                CHECK(st.rows(l, k, h).position == ref.position);
                CHECK(st.rows(l, k, h).example_id == ref.example_id);
                CHECK(st.rows(l, k, h).bucket == ref.bucket);
            }
        }
    // Queries and keys, and different layers, are sampled independently.
    CHECK(st.rows(0, kind::query, 0).position != st.rows(0, kind::key, 0).position);
    CHECK(st.rows(0, kind::query, 0).position != st.rows(1, kind::query, 0).position);
    auto const other = run(2);
    CHECK(other.rows(0, kind::query, 0).position != st.rows(0, kind::query, 0).position);
    // The store keeps exactly keep_token's tokens.
    auto const& r = st.rows(1, kind::key, 1);
    qkgeom::index_t j = 0;
    for (std::int64_t step = 0; step < 3; ++step)
        for (std::int64_t e = 0; e < 2; ++e)
            for (std::int64_t t = step * 200; t < step * 200 + 200; ++t)
                if (qkgeom::keep_token(spec, 1, 10 + e, 1, kind::key, t)) {
                    REQUIRE(j < r.position.size());
                    CHECK(r.position[j] == t);
                    CHECK(r.example_id[j] == 10 + e);
                    CHECK(r.bucket[j] == t / 16);
                    ++j;
                }
    CHECK(j == r.position.size());
}

TEST_CASE("capture: stored rows equal the input rows at the kept tokens", "[capture]") {
    auto layout = qkgeom::uniform_layout(1, 4, 1, 6, 64);
    std::vector<head_id> const heads{{0, 2, 0}};
    qkgeom::capture_store<float> st(layout, heads, {{bucket_scheme::uniform, 8, 2.0}, 3});
    CHECK(st.wants(0, kind::query, 2));
    CHECK(st.wants(0, kind::key, 0));
    CHECK_FALSE(st.wants(0, kind::query, 1));
    // Row-major float rows with a column stride (a strided, non-owning view).
    constexpr std::int64_t T = 100;
    std::vector<float> buf(static_cast<std::size_t>(T * 9));
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i) * 0.25f - 7.0f;
    auto const view = qkgeom::make_matrix_view(std::span<float const>(buf), T, 6, 9, 1);
    std::vector<std::int64_t> pos(T), ex(T);
    for (std::int64_t i = 0; i < T; ++i) {
        pos[static_cast<std::size_t>(i)] = 1000 + 3 * i;  // not arange: a shifted, strided position list
        ex[static_cast<std::size_t>(i)] = i % 3;
    }
    auto const kept = st.sampler().select(pos, ex, 0, kind::query);
    CHECK(st.add(0, kind::query, 2, view, pos, ex) == static_cast<std::int64_t>(kept.size()));
    auto const& r = st.rows(0, kind::query, 2);
    REQUIRE(r.rows() == static_cast<std::int64_t>(kept.size()));
    CHECK(r.sliding_window == std::optional<std::int64_t>(64));
    auto const m = r.matrix();
    for (std::size_t j = 0; j < kept.size(); ++j) {
        auto const i = kept[j];
        auto const jr = static_cast<qkgeom::index_t>(j);
        CHECK(r.position[jr] == pos[static_cast<std::size_t>(i)]);
        CHECK(r.example_id[jr] == ex[static_cast<std::size_t>(i)]);
        CHECK(r.bucket[jr] == pos[static_cast<std::size_t>(i)] / 8);
        for (std::int64_t c = 0; c < 6; ++c) REQUIRE(m(static_cast<qkgeom::index_t>(j), c) == buf[static_cast<std::size_t>(i * 9 + c)]);
    }

    // Errors: head outside the plan, lengths, width, non-finite kept values.
    CHECK_THAT(invalid_argument_of([&] { st.add(0, kind::query, 1, view, pos, ex); }),
               Contains("not in the capture plan") && Contains("value 1"));
    std::vector<std::int64_t> short_pos(pos.begin(), pos.end() - 1);
    CHECK_THAT(invalid_argument_of([&] { st.add_selected(0, kind::query, 2, view, short_pos, ex, kept); }),
               Contains("positions") && Contains("value 99"));
    CHECK_THAT(invalid_argument_of([&] { (void)st.sampler().select(short_pos, ex, 0, kind::query); }),
               Contains("example_ids") && Contains("value 100"));
    auto const narrow = qkgeom::make_matrix_view(std::span<float const>(buf), T, 5, 9, 1);
    CHECK_THAT(invalid_argument_of([&] { st.add(0, kind::query, 2, narrow, pos, ex); }), Contains("head_dim") && Contains("value 5"));
    auto bad = buf;
    auto const victim = kept.at(1);
    bad[static_cast<std::size_t>(victim * 9 + 4)] = std::numeric_limits<float>::quiet_NaN();
    auto const bad_view = qkgeom::make_matrix_view(std::span<float const>(bad), T, 6, 9, 1);
    auto const before = r.rows();
    CHECK_THAT(invalid_argument_of([&] { st.add(0, kind::query, 2, bad_view, pos, ex); }),
               Contains("non-finite") && Contains("row " + std::to_string(victim)) && Contains("column 4"));
    CHECK(st.rows(0, kind::query, 2).rows() == before);  // nothing half-added
    CHECK(st.rows(0, kind::query, 2).values.size() == static_cast<std::size_t>(before * 6));
    std::vector<std::int64_t> neg = pos;
    neg[5] = -4;
    CHECK_THAT(invalid_argument_of([&] { st.add(0, kind::query, 2, view, neg, ex); }),
               Contains("positions[5]") && Contains("value -4"));
    CHECK_THAT(invalid_argument_of([&] { qkgeom::capture_store<float>(layout, {{0, 2, 1}}, {}); }),
               Contains("GQA") && Contains("value 1"));
}

TEST_CASE("capture: capture_store::head is the planned head as one value (rows, scheme, window)", "[capture]") {
    // Layer 0 full attention, layer 1 sliding (window 32); GQA 4 q heads : 2 kv heads.
    qkgeom::model_layout const layout{5, {{4, 2, std::nullopt}, {4, 2, 32}}};
    std::vector<head_id> const heads{{0, 3, 1}, {1, 0, 0}, {1, 2, 1}};
    qkgeom::capture_sampler const smp{{bucket_scheme::uniform, 8, 3.0}, 17};
    qkgeom::capture_store<float> st(layout, heads, smp);
    std::mt19937_64 gen(23);
    std::normal_distribution<double> nd;
    for (std::int64_t step = 0; step < 2; ++step) {
        std::vector<std::int64_t> pos, ex;
        for (std::int64_t e = 0; e < 3; ++e)
            for (std::int64_t t = 0; t < 120; ++t) {
                pos.push_back(step * 120 + t);
                ex.push_back(e);
            }
        for (std::int64_t l = 0; l < 2; ++l)
            for (kind k : {kind::query, kind::key})
                for (std::int64_t h = 0; h < (k == kind::query ? 4 : 2); ++h) {
                    if (!st.wants(l, k, h)) continue;
                    Eigen::MatrixXd x(static_cast<Eigen::Index>(pos.size()), 5);
                    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = nd(gen);
                    st.add(l, k, h, x, pos, ex);
                }
    }
    auto same_rows = [](auto const& tr, qkgeom::captured_rows<float> const& r) {
        auto const& v = tr.vectors;
        if (v.rows() != r.rows() || v.cols() != r.dim) return false;
        auto const m = r.matrix();
        for (qkgeom::index_t i = 0; i < v.rows(); ++i)
            for (qkgeom::index_t c = 0; c < v.cols(); ++c)
                if (v(i, c) != m(i, c)) return false;
        return tr.position == r.position && tr.bucket == r.bucket && tr.example_id == r.example_id;
    };
    for (auto const& id : heads) {
        INFO("layer " << id.layer << " q_head " << id.q_head << " k_head " << id.k_head);
        auto const h = st.head(id);
        CHECK(h.id == id);
        auto const& q = st.rows(id.layer, kind::query, id.q_head);
        auto const& k = st.rows(id.layer, kind::key, id.k_head);
        REQUIRE(q.rows() > 0);
        REQUIRE(k.rows() > 0);
        CHECK(same_rows(h.queries, q));
        CHECK(same_rows(h.keys, k));
        // Keys are the k head's rows, not the q head's (the two kinds are sampled independently).
        CHECK_FALSE(h.keys.position == h.queries.position);
        REQUIRE(h.facts.buckets.has_value());
        CHECK(*h.facts.buckets == smp.buckets);
        CHECK(h.facts.sliding_window == (id.layer == 1 ? 32 : 0));
        CHECK(h.facts.context_length == 0);
    }
    // A head outside the plan, including a planned q head with another k head.
    CHECK_THROWS_AS(st.head({0, 1, 0}), std::invalid_argument);
    CHECK_THAT(invalid_argument_of([&] { (void)st.head({0, 1, 0}); }),
               Contains("qkgeom::capture_store::head") && Contains("not a planned head") && Contains("layer 0") &&
                   Contains("k_head 0") && Contains("q_head (value 1)"));
    CHECK_THAT(invalid_argument_of([&] { (void)st.head({1, 2, 0}); }),
               Contains("not a planned head") && Contains("layer 1") && Contains("k_head 0") &&
                   Contains("q_head (value 2)"));
    CHECK_THAT(invalid_argument_of([&] { (void)st.head({2, 0, 0}); }),
               Contains("not a planned head") && Contains("layer 2") && Contains("q_head (value 0)"));
}

TEST_CASE("capture: stores merge by appending, the merge order is irrelevant to the kept set", "[capture]") {
    auto const layout = qkgeom::uniform_layout(1, 2, 2, 4);
    auto const heads = qkgeom::eligible_heads(layout);
    qkgeom::capture_sampler const smp{{bucket_scheme::log, 4, 2.0}, 11};
    qkgeom::capture_store<double> whole(layout, heads, smp), a(layout, heads, smp), b(layout, heads, smp);
    std::mt19937_64 gen(5);
    std::normal_distribution<double> nd;
    for (std::int64_t e = 0; e < 6; ++e) {
        Eigen::MatrixXd x(300, 4);
        for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = nd(gen);
        std::vector<std::int64_t> pos(300), ex(300, e);
        for (std::int64_t t = 0; t < 300; ++t) pos[static_cast<std::size_t>(t)] = t;
        whole.add(0, kind::key, 1, x, pos, ex);
        (e % 2 == 0 ? a : b).add(0, kind::key, 1, x, pos, ex);
    }
    auto ab = a;
    ab += b;
    auto ba = b;
    ba += a;
    auto key = [](qkgeom::captured_rows<double> const& r) {
        std::multiset<std::vector<double>> s;
        for (std::int64_t i = 0; i < r.rows(); ++i) {
            std::vector<double> row(r.values.begin() + i * 4, r.values.begin() + i * 4 + 4);
            row.push_back(static_cast<double>(r.position[static_cast<qkgeom::index_t>(i)]));
            row.push_back(static_cast<double>(r.example_id[static_cast<qkgeom::index_t>(i)]));
            s.insert(row);
        }
        return s;
    };
    CHECK(key(ab.rows(0, kind::key, 1)) == key(whole.rows(0, kind::key, 1)));
    CHECK(key(ba.rows(0, kind::key, 1)) == key(whole.rows(0, kind::key, 1)));
    qkgeom::capture_store<double> other(layout, heads, {smp.buckets, 12});
    CHECK_THAT(invalid_argument_of([&] { other += a; }), Contains("seed") && Contains("value 11"));
}

TEST_CASE("parallel_for: every task runs exactly once, the first error stops new tasks and is rethrown", "[capture]") {
    for (unsigned jobs : {0U, 1U, 2U, 7U}) {
        std::vector<std::atomic<int>> hits(1000);
        qkgeom::parallel_for(hits.size(), jobs, [&](std::size_t i) { hits[i].fetch_add(1); });
        for (auto const& h : hits) REQUIRE(h.load() == 1);
    }
    qkgeom::parallel_for(0, 4, [](std::size_t) { FAIL("no task for n = 0"); });
    for (unsigned jobs : {1U, 2U}) {
        std::atomic<int> started{0};
        CHECK_THAT(invalid_argument_of([&] {
                       qkgeom::parallel_for(10000, jobs, [&](std::size_t i) {
                           started.fetch_add(1);
                           if (i == 3) throw std::invalid_argument("task 3 failed");
                       });
                   }),
                   Contains("task 3 failed"));
        // One worker takes tasks in order: nothing after the failing task starts.
        if (jobs == 1) CHECK(started.load() == 4);
    }
}

TEST_CASE("capture: add_selected checks every kept index and value before the store changes", "[capture][errors]") {
    auto layout = qkgeom::uniform_layout(1, 2, 1, 3, 64);
    std::vector<head_id> const heads{{0, 1, 0}};
    qkgeom::capture_store<float> st(layout, heads, {{bucket_scheme::uniform, 8, 2.0}, 3});
    Eigen::MatrixXd x(4, 3);
    x << 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12;
    std::vector<std::int64_t> const pos{0, 1, 2, 3}, ex{0, 0, 0, 0};
    std::vector<std::int64_t> const good{0, 2};
    CHECK(st.add_selected(0, kind::query, 1, x, pos, ex, good) == 2);
    auto const& r = st.rows(0, kind::query, 1);
    auto const values = r.values;
    auto consistent = [&] {
        return r.values == values && r.rows() == 2 && r.bucket.size() == 2 && r.example_id.size() == 2;
    };
    // a duplicate index
    CHECK_THAT(invalid_argument_of([&] { st.add_selected(0, kind::query, 1, x, pos, ex, std::vector<std::int64_t>{1, 1}); }),
               Contains("duplicate index") && Contains("value 1"));
    CHECK(consistent());
    // an index out of range after a valid one
    CHECK_THAT(invalid_argument_of([&] { st.add_selected(0, kind::query, 1, x, pos, ex, std::vector<std::int64_t>{1, 4}); }),
               Contains("out of range") && Contains("value 4"));
    CHECK(consistent());
    // a negative position of a kept row
    auto neg = pos;
    neg[3] = -5;
    CHECK_THAT(invalid_argument_of([&] { st.add_selected(0, kind::query, 1, x, neg, ex, std::vector<std::int64_t>{1, 3}); }),
               Contains("negative position") && Contains("-5"));
    CHECK(consistent());
    // a non-finite value in the last kept row: nothing of the earlier rows is stored
    auto bad = x;
    bad(3, 2) = std::numeric_limits<double>::quiet_NaN();
    CHECK_THAT(invalid_argument_of([&] { st.add_selected(0, kind::query, 1, bad, pos, ex, std::vector<std::int64_t>{1, 3}); }),
               Contains("non-finite value at row 3, column 2"));
    CHECK(consistent());
}

TEST_CASE("parallel_for: every task runs once whatever the thread count", "[capture][parallel]") {
    for (unsigned jobs : {0U, 1U, 3U, 64U}) {
        std::vector<std::atomic<int>> hits(50);
        qkgeom::parallel_for(hits.size(), jobs, [&](std::size_t i) { ++hits[i]; });
        CHECK(std::all_of(hits.begin(), hits.end(), [](auto const& h) { return h.load() == 1; }));
    }
}

}  // namespace qkgeom_tests_capture_test
