"""Import of a qk-sniffer capture (the thesis author's parquet datasets) into a qkgeom dataset.

    python3 -m qkgeom.qk_sniffer SNIFF_DIR -o OUT --rope-applied post|pre [--hf-config config.json]
                                  [--rate R] [--context L] ...

Input (qk-sniffer's saver/dataset.py, DatasetSaver): ``SNIFF_DIR/lLLhHH{q,k}/data.parquet`` with
columns bucket, example_id, position (int32), vector (fixed-size list of float32),
sliding_window (int or null) [, token_str]; older versions nest the entries under a split folder
``SNIFF_DIR/<model>/lLLhHH{q,k}/``. ``_saver_state.json`` (in SNIFF_DIR or its parent) holds
``model_name`` and ``model_metadata``: sampling_strategy (log | uniform | all),
sampling_min_bucket_size (log, already rounded up to a power of two) or sampling_bucket_size,
attention_scope (full_only | all_attention) and, with head sampling, head_sampling_num_layers /
_num_query_heads / _num_key_heads / _sliding_layer_count. Older states nest the metadata under
the model name.

What the import decides, and from what (every value named in an error when it is contradicted):
  * head counts: the state's head_sampling_num_*; else --hf-config; else --n-layers/--n-q-heads/
    --n-kv-heads. Never inferred from the largest head index present. Several sources must agree.
  * bucket scheme and width: the state's sampling_strategy and width (production runs used 8192,
    not the default 128); --scheme/--width only when the state has none, and they must agree when
    both exist. The keep rate is NOT recorded by qk-sniffer: --rate is required.
  * sliding windows: --hf-config when given (entries must agree); else each layer's entries, when
    every layer has entries or the state records head_sampling_sliding_layer_count = 0. A layer
    without entries whose window is unknown (qk-sniffer skips sliding-window layers under
    attention_scope full_only) is refused -- never written as full attention.
  * who sampled the tokens: token_sampler = "qk-sniffer" (its torch RNG did; capture.seed is
    written as 0 and means nothing for such a dataset).
  * which heads: qk-sniffer chose them with Python's random; the manifest records the query
    entries present as the explicit plan (capture.heads), so ``qkgeom analyze`` plans exactly
    those heads (and reports a query head whose key entry is missing). No query entry: refused.
  * pre/post-RoPE: qk-sniffer does not record capture_pre_rope, so --rope-applied post|pre is
    required; with post, --hf-config's no_rope_layers marks NoPE layers rope_applied=false.
  * rows: streamed one parquet record batch at a time (row groups) into the C++ DatasetWriter
    (memory bounded by its buffer); every batch is checked (vector width, bucket ==
    bucket_of(position), one sliding window per entry) before it is appended.

Only ``read_batches`` touches pyarrow (not installed where this was written: UNTESTED against a
real parquet file); everything else is tested on in-memory batches (tests/python/capture/).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from types import SimpleNamespace
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

ENTRY_RE = re.compile(r"^l(\d{2,})h(\d{2,})([qk])$")
COLUMNS = ("bucket", "example_id", "position", "vector", "sliding_window")
SCHEMES = {"log": "log", "log_uniform": "log", "uniform": "uniform", "all": "all"}


class ImportError_(ValueError):
    """A qk-sniffer capture that cannot be imported faithfully (the message names file, field, value)."""


def read_batches(path: str, batch_rows: int = 65536) -> Iterator[Dict]:
    """The one pyarrow function: record batches of one data.parquet as dicts of NumPy arrays."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    f = pq.ParquetFile(path)
    missing = [c for c in COLUMNS if c not in f.schema_arrow.names]
    if missing:
        raise ImportError_(f"{path}: columns {missing} missing (has {f.schema_arrow.names})")
    for rb in f.iter_batches(batch_size=batch_rows, columns=list(COLUMNS)):
        vec = rb.column(rb.schema.get_field_index("vector"))
        n = rb.num_rows
        flat = vec.flatten().to_numpy(zero_copy_only=False)
        if n and flat.size % n:
            raise ImportError_(f"{path}: vector lengths differ between rows ({flat.size} values in {n} rows)")
        if hasattr(vec, "value_lengths") and n:
            lens = vec.value_lengths().to_numpy(zero_copy_only=False)
            if (lens != lens[0]).any():
                i = int(np.argmax(lens != lens[0]))
                raise ImportError_(f"{path}: vector[{i}]: length {lens[i]} differs from row 0's {lens[0]}")
        col = {c: rb.column(rb.schema.get_field_index(c)) for c in ("bucket", "example_id", "position")}
        yield {"bucket": col["bucket"].to_numpy(zero_copy_only=False),
               "example_id": col["example_id"].to_numpy(zero_copy_only=False),
               "position": col["position"].to_numpy(zero_copy_only=False),
               "vector": flat.reshape(n, -1) if n else flat.reshape(0, 0),
               "sliding_window": rb.column(rb.schema.get_field_index("sliding_window")).to_pylist()}


