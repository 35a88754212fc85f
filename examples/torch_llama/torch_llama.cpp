// A small Llama-style attention stack written with LibTorch — RMSNorm, q/k/v
// projections, grouped-query attention, rotary embeddings (rotate-half
// pairing), causal attention over a KV cache — run on a seeded token stream,
// with the qkgeom capture called where RoPE is applied (docs/torch.md).
//
// The stream is fed in chunks, so the positions of a chunk start at the KV
// cache's length: they are passed explicitly, never assumed to be arange(T).
// Two captures run side by side: the row store (for plasticity pairs) and the
// device moments (the mode for dense captures). The captured heads are
// analysed (method §2–6) and reported. Runs on CUDA when a GPU is present.
#include <qkgeom/adapters/torch.hpp>
#include <qkgeom/adapters/torch_capture.hpp>
#include <qkgeom/analysis/analyze.hpp>
#include <qkgeom/analysis/model.hpp>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <algorithm>
#include <optional>
#include <vector>

namespace {

struct config {
    std::int64_t vocab = 512, d_model = 128, n_layers = 2, n_q_heads = 4, n_kv_heads = 2, head_dim = 32;
    double rope_theta = 10000.0;
    std::int64_t batch = 4, chunk = 64, n_chunks = 4;  // 4 sequences of 256 tokens, fed 64 at a time
};

/// RMSNorm: x / sqrt(mean(x²) + eps) · weight.
struct rms_norm_impl : torch::nn::Module {
    explicit rms_norm_impl(std::int64_t d) : weight(register_parameter("weight", torch::ones({d}))) {}
    torch::Tensor forward(torch::Tensor const& x) {
        return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + 1e-6) * weight;
    }
    torch::Tensor weight;
};

/// Rotate-half RoPE on [B, T, H, D] with explicit positions [B, T]: pairs
/// (i, i + D/2) rotated by angle position · θ^(−2i/D).
torch::Tensor apply_rope(torch::Tensor const& x, torch::Tensor const& positions, double theta) {
    auto const d = x.size(-1);
    auto const inv = torch::pow(theta, -torch::arange(0, d, 2, x.options()) / static_cast<double>(d));
    auto const ang = positions.to(x.dtype()).unsqueeze(-1) * inv;  // [B, T, D/2]
    auto const emb = torch::cat({ang, ang}, -1).unsqueeze(2);       // [B, T, 1, D]
    auto const x1 = x.narrow(-1, 0, d / 2), x2 = x.narrow(-1, d / 2, d / 2);
    auto const rotated = torch::cat({-x2, x1}, -1);
    return x * emb.cos() + rotated * emb.sin();
}

/// One attention layer with a KV cache.
struct attention_impl : torch::nn::Module {
    attention_impl(config const& c, std::int64_t layer_index)
        : cfg(c), layer(layer_index), norm(register_module("norm", std::make_shared<rms_norm_impl>(c.d_model))),
          wq(register_module("wq", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.n_q_heads * c.head_dim).bias(false)))),
          wk(register_module("wk", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.n_kv_heads * c.head_dim).bias(false)))),
          wv(register_module("wv", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.n_kv_heads * c.head_dim).bias(false)))),
          wo(register_module("wo", torch::nn::Linear(torch::nn::LinearOptions(c.n_q_heads * c.head_dim, c.d_model).bias(false)))) {}

    torch::Tensor forward(torch::Tensor const& h, torch::Tensor const& positions, torch::Tensor const& example_ids,
                          std::vector<qkgeom::torch_capture<float>*> const& captures) {
        auto const B = h.size(0), T = h.size(1);
        auto const x = norm->forward(h);
        auto q = wq(x).view({B, T, cfg.n_q_heads, cfg.head_dim});
        auto k = wk(x).view({B, T, cfg.n_kv_heads, cfg.head_dim});
        auto const v = wv(x).view({B, T, cfg.n_kv_heads, cfg.head_dim});
        q = apply_rope(q, positions, cfg.rope_theta);
        k = apply_rope(k, positions, cfg.rope_theta);
        // --- qkgeom: the post-RoPE queries and keys of this step ([B, T, H, D])
        for (auto* cap : captures) (*cap)(layer, q, k, positions, example_ids, /*sliding_window=*/std::nullopt);
        // KV cache and causal grouped-query attention
        k_cache = k_cache.defined() ? torch::cat(std::vector<torch::Tensor>{k_cache, k}, 1) : k;
        v_cache = v_cache.defined() ? torch::cat(std::vector<torch::Tensor>{v_cache, v}, 1) : v;
        auto const group = cfg.n_q_heads / cfg.n_kv_heads;
        auto const kk = k_cache.transpose(1, 2).repeat_interleave(group, 1);  // [B, Hq, S, D]
        auto const vv = v_cache.transpose(1, 2).repeat_interleave(group, 1);
        auto scores = torch::matmul(q.transpose(1, 2), kk.transpose(2, 3)) / std::sqrt(double(cfg.head_dim));
        auto const S = kk.size(2);
        auto const key_pos = torch::arange(S, positions.options()).view({1, 1, 1, S}) + (positions.select(1, 0).view({B, 1, 1, 1}) - (S - T));
        auto const causal = key_pos > positions.view({B, 1, T, 1});
        scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
        auto const out = torch::matmul(torch::softmax(scores, -1), vv).transpose(1, 2).reshape({B, T, -1});
        return h + wo(out);
    }

    config cfg;
    std::int64_t layer;
    std::shared_ptr<rms_norm_impl> norm;
    torch::nn::Linear wq, wk, wv, wo;
    torch::Tensor k_cache, v_cache;
};

}  // namespace

