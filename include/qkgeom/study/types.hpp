// qkgeom — studies: many runs (models, checkpoints) analysed once, compared in
// tables and pictures (docs/study.md). This header holds the plain types the
// study's parts share: what a study file says (study_spec), what one run's
// analysis holds once read back (run_heads), and the computed tables
// (study_result). The functions live in run/study_spec.hpp (the file),
// run/study_read.hpp (analysis folders), study/metrics.hpp (metric names, a
// head's profile summaries), study/stats.hpp (correlations, permutation
// p-values, bootstrap), study/compute.hpp (the tables),
// report/study_tables.hpp (the tables as named columns),
// report/study_svg.hpp (pictures) and run/study_run.hpp (analysis and cache).
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/geometry/pca.hpp>
#include <qkgeom/io/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace qkgeom {
namespace study {

inline constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------
// The study file
// ---------------------------------------------------------------------------

/// \brief Where a run sits in a model's training (all optional).
struct checkpoint {
    std::optional<std::int64_t> step;  ///< training step
    std::optional<double> tokens;      ///< training tokens seen
    std::string phase;                 ///< phase label ("pre-train", "LC 4K→32K", …)
    std::optional<double> order;       ///< explicit order; else step, else tokens, else file order
    [[nodiscard]] bool given() const { return step || tokens || order || !phase.empty(); }
};

/// \brief One run of a study: a model (at a checkpoint) and where its
/// analysis comes from: a capture folder (analysed, cached), an existing
/// analysis folder (read), or model-level numbers given in the file.
struct run_spec {
    std::string name;    ///< unique in the study
    std::string family;  ///< colour group; "" = the run's model
    std::string model;   ///< benchmark scores join on it; "" = name
    checkpoint ckpt;
    std::filesystem::path capture;   ///< a capture folder (docs/dataset.md), or empty
    std::filesystem::path analysis;  ///< an analysis folder (qkgeom analyze -o), or empty
    std::map<std::string, double> metrics;  ///< model-level numbers (no heads), or empty
    std::size_t index = 0;                  ///< position in the file
};

/// \brief One benchmark: overall scores per model, and optionally per
/// length bin (token range [lo, hi)) per model.
struct length_score {
    std::string model;
    double lo = 0, hi = 0;  ///< token range [lo, hi)
    double score = nan;
};
struct benchmark {
    std::string name;                       ///< e.g. "LBP"
    std::map<std::string, double> overall;  ///< model → score
    std::vector<length_score> by_length;    ///< model × length bin → score
    std::filesystem::path overall_file, by_length_file;  ///< where they were read (messages)
};

/// \brief A whole study file (docs/study.md#the-study-file).
struct study_spec {
    std::filesystem::path file;  ///< the study file (relative paths resolve against its folder)
    std::string title;
    std::vector<run_spec> runs;
    std::vector<benchmark> benchmarks;
    std::vector<double> token_edges;      ///< token-range profile edges; empty = powers of two (default_token_edges)
    std::vector<std::string> correlate;   ///< metrics set against every benchmark; empty = default_correlate
    std::vector<std::string> heatmap;     ///< metrics of the layer-depth × run heatmap; empty = {"ap_drop"}
    std::vector<std::string> trajectory;  ///< metrics of the per-head trajectories; empty = {"ap_drop"}
    std::int64_t bootstrap_resamples = 2000;
    double bootstrap_level = 0.95;
    std::uint64_t seed = 0;
    std::int64_t depth_bins = 10;  ///< relative layer-depth bins of the heatmap
    /// The file's "options" object as written (checked when parsed): the
    /// analysis options of every capture, applied over the caller's by
    /// apply_study_options (run/study_spec.hpp); null when absent.
    json::value options;
};

// ---------------------------------------------------------------------------
// One run's heads, read back from an analysis folder
// ---------------------------------------------------------------------------

/// \brief One query bucket of a head's plasticity profile (head_profile.csv).
struct profile_point {
    std::int64_t q_bucket = 0;
    double tau = nan;          ///< τ_b, mean query position
    std::int64_t n_queries = 0;  ///< w_b
    double ap = nan;           ///< AP_b
    int quintile = 0, decile = 0;
};

/// \brief One head of a run: its numeric metrics (head_metric_names order),
/// class and per-bucket profile.
struct head_row {
    head_id id;
    std::array<double, head_metric_names.size()> metrics{};
    head_class taxonomy = head_class::undefined;
    std::vector<profile_point> profile;  ///< empty when the folder has no head_profile.csv
};

/// \brief One run's analysis: its heads, or only model-level numbers.
struct run_heads {
    std::vector<head_row> heads;
    std::int64_t n_layers = 0;  ///< from the manifest, else 1 + the largest layer
    std::int64_t context_length = 0;  ///< L of the quantiles (0: unknown)
    bool has_profiles = false;  ///< head_profile.csv was present
    /// model_report.csv's quintile and decile means, used when head_profile.csv is absent
    std::array<double, 5> report_quintile{nan, nan, nan, nan, nan};
    std::array<double, 10> report_decile{nan, nan, nan, nan, nan, nan, nan, nan, nan, nan};
};

/// \brief What happened to a run.
enum class run_status { analysed, cached, read, given, failed };

// ---------------------------------------------------------------------------
// The computed study
// ---------------------------------------------------------------------------

/// \brief A mean over heads with its bootstrap interval (NaN when not known).
struct estimate {
    double value = nan, lo = nan, hi = nan;
    std::int64_t n = 0;  ///< heads with a finite value (0 for given numbers)
};

/// \brief One run's model-level numbers (the model table's row).
struct run_summary {
    run_spec spec;
    run_status status = run_status::failed;
    std::string message;             ///< why it failed; else empty
    std::string note;                ///< what the cache found and did besides (run_outcome::note); else empty
    std::int64_t n_heads = 0;
    std::int64_t n_layers = 0;
    std::map<std::string, estimate> metrics;  ///< every study metric name (study_metric_names)
    std::map<std::string, double> scores;     ///< benchmark name → overall score
    std::array<double, 5> quintile{nan, nan, nan, nan, nan};
    std::array<double, 10> decile{nan, nan, nan, nan, nan, nan, nan, nan, nan, nan};
    std::vector<double> token_profile;             ///< per token range (study token edges)
    std::map<head_class, std::int64_t> taxonomy;   ///< heads per class
};

/// \brief One step of a model's checkpoint trajectory with the bias
/// decomposition: Δlog G|bias_strength| = Δlog G|mu_q_a| + Δlog G|alpha_k|,
/// G the geometric mean over the heads where both factors are finite and
/// non-zero (docs/study.md#bias-decomposition).
struct trajectory_step {
    std::string model;
    std::size_t run = 0;  ///< index into study_result::runs
    std::size_t from = static_cast<std::size_t>(-1);  ///< previous checkpoint's run (−1: first)
    double order = nan;
    double gm_bias = nan, gm_mu_q_a = nan, gm_alpha_k = nan;  ///< geometric means of |.|
    std::int64_t n_decomposed = 0;  ///< heads in the geometric means
    double dlog_bias = nan, dlog_mu_q_a = nan, dlog_alpha_k = nan;  ///< change from `from`
};

/// \brief Correlation of one metric with one benchmark over a group of runs.
struct correlation_row {
    std::string metric, benchmark, group;  ///< group: "all" or a family
    std::int64_t n = 0;
    double pearson = nan, p_pearson = nan;
    double spearman = nan, p_spearman = nan;
    double kendall = nan, p_kendall = nan;
    std::string p_method;  ///< "exact" (all n! permutations) or "monte_carlo"
};

/// \brief Per-length correlation: a run's token-range plasticity against a
/// benchmark's per-length scores.
struct length_point {
    double lo = 0, hi = 0, score = nan, plasticity = nan;
};
struct length_correlation {
    std::string benchmark, model;
    std::size_t run = 0;
    std::vector<length_point> points;
    correlation_row corr;  ///< metric "plasticity_by_length", group = model
};

/// \brief Layer-depth × run heatmap cell: mean of a metric over the heads
/// whose relative depth layer / n_layers falls in bin `bin`.
struct depth_cell {
    std::string metric;
    std::size_t run = 0;
    std::int64_t bin = 0;
    double value = nan;
    std::int64_t n = 0;
};

/// \brief Heads present in every checkpoint of a model, with one metric per
/// checkpoint (in trajectory order).
struct head_trajectory {
    std::string model, metric;
    std::vector<std::size_t> runs;  ///< trajectory order
    std::vector<head_id> heads;
    std::vector<std::vector<double>> values;  ///< heads × runs
};

struct study_result {
    std::string title;
    std::vector<run_summary> runs;  ///< study file order
    std::vector<std::string> benchmarks;
    std::vector<double> token_edges;
    std::vector<trajectory_step> trajectory;  ///< grouped by model, in checkpoint order
    std::vector<correlation_row> correlations;
    std::vector<length_correlation> length_correlations;
    std::vector<depth_cell> depth;
    std::int64_t depth_bins = 10;
    std::vector<head_trajectory> head_trajectories;
};

}  // namespace study
}  // namespace qkgeom
