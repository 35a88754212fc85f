"""qkgeom.distributed: a capture of the trained tiny model split into S shards across processes
(CTest python.capture.sharded; argv[1] = scratch folder).

* Unit checks: shards_of covers every shard exactly once for several (S, W); shard_examples tiles
  0..n-1 in order; a shard's Recorder refuses the running example counter and ids outside its block;
  a failed shard leaves no shard folder and finish() names the rank and its message.
* Two gloo processes (subprocesses of this file: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, as
  torchrun sets them) capture S = 3 shards, into moments and into dataset parts. The same capture in
  ONE process (same S) must give: the merged moments of every head bit for bit (saved files compared
  byte by byte), the merged dataset byte for byte, analyze_dataset's head metrics exactly. The shards
  must really come from both ranks (the run manifest's owners), and the merged result must hold what an
  unsharded Recorder over all examples holds (same kept tokens, row counts; values to float rounding):
  the sharding neither loses nor repeats an example.
* A rank killed (SIGKILL) in the middle of a shard, a rank that raises, and a rank that hangs: the
  surviving rank fails within a bounded time with a message naming rank 1, and no manifest.json exists.
Exit 77 when torch or NumPy is missing.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

try:
    import numpy as np
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DATA = os.path.join(ROOT, "tests", "data", "tiny_llama")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
from _checks import check, files_of, finish, raises  # noqa: E402  (tests/python/capture/_checks.py)
import qkgeom  # noqa: E402
from qkgeom import distributed as qd  # noqa: E402
from qkgeom.capture import Recorder, manifest_for  # noqa: E402

S = 3            # logical shards: 4 examples -> blocks of 1, 1, 2
SEED, HEAD_SEED = 1234, 0
SPEC = ("uniform", 32, 8.0)


def load():
    import tiny_llama as tl  # examples/python/tiny_llama.py

    torch.set_num_threads(1)
    model = tl.load_model(DATA)
    tokens = np.load(os.path.join(DATA, "tokens.npy"))
    positions = np.load(os.path.join(DATA, "positions.npy"))
    return tl, model, tokens, positions


def manifest_of(model):
    cfg = model.cfg
    layout = qkgeom.ModelLayout(cfg.head_dim, [cfg.n_heads] * cfg.n_layers, [cfg.n_kv_heads] * cfg.n_layers)
    return manifest_for(layout, model="tiny-llama", buckets=qkgeom.BucketSpec(*SPEC),
                        context_length=cfg.context_length, seed=SEED, head_count=None, head_seed=HEAD_SEED,
                        rope=dict(pairing="rotate_half", rotary_dim=cfg.head_dim, theta=cfg.rope_theta),
                        rope_applied=[True] * cfg.n_layers)


def capture(run, tl, model, tokens, positions, on_shard=None):
    """Every shard of this rank: its block of examples in one forward, global example ids."""
    for s in run.shards():
        ex = run.examples(s)
        with run.recorder(s) as rec:
            if len(ex):
                with torch.no_grad(), rec.patch(tl, "apply_rotary_pos_emb"):
                    rec.set_batch(torch.from_numpy(positions[ex.start:ex.stop]),
                                  example_ids=np.arange(ex.start, ex.stop))
                    model(torch.from_numpy(tokens[ex.start:ex.stop]), torch.from_numpy(positions[ex.start:ex.stop]))
            if on_shard is not None:
                on_shard(s)


# ---------------------------------------------------------------------------------- worker
def worker(mode, out):
    """One rank of a 2-process run (env:// rendezvous, gloo). Exit 0 = finished, 3 = ShardedCaptureError."""
    dist.init_process_group("gloo", init_method="env://")
    tl, model, tokens, positions = load()
    man = manifest_of(model)
    rank = dist.get_rank()
    timeout = 600 if mode == "capture" else 6
    try:
        if mode == "capture":
            for sink in ("moments", "dataset"):
                with qd.ShardedCapture(os.path.join(out, sink), n_shards=S, manifest=man, sink=sink,
                                       n_examples=len(tokens), timeout_s=timeout) as run:
                    capture(run, tl, model, tokens, positions)
        else:
            def planted(s):
                if rank != 1:
                    return
                if mode == "kill":       # rows already recorded, shard folder not yet complete
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "fail":
                    raise ValueError(f"planted failure in shard {s}")
                if mode == "hang":
                    time.sleep(120)

            with qd.ShardedCapture(out, n_shards=4, manifest=man, sink="moments", n_examples=len(tokens),
                                   timeout_s=timeout) as run:
                capture(run, tl, model, tokens, positions, on_shard=planted)
    except qd.ShardedCaptureError as e:
        print(f"rank {rank}: ShardedCaptureError: {e}", flush=True)
        sys.exit(3)
    except ValueError as e:
        print(f"rank {rank}: ValueError: {e}", flush=True)
        sys.exit(4)
    print(f"rank {rank}: done", flush=True)
    sys.exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode, out, world=2, wait=120):
    """Runs `world` workers; returns ([returncode], [output], seconds until rank 0 ended)."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", mode, out], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    t0 = time.monotonic()
    outs, codes, t_rank0 = [], [], None
    for i, p in enumerate(procs):
        try:
            o, _ = p.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
        if i == 0:
            t_rank0 = time.monotonic() - t0
        outs.append(o)
        codes.append(p.returncode)
    for r, (c, o) in enumerate(zip(codes, outs)):
        print(f"--- {mode} rank {r}: exit {c}\n{o.strip()[-1500:]}")
    return codes, outs, t_rank0


def launch_hang(out):
    """Rank 1 sleeps in its shard: rank 0 must give up after the group's timeout; rank 1 is then killed."""
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "hang", out], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    t0 = time.monotonic()
    try:
        o0, _ = procs[0].communicate(timeout=90)
    except subprocess.TimeoutExpired:
        procs[0].kill()
        o0, _ = procs[0].communicate()
    took = time.monotonic() - t0
    procs[1].kill()
    procs[1].communicate()
    print(f"--- hang rank 0: exit {procs[0].returncode} after {took:.1f} s\n{o0.strip()[-1500:]}")
    return procs[0].returncode, o0, took


