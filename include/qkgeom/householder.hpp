// qkgeom — the Householder positional–semantic decomposition of the queries
// (SPEC §4; thesis §4.4.2). A closed form over the query moments per bucket;
// only the optional normality diagnostics need rows.
#pragma once

#include <qkgeom/config.hpp>
#include <qkgeom/detail/stats.hpp>
#include <qkgeom/errors.hpp>
#include <qkgeom/moments.hpp>
#include <qkgeom/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace qkgeom {

/// \brief The reflector H = I − γ u uᵀ, γ = 2/‖u‖², kept implicit (SPEC §4):
/// never formed densely in hot paths.
struct householder_reflector {
    Eigen::VectorXd u;   ///< Householder vector (empty when H = I)
    double gamma = 0.0;  ///< 2/‖u‖² (0 when H = I)

    [[nodiscard]] bool is_identity() const noexcept { return gamma == 0.0; }

    /// \brief u = β̂ − e1 with the cancellation-free first entry of SPEC §9.6;
    /// H = I when β = 0 or ‖u‖ < 1e-12.
    static householder_reflector from_direction(Eigen::VectorXd const& beta) {
        householder_reflector h;
        double const nb = beta.norm();
        if (!(nb > 0) || !std::isfinite(nb)) return h;
        Eigen::VectorXd u = beta / nb;
        if (beta(0) > 0) {
            double const tail2 = beta.tail(beta.size() - 1).squaredNorm();
            u(0) = -tail2 / (nb * (nb + beta(0)));
        } else {
            u(0) -= 1.0;
        }
        double const un2 = u.squaredNorm();
        if (!(std::sqrt(un2) >= 1e-12)) return h;
        h.u = std::move(u);
        h.gamma = 2.0 / un2;
        return h;
    }

    /// Hx = x − γ u (u·x), O(d).
    [[nodiscard]] Eigen::VectorXd apply(Eigen::VectorXd const& x) const {
        if (is_identity()) return x;
        return x - (gamma * u.dot(x)) * u;
    }

    /// Apply H to every row of a row-major block in place (rows = tokens).
    template <class Derived>
    void apply_rows(Eigen::MatrixBase<Derived>& rows) const {
        if (is_identity()) return;
        Eigen::VectorXd const s = (rows * u) * gamma;
        rows.noalias() -= s * u.transpose();
    }

    /// H S H for symmetric S without forming H: S − γ(u wᵀ + w uᵀ) + γ²(uᵀw) u uᵀ, w = S u.
    [[nodiscard]] Eigen::MatrixXd apply_sym(Eigen::MatrixXd const& S) const {
        if (is_identity()) return S;
        Eigen::VectorXd const w = S * u;
        Eigen::MatrixXd out = S;
        out.noalias() -= gamma * (u * w.transpose() + w * u.transpose());
        out.noalias() += (gamma * gamma * u.dot(w)) * (u * u.transpose());
        return out;
    }

    /// diag(H S H) in O(d²) (one S·u product).
    [[nodiscard]] Eigen::VectorXd apply_sym_diag(Eigen::MatrixXd const& S) const {
        if (is_identity()) return S.diagonal();
        Eigen::VectorXd const w = S * u;
        double const uw = u.dot(w);
        return S.diagonal().array() - 2.0 * gamma * u.array() * w.array() + gamma * gamma * uw * u.array().square();
    }

    /// The dense matrix (tests and small-d inspection only).
    [[nodiscard]] Eigen::MatrixXd dense(index_t d) const {
        Eigen::MatrixXd H = Eigen::MatrixXd::Identity(d, d);
        if (!is_identity()) H.noalias() -= gamma * u * u.transpose();
        return H;
    }
};

/// \brief Semantic model of coordinates 2..d per query bucket (SPEC §4).
enum class semantic_model {
    diag,           ///< default: per-bucket mean μ_b and per-coordinate variance σ²_b
    full,           ///< per-bucket mean μ_b and full covariance Σ_b
    global_linear,  ///< global line α_rot + β_rot τ_b and global residual variance
};

