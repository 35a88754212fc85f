// qkgeom — one head entry of a dataset (one layer, head and kind): its storage
// forms, its name lLLhHH[qk], and the checks an entry must pass against its
// manifest (shared by write_head and read_head). docs/dataset.md.
#pragma once

#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/io/manifest.hpp>
#include <qkgeom/io/npy.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace qkgeom::io {

/// \brief Storage form of one head entry.
enum class storage_format : std::uint8_t {
    npy = 0,          ///< directory lLLhHHq/ of .npy files
    safetensors = 1,  ///< lLLhHHq.safetensors
    npz = 2,          ///< lLLhHHq.npz (an .npz archive of the same .npy members)
};

/// \brief Name of a storage form (`npy`, `safetensors`, `npz`).
/// \param[in] f the form.
/// \returns a static string; "unknown" for a value outside the enumeration.
constexpr const char* storage_format_name(storage_format f) noexcept {
    switch (f) {
        case storage_format::npy: return "npy";
        case storage_format::safetensors: return "safetensors";
        case storage_format::npz: return "npz";
    }
    return "unknown";
}

/// \brief One entry of a dataset (one layer, head and kind), read back:
/// its rows (vectors widened to double, positions, buckets, example ids;
/// `token_rows`, the per-kind part of a `head_capture`) and what the file
/// says about them.
struct head_entry : token_rows<row_matrix> {
    std::int64_t layer = 0, head = 0;  ///< the layer and the head (a q head for queries, a kv head for keys)
    kind k = kind::query;              ///< query or key rows
    std::string dtype;                           ///< storage dtype of vectors: "f32", "f16", "bf16", "f64"
    std::optional<std::int64_t> sliding_window;  ///< none = full attention
};

/// \brief Names an entry file of a dataset directory (not a head pair: that
/// is qkgeom::head_id).
struct entry_id {
    std::int64_t layer = 0, head = 0;             ///< from the name lLLhHH
    kind k = kind::query;                         ///< from the name's last letter (q or k)
    storage_format format = storage_format::npy;  ///< the form the entry was found in
    friend bool operator==(entry_id const&, entry_id const&) = default;
};

/// \brief "lLLhHHq" / "lLLhHHk" (two-digit zero-padded layer and head).
/// \param[in] layer the layer, ≥ 0 (more digits when ≥ 100).
/// \param[in] head  the head, ≥ 0 (more digits when ≥ 100).
/// \param[in] k     query (suffix q) or key (suffix k).
/// \pre layer ≥ 0 and head ≥ 0 (not checked: a negative value is written
///      with its sign and names no entry read_head or list_heads accepts).
/// \returns the entry name, without directory or extension.
/// \throws std::bad_alloc if the string cannot be allocated.
[[nodiscard]] inline std::string head_entry_name(std::int64_t layer, std::int64_t head, kind k) {
    auto pad2 = [](std::int64_t v) {
        std::string s = std::to_string(v);
        return s.size() < 2 ? std::string(2 - s.size(), '0') + s : s;
    };
    return "l" + pad2(layer) + "h" + pad2(head) + kind_name(k);
}

/// \brief Largest safetensors header read_head accepts in a head entry (1 MiB;
/// an entry's header names at most 5 tensors and takes ~400 bytes). Bounds
/// the memory the JSON header costs (~40 bytes per byte of hostile text).
inline constexpr std::uint64_t head_entry_max_header = std::uint64_t{1} << 20;

