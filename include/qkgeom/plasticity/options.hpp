// qkgeom — attention plasticity: its policies, options and result types
// (method §5–6). The computation is in the other headers of this folder:
//   pair_plan.hpp    key groups, admissible cells, pair counts, exact/sampled
//                    (shared with the LibTorch path)
//   closed_form.hpp  the Gaussian PP of a pair: direct, Gram (GEMM), sampled
//   empirical.hpp    the model-free cross-check (method §9.14)
//   aggregate.hpp    cells → AP_b → profiles, AP_drop, heatmap grid, the split
//   split.hpp        the split of the profile: its types (docs/beyond-split.md)
//   evaluate.hpp     one head, from validated rows
// and the public entry points in <qkgeom/plasticity/attention_plasticity.hpp>.
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/plasticity/split.hpp>

#include <Eigen/Core>

#include <array>
#include <cstdint>
#include <vector>

namespace qkgeom {

/// \brief Which key pairs a query bucket is evaluated on (method §6).
enum class pair_policy {
    same_bucket,  ///< default: pairs of one example's keys in one earlier bucket c; a cell per (b, c)
    prefix,       ///< pairs of one example's keys anywhere in the earlier buckets (thesis' pooled prefix)
};

/// \brief How AP_overall weights the query buckets (method §6).
enum class ap_weighting {
    query_count,  ///< default: w_b = number of queries in bucket b
    cell_mean,    ///< plain mean over the non-empty cells (as the prior tool did)
};

/// \brief Exact enumeration of every admissible pair, or seeded sampling.
enum class enumeration_policy {
    automatic,  ///< exact when the head's admissible pair count ≤ max_exact_pairs, else sampled
    exact,
    sampled,
};

/// \brief How the empirical cross-check (method §9.14) forms its
/// single-precision products: a speed choice only, the counts are the same
/// (docs/plasticity.md, "How the counts are computed").
enum class empirical_columns {
    automatic,  ///< pair differences for a query bucket with no more pairs than scored keys, else keys
    keys,       ///< score every key that takes part in a pair, then compare pairs of scores
    pairs,      ///< one column kᵢ − kⱼ per pair wherever that form applies (see docs)
};

/// \brief How the empirical cross-check (method §9.14) evaluates a cell: every
/// (query, pair) evaluation, or, once the cell has more than
/// max(`empirical_max_exact`, `empirical_budget`), `empirical_pairs` of its
/// pairs against every query or `empirical_budget` evaluations drawn at random
/// (docs/plasticity.md, "Sampled or exact: `empirical_check`"). The closed form, AP and every other number
/// are the same either way; only the empirical values and `gaussian_gap` are
/// estimated.
enum class empirical_policy {
    sampled,  ///< default: a small cell is counted exactly, a large one estimated from a sample of its pairs or draws
    exact,    ///< every (query, pair) evaluation of every cell
};

/// \brief Bin edges of the 2D heatmap (method §6, §9.13): half-open bins
/// [e_j, e_{j+1}), the last one closed. Empty = the model-wide grid of
/// `model_heatmap_grid`.
struct heatmap_grid {
    std::vector<double> distance_edges;  ///< inter-key distance |t_i − t_j|
    std::vector<double> offset_edges;    ///< query-to-midpoint distance τ_b − (t_i + t_j)/2
};

/// \brief Options of `attention_plasticity` (defaults are the thesis'). The
/// capture's bucket scheme, sliding window and context length are facts of
/// the head (`capture_facts`), not options.
struct plasticity_options {
    pair_policy pairs = pair_policy::same_bucket;
    ap_weighting weighting = ap_weighting::query_count;
    enumeration_policy enumeration = enumeration_policy::automatic;
    std::int64_t max_exact_pairs = 4'000'000;  ///< automatic: exact up to this many (query bucket, pair) evaluations
    std::int64_t samples_per_cell = 2000;      ///< sampled: pairs drawn per cell
    std::uint64_t seed = 0;                    ///< sampled: seed; a cell's draws depend on (seed, head id, b, c)
                                               ///< only (method §6, `head_stream_seed`)
    /// Heatmap bin edges; empty = `model_heatmap_grid(facts, L, pairs)`, the
    /// same grid for every head of a capture whose facts carry L.
    heatmap_grid heatmap{};
    index_t dense_min_keys = 48;  ///< groups with at least this many keys use the Gram (GEMM) path
    index_t tile_keys = 256;      ///< Gram tile edge: memory stays O(tile² + group·d)
    empirical_columns empirical = empirical_columns::automatic;  ///< the check's product form (same counts)
    /// The empirical check: `sampled` (default) or `exact` (method §9.14).
    empirical_policy empirical_check = empirical_policy::sampled;
    /// `empirical_check` sampled: the (query, pair) evaluations of a drawn
    /// cell, ⌊budget/2⌋ draws (≥ 4); 32 × it bounds a pair-sampled cell's.
    /// Pairs and draws depend on (seed, head id, b, c) only.
    std::int64_t empirical_budget = 4096;
    /// `empirical_check` sampled: a cell of n_b · (its pairs) ≤
    /// max(this, `empirical_budget`) evaluations is counted exactly (≥ 0;
    /// 0: every cell above the budget is sampled).
    std::int64_t empirical_max_exact = 16'384;
    /// `empirical_check` sampled: a sampled cell of a bucket with n_b ·
    /// this ≤ 32 · `empirical_budget` counts this many of its pairs, drawn
    /// without replacement, against every query of the bucket (the
    /// difference estimator with the closed form, docs/plasticity.md); one
    /// of no more than 4 × this pairs is counted whole (≥ 0; below 2, which
    /// gives no standard error: only draws).
    std::int64_t empirical_pairs = 32;
    /// The split of the profile (`plasticity_result::split`, docs/beyond-split.md):
    /// false leaves it NaN with status `disabled` (and saves its time).
    bool split_profile = true;
};

/// \brief One (query bucket, key bucket) cell: a row of head_bucket_plasticity.csv.
/// For `prefix` there is one cell per query bucket, with k_bucket = −1.
struct plasticity_cell {
    std::int64_t q_bucket = 0;
    std::int64_t k_bucket = 0;
    double plasticity = detail::nan;  ///< mean PP over the evaluated pairs (NaN when n_pairs = 0)
    std::int64_t n_pairs = 0;         ///< evaluated pairs (v > 0)
    double std_error = 0.0;           ///< sampled: sd(PP)/√n (method §9.16); exact: 0
    double empirical = detail::nan;   ///< mean unbiased 4p̂(1−p̂)n/(n−1) over the same pairs (needs queries)
    double empirical_se = detail::nan;  ///< standard error of `empirical`: 0 counted exactly, NaN without it
};

/// \brief One query bucket of the plasticity profile.
struct plasticity_bucket {
    std::int64_t q_bucket = 0;
    std::int64_t n_queries = 0;        ///< w_b
    double tau = detail::nan;          ///< τ_b, exact mean query position
    double ap = detail::nan;           ///< AP_b (NaN: no non-empty cell; excluded everywhere)
    double ap_empirical = detail::nan; ///< the same aggregate of the empirical values
    double ap_empirical_se = detail::nan;  ///< standard error of `ap_empirical` (0: every cell counted exactly)
    double std_error = 0.0;            ///< sampled: standard error of AP_b
    std::int64_t n_pairs = 0;
    std::int64_t n_cells = 0;          ///< non-empty cells
    int quintile = 0;                  ///< ⌊5 τ_b / L⌋, clipped to 4
    int decile = 0;                    ///< ⌊10 τ_b / L⌋, clipped to 9
};

/// \brief The 2D heatmap: sum and count of PP per (distance, offset) bin.
struct plasticity_heatmap {
    std::vector<double> distance_edges, offset_edges;
    Eigen::MatrixXd sum;                                           ///< distance bins × offset bins
    Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic> count;
    std::int64_t n_outside = 0;  ///< points outside the grid: counted, not binned
};

/// \brief Result of the plasticity analysis of one head (method §6); scalar
/// fields are columns of head_metrics.csv.
struct plasticity_result {
    std::vector<plasticity_cell> cells;      ///< non-empty and empty cells, ascending (q_bucket, k_bucket)
    std::vector<plasticity_bucket> profile;  ///< ascending q_bucket (buckets with a model)
    double ap_overall = detail::nan;
    double ap_first_20pct = detail::nan;
    double ap_last_20pct = detail::nan;
    double ap_drop = detail::nan;  ///< ap_first_20pct − ap_last_20pct
    std::array<double, 5> ap_quintile{detail::nan, detail::nan, detail::nan, detail::nan, detail::nan};
    std::array<double, 10> ap_decile{};
    double gaussian_gap = detail::nan;  ///< mean |AP_b − AP_b,empirical| (needs queries)
    double gaussian_gap_se = detail::nan;  ///< its standard error (0: every cell counted exactly)
    plasticity_heatmap heatmap;
    std::int64_t n_pairs = 0;                ///< evaluated (query bucket, pair) evaluations
    std::int64_t n_pairs_skipped = 0;        ///< pairs with v ≤ 0 (identical keys), not averaged (method §9.9)
    std::int64_t n_query_buckets_skipped = 0;  ///< no earlier key bucket, or no bucket model
    bool sampled = false;
    std::int64_t context_length = 0;  ///< L used for the quantiles
    profile_split split;              ///< bias vs content decomposition of the profile (docs/beyond-split.md)
};

}  // namespace qkgeom
