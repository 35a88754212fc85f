"""qkgeom from Python refuses what the program refuses (issue 31, classes 2, 7 and 10): one
validation shared by every front end (qkgeom/core/validate.hpp), each refusal naming the argument
or field and the value, fast and before anything large is allocated.

- class 7 (contradictions): context_length below the largest position; Options(low=0.8, high=0.2),
  NaN thresholds or ks_alpha, a threshold set later that contradicts the other (refused where the
  options are used); analyze_moments with key rows other than the moments' own (another head's
  rows of the same count; the right rows in other batches are accepted); BucketSpec width 0, rate
  -1 / NaN, refused when made or changed; DatasetWriter.close() after a failed write (a file size
  limit: EFBIG) writes no manifest.json
- class 2 (unbounded work): d = 30,000 / 200,000 refused by HeadMoments and analyze_head /
  analyze_moments in well under a second and 100 MB (the shard files' limit 4096); options asking
  10^12 rank sets, samples or budgets, seeds >= 2^63, jobs / context / window outside the
  program's ranges; Ctrl-C (SIGINT) during one analyze_head call, analyze_dataset and qkgeom.study raises
  KeyboardInterrupt after the heads in progress, leaves the study cache without debris, and a
  rerun completes with the numbers of an uninterrupted run
- class 10 (vague messages): positions beyond int64 name the argument and value (not "dtype
  object"); options of the wrong type name Options.<name> and the value's type; a boolean option
  given a string is refused, never read as True
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time

from module_common import Checks, run, setup

args = setup(__doc__)
import numpy as np  # noqa: E402

import qkgeom as q  # noqa: E402

check = Checks()
W = args.work
rng = np.random.default_rng(3)
d, n = 16, 600
spec = q.BucketSpec("uniform", 64, 1.0)
pos = np.arange(n, dtype=np.int64) % 400
Q = rng.standard_normal((n, d)).astype(np.float32)
K = rng.standard_normal((n, d)).astype(np.float32)


def head(**kw):
    return q.analyze_head(Q, pos, K, pos, buckets=spec, **kw)


def bounded(fn, what, seconds=1.0, mb=100):
    """fn() raises ValueError within `seconds` and `mb` more resident memory; returns the message."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    try:
        fn()
        msg = None
    except ValueError as e:
        msg = str(e)
    dt = time.monotonic() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    check(msg is not None, f"{what}: accepted")
    check(dt < seconds, f"{what}: took {dt:.2f} s")
    check(grown < mb, f"{what}: resident memory grew {grown:.0f} MB")
    return msg or ""


# --- class 7: contradictions ------------------------------------------------------------------
check.raises(ValueError, lambda: head(context_length=300), ["context_length", "399", "300", "q_positions"],
             "context_length below the largest position")
r = head(context_length=400)
check(r.n_q_tokens == n, "context_length = largest position + 1 is accepted")

check.raises(ValueError, lambda: q.Options(low=0.8, high=0.2), ["low", "high", "0.8", "0.2"], "low > high")
check.raises(ValueError, lambda: q.Options(low=float("nan")), ["Options.low", "nan"], "NaN low")
check.raises(ValueError, lambda: q.Options(high=float("nan")), ["Options.high", "nan"], "NaN high")
check.raises(ValueError, lambda: q.Options(high=1.5), ["Options.high", "1.5"], "high above 1")
check.raises(ValueError, lambda: q.Options(ks_alpha=float("nan")), ["Options.ks_alpha", "nan"], "NaN ks_alpha")
check.raises(ValueError, lambda: q.Options(ks_alpha=1.0), ["Options.ks_alpha", "1"], "ks_alpha 1")
o = q.Options()
o.low = 0.9  # in [0, 1] alone; contradicts high = 0.7
check.raises(ValueError, lambda: head(options=o), ["analyze_head", "low", "high", "0.9", "0.7"],
             "a contradiction set by attribute is refused where the options are used")
check(q.Options(low=0.2, high=0.2).low == 0.2, "low == high is accepted")

