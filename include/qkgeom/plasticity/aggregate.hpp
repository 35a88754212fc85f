// qkgeom — the aggregation of attention plasticity (method §6, §9.10–9.13):
// cells → AP_b → AP_overall, the quantile profiles and AP_drop, the
// gaussian_gap, and the heatmap grid (one grid for every head of a capture,
// so that the model picture sums them all).
// IWYU pragma: private, include <qkgeom/plasticity/attention_plasticity.hpp>
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/plasticity/options.hpp>
#include <qkgeom/plasticity/split.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom {

namespace detail {

/// What the closed-form pass of one cell does for the empirical check (method
/// §9.14): count every recorded pair (`count`: `empirical_policy::exact`, or a
/// cell within `empirical_budget`), keep the recorded pairs for the draws after
/// the pass (`keep`: sampled enumeration), or nothing (`none`: exact
/// enumeration, whose draws come from the cell's admissible pairs).
enum class emp_pass { count, keep, none };

/// Accumulates one cell.
struct cell_acc {
    double sum = 0, sumsq = 0;
    /// The empirical check: Σ 4p̂(1−p̂)n/(n−1) over the counted pairs, or
    /// (`emp_sampled`) Σ of the draws' 2·[the two queries disagree], or
    /// (`emp_paired`) Σ over the sampled pairs of PP̂ − PP (and `emp_sumsq`
    /// of its squares) with `emp_population` the pairs sampled from.
    double emp_sum = 0, emp_sumsq = 0;
    std::int64_t n = 0, emp_n = 0, emp_population = 0;
    emp_pass emp = emp_pass::count;
    bool emp_sampled = false, emp_paired = false;
    std::vector<std::array<index_t, 2>> kept;  ///< `keep`: the recorded pairs, in order
    split_acc split;  ///< the split pass (docs/beyond-split.md), when the bucket's split model is on
};

/// n + 1 equally spaced edges over [lo, hi].
template <class = void>  // instantiated on use
std::vector<double> default_edges(double lo, double hi, int bins) {
    std::vector<double> e(static_cast<std::size_t>(bins) + 1);
    for (int i = 0; i <= bins; ++i) e[static_cast<std::size_t>(i)] = lo + (hi - lo) * i / bins;
    return e;
}

template <class = void>  // instantiated on use
void check_edges(std::vector<double> const& e, std::string_view name) {
    if (e.size() < 2) fail_arg("qkgeom::attention_plasticity", std::string(name) + ": need at least 2 edges; edges", e.size());
    for (std::size_t i = 0; i < e.size(); ++i)
        if (!std::isfinite(e[i]) || (i > 0 && !(e[i] > e[i - 1])))
            fail_arg("qkgeom::attention_plasticity",
                     std::string(name) + ": edges must be finite and strictly increasing; edge " + std::to_string(i),
                     e[i]);
}

}  // namespace detail

/// \brief The default heatmap grid of a head (method §6, §9.13), the same for
/// every head of a capture whose facts carry the context length:
/// offsets τ_b − (t_i + t_j)/2 in 32 equal bins over [−L, L]; inter-key
/// distances |t_i − t_j| in 16 equal bins over [0, min(L, B)] for
/// `same_bucket` pairs of uniform (or `all`) buckets of width B (a pair never
/// spans more), else over [0, L].
/// \param facts    the capture facts (bucket scheme and width)
/// \param L        context length, ≥ 1 (facts.context_length when set)
/// \param pairs    the pair policy
/// \returns the grid (17 distance edges, 33 offset edges)
/// \throws std::invalid_argument when L < 1
[[nodiscard]] inline heatmap_grid model_heatmap_grid(capture_facts const& facts, std::int64_t L, pair_policy pairs) {
    if (L < 1) detail::fail_arg("qkgeom::model_heatmap_grid", "context length must be >= 1", L);
    auto const Ld = static_cast<double>(L);
    double span = Ld;
    if (pairs == pair_policy::same_bucket && facts.buckets && facts.buckets->scheme != bucket_scheme::log)
        span = std::min(Ld, static_cast<double>(facts.buckets->width));
    return {detail::default_edges(0, span, 16), detail::default_edges(-Ld, Ld, 32)};
}

