// qkgeom — capturing post-RoPE queries and keys from a LibTorch model
// (issue 6; method §0, §0.1, §1).
//
// LibTorch modules have no forward hooks and TorchScript cannot take them from
// C++, so capture is an explicit call placed in the attention forward pass,
// right after RoPE is applied:
//
//   q = apply_rope(q, positions);  k = apply_rope(k, positions);
//   capture(layer, q, k, positions, example_ids, sliding_window);
//
// Per call (a "step") the capture object
//   1. validates the shapes (rank 4, [B, H, T, D] or [B, T, H, D], Hq a
//      multiple of Hkv, head counts and head_dim as in the manifest, positions
//      [B, T] or [T], example ids [B] or [B, T]);
//   2. applies the method §0.1 sampler on the host (`capture_sampler::select`:
//      the same kept tokens for every head of one (layer, kind));
//   3. gathers the kept rows of the selected heads on the tensors' device, one
//      indexed gather per (layer, kind) (strided views: never a reorder copy);
//   4. rows / moments modes: moves both gathers with one non-blocking copy into
//      (pinned, on CUDA) host memory, records an event on the device's current
//      stream, and reads them on the host only after waiting for that event —
//      at the next step (so the copy overlaps the next layer's compute) or at
//      `synchronize()`; the rows feed the row store (`capture_store`, for
//      plasticity pairs) or the streaming moments (`bucketed_moments`);
//   5. device_moments mode: updates per-bucket centred moments on the device
//      itself (GEMMs; Chan merges, method §1); nothing is copied to the host
//      until the moments are asked for.
//
// The manifest (`io::manifest`, written as the dataset's manifest.json)
// records what the analysis depends on: RoPE, head counts and GQA groups,
// sliding windows, the token sampler and the head sampling with their seeds;
// merging captures or moments whose manifests differ fails naming the field
// (io::check_compatible).
// See docs/torch.md.
#pragma once

#include <qkgeom/adapters/torch.hpp>
#include <qkgeom/capture/protocol.hpp>
#include <qkgeom/core/buckets.hpp>
#include <qkgeom/core/errors.hpp>
#include <qkgeom/io/dataset.hpp>
#include <qkgeom/stats/moments.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qkgeom {

// ---------------------------------------------------------------------------
// The manifest of a capture (independent of LibTorch): io::manifest
// ---------------------------------------------------------------------------

/// \brief The manifest of a capture (io::manifest, the dataset's
/// manifest.json) from the model's layout, its RoPE, the token sampler and the
/// head sampling: everything the analysis depends on. Per-layer sliding
/// windows come from the layout (recorded, none = full attention).
/// \param[in] model the model's name.
/// \param[in] layout per-layer head counts, sliding windows and head_dim.
/// \param[in] rope the RoPE the captured rows went through (recorded as given,
///            not validated here).
/// \param[in] sampler the method §0.1 token sampler (buckets and seed).
/// \param[in] heads the head sampling (recorded as given, not validated here).
/// \param[in] context_length the largest position + 1 the capture accepts, ≥ 1.
/// \returns the manifest, with rope and heads recorded (as torch_capture requires).
/// \throws std::invalid_argument for an invalid layout (check_layout), an
///         invalid bucket spec, or context_length < 1.
inline io::manifest make_capture_manifest(std::string model, model_layout const& layout, rope_spec rope,
                                          capture_sampler sampler, io::head_sampling heads,
                                          std::int64_t context_length) {
    constexpr std::string_view fn = "qkgeom::make_capture_manifest";
    check_layout(layout, fn);
    detail::check_bucket_spec(fn, sampler.buckets);
    if (context_length < 1) detail::fail_arg(fn, "context_length must be >= 1", context_length);
    io::manifest m;
    m.model = std::move(model);
    m.n_layers = static_cast<std::int64_t>(layout.layers.size());
    for (auto const& L : layout.layers) {
        m.n_q_heads.push_back(L.n_q_heads);
        m.n_kv_heads.push_back(L.n_kv_heads);
        m.sliding_window.push_back(L.sliding_window);
    }
    m.head_dim = layout.head_dim;
    m.buckets = sampler.buckets;
    m.seed = sampler.seed;
    m.context_length = context_length;
    m.rope = std::move(rope);
    m.heads = heads;
    return m;
}

/// \brief The moments of every analysed head of a capture, with the manifest
/// they depend on: the unit that shards reduce to and merge.
struct capture_moments {
    io::manifest manifest;            ///< what the moments depend on
    std::vector<head_moments> heads;  ///< one per analysed head (io::sampled_heads order)

