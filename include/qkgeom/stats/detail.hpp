// qkgeom — small shared statistics helpers for the closed forms (internal).
// IWYU pragma: private, include <qkgeom/plasticity.hpp>
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/stats/moments.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom::detail {

/// Relative tolerance of "numerically zero" (method §9.17): a variance,
/// co-moment or squared norm is zero when it is at most 16 ε times the
/// data's scale (its sum of squares, in the same units). 16 ε ≈ 3.6e-15 is
/// about the squared relative resolution of float32 (2⁻²⁴)², so every
/// spread a float32/bf16/f16 capture can hold stays above it, and the
/// rounding noise of the centred moments of identical rows (≈ ε² of the
/// scale) stays far below it.
inline constexpr double zero_tolerance = 16 * std::numeric_limits<double>::epsilon();

/// The one test of method §9.17: is `value` numerically zero relative to
/// `scale` (same units, e.g. a co-moment against a sum of squares)? True
/// for |value| ≤ zero_tolerance · scale, and for NaN.
template <class = void>  // instantiated on use
bool numerically_zero(double value, double scale) noexcept {
    return !(std::abs(value) > zero_tolerance * scale);
}

/// `value` when it is not numerically zero relative to `scale`, else exactly 0
/// (a variance below the rounding floor of its data, method §9.17).
template <class = void>  // instantiated on use
double snap_zero(double value, double scale) noexcept {
    return numerically_zero(value, scale) && !std::isnan(value) ? 0.0 : value;
}

/// Element-wise `snap_zero` of a vector of variances.
template <class Dep = void>
Eigen::VectorXd snap_zero(detail::dep_t<Eigen::VectorXd, Dep> v, double scale) {
    for (index_t i = 0; i < v.size(); ++i) v(i) = snap_zero(v(i), scale);
    return v;
}

/// Σ‖x‖² of a group of rows, trace C_xx + n‖x̄‖²: the scale of its co-moments.
template <class Dep = void>
double sum_squares_x(detail::dep_t<moments, Dep> const& m) {
    return m.c_xx.trace() + static_cast<double>(m.n) * m.mean_x.squaredNorm();
}

/// Σt² of a group, M2_t + n t̄²: the scale of M2_t.
template <class = void>  // instantiated on use
double sum_squares_t(moments const& m) noexcept {
    return m.m2_t + static_cast<double>(m.n) * m.mean_t * m.mean_t;
}

/// Fewer than 2 rows, or every row numerically the same vector: trace C_xx
/// numerically zero relative to Σ‖x‖² (method §9.17).
template <class Dep = void>
bool rows_constant(detail::dep_t<moments, Dep> const& m) {
    return m.n < 2 || numerically_zero(m.c_xx.trace(), sum_squares_x(m));
}

/// Fewer than 2 rows or every position the same (positions are exact
/// integers, so M2_t is exactly 0 then; the scale test is the same rule).
template <class = void>  // instantiated on use
bool positions_constant(moments const& m) noexcept {
    return m.n < 2 || numerically_zero(m.m2_t, sum_squares_t(m));
}

/// Pearson correlation from co-moments (ddof-free, method §9.1): cxy / sqrt(cxx·cyy),
/// clamped to [-1, 1]; NaN when either variance is zero or not finite.
template <class = void>  // instantiated on use
double corr_from_comoments(double cxy, double cxx, double cyy) noexcept {
    double const den = std::sqrt(cxx) * std::sqrt(cyy);
    if (!(den > 0) || !std::isfinite(den)) return nan;
    return std::clamp(cxy / den, -1.0, 1.0);
}

/// Is the projection v·x of a group numerically constant: vᵀ C_xx v
/// numerically zero relative to ‖v‖² Σ‖x‖² (method §9.17)?
template <class Dep = void>
bool projection_constant(detail::dep_t<moments, Dep> const& m, detail::dep_t<Eigen::VectorXd, Dep> const& v) {
    return m.n < 2 || numerically_zero(v.dot(m.c_xx * v), v.squaredNorm() * sum_squares_x(m));
}

/// corr(v·x, t) for one group of rows: v·C_xt / sqrt(vᵀ C_xx v · M2_t);
/// NaN when v·x or t is numerically constant (method §9.17).
template <class Dep = void>
double projection_corr(detail::dep_t<moments, Dep> const& m, detail::dep_t<Eigen::VectorXd, Dep> const& v) {
    if (positions_constant(m) || projection_constant(m, v)) return nan;
    return corr_from_comoments(v.dot(m.c_xt), v.dot(m.c_xx * v), m.m2_t);
}

/// OLS slope of v·x on t for one group: v·C_xt / M2_t (NaN when Var t = 0);
/// exactly 0 when v·x is numerically constant (method §9.17).
template <class Dep = void>
double projection_slope(detail::dep_t<moments, Dep> const& m, detail::dep_t<Eigen::VectorXd, Dep> const& v) {
    if (positions_constant(m)) return nan;
    if (projection_constant(m, v)) return 0.0;
    return v.dot(m.c_xt) / m.m2_t;
}

/// method §9.4 sign fallback: flip v so that its largest-magnitude entry is
/// positive (first index on ties). Returns true when v was flipped.
template <class Dep = void>
bool orient_by_largest_entry(detail::dep_t<Eigen::VectorXd, Dep>& v) {
    if (v.size() == 0) return false;
    index_t best = 0;
    for (index_t i = 1; i < v.size(); ++i)
        if (std::abs(v(i)) > std::abs(v(best))) best = i;
    if (v(best) < 0) {
        v = -v;
        return true;
    }
    return false;
}

/// The two kinds of a head, with at least one row each.
template <class Dep = void>
void check_head(std::string_view where, detail::dep_t<head_moments, Dep> const& hm) {
    if (hm.d <= 0) fail_arg(where, "head_moments has no dimension (d)", hm.d);
    std::string const of_d = " moments: head dimension differs from the head's d = " + std::to_string(hm.d);
    if (hm.q.d != hm.d) fail_arg(where, "query" + of_d + "; q.d", hm.q.d);
    if (hm.k.d != hm.d) fail_arg(where, "key" + of_d + "; k.d", hm.k.d);
    if (hm.q.count() == 0) fail_arg(where, "no query rows in the head's moments; query rows", 0);
    if (hm.k.count() == 0) fail_arg(where, "no key rows in the head's moments; key rows", 0);
}

/// Sum of the rows' moments per kind into one head, every row in bucket 0
/// (the analyses that do not use buckets).
template <RowMatrix XQ, IndexVector PQ, RowMatrix XK, IndexVector PK>
head_moments moments_of_rows(XQ const& q, PQ const& tq, XK const& k, PK const& tk) {
    auto const rq = as_matrix(q);
    auto const rk = as_matrix(k);
    if (rq.cols() != rk.cols())
        fail_arg("qkgeom: queries and keys", "head dimensions differ: queries have " + std::to_string(rq.cols()) +
                                                 " columns, keys have",
                 rk.cols());
    head_moments hm(rq.cols());
    hm.add(kind::query, q, tq, std::vector<std::int64_t>(static_cast<std::size_t>(rq.rows()), 0));
    hm.add(kind::key, k, tk, std::vector<std::int64_t>(static_cast<std::size_t>(rk.rows()), 0));
    return hm;
}

/// Median of a copy (NaN for an empty input).
template <class = void>  // instantiated on use
double median(std::vector<double> v) {
    if (v.empty()) return nan;
    auto const mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    double const hi = *mid;
    if (v.size() % 2 == 1) return hi;
    double const lo = *std::max_element(v.begin(), mid);
    return 0.5 * (lo + hi);
}

}  // namespace qkgeom::detail