# ---------------------------------------------------------------------------------- checks
def unit_checks(work, tl, model, tokens, positions):
    for n_shards in (1, 2, 3, 7, 8, 16):
        for world in (1, 2, 3, 4, 8, 9):
            got = [qd.shards_of(n_shards, r, world) for r in range(world)]
            flat = sorted(s for g in got for s in g)
            check(flat == list(range(n_shards)), f"shards_of({n_shards}, *, {world}) covers 0..S-1 once: {got}")
            check(all(g == sorted(g) and all(s % world == r for s in g) for r, g in enumerate(got)),
                  f"shards_of({n_shards}, r, {world}): rank r holds the shards = r mod W: {got}")
    for n in (0, 1, 4, 10, 101):
        for n_shards in (1, 3, 4, 7):
            blocks = [list(qd.shard_examples(n, n_shards, s)) for s in range(n_shards)]
            check(sum(blocks, []) == list(range(n)), f"shard_examples({n}, {n_shards}) tile 0..n-1 in order")
            check(max(len(b) for b in blocks) - min(len(b) for b in blocks) <= 1, f"blocks balanced {n}/{n_shards}")
    raises(lambda: qd.shards_of(4, 2, 2), "rank 2 outside", "shards_of rank >= world")
    raises(lambda: qd.shards_of(0, 0, 1), "n_shards must be >= 1", "shards_of S = 0")
    check(qd.rank_world() == (0, 1), f"no process group: rank_world() == (0, 1) (got {qd.rank_world()})")

    man = manifest_of(model)
    # the running counter is refused, and ids outside the shard's block
    out = os.path.join(work, "refusals")
    shutil.rmtree(out, ignore_errors=True)
    run = qd.ShardedCapture(out, n_shards=2, manifest=man, sink="moments", n_examples=4)
    pos, tok = torch.from_numpy(positions[:2]), torch.from_numpy(tokens[:2])

    def counter_ids():
        with run.recorder(0) as rec, torch.no_grad(), rec.patch(tl, "apply_rotary_pos_emb"):
            rec.set_batch(pos)
            model(tok, pos)
    raises(counter_ids, "explicit example ids", "a shard's Recorder refuses the running counter")
    check(not os.path.exists(run.shard_path(0)), "a failed shard leaves no shard folder")
    check(not [n for n in os.listdir(out) if n.startswith(".")], f"no partial folder left: {os.listdir(out)}")

    def foreign_ids():
        with run.recorder(1) as rec, torch.no_grad(), rec.patch(tl, "apply_rotary_pos_emb"):
            rec.set_batch(pos, example_ids=[0, 1])  # shard 1 holds examples 2, 3
            model(tok, pos)
    raises(foreign_ids, "outside this recorder's examples [2, 4)", "ids outside the shard's block refused")
    raises(lambda: run.finish(), "rank 0", "finish after a failed shard: ShardedCaptureError naming the rank",
           errors=(qd.ShardedCaptureError,))
    raises(lambda: run.finish(), "already called", "finish twice", errors=(RuntimeError,))
    check(not os.path.exists(os.path.join(out, "manifest.json")), "no manifest after a failed shard")
    raises(lambda: qd.load_sharded_moments(out), "did not finish", "reading an unfinished capture refused",
           errors=(qd.ShardedCaptureError,))
    raises(lambda: qd.ShardedCapture(out, n_shards=2, manifest=man, sink="moments").recorder(5).__enter__(),
           "not one of rank 0's shards", "recorder of a shard that is not this rank's")
    # an OUT holding a finished shard of an earlier run is refused
    old = os.path.join(work, "old")
    shutil.rmtree(old, ignore_errors=True)
    os.makedirs(os.path.join(old, "shard-00000"))
    raises(lambda: qd.ShardedCapture(old, n_shards=2, manifest=man), "shard folders", "OUT with old shards refused",
           errors=(qd.ShardedCaptureError,))

    # a shard never captured: finish refuses, naming it and its rank
    skip = os.path.join(work, "skipped")
    shutil.rmtree(skip, ignore_errors=True)
    run = qd.ShardedCapture(skip, n_shards=2, manifest=man, sink="moments", n_examples=4)
    with run.recorder(0) as rec, torch.no_grad(), rec.patch(tl, "apply_rotary_pos_emb"):
        rec.set_batch(pos, example_ids=[0, 1])
        model(tok, pos)
    raises(lambda: run.finish(), "shard(s) [1] were never captured (owners: shard 1 -> rank 0)",
           "finish with a shard not captured", errors=(qd.ShardedCaptureError,))
    check(os.path.isdir(run.shard_path(0)) and not os.path.exists(os.path.join(skip, "manifest.json")),
          "the captured shard stays, no manifest")
    # torchrun's environment without an initialised process group is refused
    os.environ["WORLD_SIZE"] = "2"
    try:
        raises(lambda: qd.ShardedCapture(os.path.join(work, "noinit"), n_shards=2, manifest=man),
               "not initialised", "WORLD_SIZE=2 without init_process_group", errors=(qd.ShardedCaptureError,))
    finally:
        del os.environ["WORLD_SIZE"]

    # empty shards (S > examples) are written and read: S = 6 over 4 examples
    out6 = os.path.join(work, "w1_s6")
    shutil.rmtree(out6, ignore_errors=True)
    with qd.ShardedCapture(out6, n_shards=6, manifest=man, sink="moments", n_examples=len(tokens)) as run6:
        capture(run6, tl, model, tokens, positions)
    return qd.load_sharded_moments(out6)


