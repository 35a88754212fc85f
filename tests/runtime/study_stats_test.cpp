// Tests of qkgeom/study/stats.hpp: correlations, permutation p-values
// (against a brute-force enumeration written here with its own formulas),
// hand values (Mahonian numbers, Spearman's Σd² formula), Monte Carlo against
// exact, bootstrap coverage over repeated draws, determinism, NaN handling.
#include <qkgeom/study/stats.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_study_stats_test {

namespace st = qkgeom::study;

namespace {

constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();

// A uniform in [0, 1) from the top 53 bits, and normal / exponential draws
// made from it, so the test's data are the same with every standard library.
double uniform01(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }
double normal(std::mt19937_64& g) {  // Box–Muller, one of the pair
    double const u = 1.0 - uniform01(g), v = uniform01(g);
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * 3.14159265358979323846 * v);
}
double exponential(std::mt19937_64& g) { return -std::log(1.0 - uniform01(g)); }

// ---- the test's own formulas (written differently from the library) ----

// Rank = #smaller + (#equal + 1)/2 (the average of the tied ranks).
std::vector<double> naive_ranks(std::vector<double> const& v) {
    std::vector<double> r;
    for (double a : v) {
        double less = 0, equal = 0;
        for (double b : v) less += b < a, equal += b == a;
        r.push_back(less + (equal + 1) / 2);
    }
    return r;
}
// One-pass Pearson from raw sums: (nΣxy − ΣxΣy) / √((nΣx² − (Σx)²)(nΣy² − (Σy)²)).
// The numerator N is what the enumeration compares (exact for small integers).
struct raw_pearson {
    double num = 0, den = 0;
};
raw_pearson naive_pearson(std::vector<double> const& x, std::vector<double> const& y) {
    double n = static_cast<double>(x.size()), sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
        sx += x[i], sy += y[i], sxx += x[i] * x[i], syy += y[i] * y[i], sxy += x[i] * y[i];
    return {n * sxy - sx * sy, std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy))};
}
// Tau-b from concordant C, discordant D and the tie counts n1 = Σ t(t−1)/2 of
// the tie groups of x (n2 of y): (C − D) / √((n0 − n1)(n0 − n2)).
std::int64_t tie_pairs(std::vector<double> const& v) {
    std::map<double, std::int64_t> groups;
    for (double a : v) ++groups[a];
    std::int64_t t = 0;
    for (auto const& [value, count] : groups) t += count * (count - 1) / 2;
    return t;
}
struct raw_kendall {
    std::int64_t c_minus_d = 0;
    double den = 0;
};
raw_kendall naive_kendall(std::vector<double> const& x, std::vector<double> const& y) {
    std::int64_t c = 0, d = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
        for (std::size_t j = 0; j < i; ++j) {
            bool const tied = x[i] == x[j] || y[i] == y[j];
            if (!tied && (x[i] < x[j]) == (y[i] < y[j])) ++c;
            if (!tied && (x[i] < x[j]) != (y[i] < y[j])) ++d;
        }
    auto const n = static_cast<std::int64_t>(x.size());
    auto const n0 = n * (n - 1) / 2;
    return {c - d, std::sqrt(static_cast<double>(n0 - tie_pairs(x)) * static_cast<double>(n0 - tie_pairs(y)))};
}

std::int64_t factorial(std::int64_t n) { return n <= 1 ? 1 : n * factorial(n - 1); }

