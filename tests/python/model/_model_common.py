"""Shared by the tiny-model test drivers: arguments, skips (exit 77), loading."""
from __future__ import annotations

import argparse
import os
import sys

SKIP = 77


def parse_args(doc: str):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--data", required=True, help="tests/data/tiny_llama")
    ap.add_argument("--examples", required=True, help="examples/python (tiny_llama.py)")
    ap.add_argument("--work", required=True, help="scratch folder")
    ap.add_argument("--cpp", default="", help="the tiny_llama_capture program ('' when not built)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    return args


def need(module: str):
    """Imports `module` or exits 77 (CTest: skipped) saying why."""
    try:
        return __import__(module)
    except ImportError as e:
        print(f"SKIPPED: {module} not importable with {sys.executable}: {e}")
        sys.exit(SKIP)


def tiny_llama(args):
    """The model module (examples/python/tiny_llama.py) and the trained model in eval mode."""
    torch = need("torch")
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.abspath(args.examples))
    import tiny_llama as tl

    return tl, tl.load_model(args.data)


def example_inputs(args):
    """The shared example tokens and explicit positions, int64 [B, T] (also read by tiny_llama_capture)."""
    import numpy as np

    tokens = np.load(os.path.join(args.data, "tokens.npy"))
    positions = np.load(os.path.join(args.data, "positions.npy"))
    if tokens.dtype != np.int64 or positions.dtype != np.int64 or tokens.shape != positions.shape or tokens.ndim != 2:
        raise ValueError(f"{args.data}: tokens.npy {tokens.dtype}{tokens.shape} / positions.npy "
                         f"{positions.dtype}{positions.shape}: expected int64 [B, T] both")
    return tokens, positions


class Checks:
    """Collects named pass/fail lines; exit status 1 if any failed."""

    def __init__(self):
        self.failed = 0

    def __call__(self, ok: bool, what: str):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        self.failed += 0 if ok else 1

    def exit(self):
        print("all checks passed" if not self.failed else f"{self.failed} check(s) failed")
        sys.exit(1 if self.failed else 0)


# The capture settings shared by the Python capture and tiny_llama_capture (its defaults).
BUCKET_SCHEME, BUCKET_WIDTH, BUCKET_RATE, SAMPLER_SEED, HEAD_SEED = "uniform", 32, 8.0, 1234, 0


def python_capture(qkgeom, tl, model, tokens, positions, out_dir, record_inputs=False):
    """Captures the model's post-RoPE q/k on (tokens, positions) with qkgeom.Recorder patching
    tl.apply_rotary_pos_emb, into a dataset (f32) at out_dir. Returns (logits float32 numpy,
    {layer: attention input [B, T, d_model] float32 numpy} when record_inputs)."""
    import shutil

    import torch
    from qkgeom.capture import manifest_for

    cfg = model.cfg
    layout = qkgeom.ModelLayout(cfg.head_dim, [cfg.n_heads] * cfg.n_layers, [cfg.n_kv_heads] * cfg.n_layers)
    spec = qkgeom.BucketSpec(BUCKET_SCHEME, BUCKET_WIDTH, BUCKET_RATE)
    manifest = manifest_for(layout, model="tiny-llama", buckets=spec, context_length=cfg.context_length,
                            seed=SAMPLER_SEED, head_count=None, head_seed=HEAD_SEED,
                            rope=dict(pairing="rotate_half", rotary_dim=cfg.head_dim, theta=cfg.rope_theta),
                            rope_applied=[True] * cfg.n_layers)
    shutil.rmtree(out_dir, ignore_errors=True)
    writer = qkgeom.DatasetWriter(out_dir, manifest, dtype="f32")
    rec = qkgeom.Recorder(layout, buckets=spec, seed=SAMPLER_SEED, head_seed=HEAD_SEED, sink=writer,
                          context_length=cfg.context_length, model="tiny-llama")
    inputs, handles = {}, []
    if record_inputs:  # the hidden state each attention projects (the q_proj input)
        for i, layer in enumerate(model.layers):
            handles.append(layer.self_attn.q_proj.register_forward_hook(
                lambda mod, inp, out, i=i: inputs.__setitem__(i, inp[0].detach().numpy().copy())))
    tok_t, pos_t = torch.from_numpy(tokens), torch.from_numpy(positions)
    try:
        with torch.no_grad(), rec.patch(tl, "apply_rotary_pos_emb"):
            rec.set_batch(pos_t)
            logits = model(tok_t, pos_t).numpy()
    finally:
        for h in handles:
            h.remove()
    rec.close()
    return logits, inputs
