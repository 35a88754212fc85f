// The tiny Llama-style model of examples/python/tiny_llama.py, run in LibTorch
// from its checkpoint, with the qkgeom capture called where RoPE is applied.
//
//   tiny_llama_capture MODEL_DIR TOKENS.npy POSITIONS.npy OUT_DIR
//                      [--width W] [--rate R] [--seed S] [--heads N] [--head-seed S]
//                      [--logits FILE.npy]
//
// MODEL_DIR holds config.json and model.safetensors (read with qkgeom's
// safetensors reader); TOKENS and POSITIONS are int64 [B, T] .npy files; the
// example id of sequence b is b. The forward pass repeats the Python model's
// ops in the same order, in float32 on one thread, so that with the same
// LibTorch build (Debian's libtorch-dev and python3-torch 1.13) the captured
// rows are the same bits as those of the Python capture (tested by
// tests/python/model/capture_parity.py). Change both together.
//
// The capture: torch_capture<float> in `rows` mode, buckets uniform W (default
// 32) with rate R (default 8), sampler seed S (default 1234), N sampled heads
// (default: every head) with seed --head-seed (default 0); written to OUT_DIR
// as a dataset (npy form, f32 vectors). --logits also writes the logits
// [B, T, vocab] (f32) of the full forward pass.
#include <qkgeom/adapters/torch.hpp>
#include <qkgeom/adapters/torch_capture.hpp>
#include <qkgeom/io/json.hpp>
#include <qkgeom/io/npy.hpp>
#include <qkgeom/io/safetensors.hpp>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct config {
    std::int64_t vocab_size = 0, d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, d_ff = 0,
                 context_length = 0;
    double rope_theta = 0, rms_eps = 0;
};

qkgeom::json::value const& json_field(qkgeom::json::value const& root, std::string const& source,
                                          std::string const& key) {
    auto const* v = root.find(key);
    if (v == nullptr || !v->is_number()) qkgeom::detail::fail_input(source, key, "missing", "expected a number");
    return *v;
}

std::int64_t json_positive_int(qkgeom::json::value const& root, std::string const& source, std::string const& key) {
    auto const& v = json_field(root, source, key);
    if (!v.is_int() || v.as_int() < 1 || v.as_int() > (std::int64_t{1} << 20))
        qkgeom::detail::fail_input(source, key, qkgeom::json::dump(v), "expected an integer in [1, 2^20]");
    return v.as_int();
}

config read_config(fs::path const& path) {
    auto const bytes = qkgeom::io::detail::read_file_bytes(path, 1 << 20, "file size");
    std::string const source = path.string();
    auto const root = qkgeom::json::parse(std::string_view(reinterpret_cast<char const*>(bytes.data()), bytes.size()),
                                              source);
    if (!root.is_object()) qkgeom::detail::fail_input(source, "config", root.type_name(), "expected a JSON object");
    config c;
    c.vocab_size = json_positive_int(root, source, "vocab_size");
    c.d_model = json_positive_int(root, source, "d_model");
    c.n_layers = json_positive_int(root, source, "n_layers");
    c.n_heads = json_positive_int(root, source, "n_heads");
    c.n_kv_heads = json_positive_int(root, source, "n_kv_heads");
    c.head_dim = json_positive_int(root, source, "head_dim");
    c.d_ff = json_positive_int(root, source, "d_ff");
    c.context_length = json_positive_int(root, source, "context_length");
    c.rope_theta = json_field(root, source, "rope_theta").as_double();
    c.rms_eps = json_field(root, source, "rms_eps").as_double();
    if (!(c.rope_theta > 1) || !(c.rms_eps > 0) || c.n_heads % c.n_kv_heads != 0 || c.head_dim % 2 != 0)
        qkgeom::detail::fail_input(source, "config", "rope_theta/rms_eps/n_heads/head_dim",
                                   "needs rope_theta > 1, rms_eps > 0, n_kv_heads | n_heads, even head_dim");
    return c;
}

