// qkgeom — the statistics of a study (docs/study-statistics.md): average
// ranks, Pearson, Spearman and Kendall's tau-b, their two-sided permutation
// p-values (exact enumeration of all n! permutations for small n, Monte Carlo
// above), and a percentile-bootstrap interval for a mean.
//
// Reproducibility: every random draw comes from std::mt19937_64 (fully
// specified by the standard) through this header's own unbiased bounded draw
// and Fisher–Yates shuffle, so a seed gives the same numbers with every
// standard library (std::uniform_int_distribution and std::shuffle do not).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace qkgeom {
namespace study {

/// \brief Two variables' correlations and their two-sided permutation p-values.
struct correlation_test {
    std::int64_t n = 0;  ///< pairs used (both values finite)
    double pearson = std::numeric_limits<double>::quiet_NaN();
    double p_pearson = std::numeric_limits<double>::quiet_NaN();
    double spearman = std::numeric_limits<double>::quiet_NaN();
    double p_spearman = std::numeric_limits<double>::quiet_NaN();
    double kendall = std::numeric_limits<double>::quiet_NaN();  ///< tau-b
    double p_kendall = std::numeric_limits<double>::quiet_NaN();
    std::string p_method = "none";  ///< "exact", "monte_carlo" or "none"
};

/// \brief How `correlate` computes p-values.
struct correlation_options {
    std::int64_t max_exact_n = 9;        ///< enumerate all n! permutations up to this n (at most 12)
    std::int64_t permutations = 100000;  ///< Monte Carlo permutations above it (>= 1)
    std::uint64_t seed = 0;              ///< std::mt19937_64 seed of the Monte Carlo draws
};

/// \brief A mean with its percentile-bootstrap interval.
struct interval {
    double mean = std::numeric_limits<double>::quiet_NaN();
    double lo = std::numeric_limits<double>::quiet_NaN();
    double hi = std::numeric_limits<double>::quiet_NaN();
    std::int64_t n = 0;  ///< finite values used
};

namespace detail {

inline constexpr double stats_nan = std::numeric_limits<double>::quiet_NaN();
/// Relative tolerance of the permutation p-value: |stat| >= |observed| − tol·scale.
inline constexpr double perm_rel_tol = 1e-12;

inline void check_same_size(std::span<double const> x, std::span<double const> y, char const* who) {
    if (x.size() != y.size())
        throw std::invalid_argument(std::string(who) + ": x has " + std::to_string(x.size()) +
                                    " values but y has " + std::to_string(y.size()));
}

/// A number as text for messages (%.17g: round-trips; "nan", "inf").
inline std::string number_text(double a) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", a);
    return buf;
}

inline bool all_finite(std::span<double const> v) {
    return std::all_of(v.begin(), v.end(), [](double a) { return std::isfinite(a); });
}

/// Values minus their mean (two-pass), and Σ of their squares.
inline std::vector<double> centred(std::span<double const> v, double& ss) {
    double m = 0;
    for (double a : v) m += a;
    m /= static_cast<double>(v.size());
    std::vector<double> c(v.size());
    ss = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
        c[i] = v[i] - m;
        ss += c[i] * c[i];
    }
    return c;
}

inline int sign(double a) { return (a > 0) - (a < 0); }

/// An unbiased draw from {0, …, range−1} (rejection, as arc4random_uniform):
/// fully specified, unlike std::uniform_int_distribution.
inline std::uint64_t bounded(std::mt19937_64& rng, std::uint64_t range) {
    std::uint64_t const threshold = (0 - range) % range;  // 2^64 mod range
    for (;;) {
        std::uint64_t const r = rng();
        if (r >= threshold) return r % range;
    }
}

/// Fisher–Yates shuffle with `bounded` (fully specified, unlike std::shuffle).
inline void shuffle(std::vector<std::size_t>& p, std::mt19937_64& rng) {
    for (std::size_t i = p.size(); i > 1; --i)
        std::swap(p[i - 1], p[bounded(rng, i)]);
}

