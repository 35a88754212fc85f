// qkgeom — GQA groups (docs/beyond-gqa.md): do the query heads that share a
// key head (same layer and k_head) have more alike plasticity profiles,
// AP_drop and bias_strength than heads of different groups? One-way analysis
// of variance per layer (groups = key heads), and per model with the sums of
// squares and degrees of freedom pooled over the layers (groups nested in
// layers). A closed form over the analysed heads: no rows are read.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/stats/detail.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief The metrics compared within and between GQA groups, in row order:
/// the quintile profile (the 5-vector `plasticity.ap_quintile`, squared
/// Euclidean distances), `plasticity.ap_drop`, `rotation.bias_strength`.
inline constexpr std::array<std::string_view, 3> gqa_metric_names{"profile", "ap_drop", "bias_strength"};

/// \brief One (layer, metric) row of the GQA group analysis (one row of
/// gqa_groups.csv; docs/beyond-gqa.md).
///
/// With x_gh the value of head h in group g (a key head), n_g its heads,
/// N = Σ n_g, G the groups and x̄_g, x̄ the group and layer means:
/// SS_within = Σ_g Σ_h ‖x_gh − x̄_g‖², SS_between = Σ_g n_g ‖x̄_g − x̄‖²
/// (‖·‖² the square for scalars, the squared Euclidean norm for the profile),
/// df_within = N − G, df_between = G − 1. The model row (layer −1) sums
/// SS and df over the layers.
struct gqa_metric_row {
    std::int64_t layer = -1;          ///< the layer; −1 = the model (pooled over layers)
    std::string metric;               ///< a `gqa_metric_names` entry
    std::int64_t n_groups = 0;        ///< G: key heads with at least one included head (model: Σ over layers)
    std::int64_t n_shared_groups = 0; ///< groups with at least 2 included heads
    std::int64_t n_heads = 0;         ///< N: included heads (finite value)
    std::int64_t n_excluded = 0;      ///< heads left out: a non-finite value (profile: any non-finite quintile)
    std::int64_t df_within = 0;       ///< N − G (model: Σ over layers)
    std::int64_t df_between = 0;      ///< G − 1 (model: Σ over layers)
    double within_var = detail::nan;  ///< MS_within = SS_within / df_within; NaN when df_within = 0
    double between_var = detail::nan; ///< MS_between = SS_between / df_between; NaN when df_between = 0
    /// MS_within / MS_between (+inf when MS_between = 0 < MS_within); NaN
    /// unless status is ok.
    double ratio = detail::nan;
    /// P(F(df_between, df_within) ≥ MS_between / MS_within): the one-way
    /// ANOVA F-test of "no group effect" (normal, equal-variance heads);
    /// NaN for the profile (no exact null for correlated quintiles) and
    /// unless status is ok.
    double p_value = detail::nan;
    /// "ok"; "no_heads" (no included head); "too_few_groups" (df_between =
    /// 0: fewer than 2 groups, e.g. MQA); "no_shared_key_heads" (df_within =
    /// 0: every group has one head, e.g. MHA); "no_spread" (both sums of
    /// squares numerically zero).
    std::string status = "no_heads";
};

