"""qkgeom.hf against the REAL transformers (CTest python.capture.hf_real; argv[1] = scratch folder).

Skipped (exit 77, with a message) when transformers is not importable: CI has none. Where it is,
each architecture of the table below that the installed release has is built from a random small
config (``from_config``-style construction: tiny sizes, no download, no network), captured by the
glue exactly as ``python3 -m qkgeom.hf`` captures a loaded model (``hf.capture_loaded`` with the
CLI's options, a character tokenizer, right-padded batches of two), and checked three ways:

  rows     every stored row equals an independent recomputation: forward hooks on the attention's
           q/k projections (after q_norm/k_norm where the module has them; the fused qkv_proj split)
           give the pre-RoPE rows, the modeling file's own apply_rotary_pos_emb applied to them with
           the cos/sin of that layer's call gives the post-RoPE rows (NoPE layers: the projections);
           compared at each stored row's (example, position), exactly.
  manifest the manifest's RoPE settings re-derive the rows: the rotary pairs of rope.pairing and
           rope.rotary_dim turned by position x inv_freq, scaled by rope.attention_factor, where
           inv_freq is theta^(-2i/r) / factor for scaling none/linear and the release's own
           ROPE_INIT_FUNCTIONS[rope_type](config) otherwise; and the manifest's sliding windows,
           rope_applied, scaling and factor equal the architecture's known per-layer facts.
  analysis qkgeom.analyze_dataset on the written dataset analyses every planned head.

One more Llama model takes a 3000-token example, so the glue's cross-check and the re-derivation
also run at long range (the re-derivation allows 1e-7 x position for the model's float32 angles).
QKGEOM_HF_REAL_DTYPE=bfloat16 runs the models in bf16 (the CLI's default --torch-dtype; the rotary
tables stay float32, as from_pretrained leaves them); the re-derivation then allows 4 bf16 epsilons. A partial-rotary architecture whose modeling file passes only the rotated slice to
apply_rotary_pos_emb must be REFUSED with the message that says what to do (nothing left at -o);
one that passes the whole head must be captured with rope.rotary_dim < head_dim. The table printed
at the end is the one docs/capture-recipes.md records per release.
"""

import functools
import json
import math
import os
import shutil
import sys
import traceback

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)
try:
    import transformers
except ImportError as e:
    print(f"skipped: transformers is not importable ({e}); this harness runs the glue against the real "
          "library where it is installed (docs/capture-recipes.md, 'Verified against transformers')")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import check, finish  # noqa: E402
import qkgeom  # noqa: E402
from qkgeom import hf  # noqa: E402

WORK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-hf-real"
ONLY = set(filter(None, os.environ.get("QKGEOM_HF_REAL_ONLY", "").split(",")))
D, H, KV, L = 16, 4, 2, 4
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=L, num_attention_heads=H,
             num_key_value_heads=KV, vocab_size=96, max_position_embeddings=256)
PROMPTS = ["the first example of a few words", "short", "a third example, a little longer than the first one"]


def even_sliding(w):
    return [w if i % 2 == 0 else None for i in range(L)]


def pattern_sliding(w, p):
    return [None if (i + 1) % p == 0 else w for i in range(L)]


