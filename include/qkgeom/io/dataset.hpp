// qkgeom — the on-disk dataset layout of one model (issue 5, method §0).
//
//   DIR/manifest.json
//   DIR/lLLhHHq/{vectors,position,bucket,example_id[,sliding_window]}.npy   (NumPy form)
//   DIR/lLLhHHk.safetensors  (tensors of the same names)                    (safetensors form)
//   DIR/lLLhHHq.npz          (members vectors.npy, position.npy, ...)        (NumPy archive form)
//
// LL and HH are the zero-padded layer and head (two digits, more when >= 100).
// q entries are indexed by query head, k entries by key (kv) head.
// See docs/dataset.md for the manifest fields and the validation rules.
#pragma once

#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/io/json.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/io/npz.hpp>
#include <qkgeom/io/safetensors.hpp>
#include <qkgeom/simd/moment_kernels.hpp>

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

/// \brief How the heads of a capture were chosen (method §0.1 head sampling;
/// the manifest's `capture.head_count`, `capture.head_seed`, `capture.eligibility`).
struct head_sampling {
    std::optional<std::int64_t> count;  ///< query heads sampled (sample_heads' count); none = every eligible head
    std::uint64_t seed = 0;             ///< sample_heads' seed
    layer_eligibility eligibility = layer_eligibility::full_attention_only;  ///< which layers' heads were eligible
    friend bool operator==(head_sampling const&, head_sampling const&) = default;
};

/// \brief Name of an eligibility rule as the manifest writes it
/// (`full_attention_only`, `all_layers`).
/// \param[in] e the rule.
/// \returns a static string; "full_attention_only" for any value but `all_layers`.
constexpr const char* layer_eligibility_name(layer_eligibility e) noexcept {
    return e == layer_eligibility::all_layers ? "all_layers" : "full_attention_only";
}

/// \brief What one model's capture looks like (manifest.json).
///
/// The first block is required in every manifest; `rope`, `sliding_window`
/// and `heads` were added later (issue 6), `rope_applied` and `token_sampler`
/// by issue 15; all are optional on read, so older manifests still parse
/// (they read as "not recorded", `token_sampler` as "qkgeom").
struct manifest {
    std::string model;                     ///< model name
    std::int64_t n_layers = 0;             ///< number of layers (>= 1)
    std::vector<std::int64_t> n_q_heads;   ///< query heads per layer (size n_layers)
    std::vector<std::int64_t> n_kv_heads;  ///< key/value heads per layer (divides n_q_heads)
    std::int64_t head_dim = 0;             ///< d (>= 1)
    bucket_spec buckets{};                 ///< bucket scheme, width, rate
    std::int64_t context_length = 0;       ///< L (>= 1)
    std::uint64_t seed = 0;                ///< capture sampling seed (capture.seed)

    std::optional<rope_spec> rope;  ///< the rotary embedding of the model; none = not recorded
    /// Per layer (size n_layers): the attention span, none = full attention.
    /// Empty = not recorded (then entries' own sliding_window are not cross-checked).
    std::vector<std::optional<std::int64_t>> sliding_window;
    std::optional<head_sampling> heads;  ///< head sampling of the capture; none = not recorded
    /// The query heads the capture chose explicitly (capture.heads: [layer,
    /// q_head] pairs, in the order listed; a Recorder given `heads`, an
    /// import of another tool's captures, a plan skipping layers). Empty =
    /// not recorded; exclusive with `heads` (a manifest records one plan).
    /// k_head is derived (key_head_of): parse_manifest fills it, dump_manifest
    /// does not write it, and write_manifest / planned_heads refuse a k_head
    /// other than -1 (unset) or the derived one.
    std::vector<head_id> head_list;
    /// Per layer (size n_layers; capture.rope_applied): true = the rows were
    /// captured after RoPE, false = before it (a NoPE layer that never calls
    /// RoPE, or a pre-RoPE capture). Empty = not recorded (older manifests).
    std::vector<bool> rope_applied;
    /// Who chose the kept tokens (capture.token_sampler): "qkgeom" (method
    /// §0.1's sampler with `seed`), or another tool's name (e.g. "qk-sniffer"),
    /// in which case `seed` is not a qkgeom sampler seed. Never empty.
    std::string token_sampler = "qkgeom";
};

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

/// \brief Largest manifest.json read_manifest accepts, in bytes (16 MiB; a
/// real manifest is a few kB). Checked on the file size before reading.
inline constexpr std::uint64_t manifest_max_bytes = std::uint64_t{16} << 20;
/// \brief Largest safetensors header read_head accepts in a head entry (1 MiB;
/// an entry's header names at most 5 tensors and takes ~400 bytes). Bounds
/// the memory the JSON header costs (~40 bytes per byte of hostile text).
inline constexpr std::uint64_t head_entry_max_header = std::uint64_t{1} << 20;
/// \brief Largest n_layers a manifest may declare.
inline constexpr std::int64_t manifest_max_layers = 100000;
/// \brief Largest query or key head count of one layer a manifest may declare.
inline constexpr std::int64_t manifest_max_heads_per_layer = 65536;
/// \brief Largest total of query heads over all layers a manifest may declare
/// (2^20; planned_heads enumerates them).
inline constexpr std::int64_t manifest_max_query_heads = std::int64_t{1} << 20;

namespace detail {

inline std::string manifest_fail_src(std::filesystem::path const& p) { return p.string(); }

inline std::int64_t json_int(json::value const& root, std::string const& src, std::string const& key,
                             std::int64_t min) {
    auto const* v = root.find(key);
    if (!v) qkgeom::detail::fail_input(src, key, "<missing>", "required manifest field is missing");
    if (!v->is_int()) qkgeom::detail::fail_input(src, key, json::dump(*v), "must be an integer");
    if (v->as_int() < min)
        qkgeom::detail::fail_input(src, key, v->as_int(), "must be >= " + std::to_string(min));
    return v->as_int();
}

/// Per-layer head counts: an integer (same for every layer) or an array of n_layers integers.
inline std::vector<std::int64_t> json_per_layer(json::value const& root, std::string const& src,
                                                std::string const& key, std::int64_t n_layers) {
    auto const* v = root.find(key);
    if (!v) qkgeom::detail::fail_input(src, key, "<missing>", "required manifest field is missing");
    std::vector<std::int64_t> out;
    if (v->is_int()) {
        out.assign(static_cast<std::size_t>(n_layers), v->as_int());
    } else if (v->is_array()) {
        if (static_cast<std::int64_t>(v->as_array().size()) != n_layers)
            qkgeom::detail::fail_input(src, key, v->as_array().size(),
                                       "per-layer array length differs from n_layers = " + std::to_string(n_layers));
        for (auto const& e : v->as_array()) {
            if (!e.is_int()) qkgeom::detail::fail_input(src, key, json::dump(e), "entries must be integers");
            out.push_back(e.as_int());
        }
    } else {
        qkgeom::detail::fail_input(src, key, json::dump(*v), "must be an integer or an array of integers");
    }
    for (std::size_t l = 0; l < out.size(); ++l) {
        std::string const f = v->is_int() ? key : key + "[" + std::to_string(l) + "]";
        if (out[l] < 1) qkgeom::detail::fail_input(src, f, out[l], "head counts must be >= 1");
        if (out[l] > manifest_max_heads_per_layer)
            qkgeom::detail::fail_input(src, f, out[l],
                                       "more heads in one layer than the limit of " +
                                           std::to_string(manifest_max_heads_per_layer));
    }
    return out;
}

/// The JSON object of a manifest: no byte-order mark, an object, "format"
/// and "version" (when present) "qkgeom-dataset" and 1.
inline json::value parse_manifest_root(std::string_view text, std::string const& src) {
    using qkgeom::detail::fail_input;
    if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF")
        fail_input(src, "json", "byte 0", "starts with a UTF-8 byte-order mark; save it without BOM");
    json::value root = json::parse(text, src);
    if (!root.is_object()) fail_input(src, "manifest", root.type_name(), "manifest must be a JSON object");
    if (auto const* f = root.find("format"); f && !(f->is_string() && f->as_string() == "qkgeom-dataset"))
        fail_input(src, "format", json::dump(*f), "not a qkgeom dataset manifest (expected \"qkgeom-dataset\")");
    if (auto const* ver = root.find("version"); ver && !(ver->is_int() && ver->as_int() == 1))
        fail_input(src, "version", json::dump(*ver), "unsupported manifest version (this build reads version 1)");
    return root;
}

inline void check_total_query_heads(std::vector<std::int64_t> const& n_q_heads, std::string const& src) {
    std::int64_t total = 0;
    for (auto h : n_q_heads) total += h;  // <= 1e5 layers * 65536 heads: no overflow
    if (total > manifest_max_query_heads)
        qkgeom::detail::fail_input(src, "n_q_heads", total,
                                   "more query heads over all layers than the limit of " +
                                       std::to_string(manifest_max_query_heads) + "; total");
}

/// capture.token_sampler and capture.rope_applied (issue 15) of the capture object `c`.
inline void parse_capture_provenance(json::value const& c, std::string const& src, manifest& m) {
    using qkgeom::detail::fail_input;
    if (auto const* ts = c.find("token_sampler")) {
        if (!ts->is_string() || ts->as_string().empty())
            fail_input(src, "capture.token_sampler", json::dump(*ts),
                       "must be a non-empty string (\"qkgeom\", or the tool that chose the tokens, e.g. \"qk-sniffer\")");
        m.token_sampler = ts->as_string();
    }
    auto const* ra = c.find("rope_applied");
    if (!ra) return;
    if (!ra->is_array())
        fail_input(src, "capture.rope_applied", json::dump(*ra), "must be an array of n_layers booleans");
    if (static_cast<std::int64_t>(ra->as_array().size()) != m.n_layers)
        fail_input(src, "capture.rope_applied", ra->as_array().size(),
                   "per-layer array length differs from n_layers = " + std::to_string(m.n_layers));
    for (std::size_t l = 0; l < ra->as_array().size(); ++l) {
        auto const& e = ra->as_array()[l];
        if (!e.is_bool())
            fail_input(src, "capture.rope_applied[" + std::to_string(l) + "]", json::dump(e),
                       "must be true (captured after RoPE) or false (before RoPE)");
        m.rope_applied.push_back(e.as_bool());
    }
}

/// The offset of each layer's first query head in a flat index over all
/// query heads (size n_layers + 1; the last is the total).
inline std::vector<std::int64_t> query_head_offsets(std::vector<std::int64_t> const& n_q_heads) {
    std::vector<std::int64_t> off(n_q_heads.size() + 1, 0);
    for (std::size_t l = 0; l < n_q_heads.size(); ++l) off[l + 1] = off[l] + n_q_heads[l];
    return off;
}

/// capture.heads (an explicit head plan) of the capture object `c`: a
/// non-empty array of at most sum(n_q_heads) distinct [layer, q_head] pairs
/// in range. Call after the head counts are validated.
inline void parse_capture_head_list(json::value const& c, std::string const& src, manifest& m) {
    using qkgeom::detail::fail_input;
    auto const* hl = c.find("heads");
    if (!hl) return;
    for (char const* other : {"head_count", "head_seed", "eligibility"})
        if (c.find(other))
            fail_input(src, "capture.heads", std::string("capture.") + other,
                       "an explicit head list and a head sampling (capture.head_count, head_seed, eligibility) "
                       "exclude each other; record one plan");
    if (!hl->is_array())
        fail_input(src, "capture.heads", json::dump(*hl), "must be an array of [layer, q_head] pairs");
    auto const off = query_head_offsets(m.n_q_heads);
    auto const& a = hl->as_array();
    if (a.empty())
        fail_input(src, "capture.heads", "[]", "lists no head (omit the field when no explicit plan is recorded)");
    if (static_cast<std::int64_t>(a.size()) > off.back())
        fail_input(src, "capture.heads", a.size(),
                   "more heads listed than the manifest's " + std::to_string(off.back()) + " query heads; length");
    std::vector<bool> seen(static_cast<std::size_t>(off.back()), false);
    m.head_list.reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        std::string const f = "capture.heads[" + std::to_string(i) + "]";
        auto const& e = a[i];
        if (!e.is_array() || e.as_array().size() != 2 || !e.as_array()[0].is_int() || !e.as_array()[1].is_int())
            fail_input(src, f, json::dump(e), "must be a pair of integers [layer, q_head]");
        std::int64_t const layer = e.as_array()[0].as_int(), q = e.as_array()[1].as_int();
        if (layer < 0 || layer >= m.n_layers)
            fail_input(src, f, json::dump(e), "layer outside [0, n_layers = " + std::to_string(m.n_layers) + ")");
        auto const lu = static_cast<std::size_t>(layer);
        if (q < 0 || q >= m.n_q_heads[lu])
            fail_input(src, f, json::dump(e),
                       "q_head outside [0, n_q_heads[" + std::to_string(layer) + "] = " + std::to_string(m.n_q_heads[lu]) + ")");
        auto const flat = static_cast<std::size_t>(off[lu] + q);
        if (seen[flat]) fail_input(src, f, json::dump(e), "head listed twice");
        seen[flat] = true;
        m.head_list.push_back({layer, q, key_head_of(q, m.n_q_heads[lu], m.n_kv_heads[lu])});
    }
}

}  // namespace detail

