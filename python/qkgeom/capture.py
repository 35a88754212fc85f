"""Capture of post-RoPE queries and keys from any PyTorch model (method §0, §0.1).

``Recorder`` takes q and k where the model has them -- at the user's own call
site (``record``) or by wrapping the function that applies RoPE in a module
namespace (``patch``) -- and streams the kept rows of the planned heads into
HeadMoments (one per planned head) or a DatasetWriter.

Everything that decides *what* is captured is the C++ library, called through
``qkgeom._qkgeom``: the head plan (``sample_heads``, or an explicit list), the
kept tokens (``TokenSampler.select`` on the host positions), the buckets
(``bucket_of``), the moments (``HeadMoments.add``) and the dataset writer.
This module only moves rows:

* per (layer, kind) and step, ONE gather on the rows' device picks the kept
  tokens of every planned head of that layer (advanced indexing with a
  (heads x kept) index grid: result [n_heads, n_kept, D], each head's rows
  contiguous);
* ONE copy of that block to host memory (pinned, ``non_blocking=True``, when
  the rows live on a CUDA device);
* the host blocks are handed to the sink after the step's single
  synchronisation point (``flush()``, ``step()``, the end of a ``patch``
  context, or a new forward detected) -- never one synchronisation per head.

Steps: a step is one forward pass (one batch). It ends at ``step()`` /
``flush()``, at ``set_batch()``, at the end of a ``patch`` context, or when a
layer is recorded a second time (a new forward; an error when the ending step's
tokens came from ``set_batch``, which applies to one forward only). Example ids default to a
running counter: the B sequences of a step get ids n, n+1, ..., n+B-1. The counter starts at 0 in
every process, so a capture split across processes (``qkgeom.distributed``) builds its Recorders
with ``explicit_example_ids=True``: every step must then give its global example ids (the token
sampler draws by example id, so the ids decide which tokens are kept).

Padding: ``mask`` ([B, T], nonzero = real token; an HF ``attention_mask``)
excludes padded tokens before sampling -- they are never recorded. Positions
are explicit ([B, T] position ids or [T] for every sequence) and must lie in
[0, context_length).

torch is imported only when rows arrive; this module imports without it.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _qkgeom as _ext

KIND_NAMES = {"q": "query", "query": "query", "k": "key", "key": "key"}
TENSOR_LAYOUTS = ("bhtd", "bthd")


def _torch():
    import torch  # noqa: PLC0415  (optional dependency)

    return torch


def _host_int64(x, name: str) -> np.ndarray:
    """An integer array on the host (torch tensors of any device, NumPy, sequences)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: integer array expected (dtype {a.dtype}, shape {a.shape})")
    return a.astype(np.int64, copy=False)


def plan_heads(layout, heads=None, *, head_count=None, head_seed=0, eligibility="full_attention_only"):
    """The planned query heads: ``heads`` as given (checked against the layout), else
    ``sample_heads(layout, head_count, head_seed, eligibility)`` (C++; all eligible
    heads when head_count is None)."""
    if heads is None:
        return list(_ext.sample_heads(layout, head_count, head_seed, eligibility))
    out = []
    for h in heads:
        layer, q_head = int(h[0]), int(h[1])
        n_layers = len(layout.n_q_heads)
        if not 0 <= layer < n_layers:
            raise ValueError(f"heads: layer {layer} outside [0, n_layers = {n_layers})")
        nq, nkv = int(layout.n_q_heads[layer]), int(layout.n_kv_heads[layer])
        k_head = _ext.key_head_of(q_head, nq, nkv)  # ValueError for q_head outside [0, nq)
        if len(tuple(h)) > 2 and int(h[2]) != k_head:
            raise ValueError(f"heads: ({layer}, {q_head}, {int(h[2])}): query head {q_head} reads key head "
                             f"{k_head} (n_q_heads = {nq}, n_kv_heads = {nkv})")
        out.append(_ext.HeadId(layer, q_head, k_head))
    out.sort(key=lambda h: (h.layer, h.q_head))
    for a, b in zip(out, out[1:]):
        if (a.layer, a.q_head) == (b.layer, b.q_head):
            raise ValueError(f"heads: ({a.layer}, {a.q_head}) listed twice")
    return out