    /// \brief Merge another shard: the manifests must be compatible
    /// (io::check_compatible names the first differing field), then every
    /// head merges (Chan, method §1).
    /// \param[in] o the other shard, with its heads in the same order.
    /// \returns `*this`.
    /// \throws std::invalid_argument naming the first differing manifest field,
    ///         or when the head counts differ; also what head_moments::operator+=
    ///         throws (e.g. differing head ids). On a throw during the head
    ///         loop, the heads before the failing one are already merged.
    capture_moments& operator+=(capture_moments const& o) {
        io::check_compatible(manifest, o.manifest);
        if (o.heads.size() != heads.size())
            detail::fail_arg("qkgeom::capture_moments::operator+=",
                             "head count differs: this has " + std::to_string(heads.size()) + ", the other has",
                             o.heads.size());
        for (std::size_t i = 0; i < heads.size(); ++i) heads[i] += o.heads[i];
        return *this;
    }
};

}  // namespace qkgeom

#if defined(QKGEOM_HAS_TORCH)
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>

namespace qkgeom {

/// \brief Where a capture sends the kept rows.
enum class torch_capture_mode : std::uint8_t {
    rows = 0,            ///< host row store (`capture_store`): plasticity pairs, the dataset writer
    moments = 1,         ///< host streaming moments (`bucketed_moments` per (layer, kind, head))
    device_moments = 2,  ///< moments updated on the tensors' device (dense captures; no rows kept)
};

/// \brief Options of `torch_capture`.
struct torch_capture_options {
    torch_layout layout = torch_layout::bhtd;        ///< axis order of queries and keys
    torch_capture_mode mode = torch_capture_mode::rows;  ///< where the kept rows go
    bool pinned = true;  ///< stage device → host copies in pinned memory (CUDA only; ignored elsewhere)
};

namespace detail {

/// Waits on the host until `e` has completed. Uses Event::synchronize where
/// the LibTorch version has it (2.x), else polls Event::query (1.13).
template <class E>
void torch_wait(E const& e) {
    if constexpr (requires { e.synchronize(); }) {
        e.synchronize();
    } else {
        while (!e.query()) std::this_thread::yield();
    }
}

/// An integer tensor (any device, any integer dtype, contiguous or not) as a
/// host vector of int64 in row-major order.
inline std::vector<std::int64_t> torch_int_vector(at::Tensor const& t, std::string_view where, std::string_view arg) {
    check_torch_strided(t, where, arg);
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
        fail_arg(where, std::string(arg) + ": dtype must be an integer type; dtype", torch_dtype_name(t.scalar_type()));
    at::Tensor const h = t.detach().to(at::kCPU, at::kLong).contiguous();
    auto const* p = h.data_ptr<std::int64_t>();
    return std::vector<std::int64_t>(p, p + h.numel());
}

inline std::string torch_window_text(std::optional<std::int64_t> w) { return w ? std::to_string(*w) : "none"; }

inline std::string torch_shape_text(at::Tensor const& t) {
    std::string s = "[";
    for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
}

}  // namespace detail

/// \brief The capture object: call it from the attention forward pass where
/// RoPE has been applied (see the header comment and docs/torch.md).
///
/// `Scalar` is the element type of the host row store (float by default:
/// f32, f16 and bf16 rows are stored exactly; use double for f64 rows).
/// Not thread-safe: one capture per thread or stream, merged with `+=`.
///
/// \tparam Scalar float or double.
///
/// Errors from LibTorch itself (device copies, gathers, event waits) leave
/// as c10::Error (a std::exception) from every member that touches tensors.
template <class Scalar = float>
class torch_capture {
public:
    /// \brief A capture of the heads `io::sampled_heads(manifest)` selects.
    /// The manifest must record the RoPE (`rope`) and the head sampling
    /// (`heads`); per-layer sliding windows not recorded are recorded as
    /// full attention.
    /// \param[in] manifest the capture's manifest (make_capture_manifest).
    /// \param[in] opt layout, mode and pinned staging.
    /// \throws std::invalid_argument for a manifest without RoPE or head
    ///         sampling, or an invalid one (layout, bucket scheme).
    explicit torch_capture(io::manifest manifest, torch_capture_options opt = {})
        : manifest_(checked(std::move(manifest))), opt_(opt), layout_(io::layout_of(manifest_)),
          heads_(io::sampled_heads(manifest_)), sampler_{manifest_.buckets, manifest_.seed},
          store_(layout_, heads_, sampler_) {
        for (auto const& h : heads_) {
            auto& [qh, kh] = plan_[h.layer];
            qh.push_back(h.q_head);
            kh.push_back(h.k_head);
        }
        for (auto& [layer, hk] : plan_) {
            for (auto* v : {&hk.first, &hk.second}) {
                std::sort(v->begin(), v->end());
                v->erase(std::unique(v->begin(), v->end()), v->end());
            }
        }
    }

    torch_capture(torch_capture const&) = delete;
    torch_capture& operator=(torch_capture const&) = delete;
    torch_capture(torch_capture&&) = default;
    torch_capture& operator=(torch_capture&&) = default;
    ~torch_capture() = default;

    /// \returns the manifest (write it with io::write_manifest, or `write_dataset`).
    [[nodiscard]] io::manifest const& manifest() const noexcept { return manifest_; }
    /// \returns the model layout (io::layout_of(manifest())).
    [[nodiscard]] model_layout const& layout() const noexcept { return layout_; }
    /// \returns the analysed heads, ascending (io::sampled_heads(manifest())).
    [[nodiscard]] std::vector<head_id> const& heads() const noexcept { return heads_; }
    /// \returns the method §0.1 token sampler (the manifest's buckets and seed).
    [[nodiscard]] capture_sampler const& sampler() const noexcept { return sampler_; }
    /// \returns the options given at construction.
    [[nodiscard]] torch_capture_options const& options() const noexcept { return opt_; }