/// \brief Options of `householder`.
struct householder_options {
    semantic_model model = semantic_model::diag;
};

/// \brief The rotated-basis Gaussian model of one query bucket, the input of
/// the closed form of SPEC §5. Coordinate 0 is the positional coordinate.
struct bucket_semantics {
    std::int64_t bucket = 0;
    std::int64_t n_queries = 0;
    double tau = detail::nan;  ///< τ_b: exact mean query position in the bucket (SPEC §9.2)
    Eigen::VectorXd mean;      ///< (d) [α_pos + β_pos τ_b, μ_b] (global_linear: α_rot + β_rot τ_b)
    Eigen::VectorXd var;       ///< (d) [σ²_pos, σ²_b] (global_linear: global residual variances)
    Eigen::MatrixXd cov;       ///< ((d−1)×(d−1)) Σ_b for `full`, empty otherwise
    bool used = false;         ///< false: < 2 queries under diag/full (SPEC §9.8), NaN var
};

/// \brief Result of the Householder decomposition (SPEC §4); scalar fields are
/// output columns of head_metrics.csv, vectors those of head_component_weights.csv.
struct householder_result {
    Eigen::VectorXd beta;   ///< OLS slopes Cov(Q,t)/Var(t) (original basis)
    Eigen::VectorXd alpha;  ///< intercepts mean(Q) − β mean(t)
    Eigen::VectorXd component_r2;      ///< per-coordinate R² (0 for a constant coordinate)
    Eigen::VectorXd component_weight;  ///< positive-clipped R², normalised to sum 1
    double q_R2_pos = detail::nan;     ///< mean of the per-coordinate R²
    double q_beta_norm = detail::nan;  ///< ‖β‖ (= beta_pos)
    double beta_pos = detail::nan;     ///< ‖β‖ (SPEC §9.7)
    double alpha_pos = detail::nan;    ///< β̂·α
    double sigma2_pos = detail::nan;   ///< residual variance of coordinate 1, n−1 (SPEC §9.1)
    householder_reflector H;           ///< maps β̂ to e1
    Eigen::VectorXd alpha_rot;         ///< Hα
    Eigen::VectorXd beta_rot;          ///< Hβ = ‖β‖ e1
    std::vector<bucket_semantics> buckets;  ///< ascending bucket id
    std::int64_t n_queries = 0;
    std::int64_t n_buckets_skipped = 0;     ///< buckets with < 2 queries under diag/full
    semantic_model model = semantic_model::diag;
    bool degenerate_t = false;  ///< Var(t) = 0: β = 0, H = I, R² NaN (SPEC §9.8)
};

