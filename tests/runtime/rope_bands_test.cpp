// Tests of qkgeom::rope_bands (docs/beyond-rope.md): planted pre-RoPE means
// and per-band content variances, RoPE applied with known settings, and the
// checks that must pass (consistent) or fail (wrong pairing, pre-RoPE rows,
// wrong scaling); brute-force v shares; option and settings errors.
#include <qkgeom/beyond/rope_bands.hpp>

#include "test_util.hpp"

#include <catch2/catch.hpp>

#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_rope_bands_test {

namespace {

using qkgeom::index_t;
using qkgeom::rope_pairing;
using qkgeom::rope_status;

/// A planted head: d = 24, rotary_dim 16 (8 pairs), uniform buckets of 256
/// over 4096 tokens, `per_cell` query and key rows per (example, bucket).
/// Pre-RoPE rows: mean μ (magnitude `mean_mag` on every rotary pair, zero on
/// the plain block) + sd[j]·ε. RoPE (pairing, theta 10000, positions / factor)
/// is applied unless `apply` is false.
struct planted {
    std::uint64_t seed = 1;
    rope_pairing pairing = rope_pairing::rotate_half;
    double factor = 1.0;
    bool apply = true;
    double mean_mag = 2.0;
    std::int64_t examples = 100;
    std::int64_t per_cell = 2;
    std::vector<double> sd = std::vector<double>(24, 1.0);
};

constexpr index_t kd = 24, kr = 16;

void fill(qkgeom::token_rows<qkgeom::row_matrix>& rows, planted const& p, std::mt19937_64& rng, bool keys) {
    std::normal_distribution<double> z(0.0, 1.0);
    std::uniform_int_distribution<std::int64_t> off(0, 255);
    Eigen::VectorXd mu = Eigen::VectorXd::Zero(kd);
    for (index_t i = 0; i < kr / 2; ++i) {  // pair i: angle i, magnitude mean_mag (keys: another angle)
        double const a = 0.7 * double(i) + (keys ? 1.3 : 0.0);
        mu(i) = p.mean_mag * std::cos(a), mu(i + kr / 2) = p.mean_mag * std::sin(a);
    }
    std::int64_t const n = p.examples * 16 * p.per_cell;
    rows.vectors.resize(n, kd);
    index_t r = 0;
    for (std::int64_t e = 0; e < p.examples; ++e)
        for (std::int64_t b = 0; b < 16; ++b)
            for (std::int64_t c = 0; c < p.per_cell; ++c, ++r) {
                std::int64_t const t = b * 256 + off(rng);
                Eigen::VectorXd x(kd);
                for (index_t j = 0; j < kd; ++j) x(j) = mu(j) + p.sd[std::size_t(j)] * z(rng);
                if (p.apply) {  // rotate_half (i, i + 8) rotation, then relabel for interleaved
                    Eigen::VectorXd y = x;
                    for (index_t i = 0; i < kr / 2; ++i) {
                        double const f = std::pow(10000.0, -2.0 * double(i) / double(kr)) / p.factor;
                        double const cs = std::cos(double(t) * f), sn = std::sin(double(t) * f);
                        index_t const j1 = p.pairing == rope_pairing::rotate_half ? i : 2 * i;
                        index_t const j2 = p.pairing == rope_pairing::rotate_half ? i + kr / 2 : 2 * i + 1;
                        y(j1) = x(i) * cs - x(i + kr / 2) * sn;  // pair i's content is (x_i, x_{i+8})
                        y(j2) = x(i) * sn + x(i + kr / 2) * cs;
                    }
                    x = y;
                }
                rows.vectors.row(r) = x.transpose();
                rows.position.values().push_back(t);
                rows.bucket.values().push_back(b);
                rows.example_id.values().push_back(e);
            }
}

qkgeom::head_capture<> make_head(planted const& p) {
    std::mt19937_64 rng(p.seed);
    qkgeom::head_capture<> h;
    h.facts.buckets = qkgeom::bucket_spec{qkgeom::bucket_scheme::uniform, 256};
    h.facts.context_length = 4096;
    fill(h.queries, p, rng, false);
    fill(h.keys, p, rng, true);
    qkgeom::rope_spec s;
    s.pairing = p.pairing;
    s.rotary_dim = kr;
    if (p.factor != 1.0) s.scaling = "linear", s.scaling_factor = p.factor;
    h.facts.rope = s;
    return h;
}

}  // namespace

