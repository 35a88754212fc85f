// qkgeom — one call per head (PCA, rotation, Householder, diagnostics,
// plasticity) and the layer- and model-level aggregation (method §2–6, §7).
#pragma once

#include <qkgeom/beyond/ranks.hpp>
#include <qkgeom/beyond/rope_bands.hpp>
#include <qkgeom/core/cancel.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/geometry/pca.hpp>
#include <qkgeom/geometry/rotation.hpp>
#include <qkgeom/plasticity/attention_plasticity.hpp>
#include <qkgeom/stats/moments.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom {

/// \brief Options of every analysis of a head (each with the thesis' defaults).
struct analysis_options {
    pca_options pca{};                  ///< options of `pca`
    rotation_options rotation{};        ///< options of `planar_rotation`
    householder_options householder{};  ///< options of `householder`
    plasticity_options plasticity{};    ///< options of `attention_plasticity`
    bool diagnostics = true;  ///< row-based normality diagnostics (needs query rows)
    double ks_alpha = 0.05;   ///< level of sem_frac_ks_reject, in (0, 1) (checked only when diagnostics run)
    bool ranks_on = true;     ///< top-1 flip and Kendall of m keys (`head_analysis::ranks`, docs/beyond-ranks.md)
    rank_options ranks{};     ///< options of `rank_stability`
    rope_band_options rope{}; ///< options of `rope_bands` (runs when the facts carry a RoPE and query rows exist)
};

/// \brief Degeneracy flags of a head (method §9.17): each names why some
/// head metrics are NaN (or, for `q_beta_zero`, which convention applies).
/// Bit i is `head_flag_names[i]`; the flags column of head_metrics.csv lists
/// the set ones, ';'-separated (docs/outputs.md).
enum class head_flag : std::uint32_t {
    q_constant = 1u << 0,             ///< < 2 query rows or all numerically identical
    k_constant = 1u << 1,             ///< < 2 key rows or all numerically identical
    q_positions_constant = 1u << 2,   ///< the query positions have zero variance (or < 2 rows)
    k_positions_constant = 1u << 3,   ///< the key positions have zero variance (or < 2 rows)
    pca_degenerate = 1u << 4,         ///< pooled covariance numerically zero, or the eigensolver failed
    pc0_q_flat = 1u << 5,             ///< pc0_r_q NaN: queries or their positions constant along component 0
    pc0_k_flat = 1u << 6,             ///< pc0_r_k NaN: keys or their positions constant along component 0
    drift_degenerate = 1u << 7,       ///< axis a undefined (rotation.degenerate_a)
    separation_degenerate = 1u << 8,  ///< axis b undefined (rotation.degenerate_b)
    q_beta_zero = 1u << 9,            ///< β numerically zero: H = I, β̂ = e1 (alpha_pos = mean of coordinate 0)
    pos_residual_degenerate = 1u << 10,  ///< pos_ diagnostics NaN (σ²_pos numerically zero, < 3 rows)
    sem_degenerate = 1u << 11,        ///< sem_ diagnostics NaN (no non-constant semantic coordinate, < 3 rows)
    no_plasticity_pairs = 1u << 12,   ///< no key pair evaluated: the ap_ columns are NaN
    rope_inconsistent = 1u << 13,     ///< the RoPE check failed: the rows do not fit the recorded RoPE (docs/beyond-rope.md)
};

/// \brief Names of the head flags, in bit order (the flags column's words).
inline constexpr std::array<std::string_view, 14> head_flag_names{
    "q_constant",       "k_constant",         "q_positions_constant",    "k_positions_constant",
    "pca_degenerate",   "pc0_q_flat",         "pc0_k_flat",              "drift_degenerate",
    "separation_degenerate", "q_beta_zero",   "pos_residual_degenerate", "sem_degenerate",
    "no_plasticity_pairs", "rope_inconsistent"};

