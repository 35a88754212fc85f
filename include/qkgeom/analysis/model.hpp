// qkgeom — the model level (method §6 "Model level", §7): everything that
// aggregates the analyses of a model's heads, in one place.
//
//   summarise_model      every head metric averaged over heads (finite values),
//                        overall and per layer; the mean quintile / decile
//                        profiles; the taxonomy counts (model_summary)
//   heatmap_total        the pair-weighted 2D plasticity heatmap of the model
//   model_pictures       the compact per-head data the pictures of method §7
//                        are drawn from (report/svg.hpp draws them), with the
//                        heatmap and the GQA groups (analysis/gqa.hpp)
//   finite_mean          the mean over heads of the finite values (the rule
//                        every model-level mean follows, also the study's)
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/analysis/gqa.hpp>

#include <Eigen/Core>

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


/// \brief One frequency band of a head's RoPE analysis, as the pictures need it
/// (the `rope_band` fields of the same names, docs/beyond-rope.md).
struct band_picture {
    bool rotary = true;                              ///< false: the unrotated coordinates
    double wavelength_lo = detail::nan;      ///< tokens
    double wavelength_hi = detail::nan;      ///< tokens
    double content_var_share = detail::nan;  ///< share of the queries' content variance
    double v_share_first_20pct = detail::nan;  ///< share of v, first-quintile query buckets
    double v_share_last_20pct = detail::nan;   ///< share of v, last-quintile query buckets
};

/// \brief What the pictures need of one head (no rows, no cells).
struct head_picture {
    head_id id;                            ///< which head
    std::vector<double> tau;               ///< τ_b of each profile bucket (method §4), ascending q_bucket
    std::vector<std::int64_t> q_bucket;    ///< the buckets' indices
    std::vector<double> ap;                ///< AP_b (method §6); NaN = no non-empty cell (a gap)
    std::vector<double> component_weight;  ///< method §4, head_component_weights.csv
    double pc0_r_q = detail::nan;          ///< method §2, PC0
    double pc0_r_k = detail::nan;          ///< method §2, PC0
    head_class taxonomy = head_class::undefined;   ///< the head's class (method §2)
    std::array<double, 10> ap_decile{};  ///< method §6 decile profile
    std::int64_t context_length = 0;     ///< L of the profile's quantiles
    /// The split of AP_drop (docs/beyond-split.md): bias part, content part,
    /// the both-removed remainder (ap_drop_bias, ap_drop_content, ap_drop_neither).
    std::array<double, 3> drop_split{detail::nan, detail::nan, detail::nan};
    double ap_drop = detail::nan;  ///< AP_drop (method §6)
    /// The RoPE frequency bands (high → low frequency, unrotated last);
    /// empty when the head's capture records no RoPE settings.
    std::vector<band_picture> rope_bands;
};

/// \brief Extract the picture data of one head.
/// \param[in] h the head's analysis.
/// \returns the compact copy (the profile, weights, PC0 correlations, class,
///          decile profile and context length; the heatmap is not included:
///          see heatmap_total::add).
/// \throws std::bad_alloc if the copies cannot be allocated.
inline head_picture picture_data(head_analysis const& h) {
    head_picture p;
    p.id = h.id;
    auto const& prof = h.plasticity.profile;
    p.tau.reserve(prof.size());
    p.q_bucket.reserve(prof.size());
    p.ap.reserve(prof.size());
    for (auto const& b : prof) {
        p.tau.push_back(b.tau);
        p.q_bucket.push_back(b.q_bucket);
        p.ap.push_back(b.ap);
    }
    auto const& w = h.householder.component_weight;
    p.component_weight.assign(w.data(), w.data() + w.size());
    p.pc0_r_q = h.pca.pc0_r_q;
    p.pc0_r_k = h.pca.pc0_r_k;
    p.taxonomy = h.pca.taxonomy;
    p.ap_decile = h.plasticity.ap_decile;
    p.context_length = h.plasticity.context_length;
    auto const& sp = h.plasticity.split;
    p.drop_split = {sp.ap_drop_bias, sp.ap_drop_content, sp.ap_drop_neither};
    p.ap_drop = h.plasticity.ap_drop;
    for (auto const& b : h.rope.bands)
        p.rope_bands.push_back({b.rotary, b.wavelength_lo, b.wavelength_hi, b.content_var_share,
                                b.v_share_first_20pct, b.v_share_last_20pct});
    return p;
}

