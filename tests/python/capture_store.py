"""The capture store and dataset writer shared by the capture recipes.

A fake capture loop (random post-RoPE rows, several steps and examples) goes
through qkgeom_capture.CaptureStore (feed(), as scripts/capture_hf.py and
scripts/capture_transformerlens.py drive it, and the per-head add()), and is written in each format
(npy, npz, npz_compressed) and vector dtype (f32, f16, bf16). qkgeom reads the
dataset back (read_manifest, list_heads, read_head of every entry) and:
  * the manifest's sampled heads (C++ sample_heads) == the store's plan;
  * the entries are exactly the planned query heads and the key heads they read;
  * every entry's positions are the kept positions (C++ == Python sampler) and
    its rows are the fed rows at those positions (exact for f32; rounded as
    NumPy rounds for f16, round-to-nearest-even for bf16);
  * rope, sliding_window and the capture block round-trip.
"""

import os

from _common import Checks, run, setup

args = setup(__doc__)
import numpy as np  # noqa: E402
import qkgeom_capture as qc  # noqa: E402

check = Checks()
rng = np.random.default_rng(7)
d = 8
layers_sw = [None, 16, None]
T = 40


def make_manifest():
    return qc.Manifest(model="fake-llama", n_q_heads=[4, 4, 4], n_kv_heads=[2, 2, 1], head_dim=d,
                       buckets=qc.BucketSpec("uniform", 4, 1.0), context_length=T, seed=11,
                       sliding_window=list(layers_sw),
                       rope={"pairing": "rotate_half", "rotary_dim": d, "theta": 500000.0, "scaling": "llama3",
                             "scaling_factor": 8.0},
                       head_count=3, head_seed=5, eligibility="all_layers")


def fake_rows(example, layer, kind, head):
    g = np.random.default_rng([example, layer, qc.KINDS[kind], head])
    return g.standard_normal((T, d)).astype(np.float32)


for fmt in qc.FORMATS:
    for dtype in ("f32", "f16", "bf16"):
        zlib = run(args.checker, "zlib").stdout.strip() == "1"
        if fmt == "npz_compressed" and not zlib:
            continue
        m = make_manifest()
        store = qc.CaptureStore(m)
        for example in (0, 1, 2):  # one "step" per example: positions 0..T-1
            positions = np.arange(T)
            examples = np.full(T, example)
            for layer in store.layers():
                for kind in ("q", "k"):
                    if example == 1:  # the per-head API
                        kept = store.kept(layer, kind, positions, examples)
                        for head in store.wanted(layer, kind):
                            store.add(layer, kind, head, fake_rows(example, layer, kind, head), positions, examples,
                                      kept)
                    else:  # what the capture recipes call
                        store.feed(layer, kind, positions, examples,
                                   lambda h, idx: fake_rows(example, layer, kind, h)[idx])
        out = os.path.join(args.work, f"{fmt}_{dtype}")
        store.write(out, fmt=fmt, dtype=dtype)
        text = run(args.checker, "dataset", out).stdout.splitlines()
        sampled = [tuple(int(x) for x in l.split()[1:]) for l in text if l.startswith("sampled ")]
        check(sampled == store.heads, f"{out}: C++ sampled heads {sampled} == plan {store.heads}")
        check(len(store.heads) == 3, f"{out}: three heads sampled")
        check(any(l.startswith("rope rotate_half 8 500000 llama3 8") for l in text), f"{out}: rope round trip")
        check("sliding_window null 16 null" in text, f"{out}: sliding_window round trip")
        check("heads 3 5 all_layers" in text, f"{out}: capture block round trip")
        entries = {}
        i = 0
        while i < len(text):
            if text[i].startswith("entry "):
                f = text[i].split()
                entries[(int(f[1]), f[3], int(f[2]))] = (f, text[i + 1].split()[1:], text[i + 2].split()[1:],
                                                         text[i + 3].split()[1:], text[i + 4].split()[1:])
                i += 5
            else:
                i += 1
        want = {(l, "q", q) for l, q, _ in store.heads} | {(l, "k", k) for l, _, k in store.heads}
        check(set(entries) == want, f"{out}: entries {sorted(entries)} == planned {sorted(want)}")
        for (layer, kind, head), (f, vec, pos, bucket, ex) in entries.items():
            where = f"{out} l{layer} {kind}{head}"
            fmt_name = "npy" if fmt == "npy" else "npz"
            check(f[4] == fmt_name and f[5] == dtype, f"{where}: format {f[4]} dtype {f[5]}")
            check(f[8] == ("none" if layers_sw[layer] is None else str(layers_sw[layer])), f"{where}: sliding_window {f[8]}")
            exp_pos, exp_ex, exp_rows = [], [], []
            for example in (0, 1, 2):
                k = qc.kept_positions(m.buckets, m.seed, example, layer, qc.KINDS[kind], T)
                exp_pos += k
                exp_ex += [example] * len(k)
                exp_rows.append(fake_rows(example, layer, kind, head)[k])
            rows = np.concatenate(exp_rows)
            if dtype == "f16":
                rows = rows.astype(np.float16)
            elif dtype == "bf16":
                rows = (qc._f32_to_bf16_bits(rows).astype(np.uint32) << 16).view(np.float32)
            check([int(x) for x in pos] == exp_pos, f"{where}: positions are the kept ones")
            check([int(x) for x in ex] == exp_ex, f"{where}: example ids")
            check([int(x) for x in bucket] == [qc.bucket_of(m.buckets, t) for t in exp_pos], f"{where}: buckets")
            check(len(vec) == rows.size and all(float(a) == float(b) for a, b in zip(vec, rows.astype(np.float64).ravel())),
                  f"{where}: vectors")
check.finish("python.capture_store")
