"""qkgeom.hf / qkgeom.transformerlens config parsing on configs shaped like the real ones
(CTest python.capture.hf_config; argv[1] = scratch folder).

The configs are SimpleNamespace copies of the fields the published config.json files carry
(transformers 5: rope_parameters, per layer type for Gemma-3; 4.4x: rope_theta + rope_scaling),
with the values of the real models (Llama-3.2-1B: theta 500000, llama3 scaling x32; Gemma-3:
local base 10000 / global 1e6 with linear x8, window 1024, one global layer in six; Qwen3 YaRN x4;
SmolLM3: every fourth layer NoPE). The manifest fields are written and read back through the C++
reader. No transformers needed.
"""

import os
import sys
from types import SimpleNamespace as NS

try:
    import numpy  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import check, finish, raises  # noqa: E402  (tests/python/capture/_checks.py)
import qkgeom
from qkgeom import hf, transformerlens as tl
from qkgeom.capture import manifest_for

WORK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-hf-config"


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def llama32_1b(v5=True):
    base = dict(num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, hidden_size=2048,
                head_dim=64, max_position_embeddings=131072)
    if v5:
        return NS(**base, rope_parameters=dict(LLAMA3_SCALING, rope_theta=500000.0))
    return NS(**base, rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING))


def gemma3_4b(v5=True):
    types = ["sliding_attention"] * 5 + ["full_attention"]
    text = dict(num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4, hidden_size=2560,
                head_dim=256, sliding_window=1024)
    if v5:
        text_cfg = NS(**text, layer_types=types * 2, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})
    else:
        text_cfg = NS(**text, sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                      rope_scaling={"rope_type": "linear", "factor": 8.0})
    return NS(text_config=text_cfg, vision_config=NS(num_hidden_layers=27, hidden_size=1152))


def qwen3_8b():
    return NS(num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, head_dim=128,
              use_sliding_window=False, sliding_window=None, max_window_layers=36,
              layer_types=["full_attention"] * 4, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def smollm3():
    return NS(num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, hidden_size=2048,
              use_sliding_window=False, sliding_window=None, layer_types=["full_attention"] * 8,
              no_rope_layers=[1, 1, 1, 0] * 2, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0})


def ministral3_wrapper():
    text = NS(num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8, hidden_size=3072, head_dim=128,
              sliding_window=None, rope_parameters={"rope_type": "yarn", "factor": 16.0, "rope_theta": 1000000.0,
                                                    "original_max_position_embeddings": 16384})
    return NS(text_config=text, vision_config=NS(num_hidden_layers=24))


def roundtrip(name, plan, heads=None, head_count=None):
    """manifest_for -> write_manifest -> read_manifest; returns the manifest read back."""
    layout = qkgeom.ModelLayout(plan.head_dim, plan.n_q_heads, plan.n_kv_heads, plan.sliding_window)
    hs = qkgeom.sample_heads(layout, head_count, 0, "full_attention_only") if heads is None else heads
    m = manifest_for(layout, model=name, buckets=qkgeom.BucketSpec("uniform", 128, 1.0), context_length=4096,
                     head_count=head_count, rope=hf.manifest_rope(plan, hs), rope_applied=plan.rope_applied)
    out = os.path.join(WORK, name)
    os.makedirs(out, exist_ok=True)
    qkgeom.write_manifest(out, m)
    return qkgeom.read_manifest(out), hs


def test_llama3():
    for v5 in (True, False):
        plan = hf.capture_plan_of(llama32_1b(v5))
        r = plan.rope[0]
        check((r["theta"], r["scaling"], r["scaling_factor"], r["rotary_dim"]) == (500000.0, "llama3", 32.0, 64),
              f"Llama-3.2 v5={v5}: rope {r}")
        check(plan.sliding_window == [None] * 16 and plan.n_kv_heads == [8] * 16, f"Llama-3.2 v5={v5}: layout")
        m, _ = roundtrip(f"llama-v5-{v5}", plan)
        check((m.rope.theta, m.rope.scaling, m.rope.scaling_factor) == (500000.0, "llama3", 32.0),
              f"Llama-3.2 v5={v5}: manifest rope read back")
        check(m.rope_applied == [True] * 16, f"Llama-3.2 v5={v5}: rope_applied {m.rope_applied}")
    raises(lambda: hf.capture_plan_of(NS(num_hidden_layers=2, num_attention_heads=4, hidden_size=64)),
           "rope_theta", "no RoPE settings: refused, never a default")
    raises(lambda: hf.capture_plan_of(NS(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                                         rope_parameters={"rope_type": "default"})),
           "rope_theta missing", "rope_parameters without rope_theta")