# name, config class, kwargs, expected: dict(windows, rope_applied, scaling, factor, rotary_dim, pairing, partial)
ARCHS = [
    ("llama-gqa", "LlamaConfig", dict(SMALL, head_dim=D), dict()),
    ("llama3-scaling", "LlamaConfig", dict(SMALL, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 32}),
     dict(scaling="llama3", factor=8.0)),
    ("llama-yarn4", "LlamaConfig", dict(SMALL, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                             "original_max_position_embeddings": 64}),
     dict(scaling="yarn", factor=4.0, attention_factor=0.1 * math.log(4.0) + 1.0)),
    ("qwen2", "Qwen2Config", dict(SMALL), dict()),
    ("qwen3", "Qwen3Config", dict(SMALL, head_dim=D), dict()),
    ("mistral", "MistralConfig", dict(SMALL, sliding_window=None), dict()),
    ("gemma", "GemmaConfig", dict(SMALL, head_dim=D), dict()),
    # Gemma-2's alternation is the modeling file's: odd layers on 4.42.0-4.42.3, even ones from #31775 on
    ("gemma2", "Gemma2Config", dict(SMALL, head_dim=D, sliding_window=8), dict(windows="alternating")),
    ("gemma3", "Gemma3TextConfig", dict(SMALL, head_dim=D, sliding_window=8, sliding_window_pattern=2),
     dict(windows="layer_types", eligibility="full_attention_only")),
    ("cohere", "CohereConfig", dict(SMALL), dict(pairing="interleaved")),
    ("cohere2", "Cohere2Config", dict(SMALL, sliding_window=8, sliding_window_pattern=2),
     dict(pairing="interleaved", windows="layer_types", rope_applied="sliding")),
    ("phi3-longrope", "Phi3Config", dict(SMALL, pad_token_id=0, max_position_embeddings=2048, original_max_position_embeddings=64,
                                         rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(D // 2)],
                                                       "long_factor": [2.0 + 0.1 * i for i in range(D // 2)]}),
     dict(scaling="longrope", factor=32.0, attention_factor=math.sqrt(1 + math.log(32.0) / math.log(64)))),
    ("smollm3", "SmolLM3Config", dict(SMALL, pad_token_id=0, no_rope_layers=[1, 1, 1, 0]), dict(rope_applied=[True, True, True, False])),
    ("olmo2", "Olmo2Config", dict(SMALL), dict()),
    ("starcoder2", "Starcoder2Config", dict(SMALL, sliding_window=None), dict()),
    ("stablelm", "StableLmConfig", dict(SMALL, partial_rotary_factor=0.25), dict(rotary_dim=D // 4, partial=True)),
    ("gpt-neox", "GPTNeoXConfig", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=L, num_attention_heads=H,
                                       vocab_size=96, max_position_embeddings=256, rotary_pct=0.25),
     dict(rotary_dim=D // 4, partial=True, kv=H)),
    ("ministral3", "Mistral3Config", None, dict()),
    # one long example (positions to 2999): the glue's cross-check and the re-derivation at long range
    ("llama-long", "LlamaConfig", dict(SMALL, max_position_embeddings=4096, rope_theta=500000.0), dict(long=True)),
]


class CharTokenizer:
    """Characters -> ids, right padding, truncation: the calls capture_loaded makes of a tokenizer."""
    pad_token, eos_token, padding_side = None, "</s>", "left"

    def __call__(self, texts, return_tensors, padding, truncation, max_length):
        ids = [[3 + ord(c) % 90 for c in t][:max_length] for t in texts]
        n = max(len(x) for x in ids)
        return {"input_ids": torch.tensor([x + [0] * (n - len(x)) for x in ids]),
                "attention_mask": torch.tensor([[1] * len(x) + [0] * (n - len(x)) for x in ids])}


DTYPE = getattr(torch, os.environ.get("QKGEOM_HF_REAL_DTYPE", "float32"))  # bfloat16: the CLI's default


def build(name, cls_name, kw):
    model = _build(name, cls_name, kw)
    if model is None or DTYPE == torch.float32:
        return model
    # as from_pretrained(torch_dtype=...) leaves them: the rotary tables stay float32 (.to() would round them)
    tables = {m: m.inv_freq.clone() for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)}
    model.to(DTYPE)
    for m, t in tables.items():
        m.inv_freq = t
    return model


def _build(name, cls_name, kw):
    torch.manual_seed(0)
    if name == "ministral3":
        if not hasattr(transformers, "Mistral3Config"):
            return None
        text = transformers.MistralConfig(**dict(SMALL, head_dim=D, sliding_window=None))
        vision = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                  num_attention_heads=2, image_size=32, patch_size=8, head_dim=16)
        cfg = transformers.Mistral3Config(text_config=text, vision_config=vision)
        return transformers.Mistral3ForConditionalGeneration(cfg).eval()
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        return None
    try:
        cfg = cls(**kw)
    except ValueError as e:
        if "rope_scaling" not in str(e):
            raise
        if "longrope" in str(e):  # Phi-3 before the longrope spelling: "su"
            cfg = cls(**dict(kw, rope_scaling=dict(kw["rope_scaling"], type="su")))
        else:
            print(f"{name}: this release rejects the config ({e})")
            return None
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


class Oracle:
    """Independent record of what attention used: hooked projections (pre-RoPE) and, per RoPE call,
    the modeling file's own apply_rotary_pos_emb on them with that call's cos/sin."""

    def __init__(self, model, plan):
        self.plan, self.calls, self.handles, self.pre, self.cur = plan, [], [], {}, None
        layers = hf.decoder_layers(model, plan.n_layers)
        self.ns = set()
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            self.ns.add(sys.modules[type(attn).__module__])
            self.handles.append(attn.register_forward_pre_hook(self._enter(i)))
            for kind in ("q", "k"):
                norm = getattr(attn, f"{kind}_norm", None)
                if norm is not None:
                    self.handles.append(norm.register_forward_hook(self._grab(i, kind)))
                elif hasattr(attn, f"{kind}_proj"):
                    self.handles.append(getattr(attn, f"{kind}_proj").register_forward_hook(self._grab(i, kind)))
            if not hasattr(attn, "q_proj") and hasattr(attn, "qkv_proj"):  # Phi-3: fused
                self.handles.append(attn.qkv_proj.register_forward_hook(self._grab_fused(i)))
        self.forwards = []
        self.originals = {}
        for ns in self.ns:
            self.originals[ns] = ns.apply_rotary_pos_emb
            ns.apply_rotary_pos_emb = self._wrap(ns.apply_rotary_pos_emb)

    def close(self):
        for h in self.handles:
            h.remove()
        for ns, fn in self.originals.items():
            ns.apply_rotary_pos_emb = fn

    def _enter(self, i):
        def hook(_m, _a):
            if i == 0:
                self.forwards.append({})
            self.cur = i
        return hook

    def _heads(self, x):
        if x.dim() == 4 and x.shape[1] < x.shape[2]:  # already [B, heads, T, D] (Gemma-3: q_norm after the
            return x.detach().clone()                 # transpose; here every prompt has more tokens than heads)
        b, t = x.shape[0], x.shape[1]
        return x.detach().clone().reshape(b, t, -1, D).transpose(1, 2)  # [B, heads, T, D]

    def _grab(self, i, kind):
        def hook(_m, _a, out):
            self.forwards[-1].setdefault(i, {})[kind] = self._heads(out)
        return hook

    def _grab_fused(self, i):
        def hook(_m, _a, out):
            nq, nk = self.plan.n_q_heads[i] * D, self.plan.n_kv_heads[i] * D
            self.forwards[-1].setdefault(i, {})["q"] = self._heads(out[..., :nq])
            self.forwards[-1].setdefault(i, {})["k"] = self._heads(out[..., nq:nq + nk])
        return hook

    def _wrap(self, fn):
        @functools.wraps(fn)
        def wrapper(q, k, cos, sin, *a, **kw):
            i = self.cur
            if not self.forwards or i is None:  # a call outside a forward (the glue's probe)
                return fn(q, k, cos, sin, *a, **kw)
            rec = self.forwards[-1].setdefault(i, {})
            if "q" in rec:  # independent: the hooked projections through the file's own RoPE function
                rec["post"] = tuple(x.detach().clone() for x in fn(rec["q"], rec["k"], cos, sin, *a, **kw))
            rec["cos_sin"] = (cos.detach().clone(), sin.detach().clone())
            return fn(q, k, cos, sin, *a, **kw)
        return wrapper


def manifest_rows(man, rope_extra, inv_freq, pre, positions):
    """Rows re-derived from the manifest's RoPE settings: pre [n, D] rows at positions [n]."""
    r = man.rope.rotary_dim or D
    h = r // 2
    a = np.arange(h)
    pa, pb = (a, a + h) if man.rope.pairing == "rotate_half" else (2 * a, 2 * a + 1)
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]
    c, s = np.cos(ang), np.sin(ang)
    out = pre.astype(np.float64).copy()
    x, y = pre[:, pa].astype(np.float64), pre[:, pb].astype(np.float64)
    out[:, pa], out[:, pb] = x * c - y * s, y * c + x * s
    out[:, :r] *= rope_extra
    return out


def inv_freq_of(man, model, cfg):
    r = man.rope.rotary_dim or D
    if man.rope.scaling in ("none", "linear"):
        inv = 1.0 / (man.rope.theta ** (np.arange(0, r, 2, dtype=np.float64) / r))
        return inv / (man.rope.scaling_factor if man.rope.scaling == "linear" else 1.0), "closed form"
    # other scalings: the frequencies of the model's own rotary module after the capture (its last forward;
    # LongRoPE's short/long choice and dynamic updates included), the one thing the manifest cannot hold
    tables = [m.inv_freq for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)
              and m.inv_freq.numel() == r // 2]
    if not tables:
        raise RuntimeError(f"no rotary module with an inv_freq of {r // 2} frequencies")
    return tables[0].double().numpy(), f"the model's {man.rope.scaling} inv_freq"


def run_arch(name, cls_name, kw, want, out_root):
    model = build(name, cls_name, kw)
    if model is None:
        return None
    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    prompts = os.path.join(out_root, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("\n".join(PROMPTS) + "\n")
    elig = want.get("eligibility", "all_layers")
    opts = ["--context", "64", "--scheme", "all", "--width", "8"]
    if want.get("long"):
        with open(prompts, "w") as f:
            f.write("".join(PROMPTS) * 40 + "\n" + PROMPTS[0] + "\n")
        opts = ["--context", "3000", "--scheme", "uniform", "--width", "16", "--rate", "1"]
    a = hf._args(["random-" + name, "-o", out, "--prompts", prompts, "--batch-size", "2", *opts,
                  "--eligibility", elig, "--dtype", "f32"])
    plan = hf.capture_plan_of(model.config)
    try:
        oracle = Oracle(model, plan)
    except hf.CaptureConfigError:  # no self_attn layers: the glue must refuse clearly (checked below)
        oracle = None
    try:
        hf.capture_loaded(model, CharTokenizer(), model.config, a, "random-" + name, "cpu")
    except hf.CaptureConfigError as e:
        left = os.path.exists(out) or any(n.startswith(f".{name}.partial") for n in os.listdir(out_root))
        if want.get("partial"):
            ok = ("rotates only a slice" in str(e) or "with a self_attn module" in str(e)) and "Recorder.record" in str(e) \
                and not left
            check(ok, f"{name}: partial-rotary refusal {str(e)[:200]!r}, output left: {left}")
            why = "partial rotary" if "rotates only a slice" in str(e) else "no self_attn"
            return dict(rows=f"refused ({why}){'' if ok else ' UNCLEAR'}", manifest="-", analysis="-", ok=ok,
                        msg=str(e)[:160])
        check(False, f"{name}: refused: {e}")
        return dict(rows="REFUSED", manifest="-", analysis="-", ok=False, msg=str(e)[:160])
    finally:
        if oracle is not None:
            oracle.close()
    man = qkgeom.read_manifest(out)
    with open(os.path.join(out, "manifest.json")) as f:
        raw = json.load(f)
    fwd = oracle.forwards
    bs = 2
    n_rows = n_bad = 0
    m_rows = m_bad = 0
    af = float((raw.get("rope") or {}).get("attention_factor", 1.0))
    inv, how = inv_freq_of(man, model, model.config)
    max_err = 0.0
    for h in qkgeom.planned_heads(man):
        for kind, head in (("q", h.q_head), ("k", h.k_head)):
            e = qkgeom.read_entry(out, man, h.layer, head, kind)
            pre_rows = []
            for row, pos, ex in zip(e["vectors"], e["position"], e["example_id"]):
                step, b = int(ex) // bs, int(ex) % bs
                rec = fwd[step][h.layer]
                pre = rec[kind][b, head, int(pos)]
                if man.rope_applied is None or man.rope_applied[h.layer]:
                    want_row = rec["post"][0 if kind == "q" else 1][b, head, int(pos)]
                else:
                    want_row = pre
                n_rows += 1
                if not np.array_equal(row, want_row.float().numpy()):
                    n_bad += 1
                pre_rows.append(pre.double().numpy())
            if man.rope_applied is None or man.rope_applied[h.layer]:
                got = manifest_rows(man, af, inv, np.stack(pre_rows), e["position"])
                err = np.abs(got - e["vectors"]).max() / max(1e-12, np.abs(e["vectors"]).max())
                max_err = max(max_err, float(err))
                m_rows += len(pre_rows)
                # float32 angles of the model's own cos/sin lose ~1e-7 x position; rows round to the dtype
                m_bad += int(err > max(1e-4, 4 * float(torch.finfo(DTYPE).eps)) + 1e-7 * float(e["position"].max()))
    check(n_bad == 0, f"{name}: {n_bad} of {n_rows} stored rows differ from the recomputation")
    facts = []
    want_w = want.get("windows", [None] * L)
    if want_w == "layer_types":  # the config's own list where the release writes one (5.x: pattern 4 by
        text = hf.text_config(model.config)  # default, whatever sliding_window_pattern says), else the pattern
        lt = getattr(text, "layer_types", None)
        want_w = [8 if t == "sliding_attention" else None for t in lt] if lt else pattern_sliding(8, 2)
    if want_w == "alternating":  # whichever parity the file slides (read here from its attention modules)
        parity = [getattr(layer.self_attn, "sliding_window", None) for layer in hf.decoder_layers(model, L)]
        want_w = parity if parity in (even_sliding(8), [None if w else 8 for w in even_sliding(8)]) else even_sliding(8)
        print(f"{name}: the modeling file slides layers {[i for i, w in enumerate(want_w) if w]}")
    facts.append(("sliding_window", man.sliding_window, want_w))
    want_applied = want.get("rope_applied", [True] * L)
    if want_applied == "sliding":  # Cohere2: RoPE on the sliding layers only
        want_applied = [w is not None for w in want_w]
    facts.append(("rope_applied", man.rope_applied, want_applied))
    facts.append(("pairing", man.rope.pairing, want.get("pairing", "rotate_half")))
    facts.append(("rotary_dim", man.rope.rotary_dim, want.get("rotary_dim", D)))
    facts.append(("scaling", man.rope.scaling, want.get("scaling", "none")))
    facts.append(("scaling_factor", man.rope.scaling_factor, want.get("factor", 1.0)))
    facts.append(("attention_factor", round(af, 9), round(want.get("attention_factor", 1.0), 9)))
    wrong = [f"{k} {g} != {w}" for k, g, w in facts if g != w]
    check(not wrong, f"{name}: manifest {wrong}")
    check(m_bad == 0, f"{name}: rows re-derived from the manifest differ (relative error {max_err:.3g}, {how})")
    run = qkgeom.analyze_dataset(out, jobs=1)
    n_planned, n_done = len(run.planned_heads), len(run.heads)
    check(n_done == n_planned and n_done > 0, f"{name}: analysed {n_done} of {n_planned} planned heads "
          f"({run.failures})")
    return dict(rows=f"{n_rows - n_bad}/{n_rows} equal", ok=not n_bad and not wrong and not m_bad,
                manifest=("right" if not wrong and not m_bad else f"WRONG {wrong}") + f" (re-derived {m_rows} rows, "
                f"rel. err {max_err:.1e}, {how})", analysis=f"{n_done}/{n_planned} heads",
                msg="")


def main():
    os.makedirs(WORK, exist_ok=True)
    print(f"transformers {transformers.__version__} ({os.path.dirname(transformers.__file__)}), torch {torch.__version__}")
    table = []
    for name, cls_name, kw, want in ARCHS:
        if ONLY and name not in ONLY:
            continue
        try:
            res = run_arch(name, cls_name, kw, want, WORK)
        except Exception as e:  # a crash is a failure of the glue, reported per architecture
            traceback.print_exc()
            check(False, f"{name}: {type(e).__name__}: {e}")
            res = dict(rows=f"ERROR {type(e).__name__}", manifest="-", analysis="-", ok=False, msg=str(e)[:160])
        if res is None:
            table.append((name, "not in this release", "", "", ""))
            continue
        table.append((name, res["rows"], res["manifest"], res["analysis"], res["msg"]))
    print(f"\n| architecture | rows equal | manifest right | analysis runs |  (transformers {transformers.__version__})")
    for row in table:
        print("| " + " | ".join(row[:4]) + " |" + (f"  {row[4]}" if row[4] else ""))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