/// \brief Everything qkgeom computes for one head pair.
///
/// Numerical outcomes are carried, not thrown: `pca.status`,
/// `rotation.status`, the degeneracy flags of each part, and NaN fields
/// (documented on each result type).
struct head_analysis {
    head_id id;                   ///< the head (from the capture or the moments)
    std::int64_t n_q_tokens = 0;  ///< query rows analysed
    std::int64_t n_k_tokens = 0;  ///< key rows in the moments
    index_t d_model = 0;  ///< head dimension (the column name of method §7)
    pca_result pca;                     ///< method §2; see pca_result::status
    rotation_result rotation;           ///< method §3; see rotation_result::status
    householder_result householder;     ///< method §4
    normality_diagnostics diagnostics;  ///< NaN when computed from moments or with `diagnostics` off
    plasticity_result plasticity;       ///< method §5–6; empirical values NaN when computed from moments
    rank_result ranks;                  ///< beyond pairs: top-1 flip and Kendall of m keys (docs/beyond-ranks.md)
    rope_band_result rope;              ///< RoPE check and frequency bands (docs/beyond-rope.md); not_applicable
                                        ///< without facts.rope or query rows
    std::uint32_t flags = 0;            ///< `head_flag` bits set by analyze_head (method §9.17)

    /// \brief Whether a flag is set.
    /// \param[in] f the flag.
    /// \returns true when `flags` has f's bit.
    [[nodiscard]] bool has(head_flag f) const noexcept { return (flags & static_cast<std::uint32_t>(f)) != 0; }
};

/// \brief The set flags of a head as text: their names in bit order,
/// ';'-separated; empty when none (the flags column of head_metrics.csv).
/// \param[in] h the head's analysis.
/// \returns e.g. "q_constant;pc0_q_flat;no_plasticity_pairs".
/// \throws std::bad_alloc if the string cannot be allocated.
inline std::string head_flags_text(head_analysis const& h) {
    std::string out;
    for (std::size_t i = 0; i < head_flag_names.size(); ++i)
        if ((h.flags >> i) & 1u) {
            if (!out.empty()) out += ';';
            out += head_flag_names[i];
        }
    return out;
}

namespace detail {

/// The closed forms over a head's moments (method §2–4), shared by both
/// entry points (a function template: instantiated on use).
template <class = void>
head_analysis closed_forms(head_moments const& hm, analysis_options const& opt) {
    head_analysis out;
    out.id = hm.id;
    out.n_q_tokens = hm.q.count();
    out.n_k_tokens = hm.k.count();
    out.d_model = hm.d;
    out.pca = pca(hm, opt.pca);
    out.rotation = planar_rotation(hm, opt.rotation);
    out.householder = householder(hm.q, opt.householder);
    return out;
}

/// The flags of method §9.17 from the moments and the results (`diagnosed`:
/// the normality diagnostics were computed).
template <class = void>
std::uint32_t flags_of(head_moments const& hm, head_analysis const& h, bool diagnosed) {
    moments const mq = hm.q.pooled(), mk = hm.k.pooled();
    std::uint32_t f = 0;
    auto set = [&f](head_flag x, bool on) {
        if (on) f |= static_cast<std::uint32_t>(x);
    };
    set(head_flag::q_constant, rows_constant(mq));
    set(head_flag::k_constant, rows_constant(mk));
    set(head_flag::q_positions_constant, positions_constant(mq));
    set(head_flag::k_positions_constant, positions_constant(mk));
    set(head_flag::pca_degenerate, h.pca.degenerate);
    set(head_flag::pc0_q_flat, std::isnan(h.pca.pc0_r_q));
    set(head_flag::pc0_k_flat, std::isnan(h.pca.pc0_r_k));
    set(head_flag::drift_degenerate, h.rotation.degenerate_a);
    set(head_flag::separation_degenerate, h.rotation.degenerate_b);
    set(head_flag::q_beta_zero, h.householder.beta_zero);
    set(head_flag::pos_residual_degenerate, diagnosed && h.diagnostics.pos_degenerate);
    set(head_flag::sem_degenerate, diagnosed && h.diagnostics.sem_degenerate);
    set(head_flag::no_plasticity_pairs, h.plasticity.n_pairs == 0);
    set(head_flag::rope_inconsistent, h.rope.status == rope_status::inconsistent);
    return f;
}

/// `analyze_head(head_moments, keys, …)`: the moments are well formed
/// (dimensions, both kinds present, finite and inside the input limit) and
/// agree with the key rows (dimension, row count).
template <class = void>
void check_moments_and_keys(std::string_view fn, head_moments const& hm, index_t key_cols, index_t key_rows) {
    check_head(fn, hm);
    for (auto const* bm : {&hm.q, &hm.k})
        for (auto const& [b, m] : bm->buckets) {
            std::string const what = std::string(bm == &hm.q ? "query" : "key") + " moments of bucket " +
                                     std::to_string(b);
            if (m.dim() != hm.d) fail_arg(fn, what + ": dimension differs from d = " + std::to_string(hm.d), m.dim());
            if (any_out_of_range(m.mean_x.data(), m.dim()) || !std::isfinite(m.mean_t) || !std::isfinite(m.m2_t) ||
                !m.c_xx.allFinite() || !m.c_xt.allFinite())
                fail_arg(fn, what + ": a statistic is non-finite or a mean is outside |x| < 2^128; rows", m.n);
        }
    if (key_cols != hm.d)
        fail_arg(fn, "keys: head dimension differs from the moments' d = " + std::to_string(hm.d) + "; keys have",
                 key_cols);
    if (key_rows != hm.k.count())
        fail_arg(fn, "keys: row count differs from the key moments' " + std::to_string(hm.k.count()) +
                         " rows; key rows",
                 key_rows);
}

#if defined(QKGEOM_COMPILED)
// Instantiated once in src/qkgeom_compiled.cpp (the compiled part, docs/building.md "Compile model").
extern template head_analysis closed_forms<void>(head_moments const&, analysis_options const&);
#endif

}  // namespace detail

