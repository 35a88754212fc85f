// Runtime tests of the Kolmogorov–Smirnov distribution and the one-sample KS
// normality test (method §4 diagnostics, §9 item 15): every row of the scipy
// reference table tests/data/ks_table.csv (regenerate with
// tests/data/gen_ks_table.py), the n = 1 closed form, monotonicity, range,
// the O(1/√n) approach to the limiting distribution, agreement of the two exact
// methods (Durbin, Pomeranz) where both apply, calibration of ks_test_normal
// over many seeds, ks_test_normal against the sorted formula (and the
// interpolant its bucketing relies on), and errors on bad input.
#include <qkgeom/stats/kolmogorov.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <numbers>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_kolmogorov_test {

#ifndef QKGEOM_TEST_DATA_DIR
#error "QKGEOM_TEST_DATA_DIR must be defined as the absolute path of tests/data"
#endif

namespace {

using qkgeom::kolmogorov_sf;
using qkgeom::kolmogorov_smirnov_sf;

struct ks_row {
    std::int64_t n;
    double d, sf;
    int line;
};

std::vector<ks_row> read_table() {
    std::string const path = std::string(QKGEOM_TEST_DATA_DIR) + "/ks_table.csv";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::vector<ks_row> rows;
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        if (line.empty() || line[0] == '#' || line.rfind("n,", 0) == 0) continue;
        std::istringstream ls(line);
        std::string a, b, c;
        std::getline(ls, a, ',');
        std::getline(ls, b, ',');
        std::getline(ls, c, ',');
        rows.push_back({std::stoll(a), std::stod(b), std::stod(c), lineno});
    }
    return rows;
}

/// The method scipy (and qkgeom) uses for P(D_n >= d), with the relative
/// tolerance of the comparison against scipy and why:
///  * trivial (d <= 1/(2n): 1): exact.
///  * Ruben–Gambino closed forms: 1e-13 — a product of n factors or one pow().
///  * 2·smirnov (d >= 1/2, and the tail n d² > 4 resp. > 2.2 where scipy drops
///    the two-sided intersection term and so do we): 1e-11 — both sum the same
///    positive series; ours forms each term in logarithms, so factors raised to
///    powers up to n = 10⁴ carry O(n·eps) ≈ 1e-12 relative error (scipy works in
///    double-double). Measured worst 5e-13 (n = 10⁴, sf ≈ 3e-296).
///  * Durbin / Pomeranz (exact, sf = 1 − cdf): 1e-10 — both sides compute the
///    cdf to ~1e-14 absolute and the sf here is >= 6.7e-4 (n d² <= 4), resp.
///    >= 0.02 (n d² < 2.2 for n > 140). Against 40-digit mpmath both scipy and
///    qkgeom are off by ~7e-12 relative at the worst point. Measured worst
///    1.5e-11.
///  * Pelz–Good (the same asymptotic series scipy uses, sf >= 0.02): 1e-12,
///    measured 1.3e-14.
///  * asymptotic, n > 10000 (kstwobign, the same theta series): 1e-13, measured
///    4e-15.
/// A reference of exactly 0 (scipy's MINLOG / n d² >= 370 cut-offs) requires a
/// value below 1e-300.
struct regime {
    char const* name;
    double rtol;
};

regime classify(std::int64_t n, double d) {
    double const nn = static_cast<double>(n);
    double const t = nn * d;
    if (n > qkgeom::ks_exact_max_n) return {"asymptotic", 1e-13};
    if (t <= 0.5) return {"trivial", 0.0};
    if (t <= 1.0 || t >= nn - 1.0) return {"ruben-gambino", 1e-13};
    if (d >= 0.5) return {"2*smirnov (exact)", 1e-11};
    double const nd2 = t * d;
    if (n <= 140) {
        if (nd2 <= 0.754693) return {"durbin", 1e-10};
        if (nd2 <= 4.0) return {"pomeranz", 1e-10};
        return {"2*smirnov (tail)", 1e-11};
    }
    if (nd2 >= 2.2) return {"2*smirnov (tail)", 1e-11};
    if (nn * std::pow(d, 1.5) <= 1.4) return {"durbin", 1e-10};
    return {"pelz-good", 1e-12};
}