    /// \brief One step of one layer: the post-RoPE queries [B, Hq, T, D] and
    /// keys [B, Hkv, T, D] (or [B, T, H, D] with `torch_layout::bthd`), the
    /// tokens' positions ([B, T], or [T] shared by every sequence) and example
    /// ids ([B], or [B, T] for packed batches), and the layer's sliding window
    /// (std::nullopt = full attention; must equal the manifest's).
    ///
    /// Positions are never assumed: padding, KV-cache offsets and chunked
    /// batches shift them. Positions and example ids may live on any device;
    /// CPU tensors avoid a device synchronisation.
    /// \param[in] layer the layer index, 0 ≤ layer < n_layers.
    /// \param[in] queries post-RoPE queries, f32/f64/f16/bf16, rank 4.
    /// \param[in] keys post-RoPE keys, same dtype, device, batch, tokens and
    ///            head_dim as the queries.
    /// \param[in] positions integer tensor [B, T] or [T]; 0 ≤ position < context_length.
    /// \param[in] example_ids integer tensor [B] or [B, T].
    /// \param[in] sliding_window the layer's window, equal to the manifest's.
    /// \pre the tensors are not written to until the step's copy has been read
    ///      (the next call or synchronize()); gathers are taken at call time.
    /// \throws std::invalid_argument naming the argument and the value: layer
    ///         out of range, rank, layout sizes, Hq not a multiple of Hkv, head
    ///         counts or head_dim differing from the manifest, batch/token
    ///         mismatch, sliding window, positions or example ids of the wrong
    ///         shape or dtype, positions < 0 or >= the manifest's
    ///         context_length, dtype, device. Nothing is captured by a call that
    ///         throws for one of these.
    /// \throws std::invalid_argument (modes rows and moments) for a non-finite
    ///         value in rows read during the call: those of an earlier step, or
    ///         of this one when the tensors are on the CPU. That error comes
    ///         after this step has been recorded.
    void operator()(std::int64_t layer, at::Tensor const& queries, at::Tensor const& keys,
                    at::Tensor const& positions, at::Tensor const& example_ids,
                    std::optional<std::int64_t> sliding_window) {
        auto const shapes = check_step(layer, queries, keys, sliding_window);
        std::int64_t const B = shapes.first.batch, T = shapes.first.tokens;
        auto const [fpos, fex] = flatten_tokens(positions, example_ids, B, T);

        ++steps_;
        auto const it = plan_.find(layer);
        if (it == plan_.end()) return;  // no analysed head in this layer
        pending_step step;
        step.layer = layer;
        std::vector<at::Tensor> parts;
        for (kind k : {kind::query, kind::key}) {
            auto const& heads = k == kind::query ? it->second.first : it->second.second;
            at::Tensor const& x = k == kind::query ? queries : keys;
            pending_part part;
            part.k = k;
            part.heads = heads;
            auto kept = sampler_.select(fpos, fex, layer, k);
            if (opt_.mode == torch_capture_mode::device_moments) {
                // Group the kept tokens by bucket so that each bucket is one slice.
                std::stable_sort(kept.begin(), kept.end(), [&](std::int64_t a, std::int64_t c) {
                    return sampler_.bucket(fpos[static_cast<std::size_t>(a)]) <
                           sampler_.bucket(fpos[static_cast<std::size_t>(c)]);
                });
            }
            for (auto i : kept) {
                part.position.push_back(fpos[static_cast<std::size_t>(i)]);
                part.example_id.push_back(fex[static_cast<std::size_t>(i)]);
                part.bucket.push_back(sampler_.bucket(fpos[static_cast<std::size_t>(i)]));
            }
            if (kept.empty()) continue;
            at::Tensor const g = gather(x, heads, kept, B, T);  // [nH, nK, D] on x's device
            rows_captured_ += g.size(0) * g.size(1);
            if (opt_.mode == torch_capture_mode::device_moments) {
                device_update(layer, k, heads, g, part);
            } else {
                part.offset = step.n_rows;
                step.n_rows += g.size(0) * g.size(1);
                parts.push_back(g.reshape({-1, g.size(2)}));
                step.parts.push_back(std::move(part));
            }
        }
        if (parts.empty()) return;
        at::Tensor const flat = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
        if (flat.device().is_cpu()) {
            step.host = flat;
        } else {
            bool const pin = opt_.pinned && flat.device().is_cuda() && at::hasCUDA();
            step.host = at::empty(flat.sizes(), flat.options().device(at::kCPU).pinned_memory(pin));
            step.host.copy_(flat, /*non_blocking=*/true);
            c10::impl::VirtualGuardImpl const guard(flat.device().type());
            step.done.emplace(flat.device().type());
            step.done->record(guard.getStream(flat.device()));
            bytes_to_host_ += flat.numel() * static_cast<std::int64_t>(flat.element_size());
        }
        pending_.push_back(std::move(step));
        // Read the previous steps now: this step's copy overlaps what follows.
        while (pending_.size() > 1 || (!pending_.empty() && !pending_.front().done)) consume_front();
    }

