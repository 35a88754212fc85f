#!/usr/bin/env python3
"""Convert a capture in the earlier tool's parquet layout to the qkgeom dataset layout.

Input (one model):

    MODEL_DIR/lLLhHHq/data.parquet    columns: bucket, example_id, position,
    MODEL_DIR/lLLhHHk/data.parquet             vector (list of floats), sliding_window
    ...

Output (docs/dataset.md): OUT/manifest.json plus one entry per input entry,
as lLLhHHq/ directories of .npy files (default), lLLhHHq.npz archives
(--format npz) or np.savez_compressed archives (--format npz_compressed).

What parquet does not record comes from the command line: --model,
--scheme/--width/--rate (the bucket scheme the capture used), --context-length,
--seed; per-layer head counts are inferred as (largest head index present + 1)
unless --n-q-heads / --n-kv-heads give them (give them when only some heads
were captured: inference only sees the heads present). Per-layer sliding
windows are taken from the entries (all rows of a layer must agree) and
written to the manifest.

Every row is validated before anything is written (vector width, finite
values, positions in [0, context_length), bucket == bucket_of(position) under
the given scheme -- or recomputed with --rebucket). Errors name the entry,
column, row and value.

Only `read_parquet_entry` touches pyarrow; everything else (grouping,
validation, writing) is plain NumPy and is tested in CI (tests/python:
python.converter) on in-memory tables. `--self-test OUT` runs that path on a
synthetic table without pyarrow.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, Iterable, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkgeom_capture as qc  # noqa: E402

ENTRY_RE = re.compile(r"^l(\d{2,})h(\d{2,})([qk])$")
COLUMNS = ("bucket", "example_id", "position", "vector", "sliding_window")

# A table: {"bucket": int array (n,), "example_id": (n,), "position": (n,),
#           "vector": float array (n, d), "sliding_window": list/array of (int or None) (n,)}
Table = Dict[str, object]
EntryKey = Tuple[int, int, str]  # (layer, head, kind)


def read_parquet_entry(path: str) -> Table:
    """Reads one data.parquet into a Table. The only function that needs pyarrow
    (not available where this script was written: this function has not been run)."""
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=list(COLUMNS))
    vec = t.column("vector").combine_chunks()
    n = len(vec)
    flat = vec.flatten().to_numpy(zero_copy_only=False)
    lengths = vec.value_lengths().to_numpy(zero_copy_only=False) if n else np.zeros(0, dtype=np.int64)
    if n and (lengths != lengths[0]).any():
        i = int(np.argmax(lengths != lengths[0]))
        raise ValueError(f"{path}: vector[{i}]: length {lengths[i]} differs from row 0's {lengths[0]}")
    d = int(lengths[0]) if n else 0
    return {
        "bucket": t.column("bucket").to_numpy(),
        "example_id": t.column("example_id").to_numpy(),
        "position": t.column("position").to_numpy(),
        "vector": flat.reshape(n, d),
        "sliding_window": t.column("sliding_window").to_pylist(),
    }


def discover(model_dir: str) -> List[Tuple[EntryKey, str]]:
    """The (layer, head, kind) entries of a parquet capture directory, sorted."""
    found = []
    for name in sorted(os.listdir(model_dir)):
        m = ENTRY_RE.match(name)
        path = os.path.join(model_dir, name, "data.parquet")
        if m and os.path.isfile(path):
            found.append(((int(m.group(1)), int(m.group(2)), m.group(3)), path))
    if not found:
        raise ValueError(f"{model_dir}: no lLLhHH[qk]/data.parquet entries found")
    return sorted(found)


def _entry_window(key: EntryKey, table: Table) -> Optional[int]:
    """The entry's sliding window: every row must agree (None/null = full attention)."""
    import numpy as np

    sw = list(table.get("sliding_window", []))
    n = len(table["position"])
    if len(sw) not in (0, n):
        raise ValueError(f"{qc.entry_name(*key)}: sliding_window.length {len(sw)} differs from {n} rows")
    vals = set()
    for v in sw:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            vals.add(None)
        else:
            vals.add(int(v))
    if len(vals) > 1:
        raise ValueError(f"{qc.entry_name(*key)}: sliding_window differs between rows (values {sorted(vals, key=str)})")
    return vals.pop() if vals else None


