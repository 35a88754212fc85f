"""The qkgeom.hf / qkgeom.transformerlens fixes of issue 32, without transformers (CTest
python.capture.hf_fixes; argv[1] = scratch folder).

Each case plants the structure of a real modeling file that the glue got wrong (the rule is quoted
from that file) in a stand-in module registered in sys.modules, runs the glue as the CLI does
(hf.capture_loaded with the CLI's options), and checks the dataset against what attention actually
used, or the refusal's message. Every case fails on the glue before issue 32:

  gemma2      4.42-4.52 configs have no layer_types; Gemma2DecoderLayer.is_sliding = not bool(layer_idx % 2):
              windows on even layers only (was: every layer sliding, default eligibility refused)
  cohere      rotate_half pairs (2i, 2i+1) (torch.stack([-x2, x1], -1).flatten(-2)): pairing "interleaved",
              read from the file's own apply_rotary_pos_emb (was: "rotate_half", exit 0)
  cohere2     full-attention layers skip RoPE (``if self.sliding_window is not None``): recorded pre-RoPE,
              rope_applied false (was: refused, "never recorded")
  longrope    Phi-3 configs carry no factor: scaling_factor = max / original positions; cos/sin scaled by
              the attention factor: rope.attention_factor in manifest.json (was: factor 1, unrecorded)
  rows check  rows that contradict the recorded settings stop the capture (wrong pairing, wrong factor)
  loading     only "Unrecognized configuration class" falls back to AutoModelForImageTextToText (also
              through main() with a stand-in transformers module)
  partial     StableLM/Phi-style slice at the call site: a clear refusal; a file that rotates the first r
              coordinates of the whole head: captured with rope.rotary_dim = r (was: a raw traceback)
  bridge      TransformerLens' bridge: refused before loading, naming qkgeom.hf and --legacy
  messages    refusals name options the command has (was: --layers); a failed run leaves nothing at -o
"""

import json
import math
import os
import shutil
import sys
import types
from types import SimpleNamespace as NS

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import check, finish, raises  # noqa: E402
import qkgeom  # noqa: E402
from qkgeom import hf, transformerlens  # noqa: E402

WORK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-hf-fixes"
D = 8

MODELING = '''
import torch
from torch import nn

PAIRING = "half"      # "half": (i, i + r/2) as Llama; "interleaved": (2i, 2i+1) as Cohere
PARTIAL = "none"      # "none"; "slice": the caller passes q[..., :r] (StableLM/Phi); "whole": the function splits


def rotate_half(x):
    if PAIRING == "half":
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if PARTIAL == "whole":
        r = cos.shape[-1]
        qr, qp, kr, kp = q[..., :r], q[..., r:], k[..., :r], k[..., r:]
        return (torch.cat([qr * cos + rotate_half(qr) * sin, qp], -1),
                torch.cat([kr * cos + rotate_half(kr) * sin, kp], -1))
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    def __init__(self, cfg, idx, sliding, uses_rope):
        super().__init__()
        self.layer_idx, self.head_dim, self.uses_rope, self.r = idx, cfg.head_dim, uses_rope, cfg.rotary
        self.sliding_window = cfg.sliding_window if sliding else None
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=False)

    def forward(self, h, position_embeddings):
        b, t, _ = h.shape
        q = self.q_proj(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        if self.uses_rope:
            cos, sin = position_embeddings
            if PARTIAL == "slice":
                qr, kr = apply_rotary_pos_emb(q[..., : self.r], k[..., : self.r], cos, sin)
                q, k = torch.cat([qr, q[..., self.r:]], -1), torch.cat([kr, k[..., self.r:]], -1)
            else:
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
        self.used = (q.detach().clone(), k.detach().clone())
        return torch.tanh(h + q.transpose(1, 2).reshape(b, t, -1)[..., : h.shape[-1]])


class Layer(nn.Module):
    def __init__(self, cfg, idx):
        super().__init__()
        sliding = cfg.sliding_layers[idx]
        self.is_sliding = sliding
        self.sliding_window = cfg.sliding_window  # on every layer, as Gemma2DecoderLayer: not the layer's window
        self.self_attn = Attention(cfg, idx, sliding, cfg.rope_layers[idx])


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(60, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        r = cfg.rotary
        self.inv_freq = 1.0 / (cfg.theta ** (torch.arange(0, r, 2).float() / r)) / cfg.linear
        self.attention_scaling = cfg.attention_scaling

    def forward(self, input_ids, position_ids):
        h = self.embed(input_ids)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), -1) if PAIRING == "half" else torch.repeat_interleave(freqs, 2, dim=-1)
        pe = (emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling)
        for layer in self.layers:
            h = layer.self_attn(h, pe)
        return h


class ForCausalLM(nn.Module):
    base_model_prefix = "model"

    def __init__(self, cfg, fake):
        super().__init__()
        self.config, self.model = cfg, Model(fake)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=True, logits_to_keep=0):
        h = self.model(input_ids, position_ids)
        return h[:, -logits_to_keep:] if logits_to_keep else h
'''
_COUNT = [0]