    /// The shapes of one step's queries and keys, validated against each
    /// other and the manifest (see operator()).
    [[nodiscard]] auto check_step(std::int64_t layer, at::Tensor const& queries, at::Tensor const& keys,
                                  std::optional<std::int64_t> sliding_window) const {
        constexpr std::string_view fn = "qkgeom::torch_capture";
        auto const nl = static_cast<std::int64_t>(layout_.layers.size());
        if (layer < 0 || layer >= nl) detail::fail_arg(fn, "layer must be in [0, " + std::to_string(nl) + ")", layer);
        auto const& L = layout_.layers[static_cast<std::size_t>(layer)];
        auto const qs = attention_shape_of(queries, opt_.layout, fn, "queries");
        auto const ks = attention_shape_of(keys, opt_.layout, fn, "keys");
        std::string const lay = std::string(" (layout ") + torch_layout_name(opt_.layout) + ")";
        if (ks.batch != qs.batch)
            detail::fail_arg(fn, "keys: batch size differs from the queries' (" + std::to_string(qs.batch) + ")" + lay,
                             ks.batch);
        if (ks.tokens != qs.tokens)
            detail::fail_arg(fn, "keys: token count differs from the queries' (" + std::to_string(qs.tokens) + ")" + lay,
                             ks.tokens);
        if (ks.head_dim != qs.head_dim)
            detail::fail_arg(fn, "keys: head_dim differs from the queries' (" + std::to_string(qs.head_dim) + ")" + lay,
                             ks.head_dim);
        if (qs.heads % ks.heads != 0)
            detail::fail_arg(fn,
                             "head counts: Hq = " + std::to_string(qs.heads) +
                                 " (queries) is not a multiple of Hkv (keys)" + lay + "; Hkv",
                             ks.heads);
        if (qs.heads != L.n_q_heads)
            detail::fail_arg(fn, "queries: Hq differs from the manifest's n_q_heads = " + std::to_string(L.n_q_heads) +
                                     " of layer " + std::to_string(layer) + lay + "; Hq",
                             qs.heads);
        if (ks.heads != L.n_kv_heads)
            detail::fail_arg(fn, "keys: Hkv differs from the manifest's n_kv_heads = " +
                                     std::to_string(L.n_kv_heads) + " of layer " + std::to_string(layer) + lay +
                                     "; Hkv",
                             ks.heads);
        if (qs.head_dim != layout_.head_dim)
            detail::fail_arg(fn, "queries: head_dim differs from the manifest's (" +
                                     std::to_string(layout_.head_dim) + ")" + lay,
                             qs.head_dim);
        if (sliding_window != L.sliding_window)
            detail::fail_arg(fn, "sliding_window differs from the manifest's " + detail::torch_window_text(L.sliding_window) +
                                     " for layer " + std::to_string(layer),
                             detail::torch_window_text(sliding_window));
        auto const eq = detail::torch_element_of(queries, fn, "queries");
        auto const ek = detail::torch_element_of(keys, fn, "keys");
        if (eq != ek)
            detail::fail_arg(fn, "keys: dtype differs from the queries' (" +
                                     detail::torch_dtype_name(queries.scalar_type()) + "); dtype",
                             detail::torch_dtype_name(keys.scalar_type()));
        if (queries.device() != keys.device())
            detail::fail_arg(fn, "keys: device differs from the queries' (" + queries.device().str() + "); device",
                             keys.device().str());

        return std::pair{qs, ks};
    }