namespace detail {

/// Sums of one (layer or model, metric) analysis of variance.
struct gqa_sums {
    double ss_within = 0.0, ss_between = 0.0, scale = 0.0;  // scale: Σ‖x‖², for the numerical-zero test
    std::int64_t n_groups = 0, n_shared = 0, n_heads = 0, n_excluded = 0, df_within = 0, df_between = 0;
    void add(gqa_sums const& o) {
        ss_within += o.ss_within;
        ss_between += o.ss_between;
        scale += o.scale;
        n_groups += o.n_groups;
        n_shared += o.n_shared;
        n_heads += o.n_heads;
        n_excluded += o.n_excluded;
        df_within += o.df_within;
        df_between += o.df_between;
    }
};

/// The value of metric m (index into gqa_metric_names) of a head, in v[0..dim);
/// returns dim (5 for the profile, else 1), or 0 when a value is non-finite.
inline std::size_t gqa_value(head_analysis const& h, std::size_t m, std::array<double, 5>& v) {
    std::size_t dim = 1;
    if (m == 0) {
        v = h.plasticity.ap_quintile;
        dim = 5;
    } else {
        v[0] = m == 1 ? h.plasticity.ap_drop : h.rotation.bias_strength;
    }
    for (std::size_t i = 0; i < dim; ++i)
        if (!std::isfinite(v[i])) return 0;
    return dim;
}

/// Continued fraction of the incomplete beta (modified Lentz; Numerical
/// Recipes §6.4), for x < (a + 1)/(a + b + 2).
inline double beta_continued_fraction(double a, double b, double x) {
    constexpr double tiny = 1e-300, eps = 1e-16;
    double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0);
    if (std::abs(d) < tiny) d = tiny;
    d = 1.0 / d;
    double f = d;
    for (int m = 1; m <= 100000; ++m) {
        double const md = m, m2 = 2.0 * md;
        for (int half = 0; half < 2; ++half) {
            double const num = half == 0 ? md * (b - md) * x / ((a + m2 - 1.0) * (a + m2))
                                         : -(a + md) * (a + b + md) * x / ((a + m2) * (a + m2 + 1.0));
            d = 1.0 + num * d;
            if (std::abs(d) < tiny) d = tiny;
            c = 1.0 + num / c;
            if (std::abs(c) < tiny) c = tiny;
            d = 1.0 / d;
            f *= d * c;
            if (half == 1 && std::abs(d * c - 1.0) < eps) return f;
        }
    }
    return f;  // not reached for the degrees of freedom of any real model
}

/// The regularised incomplete beta I_x(a, b), a, b > 0, x in [0, 1].
inline double regularized_beta(double a, double b, double x) {
    if (!(a > 0 && b > 0 && x >= 0 && x <= 1)) return nan;
    if (x == 0 || x == 1) return x;
    double const front =
        std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
    if (x < (a + 1.0) / (a + b + 2.0)) return front * beta_continued_fraction(a, b, x) / a;
    return 1.0 - front * beta_continued_fraction(b, a, 1.0 - x) / b;
}

/// Upper tail P(F(d1, d2) ≥ f) of the F distribution (f ≥ 0, d1, d2 > 0):
/// I_{d2/(d2 + d1 f)}(d2/2, d1/2); 1 at f = 0, 0 at f = +inf.
inline double f_upper_tail(double f, double d1, double d2) {
    if (std::isnan(f) || !(d1 > 0 && d2 > 0)) return nan;
    if (f <= 0) return 1.0;
    if (std::isinf(f)) return 0.0;
    return regularized_beta(0.5 * d2, 0.5 * d1, d2 / (d2 + d1 * f));
}

/// The analysis-of-variance sums of metric m over the heads of one layer
/// (`heads` sorted by k_head).
template <class = void>
gqa_sums gqa_layer_sums(std::vector<head_analysis const*> const& heads, std::size_t m) {
    gqa_sums s;
    std::vector<std::array<double, 5>> vals;
    std::vector<std::int64_t> group;  // k_head of each included head (ascending)
    std::size_t dim = m == 0 ? 5 : 1;
    for (auto const* h : heads) {
        std::array<double, 5> v{};
        if (gqa_value(*h, m, v) == 0) {
            ++s.n_excluded;
            continue;
        }
        vals.push_back(v);
        group.push_back(h->id.k_head);
    }
    std::size_t const n = vals.size();
    std::array<double, 5> grand{};
    for (auto const& v : vals)
        for (std::size_t i = 0; i < dim; ++i) grand[i] += v[i] / static_cast<double>(n);
    for (std::size_t lo = 0; lo < n;) {  // one group: [lo, hi)
        std::size_t hi = lo;
        while (hi < n && group[hi] == group[lo]) ++hi;
        double const ng = static_cast<double>(hi - lo);
        std::array<double, 5> mean{};
        for (std::size_t r = lo; r < hi; ++r)
            for (std::size_t i = 0; i < dim; ++i) mean[i] += vals[r][i] / ng;
        for (std::size_t i = 0; i < dim; ++i) {
            s.ss_between += ng * (mean[i] - grand[i]) * (mean[i] - grand[i]);
            for (std::size_t r = lo; r < hi; ++r) {
                s.ss_within += (vals[r][i] - mean[i]) * (vals[r][i] - mean[i]);
                s.scale += vals[r][i] * vals[r][i];
            }
        }
        ++s.n_groups;
        if (hi - lo >= 2) ++s.n_shared;
        lo = hi;
    }
    s.n_heads = static_cast<std::int64_t>(n);
    s.df_within = s.n_heads - s.n_groups;
    s.df_between = s.n_groups > 0 ? s.n_groups - 1 : 0;
    return s;
}

