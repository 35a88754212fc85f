"""qkgeom.hf.HFCapture on a model shaped like a transformers Llama/SmolLM3 (CTest
python.capture.hf_glue; argv[1] = scratch folder).

transformers is not installed here, so the model is a stand-in with the structure the glue relies
on (assumptions A1-A3, A7 of qkgeom/hf.py): a modeling module (registered in sys.modules) with a
module-level apply_rotary_pos_emb that the attention forward looks up at call time, attention
modules with layer_idx / q_proj / k_proj under model.model.layers[i].self_attn, a NoPE layer
(SmolLM3 no_rope_layers) that never calls RoPE, and a forward taking logits_to_keep. Each
attention stashes the q/k it actually used; the dataset the glue writes must hold exactly those
rows at the sampler's tokens (padding excluded). This checks the glue's plumbing, not
transformers itself (still untested, docs/capture-recipes.md).
"""

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
from _checks import check, finish, raises  # noqa: E402  (tests/python/capture/_checks.py)
import qkgeom
from qkgeom import hf
from qkgeom.capture import Recorder, manifest_for

WORK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-hf-glue"

MODELING = '''
import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class FakeAttention(nn.Module):
    def __init__(self, cfg, idx):
        super().__init__()
        self.layer_idx, self.head_dim, self.use_rope = idx, cfg.head_dim, bool(cfg.no_rope_layers[idx])
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=False)

    def forward(self, hidden_states, position_embeddings):
        b, t, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
        if self.use_rope:
            q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        self.used = (q.detach().clone(), k.detach().clone())
        return torch.tanh(hidden_states + q.transpose(1, 2).reshape(b, t, -1)[..., : hidden_states.shape[-1]])


class FakeLayer(nn.Module):
    def __init__(self, cfg, idx):
        super().__init__()
        self.self_attn = FakeAttention(cfg, idx)


class FakeModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(50, cfg.hidden_size)
        self.layers = nn.ModuleList(FakeLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))

    def forward(self, input_ids, position_ids):
        h = self.embed(input_ids)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        for layer in self.layers:
            h = layer.self_attn(h, (emb.cos(), emb.sin()))
        return h


class FakeForCausalLM(nn.Module):
    base_model_prefix = "model"

    def __init__(self, cfg):
        super().__init__()
        self.config, self.model = cfg, FakeModel(cfg)
        self.calls = []

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=True, logits_to_keep=0):
        self.calls.append(dict(logits_to_keep=logits_to_keep, use_cache=use_cache))
        h = self.model(input_ids, position_ids)
        return h[:, -logits_to_keep:] if logits_to_keep else h
'''


def modeling():
    mod = types.ModuleType("fake_modeling_smollm3")
    sys.modules[mod.__name__] = mod
    exec(compile(MODELING, mod.__name__, "exec"), mod.__dict__)  # noqa: S102  (the test's own source)
    return mod


