"""scripts/convert_parquet.py, everything but the pyarrow read.

In-memory tables shaped like the parquet capture (synthetic_tables) go through
convert() in every storage form; qkgeom reads the dataset (manifest, list_heads,
read_head) and every entry must hold exactly the table's rows: vectors (f32
exact), positions, buckets, example ids, the layer's sliding window; inferred
head counts and the per-layer sliding windows must be in the manifest. Bad
tables (wrong bucket, position beyond the context, mixed windows, ragged
widths) must be rejected naming the entry, before anything is written. The
CLI's --self-test path runs once through a subprocess.
"""

import os
import subprocess
import sys

from _common import Checks, run, setup

args = setup(__doc__)
import numpy as np  # noqa: E402
import convert_parquet as cp  # noqa: E402
import qkgeom_capture as qc  # noqa: E402

check = Checks()
spec = qc.BucketSpec("uniform", 8, 1.0)


def read_dataset(out):
    text = run(args.checker, "dataset", out).stdout.splitlines()
    entries = {}
    for i, line in enumerate(text):
        if line.startswith("entry "):
            f = line.split()
            entries[(int(f[1]), int(f[2]), f[3])] = {
                "format": f[4], "dtype": f[5], "shape": (int(f[6]), int(f[7])), "sw": f[8],
                "vector": [float(x) for x in text[i + 1].split()[1:]],
                "position": [int(x) for x in text[i + 2].split()[1:]],
                "bucket": [int(x) for x in text[i + 3].split()[1:]],
                "example_id": [int(x) for x in text[i + 4].split()[1:]]}
    return text, entries


zlib = run(args.checker, "zlib").stdout.strip() == "1"
for fmt in qc.FORMATS:
    if fmt == "npz_compressed" and not zlib:
        continue
    tables = cp.synthetic_tables(buckets=spec)
    out = os.path.join(args.work, fmt)
    m = cp.convert(tables, out, model="meta-llama/Fake-1B", buckets=spec, context_length=64, seed=9, fmt=fmt)
    text, entries = read_dataset(out)
    check(text[0] == "manifest meta-llama/Fake-1B 2 6 64 uniform 8 1 9", f"{fmt}: manifest line {text[0]!r}")
    check("n_q_heads 4 4" in text and "n_kv_heads 2 2" in text, f"{fmt}: inferred head counts")
    check("sliding_window null 32" in text, f"{fmt}: per-layer sliding windows")
    check(set(entries) == {k for k, _ in tables}, f"{fmt}: every entry converted")
    for key, t in tables:
        e = entries.get(key)
        if e is None:
            continue
        where = f"{fmt} {qc.entry_name(*key)}"
        check(e["format"] == ("npy" if fmt == "npy" else "npz"), f"{where}: storage form {e['format']}")
        check(e["shape"] == t["vector"].shape, f"{where}: shape")
        check(e["vector"] == [float(x) for x in t["vector"].astype(np.float64).ravel()], f"{where}: vectors")
        check(e["position"] == t["position"].tolist(), f"{where}: positions")
        check(e["bucket"] == t["bucket"].tolist(), f"{where}: buckets")
        check(e["example_id"] == t["example_id"].tolist(), f"{where}: example ids")
        check(e["sw"] == ("32" if key[0] == 1 else "none"), f"{where}: sliding window {e['sw']}")

# given head counts override inference (a sampled capture: only some heads present)
subset = [kt for kt in cp.synthetic_tables(buckets=spec) if kt[0][1] in (0, 1)]
out = os.path.join(args.work, "given_heads")
cp.convert(subset, out, model="m", buckets=spec, context_length=64, n_q_heads=[8], n_kv_heads=[2, 2])
text, _ = read_dataset(out)
check("n_q_heads 8 8" in text and "n_kv_heads 2 2" in text, "explicit head counts are used")


def rejected(mutate, needle, **kw):
    tables = cp.synthetic_tables(buckets=spec)
    mutate(dict(tables))
    out = os.path.join(args.work, "bad")
    try:
        cp.convert(tables, out, model="m", buckets=spec, context_length=64, **kw)
    except ValueError as e:
        check(needle in str(e), f"rejected with {needle!r}: got {e}")
        check(not os.path.exists(os.path.join(out, "manifest.json")), f"nothing written for {needle!r}")
        return
    check(False, f"not rejected: {needle!r}")


def set_col(col, i, v):
    def f(d):
        d[(0, 1, "q")][col][i] = v
    return f


rejected(set_col("bucket", 2, 99), "l00h01q: bucket[2] inconsistent with position")
rejected(set_col("position", 0, 64), "l00h01q: position[0] outside [0, context_length = 64)")
rejected(set_col("sliding_window", 0, 16), "l00h01q: sliding_window differs between rows")
rejected(set_col("vector", (0, 0), np.nan), "l00h01q: vectors[row 0, col 0]: non-finite value")
rejected(lambda d: d[(1, 0, "k")].update(sliding_window=[None] * len(d[(1, 0, "k")]["position"])),
         "differs from layer 1's other entries")
rejected(lambda d: d[(1, 0, "k")].update(vector=np.zeros((len(d[(1, 0, "k")]["position"]), 5), np.float32)),
         "vector widths differ between entries")
tables = [kt for kt in cp.synthetic_tables(buckets=spec) if not (kt[0] == (1, 1, "k"))]
tables.append(((1, 2, "k"), dict(tables[-1][1])))
try:
    cp.convert(tables, os.path.join(args.work, "bad2"), model="m", buckets=spec, context_length=64)
    check(False, "non-multiple inferred head counts rejected")
except ValueError as e:
    check("layer 1: inferred n_q_heads = 4 is not a multiple of inferred n_kv_heads = 3" in str(e), f"got {e}")
r = cp.convert(cp.synthetic_tables(buckets=spec), os.path.join(args.work, "rebucket"), model="m",
               buckets=qc.BucketSpec("log", 4, 1.0), context_length=64, rebucket=True)
text, entries = read_dataset(os.path.join(args.work, "rebucket"))
check(all(e["bucket"] == [qc.bucket_of(r.buckets, t) for t in e["position"]] for e in entries.values()),
      "--rebucket recomputes buckets under the given scheme")

# the CLI
out = os.path.join(args.work, "cli")
p = subprocess.run([sys.executable, os.path.join(args.scripts, "convert_parquet.py"), "--self-test", out, "--format", "npz",
                    "--dtype", "bf16"], capture_output=True, text=True)
check(p.returncode == 0, f"--self-test exit status {p.returncode}: {p.stderr}")
text, entries = read_dataset(out)
check(len(entries) == 12 and all(e["dtype"] == "bf16" and e["format"] == "npz" for e in entries.values()),
      "--self-test wrote 12 bf16 npz entries qkgeom reads")
p = subprocess.run([sys.executable, os.path.join(args.scripts, "convert_parquet.py"), "nowhere", out],
                   capture_output=True, text=True)
check(p.returncode == 2 and "--model and --context-length are required" in p.stderr, "missing CLI arguments rejected")
check.finish("python.converter")
