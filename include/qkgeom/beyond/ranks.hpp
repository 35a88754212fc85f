// qkgeom — beyond pairs (issue 17, docs/beyond-ranks.md): from the fitted
// Gaussian model of a head (method §4–5), for a query of bucket b and m
// candidate keys, the scores s = K̃ q̃ are jointly Gaussian,
//     s ~ N(K̃ w_b, K̃ V_b K̃ᵀ)      (k̃ = H k, V_b = diag(σ²_pos, σ²_b) or blockdiag)
// and two numbers describe the softmax's competition among them:
//   top-1 flip   1 − Σ_i p_i²,  p_i = P(key i has the top score): the
//                probability that two independent draws of the query's
//                content pick different winners. p_i is an (m−1)-dimensional
//                Gaussian orthant probability of the differences s_i − s_j,
//                integrated by Genz's separation of variables on a randomly
//                shifted, periodised Richtmyer lattice (antithetic), whose
//                shifts give the error estimate.
//   Kendall      E[τ_a] between score order and position order, exact from
//                the pairs: (1/C(m,2)) Σ_{i<j} sign(t_i − t_j)(2Φ(m_ij/√v_ij) − 1).
// The key sets are drawn per query bucket with their own policy (`prefix`:
// m keys of one example among its admissible keys; `same_bucket`: m keys of
// one (example, bucket) group), seeded from the options' seed and the head.
// Not included by <qkgeom/plasticity/attention_plasticity.hpp> or the umbrella header.
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/cancel.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/plasticity/aggregate.hpp>
#include <qkgeom/plasticity/attention_plasticity.hpp>
#include <qkgeom/plasticity/engine.hpp>
#include <qkgeom/plasticity/pair_plan.hpp>
#include <qkgeom/stats/gaussian.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <tuple>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief Which m keys compete for a query of bucket b (docs/beyond-ranks.md).
enum class rank_key_policy {
    prefix,       ///< default: m distinct keys of one example among its keys admissible for b
    same_bucket,  ///< m distinct keys of one (example, key bucket c) group, c admissible for b
};

/// \brief Options of `rank_stability`.
struct rank_options {
    index_t keys_per_set = 8;              ///< m, the competing keys per set: 2 ≤ m ≤ 64
    std::int64_t sets_per_bucket = 16;     ///< key sets drawn per query bucket (with replacement), ≥ 1
    std::int64_t lattice_points = 1;       ///< lattice points per shift (each with its antithetic), ≥ 1
    std::int64_t lattice_shifts = 2;       ///< independent random shifts, ≥ 2 (unbiased Σp², error estimate)
    rank_key_policy keys = rank_key_policy::prefix;  ///< the key-set draw
    std::uint64_t seed = 0;                ///< with the head's identity, selects every draw
    bool keep_sets = false;                ///< also return every drawn set (`rank_result::sets`)
};

/// \brief Top-1 flip and Kendall of one Gaussian score vector (`score_rank_stability`).
struct rank_set_stats {
    double top1_flip = detail::nan;         ///< 1 − Σ p_i², unbiased over the shifts, clipped to [0, 1 − 1/m]
    double top1_flip_int_se = detail::nan;  ///< its integration standard error (from the shifts)
    double kendall = detail::nan;           ///< E[τ_a(scores, positions)], exact
    Eigen::VectorXd p;                      ///< p_i = P(key i has the top score), mean over the shifts
};

/// \brief One drawn key set (kept when `rank_options::keep_sets`).
struct rank_set {
    std::int64_t q_bucket = 0;
    std::int64_t example = 0;
    std::vector<index_t> rows;  ///< key row indices, ascending
    double top1_flip = detail::nan, top1_flip_int_se = detail::nan, kendall = detail::nan;
};

/// \brief Why a query bucket has no value.
enum class rank_bucket_status {
    ok,           ///< values from n_sets drawn sets
    no_model,     ///< the bucket has no Gaussian model (< 2 queries, method §9.8; non-finite variances)
    no_key_set,   ///< no admissible example / group holds m keys
};

/// \brief One query bucket (a row of the per-bucket profile).
struct rank_bucket {
    std::int64_t q_bucket = 0;
    std::int64_t n_queries = 0;        ///< the bucket's weight
    double tau = detail::nan;          ///< τ_b
    int quintile = 0;                  ///< ⌊5 τ_b / L⌋ (method §9.12)
    rank_bucket_status status = rank_bucket_status::ok;
    std::int64_t n_sources = 0;        ///< examples (prefix) or groups (same_bucket) holding ≥ m admissible keys
    std::int64_t n_sets = 0;           ///< sets drawn and evaluated
    std::int64_t n_sets_identical = 0; ///< drawn sets with two identical key vectors: not evaluated
    double top1_flip = detail::nan;
    double top1_flip_se = detail::nan;      ///< sd over the sets / √n_sets (set sampling + integration)
    double top1_flip_int_se = detail::nan;  ///< integration part alone
    double kendall = detail::nan;
    double kendall_se = detail::nan;        ///< sd over the sets / √n_sets (set sampling)
};

/// \brief Result of `rank_stability` for one head; scalar fields are proposed
/// head_metrics.csv columns (docs/beyond-ranks.md).
struct rank_result {
    std::vector<rank_bucket> profile;  ///< one per query bucket model, ascending
    std::vector<rank_set> sets;        ///< every drawn set when `keep_sets`
    double top1_flip = detail::nan;    ///< n_queries-weighted mean over buckets with a value
    double top1_flip_se = detail::nan;
    double top1_flip_first_20pct = detail::nan, top1_flip_last_20pct = detail::nan;
    double top1_flip_drop = detail::nan;  ///< first − last quintile
    double kendall = detail::nan;
    double kendall_se = detail::nan;
    double kendall_first_20pct = detail::nan, kendall_last_20pct = detail::nan;
    double kendall_drop = detail::nan;    ///< first − last quintile
    index_t keys_per_set = 0;             ///< m
    std::int64_t n_sets = 0;              ///< evaluated sets over all buckets
    std::int64_t n_sets_identical = 0;
    std::int64_t n_buckets_no_model = 0;
    std::int64_t n_buckets_no_key_set = 0;
    std::int64_t context_length = 0;      ///< L of the quintiles
};