/// What the permutation loop needs, precomputed once: centred x and y, the
/// ranks of x and y and their centred versions (O(n) memory); the statistics'
/// numerators are compared (their denominators do not change under
/// permutations of y).
struct perm_setup {
    std::size_t n = 0;
    std::vector<double> cx, cy, rx, ry, xrank, yrank;
    double scale_p = 0, scale_s = 0;  ///< √(Sxx Syy) for values and for ranks
};

/// The three numerators for y permuted by p: Σ cx_i cy_p(i), Σ rx_i ry_p(i), S.
struct numerators {
    double p = 0, s = 0;
    std::int64_t k = 0;
};

inline numerators permuted(perm_setup const& s, std::vector<std::size_t> const& p) {
    numerators r;
    for (std::size_t i = 0; i < s.n; ++i) {
        r.p += s.cx[i] * s.cy[p[i]];
        r.s += s.rx[i] * s.ry[p[i]];
    }
    for (std::size_t i = 0; i < s.n; ++i)
        for (std::size_t j = i + 1; j < s.n; ++j)
            r.k += sign(s.xrank[i] - s.xrank[j]) * sign(s.yrank[p[i]] - s.yrank[p[j]]);
    return r;
}

/// Counts of permutations at least as extreme as the observed ones.
struct extreme_counts {
    std::int64_t p = 0, s = 0, k = 0;
    void add(numerators const& v, numerators const& obs, perm_setup const& s0) {
        p += std::abs(v.p) >= std::abs(obs.p) - perm_rel_tol * s0.scale_p;
        s += std::abs(v.s) >= std::abs(obs.s) - perm_rel_tol * s0.scale_s;
        k += std::abs(v.k) >= std::abs(obs.k);
    }
};

}  // namespace detail

/// \brief Ranks 1..n of the values, ties given the average of the ranks they
/// span (the "average" method of scipy.stats.rankdata). Infinities are ranked
/// as ordinary values; a NaN gets rank NaN and the others are ranked among
/// themselves.
/// \param[in] v the values.
/// \returns the ranks, in the order of `v`.
/// \throws std::bad_alloc if the result cannot be allocated.
inline std::vector<double> average_ranks(std::span<double const> v) {
    std::vector<std::size_t> idx;
    idx.reserve(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
        if (!std::isnan(v[i])) idx.push_back(i);
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size(), detail::stats_nan);
    for (std::size_t i = 0; i < idx.size();) {
        std::size_t j = i + 1;
        while (j < idx.size() && v[idx[j]] == v[idx[i]]) ++j;
        double const avg = 0.5 * static_cast<double>(i + 1 + j);  // mean of ranks i+1 … j
        for (std::size_t k = i; k < j; ++k) r[idx[k]] = avg;
        i = j;
    }
    return r;
}