namespace detail {

/// Throws for value (i, j) of an entry's vectors, which is NaN, ±inf or
/// outside the input limit (method §9.18).
template <class Src>
[[noreturn]] void fail_vector_value(Src const& src, index_t i, index_t j, double v) {
    qkgeom::detail::fail_input(src("vectors"), "vectors[row " + std::to_string(i) + ", col " + std::to_string(j) + "]",
                               v,
                               std::isfinite(v) ? "value outside the input limit |x| < 2^128 (method §9.18)"
                                                : "non-finite value");
}

/// Validates a head entry against the manifest, its vectors being n × d
/// (held in e.vectors or elsewhere); `check_values()` throws for the first
/// vector value outside the input limit, in its turn among the checks.
/// `src(field)` names the file of a field.
/// A token held in two rows of one entry: its example id, its position and
/// the two rows (the first pair in (example, position) order).
struct repeated_token {
    std::int64_t example = 0, position = 0;
    std::size_t first_row = 0, second_row = 0;
};

/// The first token an entry holds twice (the same example id and position in
/// two rows: a capture that ran a batch twice or hooked a layer twice), or
/// std::nullopt when each token is one row. Works in 24 bytes a row
/// (sorted (example, position, row) triples). Shared by read_head and
/// dataset_writer::close.
template <class P, class E>
std::optional<repeated_token> first_repeated_token(P const& position, E const& example_id) {
    struct tok {
        std::int64_t ex, pos;
        std::size_t row;
    };
    std::vector<tok> t(static_cast<std::size_t>(position.size()));
    for (std::size_t i = 0; i < t.size(); ++i)
        t[i] = {static_cast<std::int64_t>(example_id[static_cast<index_t>(i)]),
                static_cast<std::int64_t>(position[static_cast<index_t>(i)]), i};
    std::sort(t.begin(), t.end(), [](tok const& a, tok const& b) {
        return a.ex != b.ex ? a.ex < b.ex : a.pos != b.pos ? a.pos < b.pos : a.row < b.row;
    });
    for (std::size_t i = 1; i < t.size(); ++i)
        if (t[i].ex == t[i - 1].ex && t[i].pos == t[i - 1].pos)
            return repeated_token{t[i].ex, t[i].pos, t[i - 1].row, t[i].row};
    return std::nullopt;
}

template <class Src, class Values>
void validate_entry(head_entry const& e, index_t rows, index_t cols, manifest const& m, Src const& src,
                    Values const& check_values) {
    using qkgeom::detail::fail_input;
    auto const n = static_cast<std::size_t>(rows);
    if (n == 0)
        fail_input(src("vectors"), "vectors.shape[0]", 0,
                   std::string(e.k == kind::query ? "query" : "key") + " entry " + head_entry_name(e.layer, e.head, e.k) +
                       " holds no rows: an entry needs at least one row");
    if (cols != m.head_dim)
        fail_input(src("vectors"), "vectors.shape[1]", cols,
                   std::string(kind_name(e.k)) + " head dimension differs from manifest head_dim = " +
                       std::to_string(m.head_dim));
    auto len = [&](auto const& v, char const* f) {
        if (static_cast<std::size_t>(v.size()) != n)
            fail_input(src(f), std::string(f) + ".length", v.size(),
                       "length differs from the " + std::to_string(n) + " rows of vectors");
    };
    len(e.position, "position");
    len(e.bucket, "bucket");
    len(e.example_id, "example_id");
    check_values();
    for (std::size_t i = 0; i < n; ++i) {
        std::int64_t const t = e.position[static_cast<index_t>(i)];
        if (t < 0) fail_input(src("position"), "position[" + std::to_string(i) + "]", t, "position must be >= 0");
        if (t >= m.context_length)
            fail_input(src("position"), "position[" + std::to_string(i) + "]", t,
                       "position beyond manifest context_length = " + std::to_string(m.context_length));
        // The spec is checked with the first row (bucket_of), the later rows
        // reuse that check (t >= 0 above): the same exception, no per-row check.
        std::int64_t const b = i == 0 ? bucket_of(m.buckets, t) : qkgeom::detail::bucket_of_unchecked(m.buckets, t);
        if (e.bucket[static_cast<index_t>(i)] != b)
            fail_input(src("bucket"), "bucket[" + std::to_string(i) + "]", e.bucket[static_cast<index_t>(i)],
                       "bucket inconsistent with position " + std::to_string(t) + " under the " +
                           bucket_scheme_name(m.buckets.scheme) + " scheme (expected " + std::to_string(b) + ")");
    }
    if (auto const r = first_repeated_token(e.position, e.example_id))
        fail_input(src("position"), "position[" + std::to_string(r->second_row) + "]", r->position,
                   "example " + std::to_string(r->example) + ", position " + std::to_string(r->position) +
                       " is held twice (rows " + std::to_string(r->first_row) + " and " +
                       std::to_string(r->second_row) + "; example_id in " + src("example_id") +
                       "): one token is one row (a capture that ran a batch twice or hooked a layer twice?)");
    if (e.sliding_window && *e.sliding_window < 1)
        fail_input(src("sliding_window"), "sliding_window", *e.sliding_window, "sliding window must be >= 1");
    if (!m.sliding_window.empty() && e.layer >= 0 && e.layer < static_cast<std::int64_t>(m.sliding_window.size())) {
        auto const& want = m.sliding_window[static_cast<std::size_t>(e.layer)];
        if (want != e.sliding_window)
            fail_input(src("sliding_window"), "sliding_window",
                       e.sliding_window ? std::to_string(*e.sliding_window) : std::string("none (full attention)"),
                       "differs from the manifest's sliding_window[" + std::to_string(e.layer) +
                           "] = " + (want ? std::to_string(*want) : std::string("null (full attention)")));
    }
}

/// Validates a head entry (vectors in e.vectors) against the manifest.
/// `src(field)` names the file of a field.
template <class Src>
void validate_head(head_entry const& e, manifest const& m, Src const& src) {
    validate_entry(e, e.vectors.rows(), e.vectors.cols(), m, src, [&] {
        static_assert(input_limit == 0x1p128, "the added constant encodes the exponent of input_limit");
        std::uint64_t acc = 0;  // any_out_of_range's test (NaN, ±inf, |x| >= 2^128), branch-free
        double const* p = e.vectors.data();
        for (index_t i = 0, n = e.vectors.size(); i < n; ++i)
            acc |= (std::bit_cast<std::uint64_t>(p[i]) & 0x7ff0000000000000u) + 0x3810000000000000u;
        if ((acc >> 63) == 0) return;
        for (index_t i = 0; i < e.vectors.rows(); ++i)
            for (index_t j = 0; j < e.vectors.cols(); ++j)
                if (!(std::abs(e.vectors(i, j)) < input_limit)) fail_vector_value(src, i, j, e.vectors(i, j));
    });
}

}  // namespace detail

}  // namespace qkgeom::io