namespace detail {

/// Φ⁻¹(p) for |q| ≤ 0.425, q = p − 0.5 (AS 241's central rational; finite for any |q| ≤ 1).
template <class = void>  // instantiated on use
double normal_quantile_central(double q) noexcept {
    double const r = 0.180625 - q * q;
    return q *
               (((((((2509.0809287301226727 * r + 33430.575583588128105) * r + 67265.770927008700853) * r +
                    45921.953931549871457) * r + 13731.693765509461125) * r + 1971.5909503065514427) * r +
                 133.14166789178437745) * r + 3.387132872796366608) /
               (((((((5226.495278852545925 * r + 28729.085735721942674) * r + 39307.89580009271061) * r +
                    21213.794301586595867) * r + 5394.1960214247511077) * r + 687.1870074920579083) * r +
                 42.313330701600911252) * r + 1.0);
}

/// Φ⁻¹(p) for |q| > 0.425, q = p − 0.5 (AS 241's tails).
template <class = void>  // instantiated on use
double normal_quantile_tail(double p, double q) noexcept {
    double r = q < 0 ? p : 1.0 - p;
    r = std::sqrt(-std::log(r));
    double x = 0;
    if (r <= 5.0) {
        r -= 1.6;
        x = (((((((7.7454501427834140764e-4 * r + 0.0227238449892691845833) * r + 0.24178072517745061177) * r +
                 1.27045825245236838258) * r + 3.64784832476320460504) * r + 5.7694972214606914055) * r +
              4.6303378461565452959) * r + 1.42343711074968357734) /
            (((((((1.05075007164441684324e-9 * r + 5.475938084995344946e-4) * r + 0.0151986665636164571966) * r +
                 0.14810397642748007459) * r + 0.68976733498510000455) * r + 1.6763848301838038494) * r +
              2.05319162663775882187) * r + 1.0);
    } else {
        r -= 5.0;
        x = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r + 0.0012426609473880784386) * r +
                 0.026532189526576123093) * r + 0.29656057182850489123) * r + 1.7848265399172913358) * r +
              5.4637849111641143699) * r + 6.6579046435011037772) /
            (((((((2.04426310338993978564e-15 * r + 1.4215117583164458887e-7) * r + 1.8463183175100546818e-5) * r +
                 7.868691311456132591e-4) * r + 0.0148753612908506148525) * r + 0.13692988092273580531) * r +
              0.59983220655588793769) * r + 1.0);
    }
    return q < 0 ? -x : x;
}

/// Φ⁻¹(p), p ∈ (0, 1): Wichura's AS 241 (PPND16), relative accuracy ~1e-16
/// (the tests' reference for `rank_quantile`).
template <class = void>  // instantiated on use
double normal_quantile(double p) noexcept {
    double const q = p - 0.5;
    return std::abs(q) <= 0.425 ? normal_quantile_central(q) : normal_quantile_tail(p, q);
}

/// The Φ⁻¹ of the orthant integrands: P. J. Acklam's rationals (2003),
/// relative error ≤ 1.15e-9 against Φ⁻¹ over (0, 1) (checked against
/// `normal_quantile` in tests/runtime/rank_stability_test.cpp): a change of
/// the integration variables y_k by ~1e-9 relative, far below the lattice's
/// error, at a third less cost than AS 241. Central rational for
/// |q| ≤ rank_quantile_split (q = p − 0.5; finite for any |q| ≤ 1) ...
inline constexpr double rank_quantile_split = 0.47575;  // 0.02425 ≤ p ≤ 0.97575

template <class = void>  // instantiated on use
double rank_quantile_central(double q) noexcept {
    double const r = q * q;
    return (((((-3.969683028665376e+01 * r + 2.209460984245205e+02) * r - 2.759285104469687e+02) * r +
              1.383577518672690e+02) * r - 3.066479806614716e+01) * r + 2.506628277459239e+00) * q /
           (((((-5.447609879822406e+01 * r + 1.615858368580409e+02) * r - 1.556989798598866e+02) * r +
              6.680131188771972e+01) * r - 1.328068155288572e+01) * r + 1.0);
}
/// ... and the tails (|q| > rank_quantile_split).
template <class = void>  // instantiated on use
double rank_quantile_tail(double p, double q) noexcept {
    double const r = std::sqrt(-2.0 * std::log(q < 0 ? p : 1.0 - p));
    double const x = (((((-7.784894002430293e-03 * r - 3.223964580411365e-01) * r - 2.400758277161838e+00) * r -
                         2.549732539343734e+00) * r + 4.374664141464968e+00) * r + 2.938163982698783e+00) /
                     ((((7.784695709041462e-03 * r + 3.224671290700398e-01) * r + 2.445134137142996e+00) * r +
                       3.754408661907416e+00) * r + 1.0);
    return q < 0 ? x : -x;
}

/// Φ⁻¹(p), p ∈ (0, 1), to 1.15e-9 relative (the integrands evaluate the two
/// parts lane by lane).
template <class = void>  // instantiated on use
double rank_quantile(double p) noexcept {
    double const q = p - 0.5;
    return std::abs(q) <= rank_quantile_split ? rank_quantile_central(q) : rank_quantile_tail(p, q);
}

/// The randomised lattice of the orthant integrals: Richtmyer generators
/// q_k = frac(√prime_k), points x = |2 frac(i q + Δ) − 1| (baker's
/// periodisation) and their antithetics 1 − x, i = 1..N, per random shift Δ.
struct rank_lattice {
    std::vector<double> q;  ///< one generator per dimension
    std::int64_t points = 8, shifts = 2;

    rank_lattice(index_t dims, std::int64_t n_points, std::int64_t n_shifts) : points(n_points), shifts(n_shifts) {
        for (std::int64_t p = 2; static_cast<index_t>(q.size()) < dims; ++p) {
            bool prime = true;
            for (std::int64_t f = 2; f * f <= p && prime; ++f) prime = p % f != 0;
            if (prime) {
                double const s = std::sqrt(static_cast<double>(p));
                q.push_back(s - std::floor(s));
            }
        }
    }
};

/// Lattice points integrated side by side (independent evaluations whose special
/// functions overlap; the default lattice has 4 per orthant: 1 point and its
/// antithetic × 2 shifts).
inline constexpr int rank_lanes = 4;