# analyze_moments: the key rows must be the moments' own
m = q.HeadMoments(d, q.HeadId(0, 0, 0))
bq = q.bucket_of(spec, pos)
m.add("query", Q, pos, bq)
m.add("key", K[:300], pos[:300], bq[:300])  # two batches: rounding differs from one pass
m.add("key", K[300:], pos[300:], bq[300:])
ok = q.analyze_moments(m, K, pos, buckets=spec)
check(ok.n_k_tokens == n, "analyze_moments with the moments' own key rows (added in two batches) is accepted")
check.raises(ValueError, lambda: q.analyze_moments(m, K, pos, buckets=spec, context_length=10),
             ["analyze_moments", "k_positions", "context_length", "399"], "analyze_moments: context below the keys")
other = rng.standard_normal((n, d)).astype(np.float32)
check.raises(ValueError, lambda: q.analyze_moments(m, other, pos, buckets=spec),
             ["analyze_moments", "keys", "not the rows the key moments were reduced from", "mean of column"],
             "analyze_moments with another head's key rows (same count and positions)")
shifted = np.roll(pos, 7)
check.raises(ValueError, lambda: q.analyze_moments(m, K, shifted, buckets=spec), ["keys", "bucket"],
             "analyze_moments with the key positions of other rows")

# BucketSpec: refused when made or changed, not when used
check.raises(ValueError, lambda: q.BucketSpec("uniform", 0), ["BucketSpec", "width", "0"], "width 0")
check.raises(ValueError, lambda: q.BucketSpec("log", -4), ["BucketSpec", "width", "-4"], "log width -4")
check.raises(ValueError, lambda: q.BucketSpec("uniform", 64, -1.0), ["BucketSpec", "rate", "-1"], "rate -1")
check.raises(ValueError, lambda: q.BucketSpec("uniform", 64, float("nan")), ["rate", "nan"], "rate NaN")
s = q.BucketSpec("uniform", 64)


def set_width():
    s.width = 0


check.raises(ValueError, set_width, ["width", "0"], "width set to 0")
check(s.width == 64, "a refused width leaves the spec unchanged")

# DatasetWriter: a failed write, then close(): no manifest.json for a capture that lacks rows
wdir = os.path.join(W, "efbig")
child = r"""
import os, resource, signal, sys
import numpy as np
import qkgeom as q
d, wdir = 16, sys.argv[1]
lay = q.ModelLayout(d, [1], [1])
from qkgeom.capture import manifest_for
man = manifest_for(lay, model="m", buckets=q.BucketSpec("uniform", 64), context_length=512, seed=0)
w = q.DatasetWriter(wdir, man, dtype="f32", buffer_bytes=1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    w.append(0, "q", 0, np.ones((400, d), np.float32), np.arange(400), np.zeros(400, np.int64))
    print("append: accepted")
except OSError as e:
    print("append: OSError", e)
try:
    w.close()
    print("close: accepted")
except OSError as e:
    print("close: OSError", str(e).replace("\n", " "))
"""
r = subprocess.run([sys.executable, "-c", child, wdir], capture_output=True, text=True)
out = r.stdout + r.stderr
check("append: OSError" in out, f"the over-limit append fails with OSError: {out[-400:]!r}")
check("close: OSError" in out and "earlier write failed" in out and "manifest.json" in out,
      f"close() after the failed write is refused naming why: {out[-400:]!r}")
check(not os.path.exists(os.path.join(wdir, "manifest.json")), "no manifest.json after a failed write")

# --- class 2: unbounded work refused up front ----------------------------------------------------
msg = bounded(lambda: q.HeadMoments(30000), "HeadMoments(30000)")
check("30000" in msg and "4096" in msg and "HeadMoments" in msg, f"HeadMoments(30000): {msg!r}")
msg = bounded(lambda: q.HeadMoments(200000), "HeadMoments(200000)")
check("200000" in msg and "4096" in msg, f"HeadMoments(200000): {msg!r}")
big = rng.standard_normal((4, 30000)).astype(np.float32)
p4 = np.arange(4)
msg = bounded(lambda: q.analyze_head(big, p4, big, p4, buckets=spec), "analyze_head of 4 rows of d = 30000")
check("queries" in msg and "30000" in msg and "4096" in msg, f"analyze_head d = 30000: {msg!r}")
msg = bounded(lambda: q.analyze_moments(m, big, p4, buckets=spec), "analyze_moments of d = 30000 keys")
check("keys" in msg and "30000" in msg, f"analyze_moments d = 30000: {msg!r}")

