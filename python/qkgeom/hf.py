"""Hugging Face transformers (4.4x and 5) glue for qkgeom.capture.Recorder.

    python3 -m qkgeom.hf MODEL -o DIR [--revision R] [--context N] [--heads N] ...
    torchrun --nproc-per-node W -m qkgeom.hf MODEL -o OUT --shards S [--merge-to DIR] ...

With --shards S the examples are split into S logical shards (contiguous blocks of the prompt file)
and rank r of torchrun's W processes captures shards r, r + W, ... into OUT/shard-SSSSS/ (dataset
parts); rank 0 writes OUT/manifest.json last, after every rank reported success
(qkgeom.distributed, docs/capture.md). The result depends on S, never on W.

Verified against the real transformers source (random small ``from_config`` models, CPU): the
harness tests/python/capture/hf_real.py compares every stored row with an independent recomputation
and the manifest with the config; the releases and the table are in docs/capture-recipes.md. Not
verified: a GPU, the hub (downloads, tokenizers, real weights) -- see that page.

Assumptions (each checked at run time where it can be; a failed check stops the run):
  A1 The attention module of every decoder layer calls the module-level function
     ``apply_rotary_pos_emb(q, k, cos, sin, ...)`` of its own modeling file, looked up at call
     time, with q [B, n_q, T, d] and k [B, n_kv, T, d] (before repeat_kv), returning
     (q_embed, k_embed). The glue replaces that name for the duration of the capture. A planned
     layer that applies RoPE but never calls it stops the run after the first batch.
  A2 A forward pre-hook on each attention module (``self_attn``) names the running layer
     (its ``layer_idx``, else its index in the decoder's layer list).
  A3 NoPE layers (SmolLM3/Llama-4 ``no_rope_layers[l] == 0``) never call RoPE: their q and k are
     the outputs of ``q_proj``/``k_proj`` reshaped to [B, T, heads, d], recorded pre-RoPE
     (manifest rope_applied[l] = false). Refused when the attention module has q_norm/k_norm
     (then the projection output is not what attention uses).
  A4 RoPE settings: v5 ``config.rope_parameters`` (one dict, or one per layer type: Gemma-3
     sliding vs full), else 4.4x ``rope_theta`` + ``rope_scaling``. Neither: refused, never a
     default. The manifest's single ``rope`` block is that of the planned layers; a plan whose
     layers have different RoPE settings is refused.
  A5 Multimodal wrappers: the text config is ``get_text_config()`` / ``text_config`` /
     ``language_config``; the decoder layers are the ModuleList of ``self_attn`` layers outside
     any vision tower. Llama-3.2-Vision cross-attention layers (``cross_attention_layers``)
     attend to image tokens without RoPE: a plan holding one of them is refused.
  A6 Sliding windows per layer, from the config: ``use_sliding_window == False`` -> none;
     ``layer_types`` ("sliding_attention" -> ``sliding_window``); Gemma-2 without layer_types
     (4.42-4.52): even layers; Gemma-3 / Cohere2 4.4x ``sliding_window_pattern``; Qwen2
     ``max_window_layers``; else a model-wide ``sliding_window``. Then the LOADED modules decide
     (refine_plan): the layer's ``attention_type`` / ``is_sliding`` or the attention's
     ``sliding_window`` where the modeling file sets them (Gemma-2's first file slid the odd layers).
  A7 The backbone runs without full logits: ``logits_to_keep=1`` (``num_logits_to_keep`` on
     4.45-4.49) when the forward takes it, else the base model is called.
  A8 Pairing and rotary width: the modeling file's own apply_rotary_pos_emb is called on basis
     vectors (probe_rope_function): Cohere/Cohere2 pair (2i, 2i+1) ("interleaved"); a file that
     passes only the rotated slice of a partial-rotary head (StableLM, Phi) is refused with what to do;
     one that rotates the first rotary_dim coordinates of the whole head is captured with rotary_dim.
  A9 RoPE per layer: Cohere2's full-attention layers never call RoPE (recorded pre-RoPE, like A3).
  A10 Scaling: LongRoPE's factor is max_position_embeddings / original_max_position_embeddings when the
     config has none; YaRN and LongRoPE scale cos/sin by an attention factor, written to manifest.json
     as rope.attention_factor (docs/capture-recipes.md).
  A11 Cross-check: on the first batch, every planned RoPE layer's rows are compared with the recorded
     settings (check_rope_rows: each pair turned and scaled by attention_factor, pass-through
     coordinates unchanged, angles = position x theta^(-2i/r) / factor for scaling none/linear); a
     contradiction stops the run, and nothing is left at -o (the dataset is written to a hidden sibling
     folder and renamed at the end).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import sys
from types import SimpleNamespace
from typing import List, Optional, Sequence

ROPE_SCALINGS = {"default": "none", "none": "none"}


class CaptureConfigError(ValueError):
    """A model config the glue cannot capture faithfully (the message says which field)."""


# ---------------------------------------------------------------------------------- config
def text_config(config):
    """The decoder's config of a (possibly multimodal) model config."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            cfg = get(decoder=True)
        except TypeError:
            cfg = get()
        if cfg is not None:
            return cfg
    for attr in ("text_config", "language_config", "llm_config"):
        sub = getattr(config, attr, None)
        if sub is not None:
            return sub
    return config


