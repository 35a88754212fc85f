// qkgeom — small shared statistics helpers for the closed forms (internal).
// IWYU pragma: private, include <qkgeom/plasticity.hpp>
#pragma once

#include <qkgeom/config.hpp>
#include <qkgeom/errors.hpp>
#include <qkgeom/moments.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

namespace qkgeom::detail {


/// Pearson correlation from co-moments (ddof-free, method §9.1): cxy / sqrt(cxx·cyy),
/// clamped to [-1, 1]; NaN when either variance is zero or not finite.
inline double corr_from_comoments(double cxy, double cxx, double cyy) noexcept {
    double const den = std::sqrt(cxx) * std::sqrt(cyy);
    if (!(den > 0) || !std::isfinite(den)) return nan;
    return std::clamp(cxy / den, -1.0, 1.0);
}

/// corr(v·x, t) for one group of rows: v·C_xt / sqrt(vᵀ C_xx v · M2_t).
template <class = void>
double projection_corr(moments const& m, Eigen::VectorXd const& v) {
    if (m.n < 2) return nan;
    return corr_from_comoments(v.dot(m.c_xt), v.dot(m.c_xx * v), m.m2_t);
}

/// OLS slope of v·x on t for one group: v·C_xt / M2_t (NaN when Var t = 0).
template <class = void>
double projection_slope(moments const& m, Eigen::VectorXd const& v) {
    if (m.n < 2 || !(m.m2_t > 0)) return nan;
    return v.dot(m.c_xt) / m.m2_t;
}

/// method §9.4 sign fallback: flip v so that its largest-magnitude entry is
/// positive (first index on ties). Returns true when v was flipped.
template <class = void>
bool orient_by_largest_entry(Eigen::VectorXd& v) {
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
template <class = void>
void check_head(std::string_view where, head_moments const& hm) {
    if (hm.d <= 0) fail_arg(where, "head_moments has no dimension (d)", hm.d);
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
inline double median(std::vector<double> v) {
    if (v.empty()) return nan;
    auto const mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    double const hi = *mid;
    if (v.size() % 2 == 1) return hi;
    double const lo = *std::max_element(v.begin(), mid);
    return 0.5 * (lo + hi);
}

}  // namespace qkgeom::detail