// Counts (over all n! index permutations of y) of |statistic| >= |observed|,
// by enumerating the distinct arrangements of y's values with
// std::next_permutation and weighting each by Π t! over y's tie groups (the
// index permutations that give the same arrangement). Relative tolerance 1e-9
// on the numerators (the data are small integers or generic doubles, whose
// distinct values differ by far more).
struct brute_counts {
    std::int64_t p = 0, s = 0, k = 0;
};
brute_counts brute_force(std::vector<double> const& x, std::vector<double> const& y) {
    auto const rx = naive_ranks(x);
    auto const obs_p = naive_pearson(x, y).num, obs_s = naive_pearson(rx, naive_ranks(y)).num;
    auto const obs_k = naive_kendall(x, y).c_minus_d;
    auto const tol_p = 1e-9 * naive_pearson(x, y).den, tol_s = 1e-9 * naive_pearson(rx, naive_ranks(y)).den;
    std::int64_t weight = 1;
    std::map<double, std::int64_t> groups;
    for (double a : y) ++groups[a];
    for (auto const& [value, count] : groups) weight *= factorial(count);
    brute_counts b;
    std::vector<double> perm = y;
    std::sort(perm.begin(), perm.end());
    do {
        b.p += weight * (std::abs(naive_pearson(x, perm).num) >= std::abs(obs_p) - tol_p);
        b.s += weight * (std::abs(naive_pearson(rx, naive_ranks(perm)).num) >= std::abs(obs_s) - tol_s);
        b.k += weight * (std::abs(naive_kendall(x, perm).c_minus_d) >= std::abs(obs_k));
    } while (std::next_permutation(perm.begin(), perm.end()));
    return b;
}

std::int64_t as_count(double p, std::int64_t n) { return std::llround(p * static_cast<double>(factorial(n))); }

bool constant(std::vector<double> const& v) { return std::all_of(v.begin(), v.end(), [&](double a) { return a == v[0]; }); }

}  // namespace

TEST_CASE("average ranks: ties get the mean of their ranks, NaN gets NaN", "[study][stats]") {
    std::vector<double> const v{10, 20, 20, 5, nan_v, 20, -std::numeric_limits<double>::infinity()};
    auto const r = st::average_ranks(v);
    REQUIRE(r.size() == v.size());
    // -inf → 1, 5 → 2, 10 → 3, the three 20s share ranks 4, 5, 6 → 5
    CHECK(r[6] == 1);
    CHECK(r[3] == 2);
    CHECK(r[0] == 3);
    CHECK(r[1] == 5);
    CHECK(r[2] == 5);
    CHECK(r[5] == 5);
    CHECK(std::isnan(r[4]));
}

TEST_CASE("hand values: tau-b with ties, Spearman's Σd², Kendall's exact p from Mahonian numbers",
          "[study][stats]") {
    // x = (1,1,2,3), y = (1,2,2,3): n0 = 6, one pair tied in x, one in y; of the
    // other 4 pairs all are concordant: tau-b = 4 / √(5·5) = 0.8.
    std::vector<double> const xt{1, 1, 2, 3}, yt{1, 2, 2, 3};
    CHECK(st::kendall_tau_b(xt, yt) == Approx(0.8).epsilon(1e-15));

    // x = 1..7, y = (3,1,2,5,4,7,6): inversions (3,1), (3,2), (5,4), (7,6) → D = 4,
    // C = 21 − 4 = 17, tau = (17 − 4)/21 = 13/21.
    std::vector<double> const x{1, 2, 3, 4, 5, 6, 7}, y{3, 1, 2, 5, 4, 7, 6};
    CHECK(st::kendall_tau_b(x, y) == Approx(13.0 / 21.0).epsilon(1e-14));
    // d = (−2, 1, 1, −1, 1, −1, 1), Σd² = 4 + 6 = 10: rho = 1 − 6·10/(7·48) = 23/28;
    // with no ties Pearson of the values equals it (the values are the ranks).
    CHECK(st::spearman(x, y) == Approx(23.0 / 28.0).epsilon(1e-14));
    CHECK(st::pearson(x, y) == Approx(23.0 / 28.0).epsilon(1e-14));
    // Under permutations, S = 21 − 2D; |S| >= 13 ⇔ D <= 4 or D >= 17. The
    // Mahonian numbers I(7, k), k = 0..4, are 1, 6, 20, 49, 98 (sum 174) and the
    // distribution is symmetric (I(7, k) = I(7, 21 − k)), so p = 2·174/7! = 348/5040.
    auto const t = st::correlate(x, y);
    CHECK(t.p_method == "exact");
    CHECK(t.n == 7);
    CHECK(as_count(t.p_kendall, 7) == 348);
    CHECK(t.p_kendall == Approx(348.0 / 5040.0).epsilon(1e-15));
    // Exactly monotone: only the identity and the reversal reach |tau| = 1.
    auto const m = st::correlate(x, x);
    CHECK(as_count(m.p_kendall, 7) == 2);
    CHECK(as_count(m.p_spearman, 7) == 2);
    CHECK(as_count(m.p_pearson, 7) == 2);
    CHECK(m.kendall == 1);
}

