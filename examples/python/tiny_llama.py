"""A small Llama-style language model in pure PyTorch, and its synthetic corpus.

The model trained by scripts/train_tiny_llama.py (checkpoint in
tests/data/tiny_llama/) and captured by the tests in tests/python/model/ and
the example. Its forward pass is mirrored op for op by the LibTorch program
tests/python/model/tiny_llama_capture.cpp, so the two produce the same float32
bits (Debian's python3-torch and libtorch-dev are one build of LibTorch 1.13):
change one and the other together.

Architecture (the Hugging Face Llama layout, parameter names included):
token embedding; per layer x = x + attn(RMSNorm(x)), x = x + mlp(RMSNorm(x));
final RMSNorm and an untied output projection.
- attention: q/k/v/o projections without bias, grouped-query attention
  (n_heads query heads share n_kv_heads key/value heads), rotate-half RoPE
  applied by the module-level function `apply_rotary_pos_emb(q, k, cos, sin)`
  (looked up at call time, so a recorder can wrap it by name), causal scaled
  dot-product attention with the mask taken from the explicit positions
  (key position > query position is masked);
- MLP: SwiGLU, down(silu(gate(x)) * up(x));
- positions are explicit: forward(tokens [B, T], position_ids [B, T]).

Also here: `synthetic_batch`, the corpus generator (copy/induction, counting
and periodic segments), and a dependency-free safetensors writer/reader.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TinyLlamaConfig:
    vocab_size: int = 64
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 128
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    context_length: int = 256

    @classmethod
    def from_json(cls, path) -> "TinyLlamaConfig":
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        return asdict(self)


# --- the ops (mirrored in tiny_llama_capture.cpp) --------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float):
    """cos, sin [B, T, head_dim] for positions [B, T]: angle position * theta^(-2i/head_dim),
    the frequencies repeated for both halves (rotate-half pairing)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = torch.reciprocal(torch.pow(theta, exponents))
    freqs = position_ids.to(torch.float32).unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate-half RoPE. q [B, Hq, T, D], k [B, Hkv, T, D], cos/sin [B, T, D]."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, causal_mask):
        c = self.cfg
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # module global, looked up now: patchable
        group = c.n_heads // c.n_kv_heads
        k = k.repeat_interleave(group, 1)
        v = v.repeat_interleave(group, 1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(c.head_dim)
        scores = scores.masked_fill(causal_mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, -1), v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, cos, sin, causal_mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, causal_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class TinyLlama(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def init_weights(self, generator: torch.Generator):
        """GPT-2 style: N(0, 0.02), residual outputs scaled by 1/sqrt(2 n_layers); norms 1."""
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                continue
            std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=generator) * std)

    def backbone(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, T, d_model] (after the last RMSNorm)."""
        if tokens.shape != position_ids.shape or tokens.dim() != 2:
            raise ValueError(f"tokens {tuple(tokens.shape)} and position_ids {tuple(position_ids.shape)} must both be [B, T]")
        cos, sin = rope_cos_sin(position_ids, self.cfg.head_dim, self.cfg.rope_theta)
        causal_mask = position_ids.unsqueeze(1).unsqueeze(-1) < position_ids.unsqueeze(1).unsqueeze(2)  # [B,1,T,T]: key after query
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, causal_mask)
        return self.norm(h)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab]."""
        return self.lm_head(self.backbone(tokens, position_ids))


# --- the synthetic corpus -------------------------------------------------------------------

BOS, SEP_COPY, SEP_COUNT, SEP_PERIOD = 0, 1, 2, 3
FIRST_CONTENT = 8  # tokens FIRST_CONTENT..vocab-1 are content
# What makes a token predictable from the tokens before it (labels of synthetic_sequence):
OTHER, COPIED, COUNTED, PERIODIC = 0, 1, 2, 3


