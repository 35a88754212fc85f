"""Hugging Face transformers (4.4x and 5) glue for qkgeom.capture.Recorder.

    python3 -m qkgeom.hf MODEL -o DIR [--revision R] [--context N] [--heads N] ...

UNTESTED against real transformers: neither transformers nor a GPU was available where this
was written. The config parsing (``capture_plan_of``) is tested on SimpleNamespace configs
shaped like real v5 and 4.4x configs (tests/python/capture/hf_config.py); everything that
touches a loaded model is not. Written against the transformers source of
models/{llama,gemma3,smollm3,mistral3,qwen3,mllama}/modeling_*.py, modeling_rope_utils.py
and configuration_utils.py (v5: ``RotaryEmbeddingConfigMixin``).

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
  A6 Sliding windows per layer: ``use_sliding_window == False`` -> none; ``layer_types``
     ("sliding_attention" -> ``sliding_window``); Gemma-3 4.4x ``sliding_window_pattern``;
     Qwen2 ``max_window_layers``; else a model-wide ``sliding_window``.
  A7 The backbone runs without full logits: ``logits_to_keep=1`` (``num_logits_to_keep`` on
     4.45-4.49) when the forward takes it, else the base model is called.
"""

from __future__ import annotations

import argparse
import inspect
import json
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
        raise CaptureConfigError("config: neither rope_parameters (transformers 5) nor rope_theta (4.4x) is set; "
                                 "the RoPE base is unknown and is never assumed")
    out = {"rope_theta": theta}
    scaling = _get(cfg, "rope_scaling")
    if isinstance(scaling, dict):
        out.update(scaling)
    if layer_type == "sliding_attention" and _get(cfg, "rope_local_base_freq") is not None:
        out = {"rope_theta": _get(cfg, "rope_local_base_freq")}  # Gemma-3 4.4x: local layers, no scaling
    return out


def rope_of(cfg, layer_type: str, head_dim: int) -> dict:
    """The manifest rope block (pairing, rotary_dim, theta, scaling, scaling_factor) of a layer type."""
    d = _rope_dict_for(cfg, layer_type)
    theta = d.get("rope_theta")
    if theta is None:
        raise CaptureConfigError(f"config.rope_parameters: rope_theta missing for {layer_type} layers "
                                 f"(keys {sorted(d)}); it is never assumed")
    rtype = str(d.get("rope_type", d.get("type", "default")))
    prf = d.get("partial_rotary_factor", _get(cfg, "partial_rotary_factor", 1.0)) or 1.0
    scaling = ROPE_SCALINGS.get(rtype, rtype)
    factor = 1.0 if scaling == "none" else float(d.get("factor", 1.0) or 1.0)
    rotary = int(head_dim * float(prf))
    return {"pairing": "rotate_half", "rotary_dim": rotary - rotary % 2, "theta": float(theta),
            "scaling": scaling, "scaling_factor": factor}


def rope_applied_of(cfg, n_layers) -> List[bool]:
    """Per layer: False for NoPE layers (SmolLM3 / Llama-4 ``no_rope_layers[l] == 0``)."""
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
    applied = rope_applied_of(cfg, n_layers)
    rope_by_type = {t: rope_of(cfg, t, head_dim) for t in sorted(set(types))}
    cross = [int(x) for x in (_get(cfg, "cross_attention_layers") or [])]
    return SimpleNamespace(n_layers=n_layers, n_q_heads=[n_q] * n_layers, n_kv_heads=[n_kv] * n_layers,
                           head_dim=head_dim, sliding_window=windows, layer_types=types,
                           rope=[rope_by_type[t] for t in types], rope_applied=applied,
                           cross_attention_layers=cross)


def manifest_rope(plan, heads) -> dict:
    """The one rope block of the planned heads' layers (refused when they differ)."""
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
                f"{layer} {plan.rope[layer]}; the manifest records one; plan heads of one layer type "
                "(eligibility full_attention_only, or --layers)")
    return first


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


