// qkgeom — attention plasticity of a head (method §5–6; thesis §4.4): does
// position decide which key wins? The entry points read a head's rows
// (`head_capture`, <qkgeom/core/head.hpp>), validate them, and evaluate the
// Gaussian closed form per key pair and query bucket, its aggregation into
// cells, profiles, AP_drop, quantile profiles and the 2D heatmap, and the
// empirical cross-check against the real queries. The parts live in
// include/qkgeom/plasticity/ (see plasticity/options.hpp for the map).
#pragma once

#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/tensor.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/plasticity/aggregate.hpp>   // IWYU pragma: export
#include <qkgeom/plasticity/engine.hpp>      // IWYU pragma: export
#include <qkgeom/plasticity/options.hpp>     // IWYU pragma: export
#include <qkgeom/plasticity/pair_plan.hpp>   // IWYU pragma: export
#include <qkgeom/stats/moments.hpp>
#if QKGEOM_COMPILED_BODIES  // (with compiled parts the engine is src/qkgeom_compiled.cpp's)
#include <qkgeom/plasticity/evaluate.hpp>    // IWYU pragma: export
#endif

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom {

namespace detail {

/// Checks the options of attention_plasticity.
inline void check_plasticity_options(std::string_view fn, plasticity_options const& opt) {
    if (opt.samples_per_cell < 1) fail_arg(fn, "samples_per_cell must be >= 1", opt.samples_per_cell);
    if (opt.dense_min_keys < 2) fail_arg(fn, "dense_min_keys must be >= 2", opt.dense_min_keys);
    if (opt.tile_keys < 1) fail_arg(fn, "tile_keys must be >= 1", opt.tile_keys);
    if (opt.max_exact_pairs < 0) fail_arg(fn, "max_exact_pairs must be >= 0", opt.max_exact_pairs);
    if (opt.empirical_budget < 4)  // two draws of (pair, two queries): a mean and its standard error
        fail_arg(fn, "empirical_budget must be >= 4", opt.empirical_budget);
    if (opt.empirical_max_exact < 0) fail_arg(fn, "empirical_max_exact must be >= 0", opt.empirical_max_exact);
    if (opt.empirical_pairs < 0) fail_arg(fn, "empirical_pairs must be >= 0", opt.empirical_pairs);
    if (opt.empirical_check != empirical_policy::sampled && opt.empirical_check != empirical_policy::exact)
        fail_arg(fn, "empirical_check is not a known empirical_policy", static_cast<int>(opt.empirical_check));
}

/// The key rows against a head's model: d ≥ 1 and the keys' width; unless
/// `checked`, their values (finite) and annotations (against the facts);
/// shapes always. Shared by the plasticity and the rank stability.
/// \returns d.
template <RowMatrix KM>
index_t check_keys_for_model(std::string_view fn, householder_result const& model, token_rows<KM> const& keys,
                             capture_facts const& facts, bool checked) {
    index_t const d = model.beta.size();
    if (d < 1) fail_arg(fn, "the Householder model is empty (d)", d);
    auto const kr = as_matrix(keys.vectors);
    if (kr.cols() != d)
        fail_arg(fn, "keys: head dimension differs from the queries' model: model has d = " + std::to_string(d) +
                         ", keys have",
                 kr.cols());
    auto const kp = as_indices(keys.position);
    check_batch(std::string(fn) + ": keys", d, kr, kp, static_cast<decltype(kp) const*>(nullptr), !checked);
    if (!checked) check_annotations(fn, "keys", kr.rows(), keys.position, keys.bucket, keys.example_id, true, facts);
    return d;
}

/// The keys of a head, widened and rotated (k̃ = H k, H never formed
/// densely). Unless `checked` (the caller validated values and annotations,
/// e.g. analyze_head), the finite values and the annotations against the
/// facts are validated here; shapes always are. `with_range`: fold the
/// f32 range of the rows into the read (the empirical check needs it).
template <RowMatrix KM>
key_store read_keys(std::string_view fn, householder_result const& model, token_rows<KM> const& keys,
                    capture_facts const& facts, bool checked, bool with_range) {
    index_t const d = check_keys_for_model(fn, model, keys, facts, checked);
    auto const kr = as_matrix(keys.vectors);
    key_store ks;
    ks.d = d;
    ks.position = keys.position.values();
    ks.bucket = keys.bucket.values();
    ks.example = keys.example_id.values();
    ks.orig.resize(kr.rows(), d);
    for (index_t i = 0; i < kr.rows(); ++i) {
        kr.read_row(i, ks.orig.row(i).data());
        if (with_range) ks.range.add(ks.orig.row(i).data(), d);  // the row is in L1
    }
    ks.rot = ks.orig;
    model.H.apply_rows(ks.rot);
    return ks;
}

/// The query rows of a head by bucket (original basis), for the empirical
/// cross-check; none when `queries` has no rows. Validation as read_keys.
template <RowMatrix QM>
query_store read_queries(std::string_view fn, index_t d, token_rows<QM> const& queries, capture_facts const& facts,
                         bool checked) {
    query_store qs;
    auto const qr = as_matrix(queries.vectors);
    if (qr.rows() == 0 && queries.position.empty()) return qs;
    if (qr.cols() != d)
        fail_arg(fn, "queries: head dimension differs from the keys' (" + std::to_string(d) + "); queries have",
                 qr.cols());
    auto const qp = as_indices(queries.position);
    check_batch(std::string(fn) + ": queries", d, qr, qp, static_cast<decltype(qp) const*>(nullptr), !checked);
    if (!checked)
        check_annotations(fn, "queries", qr.rows(), queries.position, queries.bucket, queries.example_id, false,
                          facts);
    std::map<std::int64_t, std::vector<index_t>> rows_of;
    for (index_t i = 0; i < qr.rows(); ++i) {
        rows_of[queries.bucket[i]].push_back(i);
        qs.max_position = std::max(qs.max_position, queries.position[i]);
    }
    for (auto const& [b, rows] : rows_of) {
        query_rows m(static_cast<index_t>(rows.size()), d);
        for (std::size_t r = 0; r < rows.size(); ++r) {
            qr.read_row(rows[r], m.row(static_cast<index_t>(r)).data());
            qs.range.add(m.row(static_cast<index_t>(r)).data(), d);
        }
        qs.by_bucket.emplace(b, std::move(m));
    }
    return qs;
}

/// `attention_plasticity` of a head's keys and (when `queries` is not null)
/// its queries. `checked`: the caller has validated the facts, the row
/// values and the annotations (analyze_head); only shapes are checked again.
/// `id`: the head, whose identity seeds its sampling stream (method §6).
template <RowMatrix QM, RowMatrix KM>
plasticity_result plasticity_of(householder_result const& model, token_rows<QM> const* queries,
                                token_rows<KM> const& keys, capture_facts const& facts, plasticity_options const& opt,
                                bool checked, head_id const& id) {
    constexpr std::string_view fn = "qkgeom::attention_plasticity";
    check_plasticity_options(fn, opt);
    if (!checked) check_facts(fn, facts);
    bool const with_queries = queries != nullptr && !queries->position.empty();
    key_store const ks = read_keys(fn, model, keys, facts, checked, with_queries);
    query_store const qs = queries != nullptr ? read_queries(fn, ks.d, *queries, facts, checked) : query_store{};
    plasticity_options head_opt = opt;
    head_opt.seed = head_stream_seed(opt.seed, id);  // independent draws per head (method §6)
    return evaluate_plasticity(model, ks, qs, facts, head_opt);
}

}  // namespace detail

/// \brief Attention plasticity of one head (method §5–6) with the empirical
/// cross-check (method §9.14) from its query rows.
///
/// \param[in] model  `householder(...)` of the head's queries: the per-bucket
///                   Gaussian models and the reflector H
/// \param[in] head   the head's rows and capture facts. Keys need example ids.
///                   The facts' bucket scheme (when set) validates every bucket
///                   against its position and converts the sliding window;
///                   the facts' context length is L (0: max position + 1).
///                   A head with no query rows gets no cross-check
///                   (`empirical`, `ap_empirical`, `gaussian_gap` NaN).
/// \param[in] opt    pair policy, weighting, enumeration, heatmap grid, kernels
/// \returns the cells, the profile, the head metrics and the heatmap
/// \pre `model` was computed from these queries (same head dimension d)
/// \throws std::invalid_argument on an empty model, a head dimension that
///         differs between model, keys and queries, no key rows, a length that
///         differs from the rows, NaN/Inf in a row, a negative position or
///         bucket, a bucket that does not match its position under the facts'
///         scheme, a sliding window without a bucket scheme, or bad options
///         (samples_per_cell < 1, dense_min_keys < 2, tile_keys < 1,
///         max_exact_pairs < 0, empirical_budget < 4, empirical_max_exact
///         < 0, empirical_pairs < 0, heatmap edges not finite and
///         increasing).
template <RowMatrix QM, RowMatrix KM>
plasticity_result attention_plasticity(householder_result const& model, head_capture<QM, KM> const& head,
                                       plasticity_options const& opt = {}) {
    return detail::plasticity_of(model, &head.queries, head.keys, head.facts, opt, false, head.id);
}

/// \brief Attention plasticity from the key rows only (no empirical
/// cross-check: `empirical`, `ap_empirical` and `gaussian_gap` stay NaN), e.g.
/// when the queries were reduced to moments.
///
/// \param[in] model  `householder(...)` of the head's queries
/// \param[in] keys   the key rows with positions, buckets and example ids
/// \param[in] facts  the capture facts (bucket scheme, window, context length)
/// \param[in] id     the head's identity: with the options' seed it selects
///                   the head's sampling stream (method §6), so heads that
///                   share key positions draw independent pairs (required:
///                   a shared default would correlate their sampling errors)
/// \param[in] opt    options as for the overload with queries
/// \returns as for the overload with queries, without the empirical values
/// \throws std::invalid_argument as the overload with queries, for the keys
template <RowMatrix KM>
plasticity_result attention_plasticity(householder_result const& model, token_rows<KM> const& keys,
                                       capture_facts const& facts, head_id const& id,
                                       plasticity_options const& opt = {}) {
    return detail::plasticity_of(model, static_cast<token_rows<row_matrix> const*>(nullptr), keys, facts, opt, false,
                                 id);
}

}  // namespace qkgeom