int main() {
    torch::NoGradGuard no_grad;
    torch::manual_seed(2024);
    config const cfg;
    torch::Device const dev = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);

    torch::nn::Embedding embed(cfg.vocab, cfg.d_model);
    std::vector<std::shared_ptr<attention_impl>> layers;
    for (std::int64_t l = 0; l < cfg.n_layers; ++l) layers.push_back(std::make_shared<attention_impl>(cfg, l));
    embed->to(dev);
    for (auto& a : layers) a->to(dev);

    // What the analysis depends on: RoPE, head counts, GQA, sampler, seeds.
    qkgeom::rope_spec rope;
    rope.pairing = qkgeom::rope_pairing::rotate_half;
    rope.rotary_dim = cfg.head_dim;
    rope.theta = cfg.rope_theta;
    qkgeom::capture_sampler const sampler{{qkgeom::bucket_scheme::uniform, 16, 4.0}, /*seed=*/1234};
    auto const manifest = qkgeom::make_capture_manifest(
        "tiny-llama", qkgeom::uniform_layout(cfg.n_layers, cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim), rope,
        sampler, qkgeom::io::head_sampling{/*count=*/4, /*seed=*/99}, cfg.chunk * cfg.n_chunks);
    qkgeom::torch_capture_options rows_opt, dev_opt;
    rows_opt.layout = dev_opt.layout = qkgeom::torch_layout::bthd;  // capture [B, T, H, D] views as they are
    dev_opt.mode = qkgeom::torch_capture_mode::device_moments;
    qkgeom::torch_capture<float> rows(manifest, rows_opt), moments(manifest, dev_opt);

    // A seeded token stream: batch sequences, fed chunk by chunk.
    auto const tokens = torch::randint(cfg.vocab, {cfg.batch, cfg.chunk * cfg.n_chunks},
                                       torch::TensorOptions().dtype(torch::kLong)).to(dev);
    auto const example_ids = torch::arange(cfg.batch, torch::TensorOptions().dtype(torch::kLong));  // host: no sync
    for (std::int64_t c = 0; c < cfg.n_chunks; ++c) {
        auto const positions = (torch::arange(cfg.chunk, torch::TensorOptions().dtype(torch::kLong)) + c * cfg.chunk)
                                   .unsqueeze(0).repeat({cfg.batch, 1});  // [B, T], offset by the KV cache
        auto h = embed(tokens.narrow(1, c * cfg.chunk, cfg.chunk));
        for (auto& a : layers) h = a->forward(h, positions.to(dev), example_ids, {&rows, &moments});
    }

    // Analyse the captured heads (method §2–6).
    qkgeom::analysis_options const opt;
    std::vector<qkgeom::head_analysis> heads;
    double max_rel = 0;
    std::printf("device: %s; steps %lld, rows captured %lld\n", dev.str().c_str(),
                static_cast<long long>(rows.steps()), static_cast<long long>(rows.rows_captured()));
    std::printf("layer q_head k_head  n_q  n_k  q_R2_pos position_r bias_strength ap_overall  ap_drop\n");
    for (auto const& h : rows.heads()) {
        // The head as one value: views of its query rows and of its key head's
        // rows, with the capture facts (the sampler's bucket scheme, the
        // layer's window, L = the manifest's context length).
        auto const head = rows.head(h);
        auto const a = qkgeom::analyze_head(head, opt);
        std::printf("%5lld %6lld %6lld %4lld %4lld %9.4f %10.4f %13.4g %10.4f %8.4f\n", static_cast<long long>(h.layer),
                    static_cast<long long>(h.q_head), static_cast<long long>(h.k_head),
                    static_cast<long long>(a.n_q_tokens), static_cast<long long>(a.n_k_tokens), a.householder.q_R2_pos,
                    a.rotation.position_r, a.rotation.bias_strength, a.plasticity.ap_overall, a.plasticity.ap_drop);
        heads.push_back(a);
        // The device moments saw the same kept rows: their pooled statistics agree.
        auto const pooled_dev = moments.moments(h).pooled();
        qkgeom::head_moments ref(cfg.head_dim);
        ref.add(qkgeom::kind::query, head.queries);
        ref.add(qkgeom::kind::key, head.keys);
        auto const pooled_rows = ref.pooled();
        max_rel = std::max(max_rel, (pooled_dev.c_xx - pooled_rows.c_xx).cwiseAbs().maxCoeff() /
                                        pooled_rows.c_xx.cwiseAbs().maxCoeff());
    }
    auto const summary = qkgeom::summarise_model(heads);
    std::printf("mean over heads: ap_overall %.4f, q_R2_pos %.4f\n", summary.all["ap_overall"], summary.all["q_R2_pos"]);
    std::printf("device moments vs row store: max relative difference of the pooled covariance %.1e\n", max_rel);
    std::printf("captured heads analysed: %zu\n", heads.size());
    return max_rel < 1e-10 ? 0 : 1;
}

// Expected output on the CPU (LibTorch 1.13; random weights, so the heads show
// little positional structure — the point is the plumbing):
//
// device: cpu; steps 8, rows captured 1698
// layer q_head k_head  n_q  n_k  q_R2_pos position_r bias_strength ap_overall  ap_drop
//     0      1      0  270  232    0.0036     0.2498    -3.149e-05     0.9612  -0.0130
//     1      0      0  232  250    0.0041     0.2351    -1.225e-05     0.9513   0.0074
//     1      1      0  232  250    0.0051     0.2264    -4.177e-05     0.9638   0.0080
//     1      2      1  232  250    0.0035     0.2619    -0.0001283     0.9665   0.0060
// mean over heads: ap_overall 0.9607, q_R2_pos 0.0041
// device moments vs row store: max relative difference of the pooled covariance 2.9e-16
// captured heads analysed: 4