def _get(cfg, name, default=None):
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def heads_of(cfg):
    """(n_layers, n_q, n_kv, head_dim) of a text config."""
    n_layers = _get(cfg, "num_hidden_layers")
    n_q = _get(cfg, "num_attention_heads")
    if n_layers is None or n_q is None:
        raise CaptureConfigError("config: num_hidden_layers and num_attention_heads are required "
                                 f"(values {n_layers!r}, {n_q!r})")
    n_kv = _get(cfg, "num_key_value_heads") or n_q
    head_dim = _get(cfg, "head_dim") or (_get(cfg, "hidden_size") // n_q)
    return int(n_layers), int(n_q), int(n_kv), int(head_dim)


def layer_types_of(cfg, n_layers) -> List[str]:
    """Per-layer attention type: "full_attention" or "sliding_attention"."""
    lt = _get(cfg, "layer_types")
    if lt is not None:
        lt = [str(x) for x in lt]
        if len(lt) != n_layers:
            raise CaptureConfigError(f"config.layer_types: {len(lt)} entries for num_hidden_layers = {n_layers}")
        bad = sorted({x for x in lt if x not in ("full_attention", "sliding_attention")})
        if bad:
            raise CaptureConfigError(f"config.layer_types: unsupported attention type(s) {bad}")
        return lt
    if _get(cfg, "model_type") == "gemma2" and _get(cfg, "sliding_window"):
        # Gemma-2 on 4.42-4.52 (no layer_types): the modeling file makes EVEN layers sliding
        # (Gemma2DecoderLayer.is_sliding = not bool(layer_idx % 2)); 4.53+ writes the same as layer_types.
        # The first Gemma-2 file (4.42 as branched) slid the odd ones: refine_plan reads the loaded modules.
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    pattern = _get(cfg, "sliding_window_pattern")
    if pattern and _get(cfg, "sliding_window"):  # Gemma-3 on 4.4x: every pattern-th layer is global
        return ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(n_layers)]
    sw = _get(cfg, "sliding_window")
    use = _get(cfg, "use_sliding_window")
    if sw and use and _get(cfg, "max_window_layers") is not None:  # Qwen2: layers >= max_window_layers
        m = int(_get(cfg, "max_window_layers"))
        return ["sliding_attention" if i >= m else "full_attention" for i in range(n_layers)]
    if sw and use is not False:
        return ["sliding_attention"] * n_layers
    return ["full_attention"] * n_layers


def sliding_windows_of(cfg, n_layers) -> List[Optional[int]]:
    """Per-layer sliding window (None = full attention)."""
    types = layer_types_of(cfg, n_layers)
    if _get(cfg, "use_sliding_window") is False:
        return [None] * n_layers
    sw = _get(cfg, "sliding_window")
    if any(t == "sliding_attention" for t in types) and not sw:
        raise CaptureConfigError(f"config.sliding_window: sliding layers listed but no window (value {sw!r})")
    return [int(sw) if t == "sliding_attention" else None for t in types]


def _rope_dict_for(cfg, layer_type: str) -> dict:
    """The RoPE parameter dict that applies to layers of this type (v5 or 4.4x spelling)."""
    rp = _get(cfg, "rope_parameters")
    lt = _get(cfg, "layer_types")
    if isinstance(rp, dict) and rp:
        if lt is not None and set(rp).issubset(set(lt)) and not ({"rope_type", "rope_theta"} & set(rp)):
            sub = rp.get(layer_type)
            if not isinstance(sub, dict):
                raise CaptureConfigError(f"config.rope_parameters: no entry for layer type {layer_type!r} "
                                         f"(keys {sorted(rp)})")
            return dict(sub)
        return dict(rp)
    theta = _get(cfg, "rope_theta")
    if theta is None:
        theta = _get(cfg, "rotary_emb_base")  # GPT-NeoX on 4.4x
    if theta is None:
        raise CaptureConfigError("config: neither rope_parameters (transformers 5) nor rope_theta (4.4x) is set; "
                                 "the RoPE base is unknown and is never assumed")
    out = {"rope_theta": theta}
    scaling = _get(cfg, "rope_scaling")
    if isinstance(scaling, dict):
        out.update(scaling)
    if layer_type == "sliding_attention" and _get(cfg, "rope_local_base_freq") is not None:
        out = {"rope_theta": _get(cfg, "rope_local_base_freq")}  # Gemma-3 4.4x: local layers, no scaling
    return out


# Modeling files whose rotate_half pairs coordinates (2i, 2i+1) (Cohere's "interleave instead of cat").
# The config does not say it: this is the prior, the loaded modeling file's own apply_rotary_pos_emb is
# probed (probe_rope_function) and decides.
INTERLEAVED_MODEL_TYPES = {"cohere", "cohere2"}


def _positions_ratio(cfg, d) -> Optional[float]:
    """max_position_embeddings / original_max_position_embeddings (LongRoPE's effective factor)."""
    orig = d.get("original_max_position_embeddings", _get(cfg, "original_max_position_embeddings"))
    mx = _get(cfg, "max_position_embeddings")
    if not orig or not mx:
        return None
    return float(mx) / float(orig)


def attention_factor_of(cfg, d, rtype: str) -> float:
    """The factor transformers multiplies cos and sin by (modeling_rope_utils: ``attention_scaling``):
    the rotated rows' norm / the pre-RoPE rows' norm. 1 except for YaRN and LongRoPE."""
    if d.get("attention_factor") is not None and rtype in ("yarn", "longrope"):
        return float(d["attention_factor"])
    if rtype == "yarn":
        factor = float(d.get("factor", 1.0) or 1.0)

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if d.get("mscale") and d.get("mscale_all_dim"):
            return mscale(factor, float(d["mscale"])) / mscale(factor, float(d["mscale_all_dim"]))
        return mscale(factor)
    if rtype == "longrope":
        factor = _positions_ratio(cfg, d) or float(d.get("factor", 1.0) or 1.0)
        orig = d.get("original_max_position_embeddings", _get(cfg, "original_max_position_embeddings")) \
            or _get(cfg, "max_position_embeddings")
        if factor <= 1.0 or not orig:
            return 1.0
        return math.sqrt(1.0 + math.log(factor) / math.log(float(orig)))
    return 1.0


def rope_of(cfg, layer_type: str, head_dim: int) -> dict:
    """The manifest rope block (pairing, rotary_dim, theta, scaling, scaling_factor) of a layer type,
    plus ``attention_factor`` (not a RopeSpec field: the glue writes it into manifest.json itself)."""
    d = _rope_dict_for(cfg, layer_type)
    theta = d.get("rope_theta")
    if theta is None:
        raise CaptureConfigError(f"config.rope_parameters: rope_theta missing for {layer_type} layers "
                                 f"(keys {sorted(d)}); it is never assumed")
    rtype = str(d.get("rope_type", d.get("type", "default")))
    if rtype == "su":  # the LongRoPE spelling of early Phi-3 configs
        rtype = "longrope"
    prf = d.get("partial_rotary_factor", _get(cfg, "partial_rotary_factor", _get(cfg, "rotary_pct", 1.0))) or 1.0
    scaling = ROPE_SCALINGS.get(rtype, rtype)
    if scaling == "none":
        factor = 1.0
    elif rtype == "longrope":
        # Phi-3 configs carry no factor: transformers uses max / original positions (32 for Phi-3 128k)
        ratio = _positions_ratio(cfg, d)
        factor = ratio if ratio is not None else float(d.get("factor") or 0.0)
        if not factor or factor <= 0:
            raise CaptureConfigError("config.rope_scaling (longrope): no factor and no "
                                     "original_max_position_embeddings; the scaling factor is never assumed")
    else:
        factor = float(d.get("factor", 1.0) or 1.0)
    rotary = int(head_dim * float(prf))
    pairing = "interleaved" if _get(cfg, "model_type") in INTERLEAVED_MODEL_TYPES else "rotate_half"
    return {"pairing": pairing, "rotary_dim": rotary - rotary % 2, "theta": float(theta),
            "scaling": scaling, "scaling_factor": factor, "attention_factor": attention_factor_of(cfg, d, rtype)}