/// \brief Parses manifest.json text.
///
/// "format" and "version", when present, must be "qkgeom-dataset" and 1;
/// unknown fields are ignored; "gqa_group_size", when present, must agree
/// with the head counts. A UTF-8 byte-order mark is rejected with its own
/// message (RFC 8259 §8.1: JSON text must not begin with one). Missing
/// optional parts (buckets.rate → 1, capture.seed → 0, capture head sampling,
/// capture.heads, capture.rope_applied, capture.token_sampler → "qkgeom", rope,
/// sliding_window) read as their defaults / "not recorded".
/// \param[in] text the JSON text.
/// \param[in] src  the source named in error messages (usually the path).
/// \returns the manifest.
/// \throws qkgeom::input_error (source, field, value) for invalid JSON (as
///         json::parse), a leading byte-order mark, a format other than
///         "qkgeom-dataset" or a version other than 1, a missing required
///         field, a field of the wrong type, n_layers < 1 or >
///         manifest_max_layers, a head count < 1, above
///         manifest_max_heads_per_layer or not a GQA multiple, more than
///         manifest_max_query_heads query heads in all,
///         a per-layer array of the wrong length, head_dim < 1 or > 2^40,
///         context_length < 1, an unknown bucket scheme, width < 1, rate not
///         finite and > 0, a negative capture.seed / head_seed / head_count,
///         head_seed or eligibility without head_count, a capture.heads
///         that is not a non-empty array of at most manifest-total distinct
///         [layer, q_head] pairs in range or that comes with
///         capture.head_count / head_seed / eligibility, a
///         capture.token_sampler that is not a non-empty string, a
///         capture.rope_applied that is not an array of n_layers booleans, an invalid rope
///         block (pairing, rotary_dim odd or outside [0, head_dim], theta or
///         scaling_factor not finite and > 0, scaling_factor ≠ 1 with scaling
///         "none"), a sliding window < 1, or an inconsistent gqa_group_size.
/// \throws std::bad_alloc if the text or manifest cannot be held in memory.
/// \sa dump_manifest, read_manifest
[[nodiscard]] inline manifest parse_manifest(std::string_view text, std::string const& src = "manifest.json") {
    using qkgeom::detail::fail_input;
    json::value const root = detail::parse_manifest_root(text, src);
    manifest m;
    auto const* model = root.find("model");
    if (!model || !model->is_string())
        fail_input(src, "model", model ? json::dump(*model) : std::string("<missing>"), "model name must be a string");
    m.model = model->as_string();
    constexpr std::int64_t big = std::int64_t{1} << 40;
    m.n_layers = detail::json_int(root, src, "n_layers", 1);
    if (m.n_layers > manifest_max_layers)
        fail_input(src, "n_layers", m.n_layers, "more layers than the limit of " + std::to_string(manifest_max_layers));
    m.n_q_heads = detail::json_per_layer(root, src, "n_q_heads", m.n_layers);
    m.n_kv_heads = detail::json_per_layer(root, src, "n_kv_heads", m.n_layers);
    detail::check_total_query_heads(m.n_q_heads, src);
    for (std::size_t l = 0; l < m.n_q_heads.size(); ++l)
        if (m.n_q_heads[l] % m.n_kv_heads[l] != 0)
            fail_input(src, "n_kv_heads[" + std::to_string(l) + "]", m.n_kv_heads[l],
                       "n_q_heads (" + std::to_string(m.n_q_heads[l]) + ") must be a multiple of n_kv_heads");
    m.head_dim = detail::json_int(root, src, "head_dim", 1);
    if (m.head_dim > big) fail_input(src, "head_dim", m.head_dim, "implausibly large");
    m.context_length = detail::json_int(root, src, "context_length", 1);
    auto const* b = root.find("buckets");
    if (!b || !b->is_object())
        fail_input(src, "buckets", b ? json::dump(*b) : std::string("<missing>"),
                   "must be an object {scheme, width, rate}");
    auto const* sc = b->find("scheme");
    if (!sc || !sc->is_string()) fail_input(src, "buckets.scheme", sc ? json::dump(*sc) : "<missing>", "must be a string");
    if (sc->as_string() == "uniform") m.buckets.scheme = bucket_scheme::uniform;
    else if (sc->as_string() == "log") m.buckets.scheme = bucket_scheme::log;
    else if (sc->as_string() == "all") m.buckets.scheme = bucket_scheme::all;
    else fail_input(src, "buckets.scheme", sc->as_string(), "unknown bucket scheme (uniform, log, all)");
    m.buckets.width = detail::json_int(*b, src, "width", 1);
    if (auto const* r = b->find("rate")) {
        if (!r->is_number() || !(r->as_double() > 0.0) || !std::isfinite(r->as_double()))
            fail_input(src, "buckets.rate", json::dump(*r), "must be a finite number > 0");
        m.buckets.rate = r->as_double();
    } else {
        m.buckets.rate = 1.0;
    }
    if (auto const* c = root.find("capture")) {
        if (!c->is_object()) fail_input(src, "capture", json::dump(*c), "must be an object");
        if (auto const* s = c->find("seed")) {
            if (!s->is_int() || s->as_int() < 0) fail_input(src, "capture.seed", json::dump(*s), "must be an integer >= 0");
            m.seed = static_cast<std::uint64_t>(s->as_int());
        }
        detail::parse_capture_provenance(*c, src, m);
        detail::parse_capture_head_list(*c, src, m);
        auto const* hc = c->find("head_count");
        auto const* hs = c->find("head_seed");
        auto const* el = c->find("eligibility");
        if (hc) {
            head_sampling h;
            if (hc->is_int() && hc->as_int() >= 0) h.count = hc->as_int();
            else if (!hc->is_null())
                fail_input(src, "capture.head_count", json::dump(*hc), "must be an integer >= 0 or null (every eligible head)");
            if (hs) {
                if (!hs->is_int() || hs->as_int() < 0)
                    fail_input(src, "capture.head_seed", json::dump(*hs), "must be an integer >= 0");
                h.seed = static_cast<std::uint64_t>(hs->as_int());
            }
            if (el) {
                if (el->is_string() && el->as_string() == "full_attention_only")
                    h.eligibility = layer_eligibility::full_attention_only;
                else if (el->is_string() && el->as_string() == "all_layers")
                    h.eligibility = layer_eligibility::all_layers;
                else
                    fail_input(src, "capture.eligibility", json::dump(*el),
                               "must be \"full_attention_only\" or \"all_layers\"");
            }
            m.heads = h;
        } else if (hs || el) {
            fail_input(src, "capture.head_count", "<missing>",
                       "required when capture.head_seed or capture.eligibility is given");
        }
    }
    if (auto const* r = root.find("rope")) {
        if (!r->is_object())
            fail_input(src, "rope", json::dump(*r),
                       "must be an object {pairing, rotary_dim, theta, scaling, scaling_factor}");
        rope_spec rs;
        auto const* pr = r->find("pairing");
        if (!pr) fail_input(src, "rope.pairing", "<missing>", "required (\"rotate_half\" or \"interleaved\")");
        if (pr->is_string() && pr->as_string() == "rotate_half") rs.pairing = rope_pairing::rotate_half;
        else if (pr->is_string() && pr->as_string() == "interleaved") rs.pairing = rope_pairing::interleaved;
        else fail_input(src, "rope.pairing", json::dump(*pr), "must be \"rotate_half\" or \"interleaved\"");
        if (auto const* rd = r->find("rotary_dim")) {
            if (!rd->is_int() || rd->as_int() < 0 || rd->as_int() > m.head_dim || rd->as_int() % 2 != 0)
                fail_input(src, "rope.rotary_dim", json::dump(*rd),
                           "must be an even integer in [0, head_dim = " + std::to_string(m.head_dim) + "] (0 = whole head)");
            rs.rotary_dim = rd->as_int();
        }
        auto const* th = r->find("theta");
        if (!th) fail_input(src, "rope.theta", "<missing>", "required (the RoPE base frequency)");
        if (!th->is_number() || !std::isfinite(th->as_double()) || !(th->as_double() > 0.0))
            fail_input(src, "rope.theta", json::dump(*th), "must be a finite number > 0");
        rs.theta = th->as_double();
        if (auto const* sc2 = r->find("scaling")) {
            if (!sc2->is_string() || sc2->as_string().empty())
                fail_input(src, "rope.scaling", json::dump(*sc2), "must be a non-empty string (\"none\", \"linear\", ...)");
            rs.scaling = sc2->as_string();
        }
        if (auto const* sf = r->find("scaling_factor")) {
            if (!sf->is_number() || !std::isfinite(sf->as_double()) || !(sf->as_double() > 0.0))
                fail_input(src, "rope.scaling_factor", json::dump(*sf), "must be a finite number > 0");
            rs.scaling_factor = sf->as_double();
        }
        if (rs.scaling == "none" && rs.scaling_factor != 1.0)
            fail_input(src, "rope.scaling_factor", rs.scaling_factor, "must be 1 when rope.scaling is \"none\"");
        m.rope = rs;
    }
    if (auto const* sw = root.find("sliding_window")) {
        if (!sw->is_array())
            fail_input(src, "sliding_window", json::dump(*sw), "must be an array of n_layers integers or nulls");
        if (static_cast<std::int64_t>(sw->as_array().size()) != m.n_layers)
            fail_input(src, "sliding_window", sw->as_array().size(),
                       "per-layer array length differs from n_layers = " + std::to_string(m.n_layers));
        for (std::size_t l = 0; l < sw->as_array().size(); ++l) {
            auto const& e = sw->as_array()[l];
            if (e.is_null()) m.sliding_window.emplace_back();
            else if (e.is_int() && e.as_int() >= 1) m.sliding_window.emplace_back(e.as_int());
            else
                fail_input(src, "sliding_window[" + std::to_string(l) + "]", json::dump(e),
                           "must be an integer >= 1 or null (full attention)");
        }
    }
    if (root.find("gqa_group_size")) {  // derived; written for readers' convenience, checked here
        auto const g = detail::json_per_layer(root, src, "gqa_group_size", m.n_layers);
        for (std::size_t l = 0; l < g.size(); ++l)
            if (g[l] != m.n_q_heads[l] / m.n_kv_heads[l])
                fail_input(src, "gqa_group_size[" + std::to_string(l) + "]", g[l],
                           "differs from n_q_heads / n_kv_heads = " + std::to_string(m.n_q_heads[l]) + " / " +
                               std::to_string(m.n_kv_heads[l]));
    }
    return m;
}