class _Pending:
    """One (layer, kind) block of a step: host rows [n_heads, n_kept, D] (maybe still
    in flight), the head numbers, and the kept tokens' positions and example ids."""

    __slots__ = ("layer", "kind", "heads", "rows", "positions", "example_ids")

    def __init__(self, layer, kind, heads, rows, positions, example_ids):
        self.layer, self.kind, self.heads = layer, kind, heads
        self.rows, self.positions, self.example_ids = rows, positions, example_ids


class Recorder:
    """Streams the kept q/k rows of the planned heads into moments or a DatasetWriter.

    Parameters (keywords after ``layout``):
      layout          ModelLayout (head_dim, per-layer head counts and sliding windows).
      buckets         BucketSpec of the token sampler (method §0.1).
      seed            token sampling seed (TokenSampler).
      heads           explicit planned query heads (HeadId or (layer, q_head)); None: sample_heads.
      head_count, head_seed, eligibility   the sample_heads arguments when heads is None.
      sink            "moments" (one HeadMoments per planned head) or a DatasetWriter.
      context_length  L: every recorded position must be < L.
      rope_applied    per-layer list (True = post-RoPE rows) declared up front, or None; a
                      record(..., rope_applied=...) that contradicts it raises.
      model           model name (recorded by ``manifest()``).
      explicit_example_ids  True: every step must give its example ids (record / set_batch
                      ``example_ids``); the running counter is refused. For captures split across
                      processes, where the counter would repeat ids (qkgeom.distributed).
      example_id_range (lo, hi): every example id must lie in [lo, hi) (a shard's examples), or None.
    """

    def __init__(self, layout, *, buckets, seed=0, heads=None, head_count=None, head_seed=0,
                 eligibility="full_attention_only", sink="moments", context_length, rope_applied=None,
                 model="model", explicit_example_ids=False, example_id_range=None):
        if isinstance(sink, str) and sink != "moments":
            raise ValueError(f"sink: 'moments' or a DatasetWriter (value {sink!r})")
        if int(context_length) < 1:
            raise ValueError(f"context_length: must be >= 1 (value {context_length})")
        self.layout = layout
        self.buckets = buckets
        self.seed = int(seed)
        self.context_length = int(context_length)
        self.model = model
        self.head_count, self.head_seed, self.eligibility = head_count, int(head_seed), eligibility
        self.explicit_heads = heads is not None
        self.heads = plan_heads(layout, heads, head_count=head_count, head_seed=head_seed, eligibility=eligibility)
        self.n_layers = len(layout.n_q_heads)
        if rope_applied is not None and len(rope_applied) != self.n_layers:
            raise ValueError(f"rope_applied: {len(rope_applied)} entries for {self.n_layers} layers")
        self._declared_rope = None if rope_applied is None else [bool(x) for x in rope_applied]
        self._rope: Dict[int, bool] = {}
        self._sampler = _ext.TokenSampler(buckets, self.seed)
        self._q: Dict[int, List[int]] = {}
        self._k: Dict[int, List[int]] = {}
        self._by_k: Dict[Tuple[int, int], List] = {}
        for h in self.heads:
            self._q.setdefault(h.layer, []).append(h.q_head)
            if h.k_head not in self._k.setdefault(h.layer, []):
                self._k[h.layer].append(h.k_head)
            self._by_k.setdefault((h.layer, h.k_head), []).append(h)
        self._writer = None if isinstance(sink, str) else sink
        self._moments = None
        if self._writer is None:
            d = int(layout.head_dim)
            self._moments = {(h.layer, h.q_head): _ext.HeadMoments(d, h) for h in self.heads}
        self._index_cache: Dict = {}
        self._pending: List[_Pending] = []
        self._cuda_devices: set = set()
        self._step_layers: set = set()
        self._batch = None          # (positions [B,T] host, mask [B,T] host or None, example_ids [B] or None)
        self._step_b = None         # batch size of the current step
        self._next_example = 0
        self._rows_recorded = {"query": 0, "key": 0}
        self._closed = False
        self.explicit_example_ids = bool(explicit_example_ids)
        self.example_id_range = None
        if example_id_range is not None:
            lo, hi = (int(x) for x in example_id_range)
            if not 0 <= lo <= hi:
                raise ValueError(f"example_id_range: expected 0 <= lo <= hi (value {(lo, hi)})")
            self.example_id_range = (lo, hi)

    # ------------------------------------------------------------------ plan
    def layers(self) -> List[int]:
        """Layers holding planned heads, ascending."""
        return sorted(self._q)

    def planned(self, layer: int, kind: str) -> List[int]:
        """Planned head numbers of (layer, kind): query heads, or the key heads they read."""
        return list((self._q if KIND_NAMES[kind] == "query" else self._k).get(layer, []))

    # ------------------------------------------------------------------ batch / steps
    def set_batch(self, positions, mask=None, example_ids=None) -> None:
        """Declares the next step's tokens (for ``patch``, whose wrapped function does not see
        positions): positions [B, T] or [T], mask [B, T] (nonzero = real token), example ids [B].
        Ends the current step first."""
        self.step()
        self._batch = (positions, mask, example_ids)

    def step(self) -> None:
        """Ends the current step: one synchronisation, rows handed to the sink, the example
        counter advanced by the step's batch size."""
        self.flush()
        if self._step_b is not None:
            self._next_example += self._step_b
        self._step_b = None
        self._step_layers = set()
        self._index_cache = {}
        self._batch = None

    def flush(self) -> None:
        """Waits once for the step's copies in flight and hands every pending block to the sink."""
        if not self._pending:
            return
        if self._cuda_devices:
            torch = _torch()
            for dev in self._cuda_devices:
                torch.cuda.current_stream(dev).synchronize()  # one wait per device and step, not per head
            self._cuda_devices = set()
        pending, self._pending = self._pending, []
        for p in pending:
            self._deliver(p)

    # ------------------------------------------------------------------ recording
    def record(self, layer, q, k, positions=None, example_ids=None, *, mask=None, layout="bhtd",
               rope_applied=True) -> None:
        """Records layer ``layer``'s q ([B, Hq, T, D] for layout "bhtd", [B, T, Hq, D] for "bthd")
        and k (same with Hkv heads) for the current step. positions [B, T] or [T] (default: those
        of set_batch, else 0..T-1); example_ids [B] (default: the running counter); mask [B, T]
        (nonzero = real token; default: set_batch's, else every token). rope_applied=False marks
        pre-RoPE rows (a NoPE layer)."""
        if self._closed:
            raise RuntimeError("Recorder.record: the recorder is closed")
        layer = int(layer)
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"record: layer {layer} outside [0, n_layers = {self.n_layers})")
        if layout not in TENSOR_LAYOUTS:
            raise ValueError(f"record: layout must be one of {TENSOR_LAYOUTS} (value {layout!r})")
        if layer in self._step_layers:  # a layer seen twice: a new forward began
            declared = self._batch is not None
            self.step()
            if declared:
                raise ValueError(f"record(layer {layer}): a new forward began without set_batch(); the previous "
                                 "batch's positions and mask do not apply to it (call set_batch before each forward)")
        self._step_layers.add(layer)
        self._note_rope(layer, bool(rope_applied))
        if layer not in self._q:  # no planned head here: only the step's batch size is noted
            b = int(q.shape[0])
            if self._step_b is None:
                self._step_b = b
            return
        b, t = self._check_shapes(layer, q, k, layout)
        pos, msk, ex = self._tokens(b, t, positions, mask, example_ids)
        for kind, x in (("query", q), ("key", k)):
            self._record_kind(layer, kind, x, layout, pos, msk, ex, b, t)

    def _check_shapes(self, layer, q, k, layout) -> Tuple[int, int]:
        d = int(self.layout.head_dim)
        want = {"query": int(self.layout.n_q_heads[layer]), "key": int(self.layout.n_kv_heads[layer])}
        shapes = {}
        for kind, x in (("query", q), ("key", k)):
            s = tuple(x.shape)
            if len(s) != 4:
                raise ValueError(f"record(layer {layer}): {kind} rows must be 4-D ({layout}) (shape {s})")
            b, h, t = (s[0], s[1], s[2]) if layout == "bhtd" else (s[0], s[2], s[1])
            if h != want[kind] or s[3] != d:
                hname = "n_q_heads" if kind == "query" else "n_kv_heads"
                raise ValueError(f"record(layer {layer}): {kind} shape {s} ({layout}) does not match "
                                 f"{hname} = {want[kind]}, head_dim = {d}")
            shapes[kind] = (b, t)
        if shapes["query"] != shapes["key"]:
            raise ValueError(f"record(layer {layer}): query (batch, tokens) {shapes['query']} differs from "
                             f"key {shapes['key']}")
        return shapes["query"]

    def _tokens(self, b, t, positions, mask, example_ids):
        """(positions [B,T], mask [B,T] bool or None, example ids [B]) on the host, cached per step."""
        if positions is None and mask is None and example_ids is None and self._batch is not None:
            positions, mask, example_ids = self._batch
        key = (id(positions), id(mask), id(example_ids), b, t)
        hit = self._index_cache.get(("tokens",) + key)
        if hit is not None:
            return hit
        if positions is None:
            pos = np.broadcast_to(np.arange(t, dtype=np.int64), (b, t))
        else:
            pos = _host_int64(positions, "positions")
            if pos.ndim == 1:
                pos = np.broadcast_to(pos, (b, pos.shape[0]))
            if pos.shape != (b, t):
                raise ValueError(f"positions: shape {pos.shape}, expected ({b}, {t}) or ({t},)")
        msk = None
        if mask is not None:
            m = mask.detach().cpu().numpy() if hasattr(mask, "detach") else np.asarray(mask)
            if m.shape != (b, t):
                raise ValueError(f"mask: shape {m.shape}, expected ({b}, {t})")
            msk = m != 0
        if self._step_b is None:
            self._step_b = b
        elif self._step_b != b:
            raise ValueError(f"record: batch size {b} differs from this step's {self._step_b}")
        if example_ids is None:
            if self.explicit_example_ids:
                raise ValueError("example_ids: this Recorder takes explicit example ids (explicit_example_ids=True, "
                                 "e.g. one shard of a capture split across processes): pass the batch's global "
                                 "example indices to set_batch(..., example_ids=...) or record(..., example_ids=...); "
                                 "the running counter restarts at 0 in every process and would give two examples "
                                 "one id")
            ex = np.arange(self._next_example, self._next_example + b, dtype=np.int64)
        else:
            ex = _host_int64(example_ids, "example_ids").reshape(-1)
            if ex.shape != (b,):
                raise ValueError(f"example_ids: shape {ex.shape}, expected ({b},) (one id per sequence)")
        if self.example_id_range is not None and ex.size:
            lo, hi = self.example_id_range
            bad = ex[(ex < lo) | (ex >= hi)]
            if bad.size:
                raise ValueError(f"example_ids: id {int(bad[0])} outside this recorder's examples [{lo}, {hi}) "
                                 "(example_id_range: a shard's examples)")
        valid = pos if msk is None else pos[msk]
        if valid.size and (valid.min() < 0 or valid.max() >= self.context_length):
            bad = int(valid.min()) if valid.min() < 0 else int(valid.max())
            raise ValueError(f"positions: a recorded token's position {bad} is outside "
                             f"[0, context_length = {self.context_length})")
        out = (pos, msk, ex)
        self._index_cache[("tokens",) + key] = out
        return out

    def _kept(self, layer, kind, pos, msk, ex, b, t):
        """Flat (batch, token) indices of the kept tokens, with their positions and example ids."""
        flat_pos = np.ascontiguousarray(pos).reshape(-1)
        flat_ex = np.repeat(ex, t)
        if msk is None:
            valid = np.arange(b * t, dtype=np.int64)
        else:
            valid = np.flatnonzero(msk.reshape(-1)).astype(np.int64)
        vpos, vex = flat_pos[valid], flat_ex[valid]
        kept = np.asarray(self._sampler.select(vpos, vex, layer, kind), dtype=np.int64)
        return valid[kept], vpos[kept], vex[kept]

    def _record_kind(self, layer, kind, x, layout, pos, msk, ex, b, t):
        torch = _torch()
        heads = self.planned(layer, kind)
        flat, kpos, kex = self._kept(layer, kind, pos, msk, ex, b, t)
        self._rows_recorded[kind] += int(flat.size) * len(heads)
        if flat.size == 0:
            return
        dev = x.device
        bi = torch.as_tensor(flat // t, device=dev)
        ti = torch.as_tensor(flat % t, device=dev)
        hi = torch.as_tensor(np.asarray(heads, dtype=np.int64), device=dev)
        with torch.no_grad():
            if layout == "bhtd":
                g = x.detach()[bi[None, :], hi[:, None], ti[None, :]]  # ONE gather: [n_heads, n_kept, D]
            else:
                g = x.detach()[bi[None, :], ti[None, :], hi[:, None]]
        if dev.type == "cuda":
            host = torch.empty(g.shape, dtype=g.dtype, pin_memory=True)
            host.copy_(g, non_blocking=True)  # ONE asynchronous copy per (layer, kind)
            self._cuda_devices.add(dev)
        elif dev.type == "cpu":
            host = g
        else:  # another accelerator: a plain copy (synchronous on most backends)
            host = g.to("cpu")
        self._pending.append(_Pending(layer, kind, heads, host, kpos, kex))

    def _note_rope(self, layer, applied):
        prev = self._rope.get(layer)
        if prev is not None and prev != applied:
            raise ValueError(f"record(layer {layer}): rope_applied={applied} contradicts an earlier record "
                             f"of the same layer ({prev})")
        if self._declared_rope is not None and self._declared_rope[layer] != applied:
            raise ValueError(f"record(layer {layer}): rope_applied={applied} contradicts the declared "
                             f"rope_applied[{layer}] = {self._declared_rope[layer]}")
        self._rope[layer] = applied

    # ------------------------------------------------------------------ sinks
    @staticmethod
    def _as_sink_rows(block):
        """A host [n, D] block as a NumPy view (bf16 widened to float32 exactly)."""
        torch = _torch()
        if block.dtype == torch.bfloat16:
            block = block.float()
        return block.numpy()

    def _deliver(self, p: _Pending) -> None:
        rows = p.rows
        if self._writer is not None:
            for j, h in enumerate(p.heads):
                self._writer.append(p.layer, p.kind, h, self._as_sink_rows(rows[j]), p.positions, p.example_ids)
            return
        buckets = _ext.bucket_of(self.buckets, p.positions)
        for j, h in enumerate(p.heads):
            r = self._as_sink_rows(rows[j])
            if p.kind == "query":
                self._moments[(p.layer, h)].add("query", r, p.positions, buckets)
            else:
                for hid in self._by_k[(p.layer, h)]:  # a key head feeds every planned head reading it
                    self._moments[(hid.layer, hid.q_head)].add("key", r, p.positions, buckets)

    # ------------------------------------------------------------------ patching
    @contextlib.contextmanager
    def patch(self, namespace, fn_name: str, *, layer_of: Optional[Callable[[], Optional[int]]] = None,
              layout: str = "bhtd", rope_applied: bool = True):
        """Wraps ``namespace.fn_name`` (a function returning (q_embed, k_embed), e.g. transformers'
        ``apply_rotary_pos_emb``) so that every call records its OUTPUTS, and restores the original on
        exit (also on an exception). ``layer_of()`` names the running layer (None: skip the call);
        without it the calls are counted: call i of a forward is layer i mod n_layers, and a wrap to
        layer 0 starts a new step. Positions, mask and example ids come from ``set_batch`` (default:
        0..T-1, no padding, the running counter). The step is flushed at exit."""
        original = getattr(namespace, fn_name, None)
        if original is None or not callable(original):
            raise ValueError(f"patch: {getattr(namespace, '__name__', namespace)!r} has no function {fn_name!r}")
        counter = {"calls": 0}

        def wrapper(*args, **kwargs):
            out = original(*args, **kwargs)
            if layer_of is not None:
                layer = layer_of()
            else:
                layer = counter["calls"] % self.n_layers
                counter["calls"] += 1
            if layer is not None:
                self.record(int(layer), out[0], out[1], layout=layout, rope_applied=rope_applied)
            return out

        setattr(namespace, fn_name, wrapper)
        try:
            yield self
            self.step()
        finally:
            setattr(namespace, fn_name, original)

    # ------------------------------------------------------------------ results
    def rope_applied(self) -> List[bool]:
        """Per layer: True = post-RoPE rows. Layers never recorded take the declared value, else True
        (they hold no rows)."""
        out = []
        for layer in range(self.n_layers):
            if layer in self._rope:
                out.append(self._rope[layer])
            elif self._declared_rope is not None:
                out.append(self._declared_rope[layer])
            else:
                out.append(True)
        return out

    def missing_layers(self) -> List[int]:
        """Planned layers that were never recorded (e.g. a layer whose RoPE function was not called)."""
        return [layer for layer in self.layers() if layer not in self._rope]

    def rows_recorded(self) -> Dict[str, int]:
        """Rows handed to the sink so far, per kind (kept tokens x planned heads)."""
        return dict(self._rows_recorded)

    def moments(self) -> Dict:
        """{HeadId: HeadMoments} of the moments sink (after flushing)."""
        if self._moments is None:
            raise RuntimeError("Recorder.moments: the sink is a DatasetWriter")
        self.flush()
        by = {(h.layer, h.q_head): h for h in self.heads}
        return {by[key]: m for key, m in self._moments.items()}

    def close(self) -> None:
        """Ends the step; with a DatasetWriter sink, closes it (entries and manifest.json)."""
        if self._closed:
            return
        self.step()
        self._closed = True
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        return False


def manifest_for(layout, *, model: str, buckets, context_length: int, seed: int = 0, heads=None,
                 head_count=None, head_seed: int = 0, eligibility: str = "full_attention_only",
                 rope=None, rope_applied: Optional[Sequence[bool]] = None, token_sampler: str = "qkgeom"):
    """The Manifest of a capture with this layout and sampler (for a DatasetWriter sink).

    rope: dict(pairing, rotary_dim, theta, scaling, scaling_factor) or None. The plan is recorded
    so that the dataset's planned_heads equal the Recorder's plan: the head sampling
    (capture.head_count/head_seed/eligibility) when heads is None, else the explicit list
    (capture.heads: the (layer, q_head) pairs, checked as plan_heads checks them, ascending)."""
    rope_spec = None if rope is None else _ext.RopeSpec(**rope)
    sampling = _ext.HeadSampling(head_count, int(head_seed), eligibility) if heads is None else None
    head_list = None
    if heads is not None:
        head_list = [(h.layer, h.q_head) for h in plan_heads(layout, heads)]
        if not head_list:
            raise ValueError("heads: an empty list plans no head (pass None to record a head sampling)")
    return _ext.Manifest(model=str(model), n_layers=len(layout.n_q_heads),
                         n_q_heads=[int(x) for x in layout.n_q_heads], n_kv_heads=[int(x) for x in layout.n_kv_heads],
                         head_dim=int(layout.head_dim), buckets=buckets, context_length=int(context_length),
                         seed=int(seed), rope=rope_spec,
                         sliding_window=[None if w is None else int(w) for w in layout.sliding_window],
                         heads=sampling, rope_applied=None if rope_applied is None else [bool(x) for x in rope_applied],
                         token_sampler=token_sampler, head_list=head_list)