/// \brief Householder positional–semantic decomposition from a head's moments
/// (queries only; SPEC §4).
/// \throws std::invalid_argument when there are no query rows.
inline householder_result householder(bucketed_moments const& queries, householder_options const& opt = {}) {
    constexpr std::string_view fn = "qkgeom::householder";
    if (queries.count() == 0) detail::fail_arg(fn, "no query rows; query rows", 0);
    index_t const d = queries.d;
    moments const q = queries.pooled();
    householder_result r;
    r.model = opt.model;
    r.n_queries = q.n;
    r.degenerate_t = q.n < 2 || !(q.m2_t > 0);

    // OLS of every coordinate on t (SPEC §4).
    r.beta = r.degenerate_t ? Eigen::VectorXd::Zero(d) : Eigen::VectorXd(q.c_xt / q.m2_t);
    r.alpha = q.mean_x - r.beta * q.mean_t;
    r.component_r2.resize(d);
    for (index_t j = 0; j < d; ++j) {
        double const cjj = q.c_xx(j, j);
        if (r.degenerate_t) r.component_r2(j) = detail::nan;
        else if (!(cjj > 0)) r.component_r2(j) = 0.0;  // constant coordinate (SPEC §9.8)
        else r.component_r2(j) = std::min(1.0, q.c_xt(j) * q.c_xt(j) / (cjj * q.m2_t));
    }
    r.q_R2_pos = r.degenerate_t ? detail::nan : r.component_r2.mean();
    // Component weights: positive-clipped R², normalised; uniform when none > 0 (NaN counts as 0).
    Eigen::VectorXd w = r.component_r2.unaryExpr([](double x) { return x > 0 ? x : 0.0; });
    double const ws = w.sum();
    r.component_weight = ws > 0 ? Eigen::VectorXd(w / ws) : Eigen::VectorXd::Constant(d, 1.0 / double(d));

    // Reflector and rotated-basis parameters (SPEC §4, §9.6, §9.7).
    double const bn = r.beta.norm();
    r.beta_pos = r.q_beta_norm = bn;
    r.H = householder_reflector::from_direction(r.beta);
    Eigen::VectorXd beta_hat = Eigen::VectorXd::Unit(d, 0);  // β = 0: coordinate 1 stays e1 (H = I)
    if (bn > 0) beta_hat = r.beta / bn;
    r.alpha_pos = beta_hat.dot(r.alpha);
    r.alpha_rot = r.H.apply(r.alpha);
    r.beta_rot = Eigen::VectorXd::Zero(d);
    r.beta_rot(0) = bn;
    // Residual covariance of Q after the regression on t (n−1).
    Eigen::MatrixXd resid = q.c_xx;
    if (!r.degenerate_t) resid.noalias() -= (q.c_xt * q.c_xt.transpose()) / q.m2_t;
    resid /= q.n >= 2 ? double(q.n - 1) : detail::nan;
    r.sigma2_pos = std::max(0.0, beta_hat.dot(resid * beta_hat));
    if (q.n < 2) r.sigma2_pos = detail::nan;
    Eigen::VectorXd const global_var = r.H.apply_sym_diag(resid);

    for (auto const& [bucket, m] : queries.buckets) {
        bucket_semantics s;
        s.bucket = bucket;
        s.n_queries = m.n;
        s.tau = m.mean_t;
        double const line0 = r.alpha_pos + r.beta_pos * s.tau;
        if (opt.model == semantic_model::global_linear) {
            s.mean = r.alpha_rot + r.beta_rot * s.tau;
            s.mean(0) = line0;
            s.var = global_var;
            s.var(0) = r.sigma2_pos;
            s.used = true;
        } else {
            s.mean = r.H.apply(m.mean_x);
            s.mean(0) = line0;
            if (m.n < 2) {
                s.var = Eigen::VectorXd::Constant(d, detail::nan);
                ++r.n_buckets_skipped;
            } else {
                Eigen::MatrixXd const Sb = m.c_xx / double(m.n - 1);
                if (opt.model == semantic_model::full) {
                    Eigen::MatrixXd const HSH = r.H.apply_sym(Sb);
                    s.var = HSH.diagonal();
                    s.cov = HSH.bottomRightCorner(d - 1, d - 1);
                } else {
                    s.var = r.H.apply_sym_diag(Sb);
                }
                s.var(0) = r.sigma2_pos;
                s.used = true;
            }
        }
        r.buckets.push_back(std::move(s));
    }
    return r;
}

/// \brief Householder decomposition from a head's moments (uses the queries).
inline householder_result householder(head_moments const& hm, householder_options const& opt = {}) {
    return householder(hm.q, opt);
}

/// \brief Householder decomposition from query rows of any adapted tensor type.
template <RowMatrix X, IndexVector P, IndexVector B>
householder_result householder(X const& queries, P const& positions, B const& buckets,
                               householder_options const& opt = {}) {
    bucketed_moments bm(as_matrix(queries).cols());
    bm.add(queries, positions, buckets);
    return householder(bm, opt);
}

}  // namespace qkgeom