/// The row of sums `s` (layer or model) for metric m.
template <class = void>
gqa_metric_row gqa_row(std::int64_t layer, std::size_t m, gqa_sums const& s) {
    gqa_metric_row r;
    r.layer = layer;
    r.metric = std::string(gqa_metric_names[m]);
    r.n_groups = s.n_groups;
    r.n_shared_groups = s.n_shared;
    r.n_heads = s.n_heads;
    r.n_excluded = s.n_excluded;
    r.df_within = s.df_within;
    r.df_between = s.df_between;
    double const ssw = snap_zero(s.ss_within, s.scale), ssb = snap_zero(s.ss_between, s.scale);
    if (s.df_within > 0) r.within_var = ssw / static_cast<double>(s.df_within);
    if (s.df_between > 0) r.between_var = ssb / static_cast<double>(s.df_between);
    if (s.n_heads == 0) r.status = "no_heads";
    else if (s.df_between == 0) r.status = "too_few_groups";
    else if (s.df_within == 0) r.status = "no_shared_key_heads";
    else if (ssw == 0 && ssb == 0) r.status = "no_spread";
    else r.status = "ok";
    if (r.status != "ok") return r;
    r.ratio = r.between_var == 0 ? std::numeric_limits<double>::infinity() : r.within_var / r.between_var;
    if (m != 0)
        r.p_value = f_upper_tail(r.within_var == 0 ? std::numeric_limits<double>::infinity() : 1.0 / r.ratio,
                                 static_cast<double>(s.df_between), static_cast<double>(s.df_within));
    return r;
}

/// The heads sorted by (layer, k_head, q_head), after checking every id.
template <class = void>
std::vector<head_analysis const*> gqa_sorted(std::span<head_analysis const* const> heads) {
    constexpr std::string_view fn = "qkgeom::gqa_groups";
    std::vector<head_analysis const*> p;
    p.reserve(heads.size());
    std::set<std::pair<std::int64_t, std::int64_t>> seen;
    for (std::size_t i = 0; i < heads.size(); ++i) {
        head_id const& id = heads[i]->id;
        std::string const f = "heads[" + std::to_string(i) + "].id.";
        if (id.layer < 0) fail_arg(fn, f + "layer: not recorded (< 0); GQA groups need the layer", id.layer);
        if (id.k_head < 0) fail_arg(fn, f + "k_head: not recorded (< 0); GQA groups need the key head", id.k_head);
        if (id.q_head < 0) fail_arg(fn, f + "q_head: not recorded (< 0); GQA groups need the query head", id.q_head);
        if (!seen.emplace(id.layer, id.q_head).second)
            fail_arg(fn, f + "q_head: a second head with the same (layer, q_head) in layer " +
                             std::to_string(id.layer) + "; q_head", id.q_head);
        p.push_back(heads[i]);
    }
    std::sort(p.begin(), p.end(), [](auto const* a, auto const* b) {
        return std::tuple(a->id.layer, a->id.k_head, a->id.q_head) <
               std::tuple(b->id.layer, b->id.k_head, b->id.q_head);
    });
    return p;
}

}  // namespace detail