/// Scratch of the orthant integrals of one set: sized once, reused (no
/// allocation per set once grown).
struct orthant_work {
    int n = 0;                         ///< dimension of the current integral (m − 1)
    std::vector<double> S, b;          ///< the full S (row-major n × n) and b of one key
    std::vector<double> L, bp;         ///< lower Cholesky factor of the permuted S (row-major), permuted b
    std::vector<double> inv;           ///< 1 / L_kk (0 where fixed)
    std::vector<double> key;           ///< the sort keys b_j / √S_jj
    std::vector<int> order;
    std::vector<unsigned char> fixed;  ///< conditional variance zero: an indicator, no integration variable
    Eigen::MatrixXd shift;             ///< the shifts of the set (shifts × max(1, n − 1))
    std::vector<double> x;             ///< the lattice points of the set (`rank_points`)
    std::vector<double> f;             ///< integrand values, one per lattice point and antithetic
    std::vector<double> est;           ///< one orthant probability per shift
    Eigen::MatrixXd P;                 ///< the per-shift top-1 probabilities (shifts × m)

    void resize(int dim) {
        n = dim;
        auto const nn = static_cast<std::size_t>(dim) * static_cast<std::size_t>(dim);
        S.resize(nn);
        L.resize(nn);
        b.resize(static_cast<std::size_t>(dim));
        bp.resize(static_cast<std::size_t>(dim));
        inv.resize(static_cast<std::size_t>(dim));
        key.resize(static_cast<std::size_t>(dim));
        order.resize(static_cast<std::size_t>(dim));
        fixed.resize(static_cast<std::size_t>(dim));
    }
};

/// The sort key of limit j: b_j/√S_jj (±∞ where S_jj ≤ 0).
template <class = void>  // instantiated on use
double orthant_key(double b, double s) noexcept {
    double const big = std::numeric_limits<double>::infinity();
    return s > 0 ? b / std::sqrt(s) : (b > 0 ? big : -big);
}

/// Permutes (b, S) of `w` so that the most restrictive limits come first
/// (Genz–Bretz; `w.key` = `orthant_key` of each, filled by the caller), then
/// the lower Cholesky factor L of the permuted S, with conditional variances
/// ≤ 1e-12·max S_jj treated as zero (`fixed`).
template <class = void>  // instantiated on use
void orthant_factor(orthant_work& w) noexcept {
    int const n = w.n;
    auto const un = static_cast<std::size_t>(n);
    double scale = w.S[0];
    for (std::size_t j = 0; j < un; ++j) scale = std::max(scale, w.S[j * un + j]);
    for (std::size_t j = 0; j < un; ++j) {  // stable sort by counting (no branches; n ≤ 63; keys not NaN)
        std::size_t rank = 0;
        for (std::size_t k = 0; k < un; ++k)
            rank += static_cast<std::size_t>(w.key[k] < w.key[j]) + static_cast<std::size_t>(k < j && w.key[k] == w.key[j]);
        w.order[rank] = static_cast<int>(j);
    }
    std::fill(w.L.begin(), w.L.end(), 0.0);
    std::fill(w.fixed.begin(), w.fixed.end(), static_cast<unsigned char>(0));
    for (std::size_t k = 0; k < un; ++k) {
        auto const ok = static_cast<std::size_t>(w.order[k]);
        w.bp[k] = w.b[ok];
        double* const Lk = w.L.data() + k * un;
        for (std::size_t j = 0; j <= k; ++j) {
            double const* const Lj = w.L.data() + j * un;
            double v = w.S[ok * un + static_cast<std::size_t>(w.order[j])];
            for (std::size_t l = 0; l < j; ++l) v -= Lk[l] * Lj[l];
            if (j < k) {
                Lk[j] = v * w.inv[j];  // 0 when j is fixed
            } else if (v > 1e-12 * scale && scale > 0) {
                Lk[k] = std::sqrt(v);
                w.inv[k] = 1.0 / Lk[k];
            } else {
                w.inv[k] = 0.0;
                w.fixed[k] = 1;
            }
        }
    }
}

/// Genz's integrand of separation of variables at rank_lanes points
/// (coordinate k of point l at x[k·rank_lanes + l]), evaluated side by side in
/// straight loops (the central Φ⁻¹ for every lane, then the tails where
/// needed); `e0` = e_0, the first factor, which does not depend on x.
template <class = void>  // instantiated on use
void orthant_integrand(orthant_work const& w, double e0, double const* x, double* out) noexcept {
    constexpr int W = rank_lanes;
    int const n = w.n;
    std::array<double, 64 * W> y;
    std::array<double, W> prod, t, u, q, ev;
    prod.fill(1.0);
    for (int k = 0; k < n; ++k) {
        double const* const Lk = w.L.data() + static_cast<std::size_t>(k) * static_cast<std::size_t>(n);
        double* const yk = y.data() + static_cast<std::size_t>(k) * W;
        t.fill(w.bp[static_cast<std::size_t>(k)]);
        for (int j = 0; j < k; ++j) {
            double const c = Lk[j];
            double const* const yj = y.data() + static_cast<std::size_t>(j) * W;
            for (std::size_t l = 0; l < W; ++l) t[l] -= c * yj[l];
        }
        if (w.fixed[static_cast<std::size_t>(k)] != 0) {
            for (std::size_t l = 0; l < W; ++l) {
                if (!(t[l] > 0)) prod[l] = 0.0;
                yk[l] = 0.0;
            }
            continue;
        }
        for (std::size_t l = 0; l < W; ++l) {
            ev[l] = k == 0 ? e0 : preference_probability(t[l] * w.inv[static_cast<std::size_t>(k)]);
            prod[l] *= ev[l];
        }
        if (k + 1 == n) break;  // the last variable has no coordinate in x (n − 1 of them)
        double const* const xk = x + static_cast<std::size_t>(k) * W;
        for (std::size_t l = 0; l < W; ++l)
            u[l] = std::clamp(xk[l] * ev[l], std::numeric_limits<double>::min(), 1.0 - 0x1p-53);
        for (std::size_t l = 0; l < W; ++l) {
            q[l] = u[l] - 0.5;
            yk[l] = rank_quantile_central(q[l]);  // every lane (straight code), then the tails
        }
        for (std::size_t l = 0; l < W; ++l)
            if (!(std::abs(q[l]) <= rank_quantile_split)) yk[l] = rank_quantile_tail(u[l], q[l]);
    }
    for (std::size_t l = 0; l < W; ++l) out[l] = prod[l] > 0 ? prod[l] : 0.0;
}

