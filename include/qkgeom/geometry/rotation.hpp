// qkgeom — the planar rotation model: drift axis a, separation axis b and
// bias_strength (method §3; thesis §4.3). A closed form over the moments.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/status.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/stats/detail.hpp>
#include <qkgeom/stats/moments.hpp>

#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <Eigen/QR>

#include <cmath>

namespace qkgeom {

/// \brief How the separation axis b is chosen (method §3).
enum class separation_policy {
    centroid,        ///< default: b ∝ (I − aaᵀ)(μ_Q − μ_K)
    max_separation,  ///< top eigenvector of P M P, M = Σ_Q + Σ_K + ΔΔᵀ
};

/// \brief Options of `planar_rotation`.
struct rotation_options {
    separation_policy separation = separation_policy::centroid;  ///< how b is chosen
};

/// \brief Result of the planar rotation model; field names are the output
/// columns (method §3, §7). a-metrics are NaN when `degenerate_a`; b-metrics are
/// NaN when `degenerate_b` (method §9.5).
struct rotation_result {
    Eigen::VectorXd a;  ///< drift axis, Cov(X_pool, t)/‖·‖ (NaN when degenerate_a)
    Eigen::VectorXd b;  ///< separation axis ⟂ a, (μ_Q − μ_K)·b ≥ 0 (NaN when degenerate_b)
    double residual_pos_cov = detail::nan;  ///< ‖(I − aaᵀ)c‖ / ‖c‖ (self-check, ≈ 1e-16); NaN when degenerate_a
    double mu_q_a = detail::nan, mu_k_a = detail::nan;  ///< mean projections on a; NaN when degenerate_a
    double mu_q_b = detail::nan, mu_k_b = detail::nan;  ///< mean projections on b; NaN when degenerate_b
    double alpha_q = detail::nan, alpha_k = detail::nan;  ///< OLS slope of the a-projection on t; NaN when
                                                          ///< degenerate_a, or for a kind with < 2 rows or constant
                                                          ///< positions
    double r_q_a = detail::nan, r_k_a = detail::nan;      ///< corr(a·x, t) per kind; NaN when degenerate_a, or for a
                                                          ///< kind with < 2 rows or zero variance of t or a·x
    double position_r = detail::nan;           ///< |corr(a·x, t)| over the pool; NaN when degenerate_a
    double bias_strength = detail::nan;        ///< mu_q_a · alpha_k (thesis eq. 4.6); NaN when alpha_k is
    double separation_strength = detail::nan;  ///< bᵀMb / trace M; NaN when degenerate_b or a kind has < 2 rows (M
                                               ///< undefined)
    double var_frac_a = detail::nan, var_frac_b = detail::nan;  ///< aᵀΣ_pool a / trace Σ_pool, …; NaN when the axis
                                                                ///< is degenerate
    double plane_var_fraction = detail::nan;   ///< var_frac_a + var_frac_b; NaN when degenerate_b
    double content_var_b = detail::nan;        ///< (Var(b·q) + Var(b·k)) / 2; NaN when degenerate_b or a kind has < 2
                                               ///< rows
    bool degenerate_a = false;  ///< ‖c‖ ≤ 1e-12·sqrt(Var t · trace Σ_pool), or the pooled rows or positions
                                ///< numerically constant (method §9.17)
    bool degenerate_b = false;  ///< b undefined (Δ ∥ a, Δ numerically zero (method §9.17), d = 1, a degenerate;
                                ///< max_separation: a kind with < 2 rows, M numerically zero, or top eigenvalue of
                                ///< PMP ≤ 1e-12·trace M)
    /// max_separation: the eigendecomposition of PMP: `success` (always so
    /// with `centroid`, or when it was not attempted), or `no_convergence` /
    /// `invalid_input`, in which case `degenerate_b` is set and b and the
    /// b-metrics are NaN (the a-metrics stay valid).
    decomposition_status status = decomposition_status::success;