/// \brief Analyse one head (method §2–6): PCA, planar rotation, Householder
/// decomposition, normality diagnostics and attention plasticity with its
/// empirical cross-check, from the head's rows. The moments are reduced once
/// and shared by PCA, rotation and Householder; the rows serve the
/// diagnostics, the key pairs and the empirical check.
///
/// \tparam QM any RowMatrix (the query rows).
/// \tparam KM any RowMatrix (the key rows).
/// \param[in] head  the head: identity (copied to the result), capture facts
///                  (bucket scheme, sliding window, context length) and the
///                  query and key rows (any RowMatrix types). Keys need
///                  example ids; query example ids are optional.
/// \param[in] opt   options of every analysis (thesis defaults)
/// \returns every metric of the head (the columns of head_metrics.csv and
///          the per-bucket, per-component and per-cell tables)
/// \pre queries and keys have the same head dimension, at least one row each
/// \throws std::invalid_argument when queries and keys differ in head
///         dimension, a kind has no rows, a length differs from the rows, a
///         row holds NaN/Inf, a position or bucket is negative, a bucket does
///         not match its position under the facts' scheme (both arrays named),
///         the facts are inconsistent, or an option is out of range.
///         Numerical outcomes (degenerate axes, failed decompositions) are
///         flags, statuses and NaN in the result, never exceptions.
/// \throws std::bad_alloc if the moments, the d × d work matrices or the
///         plasticity work buffers cannot be allocated.
/// \sa summarise_model
template <RowMatrix QM, RowMatrix KM>
head_analysis analyze_head(head_capture<QM, KM> const& head, analysis_options const& opt = {}) {
    constexpr std::string_view fn = "qkgeom::analyze_head";
    auto const qr = as_matrix(head.queries.vectors);
    auto const kr = as_matrix(head.keys.vectors);
    if (qr.cols() != kr.cols())
        detail::fail_arg(fn, "queries and keys differ in head dimension: queries have " + std::to_string(qr.cols()) +
                                 " columns, keys have",
                         kr.cols());
    detail::check_facts(fn, head.facts);
    detail::check_annotations(fn, "queries", qr.rows(), head.queries.position, head.queries.bucket,
                              head.queries.example_id, false, head.facts);
    detail::check_annotations(fn, "keys", kr.rows(), head.keys.position, head.keys.bucket, head.keys.example_id,
                              true, head.facts);
    head_moments hm(qr.cols(), head.id);
    hm.add(kind::query, head.queries);
    hm.add(kind::key, head.keys);
    check_cancelled();  // the safe points between the stages (core/cancel.hpp)
    head_analysis out = detail::closed_forms(hm, opt);
    // The rows were validated by the moments pass (hm.add) and the
    // annotations above: the later passes check shapes only.
    if (opt.diagnostics)
        out.diagnostics = detail::diagnostics_of(out.householder, head.queries.vectors, head.queries.position,
                                                 opt.ks_alpha, true);
    check_cancelled();
    out.plasticity =
        detail::plasticity_of(out.householder, &head.queries, head.keys, head.facts, opt.plasticity, true, head.id);
    check_cancelled();
    if (opt.ranks_on)
        out.ranks = detail::rank_stability_of(out.householder, head.keys, head.facts, head.id, opt.ranks, true);
    check_cancelled();
    out.rope = detail::rope_bands_of(head, opt.rope, &hm.q, true);  // the query moments: no second pass over the rows
    out.flags = detail::flags_of(hm, out, opt.diagnostics);
    return out;
}