def bucket_bytes(m, kind):
    b = m.buckets(kind)
    return {k: {f: np.asarray(v[f]).tobytes() for f in v} for k, v in b.items()}


def same_cell(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return a == b


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-sharded"
    os.makedirs(work, exist_ok=True)
    t_start = time.monotonic()
    tl, model, tokens, positions = load()
    man = manifest_of(model)
    heads = list(qkgeom.planned_heads(man))
    m6 = unit_checks(work, tl, model, tokens, positions)

    # --- one process, S shards
    w1 = os.path.join(work, "w1")
    shutil.rmtree(w1, ignore_errors=True)
    for sink in ("moments", "dataset"):
        with qd.ShardedCapture(os.path.join(w1, sink), n_shards=S, manifest=man, sink=sink,
                               n_examples=len(tokens)) as run:
            capture(run, tl, model, tokens, positions)
    # --- two processes (gloo), the same S
    w2 = os.path.join(work, "w2")
    shutil.rmtree(w2, ignore_errors=True)
    codes, _, _ = launch("capture", w2)
    check(codes == [0, 0], f"2-process capture: exit statuses {codes}")
    if codes != [0, 0]:
        return finish()

    run2 = qd.read_sharded(os.path.join(w2, "moments"))
    check([s["rank"] for s in run2["shards"]] == [0, 1, 0] and run2["world_size"] == 2,
          f"2-process run: shards 0, 2 by rank 0 and 1 by rank 1 ({[s['rank'] for s in run2['shards']]})")
    a, b = qd.load_sharded_moments(os.path.join(w1, "moments")), qd.load_sharded_moments(os.path.join(w2, "moments"))
    check(sorted(map(tuple, a)) == sorted(map(tuple, heads)) == sorted(map(tuple, b)), "every planned head merged")
    same = 0
    for h in heads:
        pa, pb = os.path.join(work, "a.qkm"), os.path.join(work, "b.qkm")
        a[h].save(pa)
        b[h].save(pb)
        with open(pa, "rb") as fa, open(pb, "rb") as fb:
            ok = fa.read() == fb.read()
        ok = ok and all(bucket_bytes(a[h], k) == bucket_bytes(b[h], k) for k in ("query", "key"))
        same += ok
        check(ok, f"head {tuple(h)}: merged moments W=1 vs W=2 bit for bit")
    print(f"{same}/{len(heads)} heads: merged moments identical, W = 1 and 2, S = {S}")
    # the comparison can fail: merging the same shards in rank order (0, 2, 1) changes the bits
    moved = 0
    for h in heads:
        r = qkgeom.HeadMoments(man.head_dim, h)
        for s in (0, 2, 1):
            r += qkgeom.load_moments(os.path.join(w2, "moments", qd.shard_dir_name(s), qd.moments_file_name(h)))
        moved += any(bucket_bytes(r, k) != bucket_bytes(b[h], k) for k in ("query", "key"))
    check(moved > 0, f"merging in rank order changes the bits of {moved}/{len(heads)} heads (shard order matters)")

    # the merge holds what an unsharded capture of all examples holds (nothing lost or repeated)
    direct = Recorder(qkgeom.layout_of(man), buckets=man.buckets, seed=SEED, context_length=man.context_length,
                      heads=[(h.layer, h.q_head) for h in heads], explicit_example_ids=True)
    with torch.no_grad(), direct.patch(tl, "apply_rotary_pos_emb"):
        direct.set_batch(torch.from_numpy(positions), example_ids=np.arange(len(tokens)))
        model(torch.from_numpy(tokens), torch.from_numpy(positions))
    dm = direct.moments()
    for h in heads:
        for kind in ("query", "key"):
            check(a[h].rows(kind) == dm[h].rows(kind) == m6[h].rows(kind) > 0,
                  f"head {tuple(h)} {kind}: rows sharded S=3 {a[h].rows(kind)}, S=6 {m6[h].rows(kind)} "
                  f"== unsharded {dm[h].rows(kind)}")
            ba, bd = a[h].buckets(kind), dm[h].buckets(kind)
            check(sorted(ba) == sorted(bd) and all(ba[k]["n"] == bd[k]["n"] for k in ba),
                  f"head {tuple(h)} {kind}: the same buckets and counts as unsharded")
            worst = max(float(np.max(np.abs(np.asarray(ba[k][f]) - np.asarray(bd[k][f]))) /
                              (1e-30 + np.max(np.abs(np.asarray(bd[k][f])))))
                        for k in ba for f in ("mean_x", "c_xx", "mean_t"))
            check(worst < 1e-4, f"head {tuple(h)} {kind}: moments == unsharded to float32 rounding ({worst:.2e})")

    # datasets: merged parts byte for byte, analysis exactly
    da, db = os.path.join(work, "merged_w1"), os.path.join(work, "merged_w2")
    for d in (da, db):
        shutil.rmtree(d, ignore_errors=True)
    qd.merge_sharded_dataset(os.path.join(w1, "dataset"), da)
    rc = subprocess.run([sys.executable, "-m", "qkgeom.distributed", "merge", os.path.join(w2, "dataset"), "-o", db],
                        capture_output=True, text=True)
    check(rc.returncode == 0, f"python3 -m qkgeom.distributed merge: exit {rc.returncode} {rc.stderr[-500:]}")
    fa, fb = files_of(da), files_of(db)
    check(len(fa) > 4 and fa == fb, f"merged datasets W=1 vs W=2: {len(fa)} files, identical: {fa == fb}")
    ra, rb = qkgeom.analyze_dataset(da), qkgeom.analyze_dataset(db)
    check(len(ra.heads) == len(heads) == len(rb.heads) and not ra.failures,
          f"analysed {len(ra.heads)} / {len(rb.heads)} heads of {len(heads)}; failures {ra.failures}")
    n_cells = 0
    for x, y in zip(ra.heads, rb.heads):
        mx, my = x.metrics, y.metrics
        check(list(mx) == list(my) and all(same_cell(mx[c], my[c]) for c in mx), f"head {tuple(x.id)}: metrics equal")
        n_cells += len(mx)
    print(f"analyze_dataset: {len(ra.heads)} heads, {n_cells} head_metrics cells identical")
    # the merged dataset holds the unsharded capture's tokens, in example order
    for h in heads[:4]:
        e = qkgeom.read_entry(da, ra.manifest, h.layer, h.q_head, "q")
        ex = e["example_id"]
        check(bool(np.all(np.diff(ex) >= 0)), f"head {tuple(h)}: rows in example order (shard order = example order)")
        check(len(ex) == dm[h].rows("query"), f"head {tuple(h)}: {len(ex)} dataset rows == {dm[h].rows('query')}")

    # --- a killed rank, a failing rank, a hung rank: no manifest, rank 0's message names rank 1
    for mode, text in (("kill", "rank(s) 1 never reached it"), ("fail", "rank 1 (")):
        out = os.path.join(work, mode)
        shutil.rmtree(out, ignore_errors=True)
        codes, outs, took = launch(mode, out)
        check(codes[0] == 3 and text in outs[0], f"{mode}: rank 0 exits 3 naming rank 1 ({text!r}): exit {codes[0]}")
        check(took < 60, f"{mode}: rank 0 ended within 60 s ({took:.1f} s)")
        check(not os.path.exists(os.path.join(out, "manifest.json")), f"{mode}: no manifest.json")
        if mode == "kill":
            check(codes[1] == -signal.SIGKILL, f"kill: rank 1 died of SIGKILL (exit {codes[1]})")
            check(any(n.startswith(".shard-00001.partial-r1") for n in os.listdir(out)) and
                  not os.path.exists(os.path.join(out, "shard-00001")),
                  f"kill: rank 1's shard left only as a partial folder: {sorted(os.listdir(out))}")
        if mode == "fail":
            check(codes[1] == 4 and "planted failure in shard 1" in outs[0],
                  f"fail: rank 1 raised its own error (exit {codes[1]}); rank 0 quotes its message")
    out = os.path.join(work, "hang")
    shutil.rmtree(out, ignore_errors=True)
    code, o0, took = launch_hang(out)
    check(code == 3 and "rank(s) 1 never reached it" in o0, f"hang: rank 0 exits 3 naming rank 1 (exit {code})")
    check(took < 45, f"hang: rank 0 gave up within the timeout (6 s) + start-up ({took:.1f} s)")
    check(not os.path.exists(os.path.join(out, "manifest.json")), "hang: no manifest.json")
    print(f"total {time.monotonic() - t_start:.1f} s")
    return finish()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    sys.exit(main())