/// \brief Reads DIR/manifest.json.
/// \param[in] dir the dataset directory.
/// \returns the parsed manifest.
/// \throws qkgeom::input_error (source = the file's path) when it is not a
///         regular file (as regular_file_size), is larger than
///         manifest_max_bytes (field "file size", checked before reading),
///         cannot be opened or read (with the operating system's reason), or
///         as parse_manifest.
/// \throws std::bad_alloc if the file does not fit in memory.
[[nodiscard]] inline manifest read_manifest(std::filesystem::path const& dir) {
    auto const p = dir / "manifest.json";
    auto const bytes = detail::read_file_bytes(p, manifest_max_bytes, "file size");
    return parse_manifest(std::string_view(reinterpret_cast<char const*>(bytes.data()), bytes.size()), p.string());
}

/// \brief The manifest as JSON text (pretty-printed).
///
/// Not validated (write_manifest validates by re-parsing); adds the derived
/// "format", "version" and "gqa_group_size" fields.
/// \param[in] m the manifest.
/// \returns the JSON text, ending in a newline.
/// \throws std::invalid_argument when m.seed or heads->seed is ≥ 2^63 (JSON
///         integers here are int64), when buckets.rate, rope.theta or
///         rope.scaling_factor is not finite, or a string is not valid UTF-8
///         (as json::dump).
/// \throws std::bad_alloc if the text cannot be allocated.
[[nodiscard]] inline std::string dump_manifest(manifest const& m) {
    if (m.seed > static_cast<std::uint64_t>(INT64_MAX))
        qkgeom::detail::fail_arg("qkgeom::io::dump_manifest", "seed must be < 2^63", m.seed);
    if (m.heads && m.heads->seed > static_cast<std::uint64_t>(INT64_MAX))
        qkgeom::detail::fail_arg("qkgeom::io::dump_manifest", "heads->seed (capture.head_seed) must be < 2^63",
                                 m.heads->seed);
    auto ints = [](std::vector<std::int64_t> const& v) {
        json::array a;
        for (auto x : v) a.emplace_back(x);
        return json::value(std::move(a));
    };
    json::object b{{"scheme", json::value(bucket_scheme_name(m.buckets.scheme))},
                   {"width", json::value(m.buckets.width)},
                   {"rate", json::value(m.buckets.rate)}};
    json::object cap{{"seed", json::value(static_cast<std::int64_t>(m.seed))},
                     {"token_sampler", json::value(m.token_sampler)}};
    if (!m.rope_applied.empty()) {
        json::array ra;
        for (bool x : m.rope_applied) ra.emplace_back(x);
        cap.emplace_back("rope_applied", json::value(std::move(ra)));
    }
    if (m.heads) {
        cap.emplace_back("head_count", m.heads->count ? json::value(*m.heads->count) : json::value(nullptr));
        cap.emplace_back("head_seed", json::value(static_cast<std::int64_t>(m.heads->seed)));
        cap.emplace_back("eligibility", json::value(layer_eligibility_name(m.heads->eligibility)));
    }
    if (!m.head_list.empty()) {
        json::array hl;
        hl.reserve(m.head_list.size());
        for (head_id const& h : m.head_list) hl.emplace_back(json::array{json::value(h.layer), json::value(h.q_head)});
        cap.emplace_back("heads", json::value(std::move(hl)));
    }
    std::vector<std::int64_t> groups;
    for (std::size_t l = 0; l < m.n_q_heads.size() && l < m.n_kv_heads.size(); ++l)
        groups.push_back(m.n_kv_heads[l] > 0 ? m.n_q_heads[l] / m.n_kv_heads[l] : 0);
    json::object o{{"format", json::value("qkgeom-dataset")},
                   {"version", json::value(1)},
                   {"model", json::value(m.model)},
                   {"n_layers", json::value(m.n_layers)},
                   {"n_q_heads", ints(m.n_q_heads)},
                   {"n_kv_heads", ints(m.n_kv_heads)},
                   {"gqa_group_size", ints(groups)},
                   {"head_dim", json::value(m.head_dim)},
                   {"buckets", json::value(std::move(b))},
                   {"context_length", json::value(m.context_length)}};
    if (!m.sliding_window.empty()) {
        json::array sw;
        for (auto const& w : m.sliding_window) sw.push_back(w ? json::value(*w) : json::value(nullptr));
        o.emplace_back("sliding_window", json::value(std::move(sw)));
    }
    if (m.rope) {
        o.emplace_back("rope", json::value(json::object{{"pairing", json::value(rope_pairing_name(m.rope->pairing))},
                                                        {"rotary_dim", json::value(m.rope->rotary_dim)},
                                                        {"theta", json::value(m.rope->theta)},
                                                        {"scaling", json::value(m.rope->scaling)},
                                                        {"scaling_factor", json::value(m.rope->scaling_factor)}}));
    }
    o.emplace_back("capture", json::value(std::move(cap)));
    return json::dump(json::value(std::move(o)), 2) + "\n";
}

/// \brief Writes DIR/manifest.json (creating DIR). Validates by re-parsing.
/// \param[in] dir the dataset directory (created with its parents if needed).
/// \param[in] m   the manifest.
/// \throws std::invalid_argument when m.seed or heads->seed is ≥ 2^63, a rope
///         or bucket-rate value is not finite.
/// \throws qkgeom::io_error naming the path when the file cannot be written
///         (written to a temporary file, then renamed: never a partial manifest).
/// \throws qkgeom::input_error (source "qkgeom::io::write_manifest") for any
///         other invalid field, as parse_manifest reports it (head_list as
///         capture.heads); nothing is written then.
/// \throws std::invalid_argument for a head_list k_head other than -1 or the
///         derived key head (nothing written).
/// \throws std::filesystem::filesystem_error when DIR cannot be created.
/// \throws std::bad_alloc if the text cannot be allocated.
inline void write_manifest(std::filesystem::path const& dir, manifest const& m) {
    if (m.seed > static_cast<std::uint64_t>(INT64_MAX)) qkgeom::detail::fail_arg("qkgeom::io::write_manifest", "seed must be < 2^63", m.seed);
    if (m.heads && m.heads->seed > static_cast<std::uint64_t>(INT64_MAX))
        qkgeom::detail::fail_arg("qkgeom::io::write_manifest", "heads->seed (capture.head_seed) must be < 2^63", m.heads->seed);
    if (m.rope && !(std::isfinite(m.rope->theta) && std::isfinite(m.rope->scaling_factor)))
        qkgeom::detail::fail_arg("qkgeom::io::write_manifest", "rope theta and scaling_factor must be finite; theta", m.rope->theta);
    std::string const text = dump_manifest(m);
    manifest const back = parse_manifest(text, "qkgeom::io::write_manifest");
    for (std::size_t i = 0; i < m.head_list.size(); ++i)  // back.head_list holds the derived key heads
        if (m.head_list[i].k_head != -1 && m.head_list[i].k_head != back.head_list[i].k_head)
            qkgeom::detail::fail_arg("qkgeom::io::write_manifest",
                                     "head_list[" + std::to_string(i) + "].k_head must be -1 (derived) or key_head_of = " +
                                         std::to_string(back.head_list[i].k_head),
                                     m.head_list[i].k_head);
    std::filesystem::create_directories(dir);
    detail::write_file_bytes(dir / "manifest.json",
                             std::span<unsigned char const>(reinterpret_cast<unsigned char const*>(text.data()), text.size()));
}