    /// One entry per token n = b·T + t: its position and example id,
    /// validated (shapes, 0 ≤ position < context_length).
    [[nodiscard]] std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> flatten_tokens(
        at::Tensor const& positions, at::Tensor const& example_ids, std::int64_t B, std::int64_t T) const {
        constexpr std::string_view fn = "qkgeom::torch_capture";
        auto pos = detail::torch_int_vector(positions, fn, "positions");
        bool const pos_ok = (positions.dim() == 2 && positions.size(0) == B && positions.size(1) == T) ||
                            (positions.dim() == 1 && positions.size(0) == T);
        if (!pos_ok)
            detail::fail_arg(fn,
                             "positions: shape must be [B, T] = [" + std::to_string(B) + ", " + std::to_string(T) +
                                 "] or [T] = [" + std::to_string(T) + "]; shape",
                             detail::torch_shape_text(positions));
        auto ex = detail::torch_int_vector(example_ids, fn, "example_ids");
        bool const ex_ok = (example_ids.dim() == 1 && example_ids.size(0) == B) ||
                           (example_ids.dim() == 2 && example_ids.size(0) == B && example_ids.size(1) == T);
        if (!ex_ok)
            detail::fail_arg(fn,
                             "example_ids: shape must be [B] = [" + std::to_string(B) + "] or [B, T] = [" +
                                 std::to_string(B) + ", " + std::to_string(T) + "]; shape",
                             detail::torch_shape_text(example_ids));
        // Flatten to one entry per token n = b·T + t.
        auto const N = static_cast<std::size_t>(B * T);
        std::vector<std::int64_t> fpos(N), fex(N);
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < T; ++t) {
                auto const n = static_cast<std::size_t>(b * T + t);
                fpos[n] = positions.dim() == 2 ? pos[n] : pos[static_cast<std::size_t>(t)];
                fex[n] = example_ids.dim() == 2 ? ex[n] : ex[static_cast<std::size_t>(b)];
            }
        for (std::size_t n = 0; n < N; ++n)
            if (fpos[n] < 0)
                detail::fail_arg(fn,
                                 "positions: negative position at batch " + std::to_string(static_cast<std::int64_t>(n) / T) +
                                     ", token " + std::to_string(static_cast<std::int64_t>(n) % T),
                                 fpos[n]);
            else if (fpos[n] >= manifest_.context_length)
                detail::fail_arg(fn,
                                 "positions: position at batch " + std::to_string(static_cast<std::int64_t>(n) / T) +
                                     ", token " + std::to_string(static_cast<std::int64_t>(n) % T) +
                                     " is beyond the manifest's context_length = " +
                                     std::to_string(manifest_.context_length),
                                 fpos[n]);

        return {std::move(fpos), std::move(fex)};
    }

    /// \brief Wait for every pending copy and absorb it (rows, host moments);
    /// fold the device moments into the host moments.
    /// \throws std::invalid_argument when a captured value is not finite
    ///         (in host modes naming the row and column; in device_moments
    ///         naming the layer and kind).
    void synchronize() {
        while (!pending_.empty()) consume_front();
        fold_device();
    }

    /// \brief The host row store (mode `rows`), after `synchronize()`.
    /// \returns a reference to the capture's store (its contents change with
    ///          later steps and merges).
    /// \throws std::logic_error in the other modes; as synchronize().
    [[nodiscard]] capture_store<Scalar> const& store() {
        if (opt_.mode != torch_capture_mode::rows)
            throw std::logic_error("qkgeom::torch_capture::store: rows are kept only in mode `rows`");
        synchronize();
        return store_;
    }

    /// \brief Write the capture as a dataset (mode `rows`; docs/dataset.md):
    /// DIR/manifest.json and one entry per stored (layer, kind, head), the
    /// vectors stored as `vector_dtype` ("f32", "f64", "f16", "bf16"; rows
    /// captured in bf16/f16 round-trip exactly in their own dtype or wider).
    /// \param[in] dir the dataset directory.
    /// \param[in] format the per-head file format.
    /// \param[in] vector_dtype "f32", "f64", "f16" or "bf16".
    /// \throws as io::write_manifest / io::write_head (qkgeom::input_error for
    ///         an entry the manifest rejects, std::invalid_argument for a bad
    ///         vector_dtype or an I/O failure); std::logic_error in the other
    ///         modes; as synchronize(). Files written before a failure are left
    ///         in place.
    void write_dataset(std::filesystem::path const& dir, io::storage_format format = io::storage_format::npy,
                       std::string_view vector_dtype = "f32") {
        auto const& st = store();
        io::write_manifest(dir, manifest_);
        for (auto const* e : st.entries()) {
            io::head_entry h;
            h.layer = e->layer;
            h.head = e->head;
            h.k = e->k;
            h.vectors.resize(e->rows(), e->dim);
            std::transform(e->values.begin(), e->values.end(), h.vectors.data(),
                           [](Scalar v) { return static_cast<double>(v); });
            h.dtype = std::string(vector_dtype);
            h.position = e->position;
            h.bucket = e->bucket;
            h.example_id = e->example_id;
            h.sliding_window = e->sliding_window;
            io::write_head(dir, manifest_, h, format, vector_dtype);
        }
    }

    /// \brief One analysed head as one value (mode `rows`), after the
    /// capture: `store().head(h)` — identity, capture facts, and views of
    /// its query rows and of the rows of the key head it reads, ready for
    /// analyze_head / attention_plasticity.
    /// \param[in] h the head (layer, q_head, k_head), one of heads().
    /// \returns the head; its views stay valid while this capture is alive
    ///          and not stepped again
    /// \throws std::invalid_argument when the head is not an analysed head;
    ///         std::logic_error in the moments modes; as synchronize().
    [[nodiscard]] auto head(head_id const& h) {
        auto out = store().head(h);
        auto const f = io::facts_of(manifest_, h.layer);  // the manifest's context length and RoPE, as read back
        out.facts.context_length = f.context_length;
        out.facts.rope = f.rope;
        return out;
    }