/// The lattice points of a set (shared by its m orthants), in blocks of
/// rank_lanes points: point l of block c, coordinate k at
/// x[(c (n − 1) + k)·rank_lanes + l]; point index (r·N + i − 1)·2 + antithetic.
template <class Dep = void>
void rank_points(detail::dep_t<rank_lattice, Dep> const& lat, detail::dep_t<orthant_work, Dep>& w) {
    constexpr int W = rank_lanes;
    int const nk = std::max(1, w.n - 1);
    auto const per_shift = 2 * lat.points;
    auto const total = static_cast<std::int64_t>(w.shift.rows()) * per_shift;
    auto const block = static_cast<std::size_t>(nk) * W;
    w.x.assign(static_cast<std::size_t>((total + W - 1) / W) * block, 0.5);
    for (std::int64_t idx = 0; idx < total; ++idx) {
        std::int64_t const r = idx / per_shift;
        auto const i = static_cast<double>((idx % per_shift) / 2 + 1);
        bool const anti = idx % 2 == 1;
        double* const xb = w.x.data() + static_cast<std::size_t>(idx / W) * block + static_cast<std::size_t>(idx % W);
        for (int k = 0; k + 1 < w.n; ++k) {
            double const f = i * lat.q[static_cast<std::size_t>(k)] + w.shift(static_cast<index_t>(r), k);
            double const v = std::abs(2.0 * (f - std::floor(f)) - 1.0);
            xb[static_cast<std::size_t>(k) * W] = anti ? 1.0 - v : v;
        }
    }
}

/// P(X < b), X ~ N(0, S) for the (b, S) of `w` (n ≥ 1), once per shift:
/// `est[r]` for shift r, on the points `w.x` of `rank_points`.
template <class Dep = void>
void orthant_probability(detail::dep_t<rank_lattice, Dep> const& lat, std::span<double> est,
                         detail::dep_t<orthant_work, Dep>& w) {
    constexpr int W = rank_lanes;
    orthant_factor(w);
    int const n = w.n;
    double const e0 = w.fixed[0] != 0 ? 1.0 : preference_probability(w.bp[0] / w.L[0]);
    if (w.fixed[0] != 0 && !(w.bp[0] > 0)) {  // an indicator that is 0: exact
        std::fill(est.begin(), est.end(), 0.0);
        return;
    }
    int free_vars = 0;
    for (int k = 0; k + 1 < n; ++k) free_vars += w.fixed[static_cast<std::size_t>(k)] == 0 ? 1 : 0;
    std::array<double, W> v{};
    if (free_vars == 0) {  // the integrand does not depend on x: exact
        std::array<double, 64 * W> x;
        x.fill(0.5);
        orthant_integrand(w, e0, x.data(), v.data());
        std::fill(est.begin(), est.end(), v[0]);
        return;
    }
    auto const per_shift = 2 * lat.points;  // each point and its antithetic
    auto const total = static_cast<std::int64_t>(est.size()) * per_shift;
    auto const block = static_cast<std::size_t>(std::max(1, n - 1)) * W;
    w.f.resize(static_cast<std::size_t>(total));
    for (std::int64_t c0 = 0; c0 < total; c0 += W) {
        int const count = static_cast<int>(std::min<std::int64_t>(W, total - c0));
        orthant_integrand(w, e0, w.x.data() + static_cast<std::size_t>(c0 / W) * block, v.data());  // lanes ≥ count: ignored
        std::copy_n(v.begin(), count, w.f.begin() + c0);
    }
    for (std::size_t r = 0; r < est.size(); ++r) {
        double sum = 0;
        for (std::int64_t a = 0; a < per_shift; ++a) sum += w.f[r * static_cast<std::size_t>(per_shift) + static_cast<std::size_t>(a)];
        est[r] = sum / (2.0 * static_cast<double>(lat.points));
    }
}

/// E[τ_a] between the score order and the position order (exact, method §5 pairs).
template <class Dep = void>
double expected_kendall(detail::dep_t<Eigen::VectorXd, Dep> const& s, detail::dep_t<Eigen::MatrixXd, Dep> const& C,
                        std::span<double const> t) {
    auto const m = s.size();
    double sum = 0;
    for (index_t i = 0; i < m; ++i)
        for (index_t j = i + 1; j < m; ++j) {
            double const dt = t[static_cast<std::size_t>(i)] - t[static_cast<std::size_t>(j)];
            if (dt == 0) continue;  // tied positions contribute 0
            double const mij = s(i) - s(j), vij = C(i, i) + C(j, j) - 2.0 * C(i, j);
            double e = 0;  // E[sign(s_i − s_j)]
            if (vij > 0) e = 2.0 * preference_probability(mij / std::sqrt(vij)) - 1.0;
            else e = mij > 0 ? 1.0 : (mij < 0 ? -1.0 : 0.0);
            sum += (dt > 0 ? e : -e);
        }
    return sum / (0.5 * static_cast<double>(m) * static_cast<double>(m - 1));
}

/// Keys whose winning probability is bounded by min_j Φ(z_ij) < this are not
/// integrated (p_i = 0; the error in Σ p_i² is below 1e-14 per key).
inline constexpr double rank_negligible = 1e-7;
/// Φ⁻¹(rank_negligible): the bound is tested as min_j z_ij < this (no Φ).
inline constexpr double rank_negligible_z = -5.1993375821928165;

