"""qkgeom.qk_sniffer.import_capture on in-memory record batches (CTest python.capture.qk_sniffer;
argv[1] = scratch folder). Everything but the pyarrow read (read_batches) is exercised.

The capture mimics qk-sniffer's production layout: log buckets with min width 8192 in the saver
state (not the default 128), head sampling metadata with the true head counts, layer 1 skipped as
a sliding-window layer (full_only), each entry delivered in two record batches (row groups).
"""

import json
import os
import shutil
import sys
from types import SimpleNamespace as NS

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import check, finish, raises  # noqa: E402  (tests/python/capture/_checks.py)
import qkgeom
from qkgeom import qk_sniffer as qs

WORK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-qk-sniffer"
D, L, NQ, NKV, CTX = 6, 3, 4, 2, 40000
SPEC = qkgeom.BucketSpec("log", 8192, 1.0)


def make_entries(seed=5):
    """{(layer, head, kind): [batch, batch]} for layers 0 and 2 (layer 1 skipped: sliding)."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in (0, 2):
        for kind, n in (("q", NQ), ("k", NKV)):
            for head in range(n):
                batches = []
                for _ in range(2):
                    m = int(rng.integers(3, 9))
                    pos = np.sort(rng.integers(0, CTX, m)).astype(np.int32)
                    batches.append({"bucket": qkgeom.bucket_of(SPEC, pos).astype(np.int32),
                                    "example_id": rng.integers(0, 50, m).astype(np.int32), "position": pos,
                                    "vector": rng.standard_normal((m, D)).astype(np.float32),
                                    "sliding_window": [None] * m})
                out[(layer, head, kind)] = batches
    return out


STATE = {"model_name": "HuggingFaceTB/SmolLM2-135M", "path": "mem/_saver_state.json", "metadata": {
    "sampling_strategy": "log", "sampling_min_bucket_size": 8192, "attention_scope": "full_only",
    "head_sampling_num_layers": L, "head_sampling_num_query_heads": NQ, "head_sampling_num_key_heads": NKV,
    "head_sampling_sliding_layer_count": 1}}
HF_PLAN = NS(n_layers=L, n_q_heads=[NQ] * L, n_kv_heads=[NKV] * L, head_dim=D, sliding_window=[None, 2048, None],
             rope=[{"pairing": "rotate_half", "rotary_dim": D, "theta": 10000.0, "scaling": "none",
                    "scaling_factor": 1.0}] * L, rope_applied=[True, True, False], cross_attention_layers=[])


def run(out, entries, **kw):
    shutil.rmtree(out, ignore_errors=True)
    args = dict(model="smollm2", context_length=CTX, rope_applied="post", state=STATE, rate=1.0)
    args.update(kw)
    return qs.import_capture(list(entries.items()), lambda batches: iter(batches), out, **args)


def test_import():
    entries = make_entries()
    out = os.path.join(WORK, "ok")
    raises(lambda: run(out, entries), "layers [1] have no entries", "skipped sliding layer without --hf-config")
    check(not os.path.exists(os.path.join(out, "manifest.json")), "refused import wrote no manifest")
    r = run(out, entries, hf_plan=HF_PLAN)
    m = qkgeom.read_manifest(out)
    check((m.buckets.scheme, m.buckets.width) == ("log", 8192), f"buckets from the state: {m.buckets}")
    check(m.token_sampler == "qk-sniffer", f"token_sampler {m.token_sampler}")
    check(m.sliding_window == [None, 2048, None], f"windows {m.sliding_window} (layer 1 is sliding, not full)")
    check(m.rope_applied == [True, True, False], f"rope_applied {m.rope_applied}")
    check(m.n_q_heads == [NQ] * L and m.n_kv_heads == [NKV] * L, "head counts from the state")
    check(m.heads is None, "no qkgeom head sampling claimed")
    q_entries = sorted((layer, head) for (layer, head, kind) in entries if kind == "q")
    check(m.head_list == q_entries, f"capture.heads {m.head_list} != the query entries {q_entries}")
    res = qkgeom.analyze_dataset(out, jobs=1)  # layer 1 skipped: planned = the 8 imported heads, none absent
    check(res.planned == len(q_entries) and not res.failures, f"analyze: planned {res.planned}, failures {res.failures}")
    total = 0
    for (layer, head, kind), batches in entries.items():
        e = qkgeom.read_entry(out, m, layer, head, kind)
        v = np.concatenate([b["vector"] for b in batches]).astype(np.float64)
        check(np.array_equal(e["vectors"], v), f"l{layer}h{head}{kind}: vectors")
        check(np.array_equal(e["position"], np.concatenate([b["position"] for b in batches])), "positions")
        check(np.array_equal(e["example_id"], np.concatenate([b["example_id"] for b in batches])), "example ids")
        total += len(v)
    check(r.rows == total, f"rows {r.rows} != {total}")
    pre = run(os.path.join(WORK, "pre"), entries, hf_plan=HF_PLAN, rope_applied="pre")
    check(list(pre.manifest.rope_applied) == [False] * L, "pre-RoPE capture marked rope_applied = false")
    st = {**STATE, "metadata": {**STATE["metadata"], "head_sampling_sliding_layer_count": 0}}
    run(os.path.join(WORK, "nosliding"), entries, state=st)  # the state says no layer slides: no config needed
    check(qkgeom.read_manifest(os.path.join(WORK, "nosliding")).sliding_window == [None] * L, "no sliding layers")


def test_refusals():
    entries = make_entries()
    out = os.path.join(WORK, "bad")
    raises(lambda: run(out, entries, rate=None), "--rate", "base_rate not recorded")
    raises(lambda: run(out, entries, width=128), "--width 128 contradicts", "width contradicting the state")
    raises(lambda: run(out, entries, rope_applied="maybe"), "--rope-applied", "pre/post not stated")
    raises(lambda: run(out, entries, state=None, hf_plan=HF_PLAN), "--scheme and --width", "no scheme anywhere")
    raises(lambda: run(out, entries, n_layers=3, n_q_heads=8, n_kv_heads=2, hf_plan=HF_PLAN), "disagree",
           "head counts disagree")
    nostate = {**STATE, "metadata": {"sampling_strategy": "log", "sampling_min_bucket_size": 8192}}
    raises(lambda: run(out, entries, state=nostate), "head counts unknown", "no head counts anywhere")
    bad = make_entries()
    bad[(2, 1, "q")][1]["bucket"] = bad[(2, 1, "q")][1]["bucket"] + 1
    raises(lambda: run(out, bad, hf_plan=HF_PLAN), "l02h01q: bucket[", "bucket inconsistent with position")
    sw = make_entries()
    sw[(0, 0, "k")][0]["sliding_window"] = [None] * (len(sw[(0, 0, "k")][0]["position"]) - 1) + [512]
    raises(lambda: run(out, sw, hf_plan=HF_PLAN), "l00h00k: sliding_window differs", "mixed windows in an entry")
    keys_only = {k: v for k, v in make_entries().items() if k[2] == "k"}
    raises(lambda: run(out, keys_only, hf_plan=HF_PLAN), "no query entry", "a capture without query entries")
    stray = make_entries()
    stray[(0, 5, "q")] = stray[(0, 0, "q")]
    raises(lambda: run(out, stray, hf_plan=HF_PLAN), "l00h05q: outside", "stray head")


def test_state_files():
    os.makedirs(WORK, exist_ok=True)
    new = os.path.join(WORK, "new_state.json")
    with open(new, "w") as f:
        json.dump({"model_name": "m", "model_metadata": {"sampling_strategy": "uniform",
                                                          "sampling_bucket_size": 8192}}, f)
    s = qs.read_saver_state(new)
    check(qs.buckets_from(s, None, None, 1.0) == ("uniform", 8192, 1.0), "new-layout state")
    old = os.path.join(WORK, "old_state.json")
    with open(old, "w") as f:
        json.dump({"model_metadata": {"google/gemma-3": {"sampling_strategy": "log",
                                                         "sampling_min_bucket_size": 128}},
                   "bucket_counts": {}}, f)
    s = qs.read_saver_state(old)
    check(s["model_name"] == "google/gemma-3" and qs.buckets_from(s, None, None, 2.0) == ("log", 128, 2.0),
          "old-layout state (metadata nested under the model name)")


def test_cli():
    """python3 -m qkgeom.qk_sniffer's main on a folder of entries (read_batches, the one pyarrow function,
    replaced by the in-memory batches), _saver_state.json in the parent and an HF config.json."""
    entries = make_entries(9)
    root = os.path.join(WORK, "sniffed")
    shutil.rmtree(root, ignore_errors=True)
    split = os.path.join(root, "HuggingFaceTB_SmolLM2-135M")  # the older split-folder layout
    by_path = {}
    for (layer, head, kind), batches in entries.items():
        d = os.path.join(split, f"l{layer:02d}h{head:02d}{kind}")
        os.makedirs(d)
        path = os.path.join(d, "data.parquet")
        open(path, "wb").close()
        by_path[path] = batches
    with open(os.path.join(root, "_saver_state.json"), "w") as f:
        json.dump({"model_name": "HuggingFaceTB/SmolLM2-135M", "model_metadata": STATE["metadata"]}, f)
    cfg = os.path.join(WORK, "config.json")
    with open(cfg, "w") as f:
        json.dump({"num_hidden_layers": L, "num_attention_heads": NQ, "num_key_value_heads": NKV, "head_dim": D,
                   "hidden_size": NQ * D, "rope_theta": 100000.0, "layer_types": ["full_attention",
                   "sliding_attention", "full_attention"], "sliding_window": 2048}, f)
    out = os.path.join(WORK, "cli")
    shutil.rmtree(out, ignore_errors=True)
    real = qs.read_batches
    qs.read_batches = lambda path, batch_rows=65536: iter(by_path[path])
    try:
        rc = qs.main([split, "-o", out, "--rope-applied", "post", "--context", str(CTX), "--rate", "1",
                      "--hf-config", cfg])
    finally:
        qs.read_batches = real
    m = qkgeom.read_manifest(out)
    check(rc == 0 and m.model == "HuggingFaceTB/SmolLM2-135M", f"cli: rc {rc}, model {m.model}")
    check(m.sliding_window == [None, 2048, None] and m.rope.theta == 100000.0, "cli: windows and rope from config.json")
    e = qkgeom.read_entry(out, m, 2, 1, "k")
    check(np.array_equal(e["vectors"], np.concatenate([b["vector"] for b in entries[(2, 1, "k")]]).astype(np.float64)),
          "cli: l02h01k rows")


def main():
    os.makedirs(WORK, exist_ok=True)
    test_import()
    test_cli()
    test_refusals()
    test_state_files()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