CFG = NS(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, hidden_size=16, head_dim=4,
         no_rope_layers=[1, 1, 0, 1], use_sliding_window=False, sliding_window=None,
         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
SPEC = qkgeom.BucketSpec("uniform", 2, 1.0)
SEED, CTX, B, T = 3, 32, 2, 12


def expected_rows(layer, kind, x, mask, pos, ex, head):
    valid = [(b, t) for b in range(B) for t in range(T) if mask[b, t]]
    vpos = np.array([int(pos[b, t]) for b, t in valid], dtype=np.int64)
    vex = np.array([int(ex[b]) for b, _ in valid], dtype=np.int64)
    kept = qkgeom.TokenSampler(SPEC, SEED).select(vpos, vex, layer, kind)
    return (np.stack([x[valid[i][0], head, valid[i][1]].numpy() for i in kept]).astype(np.float64),
            vpos[kept], vex[kept])


def capture(model, out):
    plan = hf.capture_plan_of(model.config)
    layout = qkgeom.ModelLayout(plan.head_dim, plan.n_q_heads, plan.n_kv_heads, plan.sliding_window)
    m = manifest_for(layout, model="fake", buckets=SPEC, context_length=CTX, seed=SEED,
                     rope=hf.manifest_rope(plan, qkgeom.sample_heads(layout, None)), rope_applied=plan.rope_applied)
    shutil.rmtree(out, ignore_errors=True)
    rec = Recorder(layout, buckets=SPEC, seed=SEED, sink=qkgeom.DatasetWriter(out, m), context_length=CTX,
                   rope_applied=plan.rope_applied)
    gen = torch.Generator().manual_seed(9)
    used = []
    with hf.HFCapture(model, rec, plan) as cap:
        for step in range(2):
            ids = torch.randint(0, 50, (B, T), generator=gen)
            mask = torch.ones(B, T, dtype=torch.long)
            mask[1, 8 - 3 * step:] = 0  # right padding
            cap.run(ids, mask, "cpu")
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            used.append((mask, pos, np.arange(B) + B * step,
                         [layer.self_attn.used for layer in model.model.layers]))
    rec.close()
    return used


def test_glue():
    mod = modeling()
    torch.manual_seed(0)
    model = mod.FakeForCausalLM(CFG)
    out = os.path.join(WORK, "ds")
    used = capture(model, out)
    check(all(c == dict(logits_to_keep=1, use_cache=False) for c in model.calls), f"forward calls {model.calls}")
    check(mod.apply_rotary_pos_emb.__name__ == "apply_rotary_pos_emb", "apply_rotary_pos_emb restored")
    man = qkgeom.read_manifest(out)
    check(man.rope_applied == [True, True, False, True], f"rope_applied {man.rope_applied}")
    for layer in range(4):
        for kind, n in (("q", 4), ("k", 2)):
            for head in range(n):
                e = qkgeom.read_entry(out, man, layer, head, kind)
                parts = [expected_rows(layer, "query" if kind == "q" else "key", u[3][layer][0 if kind == "q" else 1],
                                       u[0], u[1], u[2], head) for u in used]
                v = np.concatenate([p[0] for p in parts])
                check(np.array_equal(e["vectors"], v), f"l{layer}h{head}{kind}: rows differ from the q/k attention used")
                check(np.array_equal(e["position"], np.concatenate([p[1] for p in parts])),
                      f"l{layer}h{head}{kind}: positions")


def test_refusals():
    mod = modeling()
    model = mod.FakeForCausalLM(CFG)
    model.model.layers[1].self_attn.use_rope = False  # a RoPE layer that never calls the function
    raises(lambda: capture(model, os.path.join(WORK, "missing")), "planned layers [1] were never recorded",
           "a planned RoPE layer without a RoPE call")
    check(not os.path.exists(os.path.join(WORK, "missing", "manifest.json")), "refused capture left no manifest")
    model2 = mod.FakeForCausalLM(CFG)
    model2.model.layers[2].self_attn.q_norm = torch.nn.Identity()
    raises(lambda: capture(model2, os.path.join(WORK, "qnorm")), "q_norm", "NoPE layer with q_norm")


class FakeTokenizer:
    """Characters -> ids (mod 50), right padding, truncation at max_length: the calls capture_loaded makes."""
    pad_token, eos_token, padding_side = None, "</s>", "left"

    def __call__(self, texts, return_tensors, padding, truncation, max_length):
        ids = [[ord(c) % 50 for c in t][:max_length] for t in texts]
        n = max(len(x) for x in ids)
        mask = torch.tensor([[1] * len(x) + [0] * (n - len(x)) for x in ids])
        return {"input_ids": torch.tensor([x + [0] * (n - len(x)) for x in ids]), "attention_mask": mask}


def test_cli_path():
    """hf.capture_loaded (what python3 -m qkgeom.hf runs after loading) with the CLI's own options."""
    mod = modeling()
    torch.manual_seed(1)
    model = mod.FakeForCausalLM(CFG)
    prompts = os.path.join(WORK, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("the first example\n\nsecond\na third, longer example that is cut at the context\n")
    out = os.path.join(WORK, "cli")
    shutil.rmtree(out, ignore_errors=True)
    a = hf._args(["fake", "-o", out, "--prompts", prompts, "--context", "16", "--batch-size", "2",
                  "--heads", "3", "--scheme", "all", "--width", "4"])
    tok = FakeTokenizer()
    hf.capture_loaded(model, tok, model.config, a, "fake@rev", "cpu")
    check(tok.padding_side == "right" and tok.pad_token == "</s>", "tokenizer set to right padding")
    man = qkgeom.read_manifest(out)
    heads = qkgeom.planned_heads(man)
    check(man.model == "fake@rev" and man.context_length == 16 and len(heads) == 3, f"manifest {man} {heads}")
    check(man.heads is not None and man.heads.count == 3, "head sampling recorded")
    h = heads[0]
    e = qkgeom.read_entry(out, man, h.layer, h.q_head, "q")
    # scheme all: every real token kept; 3 examples of 16 + 6 + 16 tokens (the third cut at 16)
    check(len(e["position"]) == 16 + 6 + 16, f"rows {len(e['position'])} != 38 (padding excluded, context cut)")
    check(sorted(set(e["example_id"].tolist())) == [0, 1, 2], f"example ids {sorted(set(e['example_id'].tolist()))}")


def main():
    os.makedirs(WORK, exist_ok=True)
    test_glue()
    test_refusals()
    test_cli_path()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
