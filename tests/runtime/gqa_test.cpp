// GQA groups (docs/beyond-gqa.md): the one-way analysis of variance of head
// metrics with the key heads as groups. Brute force on hand examples (sums of
// squares by pairwise distances, an independent formula), the F tail against
// Boost.Math, planted group effects (expected mean squares and ratio by
// Monte Carlo; uniform p-values under independence), exclusions and
// degenerate layers, the CSV read back, and an end-to-end check on synthetic
// GQA layers (shared vs mixed drift slopes within groups).
#include <qkgeom/analysis/gqa.hpp>
#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/run/study_read.hpp>
#include <qkgeom/stats/kolmogorov.hpp>

#include <boost/math/distributions/fisher_f.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_gqa_test {

namespace {

using qkgeom::gqa_metric_row;
using qkgeom::head_analysis;
constexpr double k_nan = std::numeric_limits<double>::quiet_NaN();

/// A head with only the fields gqa_groups reads.
head_analysis make_head(std::int64_t layer, std::int64_t q, std::int64_t k, double ap_drop, double bias,
                        std::array<double, 5> quint) {
    head_analysis h;
    h.id = {layer, q, k};
    h.plasticity.ap_drop = ap_drop;
    h.rotation.bias_strength = bias;
    h.plasticity.ap_quintile = quint;
    return h;
}

std::array<double, 5> flat(double x) { return {x, x, x, x, x}; }

gqa_metric_row const& row_of(std::vector<gqa_metric_row> const& rows, std::int64_t layer, std::string const& metric) {
    auto const it = std::find_if(rows.begin(), rows.end(),
                                 [&](auto const& r) { return r.layer == layer && r.metric == metric; });
    REQUIRE(it != rows.end());
    return *it;
}

/// Brute force: SS_within = Σ_g (1/(2 n_g)) Σ_{h,h'} ‖x_h − x_h'‖² (pairwise
/// form), SS_between = SS_total − SS_within with SS_total = (1/(2N)) Σ_{h,h'}.
struct brute {
    double ssw = 0, ssb = 0;
};
brute brute_force(std::map<std::int64_t, std::vector<std::vector<double>>> const& groups) {
    auto d2 = [](std::vector<double> const& a, std::vector<double> const& b) {
        double s = 0;
        for (std::size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
        return s;
    };
    std::vector<std::vector<double>> all;
    brute out;
    for (auto const& [k, g] : groups) {
        double s = 0;
        for (auto const& a : g)
            for (auto const& b : g) s += d2(a, b);
        out.ssw += s / (2.0 * static_cast<double>(g.size()));
        all.insert(all.end(), g.begin(), g.end());
    }
    double tot = 0;
    for (auto const& a : all)
        for (auto const& b : all) tot += d2(a, b);
    out.ssb = tot / (2.0 * static_cast<double>(all.size())) - out.ssw;
    return out;
}

double boost_f_tail(double f, double d1, double d2) {
    return boost::math::cdf(boost::math::complement(boost::math::fisher_f_distribution<double>(d1, d2), f));
}

}  // namespace

TEST_CASE("gqa: the F upper tail agrees with Boost.Math", "[gqa]") {
    int checked = 0;
    for (double d1 : {1.0, 2.0, 3.0, 7.0, 31.0, 250.0, 4000.0})
        for (double d2 : {1.0, 3.0, 24.0, 100.0, 1000.0, 20000.0, 1e5})
            for (double f : {1e-6, 0.01, 0.3, 0.9, 1.0, 1.2, 2.5, 8.0, 40.0, 1e3}) {
                double const ref = boost_f_tail(f, d1, d2), got = qkgeom::detail::f_upper_tail(f, d1, d2);
                INFO("d1 " << d1 << " d2 " << d2 << " f " << f << " boost " << ref << " ours " << got);
                // lgamma and x^a: relative error grows with the degrees of freedom (documented)
                if (ref > 1e-300) CHECK(std::abs(got - ref) <= 2e-13 * (d1 + d2) * ref);
                else CHECK(got < 1e-290);
                ++checked;
            }
    CHECK(checked == 490);
    CHECK(qkgeom::detail::f_upper_tail(0.0, 3, 4) == 1.0);
    CHECK(qkgeom::detail::f_upper_tail(std::numeric_limits<double>::infinity(), 3, 4) == 0.0);
    CHECK(std::isnan(qkgeom::detail::f_upper_tail(k_nan, 3, 4)));
    CHECK(std::isnan(qkgeom::detail::f_upper_tail(1.0, 0, 4)));
}

TEST_CASE("gqa: a hand example against brute force and the printed numbers", "[gqa]") {
    // Layer 3: k_head 0 = {1, 2, 3}, k_head 1 = {5, 7} (AP_drop); means 2, 6, grand 3.6:
    // SS_w = 2 + 2 = 4 (df 3), SS_b = 3·1.6² + 2·2.4² = 19.2 (df 1), ratio = (4/3)/19.2 = 5/72.
    std::vector<head_analysis> h{
        make_head(3, 4, 1, 5, 0.5, {1, 0, 0, 0, 2}),  make_head(3, 0, 0, 1, 1.0, {0, 1, 2, 3, 4}),
        make_head(3, 2, 0, 3, -2., {1, 1, 1, 1, 1}),  make_head(3, 1, 0, 2, 4.0, {2, 0, 1, 0, -1}),
        make_head(3, 3, 1, 7, 0.0, {0, 0, 3, 0, 0}),
    };
    auto const rows = qkgeom::gqa_groups(h);
    REQUIRE(rows.size() == 6);
    auto const& a = row_of(rows, 3, "ap_drop");
    CHECK(a.status == "ok");
    CHECK(a.n_groups == 2);
    CHECK(a.n_shared_groups == 2);
    CHECK(a.n_heads == 5);
    CHECK(a.n_excluded == 0);
    CHECK(a.df_within == 3);
    CHECK(a.df_between == 1);
    CHECK(a.within_var == Approx(4.0 / 3).epsilon(1e-14));
    CHECK(a.between_var == Approx(19.2).epsilon(1e-14));
    CHECK(a.ratio == Approx(5.0 / 72).epsilon(1e-13));
    CHECK(a.p_value == Approx(boost_f_tail(14.4, 1, 3)).epsilon(1e-11));
    // Every metric against the pairwise brute force.
    for (std::string const metric : {"profile", "ap_drop", "bias_strength"}) {
        std::map<std::int64_t, std::vector<std::vector<double>>> g;
        for (auto const& x : h) {
            auto const& q = x.plasticity.ap_quintile;
            g[x.id.k_head].push_back(metric == "profile" ? std::vector<double>(q.begin(), q.end())
                                     : metric == "ap_drop" ? std::vector<double>{x.plasticity.ap_drop}
                                                           : std::vector<double>{x.rotation.bias_strength});
        }
        brute const b = brute_force(g);
        auto const& r = row_of(rows, 3, metric);
        INFO(metric);
        CHECK(r.within_var == Approx(b.ssw / 3).epsilon(1e-12));
        CHECK(r.between_var == Approx(b.ssb / 1).epsilon(1e-12));
        CHECK(r.ratio == Approx((b.ssw / 3) / b.ssb).epsilon(1e-12));
        CHECK(std::isnan(r.p_value) == (metric == "profile"));
        // One layer: the model rows equal the layer rows.
        auto const& m = row_of(rows, -1, metric);
        CHECK(m.within_var == r.within_var);
        CHECK(m.between_var == r.between_var);
        CHECK(m.df_within == r.df_within);
    }
    // Row order: the layer's metrics in gqa_metric_names order, then the model.
    for (std::size_t i = 0; i < 6; ++i) {
        CHECK(rows[i].layer == (i < 3 ? 3 : -1));
        CHECK(rows[i].metric == qkgeom::gqa_metric_names[i % 3]);
    }
}

TEST_CASE("gqa: the model rows pool the layers' sums (layer offsets do not count)", "[gqa]") {
    std::vector<head_analysis> h;
    // Layer 0: groups {0, 2} and {4}; layer 1: groups {100, 101}, {103, 104}; (q_heads numbered per layer).
    h.push_back(make_head(0, 0, 0, 0, 0, flat(0)));
    h.push_back(make_head(0, 1, 0, 2, 0, flat(0)));
    h.push_back(make_head(0, 2, 1, 4, 0, flat(0)));
    for (int i = 0; i < 4; ++i) h.push_back(make_head(1, i, i / 2, std::array{100, 101, 103, 104}[i], 0, flat(0)));
    auto const rows = qkgeom::gqa_groups(h);
    REQUIRE(rows.size() == 9);
    auto const& l0 = row_of(rows, 0, "ap_drop");
    auto const& l1 = row_of(rows, 1, "ap_drop");
    auto const& m = row_of(rows, -1, "ap_drop");
    // Layer 0: SS_w = 2 (df 1), SS_b = 2·(1 − 2)² + (4 − 2)² = 6 (df 1).
    CHECK(l0.within_var == Approx(2.0));
    CHECK(l0.between_var == Approx(6.0));
    // Layer 1: SS_w = 0.5 + 0.5 = 1 (df 2), SS_b = 2·1.5² · 2 = 9 (df 1).
    CHECK(l1.within_var == Approx(0.5));
    CHECK(l1.between_var == Approx(9.0));
    CHECK(m.df_within == 3);
    CHECK(m.df_between == 2);
    CHECK(m.n_groups == 4);
    CHECK(m.n_heads == 7);
    CHECK(m.within_var == Approx(3.0 / 3));
    CHECK(m.between_var == Approx(15.0 / 2));  // not the ≈ 10⁴ a pooled one-way ANOVA over (layer, k_head) gives
    CHECK(m.p_value == Approx(boost_f_tail(7.5, 2, 3)).epsilon(1e-11));
    // bias_strength and the profile are constant: no spread.
    CHECK(row_of(rows, -1, "bias_strength").status == "no_spread");
    CHECK(std::isnan(row_of(rows, -1, "profile").ratio));
}

TEST_CASE("gqa: planted group effects give the expected mean squares and ratio", "[gqa]") {
    // Two layers × G = 8 key heads × n = 4 query heads: x = layer offset + b_g + e,
    // b_g ~ N(0, σ_b²) shared by a group, e ~ N(0, σ_w²) per head. Balanced one-way
    // ANOVA: E MS_w = σ_w², E MS_b = σ_w² + n σ_b²; MS_w/MS_b = c · F(df_w, df_b)
    // with c = σ_w² / (σ_w² + n σ_b²), E = c · df_b / (df_b − 2). The profile's 5
    // coordinates are independent with the same variances: traces 5× and df 5×.
    constexpr int G = 8, n = 4, R = 3000;
    struct planted {
        double sw, sb;
    };
    for (planted const p : {planted{0.1, 1.0}, planted{1.0, 0.0}, planted{0.5, 0.5}}) {
        std::mt19937_64 rng(17 + static_cast<unsigned>(p.sb * 10));
        std::normal_distribution<double> z;
        std::map<std::pair<std::int64_t, std::string>, std::array<std::vector<double>, 3>> got;  // msw, msb, ratio
        std::vector<double> pvals;
        for (int r = 0; r < R; ++r) {
            std::vector<head_analysis> h;
            for (int layer = 0; layer < 2; ++layer)
                for (int g = 0; g < G; ++g) {
                    std::array<double, 7> b{};
                    for (auto& x : b) x = p.sb * z(rng);
                    for (int i = 0; i < n; ++i) {
                        std::array<double, 5> q{};
                        for (int c = 0; c < 5; ++c) q[c] = 10.0 * layer + b[c] + p.sw * z(rng);
                        h.push_back(make_head(layer, g * n + i, g, 50.0 * layer + b[5] + p.sw * z(rng),
                                              -3.0 + b[6] + p.sw * z(rng), q));
                    }
                }
            for (auto const& row : qkgeom::gqa_groups(h)) {
                REQUIRE(row.status == "ok");
                auto& v = got[{row.layer, row.metric}];
                v[0].push_back(row.within_var);
                v[1].push_back(row.between_var);
                v[2].push_back(row.ratio);
                if (row.metric != "profile" && p.sb == 0) pvals.push_back(row.p_value);
            }
        }
        double const c = p.sw * p.sw / (p.sw * p.sw + n * p.sb * p.sb);
        for (auto const& [key, v] : got) {
            bool const prof = key.second == "profile";
            double const dim = prof ? 5 : 1;
            double const dfb = dim * (key.first < 0 ? 2 : 1) * (G - 1);
            std::array<double, 3> const expect{dim * p.sw * p.sw, dim * (p.sw * p.sw + n * p.sb * p.sb),
                                               c * dfb / (dfb - 2)};
            for (std::size_t s = 0; s < 3; ++s) {
                double mean = 0, m2 = 0;
                for (double x : v[s]) mean += x / R;
                for (double x : v[s]) m2 += (x - mean) * (x - mean);
                double const se = std::sqrt(m2 / (R - 1) / R);
                INFO("σ_w " << p.sw << " σ_b " << p.sb << " layer " << key.first << " " << key.second << " stat "
                            << s << " mean " << mean << " expected " << expect[s] << " se " << se);
                CHECK(std::abs(mean - expect[s]) < 4 * se);
            }
        }
        if (p.sb == 0) {  // independent heads: F-test p-values are uniform
            std::sort(pvals.begin(), pvals.end());
            double d = 0;
            double const np = static_cast<double>(pvals.size());
            for (std::size_t i = 0; i < pvals.size(); ++i)
                d = std::max({d, pvals[i] - static_cast<double>(i) / np, static_cast<double>(i + 1) / np - pvals[i]});
            double const pks = qkgeom::kolmogorov_smirnov_sf(static_cast<std::int64_t>(pvals.size()), d);
            INFO("KS D " << d << " p " << pks << " over " << pvals.size() << " p-values");
            CHECK(pks > 1e-3);
        }
    }
}

TEST_CASE("gqa: exclusions, degenerate layers and statuses", "[gqa]") {
    std::vector<head_analysis> h;
    // Layer 0 (GQA 2×2): head 1 has AP_drop NaN, head 3 a NaN quintile.
    h.push_back(make_head(0, 0, 0, 1, 1, flat(1)));
    h.push_back(make_head(0, 1, 0, k_nan, 2, flat(2)));
    h.push_back(make_head(0, 2, 1, 3, 5, flat(3)));
    h.push_back(make_head(0, 3, 1, 4, 7, {1, 2, k_nan, 3, 4}));
    // Layer 1 (MHA): one query head per key head.
    for (int i = 0; i < 3; ++i) h.push_back(make_head(1, i, i, i, i * i, flat(i)));
    // Layer 2 (MQA): one key head.
    for (int i = 0; i < 3; ++i) h.push_back(make_head(2, i, 0, i, i * i, flat(i)));
    // Layer 5: every value non-finite.
    h.push_back(make_head(5, 0, 0, k_nan, std::numeric_limits<double>::infinity(), flat(k_nan)));
    // Layer 6: equal group means (no between spread); layer 7: no within spread.
    for (int i = 0; i < 4; ++i) h.push_back(make_head(6, i, i / 2, (i % 2) ? 3 : 1, 0, flat(0)));
    for (int i = 0; i < 4; ++i) h.push_back(make_head(7, i, i / 2, (i / 2) ? 3 : 1, 0, flat(0)));
    auto const rows = qkgeom::gqa_groups(std::span<head_analysis const>(h));
    REQUIRE(rows.size() == 3 * 6 + 3);
    std::vector<std::int64_t> layers;
    for (auto const& r : rows) layers.push_back(r.layer);
    CHECK(std::is_sorted(layers.begin(), layers.end() - 3));

    auto const& a0 = row_of(rows, 0, "ap_drop");
    CHECK(a0.n_excluded == 1);
    CHECK(a0.n_heads == 3);
    CHECK(a0.n_shared_groups == 1);
    CHECK(a0.within_var == Approx(0.5));          // {3, 4}; {1} alone
    CHECK(a0.between_var == Approx(25.0 / 6));  // (1 − 8/3)² + 2 (3.5 − 8/3)², df 1
    CHECK(row_of(rows, 0, "bias_strength").n_excluded == 0);
    CHECK(row_of(rows, 0, "profile").n_excluded == 1);
    CHECK(row_of(rows, 0, "profile").n_heads == 3);

    auto const& mha = row_of(rows, 1, "ap_drop");
    CHECK(mha.status == "no_shared_key_heads");
    CHECK(std::isnan(mha.within_var));
    CHECK(mha.between_var == Approx(1.0));
    CHECK(std::isnan(mha.ratio));
    CHECK(std::isnan(mha.p_value));
    auto const& mqa = row_of(rows, 2, "bias_strength");
    CHECK(mqa.status == "too_few_groups");
    CHECK(mqa.within_var == Approx(13.0 / 3));  // {0, 1, 4}: SS = 26/3, df 2
    CHECK(std::isnan(mqa.between_var));
    CHECK(std::isnan(mqa.ratio));
    for (auto const& r : rows)
        if (r.layer == 5) {
            CHECK(r.status == "no_heads");
            CHECK(r.n_excluded == 1);
            CHECK(r.n_heads == 0);
            CHECK(std::isnan(r.within_var));
        }
    auto const& nb = row_of(rows, 6, "ap_drop");
    CHECK(nb.status == "ok");
    CHECK(nb.between_var == 0.0);
    CHECK(nb.ratio == std::numeric_limits<double>::infinity());
    CHECK(nb.p_value == 1.0);
    auto const& nw = row_of(rows, 7, "ap_drop");
    CHECK(nw.within_var == 0.0);
    CHECK(nw.ratio == 0.0);
    CHECK(nw.p_value == 0.0);
    CHECK(row_of(rows, 6, "bias_strength").status == "no_spread");
    // The model pools every layer's df: ap_drop df_w = 1 + 0 + 2 + 0 + 2 + 2, df_b = 1 + 2 + 0 + 0 + 1 + 1.
    auto const& m = row_of(rows, -1, "ap_drop");
    CHECK(m.df_within == 7);
    CHECK(m.df_between == 5);
    CHECK(m.n_excluded == 2);
    CHECK(m.status == "ok");

    // No heads: three model rows.
    auto const none = qkgeom::gqa_groups(std::span<head_analysis const>());
    REQUIRE(none.size() == 3);
    for (auto const& r : none) CHECK((r.layer == -1 && r.status == "no_heads"));
}

TEST_CASE("gqa: unrecorded or duplicated head ids are rejected by name", "[gqa]") {
    auto msg = [](std::vector<head_analysis> const& h) {
        try {
            (void)qkgeom::gqa_groups(h);
        } catch (std::invalid_argument const& e) {
            return std::string(e.what());
        }
        return std::string("<nothing thrown>");
    };
    std::vector<head_analysis> h{make_head(0, 0, 0, 1, 1, flat(1)), make_head(0, 1, -1, 1, 1, flat(1))};
    CHECK_THAT(msg(h), Catch::Contains("heads[1].id.k_head") && Catch::Contains("-1"));
    h[1] = make_head(-1, 1, 0, 1, 1, flat(1));
    CHECK_THAT(msg(h), Catch::Contains("heads[1].id.layer"));
    h[1] = make_head(0, -1, 0, 1, 1, flat(1));
    CHECK_THAT(msg(h), Catch::Contains("heads[1].id.q_head"));
    h[1] = make_head(0, 0, 1, 1, 1, flat(1));
    CHECK_THAT(msg(h), Catch::Contains("heads[1].id.q_head") && Catch::Contains("same (layer, q_head)"));
}

TEST_CASE("gqa: gqa_groups.csv has one row per (layer, metric) plus the model rows and reads back", "[gqa]") {
    std::vector<head_analysis> h;
    std::mt19937_64 rng(5);
    std::normal_distribution<double> z;
    for (int layer : {0, 2, 9})
        for (int q = 0; q < 6; ++q)
            h.push_back(make_head(layer, q, q / 3, z(rng), q == 4 ? k_nan : z(rng), {z(rng), z(rng), 0, 1, z(rng)}));
    h.push_back(make_head(4, 0, 0, 1, 1, flat(1)));  // a degenerate layer: nan fields
    auto const rows = qkgeom::gqa_groups(h);
    REQUIRE(rows.size() == 4 * 3 + 3);
    std::ostringstream os;
    qkgeom::report::write_gqa_groups(os, rows);
    auto const t = qkgeom::study::parse_csv(os.str(), "<written>");
    CHECK(t.columns == qkgeom::report::gqa_groups_columns());
    REQUIRE(t.rows.size() == rows.size());
    auto num = [](std::string const& s) {
        double x = 0;
        auto const r = std::from_chars(s.data(), s.data() + s.size(), x);
        REQUIRE(r.ec == std::errc{});
        REQUIRE(r.ptr == s.data() + s.size());
        return x;
    };
    auto same = [&](std::string const& f, double x) {
        if (std::isnan(x)) return f == "nan";
        return std::bit_cast<std::uint64_t>(num(f)) == std::bit_cast<std::uint64_t>(x);
    };
    std::size_t n_nan = 0, n_ok = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        auto const& f = t.rows[i];
        auto const& r = rows[i];
        INFO("row " << i);
        CHECK(f[0] == std::to_string(r.layer));
        CHECK(f[1] == r.metric);
        CHECK(f[2] == std::to_string(r.n_groups));
        CHECK(f[3] == std::to_string(r.n_shared_groups));
        CHECK(f[4] == std::to_string(r.n_heads));
        CHECK(f[5] == std::to_string(r.n_excluded));
        CHECK(f[6] == std::to_string(r.df_within));
        CHECK(f[7] == std::to_string(r.df_between));
        CHECK(same(f[8], r.within_var));
        CHECK(same(f[9], r.between_var));
        CHECK(same(f[10], r.ratio));
        CHECK(same(f[11], r.p_value));
        CHECK(f[12] == r.status);
        n_nan += f[8] == "nan";
        n_ok += f[12] == "ok";
    }
    CHECK(n_nan == 3);  // layer 4
    CHECK(n_ok == 12);
    CHECK(qkgeom::report::gqa_groups_file == "gqa_groups.csv");
}