TEST_CASE("rope_bands: post-RoPE rows with the right settings are consistent", "[rope]") {
    for (auto pairing : {rope_pairing::rotate_half, rope_pairing::interleaved}) {
        planted p;
        p.pairing = pairing;
        auto const h = make_head(p);
        auto const r = qkgeom::rope_bands(h);
        INFO("pairing " << qkgeom::rope_pairing_name(pairing) << " coherence " << r.coherence << " raw "
                        << r.coherence_raw);
        CHECK(r.status == rope_status::consistent);
        CHECK(r.queries.status == rope_status::consistent);
        CHECK(r.keys.status == rope_status::consistent);
        CHECK(r.queries.powered_pairs >= 3);
        CHECK(r.coherence > 0.95);
        CHECK(r.coherence_raw < 0.5);  // the rows as given rotate
        CHECK(r.queries.coherence_min > 0.8);
        CHECK(r.queries.mirror_max < 0.2);  // each pair rotates in one sense
        CHECK(r.keys.mirror_max < 0.2);
        REQUIRE(r.pairs.size() == 8);
        REQUIRE(r.bands.size() == 8 + 1);  // 8 bands of one pair, plus the unrotated band
        CHECK_FALSE(r.bands.back().rotary);
        CHECK(r.bands.back().n_coords == kd - kr);
    }
}

TEST_CASE("rope_bands: the other pairing, pre-RoPE rows and a wrong scaling are flagged", "[rope]") {
    SECTION("wrong pairing") {
        for (auto pairing : {rope_pairing::rotate_half, rope_pairing::interleaved}) {
            planted p;
            p.pairing = pairing;
            p.mean_mag = 0.5;  // weak mean: pair 0 alone is powered, half demodulated (coordinate 0 is in
                               // pair 0 under both pairings): only the mirror check sees it
            auto h = make_head(p);
            h.facts.rope->pairing =
                pairing == rope_pairing::rotate_half ? rope_pairing::interleaved : rope_pairing::rotate_half;
            auto const r = qkgeom::rope_bands(h);
            INFO("coherence " << r.coherence << " q " << r.queries.coherence << " k " << r.keys.coherence);
            CHECK(r.status == rope_status::inconsistent);
            CHECK(r.pairs[0].query.powered);
            CHECK(r.pairs[0].query.mirror_ratio > 0.5);
        }
    }
    SECTION("rows captured before RoPE, settings saying post-RoPE") {
        planted p;
        p.apply = false;
        auto const r = qkgeom::rope_bands(make_head(p));
        INFO("coherence " << r.coherence << " raw " << r.coherence_raw);
        CHECK(r.status == rope_status::inconsistent);
        CHECK(r.coherence < 0.3);
        CHECK(r.coherence_raw > 0.9);  // the rows as given have the stable mean
    }
    SECTION("linear scaling: round trip, and the scaling left out") {
        planted p;
        p.factor = 4.0;
        auto h = make_head(p);
        auto const r = qkgeom::rope_bands(h);
        INFO("coherence " << r.coherence);
        CHECK(r.status == rope_status::consistent);
        CHECK(r.pairs[0].frequency == Approx(0.25).epsilon(1e-12));
        h.facts.rope->scaling = "none";
        h.facts.rope->scaling_factor = 1.0;
        CHECK(qkgeom::rope_bands(h).status == rope_status::inconsistent);
    }
}

