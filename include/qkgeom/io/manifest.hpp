// qkgeom — the manifest of a capture (DIR/manifest.json, method §0): what one
// model's capture looks like, read, written and checked; the layout, head plan
// and capture facts it implies; whether two captures may be merged.
// See docs/dataset.md for the fields and the validation rules.
#pragma once

#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/config.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/core/head.hpp>
#include <qkgeom/io/json.hpp>
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

/// \brief Largest manifest.json read_manifest accepts, in bytes (16 MiB; a
/// real manifest is a few kB). Checked on the file size before reading.
inline constexpr std::uint64_t manifest_max_bytes = std::uint64_t{16} << 20;
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

namespace detail {

/// model, n_layers, the per-layer head counts, head_dim and context_length.
inline void parse_manifest_shape(json::value const& root, std::string const& src, manifest& m) {
    using qkgeom::detail::fail_input;
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
}

/// The bucket scheme (buckets: scheme, width, rate).
inline void parse_manifest_buckets(json::value const& root, std::string const& src, manifest& m) {
    using qkgeom::detail::fail_input;
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
}

/// The capture block: seed, provenance, head list, head sampling.
inline void parse_manifest_capture(json::value const* c, std::string const& src, manifest& m) {
    using qkgeom::detail::fail_input;
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

/// The rope block (pairing, rotary_dim, theta, scaling, scaling_factor).
inline rope_spec parse_manifest_rope(json::value const* r, std::string const& src, manifest const& m) {
    using qkgeom::detail::fail_input;
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
    return rs;
}

/// sliding_window and gqa_group_size (per layer).
inline void parse_manifest_layers(json::value const& root, std::string const& src, manifest& m) {
    using qkgeom::detail::fail_input;
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
    json::value const root = detail::parse_manifest_root(text, src);
    manifest m;
    detail::parse_manifest_shape(root, src, m);
    detail::parse_manifest_buckets(root, src, m);
    if (auto const* c = root.find("capture")) detail::parse_manifest_capture(c, src, m);
    if (auto const* r = root.find("rope")) m.rope = detail::parse_manifest_rope(r, src, m);
    detail::parse_manifest_layers(root, src, m);
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

}  // namespace qkgeom::io