/// The textbook KS statistic: sort, then D⁺ = max((i+1)/n − Φ(x_(i))),
/// D⁻ = max(Φ(x_(i)) − i/n); the p-value by the same library call.
qkgeom::ks_result ks_sorted_reference(std::vector<double> x) {
    std::sort(x.begin(), x.end());
    double const nn = static_cast<double>(x.size());
    double dplus = -std::numeric_limits<double>::infinity();
    double dminus = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < x.size(); ++i) {
        double const cdf = 0.5 * std::erfc(-x[i] / std::numbers::sqrt2);
        dplus = std::max(dplus, static_cast<double>(i + 1) / nn - cdf);
        dminus = std::max(dminus, cdf - static_cast<double>(i) / nn);
    }
    double const stat = std::max(dplus, dminus);
    return {stat, kolmogorov_smirnov_sf(static_cast<std::int64_t>(x.size()), stat)};
}

/// x_i with Φ(x_i) = q_i to the last bits, for increasing q_i in (0, 1):
/// Newton steps from the previous root, safeguarded by bisection.
std::vector<double> normal_quantiles(std::vector<double> const& q) {
    std::vector<double> x(q.size());
    double v = -40.0;  // Φ(v) <= q_i for every i
    for (std::size_t i = 0; i < q.size(); ++i) {
        double lo = v, hi = 40.0;
        for (int it = 0; it < 400; ++it) {
            double const f = qkgeom::detail::ks::normal_cdf(v) - q[i];
            if (f == 0.0) break;
            (f < 0.0 ? lo : hi) = v;
            double const newton = v - f / (std::exp(-0.5 * v * v) / std::sqrt(2.0 * std::numbers::pi));
            double const next = newton > lo && newton < hi ? newton : 0.5 * (lo + hi);
            if (next == v) break;
            v = next;
        }
        x[i] = v;
    }
    return x;
}

}  // namespace

TEST_CASE("kolmogorov_smirnov_sf matches the scipy reference table", "[kolmogorov]") {
    std::vector<ks_row> const rows = read_table();
    REQUIRE(rows.size() > 500);
    std::map<std::string, double> worst;
    for (ks_row const& r : rows) {
        regime const g = classify(r.n, r.d);
        double const got = kolmogorov_smirnov_sf(r.n, r.d);
        INFO("line " << r.line << ": n = " << r.n << ", d = " << r.d << ", regime " << g.name);
        INFO("scipy " << r.sf << ", qkgeom " << got);
        if (r.sf == 0.0) {
            CHECK(got <= 1e-300);
            continue;
        }
        double const rel = std::abs(got - r.sf) / r.sf;
        worst[g.name] = std::max(worst[g.name], rel);
        CHECK(rel <= g.rtol);
    }
    // Every regime is represented in the table.
    for (char const* name : {"asymptotic", "trivial", "ruben-gambino", "2*smirnov (exact)", "durbin", "pomeranz",
                             "2*smirnov (tail)", "pelz-good"}) {
        INFO("regime " << name);
        CHECK(worst.count(name) == 1);
    }
}

TEST_CASE("kolmogorov_smirnov_sf edge values", "[kolmogorov]") {
    double const inf = std::numeric_limits<double>::infinity();
    for (std::int64_t n : {1, 2, 7, 140, 141, 10000, 10001, 1000000}) {
        CHECK(kolmogorov_smirnov_sf(n, 0.0) == 1.0);
        CHECK(kolmogorov_smirnov_sf(n, -0.5) == 1.0);
        CHECK(kolmogorov_smirnov_sf(n, -inf) == 1.0);
        CHECK(kolmogorov_smirnov_sf(n, 1.0) == 0.0);
        CHECK(kolmogorov_smirnov_sf(n, 1.5) == 0.0);
        CHECK(kolmogorov_smirnov_sf(n, inf) == 0.0);
        // D_n >= 1/(2n) always, so P(D_n >= d) = 1 for d <= 1/(2n).
        if (n <= qkgeom::ks_exact_max_n) CHECK(kolmogorov_smirnov_sf(n, 0.49 / static_cast<double>(n)) == 1.0);
    }
    CHECK(kolmogorov_sf(0.0) == 1.0);
    CHECK(kolmogorov_sf(-1.0) == 1.0);
    CHECK(kolmogorov_sf(inf) == 0.0);
    CHECK(kolmogorov_sf(40.0) == 0.0);
}

