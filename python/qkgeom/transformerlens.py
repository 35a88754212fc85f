"""TransformerLens glue for qkgeom.capture.Recorder: the legacy HookedTransformer (the TransformerLens 3
TransformerBridge is refused, assumption T2).

    python3 -m qkgeom.transformerlens MODEL -o DIR --prompts FILE --legacy [--context N] ...

UNTESTED against real TransformerLens. The checks (``check_context``, ``check_grouping``,
``plan_of_cfg``) are tested on SimpleNamespace configs (tests/python/capture/hf_config.py) and the
bridge refusal in tests/python/capture/hf_fixes.py; nothing that runs a model is. Written against
TransformerLens' source: model_bridge/bridge.py (``TransformerBridge.original_model``),
model_bridge/generalized_components/position_embeddings_attention.py, and the legacy
components/abstract_attention.py / grouped_query_attention.py hook points.

Assumptions:
  T1 Context: the requested context must fit ``cfg.n_ctx``; a longer request is REFUSED (the
     legacy ``to_tokens`` truncates to n_ctx by default; here tokens are produced with
     ``truncate=False`` and an example longer than the context is cut to the context, which the
     manifest records as context_length).
  T2 TransformerBridge (TransformerLens 3): REFUSED, before any weights are loaded. The bridge
     replaces the Hugging Face attention modules of ``bridge.original_model`` in place with its own
     components, which re-implement attention with an explicit score matrix and never call the
     modeling file's ``apply_rotary_pos_emb``: there is no call site left to record. The same
     checkpoint is captured by ``python3 -m qkgeom.hf`` (the same options; transformers loads it
     directly), or by the legacy HookedTransformer here with ``--legacy``.
  T3 Legacy HookedTransformer: ``blocks.{L}.attn.hook_rot_q`` is [B, T, n_heads, d_head] and
     ``hook_rot_k`` is [B, T, n_key_value_heads, d_head] after the rotary embedding and before any
     GQA repetition -- unless ``cfg.ungroup_grouped_query_attention`` is True, when hook_rot_k
     carries n_heads (repeated) heads: REFUSED. The hooks only read q and k. The legacy model's
     own attention materialises its [B, H, T, T] scores (TransformerLens' implementation; there is
     no SDPA path): for long contexts use the bridge / qkgeom.hf. The forward stops after the last
     planned layer (``stop_at_layer``), so no logits are computed. One example per forward,
     positions 0..T-1.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from .hf import CaptureConfigError


BRIDGE_REFUSAL = (
    "TransformerBridge (TransformerLens 3) is not supported: the bridge replaces the Hugging Face attention "
    "modules of bridge.original_model in place, so no apply_rotary_pos_emb call is left to record (assumption "
    "T2). Capture the same checkpoint with `python3 -m qkgeom.hf {model} ...` (the same options), or with the "
    "legacy HookedTransformer: add --legacy")


def check_context(n_ctx, requested: int, what: str = "cfg.n_ctx") -> None:
    """Refuses a context the model cannot take (never a silent truncation)."""
    if n_ctx is None:
        raise CaptureConfigError(f"{what} is not set: the model's context is unknown")
    if int(requested) > int(n_ctx):
        raise CaptureConfigError(f"requested context {requested} exceeds {what} = {n_ctx}: TransformerLens would "
                                 "truncate; capture with a context <= n_ctx, or load the model with a larger n_ctx")


def check_grouping(cfg) -> None:
    """Refuses ungrouped keys (hook_rot_k would carry n_q repeated heads instead of n_kv)."""
    if getattr(cfg, "ungroup_grouped_query_attention", False):
        raise CaptureConfigError("cfg.ungroup_grouped_query_attention is True: hook_rot_k then carries the n_heads "
                                 "repeated key heads, not the n_key_value_heads keys qkgeom records; load the model "
                                 "with ungroup_grouped_query_attention=False")


def plan_of_cfg(cfg) -> SimpleNamespace:
    """Layout, sliding windows and RoPE of a legacy HookedTransformerConfig."""
    if getattr(cfg, "positional_embedding_type", None) != "rotary":
        raise CaptureConfigError(f"cfg.positional_embedding_type is {getattr(cfg, 'positional_embedding_type', None)!r},"
                                 " not 'rotary'")
    n_layers, n_q, d = int(cfg.n_layers), int(cfg.n_heads), int(cfg.d_head)
    n_kv = int(getattr(cfg, "n_key_value_heads", None) or n_q)
    attn_types = getattr(cfg, "attn_types", None)
    window = getattr(cfg, "window_size", None)
    windows = []
    for layer in range(n_layers):
        local = attn_types is not None and attn_types[layer] == "local"
        if local and not window:
            raise CaptureConfigError(f"cfg.attn_types[{layer}] is 'local' but cfg.window_size is {window!r}")
        windows.append(int(window) if local else None)
    theta = getattr(cfg, "rotary_base", None)
    if theta is None:
        raise CaptureConfigError("cfg.rotary_base is not set: the RoPE base is never assumed")
    rope = {"pairing": "interleaved" if getattr(cfg, "rotary_adjacent_pairs", False) else "rotate_half",
            "rotary_dim": int(getattr(cfg, "rotary_dim", None) or d), "theta": float(theta),
            "scaling": "none", "scaling_factor": 1.0}
    if getattr(cfg, "use_NTK_by_parts_rope", False):
        rope["scaling"], rope["scaling_factor"] = "llama3", float(cfg.NTK_by_parts_factor)
    return SimpleNamespace(n_layers=n_layers, n_q_heads=[n_q] * n_layers, n_kv_heads=[n_kv] * n_layers,
                           head_dim=d, sliding_window=windows, rope=rope, rope_applied=[True] * n_layers)


def capture_legacy(model, rec, tokens) -> None:
    """One example through a legacy HookedTransformer: hook_rot_q / hook_rot_k of the planned layers."""
    import torch  # noqa: PLC0415

    check_grouping(model.cfg)
    if tokens.shape[0] != 1:
        raise CaptureConfigError(f"capture_legacy: one example per forward (batch {tokens.shape[0]})")
    held = {}

    def q_hook(layer):
        def fn(t, hook):  # noqa: ARG001
            held[layer] = t
            return t
        return fn

    def k_hook(layer):
        def fn(t, hook):  # noqa: ARG001
            rec.record(layer, held.pop(layer), t, layout="bthd")
            return t
        return fn

    hooks = []
    for layer in rec.layers():
        hooks.append((f"blocks.{layer}.attn.hook_rot_q", q_hook(layer)))
        hooks.append((f"blocks.{layer}.attn.hook_rot_k", k_hook(layer)))
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks, stop_at_layer=max(rec.layers()) + 1)
    missing = rec.missing_layers()
    if missing:
        raise CaptureConfigError(f"hook_rot_q/hook_rot_k did not fire for planned layers {missing}")
    rec.step()


def main(argv=None) -> int:
    from . import hf  # noqa: PLC0415

    a = hf._args(argv, prog="python3 -m qkgeom.transformerlens")  # the same options as qkgeom.hf
    import torch  # noqa: PLC0415

    import qkgeom  # noqa: PLC0415
    from .capture import Recorder, manifest_for  # noqa: PLC0415

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not a.legacy:
        raise CaptureConfigError(BRIDGE_REFUSAL.format(model=a.model))
    from transformer_lens import HookedTransformer  # noqa: PLC0415

    model = HookedTransformer.from_pretrained_no_processing(a.model, device=device,
                                                            dtype=getattr(torch, a.torch_dtype))
    check_context(model.cfg.n_ctx, a.context)
    check_grouping(model.cfg)
    plan = plan_of_cfg(model.cfg)
    layout = qkgeom.ModelLayout(plan.head_dim, plan.n_q_heads, plan.n_kv_heads, plan.sliding_window)
    buckets = qkgeom.BucketSpec(a.scheme, a.width, a.rate)
    m = manifest_for(layout, model=a.model, buckets=buckets, context_length=a.context, seed=a.seed,
                     head_count=a.heads, head_seed=a.head_seed, eligibility=a.eligibility, rope=plan.rope,
                     rope_applied=plan.rope_applied)
    rec = Recorder(layout, buckets=buckets, seed=a.seed, head_count=a.heads, head_seed=a.head_seed,
                   eligibility=a.eligibility, sink=qkgeom.DatasetWriter(a.out, m, dtype=a.dtype),
                   context_length=a.context, model=a.model)
    for text in hf.read_prompts(a.prompts, a.max_examples):
        tokens = model.to_tokens(text, truncate=False)[:, : a.context]
        capture_legacy(model, rec, tokens.to(device))
    rec.close()
    print(f"{len(rec.heads)} planned heads, rows {rec.rows_recorded()} written to {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CaptureConfigError as e:
        print(f"qkgeom.transformerlens: error: {e}", file=sys.stderr)
        sys.exit(1)