/// The per-shift top-1 probabilities P̂ (shifts × m, held by `w`), each row
/// normalised to sum 1.
template <class Dep = void>
Eigen::MatrixXd const& top1_probabilities(detail::dep_t<Eigen::VectorXd, Dep> const& s,
                                          detail::dep_t<Eigen::MatrixXd, Dep> const& C,
                                          detail::dep_t<rank_lattice, Dep> const& lat, std::mt19937_64& gen,
                                          detail::dep_t<orthant_work, Dep>& w) {
    auto const m = s.size();
    auto const R = static_cast<index_t>(lat.shifts);
    w.P.setZero(R, m);
    w.shift.resize(R, std::max<index_t>(1, m - 2));
    for (index_t r = 0; r < w.shift.rows(); ++r)
        for (index_t k = 0; k < w.shift.cols(); ++k) w.shift(r, k) = unit_interval(gen());
    w.resize(static_cast<int>(m - 1));
    rank_points(lat, w);
    auto const n = static_cast<std::size_t>(m - 1);
    w.est.resize(static_cast<std::size_t>(R));
    std::span<double> const es(w.est);
    for (index_t i = 0; i < m; ++i) {
        bool negligible = false;
        std::size_t a = 0;
        for (index_t j = 0; j < m; ++j) {
            if (j == i) continue;
            w.b[a] = s(i) - s(j);  // D_j = s_i − s_j ~ N(b, S): P(all D > 0) = P(X < b), X ~ N(0, S)
            std::size_t c = 0;
            for (index_t k = 0; k < m; ++k) {
                if (k == i) continue;
                w.S[a * n + c++] = C(i, i) - C(i, k) - C(j, i) + C(j, k);
            }
            w.key[a] = orthant_key(w.b[a], w.S[a * n + a]);
            negligible = negligible || w.key[a] < rank_negligible_z;
            ++a;
        }
        if (negligible) continue;
        orthant_probability(lat, es, w);
        for (index_t r = 0; r < R; ++r) w.P(r, i) = es[static_cast<std::size_t>(r)];
    }
    for (index_t r = 0; r < R; ++r) {
        double const tot = w.P.row(r).sum();
        if (tot > 0) w.P.row(r) /= tot;
    }
    return w.P;
}
/// 1 − Σ p_i² from the per-shift estimates: the U-statistic over shift pairs
/// r ≠ r′ (unbiased for independent shifts), its integration standard error
/// by linearisation, clipped to [0, 1 − 1/m].
template <class Dep = void>
rank_set_stats flip_of(detail::dep_t<Eigen::MatrixXd, Dep> const& P) {
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    using RSStats = detail::dep_t<rank_set_stats, Dep>;
    auto const R = P.rows();
    auto const m = P.cols();
    RSStats st;
    st.p = P.colwise().mean().transpose();
    VecX const colsum = P.colwise().sum().transpose();
    double const cross = colsum.squaredNorm() - P.squaredNorm();  // Σ_i Σ_{r≠r′} P_ri P_r′i
    double const sum_p2 = cross / (static_cast<double>(R) * static_cast<double>(R - 1));
    st.top1_flip = std::clamp(1.0 - sum_p2, 0.0, 1.0 - 1.0 / static_cast<double>(m));
    VecX const g = P * (2.0 * st.p);  // linearised Σ p² per shift
    double const gm = g.mean();
    double const var = (g.array() - gm).square().sum() / static_cast<double>(R - 1);
    st.top1_flip_int_se = std::sqrt(var / static_cast<double>(R));
    return st;
}

/// Checks rank options (the field and value named in the message).
template <class = void>  // instantiated on use
void check_rank_options(std::string_view fn, rank_options const& o) {
    if (o.keys_per_set < 2 || o.keys_per_set > 64)
        fail_arg(fn, "rank_options.keys_per_set must be in [2, 64]", o.keys_per_set);
    if (o.sets_per_bucket < 1) fail_arg(fn, "rank_options.sets_per_bucket must be >= 1", o.sets_per_bucket);
    if (o.lattice_points < 1) fail_arg(fn, "rank_options.lattice_points must be >= 1", o.lattice_points);
    if (o.lattice_shifts < 2) fail_arg(fn, "rank_options.lattice_shifts must be >= 2", o.lattice_shifts);
    if (o.keys != rank_key_policy::prefix && o.keys != rank_key_policy::same_bucket)
        fail_arg(fn, "rank_options.keys: unknown key policy", static_cast<int>(o.keys));
}

}  // namespace detail

/// \brief Top-1 flip and expected Kendall τ_a of m jointly Gaussian scores.
/// \param[in] mean       score means (m ≥ 2)
/// \param[in] cov        score covariance (m × m, symmetric positive semi-definite)
/// \param[in] positions  the keys' positions (m), for Kendall's position order
/// \param[in] opt        lattice_points, lattice_shifts (the key-set fields are not used)
/// \param[in] seed       the lattice shifts' seed (same seed, same result)
/// \returns p_i, 1 − Σ p_i² with its integration standard error, E[τ_a]
/// \throws std::invalid_argument on bad options or sizes (named)
template <class Dep = void>
rank_set_stats score_rank_stability(detail::dep_t<Eigen::VectorXd, Dep> const& mean,
                                    detail::dep_t<Eigen::MatrixXd, Dep> const& cov,
                                    std::span<double const> positions, rank_options const& opt, std::uint64_t seed) {
    using RSStats = detail::dep_t<rank_set_stats, Dep>;
    constexpr std::string_view fn = "qkgeom::score_rank_stability";
    if (mean.size() < 2 || mean.size() > 64) detail::fail_arg(fn, "mean: need 2 to 64 scores; size", mean.size());
    rank_options o = opt;
    o.keys_per_set = mean.size();
    detail::check_rank_options(fn, o);
    if (!mean.allFinite()) detail::fail_arg(fn, "mean: values must be finite; size", mean.size());
    if (cov.size() != 0 && !cov.allFinite()) detail::fail_arg(fn, "cov: values must be finite; rows", cov.rows());
    if (cov.rows() != mean.size() || cov.cols() != mean.size()) detail::fail_arg(fn, "cov must be m x m; rows", cov.rows());
    if (static_cast<index_t>(positions.size()) != mean.size())
        detail::fail_arg(fn, "positions must have m entries; entries", positions.size());
    detail::rank_lattice const lat(mean.size() - 2, o.lattice_points, o.lattice_shifts);
    std::mt19937_64 gen(detail::splitmix64(seed));
    detail::orthant_work w;
    RSStats st = detail::flip_of(detail::top1_probabilities(mean, cov, lat, gen, w));
    st.kendall = detail::expected_kendall(mean, cov, positions);
    return st;
}