/// \brief Pearson's r = Σ(x−x̄)(y−ȳ) / √(Σ(x−x̄)² Σ(y−ȳ)²), two-pass in double.
/// \param[in] x,y the paired values (same size).
/// \returns r in [−1, 1]; NaN when n < 3, a value is not finite, or x or y is constant.
/// \throws std::invalid_argument if the sizes differ.
inline double pearson(std::span<double const> x, std::span<double const> y) {
    detail::check_same_size(x, y, "pearson");
    if (x.size() < 3 || !detail::all_finite(x) || !detail::all_finite(y)) return detail::stats_nan;
    double sxx = 0, syy = 0, sxy = 0;
    auto const cx = detail::centred(x, sxx);
    auto const cy = detail::centred(y, syy);
    if (!(sxx > 0) || !(syy > 0)) return detail::stats_nan;
    for (std::size_t i = 0; i < cx.size(); ++i) sxy += cx[i] * cy[i];
    return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

/// \brief Spearman's rho: Pearson's r of the average ranks.
/// \param[in] x,y the paired values (same size).
/// \returns rho in [−1, 1]; NaN when n < 3, a value is not finite, or x or y is constant.
/// \throws std::invalid_argument if the sizes differ.
inline double spearman(std::span<double const> x, std::span<double const> y) {
    detail::check_same_size(x, y, "spearman");
    if (x.size() < 3 || !detail::all_finite(x) || !detail::all_finite(y)) return detail::stats_nan;
    auto const rx = average_ranks(x), ry = average_ranks(y);
    return pearson(rx, ry);
}

/// \brief Kendall's tau-b = Σ_{i<j} sgn(x_i−x_j) sgn(y_i−y_j) / √((n₀−n₁)(n₀−n₂)),
/// n₀ = n(n−1)/2, n₁ and n₂ the pairs tied in x and in y. O(n²).
/// \param[in] x,y the paired values (same size).
/// \returns tau-b in [−1, 1]; NaN when n < 3, a value is not finite, or x or y is constant.
/// \throws std::invalid_argument if the sizes differ.
inline double kendall_tau_b(std::span<double const> x, std::span<double const> y) {
    detail::check_same_size(x, y, "kendall_tau_b");
    if (x.size() < 3 || !detail::all_finite(x) || !detail::all_finite(y)) return detail::stats_nan;
    std::int64_t s = 0, tx = 0, ty = 0;  // Σ sx·sy, pairs untied in x, pairs untied in y
    for (std::size_t i = 0; i < x.size(); ++i)
        for (std::size_t j = i + 1; j < x.size(); ++j) {
            int const a = detail::sign(x[i] - x[j]), b = detail::sign(y[i] - y[j]);
            s += a * b;
            tx += a != 0;
            ty += b != 0;
        }
    if (tx == 0 || ty == 0) return detail::stats_nan;
    double const t = static_cast<double>(s) / std::sqrt(static_cast<double>(tx) * static_cast<double>(ty));
    return std::clamp(t, -1.0, 1.0);
}

namespace detail {

/// The permutation loop's precomputed parts of x and y (pairs all finite).
inline perm_setup make_perm_setup(std::span<double const> x, std::span<double const> y) {
    perm_setup s;
    s.n = x.size();
    double sxx = 0, syy = 0, rxx = 0, ryy = 0;
    s.cx = centred(x, sxx);
    s.cy = centred(y, syy);
    s.xrank = average_ranks(x);
    s.yrank = average_ranks(y);
    s.rx = centred(s.xrank, rxx);
    s.ry = centred(s.yrank, ryy);
    s.scale_p = std::sqrt(sxx * syy);
    s.scale_s = std::sqrt(rxx * ryy);
    return s;
}

}  // namespace detail

/// \brief Pearson, Spearman and Kendall's tau-b of the pairs where both x and y
/// are finite, with two-sided permutation p-values under permutations of y:
/// p = #{π : |stat(π)| >= |stat_obs| − 1e-12·scale} / #π, over all n!
/// permutations when n <= max_exact_n ("exact"), else p = (1 + count) /
/// (1 + permutations) over random ones ("monte_carlo"); see
/// docs/study-statistics.md. Cost: n!·n² (exact) or permutations·n² (Monte Carlo).
/// \param[in] x,y the paired values (same size); non-finite pairs are left out.
/// \param[in] o exact limit, Monte Carlo permutations and seed.
/// \returns the test; n the pairs used. With n < 3, or x or y constant over
///          the pairs used, every statistic and p-value is NaN and p_method "none".
/// \throws std::invalid_argument if the sizes differ, max_exact_n is not in
///         [0, 12] or permutations < 1.
template <class = void>
correlation_test correlate(std::span<double const> x, std::span<double const> y, correlation_options const& o = {}) {
    detail::check_same_size(x, y, "correlate");
    if (o.max_exact_n < 0 || o.max_exact_n > 12)
        throw std::invalid_argument("correlate: max_exact_n = " + std::to_string(o.max_exact_n) +
                                    " is not in [0, 12]");
    if (o.permutations < 1)
        throw std::invalid_argument("correlate: permutations = " + std::to_string(o.permutations) +
                                    " is not >= 1");
    std::vector<double> fx, fy;
    for (std::size_t i = 0; i < x.size(); ++i)
        if (std::isfinite(x[i]) && std::isfinite(y[i])) {
            fx.push_back(x[i]);
            fy.push_back(y[i]);
        }
    correlation_test t;
    t.n = static_cast<std::int64_t>(fx.size());
    t.pearson = pearson(fx, fy);
    if (std::isnan(t.pearson)) return t;  // n < 3 or constant: all NaN
    t.spearman = spearman(fx, fy);
    t.kendall = kendall_tau_b(fx, fy);
    auto const s = detail::make_perm_setup(fx, fy);
    std::vector<std::size_t> p(s.n);
    std::iota(p.begin(), p.end(), std::size_t{0});
    auto const obs = detail::permuted(s, p);
    detail::extreme_counts c;
    double total = 0;
    if (t.n <= o.max_exact_n) {
        do {
            c.add(detail::permuted(s, p), obs, s);
            total += 1;
        } while (std::next_permutation(p.begin(), p.end()));
        t.p_method = "exact";
    } else {
        std::mt19937_64 rng(o.seed);
        for (std::int64_t b = 0; b < o.permutations; ++b) {
            detail::shuffle(p, rng);
            c.add(detail::permuted(s, p), obs, s);
        }
        ++c.p;  // the observed arrangement itself
        ++c.s;
        ++c.k;
        total = 1 + static_cast<double>(o.permutations);
        t.p_method = "monte_carlo";
    }
    t.p_pearson = static_cast<double>(c.p) / total;
    t.p_spearman = static_cast<double>(c.s) / total;
    t.p_kendall = static_cast<double>(c.k) / total;
    return t;
}

/// \brief The mean of the finite values with a percentile-bootstrap interval:
/// `resamples` resamples of n values drawn with replacement (std::mt19937_64
/// seeded with `seed`), their means sorted m_(0) ≤ … ≤ m_(B−1), and lo, hi the
/// quantiles q = (1−level)/2 and (1+level)/2 by linear interpolation at
/// h = (B−1)·q between m_(⌊h⌋) and m_(⌊h⌋+1) (scipy/numpy "linear").
/// \param[in] v the values; non-finite ones are left out.
/// \param[in] level the coverage, in (0, 1).
/// \param[in] resamples the bootstrap resamples B, >= 1.
/// \param[in] seed the generator's seed.
/// \returns mean, lo, hi and n (finite count). n == 0: all NaN; n == 1: mean
///          the value, lo = hi = NaN (one value has no spread to resample).
/// \throws std::invalid_argument if level is not in (0, 1) or resamples < 1.
template <class = void>
interval bootstrap_mean(std::span<double const> v, double level = 0.95, std::int64_t resamples = 2000,
                        std::uint64_t seed = 0) {
    if (!(level > 0 && level < 1))
        throw std::invalid_argument("bootstrap_mean: level = " + detail::number_text(level) + " is not in (0, 1)");
    if (resamples < 1)
        throw std::invalid_argument("bootstrap_mean: resamples = " + std::to_string(resamples) +
                                    " is not >= 1");
    std::vector<double> f;
    for (double a : v)
        if (std::isfinite(a)) f.push_back(a);
    interval r;
    r.n = static_cast<std::int64_t>(f.size());
    if (f.empty()) return r;
    r.mean = std::accumulate(f.begin(), f.end(), 0.0) / static_cast<double>(f.size());
    if (f.size() == 1) return r;
    std::mt19937_64 rng(seed);
    std::vector<double> means(static_cast<std::size_t>(resamples));
    for (auto& m : means) {
        double sum = 0;
        for (std::size_t i = 0; i < f.size(); ++i) sum += f[detail::bounded(rng, f.size())];
        m = sum / static_cast<double>(f.size());
    }
    std::sort(means.begin(), means.end());
    auto quantile = [&](double q) {
        double const h = static_cast<double>(means.size() - 1) * q;
        auto const lo = static_cast<std::size_t>(std::floor(h));
        std::size_t const hi = std::min(lo + 1, means.size() - 1);
        return means[lo] + (h - static_cast<double>(lo)) * (means[hi] - means[lo]);
    };
    r.lo = quantile((1 - level) / 2);
    r.hi = quantile((1 + level) / 2);
    return r;
}

}  // namespace study
}  // namespace qkgeom