/// \brief GQA groups (docs/beyond-gqa.md): for each layer and metric
/// (`gqa_metric_names`: the quintile profile, AP_drop, bias_strength), the
/// within-group and between-group mean squares of the one-way analysis of
/// variance whose groups are the key heads (query heads with the same layer
/// and k_head), their ratio MS_within / MS_between and, for the scalar
/// metrics, the F-test p-value; then the model rows (layer −1), which pool
/// the sums of squares and degrees of freedom of the layers (groups nested
/// in layers: layer-to-layer differences do not count as between-group).
///
/// Independent heads give MS_within and MS_between of the same expectation
/// (ratio ≈ 1; exactly E ratio = df_b/(df_b − 2) for normal heads, df_b > 2);
/// heads that share their key head's drift give ratio ≪ 1.
///
/// \param[in] heads the analysed heads of a model, in any order. A head
///            whose metric value is non-finite (profile: any quintile) is
///            left out of that metric and counted in n_excluded.
/// \returns for each layer ascending the 3 metric rows in
///          `gqa_metric_names` order, then the 3 model rows (always present;
///          status "no_heads" when `heads` is empty). Degenerate layers
///          (one key head, one query head per key head, no spread) have NaN
///          fields and a status (gqa_metric_row::status).
/// \throws std::invalid_argument naming `heads[i].id.<field>` when a head's
///         layer, k_head or q_head is not recorded (< 0), or two heads have
///         the same (layer, q_head).
/// \throws std::bad_alloc if the work arrays cannot be allocated.
template <class = void>
std::vector<gqa_metric_row> gqa_groups(std::span<head_analysis const* const> heads) {
    auto const sorted = detail::gqa_sorted(heads);
    std::vector<gqa_metric_row> rows;
    std::array<detail::gqa_sums, gqa_metric_names.size()> model{};
    for (std::size_t lo = 0; lo < sorted.size();) {  // one layer: [lo, hi)
        std::size_t hi = lo;
        while (hi < sorted.size() && sorted[hi]->id.layer == sorted[lo]->id.layer) ++hi;
        std::vector<head_analysis const*> const layer(sorted.begin() + static_cast<std::ptrdiff_t>(lo),
                                                      sorted.begin() + static_cast<std::ptrdiff_t>(hi));
        for (std::size_t m = 0; m < gqa_metric_names.size(); ++m) {
            detail::gqa_sums const s = detail::gqa_layer_sums(layer, m);
            rows.push_back(detail::gqa_row(sorted[lo]->id.layer, m, s));
            model[m].add(s);
        }
        lo = hi;
    }
    for (std::size_t m = 0; m < gqa_metric_names.size(); ++m) rows.push_back(detail::gqa_row(-1, m, model[m]));
    return rows;
}

/// \brief Whether every head records the identity the GQA groups need
/// (layer, q_head and k_head ≥ 0): the reports write gqa_groups.csv and draw
/// gqa_groups.svg from `gqa_groups` only then.
/// \param[in] heads the analysed heads.
/// \returns true when no head has a negative layer, q_head or k_head.
inline bool gqa_ids_recorded(std::span<head_analysis const> heads) noexcept {
    return std::all_of(heads.begin(), heads.end(), [](head_analysis const& h) {
        return h.id.layer >= 0 && h.id.q_head >= 0 && h.id.k_head >= 0;
    });
}

/// \brief GQA groups of heads held by value (as `gqa_groups` over pointers).
/// \param[in] heads the analysed heads of a model, in any order.
/// \returns as the pointer overload.
/// \throws as the pointer overload (`heads[i]` indexes this span).
template <class = void>
std::vector<gqa_metric_row> gqa_groups(std::span<head_analysis const> heads) {
    std::vector<head_analysis const*> p;
    p.reserve(heads.size());
    for (auto const& h : heads) p.push_back(&h);
    return gqa_groups(std::span<head_analysis const* const>(p));
}

}  // namespace qkgeom