#if defined(QKGEOM_COMPILED)
// The common row types (row-major f64 and f32 as read from captures, column-major
// f64 as the synthetic generator makes them): instantiated once in
// src/qkgeom_compiled.cpp (docs/building.md "Compile model"); other types are
// instantiated where they are used, as without the compiled part.
extern template head_analysis analyze_head(head_capture<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> const&,
                                           analysis_options const&);
extern template head_analysis analyze_head(head_capture<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> const&,
                                           analysis_options const&);
extern template head_analysis analyze_head(head_capture<Eigen::MatrixXd> const&, analysis_options const&);
#endif

/// \brief Analyse one head from its (merged) moments and its key rows: every
/// closed form; no normality diagnostics and no empirical cross-check (those
/// need query rows), so those fields stay NaN.
///
/// \tparam KM any RowMatrix (the key rows).
/// \param[in] hm     the head's moments (identity copied to the result)
/// \param[in] keys   the key rows with positions, buckets and example ids
/// \param[in] facts  the capture facts
/// \param[in] opt    options (the diagnostics flag is ignored)
/// \returns the head's metrics without diagnostics and empirical values
/// \pre hm.d ≥ 1 and the moments hold query and key rows; `keys` are the
///      rows the key moments were reduced from (same d and row count,
///      checked; their values are not compared with the moments)
/// \throws std::invalid_argument as `analyze_head(head)` for the keys, and
///         when hm.d < 1, the moments hold no query rows or no key rows, a
///         bucket's dimension differs from hm.d, a statistic is non-finite or
///         a mean is outside the input limit, the keys' column count differs
///         from hm.d or their row count from the key moments', or
///         pca.n_components < 1
/// \throws std::bad_alloc if the d × d work matrices or the plasticity work
///         buffers cannot be allocated
template <RowMatrix KM>
head_analysis analyze_head(head_moments const& hm, token_rows<KM> const& keys, capture_facts const& facts,
                           analysis_options const& opt = {}) {
    auto const kr = as_matrix(keys.vectors);
    detail::check_moments_and_keys("qkgeom::analyze_head", hm, kr.cols(), kr.rows());
    head_analysis out = detail::closed_forms(hm, opt);
    out.plasticity = attention_plasticity(out.householder, keys, facts, hm.id, opt.plasticity);
    if (opt.ranks_on) out.ranks = rank_stability(out.householder, keys, facts, hm.id, opt.ranks);
    out.flags = detail::flags_of(hm, out, false);
    return out;
}

// ---------------------------------------------------------------------------
// Head metrics as named numbers (the numeric columns of head_metrics.csv) and
// their aggregation over heads.
// ---------------------------------------------------------------------------

/// \brief What kind of number a head metric is (docs/analyze.md, "Head metrics").
enum class metric_kind {
    count,        ///< a non-negative integer (rows, dimension); written as an integer
    fraction,     ///< a score in [0, 1]: a share of a whole (R², variance fractions), plasticity, coherence
    correlation,  ///< a correlation in [−1, 1] (Pearson r, Kendall τ)
    probability,  ///< a probability (KS p-values, top-1 flip rates)
    real          ///< any other real number (means, slopes, shapes, differences)
};

/// \brief The name of a metric kind ("count", "fraction", "correlation",
/// "probability", "real").
constexpr std::string_view metric_kind_name(metric_kind k) noexcept {
    switch (k) {
    case metric_kind::count: return "count";
    case metric_kind::fraction: return "fraction";
    case metric_kind::correlation: return "correlation";
    case metric_kind::probability: return "probability";
    case metric_kind::real: break;
    }
    return "real";
}