def rope_applied_of(cfg, n_layers, types: Optional[Sequence[str]] = None) -> List[bool]:
    """Per layer: False for NoPE layers (SmolLM3 / Llama-4 ``no_rope_layers[l] == 0``; Cohere2's
    full-attention layers, whose attention applies RoPE only when ``self.sliding_window`` is set)."""
    if _get(cfg, "model_type") == "cohere2":
        types = types if types is not None else layer_types_of(cfg, n_layers)
        return [t == "sliding_attention" for t in types]
    nope = _get(cfg, "no_rope_layers")
    if nope is None:
        return [True] * n_layers
    nope = list(nope)
    if len(nope) != n_layers:
        raise CaptureConfigError(f"config.no_rope_layers: {len(nope)} entries for num_hidden_layers = {n_layers}")
    return [bool(x) for x in nope]


def capture_plan_of(config) -> SimpleNamespace:
    """Everything the manifest needs from a (possibly multimodal) transformers config:
    n_layers, n_q_heads, n_kv_heads, head_dim, sliding_window, layer_types, rope per layer,
    rope_applied, cross_attention_layers."""
    cfg = text_config(config)
    n_layers, n_q, n_kv, head_dim = heads_of(cfg)
    types = layer_types_of(cfg, n_layers)
    windows = sliding_windows_of(cfg, n_layers)
    applied = rope_applied_of(cfg, n_layers, types)
    rope_by_type = {t: rope_of(cfg, t, head_dim) for t in sorted(set(types))}
    cross = [int(x) for x in (_get(cfg, "cross_attention_layers") or [])]
    return SimpleNamespace(n_layers=n_layers, n_q_heads=[n_q] * n_layers, n_kv_heads=[n_kv] * n_layers,
                           head_dim=head_dim, sliding_window=windows, layer_types=types,
                           rope=[rope_by_type[t] for t in types], rope_applied=applied,
                           cross_attention_layers=cross)


ROPE_SPEC_FIELDS = ("pairing", "rotary_dim", "theta", "scaling", "scaling_factor")


def _planned_rope(plan, heads):
    layers = sorted({h.layer for h in heads} - {l for l in range(plan.n_layers) if not plan.rope_applied[l]})
    if not layers:
        layers = [l for l in range(plan.n_layers) if plan.rope_applied[l]][:1]
    if not layers:
        return None
    first = plan.rope[layers[0]]
    for layer in layers:
        if plan.rope[layer] != first:
            raise CaptureConfigError(
                f"planned heads span layers with different RoPE settings: layer {layers[0]} {first} vs layer "
                f"{layer} {plan.rope[layer]}; the manifest records one rope block. Capture the full-attention "
                "layers only (--eligibility full_attention_only, the default), or capture each layer type "
                "into its own dataset with the Python API (Recorder with an explicit heads=[...] list)")
    return first


def manifest_rope(plan, heads) -> Optional[dict]:
    """The one rope block (RopeSpec fields) of the planned heads' layers (refused when they differ)."""
    r = _planned_rope(plan, heads)
    return None if r is None else {k: r[k] for k in ROPE_SPEC_FIELDS}


def manifest_attention_factor(plan, heads) -> float:
    """rope.attention_factor of the planned layers (1 = the rows are a pure rotation of q_proj/k_proj)."""
    r = _planned_rope(plan, heads)
    return 1.0 if r is None else float(r.get("attention_factor", 1.0))


def check_plan(plan, heads) -> None:
    """Refuses planned heads the glue cannot capture (Llama-3.2-Vision cross-attention layers)."""
    bad = sorted({h.layer for h in heads} & set(plan.cross_attention_layers))
    if bad:
        raise CaptureConfigError(f"planned heads in cross-attention layers {bad} (config.cross_attention_layers): "
                                 "they attend to image tokens without RoPE, and the manifest cannot yet exclude them "
                                 "from the plan (not supported: Llama-3.2-Vision)")


def parse_override(text: str):
    """'a.b=value' -> (['a', 'b'], value); value parsed as JSON when it is JSON, else a string."""
    if "=" not in text:
        raise CaptureConfigError(f"--config-override: expected key=value (value {text!r})")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise CaptureConfigError(f"--config-override: empty key (value {text!r})")
    return path, value


def apply_overrides(config, overrides: Sequence[str]) -> None:
    """Applies key=value overrides to the TEXT config (dotted keys descend into dicts), e.g.
    rope_parameters.factor=4 or rope_scaling={"rope_type":"yarn","factor":4.0,...}."""
    cfg = text_config(config)
    for text in overrides:
        path, value = parse_override(text)
        target = cfg
        for name in path[:-1]:
            nxt = _get(target, name)
            if nxt is None:
                raise CaptureConfigError(f"--config-override {text!r}: config has no {name!r}")
            target = nxt
        if isinstance(target, dict):
            target[path[-1]] = value
        else:
            setattr(target, path[-1], value)


