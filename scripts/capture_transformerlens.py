#!/usr/bin/env python3
"""Capture post-RoPE queries and keys with TransformerLens hooks into the qkgeom layout.

Recipe (docs/capture-recipes.md). NOT run in CI and not verified on a GPU
when it was written: transformer_lens and torch were not installed there. The
sampler, the head plan and the writer it uses (scripts/qkgeom_capture.py) are
tested against the C++ in tests/python.

How it captures: TransformerLens applies the rotary embedding in the
attention block and exposes the results as hook points

    blocks.{L}.attn.hook_rot_q   (batch, pos, n_heads, d_head)
    blocks.{L}.attn.hook_rot_k   (batch, pos, n_key_value_heads, d_head)  for GQA models

hook_rot_k fires before the key heads are repeated for GQA, so keys are per
kv head as method §0 wants. The model is loaded with
`from_pretrained_no_processing` so that no weight processing (LayerNorm
folding, centring) changes q and k. One example per forward (batch 1; the
tokenizer's BOS is position 0), example id = the example's index; the
method §0.1 sampler keeps the same positions for every head of one (layer, kind).

Usage:
    python3 scripts/capture_transformerlens.py --model meta-llama/Llama-3.2-1B --prompts prompts.txt \\
        --out data/llama-3.2-1b-tl --context-length 2048 --head-count 64
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkgeom_capture as qc  # noqa: E402


def layout_from_cfg(cfg):
    """(layers, head_dim, rope) from a HookedTransformerConfig."""
    n_q = cfg.n_heads
    n_kv = getattr(cfg, "n_key_value_heads", None) or n_q
    window = getattr(cfg, "window_size", None)
    attn_types = getattr(cfg, "attn_types", None)  # e.g. ["global", "local", ...] for alternating models
    layers = []
    for l in range(cfg.n_layers):
        local = attn_types is not None and attn_types[l] == "local"
        layers.append(qc.LayerLayout(n_q, n_kv, int(window) if (local and window) else None))
    rope = {
        "pairing": "interleaved" if getattr(cfg, "rotary_adjacent_pairs", False) else "rotate_half",
        "rotary_dim": int(cfg.rotary_dim or cfg.d_head),
        "theta": float(getattr(cfg, "rotary_base", 10000)),
        "scaling": "none",
        "scaling_factor": 1.0,
    }
    if getattr(cfg, "use_NTK_by_parts_rope", False):
        rope["scaling"], rope["scaling_factor"] = "llama3", float(getattr(cfg, "NTK_by_parts_factor", 1.0))
    return layers, cfg.d_head, rope


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    qc.add_capture_args(ap)
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from transformer_lens import HookedTransformer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = HookedTransformer.from_pretrained_no_processing(args.model, device=device,
                                                            dtype=getattr(torch, args.torch_dtype))
    model.eval()
    cfg = model.cfg
    if cfg.positional_embedding_type != "rotary":
        raise SystemExit(f"{args.model}: positional_embedding_type is {cfg.positional_embedding_type!r}, not rotary")
    layers, head_dim, rope = layout_from_cfg(cfg)
    m = qc.manifest_from_args(args, args.model, layers, head_dim, rope)
    store = qc.CaptureStore(m)
    print(f"capture plan: {len(store.heads)} query heads in layers {store.layers()}", file=sys.stderr)

    state = {"positions": None, "example_ids": None, "seen": set()}

    def hook(layer, kind):
        def fn(t, hook):  # t: (1, T, heads, d)
            state["seen"].add((layer, kind))
            store.feed(layer, kind, state["positions"], state["example_ids"],
                       lambda h, idx: t[0, torch.as_tensor(idx, device=t.device), h].float().cpu().numpy())
            return t
        return fn

    fwd_hooks = []
    for layer in store.layers():
        fwd_hooks.append((f"blocks.{layer}.attn.hook_rot_q", hook(layer, "q")))
        fwd_hooks.append((f"blocks.{layer}.attn.hook_rot_k", hook(layer, "k")))
    prompts = qc.read_prompts(args.prompts, args.max_examples)
    with torch.no_grad():
        for i, text in enumerate(prompts):
            tokens = model.to_tokens(text)[:, : args.context_length]
            T = tokens.shape[1]
            state["positions"] = np.arange(T, dtype=np.int64)
            state["example_ids"] = np.full(T, i, dtype=np.int64)
            state["seen"] = set()
            model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, return_type=None)
            want = {(l, k) for l in store.layers() for k in ("q", "k")}
            if state["seen"] != want:
                raise SystemExit(f"hooks did not fire for {sorted(want - state['seen'])}")
            print(f"example {i}: {T} tokens", file=sys.stderr)
    written = store.write(args.out, fmt=args.format, dtype=args.dtype)
    print(f"{len(written)} entries written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