/// \brief One numeric column of head_metrics.csv: its name, kind, meaning and
/// the field of `head_analysis` it reads.
struct head_metric {
    std::string_view name;                     ///< column name (the result field's name)
    metric_kind kind;                          ///< what kind of number it is
    std::string_view meaning;                  ///< one line, as in docs/outputs.md
    double (*value)(head_analysis const&);     ///< the value of one head (counts converted to double)
};

/// \brief The registry of the numeric head metrics, in column order (method §7,
/// then §10 from `ap_drop_bias` on, then `gaussian_gap_se`, the standard error
/// of the sampled empirical check, method §9.14): every list of head metrics — the columns of
/// head_metrics.csv and model_report.csv, `head_metric_names`,
/// `head_metric_values`, the Python tables, the study metrics — comes from it.
/// tests/runtime/metric_registry_test.cpp checks docs/outputs.md against it.
inline constexpr std::array<head_metric, 55> head_metrics{{
    {"n_q_tokens", metric_kind::count, "query rows of the head",
     [](head_analysis const& h) { return double(h.n_q_tokens); }},
    {"n_k_tokens", metric_kind::count, "key rows of the head",
     [](head_analysis const& h) { return double(h.n_k_tokens); }},
    {"d_model", metric_kind::count, "head dimension d",
     [](head_analysis const& h) { return double(h.d_model); }},
    {"q_R2_pos", metric_kind::fraction, "overall R² of the queries on position",
     [](head_analysis const& h) { return h.householder.q_R2_pos; }},
    {"q_beta_norm", metric_kind::real, "‖β‖, norm of the positional slope of the queries",
     [](head_analysis const& h) { return h.householder.q_beta_norm; }},
    {"alpha_pos", metric_kind::real, "intercept of the positional coordinate",
     [](head_analysis const& h) { return h.householder.alpha_pos; }},
    {"sigma2_pos", metric_kind::real, "residual variance of the positional coordinate",
     [](head_analysis const& h) { return h.householder.sigma2_pos; }},
    {"pos_skew", metric_kind::real, "skewness of the positional residual",
     [](head_analysis const& h) { return h.diagnostics.pos_skew; }},
    {"pos_excess_kurtosis", metric_kind::real, "excess kurtosis of the positional residual",
     [](head_analysis const& h) { return h.diagnostics.pos_excess_kurtosis; }},
    {"pos_ks_p", metric_kind::probability, "KS p-value of the positional residual against a normal",
     [](head_analysis const& h) { return h.diagnostics.pos_ks_p; }},
    {"sem_median_abs_skew", metric_kind::real, "median |skewness| over up to 64 semantic coordinates",
     [](head_analysis const& h) { return h.diagnostics.sem_median_abs_skew; }},
    {"sem_median_abs_kurtosis", metric_kind::real, "median |excess kurtosis| over the semantic coordinates",
     [](head_analysis const& h) { return h.diagnostics.sem_median_abs_kurtosis; }},
    {"sem_median_ks_p", metric_kind::probability, "median KS p-value over the semantic coordinates",
     [](head_analysis const& h) { return h.diagnostics.sem_median_ks_p; }},
    {"sem_frac_ks_reject", metric_kind::fraction, "share of semantic coordinates whose KS test rejects",
     [](head_analysis const& h) { return h.diagnostics.sem_frac_ks_reject; }},
    {"ap_overall", metric_kind::fraction, "w_b-weighted attention plasticity over all buckets",
     [](head_analysis const& h) { return h.plasticity.ap_overall; }},
    {"ap_first_20pct", metric_kind::fraction, "attention plasticity of the first quintile",
     [](head_analysis const& h) { return h.plasticity.ap_first_20pct; }},
    {"ap_last_20pct", metric_kind::fraction, "attention plasticity of the last quintile",
     [](head_analysis const& h) { return h.plasticity.ap_last_20pct; }},
    {"ap_drop", metric_kind::real, "ap_first_20pct − ap_last_20pct",
     [](head_analysis const& h) { return h.plasticity.ap_drop; }},
    {"gaussian_gap", metric_kind::real, "mean |AP_b − AP_b,empirical|",
     [](head_analysis const& h) { return h.plasticity.gaussian_gap; }},
    {"mu_q_a", metric_kind::real, "mean query projection on the drift axis a",
     [](head_analysis const& h) { return h.rotation.mu_q_a; }},
    {"mu_k_a", metric_kind::real, "mean key projection on a",
     [](head_analysis const& h) { return h.rotation.mu_k_a; }},
    {"mu_q_b", metric_kind::real, "mean query projection on the separation axis b",
     [](head_analysis const& h) { return h.rotation.mu_q_b; }},
    {"mu_k_b", metric_kind::real, "mean key projection on b",
     [](head_analysis const& h) { return h.rotation.mu_k_b; }},
    {"alpha_q", metric_kind::real, "OLS slope of the query projection on a against position",
     [](head_analysis const& h) { return h.rotation.alpha_q; }},
    {"alpha_k", metric_kind::real, "OLS slope of the key projection on a against position",
     [](head_analysis const& h) { return h.rotation.alpha_k; }},
    {"r_q_a", metric_kind::correlation, "corr(a·q, position) over the queries",
     [](head_analysis const& h) { return h.rotation.r_q_a; }},
    {"r_k_a", metric_kind::correlation, "corr(a·k, position) over the keys",
     [](head_analysis const& h) { return h.rotation.r_k_a; }},
    {"position_r", metric_kind::correlation, "|corr(a·x, position)| over queries and keys pooled",
     [](head_analysis const& h) { return h.rotation.position_r; }},
    {"bias_strength", metric_kind::real, "mu_q_a · alpha_k (thesis eq. 4.6)",
     [](head_analysis const& h) { return h.rotation.bias_strength; }},
    {"separation_strength", metric_kind::fraction, "bᵀMb / trace M, separation of queries and keys along b",
     [](head_analysis const& h) { return h.rotation.separation_strength; }},
    {"var_frac_a", metric_kind::fraction, "share of the pooled variance along a",
     [](head_analysis const& h) { return h.rotation.var_frac_a; }},
    {"var_frac_b", metric_kind::fraction, "share of the pooled variance along b",
     [](head_analysis const& h) { return h.rotation.var_frac_b; }},
    {"plane_var_fraction", metric_kind::fraction, "var_frac_a + var_frac_b",
     [](head_analysis const& h) { return h.rotation.plane_var_fraction; }},
    {"content_var_b", metric_kind::real, "(Var(b·q) + Var(b·k)) / 2",
     [](head_analysis const& h) { return h.rotation.content_var_b; }},
    {"residual_pos_cov", metric_kind::real, "‖(I − aaᵀ)c‖ / ‖c‖, self-check (≈ 1e-16)",
     [](head_analysis const& h) { return h.rotation.residual_pos_cov; }},
    {"pc0_r_q", metric_kind::correlation, "r_q of PCA component 0",
     [](head_analysis const& h) { return h.pca.pc0_r_q; }},
    {"pc0_r_k", metric_kind::correlation, "r_k of PCA component 0",
     [](head_analysis const& h) { return h.pca.pc0_r_k; }},
    {"q_pos_var_frac", metric_kind::fraction, "share of Q variance linear in position",
     [](head_analysis const& h) { return h.pca.q_pos_var_frac; }},
    {"k_pos_var_frac", metric_kind::fraction, "share of K variance linear in position",
     [](head_analysis const& h) { return h.pca.k_pos_var_frac; }},
    // beyond the thesis (docs/beyond-*.md)
    {"ap_drop_bias", metric_kind::real, "bias part of ap_drop (two-factor Shapley split)",
     [](head_analysis const& h) { return h.plasticity.split.ap_drop_bias; }},
    {"ap_drop_content", metric_kind::real, "content-decay part of ap_drop",
     [](head_analysis const& h) { return h.plasticity.split.ap_drop_content; }},
    {"ap_drop_neither", metric_kind::real, "remainder: ap_drop with neither drift nor content change",
     [](head_analysis const& h) { return h.plasticity.split.ap_drop_neither; }},
    {"ap_drop_no_drift", metric_kind::real, "ap_drop of the counterfactual profile with β_pos = 0",
     [](head_analysis const& h) { return h.plasticity.split.ap_drop_no_drift; }},
    {"ap_drop_frozen_content", metric_kind::real, "ap_drop with the content model frozen at the first quintile",
     [](head_analysis const& h) { return h.plasticity.split.ap_drop_frozen_content; }},
    {"top1_flip", metric_kind::probability, "probability that the top-scoring of m keys changes",
     [](head_analysis const& h) { return h.ranks.top1_flip; }},
    {"top1_flip_first_20pct", metric_kind::probability, "top1_flip over the first quintile",
     [](head_analysis const& h) { return h.ranks.top1_flip_first_20pct; }},
    {"top1_flip_last_20pct", metric_kind::probability, "top1_flip over the last quintile",
     [](head_analysis const& h) { return h.ranks.top1_flip_last_20pct; }},
    {"top1_flip_drop", metric_kind::real, "top1_flip_first_20pct − top1_flip_last_20pct",
     [](head_analysis const& h) { return h.ranks.top1_flip_drop; }},
    {"rank_kendall", metric_kind::correlation, "expected Kendall τ_a of score order and position order of m keys",
     [](head_analysis const& h) { return h.ranks.kendall; }},
    {"rank_kendall_first_20pct", metric_kind::correlation, "rank_kendall over the first quintile",
     [](head_analysis const& h) { return h.ranks.kendall_first_20pct; }},
    {"rank_kendall_last_20pct", metric_kind::correlation, "rank_kendall over the last quintile",
     [](head_analysis const& h) { return h.ranks.kendall_last_20pct; }},
    {"rank_kendall_drop", metric_kind::real, "rank_kendall_first_20pct − rank_kendall_last_20pct",
     [](head_analysis const& h) { return h.ranks.kendall_drop; }},
    {"rope_coherence", metric_kind::fraction, "pooled coherence of the unrotated bucket means (≈ 1: fits the RoPE)",
     [](head_analysis const& h) { return h.rope.coherence; }},
    {"rope_coherence_raw", metric_kind::fraction, "the same for the rows as given (not unrotated)",
     [](head_analysis const& h) { return h.rope.coherence_raw; }},
    {"gaussian_gap_se", metric_kind::real, "standard error of the sampled gaussian_gap (0: counted exactly)",
     [](head_analysis const& h) { return h.plasticity.gaussian_gap_se; }},
}};