# ---------------------------------------------------------------------------------- model glue
def decoder_layers(model, n_layers):
    """The decoder's ModuleList of self-attention layers (multimodal wrappers included)."""
    import torch  # noqa: PLC0415

    found = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or not name.endswith("layers") or len(mod) != n_layers:
            continue
        if "vision" in name or "visual" in name or "audio" in name:
            continue
        if any(hasattr(layer, "self_attn") for layer in mod):
            found.append((name, mod))
    if not found:
        other = sorted({type(getattr(layer, a)).__name__ for name, mod in model.named_modules()
                        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers
                        for layer in mod for a in ("attention", "attn", "self_attention") if hasattr(layer, a)})
        raise CaptureConfigError(
            f"model: no decoder ModuleList of {n_layers} layers with a self_attn module"
            + (f" (its layers hold {other}: a different attention structure)" if other else "")
            + "; qkgeom.hf records the self_attn call site of Llama-style modeling files only. What to do: record "
            "at your own call site with qkgeom.capture.Recorder.record(layer, q, k, ...) (docs/capture-recipes.md)")
    if len(found) != 1:
        raise CaptureConfigError(f"model: expected one decoder ModuleList of {n_layers} layers with self_attn, "
                                 f"found {[n for n, _ in found]}")
    return found[0][1]


def _forward_kwargs(model, batch):
    params = inspect.signature(model.forward).parameters
    kw = dict(batch, use_cache=False)
    if "logits_to_keep" in params:
        return model, dict(kw, logits_to_keep=1)
    if "num_logits_to_keep" in params:
        return model, dict(kw, num_logits_to_keep=1)
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None:
        raise CaptureConfigError("model: its forward takes no logits_to_keep and it has no base model to call")
    return base, kw


def _interleaved_or_half(r: int):
    """(first, second) coordinate indices of the r/2 rotary pairs under each pairing."""
    import torch  # noqa: PLC0415

    h = r // 2
    a = torch.arange(h)
    return {"rotate_half": (a, a + h), "interleaved": (2 * a, 2 * a + 1)}


def probe_rope_function(fn, head_dim: int, rotary_dim: int, where: str) -> str:
    """Calls a modeling file's own ``apply_rotary_pos_emb(q, k, cos, sin)`` on the basis vectors
    e_0 .. e_{d-1} (as d heads of one token) with cos = 0 and sin = 1 over the rotary width: a quarter
    turn, so the output is the file's own rotate_half of each basis vector. Returns the pairing it
    implements ("rotate_half": pairs (i, i + r/2); "interleaved": pairs (2i, 2i+1)); the coordinates
    past rotary_dim must come back unchanged. Refuses a function that does not take the whole head
    (a partial-rotary file that passes only the rotated slice to it)."""
    import torch  # noqa: PLC0415

    d, r = int(head_dim), int(rotary_dim or head_dim)
    eye = torch.eye(d, dtype=torch.float32)[None, :, None, :]  # [B=1, heads=d, T=1, d]
    cos, sin = torch.zeros(1, 1, r), torch.ones(1, 1, r)
    old_style = (cos[0], sin[0], torch.zeros(1, 1, dtype=torch.long))
    partial = CaptureConfigError(
        f"{where}.apply_rotary_pos_emb rotates only a slice of the head: this modeling file applies RoPE to the "
        f"first {r} of {d} coordinates (partial_rotary_factor / rotary_pct < 1) and passes only that slice to "
        "apply_rotary_pos_emb, so the call site never sees the whole query/key head and the glue cannot record "
        "it. What to do: record at your own call site with qkgeom.capture.Recorder.record(layer, q, k, ...) after "
        f"the rotated and pass-through parts are concatenated, with rope rotary_dim = {r} in manifest_for "
        "(docs/capture-recipes.md, 'Partial rotary'), or use a transformers release whose modeling file passes "
        "the whole head to apply_rotary_pos_emb")
    try:
        param = inspect.signature(fn).parameters.get("position_ids")
    except (TypeError, ValueError):
        param = None
    # 4.4x files before the RoPE refactor take position_ids and index cos[position_ids] ([seq, r] tables)
    # inside the function; tried second also when a wrapper hides the signature
    calls = [old_style, (cos, sin)] if param is not None and param.default is inspect.Parameter.empty \
        else [(cos, sin), old_style]
    errors = []
    out = None
    for args in calls:
        try:
            with torch.no_grad():
                out = fn(eye.clone(), eye.clone(), *args)
            break
        except (RuntimeError, TypeError, ValueError, IndexError) as e:
            errors.append(e)
    if out is None:
        e = errors[0]
        if r < d:
            raise partial from e
        raise CaptureConfigError(f"{where}.apply_rotary_pos_emb(q, k, cos, sin) failed on q, k [1, {d}, 1, {d}] "
                                 f"with cos, sin [1, 1, {r}] ({type(e).__name__}: {e}): not the call site "
                                 "qkgeom.hf records (assumption A1)") from e
    q = out[0]
    if tuple(q.shape) != (1, d, 1, d):
        if r < d:
            raise partial
        raise CaptureConfigError(f"{where}.apply_rotary_pos_emb returned q of shape {tuple(q.shape)} for q "
                                 f"[1, {d}, 1, {d}] (assumption A1)")
    m = q[0, :, 0, :].double()  # row i: the image of e_i
    for i in range(r, d):
        if not torch.allclose(m[i], torch.eye(d, dtype=torch.float64)[i], atol=1e-6):
            raise CaptureConfigError(f"{where}.apply_rotary_pos_emb changes coordinate {i} >= rotary_dim {r}: "
                                     "the rotary width recorded from the config is not the one it uses")
    for name, (a, b) in _interleaved_or_half(r).items():
        want = torch.zeros(d, d, dtype=torch.float64)
        want[r:, r:] = torch.eye(d - r, dtype=torch.float64)
        want[a, b] = 1.0   # quarter turn: (x_a, x_b) -> (-x_b, x_a)
        want[b, a] = -1.0
        if torch.allclose(m, want, atol=1e-6):
            return name
    raise CaptureConfigError(f"{where}.apply_rotary_pos_emb pairs coordinates neither as rotate_half (i, i + r/2) "
                             "nor as interleaved (2i, 2i+1); the dataset format records only those two")


def _module_sliding(layer, attn):
    """(sliding?, window or None) read from a loaded decoder layer, or None when it states nothing."""
    at = getattr(layer, "attention_type", None)
    if at is None:
        at = getattr(attn, "attention_type", None)
    window = vars(attn).get("sliding_window")
    window = int(window) if isinstance(window, int) and not isinstance(window, bool) else None
    if isinstance(at, str) and at in ("sliding_attention", "full_attention"):
        return at == "sliding_attention", window
    for owner in (layer, attn):
        flag = vars(owner).get("is_sliding")
        if isinstance(flag, bool):
            return flag, window
    if "sliding_window" in vars(attn):
        return window is not None, window
    return None