TEST_CASE("gqa: end to end on synthetic GQA layers (shared vs mixed drift slopes)", "[gqa]") {
    namespace syn = qkgeom::synthetic;
    // 8 query heads on 4 key heads (groups of 2), all key heads alike (no planted
    // per-bucket means). Shared: both heads of key head g drift with slope s_g (s
    // differs between groups). Mixed: every group holds one flat and one strongly
    // drifting head. AP_drop, bias_strength and the profile follow the slope, so the
    // ratio is ≪ 1 when groups share the slope and ≫ 1 when mixed.
    std::array<double, 4> const slopes{0.0, 1.5e-3, 3e-3, 4.5e-3};
    auto analyse = [&](bool shared) {
        std::vector<head_analysis> out;
        for (std::int64_t layer : {0, 1}) {
            syn::layer_spec L;
            L.d = 12;
            L.rotary_dims = 4;
            L.n_q_heads = 8;
            L.n_kv_heads = 4;
            L.layer = layer;
            L.model_seed = 3;
            L.q_heads.assign(8, syn::default_q_head());
            L.kv_heads.assign(4, syn::default_kv_head());
            for (auto& k : L.kv_heads) k.key.bucket_mean_scale = 0.0;
            for (std::size_t q = 0; q < 8; ++q) {
                L.q_heads[q].query.slope = shared ? slopes[q / 2] : slopes[(q % 2) * 3];
                L.q_heads[q].query.bucket_mean_scale = 0.0;
            }
            syn::capture_spec cap;
            cap.n_examples = 8;
            cap.context_length = 1024;
            cap.buckets = {qkgeom::bucket_scheme::uniform, 128, 3.0};
            cap.seed = 11;
            for (auto const& hc : syn::generate_layer(L, cap)) {
                out.push_back(qkgeom::analyze_head(hc));
                REQUIRE(out.back().id.k_head == out.back().id.q_head / 2);
            }
        }
        return qkgeom::gqa_groups(out);
    };
    auto const shared = analyse(true), mixed = analyse(false);
    for (std::string const metric : {"ap_drop", "bias_strength", "profile"}) {
        auto const& s = row_of(shared, -1, metric);
        auto const& m = row_of(mixed, -1, metric);
        INFO(metric << ": shared ratio " << s.ratio << " p " << s.p_value << "; mixed ratio " << m.ratio << " p "
                    << m.p_value);
        REQUIRE(s.status == "ok");
        REQUIRE(m.status == "ok");
        CHECK(s.n_heads == 16);
        CHECK(s.df_between == 6);
        CHECK(s.df_within == 8);
        CHECK(s.ratio < 0.2);
        CHECK(m.ratio > 3.0);
        if (metric != "profile") {
            CHECK(s.p_value < 0.01);
            CHECK(m.p_value > 0.5);
        }
    }
}

}  // namespace qkgeom_tests_gqa_test
