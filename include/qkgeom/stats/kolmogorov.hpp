// qkgeom — the Kolmogorov–Smirnov distribution and the one-sample KS test
// against N(0, 1), for the normality diagnostics of method §4.
//
// method §9 item 15: the p-value uses the exact finite-n distribution of the
// two-sided statistic D_n for n <= 10,000 (as scipy.stats.kstest does by
// default) and the limiting Kolmogorov distribution, sf(√n·d), above.
//
// The finite-n distribution follows Simard & L'Ecuyer (2011), "Computing the
// Two-Sided Kolmogorov-Smirnov Distribution", J. Stat. Softw. 39(11), with the
// regime boundaries that scipy.stats.kstwo uses (scipy/stats/_ksstats.py), so
// that the values agree with scipy's. With t = n·d:
//
//   d <= 0 → 1;  d >= 1 → 0;  t <= 1/2 → 1                         (exact)
//   1/2 < t <= 1     Ruben–Gambino: cdf = n!/nⁿ (2t − 1)ⁿ, sf = 1 − cdf   (exact)
//   t >= n − 1       Ruben–Gambino: sf = 2 (1 − d)ⁿ                     (exact)
//   d >= 1/2         sf = 2 · P(D⁺_n >= d)  (the two one-sided events are
//                    disjoint), D⁺_n by the Smirnov–Birnbaum–Tingey sum    (exact)
//   n <= 140:   n d² <= 0.754693  Durbin matrix (Marsaglia–Tsang–Wang)      (exact)
//               n d² <= 4         Pomeranz recursion                       (exact)
//               otherwise         2 · P(D⁺_n >= d)   (drops the two-sided
//                                 intersection term, relative size < e^-24)
//   n > 140:    n d² >= 370       0
//               n d² >= 2.2       2 · P(D⁺_n >= d)   (intersection term < 2e-6 relative)
//               n d^1.5 <= 1.4    Durbin matrix, sf = 1 − cdf              (exact)
//               otherwise         Pelz–Good asymptotic series, sf = 1 − cdf
//
// 1 − cdf is formed only where sf >= ~0.02 (n d² < 2.2) or where the cdf is
// tiny, so the upper tail never suffers cancellation.
#pragma once

#include <qkgeom/core/errors.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief Largest sample size for which `kolmogorov_smirnov_sf` uses the exact
/// finite-n distribution; above it, the limiting distribution (method §9 item 15).
inline constexpr std::int64_t ks_exact_max_n = 10000;