def refine_plan(plan, model, config=None) -> list:
    """Per-layer facts read from the LOADED model where the config is ambiguous: the sliding window of
    each layer (the layer's ``attention_type`` / ``is_sliding`` / the attention's ``sliding_window``,
    as the modeling file set them: Gemma-2 on 4.42-4.52 has no layer_types), and the pairing and
    rotary width of each modeling file's own apply_rotary_pos_emb (probe_rope_function: Cohere's
    interleaved pairs). Updates ``plan`` in place; returns the notes (one line per changed fact)."""
    cfg = text_config(config if config is not None else model.config)
    layers = decoder_layers(model, plan.n_layers)
    notes = []
    windows = list(plan.sliding_window)
    probed = {}
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            continue
        facts = _module_sliding(layer, attn)
        if facts is not None:
            sliding, window = facts
            if sliding and window is None:
                window = _get(cfg, "sliding_window")
                if not window:
                    raise CaptureConfigError(f"layer {i}: the loaded module is a sliding-window layer but "
                                             f"config.sliding_window is {window!r}")
            new = int(window) if sliding else None
            if new != windows[i]:
                notes.append(f"layer {i}: sliding window {windows[i]} (config) -> {new} (loaded module)")
                windows[i] = new
        if not plan.rope_applied[i]:
            continue
        ns = sys.modules[type(attn).__module__]
        fn = getattr(ns, "apply_rotary_pos_emb", None)
        if not callable(fn):
            raise CaptureConfigError(f"{ns.__name__} has no apply_rotary_pos_emb (assumption A1)")
        key = (ns.__name__, plan.rope[i]["rotary_dim"])
        if key not in probed:
            probed[key] = probe_rope_function(fn, plan.head_dim, plan.rope[i]["rotary_dim"], ns.__name__)
        if plan.rope[i]["pairing"] != probed[key]:
            notes.append(f"layer {i}: pairing {plan.rope[i]['pairing']} (config) -> {probed[key]} "
                         f"({ns.__name__}.apply_rotary_pos_emb)")
        plan.rope[i] = dict(plan.rope[i], pairing=probed[key])
    plan.sliding_window = windows
    plan.layer_types = ["full_attention" if w is None else "sliding_attention" for w in windows]
    return notes