/// \brief The model layout a manifest describes (head_dim, per-layer head
/// counts, per-layer sliding window; full attention where none is recorded),
/// for eligible_heads / sample_heads / capture_store.
/// \param[in] m the manifest.
/// \returns the layout, one layer_layout per layer.
/// \throws std::invalid_argument for an inconsistent manifest: n_layers < 1,
///         n_q_heads / n_kv_heads / a recorded sliding_window whose length
///         differs from n_layers, or as check_layout (head_dim < 1, head
///         counts, GQA divisibility, windows < 1).
/// \throws std::bad_alloc if the layout cannot be allocated.
[[nodiscard]] inline model_layout layout_of(manifest const& m) {
    constexpr std::string_view fn = "qkgeom::io::layout_of";
    if (m.n_layers < 1) qkgeom::detail::fail_arg(fn, "n_layers must be >= 1", m.n_layers);
    auto const nl = static_cast<std::size_t>(m.n_layers);
    if (m.n_q_heads.size() != nl) qkgeom::detail::fail_arg(fn, "n_q_heads: length differs from n_layers; length", m.n_q_heads.size());
    if (m.n_kv_heads.size() != nl) qkgeom::detail::fail_arg(fn, "n_kv_heads: length differs from n_layers; length", m.n_kv_heads.size());
    if (!m.sliding_window.empty() && m.sliding_window.size() != nl)
        qkgeom::detail::fail_arg(fn, "sliding_window: length differs from n_layers; length", m.sliding_window.size());
    model_layout out;
    out.head_dim = m.head_dim;
    for (std::size_t l = 0; l < nl; ++l)
        out.layers.push_back({m.n_q_heads[l], m.n_kv_heads[l],
                              m.sliding_window.empty() ? std::optional<std::int64_t>{} : m.sliding_window[l]});
    check_layout(out, fn);
    return out;
}

/// \brief The head pairs a manifest's head sampling selects:
/// sample_heads(layout_of(m), count, seed, eligibility), or every eligible
/// head when count is none.
/// \param[in] m the manifest.
/// \returns the head pairs, ascending by (layer, q_head).
/// \throws std::invalid_argument when the manifest records no head sampling,
///         for an inconsistent manifest (as layout_of), or a negative count.
/// \throws std::bad_alloc if the list cannot be allocated.
/// \sa planned_heads
[[nodiscard]] inline std::vector<head_id> sampled_heads(manifest const& m) {
    if (!m.heads)
        qkgeom::detail::fail_arg("qkgeom::io::sampled_heads", "the manifest records no head sampling (capture.head_count)",
                                 m.model);
    auto const layout = layout_of(m);
    if (!m.heads->count) return eligible_heads(layout, m.heads->eligibility);
    return sample_heads(layout, *m.heads->count, m.heads->seed, m.heads->eligibility);
}

namespace detail {

template <class T>
std::string compat_text(T const& v) {
    if constexpr (std::is_same_v<T, std::string>) {
        return "\"" + v + "\"";
    } else {
        std::ostringstream os;
        os.precision(17);
        os << v;
        return os.str();
    }
}
inline std::string compat_text(std::optional<std::int64_t> const& v) {
    return v ? std::to_string(*v) : std::string("null");
}
inline std::string compat_text(head_id const& h) {
    return "[" + std::to_string(h.layer) + ", " + std::to_string(h.q_head) + "]";
}

/// (layer, q_head) of a head list, ascending (k_head dropped: it is derived).
inline std::vector<head_id> sorted_pairs(std::vector<head_id> const& v) {
    std::vector<head_id> out;
    out.reserve(v.size());
    for (head_id const& h : v) out.push_back({h.layer, h.q_head, -1});
    std::sort(out.begin(), out.end());
    return out;
}

template <class T>
void compat_field(std::string_view field, T const& a, T const& b) {
    if (a == b) return;
    throw std::invalid_argument("qkgeom::io::check_compatible: manifests differ in " + std::string(field) + ": " +
                                compat_text(a) + " vs " + compat_text(b));
}

}  // namespace detail

/// \brief Checks that two captures may be merged (datasets, moment shards):
/// throws std::invalid_argument naming the first field that differs and both
/// values, e.g. "qkgeom::io::check_compatible: manifests differ in
/// n_kv_heads[3]: 8 vs 4".
///
/// Fields, in the order checked: model, n_layers, head_dim, n_q_heads[L],
/// n_kv_heads[L], buckets.scheme, buckets.width, buckets.rate,
/// capture.token_sampler, capture.seed, context_length, rope (recorded or
/// not), rope.pairing, rope.rotary_dim, rope.theta, rope.scaling,
/// rope.scaling_factor, capture.rope_applied (recorded or not),
/// capture.rope_applied[L], sliding_window (recorded or not), sliding_window[L], capture.head_sampling (recorded or not),
/// capture.head_count, capture.head_seed, capture.eligibility, capture.heads
/// (recorded or not), capture.heads.length, capture.heads (ascending)[i]
/// (the lists compared as sets: sorted by (layer, q_head)). A field
/// recorded in one manifest and not in the other is a difference: the merged
/// capture could not say what it is. docs/dataset.md gives the reason for each.
/// \param[in] a one manifest.
/// \param[in] b the other.
/// \throws std::invalid_argument naming the first field that differs and both
///         values ("model" included: only the model name is compared, not the
///         format version).
/// \throws std::bad_alloc if the message cannot be allocated.
inline void check_compatible(manifest const& a, manifest const& b) {
    using detail::compat_field;
    compat_field("model", a.model, b.model);
    compat_field("n_layers", a.n_layers, b.n_layers);
    compat_field("head_dim", a.head_dim, b.head_dim);
    auto per_layer = [](std::string_view name, std::vector<std::int64_t> const& x, std::vector<std::int64_t> const& y) {
        compat_field(std::string(name) + ".length", x.size(), y.size());
        for (std::size_t l = 0; l < x.size(); ++l) compat_field(std::string(name) + "[" + std::to_string(l) + "]", x[l], y[l]);
    };
    per_layer("n_q_heads", a.n_q_heads, b.n_q_heads);
    per_layer("n_kv_heads", a.n_kv_heads, b.n_kv_heads);
    compat_field("buckets.scheme", std::string(bucket_scheme_name(a.buckets.scheme)),
                 std::string(bucket_scheme_name(b.buckets.scheme)));
    compat_field("buckets.width", a.buckets.width, b.buckets.width);
    compat_field("buckets.rate", a.buckets.rate, b.buckets.rate);
    compat_field("capture.token_sampler", a.token_sampler, b.token_sampler);
    compat_field("capture.seed", a.seed, b.seed);
    compat_field("context_length", a.context_length, b.context_length);
    auto recorded = [](bool x) { return std::string(x ? "recorded" : "not recorded"); };
    compat_field("rope", recorded(a.rope.has_value()), recorded(b.rope.has_value()));
    if (a.rope) {
        compat_field("rope.pairing", std::string(rope_pairing_name(a.rope->pairing)),
                     std::string(rope_pairing_name(b.rope->pairing)));
        compat_field("rope.rotary_dim", a.rope->rotary_dim, b.rope->rotary_dim);
        compat_field("rope.theta", a.rope->theta, b.rope->theta);
        compat_field("rope.scaling", a.rope->scaling, b.rope->scaling);
        compat_field("rope.scaling_factor", a.rope->scaling_factor, b.rope->scaling_factor);
    }
    compat_field("capture.rope_applied", recorded(!a.rope_applied.empty()), recorded(!b.rope_applied.empty()));
    if (!a.rope_applied.empty()) {
        compat_field("capture.rope_applied.length", a.rope_applied.size(), b.rope_applied.size());
        for (std::size_t l = 0; l < a.rope_applied.size(); ++l)
            compat_field("capture.rope_applied[" + std::to_string(l) + "]", std::string(a.rope_applied[l] ? "true" : "false"),
                         std::string(b.rope_applied[l] ? "true" : "false"));
    }
    compat_field("sliding_window", recorded(!a.sliding_window.empty()), recorded(!b.sliding_window.empty()));
    if (!a.sliding_window.empty()) {
        compat_field("sliding_window.length", a.sliding_window.size(), b.sliding_window.size());
        for (std::size_t l = 0; l < a.sliding_window.size(); ++l)
            compat_field("sliding_window[" + std::to_string(l) + "]", a.sliding_window[l], b.sliding_window[l]);
    }
    compat_field("capture.head_sampling", recorded(a.heads.has_value()), recorded(b.heads.has_value()));
    if (a.heads) {
        compat_field("capture.head_count", a.heads->count, b.heads->count);
        compat_field("capture.head_seed", a.heads->seed, b.heads->seed);
        compat_field("capture.eligibility", std::string(layer_eligibility_name(a.heads->eligibility)),
                     std::string(layer_eligibility_name(b.heads->eligibility)));
    }
    compat_field("capture.heads", recorded(!a.head_list.empty()), recorded(!b.head_list.empty()));
    if (!a.head_list.empty()) {
        compat_field("capture.heads.length", a.head_list.size(), b.head_list.size());
        auto const x = detail::sorted_pairs(a.head_list), y = detail::sorted_pairs(b.head_list);
        for (std::size_t i = 0; i < x.size(); ++i)
            compat_field("capture.heads (ascending)[" + std::to_string(i) + "]", x[i], y[i]);
    }
}