namespace detail {

/// The keys of a head by (example, bucket, row): each example a contiguous
/// run, inside it ascending key bucket, so that an example's keys in the
/// admissible buckets [c_lo, c_hi] are one sub-run (admissible buckets are a
/// contiguous range of the present ones: c < b and the window rule are monotone).
struct rank_key_index {
    std::vector<index_t> rows;                ///< sorted rows
    std::vector<std::int64_t> bucket;         ///< bucket of rows[i]
    std::vector<std::size_t> start;           ///< example e's run: [start[e], start[e + 1])
    std::vector<std::int64_t> example;        ///< example id of run e
    std::vector<std::int64_t> present;        ///< key buckets present, ascending

    rank_key_index(std::span<std::int64_t const> kb, std::span<std::int64_t const> ke) {
        auto const n = kb.size();
        rows.resize(n);
        std::iota(rows.begin(), rows.end(), index_t{0});
        auto const before = [&](index_t a, index_t b) {
            auto const ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
            if (ke[ua] != ke[ub]) return ke[ua] < ke[ub];
            if (kb[ua] != kb[ub]) return kb[ua] < kb[ub];
            return a < b;
        };
        if (!std::is_sorted(rows.begin(), rows.end(), before))  // captures usually are: no sort
            std::sort(rows.begin(), rows.end(), before);
        bucket.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            auto const r = static_cast<std::size_t>(rows[i]);
            bucket[i] = kb[r];
            if (i == 0 || ke[r] != example.back()) {
                start.push_back(i);
                example.push_back(ke[r]);
            }
        }
        start.push_back(n);
        if (n == 0) return;
        auto const [lo, hi] = std::minmax_element(kb.begin(), kb.end());
        if (static_cast<std::uint64_t>(*hi) - static_cast<std::uint64_t>(*lo) < 4 * n + 64) {  // flags, no sort
            std::vector<unsigned char> seen(static_cast<std::size_t>(*hi - *lo) + 1, 0);
            for (auto c : kb) seen[static_cast<std::size_t>(c - *lo)] = 1;
            for (std::size_t c = 0; c < seen.size(); ++c)
                if (seen[c] != 0) present.push_back(*lo + static_cast<std::int64_t>(c));
            return;
        }
        present.assign(kb.begin(), kb.end());
        std::sort(present.begin(), present.end());
        present.erase(std::unique(present.begin(), present.end()), present.end());
    }
};

/// The key rows of a head as `rank_stability` reads them: on demand, only
/// the rows of drawn sets, rotated one by one (k̃ = H k, O(d) each).
template <class Reader>
struct rank_rows {
    Reader const& rows;
    householder_reflector const& H;
    std::span<std::int64_t const> position;
    index_t d = 0;

    /// Kt(:, a) = k_row, the original key (keys as columns: contiguous).
    void read(index_t row, Eigen::MatrixXd& Kt, index_t a) const { rows.read_row(row, Kt.col(a).data()); }
    /// Kt(:, a) ← H Kt(:, a).
    void rotate(Eigen::MatrixXd& Kt, index_t a) const {
        if (H.is_identity()) return;
        auto col = Kt.col(a);
        col -= (H.gamma * H.u.dot(col)) * H.u;
    }
};

/// A candidate source of key sets: rows[first, first + count) of the index.
struct rank_source {
    std::size_t first = 0, count = 0;
    std::int64_t example = 0;
};

/// The sources of query bucket b: per example its admissible keys (`prefix`)
/// or its (example, bucket) groups (`same_bucket`), only those with ≥ m keys.
template <class Dep = void>
std::vector<rank_source> rank_sources(detail::dep_t<rank_key_index, Dep> const& ix, capture_facts const& facts,
                                      std::int64_t b,
                                      rank_options const& o) {
    std::vector<rank_source> out;
    std::int64_t lo = -1, hi = -1;
    for (auto c : ix.present)
        if (c < b && in_window(facts, b, c)) {
            if (lo < 0) lo = c;
            hi = c;
        }
    if (lo < 0) return out;
    auto const m = static_cast<std::size_t>(o.keys_per_set);
    for (std::size_t e = 0; e + 1 < ix.start.size(); ++e) {
        auto const beg = ix.bucket.begin() + static_cast<std::ptrdiff_t>(ix.start[e]);
        auto const end = ix.bucket.begin() + static_cast<std::ptrdiff_t>(ix.start[e + 1]);
        auto a = beg;
        auto z = beg;
        if (end - beg <= 64) {  // short runs: branch-free counts (the run is sorted)
            std::ptrdiff_t below = 0, upto = 0;
            for (auto it = beg; it != end; ++it) {
                below += *it < lo ? 1 : 0;
                upto += *it <= hi ? 1 : 0;
            }
            a += below;
            z += upto;
        } else {
            a = std::lower_bound(beg, end, lo);
            z = std::upper_bound(a, end, hi);
        }
        if (o.keys == rank_key_policy::prefix) {
            if (static_cast<std::size_t>(z - a) >= m)
                out.push_back({static_cast<std::size_t>(a - ix.bucket.begin()), static_cast<std::size_t>(z - a),
                               ix.example[e]});
            continue;
        }
        while (a != z) {
            auto const g = std::upper_bound(a, z, *a);
            if (static_cast<std::size_t>(g - a) >= m)
                out.push_back({static_cast<std::size_t>(a - ix.bucket.begin()), static_cast<std::size_t>(g - a),
                               ix.example[e]});
            a = g;
        }
    }
    return out;
}

/// Draws one key set: a source with probability ∝ its key count, then m
/// distinct keys uniformly (Floyd's algorithm); rows ascending.
template <class Dep = void>
rank_set draw_rank_set(detail::dep_t<rank_key_index, Dep> const& ix, std::vector<rank_source> const& src,
                       std::vector<double> const& cum, index_t m, std::mt19937_64& gen) {
    using RSet = detail::dep_t<rank_set, Dep>;
    double const u = unit_interval(gen()) * cum.back();
    auto si = static_cast<std::size_t>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin());
    si = std::min(si, src.size() - 1);
    rank_source const& s = src[si];
    RSet set;
    set.example = s.example;
    std::vector<std::size_t> pick;
    for (std::size_t j = s.count - static_cast<std::size_t>(m); j < s.count; ++j) {
        auto const t = static_cast<std::size_t>(gen() % (j + 1));
        pick.push_back(std::find(pick.begin(), pick.end(), t) == pick.end() ? t : j);
    }
    for (auto p : pick) set.rows.push_back(ix.rows[s.first + p]);
    std::sort(set.rows.begin(), set.rows.end());
    return set;
}