TEST_CASE("exact permutation p-values equal brute-force enumeration for n = 3..8", "[study][stats]") {
    std::mt19937_64 g(20240916);
    int checked = 0, degenerate = 0;
    for (int rep = 0; rep < 240; ++rep) {
        auto const n = static_cast<std::size_t>(3 + rep % 6);
        int const kind = rep / 6 % 5;  // 0,1: small integers (many ties); 2: generic doubles; 3: monotone; 4: antitone
        std::vector<double> x(n), y(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (kind <= 1) {
                std::uint64_t const range = kind == 0 ? 3 : 10;
                x[i] = static_cast<double>(g() % range);
                y[i] = static_cast<double>(g() % range);
            } else {
                x[i] = normal(g);
                y[i] = kind == 2 ? normal(g) : 0.0;
            }
        }
        if (kind >= 3) {  // an exact monotone transform of x (with x's ties when rounded)
            for (std::size_t i = 0; i < n; ++i) x[i] = std::round(2 * x[i]);
            for (std::size_t i = 0; i < n; ++i) y[i] = (kind == 3 ? 1 : -1) * (x[i] * x[i] * x[i] + 3 * x[i]);
        }
        CAPTURE(rep, n, kind, x, y);
        auto const t = st::correlate(x, y);
        if (constant(x) || constant(y)) {  // degenerate: everything NaN, p_method none
            CHECK(std::isnan(t.pearson));
            CHECK(std::isnan(t.p_kendall));
            CHECK(t.p_method == "none");
            ++degenerate;
            continue;
        }
        REQUIRE(t.p_method == "exact");
        auto const ni = static_cast<std::int64_t>(n);
        auto const b = brute_force(x, y);
        CHECK(as_count(t.p_pearson, ni) == b.p);
        CHECK(as_count(t.p_spearman, ni) == b.s);
        CHECK(as_count(t.p_kendall, ni) == b.k);
        auto const pr = naive_pearson(x, y);
        auto const sr = naive_pearson(naive_ranks(x), naive_ranks(y));
        auto const kr = naive_kendall(x, y);
        CHECK(t.pearson == Approx(pr.num / pr.den).margin(1e-12));
        CHECK(t.spearman == Approx(sr.num / sr.den).margin(1e-12));
        CHECK(t.kendall == Approx(static_cast<double>(kr.c_minus_d) / kr.den).margin(1e-12));
        if (kind >= 3) CHECK(std::abs(t.kendall) == 1);
        ++checked;
    }
    CHECK(checked > 200);
    CHECK(degenerate > 0);
}

TEST_CASE("Monte Carlo p-values agree with exact enumeration within 4 standard errors", "[study][stats]") {
    // n = 10: exact with max_exact_n = 10 (10! = 3,628,800 permutations,
    // ~0.2 s at -O2, ~2 s unoptimised), Monte Carlo with max_exact_n = 9. Data
    // chosen so that the p-values are moderate (a weak association with a tie),
    // where the Monte Carlo error is largest.
    std::vector<double> const x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, y{2, 1, 5, 3, 3, 9, 4, 8, 6.5, 7};
    auto const exact = st::correlate(x, y, {.max_exact_n = 10});
    auto const mc = st::correlate(x, y, {.max_exact_n = 9, .permutations = 20000, .seed = 7});
    REQUIRE(exact.p_method == "exact");
    REQUIRE(mc.p_method == "monte_carlo");
    CHECK(mc.pearson == exact.pearson);
    CHECK(mc.kendall == exact.kendall);
    auto within = [](double p_mc, double p_exact) {
        double const se = std::sqrt(p_exact * (1 - p_exact) / 20000.0);
        CAPTURE(p_mc, p_exact, se);
        CHECK(std::abs(p_mc - p_exact) <= 4 * se + 1.0 / 20001.0);
    };
    within(mc.p_pearson, exact.p_pearson);
    within(mc.p_spearman, exact.p_spearman);
    within(mc.p_kendall, exact.p_kendall);
    CHECK(exact.p_kendall > 0.005);  // the comparison is meaningful
    CHECK(exact.p_kendall < 0.5);
    // Monte Carlo p is never below 1/(1 + B).
    auto const mono = st::correlate(x, x, {.max_exact_n = 3, .permutations = 999});
    CHECK(mono.p_kendall >= 1.0 / 1000.0);
    CHECK(mono.p_kendall < 0.01);
}