def check_rope_rows(x_in, x_out, positions, mask, rope: dict, what: str) -> float:
    """Cross-checks rows that went through apply_rotary_pos_emb against the recorded settings:
    x_in, x_out [B, H, T, d] (before, after), positions/mask [B, T] (host). Per rotary pair of
    ``rope['pairing']`` the output must be the input turned by an angle and scaled by one constant,
    ``rope['attention_factor']``; coordinates past ``rotary_dim`` unchanged; for scaling none/linear the
    angle of pair i at position t must be t * theta^(-2i/r) / factor. Returns the measured scale; a
    contradiction raises CaptureConfigError naming the setting."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    b, n_t = min(int(x_in.shape[0]), 4), int(x_in.shape[2])
    tok = torch.linspace(0, n_t - 1, min(n_t, 512)).round().long().unique()  # <= 512 tokens spread over T
    eps = float(torch.finfo(x_out.dtype).eps) if x_out.dtype.is_floating_point else 1e-7
    xi = x_in[:b, :, tok.to(x_in.device)].detach().to("cpu", torch.float64)
    xo = x_out[:b, :, tok.to(x_out.device)].detach().to("cpu", torch.float64)
    if xi.shape != xo.shape:
        raise CaptureConfigError(f"{what}: apply_rotary_pos_emb returned shape {tuple(xo.shape)} for input "
                                 f"{tuple(xi.shape)}")
    d = int(xi.shape[-1])
    r = int(rope["rotary_dim"] or d)
    tk = tok.numpy()
    valid = torch.ones(b, len(tk), dtype=torch.bool) if mask is None else \
        torch.as_tensor(np.asarray(mask)[:b][:, tk] != 0)
    pos = torch.as_tensor(np.asarray(positions)[:b][:, tk], dtype=torch.float64)
    scale = float(xi[..., :].abs().max()) or 1.0
    if r < d:
        diff = float((xo[..., r:] - xi[..., r:]).abs().amax(dim=(1, 3))[valid].max()) if bool(valid.any()) else 0.0
        if diff > 16 * eps * scale + 1e-6:
            raise CaptureConfigError(f"{what}: coordinates {r}..{d - 1} changed by RoPE (max difference {diff:.3g}) "
                                     f"but rope.rotary_dim = {r} says they pass through")
    a, c = _interleaved_or_half(r)[rope["pairing"]]
    zi = torch.complex(xi[..., a], xi[..., c])      # [b, H, t, r/2]
    zo = torch.complex(xo[..., a], xo[..., c])
    ni, no = zi.abs(), zo.abs()
    vmask = valid[:, None, :, None].expand_as(ni)
    if not bool(vmask.any()):
        return float(rope.get("attention_factor", 1.0))
    rms = float(ni[vmask].pow(2).mean().sqrt())
    sel = vmask & (ni > 0.25 * rms)  # pairs with a clear norm (small ones carry only rounding)
    if not bool(sel.any()):
        return float(rope.get("attention_factor", 1.0))
    ratio = (no / ni)[sel]
    measured = float(ratio.median())
    af = float(rope.get("attention_factor", 1.0))
    tol = 16 * eps + 1e-4
    spread = float((ratio - measured).abs().max())
    if spread > tol * max(1.0, measured):
        raise CaptureConfigError(
            f"{what}: the rows do not fit rope.pairing = {rope['pairing']!r}, rotary_dim = {r}: the norm of a "
            f"recorded pair changes by RoPE by ratios from {float(ratio.min()):.4g} to {float(ratio.max()):.4g} "
            "(a rotation keeps it constant); the manifest would be wrong, nothing is written")
    if abs(measured - af) > 4 * eps * af + 1e-4 * af + 1e-6:
        raise CaptureConfigError(
            f"{what}: RoPE scales the rows by {measured:.6g} (rotated norm / pre-RoPE norm), but the settings read "
            f"from the config give attention_factor = {af:.6g}; the manifest would be wrong, nothing is written")
    if rope["scaling"] in ("none", "linear"):
        inv = 1.0 / (float(rope["theta"]) ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
        inv = inv / float(rope["scaling_factor"] if rope["scaling"] == "linear" else 1.0)
        want = pos[:, None, :, None] * inv                                 # [b, 1, t, r/2]
        turn = zo * torch.conj(zi) / (no * ni)                             # e^{i angle}
        err = (turn - torch.exp(torch.complex(torch.zeros_like(want), want))).abs()
        # rounding of the rows, plus the frequency's own precision: a model cast with .to(bfloat16) holds
        # its inv_freq in bf16 (0.4% off at most), a float32 table is exact to ~1e-7
        tol = 32 * eps + 1e-4 + want.abs() * (4e-7 + 2 * eps)
        over = (err - tol).expand_as(ni)[sel]
        err = err.expand_as(ni)[sel]
        if float(over.max()) > 0:
            raise CaptureConfigError(
                f"{what}: the rotation angles do not fit rope.theta = {rope['theta']}, scaling = {rope['scaling']!r} "
                f"x {rope['scaling_factor']} at the given positions (largest angle error {float(err.max()):.3g} rad); "
                "the manifest would be wrong, nothing is written")
    return measured


class HFCapture:
    """Installs the capture hooks on a loaded transformers model (context manager).

    check_rows: on the first batch, the rows of every planned RoPE layer are cross-checked against the
    plan's RoPE settings (check_rope_rows: pairing, rotary_dim, theta/scaling where they fix the angle,
    the attention factor), and a layer the plan records as NoPE that calls apply_rotary_pos_emb stops the
    run."""

    def __init__(self, model, recorder, plan, check_rows=True):
        self.model, self.rec, self.plan = model, recorder, plan
        self.layers = decoder_layers(model, plan.n_layers)
        self.state = {"layer": None, "attn": None}
        self.handles = []
        self._proj = {}
        self.check_rows = check_rows
        self._checked = set()
        self._batch = (None, None)
        self.measured_attention_factor = {}

    def __enter__(self):
        import contextlib  # noqa: PLC0415

        self._stack = contextlib.ExitStack()
        modules = {}
        planned = set(self.rec.layers())
        for i, layer in enumerate(self.layers):
            attn = getattr(layer, "self_attn", None)
            if attn is None:
                continue
            idx = int(getattr(attn, "layer_idx", i) if getattr(attn, "layer_idx", None) is not None else i)
            self.handles.append(attn.register_forward_pre_hook(self._enter_layer(idx)))
            self.handles.append(attn.register_forward_hook(self._leave_layer()))
            if not self.plan.rope_applied[idx] and idx in planned:
                self._hook_projections(idx, attn)
            ns = sys.modules[type(attn).__module__]
            if self.plan.rope_applied[idx] and idx in planned:
                modules.setdefault(ns, set()).add(idx)
            else:
                modules.setdefault(ns, set())
        for ns, idxs in modules.items():
            fn = getattr(ns, "apply_rotary_pos_emb", None)
            if not callable(fn):
                raise CaptureConfigError(f"{ns.__name__} has no apply_rotary_pos_emb (assumption A1)")
            probed = {}
            for idx in sorted(idxs):
                rope = self.plan.rope[idx]
                if rope["rotary_dim"] not in probed:
                    probed[rope["rotary_dim"]] = probe_rope_function(fn, self.plan.head_dim, rope["rotary_dim"],
                                                                     ns.__name__)
                got = probed[rope["rotary_dim"]]
                if got != rope["pairing"]:
                    raise CaptureConfigError(f"layer {idx}: the plan records pairing {rope['pairing']!r} but "
                                             f"{ns.__name__}.apply_rotary_pos_emb pairs {got!r} "
                                             "(call hf.refine_plan(plan, model) before writing the manifest)")
            self._stack.enter_context(self._checking(ns))
            self._stack.enter_context(self.rec.patch(ns, "apply_rotary_pos_emb", layer_of=lambda: self.state["layer"]))
        return self

    def _checking(self, ns):
        """Wraps ns.apply_rotary_pos_emb with the row cross-check (inside the recorder's wrapper)."""
        import contextlib  # noqa: PLC0415

        original = ns.apply_rotary_pos_emb

        def checked(*args, **kwargs):
            out = original(*args, **kwargs)
            idx = self.state["attn"]
            if idx is not None and not self.plan.rope_applied[idx]:
                raise CaptureConfigError(f"layer {idx}: recorded as a NoPE layer (rope_applied false) but its "
                                         f"attention calls {ns.__name__}.apply_rotary_pos_emb; the manifest would "
                                         "be wrong, nothing is written")
            if self.check_rows and idx is not None and idx in self.rec.layers() and idx not in self._checked:
                pos, mask = self._batch
                if pos is not None:
                    rope = self.plan.rope[idx]
                    fq = check_rope_rows(args[0], out[0], pos, mask, rope, f"layer {idx} queries")
                    fk = check_rope_rows(args[1], out[1], pos, mask, rope, f"layer {idx} keys")
                    self.measured_attention_factor[idx] = (fq, fk)
                    self._checked.add(idx)
            return out

        @contextlib.contextmanager
        def ctx():
            ns.apply_rotary_pos_emb = checked
            try:
                yield
            finally:
                ns.apply_rotary_pos_emb = original
        return ctx()

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self._stack.__exit__(*exc)
        return False

    def _enter_layer(self, idx):
        def hook(_module, _args):
            self.state["attn"] = idx
            self.state["layer"] = idx if self.plan.rope_applied[idx] else None
        return hook

    def _leave_layer(self):
        def hook(_module, _args, _out):
            self.state["layer"] = None
            self.state["attn"] = None
        return hook

    def _hook_projections(self, idx, attn):
        if getattr(attn, "q_norm", None) is not None or getattr(attn, "k_norm", None) is not None:
            raise CaptureConfigError(f"layer {idx}: NoPE layer with q_norm/k_norm: q_proj output is not the "
                                     "attention input (assumption A3)")
        d = self.plan.head_dim

        def grab(kind):
            def hook(_module, _args, out):
                self._proj[(idx, kind)] = out
                if (idx, "q") in self._proj and (idx, "k") in self._proj:
                    q, k = self._proj.pop((idx, "q")), self._proj.pop((idx, "k"))
                    b, t = q.shape[0], q.shape[1]
                    self.rec.record(idx, q.view(b, t, -1, d), k.view(b, t, -1, d), layout="bthd",
                                    rope_applied=False)
            return hook
        self.handles.append(attn.q_proj.register_forward_hook(grab("q")))
        self.handles.append(attn.k_proj.register_forward_hook(grab("k")))

    def run(self, input_ids, attention_mask, device, example_ids=None):
        """One batch (host tensors): explicit positions (cumulative mask - 1), padding masked, no full
        logits. Positions and mask stay on the host for the sampler, so reading them never waits for
        the device; the model gets device copies."""
        import torch  # noqa: PLC0415

        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        self.rec.set_batch(positions, mask=attention_mask, example_ids=example_ids)
        self._batch = (positions.numpy(), attention_mask.numpy())
        fn, kw = _forward_kwargs(self.model, {"input_ids": input_ids.to(device),
                                              "attention_mask": attention_mask.to(device),
                                              "position_ids": positions.to(device)})
        with torch.no_grad():
            fn(**kw)
        missing = self.rec.missing_layers()
        if missing:
            raise CaptureConfigError(f"planned layers {missing} were never recorded: apply_rotary_pos_emb was not "
                                     "called for them (assumption A1); nothing is written for this model")
        self.rec.step()


# ---------------------------------------------------------------------------------- CLI
def _args(argv, prog="python3 -m qkgeom.hf"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("model", help="model id or local path")
    ap.add_argument("--legacy", action="store_true", help=argparse.SUPPRESS if prog.endswith(".hf") else
                    "legacy HookedTransformer (required: the TransformerBridge is refused, "
                    "capture its checkpoint with python3 -m qkgeom.hf)")
    ap.add_argument("-o", "--out", required=True, help="output dataset directory (new or empty; written only "
                    "when the capture succeeds)")
    ap.add_argument("--prompts", required=True, help="text file, one example per line (.jsonl: {'text': ...})")
    ap.add_argument("--revision", default=None, help="model revision (branch, tag or commit)")
    ap.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                    help="set a text-config field before loading (JSON value), e.g. rope_parameters.factor=4")
    ap.add_argument("--context", type=int, default=2048, help="tokens per example (truncation) = context_length")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--max-examples", type=int, default=64)
    ap.add_argument("--heads", type=int, default=None, help="query heads to sample (default: all eligible)")
    ap.add_argument("--head-seed", type=int, default=0)
    ap.add_argument("--eligibility", choices=("full_attention_only", "all_layers"), default="full_attention_only")
    ap.add_argument("--scheme", choices=("uniform", "log", "all"), default="uniform")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="token sampling seed")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16", "f64"), default="f32", help="stored vector dtype")
    ap.add_argument("--torch-dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available; under torchrun "
                    "cuda:LOCAL_RANK)")
    if prog.endswith(".hf"):
        ap.add_argument("--shards", type=int, default=None, metavar="S",
                        help="split the examples into S logical shards (independent of the number of processes); "
                        "under torchrun rank r captures shards r, r+W, ...; -o is then a sharded capture folder")
        ap.add_argument("--merge-to", default=None, metavar="DIR",
                        help="with --shards: rank 0 joins the dataset parts into one dataset DIR after success")
        ap.add_argument("--timeout", type=float, default=1800.0,
                        help="with --shards: seconds the ranks wait for the slowest at the end (default 1800)")
    return ap.parse_args(argv)