TEST_CASE("rope_bands: the angle tables agree with direct cos/sin", "[rope]") {
    namespace rd = qkgeom::detail::rope;
    std::vector<double> const f = {1.0, 0.1, 1e-3, 1e-6};
    rd::trig_table const tab(f, 5000), direct(f, rd::trig_table::direct_from);
    REQUIRE(direct.lc.empty());
    qkgeom::rope_spec spec;  // only the layout is used: 4 pairs in one band,
    spec.rotary_dim = 8;     // first coordinates at columns 0..3, second ones at 4..7
    rd::geometry const g = rd::make_geometry(spec, 8, 1, 1.0);
    REQUIRE(g.bands.size() == 1);
    for (std::int64_t t : {0, 1, 70, 71, 4999, 5000}) {
        double ca[4], sa[4], cb[4], sb[4];
        tab.angles(t, ca, sa);
        direct.angles(t, cb, sb);
        for (int j = 0; j < 4; ++j) {
            CHECK(ca[j] == Approx(std::cos(double(t) * f[std::size_t(j)])).margin(1e-12));
            CHECK(sa[j] == Approx(std::sin(double(t) * f[std::size_t(j)])).margin(1e-12));
            CHECK(cb[j] == Approx(std::cos(double(t) * f[std::size_t(j)])).margin(1e-15));
        }
        // R(t)ᵀ applied to pair j = (x_j, x_{j+4}) by hand, R(t) for the mirror sums, the frames' sums
        double const x[8] = {1, 3, 5, 7, 2, 4, 6, 8};
        double u[8];
        rd::pair_energy raw(g), rot(g);
        rd::unrotate_row(g, x, u, ca, sa, raw, rot);
        rd::unrotate_row(g, x, u, ca, sa, raw, rot);  // twice: the sums add
        for (int j = 0; j < 4; ++j) {
            double const c = std::cos(double(t) * f[std::size_t(j)]), s = std::sin(double(t) * f[std::size_t(j)]);
            double const p = x[j], q = x[j + 4];
            CHECK(u[j] == Approx(c * p + s * q).margin(1e-12));
            CHECK(u[j + 4] == Approx(c * q - s * p).margin(1e-12));
            CHECK(rot.r1[std::size_t(j)] == Approx(2 * (c * p - s * q)).margin(1e-12));
            CHECK(rot.r2[std::size_t(j)] == Approx(2 * (s * p + c * q)).margin(1e-12));
            CHECK(raw.cs[std::size_t(j)] == 2 * p);
            CHECK(raw.cq[std::size_t(j + 4)] == 2 * q * q);
            CHECK(rot.cs[std::size_t(j)] == Approx(2 * u[j]).epsilon(1e-15));
            CHECK(rot.cq[std::size_t(j)] + rot.cq[std::size_t(j + 4)] == Approx(2 * (p * p + q * q)).epsilon(1e-14));
        }
    }
}

TEST_CASE("rope_bands: the band Gram update equals the brute-force sum over the rows", "[rope]") {
    namespace rd = qkgeom::detail::rope;
    std::mt19937_64 rng(17);
    std::normal_distribution<double> nd;
    qkgeom::index_t const n = 37, d = 13;
    rd::rmat x(n, d);
    for (qkgeom::index_t i = 0; i < n; ++i)
        for (qkgeom::index_t j = 0; j < d; ++j) x(i, j) = nd(rng) + 0.1 * double(j);
    for (std::vector<qkgeom::index_t> const& cols : {std::vector<qkgeom::index_t>{0, 3, 4, 12, 7},
                                                    std::vector<qkgeom::index_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}) {
        auto const w = qkgeom::index_t(cols.size());
        rd::dmat C = rd::dmat::Constant(w, w, 0.5);  // the update adds to the lower triangle
        rd::gram_update gu;
        gu.add(x.data(), d, n, cols, C);
        for (qkgeom::index_t j = 0; j < w; ++j)
            for (qkgeom::index_t i = j; i < w; ++i) {
                double s = 0.5;
                for (qkgeom::index_t k = 0; k < n; ++k) s += x(k, cols[std::size_t(i)]) * x(k, cols[std::size_t(j)]);
                CHECK(C(i, j) == Approx(s).epsilon(1e-13));
            }
        CHECK(C(0, w - 1) == 0.5);  // the upper triangle is not touched
    }
}

