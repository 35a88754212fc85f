// qkgeom — the names of the analysis policies, as the `qkgeom` program's
// options, the reports' run record and the Python package spell them
// (`--sign dominant`, `Options(sign="dominant")`). One table per policy
// enumeration; the program and the Python module both read these tables.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/beyond/ranks.hpp>
#include <qkgeom/beyond/rope_bands.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/geometry/householder.hpp>
#include <qkgeom/geometry/pca.hpp>
#include <qkgeom/geometry/rotation.hpp>
#include <qkgeom/plasticity/options.hpp>

#include <array>
#include <charconv>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkgeom {

/// \brief The name table of a policy enumeration: `choices`, an array of
/// (name, value) pairs sorted by name, one per value of the enumeration.
/// Defined for sign_policy, separation_policy, semantic_model, pair_policy,
/// ap_weighting, enumeration_policy and rank_key_policy; undefined for other types.
template <class E>
struct policy_table;

template <>
struct policy_table<sign_policy> {
    static constexpr std::array<std::pair<std::string_view, sign_policy>, 2> choices{
        {{"dominant", sign_policy::dominant}, {"query_anchor", sign_policy::query_anchor}}};
};
template <>
struct policy_table<separation_policy> {
    static constexpr std::array<std::pair<std::string_view, separation_policy>, 2> choices{
        {{"centroid", separation_policy::centroid}, {"max_separation", separation_policy::max_separation}}};
};
template <>
struct policy_table<semantic_model> {
    static constexpr std::array<std::pair<std::string_view, semantic_model>, 3> choices{
        {{"diag", semantic_model::diag}, {"full", semantic_model::full}, {"global_linear", semantic_model::global_linear}}};
};
template <>
struct policy_table<pair_policy> {
    static constexpr std::array<std::pair<std::string_view, pair_policy>, 2> choices{
        {{"prefix", pair_policy::prefix}, {"same_bucket", pair_policy::same_bucket}}};
};
template <>
struct policy_table<ap_weighting> {
    static constexpr std::array<std::pair<std::string_view, ap_weighting>, 2> choices{
        {{"cell_mean", ap_weighting::cell_mean}, {"query_count", ap_weighting::query_count}}};
};
template <>
struct policy_table<rank_key_policy> {
    static constexpr std::array<std::pair<std::string_view, rank_key_policy>, 2> choices{
        {{"prefix", rank_key_policy::prefix}, {"same_bucket", rank_key_policy::same_bucket}}};
};
template <>
struct policy_table<enumeration_policy> {
    static constexpr std::array<std::pair<std::string_view, enumeration_policy>, 3> choices{
        {{"auto", enumeration_policy::automatic},
         {"exact", enumeration_policy::exact},
         {"sampled", enumeration_policy::sampled}}};
};
template <>
struct policy_table<empirical_policy> {
    static constexpr std::array<std::pair<std::string_view, empirical_policy>, 2> choices{
        {{"exact", empirical_policy::exact}, {"sampled", empirical_policy::sampled}}};
};

/// \brief A policy enumeration with a name table (policy_table<E>).
template <class E>
concept named_policy = requires { policy_table<E>::choices; };

/// \brief The (name, value) pairs of a policy, sorted by name.
/// \tparam E a named_policy.
/// \returns a view of the static table.
template <named_policy E>
[[nodiscard]] constexpr std::span<std::pair<std::string_view, E> const> policy_choices() noexcept {
    return policy_table<E>::choices;
}

/// \brief The value a name spells.
/// \tparam E a named_policy.
/// \param[in] name the name, as the program's option takes it (exact, case-sensitive).
/// \returns the value; none for a name outside the table.
template <named_policy E>
[[nodiscard]] constexpr std::optional<E> policy_from_name(std::string_view name) noexcept {
    for (auto const& [n, e] : policy_table<E>::choices)
        if (n == name) return e;
    return std::nullopt;
}

/// \brief The name of a policy value.
/// \tparam E a named_policy.
/// \param[in] e the value.
/// \returns a static string; "?" for a value outside the enumeration.
template <named_policy E>
[[nodiscard]] constexpr std::string_view policy_name(E e) noexcept {
    for (auto const& [n, v] : policy_table<E>::choices)
        if (v == e) return n;
    return "?";
}

/// \brief The names of a policy for a message: "a | b | c", sorted by name.
/// \tparam E a named_policy.
/// \returns the text.
/// \throws std::bad_alloc if the text cannot be allocated.
template <named_policy E>
[[nodiscard]] std::string policy_choices_text() {
    std::string all;
    for (auto const& [n, e] : policy_table<E>::choices) all += (all.empty() ? "" : " | ") + std::string(n);
    return all;
}