/// The checkpoint's tensors as float32 torch tensors, each checked against the shape the config implies.
class weights {
public:
    weights(fs::path const& path, config const& c) : file_(qkgeom::io::read_safetensors(path)), source_(path.string()) {
        expect("embed_tokens.weight", {c.vocab_size, c.d_model});
        expect("norm.weight", {c.d_model});
        expect("lm_head.weight", {c.vocab_size, c.d_model});
        for (std::int64_t l = 0; l < c.n_layers; ++l) {
            std::string const p = "layers." + std::to_string(l) + ".";
            expect(p + "input_layernorm.weight", {c.d_model});
            expect(p + "post_attention_layernorm.weight", {c.d_model});
            expect(p + "self_attn.q_proj.weight", {c.n_heads * c.head_dim, c.d_model});
            expect(p + "self_attn.k_proj.weight", {c.n_kv_heads * c.head_dim, c.d_model});
            expect(p + "self_attn.v_proj.weight", {c.n_kv_heads * c.head_dim, c.d_model});
            expect(p + "self_attn.o_proj.weight", {c.d_model, c.n_heads * c.head_dim});
            expect(p + "mlp.gate_proj.weight", {c.d_ff, c.d_model});
            expect(p + "mlp.up_proj.weight", {c.d_ff, c.d_model});
            expect(p + "mlp.down_proj.weight", {c.d_model, c.d_ff});
        }
        if (file_.tensors.size() != tensors_.size()) {
            for (auto const& [name, t] : file_.tensors)
                if (!tensors_.count(name)) qkgeom::detail::fail_input(source_, name, "present", "unexpected tensor");
        }
    }
    torch::Tensor const& operator[](std::string const& name) const { return tensors_.at(name); }

private:
    void expect(std::string const& name, std::vector<std::int64_t> shape) {
        auto const it = file_.tensors.find(name);
        if (it == file_.tensors.end()) qkgeom::detail::fail_input(source_, name, "missing", "tensor not in the file");
        auto const& t = it->second;
        if (t.type != qkgeom::io::dtype::f32)
            qkgeom::detail::fail_input(source_, name + ".dtype", qkgeom::io::detail::st_dtype_name(t.type), "expected F32");
        if (t.shape != shape)
            qkgeom::detail::fail_input(source_, name + ".shape", qkgeom::io::detail::shape_text(t.shape),
                                       "expected " + qkgeom::io::detail::shape_text(shape));
        // from_blob views the (little-endian, this host's order) bytes; clone owns them.
        tensors_[name] = torch::from_blob(const_cast<unsigned char*>(t.data.data()), shape, torch::kFloat32).clone();
    }
    qkgeom::io::safetensors_file file_;
    std::string source_;
    std::map<std::string, torch::Tensor> tensors_;
};

// --- the ops of examples/python/tiny_llama.py, in the same order -----------------------------

torch::Tensor rms_norm(torch::Tensor const& x, torch::Tensor const& w, double eps) {
    return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * w;
}

torch::Tensor rotate_half(torch::Tensor const& x) {
    auto const half = x.size(-1) / 2;
    return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

struct forward_pass {
    config const& c;
    weights const& w;
    std::vector<qkgeom::torch_capture<float>*> captures;

    torch::Tensor attention(std::int64_t l, torch::Tensor const& x, torch::Tensor const& cos, torch::Tensor const& sin,
                            torch::Tensor const& mask, torch::Tensor const& positions,
                            torch::Tensor const& example_ids) const {
        std::string const p = "layers." + std::to_string(l) + ".self_attn.";
        auto const B = x.size(0), T = x.size(1);
        auto q = torch::linear(x, w[p + "q_proj.weight"]).view({B, T, c.n_heads, c.head_dim}).transpose(1, 2);
        auto k = torch::linear(x, w[p + "k_proj.weight"]).view({B, T, c.n_kv_heads, c.head_dim}).transpose(1, 2);
        auto v = torch::linear(x, w[p + "v_proj.weight"]).view({B, T, c.n_kv_heads, c.head_dim}).transpose(1, 2);
        auto const cu = cos.unsqueeze(1), su = sin.unsqueeze(1);  // apply_rotary_pos_emb
        q = q * cu + rotate_half(q) * su;
        k = k * cu + rotate_half(k) * su;
        // --- qkgeom: the post-RoPE queries [B, Hq, T, D] and keys [B, Hkv, T, D]
        for (auto* cap : captures) (*cap)(l, q, k, positions, example_ids, /*sliding_window=*/std::nullopt);
        auto const group = c.n_heads / c.n_kv_heads;
        k = k.repeat_interleave(group, 1);
        v = v.repeat_interleave(group, 1);
        auto scores = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(c.head_dim));
        scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
        auto const out = torch::matmul(torch::softmax(scores, -1), v);
        return torch::linear(out.transpose(1, 2).reshape({B, T, c.n_heads * c.head_dim}), w[p + "o_proj.weight"]);
    }

    torch::Tensor mlp(std::int64_t l, torch::Tensor const& x) const {
        std::string const p = "layers." + std::to_string(l) + ".mlp.";
        return torch::linear(torch::silu(torch::linear(x, w[p + "gate_proj.weight"])) * torch::linear(x, w[p + "up_proj.weight"]),
                             w[p + "down_proj.weight"]);
    }

    /// Logits [B, T, vocab] for tokens and positions [B, T] (int64).
    torch::Tensor operator()(torch::Tensor const& tokens, torch::Tensor const& positions,
                             torch::Tensor const& example_ids) const {
        // rope_cos_sin
        auto const exponents = torch::arange(0, c.head_dim, 2, torch::kInt64).to(torch::kFloat32) / c.head_dim;
        auto const inv_freq = torch::reciprocal(torch::pow(c.rope_theta, exponents));
        auto const freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq;
        auto const emb = torch::cat({freqs, freqs}, -1);
        auto const cos = emb.cos(), sin = emb.sin();
        auto const mask = positions.unsqueeze(1).unsqueeze(-1) < positions.unsqueeze(1).unsqueeze(2);
        auto h = torch::embedding(w["embed_tokens.weight"], tokens);
        for (std::int64_t l = 0; l < c.n_layers; ++l) {
            std::string const p = "layers." + std::to_string(l) + ".";
            h = h + attention(l, rms_norm(h, w[p + "input_layernorm.weight"], c.rms_eps), cos, sin, mask, positions,
                              example_ids);
            h = h + mlp(l, rms_norm(h, w[p + "post_attention_layernorm.weight"], c.rms_eps));
        }
        return torch::linear(rms_norm(h, w["norm.weight"], c.rms_eps), w["lm_head.weight"]);
    }
};