    /// \brief The moments of one analysed head (modes `moments` and
    /// `device_moments`), after `synchronize()`: its query head's rows and
    /// the rows of the key head it reads (method §0 GQA mapping).
    /// \param[in] h the head (layer, q_head, k_head), one of heads().
    /// \returns its moments; a kind with no captured row has no buckets.
    /// \throws std::invalid_argument when the head is not an analysed head;
    ///         std::logic_error in mode `rows`; as synchronize().
    [[nodiscard]] head_moments moments(head_id const& h) {
        if (opt_.mode == torch_capture_mode::rows)
            throw std::logic_error("qkgeom::torch_capture::moments: mode `rows` keeps rows; use store()");
        if (std::find(heads_.begin(), heads_.end(), h) == heads_.end())
            detail::fail_arg("qkgeom::torch_capture::moments",
                             "head (layer " + std::to_string(h.layer) + ", q_head " + std::to_string(h.q_head) +
                                 ") is not an analysed head of this capture; q_head",
                             h.q_head);
        synchronize();
        auto const d = layout_.head_dim;
        head_moments out(d, head_id{h.layer, h.q_head, h.k_head});
        if (auto it = host_.find(key_of(h.layer, kind::query, h.q_head)); it != host_.end()) out.q = it->second;
        if (auto it = host_.find(key_of(h.layer, kind::key, h.k_head)); it != host_.end()) out.k = it->second;
        return out;
    }

    /// \brief Every analysed head's moments with the manifest (modes
    /// `moments`, `device_moments`).
    /// \returns one head_moments per heads() entry, in that order, and the manifest.
    /// \throws std::logic_error in mode `rows`; as synchronize().
    [[nodiscard]] capture_moments result() {
        capture_moments out;
        out.manifest = manifest_;
        for (auto const& h : heads_) out.heads.push_back(moments(h));
        return out;
    }

    /// \brief Merge another capture of the same manifest and mode (shards,
    /// threads, devices): rows are appended, moments merged (Chan, method §1).
    /// \param[in,out] o the other capture; it is synchronised (its pending
    ///            copies are absorbed) but otherwise left as it was.
    /// \pre `o` is not `*this`.
    /// \returns `*this`.
    /// \throws std::invalid_argument naming the manifest field that differs,
    ///         or the mode; as synchronize() (of either capture).
    torch_capture& operator+=(torch_capture& o) {
        constexpr std::string_view fn = "qkgeom::torch_capture::operator+=";
        io::check_compatible(manifest_, o.manifest_);
        if (o.opt_.mode != opt_.mode)
            detail::fail_arg(fn, "capture modes differ: this has " + std::to_string(static_cast<int>(opt_.mode)) +
                                     ", the other has",
                             static_cast<int>(o.opt_.mode));
        synchronize();
        o.synchronize();
        if (opt_.mode == torch_capture_mode::rows) store_ += o.store_;
        for (auto const& [key, bm] : o.host_) {
            auto [it, inserted] = host_.try_emplace(key, layout_.head_dim);
            it->second += bm;
        }
        steps_ += o.steps_;
        rows_captured_ += o.rows_captured_;
        bytes_to_host_ += o.bytes_to_host_;
        return *this;
    }

