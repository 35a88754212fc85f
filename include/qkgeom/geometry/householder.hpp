// qkgeom — the Householder positional–semantic decomposition of the queries
// (method §4; thesis §4.4.2). A closed form over the query moments per bucket;
// only the optional normality diagnostics need rows.
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/stats/detail.hpp>
#include <qkgeom/stats/kolmogorov.hpp>
#include <qkgeom/stats/moments.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace qkgeom {

/// \brief The reflector H = I − γ u uᵀ, γ = 2/‖u‖², kept implicit (method §4):
/// never formed densely in hot paths.
struct householder_reflector {
    Eigen::VectorXd u;   ///< Householder vector (empty when H = I)
    double gamma = 0.0;  ///< 2/‖u‖² (0 when H = I)

    /// \brief Whether H = I (no reflection stored).
    /// \returns `gamma == 0`.
    [[nodiscard]] bool is_identity() const noexcept { return gamma == 0.0; }

    /// \brief u = β̂ − e1 with the cancellation-free first entry of method §9.6;
    /// H = I when β = 0 or ‖u‖ < 1e-12.
    /// \param[in] beta the direction to map onto e1 (any size d ≥ 0).
    /// \returns the reflector with H β̂ = e1; the identity when β is empty,
    ///          zero or has a non-finite norm, or when β̂ is already e1 to
    ///          within 1e-12.
    /// \throws std::bad_alloc if u cannot be allocated.
    template <class V = void>
    static householder_reflector from_direction(detail::dep_t<Eigen::VectorXd, V> const& beta) {
        using VecX = detail::dep_t<Eigen::VectorXd, V>;
        householder_reflector h;
        double const nb = beta.norm();
        if (!(nb > 0) || !std::isfinite(nb)) return h;
        VecX u = beta / nb;
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

    /// \brief Hx = x − γ u (u·x), O(d).
    /// \param[in] x a vector of the reflector's dimension.
    /// \pre x.size() == u.size() unless `is_identity()` (not checked).
    /// \returns Hx (a copy of x when H = I).
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>
    [[nodiscard]] Eigen::VectorXd apply(detail::dep_t<Eigen::VectorXd, V> const& x) const {
        auto& u = detail::dep_ref<V>(this->u);
        if (is_identity()) return x;
        return x - (gamma * u.dot(x)) * u;
    }

    /// \brief Apply H to every row of a row-major block in place (rows = tokens).
    /// \tparam Derived any Eigen dense matrix expression that can be assigned to.
    /// \param[in,out] rows n × d rows, replaced by their reflections (unchanged when H = I).
    /// \pre rows.cols() == u.size() unless `is_identity()` (not checked).
    /// \throws std::bad_alloc if the n-vector of projections cannot be allocated.
    template <class Derived>
    void apply_rows(Eigen::MatrixBase<Derived>& rows) const {
        using VecX = detail::dep_t<Eigen::VectorXd, Derived>;
        auto& u = detail::dep_ref<Derived>(this->u);
        if (is_identity()) return;
        VecX const s = (rows * u) * gamma;
        rows.noalias() -= s * u.transpose();
    }

    /// \brief H S H for symmetric S without forming H: S − γ(u wᵀ + w uᵀ) + γ²(uᵀw) u uᵀ, w = S u.
    /// \param[in] S a symmetric d × d matrix.
    /// \pre S is d × d with d == u.size() unless `is_identity()` (not checked).
    /// \returns H S H (d × d, symmetric to rounding; a copy of S when H = I).
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>
    [[nodiscard]] Eigen::MatrixXd apply_sym(detail::dep_t<Eigen::MatrixXd, V> const& S) const {
        using VecX = detail::dep_t<Eigen::VectorXd, V>;
        using MatX = detail::dep_t<Eigen::MatrixXd, V>;
        auto& u = detail::dep_ref<V>(this->u);
        if (is_identity()) return S;
        VecX const w = S * u;
        MatX out = S;
        out.noalias() -= gamma * (u * w.transpose() + w * u.transpose());
        out.noalias() += (gamma * gamma * u.dot(w)) * (u * u.transpose());
        return out;
    }

    /// \brief diag(H S H) in O(d²) (one S·u product).
    /// \param[in] S a symmetric d × d matrix.
    /// \pre S is d × d with d == u.size() unless `is_identity()` (not checked).
    /// \returns the diagonal of H S H (d).
    /// \throws std::bad_alloc if the result cannot be allocated.
    template <class V = void>
    [[nodiscard]] Eigen::VectorXd apply_sym_diag(detail::dep_t<Eigen::MatrixXd, V> const& S) const {
        using VecX = detail::dep_t<Eigen::VectorXd, V>;
        auto& u = detail::dep_ref<V>(this->u);
        if (is_identity()) return S.diagonal();
        VecX const w = S * u;
        double const uw = u.dot(w);
        return S.diagonal().array() - 2.0 * gamma * u.array() * w.array() + gamma * gamma * uw * u.array().square();
    }

    /// \brief The dense matrix (tests and small-d inspection only).
    /// \param[in] d the dimension.
    /// \pre d ≥ 0, and d == u.size() unless `is_identity()` (not checked).
    /// \returns H = I − γ u uᵀ (d × d).
    /// \throws std::bad_alloc if the matrix cannot be allocated.
    template <class V = void>
    [[nodiscard]] Eigen::MatrixXd dense(index_t d) const {
        using MatX = detail::dep_t<Eigen::MatrixXd, V>;
        auto& u = detail::dep_ref<V>(this->u);
        MatX H = MatX::Identity(d, d);
        if (!is_identity()) H.noalias() -= gamma * u * u.transpose();
        return H;
    }
};

/// \brief Semantic model of coordinates 2..d per query bucket (method §4).
enum class semantic_model {
    diag,           ///< default: per-bucket mean μ_b and per-coordinate variance σ²_b
    full,           ///< per-bucket mean μ_b and full covariance Σ_b
    global_linear,  ///< global line α_rot + β_rot τ_b and global residual variance
};

/// \brief Options of `householder`.
struct householder_options {
    semantic_model model = semantic_model::diag;  ///< semantic model of coordinates 2..d per bucket
};

/// \brief The rotated-basis Gaussian model of one query bucket, the input of
/// the closed form of method §5. Coordinate 0 is the positional coordinate.
struct bucket_semantics {
    std::int64_t bucket = 0;     ///< bucket id
    std::int64_t n_queries = 0;  ///< query rows in the bucket
    double tau = detail::nan;  ///< τ_b: exact mean query position in the bucket (method §9.2)
    Eigen::VectorXd mean;      ///< (d) [α_pos + β_pos τ_b, μ_b] (global_linear: α_rot + β_rot τ_b)
    Eigen::VectorXd var;       ///< (d) [σ²_pos, σ²_b] (global_linear: global residual variances); all NaN when
                               ///< `used` is false, and under global_linear when the head has < 2 queries
    Eigen::MatrixXd cov;       ///< ((d−1)×(d−1)) Σ_b for `full` (when `used`), empty otherwise
    bool used = false;         ///< false: < 2 queries under diag/full (method §9.8), NaN var
};

/// \brief Result of the Householder decomposition (method §4); scalar fields are
/// output columns of head_metrics.csv, vectors those of head_component_weights.csv.
struct householder_result {
    Eigen::VectorXd beta;   ///< OLS slopes Cov(Q,t)/Var(t) (original basis); zero when degenerate_t
    Eigen::VectorXd alpha;  ///< intercepts mean(Q) − β mean(t)
    Eigen::VectorXd component_r2;      ///< per-coordinate R² (0 for a constant coordinate); all NaN when degenerate_t
    Eigen::VectorXd component_weight;  ///< positive-clipped R², normalised to sum 1; uniform 1/d when no R² > 0
    double q_R2_pos = detail::nan;     ///< mean of the per-coordinate R²; NaN when degenerate_t
    double q_beta_norm = detail::nan;  ///< ‖β‖ (= beta_pos)
    double beta_pos = detail::nan;     ///< ‖β‖ (method §9.7); 0 when degenerate_t
    double alpha_pos = detail::nan;    ///< β̂·α (β̂ = e1 when β = 0)
    double sigma2_pos = detail::nan;   ///< residual variance of coordinate 1, n−1 (method §9.1); NaN when < 2 queries
    householder_reflector H;           ///< maps β̂ to e1
    Eigen::VectorXd alpha_rot;         ///< Hα
    Eigen::VectorXd beta_rot;          ///< Hβ = ‖β‖ e1
    std::vector<bucket_semantics> buckets;  ///< ascending bucket id
    std::int64_t n_queries = 0;             ///< query rows over all buckets
    std::int64_t max_position = -1;         ///< largest query position (method §9.12 default context length)
    std::int64_t n_buckets_skipped = 0;     ///< buckets with < 2 queries under diag/full
    semantic_model model = semantic_model::diag;  ///< the model the buckets were fitted with
    bool degenerate_t = false;  ///< Var(t) = 0 or < 2 queries: β = 0, H = I, R² NaN (method §9.8)
    bool beta_zero = false;     ///< β numerically zero (method §9.17) or degenerate_t: β = 0, H = I, β̂ = e1
    bool constant_q = false;    ///< < 2 queries, or the query rows numerically identical (method §9.17): every
                                ///< variance is 0, so the plasticity pairs are skipped (AP NaN)
};

/// \brief Householder positional–semantic decomposition from a head's moments
/// (queries only; method §4).
///
/// Closed form over the moments: β and α by OLS of every coordinate on the
/// position, H from β̂, then one `bucket_semantics` per bucket under
/// `opt.model`. No decomposition is involved, so there is no status: the
/// degenerate cases are flagged (`degenerate_t`, `bucket_semantics::used`).
/// \param[in] queries the query statistics per bucket.
/// \param[in] opt     the semantic model.
/// \returns the decomposition; see `householder_result` for the NaN cases.
/// \pre queries holds at least one row.
/// \throws std::invalid_argument when there are no query rows.
/// \throws std::bad_alloc if a vector or matrix cannot be allocated.
/// \sa householder_diagnostics
template <class V = void>
householder_result householder(detail::dep_t<bucketed_moments, V> const& queries, householder_options const& opt = {}) {
    using HRes = detail::dep_t<householder_result, V>;
    using VecX = detail::dep_t<Eigen::VectorXd, V>;
    using MatX = detail::dep_t<Eigen::MatrixXd, V>;
    using Mom = detail::dep_t<moments, V>;
    constexpr std::string_view fn = "qkgeom::householder";
    if (queries.count() == 0) detail::fail_arg(fn, "no query rows; query rows", 0);
    index_t const d = queries.d;
    Mom const q = queries.pooled();
    HRes r;
    r.model = opt.model;
    r.n_queries = q.n;
    r.max_position = static_cast<std::int64_t>(q.t_max);
    r.degenerate_t = detail::positions_constant(q);
    // method §9.17: the scale of the query co-moments, Σ‖q‖².
    double const scale = detail::sum_squares_x(q);
    r.constant_q = detail::rows_constant(q);

    // OLS of every coordinate on t (method §4). β is numerically zero when
    // the variance it explains, ‖C_xt‖²/M2_t, is (method §9.17).
    r.beta_zero = r.degenerate_t || detail::numerically_zero(q.c_xt.squaredNorm() / q.m2_t, scale);
    r.beta = r.beta_zero ? VecX::Zero(d) : VecX(q.c_xt / q.m2_t);
    r.alpha = q.mean_x - r.beta * q.mean_t;
    r.component_r2.resize(d);
    for (index_t j = 0; j < d; ++j) {
        double const cjj = q.c_xx(j, j);
        if (r.degenerate_t) r.component_r2(j) = detail::nan;
        else if (detail::numerically_zero(cjj, scale)) r.component_r2(j) = 0.0;  // constant coordinate (§9.8, §9.17)
        else r.component_r2(j) = std::min(1.0, q.c_xt(j) * q.c_xt(j) / (cjj * q.m2_t));
    }
    r.q_R2_pos = r.degenerate_t ? detail::nan : r.component_r2.mean();
    // Component weights: positive-clipped R², normalised; uniform when none > 0 (NaN counts as 0).
    VecX w = r.component_r2.unaryExpr([](double x) { return x > 0 ? x : 0.0; });
    double const ws = w.sum();
    r.component_weight = ws > 0 ? VecX(w / ws) : VecX::Constant(d, 1.0 / double(d));

    // Reflector and rotated-basis parameters (method §4, §9.6, §9.7).
    double const bn = r.beta.norm();
    r.beta_pos = r.q_beta_norm = bn;
    r.H = householder_reflector::from_direction(r.beta);
    VecX beta_hat = VecX::Unit(d, 0);  // β = 0: coordinate 1 stays e1 (H = I)
    if (bn > 0) beta_hat = r.beta / bn;
    r.alpha_pos = beta_hat.dot(r.alpha);
    r.alpha_rot = r.H.apply(r.alpha);
    r.beta_rot = VecX::Zero(d);
    r.beta_rot(0) = bn;
    // Residual covariance of Q after the regression on t (n−1).
    MatX resid = q.c_xx;
    if (!r.beta_zero) resid.noalias() -= (q.c_xt * q.c_xt.transpose()) / q.m2_t;
    double const vscale = q.n >= 2 ? scale / double(q.n - 1) : detail::nan;  // Σ‖q‖² in variance units
    resid /= q.n >= 2 ? double(q.n - 1) : detail::nan;
    r.sigma2_pos = detail::snap_zero(std::max(0.0, beta_hat.dot(resid * beta_hat)), vscale);
    if (q.n < 2) r.sigma2_pos = detail::nan;
    VecX const global_var = detail::snap_zero(r.H.apply_sym_diag(resid), vscale);

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
                s.var = VecX::Constant(d, detail::nan);
                ++r.n_buckets_skipped;
            } else {
                MatX const Sb = m.c_xx / double(m.n - 1);
                if (opt.model == semantic_model::full) {
                    MatX HSH = r.H.apply_sym(Sb);
                    // method §9.17: a numerically zero Σ_b is exactly zero
                    if (detail::numerically_zero(HSH.trace(), vscale)) HSH.setZero();
                    s.var = HSH.diagonal();
                    s.cov = HSH.bottomRightCorner(d - 1, d - 1);
                } else {
                    s.var = detail::snap_zero(r.H.apply_sym_diag(Sb), vscale);
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
/// \param[in] hm  the head's moments; only `hm.q` is used.
/// \param[in] opt the semantic model.
/// \returns `householder(hm.q, opt)`.
/// \throws std::invalid_argument when there are no query rows.
/// \throws std::bad_alloc if a vector or matrix cannot be allocated.
template <class = void>
householder_result householder(head_moments const& hm, householder_options const& opt = {}) {
    return householder(hm.q, opt);
}

/// \brief Householder decomposition from query rows of any adapted tensor type.
/// \tparam X any RowMatrix.
/// \tparam P any IndexVector.
/// \tparam B any IndexVector.
/// \param[in] queries   n × d query rows, n ≥ 1, d ≥ 1, all finite.
/// \param[in] positions n non-negative token positions.
/// \param[in] buckets   n non-negative bucket ids.
/// \param[in] opt       the semantic model.
/// \returns as the `bucketed_moments` overload.
/// \throws std::invalid_argument when d = 0, on zero rows, a positions or
///         buckets length other than n, negative positions or bucket ids, or
///         NaN/Inf values (as bucketed_moments::add).
/// \throws std::bad_alloc if the moments or results cannot be allocated.
template <RowMatrix X, IndexVector P, IndexVector B>
householder_result householder(X const& queries, P const& positions, B const& buckets,
                               householder_options const& opt = {}) {
    bucketed_moments bm(as_matrix(queries).cols());
    bm.add(queries, positions, buckets);
    return householder(bm, opt);
}

/// \brief Row-based normality diagnostics of the Householder model (method §4,
/// §9.15); output columns of head_metrics.csv. Skewness and excess kurtosis
/// are the moment (biased) estimators g1 = m3/m2^{3/2}, g2 = m4/m2² − 3, as
/// scipy.stats.skew/kurtosis compute by default; KS is the two-sided
/// one-sample test against N(0, 1) (stats/kolmogorov.hpp).
struct normality_diagnostics {
    double pos_skew = detail::nan;             ///< skewness of the standardised coordinate-1 residual
    double pos_excess_kurtosis = detail::nan;  ///< its excess kurtosis
    double pos_ks_p = detail::nan;             ///< its KS p-value against N(0, 1)
    double sem_median_abs_skew = detail::nan;      ///< median |skew| over the semantic coordinates used
    double sem_median_abs_kurtosis = detail::nan;  ///< median |excess kurtosis|
    double sem_median_ks_p = detail::nan;          ///< median KS p-value
    double sem_frac_ks_reject = detail::nan;       ///< fraction of KS p < ks_alpha
                                                   ///< (the sem_ fields are NaN when no semantic coordinate has
                                                   ///< a non-zero variance, d = 1, or fewer than 3 rows)
    index_t sem_coordinates = 0;                   ///< min(64, d − 1) coordinates considered (also when n < 3)
    bool pos_degenerate = false;  ///< the pos_ fields are NaN: < 3 rows, or σ²_pos numerically zero (method §9.17)
    bool sem_degenerate = false;  ///< the sem_ fields are NaN: < 3 rows, d = 1, or every semantic coordinate
                                  ///< numerically constant (method §9.17)
};

namespace detail {

struct shape_stats {
    double skew = nan, excess_kurtosis = nan, ks_p = nan;
};

/// Skewness, excess kurtosis and KS p of values already standardised to mean 0, sd 1.
template <class Dep = void>
shape_stats shape_of(std::span<double const> z) {
    shape_stats s;
    double const n = static_cast<double>(z.size());
    double mean = 0;
    for (double v : z) mean += v;
    mean /= n;
    double m2 = 0, m3 = 0, m4 = 0;
    for (double v : z) {
        double const c = v - mean, c2 = c * c;
        m2 += c2;
        m3 += c2 * c;
        m4 += c2 * c2;
    }
    m2 /= n;
    m3 /= n;
    m4 /= n;
    if (m2 > 0) {
        s.skew = m3 / (m2 * std::sqrt(m2));
        s.excess_kurtosis = m4 / (m2 * m2) - 3.0;
    }
    s.ks_p = ks_test_normal(z).pvalue;
    return s;
}


/// `householder_diagnostics`; `rows_checked`: the caller has validated the
/// row values already (analyze_head), only the shapes are checked again.
template <RowMatrix X, IndexVector P>
normality_diagnostics diagnostics_of(detail::dep_t<householder_result, X> const& model, X const& queries,
                                     P const& positions,
                                     double ks_alpha, bool rows_checked) {
    using VecX = detail::dep_t<Eigen::VectorXd, X>;
    using MatX = detail::dep_t<Eigen::MatrixXd, X>;
    constexpr std::string_view fn = "qkgeom::householder_diagnostics";
    auto const r = as_matrix(queries);
    auto const p = as_indices(positions);
    index_t const d = model.beta.size();
    if (!(ks_alpha > 0 && ks_alpha < 1)) detail::fail_arg(fn, "ks_alpha must be in (0, 1)", ks_alpha);
    normality_diagnostics out;
    index_t const m = std::max<index_t>(0, std::min<index_t>(64, d - 1));
    out.sem_coordinates = m;
    out.pos_degenerate = out.sem_degenerate = true;  // until computed
    if (r.rows() == 0 && p.size() == 0) return out;  // no rows: NaN (fewer than 3)
    detail::check_batch(fn, d, r, p, static_cast<decltype(p) const*>(nullptr), !rows_checked);
    index_t const n = r.rows();
    if (n < 3) return out;
    // Rotated rows, coordinate 0 and the first m semantic coordinates. Only
    // coordinates 1..m of Hq = q − γ (u·q) u are needed: the same arithmetic as
    // H.apply (one dot product, then q_j − (γ u·q) u_j), without forming the
    // other d − 1 − m or allocating per row.
    // Rows are formed in row-major blocks of 256 (in L2) and copied to the
    // column-major Y block by block: writing Y row by row would touch 1 + m
    // cache lines per row.
    MatX Y(n, 1 + m);
    VecX row(d);
    VecX const bh = model.beta_pos > 0 ? VecX(model.beta / model.beta_pos)
                                                  : VecX(VecX::Unit(d, 0));
    bool const reflect = !model.H.is_identity();
    constexpr index_t block = 256;
    detail::dep_t<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, X> T(std::min(block, n),
    1 + m);
    double sum_sq = 0;  // Σ‖q‖², the scale of method §9.17
    for (index_t i0 = 0; i0 < n; i0 += block) {
        index_t const nb = std::min(block, n - i0);
        for (index_t t = 0; t < nb; ++t) {
            index_t const i = i0 + t;
            r.read_row(i, row.data());
            sum_sq += row.squaredNorm();
            T(t, 0) = bh.dot(row) - model.alpha_pos - model.beta_pos * static_cast<double>(p[i]);
            if (reflect) {
                double const s = model.H.gamma * model.H.u.dot(row);
                T.row(t).tail(m) = (row.segment(1, m) - s * model.H.u.segment(1, m)).transpose();
            } else {
                T.row(t).tail(m) = row.segment(1, m).transpose();
            }
        }
        Y.middleRows(i0, nb) = T.topRows(nb);
    }
    std::vector<double> z(static_cast<std::size_t>(n));
    auto standardised = [&](index_t j, double centre, double sd) -> bool {
        if (!(sd > 0) || !std::isfinite(sd)) return false;
        for (index_t i = 0; i < n; ++i) z[static_cast<std::size_t>(i)] = (Y(i, j) - centre) / sd;
        return true;
    };
    double const var_scale = sum_sq / static_cast<double>(n - 1);  // Σ‖q‖² in variance units
    if (!numerically_zero(model.sigma2_pos, var_scale) && standardised(0, 0.0, std::sqrt(model.sigma2_pos))) {
        auto const s = detail::shape_of(z);
        out.pos_skew = s.skew;
        out.pos_excess_kurtosis = s.excess_kurtosis;
        out.pos_ks_p = s.ks_p;
        out.pos_degenerate = false;
    }
    std::vector<double> skews, kurts, ps;
    for (index_t j = 1; j <= m; ++j) {
        VecX const col = Y.col(j);
        double const mean = col.mean();
        double const var = (col.array() - mean).square().sum() / static_cast<double>(n - 1);
        if (numerically_zero(var, var_scale) || !standardised(j, mean, std::sqrt(var))) continue;
        auto const s = detail::shape_of(z);
        skews.push_back(std::abs(s.skew));
        kurts.push_back(std::abs(s.excess_kurtosis));
        ps.push_back(s.ks_p);
    }
    if (!ps.empty()) {
        out.sem_degenerate = false;
        out.sem_median_abs_skew = detail::median(skews);
        out.sem_median_abs_kurtosis = detail::median(kurts);
        out.sem_median_ks_p = detail::median(ps);
        out.sem_frac_ks_reject =
            static_cast<double>(std::count_if(ps.begin(), ps.end(), [&](double v) { return v < ks_alpha; })) /
            static_cast<double>(ps.size());
    }
    return out;
}
}  // namespace detail

/// \brief Normality diagnostics from the query rows used to fit `model`
/// (method §4 "Diagnostics", §9.15): the coordinate-1 residual
/// (β̂·q − α_pos − β_pos t)/σ_pos and the first min(64, d − 1) semantic
/// coordinates of Hq, each standardised by its global mean and (n−1) sd.
/// Fewer than 3 rows (also none), or a numerically zero variance (method
/// §9.17), gives NaN for that coordinate and sets `pos_degenerate` /
/// `sem_degenerate`.
/// \tparam X any RowMatrix.
/// \tparam P any IndexVector.
/// \param[in] model     the result of `householder` on (a superset of) these queries.
/// \param[in] queries   n × d query rows, n ≥ 0, d = model.beta.size(), all finite.
/// \param[in] positions n non-negative token positions.
/// \param[in] ks_alpha  level for `sem_frac_ks_reject` (default 0.05), in (0, 1).
/// \returns the diagnostics; all NaN when n < 3, the pos_ fields NaN when
///          σ²_pos is 0 or NaN.
/// \pre `model` comes from `householder` (a default-constructed one has d = 0).
/// \throws std::invalid_argument on a column count other than d (n ≥ 1),
///         a positions length other than n, negative positions, NaN/Inf
///         values, or ks_alpha outside (0, 1).
/// \throws std::bad_alloc if the n × (1 + min(64, d − 1)) work matrix
///         cannot be allocated.
template <RowMatrix X, IndexVector P>
normality_diagnostics householder_diagnostics(householder_result const& model, X const& queries,
                                              P const& positions, double ks_alpha = 0.05) {
    return detail::diagnostics_of(model, queries, positions, ks_alpha, false);
}

}  // namespace qkgeom
