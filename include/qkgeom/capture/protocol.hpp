// qkgeom — the capture protocol as library components (method §0, §0.1).
//
// Everything a capture loop needs besides the token sampler of core/buckets.hpp:
//
//   * GQA mapping            h_k = ⌊h_q / (n_q / n_kv)⌋                       (method §0)
//   * the model's layout     heads per layer, sliding window per layer, RoPE
//   * eligibility            full-attention layers only (default) or all      (method §0.1)
//   * head sampling          `count` (layer, q_head) pairs without replacement,
//                            seeded, all of them when fewer are eligible       (method §0.1)
//   * capture_sampler        the deterministic keep decision applied to a step
//                            of tokens (positions + example ids)               (method §0.1)
//   * capture_store          rows of the selected heads, kept tokens only,
//                            ready for plasticity pairs or the dataset writer
//
// None of this depends on a tensor library: a capture loop in C++ (or the
// LibTorch adapter) hands rows over through the tensor concept (core/tensor.hpp).
#pragma once

#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/core/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace qkgeom {

// ---------------------------------------------------------------------------
// GQA mapping (method §0)
// ---------------------------------------------------------------------------

/// \brief The GQA group size n_q / n_kv (method §0).
/// \param[in] n_q_heads  query heads of the layer, ≥ 1.
/// \param[in] n_kv_heads key/value heads of the layer, ≥ 1, dividing n_q_heads.
/// \returns n_q_heads / n_kv_heads (1 without GQA).
/// \throws std::invalid_argument when n_q < 1, n_kv < 1 or n_kv does not divide n_q.
inline std::int64_t gqa_group_size(std::int64_t n_q_heads, std::int64_t n_kv_heads) {
    constexpr std::string_view fn = "qkgeom::gqa_group_size";
    if (n_q_heads < 1) detail::fail_arg(fn, "n_q_heads must be >= 1", n_q_heads);
    if (n_kv_heads < 1) detail::fail_arg(fn, "n_kv_heads must be >= 1", n_kv_heads);
    if (n_q_heads % n_kv_heads != 0)
        detail::fail_arg(fn, "n_q_heads = " + std::to_string(n_q_heads) + " is not a multiple of n_kv_heads",
                         n_kv_heads);
    return n_q_heads / n_kv_heads;
}

/// \brief The key/value head read by query head `q_head` (method §0):
/// h_k = ⌊h_q / (n_q / n_kv)⌋.
/// \param[in] q_head     the query head, in [0, n_q_heads).
/// \param[in] n_q_heads  query heads of the layer, ≥ 1.
/// \param[in] n_kv_heads key/value heads of the layer, ≥ 1, dividing n_q_heads.
/// \returns the key head, in [0, n_kv_heads).
/// \throws std::invalid_argument for an invalid (n_q, n_kv) (as gqa_group_size)
///         or q_head outside [0, n_q).
inline std::int64_t key_head_of(std::int64_t q_head, std::int64_t n_q_heads, std::int64_t n_kv_heads) {
    std::int64_t const g = gqa_group_size(n_q_heads, n_kv_heads);
    if (q_head < 0 || q_head >= n_q_heads)
        detail::fail_arg("qkgeom::key_head_of",
                         "q_head must be in [0, n_q_heads = " + std::to_string(n_q_heads) + ")", q_head);
    return q_head / g;
}

// ---------------------------------------------------------------------------
// The model's layout
// ---------------------------------------------------------------------------

// rope_pairing, rope_pairing_name and rope_spec live in <qkgeom/core/head.hpp>
// (capture facts carry the RoPE a head was captured under).


/// \brief One layer's attention shape.
struct layer_layout {
    std::int64_t n_q_heads = 0;                  ///< query heads (>= 1)
    std::int64_t n_kv_heads = 0;                 ///< key/value heads (>= 1, divides n_q_heads)
    std::optional<std::int64_t> sliding_window;  ///< attention span in tokens; none = full attention
    friend bool operator==(layer_layout const&, layer_layout const&) = default;
};