# ------------------------------------------------------------------------------ state
def read_saver_state(path: str) -> Dict:
    """{'model_name': str|None, 'metadata': dict} of a _saver_state.json (new or old layout)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ImportError_(f"{path}: cannot read the saver state ({e})") from e
    if not isinstance(data, dict):
        raise ImportError_(f"{path}: top level is not an object")
    name = data.get("model_name")
    meta = data.get("model_metadata") or {}
    if not isinstance(meta, dict):
        raise ImportError_(f"{path}: model_metadata is not an object")
    if name is None and meta and all(isinstance(v, dict) for v in meta.values()):  # old layout: {model: {...}}
        if len(meta) != 1:
            raise ImportError_(f"{path}: model_metadata holds {len(meta)} models ({sorted(meta)}); import one split")
        name, meta = next(iter(meta.items()))
    return {"model_name": name, "metadata": dict(meta), "path": path}


def buckets_from(state: Optional[Dict], scheme: Optional[str], width: Optional[int], rate: Optional[float]):
    """(scheme, width, rate): the state's scheme and width, the rate from the command line."""
    src = state["path"] if state else "(no _saver_state.json)"
    meta = state["metadata"] if state else {}
    s_scheme = meta.get("sampling_strategy")
    s_width = meta.get("sampling_min_bucket_size") if s_scheme in ("log", "log_uniform") else meta.get(
        "sampling_bucket_size")
    if s_scheme is not None:
        if s_scheme not in SCHEMES:
            raise ImportError_(f"{src}: model_metadata.sampling_strategy: unknown scheme (value {s_scheme!r})")
        if s_width is None:
            raise ImportError_(f"{src}: model_metadata: sampling strategy {s_scheme!r} without its bucket width")
        if scheme is not None and SCHEMES.get(scheme, scheme) != SCHEMES[s_scheme]:
            raise ImportError_(f"--scheme {scheme} contradicts {src}: sampling_strategy = {s_scheme}")
        if width is not None and int(width) != int(s_width):
            raise ImportError_(f"--width {width} contradicts {src}: bucket width = {s_width}")
        scheme, width = SCHEMES[s_scheme], int(s_width)
    elif scheme is None or width is None:
        raise ImportError_(f"{src}: the bucket scheme and width are not recorded: pass --scheme and --width")
    if rate is None:
        raise ImportError_("--rate: qk-sniffer does not record its sampler's base_rate; give the capture "
                           "config's capture.sampler.base_rate")
    return SCHEMES.get(scheme, scheme), int(width), float(rate)


def counts_from(state, hf_plan, n_layers, n_q, n_kv) -> Tuple[int, int, int]:
    """(n_layers, n_q, n_kv) from every source given; they must agree; at least one is needed."""
    found = {}
    meta = state["metadata"] if state else {}
    if "head_sampling_num_query_heads" in meta:
        found[state["path"]] = (int(meta["head_sampling_num_layers"]), int(meta["head_sampling_num_query_heads"]),
                                int(meta["head_sampling_num_key_heads"]))
    if hf_plan is not None:
        found["--hf-config"] = (hf_plan.n_layers, hf_plan.n_q_heads[0], hf_plan.n_kv_heads[0])
    if None not in (n_layers, n_q, n_kv):
        found["--n-layers/--n-q-heads/--n-kv-heads"] = (int(n_layers), int(n_q), int(n_kv))
    if not found:
        raise ImportError_("head counts unknown: the saver state has no head_sampling_num_* fields; pass "
                           "--hf-config config.json or --n-layers, --n-q-heads and --n-kv-heads (they are never "
                           "inferred from the heads present)")
    values = set(found.values())
    if len(values) > 1:
        raise ImportError_("head counts (n_layers, n_q_heads, n_kv_heads) disagree: " +
                           "; ".join(f"{k}: {v}" for k, v in found.items()))
    return values.pop()


# ------------------------------------------------------------------------------ entries
def discover(sniff_dir: str) -> List[Tuple[Tuple[int, int, str], str]]:
    """((layer, head, kind), data.parquet path) of a capture folder, sorted."""
    found = []
    for name in sorted(os.listdir(sniff_dir)):
        m = ENTRY_RE.match(name)
        path = os.path.join(sniff_dir, name, "data.parquet")
        if m and os.path.isfile(path):
            found.append(((int(m.group(1)), int(m.group(2)), m.group(3)), path))
    if not found:
        raise ImportError_(f"{sniff_dir}: no lLLhHH[qk]/data.parquet entries")
    return found


