#!/usr/bin/env python3
"""Capture post-RoPE queries and keys of a Llama-family Hugging Face model into the qkgeom layout.

Recipe (docs/capture-recipes.md). NOT run in CI and not verified on a GPU
when it was written: transformers and torch were not installed there. The
sampler, the head plan and the writer it uses (scripts/qkgeom_capture.py) are
tested against the C++ in tests/python.

How it captures: in the transformers Llama family (Llama, Mistral, Qwen2,
Gemma, ... -- any model whose attention module calls the module-level
function `apply_rotary_pos_emb(q, k, cos, sin)` of its modeling file) the
attention forward computes

    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
    ... cache update ...
    attention_interface(...)            # repeat_kv happens in here (eager) or in the kernel

so the outputs of `apply_rotary_pos_emb` are the post-RoPE q (batch, n_q_heads,
T, d) and k (batch, n_kv_heads, T, d), *before* repeat_kv: exactly what method
§0 captures (keys per kv head). The recipe replaces that function in the
model's modeling module by a wrapper that records its outputs; a forward
pre-hook on each attention module tells the wrapper which layer is running.
One example per forward (batch 1): positions 0..T-1, example id = the
example's index. Per (layer, kind) the method §0.1 sampler keeps the same
positions for every head (qkgeom_capture.keep_mask == buckets.hpp keep_token);
only the planned heads (sample_heads, method §0.1) are moved to the CPU.

Usage:
    python3 scripts/capture_hf.py --model meta-llama/Llama-3.2-1B --prompts prompts.txt \\
        --out data/llama-3.2-1b --context-length 2048 --head-count 64 --format npz
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkgeom_capture as qc  # noqa: E402


def layout_from_config(cfg):
    """(layers, head_dim, rope) from a transformers config: per-layer heads and sliding windows
    (best effort across families: `layer_types`, `use_sliding_window` + `max_window_layers`,
    or a model-wide `sliding_window`), and the RoPE parameters."""
    n_layers = cfg.num_hidden_layers
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_q
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    windows = []
    for l in range(n_layers):
        if layer_types is not None:
            w = window if layer_types[l] == "sliding_attention" else None
        elif getattr(cfg, "use_sliding_window", None) is False:
            w = None
        elif getattr(cfg, "use_sliding_window", None) and getattr(cfg, "max_window_layers", None) is not None:
            w = window if l >= cfg.max_window_layers else None  # Qwen2: the top layers use the window
        else:
            w = window
        windows.append(int(w) if w else None)
    layers = [qc.LayerLayout(n_q, n_kv, w) for w in windows]
    scaling = getattr(cfg, "rope_scaling", None) or {}
    rope = {
        "pairing": "rotate_half",  # transformers' Llama-family rotary uses rotate_half
        "rotary_dim": int(head_dim * getattr(cfg, "partial_rotary_factor", 1.0)),
        "theta": float(getattr(cfg, "rope_theta", 10000.0)),
        "scaling": str(scaling.get("rope_type", scaling.get("type", "none"))) if scaling else "none",
        "scaling_factor": float(scaling.get("factor", 1.0)) if scaling else 1.0,
    }
    if rope["scaling"] in ("default", "none"):
        rope["scaling"], rope["scaling_factor"] = "none", 1.0
    return layers, head_dim, rope


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    qc.add_capture_args(ap)
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=getattr(torch, args.torch_dtype))
    model.to(device).eval()

    layers, head_dim, rope = layout_from_config(model.config)
    m = qc.manifest_from_args(args, args.model, layers, head_dim, rope)
    store = qc.CaptureStore(m)
    print(f"capture plan: {len(store.heads)} query heads in layers {store.layers()}", file=sys.stderr)

    decoder_layers = model.model.layers
    attn_modules = [blk.self_attn for blk in decoder_layers]
    modeling = sys.modules[type(attn_modules[0]).__module__]
    original = getattr(modeling, "apply_rotary_pos_emb", None)
    if original is None:
        raise SystemExit(f"{modeling.__name__} has no apply_rotary_pos_emb: this model is not supported by this recipe")

    state = {"layer": None, "positions": None, "example_ids": None, "seen": set()}

    def patched(q, k, *rest, **kw):
        q_rot, k_rot = original(q, k, *rest, **kw)
        layer = state["layer"]
        if layer is not None:
            state["seen"].add(layer)
            pos, ex = state["positions"], state["example_ids"]
            for kind, t in (("q", q_rot), ("k", k_rot)):
                # t: (1, heads, T, d) -- rows of one head at the kept token indices, to the CPU as float32
                store.feed(layer, kind, pos, ex,
                           lambda h, idx, t=t: t[0, h, torch.as_tensor(idx, device=t.device)].float().cpu().numpy())
        return q_rot, k_rot

    def pre_hook(layer):
        def hook(_module, _args, _kwargs=None):
            state["layer"] = layer
        return hook

    hooks = [a.register_forward_pre_hook(pre_hook(l)) for l, a in enumerate(attn_modules)]
    modeling.apply_rotary_pos_emb = patched
    try:
        prompts = qc.read_prompts(args.prompts, args.max_examples)
        with torch.no_grad():
            for i, text in enumerate(prompts):
                ids = tok(text, return_tensors="pt", truncation=True, max_length=args.context_length).input_ids.to(device)
                T = ids.shape[1]
                state["positions"] = np.arange(T, dtype=np.int64)
                state["example_ids"] = np.full(T, i, dtype=np.int64)
                state["seen"] = set()
                model(input_ids=ids, use_cache=False)
                state["layer"] = None
                missing = set(store.layers()) - state["seen"]
                if missing:
                    raise SystemExit(f"apply_rotary_pos_emb was not called through {modeling.__name__} for layers "
                                     f"{sorted(missing)}: this transformers version or model is not supported")
                print(f"example {i}: {T} tokens", file=sys.stderr)
    finally:
        modeling.apply_rotary_pos_emb = original
        for h in hooks:
            h.remove()
    written = store.write(args.out, fmt=args.format, dtype=args.dtype)
    print(f"{len(written)} entries written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