namespace detail {
namespace ks {

inline constexpr double pi = std::numbers::pi;
inline constexpr double pi2 = pi * pi;
inline constexpr double sqrt_2pi = 2.5066282746310005024157652848110453;  // √(2π)
inline constexpr double ln2 = std::numbers::ln2;
/// log(2^-1075), cephes' MINLOG with denormals: scipy's smirnov() returns
/// 0 when −2 n d² is below it (the true value is below the denormal range).
inline constexpr double min_log = -745.1332191019412;
inline constexpr double eps = std::numeric_limits<double>::epsilon();

template <class = void>  // instantiated on use
double clip01(double p) noexcept { return std::clamp(p, 0.0, 1.0); }

/// n·d split exactly into an integer part and a fraction in [0, 1): the product
/// is formed as a double-double (hi + lo via fma) so that floor(n d) and the
/// remainder are right even when n d is within rounding of an integer.
struct nd_split {
    std::int64_t whole;
    double frac;
};

template <class = void>  // instantiated on use
nd_split split_nd(std::int64_t n, double d) noexcept {
    double const nn = static_cast<double>(n);
    double const hi = nn * d;
    double const lo = std::fma(nn, d, -hi);
    double fl = std::floor(hi);
    double frac = (hi - fl) + lo;  // hi − fl is exact (Sterbenz, or fl = 0)
    if (frac < 0) {
        fl -= 1;
        frac += 1;
    }
    if (frac >= 1) {
        fl += 1;
        frac -= 1;
    }
    return {static_cast<std::int64_t>(fl), frac};
}

/// n!·2^(−e) as a mantissa in [0.5, 1) with its binary exponent e (exact
/// integer products, one rounding per factor).
struct scaled {
    double mant = 1.0;
    long expo = 0;
    void normalise() noexcept {
        int e = 0;
        mant = std::frexp(mant, &e);
        expo += e;
    }
    [[nodiscard]] double value() const noexcept { return std::ldexp(mant, static_cast<int>(expo)); }
};

template <class = void>  // instantiated on use
scaled factorial_scaled(std::int64_t n) noexcept {
    scaled f;
    for (std::int64_t i = 2; i <= n; ++i) {
        f.mant *= static_cast<double>(i);
        f.normalise();
    }
    return f;
}

/// Limiting Kolmogorov distribution: sf(x) = P(K > x), K = sup |Brownian bridge|.
///   x <= 0.82:  cdf = √(2π)/x Σ_{k>=1} exp(−(2k−1)² π² / (8x²)),  sf = 1 − cdf
///               (sf >= 0.51 here: no cancellation);
///   x >  0.82:  sf = 2 Σ_{k>=1} (−1)^(k−1) exp(−2k²x²)  (terms summed smallest first).
/// The cut-over 0.82 is scipy's (cephes kolmogorov.c, van Mulbregt 2018).
template <class = void>  // instantiated on use
double kolmogorov_sf_impl(double x) noexcept {
    if (!(x > 0)) return 1.0;
    if (x <= 0.82) {
        double const a = -pi2 / (8.0 * x * x);
        double sum = 0.0;
        for (int k = 1; k <= 40; ++k) {
            double const m = 2.0 * k - 1.0;
            double const term = std::exp(a * m * m);
            sum += term;
            if (term <= eps * sum) break;
        }
        return clip01(1.0 - sqrt_2pi / x * sum);
    }
    double const a = -2.0 * x * x;
    double terms[16];
    int count = 0;
    double const first = std::exp(a);
    if (first == 0.0) return 0.0;
    for (int k = 1; k <= 16; ++k) {
        double const term = std::exp(a * static_cast<double>(k) * static_cast<double>(k));
        terms[count++] = term;
        if (term <= 0.25 * eps * first) break;
    }
    double sum = 0.0;
    for (int i = count - 1; i >= 0; --i) sum += (i % 2 == 0) ? terms[i] : -terms[i];
    return clip01(2.0 * sum);
}

/// One-sided Smirnov distribution P(D⁺_n >= d) for 1/n < d < 1 by the
/// Smirnov (1944) / Birnbaum–Tingey (1951) sum
///   P = d Σ_{v=0}^{⌊n(1−d)⌋} C(n,v) (d + v/n)^(v−1) (1 − d − v/n)^(n−v),
/// all terms positive. Each term is formed in logarithms (C(n,v) carried as a
/// scaled mantissa/exponent), the sum by a streaming log-sum-exp. The factors
/// d + v/n and 1 − d − v/n come from the exact split of n·d, so no term loses
/// precision to cancellation; the relative error is O(n·eps) at worst.
/// Mirrors scipy.special.smirnov: 0 when −2 n d² < MINLOG (sf < ~1e-308).
template <class = void>  // instantiated on use
double smirnov_sf(std::int64_t n, double d) noexcept {
    double const nn = static_cast<double>(n);
    if (-2.0 * nn * d * d < min_log) return 0.0;
    nd_split const s = split_nd(n, d);
    if (s.whole >= n - 1) return clip01(std::pow(1.0 - d, nn));  // d >= 1 − 1/n
    std::int64_t const vmax = n - s.whole - 1;                      // last v with 1 − d − v/n > 0
    double c_mant = 1.0;                                            // C(n, v) = c_mant · 2^c_exp
    long c_exp = 0;
    double lmax = -std::numeric_limits<double>::infinity();
    double acc = 0.0;
    for (std::int64_t v = 0; v <= vmax; ++v) {
        double const a = (static_cast<double>(v + s.whole) + s.frac) / nn;      // d + v/n
        double const b = (static_cast<double>(n - v - s.whole) - s.frac) / nn;  // 1 − d − v/n
        double const log_c = std::log(c_mant) + static_cast<double>(c_exp) * ln2;
        double const l = log_c + static_cast<double>(v - 1) * std::log(a) + static_cast<double>(n - v) * std::log(b);
        if (l > lmax) {
            acc = acc * std::exp(lmax - l) + 1.0;
            lmax = l;
        } else {
            acc += std::exp(l - lmax);
        }
        c_mant *= static_cast<double>(n - v) / static_cast<double>(v + 1);
        int e = 0;
        c_mant = std::frexp(c_mant, &e);
        c_exp += e;
    }
    return clip01(std::exp(lmax + std::log(acc * d)));
}

/// Durbin (1968) matrix method as organised by Marsaglia, Tsang & Wang (2003):
/// with n d = k − h (k integer, 0 <= h < 1) and m = 2k − 1,
///   P(D_n < d) = n!/nⁿ · (Hⁿ)_{kk},
///   H_{ij} = 1/(i − j + 1)!  for i − j + 1 >= 0 (else 0), with the first column
///   and last row reduced by h^i/i! and h^(m−j+1)/(m−j+1)!, and H_{m1} increased
///   by (2h − 1)ⁿ/m! when 2h > 1. Powers by repeated squaring; every product is
///   rescaled by an exact power of two (tracked exponent), so nothing over- or
///   underflows. Cost O(m³ log n).
template <class = void>  // instantiated on use
double durbin_cdf(std::int64_t n, double d) {
    double const t = static_cast<double>(n) * d;
    auto const k = static_cast<std::size_t>(std::ceil(t));
    double const h = static_cast<double>(k) - t;
    std::size_t const m = 2 * k - 1;
    std::vector<double> inv_fact(m + 1);
    inv_fact[0] = 1.0;
    for (std::size_t i = 1; i <= m; ++i) inv_fact[i] = inv_fact[i - 1] / static_cast<double>(i);

    std::vector<double> hm(m * m, 0.0);
    for (std::size_t r = 0; r < m; ++r)
        for (std::size_t c = 0; c <= std::min(r + 1, m - 1); ++c) hm[r * m + c] = inv_fact[r + 1 - c];
    for (std::size_t r = 0; r < m; ++r) hm[r * m] -= std::pow(h, static_cast<double>(r + 1)) * inv_fact[r + 1];
    for (std::size_t c = 0; c < m; ++c)
        hm[(m - 1) * m + c] -= std::pow(h, static_cast<double>(m - c)) * inv_fact[m - c];
    if (2.0 * h - 1.0 > 0.0) hm[(m - 1) * m] += std::pow(2.0 * h - 1.0, static_cast<double>(m)) * inv_fact[m];

    std::vector<double> tmp(m * m);
    auto multiply = [&](std::vector<double>& out, std::vector<double> const& x, std::vector<double> const& y,
                        long& expo) {
        std::fill(tmp.begin(), tmp.end(), 0.0);
        for (std::size_t r = 0; r < m; ++r)
            for (std::size_t j = 0; j < m; ++j) {
                double const xr = x[r * m + j];
                if (xr == 0.0) continue;
                for (std::size_t c = 0; c < m; ++c) tmp[r * m + c] += xr * y[j * m + c];
            }
        double big = 0.0;
        for (double v : tmp) big = std::max(big, std::abs(v));
        int e = 0;
        if (big > 0.0) {
            e = std::ilogb(big);
            for (double& v : tmp) v = std::ldexp(v, -e);
        }
        expo += e;
        out.swap(tmp);
    };

    std::vector<double> pw(m * m, 0.0);  // result Hⁿ, scaled by 2^p_exp
    for (std::size_t i = 0; i < m; ++i) pw[i * m + i] = 1.0;
    long p_exp = 0, h_exp = 0;
    bool first = true;
    for (std::int64_t nn = n; nn > 0; nn /= 2) {
        if (nn % 2) {
            if (first) {
                pw = hm;
                p_exp = h_exp;
                first = false;
            } else {
                long e = p_exp + h_exp;
                multiply(pw, pw, hm, e);
                p_exp = e;
            }
        }
        if (nn > 1) {
            long e = 2 * h_exp;
            multiply(hm, hm, hm, e);
            h_exp = e;
        }
    }
    double p = pw[(k - 1) * m + (k - 1)];
    // × n!/nⁿ = Π_{i=1}^{n} (i/n), rescaled by powers of two.
    long expo = p_exp;
    double const nn = static_cast<double>(n);
    for (std::int64_t i = 1; i <= n; ++i) {
        p = p * static_cast<double>(i) / nn;
        if (p != 0.0 && std::abs(p) < 0x1p-128) {
            p = std::ldexp(p, 128);
            expo -= 128;
        }
    }
    return clip01(std::ldexp(p, static_cast<int>(std::clamp<long>(expo, -100000, 100000))));
}

/// Pomeranz (1974) recursion for P(D_n < d). Scale positions to [0, n] and let
/// N(s) count the sample points below s; D_n < d with t = n d = l + f iff
/// s − t < N(s) < s + t for all s. Both bounds are constant between the
/// break points 0, g, 1−g, 1+g, 2−g, …, n−g, n (g = min(f, 1−f)), so the
/// count at successive break points is a Markov chain whose increments over an
/// interval of length λ have (Poissonised) weights (λ/n)^j / j!; the count
/// entering an interval must respect its lower bound, the count leaving it its
/// upper bound:
///   [0, g]           : N <= l
///   [k+g, k+1−g]     : k−l+1 <= N <= k+l     (f <= 1/2)
///                      k−l   <= N <= k+l+1   (f >  1/2)
///   [k−g, k+g]       : k−l   <= N <= k+l
///   [n−g, n]         : N >= n−l
/// and P(D_n < d) = n! · V(n) after the last interval. The state vector is
/// rescaled by an exact power of two at every step. Cost O(n l²).
template <class = void>  // instantiated on use
double pomeranz_cdf(std::int64_t n64, double d) {
    nd_split const s = split_nd(n64, d);
    long const n = static_cast<long>(n64);
    long const l = static_cast<long>(s.whole);
    double const f = s.frac;
    double const g = std::min(f, 1.0 - f);
    auto const width = static_cast<std::size_t>(2 * l + 4);
    double const nn = static_cast<double>(n);
    auto weights = [&](double len) {
        std::vector<double> w(width, 0.0);
        w[0] = 1.0;
        for (std::size_t j = 1; j < width; ++j) w[j] = w[j - 1] * (len / nn) / static_cast<double>(j);
        return w;
    };
    std::vector<double> const w_g = weights(g), w_2g = weights(2.0 * g), w_1m2g = weights(1.0 - 2.0 * g);

    std::vector<double> cur(static_cast<std::size_t>(n) + 1, 0.0), nxt(cur.size(), 0.0);
    long lo = 0, hi = 0;
    cur[0] = 1.0;
    long expo = 0;
    bool dead = false;
    auto step = [&](std::vector<double> const& w, long lower, long upper) {
        if (dead) return;
        long const nlo = std::max(lo, lower);
        long const nhi = std::min(upper, n);
        if (nlo > nhi || nlo > hi) {
            dead = true;
            return;
        }
        double big = 0.0;
        for (long j = nlo; j <= nhi; ++j) {
            double acc = 0.0;
            for (long k = nlo; k <= std::min(j, hi); ++k)
                acc += cur[static_cast<std::size_t>(k)] * w[static_cast<std::size_t>(j - k)];
            nxt[static_cast<std::size_t>(j)] = acc;
            big = std::max(big, acc);
        }
        for (long j = lo; j <= hi; ++j) cur[static_cast<std::size_t>(j)] = 0.0;
        cur.swap(nxt);
        lo = nlo;
        hi = nhi;
        if (big == 0.0) {
            dead = true;
            return;
        }
        int const e = std::ilogb(big);
        for (long j = lo; j <= hi; ++j) cur[static_cast<std::size_t>(j)] = std::ldexp(cur[static_cast<std::size_t>(j)], -e);
        expo += e;
    };
    bool const low_f = f <= 0.5;
    step(w_g, -l, l);
    for (long k = 0; k < n; ++k) {
        step(w_1m2g, low_f ? k - l + 1 : k - l, low_f ? k + l : k + l + 1);
        if (k + 1 < n) step(w_2g, k + 1 - l, k + 1 + l);
    }
    step(w_g, n - l, n + l);
    if (dead || hi < n) return 0.0;
    scaled const fact = factorial_scaled(n);
    double const v = cur[static_cast<std::size_t>(n)] * fact.mant;
    return clip01(std::ldexp(v, static_cast<int>(std::clamp<long>(expo + fact.expo, -100000, 100000))));
}

/// Pelz & Good (1976) asymptotic expansion of P(D_n <= d), as given by Simard &
/// L'Ecuyer (2011, eq. 8–11): with z = √n d,
///   cdf ≈ K0(z) + K1(z)/√n + K2(z)/n + K3(z)/n^{3/2},
/// each K_i a theta-type series in exp(−(k − ½)² π² / (2z²)) (and, for K2, K3,
/// exp(−k² π² / (2z²))). Truncated at k = ⌈16 z/π⌉ as scipy does.
template <class = void>  // instantiated on use
double pelz_good_cdf(std::int64_t n, double d) noexcept {
    double const nn = static_cast<double>(n);
    double const z = std::sqrt(nn) * d;
    double const z2 = z * z, z3 = z2 * z, z4 = z2 * z2, z6 = z4 * z2, z7 = z6 * z, z8 = z4 * z4, z10 = z8 * z2;
    double const qlog = -pi2 / 8.0 / z2;
    if (qlog < -708.0) return 0.0;
    double const pi4 = pi2 * pi2, pi6 = pi4 * pi2;
    auto const kmax = static_cast<int>(std::ceil(16.0 * z / pi));
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int k = kmax; k >= 1; --k) {  // smallest terms first
        double const m = 2.0 * k - 1.0;
        double const m2 = m * m, m4 = m2 * m2, m6 = m4 * m2;
        double const w = std::exp(qlog * m2);  // exp(−(k−½)²π²/(2z²))
        s0 += w;
        s1 += w * (pi2 * m2 / 4.0 - z2);
        s2 += w * (6.0 * z6 + 2.0 * z4 + (2.0 * z4 - 5.0 * z2) * pi2 * m2 / 4.0 + pi4 * (1.0 - 2.0 * z2) * m4 / 16.0);
        s3 += w * (pi6 * (5.0 - 30.0 * z2) * m6 / 64.0 + pi4 * (-60.0 * z2 + 212.0 * z4) * m4 / 16.0 +
                   pi2 * (135.0 * z4 - 96.0 * z6) * m2 / 4.0 - 30.0 * z6 - 90.0 * z8);
    }
    double k0 = sqrt_2pi * s0 / z;
    double k1 = sqrt_2pi * s1 / (6.0 * z4);
    double k2 = sqrt_2pi * s2 / (72.0 * z7);
    double k3 = sqrt_2pi * s3 / (6480.0 * z10);
    double e2 = 0, e3 = 0;
    double const qlog2 = -pi2 / 2.0 / z2;
    for (int k = kmax; k >= 1; --k) {
        double const kk = static_cast<double>(k) * k;
        double const w = std::exp(qlog2 * kk);  // exp(−k²π²/(2z²))
        e2 += kk * w;
        e3 += (3.0 * z2 - pi2 * kk) * kk * w;
    }
    k2 += -pi2 * sqrt_2pi / (36.0 * z3) * e2;
    k3 += pi2 * sqrt_2pi / (216.0 * z6) * e3;
    double const rn = std::sqrt(nn);
    return k0 + k1 / rn + k2 / nn + k3 / (nn * rn);
}

/// P(D_n >= d) for 1 <= n <= ks_exact_max_n and 0 < d < 1, by regime (see the
/// file comment; boundaries as scipy's `_kolmogn`).
template <class = void>  // instantiated on use
double exact_sf(std::int64_t n, double d) {
    double const nn = static_cast<double>(n);
    double const t = nn * d;
    if (t <= 1.0) {  // Ruben–Gambino, 1/(2n) < d <= 1/n
        if (t <= 0.5) return 1.0;
        double const r = 2.0 * t - 1.0;
        if (n > 140) return 1.0;  // cdf = n!/nⁿ rⁿ < 1e-58
        double cdf = 1.0;
        for (std::int64_t i = 1; i <= n; ++i) cdf *= static_cast<double>(i) / nn * r;
        return clip01(1.0 - cdf);
    }
    if (t >= nn - 1.0) return clip01(2.0 * std::pow(1.0 - d, nn));  // Ruben–Gambino, d >= 1 − 1/n
    if (d >= 0.5) return clip01(2.0 * smirnov_sf(n, d));          // D⁺ >= d and D⁻ >= d disjoint
    double const nd2 = t * d;
    if (n <= 140) {
        if (nd2 <= 0.754693) return clip01(1.0 - durbin_cdf(n, d));
        if (nd2 <= 4.0) return clip01(1.0 - pomeranz_cdf(n, d));
        return clip01(2.0 * smirnov_sf(n, d));
    }
    if (nd2 >= 370.0) return 0.0;
    if (nd2 >= 2.2) return clip01(2.0 * smirnov_sf(n, d));
    double const cdf = (nn * std::pow(d, 1.5) <= 1.4) ? durbin_cdf(n, d) : pelz_good_cdf(n, d);
    return clip01(1.0 - cdf);
}

/// Standard normal cdf Φ(x) = erfc(−x/√2)/2: no cancellation in either tail.
template <class = void>  // instantiated on use
double normal_cdf(double x) noexcept { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

/// Φ linearly interpolated between the knots −8.5 + j/64, j = 0 … 1088 (0
/// below, 1 above): the bucketing function of `ks_test_normal`.
///  - Error: |ũ − Φ| <= h²/8 · max|Φ''| = φ(1)/32768 < 7.4e-6 inside (h = 1/64,
///    Φ'' = −xφ(x)), Φ(−8.5) < 1e-17 outside, plus a few ulps of rounding
///    (knots from erfc, the interpolation, the argument); the bound used is
///    `normal_cdf_approx_error` = 1e-5.
///  - Non-decreasing in x in floating point: y = (x + 8.5)·64 is monotone
///    (exact ×64); the knot values v[j] are forced non-decreasing; adjacent
///    knots are within a factor 2, so v[j+1] − v[j] is exact (Sterbenz) and
///    v[j] + f·(v[j+1] − v[j]) for f ∈ [0, 1) is monotone in f and never
///    exceeds v[j+1] (rounding is monotone; an FMA keeps this). The tests
///    check the factor 2, the monotonicity and the error on a dense grid.
struct normal_cdf_knots {
    static constexpr double x0 = -8.5;
    static constexpr double inv_h = 64.0;
    static constexpr int segments = 1088;
    double value[segments + 1];
    normal_cdf_knots() noexcept {
        for (int j = 0; j <= segments; ++j) value[j] = normal_cdf(x0 + static_cast<double>(j) / inv_h);
        for (int j = 1; j <= segments; ++j) value[j] = std::max(value[j], value[j - 1]);
    }
    /// ũ(x)
    [[nodiscard]] double operator()(double x) const noexcept {
        double const y = (x - x0) * inv_h;
        if (!(y >= 0.0)) return 0.0;
        if (!(y < static_cast<double>(segments))) return 1.0;
        auto const j = static_cast<int>(y);
        double const f = y - static_cast<double>(j);
        double const a = value[j];
        return a + f * (value[j + 1] - a);
    }
};

/// The knots, computed once (thread-safe static initialisation).
template <class = void>  // instantiated on use
normal_cdf_knots const& normal_cdf_approx() noexcept {
    static normal_cdf_knots const knots;
    return knots;
}

/// Bound on |normal_cdf_approx()(x) − normal_cdf(x)| used by ks_test_normal
/// (the true bound is < 7.5e-6).
inline constexpr double normal_cdf_approx_error = 1e-5;

}  // namespace ks
}  // namespace detail