TEST_CASE("n = 1 closed form: P(D_1 >= d) = 2(1 - d) on [1/2, 1]", "[kolmogorov]") {
    // D_1 = max(U, 1 - U) for one uniform U, so P(D_1 >= d) = 2(1 - d).
    for (int i = 0; i <= 1000; ++i) {
        double const d = 0.5 + 0.5 * i / 1000.0;
        INFO("d = " << d);
        CHECK(kolmogorov_smirnov_sf(1, d) == Approx(2.0 * (1.0 - d)).epsilon(1e-15).margin(1e-300));
    }
    CHECK(kolmogorov_smirnov_sf(1, 0.25) == 1.0);
    CHECK(kolmogorov_smirnov_sf(1, 0.4999) == 1.0);
}

TEST_CASE("n = 2 closed forms", "[kolmogorov]") {
    // Ruben–Gambino: P(D_2 < d) = 2!/2² (4d − 1)² on (1/4, 1/2], and P(D_2 >= d) = 2(1 − d)² on [1/2, 1).
    for (double d : {0.26, 0.3, 0.4, 0.49}) CHECK(kolmogorov_smirnov_sf(2, d) == Approx(1.0 - 0.5 * (4 * d - 1) * (4 * d - 1)).epsilon(1e-15));
    for (double d : {0.5, 0.6, 0.9, 0.999}) CHECK(kolmogorov_smirnov_sf(2, d) == Approx(2.0 * (1 - d) * (1 - d)).epsilon(1e-14));
}

TEST_CASE("kolmogorov_smirnov_sf lies in [0, 1] and is non-increasing in d", "[kolmogorov]") {
    // Slack: for n <= 140 every method is exact (or drops a term below e^-24
    // relative), so only rounding (<= ~3e-11 relative, from forming 1 − cdf) can
    // reverse the order. For 140 < n <= 10000 scipy's regime seams are not
    // continuous: at n d^1.5 = 1.4 (exact Durbin → Pelz–Good asymptotic) and at
    // n d² = 2.2 (Pelz–Good/Durbin → 2·smirnov, which drops the intersection
    // term) the value steps by up to ~3.4e-6 relative (measured: n = 141);
    // qkgeom follows scipy there, so the slack is 1e-5. Above 10000 the
    // limiting distribution is smooth.
    for (std::int64_t n : {1, 2, 3, 5, 10, 20, 50, 100, 139, 140, 141, 200, 500, 1000, 5000, 10000, 10001, 100000}) {
        double const slack = n <= 140 ? 1e-10 : (n <= qkgeom::ks_exact_max_n ? 1e-5 : 1e-13);
        double prev = 1.0;
        int const steps = 3000;
        for (int i = 0; i <= steps; ++i) {
            double const d = static_cast<double>(i) / steps;
            double const sf = kolmogorov_smirnov_sf(n, d);
            INFO("n = " << n << ", d = " << d << ", sf = " << sf << ", previous " << prev);
            REQUIRE(sf >= 0.0);
            REQUIRE(sf <= 1.0);
            CHECK(sf <= prev * (1.0 + slack));
            prev = sf;
        }
    }
    // Around the seams themselves, in steps far below the grid's: upward steps
    // stay below 1e-5 relative; the largest step, downward, is the Pelz–Good
    // approximation error at n = 141 (2.3e-5 relative at n d² = 2.2).
    for (std::int64_t n : {141, 200, 1000, 10000}) {
        double const nn = static_cast<double>(n);
        for (double b : {std::pow(1.4 / nn, 2.0 / 3.0), std::sqrt(2.2 / nn)}) {
            double const lo = kolmogorov_smirnov_sf(n, b * (1 - 1e-12));
            double const hi = kolmogorov_smirnov_sf(n, b * (1 + 1e-12));
            INFO("n = " << n << ", seam at d = " << b << ": " << lo << " -> " << hi);
            CHECK(hi - lo <= 1e-5 * lo);
            CHECK(lo - hi <= 5e-5 * lo);
        }
    }
}

