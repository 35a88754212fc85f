// qkgeom — combined Q+K PCA and the head taxonomy (method §2; thesis §4.2).
//
// A closed form over the moments: the pooled covariance Σ_pool (about the
// pooled mean, method §9.3) is eigen-decomposed; each component's position
// correlation per kind is v·C_xt / sqrt(vᵀC_xx v · M2_t) from that kind's
// co-moments. No rows are needed.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/status.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/stats/detail.hpp>
#include <qkgeom/stats/moments.hpp>

#include <Eigen/Core>
#include <Eigen/Eigenvalues>

#include <cmath>
#include <string_view>
#include <vector>

namespace qkgeom {

/// \brief Sign canonicalisation of PCA components (method §2, §9.4).
enum class sign_policy {
    dominant,      ///< default: the larger-|r| of (r_q, r_k) is made positive
    query_anchor,  ///< r_q >= 0, falling back to r_k when |r_q| < 0.05
};

/// \brief Head taxonomy on component 0 (method §2, thesis §4.2.2).
enum class head_class { position_dominated, q_positional, k_positional, content_focused, mixed, undefined };

/// \brief The class name as written in the output columns.
/// \param[in] c the class.
/// \returns a static string: "position_dominated", "q_positional",
///          "k_positional", "content_focused", "mixed" or "undefined" (also
///          for a value outside the enumeration).
constexpr std::string_view to_string(head_class c) noexcept {
    switch (c) {
        case head_class::position_dominated: return "position_dominated";
        case head_class::q_positional: return "q_positional";
        case head_class::k_positional: return "k_positional";
        case head_class::content_focused: return "content_focused";
        case head_class::mixed: return "mixed";
        case head_class::undefined: break;
    }
    return "undefined";
}

/// \brief Taxonomy thresholds; inequalities are strict (method §9.4).
/// Not validated: `low <= high` is expected; NaN thresholds make every
/// comparison false, i.e. `mixed`.
struct taxonomy_thresholds {
    double low = 0.3;   ///< |r| below this is "not positional"
    double high = 0.7;  ///< |r| above this is "positional"
};

/// \brief Classify (r_q, r_k) of component 0: position-dominated (both
/// |r| > high), Q-positional (|r_q| > high, |r_k| < low), K-positional
/// (|r_q| < low, |r_k| > high), content-focused (both < low), mixed otherwise;
/// undefined when either is NaN.
/// \param[in] r_q the query position correlation of component 0.
/// \param[in] r_k the key position correlation of component 0.
/// \param[in] th  the thresholds (strict inequalities; not validated).
/// \returns the class; `head_class::undefined` when r_q or r_k is NaN.
constexpr head_class classify(double r_q, double r_k, taxonomy_thresholds th = {}) noexcept {
    if (std::isnan(r_q) || std::isnan(r_k)) return head_class::undefined;
    double const aq = r_q < 0 ? -r_q : r_q, ak = r_k < 0 ? -r_k : r_k;
    if (aq > th.high && ak > th.high) return head_class::position_dominated;
    if (aq > th.high && ak < th.low) return head_class::q_positional;
    if (aq < th.low && ak > th.high) return head_class::k_positional;
    if (aq < th.low && ak < th.low) return head_class::content_focused;
    return head_class::mixed;
}

/// \brief Options of `pca` (defaults are the thesis').
struct pca_options {
    index_t n_components = 10;  ///< components reported, ≥ 1 (clipped to d)
    sign_policy sign = sign_policy::dominant;  ///< orientation of each component (method §9.4)
    taxonomy_thresholds thresholds{};          ///< thresholds of `classify` on component 0
};

/// \brief One principal component (row of `qk_pca.csv`).
struct pca_component {
    index_t component = 0;                 ///< 0-based, descending eigenvalue
    double eigenvalue = detail::nan;       ///< λ_j of Σ_pool (n−1 normalisation); NaN when `status` is not success
    double explained_variance_ratio = detail::nan;  ///< λ_j / trace Σ_pool; NaN when `degenerate`
    double r_q = detail::nan;              ///< corr(Q v_j, t_q); NaN when the query positions or Q v_j are
                                           ///< numerically constant (method §9.17), < 2 query rows, or `degenerate`
    double r_k = detail::nan;              ///< corr(K v_j, t_k); NaN likewise for keys
    Eigen::VectorXd loading;               ///< v_j (unit, sign-canonicalised); all NaN when `status` is not success
};

/// \brief Result of the combined Q+K PCA (method §2).
struct pca_result {
    std::vector<pca_component> components;  ///< the first n_components
    Eigen::MatrixXd basis;          ///< all d eigenvectors as columns (orthogonal), same order and signs
    Eigen::VectorXd eigenvalues;    ///< all d eigenvalues, descending
    double pc0_r_q = detail::nan;   ///< r_q of component 0 (head_metrics.csv); NaN as pca_component::r_q
    double pc0_r_k = detail::nan;   ///< r_k of component 0; NaN as pca_component::r_k
    head_class taxonomy = head_class::undefined;  ///< class of component 0; `undefined` when pc0_r_q or pc0_r_k is NaN
    double q_pos_var_frac = detail::nan;  ///< ‖Cov(Q,t)‖² / (Var t_q · trace Σ_Q); NaN when < 2 query rows, or the
                                          ///< query rows or positions are numerically constant (method §9.17)
    double k_pos_var_frac = detail::nan;  ///< same for keys
    bool degenerate = false;        ///< pooled variance numerically zero (method §9.17) or fewer than 2 rows: NaN
                                    ///< explained-variance ratios and correlations, taxonomy `undefined`; also set
                                    ///< when `status` is not success
    /// The eigendecomposition of Σ_pool: `success`, or `no_convergence` /
    /// `invalid_input`, in which case `basis`, `eigenvalues` and every
    /// component field are NaN, `taxonomy` is `undefined` and `degenerate`
    /// is set (the positional variance fractions are still computed).
    decomposition_status status = decomposition_status::success;
};

namespace detail {

/// Orient v per method §2/§9.4 given its correlations; flips r_q, r_k with it.
template <class Dep = void>
void canonicalise_sign(detail::dep_t<Eigen::VectorXd, Dep>& v, double& r_q, double& r_k, sign_policy policy) {
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    double decide = nan;
    if (policy == sign_policy::dominant) {
        bool const fq = std::isfinite(r_q), fk = std::isfinite(r_k);
        if (fq && fk) decide = std::abs(r_q) >= std::abs(r_k) ? r_q : r_k;
        else if (fq) decide = r_q;
        else if (fk) decide = r_k;
    } else {
        decide = (std::isfinite(r_q) && std::abs(r_q) >= 0.05) ? r_q : r_k;
    }
    bool flip = false;
    if (std::isfinite(decide) && decide != 0.0) {
        flip = decide < 0;
    } else {  // method §9.4 fallback
        VecX w = v;
        flip = orient_by_largest_entry(w);
    }
    if (flip) {
        v = -v;
        r_q = -r_q;
        r_k = -r_k;
    }
}

/// ‖C_xt‖² / (M2_t · trace C_xx): share of the variance linear in position;
/// NaN when the rows or the positions are numerically constant (method §9.17).
template <class Dep = void>
double positional_variance_fraction(detail::dep_t<moments, Dep> const& m) {
    if (rows_constant(m) || positions_constant(m)) return nan;
    return m.c_xt.squaredNorm() / (m.m2_t * m.c_xx.trace());
}

}  // namespace detail

/// \brief Combined Q+K PCA from a head's moments (method §2).
/// \param[in] hm   the head's moments (queries and keys)
/// \param[in] opt  number of components, sign policy, taxonomy thresholds
/// \returns the components (descending eigenvalue), their r_q/r_k, the full
///          basis, the taxonomy of component 0 and the positional variance
///          fractions; `degenerate` when the pooled variance is zero,
///          `status` when the eigensolver failed (then NaN)
/// \pre hm.d ≥ 1, both kinds have rows, opt.n_components ≥ 1.
/// \throws std::invalid_argument when hm.d < 1, a kind has no rows or
///         n_components < 1.
/// \throws std::bad_alloc if the d × d work matrices cannot be allocated.
/// \sa classify, planar_rotation
template <class Dep = void>
pca_result pca(detail::dep_t<head_moments, Dep> const& hm, pca_options const& opt = {}) {
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    using MatX = detail::dep_t<Eigen::MatrixXd, Dep>;
    using PcaRes = detail::dep_t<pca_result, Dep>;
    using Mom = detail::dep_t<moments, Dep>;
    detail::check_head("qkgeom::pca", hm);
    if (opt.n_components < 1) detail::fail_arg("qkgeom::pca", "n_components must be >= 1", opt.n_components);
    Mom const mq = hm.q.pooled(), mk = hm.k.pooled();
    Mom pool = mq;
    pool += mk;
    index_t const d = hm.d;

    PcaRes r;
    r.q_pos_var_frac = detail::positional_variance_fraction(mq);
    r.k_pos_var_frac = detail::positional_variance_fraction(mk);

    // Eigen-decomposition of the pooled co-moment (scaled by 1/(n−1) for λ).
    Eigen::SelfAdjointEigenSolver<MatX> es(pool.c_xx);
    r.status = detail::status_of(es.info());
    if (r.status != decomposition_status::success) {
        r.basis = MatX::Constant(d, d, detail::nan);
        r.eigenvalues = VecX::Constant(d, detail::nan);
        r.degenerate = true;
        for (index_t j = 0; j < std::min(opt.n_components, d); ++j) {
            pca_component c;
            c.component = j;
            c.loading = VecX::Constant(d, detail::nan);
            r.components.push_back(std::move(c));
        }
        r.taxonomy = head_class::undefined;
        return r;
    }
    double const scale = pool.n >= 2 ? 1.0 / static_cast<double>(pool.n - 1) : detail::nan;
    // Eigen's eigenvalues are ascending: reverse for method §2's descending order.
    r.basis = es.eigenvectors().rowwise().reverse();
    r.eigenvalues = es.eigenvalues().reverse() * scale;
    double const trace = pool.c_xx.trace() * scale;
    r.degenerate = detail::rows_constant(pool);  // method §9.17: pooled variance numerically zero

    index_t const k = std::min(opt.n_components, d);
    for (index_t j = 0; j < d; ++j) {
        VecX v = r.basis.col(j);
        // A numerically zero pooled covariance has arbitrary eigenvectors: no correlation.
        double rq = r.degenerate ? detail::nan : detail::projection_corr(mq, v);
        double rk = r.degenerate ? detail::nan : detail::projection_corr(mk, v);
        detail::canonicalise_sign(v, rq, rk, opt.sign);
        r.basis.col(j) = v;
        if (j < k) {
            pca_component c;
            c.component = j;
            c.eigenvalue = r.eigenvalues(j);
            c.explained_variance_ratio = r.degenerate ? detail::nan : r.eigenvalues(j) / trace;
            c.r_q = rq;
            c.r_k = rk;
            c.loading = v;
            r.components.push_back(std::move(c));
        }
    }
    r.pc0_r_q = r.components.front().r_q;
    r.pc0_r_k = r.components.front().r_k;
    r.taxonomy = classify(r.pc0_r_q, r.pc0_r_k, opt.thresholds);
    return r;
}

/// \brief Combined Q+K PCA from rows of any adapted tensor type (method §2).
///
/// Accumulates the rows into a `head_moments` (one bucket) and calls
/// `pca(head_moments const&, pca_options const&)`.
/// \tparam XQ any RowMatrix (queries).
/// \tparam PQ any IndexVector.
/// \tparam XK any RowMatrix (keys).
/// \tparam PK any IndexVector.
/// \param[in] queries     n_q × d query rows, n_q ≥ 1, all finite.
/// \param[in] q_positions n_q non-negative query positions.
/// \param[in] keys        n_k × d key rows (same d), n_k ≥ 1, all finite.
/// \param[in] k_positions n_k non-negative key positions.
/// \param[in] opt         number of components, sign policy, taxonomy thresholds.
/// \returns as the `head_moments` overload.
/// \throws std::invalid_argument when queries and keys have different column
///         counts, d = 0, a kind has no rows, a positions length differs from
///         its rows, a position is negative, a value is NaN/Inf, or
///         n_components < 1.
/// \throws std::bad_alloc if the moments or work matrices cannot be allocated.
template <RowMatrix XQ, IndexVector PQ, RowMatrix XK, IndexVector PK>
pca_result pca(XQ const& queries, PQ const& q_positions, XK const& keys, PK const& k_positions,
               pca_options const& opt = {}) {
    return pca(detail::moments_of_rows(queries, q_positions, keys, k_positions), opt);
}

}  // namespace qkgeom