    /// \brief An orthonormal basis [a, b, complement] as columns (requires both axes):
    /// the rotation that preserves q·k (thesis §4.3). Built with a Householder
    /// QR of [a b], so it is orthogonal to rounding.
    /// \returns the d × d orthogonal basis; columns 0 and 1 are exactly a and b
    /// \pre `*this` comes from `planar_rotation` (a and b have size d ≥ 2).
    /// \throws std::invalid_argument when a or b is degenerate
    /// \throws std::bad_alloc if the d × d result cannot be allocated
    template <class Dep = void>
    [[nodiscard]] Eigen::MatrixXd basis() const {
        using MatX = detail::dep_t<Eigen::MatrixXd, Dep>;
        index_t const d = a.size();
        if (degenerate_a || degenerate_b)
            detail::fail_arg("qkgeom::rotation_result::basis", "axes a and b must both be defined; degenerate_a",
                             degenerate_a);
        MatX ab(d, 2);
        ab << a, b;
        Eigen::HouseholderQR<MatX> qr(ab);
        MatX q = qr.householderQ();
        q.col(0) = a;  // exact a and b; the complement comes from the QR
        q.col(1) = b;
        return q;
    }
};

/// \brief The planar rotation model from a head's moments (method §3).
/// \param[in] hm   the head's moments (queries and keys)
/// \param[in] opt  the separation policy of axis b
/// \returns the axes a and b and every rotation metric; `degenerate_a` /
///          `degenerate_b` flag undefined axes (their metrics NaN), `status`
///          a failed eigendecomposition (max_separation)
/// \pre hm.d ≥ 1 and both kinds have rows.
/// \throws std::invalid_argument when hm.d < 1 or a kind has no rows.
/// \throws std::bad_alloc if the d × d work matrices cannot be allocated.
/// \sa rotation_result::basis, pca
template <class Dep = void>
rotation_result planar_rotation(detail::dep_t<head_moments, Dep> const& hm, rotation_options const& opt = {}) {
    using VecX = detail::dep_t<Eigen::VectorXd, Dep>;
    using MatX = detail::dep_t<Eigen::MatrixXd, Dep>;
    using RotRes = detail::dep_t<rotation_result, Dep>;
    using Mom = detail::dep_t<moments, Dep>;
    detail::check_head("qkgeom::planar_rotation", hm);
    index_t const d = hm.d;
    Mom const mq = hm.q.pooled(), mk = hm.k.pooled();
    Mom pool = mq;
    pool += mk;
    RotRes r;
    r.a = VecX::Constant(d, detail::nan);
    r.b = VecX::Constant(d, detail::nan);

    // --- axis a (method §3; degeneracy method §9.5, in co-moment units: both sides scale by n−1)
    VecX const& c = pool.c_xt;
    double const cn = c.norm();
    double const tr_pool = pool.c_xx.trace();
    // … and, before it, the rows or positions of the pool numerically constant (method §9.17).
    r.degenerate_a = detail::rows_constant(pool) || detail::positions_constant(pool) ||
                     !(cn > 1e-12 * std::sqrt(pool.m2_t * tr_pool));
    // --- b needs Δ = μ_Q − μ_K and M (second moment of q − k), sample-normalised
    VecX const delta = mq.mean_x - mk.mean_x;
    // Σ_Q, Σ_K (n−1); undefined (NaN) for a kind with a single row, and so is M.
    bool const have_m = mq.n >= 2 && mk.n >= 2;
    MatX const Sq = mq.n >= 2 ? MatX(mq.c_xx / double(mq.n - 1))
                                         : MatX::Constant(d, d, detail::nan);
    MatX const Sk = mk.n >= 2 ? MatX(mk.c_xx / double(mk.n - 1))
                                         : MatX::Constant(d, d, detail::nan);
    if (r.degenerate_a) {
        r.degenerate_b = true;
        return r;
    }
    r.a = c / cn;
    VecX const& a = r.a;
    r.residual_pos_cov = (c - a * a.dot(c)).norm() / cn;
    r.mu_q_a = a.dot(mq.mean_x);
    r.mu_k_a = a.dot(mk.mean_x);
    r.alpha_q = detail::projection_slope(mq, a);
    r.alpha_k = detail::projection_slope(mk, a);
    r.r_q_a = detail::projection_corr(mq, a);
    r.r_k_a = detail::projection_corr(mk, a);
    r.position_r = std::abs(detail::projection_corr(pool, a));
    r.bias_strength = r.mu_q_a * r.alpha_k;
    r.var_frac_a = detail::projection_constant(pool, a) ? 0.0 : a.dot(pool.c_xx * a) / tr_pool;

    // --- axis b
    VecX const pdelta = delta - a * a.dot(delta);
    MatX const M = Sq + Sk + delta * delta.transpose();
    VecX b;
    // Δ numerically zero against the centroids (method §9.17): Q and K share their mean.
    bool const delta_zero = detail::numerically_zero(delta.squaredNorm(),
                                                     mq.mean_x.squaredNorm() + mk.mean_x.squaredNorm());
    if (opt.separation == separation_policy::centroid) {
        double const pn = pdelta.norm();
        r.degenerate_b = d < 2 || delta_zero || !(pn > 1e-12 * delta.norm());
        if (!r.degenerate_b) b = pdelta / pn;
    } else if (!have_m || (delta_zero && detail::rows_constant(mq) && detail::rows_constant(mk))) {
        r.degenerate_b = true;  // M needs Σ_Q and Σ_K; M numerically zero (method §9.17)
    } else {
        // P M P with P = I − aaᵀ, applied implicitly; its top eigenvector is ⟂ a.
        MatX PM = M - a * (a.transpose() * M);
        MatX PMP = PM - (PM * a) * a.transpose();
        PMP = 0.5 * (PMP + PMP.transpose()).eval();
        Eigen::SelfAdjointEigenSolver<MatX> es(PMP);
        r.status = detail::status_of(es.info());
        double const top = d >= 2 && r.status == decomposition_status::success ? es.eigenvalues()(d - 1) : 0.0;
        r.degenerate_b = d < 2 || !(top > 1e-12 * M.trace());
        if (!r.degenerate_b) {
            b = es.eigenvectors().col(d - 1);
            b -= a * a.dot(b);  // remove rounding along a
            b.normalize();
        }
    }
    if (r.degenerate_b) return r;
    double const sep = delta.dot(b);
    if (sep < 0) b = -b;
    else if (sep == 0) detail::orient_by_largest_entry(b);  // method §9.4 fallback
    r.b = b;
    r.mu_q_b = b.dot(mq.mean_x);
    r.mu_k_b = b.dot(mk.mean_x);
    double const trM = M.trace();
    r.separation_strength = have_m && trM > 0 ? b.dot(M * b) / trM : detail::nan;
    r.var_frac_b = detail::projection_constant(pool, b) ? 0.0 : b.dot(pool.c_xx * b) / tr_pool;
    r.plane_var_fraction = r.var_frac_a + r.var_frac_b;
    // A numerically constant projection has variance exactly 0 (method §9.17).
    double const vq = mq.n < 2 ? detail::nan : detail::projection_constant(mq, b) ? 0.0 : b.dot(Sq * b);
    double const vk = mk.n < 2 ? detail::nan : detail::projection_constant(mk, b) ? 0.0 : b.dot(Sk * b);
    r.content_var_b = 0.5 * (vq + vk);
    return r;
}

/// \brief The planar rotation model from rows of any adapted tensor type.
///
/// Accumulates the rows into a `head_moments` (one bucket) and calls
/// `planar_rotation(head_moments const&, rotation_options const&)`.
/// \tparam XQ any RowMatrix (queries).
/// \tparam PQ any IndexVector.
/// \tparam XK any RowMatrix (keys).
/// \tparam PK any IndexVector.
/// \param[in] queries     n_q × d query rows, n_q ≥ 1, all finite.
/// \param[in] q_positions n_q non-negative query positions.
/// \param[in] keys        n_k × d key rows (same d), n_k ≥ 1, all finite.
/// \param[in] k_positions n_k non-negative key positions.
/// \param[in] opt         the separation policy of axis b.
/// \returns as the `head_moments` overload.
/// \throws std::invalid_argument when queries and keys have different column
///         counts, d = 0, a kind has no rows, a positions length differs from
///         its rows, a position is negative or a value is NaN/Inf.
/// \throws std::bad_alloc if the moments or work matrices cannot be allocated.
template <RowMatrix XQ, IndexVector PQ, RowMatrix XK, IndexVector PK>
rotation_result planar_rotation(XQ const& queries, PQ const& q_positions, XK const& keys, PK const& k_positions,
                                rotation_options const& opt = {}) {
    return planar_rotation(detail::moments_of_rows(queries, q_positions, keys, k_positions), opt);
}

}  // namespace qkgeom