    /// \returns the steps seen (calls, all layers).
    [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
    /// \returns the rows gathered (kept tokens × selected heads, queries and keys).
    [[nodiscard]] std::int64_t rows_captured() const noexcept { return rows_captured_; }
    /// \returns the bytes copied from a device to the host for rows (0 for CPU
    /// tensors and in device_moments mode).
    [[nodiscard]] std::int64_t bytes_to_host() const noexcept { return bytes_to_host_; }

private:
    using key_t = std::tuple<std::int64_t, int, std::int64_t>;  // (layer, kind, head)
    static key_t key_of(std::int64_t layer, kind k, std::int64_t head) { return {layer, static_cast<int>(k), head}; }

    /// The kept rows of one kind of one step, as laid out in the staged copy.
    struct pending_part {
        kind k = kind::query;
        std::vector<std::int64_t> heads;  ///< selected heads, ascending
        std::vector<std::int64_t> position, example_id, bucket;  ///< per kept token
        std::int64_t offset = 0;  ///< first row in `host`: head i occupies rows offset + i·nK ..
    };
    struct pending_step {
        std::int64_t layer = 0;
        std::int64_t n_rows = 0;
        at::Tensor host;                 ///< [rows, D] on the CPU (pinned when staged from CUDA)
        std::optional<c10::Event> done;  ///< recorded after the copy; none for CPU tensors
        std::vector<pending_part> parts;
    };

    /// One indexed gather: rows (b, h, t) of `x` for the heads × kept tokens,
    /// [nH, nK, D], on x's device; strided views are indexed in place.
    at::Tensor gather(at::Tensor const& x, std::vector<std::int64_t> const& heads, std::vector<std::int64_t> const& kept,
                      std::int64_t B, std::int64_t T) const {
        (void)B;
        auto const nk = static_cast<std::int64_t>(kept.size());
        auto const nh = static_cast<std::int64_t>(heads.size());
        at::Tensor idx = at::empty({2, nk}, at::TensorOptions().dtype(at::kLong));
        auto* p = idx.data_ptr<std::int64_t>();
        for (std::int64_t i = 0; i < nk; ++i) {
            p[i] = kept[static_cast<std::size_t>(i)] / T;
            p[nk + i] = kept[static_cast<std::size_t>(i)] % T;
        }
        at::Tensor hidx = at::empty({nh, 1}, at::TensorOptions().dtype(at::kLong));
        std::copy(heads.begin(), heads.end(), hidx.data_ptr<std::int64_t>());
        if (!x.device().is_cpu()) {
            idx = idx.to(x.device());
            hidx = hidx.to(x.device());
        }
        at::Tensor const bi = idx[0].unsqueeze(0), ti = idx[1].unsqueeze(0);
        at::Tensor const xd = x.detach();
        if (opt_.layout == torch_layout::bhtd) return xd.index({bi, hidx, ti});
        return xd.index({bi, ti, hidx});
    }

    void consume_front() {
        pending_step step = std::move(pending_.front());
        pending_.pop_front();
        if (step.done) detail::torch_wait(*step.done);  // the host reads only after the copy completed
        for (auto const& part : step.parts) {
            auto const nk = static_cast<std::int64_t>(part.position.size());
            std::vector<std::int64_t> all(static_cast<std::size_t>(nk));
            std::iota(all.begin(), all.end(), std::int64_t{0});
            for (std::size_t i = 0; i < part.heads.size(); ++i) {
                torch_matrix const rows(step.host.narrow(0, part.offset + static_cast<std::int64_t>(i) * nk, nk));
                std::int64_t const head = part.heads[i];
                if (opt_.mode == torch_capture_mode::rows) {
                    store_.add_selected(step.layer, part.k, head, rows, part.position, part.example_id, all);
                } else {
                    auto [it, inserted] = host_.try_emplace(key_of(step.layer, part.k, head), layout_.head_dim);
                    it->second.add(rows, part.position, part.bucket);
                }
            }
        }
    }

    // --- device moments (method §1 on the device) ------------------------------
    struct device_bucket {
        std::int64_t n = 0;
        double mean_t = 0, m2_t = 0;
        double t_min = std::numeric_limits<double>::infinity(), t_max = -std::numeric_limits<double>::infinity();
        at::Tensor mean_x, c_xt, c_xx;  ///< [nH, D], [nH, D], [nH, D, D] in f64 on the device
    };
    struct device_group {
        std::vector<std::int64_t> heads;
        std::map<std::int64_t, device_bucket> buckets;
        at::Tensor nonfinite;  ///< device bool: a non-finite value was seen
    };

    /// Absorb the gathered rows g [nH, nK, D] (kept tokens grouped by bucket)
    /// into the device state of (layer, kind): per bucket, the block's centred
    /// co-moments by one batched GEMM, merged with Chan's formulas (stats/moments.hpp).
    /// Position statistics are exact host arithmetic (positions are on the host).
    void device_update(std::int64_t layer, kind k, std::vector<std::int64_t> const& heads, at::Tensor const& g,
                       pending_part const& part) {
        auto& grp = device_[key_of(layer, k, -1)];
        grp.heads = heads;
        at::Tensor const x = g.to(at::kDouble);
        at::Tensor const bad = at::logical_not(at::isfinite(x).all());
        grp.nonfinite = grp.nonfinite.defined() ? at::logical_or(grp.nonfinite, bad) : bad;
        auto const nk = static_cast<std::int64_t>(part.position.size());
        // Host: centred positions of every bucket segment (two-pass, corrected).
        std::vector<double> tc(static_cast<std::size_t>(nk));
        struct seg { std::int64_t bucket, start, count; double mean, m2, tmin, tmax; };
        std::vector<seg> segs;
        for (std::int64_t s = 0; s < nk;) {
            std::int64_t e = s;
            while (e < nk && part.bucket[static_cast<std::size_t>(e)] == part.bucket[static_cast<std::size_t>(s)]) ++e;
            auto const nb = static_cast<double>(e - s);
            double mt = 0, tmin = std::numeric_limits<double>::infinity(), tmax = -tmin;
            for (std::int64_t i = s; i < e; ++i) {
                auto const t = static_cast<double>(part.position[static_cast<std::size_t>(i)]);
                mt += t;
                tmin = std::min(tmin, t);
                tmax = std::max(tmax, t);
            }
            mt /= nb;
            double corr = 0;
            for (std::int64_t i = s; i < e; ++i) corr += static_cast<double>(part.position[static_cast<std::size_t>(i)]) - mt;
            mt += corr / nb;
            double m2 = 0;
            for (std::int64_t i = s; i < e; ++i) {
                double const c = static_cast<double>(part.position[static_cast<std::size_t>(i)]) - mt;
                tc[static_cast<std::size_t>(i)] = c;
                m2 += c * c;
            }
            segs.push_back({part.bucket[static_cast<std::size_t>(s)], s, e - s, mt, m2, tmin, tmax});
            s = e;
        }
        at::Tensor tcd = at::from_blob(tc.data(), {nk}, at::TensorOptions().dtype(at::kDouble)).clone();
        if (!x.device().is_cpu()) tcd = tcd.to(x.device());
        for (auto const& sg : segs) {
            at::Tensor const xb = x.narrow(1, sg.start, sg.count);  // [nH, nb, D]
            at::Tensor const tb = tcd.narrow(0, sg.start, sg.count);
            at::Tensor bx = xb.mean(1);                              // [nH, D]
            at::Tensor xc = xb - bx.unsqueeze(1);
            at::Tensor const corr = xc.mean(1);
            bx = bx + corr;
            xc = xc - corr.unsqueeze(1);
            at::Tensor const xct = xc.transpose(1, 2);               // [nH, D, nb]
            at::Tensor const cxx = at::matmul(xct, xc);              // [nH, D, D]
            at::Tensor const cxt = at::matmul(xct, tb);              // [nH, D]
            auto& st = grp.buckets[sg.bucket];
            auto const nb = static_cast<double>(sg.count);
            if (st.n == 0) {
                st.mean_x = bx;
                st.c_xt = cxt;
                st.c_xx = cxx;
                st.mean_t = sg.mean;
                st.m2_t = sg.m2;
            } else {
                double const na = static_cast<double>(st.n), nt = na + nb, f = na * nb / nt;
                double const dt = sg.mean - st.mean_t;
                at::Tensor const dx = bx - st.mean_x;
                st.m2_t += sg.m2 + f * dt * dt;
                st.c_xt = st.c_xt + cxt + dx * (f * dt);
                st.c_xx = st.c_xx + cxx + (dx.unsqueeze(2) * dx.unsqueeze(1)) * f;
                st.mean_t += dt * (nb / nt);
                st.mean_x = st.mean_x + dx * (nb / nt);
            }
            st.t_min = std::min(st.t_min, sg.tmin);
            st.t_max = std::max(st.t_max, sg.tmax);
            st.n += sg.count;
        }
    }

    /// Copy the device state to the host (one copy per bucket and kind) and
    /// merge it into the host moments; the device state is reset.
    void fold_device() {
        constexpr std::string_view fn = "qkgeom::torch_capture::synchronize";
        auto const d = layout_.head_dim;
        for (auto& [key, grp] : device_) {
            auto const layer = std::get<0>(key);
            auto const k = static_cast<kind>(std::get<1>(key));
            if (grp.nonfinite.defined() && grp.nonfinite.template item<bool>())
                detail::fail_arg(fn, "non-finite " + std::string(kind_name(k)) + " value captured in layer",
                                 layer);
            for (auto const& [bucket, st] : grp.buckets) {
                at::Tensor const mx = st.mean_x.to(at::kCPU).contiguous();
                at::Tensor const cxt = st.c_xt.to(at::kCPU).contiguous();
                at::Tensor const cxx = st.c_xx.to(at::kCPU).contiguous();
                for (std::size_t i = 0; i < grp.heads.size(); ++i) {
                    qkgeom::moments m(d);
                    m.n = st.n;
                    m.mean_t = st.mean_t;
                    m.m2_t = st.m2_t;
                    m.t_min = st.t_min;
                    m.t_max = st.t_max;
                    auto const hi = static_cast<std::int64_t>(i);
                    m.mean_x = Eigen::Map<Eigen::VectorXd const>(mx[hi].data_ptr<double>(), d);
                    m.c_xt = Eigen::Map<Eigen::VectorXd const>(cxt[hi].data_ptr<double>(), d);
                    // Row-major D×D; the lower triangle is mirrored (as moments::symmetrize).
                    m.c_xx = Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> const>(
                        cxx[hi].data_ptr<double>(), d, d);
                    m.symmetrize();
                    auto [it, inserted] = host_.try_emplace(key_of(layer, k, grp.heads[i]), d);
                    auto [bt, ins] = it->second.buckets.try_emplace(bucket, d);
                    bt->second += m;
                }
            }
        }
        device_.clear();
    }

    static io::manifest checked(io::manifest m) {
        constexpr std::string_view fn = "qkgeom::torch_capture";
        if (!m.rope)
            detail::fail_arg(fn, "the manifest must record the RoPE (manifest.rope: pairing, rotary_dim, theta, scaling); model",
                             m.model);
        if (!m.heads)
            detail::fail_arg(fn, "the manifest must record the head sampling (manifest.heads: count, seed, eligibility); model",
                             m.model);
        if (m.sliding_window.empty())
            m.sliding_window.assign(static_cast<std::size_t>(std::max<std::int64_t>(m.n_layers, 0)), std::nullopt);
        return m;
    }

    io::manifest manifest_;
    torch_capture_options opt_;
    model_layout layout_;
    std::vector<head_id> heads_;
    capture_sampler sampler_;
    capture_store<Scalar> store_;
    std::map<std::int64_t, std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> plan_;  // layer -> (q, k heads)
    std::deque<pending_step> pending_;
    std::map<key_t, bucketed_moments> host_;
    std::map<key_t, device_group> device_;
    std::int64_t steps_ = 0, rows_captured_ = 0, bytes_to_host_ = 0;
};

}  // namespace qkgeom

#endif