namespace detail {

inline dtype vector_dtype_from_name(std::string_view s) {
    if (s == "f32") return dtype::f32;
    if (s == "f64") return dtype::f64;
    if (s == "f16") return dtype::f16;
    if (s == "bf16") return dtype::bf16;
    qkgeom::detail::fail_arg("qkgeom::io::write_head", "vector dtype must be f32, f64, f16 or bf16", s);
}

inline std::vector<unsigned char> encode_vectors(row_matrix const& v, dtype t) {
    std::size_t const n = static_cast<std::size_t>(v.size()), w = dtype_size(t);
    std::vector<unsigned char> out(n * w);
    double const* p = v.data();
    for (std::size_t i = 0; i < n; ++i) {
        unsigned char* q = out.data() + i * w;
        switch (t) {
            case dtype::f64: store_value(q, p[i]); break;
            case dtype::f32: store_value(q, static_cast<float>(p[i])); break;
            case dtype::f16: store_value(q, float16::from_float(static_cast<float>(p[i]))); break;
            case dtype::bf16: store_value(q, bfloat16::from_float(static_cast<float>(p[i]))); break;
            default: break;
        }
    }
    return out;
}

inline npy_array int_array(std::vector<std::int64_t> const& v) {
    return make_npy(std::span<std::int64_t const>(v), {static_cast<std::int64_t>(v.size())});
}

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

namespace detail {

/// Throws std::invalid_argument (naming `fn`) when e.layer / e.head are
/// outside the manifest's counts or the manifest is inconsistent.
inline void check_entry_range(manifest const& m, head_entry const& e, std::string_view fn) {
    if (m.n_q_heads.size() != static_cast<std::size_t>(std::max<std::int64_t>(m.n_layers, 0)) ||
        m.n_kv_heads.size() != m.n_q_heads.size())
        qkgeom::detail::fail_arg(fn, "inconsistent manifest: n_q_heads / n_kv_heads lengths differ from n_layers; n_layers",
                                 m.n_layers);
    if (e.layer < 0 || e.layer >= m.n_layers)
        qkgeom::detail::fail_arg(fn, "layer outside [0, n_layers = " + std::to_string(m.n_layers) + "); layer", e.layer);
    auto const L = static_cast<std::size_t>(e.layer);
    std::int64_t const nh = e.k == kind::query ? m.n_q_heads[L] : m.n_kv_heads[L];
    if (e.head < 0 || e.head >= nh)
        qkgeom::detail::fail_arg(fn,
                                 std::string("head outside [0, ") + (e.k == kind::query ? "n_q_heads" : "n_kv_heads") +
                                     " = " + std::to_string(nh) + "); head",
                                 e.head);
}

/// The files an entry in NumPy form holds.
inline constexpr std::string_view npy_entry_files[] = {"vectors.npy", "position.npy", "bucket.npy", "example_id.npy",
                                                       "sliding_window.npy"};

/// Removes an entry directory in NumPy form (its known files, then the
/// directory); nothing when absent. Throws io_error when `sub` is not such a
/// directory (another file type, or other files inside: never removed).
inline void remove_npy_entry(std::filesystem::path const& sub) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto const t = fs::symlink_status(sub, ec).type();
    if (t == fs::file_type::not_found) return;
    if (t != fs::file_type::directory)
        throw io_error(sub.string(), "qkgeom::io::write_head: cannot replace '" + escape_text(sub.string()) +
                                         "': not a directory of .npy files; remove it by hand");
    for (auto const& de : fs::directory_iterator(sub, ec)) {
        auto const fname = de.path().filename().string();
        if (std::find(std::begin(npy_entry_files), std::end(npy_entry_files), fname) == std::end(npy_entry_files))
            throw io_error(sub.string(), "qkgeom::io::write_head: cannot replace '" + escape_text(sub.string()) +
                                             "': it holds a file that is not part of an entry ('" +
                                             escape_text(fname) + "'); remove it by hand");
    }
    for (auto f : npy_entry_files) fs::remove(sub / std::string(f), ec);
    if (!fs::remove(sub, ec) || ec)
        throw io_error(sub.string(), "qkgeom::io::write_head: cannot remove '" + escape_text(sub.string()) +
                                         "': " + (ec ? ec.message() : std::string("not removed")));
}

/// Removes an entry file (.npz / .safetensors form); nothing when absent.
inline void remove_entry_file(std::filesystem::path const& p) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto const t = fs::symlink_status(p, ec).type();
    if (t == fs::file_type::not_found) return;
    if (t == fs::file_type::directory)
        throw io_error(p.string(), "qkgeom::io::write_head: cannot replace '" + escape_text(p.string()) +
                                       "': is a directory; remove it by hand");
    fs::remove(p, ec);
    if (ec)
        throw io_error(p.string(), "qkgeom::io::write_head: cannot remove '" + escape_text(p.string()) + "': " +
                                       ec.message());
}

/// Writes an entry in NumPy form: into a temporary directory next to `sub`,
/// which then replaces `sub` (no partial entry is left on failure).
inline void write_npy_entry(std::filesystem::path const& sub, head_entry const& e, npy_array v) {
    namespace fs = std::filesystem;
    static std::atomic<unsigned> counter{0};
    fs::path tmp = sub;
    tmp += ".tmp-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007) + "-" +
           std::to_string(counter++);
    std::error_code ec;
    if (!fs::create_directory(tmp, ec) || ec)
        throw io_error(tmp.string(), "qkgeom::io::write_head: cannot create '" + escape_text(tmp.string()) +
                                         "': " + (ec ? ec.message() : std::string("it exists")));
    try {
        write_npy(tmp / "vectors.npy", v);
        write_npy(tmp / "position.npy", int_array(e.position.values()));
        write_npy(tmp / "bucket.npy", int_array(e.bucket.values()));
        write_npy(tmp / "example_id.npy", int_array(e.example_id.values()));
        if (e.sliding_window) {
            std::int64_t const w = *e.sliding_window;
            write_npy(tmp / "sliding_window.npy", make_npy(std::span<std::int64_t const>(&w, 1), {}));
        }
        remove_npy_entry(sub);
        fs::rename(tmp, sub, ec);
        if (ec)
            throw io_error(sub.string(), "qkgeom::io::write_head: cannot rename '" + escape_text(tmp.string()) +
                                             "' to '" + escape_text(sub.string()) + "': " + ec.message());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
}

}  // namespace detail

/// \brief Writes one head entry under DIR in the given format, vectors stored
/// as `vector_dtype` ("f32", "f64", "f16", "bf16"; narrowing rounds to nearest even).
/// Validates the entry (lengths, finiteness, buckets, sliding window) against
/// the manifest first. `npz_method` is the compression of the npz form
/// (deflate needs zlib: npz_deflate_available()).
///
/// Each file is written to a temporary name in the same directory and
/// renamed into place (the NumPy form: a temporary directory that replaces
/// the entry's directory), so a failure leaves no partial entry. After the
/// write, the entry's other storage forms are removed (so read_head never
/// finds it in two forms); an entry directory holding other files than the
/// entry's .npy files, or a directory in place of a .npz / .safetensors
/// entry, is never removed: io_error then.
/// \param[in] dir          the dataset directory (created if needed).
/// \param[in] m            the dataset's manifest.
/// \param[in] e            the entry: layer, head, kind and rows.
/// \param[in] format       the storage form.
/// \param[in] vector_dtype "f32" (default), "f64", "f16" or "bf16".
/// \param[in] npz_method   compression of the npz members (npz form only).
/// \throws qkgeom::input_error for an invalid entry (naming the file, field
///         and value): a column count other than head_dim, position / bucket
///         / example_id lengths other than the row count, a non-finite value,
///         a position < 0 or ≥ context_length, a bucket inconsistent with its
///         position, a sliding window < 1 or one that differs from the
///         manifest's for the layer.
/// \throws std::invalid_argument for a layer or head outside the manifest's
///         counts, a bad vector_dtype, an invalid bucket spec in the
///         manifest, an unknown format or npz compression unavailable in
///         this build (as write_npz).
/// \throws qkgeom::io_error naming the path when a file cannot be written,
///         renamed or an older form of the entry cannot be removed.
/// \throws std::filesystem::filesystem_error when a directory cannot be created.
/// \throws std::bad_alloc if the encoded arrays cannot be allocated.
/// \sa read_head
inline void write_head(std::filesystem::path const& dir, manifest const& m, head_entry const& e, storage_format format,
                       std::string_view vector_dtype = "f32", npz_compression npz_method = npz_compression::stored) {
    namespace fs = std::filesystem;
    detail::check_entry_range(m, e, "qkgeom::io::write_head");
    std::string const name = head_entry_name(e.layer, e.head, e.k);
    detail::validate_head(e, m, [&](std::string_view) { return (dir / name).string(); });
    dtype const t = detail::vector_dtype_from_name(vector_dtype);
    if (format != storage_format::npy && format != storage_format::npz && format != storage_format::safetensors)
        qkgeom::detail::fail_arg("qkgeom::io::write_head", "unknown storage format", static_cast<int>(format));
    std::vector<std::int64_t> const vshape{e.vectors.rows(), e.vectors.cols()};
    fs::create_directories(dir);
    auto const sub = dir / name, nz = dir / (name + ".npz"), st = dir / (name + ".safetensors");
    npy_array v;
    v.descr = std::string(detail::npy_descr_of(t));
    v.shape = vshape;
    v.data = detail::encode_vectors(e.vectors, t);
    if (format == storage_format::npy) {
        detail::write_npy_entry(sub, e, std::move(v));
    } else if (format == storage_format::npz) {
        npz_file f;
        f.add("vectors", std::move(v));
        f.add("position", detail::int_array(e.position.values()));
        f.add("bucket", detail::int_array(e.bucket.values()));
        f.add("example_id", detail::int_array(e.example_id.values()));
        if (e.sliding_window) {
            std::int64_t const w = *e.sliding_window;
            f.add("sliding_window", make_npy(std::span<std::int64_t const>(&w, 1), {}));
        }
        npz_write_options opt;
        opt.compression = npz_method;
        write_npz(nz, f, opt);
    } else {
        safetensors_file f;
        st_tensor vt;
        vt.type = t;
        vt.shape = vshape;
        vt.data = std::move(v.data);
        f.tensors.emplace("vectors", std::move(vt));
        auto ints = [](std::vector<std::int64_t> const& x) {
            return make_tensor(std::span<std::int64_t const>(x), {static_cast<std::int64_t>(x.size())});
        };
        f.tensors.emplace("position", ints(e.position.values()));
        f.tensors.emplace("bucket", ints(e.bucket.values()));
        f.tensors.emplace("example_id", ints(e.example_id.values()));
        if (e.sliding_window) {
            std::int64_t const w = *e.sliding_window;
            f.tensors.emplace("sliding_window", make_tensor(std::span<std::int64_t const>(&w, 1), {}));
        }
        f.metadata.emplace("format", "qkgeom-dataset");
        write_safetensors(st, f);
    }
    // The entry now exists in `format`; remove its other forms so reads stay unambiguous.
    if (format != storage_format::npy) detail::remove_npy_entry(sub);
    if (format != storage_format::npz) detail::remove_entry_file(nz);
    if (format != storage_format::safetensors) detail::remove_entry_file(st);
}

