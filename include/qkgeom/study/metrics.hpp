// qkgeom — what a study measures of a run's heads (docs/study.md#metrics):
// the study's metric names (head_metric_names plus the derived
// absolute-value means) and a head's profile summaries from its profile rows
// (quintile and decile means, token ranges). Values to values: no files; the
// study file (run/study_spec.hpp) and the analysis folders
// (run/study_read.hpp) are read above, in run/.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/study/types.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom {
namespace study {

/// \brief Derived model-level metrics a study adds to head_metric_names:
/// means over heads of the absolute values (the thesis reports |r_k^a|,
/// |r_q^a|, |α_K|, |μ_Q^a|).
inline constexpr std::array<std::string_view, 5> derived_metric_names{"abs_mu_q_a", "abs_alpha_k", "abs_r_q_a",
                                                                      "abs_r_k_a", "abs_bias_strength"};

/// \brief Every metric of the model table: head_metric_names, then
/// derived_metric_names.
/// \returns the names, in column order.
inline std::vector<std::string> study_metric_names() {
    std::vector<std::string> out;
    for (auto n : head_metric_names) out.emplace_back(n);
    for (auto n : derived_metric_names) out.emplace_back(n);
    return out;
}

/// \brief Whether `name` is a study metric.
/// \param[in] name a metric name.
/// \returns true for a head_metric_names or derived_metric_names entry.
inline bool is_study_metric(std::string_view name) {
    return std::find(head_metric_names.begin(), head_metric_names.end(), name) != head_metric_names.end() ||
           std::find(derived_metric_names.begin(), derived_metric_names.end(), name) != derived_metric_names.end();
}

/// \brief The valid values of a study metric (docs/study.md#metrics),
/// derived from its kind in the registry (`head_metrics`): a count is an
/// integer >= 0 (never NaN); a fraction or a probability lies in [0, 1]; a
/// correlation in [-1, 1]; a real number is finite; the derived `abs_<m>`
/// lies in [max(0, lo), max(|lo|, |hi|)] of <m>'s range. Every metric but a
/// count may be NaN (undefined for the head, docs/outputs.md). Bounds hold to
/// `metric_range_slack` (rounding of a value computed as 1 − x or a ratio).
struct metric_range {
    double lo = -std::numeric_limits<double>::infinity();
    double hi = std::numeric_limits<double>::infinity();
    bool integer = false;  ///< a count
    bool nan_ok = true;    ///< NaN allowed
    std::string_view kind = "real";  ///< the registry's kind name (derived: "absolute value")
};

/// \brief How far a fraction, probability or correlation may lie outside its bounds (rounding).
inline constexpr double metric_range_slack = 1e-6;

/// \brief The range of a study metric (head_metric_names or derived_metric_names).
/// \param[in] name a study metric name.
/// \returns its range; a real's (any finite value) for an unknown name.
inline metric_range study_metric_range(std::string_view name) {
    bool const derived = name.starts_with("abs_") &&
                         std::find(derived_metric_names.begin(), derived_metric_names.end(), name) != derived_metric_names.end();
    std::string_view const base = derived ? name.substr(4) : name;
    metric_range r;
    for (auto const& m : head_metrics) {
        if (m.name != base) continue;
        r.kind = metric_kind_name(m.kind);
        if (m.kind == metric_kind::count) r.lo = 0, r.integer = true, r.nan_ok = false;
        else if (m.kind == metric_kind::fraction || m.kind == metric_kind::probability) r.lo = 0, r.hi = 1;
        else if (m.kind == metric_kind::correlation) r.lo = -1, r.hi = 1;
    }
    if (derived) {
        double const hi = std::max(std::abs(r.lo), std::abs(r.hi));
        r.lo = std::max(0.0, r.lo);
        r.hi = hi;
        r.kind = "absolute value";
    }
    return r;
}

/// \brief Why a value is not valid for a study metric.
/// \param[in] name the metric.
/// \param[in] x the value.
/// \returns "" when valid; else the problem ("outside [0, 1] (a fraction)", ...).
inline std::string metric_value_problem(std::string_view name, double x) {
    auto const r = study_metric_range(name);
    auto const kind = " (" + std::string(r.kind == "absolute value" ? "an " : "a ") + std::string(r.kind) + ")";
    if (std::isnan(x)) return r.nan_ok ? std::string() : "must not be nan" + kind;
    if (!std::isfinite(x)) return "must be finite (an undefined value is written nan)";
    if (r.integer && (x < 0 || x != std::floor(x))) return "must be an integer >= 0" + kind;
    auto const bound = [](double v) {
        char b[32];
        std::snprintf(b, sizeof b, "%g", v);
        return std::string(b);
    };
    if (std::isfinite(r.hi) && (x < r.lo - metric_range_slack || x > r.hi + metric_range_slack))
        return "outside [" + bound(r.lo) + ", " + bound(r.hi) + "]" + kind;
    if (!std::isfinite(r.hi) && x < r.lo) return "must be >= " + bound(r.lo) + kind;
    return {};
}

/// \brief The metrics set against every benchmark when the study file names none.
inline constexpr std::array<std::string_view, 7> default_correlate{
    "ap_drop", "ap_overall", "ap_first_20pct", "ap_last_20pct", "bias_strength", "abs_r_k_a", "abs_r_q_a"};

namespace detail {

/// The n_queries-weighted mean of the finite AP_b per quantile (as
/// qkgeom::detail::quantile_profile computes a head's ap_quintile / ap_decile).
template <std::size_t K>
std::array<double, K> quantile_means(head_row const& h, int profile_point::*member) {
    std::array<double, K> num{}, den{}, out{};
    for (auto const& p : h.profile)
        if (std::isfinite(p.ap)) {
            auto const q = static_cast<std::size_t>(p.*member);
            if (q >= K) continue;  // read_analysis rejects these; a hand-built row may not
            num[q] += double(p.n_queries) * p.ap;
            den[q] += double(p.n_queries);
        }
    for (std::size_t q = 0; q < K; ++q) out[q] = den[q] > 0 ? num[q] / den[q] : nan;
    return out;
}

}  // namespace detail

/// \brief A head's quintile profile from its profile rows: per quintile, the
/// n_queries-weighted mean of the finite AP_b (method §6, §9.12); equal to the
/// analysis's `plasticity.ap_quintile`.
/// \param[in] h the head (its profile; empty gives all NaN).
/// \returns five means; NaN for a quintile with no finite AP_b of positive weight.
inline std::array<double, 5> head_quintiles(head_row const& h) {
    return detail::quantile_means<5>(h, &profile_point::quintile);
}

/// \brief A head's decile profile from its profile rows (as head_quintiles).
/// \param[in] h the head.
/// \returns ten means; NaN for a decile with no finite AP_b of positive weight.
inline std::array<double, 10> head_deciles(head_row const& h) {
    return detail::quantile_means<10>(h, &profile_point::decile);
}

/// \brief A head's plasticity over a token range: the n_queries-weighted mean
/// of the finite AP_b over the buckets with lo <= tau < hi.
/// \param[in] h the head.
/// \param[in] lo the range's start (inclusive).
/// \param[in] hi the range's end (exclusive; may be +inf).
/// \returns the mean; NaN when no bucket with a finite AP_b and positive weight falls in the range.
inline double token_range_profile(head_row const& h, double lo, double hi) {
    double num = 0, den = 0;
    for (auto const& p : h.profile)
        if (std::isfinite(p.ap) && p.tau >= lo && p.tau < hi) {
            num += double(p.n_queries) * p.ap;
            den += double(p.n_queries);
        }
    return den > 0 ? num / den : nan;
}

}  // namespace study
}  // namespace qkgeom