namespace {
struct coverage {
    double rate90 = 0, rate95 = 0, width95 = 0;  // width95: mean half-width / (1.96 σ/√n)
};
template <class Draw>
coverage bootstrap_coverage(Draw draw, double mu, double sigma, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    int constexpr reps = 400, n = 60;
    coverage c;
    std::vector<double> v(n);
    for (int r = 0; r < reps; ++r) {
        for (auto& a : v) a = draw(g);
        auto const i90 = st::bootstrap_mean(v, 0.90, 1000, seed + static_cast<std::uint64_t>(r));
        auto const i95 = st::bootstrap_mean(v, 0.95, 1000, seed + static_cast<std::uint64_t>(r));
        c.rate90 += i90.lo <= mu && mu <= i90.hi;
        c.rate95 += i95.lo <= mu && mu <= i95.hi;
        c.width95 += (i95.hi - i95.lo) / 2 / (1.96 * sigma / std::sqrt(double{n}));
        CHECK(i95.lo <= i90.lo);
        CHECK(i90.hi <= i95.hi);
        CHECK(i90.lo < i90.mean);
        CHECK(i90.mean < i90.hi);
    }
    c.rate90 /= reps;
    c.rate95 /= reps;
    c.width95 /= reps;
    return c;
}
}  // namespace

TEST_CASE("bootstrap percentile intervals cover the planted mean at about their nominal rate", "[study][stats]") {
    // The percentile bootstrap of a mean undercovers a little: its spread is
    // σ√((n−1)/n)/√n and it uses normal rather than t quantiles, so at n = 60
    // the expected coverage is ≈ 0.943 (95%) and ≈ 0.892 (90%) for normal
    // data, lower for skewed data. Binomial standard errors over 400 draws are
    // ≈ 0.011 (95%) and ≈ 0.015 (90%); the bounds sit ~4 SE below the expected
    // rate and above it, so a too-narrow or too-wide interval fails.
    auto const nrm = bootstrap_coverage([](std::mt19937_64& g) { return 3.0 + 2.0 * normal(g); }, 3.0, 2.0, 11);
    CAPTURE(nrm.rate90, nrm.rate95, nrm.width95);
    CHECK(nrm.rate95 >= 0.90);
    CHECK(nrm.rate95 <= 0.985);
    CHECK(nrm.rate90 >= 0.83);
    CHECK(nrm.rate90 <= 0.95);
    // Width: mean half-width ≈ √(59/60) · (1.96 σ/√n) (the sample σ is unbiased-ish).
    CHECK(nrm.width95 == Approx(std::sqrt(59.0 / 60.0)).epsilon(0.04));
    // Exponential(1): mean 1, σ 1, skewed — the percentile interval undercovers more.
    auto const ex = bootstrap_coverage(exponential, 1.0, 1.0, 23);
    CAPTURE(ex.rate90, ex.rate95, ex.width95);
    CHECK(ex.rate95 >= 0.88);
    CHECK(ex.rate95 <= 0.985);
    CHECK(ex.rate90 >= 0.81);
    CHECK(ex.rate90 <= 0.95);
}

TEST_CASE("determinism: the same seed gives the same p-values and interval", "[study][stats]") {
    std::vector<double> const x{1, 4, 2, 8, 5, 7, 3, 9, 6, 10, 12, 11}, y{2, 3, 1, 7, 9, 4, 5, 8, 6, 12, 10, 11};
    st::correlation_options const o{.max_exact_n = 9, .permutations = 5000, .seed = 42};
    auto const a = st::correlate(x, y, o), b = st::correlate(x, y, o);
    CHECK(a.p_method == "monte_carlo");
    CHECK(a.p_pearson == b.p_pearson);
    CHECK(a.p_spearman == b.p_spearman);
    CHECK(a.p_kendall == b.p_kendall);
    auto const i1 = st::bootstrap_mean(x, 0.9, 500, 5), i2 = st::bootstrap_mean(x, 0.9, 500, 5);
    CHECK(i1.lo == i2.lo);
    CHECK(i1.hi == i2.hi);
    auto const i3 = st::bootstrap_mean(x, 0.9, 500, 6);  // another seed: another interval
    CHECK((i3.lo != i1.lo || i3.hi != i1.hi));
}