def _window_of(name, sw, n) -> Optional[int]:
    vals = set()
    for v in sw:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            vals.add(None)
        else:
            vals.add(int(v))
    if len(sw) != n:
        raise ImportError_(f"{name}: sliding_window has {len(sw)} values for {n} rows")
    if len(vals) > 1:
        raise ImportError_(f"{name}: sliding_window differs between rows (values {sorted(vals, key=str)})")
    return vals.pop() if vals else None


def _check_batch(name, batch, spec, head_dim, row0):
    """Vector width and bucket == bucket_of(position); returns (vectors, positions, example ids)."""
    import qkgeom  # noqa: PLC0415

    v = np.asarray(batch["vector"])
    n = v.shape[0]
    if v.ndim != 2 or v.shape[1] != head_dim:
        raise ImportError_(f"{name}: vector width {v.shape[1] if v.ndim == 2 else v.shape} differs from head_dim "
                           f"= {head_dim} (rows {row0}..)")
    pos = np.asarray(batch["position"], dtype=np.int64)
    ex = np.asarray(batch["example_id"], dtype=np.int64)
    if pos.shape != (n,) or ex.shape != (n,):
        raise ImportError_(f"{name}: position/example_id lengths {pos.shape}/{ex.shape} differ from {n} vectors")
    want = qkgeom.bucket_of(spec, pos)
    bad = np.flatnonzero(np.asarray(batch["bucket"], dtype=np.int64) != want)
    if bad.size:
        i = int(bad[0])
        raise ImportError_(f"{name}: bucket[{row0 + i}] = {batch['bucket'][i]} differs from bucket_of(position "
                           f"{pos[i]}) = {want[i]} under the {spec.scheme} scheme of width {spec.width}")
    return v, pos, ex


def first_width(entries, open_batches) -> int:
    """head_dim from the first non-empty batch."""
    for key, src in entries:
        for batch in open_batches(src):
            v = np.asarray(batch["vector"])
            if v.ndim == 2 and v.shape[0]:
                return int(v.shape[1])
    raise ImportError_("no rows in any entry")


def windows_for(n_layers, entry_windows, state, hf_plan) -> List[Optional[int]]:
    """Per-layer windows: --hf-config's, else the entries' when every layer has entries or the state
    says no layer slides; anything else is refused."""
    if hf_plan is not None:
        for layer, w in entry_windows.items():
            if w != hf_plan.sliding_window[layer]:
                raise ImportError_(f"layer {layer}: entries' sliding_window {w} differs from --hf-config's "
                                   f"{hf_plan.sliding_window[layer]}")
        return list(hf_plan.sliding_window)
    meta = state["metadata"] if state else {}
    no_sliding = meta.get("head_sampling_sliding_layer_count") == 0
    if len(entry_windows) == n_layers or no_sliding:
        return [entry_windows.get(layer) for layer in range(n_layers)]
    unknown = [layer for layer in range(n_layers) if layer not in entry_windows]
    scope = meta.get("attention_scope", "not recorded")
    raise ImportError_(f"layers {unknown} have no entries and their sliding windows are unknown "
                       f"(attention_scope {scope}; qk-sniffer skips sliding-window layers under full_only): "
                       "pass --hf-config config.json; a skipped layer is never written as full attention")