/// \brief The value a name spells, or an error listing the choices.
/// \tparam E a named_policy.
/// \param[in] name the name.
/// \param[in] what what is being set, first in the message (e.g. "--sign", "Options.sign").
/// \returns the value.
/// \throws std::invalid_argument "WHAT: 'NAME' is not one of a | b" (NAME
///         escaped as escape_text does) for a name outside the table.
template <named_policy E>
[[nodiscard]] E parse_policy(std::string_view name, std::string_view what) {
    if (auto const e = policy_from_name<E>(name)) return *e;
    throw std::invalid_argument(std::string(what) + ": '" + escape_text(name) + "' is not one of " +
                                policy_choices_text<E>());
}

/// \brief Every analysis option in effect, as one line of `name=value`
/// words: the run record of the program's reports, and the part of a study's
/// cache key that says how a run was analysed (docs/study.md#caching). Two
/// option sets that analyse differently give different texts.
/// \param[in] o the options.
/// \returns "components=… sign=… low=… high=… separation=… semantic=…
///          diagnostics=… ks_alpha=… pairs=… weighting=… enumeration=…
///          max_exact_pairs=… samples=… seed=… split=… ranks=… rank_keys=…
///          rank_sets=… rank_points=… rank_shifts=… rank_draw=… rank_seed=…
///          rope_bands=… rope_min_span=… rope_min_energy_z=… rope_consistent=…
///          rope_inconsistent=… rope_min_rows=… rope_max_mirror=…", then the
///          heatmap edges when not the default grid (numbers in shortest
///          round-trip form). Options that change speed only (dense_min_keys,
///          tile_keys, empirical) or only what is kept (rank_options::keep_sets)
///          are not part of it.
/// \throws std::bad_alloc if the text cannot be allocated.
[[nodiscard]] inline std::string options_text(analysis_options const& o) {
    auto num = [](double x) {
        std::array<char, 32> b{};
        auto const r = std::to_chars(b.data(), b.data() + b.size(), x);
        return std::string(b.data(), r.ptr);
    };
    auto name = [](auto e) { return std::string(policy_name(e)); };
    auto edges = [&](char const* key, std::vector<double> const& e) {  // only when not the default grid
        std::string t;
        for (double x : e) t += (t.empty() ? key : ",") + num(x);
        return t;
    };
    return "components=" + std::to_string(o.pca.n_components) + " sign=" + name(o.pca.sign) +
           " low=" + num(o.pca.thresholds.low) + " high=" + num(o.pca.thresholds.high) +
           " separation=" + name(o.rotation.separation) + " semantic=" + name(o.householder.model) +
           " diagnostics=" + (o.diagnostics ? "on" : "off") + " ks_alpha=" + num(o.ks_alpha) +
           " pairs=" + name(o.plasticity.pairs) + " weighting=" + name(o.plasticity.weighting) +
           " enumeration=" + name(o.plasticity.enumeration) +
           " max_exact_pairs=" + std::to_string(o.plasticity.max_exact_pairs) +
           " samples=" + std::to_string(o.plasticity.samples_per_cell) + " seed=" + std::to_string(o.plasticity.seed) +
           " empirical=" + name(o.plasticity.empirical_check) +
           " empirical_budget=" + std::to_string(o.plasticity.empirical_budget) +
           " empirical_max_exact=" + std::to_string(o.plasticity.empirical_max_exact) +
           " empirical_pairs=" + std::to_string(o.plasticity.empirical_pairs) +
           " split=" + (o.plasticity.split_profile ? "on" : "off") + " ranks=" + (o.ranks_on ? "on" : "off") +
           " rank_keys=" + std::to_string(o.ranks.keys_per_set) + " rank_sets=" + std::to_string(o.ranks.sets_per_bucket) +
           " rank_points=" + std::to_string(o.ranks.lattice_points) +
           " rank_shifts=" + std::to_string(o.ranks.lattice_shifts) + " rank_draw=" + name(o.ranks.keys) +
           " rank_seed=" + std::to_string(o.ranks.seed) + " rope_bands=" + std::to_string(o.rope.n_bands) +
           " rope_min_span=" + num(o.rope.min_angle_span) + " rope_min_energy_z=" + num(o.rope.min_energy_z) +
           " rope_consistent=" + num(o.rope.consistent_above) + " rope_inconsistent=" + num(o.rope.inconsistent_below) +
           " rope_min_rows=" + std::to_string(o.rope.min_bucket_rows) + " rope_max_mirror=" + num(o.rope.max_mirror_ratio) +
           edges(" heatmap_distance=", o.plasticity.heatmap.distance_edges) +
           edges(" heatmap_offset=", o.plasticity.heatmap.offset_edges);
}

}  // namespace qkgeom
