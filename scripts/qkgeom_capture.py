"""qkgeom capture support shared by the capture recipes and the parquet converter.

Three parts, each a plain-Python port of the C++ it must agree with:

* the method §0.1 token sampler of ``include/qkgeom/buckets.hpp``: buckets,
  keep probabilities and the deterministic keep hash (splitmix64 chained over
  seed, example_id, layer, kind, position), bit for bit;
* the method §0.1 head sampler of ``include/qkgeom/capture.hpp``
  (``sample_heads``: seeded partial Fisher-Yates over the eligible heads);
* a writer of the qkgeom dataset layout (``docs/dataset.md``): manifest.json
  and one entry per (layer, head, kind) as an ``lLLhHHq/`` directory of .npy
  files or an ``lLLhHHq.npz`` archive.

The sampler functions need only the standard library; the vectorised keep
mask, the capture store and the writer need NumPy. ``tests/python`` checks
the samplers against the C++ (kept positions and sampled heads for several
seeds and schemes) and reads what the writer writes with qkgeom's readers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

MASK64 = (1 << 64) - 1
KINDS = {"q": 0, "k": 1}  # kind::query = 0, kind::key = 1 (config.hpp)
SCHEMES = ("uniform", "log", "all")
ELIGIBILITIES = ("full_attention_only", "all_layers")
ROPE_PAIRINGS = ("rotate_half", "interleaved")


# ---------------------------------------------------------------------------
# method §0.1 token sampler (buckets.hpp)
# ---------------------------------------------------------------------------

def splitmix64(x: int) -> int:
    """splitmix64 output function of one 64-bit word (buckets.hpp detail::splitmix64)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def keep_hash(seed: int, example_id: int, layer: int, kind: int, position: int) -> int:
    """The 64-bit keep hash of one token; integers as 64-bit two's complement."""
    h = splitmix64(seed & MASK64)
    for v in (example_id, layer, kind, position):
        h = splitmix64(h ^ (v & MASK64))
    return h


def keep_uniform(seed: int, example_id: int, layer: int, kind: int, position: int) -> float:
    """u = (keep_hash >> 11) * 2^-53 in [0, 1), exact."""
    return float(keep_hash(seed, example_id, layer, kind, position) >> 11) * 2.0 ** -53


@dataclass(frozen=True)
class BucketSpec:
    """scheme "uniform" | "log" | "all"; width = B (uniform, all) or B_min (log); rate > 0."""

    scheme: str = "uniform"
    width: int = 128
    rate: float = 1.0

    def check(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"buckets.scheme: unknown bucket scheme {self.scheme!r} (uniform, log, all)")
        if not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"buckets.width: bucket width must be >= 1 (value {self.width!r})")
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"buckets.rate: keep rate must be finite and > 0 (value {self.rate!r})")


def _ceil_log2(x: int) -> int:
    return 0 if x <= 1 else (x - 1).bit_length()


def _floor_log2(x: int) -> int:
    return x.bit_length() - 1


def min_bucket(spec: BucketSpec) -> int:
    return _ceil_log2(spec.width) if spec.scheme == "log" else 0


def bucket_of(spec: BucketSpec, position: int) -> int:
    """method §0.1: floor(t / B) (uniform, all); max(i_min, floor(log2(t + 1))) (log)."""
    if position < 0:
        raise ValueError(f"position: must be >= 0 (value {position})")
    if spec.scheme == "log":
        return max(_ceil_log2(spec.width), _floor_log2(position + 1))
    return position // spec.width


def keep_probability(spec: BucketSpec, position: int) -> float:
    if spec.scheme == "uniform":
        return min(1.0, spec.rate / float(spec.width))
    if spec.scheme == "log":
        return min(1.0, math.ldexp(spec.rate, -bucket_of(spec, position)))
    return 1.0


def keep_token(spec: BucketSpec, seed: int, example_id: int, layer: int, kind: int, position: int) -> bool:
    """Whether the token is captured: keep_uniform(...) < keep_probability (always when p >= 1)."""
    p = keep_probability(spec, position)
    return p >= 1.0 or keep_uniform(seed, example_id, layer, kind, position) < p


def kept_positions(spec: BucketSpec, seed: int, example_id: int, layer: int, kind: int, length: int) -> List[int]:
    """Every kept position 0 <= t < length of one (example, layer, kind), ascending."""
    spec.check()
    return [t for t in range(length) if keep_token(spec, seed, example_id, layer, kind, t)]