TEST_CASE("Durbin and Pomeranz agree where both are exact", "[kolmogorov]") {
    namespace ks = qkgeom::detail::ks;
    for (std::int64_t n : {4, 10, 33, 50, 100, 139, 140, 300}) {
        double const nn = static_cast<double>(n);
        for (double z = 0.6; z <= 2.2; z += 0.05) {
            double const d = z / std::sqrt(nn);
            if (nn * d <= 1.0 || d >= 0.5) continue;
            double const a = ks::durbin_cdf(n, d), b = ks::pomeranz_cdf(n, d);
            INFO("n = " << n << ", d = " << d << ": Durbin " << a << ", Pomeranz " << b);
            CHECK(std::abs(a - b) <= 5e-14);
        }
    }
}

TEST_CASE("exact and 2*smirnov agree where the intersection term is negligible", "[kolmogorov]") {
    // P(D_n >= d) = 2 P(D⁺_n >= d) − P(D⁺ >= d, D⁻ >= d); at n d² = 4 the last
    // term is ~e^-24 relative, so the exact Pomeranz value equals 2·smirnov.
    namespace ks = qkgeom::detail::ks;
    for (std::int64_t n : {20, 60, 140}) {
        double const d = std::sqrt(3.9 / static_cast<double>(n));
        double const exact = 1.0 - ks::pomeranz_cdf(n, d);
        CHECK(2.0 * ks::smirnov_sf(n, d) == Approx(exact).epsilon(1e-9));
    }
}

TEST_CASE("exact distribution approaches the limiting one at rate 1/sqrt(n)", "[kolmogorov]") {
    // The Li-Chien / Korolyuk expansion: P(D_n >= z/√n) = K̄(z) − K1(z)/√n + O(1/n),
    // with max_z |K1(z)| ≈ 0.28 (near z = 0.74). So √n · max |difference| must
    // settle near 0.28: it is neither 0 (the exact path is really used) nor O(1).
    for (std::int64_t n : {1000, 5000, 10000}) {
        double const rn = std::sqrt(static_cast<double>(n));
        double worst = 0.0;
        for (double z = 0.1; z <= 4.0; z += 0.01)
            worst = std::max(worst, std::abs(kolmogorov_smirnov_sf(n, z / rn) - kolmogorov_sf(z)));
        INFO("n = " << n << ": sqrt(n) max |exact - asymptotic| = " << worst * rn);
        CHECK(worst * rn < 0.35);
        CHECK(worst * rn > 0.2);
    }
    // Above 10000 the asymptotic distribution is used (method §9 item 15).
    CHECK(kolmogorov_smirnov_sf(10001, 0.01) == kolmogorov_sf(0.01 * std::sqrt(10001.0)));
}

TEST_CASE("kolmogorov_sf: both series agree at the cut-over and the tail is 2 exp(-2x^2)", "[kolmogorov]") {
    double const a = kolmogorov_sf(std::nextafter(0.82, 0.0));
    double const b = kolmogorov_sf(std::nextafter(0.82, 1.0));
    CHECK(a == Approx(b).epsilon(1e-14));
    for (double x : {3.0, 5.0, 10.0, 20.0, 26.0}) CHECK(kolmogorov_sf(x) == Approx(2.0 * std::exp(-2.0 * x * x)).epsilon(1e-14));
    // Median of the Kolmogorov distribution (kstwobign.ppf(0.5) = 0.82757355518990772).
    CHECK(kolmogorov_sf(0.82757355518990772) == Approx(0.5).epsilon(1e-14));
}

