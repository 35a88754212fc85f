"""Capture across processes (torchrun / torch.distributed), with files in between.

The user fixes a number of logical shards S, independent of the number of processes W. Shard s
holds a fixed block of examples (``shard_examples``: contiguous, in order) and rank r captures
shards r, r + W, r + 2W, ... (``shards_of``). Each shard is written to its own folder
OUT/shard-SSSSS/: one moments file per planned head (``HeadMoments.save``, docs/moments.md) or a
dataset part (a ``DatasetWriter`` folder). A shard is written under a hidden temporary name and
renamed when it is complete, so a crashed shard never looks finished.

``finish()`` is the only place processes talk: a gather of small metadata (success flag, message,
shards written, row counts) on a gloo group, then rank 0 writes OUT/manifest.json LAST, only when
every rank reported success, and tells the others. A failed rank means no manifest and an error
naming the rank(s) and their messages on every surviving rank; a dead or hung rank makes the others
fail within the group's timeout (a killed peer is usually noticed at once, its connection closes).

The exact merge of the moments happens when the shards are READ (``load_sharded_moments``), in the
fixed shard order 0..S-1 with ``HeadMoments +=``: the result depends on S, never on W. (torch's
collectives have no user-defined reduction, and a reduction tree ordered by rank would make the
bits depend on W.) Dataset parts are joined head by head in shard order into one ordinary dataset
(``merge_sharded_dataset``), which ``analyze_dataset`` / ``qkgeom analyze`` read as usual.

Example ids must be global: the Recorders of a sharded capture refuse the running counter
(``Recorder(explicit_example_ids=True)``) and, when the number of examples is given, ids outside
the shard's block. torch is imported only when a process group is used.

    python3 -m qkgeom.distributed merge OUT -o DATASET      # dataset parts -> one dataset
    python3 -m qkgeom.distributed moments OUT -o DIR        # merged lLLhHH.qkm per planned head
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import itertools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import _qkgeom as _ext

FORMAT = "qkgeom-sharded-capture"
FORMAT_VERSION = 1
SHARD_FORMAT = "qkgeom-capture-shard"
MANIFEST = "manifest.json"
SHARD_INFO = "shard.json"
SINKS = ("moments", "dataset")
DEFAULT_TIMEOUT_S = 1800.0   # torch's own default for a process group

_instances = itertools.count()


class ShardedCaptureError(RuntimeError):
    """A sharded capture that did not complete: a rank failed, died or did not report, or the ranks
    disagree. No manifest.json was written."""


# ---------------------------------------------------------------------------------- sharding
def rank_world(group=None) -> Tuple[int, int]:
    """(rank, world size) of torch.distributed when a process group is initialised, else (0, 1)."""
    try:
        import torch.distributed as dist  # noqa: PLC0415
    except ImportError:
        return 0, 1
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return int(dist.get_rank(group)), int(dist.get_world_size(group))


def shards_of(n_shards: int, rank: int, world: int) -> List[int]:
    """The shards rank ``rank`` of ``world`` captures: rank, rank + world, ... below n_shards."""
    n_shards, rank, world = int(n_shards), int(rank), int(world)
    if n_shards < 1:
        raise ValueError(f"shards_of: n_shards must be >= 1 (value {n_shards})")
    if world < 1:
        raise ValueError(f"shards_of: world must be >= 1 (value {world})")
    if not 0 <= rank < world:
        raise ValueError(f"shards_of: rank {rank} outside [0, world = {world})")
    return list(range(rank, n_shards, world))


def shard_examples(n_examples: int, n_shards: int, shard: int) -> range:
    """The global example indices of shard ``shard``: the contiguous block
    [floor(shard n / S), floor((shard + 1) n / S)). Blocks are in order, so joining the shards in
    shard order lists the examples in their original order."""
    n, s_count, s = int(n_examples), int(n_shards), int(shard)
    if n < 0:
        raise ValueError(f"shard_examples: n_examples must be >= 0 (value {n})")
    if s_count < 1:
        raise ValueError(f"shard_examples: n_shards must be >= 1 (value {s_count})")
    if not 0 <= s < s_count:
        raise ValueError(f"shard_examples: shard {s} outside [0, n_shards = {s_count})")
    return range(s * n // s_count, (s + 1) * n // s_count)


def shard_dir_name(shard: int) -> str:
    return f"shard-{int(shard):05d}"


def moments_file_name(head) -> str:
    """lLLhHH.qkm: the moments file of query head (layer, q_head) inside a shard folder."""
    return f"l{int(head.layer):02d}h{int(head.q_head):02d}.qkm"


def _entry_name(layer: int, head: int, kind: str) -> str:
    return f"l{int(layer):02d}h{int(head):02d}{kind}"


def _manifest_from_json(obj) -> "_ext.Manifest":
    """A Manifest from its JSON object, read (and validated) by the C++ reader."""
    with tempfile.TemporaryDirectory(prefix="qkgeom-manifest-") as d:
        with open(os.path.join(d, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(obj, f)
        return _ext.read_manifest(d)


def _merge_extra(dst: dict, extra: dict) -> dict:
    """dst with the fields of extra added (nested dicts merged), e.g. {"rope": {"attention_factor": f}}."""
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge_extra(dst[k], v)
        else:
            dst[k] = v
    return dst


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------- the capture
class ShardedCapture:
    """One process's part of a capture split into ``n_shards`` logical shards.

    Every rank constructs it with the same arguments (a collective: it checks OUT and that the ranks
    agree), captures its shards (``shards()``, each inside ``with run.recorder(shard) as rec``) and
    calls ``finish()`` (a collective; the ``with ShardedCapture(...)`` form calls it at exit, and
    reports an exception of this rank to the others). Parameters:

      out          output folder, shared by all ranks (new, or holding no manifest.json and no shard).
      n_shards     S >= 1, independent of the number of processes.
      manifest     the capture's Manifest (``qkgeom.capture.manifest_for``): the Recorders' layout,
                   buckets, seed, plan (``planned_heads``), context length, rope_applied and model
                   are read from it, so every shard records what the manifest says.
      sink         "moments" (one lLLhHH.qkm per planned head and shard) or "dataset" (a part each).
      dtype        the dataset parts' storage dtype (f32 | f16 | bf16 | f64).
      n_examples   the number of examples: each shard's Recorder then refuses example ids outside
                   ``shard_examples(n_examples, n_shards, shard)``. None: not checked.
      timeout_s    how long finish() waits for the slowest rank (a rank that hangs fails the run then).
      manifest_extra  JSON fields added to each part's manifest.json and the run's manifest (e.g.
                   {"rope": {"attention_factor": f}}, which qkgeom.hf writes for YaRN / LongRoPE).
    The ranks are those of torch.distributed's default group (initialised by the caller, e.g. under
    torchrun; none: one process, rank 0 of 1). The metadata travels on a NEW gloo group with
    ``timeout_s``, also when the default group is NCCL.
    """

    def __init__(self, out, *, n_shards: int, manifest, sink: str = "moments", dtype: str = "f32",
                 n_examples: Optional[int] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 manifest_extra: Optional[dict] = None):
        if sink not in SINKS:
            raise ValueError(f"ShardedCapture: sink must be one of {SINKS} (value {sink!r})")
        if int(n_shards) < 1:
            raise ValueError(f"ShardedCapture: n_shards must be >= 1 (value {n_shards})")
        if n_examples is not None and int(n_examples) < 0:
            raise ValueError(f"ShardedCapture: n_examples must be >= 0 (value {n_examples})")
        if not float(timeout_s) > 0:
            raise ValueError(f"ShardedCapture: timeout_s must be > 0 (value {timeout_s})")
        self.out = os.path.abspath(os.fspath(out))
        self.n_shards = int(n_shards)
        self.manifest = manifest
        self.sink = sink
        self.dtype = str(dtype)
        self.n_examples = None if n_examples is None else int(n_examples)
        self.timeout_s = float(timeout_s)
        self.manifest_extra = dict(manifest_extra or {})
        self.heads = list(_ext.planned_heads(manifest))
        self.layout = _ext.layout_of(manifest)
        self.rank, self.world = rank_world()
        env_world = os.environ.get("WORLD_SIZE", "1")
        if self.world == 1 and env_world.isdigit() and int(env_world) > 1:
            raise ShardedCaptureError(f"ShardedCapture: WORLD_SIZE = {env_world} in the environment (torchrun) but "
                                      "torch.distributed is not initialised: call torch.distributed."
                                      "init_process_group() first, or every process would capture every shard")
        self._group = None
        self._store = None
        self._written: Dict[int, dict] = {}
        self._error: Optional[str] = None
        self._finished = False
        self._manifest_json = _merge_extra(json.loads(manifest.to_json()), self.manifest_extra)
        key = hashlib.sha1(f"{self.out}|{next(_instances)}".encode()).hexdigest()[:16]
        self._key = f"qkgeom/sharded/{key}"
        if self.world > 1:
            import torch.distributed as dist  # noqa: PLC0415

            # every rank of the default group calls new_group (a collective), here while all are alive
            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout_s))
            try:
                self._store = dist.distributed_c10d._get_default_store()  # names the ranks that never reported
            except Exception:  # noqa: BLE001  (a private helper: without it the message names no rank)
                self._store = None
        # Every rank checks OUT and states its settings; all agree before anything is written.
        problem = self._check_out()
        mine = {"rank": self.rank, "problem": problem, "settings": self._settings()}
        everyone = self._gather(mine, "start")
        problems = [f"rank {s['rank']}: {s['problem']}" for s in everyone if s["problem"]]
        if problems:
            raise ShardedCaptureError(f"ShardedCapture({self.out}): " + "; ".join(problems))
        for s in everyone:
            if s["settings"] != everyone[0]["settings"]:
                diff = sorted(k for k in s["settings"] if s["settings"][k] != everyone[0]["settings"].get(k))
                raise ShardedCaptureError(f"ShardedCapture({self.out}): rank {s['rank']} was started with other "
                                          f"settings than rank {everyone[0]['rank']} (differ: {diff}); every rank must "
                                          "pass the same out, n_shards, sink, dtype, n_examples and manifest")
        os.makedirs(self.out, exist_ok=True)

    # ------------------------------------------------------------------ plumbing
    def _settings(self) -> dict:
        return {"out": self.out, "n_shards": self.n_shards, "sink": self.sink, "dtype": self.dtype,
                "n_examples": self.n_examples, "manifest": self._manifest_json}

    def _check_out(self) -> Optional[str]:
        if not os.path.exists(self.out):
            return None
        if not os.path.isdir(self.out):
            return f"{self.out} exists and is not a folder"
        names = os.listdir(self.out)
        if MANIFEST in names:
            return f"{self.out} already holds a {MANIFEST} (a finished capture); choose a new folder"
        shards = sorted(n for n in names if n.startswith("shard-"))
        if shards:
            return (f"{self.out} already holds shard folders ({shards[0]}, ...) of an earlier run; remove them or "
                    "choose a new folder")
        return None

    def _gather(self, obj, phase: str) -> List[dict]:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist  # noqa: PLC0415

        out = [None] * self.world
        self._post(phase)
        t0 = time.monotonic()
        try:
            dist.all_gather_object(out, obj, group=self._group)
        except Exception as e:  # noqa: BLE001  (gloo: a closed connection or the timeout)
            raise ShardedCaptureError(self._lost(phase, e, time.monotonic() - t0)) from e
        return out

    def _broadcast(self, obj, phase: str):
        if self.world == 1:
            return obj
        import torch.distributed as dist  # noqa: PLC0415

        box = [obj]
        self._post(phase)
        t0 = time.monotonic()
        try:
            dist.broadcast_object_list(box, src=0, group=self._group)
        except Exception as e:  # noqa: BLE001
            raise ShardedCaptureError(self._lost(phase, e, time.monotonic() - t0)) from e
        return box[0]

    def _post(self, phase: str) -> None:
        """Marks in the store that this rank reached ``phase`` (to name the ranks that did not)."""
        if self._store is None:
            return
        try:
            self._store.add(f"{self._key}/{phase}/{self.rank}", 1)  # add: PrefixStore (torch 1.13) has no check()
        except Exception:  # noqa: BLE001
            pass

    def _lost(self, phase: str, err: Exception, waited: float) -> str:
        """The message of a collective that failed: which ranks never reached it, when the store says."""
        missing = None
        if self._store is not None:
            try:
                missing = [r for r in range(self.world) if r != self.rank
                           and self._store.add(f"{self._key}/{phase}/{r}", 0) < 1]  # add(k, 0): read, never wait
            except Exception:  # noqa: BLE001  (the store lives in rank 0 or the launcher; it may be gone)
                missing = None
        who = ("rank(s) " + ", ".join(str(r) for r in missing) + " never reached it (died, killed or hung)"
               if missing else "the rank(s) that did not report could not be named (the store is unreachable)"
               if missing is None else "every rank reached it; a rank died during the exchange")
        return (f"sharded capture {self.out}: rank {self.rank}: the {phase} exchange failed after {waited:.1f} s "
                f"(timeout {self.timeout_s:g} s): {who}. No {MANIFEST} is written. ({type(err).__name__}: {err})")

    # ------------------------------------------------------------------ capture
    def shards(self) -> List[int]:
        """The shards this rank captures: rank, rank + world, ..."""
        return shards_of(self.n_shards, self.rank, self.world)

    def examples(self, shard: int) -> range:
        """The global example indices of ``shard`` (needs n_examples)."""
        if self.n_examples is None:
            raise ValueError("ShardedCapture.examples: n_examples was not given")
        return shard_examples(self.n_examples, self.n_shards, shard)

    def shard_path(self, shard: int) -> str:
        return os.path.join(self.out, shard_dir_name(shard))

    @contextlib.contextmanager
    def recorder(self, shard: int, **recorder_kwargs):
        """A Recorder for one shard (explicit example ids required). On a normal exit the shard's files
        are completed and the folder renamed to OUT/shard-SSSSS; on an exception the partial folder is
        removed and this rank's finish() reports the failure."""
        from .capture import Recorder  # noqa: PLC0415

        shard = int(shard)
        if shard not in self.shards():
            raise ValueError(f"ShardedCapture.recorder: shard {shard} is not one of rank {self.rank}'s shards "
                             f"{self.shards()} (n_shards {self.n_shards}, world {self.world})")
        if shard in self._written:
            raise ValueError(f"ShardedCapture.recorder: shard {shard} was already written")
        if self._finished:
            raise RuntimeError("ShardedCapture.recorder: finish() was already called")
        final = self.shard_path(shard)
        tmp = os.path.join(self.out, f".{shard_dir_name(shard)}.partial-r{self.rank}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        m = self.manifest
        rng = None if self.n_examples is None else self.examples(shard)
        kwargs = dict(buckets=m.buckets, seed=int(m.seed), heads=[(h.layer, h.q_head) for h in self.heads],
                      context_length=int(m.context_length),
                      rope_applied=m.rope_applied, model=m.model, explicit_example_ids=True,
                      example_id_range=None if rng is None else (rng.start, rng.stop))
        kwargs.update(recorder_kwargs)
        try:
            if self.sink == "dataset":
                sink = _ext.DatasetWriter(tmp, m, dtype=self.dtype)
            else:
                os.makedirs(tmp)  # the shard in progress (never a finished shard's name)
                sink = "moments"
            rec = Recorder(self.layout, sink=sink, **kwargs)
            yield rec
            rec.close()
            if self.sink == "moments":
                for hid, mom in rec.moments().items():
                    mom.save(os.path.join(tmp, moments_file_name(hid)), buckets=m.buckets)
            elif self.manifest_extra:
                path = os.path.join(tmp, MANIFEST)
                with open(path, encoding="utf-8") as f:
                    part = json.load(f)
                _write_json(path, _merge_extra(part, self.manifest_extra))
            info = {"format": SHARD_FORMAT, "version": FORMAT_VERSION, "shard": shard, "n_shards": self.n_shards,
                    "sink": self.sink, "rank": self.rank, "world_size": self.world, "rows": rec.rows_recorded(),
                    "examples": None if rng is None else [rng.start, rng.stop]}
            _write_json(os.path.join(tmp, SHARD_INFO), info)
            os.replace(tmp, final)  # complete: the shard appears under its final name in one step
            self._written[shard] = {"rows": info["rows"], "rank": self.rank}
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if self._error is None:
                self._error = f"shard {shard}: {type(e).__name__}: {e}"
            raise

    # ------------------------------------------------------------------ finish
    def finish(self, error: Optional[BaseException] = None) -> dict:
        """Collective: every rank reports; rank 0 writes OUT/manifest.json last, only when every rank
        succeeded and every shard 0..S-1 was written exactly once. Returns the run's manifest (a dict)
        on every rank; raises ShardedCaptureError (naming the failed ranks and their messages) on every
        rank otherwise. ``error``: this rank's own failure, reported to the others."""
        if self._finished:
            raise RuntimeError("ShardedCapture.finish: already called")
        self._finished = True
        message = self._error
        if error is not None and message is None:
            message = f"{type(error).__name__}: {error}"
        mine = {"rank": self.rank, "ok": message is None, "message": message, "host": socket.gethostname(),
                "pid": os.getpid(), "shards": {str(s): w for s, w in self._written.items()}}
        statuses = self._gather(mine, "finish")
        verdict = None
        if self.rank == 0:
            verdict = self._verdict(statuses)
        verdict = self._broadcast(verdict, "manifest")
        if not verdict["ok"]:
            raise ShardedCaptureError(verdict["message"])
        return verdict["manifest"]

    def _verdict(self, statuses: List[dict]) -> dict:
        failed = [s for s in statuses if not s["ok"]]
        if failed:
            names = ", ".join(f"rank {s['rank']} ({s['host']}, pid {s['pid']}): {s['message']}" for s in failed)
            return {"ok": False, "message": f"sharded capture {self.out}: {len(failed)} of {self.world} rank(s) "
                                            f"failed, no {MANIFEST} written: {names}"}
        shards = {}
        for s in statuses:
            for k, w in s["shards"].items():
                if int(k) in shards:
                    return {"ok": False, "message": f"sharded capture {self.out}: shard {k} written by ranks "
                                                    f"{shards[int(k)]['rank']} and {s['rank']}"}
                shards[int(k)] = w
        missing = [s for s in range(self.n_shards) if s not in shards]
        if missing:
            owners = ", ".join(f"shard {s} -> rank {s % self.world}" for s in missing)
            return {"ok": False, "message": f"sharded capture {self.out}: shard(s) {missing} were never captured "
                                            f"(owners: {owners}); every rank must capture every shard of shards(); "
                                            f"no {MANIFEST} written"}
        absent = [s for s in range(self.n_shards) if not os.path.isdir(self.shard_path(s))]
        if absent:
            return {"ok": False, "message": f"sharded capture {self.out}: rank 0 cannot see the folders of shard(s) "
                                            f"{absent}: OUT must be one folder shared by every rank (a shared file "
                                            f"system); no {MANIFEST} written"}
        run = {"format": FORMAT, "version": FORMAT_VERSION, "sink": self.sink,
               "dtype": self.dtype if self.sink == "dataset" else None, "n_shards": self.n_shards,
               "world_size": self.world, "n_examples": self.n_examples,
               "heads": [[h.layer, h.q_head, h.k_head] for h in self.heads],
               "shards": [{"shard": s, "dir": shard_dir_name(s), "rank": shards[s]["rank"], "rows": shards[s]["rows"]}
                          for s in range(self.n_shards)],
               "manifest": self._manifest_json}
        try:
            _write_json(os.path.join(self.out, MANIFEST), run)  # LAST: the run reads as complete from here on
        except OSError as e:
            return {"ok": False, "message": f"sharded capture {self.out}: rank 0 could not write {MANIFEST}: {e}"}
        return {"ok": True, "manifest": run}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._finished:
            return False
        if exc is None:
            self.finish()
            return False
        with contextlib.suppress(ShardedCaptureError):  # this rank's own exception is the one to raise
            self.finish(error=exc)
        return False


# ---------------------------------------------------------------------------------- reading
def read_sharded(out) -> dict:
    """The run manifest OUT/manifest.json of a finished sharded capture (format checked; every shard
    folder present, its shard.json matching). Without it, the capture did not finish."""
    out = os.path.abspath(os.fspath(out))
    path = os.path.join(out, MANIFEST)
    if not os.path.isfile(path):
        raise ShardedCaptureError(f"{out}: no {MANIFEST}: the sharded capture did not finish (a rank failed or died, "
                                  "or it is still running); its shard folders are not a complete capture")
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    if run.get("format") != FORMAT:
        raise ShardedCaptureError(f"{path}: format {run.get('format')!r}, expected {FORMAT!r} (a sharded capture)")
    if int(run.get("version", 0)) > FORMAT_VERSION:
        raise ShardedCaptureError(f"{path}: version {run.get('version')} is newer than this qkgeom reads "
                                  f"({FORMAT_VERSION})")
    n = int(run["n_shards"])
    if [int(s["shard"]) for s in run["shards"]] != list(range(n)):
        raise ShardedCaptureError(f"{path}: shards must list 0..{n - 1} in order")
    for s in run["shards"]:
        d = os.path.join(out, s["dir"])
        info_path = os.path.join(d, SHARD_INFO)
        if not os.path.isfile(info_path):
            raise ShardedCaptureError(f"{d}: missing ({SHARD_INFO} absent): the capture is incomplete")
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
        if int(info["shard"]) != int(s["shard"]) or int(info["n_shards"]) != n or info["sink"] != run["sink"]:
            raise ShardedCaptureError(f"{info_path}: shard {info['shard']} of {info['n_shards']} ({info['sink']}), "
                                      f"expected shard {s['shard']} of {n} ({run['sink']})")
    return run


def sharded_manifest(out) -> "_ext.Manifest":
    """The capture's Manifest (as the ranks were given it) of a finished sharded capture."""
    return _manifest_from_json(read_sharded(out)["manifest"])


def load_sharded_moments(out) -> Dict:
    """{HeadId: HeadMoments} of a finished moments capture: each planned head's shard files merged with
    ``+=`` in shard order 0..S-1 (the same bits whatever the number of processes that wrote them)."""
    out = os.path.abspath(os.fspath(out))
    run = read_sharded(out)
    if run["sink"] != "moments":
        raise ShardedCaptureError(f"{out}: a sharded {run['sink']} capture, not moments "
                                  "(use merge_sharded_dataset)")
    man = _manifest_from_json(run["manifest"])
    d = int(man.head_dim)
    result = {}
    for h in _ext.planned_heads(man):
        total = _ext.HeadMoments(d, h)
        for s in run["shards"]:
            path = os.path.join(out, s["dir"], moments_file_name(h))
            part = _ext.load_moments(path)
            got = part.id
            if (got.layer, got.q_head, got.k_head) != (h.layer, h.q_head, h.k_head) or part.dim != d:
                raise ShardedCaptureError(f"{path}: head {tuple(got)} d {part.dim}, expected {tuple(h)} d {d}")
            total += part
        result[h] = total
    return result


def merge_sharded_dataset(out, dest, *, buffer_bytes: int = 64 << 20) -> str:
    """Joins the dataset parts of a finished sharded capture into ONE ordinary dataset at ``dest``
    (absent or empty): entry by entry, the parts' rows in shard order 0..S-1, written by DatasetWriter
    in the parts' dtype (rows are read widened to float64 and stored back exactly). Memory: one
    part's entry (as float64) plus ``buffer_bytes``. The writer's close refuses a token held twice
    (two shards given one example id). manifest.json is written last; fields the parts' manifests
    carry beyond the Manifest (rope.attention_factor) are kept. Returns dest."""
    out = os.path.abspath(os.fspath(out))
    dest = os.path.abspath(os.fspath(dest))
    run = read_sharded(out)
    if run["sink"] != "dataset":
        raise ShardedCaptureError(f"{out}: a sharded {run['sink']} capture, not a dataset "
                                  "(use load_sharded_moments)")
    man = _manifest_from_json(run["manifest"])
    parts = [os.path.join(out, s["dir"]) for s in run["shards"]]
    part_man = [_ext.read_manifest(p) for p in parts]
    entries = set()
    for h in _ext.planned_heads(man):
        entries.add((h.layer, "q", h.q_head))
        entries.add((h.layer, "k", h.k_head))
    writer = _ext.DatasetWriter(dest, man, dtype=run["dtype"], buffer_bytes=int(buffer_bytes))
    for layer, kind, head in sorted(entries):
        name = _entry_name(layer, head, kind)
        for p, pm in zip(parts, part_man):
            if not os.path.isdir(os.path.join(p, name)):
                continue  # no kept token of this entry in that shard
            e = _ext.read_entry(p, pm, layer, head, kind)
            writer.append(layer, kind, head, e["vectors"], e["position"], e["example_id"])
            del e
    writer.close()
    with open(os.path.join(parts[0], MANIFEST), encoding="utf-8") as f:
        first = json.load(f)
    path = os.path.join(dest, MANIFEST)
    with open(path, encoding="utf-8") as f:
        written = json.load(f)
    extra = _extra_fields(first, written)
    if extra:
        _write_json(path, _merge_extra(written, extra))
    return dest


def _extra_fields(src: dict, dst: dict) -> dict:
    """The fields of src (nested dicts included) that dst lacks."""
    out = {}
    for k, v in src.items():
        if k not in dst:
            out[k] = v
        elif isinstance(v, dict) and isinstance(dst[k], dict):
            sub = _extra_fields(v, dst[k])
            if sub:
                out[k] = sub
    return out


# ---------------------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python3 -m qkgeom.distributed",
                                 description="Read a finished sharded capture (qkgeom.distributed).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a1 = sub.add_parser("merge", help="dataset parts -> one dataset (shard order)")
    a1.add_argument("out")
    a1.add_argument("-o", "--dest", required=True)
    a2 = sub.add_parser("moments", help="moments shards -> one merged lLLhHH.qkm per planned head (shard order)")
    a2.add_argument("out")
    a2.add_argument("-o", "--dest", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "merge":
        merge_sharded_dataset(a.out, a.dest)
        print(f"{a.out} -> {a.dest}")
        return 0
    merged = load_sharded_moments(a.out)
    os.makedirs(a.dest, exist_ok=True)
    buckets = sharded_manifest(a.out).buckets
    for h, m in merged.items():
        m.save(os.path.join(a.dest, moments_file_name(h)), buckets=buckets)
    print(f"{len(merged)} heads merged into {a.dest}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ShardedCaptureError as e:
        print(f"qkgeom.distributed: error: {e}", file=sys.stderr)
        sys.exit(1)