/// \brief Survival function of the limiting Kolmogorov distribution,
/// P(K > x) with K = sup |Brownian bridge| (scipy.stats.kstwobign.sf).
///
/// `x <= 0` gives 1. Accurate to a few ulps relative over the whole range,
/// including the far tail (2 e^{−2x²} down to underflow).
/// \param[in] x the scaled statistic, usually √n·D_n; +∞ gives 0.
/// \returns P(K > x) ∈ [0, 1].
/// \throws std::invalid_argument if x is NaN.
/// \sa kolmogorov_smirnov_sf
template <class = void>  // instantiated on use
double kolmogorov_sf(double x) {
    if (std::isnan(x)) detail::fail_arg("qkgeom::kolmogorov_sf", "x is NaN", x);
    return detail::ks::kolmogorov_sf_impl(x);
}

/// \brief P(D_n >= d) for the two-sided one-sample Kolmogorov–Smirnov
/// statistic D_n = sup |F_n − F| of a sample of size n (method §4, §9 item 15).
///
/// For n <= `ks_exact_max_n` (10,000) the exact finite-n distribution (scipy's
/// `kstwo.sf(d, n)`); above it the limiting distribution `kolmogorov_sf(√n·d)`
/// (scipy's `kstwobign.sf`). d <= 0 gives 1, d >= 1 gives 0. The upper tail is
/// computed directly (never as 1 − cdf when it is small).
/// \param[in] n the sample size, ≥ 1.
/// \param[in] d the observed statistic; any non-NaN value.
/// \returns P(D_n ≥ d) ∈ [0, 1].
/// \throws std::invalid_argument if n < 1 or d is NaN.
/// \throws std::bad_alloc if the work arrays of the Durbin or Pomeranz
///         regimes (O(n·d) and O(n) doubles) cannot be allocated.
/// \sa kolmogorov_sf, ks_test_normal
template <class = void>  // instantiated on use
double kolmogorov_smirnov_sf(std::int64_t n, double d) {
    if (n < 1) detail::fail_arg("qkgeom::kolmogorov_smirnov_sf", "sample size n must be >= 1", n);
    if (std::isnan(d)) detail::fail_arg("qkgeom::kolmogorov_smirnov_sf", "statistic d is NaN", d);
    if (d <= 0.0) return 1.0;
    if (d >= 1.0) return 0.0;
    if (n > ks_exact_max_n) return detail::ks::kolmogorov_sf_impl(d * std::sqrt(static_cast<double>(n)));
    return detail::ks::exact_sf(n, d);
}