TEST_CASE("ks_test_normal matches scipy.stats.kstest on a fixed sample", "[kolmogorov]") {
    // scipy 1.10.1: kstest([-1.2, 0.3, 0.7, 2.1, -0.4, 0.05, 1.1, -0.9, 0.45, -2.3, 0.8], 'norm')
    std::vector<double> const z{-1.2, 0.3, 0.7, 2.1, -0.4, 0.05, 1.1, -0.9, 0.45, -2.3, 0.8};
    qkgeom::ks_result const r = qkgeom::ks_test_normal(z);
    CHECK(r.statistic == Approx(0.16336596764349803).epsilon(1e-14));
    CHECK(r.pvalue == Approx(0.8860542793837806).epsilon(1e-12));
    // Two points: D = Φ(1) − 1/2, P = 1 − (2D·2 − 1)²/2 (Ruben–Gambino, n = 2).
    qkgeom::ks_result const r2 = qkgeom::ks_test_normal(std::vector<double>{1.0, -1.0});
    CHECK(r2.statistic == Approx(0.3413447460685429).epsilon(1e-14));
    CHECK(r2.pvalue == Approx(0.9332490989253873).epsilon(1e-13));
    // One point at 0: D = 1/2, P = 1.
    qkgeom::ks_result const r1 = qkgeom::ks_test_normal(std::vector<double>{0.0});
    CHECK(r1.statistic == 0.5);
    CHECK(r1.pvalue == 1.0);
    // Order does not matter; the input is not modified.
    std::vector<double> rev(z.rbegin(), z.rend());
    CHECK(qkgeom::ks_test_normal(rev).statistic == r.statistic);
    CHECK(rev.front() == 0.8);
}

TEST_CASE("ks_test_normal is calibrated under the null and powerful under a shift", "[kolmogorov]") {
    // Under H0 the p-value is Uniform(0, 1) (continuous data). Over 400 seeds the
    // fraction below 0.05 has sd sqrt(0.05·0.95/400) = 0.0109: accept 0.05 ± 4 sd.
    // Sample sizes cycle through every regime of the exact distribution.
    std::int64_t const sizes[] = {5, 40, 140, 600, 3000};
    int const seeds = 400;
    int below = 0;
    double sum_p = 0.0;
    for (int seed = 0; seed < seeds; ++seed) {
        std::mt19937_64 gen(static_cast<std::uint64_t>(seed) * 7919u + 17u);
        std::normal_distribution<double> nd(0.0, 1.0);
        std::vector<double> x(static_cast<std::size_t>(sizes[seed % 5]));
        for (double& v : x) v = nd(gen);
        qkgeom::ks_result const r = qkgeom::ks_test_normal(x);
        REQUIRE(r.pvalue >= 0.0);
        REQUIRE(r.pvalue <= 1.0);
        below += r.pvalue < 0.05 ? 1 : 0;
        sum_p += r.pvalue;
    }
    double const frac = static_cast<double>(below) / seeds;
    double const sd = std::sqrt(0.05 * 0.95 / seeds);
    INFO("fraction of p < 0.05: " << frac << ", mean p " << sum_p / seeds);
    CHECK(std::abs(frac - 0.05) <= 4 * sd);
    CHECK(std::abs(sum_p / seeds - 0.5) <= 4 * std::sqrt(1.0 / 12.0 / seeds));

    // A shifted sample (mean 0.5 instead of 0) is rejected decisively.
    std::mt19937_64 gen(12345);
    std::normal_distribution<double> shifted(0.5, 1.0);
    std::vector<double> x(500);
    for (double& v : x) v = shifted(gen);
    qkgeom::ks_result const r = qkgeom::ks_test_normal(x);
    INFO("shifted: D = " << r.statistic << ", p = " << r.pvalue);
    CHECK(r.statistic > 0.12);
    CHECK(r.pvalue < 1e-8);
    // n > 10000 goes through the asymptotic distribution and still rejects.
    std::vector<double> big(20000);
    for (double& v : big) v = shifted(gen);
    CHECK(qkgeom::ks_test_normal(big).pvalue < 1e-100);
}

