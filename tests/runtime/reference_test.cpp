// High-precision references for the library's hand-written tail numerics,
// computed with Boost.Multiprecision (cpp_bin_float_50: 50 decimal digits;
// its erfc is Boost.Math's). Boost is a test-only dependency of qkgeom and
// this file is why (docs/building.md).
//
//  - stats/gaussian.hpp: Φ(−|z|) (`normal_tail`), Φ(z) (`preference_probability`)
//    and PP(z) = 4Φ(−|z|)(1 − Φ(−|z|)) (`pairwise_plasticity`, scalar and
//    span; the batched `detail::vpp::pairwise_plasticity` at every ISA level)
//    within 1e-12 relative of the 50-digit values for |z| <= 37, both signs,
//    on a dense sweep; beyond, graceful underflow: finite, >= 0,
//    non-increasing in |z|, within 1e-12·DBL_MIN + 8 subnormal ulps of the
//    reference in the subnormals, and exactly 0 far out.
//  - stats/kolmogorov.hpp: the limiting Kolmogorov distribution `kolmogorov_sf(x)`,
//    and `kolmogorov_smirnov_sf(n, d)` for n > 10000 (where it is
//    kolmogorov_sf(√n·d), method §9 item 15), within 1e-12 relative of the two
//    theta series summed in 50 digits, down to the edge of the normal range.
//    Boost 1.74 (Debian bookworm's libboost-dev) has no Kolmogorov–Smirnov
//    distribution (later Boost.Math releases have one, e.g. bookworm's 1.81,
//    whose libboost1.81-dev conflicts with the 1.74 packages), so the
//    reference is the series itself; the two forms (Jacobi-transformed and
//    alternating) are checked against each other first.
//
// The references are themselves checked: erfc at 50 digits against 100 digits.
//
// Measured (g++ 12, x86-64): the worst relative error of every Φ/PP helper is
// ≈ 1.9e-13 near |z| = 37 (bound ≈ z²·ε): the rounding of |z|/√2 to a double,
// amplified by erfc's conditioning (d ln erfc(x)/d ln x ≈ −2x²); the batched
// kernel and std::erfc, which round the same argument, err alike.
#include <qkgeom/simd/dispatch.hpp>
#include <qkgeom/stats/gaussian.hpp>
#include <qkgeom/stats/kolmogorov.hpp>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "test_util.hpp"