def _segment(rng: np.random.Generator, n_content: int) -> tuple[list[int], list[int]]:
    """One segment's tokens and labels."""
    kind = rng.integers(3)
    c = lambda x: FIRST_CONTENT + (np.asarray(x) % n_content)  # noqa: E731
    if kind == 0:  # copy: SEP x1..xn SEP x1..xn, 4 <= n <= 16 (the second copy needs an induction head)
        n = int(rng.integers(4, 17))
        x = c(rng.integers(n_content, size=n))
        return [SEP_COPY, *x, SEP_COPY, *x], [OTHER] * (n + 2) + [COPIED] * n
    if kind == 1:  # counting: SEP a, a+s, a+2s, ... (mod n_content): content of the last two tokens
        n, a, s = int(rng.integers(8, 25)), rng.integers(n_content), rng.integers(1, 4)
        return [SEP_COUNT, *c(a + s * np.arange(n))], [OTHER] * 3 + [COUNTED] * (n - 2)
    # periodic: SEP then a pattern of period p repeated (the token p positions back)
    p, n = int(rng.integers(2, 7)), int(rng.integers(12, 41))
    pattern = c(rng.integers(n_content, size=p))
    return [SEP_PERIOD, *pattern[np.arange(n) % p]], [OTHER] * (p + 1) + [PERIODIC] * (n - p)


def synthetic_sequence(rng: np.random.Generator, length: int, vocab_size: int, labels: bool = False):
    """BOS, then random segments (copy / counting / periodic) up to `length` tokens: int64 [length]
    (and, with labels=True, the int64 [length] labels OTHER / COPIED / COUNTED / PERIODIC saying
    which rule predicts each token; the same tokens either way)."""
    out, lab = [BOS], [OTHER]
    while len(out) < length:
        t, l = _segment(rng, vocab_size - FIRST_CONTENT)
        out.extend(int(x) for x in t)
        lab.extend(l)
    toks = np.asarray(out[:length], dtype=np.int64)
    return (toks, np.asarray(lab[:length], dtype=np.int64)) if labels else toks


def synthetic_batch(rng: np.random.Generator, batch: int, length: int, vocab_size: int, labels: bool = False):
    """[batch, length] int64 token ids (and labels, as synthetic_sequence)."""
    seqs = [synthetic_sequence(rng, length, vocab_size, labels) for _ in range(batch)]
    if labels:
        return np.stack([s[0] for s in seqs]), np.stack([s[1] for s in seqs])
    return np.stack(seqs)


# --- safetensors (the format: 8-byte little-endian header size, JSON header, raw tensors) ---

_ST_DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64", np.dtype("<i8"): "I64"}
_ST_NUMPY = {v: k for k, v in _ST_DTYPES.items()}


def save_safetensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes name -> array (float32/float64/int64, C order, little-endian) as safetensors."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(np.asarray(tensors[name]))
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        if a.dtype not in _ST_DTYPES:
            raise ValueError(f"save_safetensors: tensor {name!r}: dtype {a.dtype} not supported")
        blob = a.tobytes()
        header[name] = {"dtype": _ST_DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # data starts 8-byte aligned (padding allowed by the format)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_safetensors(path) -> tuple[dict, dict]:
    """Reads a file written by save_safetensors: (name -> numpy array, metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header size")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header_size {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, e in header.items():
        if e["dtype"] not in _ST_NUMPY:
            raise ValueError(f"{path}: tensor {name!r}: dtype {e['dtype']} not supported")
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype=_ST_NUMPY[e["dtype"]]).reshape(e["shape"]).copy()
    return out, meta


def load_model(directory) -> TinyLlama:
    """The model in `directory` (config.json + model.safetensors), in eval mode."""
    import os

    cfg = TinyLlamaConfig.from_json(os.path.join(directory, "config.json"))
    model = TinyLlama(cfg)
    weights, _ = load_safetensors(os.path.join(directory, "model.safetensors"))
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    model.load_state_dict(state, strict=True)
    return model.eval()