TEST_CASE("Kolmogorov functions reject bad input", "[kolmogorov]") {
    double const nan = std::numeric_limits<double>::quiet_NaN();
    double const inf = std::numeric_limits<double>::infinity();
    CHECK_THROWS_AS(kolmogorov_smirnov_sf(0, 0.1), std::invalid_argument);
    CHECK_THROWS_AS(kolmogorov_smirnov_sf(-3, 0.1), std::invalid_argument);
    CHECK_THROWS_WITH(kolmogorov_smirnov_sf(0, 0.1), Catch::Contains("n must be >= 1"));
    CHECK_THROWS_AS(kolmogorov_smirnov_sf(10, nan), std::invalid_argument);
    CHECK_THROWS_AS(kolmogorov_sf(nan), std::invalid_argument);
    CHECK_THROWS_AS(qkgeom::ks_test_normal(std::vector<double>{}), std::invalid_argument);
    CHECK_THROWS_WITH(qkgeom::ks_test_normal(std::vector<double>{0.1, 0.2, 0.3, nan}), Catch::Contains("index 3"));
    CHECK_THROWS_WITH(qkgeom::ks_test_normal(std::vector<double>{inf, 0.2}), Catch::Contains("index 0"));
    CHECK_THROWS_AS(qkgeom::ks_test_normal(std::vector<double>{0.1, -inf}), std::invalid_argument);
}

TEST_CASE("ks_test_normal equals the sorted formula on random tied tail and shifted samples", "[kolmogorov]") {
    std::mt19937_64 gen(20240607);
    std::normal_distribution<double> nd(0.0, 1.0);
    auto draw = [&](std::size_t n, auto&& f) {
        std::vector<double> x(n);
        for (double& v : x) v = f(nd(gen));
        return x;
    };
    auto compare = [](std::vector<double> const& x, char const* what) {
        qkgeom::ks_result const got = qkgeom::ks_test_normal(x);
        qkgeom::ks_result const want = ks_sorted_reference(x);
        INFO(what << ", n = " << x.size() << ": D = " << got.statistic << " (reference " << want.statistic
                  << "), p = " << got.pvalue << " (reference " << want.pvalue << ")");
        CHECK(std::abs(got.statistic - want.statistic) <= 1e-15);
        CHECK(got.statistic == want.statistic);  // documented: bit-identical (the same terms are formed)
        bool const p_ok =
            got.pvalue == want.pvalue || std::abs(got.pvalue - want.pvalue) <= 1e-12 * std::abs(want.pvalue);
        CHECK(p_ok);
    };
    std::size_t const sizes[] = {1, 2, 3, 10, 1000, 8000, 20000, 100000};  // 100000: slack of 3 levels
    for (std::size_t n : sizes) {
        int const reps = n <= 10 ? 20 : n <= 8000 ? 4 : 1;
        for (int rep = 0; rep < reps; ++rep) {
            INFO("repetition " << rep);
            compare(draw(n, [](double v) { return v; }), "N(0, 1)");
            // many exact ties: one decimal, or a handful of values
            compare(draw(n, [](double v) { return std::round(10.0 * v) / 10.0; }), "rounded to 0.1");
            compare(draw(n, [](double v) { return std::round(v); }), "rounded to integers");
            // far tails: Φ within 3e-7 of 1 (or of 0), and beyond the interpolant's range
            compare(draw(n, [](double v) { return 5.0 + std::abs(v); }), "all > 5");
            compare(draw(n, [](double v) { return -5.0 - std::abs(v); }), "all < -5");
            compare(draw(n, [](double v) { return 9.0 + std::abs(v); }), "all > 9");
            compare(draw(n, [](double v) { return v < 0 ? -40.0 + v : 1e300 * v; }), "±huge");
            // shifted / scaled: D large (every regime of the p-value, up to D near 1)
            compare(draw(n, [](double v) { return v + 0.5; }), "N(0.5, 1)");
            compare(draw(n, [](double v) { return 3.0 * v; }), "N(0, 9)");
            compare(draw(n, [](double v) { return 0.1 * v - 2.0; }), "N(-2, 0.01)");
            compare(draw(n, [](double v) { return 0.01 * v + 3.0; }), "N(3, 1e-4)");
        }
    }
    // Samples that hug Φ: x_(i) = Φ⁻¹((i + e)/n), so that terms of neighbouring
    // buckets tie to the last bits and values sit on bucket edges.
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (std::size_t n : {std::size_t{10}, std::size_t{100}, std::size_t{1000}, std::size_t{8000}}) {
        for (double e : {1e-9, 0.5, 1.0 - 1e-7, 1e-6, 1.0 - 1e-6, -1.0}) {  // −1: uniform jitter
            std::vector<double> q(n);
            for (std::size_t i = 0; i < n; ++i)
                q[i] = (static_cast<double>(i) + (e < 0 ? unit(gen) : e)) / static_cast<double>(n);
            INFO("offset " << e);
            compare(normal_quantiles(q), "quantiles");
        }
    }
    {
        // The interpolant is ~2.2 buckets off near |x| = 1 at n = 300000, so a_k
        // reaches 3 there, while at x = 0 (a knot, Φ'' = 0) it is exact and a_k
        // = 1. The largest term is put at x ≈ 0: only the 2δn margin of the
        // exclusion rule keeps its bucket (without it D is 0.5/n, not 0.75/n).
        std::size_t const n = 300000, r = n / 2;
        std::vector<double> q(n);
        for (std::size_t i = 0; i < n; ++i) q[i] = (static_cast<double>(i) + 0.5) / static_cast<double>(n);
        q[r] -= 0.25 / static_cast<double>(n);
        compare(normal_quantiles(q), "hugging, the maximum at 0");
    }
    // identical values, and values exactly on the interpolant's knots
    compare(std::vector<double>(1000, 0.0), "all 0");
    compare(std::vector<double>(1000, -1.25), "all -1.25");
    std::vector<double> knots;
    for (int j = -600; j <= 600; ++j) knots.push_back(static_cast<double>(j) / 64.0);
    compare(knots, "knots");
}