/// Mean and standard error (sd/√n; NaN for n < 2) of values.
template <class = void>  // instantiated on use
std::pair<double, double> mean_se(std::vector<double> const& v) {
    if (v.empty()) return {nan, nan};
    double const n = static_cast<double>(v.size());
    double const mu = std::accumulate(v.begin(), v.end(), 0.0) / n;
    if (v.size() < 2) return {mu, nan};
    double ss = 0;
    for (double x : v) ss += (x - mu) * (x - mu);
    return {mu, std::sqrt(ss / (n - 1) / n)};
}

/// Scores of one set under a bucket model: s = K̃ w, C = K̃ V K̃ᵀ (the keys
/// held as the columns of Kt = K̃ᵀ). False when two keys of the set are
/// identical (their scores always tie).
template <class Reader>
bool set_scores(rank_rows<Reader> const& kr, detail::dep_t<bucket_semantics, Reader> const& bm,
                std::vector<index_t> const& rows,
                detail::dep_t<Eigen::MatrixXd, Reader> const& V, detail::dep_t<Eigen::VectorXd, Reader>& s,
                detail::dep_t<Eigen::MatrixXd, Reader>& C, detail::dep_t<Eigen::MatrixXd, Reader>& Kt,
                detail::dep_t<Eigen::MatrixXd, Reader>& W) {
    auto const m = static_cast<index_t>(rows.size());
    Kt.resize(kr.d, m);
    for (index_t a = 0; a < m; ++a) kr.read(rows[static_cast<std::size_t>(a)], Kt, a);  // the loads overlap
    for (index_t a = 0; a < m; ++a) {
        kr.rotate(Kt, a);
        for (index_t c = 0; c < a; ++c)
            if (Kt.col(a) == Kt.col(c)) return false;
    }
    s.noalias() = Kt.transpose() * bm.mean;
    if (V.size() != 0) W.noalias() = V * Kt;
    else {
        W.resize(kr.d, m);
        for (index_t c = 0; c < m; ++c) W.col(c).array() = Kt.col(c).array() * bm.var.array();  // packets
    }
    C.resize(m, m);
    for (index_t a = 0; a < m; ++a)
        for (index_t c = a; c < m; ++c) C(a, c) = C(c, a) = Kt.col(a).dot(W.col(c));
    return true;
}

/// One query bucket: its sets drawn and evaluated, the profile entry filled.
template <class Reader>
void rank_bucket_eval(rank_rows<Reader> const& ks, detail::dep_t<rank_key_index, Reader> const& ix,
                      detail::dep_t<bucket_semantics, Reader> const& bm,
                      capture_facts const& facts, rank_options const& o, std::uint64_t stream,
                      detail::dep_t<rank_lattice, Reader> const& lat, detail::dep_t<rank_bucket, Reader>& rb,
                      detail::dep_t<rank_result, Reader>& res) {
    using VecX = detail::dep_t<Eigen::VectorXd, Reader>;
    using MatX = detail::dep_t<Eigen::MatrixXd, Reader>;
    using RSStats = detail::dep_t<rank_set_stats, Reader>;
    using OWork = detail::dep_t<orthant_work, Reader>;
    using RSet = detail::dep_t<rank_set, Reader>;
    auto const src = rank_sources(ix, facts, bm.bucket, o);
    if (src.empty()) {
        rb.status = rank_bucket_status::no_key_set;
        return;
    }
    rb.n_sources = static_cast<std::int64_t>(src.size());
    std::vector<double> cum;
    double tot = 0;
    for (auto const& s : src) cum.push_back(tot += static_cast<double>(s.count));
    // two streams per bucket: the sets (independent of the lattice options) and the lattice shifts
    std::uint64_t const bs = hash_step(stream, static_cast<std::uint64_t>(bm.bucket));
    std::mt19937_64 gen(bs), lattice_gen(hash_step(bs, 0x6C617474696365ULL));  // "lattice"
    MatX const V = bm.cov.size() != 0 ? full_bucket_covariance(bm, ks.d) : MatX();
    std::vector<double> flips, kends;
    double int_var = 0;
    VecX s;
    MatX C, K, W;
    OWork w;
    std::vector<double> t(static_cast<std::size_t>(o.keys_per_set));
    for (std::int64_t n = 0; n < o.sets_per_bucket; ++n) {
        if ((n & 1023) == 1023) check_cancelled();  // up to 10^6 sets a bucket
        RSet set = draw_rank_set(ix, src, cum, o.keys_per_set, gen);
        set.q_bucket = bm.bucket;
        if (!set_scores(ks, bm, set.rows, V, s, C, K, W)) {
            ++rb.n_sets_identical;
            continue;
        }
        for (std::size_t a = 0; a < t.size(); ++a) t[a] = static_cast<double>(ks.position[static_cast<std::size_t>(set.rows[a])]);
        RSStats const st = flip_of(top1_probabilities(s, C, lat, lattice_gen, w));
        set.top1_flip = st.top1_flip;
        set.top1_flip_int_se = st.top1_flip_int_se;
        set.kendall = expected_kendall(s, C, t);
        flips.push_back(set.top1_flip);
        kends.push_back(set.kendall);
        int_var += st.top1_flip_int_se * st.top1_flip_int_se;
        if (o.keep_sets) res.sets.push_back(std::move(set));
    }
    rb.n_sets = static_cast<std::int64_t>(flips.size());
    if (rb.n_sets == 0) return;  // every drawn set had identical keys: NaN, counted
    std::tie(rb.top1_flip, rb.top1_flip_se) = mean_se(flips);
    std::tie(rb.kendall, rb.kendall_se) = mean_se(kends);
    rb.top1_flip_int_se = std::sqrt(int_var) / static_cast<double>(rb.n_sets);
}

/// The n_queries-weighted mean (and its standard error) over buckets with a
/// finite value, optionally restricted to one quintile (q ≥ 0).
template <class Member>
std::pair<double, double> rank_weighted(std::vector<rank_bucket> const& prof, Member val, Member se, int q) {
    double w = 0, sum = 0, var = 0;
    for (auto const& rb : prof)
        if (std::isfinite(rb.*val) && (q < 0 || rb.quintile == q)) {
            double const wb = static_cast<double>(rb.n_queries);
            w += wb;
            sum += wb * (rb.*val);
            var += wb * wb * (std::isfinite(rb.*se) ? (rb.*se) * (rb.*se) : 0.0);
        }
    if (!(w > 0)) return {nan, nan};
    return {sum / w, std::sqrt(var) / w};
}