/// \brief The 2D heatmap of a model (method §6): per (distance, offset) bin the
/// sum of the heads' PP sums and the sum of their counts, so the cell mean is
/// the pair-weighted mean over heads. Heads whose grid differs from the first
/// head's are not added; they are counted in `n_heads_other_grid`.
struct heatmap_total {
    std::vector<double> distance_edges, offset_edges;              ///< the grid (of the first head added)
    Eigen::MatrixXd sum;                                           ///< distance bins × offset bins
    Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic> count;  ///< pair counts, same shape as sum
    std::int64_t n_outside = 0;           ///< pairs outside the grid, summed over added heads
    std::int64_t n_heads = 0;             ///< heads added
    std::int64_t n_heads_other_grid = 0;  ///< heads left out (another grid)

    /// \brief Add one head's heatmap. A heatmap with fewer than two edges on an
    /// axis is ignored; one on another grid than the first is only counted in
    /// n_heads_other_grid.
    /// \param[in] h the head's heatmap.
    /// \throws std::bad_alloc when the first grid's matrices cannot be allocated.
    void add(plasticity_heatmap const& h) {
        if (h.distance_edges.size() < 2 || h.offset_edges.size() < 2) return;
        if (n_heads == 0 && n_heads_other_grid == 0) {
            distance_edges = h.distance_edges;
            offset_edges = h.offset_edges;
            sum = Eigen::MatrixXd::Zero(h.sum.rows(), h.sum.cols());
            count = Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic>::Zero(h.count.rows(), h.count.cols());
        }
        if (h.distance_edges != distance_edges || h.offset_edges != offset_edges || h.sum.rows() != sum.rows() ||
            h.sum.cols() != sum.cols() || h.count.rows() != count.rows() || h.count.cols() != count.cols()) {
            ++n_heads_other_grid;
            return;
        }
        sum += h.sum;
        count += h.count;
        n_outside += h.n_outside;
        ++n_heads;
    }
    /// \brief Mean PP of cell (distance bin i, offset bin j).
    /// \pre 0 ≤ i < sum.rows(), 0 ≤ j < sum.cols() (not checked).
    /// \returns Σ sums / Σ counts over heads; NaN when the cell is empty.
    [[nodiscard]] double mean(Eigen::Index i, Eigen::Index j) const {
        return count(i, j) > 0 ? sum(i, j) / static_cast<double>(count(i, j)) : detail::nan;
    }
};

/// \brief The picture data of one model, filled head by head.
struct model_pictures {
    std::string model;                ///< the model's name (titles, alt texts)
    std::vector<head_picture> heads;  ///< per head, in the order added
    heatmap_total heatmap;            ///< the summed heatmap
    /// The GQA group analysis of the model's heads (`gqa_groups`,
    /// docs/beyond-gqa.md): filled by `collect_pictures` when every head
    /// records its layer, q_head and k_head (`gqa_ids_recorded`); `add`
    /// leaves it alone (set it from the heads when adding them one by one).
    std::vector<gqa_metric_row> gqa;

    /// \brief An empty accumulator with no name.
    model_pictures() = default;
    /// \brief An empty accumulator.
    /// \param[in] name the model's name.
    explicit model_pictures(std::string name) : model(std::move(name)) {}

    /// \brief Add one head (its analysis can be dropped afterwards).
    /// \param[in] h the head's analysis.
    /// \throws std::bad_alloc if the copy cannot be allocated.
    void add(head_analysis const& h) {
        heads.push_back(picture_data(h));
        heatmap.add(h.plasticity.heatmap);
    }
    /// \brief Add every head of a span, in order.
    /// \param[in] hs the heads' analyses.
    /// \throws std::bad_alloc if the copies cannot be allocated.
    void add(std::span<head_analysis const> hs) {
        for (auto const& h : hs) add(h);
    }
};

/// \brief The picture data of a model from its heads.
/// \param[in] model the model's name.
/// \param[in] heads the analysed heads.
/// \returns the accumulator with every head added.
/// \throws std::bad_alloc if the copies cannot be allocated.
inline model_pictures collect_pictures(std::string model, std::span<head_analysis const> heads) {
    model_pictures m(std::move(model));
    m.heads.reserve(heads.size());
    m.add(heads);
    if (gqa_ids_recorded(heads)) m.gqa = gqa_groups(heads);
    return m;
}

}  // namespace qkgeom