def modeling(pairing="half", partial="none"):
    _COUNT[0] += 1
    mod = types.ModuleType(f"fake_modeling_{_COUNT[0]}")
    sys.modules[mod.__name__] = mod
    exec(compile(MODELING, mod.__name__, "exec"), mod.__dict__)  # noqa: S102  (the test's own source)
    mod.PAIRING, mod.PARTIAL = pairing, partial
    return mod


def model_of(mod, config, n_layers=4, sliding_layers=None, rope_layers=None, rotary=D, theta=10000.0, linear=1.0,
             attention_scaling=1.0, window=8):
    fake = NS(num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2, hidden_size=16, head_dim=D,
              sliding_window=window, sliding_layers=sliding_layers or [False] * n_layers,
              rope_layers=rope_layers or [True] * n_layers, rotary=rotary, theta=theta, linear=linear,
              attention_scaling=attention_scaling)
    torch.manual_seed(0)
    return mod.ForCausalLM(config, fake)


class Tok:
    pad_token, eos_token, padding_side = None, "</s>", "left"

    def __call__(self, texts, return_tensors, padding, truncation, max_length):
        ids = [[ord(c) % 60 for c in t][:max_length] for t in texts]
        n = max(len(x) for x in ids)
        return {"input_ids": torch.tensor([x + [0] * (n - len(x)) for x in ids]),
                "attention_mask": torch.tensor([[1] * len(x) + [0] * (n - len(x)) for x in ids])}


PROMPT_TEXT = ["a first example that is long enough", "second one", "the third example of the set"]