def keep_mask(spec: BucketSpec, seed: int, example_ids, layer: int, kind: int, positions):
    """Vectorised keep decision (NumPy): a bool array, element i = keep_token(..., example_ids[i], ..., positions[i]).

    Bit-identical to keep_token (uint64 arithmetic wraps mod 2^64 like the C++).
    Positions must be >= 0 and < 2^53.
    """
    import numpy as np

    spec.check()
    pos = np.asarray(positions, dtype=np.int64)
    ex = np.asarray(example_ids, dtype=np.int64)
    if pos.shape != ex.shape:
        raise ValueError(f"example_ids: shape {ex.shape} differs from positions {pos.shape}")
    if pos.size and (pos.min() < 0 or pos.max() >= 2 ** 53):
        raise ValueError(f"positions must be in [0, 2^53) (value {int(pos.min())}..{int(pos.max())})")

    def mix(z):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):
        h0 = splitmix64(seed & MASK64)
        h = mix(np.full(pos.shape, h0, dtype=np.uint64) ^ ex.astype(np.uint64))
        h = mix(h ^ np.uint64(layer & MASK64))
        h = mix(h ^ np.uint64(kind & MASK64))
        h = mix(h ^ pos.astype(np.uint64))
    u = (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    if spec.scheme == "uniform":
        p = np.full(pos.shape, min(1.0, spec.rate / float(spec.width)))
    elif spec.scheme == "log":
        _, e = np.frexp((pos + 1).astype(np.float64))  # t + 1 = m * 2^e, m in [0.5, 1): floor(log2) = e - 1
        b = np.maximum(_ceil_log2(spec.width), e.astype(np.int64) - 1)
        p = np.minimum(1.0, np.ldexp(spec.rate, -b))
    else:
        p = np.ones(pos.shape)
    return (p >= 1.0) | (u < p)


def buckets_of(spec: BucketSpec, positions):
    """Vectorised bucket_of (NumPy int64 array)."""
    import numpy as np

    pos = np.asarray(positions, dtype=np.int64)
    if spec.scheme == "log":
        _, e = np.frexp((pos + 1).astype(np.float64))
        return np.maximum(_ceil_log2(spec.width), e.astype(np.int64) - 1)
    return pos // spec.width


# ---------------------------------------------------------------------------
# method §0.1 head sampler (capture.hpp)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerLayout:
    n_q_heads: int
    n_kv_heads: int
    sliding_window: Optional[int] = None  # None = full attention


def check_layout(layers: Sequence[LayerLayout], head_dim: int) -> None:
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1 (value {head_dim})")
    if not layers:
        raise ValueError("layers: a layout needs at least one layer")
    for l, L in enumerate(layers):
        if L.n_q_heads < 1 or L.n_kv_heads < 1 or L.n_q_heads % L.n_kv_heads:
            raise ValueError(f"layers[{l}]: n_q_heads = {L.n_q_heads} must be a positive multiple of "
                             f"n_kv_heads = {L.n_kv_heads}")
        if L.sliding_window is not None and L.sliding_window < 1:
            raise ValueError(f"layers[{l}].sliding_window must be >= 1 or None (value {L.sliding_window})")


def eligible_heads(layers: Sequence[LayerLayout], eligibility: str = "full_attention_only") -> List[Tuple[int, int, int]]:
    """Every eligible (layer, q_head, k_head), ascending; k_head = q_head // (n_q / n_kv)."""
    if eligibility not in ELIGIBILITIES:
        raise ValueError(f"eligibility must be one of {ELIGIBILITIES} (value {eligibility!r})")
    out = []
    for l, L in enumerate(layers):
        if eligibility == "full_attention_only" and L.sliding_window is not None:
            continue
        g = L.n_q_heads // L.n_kv_heads
        out.extend((l, h, h // g) for h in range(L.n_q_heads))
    return out


def _bounded_draw(state: int, m: int) -> Tuple[int, int]:
    reject_from = ((1 << 64) - m) % m  # 2^64 mod m
    while True:
        state = splitmix64(state)
        if state >= reject_from:
            return state, state % m


def sample_heads(layers: Sequence[LayerLayout], count: Optional[int], seed: int,
                 eligibility: str = "full_attention_only") -> List[Tuple[int, int, int]]:
    """capture.hpp sample_heads: `count` eligible heads without replacement (all when None or fewer)."""
    pool = eligible_heads(layers, eligibility)
    if count is None or count >= len(pool):
        return pool
    if count < 0:
        raise ValueError(f"count must be >= 0 (value {count})")
    s = splitmix64((seed & MASK64) ^ 0x6865616473616D70)  # "headsamp"
    for i in range(count):
        s, d = _bounded_draw(s, len(pool) - i)
        j = i + d
        pool[i], pool[j] = pool[j], pool[i]
    return sorted(pool[:count])


# ---------------------------------------------------------------------------
# Dataset writer (docs/dataset.md)
# ---------------------------------------------------------------------------

def entry_name(layer: int, head: int, kind: str) -> str:
    """"lLLhHHq" / "lLLhHHk": two-digit zero padding (more digits when >= 100)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be 'q' or 'k' (value {kind!r})")
    return f"l{layer:02d}h{head:02d}{kind}"


@dataclass
class Manifest:
    """manifest.json (docs/dataset.md); per-layer lists have n_layers entries."""

    model: str
    n_q_heads: List[int]
    n_kv_heads: List[int]
    head_dim: int
    buckets: BucketSpec
    context_length: int
    seed: int = 0
    sliding_window: Optional[List[Optional[int]]] = None  # None = not recorded
    rope: Optional[Dict] = None  # {pairing, rotary_dim, theta, scaling, scaling_factor}
    head_count: Optional[int] = None  # with record_heads: None = every eligible head
    head_seed: int = 0
    eligibility: str = "full_attention_only"
    record_heads: bool = False  # write capture.head_count / head_seed / eligibility
    extra: Dict = field(default_factory=dict)  # more top-level fields (ignored by qkgeom)

    @property
    def n_layers(self) -> int:
        return len(self.n_q_heads)

    def check(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model: must be a non-empty string (value {self.model!r})")
        if len(self.n_kv_heads) != self.n_layers:
            raise ValueError(f"n_kv_heads: {len(self.n_kv_heads)} entries, n_q_heads has {self.n_layers}")
        check_layout(self.layers(), self.head_dim)
        self.buckets.check()
        if self.context_length < 1:
            raise ValueError(f"context_length must be >= 1 (value {self.context_length})")
        if not 0 <= self.seed < 2 ** 63 or not 0 <= self.head_seed < 2 ** 63:
            raise ValueError(f"seed and head_seed must be in [0, 2^63) (values {self.seed}, {self.head_seed})")
        if self.sliding_window is not None and len(self.sliding_window) != self.n_layers:
            raise ValueError(f"sliding_window: {len(self.sliding_window)} entries for {self.n_layers} layers")
        if self.eligibility not in ELIGIBILITIES:
            raise ValueError(f"eligibility must be one of {ELIGIBILITIES} (value {self.eligibility!r})")
        if self.rope is not None:
            r = self.rope
            if r.get("pairing") not in ROPE_PAIRINGS:
                raise ValueError(f"rope.pairing must be one of {ROPE_PAIRINGS} (value {r.get('pairing')!r})")
            rd = int(r.get("rotary_dim", 0))
            if rd < 0 or rd > self.head_dim or rd % 2:
                raise ValueError(f"rope.rotary_dim must be even in [0, head_dim = {self.head_dim}] (value {rd})")
            if not (math.isfinite(float(r.get("theta", 0))) and float(r.get("theta", 0)) > 0):
                raise ValueError(f"rope.theta must be finite and > 0 (value {r.get('theta')!r})")

    def layers(self) -> List[LayerLayout]:
        sw = self.sliding_window or [None] * self.n_layers
        return [LayerLayout(q, k, w) for q, k, w in zip(self.n_q_heads, self.n_kv_heads, sw)]

    def to_json(self) -> Dict:
        self.check()
        b = self.buckets
        cap = {"seed": int(self.seed)}
        if self.record_heads:
            cap.update({"head_count": self.head_count, "head_seed": int(self.head_seed),
                        "eligibility": self.eligibility})
        o = {"format": "qkgeom-dataset", "version": 1, "model": self.model, "n_layers": self.n_layers,
             "n_q_heads": [int(x) for x in self.n_q_heads], "n_kv_heads": [int(x) for x in self.n_kv_heads],
             "gqa_group_size": [int(q) // int(k) for q, k in zip(self.n_q_heads, self.n_kv_heads)],
             "head_dim": int(self.head_dim),
             "buckets": {"scheme": b.scheme, "width": int(b.width), "rate": float(b.rate)},
             "context_length": int(self.context_length)}
        if self.sliding_window is not None:
            o["sliding_window"] = [None if w is None else int(w) for w in self.sliding_window]
        if self.rope is not None:
            r = self.rope
            o["rope"] = {"pairing": r["pairing"], "rotary_dim": int(r.get("rotary_dim", 0)),
                         "theta": float(r["theta"]), "scaling": str(r.get("scaling", "none")),
                         "scaling_factor": float(r.get("scaling_factor", 1.0))}
        o["capture"] = cap
        o.update(self.extra)
        return o


def write_manifest(out_dir: str, m: Manifest) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "manifest.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(m.to_json(), f, indent=2)
        f.write("\n")
    return path


def _f32_to_bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (finite input), as qkgeom::bfloat16::from_float."""
    import numpy as np

    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return r.astype(np.uint16)


def storage_array(vectors, dtype: str):
    """The vectors array as stored: <f4, <f8, <f2, or bf16 as a 2-byte void type (|V2, qkgeom's
    bf16 convention). `vectors` is any float array; for "bf16" a uint16 array is taken as raw
    bfloat16 bits (e.g. torch_tensor.view(torch.int16).numpy().view(np.uint16))."""
    import numpy as np

    v = np.asarray(vectors)
    if dtype == "f32":
        return np.ascontiguousarray(v, dtype="<f4")
    if dtype == "f64":
        return np.ascontiguousarray(v, dtype="<f8")
    if dtype == "f16":
        return np.ascontiguousarray(v, dtype="<f2")
    if dtype == "bf16":
        bits = v.astype("<u2") if v.dtype == np.uint16 else _f32_to_bf16_bits(v)
        return np.ascontiguousarray(bits, dtype="<u2").view("V2")
    raise ValueError(f"dtype must be f32, f64, f16 or bf16 (value {dtype!r})")


def check_entry(m: Manifest, layer: int, head: int, kind: str, vectors, position, bucket, example_id,
                sliding_window: Optional[int]) -> None:
    """The rules qkgeom's reader applies (docs/dataset.md "head entry"), checked before writing."""
    import numpy as np

    name = entry_name(layer, head, kind)
    if not 0 <= layer < m.n_layers:
        raise ValueError(f"{name}: layer outside [0, n_layers = {m.n_layers}) (value {layer})")
    nh = (m.n_q_heads if kind == "q" else m.n_kv_heads)[layer]
    if not 0 <= head < nh:
        raise ValueError(f"{name}: head outside [0, {'n_q_heads' if kind == 'q' else 'n_kv_heads'} = {nh}) (value {head})")
    v = np.asarray(vectors)
    if v.ndim != 2 or v.shape[1] != m.head_dim:
        raise ValueError(f"{name}: vectors.shape must be (n, head_dim = {m.head_dim}) (value {v.shape})")
    n = v.shape[0]
    for fname, col in (("position", position), ("bucket", bucket), ("example_id", example_id)):
        if np.asarray(col).shape != (n,):
            raise ValueError(f"{name}: {fname}.length differs from the {n} rows of vectors (value {np.asarray(col).shape})")
    if v.dtype != np.uint16 and v.size and not np.isfinite(v).all():
        i, j = np.argwhere(~np.isfinite(v))[0]
        raise ValueError(f"{name}: vectors[row {i}, col {j}]: non-finite value (value {v[i, j]})")
    pos = np.asarray(position, dtype=np.int64)
    if n and (pos.min() < 0 or pos.max() >= m.context_length):
        i = int(np.argmax((pos < 0) | (pos >= m.context_length)))
        raise ValueError(f"{name}: position[{i}] outside [0, context_length = {m.context_length}) (value {pos[i]})")
    want = buckets_of(m.buckets, pos)
    bad = np.nonzero(np.asarray(bucket, dtype=np.int64) != want)[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}: bucket[{i}] inconsistent with position {pos[i]} under the {m.buckets.scheme} "
                         f"scheme (expected {want[i]}) (value {np.asarray(bucket)[i]})")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"{name}: sliding_window must be >= 1 (value {sliding_window})")
    if m.sliding_window is not None and m.sliding_window[layer] != sliding_window:
        raise ValueError(f"{name}: sliding_window {sliding_window} differs from the manifest's "
                         f"sliding_window[{layer}] = {m.sliding_window[layer]}")


FORMATS = ("npy", "npz", "npz_compressed")


def write_entry(out_dir: str, m: Manifest, layer: int, head: int, kind: str, vectors, position, bucket, example_id,
                sliding_window: Optional[int] = None, fmt: str = "npy", dtype: str = "f32") -> str:
    """Writes one head entry (validated first). fmt: "npy" (directory of .npy files), "npz"
    (np.savez, stored) or "npz_compressed" (np.savez_compressed: qkgeom needs zlib to read it)."""
    import numpy as np

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} (value {fmt!r})")
    check_entry(m, layer, head, kind, vectors, position, bucket, example_id, sliding_window)
    arrays = {
        "vectors": storage_array(vectors, dtype),
        "position": np.ascontiguousarray(position, dtype="<i8"),
        "bucket": np.ascontiguousarray(bucket, dtype="<i8"),
        "example_id": np.ascontiguousarray(example_id, dtype="<i8"),
    }
    if sliding_window is not None:
        arrays["sliding_window"] = np.array(sliding_window, dtype="<i8")
    name = entry_name(layer, head, kind)
    os.makedirs(out_dir, exist_ok=True)
    if fmt == "npy":
        sub = os.path.join(out_dir, name)
        os.makedirs(sub, exist_ok=True)
        stale = os.path.join(sub, "sliding_window.npy")
        if sliding_window is None and os.path.exists(stale):
            os.remove(stale)
        for k, a in arrays.items():
            np.save(os.path.join(sub, k + ".npy"), a, allow_pickle=False)
        return sub
    path = os.path.join(out_dir, name + ".npz")
    with open(path, "wb") as f:
        (np.savez_compressed if fmt == "npz_compressed" else np.savez)(f, **arrays)
    return path