TEST_CASE("the KS bucketing interpolant is monotone and within its error bound", "[kolmogorov]") {
    // ks_test_normal is exact only if the interpolant never decreases and stays
    // within normal_cdf_approx_error of normal_cdf (stats/kolmogorov.hpp).
    auto const& knots = qkgeom::detail::ks::normal_cdf_approx();
    using knots_t = qkgeom::detail::ks::normal_cdf_knots;
    double const bound = qkgeom::detail::ks::normal_cdf_approx_error;
    bool knots_ok = knots.value[0] > 0.0 && knots.value[knots_t::segments] <= 1.0;
    for (int j = 0; j < knots_t::segments; ++j)  // non-decreasing and within a factor 2 (exact differences)
        knots_ok = knots_ok && knots.value[j] <= knots.value[j + 1] && knots.value[j + 1] <= 2.0 * knots.value[j];
    CHECK(knots_ok);
    std::vector<double> x;
    for (int i = -1000000; i <= 1000000; ++i) x.push_back(static_cast<double>(i) * 1e-5);  // [-10, 10]
    for (int j = 0; j <= knots_t::segments; ++j) {  // around every knot
        double const k = knots_t::x0 + static_cast<double>(j) / knots_t::inv_h;
        double lo = k, hi = k;
        for (int s = 0; s < 4; ++s) {
            lo = std::nextafter(lo, -1e9);
            hi = std::nextafter(hi, 1e9);
            x.push_back(lo);
            x.push_back(hi);
        }
        x.push_back(k);
    }
    for (double v : {-1e300, -40.0, 40.0, 1e300, -0.0}) x.push_back(v);
    std::sort(x.begin(), x.end());
    double worst = 0.0, prev = -1.0;
    bool monotone = true;
    for (double v : x) {
        double const a = knots(v);
        monotone = monotone && a >= prev;
        prev = a;
        worst = std::max(worst, std::abs(a - qkgeom::detail::ks::normal_cdf(v)));
    }
    INFO("largest |interpolant - normal_cdf| = " << worst);
    CHECK(monotone);
    CHECK(worst <= 7.5e-6);  // h²/8 · φ(1) = 7.38e-6, plus rounding
    CHECK(worst < bound);
}

}  // namespace qkgeom_tests_kolmogorov_test