def import_capture(entries, open_batches: Callable, out: str, *, model: str, context_length: int,
                   rope_applied: str, state=None, hf_plan=None, scheme=None, width=None, rate=None,
                   n_layers=None, n_q_heads=None, n_kv_heads=None, dtype="f32") -> SimpleNamespace:
    """Streams entries ((layer, head, kind), source) -- open_batches(source) yields batches -- into OUT."""
    import qkgeom  # noqa: PLC0415

    from .capture import manifest_for  # noqa: PLC0415

    if rope_applied not in ("post", "pre"):
        raise ImportError_(f"--rope-applied: 'post' or 'pre' (value {rope_applied!r}); qk-sniffer does not record it")
    entries = sorted(entries, key=lambda e: e[0])
    L, nq, nkv = counts_from(state, hf_plan, n_layers, n_q_heads, n_kv_heads)
    for (layer, head, kind), _ in entries:
        limit = nq if kind == "q" else nkv
        if not (0 <= layer < L and 0 <= head < limit):
            raise ImportError_(f"l{layer:02d}h{head:02d}{kind}: outside n_layers = {L}, "
                               f"{'n_q_heads' if kind == 'q' else 'n_kv_heads'} = {limit}")
    sch, wid, rt = buckets_from(state, scheme, width, rate)
    spec = qkgeom.BucketSpec(sch, wid, rt)
    head_dim = hf_plan.head_dim if hf_plan is not None else first_width(entries, open_batches)
    # pass 1 (windows only: one column): the per-entry windows decide the manifest
    entry_windows: Dict[int, Optional[int]] = {}
    for (layer, head, kind), src in entries:
        name = f"l{layer:02d}h{head:02d}{kind}"
        for batch in open_batches(src):
            w = _window_of(name, list(batch["sliding_window"]), len(batch["position"]))
            if layer in entry_windows and entry_windows[layer] != w and len(batch["position"]):
                raise ImportError_(f"{name}: sliding_window {w} differs from layer {layer}'s other entries "
                                   f"({entry_windows[layer]})")
            if len(batch["position"]):
                entry_windows[layer] = w
    windows = windows_for(L, entry_windows, state, hf_plan)
    if rope_applied == "pre":
        applied = [False] * L
    else:
        applied = list(hf_plan.rope_applied) if hf_plan is not None else [True] * L
    layout = qkgeom.ModelLayout(head_dim, [nq] * L, [nkv] * L, windows)
    rope = None
    if hf_plan is not None:
        from .hf import manifest_rope  # noqa: PLC0415

        rope = manifest_rope(hf_plan, [SimpleNamespace(layer=k[0]) for k, _ in entries if k[2] == "q"])
    # qk-sniffer chose its heads with Python's random: the plan is the query entries present (capture.heads)
    q_heads = [(layer, head) for (layer, head, kind), _ in entries if kind == "q"]
    if not q_heads:
        raise ImportError_("no query entry (lLLhHHq) in the capture: no head to import")
    m = manifest_for(layout, model=model, buckets=spec, context_length=context_length, heads=q_heads, rope=rope,
                     rope_applied=applied, token_sampler="qk-sniffer")
    rows = 0
    writer = qkgeom.DatasetWriter(out, m, dtype=dtype)
    for (layer, head, kind), src in entries:
        name = f"l{layer:02d}h{head:02d}{kind}"
        row0 = 0
        for batch in open_batches(src):
            v, pos, ex = _check_batch(name, batch, spec, head_dim, row0)
            if v.shape[0]:
                writer.append(layer, kind, head, v, pos, ex)
            row0 += v.shape[0]
        rows += row0
    writer.close()
    return SimpleNamespace(manifest=m, rows=rows, entries=len(entries))


def _hf_plan(path):
    from .hf import capture_plan_of  # noqa: PLC0415

    with open(path, encoding="utf-8") as f:
        raw = json.load(f)

    def ns(d):
        return SimpleNamespace(**{k: ns(v) if isinstance(v, dict) and k.endswith("_config") else v
                                  for k, v in d.items()})
    return capture_plan_of(ns(raw))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m qkgeom.qk_sniffer", description=__doc__.split("\n")[0])
    ap.add_argument("sniff_dir")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--rope-applied", required=True, choices=("post", "pre"),
                    help="post: captured after RoPE (capture_pre_rope: false); pre: before")
    ap.add_argument("--context", type=int, required=True, help="the capture's max_length (positions < it)")
    ap.add_argument("--model", default=None, help="model name (default: the state's model_name)")
    ap.add_argument("--state", default=None, help="_saver_state.json (default: in SNIFF_DIR or its parent)")
    ap.add_argument("--hf-config", default=None, help="the model's config.json (head counts, windows, RoPE, NoPE)")
    ap.add_argument("--rate", type=float, default=None, help="capture.sampler.base_rate (not recorded by qk-sniffer)")
    ap.add_argument("--scheme", default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--n-layers", type=int)
    ap.add_argument("--n-q-heads", type=int)
    ap.add_argument("--n-kv-heads", type=int)
    ap.add_argument("--dtype", default="f32", choices=("f32", "f16", "bf16", "f64"))
    a = ap.parse_args(argv)
    state_path = a.state
    if state_path is None:
        for cand in (a.sniff_dir, os.path.dirname(os.path.abspath(a.sniff_dir))):
            if os.path.isfile(os.path.join(cand, "_saver_state.json")):
                state_path = os.path.join(cand, "_saver_state.json")
                break
    state = read_saver_state(state_path) if state_path else None
    model = a.model or (state or {}).get("model_name")
    if not model:
        raise ImportError_("model name unknown: no _saver_state.json model_name; pass --model")
    r = import_capture(discover(a.sniff_dir), read_batches, a.out, model=model, context_length=a.context,
                       rope_applied=a.rope_applied, state=state,
                       hf_plan=_hf_plan(a.hf_config) if a.hf_config else None, scheme=a.scheme, width=a.width,
                       rate=a.rate, n_layers=a.n_layers, n_q_heads=a.n_q_heads, n_kv_heads=a.n_kv_heads,
                       dtype=a.dtype)
    print(f"{r.entries} entries, {r.rows} rows of {model} written to {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:
        print(f"qkgeom.qk_sniffer: error: {e}", file=sys.stderr)
        sys.exit(1)