/// \brief A model's attention layout: what a capture loop must know to choose
/// heads and map query heads to key heads.
struct model_layout {
    std::int64_t head_dim = 0;          ///< d (>= 1)
    std::vector<layer_layout> layers;   ///< one per layer, in order
    friend bool operator==(model_layout const&, model_layout const&) = default;
};

/// \brief A layout with the same attention shape in every layer.
///
/// Only n_layers is checked here; pass the result to `check_layout` (or to
/// any function that takes it: eligible_heads, capture_store) for the rest.
/// \param[in] n_layers       layers, ≥ 1.
/// \param[in] n_q_heads      query heads per layer.
/// \param[in] n_kv_heads     key/value heads per layer.
/// \param[in] head_dim       d.
/// \param[in] sliding_window every layer's window in tokens; none = full attention.
/// \returns the layout.
/// \throws std::invalid_argument when n_layers < 1.
/// \throws std::bad_alloc if the layers cannot be allocated.
inline model_layout uniform_layout(std::int64_t n_layers, std::int64_t n_q_heads, std::int64_t n_kv_heads,
                                   std::int64_t head_dim, std::optional<std::int64_t> sliding_window = {}) {
    if (n_layers < 1) detail::fail_arg("qkgeom::uniform_layout", "n_layers must be >= 1", n_layers);
    return model_layout{head_dim, std::vector<layer_layout>(static_cast<std::size_t>(n_layers),
                                                            layer_layout{n_q_heads, n_kv_heads, sliding_window})};
}

/// \brief Checks a layout: head_dim >= 1, at least one layer, every layer's
/// GQA shape valid and sliding windows >= 1. Messages name `layers[L].field`.
/// \param[in] m     the layout.
/// \param[in] where the function name the messages start with.
/// \throws std::invalid_argument at the first violation: head_dim < 1, no
///         layers, n_q_heads < 1, n_kv_heads < 1, n_kv_heads not dividing
///         n_q_heads, or a sliding window < 1.
inline void check_layout(model_layout const& m, std::string_view where = "qkgeom::check_layout") {
    if (m.head_dim < 1) detail::fail_arg(where, "head_dim must be >= 1", m.head_dim);
    if (m.layers.empty()) detail::fail_arg(where, "layers: a layout needs at least one layer; count", 0);
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
        auto const& L = m.layers[l];
        std::string const f = "layers[" + std::to_string(l) + "].";
        if (L.n_q_heads < 1) detail::fail_arg(where, f + "n_q_heads must be >= 1", L.n_q_heads);
        if (L.n_kv_heads < 1) detail::fail_arg(where, f + "n_kv_heads must be >= 1", L.n_kv_heads);
        if (L.n_q_heads % L.n_kv_heads != 0)
            detail::fail_arg(where,
                             f + "n_q_heads = " + std::to_string(L.n_q_heads) + " is not a multiple of n_kv_heads",
                             L.n_kv_heads);
        if (L.sliding_window && *L.sliding_window < 1)
            detail::fail_arg(where, f + "sliding_window must be >= 1 (or none for full attention)",
                             *L.sliding_window);
    }
}

// ---------------------------------------------------------------------------
// Eligibility and head sampling (method §0.1)
// ---------------------------------------------------------------------------

/// \brief Which layers' heads may be sampled (method §0.1). The thesis'
/// default: full-attention layers only (a sliding-window layer cannot show
/// long-range positional preferences).
enum class layer_eligibility : std::uint8_t {
    full_attention_only = 0,  ///< layers with no sliding window (default)
    all_layers = 1,           ///< every layer
};