TEST_CASE("rope_bands: the register-blocked pair loop gives the row loop's sums at every level", "[rope]") {
    namespace rd = qkgeom::detail::rope;
    std::mt19937_64 rng(23);
    std::normal_distribution<double> nd;
    std::uniform_int_distribution<std::int64_t> pos(0, 999);
    for (index_t const h : {index_t(13), index_t(32)}) {  // 13: a tail of pairs past the vector chunks
        qkgeom::rope_spec spec;
        spec.rotary_dim = 2 * h;
        index_t const d = 2 * h + 3, n = 41;
        rd::geometry const g = rd::make_geometry(spec, d, 3, 1.0);
        rd::trig_table const tt(g.freq, 999);
        rd::rmat x(n, d);
        std::vector<std::int64_t> t(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) {
            t[std::size_t(i)] = pos(rng);
            for (index_t j = 0; j < d; ++j) x(i, j) = nd(rng) + 0.3 * double(j % 5);
        }
        rd::pair_energy raw0(g), rot0(g);  // the row loop (the generic level's path)
        std::vector<double> u0(static_cast<std::size_t>(n * g.r)), cs(static_cast<std::size_t>(h)), sn(cs);
        for (index_t r = 0; r < n; ++r) {
            tt.angles(t[std::size_t(r)], cs.data(), sn.data());
            rd::unrotate_row(g, x.row(r).data(), u0.data() + r * g.r, cs.data(), sn.data(), raw0, rot0);
        }
        for (auto level : {qkgeom::simd::isa::generic, qkgeom::simd::isa::avx2, qkgeom::simd::isa::avx512}) {
            if (level > qkgeom::simd::detected()) continue;
            CAPTURE(h, qkgeom::simd::isa_name(level));
            rd::pair_energy raw(g), rot(g);
            std::vector<double> u(std::size_t(n * g.r), -1.0);
            std::vector<index_t> work;
            rd::unrotate_bucket(level, g, tt, x, t.data(), n, u.data(), raw, rot, work);
            CHECK(u == u0);  // multiply then add in the row loop's order: equal bit for bit
            CHECK(raw.cs == raw0.cs);
            CHECK(raw.cq == raw0.cq);
            CHECK(rot.cs == rot0.cs);
            CHECK(rot.cq == rot0.cq);
            CHECK(rot.r1 == rot0.r1);
            CHECK(rot.r2 == rot0.r2);
            std::vector<double> mu(static_cast<std::size_t>(d)), acc(static_cast<std::size_t>(d), 0.25);
            for (index_t j = 0; j < d; ++j) mu[std::size_t(j)] = 0.1 * double(j);
            qkgeom::detail::ropek::sq_residual(level, x.data(), d, n, mu.data(), d, acc.data());  // acc = the sums
            std::vector<double> sums(mu);  // col_sums adds to what is there
            qkgeom::detail::ropek::col_sums(level, x.data(), d, n, d, sums.data());
            for (index_t j = 0; j < d; ++j) {
                double s = 0, t1 = mu[std::size_t(j)];
                for (index_t r = 0; r < n; ++r) {
                    s += (x(r, j) - mu[std::size_t(j)]) * (x(r, j) - mu[std::size_t(j)]);
                    t1 += x(r, j);
                }
                CHECK(acc[std::size_t(j)] == Approx(s).epsilon(1e-14));
                CHECK(sums[std::size_t(j)] == Approx(t1).epsilon(1e-14));
            }
        }
    }
}

TEST_CASE("rope_bands: key groups packed into the band panels give the brute-force band Gram blocks", "[rope]") {
    namespace rd = qkgeom::detail::rope;
    std::mt19937_64 rng(29);
    std::normal_distribution<double> nd;
    qkgeom::rope_spec spec;
    spec.rotary_dim = 10;  // 5 pairs in 2 bands of 2 and 3 pairs: panels straddle the two runs; 4 plain columns
    spec.pairing = rope_pairing::interleaved;
    index_t const d = 14, n = 23;
    rd::geometry const g = rd::make_geometry(spec, d, 2, 1.0);
    REQUIRE(g.bands.size() == 3);
    struct rows_t {
        std::vector<std::int64_t> example, bucket;
    } k;
    for (index_t i = 0; i < n; ++i) k.example.push_back(i < 5 ? 0 : i < 6 ? 1 : i < 15 ? 2 : 3), k.bucket.push_back(4);
    rd::rmat x(n, d);
    for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < d; ++j) x(i, j) = nd(rng) + double(k.example[std::size_t(i)]) * 0.5 * double(j);
    for (auto level : qkgeom_test::isa_levels_to_run("key prefix")) {
        CAPTURE(qkgeom::simd::isa_name(level));
        qkgeom::simd::scoped_limit const cap(level);
        rd::key_prefix kp(g);
        kp.add_cell(k, 0, n, x, g);
        REQUIRE(kp.pairs.back() == 10 + 0 + 36 + 28);  // pairs within examples: 5, 1, 9 and 8 keys
        for (std::size_t b = 0; b < g.bands.size(); ++b) {
            auto const& cols = g.band_cols[b];
            for (std::size_t j = 0; j < cols.size(); ++j)
                for (std::size_t i = j; i < cols.size(); ++i) {
                    double s = 0;  // Σ over same-example pairs of Δ_i Δ_j
                    for (index_t p = 0; p < n; ++p)
                        for (index_t q = p + 1; q < n; ++q)
                            if (k.example[std::size_t(p)] == k.example[std::size_t(q)])
                                s += (x(p, cols[i]) - x(q, cols[i])) * (x(p, cols[j]) - x(q, cols[j]));
                    CHECK(kp.pref.back()[b](index_t(i), index_t(j)) == Approx(s).epsilon(1e-12));
                }
        }
    }
}