# ---------------------------------------------------------------------------
# Capture store: what a capture loop fills (shared by the recipes)
# ---------------------------------------------------------------------------

class CaptureStore:
    """Kept rows of the planned heads, per (layer, kind, head), ready for write().

    Plan: the heads of `sample_heads(manifest.layers(), head_count, head_seed,
    eligibility)` (queries of those query heads, keys of the key heads they
    read). For every step call `kept(...)` once per (layer, kind) and then
    `add(...)` per head with that head's rows (T x head_dim numpy) for the
    step's tokens.
    """

    def __init__(self, m: Manifest):
        m.record_heads = True
        m.check()
        self.m = m
        self.heads = sample_heads(m.layers(), m.head_count, m.head_seed, m.eligibility)
        self.q_heads: Dict[int, List[int]] = {}
        self.k_heads: Dict[int, List[int]] = {}
        for layer, q, k in self.heads:
            self.q_heads.setdefault(layer, []).append(q)
            if k not in self.k_heads.setdefault(layer, []):
                self.k_heads[layer].append(k)
        self.rows: Dict[Tuple[int, str, int], List] = {}

    def layers(self) -> List[int]:
        return sorted(set(self.q_heads) | set(self.k_heads))

    def wanted(self, layer: int, kind: str) -> List[int]:
        return (self.q_heads if kind == "q" else self.k_heads).get(layer, [])

    def kept(self, layer: int, kind: str, positions, example_ids):
        """Indices of the kept tokens of a step (the same for every head of one (layer, kind))."""
        import numpy as np

        return np.nonzero(keep_mask(self.m.buckets, self.m.seed, example_ids, layer, KINDS[kind], positions))[0]

    def add(self, layer: int, kind: str, head: int, rows, positions, example_ids, kept) -> None:
        import numpy as np

        if head not in self.wanted(layer, kind):
            raise ValueError(f"(layer {layer}, {kind}) head {head} is not in the capture plan")
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.m.head_dim:
            raise ValueError(f"rows: shape {rows.shape}, expected (T, head_dim = {self.m.head_dim})")
        pos = np.asarray(positions, dtype=np.int64)[kept]
        self.rows.setdefault((layer, kind, head), []).append(
            (rows[kept], pos, np.asarray(example_ids, dtype=np.int64)[kept]))

    def add_kept(self, layer: int, kind: str, head: int, rows, positions, example_ids) -> None:
        """Append rows that are already the kept ones (with their positions and example ids)."""
        import numpy as np

        if head not in self.wanted(layer, kind):
            raise ValueError(f"(layer {layer}, {kind}) head {head} is not in the capture plan")
        rows = np.asarray(rows, dtype=np.float32)
        pos = np.asarray(positions, dtype=np.int64)
        ex = np.asarray(example_ids, dtype=np.int64)
        if rows.ndim != 2 or rows.shape != (pos.size, self.m.head_dim) or ex.shape != pos.shape:
            raise ValueError(f"(layer {layer}, {kind}) head {head}: rows {rows.shape}, positions {pos.shape}, "
                             f"example_ids {ex.shape}; expected (n, head_dim = {self.m.head_dim}), (n,), (n,)")
        self.rows.setdefault((layer, kind, head), []).append((rows, pos, ex))

    def feed(self, layer: int, kind: str, positions, example_ids, rows_of) -> int:
        """One step of one (layer, kind), as the capture hooks call it: chooses the kept tokens
        once and asks `rows_of(head, kept_indices)` for each planned head's rows at those
        tokens (a (n_kept, head_dim) array; e.g. a slice of a GPU tensor moved to the CPU).
        Returns the number of kept tokens (0 when no head of this layer and kind is planned)."""
        import numpy as np

        heads = self.wanted(layer, kind)
        if not heads:
            return 0
        kept = self.kept(layer, kind, positions, example_ids)
        pos = np.asarray(positions, dtype=np.int64)[kept]
        ex = np.asarray(example_ids, dtype=np.int64)[kept]
        for head in heads:
            self.add_kept(layer, kind, head, rows_of(head, kept), pos, ex)
        return int(kept.size)

    def write(self, out_dir: str, fmt: str = "npy", dtype: str = "f32") -> List[str]:
        import numpy as np

        write_manifest(out_dir, self.m)
        written = []
        sw = self.m.sliding_window
        for layer in self.layers():
            for kind in ("q", "k"):
                for head in self.wanted(layer, kind):
                    parts = self.rows.get((layer, kind, head), [])
                    if parts:
                        v = np.concatenate([p[0] for p in parts])
                        pos = np.concatenate([p[1] for p in parts])
                        ex = np.concatenate([p[2] for p in parts])
                    else:
                        v = np.zeros((0, self.m.head_dim), dtype=np.float32)
                        pos = ex = np.zeros(0, dtype=np.int64)
                    written.append(write_entry(out_dir, self.m, layer, head, kind, v, pos,
                                               buckets_of(self.m.buckets, pos), ex,
                                               None if sw is None else sw[layer], fmt, dtype))
        return written