for name, value, rng_text in [("rank_sets", 10**12, "1..1000000"), ("samples", 10**12, "1..1000000000"),
                              ("empirical_budget", 10**12, "4..1000000000"), ("components", 0, "1..4096"),
                              ("rank_keys", 65, "2..64"), ("rope_bands", 0, "1..2048"),
                              ("seed", 2**63, "0..9223372036854775807"), ("seed", -1, "0..9223372036854775807"),
                              ("max_exact_pairs", 2**80, "0..4611686018427387904"),
                              ("empirical_max_exact", -5, "0..4611686018427387904"),
                              ("empirical_pairs", 10**7, "0..1000000")]:
    check.raises(ValueError, lambda: q.Options(**{name: value}), ["Options." + name, str(value), rng_text],
                 f"Options({name}={value})")
o = q.Options()


def set_rank_sets():
    o.rank_sets = 10**12


check.raises(ValueError, set_rank_sets, ["Options.rank_sets", "1000000000000", "1..1000000"], "rank_sets attribute")
check(o.rank_sets == 16, "a refused value leaves the option unchanged")
check(q.Options(rank_sets=10**6, samples=10**9).rank_sets == 10**6, "the range ends are accepted")
check(q.Options(samples=np.int64(500)).samples == 500, "a NumPy integer is accepted")

# --- class 10: messages naming the argument and the value -------------------------------------------
check.raises(ValueError, lambda: q.analyze_head(Q[:2], [0, 2**70], K[:2], [0, 1], buckets=spec),
             ["q_positions", str(2**70), "int64"], "a position beyond int64")
check.raises(TypeError, lambda: q.analyze_head(Q[:2], [0, "x"], K[:2], [0, 1], buckets=spec),
             ["q_positions", "integers"], "a string among the positions")
check.raises(TypeError, lambda: q.Options(diagnostics="no"), ["Options.diagnostics", "str", "'no'"],
             "a string for a boolean option is refused, not read as True")
check.raises(TypeError, lambda: q.Options(split=1), ["Options.split", "int"], "an integer for a boolean option")
check.raises(TypeError, lambda: q.Options(components=2.5), ["Options.components", "float", "2.5"],
             "a float for an integer option")
check.raises(TypeError, lambda: q.Options(samples="10"), ["Options.samples", "str"], "a string for an integer")
check.raises(TypeError, lambda: q.Options(low="0.3"), ["Options.low", "str"], "a string for a threshold")
check.raises(TypeError, lambda: q.Options(pairs=3), ["Options.pairs", "int"], "a number for a policy")

# --- class 2: Ctrl-C during analyze_dataset and qkgeom.study ---------------------------------------
if not args.qkgeom:
    print("no qkgeom program: the interruption checks are skipped")
