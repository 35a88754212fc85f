// qkgeom — the model level (method §6 "Model level", §7). What aggregates the
// analyses of a model's heads lives in analysis/: this header (in the
// umbrella) and analysis/model_pictures.hpp (the pictures' data).
//
//   finite_mean          the mean over heads of the finite values (the rule
//                        every model-level mean follows, also the study's)
//   summarise_model      every head metric averaged over heads (finite values),
//                        overall and per layer; the mean quintile / decile
//                        profiles; the taxonomy counts (model_summary)
//
// analysis/model_pictures.hpp: heatmap_total (the pair-weighted 2D heatmap of
// the model) and model_pictures (the compact per-head data the pictures of
// method §7 are drawn from, with the GQA groups of analysis/gqa.hpp). It is
// kept out of the umbrella: its integer Eigen matrices cost compile time that
// an analysis does not need.
#pragma once

#include <qkgeom/analysis/analyze.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief The mean of the finite values of a range (NaN and ±inf left out),
/// the rule of every model-level mean (method §6 "Model level").
/// \param[in] values the values, e.g. one metric over a model's heads.
/// \param[out] n_finite if given, set to how many values were finite.
/// \returns the mean; NaN when no value is finite.
template <class Range>
[[nodiscard]] double finite_mean(Range const& values, std::int64_t* n_finite = nullptr) {
    double sum = 0;
    std::int64_t n = 0;
    for (double const x : values)
        if (std::isfinite(x)) {
            sum += x;
            ++n;
        }
    if (n_finite != nullptr) *n_finite = n;
    return n > 0 ? sum / static_cast<double>(n) : detail::nan;
}

/// \brief Averages over a set of heads (method §6 "Model level"). Each mean is
/// over the heads where the value is finite; `n_finite` says how many.
struct head_set_summary {
    std::int64_t n_heads = 0;  ///< heads in the set
    std::array<double, head_metric_names.size()> mean{};       ///< per metric, `head_metric_names` order; NaN when no
                                                               ///< head has a finite value
    std::array<std::int64_t, head_metric_names.size()> n_finite{};  ///< per metric, heads with a finite value
    std::array<double, 5> ap_quintile{};   ///< mean quintile profile over heads (finite entries); NaN where none
    std::array<double, 10> ap_decile{};    ///< mean decile profile; NaN where none
    std::map<head_class, std::int64_t> taxonomy_counts;  ///< heads per PCA class (`undefined` included)

    /// \brief The mean of a metric by name (NaN when unknown or no finite value).
    /// \param[in] name a name of `head_metric_names`.
    /// \returns the mean; NaN for an unknown name or when no head has a finite value.
    [[nodiscard]] double operator[](std::string_view name) const noexcept {
        for (std::size_t i = 0; i < head_metric_names.size(); ++i)
            if (head_metric_names[i] == name) return mean[i];
        return detail::nan;
    }
};

/// \brief Model-level report: all heads, and per layer.
struct model_summary {
    head_set_summary all;                                ///< every head
    std::map<std::int64_t, head_set_summary> per_layer;  ///< by head_id::layer, ascending (−1 for heads without one)
};

namespace detail {

template <std::size_t N>
void mean_finite(std::array<double, N>& sum, std::array<std::int64_t, N>& cnt, std::array<double, N> const& v) {
    for (std::size_t i = 0; i < N; ++i)
        if (std::isfinite(v[i])) {
            sum[i] += v[i];
            ++cnt[i];
        }
}

template <std::size_t N>
std::array<double, N> finish_mean(std::array<double, N> const& sum, std::array<std::int64_t, N> const& cnt) {
    std::array<double, N> out{};
    for (std::size_t i = 0; i < N; ++i) out[i] = cnt[i] > 0 ? sum[i] / double(cnt[i]) : nan;
    return out;
}

template <class = void>
head_set_summary summarise(std::vector<head_analysis const*> const& heads) {
    head_set_summary s;
    s.n_heads = static_cast<std::int64_t>(heads.size());
    std::array<double, head_metric_names.size()> sum{};
    std::array<double, 5> qsum{};
    std::array<std::int64_t, 5> qcnt{};
    std::array<double, 10> dsum{};
    std::array<std::int64_t, 10> dcnt{};
    for (auto const* h : heads) {
        mean_finite(sum, s.n_finite, head_metric_values(*h));
        mean_finite(qsum, qcnt, h->plasticity.ap_quintile);
        mean_finite(dsum, dcnt, h->plasticity.ap_decile);
        ++s.taxonomy_counts[h->pca.taxonomy];
    }
    s.mean = finish_mean(sum, s.n_finite);
    s.ap_quintile = finish_mean(qsum, qcnt);
    s.ap_decile = finish_mean(dsum, dcnt);
    return s;
}

}  // namespace detail

/// \brief Aggregate the heads of one model: every head metric averaged over
/// heads (finite values only), overall and per layer, plus the averaged
/// quintile/decile profiles and the taxonomy counts.
/// \param[in] heads the analyses of the model's heads (any order).
/// \returns the summary; with no heads, `all.n_heads` is 0, every mean NaN
///          and `per_layer` empty.
/// \throws std::bad_alloc if the per-layer lists cannot be allocated.
template <class = void>
model_summary summarise_model(std::span<head_analysis const> heads) {
    model_summary m;
    std::vector<head_analysis const*> all;
    std::map<std::int64_t, std::vector<head_analysis const*>> by_layer;
    for (auto const& h : heads) {
        all.push_back(&h);
        by_layer[h.id.layer].push_back(&h);
    }
    m.all = detail::summarise(all);
    for (auto const& [layer, hs] : by_layer) m.per_layer.emplace(layer, detail::summarise(hs));
    return m;
}


}  // namespace qkgeom