def test_gemma3():
    for v5 in (True, False):
        plan = hf.capture_plan_of(gemma3_4b(v5))
        want_w = ([1024] * 5 + [None]) * 2
        check(plan.sliding_window == want_w, f"Gemma-3 v5={v5}: windows {plan.sliding_window}")
        check(plan.rope[5]["theta"] == 1e6 and plan.rope[5]["scaling"] == "linear" and
              plan.rope[5]["scaling_factor"] == 8.0, f"Gemma-3 v5={v5}: global rope {plan.rope[5]}")
        check(plan.rope[0]["theta"] == 10000.0 and plan.rope[0]["scaling"] == "none",
              f"Gemma-3 v5={v5}: local rope {plan.rope[0]}")
        m, hs = roundtrip(f"gemma3-v5-{v5}", plan)  # full_attention_only: layers 5 and 11
        check(sorted({h.layer for h in hs}) == [5, 11], f"Gemma-3: eligible layers {sorted({h.layer for h in hs})}")
        check(m.sliding_window == want_w and m.rope.theta == 1e6, f"Gemma-3 v5={v5}: manifest windows / rope")
        mixed = [qkgeom.HeadId(0, 0, 0), qkgeom.HeadId(5, 0, 0)]
        raises(lambda: hf.manifest_rope(plan, mixed), "different RoPE settings", "Gemma-3 plan over both layer types")


def test_qwen3_yarn_override():
    cfg = qwen3_8b()
    hf.apply_overrides(cfg, ['rope_parameters={"rope_type":"yarn","factor":4.0,'
                             '"original_max_position_embeddings":32768,"rope_theta":1000000.0}'])
    r = hf.capture_plan_of(cfg).rope[0]
    check((r["scaling"], r["scaling_factor"], r["theta"]) == ("yarn", 4.0, 1e6), f"Qwen3 YaRN x4: {r}")
    cfg2 = qwen3_8b()
    hf.apply_overrides(cfg2, ['rope_parameters.rope_type="yarn"', "rope_parameters.factor=4"])
    r2 = hf.capture_plan_of(cfg2).rope[0]
    check((r2["scaling"], r2["scaling_factor"]) == ("yarn", 4.0), f"Qwen3 dotted override: {r2}")
    raises(lambda: hf.apply_overrides(qwen3_8b(), ["no_equals_sign"]), "key=value", "malformed override")
    plan = hf.capture_plan_of(qwen3_8b())
    check(plan.sliding_window == [None] * 4, "Qwen3 use_sliding_window=False: no windows")
    qwen2 = NS(num_hidden_layers=4, num_attention_heads=4, hidden_size=64, use_sliding_window=True,
               sliding_window=4096, max_window_layers=2, rope_theta=10000.0)
    check(hf.capture_plan_of(qwen2).sliding_window == [None, None, 4096, 4096], "Qwen2 max_window_layers")


def test_smollm3_nope():
    plan = hf.capture_plan_of(smollm3())
    check(plan.rope_applied == [True, True, True, False] * 2, f"SmolLM3 rope_applied {plan.rope_applied}")
    m, _ = roundtrip("smollm3", plan)
    check(m.rope_applied == [True, True, True, False] * 2, f"SmolLM3 manifest rope_applied {m.rope_applied}")
    check(m.rope.theta == 5000000.0, f"SmolLM3 rope theta {m.rope.theta}")


def test_multimodal():
    plan = hf.capture_plan_of(ministral3_wrapper())
    check(plan.n_layers == 4 and plan.head_dim == 128, "Ministral-3 wrapper: the text config's layout")
    check(plan.rope[0]["scaling"] == "yarn" and plan.rope[0]["scaling_factor"] == 16.0, f"Ministral-3 rope {plan.rope[0]}")
    mllama = NS(text_config=NS(num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                               rope_theta=500000.0, cross_attention_layers=[3]))
    mplan = hf.capture_plan_of(mllama)
    raises(lambda: hf.check_plan(mplan, [qkgeom.HeadId(3, 0, 0)]), "cross-attention layers [3]",
           "Llama-3.2-Vision cross-attention head")
    hf.check_plan(mplan, [qkgeom.HeadId(2, 0, 0)])


def test_transformerlens():
    raises(lambda: tl.check_context(2048, 4096), "exceeds cfg.n_ctx = 2048", "TL context beyond n_ctx")
    tl.check_context(2048, 2048)
    raises(lambda: tl.check_grouping(NS(ungroup_grouped_query_attention=True)), "ungroup_grouped_query_attention",
           "TL ungrouped keys")
    tl.check_grouping(NS(ungroup_grouped_query_attention=False))
    cfg = NS(positional_embedding_type="rotary", n_layers=2, n_heads=8, n_key_value_heads=2, d_head=16,
             rotary_base=500000.0, rotary_dim=16, use_NTK_by_parts_rope=True, NTK_by_parts_factor=32.0,
             attn_types=["global", "local"], window_size=4096)
    p = tl.plan_of_cfg(cfg)
    check(p.sliding_window == [None, 4096] and p.rope["scaling"] == "llama3" and p.n_kv_heads == [2, 2],
          f"TL legacy plan {p}")
    raises(lambda: tl.plan_of_cfg(NS(**dict(cfg.__dict__, rotary_base=None))), "rotary_base", "TL without rotary_base")


def main():
    os.makedirs(WORK, exist_ok=True)
    for t in (test_llama3, test_gemma3, test_qwen3_yarn_override, test_smollm3_nope, test_multimodal,
              test_transformerlens):
        t()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