def run(model, name, *extra):
    """hf.capture_loaded as python3 -m qkgeom.hf runs it; returns (out folder, the attention's last q/k)."""
    out = os.path.join(WORK, name)
    shutil.rmtree(out, ignore_errors=True)
    prompts = os.path.join(WORK, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("\n".join(PROMPT_TEXT) + "\n")
    a = hf._args(["fake", "-o", out, "--prompts", prompts, "--context", "48", "--batch-size", "3", "--scheme", "all",
                  "--width", "4", *extra])
    hf.capture_loaded(model, Tok(), model.config, a, name, "cpu")
    return out


def stored_equals_used(model, out, what):
    """The dataset (one batch of 3, scheme all) holds exactly the q/k each attention used."""
    man = qkgeom.read_manifest(out)
    enc = Tok()(PROMPT_TEXT, "pt", True, True, 48)
    mask = enc["attention_mask"]
    n = 0
    for h in qkgeom.planned_heads(man):
        used = model.model.layers[h.layer].self_attn.used
        for kind, head, x in (("q", h.q_head, used[0]), ("k", h.k_head, used[1])):
            e = qkgeom.read_entry(out, man, h.layer, head, kind)
            want = np.stack([x[int(ex), head, int(p)].numpy() for ex, p in zip(e["example_id"], e["position"])])
            check(np.array_equal(e["vectors"], want), f"{what}: l{h.layer}h{head}{kind} rows differ from attention's")
            check(len(e["position"]) == int(mask.sum()), f"{what}: l{h.layer}h{head}{kind}: {len(e['position'])} rows")
            n += 1
    check(n > 0, f"{what}: no entries")
    return man


def llama_like(**kw):
    base = dict(model_type="llama", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                hidden_size=16, head_dim=D, rope_theta=10000.0, max_position_embeddings=4096)
    base.update(kw)
    return NS(**base)


def test_gemma2():
    cfg = llama_like(model_type="gemma2", sliding_window=8)  # a 4.42-4.52 Gemma-2 config: no layer_types
    plan = hf.capture_plan_of(cfg)
    check(plan.sliding_window == [8, None, 8, None], f"gemma2 config windows {plan.sliding_window} (even layers slide)")
    mod = modeling()
    model = model_of(mod, cfg, sliding_layers=[True, False, True, False])
    out = run(model, "gemma2")  # default eligibility: the full layers 1 and 3
    man = stored_equals_used(model, out, "gemma2")
    check(man.sliding_window == [8, None, 8, None], f"gemma2 manifest windows {man.sliding_window}")
    check(sorted({h.layer for h in qkgeom.planned_heads(man)}) == [1, 3], "gemma2: full layers planned")
    # the loaded modules decide where the config says nothing layer-wise (a config without model_type)
    plan = hf.capture_plan_of(llama_like(sliding_window=8, use_sliding_window=True))
    check(plan.sliding_window == [8] * 4, "model-wide window from the config alone")
    notes = hf.refine_plan(plan, model, model.config)
    check(plan.sliding_window == [8, None, 8, None] and len(notes) == 2, f"refine_plan windows {plan.sliding_window}")


def test_cohere():
    cfg = llama_like(model_type="cohere")
    check(hf.capture_plan_of(cfg).rope[0]["pairing"] == "interleaved", "cohere config prior: interleaved")
    mod = modeling("interleaved")
    check(hf.probe_rope_function(mod.apply_rotary_pos_emb, D, D, "m") == "interleaved", "probe: interleaved")
    check(hf.probe_rope_function(modeling("half").apply_rotary_pos_emb, D, D, "m") == "rotate_half", "probe: half")
    # a model_type the glue has no prior for: the modeling file's own function decides
    model = model_of(mod, llama_like(model_type="some-cohere-derivative"))
    out = run(model, "cohere")
    man = stored_equals_used(model, out, "cohere")
    check(man.rope.pairing == "interleaved", f"cohere manifest pairing {man.rope.pairing}")
    # HFCapture with a plan that still says rotate_half refuses before any row is written
    plan = hf.capture_plan_of(llama_like())
    layout = qkgeom.ModelLayout(D, plan.n_q_heads, plan.n_kv_heads, plan.sliding_window)
    rec = qkgeom.Recorder(layout, buckets=qkgeom.BucketSpec("all", 4, 1.0), context_length=48)
    raises(lambda: hf.HFCapture(model, rec, plan).__enter__(), "pairs 'interleaved'", "plan with the wrong pairing")


def test_cohere2():
    cfg = llama_like(model_type="cohere2", sliding_window=8, sliding_window_pattern=4)
    plan = hf.capture_plan_of(cfg)
    check(plan.rope_applied == [True, True, True, False], f"cohere2 rope_applied {plan.rope_applied}")
    check(plan.sliding_window == [8, 8, 8, None], f"cohere2 windows {plan.sliding_window}")
    mod = modeling("interleaved")
    model = model_of(mod, cfg, sliding_layers=[True, True, True, False], rope_layers=[True, True, True, False])
    out = run(model, "cohere2", "--eligibility", "all_layers")
    man = stored_equals_used(model, out, "cohere2")
    check(man.rope_applied == [True, True, True, False] and man.rope.pairing == "interleaved",
          f"cohere2 manifest rope_applied {man.rope_applied}, pairing {man.rope.pairing}")
    # a layer recorded as NoPE that calls RoPE stops the run
    model2 = model_of(modeling("interleaved"), cfg, sliding_layers=[True, True, True, False])
    raises(lambda: run(model2, "cohere2-wrong", "--eligibility", "all_layers"), "recorded as a NoPE layer",
           "NoPE layer calling RoPE")


def test_longrope_yarn():
    cfg = llama_like(model_type="phi3", max_position_embeddings=131072, original_max_position_embeddings=4096,
                     rope_scaling={"type": "longrope", "short_factor": [1.0] * (D // 2), "long_factor": [2.0] * (D // 2)})
    r = hf.capture_plan_of(cfg).rope[0]
    want_af = math.sqrt(1 + math.log(32.0) / math.log(4096))
    check(r["scaling"] == "longrope" and r["scaling_factor"] == 32.0, f"longrope factor {r}")
    check(abs(r["attention_factor"] - want_af) < 1e-12, f"longrope attention factor {r['attention_factor']} vs {want_af}")
    model = model_of(modeling(), cfg, attention_scaling=want_af)
    out = run(model, "longrope")
    man = stored_equals_used(model, out, "longrope")
    with open(os.path.join(out, "manifest.json")) as f:
        raw = json.load(f)
    check(man.rope.scaling_factor == 32.0, f"longrope manifest factor {man.rope.scaling_factor}")
    check(abs(raw["rope"].get("attention_factor", 1.0) - want_af) < 1e-12,
          f"manifest.json rope.attention_factor {raw['rope'].get('attention_factor')}")
    yarn = llama_like(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})
    check(abs(hf.capture_plan_of(yarn).rope[0]["attention_factor"] - (0.1 * math.log(4) + 1)) < 1e-12, "yarn x4 factor")
    # rows scaled by a factor the settings do not give: refused, nothing written
    model2 = model_of(modeling(), llama_like(), attention_scaling=1.14)
    raises(lambda: run(model2, "scaled-unrecorded"), "scales the rows by 1.14", "unrecorded attention factor")
    check(not os.path.exists(os.path.join(WORK, "scaled-unrecorded")), "refused run left no output folder")
    # rows whose angles contradict theta: refused
    model3 = model_of(modeling(), llama_like(), theta=500.0)
    raises(lambda: run(model3, "wrong-theta"), "rope.theta = 10000.0", "rows contradicting theta")


class FakeTransformers:
    """AutoModelForCausalLM / AutoModelForImageTextToText with scripted outcomes."""

    def __init__(self, causal, image):
        self.tried = []

        def auto(name, outcome):
            def from_pretrained(model, **kw):
                self.tried.append(name)
                if isinstance(outcome, Exception):
                    raise outcome
                return outcome
            return NS(from_pretrained=from_pretrained)
        self.AutoModelForCausalLM = auto("causal", causal)
        self.AutoModelForImageTextToText = auto("image", image)


def test_loading():
    real = ValueError("Trying to set a tensor of shape [8, 16] in 'weight' (which has shape [4, 16]), this looks incorrect")
    t = FakeTransformers(real, "image-model")
    raises(lambda: hf.load_model(t, "m", {}), "this looks incorrect", "a real loading error surfaces")
    check(t.tried == ["causal"], f"no image-text retry after a real error: {t.tried}")
    unrec = ValueError("Unrecognized configuration class <class 'MllamaConfig'> for this kind of AutoModel: "
                       "AutoModelForCausalLM.")
    t = FakeTransformers(unrec, "image-model")
    check(hf.load_model(t, "m", {}) == "image-model" and t.tried == ["causal", "image"], "multimodal fallback")
    t = FakeTransformers(unrec, ValueError("Unrecognized configuration class ... AutoModelForImageTextToText"))
    raises(lambda: hf.load_model(t, "m", {}), "AutoModelForCausalLM: Unrecognized configuration class <class "
           "'MllamaConfig'>", "both messages when both fail")


def test_loading_cli():
    """The same through python3 -m qkgeom.hf's main(), with a stand-in transformers module."""
    real = ValueError("Error(s) in loading state_dict: size mismatch for model.embed_tokens.weight")
    t = FakeTransformers(real, "image-model")
    t.AutoConfig = NS(from_pretrained=lambda name, revision=None: llama_like())
    t.AutoTokenizer = NS(from_pretrained=lambda name, revision=None: Tok())
    saved = sys.modules.get("transformers")
    sys.modules["transformers"] = t
    try:
        raises(lambda: hf.main(["m", "-o", os.path.join(WORK, "cli-load"), "--prompts", "p.txt"]), "size mismatch",
               "main(): the real loading error surfaces", errors=(Exception,))
    finally:
        if saved is None:
            del sys.modules["transformers"]
        else:
            sys.modules["transformers"] = saved
    check(t.tried == ["causal"], f"main(): no image-text retry after a real error: {t.tried}")
    check(not os.path.exists(os.path.join(WORK, "cli-load")), "main(): failed load left no output folder")


def test_partial():
    cfg = llama_like(model_type="stablelm", partial_rotary_factor=0.5)
    check(hf.capture_plan_of(cfg).rope[0]["rotary_dim"] == D // 2, "partial_rotary_factor -> rotary_dim")
    model = model_of(modeling(partial="slice"), cfg, rotary=D // 2)
    out = os.path.join(WORK, "stablelm")
    raises(lambda: run(model, "stablelm"), "Recorder.record", "slice call site: refused with what to do")
    check(not os.path.exists(out), "refused partial-rotary run left no output folder")
    model2 = model_of(modeling(partial="whole"), cfg, rotary=D // 2)
    man = stored_equals_used(model2, run(model2, "neox-whole"), "whole-head partial rotary")
    check(man.rope.rotary_dim == D // 2, f"rotary_dim {man.rope.rotary_dim}")
    # GPT-NeoX 4.4x configs: rotary_pct and rotary_emb_base
    check(hf.capture_plan_of(llama_like(model_type="gpt_neox", rope_theta=None, rotary_emb_base=10000.0,
                                        rotary_pct=0.25)).rope[0]["rotary_dim"] == D // 4, "rotary_pct -> rotary_dim")


def test_bridge():
    raises(lambda: transformerlens.main(["m", "-o", os.path.join(WORK, "tl"), "--prompts", "p.txt"]),
           "python3 -m qkgeom.hf m", "bridge refused naming qkgeom.hf")
    raises(lambda: transformerlens.main(["m", "-o", os.path.join(WORK, "tl"), "--prompts", "p.txt"]), "--legacy",
           "bridge refusal names --legacy")


def test_messages():
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415
    import re  # noqa: PLC0415

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            hf._args(["--help"])
        except SystemExit:
            pass
    known = set(re.findall(r"--[a-z][a-z-]*", buf.getvalue()))
    check("--eligibility" in known, f"the command's options {sorted(known)}")
    gem = llama_like(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8,
                     rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                      "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
    plan = hf.capture_plan_of(gem)
    try:
        hf.manifest_rope(plan, [qkgeom.HeadId(0, 0, 0), qkgeom.HeadId(1, 0, 0)])
        check(False, "mixed RoPE plan not refused")
    except hf.CaptureConfigError as e:
        named = set(re.findall(r"--[a-z][a-z-]*", str(e)))
        check(named and named <= known, f"refusal names options {sorted(named)}; the command has {sorted(known)}")
    # a capture that fails after the writer started leaves nothing at -o (and no hidden partial folder)
    mod = modeling()
    model = model_of(mod, llama_like(), rope_layers=[True, False, True, True])
    raises(lambda: run(model, "failed"), "never recorded", "a planned RoPE layer without a RoPE call")
    left = [n for n in os.listdir(WORK) if n == "failed" or n.startswith(".failed.partial")]
    check(not left, f"failed run left {left}")
    # an existing non-empty output folder is refused before anything runs
    busy = os.path.join(WORK, "busy")
    os.makedirs(busy, exist_ok=True)
    with open(os.path.join(busy, "keep.txt"), "w") as f:
        f.write("x")
    a = hf._args(["fake", "-o", busy, "--prompts", os.path.join(WORK, "prompts.txt")])
    raises(lambda: hf.capture_loaded(model_of(modeling(), llama_like()), Tok(), llama_like(), a, "m", "cpu"),
           "exists and is not an empty folder", "non-empty -o refused")
    check(os.listdir(busy) == ["keep.txt"], "non-empty -o untouched")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK, exist_ok=True)
    for t in (test_gemma2, test_cohere, test_cohere2, test_longrope_yarn, test_loading, test_loading_cli, test_partial,
              test_bridge,
              test_messages):
        try:
            t()
        except Exception as e:  # noqa: BLE001  (a crash is one failed case; the others still run)
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            check(False, f"{t.__name__}: {type(e).__name__}: {e}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