/// An int64 [B, T] .npy file as a torch tensor.
torch::Tensor read_matrix_i64(fs::path const& path) {
    auto const a = qkgeom::io::read_npy(path);
    if (a.shape.size() != 2)
        qkgeom::detail::fail_input(path.string(), "shape", qkgeom::io::detail::shape_text(a.shape), "expected [B, T]");
    auto v = qkgeom::io::npy_to_int64(a, path.string());
    return torch::from_blob(v.data(), {a.shape[0], a.shape[1]}, torch::kInt64).clone();
}

struct options {
    fs::path model, tokens, positions, out, logits;
    std::int64_t width = 32;
    double rate = 8.0;
    std::uint64_t seed = 1234, head_seed = 0;
    std::optional<std::int64_t> heads;
};

options parse_args(int argc, char** argv) {
    options o;
    std::vector<std::string> pos;
    for (int i = 1; i < argc; ++i) {
        std::string const a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument("option " + a + " needs a value");
            return argv[++i];
        };
        if (a == "--width") o.width = std::stoll(value());
        else if (a == "--rate") o.rate = std::stod(value());
        else if (a == "--seed") o.seed = std::stoull(value());
        else if (a == "--heads") o.heads = std::stoll(value());
        else if (a == "--head-seed") o.head_seed = std::stoull(value());
        else if (a == "--logits") o.logits = value();
        else if (a.rfind("--", 0) == 0) throw std::invalid_argument("unknown option " + a);
        else pos.push_back(a);
    }
    if (pos.size() != 4)
        throw std::invalid_argument("usage: tiny_llama_capture MODEL_DIR TOKENS.npy POSITIONS.npy OUT_DIR [options]");
    o.model = pos[0];
    o.tokens = pos[1];
    o.positions = pos[2];
    o.out = pos[3];
    return o;
}

int run(options const& o) {
    torch::set_num_threads(1);
    torch::NoGradGuard no_grad;
    config const cfg = read_config(o.model / "config.json");
    weights const w(o.model / "model.safetensors", cfg);
    auto const tokens = read_matrix_i64(o.tokens), positions = read_matrix_i64(o.positions);
    if (!tokens.sizes().equals(positions.sizes()))
        throw std::invalid_argument("tokens and positions must have the same shape [B, T]");
    if (tokens.min().item<std::int64_t>() < 0 || tokens.max().item<std::int64_t>() >= cfg.vocab_size)
        qkgeom::detail::fail_input(o.tokens.string(), "data", "token id", "outside [0, vocab_size)");

    qkgeom::rope_spec rope;
    rope.pairing = qkgeom::rope_pairing::rotate_half;
    rope.rotary_dim = cfg.head_dim;
    rope.theta = cfg.rope_theta;
    qkgeom::capture_sampler const sampler{{qkgeom::bucket_scheme::uniform, o.width, o.rate}, o.seed};
    auto const manifest = qkgeom::make_capture_manifest(
        "tiny-llama", qkgeom::uniform_layout(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim), rope, sampler,
        qkgeom::io::head_sampling{o.heads, o.head_seed}, cfg.context_length);
    qkgeom::torch_capture_options copt;
    copt.layout = qkgeom::torch_layout::bhtd;
    qkgeom::torch_capture<float> capture(manifest, copt);

    auto const example_ids = torch::arange(tokens.size(0), torch::kInt64);
    forward_pass const fwd{cfg, w, {&capture}};
    auto const logits = fwd(tokens, positions, example_ids).contiguous();
    capture.write_dataset(o.out, qkgeom::io::storage_format::npy, "f32");
    if (!o.logits.empty()) {
        std::vector<std::int64_t> shape(logits.sizes().begin(), logits.sizes().end());
        auto const* p = logits.data_ptr<float>();
        qkgeom::io::write_npy(o.logits, qkgeom::io::make_npy(std::span<float const>(p, static_cast<std::size_t>(logits.numel())), shape));
    }
    std::printf("tiny_llama_capture: %lld sequences x %lld tokens, %zu heads, %lld rows captured -> %s\n",
                static_cast<long long>(tokens.size(0)), static_cast<long long>(tokens.size(1)), capture.heads().size(),
                static_cast<long long>(capture.rows_captured()), o.out.string().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse_args(argc, argv));
    } catch (std::exception const& e) {
        std::fprintf(stderr, "tiny_llama_capture: %s\n", e.what());
        return 1;
    }
}