namespace detail {

/// The names of a registry (head_metrics, profile_metrics), in its order.
template <class Entry, std::size_t N>
consteval std::array<std::string_view, N> names_of_registry(std::array<Entry, N> const& registry) {
    std::array<std::string_view, N> out{};
    for (std::size_t i = 0; i < N; ++i) out[i] = registry[i].name;
    return out;
}

}  // namespace detail

/// \brief Names of the numeric head metrics, in column order (method §7): the
/// names of `head_metrics`.
inline constexpr std::array<std::string_view, 55> head_metric_names = detail::names_of_registry(head_metrics);

/// \brief The numeric head metrics of one head, in `head_metrics` order.
/// \param[in] h the head's analysis.
/// \returns the 55 values; NaN where the analysis left a field NaN.
inline std::array<double, head_metric_names.size()> head_metric_values(head_analysis const& h) {
    std::array<double, head_metric_names.size()> out{};
    for (std::size_t i = 0; i < head_metrics.size(); ++i) out[i] = head_metrics[i].value(h);
    return out;
}

namespace detail {

/// The rank bucket of the same q_bucket as entry `i` of h.plasticity.profile; null when none.
inline rank_bucket const* rank_entry_of(head_analysis const& h, std::size_t i) {
    if (i >= h.plasticity.profile.size()) return nullptr;
    std::int64_t const b = h.plasticity.profile[i].q_bucket;
    auto const& rp = h.ranks.profile;
    auto const it = std::lower_bound(rp.begin(), rp.end(), b,
                                     [](rank_bucket const& r, std::int64_t x) { return r.q_bucket < x; });
    return it != rp.end() && it->q_bucket == b ? &*it : nullptr;
}

/// Field `f` of split entry `i` (the split profile runs parallel to the plasticity profile); NaN when none.
template <double split_bucket::*f>
double split_value(head_analysis const& h, std::size_t i) {
    auto const& sp = h.plasticity.split.profile;
    return i < sp.size() ? sp[i].*f : nan;
}

/// Field `f` of the rank bucket of entry `i`; NaN when none.
template <double rank_bucket::*f>
double rank_value(head_analysis const& h, std::size_t i) {
    auto const* r = rank_entry_of(h, i);
    return r != nullptr ? r->*f : nan;
}

}  // namespace detail