/// \brief As above, reading the manifest from DIR/manifest.json.
/// \param[in] dir          the dataset directory; DIR/manifest.json must exist.
/// \param[in] e            the entry: layer, head, kind and rows.
/// \param[in] format       the storage form.
/// \param[in] vector_dtype "f32" (default), "f64", "f16" or "bf16".
/// \param[in] npz_method   compression of the npz members (npz form only).
/// \throws qkgeom::input_error as read_manifest and as the overload above.
/// \throws std::invalid_argument, std::filesystem::filesystem_error,
///         std::bad_alloc as the overload above.
inline void write_head(std::filesystem::path const& dir, head_entry const& e, storage_format format,
                       std::string_view vector_dtype = "f32", npz_compression npz_method = npz_compression::stored) {
    write_head(dir, read_manifest(dir), e, format, vector_dtype, npz_method);
}

namespace detail {

inline std::vector<std::int64_t> int_vector(npy_array const& a, std::string const& src, std::string const& field) {
    if (a.shape.size() != 1)
        qkgeom::detail::fail_input(src, field + ".shape", shape_text(a.shape), "expected a rank-1 array");
    return npy_to_int64(a, src, field);
}

inline std::int64_t int_scalar(npy_array const& a, std::string const& src, std::string const& field) {
    if (!(a.shape.empty() || (a.shape.size() == 1 && a.shape[0] == 1)))
        qkgeom::detail::fail_input(src, field + ".shape", shape_text(a.shape), "expected a scalar (shape () or (1,))");
    return npy_to_int64(a, src, field)[0];
}

inline void check_vector_dtype(npy_array const& a, std::string const& src, head_entry& e) {
    dtype const t = npy_dtype(a, src);
    if (!dtype_is_float(t))
        qkgeom::detail::fail_input(src, "vectors.dtype", a.descr, "vectors must be f32, f64, f16 or bf16");
    if (a.shape.size() != 2)
        qkgeom::detail::fail_input(src, "vectors.shape", shape_text(a.shape), "vectors must be a rank-2 array (n, d)");
    e.dtype = std::string(dtype_name(t));
}

}  // namespace detail