else:
    cap = os.path.join(W, "cap")
    run(args.qkgeom, "synth", cap, "--layers", 4, "--quiet")
    study_file = os.path.join(W, "study.json")
    with open(study_file, "w") as f:
        json.dump({"runs": [{"name": "a", "capture": "cap"}]}, f)
    child = r"""
import os, signal, sys, threading, time
import qkgeom as q
what, target, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
opts = q.Options(rank_sets=1000)  # ~0.1 s a head: a run of some seconds
t0 = time.monotonic()
if delay > 0:
    threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    if what == "dataset":
        r = q.analyze_dataset(target, opts, jobs=1)
        print("done", len(r.heads))
    elif what == "head":  # ONE call: 4096 rows a kind, 12000 rank sets a bucket (a second or two)
        import numpy as np
        rng = np.random.default_rng(1)
        X, Y, p = rng.standard_normal((4096, 64)), rng.standard_normal((4096, 64)), np.arange(4096)
        r = q.analyze_head(X, p, Y, p, buckets=q.BucketSpec("uniform", 256, 1.0), context_length=4096,
                           options=q.Options(rank_sets=12000))
        print("done", r.n_q_tokens)
    else:
        st = q.study(target, options=opts, jobs=1)
        print("done", [x["status"] for x in st.runs], st.models["ap_drop"].tolist())
except KeyboardInterrupt:
    print("interrupted %.3f" % (time.monotonic() - t0 - delay))
print("elapsed %.3f" % (time.monotonic() - t0))
"""

    def child_run(what, target, delay):
        r = subprocess.run([sys.executable, "-c", child, what, target, str(delay)], capture_output=True, text=True,
                           timeout=120)
        return r.stdout.strip().splitlines(), r.stderr

    lines, err = child_run("dataset", cap, 0)
    full = float(lines[-1].split()[1]) if lines and lines[-1].startswith("elapsed") else 0.0
    check(lines and lines[0] == "done 32", f"analyze_dataset of the capture: {lines} {err[-300:]}")
    delay = min(0.5, full / 4)
    lines, err = child_run("dataset", cap, delay)
    late = float(lines[0].split()[1]) if lines and lines[0].startswith("interrupted") else None
    check(late is not None, f"SIGINT during analyze_dataset raises KeyboardInterrupt: {lines} {err[-300:]}")
    check(late is not None and late < max(0.5, full / 3),
          f"KeyboardInterrupt {late} s after SIGINT (a full run takes {full:.2f} s)")

    # one analyze_head call stops at its next safe point (core/cancel.hpp), not at its end
    lines, err = child_run("head", "-", 0)
    full_head = float(lines[-1].split()[1]) if lines and lines[-1].startswith("elapsed") else 0.0
    check(lines and lines[0].startswith("done"), f"analyze_head of the large head: {lines} {err[-300:]}")
    lines, err = child_run("head", "-", min(0.5, full_head / 4))
    late = float(lines[0].split()[1]) if lines and lines[0].startswith("interrupted") else None
    check(late is not None and late < max(0.3, full_head / 4),
          f"SIGINT during one analyze_head call: KeyboardInterrupt {late} s after it (the call takes "
          f"{full_head:.2f} s): {lines} {err[-300:]}")

    lines, err = child_run("study", study_file, 0)
    clean = lines[0] if lines else ""
    check(clean.startswith("done ['analysed']"), f"the study: {lines} {err[-300:]}")
    cache = os.path.join(W, ".qkgeom-study-cache")
    import shutil

    shutil.rmtree(cache)
    lines, err = child_run("study", study_file, delay)
    check(lines and lines[0].startswith("interrupted"), f"SIGINT during qkgeom.study: {lines} {err[-300:]}")
    left = [x for x in os.listdir(cache)] if os.path.isdir(cache) else []
    check(not left, f"an interrupted study leaves nothing in its cache: {left}")
    lines, err = child_run("study", study_file, 0)
    check(lines and lines[0] == clean, f"the rerun after the interruption: {lines} (clean run: {clean}) {err[-300:]}")

# ---- class 9: rows read without the GIL are held: resizing them from another thread is refused ----
import threading
import time

big = np.random.default_rng(5).standard_normal((300000, 64))
bpos = np.arange(big.shape[0]) % 4096
outcome = []


def _resize_during_call():
    time.sleep(0.05)
    try:
        big.resize((10, 64))  # refcheck (NumPy's default): refused while a call holds the array
        outcome.append("resized")
    except ValueError as e:
        outcome.append("refused: %s" % e)


hm_gil = q.HeadMoments(64)
th = threading.Thread(target=_resize_during_call)
th.start()
t0 = time.time()
while th.is_alive() or time.time() - t0 < 0.2:
    hm_gil.add("query", big, bpos, bpos // 256)
th.join()
check(outcome and outcome[0].startswith("refused"),
      f"resizing rows from another thread while a call reads them is refused, not a crash: {outcome}")
check(big.shape == (300000, 64), "the rows keep their shape")

check.finish("python.module.validation")