/// \brief One per-query-bucket value beyond the thesis, a column of
/// head_profile.csv after `decile` (docs/outputs.md).
struct profile_metric {
    std::string_view name;                                ///< column name
    metric_kind kind;                                     ///< what kind of number it is
    std::string_view meaning;                             ///< one line, as in docs/outputs.md's table
    double (*value)(head_analysis const&, std::size_t);  ///< the value for entry i of h.plasticity.profile
};

/// \brief The registry of the per-query-bucket values beyond the thesis: the
/// split of the profile (docs/beyond-split.md; the split entry of the same
/// index) and the rank stability of m keys (docs/beyond-ranks.md; the rank
/// bucket of the same `q_bucket`). NaN where an analysis was off or the bucket
/// has no value. head_profile.csv's columns after `decile`, the Python
/// profile's keys and docs/outputs.md's table come from it
/// (tests/runtime/metric_registry_test.cpp).
inline constexpr std::array<profile_metric, 11> profile_metrics{{
    {"pos_mean_rms", metric_kind::real,
     "√(mean over the bucket's evaluated pairs of m_pos²), m_pos = δ₁(α_pos + β_pos τ_b): the positional part of the "
     "closed-form mean (method §10.1)",
     detail::split_value<&split_bucket::pos_mean_rms>},
    {"content_mean_rms", metric_kind::real, "√(mean of m_con²), m_con = δ₂:d · μ_b: the content part of the mean",
     detail::split_value<&split_bucket::content_mean_rms>},
    {"pos_var", metric_kind::real, "mean of v_pos = σ²_pos δ₁² over the pairs", detail::split_value<&split_bucket::pos_var>},
    {"content_var", metric_kind::real, "mean of v_con = δ₂:dᵀ Σ_b δ₂:d over the pairs",
     detail::split_value<&split_bucket::content_var>},
    {"ap_no_drift", metric_kind::fraction, "AP_b with β_pos = 0", detail::split_value<&split_bucket::ap_no_drift>},
    {"ap_frozen_content", metric_kind::fraction,
     "AP_b with the content model (μ_b, σ²_b or Σ_b) frozen at the first-quintile reference",
     detail::split_value<&split_bucket::ap_frozen_content>},
    {"ap_neither", metric_kind::fraction, "AP_b with both", detail::split_value<&split_bucket::ap_neither>},
    {"top1_flip", metric_kind::probability, "top-1 flip of m keys for a query of this bucket (method §10.4)",
     detail::rank_value<&rank_bucket::top1_flip>},
    {"top1_flip_se", metric_kind::real, "its standard error (set sampling and integration)",
     detail::rank_value<&rank_bucket::top1_flip_se>},
    {"rank_kendall", metric_kind::correlation, "expected Kendall τ_a of score order vs position order of m keys",
     detail::rank_value<&rank_bucket::kendall>},
    {"rank_kendall_se", metric_kind::real, "its standard error", detail::rank_value<&rank_bucket::kendall_se>},
}};

/// \brief Names of the per-query-bucket values beyond the thesis (columns of
/// head_profile.csv after `decile`): the names of `profile_metrics`.
inline constexpr std::array<std::string_view, profile_metrics.size()> profile_beyond_names =
    detail::names_of_registry(profile_metrics);

/// \brief The values of `profile_metrics` for entry `i` of `h.plasticity.profile`.
/// \param[in] h the head's analysis.
/// \param[in] i an index into h.plasticity.profile.
/// \returns the 11 values; NaN where an analysis was off or has none.
inline std::array<double, profile_metrics.size()> profile_beyond_values(head_analysis const& h, std::size_t i) {
    std::array<double, profile_metrics.size()> v{};
    for (std::size_t k = 0; k < profile_metrics.size(); ++k) v[k] = profile_metrics[k].value(h, i);
    return v;
}

}  // namespace qkgeom