def infer_heads(keys: Iterable[EntryKey], n_layers: Optional[int]) -> Tuple[List[int], List[int]]:
    """(n_q_heads, n_kv_heads) per layer as largest head present + 1."""
    keys = list(keys)
    L = n_layers if n_layers is not None else max(k[0] for k in keys) + 1
    q = [0] * L
    kv = [0] * L
    for layer, head, kind in keys:
        if layer >= L:
            raise ValueError(f"{qc.entry_name(layer, head, kind)}: layer {layer} outside n_layers = {L}")
        arr = q if kind == "q" else kv
        arr[layer] = max(arr[layer], head + 1)
    for l in range(L):
        if q[l] == 0 or kv[l] == 0:
            raise ValueError(f"layer {l}: no {'query' if q[l] == 0 else 'key'} entries to infer head counts from; "
                             "pass --n-q-heads and --n-kv-heads")
        if q[l] % kv[l]:
            raise ValueError(f"layer {l}: inferred n_q_heads = {q[l]} is not a multiple of inferred n_kv_heads = "
                             f"{kv[l]} (only some heads present?); pass --n-q-heads and --n-kv-heads")
    return q, kv


def _per_layer(values: Optional[List[int]], n_layers: int, what: str) -> Optional[List[int]]:
    if values is None:
        return None
    if len(values) == 1:
        return values * n_layers
    if len(values) != n_layers:
        raise ValueError(f"--{what}: {len(values)} values for {n_layers} layers (give 1 or n_layers)")
    return values


def convert(tables: Iterable[Tuple[EntryKey, Table]], out_dir: str, *, model: str, buckets: qc.BucketSpec,
            context_length: int, seed: int = 0, n_layers: Optional[int] = None,
            n_q_heads: Optional[List[int]] = None, n_kv_heads: Optional[List[int]] = None,
            fmt: str = "npy", dtype: str = "f32", rebucket: bool = False) -> qc.Manifest:
    """Validates every table, then writes the manifest and the entries. Returns the manifest."""
    import numpy as np

    tables = sorted(tables, key=lambda kt: kt[0])
    if not tables:
        raise ValueError("no entries to convert")
    keys = [k for k, _ in tables]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate entries: " + ", ".join(sorted({qc.entry_name(*k) for k in keys if keys.count(k) > 1})))
    if n_q_heads is None or n_kv_heads is None:
        iq, ikv = infer_heads(keys, n_layers)
        L = len(iq)
        n_q_heads = _per_layer(n_q_heads, L, "n-q-heads") or iq
        n_kv_heads = _per_layer(n_kv_heads, L, "n-kv-heads") or ikv
    else:
        L = n_layers if n_layers is not None else max(len(n_q_heads), len(n_kv_heads), max(k[0] for k in keys) + 1)
        n_q_heads = _per_layer(n_q_heads, L, "n-q-heads")
        n_kv_heads = _per_layer(n_kv_heads, L, "n-kv-heads")
    head_dims = {np.asarray(t["vector"]).shape[1] for _, t in tables if np.asarray(t["vector"]).ndim == 2}
    if len(head_dims) != 1:
        raise ValueError(f"vector widths differ between entries (or no rank-2 vectors): {sorted(head_dims)}")
    head_dim = head_dims.pop()
    windows: Dict[int, Optional[int]] = {}
    prepared = []
    for key, t in tables:
        w = _entry_window(key, t)
        layer = key[0]
        if layer in windows and windows[layer] != w:
            raise ValueError(f"{qc.entry_name(*key)}: sliding_window {w} differs from layer {layer}'s other entries "
                             f"({windows[layer]})")
        windows[layer] = w
        pos = np.asarray(t["position"], dtype=np.int64)
        bucket = qc.buckets_of(buckets, pos) if rebucket else np.asarray(t["bucket"], dtype=np.int64)
        prepared.append((key, np.asarray(t["vector"]), pos, bucket, np.asarray(t["example_id"], dtype=np.int64), w))
    m = qc.Manifest(model=model, n_q_heads=list(n_q_heads), n_kv_heads=list(n_kv_heads), head_dim=head_dim,
                    buckets=buckets, context_length=context_length, seed=seed,
                    sliding_window=[windows.get(l) for l in range(L)] if windows else None)
    m.check()
    for key, v, pos, bucket, ex, w in prepared:  # validate all before writing anything
        qc.check_entry(m, key[0], key[1], key[2], v, pos, bucket, ex, w)
    qc.write_manifest(out_dir, m)
    for key, v, pos, bucket, ex, w in prepared:
        qc.write_entry(out_dir, m, key[0], key[1], key[2], v, pos, bucket, ex, w, fmt, dtype)
    return m