def read_prompts(path: str, limit: int) -> List[str]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line)["text"] if path.endswith(".jsonl") else line.rstrip("\n"))
                if len(out) >= limit:
                    break
    if not out:
        raise CaptureConfigError(f"{path}: no examples")
    return out


def _partial_dir(out: str) -> str:
    out = os.path.abspath(out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise CaptureConfigError(f"-o {out}: exists and is not an empty folder; choose a new output folder "
                                 "(a capture never writes into an existing dataset)")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    return os.path.join(parent, f".{os.path.basename(out)}.partial-{os.getpid()}")


def write_attention_factor(folder: str, factor: float) -> None:
    """Adds rope.attention_factor to FOLDER/manifest.json (docs/capture-recipes.md: the constant RoPE scales
    the rows by; YaRN, LongRoPE). The C++ reader ignores the field (unknown fields are ignored)."""
    path = os.path.join(folder, "manifest.json")
    with open(path, encoding="utf-8") as f:
        m = json.load(f)
    if m.get("rope") is None:
        return
    m["rope"]["attention_factor"] = float(factor)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(m, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def capture_loaded(model, tok, config, a, model_name: str, device) -> int:
    """Captures a loaded transformers model with the CLI options ``a`` into the dataset a.out.

    The plan's per-layer facts are read from the loaded modules (refine_plan), the first batch's rows
    are cross-checked against the recorded RoPE settings (HFCapture check_rows), and the dataset is
    written into a hidden sibling folder that becomes a.out only when everything succeeded: a failed
    run leaves nothing at a.out."""
    import qkgeom  # noqa: PLC0415

    from .capture import Recorder, manifest_for  # noqa: PLC0415

    plan = capture_plan_of(config)
    for note in refine_plan(plan, model, config):
        print(f"qkgeom.hf: {note}", file=sys.stderr)
    layout = qkgeom.ModelLayout(plan.head_dim, plan.n_q_heads, plan.n_kv_heads, plan.sliding_window)
    buckets = qkgeom.BucketSpec(a.scheme, a.width, a.rate)
    heads = qkgeom.sample_heads(layout, a.heads, a.head_seed, a.eligibility)
    if not heads:
        raise CaptureConfigError(f"no head to capture: every layer has a sliding window ({plan.sliding_window[:4]}...) "
                                 f"and --eligibility is {a.eligibility}; use --eligibility all_layers")
    check_plan(plan, heads)
    rope = manifest_rope(plan, heads)
    factor = manifest_attention_factor(plan, heads)
    m = manifest_for(layout, model=model_name, buckets=buckets, context_length=a.context, seed=a.seed,
                     head_count=a.heads, head_seed=a.head_seed, eligibility=a.eligibility,
                     rope=rope, rope_applied=plan.rope_applied)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    prompts = read_prompts(a.prompts, a.max_examples)
    if getattr(a, "shards", None) is not None:
        extra = {"rope": {"attention_factor": factor}} if rope is not None and factor != 1.0 else None
        return _capture_sharded(model, tok, plan, m, prompts, a, device, extra)
    tmp = _partial_dir(a.out)
    try:
        rec = Recorder(layout, buckets=buckets, seed=a.seed, head_count=a.heads, head_seed=a.head_seed,
                       eligibility=a.eligibility, sink=qkgeom.DatasetWriter(tmp, m, dtype=a.dtype),
                       context_length=a.context, rope_applied=plan.rope_applied, model=model_name)
        with HFCapture(model, rec, plan) as cap:
            for start in range(0, len(prompts), a.batch_size):
                enc = tok(prompts[start:start + a.batch_size], return_tensors="pt", padding=True, truncation=True,
                          max_length=a.context)
                cap.run(enc["input_ids"], enc["attention_mask"], device)
                print(f"examples {start}..{start + enc['input_ids'].shape[0] - 1}: {enc['input_ids'].shape[1]} "
                      "tokens", file=sys.stderr)
        rec.close()
        if rope is not None and factor != 1.0:
            write_attention_factor(tmp, factor)
        out = os.path.abspath(a.out)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked by _partial_dir)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"{len(rec.heads)} planned heads, rows {rec.rows_recorded()} written to {a.out}")
    return 0


