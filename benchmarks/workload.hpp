// qkgeom benchmarks — seeded synthetic workloads shaped like real captures
// (method §8): d = 128 (64 rotary dimensions, RoPE, a Haar-random mixing per kv
// head), 500 sequences of 4,096 tokens, uniform buckets of 256 tokens at
// rate 1 (≈ 1 kept token per bucket per sequence) → 16 buckets and ≈ 8,000
// query + 8,000 key rows per head. Rows are stored as f32, as captures are.
#pragma once

#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/capture/synthetic.hpp>
#include <qkgeom/core/parallel.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace qkbench {

using qkgeom::index_t;
using rows_f32 = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// One head pair as a capture holds it: f32 rows and integer annotations,
/// with its identity and capture facts (a qkgeom::head_capture: every
/// analysis takes it as it is).
struct head_data : qkgeom::head_capture<rows_f32> {
    [[nodiscard]] std::size_t bytes() const {
        return std::size_t(queries.vectors.size() + keys.vectors.size()) * sizeof(float);
    }
};

/// The shape of the synthetic model: `n_layers` × `n_q_heads` query heads
/// (GQA with `n_kv_heads` kv heads per layer).
struct model_shape {
    std::int64_t n_layers = 25;
    std::int64_t n_q_heads = 12;
    std::int64_t n_kv_heads = 4;
    index_t d = 128;
    std::int64_t n_examples = 500;
    std::int64_t context_length = 4096;
    std::int64_t bucket_width = 256;
    [[nodiscard]] std::int64_t heads() const { return n_layers * n_q_heads; }
};

/// Environment override of an integer knob (for quick local runs).
inline std::int64_t env_int(char const* name, std::int64_t fallback) {
    char const* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

/// The 300-head model of method §8 (QKGEOM_BENCH_LAYERS overrides the layer count).
inline model_shape realistic_model() {
    model_shape s;
    s.n_layers = env_int("QKGEOM_BENCH_LAYERS", 25);
    return s;
}

inline qkgeom::synthetic::layer_spec layer_of(model_shape const& s, std::int64_t layer) {
    qkgeom::synthetic::layer_spec L;
    L.d = s.d;
    L.rotary_dims = s.d / 2;
    L.mix = true;
    L.n_q_heads = s.n_q_heads;
    L.n_kv_heads = s.n_kv_heads;
    L.layer = layer;
    L.model_seed = 4242 + static_cast<std::uint64_t>(layer);
    for (std::int64_t h = 0; h < L.n_q_heads; ++h) {
        auto q = qkgeom::synthetic::default_q_head();
        q.query.slope = 1e-3 * (1.0 + 0.1 * double((h * 7 + layer * 3) % 5 - 2));
        q.query.noise_sd_ramp = 0.3;
        L.q_heads.push_back(q);
    }
    for (std::int64_t g = 0; g < L.n_kv_heads; ++g) L.kv_heads.push_back(qkgeom::synthetic::default_kv_head());
    return L;
}

inline qkgeom::synthetic::capture_spec capture_of(model_shape const& s) {
    qkgeom::synthetic::capture_spec c;
    c.n_examples = s.n_examples;
    c.context_length = s.context_length;
    c.buckets = {.scheme = qkgeom::bucket_scheme::uniform, .width = s.bucket_width, .rate = 1.0};
    c.seed = 7;
    return c;
}

/// The capture facts of a capture of this shape (what `qkgeom analyze` reads
/// from the manifest): the bucket scheme and L; no sliding window.
inline qkgeom::capture_facts capture_facts_of(model_shape const& s) {
    qkgeom::capture_facts f;
    f.buckets = capture_of(s).buckets;
    f.context_length = s.context_length;
    return f;
}

/// The synthetic head with its rows stored as f32 (its facts are those of
/// capture_facts_of: the capture's bucket scheme and context length).
inline head_data to_head_data(qkgeom::synthetic::head_capture&& hc) {
    head_data h;
    h.id = hc.id;
    h.facts = hc.facts;
    h.queries = {hc.queries.vectors.cast<float>(), std::move(hc.queries.position), std::move(hc.queries.bucket),
                 std::move(hc.queries.example_id)};
    h.keys = {hc.keys.vectors.cast<float>(), std::move(hc.keys.position), std::move(hc.keys.bucket),
              std::move(hc.keys.example_id)};
    return h;
}

/// Every head of a layer.
inline std::vector<head_data> make_layer(model_shape const& s, std::int64_t layer) {
    auto heads = qkgeom::synthetic::generate_layer(layer_of(s, layer), capture_of(s));
    std::vector<head_data> out;
    out.reserve(heads.size());
    for (auto& hc : heads) out.push_back(to_head_data(std::move(hc)));
    return out;
}

/// One realistic head (layer 0, query head 0); cached per process.
inline head_data const& realistic_head() {
    static head_data const h = to_head_data(qkgeom::synthetic::generate_head(layer_of(model_shape{}, 0), capture_of(model_shape{}), 0));
    return h;
}

using qkgeom::parallel_for;  // qkgeom/core/parallel.hpp

/// Analyse one head with the library (default options = what `qkgeom analyze` does).
inline qkgeom::head_analysis analyze(head_data const& h, qkgeom::analysis_options const& opt) {
    return qkgeom::analyze_head(h, opt);
}

/// The options `qkgeom analyze` uses for a capture of this shape: the
/// defaults (the bucket scheme and L are capture facts of the head,
/// capture_facts_of).
inline qkgeom::analysis_options cli_options(model_shape const&) { return {}; }

}  // namespace qkbench