def synthetic_tables(seed: int = 3, n_layers: int = 2, head_dim: int = 6, buckets: qc.BucketSpec = qc.BucketSpec("uniform", 8, 1.0),
                     context_length: int = 64) -> List[Tuple[EntryKey, Table]]:
    """In-memory tables shaped like the parquet capture (for --self-test and tests/python):
    layers of 4 query heads / 2 key heads, layer 1 with a sliding window of 32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for layer in range(n_layers):
        sw = 32 if layer == 1 else None
        for kind, nh in (("q", 4), ("k", 2)):
            for head in range(nh):
                n = int(rng.integers(5, 20))
                pos = np.sort(rng.integers(0, context_length, n))
                out.append(((layer, head, kind), {
                    "bucket": qc.buckets_of(buckets, pos),
                    "example_id": rng.integers(0, 4, n),
                    "position": pos,
                    "vector": rng.standard_normal((n, head_dim)).astype(np.float32),
                    "sliding_window": [sw] * n,
                }))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", nargs="?", help="directory holding lLLhHH{q,k}/data.parquet")
    ap.add_argument("out_dir", nargs="?", help="output dataset directory")
    ap.add_argument("--model", help="model name for manifest.json (e.g. meta-llama/Llama-3.2-1B)")
    ap.add_argument("--scheme", choices=qc.SCHEMES, default="uniform", help="bucket scheme of the capture")
    ap.add_argument("--width", type=int, default=128, help="bucket width B (B_min for log)")
    ap.add_argument("--rate", type=float, default=1.0, help="keep rate of the capture sampler")
    ap.add_argument("--context-length", type=int, help="context length L of the capture (positions < L)")
    ap.add_argument("--seed", type=int, default=0, help="capture sampling seed")
    ap.add_argument("--n-layers", type=int, help="number of layers (default: largest layer present + 1)")
    ap.add_argument("--n-q-heads", type=int, nargs="+", help="query heads per layer (one value or n_layers)")
    ap.add_argument("--n-kv-heads", type=int, nargs="+", help="key/value heads per layer (one value or n_layers)")
    ap.add_argument("--format", choices=qc.FORMATS, default="npy", help="entry storage form")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16", "f64"), default="f32", help="vector storage dtype")
    ap.add_argument("--rebucket", action="store_true", help="recompute bucket from position instead of checking it")
    ap.add_argument("--self-test", metavar="OUT", help="convert a synthetic in-memory table to OUT (no pyarrow)")
    a = ap.parse_args(argv)
    buckets = qc.BucketSpec(a.scheme, a.width, a.rate)
    if a.self_test:
        spec = qc.BucketSpec("uniform", 8, 1.0)
        m = convert(synthetic_tables(buckets=spec), a.self_test, model="synthetic", buckets=spec, context_length=64,
                    seed=1, fmt=a.format, dtype=a.dtype)
        print(f"self-test: {m.n_layers} layers written to {a.self_test} ({a.format}, {a.dtype})")
        return 0
    if not (a.model_dir and a.out_dir and a.model and a.context_length):
        ap.error("model_dir, out_dir, --model and --context-length are required (or --self-test OUT)")
    entries = discover(a.model_dir)
    tables = [(key, read_parquet_entry(path)) for key, path in entries]
    m = convert(tables, a.out_dir, model=a.model, buckets=buckets, context_length=a.context_length, seed=a.seed,
                n_layers=a.n_layers, n_q_heads=a.n_q_heads, n_kv_heads=a.n_kv_heads, fmt=a.format, dtype=a.dtype,
                rebucket=a.rebucket)
    print(f"{len(entries)} entries of {m.model} ({m.n_layers} layers) written to {a.out_dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"convert_parquet.py: {e}", file=sys.stderr)
        sys.exit(1)