TEST_CASE("non-finite pairs are left out and n counts the pairs used", "[study][stats]") {
    double const inf = std::numeric_limits<double>::infinity();
    std::vector<double> const x{1, 2, nan_v, 4, 5, 6, 7}, y{2, 1, 3, inf, 4, 6, 5};
    auto const t = st::correlate(x, y);
    CHECK(t.n == 5);
    std::vector<double> const fx{1, 2, 5, 6, 7}, fy{2, 1, 4, 6, 5};
    auto const f = st::correlate(fx, fy);
    CHECK(t.pearson == f.pearson);
    CHECK(t.kendall == f.kendall);
    CHECK(t.p_spearman == f.p_spearman);
    CHECK(t.p_method == "exact");
    // The plain functions do not drop: a non-finite value gives NaN.
    CHECK(std::isnan(st::pearson(x, y)));
    CHECK(std::isnan(st::spearman(x, y)));
    CHECK(std::isnan(st::kendall_tau_b(x, y)));
    // Fewer than 3 usable pairs: all NaN, p_method "none".
    std::vector<double> const x2{1, nan_v, 3, 4}, y2{1, 2, inf, 4};
    auto const s = st::correlate(x2, y2);
    CHECK(s.n == 2);
    CHECK(std::isnan(s.pearson));
    CHECK(std::isnan(s.p_spearman));
    CHECK(s.p_method == "none");
    // A constant variable: NaN.
    std::vector<double> const c{2, 2, 2, 2};
    CHECK(std::isnan(st::correlate(c, y2).kendall));
    CHECK(std::isnan(st::pearson(c, std::vector<double>{1, 2, 3, 4})));
    // Bootstrap: finite values only; n = 0 and n = 1.
    auto const bi = st::bootstrap_mean(std::vector<double>{1, nan_v, 3, inf, 2});
    CHECK(bi.n == 3);
    CHECK(bi.mean == 2);
    CHECK(bi.lo >= 1);
    CHECK(bi.hi <= 3);
    auto const b0 = st::bootstrap_mean(std::vector<double>{nan_v});
    CHECK(b0.n == 0);
    CHECK(std::isnan(b0.mean));
    auto const b1 = st::bootstrap_mean(std::vector<double>{4.5, -inf});
    CHECK(b1.n == 1);
    CHECK(b1.mean == 4.5);
    CHECK(std::isnan(b1.lo));
    CHECK(std::isnan(b1.hi));
}

TEST_CASE("invalid arguments are errors naming the parameter and value", "[study][stats]") {
    std::vector<double> const v{1, 2, 3};
    CHECK_THROWS_WITH(st::bootstrap_mean(v, 1.5), Catch::Contains("level = 1.5"));
    CHECK_THROWS_WITH(st::bootstrap_mean(v, 0.0), Catch::Contains("level = 0"));
    CHECK_THROWS_WITH(st::bootstrap_mean(v, nan_v), Catch::Contains("level = nan"));
    CHECK_THROWS_WITH(st::bootstrap_mean(v, 0.9, 0), Catch::Contains("resamples = 0"));
    CHECK_THROWS_AS(st::bootstrap_mean(v, 0.9, -3), std::invalid_argument);
    CHECK_THROWS_WITH(st::correlate(v, std::vector<double>{1, 2}), Catch::Contains("y has 2"));
    CHECK_THROWS_WITH(st::correlate(v, v, {.permutations = 0}), Catch::Contains("permutations = 0"));
    CHECK_THROWS_WITH(st::correlate(v, v, {.max_exact_n = 13}), Catch::Contains("max_exact_n = 13"));
    CHECK_THROWS_AS(st::pearson(v, std::vector<double>{1}), std::invalid_argument);
}

}  // namespace qkgeom_tests_study_stats_test