class HFCapture:
    """Installs the capture hooks on a loaded transformers model (context manager)."""

    def __init__(self, model, recorder, plan):
        self.model, self.rec, self.plan = model, recorder, plan
        self.layers = decoder_layers(model, plan.n_layers)
        self.state = {"layer": None}
        self.handles = []
        self._proj = {}

    def __enter__(self):
        import contextlib  # noqa: PLC0415

        self._stack = contextlib.ExitStack()
        modules = set()
        for i, layer in enumerate(self.layers):
            attn = getattr(layer, "self_attn", None)
            if attn is None:
                continue
            idx = int(getattr(attn, "layer_idx", i) if getattr(attn, "layer_idx", None) is not None else i)
            self.handles.append(attn.register_forward_pre_hook(self._enter_layer(idx)))
            self.handles.append(attn.register_forward_hook(self._leave_layer()))
            if not self.plan.rope_applied[idx] and idx in self.rec.layers():
                self._hook_projections(idx, attn)
            modules.add(sys.modules[type(attn).__module__])
        for ns in modules:
            if not callable(getattr(ns, "apply_rotary_pos_emb", None)):
                raise CaptureConfigError(f"{ns.__name__} has no apply_rotary_pos_emb (assumption A1)")
            self._stack.enter_context(self.rec.patch(ns, "apply_rotary_pos_emb", layer_of=lambda: self.state["layer"]))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self._stack.__exit__(*exc)
        return False

    def _enter_layer(self, idx):
        def hook(_module, _args):
            self.state["layer"] = idx if self.plan.rope_applied[idx] else None
        return hook

    def _leave_layer(self):
        def hook(_module, _args, _out):
            self.state["layer"] = None
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
                    "legacy HookedTransformer (default: TransformerBridge)")
    ap.add_argument("-o", "--out", required=True, help="output dataset directory (or .qkm moments folder)")
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
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available)")
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


def capture_loaded(model, tok, config, a, model_name: str, device) -> int:
    """Captures a loaded transformers model (also TransformerLens' bridge.original_model) with the
    CLI options ``a`` into the dataset a.out."""
    import qkgeom  # noqa: PLC0415

    from .capture import Recorder, manifest_for  # noqa: PLC0415

    plan = capture_plan_of(config)
    layout = qkgeom.ModelLayout(plan.head_dim, plan.n_q_heads, plan.n_kv_heads, plan.sliding_window)
    buckets = qkgeom.BucketSpec(a.scheme, a.width, a.rate)
    heads = qkgeom.sample_heads(layout, a.heads, a.head_seed, a.eligibility)
    if not heads:
        raise CaptureConfigError(f"no head to capture: every layer has a sliding window ({plan.sliding_window[:4]}...) "
                                 f"and --eligibility is {a.eligibility}; use --eligibility all_layers")
    check_plan(plan, heads)
    m = manifest_for(layout, model=model_name, buckets=buckets, context_length=a.context, seed=a.seed,
                     head_count=a.heads, head_seed=a.head_seed, eligibility=a.eligibility,
                     rope=manifest_rope(plan, heads), rope_applied=plan.rope_applied)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    rec = Recorder(layout, buckets=buckets, seed=a.seed, head_count=a.heads, head_seed=a.head_seed,
                   eligibility=a.eligibility, sink=qkgeom.DatasetWriter(a.out, m, dtype=a.dtype),
                   context_length=a.context, rope_applied=plan.rope_applied, model=model_name)
    prompts = read_prompts(a.prompts, a.max_examples)
    with HFCapture(model, rec, plan) as cap:
        for start in range(0, len(prompts), a.batch_size):
            enc = tok(prompts[start:start + a.batch_size], return_tensors="pt", padding=True, truncation=True,
                      max_length=a.context)
            cap.run(enc["input_ids"], enc["attention_mask"], device)
            print(f"examples {start}..{start + enc['input_ids'].shape[0] - 1}: {enc['input_ids'].shape[1]} tokens",
                  file=sys.stderr)
    rec.close()
    print(f"{len(rec.heads)} planned heads, rows {rec.rows_recorded()} written to {a.out}")
    return 0


def main(argv=None) -> int:
    a = _args(argv)
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    config = transformers.AutoConfig.from_pretrained(a.model, revision=a.revision)
    apply_overrides(config, a.config_override)
    capture_plan_of(config)  # refuse a config the capture cannot record before loading any weights
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = transformers.AutoTokenizer.from_pretrained(a.model, revision=a.revision)
    load = dict(config=config, revision=a.revision, torch_dtype=getattr(torch, a.torch_dtype))
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, **load)
    except ValueError:  # multimodal wrappers (e.g. Llama-3.2-Vision) have no CausalLM auto class
        model = transformers.AutoModelForImageTextToText.from_pretrained(a.model, **load)
    model.to(device).eval()
    name = a.model if a.revision is None else f"{a.model}@{a.revision}"
    return capture_loaded(model, tok, model.config, a, name, device)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CaptureConfigError as e:
        print(f"qkgeom.hf: error: {e}", file=sys.stderr)
        sys.exit(1)