/// \brief Result of a one-sample KS test.
struct ks_result {
    double statistic;  ///< D_n = max(D⁺, D⁻)
    double pvalue;     ///< P(D_n >= statistic) under the null, `kolmogorov_smirnov_sf`
};

/// \brief Two-sided one-sample Kolmogorov–Smirnov test of already-standardised
/// values against N(0, 1) (the method §4 normality diagnostic).
///
/// With x_(0) <= … <= x_(n−1) the sorted sample and Φ(x) = erfc(−x/√2)/2,
/// D⁺ = max_i ((i+1)/n − Φ(x_(i))), D⁻ = max_i (Φ(x_(i)) − i/n),
/// D = max(D⁺, D⁻), p = P(D_n >= D) — the statistic and p-value of
/// `scipy.stats.kstest(z, 'norm')` for n <= 10,000. Computed without sorting
/// the sample, in O(n) with Φ evaluated only for the few values near the
/// maximum (see the body); the statistic is bit-identical to the sorted
/// formula.
/// \param[in] z the standardised sample (already centred and scaled; this
///            function does not estimate a mean or a variance).
/// \returns the statistic D and its p-value `kolmogorov_smirnov_sf(n, D)`.
/// \throws std::invalid_argument if z is empty or holds a non-finite value
/// (the message names its index).
/// \throws std::bad_alloc if the O(n) work arrays cannot be allocated.
template <class = void>  // instantiated on use
ks_result ks_test_normal(std::span<double const> z) {
    if (z.empty()) detail::fail_arg("qkgeom::ks_test_normal", "need at least 1 value; sample size", z.size());
    for (std::size_t i = 0; i < z.size(); ++i)
        if (!std::isfinite(z[i]))
            detail::fail_arg("qkgeom::ks_test_normal", "non-finite value at index " + std::to_string(i), z[i]);
    // Exact bucket method (method §4, §9 item 15). Every term of the sorted
    // formula is (with r the rank of x in the sorted sample, ties in any order,
    // as they have equal Φ)
    //   T⁺ = fl(fl((r+1)/n) − Φ(x)),   T⁻ = fl(Φ(x) − fl(r/n)),
    // and D = the largest of all 2n terms. Instead of sorting:
    //  1. Each value goes to bucket k = min(n−1, ⌊ũ(x)·n⌋), ũ the interpolant
    //     `normal_cdf_approx`. ũ is non-decreasing in x, so buckets are in the
    //     order of the sorted sample: with m_k values in bucket k and C_k values
    //     in earlier buckets, the values of bucket k have ranks C_k … C_k+m_k−1.
    //  2. For x in bucket k, ũ(x) ∈ [k/n, (k+1)/n] (up to 2^-53) and
    //     |Φ(x) − ũ(x)| <= δ' < δ = `normal_cdf_approx_error` (δ' covers the
    //     interpolation error h²/8·max|Φ''| = 7.4e-6 and every rounding,
    //     including erfc's), so every term of bucket k is at most
    //     a_k/n + δ', a_k = max(C_k + m_k − k, k + 1 − C_k), while the last
    //     T⁺ (the first T⁻) of the bucket attaining A = max_k a_k is at least
    //     (A − 1)/n − δ'. A bucket with A − a_k > 1 + 2δn therefore holds no
    //     term that can be the maximum.
    //  3. The values of the remaining buckets (a handful: those within ~1/n of
    //     the maximum) are sorted, given their exact ranks, and their terms are
    //     formed with `normal_cdf` and the same expressions as the sorted
    //     formula; D is the largest, so it equals the sorted formula's bit for
    //     bit, with O(n) work and Φ evaluated only O(1) times for a typical
    //     sample (all of a bucket in the worst case, e.g. every value > 8.5).
    std::size_t const n = z.size();
    double const nn = static_cast<double>(n);
    std::vector<std::size_t> count(n, 0);  // per bucket: count, then first rank or `skip`
    std::vector<std::size_t> bucket(n);
    detail::ks::normal_cdf_knots const& approx = detail::ks::normal_cdf_approx();
    for (std::size_t i = 0; i < n; ++i) {
        // ⌊ũ·n⌋ (ũ·n in [0, n]; the signed conversion is the cheap one)
        auto const k = std::min(n - 1, static_cast<std::size_t>(static_cast<std::int64_t>(approx(z[i]) * nn)));
        bucket[i] = k;
        ++count[k];
    }
    // a_k as a signed integer (branch-free walks: empty buckets are frequent and random).
    auto score = [](std::size_t k, std::size_t c, std::size_t m) {
        auto const kk = static_cast<std::int64_t>(k), cc = static_cast<std::int64_t>(c),
                   mm = static_cast<std::int64_t>(m);
        return std::max(cc + mm - kk, kk + 1 - cc);
    };
    // An empty bucket's a_k is below that of the nearest non-empty bucket
    // before it (C + m − k) or after it (k + 1 − C), and best >= 1, so empty
    // buckets need no test here.
    std::int64_t best = 1;
    for (std::size_t k = 0, c = 0; k < n; ++k) {
        std::size_t const m = count[k];
        best = std::max(best, score(k, c, m));
        c += m;
    }
    // Keep bucket k iff best − a_k <= 1 + 2δn (an integer on the left).
    auto const slack = static_cast<std::int64_t>(1.0 + 2.0 * detail::ks::normal_cdf_approx_error * nn);
    constexpr std::size_t skip = std::numeric_limits<std::size_t>::max();
    std::size_t n_kept = 0;
    for (std::size_t k = 0, c = 0; k < n; ++k) {  // count[k] becomes the first rank of a kept bucket, else skip
        std::size_t const m = count[k];
        bool const keep = best - score(k, c, m) <= slack;
        count[k] = keep ? c : skip;
        n_kept += keep ? m : 0;
        c += m;
    }
    std::vector<std::pair<double, std::size_t>> kept;  // (value, bucket)
    kept.reserve(n_kept);
    for (std::size_t i = 0; i < n; ++i)
        if (count[bucket[i]] != skip) kept.emplace_back(z[i], bucket[i]);
    std::sort(kept.begin(), kept.end(), [](auto const& a, auto const& b) { return a.first < b.first; });
    double stat = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0, rank = 0; j < kept.size(); ++j, ++rank) {
        if (j == 0 || kept[j].second != kept[j - 1].second) rank = count[kept[j].second];
        double const cdf = detail::ks::normal_cdf(kept[j].first);
        stat = std::max(stat, static_cast<double>(rank + 1) / nn - cdf);
        stat = std::max(stat, cdf - static_cast<double>(rank) / nn);
    }
    return {stat, kolmogorov_smirnov_sf(static_cast<std::int64_t>(n), stat)};
}

}  // namespace qkgeom