TEST_CASE("rope_bands: dense cluster ids by counting equal those by sorting", "[rope]") {
    namespace rd = qkgeom::detail::rope;
    std::vector<std::int64_t> const small = {7, 3, 3, 9, 7, 12, 3, -2};
    std::vector<std::int64_t> big;  // the same order of ids spread past the counting range
    for (auto e : small) big.push_back(e * (std::int64_t{1} << 40));
    rd::content_acc const a(small, 2), b(big, 2);
    CHECK(a.n_clusters == 5);
    CHECK(b.n_clusters == 5);
    CHECK(a.cluster_of == std::vector<std::int64_t>{2, 1, 1, 3, 2, 4, 1, 0});
    CHECK(b.cluster_of == a.cluster_of);
}

TEST_CASE("rope_bands: no signal and no settings give statuses and NaN", "[rope]") {
    planted p;
    p.mean_mag = 0.0;  // zero pre-RoPE mean: nothing to check
    auto h = make_head(p);
    auto r = qkgeom::rope_bands(h);
    CHECK(r.status == rope_status::undetermined);
    CHECK(r.queries.powered_pairs == 0);
    CHECK(std::isnan(r.coherence));
    CHECK(std::isfinite(r.bands[0].content_var_share));  // the bands do not need the mean
    h.facts.rope->scaling = "yarn";
    h.facts.rope->scaling_factor = 4.0;
    r = qkgeom::rope_bands(h);
    CHECK(r.status == rope_status::unsupported_scaling);
    CHECK(std::isnan(r.coherence));
    CHECK(r.bands.empty());
    h.facts.rope.reset();
    r = qkgeom::rope_bands(h);
    CHECK(r.status == rope_status::not_applicable);
    CHECK(std::isnan(r.coherence));
    CHECK(std::string(qkgeom::rope_status_name(r.status)) == "not_applicable");
    planted tiny;
    tiny.examples = 1, tiny.per_cell = 1;  // one row per bucket
    r = qkgeom::rope_bands(make_head(tiny));
    CHECK(r.status == rope_status::too_few_rows);
    CHECK(std::isnan(r.bands[0].content_var_share));
}