def _capture_sharded(model, tok, plan, m, prompts, a, device, extra) -> int:
    """capture_loaded with --shards: this rank's shards of the prompts (contiguous blocks, global example
    ids = line numbers among the examples), dataset parts, rank 0's manifest last (qkgeom.distributed)."""
    import torch  # noqa: PLC0415

    from .distributed import ShardedCapture, merge_sharded_dataset  # noqa: PLC0415

    if a.shards < 1:
        raise CaptureConfigError(f"--shards: must be >= 1 (value {a.shards})")
    with ShardedCapture(a.out, n_shards=a.shards, manifest=m, sink="dataset", dtype=a.dtype,
                        n_examples=len(prompts), timeout_s=a.timeout, manifest_extra=extra) as run:
        for shard in run.shards():
            ex = run.examples(shard)
            with run.recorder(shard) as rec:
                with HFCapture(model, rec, plan) as cap:
                    for start in range(ex.start, ex.stop, a.batch_size):
                        stop = min(start + a.batch_size, ex.stop)
                        enc = tok(prompts[start:stop], return_tensors="pt", padding=True, truncation=True,
                                  max_length=a.context)
                        cap.run(enc["input_ids"], enc["attention_mask"], device,
                                example_ids=torch.arange(start, stop, dtype=torch.int64))
            print(f"rank {run.rank}: shard {shard} (examples {ex.start}..{ex.stop - 1}) written", file=sys.stderr)
    if run.rank == 0:
        print(f"{len(run.heads)} planned heads, {a.shards} shards by {run.world} process(es) written to {a.out}")
        if getattr(a, "merge_to", None):
            merge_sharded_dataset(a.out, a.merge_to)
            print(f"dataset parts joined into {a.merge_to}")
    return 0


def init_distributed(device_arg: Optional[str]):
    """Under torchrun (WORLD_SIZE > 1 in the environment): initialises the default process group when the
    caller has not (NCCL for a CUDA device, else gloo) and returns the device of this rank
    (cuda:LOCAL_RANK when CUDA is available and --device is not given)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_arg is not None:
        device = device_arg
    elif torch.cuda.is_available():
        device = f"cuda:{local}"
    else:
        device = "cpu"
    if str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if not dist.is_initialized():
        backend = "nccl" if str(device).startswith("cuda") and dist.is_nccl_available() else "gloo"
        dist.init_process_group(backend=backend, init_method="env://")
    return device


def load_model(transformers, name: str, load: dict):
    """AutoModelForCausalLM, and AutoModelForImageTextToText only when the first says the config class is
    unrecognized (a multimodal wrapper); any other error is the real cause and is raised as it is."""
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(name, **load)
    except ValueError as e:
        if "unrecognized configuration class" not in str(e).lower():
            raise
        first = e
    auto = getattr(transformers, "AutoModelForImageTextToText", None)
    if auto is None:
        raise CaptureConfigError(f"{name}: AutoModelForCausalLM cannot load it ({first}), and this transformers "
                                 "has no AutoModelForImageTextToText") from first
    try:
        return auto.from_pretrained(name, **load)
    except ValueError as e:
        raise CaptureConfigError(f"{name}: neither auto class loads it. AutoModelForCausalLM: {first} -- "
                                 f"AutoModelForImageTextToText: {e}") from e


def main(argv=None) -> int:
    a = _args(argv)
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    config = transformers.AutoConfig.from_pretrained(a.model, revision=a.revision)
    apply_overrides(config, a.config_override)
    capture_plan_of(config)  # refuse a config the capture cannot record before loading any weights
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.shards is None:
        if world > 1:
            raise CaptureConfigError(f"WORLD_SIZE = {world} (torchrun) but no --shards: every process would capture "
                                     "every example into one -o; pass --shards S (docs/capture.md)")
        _partial_dir(a.out)  # an output folder it would not write into
        device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    else:
        if a.merge_to is not None:
            _partial_dir(a.merge_to)
        device = init_distributed(a.device) if world > 1 else (a.device or ("cuda" if torch.cuda.is_available()
                                                                           else "cpu"))
    tok = transformers.AutoTokenizer.from_pretrained(a.model, revision=a.revision)
    load = dict(config=config, revision=a.revision, torch_dtype=getattr(torch, a.torch_dtype))
    model = load_model(transformers, a.model, load)
    model.to(device).eval()
    name = a.model if a.revision is None else f"{a.model}@{a.revision}"
    return capture_loaded(model, tok, model.config, a, name, device)


if __name__ == "__main__":
    from .distributed import ShardedCaptureError

    try:
        sys.exit(main())
    except (CaptureConfigError, ShardedCaptureError) as e:
        print(f"qkgeom.hf: error: {e}", file=sys.stderr)
        sys.exit(1)
