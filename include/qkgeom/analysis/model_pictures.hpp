// qkgeom — the model level's picture data (method §6 "Model level", §7): the
// pair-weighted 2D plasticity heatmap of a model (heatmap_total) and the
// compact per-head data the pictures are drawn from (model_pictures, filled
// head by head so a streaming caller can drop each head_analysis after `add`;
// report/svg.hpp draws them). The rest of the model level is
// analysis/model.hpp.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/analysis/gqa.hpp>
#include <qkgeom/analysis/model.hpp>

#include <Eigen/Core>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace qkgeom {

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