/// \brief Row-major single-precision matrix: the rows of an f32, f16 or bf16
/// entry as read_capture_rows keeps them (every such value is a float, so
/// the rows are exactly the stored values; the analyses widen them to double
/// as they read them).
using row_matrix_f32 = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace detail {

/// An entry as read: its rows in e.vectors (double) or, when `single`, in
/// v32 (stored dtype f32, f16 or bf16); `nonfinite`: the scan made while the
/// rows were copied into v32 found NaN or ±inf (reported by validate_read,
/// in its turn among the checks).
struct entry_read {
    head_entry e;
    row_matrix_f32 v32;
    bool single = false;
    bool nonfinite = false;
};

inline bool widens_to_f32(dtype t) noexcept { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

/// Values per step of the copy-and-scan: the scan reads what the copy has
/// just written, while it is in cache.
inline constexpr std::size_t scan_chunk_values = 16384;

/// Scans v32's values [from, to) (the dispatched f32 finiteness scan: for
/// these dtypes finite is exactly |x| < 2^128).
inline void scan_f32(entry_read& r, simd::isa level, std::size_t from, std::size_t to) noexcept {
    r.nonfinite = qkgeom::detail::mom::any_nonfinite_f32(level, r.v32.data() + from, static_cast<index_t>(to - from)) ||
                  r.nonfinite;
}

/// The vectors of an array in memory (dtype and rank checked): into v32
/// with the scan when `single` and the dtype widens to f32, else into
/// e.vectors (npy_to_matrix).
inline void vectors_from(npy_array const& a, std::string const& src, bool single, entry_read& r) {
    dtype const t = npy_dtype(a, src);
    if (!single || !widens_to_f32(t)) {
        r.e.vectors = npy_to_matrix(a, src);
        return;
    }
    check_data_size(a, t, src);
    auto const rows = static_cast<index_t>(a.shape[0]), cols = static_cast<index_t>(a.shape[1]);
    r.v32.resize(rows, cols);
    r.single = true;
    std::size_t const n = static_cast<std::size_t>(rows * cols), w = dtype_size(t);
    simd::isa const level = simd::active();
    if (!a.fortran_order) {
        for (std::size_t s = 0; s < n; s += scan_chunk_values) {
            std::size_t const e = std::min(n, s + scan_chunk_values);
            load_floats(t, a.data.data() + s * w, e - s, r.v32.data() + s);
            scan_f32(r, level, s, e);
        }
        return;
    }
    for (index_t i = 0; i < rows; ++i)  // element (i, j) of Fortran order at i + j * rows
        for (index_t j = 0; j < cols; ++j)
            r.v32(i, j) = static_cast<float>(load_double(t, a.data.data(), static_cast<std::size_t>(i + j * rows)));
    scan_f32(r, level, 0, n);
}

/// The vectors of an entry in NumPy form: f32 rows in C order go from the
/// file straight into v32, scanned step by step as they arrive; other arrays
/// are read whole and converted (vectors_from).
inline void read_npy_vectors(std::filesystem::path const& path, std::string const& src, bool single, entry_read& r) {
    npy_reader in(path);
    check_vector_dtype(in.header(), src, r.e);
    npy_array const& h = in.header();
    if (!single || in.type() != dtype::f32 || h.fortran_order || std::endian::native != std::endian::little) {
        vectors_from(in.take(), src, single, r);
        return;
    }
    auto const rows = static_cast<index_t>(h.shape[0]), cols = static_cast<index_t>(h.shape[1]);
    r.v32.resize(rows, cols);
    r.single = true;
    std::size_t const n = static_cast<std::size_t>(rows * cols);
    simd::isa const level = simd::active();
    for (std::size_t s = 0; s < n; s += scan_chunk_values) {
        std::size_t const e = std::min(n, s + scan_chunk_values);
        in.read_data(reinterpret_cast<unsigned char*>(r.v32.data() + s), (e - s) * sizeof(float));
        scan_f32(r, level, s, e);
    }
    in.finish();
}

/// validate_head for an entry as read (rows in e.vectors or v32).
template <class Src>
void validate_read(entry_read const& r, manifest const& m, Src const& src) {
    if (!r.single) {
        validate_head(r.e, m, src);
        return;
    }
    validate_entry(r.e, r.v32.rows(), r.v32.cols(), m, src, [&] {
        if (!r.nonfinite) return;
        for (index_t i = 0; i < r.v32.rows(); ++i)
            for (index_t j = 0; j < r.v32.cols(); ++j)
                if (!std::isfinite(r.v32(i, j))) fail_vector_value(src, i, j, static_cast<double>(r.v32(i, j)));
    });
}

inline void read_npz_entry(std::filesystem::path const& nz, manifest const& m, bool single, entry_read& r) {
    auto& e = r.e;
    std::string const s = nz.string();
    auto const f = read_npz(nz);
    auto msrc = [&](std::string_view member) { return s + "[" + std::string(member) + ".npy]"; };
    auto const& v = f.at("vectors", s);
    check_vector_dtype(v, msrc("vectors"), e);
    vectors_from(v, msrc("vectors"), single, r);
    e.position = token_positions(int_vector(f.at("position", s), msrc("position"), "position"));
    e.bucket = token_buckets(int_vector(f.at("bucket", s), msrc("bucket"), "bucket"));
    e.example_id = example_ids(int_vector(f.at("example_id", s), msrc("example_id"), "example_id"));
    if (auto const* w = f.find("sliding_window"))
        e.sliding_window = int_scalar(*w, msrc("sliding_window"), "sliding_window");
    validate_read(r, m, msrc);
}

inline void read_npy_entry(std::filesystem::path const& sub, std::string const& name, manifest const& m, bool single,
                           entry_read& r) {
    namespace fs = std::filesystem;
    auto& e = r.e;
    {
        std::error_code ec;
        auto const t = fs::status(sub, ec).type();
        if (t != fs::file_type::directory)
            qkgeom::detail::fail_input(sub.string(), "entry", name,
                                       ec ? "cannot access the entry: " + ec.message()
                                          : std::string("is not a directory (an entry in NumPy form is a directory "
                                                        "of .npy files; the other forms end in .safetensors or .npz)"));
    }
    auto src = [&](std::string_view f) { return (sub / (std::string(f) + ".npy")).string(); };
    read_npy_vectors(sub / "vectors.npy", src("vectors"), single, r);
    e.position = token_positions(int_vector(read_npy(sub / "position.npy"), src("position"), "position"));
    e.bucket = token_buckets(int_vector(read_npy(sub / "bucket.npy"), src("bucket"), "bucket"));
    e.example_id = example_ids(int_vector(read_npy(sub / "example_id.npy"), src("example_id"), "example_id"));
    std::error_code ec;
    auto const wt = fs::symlink_status(sub / "sliding_window.npy", ec).type();
    if (wt != fs::file_type::not_found && wt != fs::file_type::none)
        e.sliding_window = int_scalar(read_npy(sub / "sliding_window.npy"), src("sliding_window"), "sliding_window");
    validate_read(r, m, src);
}

inline void read_st_entry(std::filesystem::path const& st, manifest const& m, bool single, entry_read& r) {
    auto& e = r.e;
    std::string const s = st.string();
    auto const f = read_safetensors(st, head_entry_max_header);
    auto get = [&](std::string const& t) -> npy_array {
        auto it = f.tensors.find(t);
        if (it == f.tensors.end()) qkgeom::detail::fail_input(s, t, "<missing>", "required tensor is missing");
        return to_npy_array(it->second);
    };
    auto const v = get("vectors");
    check_vector_dtype(v, s, e);
    vectors_from(v, s, single, r);
    e.position = token_positions(int_vector(get("position"), s, "position"));
    e.bucket = token_buckets(int_vector(get("bucket"), s, "bucket"));
    e.example_id = example_ids(int_vector(get("example_id"), s, "example_id"));
    if (f.tensors.count("sliding_window")) e.sliding_window = int_scalar(get("sliding_window"), s, "sliding_window");
    validate_read(r, m, [&](std::string_view) { return s; });
}

/// read_head, the rows kept in single precision (entry_read::v32) when
/// `single` and the stored dtype is f32, f16 or bf16.
inline entry_read read_entry(std::filesystem::path const& dir, manifest const& m, std::int64_t layer, std::int64_t head,
                             kind k, bool single) {
    using qkgeom::detail::fail_input;
    namespace fs = std::filesystem;
    std::string const name = head_entry_name(layer, head, k);
    if (m.n_q_heads.size() != static_cast<std::size_t>(std::max<std::int64_t>(m.n_layers, 0)) ||
        m.n_kv_heads.size() != m.n_q_heads.size())
        qkgeom::detail::fail_arg("qkgeom::io::read_head",
                                 "inconsistent manifest: n_q_heads / n_kv_heads lengths differ from n_layers; n_layers",
                                 m.n_layers);
    if (layer < 0 || layer >= m.n_layers)
        fail_input((dir / name).string(), "layer", layer, "layer outside [0, n_layers = " + std::to_string(m.n_layers) + ")");
    std::int64_t const nh = k == kind::query ? m.n_q_heads[static_cast<std::size_t>(layer)]
                                             : m.n_kv_heads[static_cast<std::size_t>(layer)];
    if (head < 0 || head >= nh)
        fail_input((dir / name).string(), "head", head,
                   std::string("head outside [0, ") + (k == kind::query ? "n_q_heads" : "n_kv_heads") + " = " +
                       std::to_string(nh) + ")");
    entry_read r;
    r.e.layer = layer;
    r.e.head = head;
    r.e.k = k;
    auto const sub = dir / name;
    auto const st = dir / (name + ".safetensors");
    auto const nz = dir / (name + ".npz");
    // Anything at an entry's path counts as that form (a directory named
    // lLLhHHq.safetensors too): the reader then says what is wrong with it.
    auto present = [](fs::path const& p) {
        std::error_code ec;
        auto const t = fs::symlink_status(p, ec).type();
        return t != fs::file_type::not_found && t != fs::file_type::none;
    };
    bool const is_npy = present(sub);
    bool const is_st = present(st);
    bool const is_npz = present(nz);
    if (int{is_npy} + int{is_st} + int{is_npz} > 1) {
        std::string forms;
        if (is_npy) forms += " " + name + "/";
        if (is_st) forms += " " + name + ".safetensors";
        if (is_npz) forms += " " + name + ".npz";
        fail_input(sub.string(), "entry", name, "the entry exists in more than one storage form:" + forms);
    }
    if (!is_npy && !is_st && !is_npz)
        fail_input(sub.string(), "entry", name, "head entry not found (no directory, no .safetensors, no .npz)");
    if (is_npz) read_npz_entry(nz, m, single, r);
    else if (is_npy) read_npy_entry(sub, name, m, single, r);
    else read_st_entry(st, m, single, r);
    return r;
}

}  // namespace detail

/// \brief Reads and validates one head entry, detecting the storage form
/// (directory lLLhHHq/ of .npy files, lLLhHHq.safetensors or lLLhHHq.npz;
/// exactly one of them must exist).
/// \param[in] dir   the dataset directory.
/// \param[in] m     its manifest (`read_manifest(dir)`).
/// \param[in] layer the layer, in [0, n_layers).
/// \param[in] head  the head, in [0, n_q_heads[layer]) for queries or
///                  [0, n_kv_heads[layer]) for keys.
/// \param[in] k     query or key.
/// \returns the entry, vectors widened to double and `dtype` the stored type.
/// \throws qkgeom::input_error naming the file, field and value: layer or head
///         out of range, no entry or an entry in more than one form, an
///         entry path that is not what its form needs (a directory named
///         lLLhHHq.safetensors: "is a directory, not a regular file"; a file
///         named lLLhHHq), an unreadable or malformed file (npy / npz /
///         safetensors, with the operating system's reason), an entry with
///         no rows, a missing
///         array, vectors not a float rank-2 array, an integer array of the
///         wrong rank or type, or an entry that fails the checks write_head
///         makes (head_dim, lengths, finiteness, positions, buckets, sliding
///         window).
/// \throws std::invalid_argument if the manifest's bucket spec is invalid or
///         its per-layer head counts do not have n_layers entries.
/// \throws std::bad_alloc if the arrays do not fit in memory.
[[nodiscard]] inline head_entry read_head(std::filesystem::path const& dir, manifest const& m, std::int64_t layer,
                                          std::int64_t head, kind k) {
    return std::move(detail::read_entry(dir, m, layer, head, k, false).e);
}

/// \brief As above, reading DIR/manifest.json first.
/// \param[in] dir   the dataset directory.
/// \param[in] layer the layer.
/// \param[in] head  the head (a q head for queries, a kv head for keys).
/// \param[in] k     query or key.
/// \returns the entry.
/// \throws qkgeom::input_error as read_manifest and as the overload above.
/// \throws std::invalid_argument, std::filesystem::filesystem_error,
///         std::bad_alloc as the overload above.
[[nodiscard]] inline head_entry read_head(std::filesystem::path const& dir, std::int64_t layer, std::int64_t head,
                                          kind k) {
    return read_head(dir, read_manifest(dir), layer, head, k);
}

namespace detail {

/// m.head_list checked against the layout (layer and q_head in range, no
/// duplicate, k_head -1 or the derived one), with the key heads filled in,
/// ascending by (layer, q_head).
inline std::vector<head_id> resolved_head_list(manifest const& m, model_layout const& layout) {
    constexpr std::string_view fn = "qkgeom::io::planned_heads";
    std::vector<head_id> out;
    out.reserve(m.head_list.size());
    for (std::size_t i = 0; i < m.head_list.size(); ++i) {
        head_id h = m.head_list[i];
        std::string const f = "head_list[" + std::to_string(i) + "]";
        if (h.layer < 0 || h.layer >= static_cast<std::int64_t>(layout.layers.size()))
            qkgeom::detail::fail_arg(fn, f + ".layer outside [0, n_layers = " + std::to_string(layout.layers.size()) + ")",
                                     h.layer);
        auto const& ll = layout.layers[static_cast<std::size_t>(h.layer)];
        if (h.q_head < 0 || h.q_head >= ll.n_q_heads)
            qkgeom::detail::fail_arg(fn, f + ".q_head outside [0, n_q_heads = " + std::to_string(ll.n_q_heads) + ")",
                                     h.q_head);
        std::int64_t const k = key_head_of(h.q_head, ll.n_q_heads, ll.n_kv_heads);
        if (h.k_head != -1 && h.k_head != k)
            qkgeom::detail::fail_arg(fn, f + ".k_head must be -1 (derived) or key_head_of = " + std::to_string(k),
                                     h.k_head);
        h.k_head = k;
        out.push_back(h);
    }
    std::sort(out.begin(), out.end());
    for (std::size_t i = 1; i < out.size(); ++i)
        if (out[i] == out[i - 1])
            qkgeom::detail::fail_arg(fn, "head_list lists a head twice; (layer, q_head) = (" + std::to_string(out[i].layer) +
                                             ", " + std::to_string(out[i].q_head) + "); q_head",
                                     out[i].q_head);
    return out;
}

}  // namespace detail

/// \brief The heads a capture holds: the manifest's explicit head list when
/// it records one (capture.heads), its head sample when it records one
/// (method §0.1, capture.head_count), else every query head of every layer;
/// each with the key head it reads (GQA, method §0).
/// \param[in] m the manifest.
/// \returns the head pairs, ascending by (layer, q_head) (an explicit list
///          is sorted: the plan is a set, its order in the file carries no
///          meaning).
/// \throws std::invalid_argument for an inconsistent manifest (as layout_of),
///         a negative recorded head count (as sample_heads), both a head list
///         and a head sampling, or a head_list entry out of range, listed
///         twice or with a k_head other than -1 or the derived one.
/// \throws std::bad_alloc if the list cannot be allocated.
[[nodiscard]] inline std::vector<head_id> planned_heads(manifest const& m) {
    if (!m.head_list.empty()) {
        if (m.heads)
            qkgeom::detail::fail_arg("qkgeom::io::planned_heads",
                                     "the manifest records both a head list and a head sampling; head_list size",
                                     m.head_list.size());
        return detail::resolved_head_list(m, layout_of(m));
    }
    return m.heads ? sampled_heads(m) : eligible_heads(layout_of(m), layer_eligibility::all_layers);
}

/// \brief The capture facts of a manifest for one layer: bucket scheme,
/// context length, the layer's sliding window (0 = full attention), and the
/// manifest's `rope` block when the layer's rows were captured after RoPE
/// (`capture.rope_applied[layer]` true, or not recorded: post-RoPE is what
/// the capture tools record).
/// \param[in] m     the manifest.
/// \param[in] layer the layer, in [0, n_layers); no recorded sliding_window
///                  gives sliding_window 0.
/// \returns the facts (not validated).
/// \throws std::invalid_argument for a layer outside [0, n_layers).
[[nodiscard]] inline capture_facts facts_of(manifest const& m, std::int64_t layer) {
    if (layer < 0 || layer >= m.n_layers)
        qkgeom::detail::fail_arg("qkgeom::io::facts_of",
                                 "layer outside [0, n_layers = " + std::to_string(m.n_layers) + "); layer", layer);
    capture_facts f;
    f.buckets = m.buckets;
    f.context_length = m.context_length;
    if (layer >= 0 && layer < static_cast<std::int64_t>(m.sliding_window.size()))
        f.sliding_window = m.sliding_window[static_cast<std::size_t>(layer)].value_or(0);
    bool const applied = m.rope_applied.empty() || m.rope_applied[static_cast<std::size_t>(layer)];
    if (m.rope && applied) f.rope = m.rope;
    return f;
}

namespace detail {

/// The query and key entries of a head (read_capture's checks and messages),
/// rows kept in single precision where read_entry keeps them.
inline std::pair<entry_read, entry_read> read_entries(std::filesystem::path const& dir, manifest const& m,
                                                      head_id const& id, bool single) {
    if (id.layer >= 0 && id.layer < m.n_layers) {
        auto const L = static_cast<std::size_t>(id.layer);
        if (key_head_of(id.q_head, m.n_q_heads[L], m.n_kv_heads[L]) != id.k_head)
            qkgeom::detail::fail_arg("qkgeom::io::read_capture",
                                     "k_head does not follow the GQA mapping of layer " + std::to_string(id.layer) +
                                         " q_head " + std::to_string(id.q_head) + "; k_head",
                                     id.k_head);
    }
    entry_read q = read_entry(dir, m, id.layer, id.q_head, kind::query, single);
    entry_read k = [&] {
        try {
            return read_entry(dir, m, id.layer, id.k_head, kind::key, single);
        } catch (input_error const& e) {  // say that the key entry is at fault, and which query head read it
            throw input_error(e.source(), e.field(), e.value(),
                              "key entry " + head_entry_name(id.layer, id.k_head, kind::key) + " (read by query head " +
                                  std::to_string(id.q_head) + "): " + e.what());
        }
    }();
    if (q.e.sliding_window != k.e.sliding_window)
        qkgeom::detail::fail_input((dir / head_entry_name(id.layer, id.k_head, kind::key)).string(), "sliding_window",
                                   k.e.sliding_window ? std::to_string(*k.e.sliding_window) : std::string("none"),
                                   "differs from the query entry's sliding window");
    return {std::move(q), std::move(k)};
}

/// A head of rows of type M from its two entries' rows.
template <class M>
head_capture<M> make_capture(manifest const& m, head_id const& id, token_rows<M> q, token_rows<M> k,
                             std::optional<std::int64_t> window) {
    head_capture<M> out;
    out.id = id;
    out.facts = facts_of(m, id.layer);
    out.facts.sliding_window = window.value_or(0);
    out.queries = std::move(q);
    out.keys = std::move(k);
    return out;
}

/// The rows of an entry as token_rows of single or double precision (the
/// single ones widened exactly when double is asked for).
inline token_rows<row_matrix_f32> rows_f32(entry_read& r) {
    return {std::move(r.v32), std::move(r.e.position), std::move(r.e.bucket), std::move(r.e.example_id)};
}
inline token_rows<row_matrix> rows_f64(entry_read& r) {
    if (r.single) r.e.vectors = r.v32.cast<double>();
    return std::move(static_cast<token_rows<row_matrix>&>(r.e));
}

}  // namespace detail

/// \brief Reads one head as one value (method §0): the query entry of
/// (layer, q_head), the key entry of (layer, k_head), and the capture facts
/// (the manifest's bucket scheme and context length, the entries' sliding
/// window).
/// \param[in] dir  the dataset directory
/// \param[in] m    its manifest (`read_manifest(dir)`)
/// \param[in] id   the head: layer, q_head and the k_head it reads
/// \returns the head, rows widened to double
/// \throws qkgeom::input_error naming the file, field and value for a
///         missing or invalid entry (for the key entry the message starts
///         "key entry lLLhHHk (read by query head Q): ", as several query
///         heads read one key entry), or when the two entries' sliding windows
///         differ; std::invalid_argument when k_head is not the key head of
///         q_head under the manifest's GQA layout, or q_head is outside
///         [0, n_q_heads) (as key_head_of, before any file is read)
/// \throws std::filesystem::filesystem_error, std::bad_alloc as read_head
/// \pre m is consistent, as parse_manifest guarantees
[[nodiscard]] inline head_capture<row_matrix> read_capture(std::filesystem::path const& dir, manifest const& m,
                                                           head_id const& id) {
    auto [q, k] = detail::read_entries(dir, m, id, false);
    auto const window = q.e.sliding_window;
    return detail::make_capture(m, id, detail::rows_f64(q), detail::rows_f64(k), window);
}

/// \brief A head as read_capture_rows returns it: rows in single precision
/// (both entries stored as f32, f16 or bf16; the values exactly those
/// stored) or in double (an entry stored as f64).
using stored_capture = std::variant<head_capture<row_matrix_f32>, head_capture<row_matrix>>;

/// \brief read_capture keeping the stored precision: when both entries are
/// stored as f32, f16 or bf16 their rows stay floats (half the memory and the
/// memory traffic of double; 16-bit values are widened to float exactly),
/// else both are widened to double. The analyses widen each value to double
/// as they read it, so a head analysed from either form gives bit-identical
/// results. The rows are copied once from the file (f32 .npy: straight into
/// the matrix) and scanned for NaN / ±inf as they are copied.
/// \param[in] dir  the dataset directory
/// \param[in] m    its manifest (`read_manifest(dir)`)
/// \param[in] id   the head: layer, q_head and the k_head it reads
/// \returns the head, single precision (index 0) or double (index 1)
/// \throws as read_capture, with the same messages (file, field, value)
/// \pre m is consistent, as parse_manifest guarantees
[[nodiscard]] inline stored_capture read_capture_rows(std::filesystem::path const& dir, manifest const& m,
                                                      head_id const& id) {
    auto [q, k] = detail::read_entries(dir, m, id, true);
    auto const window = q.e.sliding_window;
    if (q.single && k.single) return detail::make_capture(m, id, detail::rows_f32(q), detail::rows_f32(k), window);
    return detail::make_capture(m, id, detail::rows_f64(q), detail::rows_f64(k), window);
}

namespace detail {

/// Parses a canonical entry name l<LL>h<HH>[qk] (without extension) into
/// id.layer, id.head, id.k; false for any other name.
inline bool parse_entry_name(std::string_view name, entry_id& id) {
    if (name.size() < 7 || name[0] != 'l') return false;
    std::size_t const hpos = name.find('h', 1);
    if (hpos == std::string_view::npos || hpos < 3) return false;
    char const kc = name.back();
    if (kc != 'q' && kc != 'k') return false;
    auto digits = [](std::string_view t, std::int64_t& v) {
        if (t.size() < 2 || t.size() > 9) return false;
        v = 0;
        for (char c : t) {
            if (c < '0' || c > '9') return false;
            v = v * 10 + (c - '0');
        }
        return true;
    };
    if (!digits(name.substr(1, hpos - 1), id.layer) || !digits(name.substr(hpos + 1, name.size() - hpos - 2), id.head))
        return false;
    id.k = kc == 'q' ? kind::query : kind::key;
    return head_entry_name(id.layer, id.head, id.k) == name;  // canonical only
}

}  // namespace detail

/// \brief The head entries present in DIR (names lLLhHH[qk], lLLhHH[qk].safetensors
/// or lLLhHH[qk].npz), sorted by layer, head, kind. Classified by name only,
/// whatever the file type (a directory named l00h01q.npz is listed as the npz
/// form; read_head then says it is a directory). Other names are ignored. An
/// entry present in two forms is listed twice (read_head rejects it).
/// \param[in] dir the dataset directory.
/// \returns the entries found (canonical names only; not checked against a manifest).
/// \throws qkgeom::input_error (source = dir) when the directory cannot be listed.
/// \throws std::filesystem::filesystem_error if iteration or an entry's status
///         fails after the listing has started.
/// \throws std::bad_alloc if the list cannot be allocated.
[[nodiscard]] inline std::vector<entry_id> list_heads(std::filesystem::path const& dir) {
    std::vector<entry_id> out;
    std::error_code ec;
    for (auto const& de : std::filesystem::directory_iterator(dir, ec)) {
        std::string name = de.path().filename().string();
        entry_id id;
        // Classified by name only: an entry of the wrong file type (a directory
        // named lLLhHHq.npz) is listed, and read_head says what is wrong with it.
        if (name.size() > 12 && name.ends_with(".safetensors")) {
            id.format = storage_format::safetensors;
            name.resize(name.size() - 12);
        } else if (name.size() > 4 && name.ends_with(".npz")) {
            id.format = storage_format::npz;
            name.resize(name.size() - 4);
        } else {
            id.format = storage_format::npy;
        }
        if (!detail::parse_entry_name(name, id)) continue;
        out.push_back(id);
    }
    if (ec) qkgeom::detail::fail_input(dir.string(), "directory", dir.string(), "cannot list directory: " + ec.message());
    std::sort(out.begin(), out.end(), [](entry_id const& a, entry_id const& b) {
        if (a.layer != b.layer) return a.layer < b.layer;
        if (a.head != b.head) return a.head < b.head;
        if (a.k != b.k) return a.k < b.k;
        return a.format < b.format;
    });
    return out;
}

/// \brief Directory entries of DIR that look like head entries (a canonical
/// name lLLhHH[qk], bare or ending in .safetensors / .npz, whatever the
/// file type) but lie outside the manifest: layer ≥ n_layers, or head ≥ the
/// layer's n_q_heads (q) / n_kv_heads (k). A program reports these instead
/// of skipping them silently.
/// \param[in] dir the dataset directory.
/// \param[in] m its manifest.
/// \param[in] max_names the most names returned (default 1000); when more
///            entries are stray, one last element "... and N more" follows
///            them. The whole directory is scanned; memory stays bounded by
///            max_names.
/// \returns the file names (no directory), in directory order.
/// \throws qkgeom::input_error (source = dir) when the directory cannot be listed.
/// \throws std::bad_alloc if the list cannot be allocated.
[[nodiscard]] inline std::vector<std::string> stray_entries(std::filesystem::path const& dir, manifest const& m,
                                                            std::size_t max_names = 1000) {
    std::vector<std::string> out;
    std::uint64_t more = 0;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
        std::string const file = it->path().filename().string();
        std::string_view name = file;
        if (name.ends_with(".safetensors")) name.remove_suffix(12);
        else if (name.ends_with(".npz")) name.remove_suffix(4);
        entry_id id;
        if (!detail::parse_entry_name(name, id)) continue;
        bool stray = id.layer >= m.n_layers;
        if (!stray) {
            auto const L = static_cast<std::size_t>(id.layer);
            auto const& counts = id.k == kind::query ? m.n_q_heads : m.n_kv_heads;
            stray = L >= counts.size() || id.head >= counts[L];
        }
        if (!stray) continue;
        if (out.size() < max_names) out.push_back(file);
        else ++more;
    }
    if (ec) qkgeom::detail::fail_input(dir.string(), "directory", dir.string(), "cannot list directory: " + ec.message());
    if (more > 0) out.push_back("... and " + std::to_string(more) + " more");
    return out;
}

}  // namespace qkgeom::io
