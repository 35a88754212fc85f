// qkgeom — the decomposition of the plasticity profile (issue 17, part 1;
// docs/beyond-split.md): per query bucket the positional and content parts of
// the closed-form mean and the content variance, and the counterfactual
// profiles of the same fitted model on the same pairs (no drift, frozen
// content, both), whose AP_drops give the two-factor Shapley split of AP_drop
// into a bias part, a content part and the both-removed remainder.
// This header holds the types only (options.hpp includes it); the per-pair
// kernel is in closed_form.hpp, the pass runs inside the plasticity pass
// (evaluate.hpp) and the aggregation is in aggregate.hpp.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/config.hpp>

#include <Eigen/Core>

#include <cstdint>
#include <vector>

namespace qkgeom {

/// \brief Whether `plasticity_result::split` was computed, and if not why.
enum class split_status {
    not_computed,  ///< the path that made the result does not compute it (e.g. LibTorch cells), all NaN
    computed,      ///< every field computed (NaN only where a profile is NaN, as for AP_drop itself)
    disabled,      ///< `plasticity_options::split_profile` was false, all NaN
    no_reference,  ///< no first-quintile bucket with a model: frozen-content profiles, bias and content parts NaN
};

/// \brief One query bucket of the split profile (one per entry of
/// `plasticity_result::profile`, same order). Means and variances are over the
/// bucket's evaluated pairs (all its cells pooled); NaN where it has none.
struct split_bucket {
    std::int64_t q_bucket = 0;
    double pos_mean_rms = detail::nan;       ///< √mean (δ₁ w_b[0])²: the positional part of m
    double content_mean_rms = detail::nan;   ///< √mean (δ₂:d · μ_b)²: the content part of m
    double pos_var = detail::nan;            ///< mean σ²_pos δ₁²: the positional part of v
    double content_var = detail::nan;        ///< mean δ₂:dᵀ Σ_b δ₂:d (diag: Σ σ²_{b,l} δ_l²)
    double ap = detail::nan;                 ///< AP_b recomputed by this pass (equals profile[i].ap to rounding)
    double ap_no_drift = detail::nan;        ///< AP_b with β_pos = 0 (w_b[0] := α_pos)
    double ap_frozen_content = detail::nan;  ///< AP_b with μ_b, σ²_b (Σ_b) := the first-quintile reference
    double ap_neither = detail::nan;         ///< AP_b with both
};

/// \brief The split of AP_drop (a member of `plasticity_result`): the
/// counterfactual AP_drops aggregated exactly as `plasticity_result::ap_drop`,
/// and the two-factor Shapley split
///   ap_drop_bias    = ½[(D − D_no_drift) + (D_frozen − D_neither)]
///   ap_drop_content = ½[(D − D_frozen) + (D_no_drift − D_neither)]
/// with D = `plasticity_result::ap_drop`, so that
/// ap_drop_bias + ap_drop_content + ap_drop_neither = ap_drop (to rounding).
struct profile_split {
    std::vector<split_bucket> profile;
    double ap_drop_no_drift = detail::nan;
    double ap_drop_frozen_content = detail::nan;
    double ap_drop_neither = detail::nan;  ///< the both-removed remainder
    double ap_drop_bias = detail::nan;
    double ap_drop_content = detail::nan;
    std::int64_t n_frozen_buckets = 0;     ///< first-quintile buckets with a model (the reference)
    std::int64_t n_pairs_degenerate = 0;   ///< counterfactual evaluations with v ≤ 0 (PP 0, or 1 when m = 0)
    split_status status = split_status::not_computed;
};

namespace detail {

/// The counterfactual model of one query bucket (rotated basis): the frozen
/// content mean and variances (coordinates 1..d−1 of `wf`, `varf`; `covf`
/// the frozen Σ for `full`, else empty) and the drift-free positional mean
/// α_pos. `on` false: the bucket evaluates no split.
struct split_model {
    bool on = false;
    bool frozen = false;  ///< a reference exists (else only the no-drift profile)
    double alpha_pos = nan;
    Eigen::VectorXd wf, varf;
    Eigen::MatrixXd covf;
    /// full: row i = Σ_ref k̃_i[1:] (row-major, d − 1 columns; the head's
    /// P = K̃[:, 1:] Σ_ref), so Σ_ref δ₂:d = P_i − P_j in O(d); null otherwise.
    double const* pref = nullptr;
    /// Whether the frozen content model is the actual one (global_linear):
    /// −1 not known yet; set on first use by the split pass (closed_form.hpp),
    /// which then takes fr = act and ne = nd without evaluating them again.
    mutable signed char same_state = -1;
};

/// Sums of one cell (or bucket) of the split pass.
struct split_acc {
    double act = 0, nd = 0, fr = 0, ne = 0;           ///< Σ PP of the four profiles
    double mpos2 = 0, mcon2 = 0, vpos = 0, vcon = 0;  ///< Σ m_pos², m_con², v_pos, v_con
    std::int64_t n = 0, degenerate = 0;

    void add(split_acc const& o) {
        act += o.act, nd += o.nd, fr += o.fr, ne += o.ne;
        mpos2 += o.mpos2, mcon2 += o.mcon2, vpos += o.vpos, vcon += o.vcon;
        n += o.n, degenerate += o.degenerate;
    }
};

}  // namespace detail

}  // namespace qkgeom