/// \brief Every eligible (layer, q_head), ascending by (layer, q_head), with
/// its key head.
/// \param[in] m the layout.
/// \param[in] e which layers are eligible (default: full-attention layers only).
/// \returns the eligible heads; empty when no layer is eligible (e.g. every
///          layer has a sliding window under `full_attention_only`).
/// \throws std::invalid_argument for an invalid layout (as check_layout).
/// \throws std::bad_alloc if the list cannot be allocated.
inline std::vector<head_id> eligible_heads(model_layout const& m,
                                             layer_eligibility e = layer_eligibility::full_attention_only) {
    check_layout(m, "qkgeom::eligible_heads");
    std::vector<head_id> out;
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
        auto const& L = m.layers[l];
        if (e == layer_eligibility::full_attention_only && L.sliding_window) continue;
        std::int64_t const g = L.n_q_heads / L.n_kv_heads;
        for (std::int64_t h = 0; h < L.n_q_heads; ++h) out.push_back({static_cast<std::int64_t>(l), h, h / g});
    }
    return out;
}

namespace detail {
/// A uniform integer in [0, m) from a splitmix64 stream, without modulo bias
/// (rejection of the top 2^64 mod m values).
inline std::uint64_t bounded_draw(std::uint64_t& state, std::uint64_t m) noexcept {
    std::uint64_t const reject_from = (0 - m) % m;  // 2^64 mod m
    for (;;) {
        state = splitmix64(state);
        if (state >= reject_from) return state % m;
    }
}
}  // namespace detail

/// \brief Head sampling (method §0.1): `count` query heads uniformly without
/// replacement from the eligible (layer, q_head) pairs, seeded; all of them
/// when fewer than `count` are eligible. Returned ascending by (layer, q_head).
///
/// The generator is documented so other tools can reproduce it: the eligible
/// list E (ascending) is shuffled by a partial Fisher–Yates pass,
///
///     s = splitmix64(seed ^ 0x6865616473616D70)            // "headsamp"
///     for i = 0 .. count-1:  j = i + draw(s, |E| - i);  swap(E[i], E[j])
///
/// where draw(s, m) repeats s = splitmix64(s) until s >= (2^64 mod m) and
/// returns s mod m; the first `count` entries, sorted, are the sample.
/// \param[in] m     the layout.
/// \param[in] count heads to draw, ≥ 0.
/// \param[in] seed  the sampling seed.
/// \param[in] e     which layers are eligible (default: full-attention layers only).
/// \returns min(count, |E|) heads, ascending by (layer, q_head).
/// \throws std::invalid_argument for an invalid layout (as check_layout) or count < 0.
/// \throws std::bad_alloc if the list cannot be allocated.
/// \sa eligible_heads
inline std::vector<head_id> sample_heads(model_layout const& m, std::int64_t count, std::uint64_t seed,
                                           layer_eligibility e = layer_eligibility::full_attention_only) {
    if (count < 0) detail::fail_arg("qkgeom::sample_heads", "count must be >= 0", count);
    auto pool = eligible_heads(m, e);
    auto const n = static_cast<std::uint64_t>(pool.size());
    if (static_cast<std::uint64_t>(count) >= n) return pool;
    std::uint64_t s = detail::splitmix64(seed ^ 0x6865616473616D70ULL);
    for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(count); ++i) {
        std::uint64_t const j = i + detail::bounded_draw(s, n - i);
        std::swap(pool[i], pool[j]);
    }
    pool.resize(static_cast<std::size_t>(count));
    std::sort(pool.begin(), pool.end());
    return pool;
}