// One namespace per file: the test program is built as a unity build
// (tests/CMakeLists.txt), where the files' helpers must not meet.
namespace qkgeom_tests_reference_test {

namespace {

using mp50 = boost::multiprecision::cpp_bin_float_50;
using mp100 = boost::multiprecision::cpp_bin_float_100;

constexpr double k_tol = 1e-12;     // relative, where the result is a normal double
constexpr double k_pp_zmax = 37.0;  // PP(37) ≈ 1.1e-299: normal
constexpr double k_denorm = std::numeric_limits<double>::denorm_min();

/// Φ(−|z|) = erfc(|z|/√2)/2 in precision T, for the exact double z.
template <class T>
T tail_ref(double z) {
    T const x = T(std::abs(z)) / boost::multiprecision::sqrt(T(2));
    return boost::multiprecision::erfc(x) / 2;
}

/// Φ(z) in 50 digits.
mp50 cdf_ref(double z) { return boost::multiprecision::erfc(mp50(-z) / boost::multiprecision::sqrt(mp50(2))) / 2; }

/// PP(z) = 4t(1 − t), t = Φ(−|z|), in 50 digits.
mp50 pp_ref(double z) {
    mp50 const t = tail_ref<mp50>(z);
    return 4 * t * (1 - t);
}

double rel_err(double got, mp50 const& ref) {
    mp50 const diff = abs(mp50(got) - ref);
    return static_cast<double>(diff / ref);
}

double abs_err(double got, mp50 const& ref) { return static_cast<double>(abs(mp50(got) - ref)); }

/// The sweep: z = 0 and its neighbours, tiny, near 0, the kernel's interval
/// boundaries (|z|/√2 = 0.46875, 4) ± a few ulps, linear and log-spaced over
/// [0, 37], random doubles, the named points 1, 10, 20, 30, 37; each with both
/// signs. Only |z| <= 37 (the relative-accuracy range).
std::vector<double> pp_sweep() {
    std::vector<double> z{0.0, 5e-324, 1e-300, 1e-100, 1e-20, 1e-10, 1e-8, 1e-5, 1e-3, 0.01, 0.1, 0.5,
                          1.0, 1.5,    2.0,    3.0,    5.0,   8.0,   10.0, 15.0, 20.0, 25.0, 30.0, 35.0,
                          36.0, 36.5,  36.9,   37.0};
    double const sqrt2 = std::sqrt(2.0);
    for (double b : {0.46875 * sqrt2, 4.0 * sqrt2}) {
        double v = b;
        for (int i = 0; i < 4; ++i) v = std::nextafter(v, 0.0);
        for (int i = 0; i < 9; ++i, v = std::nextafter(v, 100.0)) z.push_back(v);
    }
    for (int i = 0; i <= 3700; ++i) z.push_back(i * 0.01);  // linear, step 0.01
    for (int i = 0; i <= 400; ++i) z.push_back(std::pow(10.0, -12.0 + i * (12.0 + std::log10(37.0)) / 400.0));
    std::mt19937_64 gen(20240613);
    std::uniform_real_distribution<double> u(0.0, k_pp_zmax);
    for (int i = 0; i < 2000; ++i) z.push_back(u(gen));
    std::vector<double> both;
    both.reserve(2 * z.size());
    for (double v : z) {
        v = std::min(v, k_pp_zmax);
        both.push_back(v);
        both.push_back(-v);
    }
    return both;
}

/// |z| past 37: a fine grid into the subnormals and beyond the last nonzero
/// value, then far values and infinity (ascending).
std::vector<double> underflow_grid() {
    std::vector<double> z;
    for (int i = 0; i <= 30000; ++i) z.push_back(37.0 + i * 1e-4);  // [37, 40]
    for (double v : {41.0, 50.0, 100.0, 1e10, 1e300, std::numeric_limits<double>::max(),
                     std::numeric_limits<double>::infinity()})
        z.push_back(v);
    return z;
}

struct worst {
    double rel = 0;
    double at = 0;
    void take(double err, double z) {
        if (err > rel) {
            rel = err;
            at = z;
        }
    }
};

/// Limiting Kolmogorov distribution P(K > x) in 50 digits by the alternating
/// series 2 Σ_{k>=1} (−1)^(k−1) exp(−2k²x²) (converges fast for x >~ 0.6).
mp50 kolmogorov_sf_alternating(mp50 const& x) {
    mp50 sum = 0;
    mp50 const a = -2 * x * x;
    for (int k = 1; k <= 400; ++k) {
        mp50 const term = exp(a * k * k);
        sum += (k % 2 == 1) ? term : mp50(-term);
        if (term < sum * mp50("1e-60")) break;
    }
    return 2 * sum;
}

/// The same by the Jacobi-transformed series
/// 1 − √(2π)/x Σ_{k>=1} exp(−(2k−1)²π²/(8x²)) (converges fast for x <~ 1.5).
mp50 kolmogorov_sf_jacobi(mp50 const& x) {
    mp50 const pi = boost::math::constants::pi<mp50>();
    mp50 const a = -pi * pi / (8 * x * x);
    mp50 sum = 0;
    for (int k = 1; k <= 400; ++k) {
        mp50 const m = 2 * k - 1;
        mp50 const term = exp(a * m * m);
        sum += term;
        if (term < sum * mp50("1e-60")) break;
    }
    return 1 - sqrt(2 * pi) / x * sum;
}

mp50 kolmogorov_sf_ref(mp50 const& x) { return x < 1 ? kolmogorov_sf_jacobi(x) : kolmogorov_sf_alternating(x); }

}  // namespace

TEST_CASE("reference: erfc at 50 digits agrees with 100 digits over the PP range", "[reference][gaussian]") {
    // The references below are only as good as Boost's multiprecision erfc.
    double worst_rel = 0;
    for (double z : {0.0, 1e-10, 0.3, 0.6629, 1.0, 5.0, 5.6568, 10.0, 20.0, 30.0, 37.0, 38.5}) {
        mp100 const hi = tail_ref<mp100>(z);
        mp100 const lo = mp100(tail_ref<mp50>(z));
        worst_rel = std::max(worst_rel, static_cast<double>(abs(lo - hi) / hi));
    }
    INFO("worst relative difference of the 50-digit tail from the 100-digit tail: " << worst_rel);
    CHECK(worst_rel < 1e-45);
}

TEST_CASE("reference: normal_tail, preference_probability and scalar PP are within 1e-12 of 50 digits for |z| <= 37",
          "[reference][gaussian]") {
    std::vector<double> const z = pp_sweep();
    worst tail, pref, pp;
    for (double v : z) {
        tail.take(rel_err(qkgeom::normal_tail(v), tail_ref<mp50>(v)), v);
        pref.take(rel_err(qkgeom::preference_probability(v), cdf_ref(v)), v);
        pp.take(rel_err(qkgeom::pairwise_plasticity(v), pp_ref(v)), v);
    }
    INFO(z.size() << " points; worst relative error: normal_tail " << tail.rel << " (z = " << tail.at
                  << "), preference_probability " << pref.rel << " (z = " << pref.at << "), pairwise_plasticity "
                  << pp.rel << " (z = " << pp.at << ")");
    CHECK(tail.rel <= k_tol);
    CHECK(pref.rel <= k_tol);
    CHECK(pp.rel <= k_tol);

    // the span overload is the scalar one element-wise
    std::vector<double> out(z.size());
    qkgeom::pairwise_plasticity(std::span<double const>(z), std::span<double>(out));
    worst span_pp;
    for (std::size_t i = 0; i < z.size(); ++i) span_pp.take(rel_err(out[i], pp_ref(z[i])), z[i]);
    INFO("span pairwise_plasticity: worst relative error " << span_pp.rel << " (z = " << span_pp.at << ")");
    CHECK(span_pp.rel <= k_tol);
}

TEST_CASE("reference: batched PP is within 1e-12 of 50 digits for |z| <= 37 at every ISA level",
          "[reference][gaussian][vector]") {
    std::vector<double> const z = pp_sweep();
    std::vector<mp50> ref;
    ref.reserve(z.size());
    for (double v : z) ref.push_back(pp_ref(v));
    for (qkgeom::simd::isa const level : qkgeom_test::isa_levels_to_run("reference: batched PP")) {
        std::vector<double> out(z.size());
        qkgeom::detail::vpp::batch_at(level, z.data(), out.data(), z.size());
        worst w;
        for (std::size_t i = 0; i < z.size(); ++i) w.take(rel_err(out[i], ref[i]), z[i]);
        INFO("level " << qkgeom::simd::isa_name(level) << ": " << z.size() << " points, worst relative error "
                      << w.rel << " (z = " << w.at << ")");
        CHECK(w.rel <= k_tol);
    }
    // and the public entry of the dense path (simd::active())
    std::vector<double> out(z.size());
    qkgeom::detail::vpp::pairwise_plasticity(std::span<double const>(z), std::span<double>(out));
    worst w;
    for (std::size_t i = 0; i < z.size(); ++i) w.take(rel_err(out[i], ref[i]), z[i]);
    INFO("detail::vpp::pairwise_plasticity: worst relative error " << w.rel << " (z = " << w.at << ")");
    CHECK(w.rel <= k_tol);
}

TEST_CASE("reference: PP and the tails underflow gracefully past |z| = 37", "[reference][gaussian]") {
    std::vector<double> const z = underflow_grid();
    // Where the reference is still a normal double (to ≈ 37.5), relative
    // accuracy holds; in the subnormals the absolute error is bounded by the
    // same relative tolerance at the edge of the normal range (the argument's
    // rounding, ≈ z²·ε relative, carries on below it) plus a few subnormal
    // ulps for the final rounding.
    double const abs_bound = k_tol * std::numeric_limits<double>::min() + 8 * k_denorm;
    auto check_run = [&](char const* what, std::vector<double> const& got, auto&& reference) {
        bool finite_nonneg = true;
        double worst_rise = 0, worst_abs_sub = 0;
        worst rel;
        for (std::size_t i = 0; i < z.size(); ++i) {
            finite_nonneg = finite_nonneg && std::isfinite(got[i]) && got[i] >= 0.0;
            if (i > 0) worst_rise = std::max(worst_rise, got[i] - got[i - 1]);
            if (!std::isfinite(z[i]) || z[i] > 100.0) continue;
            mp50 const ref = reference(z[i]);
            if (ref >= std::numeric_limits<double>::min())
                rel.take(rel_err(got[i], ref), z[i]);
            else
                worst_abs_sub = std::max(worst_abs_sub, abs_err(got[i], ref));
        }
        INFO(what << ": worst relative error while normal " << rel.rel << " (z = " << rel.at
                  << "), worst absolute error in the subnormals " << worst_abs_sub << " (" << worst_abs_sub / k_denorm
                  << " subnormal ulps), worst rise " << worst_rise);
        CHECK(finite_nonneg);
        CHECK(worst_rise <= 8 * k_denorm);  // non-increasing up to a few subnormal ulps (as libm's erfc)
        CHECK(rel.rel <= k_tol);
        CHECK(worst_abs_sub <= abs_bound);
        CHECK(got.back() == 0.0);  // z = +inf
        CHECK(got[got.size() - 2] == 0.0);
    };
    for (double sign : {1.0, -1.0}) {
        INFO("sign " << sign);
        std::vector<double> zs(z.size()), tail(z.size()), pp(z.size()), pref(z.size());
        for (std::size_t i = 0; i < z.size(); ++i) {
            zs[i] = sign * z[i];
            tail[i] = qkgeom::normal_tail(zs[i]);
            pp[i] = qkgeom::pairwise_plasticity(zs[i]);
        }
        check_run("normal_tail", tail, [](double v) { return tail_ref<mp50>(v); });
        check_run("pairwise_plasticity", pp, [](double v) { return pp_ref(v); });
        for (qkgeom::simd::isa const level : qkgeom_test::isa_levels_to_run("reference: batched PP underflow")) {
            INFO("level " << qkgeom::simd::isa_name(level));
            std::vector<double> out(zs.size());
            qkgeom::detail::vpp::batch_at(level, zs.data(), out.data(), zs.size());
            check_run("batched PP", out, [](double v) { return pp_ref(v); });
        }
    }
    // Φ(z) for z → −∞ is the lower tail itself: same underflow.
    std::vector<double> pref(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) pref[i] = qkgeom::preference_probability(-z[i]);
    check_run("preference_probability(-|z|)", pref, [](double v) { return cdf_ref(-v); });
    // and the upper side saturates at exactly 1
    CHECK(qkgeom::preference_probability(40.0) == 1.0);
    CHECK(qkgeom::preference_probability(std::numeric_limits<double>::infinity()) == 1.0);
}

TEST_CASE("reference: the two 50-digit Kolmogorov series agree", "[reference][kolmogorov]") {
    double worst_rel = 0;
    for (double x : {0.4, 0.6, 0.8, 0.82, 1.0, 1.2, 1.5}) {
        mp50 const a = kolmogorov_sf_alternating(mp50(x));
        mp50 const b = kolmogorov_sf_jacobi(mp50(x));
        worst_rel = std::max(worst_rel, static_cast<double>(abs(a - b) / b));
    }
    INFO("worst relative difference of the alternating and Jacobi series: " << worst_rel);
    CHECK(worst_rel < 1e-40);
}

TEST_CASE("reference: kolmogorov_sf is within 1e-12 of the 50-digit series down to the normal range",
          "[reference][kolmogorov]") {
    // sf(x) >= DBL_MIN up to x ≈ 18.82 (2 e^{-2x²} = 2.2e-308)
    std::vector<double> x{1e-3, 0.05, 0.1, 0.2, 0.3, 0.5, std::nextafter(0.82, 0.0), 0.82, std::nextafter(0.82, 1.0),
                          0.82757355518990772, 1.0, 1.36, 2.0, 3.0, 5.0, 10.0, 15.0, 18.0, 18.8};
    for (int i = 1; i <= 1880; ++i) x.push_back(i * 0.01);
    worst w;
    for (double v : x) w.take(rel_err(qkgeom::kolmogorov_sf(v), kolmogorov_sf_ref(mp50(v))), v);
    INFO(x.size() << " points; worst relative error " << w.rel << " (x = " << w.at << ")");
    CHECK(w.rel <= k_tol);
    // beyond: graceful underflow to 0
    double prev = qkgeom::kolmogorov_sf(18.8);
    bool monotone = true, nonneg = true;
    for (int i = 0; i <= 2000; ++i) {
        double const s = qkgeom::kolmogorov_sf(18.8 + i * 1e-3);
        monotone = monotone && s <= prev + 8 * k_denorm;
        nonneg = nonneg && s >= 0.0 && std::isfinite(s);
        prev = s;
    }
    CHECK(monotone);
    CHECK(nonneg);
    CHECK(qkgeom::kolmogorov_sf(30.0) == 0.0);
    CHECK(qkgeom::kolmogorov_sf(std::numeric_limits<double>::infinity()) == 0.0);
}

TEST_CASE("reference: the large-n KS p-value (n > 10000) is within 1e-12 of the 50-digit limiting distribution",
          "[reference][kolmogorov]") {
    // kolmogorov_smirnov_sf(n, d) = P(K > √n·d) above ks_exact_max_n; the
    // reference takes √n·d in 50 digits from the exact double d.
    worst w;
    int points = 0;
    for (std::int64_t n : {qkgeom::ks_exact_max_n + 1, std::int64_t{20000}, std::int64_t{65536},
                           std::int64_t{1000003}, std::int64_t{100000000}}) {
        mp50 const sqrt_n = sqrt(mp50(n));
        for (int i = 1; i <= 600; ++i) {
            double const x = i * 0.03;  // √n·d in (0, 18]
            double const d = x / std::sqrt(static_cast<double>(n));
            if (d >= 1.0) continue;
            mp50 const ref = kolmogorov_sf_ref(sqrt_n * mp50(d));
            w.take(rel_err(qkgeom::kolmogorov_smirnov_sf(n, d), ref), d);
            ++points;
        }
    }
    INFO(points << " points; worst relative error " << w.rel << " (d = " << w.at << ")");
    CHECK(w.rel <= k_tol);
}

}  // namespace qkgeom_tests_reference_test