namespace detail {

/// ⌊k·τ_b/L⌋ in integer arithmetic (method §9.12): τ_b = S/n with S integer.
template <class = void>  // instantiated on use
int quantile_of(double tau, std::int64_t n, std::int64_t L, int k) {
    auto const S = static_cast<std::int64_t>(std::llround(tau * static_cast<double>(n)));
    long double const q = static_cast<long double>(k) * static_cast<long double>(S) /
                          (static_cast<long double>(n) * static_cast<long double>(L));
    std::int64_t num = 0;
    bool const exact = S <= std::numeric_limits<std::int64_t>::max() / k && n <= std::numeric_limits<std::int64_t>::max() / L;
    if (exact) {
        num = (static_cast<std::int64_t>(k) * S) / (n * L);
    } else {
        num = static_cast<std::int64_t>(std::floor(q));
    }
    return static_cast<int>(std::clamp<std::int64_t>(num, 0, k - 1));
}

/// The empty heatmap of `grid` (the model grid for L when `grid` is empty).
template <class = void>
plasticity_heatmap make_heatmap(heatmap_grid const& grid, capture_facts const& facts, std::int64_t L,
                                       pair_policy pairs) {
    plasticity_heatmap hm;
    heatmap_grid const g = (grid.distance_edges.empty() || grid.offset_edges.empty())
                               ? model_heatmap_grid(facts, L, pairs)
                               : heatmap_grid{};
    hm.distance_edges = grid.distance_edges.empty() ? g.distance_edges : grid.distance_edges;
    hm.offset_edges = grid.offset_edges.empty() ? g.offset_edges : grid.offset_edges;
    check_edges(hm.distance_edges, "heatmap.distance_edges");
    check_edges(hm.offset_edges, "heatmap.offset_edges");
    hm.sum = Eigen::MatrixXd::Zero(index_t(hm.distance_edges.size()) - 1, index_t(hm.offset_edges.size()) - 1);
    hm.count.setZero(hm.sum.rows(), hm.sum.cols());
    return hm;
}

/// A finished cell (method §9.10, §9.16).
template <class = void>  // instantiated on use
plasticity_cell finish_cell(cell_acc const& acc, std::int64_t b, std::int64_t c, bool sampled) {
    plasticity_cell cell;
    cell.q_bucket = b;
    cell.k_bucket = c;
    cell.n_pairs = acc.n;
    if (acc.n > 0) {
        cell.plasticity = acc.sum / double(acc.n);
        if (sampled && acc.n > 1) {
            double const var = std::max(0.0, (acc.sumsq - acc.sum * acc.sum / double(acc.n)) / double(acc.n - 1));
            cell.std_error = std::sqrt(var / double(acc.n));
        }
        if (acc.emp_paired && acc.emp_n > 1) {
            // the difference estimator over m pairs drawn without replacement
            // from N: the closed form's mean plus the mean of PP̂ − PP, with
            // se = s/√m·√(1 − m/N)
            auto const m = double(acc.emp_n), big_n = double(acc.emp_population);
            double const mean = acc.emp_sum / m;
            double const var = std::max(0.0, (acc.emp_sumsq - acc.emp_sum * mean) / (m - 1));
            cell.empirical = cell.plasticity + mean;
            cell.empirical_se = std::sqrt(var / m * std::max(0.0, 1.0 - m / big_n));
        } else if (acc.emp_n > 0 && !acc.emp_paired) {
            cell.empirical = acc.emp_sum / double(acc.emp_n);
            cell.empirical_se = acc.emp_sampled ? nan : 0.0;
            // draws y ∈ {0, 2} with mean ȳ: s² = n ȳ(2 − ȳ)/(n − 1), se = s/√n
            if (acc.emp_sampled && acc.emp_n > 1)
                cell.empirical_se = std::sqrt(std::max(0.0, cell.empirical * (2.0 - cell.empirical)) /
                                              double(acc.emp_n - 1));
        }
    }
    return cell;
}

/// `same_bucket`: AP_b = the unweighted mean of the bucket's non-empty cells
/// (method §9.10–9.11); the empirical AP_b only when every non-empty cell has
/// one, with the standard error √(Σ_c se_c²)/n_c of a mean of independent cells.
template <class = void>  // instantiated on use
void same_bucket_profile(std::span<plasticity_cell const> cells, plasticity_bucket& pb) {
    double sum = 0, emp_sum = 0, se2 = 0, emp_se2 = 0;
    std::int64_t n_emp = 0;
    for (auto const& cell : cells) {
        if (cell.n_pairs == 0) continue;  // method §9.10: empty cells excluded
        ++pb.n_cells;
        pb.n_pairs += cell.n_pairs;
        sum += cell.plasticity;
        se2 += cell.std_error * cell.std_error;
        if (std::isfinite(cell.empirical)) {
            emp_sum += cell.empirical;
            emp_se2 += cell.empirical_se * cell.empirical_se;
            ++n_emp;
        }
    }
    if (pb.n_cells > 0) {
        pb.ap = sum / double(pb.n_cells);
        pb.std_error = std::sqrt(se2) / double(pb.n_cells);
        if (n_emp == pb.n_cells) {
            pb.ap_empirical = emp_sum / double(n_emp);
            pb.ap_empirical_se = std::sqrt(emp_se2) / double(n_emp);
        }
    }
}

/// `prefix`: AP_b = the mean over its pairs (one cell, method §9.11).
template <class = void>  // instantiated on use
void prefix_profile(plasticity_cell const& cell, plasticity_bucket& pb) {
    if (cell.n_pairs == 0) return;
    pb.n_cells = 1;
    pb.n_pairs = cell.n_pairs;
    pb.ap = cell.plasticity;
    pb.std_error = cell.std_error;
    pb.ap_empirical = cell.empirical;
    pb.ap_empirical_se = cell.empirical_se;
}

/// The w_b-weighted profile over k quantiles of the buckets with a finite AP_b.
template <class Member>
std::vector<double> quantile_profile(std::vector<plasticity_bucket> const& profile, int k, Member member) {
    std::vector<double> num(static_cast<std::size_t>(k), 0.0), den(static_cast<std::size_t>(k), 0.0);
    for (auto const& pb : profile)
        if (std::isfinite(pb.ap)) {
            auto const q = static_cast<std::size_t>(pb.*member);
            num[q] += double(pb.n_queries) * pb.ap;
            den[q] += double(pb.n_queries);
        }
    std::vector<double> out(static_cast<std::size_t>(k), nan);
    for (std::size_t q = 0; q < out.size(); ++q)
        if (den[q] > 0) out[q] = num[q] / den[q];
    return out;
}

/// AP_overall, the quantile profiles, AP_drop and gaussian_gap of a head
/// whose cells and profile are complete (method §6, §9.10–9.14).
template <class = void>  // instantiated on use
void aggregate(plasticity_result& res, ap_weighting weighting) {
    double wsum = 0, wap = 0;
    for (auto const& pb : res.profile)
        if (std::isfinite(pb.ap)) {
            wsum += double(pb.n_queries);
            wap += double(pb.n_queries) * pb.ap;
        }
    if (weighting == ap_weighting::query_count) {
        if (wsum > 0) res.ap_overall = wap / wsum;
    } else {
        double cs = 0;
        std::int64_t cn = 0;
        for (auto const& c : res.cells)
            if (c.n_pairs > 0) {
                cs += c.plasticity;
                ++cn;
            }
        if (cn > 0) res.ap_overall = cs / double(cn);
    }
    auto const qp = quantile_profile(res.profile, 5, &plasticity_bucket::quintile);
    auto const dp = quantile_profile(res.profile, 10, &plasticity_bucket::decile);
    std::copy(qp.begin(), qp.end(), res.ap_quintile.begin());
    std::copy(dp.begin(), dp.end(), res.ap_decile.begin());
    res.ap_first_20pct = res.ap_quintile[0];
    res.ap_last_20pct = res.ap_quintile[4];
    res.ap_drop = res.ap_first_20pct - res.ap_last_20pct;
    // gaussian_gap and its standard error (the delta method with each |·|'s
    // sign fixed: the buckets' empirical values are independent, AP_b exact)
    double gap = 0, gap_se2 = 0;
    std::int64_t ng = 0;
    for (auto const& pb : res.profile)
        if (std::isfinite(pb.ap) && std::isfinite(pb.ap_empirical)) {
            gap += std::abs(pb.ap - pb.ap_empirical);
            gap_se2 += pb.ap_empirical_se * pb.ap_empirical_se;
            ++ng;
        }
    if (ng > 0) {
        res.gaussian_gap = gap / double(ng);
        res.gaussian_gap_se = std::sqrt(gap_se2) / double(ng);
    }
}

/// The AP_drop of a profile whose AP_b are `ap` (one per `profile` entry),
/// aggregated exactly as `aggregate` does: the w_b-weighted quintile means
/// of the buckets with a finite AP_b, first minus last.
template <class = void>  // instantiated on use
double split_drop(std::vector<plasticity_bucket> profile, std::vector<split_bucket> const& sp,
                         double split_bucket::*ap) {
    for (std::size_t i = 0; i < profile.size(); ++i) profile[i].ap = sp[i].*ap;
    auto const q = quantile_profile(profile, 5, &plasticity_bucket::quintile);
    return q[0] - q[4];
}

/// The counterfactual AP_drops and the Shapley split of `res.split`
/// (docs/beyond-split.md), after `aggregate`. `on`: the options asked for it;
/// `frozen`: a first-quintile reference exists (`n_ref` buckets).
template <class = void>  // instantiated on use
void aggregate_split(plasticity_result& res, bool on, bool frozen, std::int64_t n_ref) {
    profile_split& sp = res.split;
    sp.n_frozen_buckets = n_ref;
    if (!on) {
        sp.status = split_status::disabled;
        return;
    }
    sp.status = frozen ? split_status::computed : split_status::no_reference;
    double const D = res.ap_drop;
    sp.ap_drop_no_drift = split_drop(res.profile, sp.profile, &split_bucket::ap_no_drift);
    if (!frozen) return;
    sp.ap_drop_frozen_content = split_drop(res.profile, sp.profile, &split_bucket::ap_frozen_content);
    sp.ap_drop_neither = split_drop(res.profile, sp.profile, &split_bucket::ap_neither);
    sp.ap_drop_bias = 0.5 * ((D - sp.ap_drop_no_drift) + (sp.ap_drop_frozen_content - sp.ap_drop_neither));
    sp.ap_drop_content = 0.5 * ((D - sp.ap_drop_frozen_content) + (sp.ap_drop_no_drift - sp.ap_drop_neither));
}

}  // namespace detail

}  // namespace qkgeom