TEST_CASE("rope_bands: planted per-band content variance shares within their standard errors", "[rope]") {
    // sd per coordinate: rotary pair i has sd 0.5 + 0.25 i on both coordinates, plain coordinates 1.5.
    planted p;
    for (index_t i = 0; i < kr / 2; ++i) p.sd[std::size_t(i)] = p.sd[std::size_t(i + kr / 2)] = 0.5 + 0.25 * double(i);
    for (index_t j = kr; j < kd; ++j) p.sd[std::size_t(j)] = 1.5;
    double total = 0;
    for (double s : p.sd) total += s * s;
    qkgeom::rope_band_options opt;
    opt.n_bands = 4;  // 2 pairs per band
    std::vector<double> truth;
    for (index_t k = 0; k < 4; ++k) {
        double const a = p.sd[std::size_t(2 * k)], b = p.sd[std::size_t(2 * k + 1)];
        truth.push_back(2 * (a * a + b * b) / total);
    }
    truth.push_back(double(kd - kr) * 2.25 / total);
    int const n_seeds = 30;
    std::vector<double> sum(5, 0.0), sum2(5, 0.0), se_sum(5, 0.0);
    for (int s = 0; s < n_seeds; ++s) {
        p.seed = 100 + std::uint64_t(s);
        auto const r = qkgeom::rope_bands(make_head(p), opt);
        REQUIRE(r.bands.size() == 5);
        CHECK(r.clusters_are_examples);
        double share_sum = 0;
        for (std::size_t k = 0; k < 5; ++k) {
            double const est = r.bands[k].content_var_share, se = r.bands[k].content_var_share_se;
            INFO("seed " << s << " band " << k << " est " << est << " truth " << truth[k] << " se " << se);
            CHECK(std::abs(est - truth[k]) < 3 * se);
            sum[k] += est, sum2[k] += est * est, se_sum[k] += se;
            share_sum += est;
        }
        CHECK(share_sum == Approx(1.0).epsilon(1e-12));
    }
    for (std::size_t k = 0; k < 5; ++k) {  // the SE is about the spread over seeds
        double const m = sum[k] / n_seeds;
        double const sd = std::sqrt((sum2[k] - n_seeds * m * m) / (n_seeds - 1));
        double const ratio = (se_sum[k] / n_seeds) / sd;
        INFO("band " << k << " mean SE / sd over seeds = " << ratio);
        CHECK(ratio > 0.65);
        CHECK(ratio < 1.5);
    }
}

TEST_CASE("rope_bands: v shares against brute force over the pairs", "[rope]") {
    planted p;
    p.examples = 20;
    p.per_cell = 3;
    for (index_t j = 0; j < kd; ++j) p.sd[std::size_t(j)] = 0.3 + 0.1 * double(j % 7);
    auto h = make_head(p);
    h.facts.sliding_window = 1024;  // key buckets b − 4 .. b − 1
    qkgeom::rope_band_options opt;
    opt.n_bands = 3;  // pairs {0,1,2}, {3,4,5}, {6,7}, unrotated
    auto const r = qkgeom::rope_bands(h, opt);
    REQUIRE(r.bands.size() == 4);
    CHECK(r.bands[0].n_pairs == 2);  // ⌊k·8/3⌋ boundaries: 0, 2, 5, 8
    CHECK(r.bands[1].n_pairs == 3);
    CHECK(r.bands[2].n_pairs == 3);
    std::vector<std::vector<index_t>> cols = {{0, 1, 8, 9}, {2, 3, 4, 10, 11, 12}, {5, 6, 7, 13, 14, 15}, {}};
    for (index_t j = kr; j < kd; ++j) cols[3].push_back(j);
    auto const& Q = h.queries.vectors;
    auto const& K = h.keys.vectors;
    REQUIRE(r.buckets.size() == 16);
    for (auto const& bb : r.buckets) {
        double share_sum = 0;
        for (double v : bb.v_share) share_sum += v;
        if (bb.bucket == 0) {
            CHECK(bb.n_pairs == 0);
            CHECK(std::isnan(bb.v_share[0]));
            continue;
        }
        CHECK(share_sum == Approx(1.0).epsilon(1e-12));
        // brute force: Σ_b from the bucket's query rows; every pair of one example's keys in one admissible bucket
        std::vector<index_t> qrows;
        for (index_t i = 0; i < Q.rows(); ++i)
            if (h.queries.bucket[i] == bb.bucket) qrows.push_back(i);
        Eigen::MatrixXd X(index_t(qrows.size()), kd);
        for (std::size_t i = 0; i < qrows.size(); ++i) X.row(index_t(i)) = Q.row(qrows[i]);
        Eigen::MatrixXd const Xc = X.rowwise() - X.colwise().mean();
        Eigen::MatrixXd const S = Xc.transpose() * Xc;
        std::vector<double> V(4, 0.0);
        std::int64_t npairs = 0;
        for (index_t i = 0; i < K.rows(); ++i)
            for (index_t j = i + 1; j < K.rows(); ++j) {
                auto const c = h.keys.bucket[i];
                if (c != h.keys.bucket[j] || h.keys.example_id[i] != h.keys.example_id[j]) continue;
                if (c >= bb.bucket || c < bb.bucket - 4) continue;
                ++npairs;
                Eigen::VectorXd const dlt = (K.row(i) - K.row(j)).transpose();
                for (std::size_t band = 0; band < 4; ++band)
                    for (index_t a : cols[band])
                        for (index_t b : cols[band]) V[band] += dlt(a) * S(a, b) * dlt(b);
            }
        CHECK(bb.n_pairs == npairs);
        double const tot = V[0] + V[1] + V[2] + V[3];
        for (std::size_t band = 0; band < 4; ++band)
            CHECK(bb.v_share[band] == Approx(V[band] / tot).epsilon(1e-10));
    }
    // the same from the caller's query moments (analyze_head's head_moments::q)
    qkgeom::bucketed_moments qm(kd);
    qm.add(h.queries.vectors, h.queries.position, h.queries.bucket);
    auto const rm = qkgeom::rope_bands(h, opt, &qm);
    REQUIRE(rm.buckets.size() == r.buckets.size());
    for (std::size_t i = 1; i < r.buckets.size(); ++i)
        for (std::size_t band = 0; band < 4; ++band)
            CHECK(rm.buckets[i].v_share[band] == Approx(r.buckets[i].v_share[band]).epsilon(1e-10));
    qkgeom::bucketed_moments other(kd);  // moments of other rows: refused
    qkgeom::row_matrix const some_keys = h.keys.vectors.topRows(100);
    std::vector<std::int64_t> const some_pos(h.keys.position.begin(), h.keys.position.begin() + 100);
    std::vector<std::int64_t> const some_bucket(h.keys.bucket.begin(), h.keys.bucket.begin() + 100);
    other.add(some_keys, qkgeom::token_positions(some_pos), qkgeom::token_buckets(some_bucket));
    CHECK_THROWS_WITH(qkgeom::rope_bands(h, opt, &other), Catch::Contains("query_moments"));
    // head summary: quintile 0 = buckets 0..3 (τ < 819.2), quintile 4 = buckets 13..15
    double w = 0, acc = 0;
    for (auto const& bb : r.buckets)
        if (bb.bucket >= 13) acc += double(bb.n_queries) * bb.v_share[1], w += double(bb.n_queries);
    CHECK(r.bands[1].v_share_last_20pct == Approx(acc / w).epsilon(1e-12));
}