/// \brief The distinct (layer, k_head) a set of head pairs reads, ascending.
/// \param[in] heads the head pairs (any order; duplicates allowed).
/// \returns the sorted, de-duplicated (layer, k_head) pairs.
/// \throws std::bad_alloc if the list cannot be allocated.
inline std::vector<std::pair<std::int64_t, std::int64_t>> key_heads_of(std::vector<head_id> const& heads) {
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    out.reserve(heads.size());
    for (auto const& h : heads) out.emplace_back(h.layer, h.k_head);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

// ---------------------------------------------------------------------------
// The token sampler applied to a step (method §0.1)
// ---------------------------------------------------------------------------

/// \brief The method §0.1 keep decision bound to a bucket scheme and a seed.
struct capture_sampler {
    bucket_spec buckets{};   ///< scheme, width (B or B_min), rate
    std::uint64_t seed = 0;  ///< sampling seed

    /// \brief Whether the token is kept (keep_token with this scheme and seed).
    /// \param[in] example_id the example (sequence) id.
    /// \param[in] layer      the layer index.
    /// \param[in] k          query or key.
    /// \param[in] position   the token position, ≥ 0.
    /// \returns true when the token is kept.
    /// \throws std::invalid_argument for an invalid `buckets` or position < 0 (as keep_token).
    [[nodiscard]] bool keep(std::int64_t example_id, std::int64_t layer, kind k, std::int64_t position) const {
        return keep_token(buckets, seed, example_id, layer, k, position);
    }

    /// \brief Bucket of a position (bucket_of with this scheme).
    /// \param[in] position the token position, ≥ 0.
    /// \returns the bucket index.
    /// \throws std::invalid_argument for an invalid `buckets` or position < 0 (as bucket_of).
    [[nodiscard]] std::int64_t bucket(std::int64_t position) const { return bucket_of(buckets, position); }

    /// \brief Indices i (ascending) of the kept tokens of one step, given each
    /// token's position and example id (equal lengths). The same indices for
    /// every head of one (layer, kind).
    /// \param[in] positions   each token's position, ≥ 0.
    /// \param[in] example_ids each token's example id (same length).
    /// \param[in] layer       the layer index (part of the keep decision).
    /// \param[in] k           query or key (part of the keep decision).
    /// \returns the kept indices into `positions`, ascending.
    /// \throws std::invalid_argument for an invalid `buckets` (unknown scheme,
    ///         width < 1, rate not finite and > 0), on unequal lengths or a
    ///         negative position (naming the index and value).
    /// \throws std::bad_alloc if the result cannot be allocated.
    [[nodiscard]] std::vector<std::int64_t> select(std::span<std::int64_t const> positions,
                                                   std::span<std::int64_t const> example_ids, std::int64_t layer,
                                                   kind k) const {
        constexpr std::string_view fn = "qkgeom::capture_sampler::select";
        detail::check_bucket_spec(fn, buckets);
        if (positions.size() != example_ids.size())
            detail::fail_arg(fn,
                             "example_ids: length differs from positions (" + std::to_string(positions.size()) +
                                 "); length",
                             example_ids.size());
        std::vector<std::int64_t> out;
        for (std::size_t i = 0; i < positions.size(); ++i) {
            std::int64_t const t = positions[i];
            if (t < 0) detail::fail_arg(fn, "positions[" + std::to_string(i) + "] must be >= 0", t);
            double const p = detail::keep_probability_unchecked(buckets, t);
            if (p >= 1.0 || keep_uniform(seed, example_ids[i], layer, k, t) < p)
                out.push_back(static_cast<std::int64_t>(i));
        }
        return out;
    }
};

// ---------------------------------------------------------------------------
// Row store
// ---------------------------------------------------------------------------

/// \brief The kept rows of one (layer, kind, head), in capture order.
///
/// `values` is row-major n × dim in `Scalar` (float by default: captures come
/// in f32/f16/bf16, which widen to float exactly); use `matrix()` to hand the
/// rows to any analysis.
///
/// \tparam Scalar the stored element type.
template <class Scalar = float>
struct captured_rows {
    std::int64_t layer = 0, head = 0;  ///< the layer and the head (a q head for queries, a k head for keys)
    kind k = kind::query;              ///< query or key rows
    std::int64_t dim = 0;              ///< d, the model's head_dim
    std::vector<Scalar> values;  ///< n × dim, row-major
    token_positions position;    ///< per row
    token_buckets bucket;        ///< per row, bucket_of(sampler buckets, position)
    example_ids example_id;      ///< per row
    std::optional<std::int64_t> sliding_window;  ///< the layer's, none = full attention

    /// \brief Number of stored rows.
    /// \returns `position.size()`.
    [[nodiscard]] std::int64_t rows() const noexcept { return static_cast<std::int64_t>(position.size()); }
    /// \brief The rows as a bounds-checked view satisfying RowMatrix.
    /// \returns a rows() × dim `matrix_view` of `values`; valid while `values`
    ///          is neither destroyed nor reallocated.
    /// \throws std::invalid_argument when values.size() < rows() × dim (only
    ///         if the fields were edited inconsistently).
    [[nodiscard]] auto matrix() const { return make_matrix_view(std::span<Scalar const>(values), rows(), dim); }
    /// \brief The rows with their annotations as the analyses take them (a
    /// view of the values; the annotations are copied).
    /// \returns a `token_rows` of `matrix()` with copies of position, bucket
    ///          and example_id.
    /// \throws std::invalid_argument as matrix().
    /// \throws std::bad_alloc if the annotations cannot be copied.
    [[nodiscard]] auto token_view() const {
        return token_rows<decltype(matrix())>{matrix(), position, bucket, example_id};
    }
};

/// \brief Collects the kept rows of a chosen set of heads from a capture loop.
///
/// Call `add` once per (layer, kind, head) and step with that head's rows for
/// the step's tokens (T × d, any RowMatrix), the tokens' positions and example
/// ids. Only heads in the plan are stored (queries of the sampled q heads,
/// keys of the key heads they read); only tokens the sampler keeps are stored;
/// the rows must be finite. Not thread-safe: one store per capture thread, or
/// merge with `+=` (rows are appended; order does not matter to any analysis).
///
/// \tparam Scalar the stored element type (values are converted to it).
template <class Scalar = float>
class capture_store {
public:
    /// \brief An empty store with an empty plan (every `add` throws).
    capture_store() = default;
    /// \brief A store for the given plan, with an empty slot per planned
    /// (layer, kind, head).
    /// \param[in] layout  the model's attention layout.
    /// \param[in] heads   the planned heads (e.g. from sample_heads); each
    ///                    k_head must follow the GQA mapping of its layer.
    /// \param[in] sampler the keep decision and bucket scheme.
    /// \throws std::invalid_argument for an invalid layout (as check_layout),
    ///         an invalid bucket spec, a head whose layer is out of range or
    ///         whose q_head is outside [0, n_q_heads) (as key_head_of), or
    ///         whose k_head differs from key_head_of(q_head).
    /// \throws std::bad_alloc if the slots cannot be allocated.
    capture_store(model_layout layout, std::vector<head_id> heads, capture_sampler sampler)
        : layout_(std::move(layout)), heads_(std::move(heads)), sampler_(sampler) {
        constexpr std::string_view fn = "qkgeom::capture_store";
        check_layout(layout_, fn);
        detail::check_bucket_spec(fn, sampler_.buckets);
        for (auto const& h : heads_) {
            if (h.layer < 0 || h.layer >= static_cast<std::int64_t>(layout_.layers.size()))
                detail::fail_arg(fn, "heads: layer out of range", h.layer);
            auto const& L = layout_.layers[static_cast<std::size_t>(h.layer)];
            if (key_head_of(h.q_head, L.n_q_heads, L.n_kv_heads) != h.k_head)
                detail::fail_arg(fn,
                                 "heads: k_head does not follow the GQA mapping for layer " +
                                     std::to_string(h.layer) + " q_head " + std::to_string(h.q_head) + "; k_head",
                                 h.k_head);
            slot(h.layer, kind::query, h.q_head);
            slot(h.layer, kind::key, h.k_head);
        }
    }

    /// \brief The model layout of the plan.
    /// \returns the layout given to the constructor.
    [[nodiscard]] model_layout const& layout() const noexcept { return layout_; }
    /// \brief The planned heads.
    /// \returns the heads given to the constructor, in their order.
    [[nodiscard]] std::vector<head_id> const& heads() const noexcept { return heads_; }
    /// \brief The token sampler.
    /// \returns the sampler given to the constructor.
    [[nodiscard]] capture_sampler const& sampler() const noexcept { return sampler_; }

    /// \brief Whether rows of (layer, kind, head) are stored.
    /// \param[in] layer the layer index.
    /// \param[in] k     query or key.
    /// \param[in] head  a q head for queries, a k head for keys.
    /// \returns true when the plan stores that head's rows.
    [[nodiscard]] bool wants(std::int64_t layer, kind k, std::int64_t head) const {
        return store_.count(std::tuple{layer, static_cast<int>(k), head}) != 0;
    }

    /// \brief Add one head's rows for one step. Returns the number kept.
    /// \tparam X any RowMatrix.
    /// \param[in] layer       the layer index.
    /// \param[in] k           query or key.
    /// \param[in] head        a q head for queries, a k head for keys.
    /// \param[in] rows        T × head_dim rows of the step's tokens.
    /// \param[in] positions   T token positions, ≥ 0.
    /// \param[in] example_ids T example ids.
    /// \returns the number of rows kept (and stored).
    /// \throws std::invalid_argument for an invalid bucket spec, when
    ///         positions and example_ids differ in length or a position is
    ///         negative (from capture_sampler::select), the head is not in the
    ///         plan, the row count differs from positions/example_ids, the
    ///         width differs from head_dim, or a kept value is not finite
    ///         (naming row, column, value); nothing is stored then.
    /// \throws std::bad_alloc if the rows cannot be stored.
    template <RowMatrix X>
    std::int64_t add(std::int64_t layer, kind k, std::int64_t head, X const& rows,
                     std::span<std::int64_t const> positions, std::span<std::int64_t const> example_ids) {
        auto const idx = sampler_.select(positions, example_ids, layer, k);
        return add_selected(layer, k, head, rows, positions, example_ids, idx);
    }

    /// \brief As `add`, with the kept indices already chosen by
    /// `sampler().select(positions, example_ids, layer, k)` — compute them once
    /// per (layer, kind) and step and reuse them for every head.
    /// \tparam X any RowMatrix.
    /// \param[in] layer       the layer index.
    /// \param[in] k           query or key.
    /// \param[in] head        a q head for queries, a k head for keys.
    /// \param[in] rows        T × head_dim rows of the step's tokens.
    /// \param[in] positions   T token positions.
    /// \param[in] example_ids T example ids.
    /// \param[in] kept        indices into the T tokens, as `select` returns them.
    /// \returns kept.size(), the number of rows stored.
    /// \throws std::invalid_argument when the head is not in the plan, the row
    ///         count differs from positions/example_ids, the width differs
    ///         from head_dim, an index of `kept` is outside [0, T) or listed
    ///         twice, a kept position is negative, or a kept value is not
    ///         finite (naming row, column, value). Everything is checked
    ///         before the store changes: nothing is stored when it throws.
    /// \throws std::bad_alloc if the rows cannot be stored (nothing is stored then).
    template <RowMatrix X>
    std::int64_t add_selected(std::int64_t layer, kind k, std::int64_t head, X const& rows,
                              std::span<std::int64_t const> positions, std::span<std::int64_t const> example_ids,
                              std::span<std::int64_t const> kept) {
        constexpr std::string_view fn = "qkgeom::capture_store::add";
        auto it = store_.find(std::tuple{layer, static_cast<int>(k), head});
        if (it == store_.end())
            detail::fail_arg(fn,
                             "(layer " + std::to_string(layer) + ", " + kind_name(k) +
                                 ") head is not in the capture plan; head",
                             head);
        auto r = as_matrix(rows);
        auto const n = static_cast<std::int64_t>(r.rows());
        if (static_cast<std::int64_t>(positions.size()) != n)
            detail::fail_arg(fn, "positions: length differs from the row count (" + std::to_string(n) + "); length",
                             positions.size());
        if (static_cast<std::int64_t>(example_ids.size()) != n)
            detail::fail_arg(fn,
                             "example_ids: length differs from the row count (" + std::to_string(n) + "); length",
                             example_ids.size());
        if (static_cast<std::int64_t>(r.cols()) != layout_.head_dim)
            detail::fail_arg(fn, "rows: width differs from head_dim (" + std::to_string(layout_.head_dim) + "); width",
                             r.cols());
        auto& dst = it->second;
        auto const d = layout_.head_dim;
        // Everything is checked before the store changes (strong guarantee).
        std::vector<char> seen(static_cast<std::size_t>(n), 0);
        for (std::int64_t i : kept) {
            if (i < 0 || i >= n) detail::fail_arg(fn, "kept: index out of range [0, " + std::to_string(n) + "); index", i);
            if (seen[static_cast<std::size_t>(i)]) detail::fail_arg(fn, "kept: duplicate index", i);
            seen[static_cast<std::size_t>(i)] = 1;
            if (positions[static_cast<std::size_t>(i)] < 0)
                detail::fail_arg(fn, "positions: negative position of kept row " + std::to_string(i) + "; position",
                                 positions[static_cast<std::size_t>(i)]);
            for (std::int64_t j = 0; j < d; ++j) {
                double const v = r(static_cast<index_t>(i), static_cast<index_t>(j));
                if (!std::isfinite(v))
                    detail::fail_arg(fn,
                                     "rows: non-finite value at row " + std::to_string(i) + ", column " +
                                         std::to_string(j) + " of (layer " + std::to_string(layer) + ", " +
                                         kind_name(k) + " head " + std::to_string(head) + "); value",
                                     v);
            }
        }
        std::size_t const base = dst.values.size();
        // Reserve first: the appends below cannot throw, so the four arrays stay consistent.
        dst.values.reserve(base + kept.size() * static_cast<std::size_t>(d));
        dst.position.values().reserve(dst.position.values().size() + kept.size());
        dst.bucket.values().reserve(dst.bucket.values().size() + kept.size());
        dst.example_id.values().reserve(dst.example_id.values().size() + kept.size());
        for (std::int64_t i : kept) {
            for (std::int64_t j = 0; j < d; ++j)
                dst.values.push_back(static_cast<Scalar>(r(static_cast<index_t>(i), static_cast<index_t>(j))));
            auto const t = positions[static_cast<std::size_t>(i)];
            dst.position.values().push_back(t);
            dst.bucket.values().push_back(detail::bucket_of_unchecked(sampler_.buckets, t));
            dst.example_id.values().push_back(example_ids[static_cast<std::size_t>(i)]);
        }
        return static_cast<std::int64_t>(kept.size());
    }

    /// \brief The stored rows of (layer, kind, head).
    /// \param[in] layer the layer index.
    /// \param[in] k     query or key.
    /// \param[in] head  a q head for queries, a k head for keys.
    /// \returns the rows; the reference stays valid for the store's lifetime.
    /// \throws std::invalid_argument when the head is not in the plan.
    [[nodiscard]] captured_rows<Scalar> const& rows(std::int64_t layer, kind k, std::int64_t head) const {
        auto it = store_.find(std::tuple{layer, static_cast<int>(k), head});
        if (it == store_.end())
            detail::fail_arg("qkgeom::capture_store::rows",
                             "(layer " + std::to_string(layer) + ", " + kind_name(k) +
                                 ") head is not in the capture plan; head",
                             head);
        return it->second;
    }

    /// \brief One planned head as one value (method §0): its identity, the
    /// capture facts (the sampler's bucket scheme, the layer's sliding
    /// window) and views of its query rows and of the rows of the key head
    /// it reads, ready for analyze_head / attention_plasticity.
    /// \param[in] id  a head of the plan (`heads()`)
    /// \returns the head; its row views stay valid while the store is alive
    ///          and not appended to; `facts.sliding_window` is 0 for a
    ///          full-attention layer; `facts.context_length` is 0 ("from the
    ///          rows": max position + 1, method §9.12), since the store does
    ///          not know the model's context length — set it on the result
    ///          when the capture knows it
    /// \throws std::invalid_argument when the head is not in the plan
    /// \throws std::bad_alloc if the annotations cannot be copied
    [[nodiscard]] auto head(head_id const& id) const {
        if (std::find(heads_.begin(), heads_.end(), id) == heads_.end())
            detail::fail_arg("qkgeom::capture_store::head",
                             "(layer " + std::to_string(id.layer) + ", k_head " + std::to_string(id.k_head) +
                                 ") is not a planned head; q_head",
                             id.q_head);
        auto const& q = rows(id.layer, kind::query, id.q_head);
        auto const& k = rows(id.layer, kind::key, id.k_head);
        using view = decltype(q.matrix());
        head_capture<view, view> out{id, {}, q.token_view(), k.token_view()};
        out.facts.buckets = sampler_.buckets;
        out.facts.sliding_window = q.sliding_window.value_or(0);
        return out;
    }

    /// \brief Every stored entry, ordered by (layer, kind, head).
    /// \returns pointers into the store, valid for its lifetime.
    /// \throws std::bad_alloc if the list cannot be allocated.
    [[nodiscard]] std::vector<captured_rows<Scalar> const*> entries() const {
        std::vector<captured_rows<Scalar> const*> out;
        for (auto const& [key, v] : store_) out.push_back(&v);
        return out;
    }

    /// \brief Append another store's rows (same layout, heads and sampler).
    /// \param[in] o the other store.
    /// \returns `*this`.
    /// \throws std::invalid_argument naming what differs (layout, heads,
    ///         sampler buckets or seed); nothing is appended then.
    /// \throws std::bad_alloc if the rows cannot be appended (entries
    ///         earlier in the order may then already be appended).
    capture_store& operator+=(capture_store const& o) {
        constexpr std::string_view fn = "qkgeom::capture_store::operator+=";
        if (!(o.layout_ == layout_)) detail::fail_arg(fn, "layout differs; other head_dim", o.layout_.head_dim);
        if (!(o.heads_ == heads_)) detail::fail_arg(fn, "heads differ; other head count", o.heads_.size());
        if (!(o.sampler_.buckets == sampler_.buckets)) detail::fail_arg(fn, "sampler buckets differ; other width", o.sampler_.buckets.width);
        if (o.sampler_.seed != sampler_.seed) detail::fail_arg(fn, "sampler seed differs; other", o.sampler_.seed);
        for (auto const& [key, v] : o.store_) {
            auto& dst = store_.at(key);
            dst.values.insert(dst.values.end(), v.values.begin(), v.values.end());
            dst.position.values().insert(dst.position.values().end(), v.position.begin(), v.position.end());
            dst.bucket.values().insert(dst.bucket.values().end(), v.bucket.begin(), v.bucket.end());
            dst.example_id.values().insert(dst.example_id.values().end(), v.example_id.begin(), v.example_id.end());
        }
        return *this;
    }

private:
    void slot(std::int64_t layer, kind k, std::int64_t head) {
        auto [it, inserted] = store_.try_emplace(std::tuple{layer, static_cast<int>(k), head});
        if (!inserted) return;
        auto& e = it->second;
        e.layer = layer;
        e.head = head;
        e.k = k;
        e.dim = layout_.head_dim;
        e.sliding_window = layout_.layers[static_cast<std::size_t>(layer)].sliding_window;
    }

    model_layout layout_{};
    std::vector<head_id> heads_;
    capture_sampler sampler_{};
    std::map<std::tuple<std::int64_t, int, std::int64_t>, captured_rows<Scalar>> store_;
};

}  // namespace qkgeom