/// The head's means, quintile values and drops from its profile.
template <class = void>  // instantiated on use
void rank_aggregate(rank_result& r) {
    using B = rank_bucket;
    std::tie(r.top1_flip, r.top1_flip_se) = rank_weighted(r.profile, &B::top1_flip, &B::top1_flip_se, -1);
    std::tie(r.kendall, r.kendall_se) = rank_weighted(r.profile, &B::kendall, &B::kendall_se, -1);
    r.top1_flip_first_20pct = rank_weighted(r.profile, &B::top1_flip, &B::top1_flip_se, 0).first;
    r.top1_flip_last_20pct = rank_weighted(r.profile, &B::top1_flip, &B::top1_flip_se, 4).first;
    r.kendall_first_20pct = rank_weighted(r.profile, &B::kendall, &B::kendall_se, 0).first;
    r.kendall_last_20pct = rank_weighted(r.profile, &B::kendall, &B::kendall_se, 4).first;
    r.top1_flip_drop = r.top1_flip_first_20pct - r.top1_flip_last_20pct;
    r.kendall_drop = r.kendall_first_20pct - r.kendall_last_20pct;
}

/// The stream of a head's rank draws: the head's stream (`head_stream_seed`)
/// mixed with "rankstab", so it differs from its pair-sampling stream.
constexpr std::uint64_t rank_stream_seed(std::uint64_t seed, head_id const& id) noexcept {
    return hash_step(head_stream_seed(seed, id), 0x72616E6B73746162ULL);
}

/// `rank_stability` from validated keys (`ks.rows` a MatrixReader of the
/// original rows, `kb`/`ke` their buckets and example ids).
template <class Reader>
rank_result evaluate_ranks(householder_result const& model, rank_rows<Reader> const& ks,
                           std::span<std::int64_t const> kb, std::span<std::int64_t const> ke,
                           capture_facts const& facts, head_id const& id, rank_options const& o) {
    rank_result res;
    res.keys_per_set = o.keys_per_set;
    std::int64_t max_pos = model.max_position;
    for (auto t : ks.position) max_pos = std::max(max_pos, t);
    res.context_length = facts.context_length > 0 ? facts.context_length : max_pos + 1;  // method §9.12
    rank_key_index const ix(kb, ke);
    rank_lattice const lat(o.keys_per_set - 2, o.lattice_points, o.lattice_shifts);
    std::uint64_t const stream = rank_stream_seed(o.seed, id);
    for (auto const& bm : model.buckets) {
        check_cancelled();  // a safe point (core/cancel.hpp)
        rank_bucket rb;
        rb.q_bucket = bm.bucket;
        rb.n_queries = bm.n_queries;
        rb.tau = bm.tau;
        rb.quintile = quantile_of(bm.tau, std::max<std::int64_t>(1, bm.n_queries), res.context_length, 5);
        // no model: < 2 queries (method §9.8), or variances not finite (global_linear, < 2 queries in the head)
        bool const model_ok = bm.used && bm.var.size() == ks.d && bm.var.allFinite() && bm.mean.allFinite() &&
                              (bm.cov.size() == 0 || bm.cov.allFinite());
        if (!model_ok) rb.status = rank_bucket_status::no_model;
        else rank_bucket_eval(ks, ix, bm, facts, o, stream, lat, rb, res);
        res.n_buckets_no_model += rb.status == rank_bucket_status::no_model ? 1 : 0;
        res.n_buckets_no_key_set += rb.status == rank_bucket_status::no_key_set ? 1 : 0;
        res.n_sets += rb.n_sets;
        res.n_sets_identical += rb.n_sets_identical;
        res.profile.push_back(rb);
    }
    rank_aggregate(res);
    return res;
}

/// `rank_stability`; `checked`: the caller (analyze_head) has validated the
/// facts, the row values and the annotations; only shapes are checked again.
template <RowMatrix KM>
rank_result rank_stability_of(householder_result const& model, token_rows<KM> const& keys,
                              capture_facts const& facts, head_id const& id, rank_options const& opt, bool checked) {
    constexpr std::string_view fn = "qkgeom::rank_stability";
    check_rank_options(fn, opt);
    if (!checked) check_facts(fn, facts);
    index_t const d = check_keys_for_model(fn, model, keys, facts, checked);
    auto const kr = as_matrix(keys.vectors);
    if (keys.bucket.size() != kr.rows()) fail_arg(fn, "keys: buckets: length differs from the rows; length", keys.bucket.size());
    if (keys.example_id.size() != kr.rows())
        fail_arg(fn, "keys: example ids: length differs from the rows; length", keys.example_id.size());
    rank_rows<std::remove_cvref_t<decltype(kr)>> const rows{kr, model.H, keys.position.values(), d};
    return evaluate_ranks(model, rows, keys.bucket.values(), keys.example_id.values(), facts, id, opt);
}

}  // namespace detail

/// \brief Top-1 stability and expected Kendall τ_a of a head's key sets
/// under its fitted Gaussian query model (docs/beyond-ranks.md).
///
/// \param[in] model  `householder(...)` of the head's queries (per-bucket w_b, V_b, H)
/// \param[in] keys   the key rows with positions, buckets and example ids
/// \param[in] facts  capture facts (bucket scheme, sliding window, context length)
/// \param[in] id     the head: with `opt.seed` it selects the draws (reproducible)
/// \param[in] opt    m, sets per bucket, lattice size, key policy, seed
/// \returns per query bucket and per head: top-1 flip, Kendall, their
///          standard errors, quintile values and drops; NaN (with a status)
///          for buckets without a model or without an eligible key set
/// \throws std::invalid_argument on bad options (the field named), bad facts,
///         or keys that do not match the model or fail validation
template <RowMatrix KM>
rank_result rank_stability(householder_result const& model, token_rows<KM> const& keys, capture_facts const& facts,
                           head_id const& id, rank_options const& opt = {}) {
    return detail::rank_stability_of(model, keys, facts, id, opt, false);
}

}  // namespace qkgeom