TEST_CASE("rope_bands: bad options and settings throw naming the field", "[rope]") {
    planted p;
    p.examples = 4;
    auto h = make_head(p);
    auto throws_with = [&](qkgeom::rope_band_options const& o, std::string const& field) {
        try {
            (void)qkgeom::rope_bands(h, o);
            FAIL("no exception for " << field);
        } catch (std::invalid_argument const& e) {
            INFO(e.what());
            CHECK(std::string(e.what()).find(field) != std::string::npos);
        }
    };
    qkgeom::rope_band_options o;
    o.n_bands = 0;
    throws_with(o, "n_bands");
    o = {};
    o.min_angle_span = std::numeric_limits<double>::quiet_NaN();
    throws_with(o, "min_angle_span");
    o = {};
    o.min_energy_z = -1;
    throws_with(o, "min_energy_z");
    o = {};
    o.consistent_above = 1.5;
    throws_with(o, "consistent_above");
    o = {};
    o.inconsistent_below = 0.9;
    throws_with(o, "inconsistent_below");
    o = {};
    o.min_bucket_rows = 1;
    throws_with(o, "min_bucket_rows");
    o = {};
    o.max_mirror_ratio = 0;
    throws_with(o, "max_mirror_ratio");
    o = {};
    h.facts.rope->rotary_dim = 15;
    throws_with(o, "facts.rope.rotary_dim");
    h.facts.rope->rotary_dim = 26;
    throws_with(o, "facts.rope.rotary_dim");
    h.facts.rope->rotary_dim = 16;
    h.facts.rope->theta = 0;
    throws_with(o, "facts.rope.theta");
    h.facts.rope->theta = 10000;
    h.facts.rope->scaling_factor = 2;  // with "none"
    throws_with(o, "facts.rope.scaling_factor");
    h.facts.rope->scaling = "linear";
    h.facts.rope->scaling_factor = -2;
    throws_with(o, "facts.rope.scaling_factor");
    h.facts.rope->scaling_factor = 2;
    h.queries.vectors(3, 5) = std::numeric_limits<double>::infinity();
    throws_with(o, "row 3");
}

}  // namespace qkgeom_tests_rope_bands_test