# ---------------------------------------------------------------------------
# Pieces of the capture recipes' command lines (capture_hf.py, capture_transformerlens.py)
# ---------------------------------------------------------------------------

def add_capture_args(ap) -> None:
    """Options shared by the capture recipes."""
    ap.add_argument("--model", required=True, help="model name or local path")
    ap.add_argument("--prompts", required=True, help="text file: one example per line (or .jsonl with a 'text' field)")
    ap.add_argument("--out", required=True, help="output dataset directory")
    ap.add_argument("--max-examples", type=int, default=64, help="examples to run (default 64)")
    ap.add_argument("--context-length", type=int, default=2048, help="tokens per example, truncated (default 2048)")
    ap.add_argument("--scheme", choices=SCHEMES, default="uniform", help="bucket scheme (method §0.1)")
    ap.add_argument("--width", type=int, default=128, help="bucket width B (B_min for log)")
    ap.add_argument("--rate", type=float, default=1.0, help="expected kept tokens per bucket per sequence")
    ap.add_argument("--seed", type=int, default=0, help="token sampling seed")
    ap.add_argument("--head-count", type=int, default=None, help="query heads to sample (default: all eligible)")
    ap.add_argument("--head-seed", type=int, default=0, help="head sampling seed")
    ap.add_argument("--eligibility", choices=ELIGIBILITIES, default="full_attention_only")
    ap.add_argument("--format", choices=FORMATS, default="npy", help="entry storage form")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16", "f64"), default="f32", help="stored vector dtype")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--torch-dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16",
                    help="dtype the model runs in")


def read_prompts(path: str, limit: int) -> List[str]:
    """Examples from a text file (one per non-empty line) or a .jsonl file ({"text": ...} per line)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            out.append(json.loads(line)["text"] if path.endswith(".jsonl") else line)
            if len(out) >= limit:
                break
    if not out:
        raise ValueError(f"{path}: no examples")
    return out


def manifest_from_args(args, model_name: str, layers: Sequence[LayerLayout], head_dim: int,
                       rope: Optional[Dict]) -> Manifest:
    """The manifest of a capture run (head sampling recorded)."""
    sw = [L.sliding_window for L in layers]
    return Manifest(model=model_name, n_q_heads=[L.n_q_heads for L in layers],
                    n_kv_heads=[L.n_kv_heads for L in layers], head_dim=head_dim,
                    buckets=BucketSpec(args.scheme, args.width, args.rate), context_length=args.context_length,
                    seed=args.seed, sliding_window=sw, rope=rope, head_count=args.head_count,
                    head_seed=args.head_seed, eligibility=args.eligibility, record_heads=True)
