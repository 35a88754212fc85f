#!/usr/bin/env python3
"""Hostile-input suite for the qkgeom program (issues 14 and 31, "Reliability").

Makes small clean captures with the program itself (`qkgeom synth`), analyses
each once as the baseline, then for every case copies a capture, applies ONE
corruption, runs the program on it and checks what the reliability contract
says (docs/cli.md; tests/hostile/README.md lists the classes):

  * the exit status (0 ok, 1 run failed, 2 usage, 3 some heads failed);
  * exit 1: stderr is one line `qkgeom: error: ...` naming the file or entry
    (and keywords for the field / value); exit 3: OUT/failures.txt names every
    failing entry, never a healthy one; no raw CR in any message;
  * exit 3: every healthy head's rows in head_metrics.csv and in the other
    per-head CSVs are identical to the clean run's;
  * resources: every run is a child reaped with os.wait4: wall time < 10 s and
    max RSS < 256 MB (inputs here are all under 10 MB); a hard timeout (30 s)
    turns a hang into a FAIL instead of blocking CI.

Usage: hostile.py --qkgeom PATH --work DIR [--class N] [--list] [-k SUBSTRING]
                  [--sanitized]
Exit status: 0 all selected cases passed, 1 some failed, 77 numpy missing
(skipped).  --sanitized (a sanitizer build): no RSS bound, wall bound 30 s.
Python 3 standard library + numpy only.
"""
import argparse
import csv
import io
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib


def _spawn_one(req):
    """Runs one child (req: argv, cwd, stdout/stderr file paths, timeout): exit
    status, wall time, max RSS of that child (os.wait4), killed at the timeout."""
    with open(req["stdout"], "wb") as fo, open(req["stderr"], "wb") as fe:
        t0 = time.monotonic()
        kw = {"user": req["user"], "group": req["user"], "extra_groups": []} if req.get("user") is not None else {}
        p = subprocess.Popen(req["argv"], stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=req["cwd"],
                             start_new_session=True, **kw)
        fired = []

        def kill():
            fired.append(1)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass

        timer = threading.Timer(req["timeout"], kill)
        timer.start()
        # Reap with wait4; meanwhile watch the resident size and kill a child
        # past req["kill_rss_mb"] (protects the machine: CI runs two suites).
        over = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            try:
                with open("/proc/%d/status" % p.pid) as f:
                    rss = next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
            except (OSError, ValueError):
                rss = 0
            if rss > req["kill_rss_mb"] * 1024 and not over:
                over = rss
                kill()
            time.sleep(0.01)
        timer.cancel()
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        try:  # anything the child left in its group (it should leave nothing)
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    return {"rc": rc, "wall": time.monotonic() - t0, "rss_kb": max(ru.ru_maxrss, over),
            "timed_out": bool(fired) and not over, "rss_killed": bool(over)}


class Spawner:
    """Children are started by a helper process forked before numpy is
    imported and before any test data is made: on Linux a child's max RSS
    (ru_maxrss) includes the high-water mark of the process it was forked from,
    so forking from this (growing) interpreter would count its memory as the
    program's. The helper stays small (~10 MB, below the program's own)."""

    def __init__(self):
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the helper
            os.close(req_w)
            os.close(res_r)
            rf, wf = os.fdopen(req_r, "r"), os.fdopen(res_w, "w")
            for line in rf:
                try:
                    res = _spawn_one(json.loads(line))
                except Exception as e:  # report, never die silently
                    res = {"error": "%s: %s" % (type(e).__name__, e)}
                wf.write(json.dumps(res) + "\n")
                wf.flush()
            os._exit(0)
        os.close(req_r)
        os.close(res_w)
        self.pid = pid
        self.w, self.r = os.fdopen(req_w, "w"), os.fdopen(res_r, "r")

    def run(self, req):
        self.w.write(json.dumps(req) + "\n")
        self.w.flush()
        res = json.loads(self.r.readline())
        if "error" in res:
            raise RuntimeError("spawner: " + res["error"])
        return res


SPAWNER = Spawner() if __name__ == "__main__" else None

try:
    import numpy as np
except ImportError:  # CI installs python3-numpy; without it the suite is skipped
    print("hostile: numpy not found: skipped")
    sys.exit(77)

MB = 1024 * 1024
HARD_TIMEOUT_S = 30.0


class Fail(Exception):
    """A case's assertion failed (the message says what was seen)."""


class Skip(Exception):
    """A case cannot run here (e.g. permissions as root)."""


# --------------------------------------------------------------------------
# running the program
# --------------------------------------------------------------------------
class Result:
    def __init__(self, argv, rc, out, err, wall, rss_kb, timed_out):
        self.argv, self.rc, self.out, self.err = argv, rc, out, err
        self.wall, self.rss_mb, self.timed_out = wall, rss_kb / 1024.0, timed_out

    def brief(self):
        line = self.err.strip().splitlines()[-1] if self.err.strip() else ""
        return "exit %s, %.1f s, %.0f MB, stderr: %s" % (
            "TIMEOUT" if self.timed_out else self.rc, self.wall, self.rss_mb, repr(line[:300]))


def run_child(argv, cwd=None, timeout=HARD_TIMEOUT_S, user=None):
    """Runs argv as a child (through the spawner); returns its exit status,
    output, wall time and max RSS. Killed (process group) at `timeout`."""
    log_dir = Ctx.current.tmp
    req = {"argv": argv, "cwd": cwd, "timeout": timeout, "stdout": os.path.join(log_dir, "stdout"),
           "stderr": os.path.join(log_dir, "stderr"), "user": user, "kill_rss_mb": Ctx.current.kill_rss_mb}
    res = SPAWNER.run(req) if SPAWNER else _spawn_one(req)
    with open(req["stdout"], "rb") as f:
        out = f.read().decode("utf-8", "replace")
    with open(req["stderr"], "rb") as f:
        err = f.read().decode("utf-8", "replace")
    r = Result(argv, res["rc"], out, err, res["wall"], res["rss_kb"], res["timed_out"])
    r.rss_killed = res["rss_killed"]
    return r


class Ctx:
    """Paths, the program and the clean captures (made lazily, once)."""
    current = None

    def __init__(self, qkgeom, work, sanitized, bases=None):
        self.qkgeom = os.path.abspath(qkgeom)
        self.work = os.path.abspath(work)
        self.bases_dir = os.path.abspath(bases) if bases else os.path.join(self.work, "base")
        self.sanitized = sanitized
        self.wall_limit = 30.0 if sanitized else 10.0
        self.hard_timeout = 60.0 if sanitized else HARD_TIMEOUT_S
        self.kill_rss_mb = 3072 if sanitized else 1024  # a child past this is killed (the case fails)
        self.rss_limit_mb = None if sanitized else 256.0
        self.tmp = os.path.join(self.work, "tmp")
        self.bases = {}
        os.makedirs(self.tmp, exist_ok=True)
        self.case_dir = None
        self.max_wall = self.max_rss = 0.0  # of the program runs of the current case
        self.python, self.python_path = sys.executable, None  # the class `python` (--python-path)
        Ctx.current = self

    # -- the program ------------------------------------------------------
    def run(self, *args, timeout=None, check_bounds=True, rss_limit_mb=None, user=None):
        return self.run_argv([self.qkgeom] + [str(a) for a in args], timeout=timeout, check_bounds=check_bounds,
                             rss_limit_mb=rss_limit_mb, user=user)

    def run_argv(self, argv, timeout=None, check_bounds=True, rss_limit_mb=None, user=None):
        """Runs argv (the program, or python for the class `python`) with the bounds of a case."""
        args = argv[1:] if argv[0] == self.qkgeom else [os.path.basename(argv[0]), "-c", "SCRIPT"]
        timeout = timeout or self.hard_timeout
        r = run_child(argv, cwd=self.case_dir or self.work, timeout=timeout, user=user)
        self.last_err = r.err
        self.max_wall = max(self.max_wall, r.wall)
        self.max_rss = max(self.max_rss, r.rss_mb)
        if r.timed_out:
            raise Fail("hang: killed after %.0f s (%s)" % (timeout, " ".join(map(str, args[:3]))))
        if r.rss_killed:
            raise Fail("killed at %.0f MB resident (over %d MB) after %.1f s (%s)" % (
                r.rss_mb, self.kill_rss_mb, r.wall, " ".join(map(str, args[:3]))))
        if r.rc < 0:
            raise Fail("killed by signal %d: %s" % (-r.rc, r.brief()))
        if check_bounds:
            if r.wall >= self.wall_limit:
                raise Fail("took %.1f s (limit %.0f s): %s" % (r.wall, self.wall_limit, r.brief()))
            lim = self.rss_limit_mb if rss_limit_mb is None or self.rss_limit_mb is None else min(
                rss_limit_mb, self.rss_limit_mb)
            if lim is not None and r.rss_mb >= lim:
                raise Fail("max RSS %.0f MB (limit %.0f MB): %s" % (r.rss_mb, lim, r.brief()))
        for text in (r.err, r.out):
            if "bad_alloc" in text:
                raise Fail("std::bad_alloc surfaced: " + r.brief())
        return r

    def analyze(self, cap, out, *extra, quiet=True, **kw):
        args = ["analyze", cap, "-o", out, "-j", "1"] + list(extra)
        if quiet:
            args.append("--quiet")
        return self.run(*args, **kw)

    # -- clean captures ---------------------------------------------------
    def base(self, fmt, dtype="f32"):
        """(capture dir, baseline) for a storage format; made once per work dir."""
        key = (fmt, dtype)
        if key in self.bases:
            return self.bases[key]
        root = os.path.join(self.bases_dir, "%s_%s" % (fmt, dtype))
        cap, out = os.path.join(root, "capture"), os.path.join(root, "clean")
        stamp = os.path.join(root, "ok")
        if not (os.path.exists(stamp) and open(stamp).read() == self.stamp()):
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            save, self.case_dir = self.case_dir, root
            try:
                r = self.run("synth", cap, "--layers", 1, "--heads", 4, "--format", fmt, "--dtype", dtype,
                             "--quiet", check_bounds=False)
                if r.rc != 0:
                    raise Fail("setup: qkgeom synth --format %s --dtype %s: %s" % (fmt, dtype, r.brief()))
                if self.sanitized:
                    thin_capture(cap)
                r = self.analyze(cap, out, check_bounds=False)
                if r.rc != 0:
                    raise Fail("setup: clean analyze of the %s capture: %s" % (fmt, r.brief()))
            finally:
                self.case_dir = save
            with open(stamp, "w") as f:
                f.write(self.stamp())
        b = Baseline(cap, out, fmt)
        self.bases[key] = b
        return b

    def stamp(self):
        st = os.stat(self.qkgeom)
        return "%s %d %d %s" % (self.qkgeom, st.st_size, st.st_mtime_ns, "thin" if self.sanitized else "full")


def thin_capture(cap):
    """Sanitizer builds (Debug, ASan) analyse ~20x slower: keep the rows of
    every 4th example only, in every entry, rewritten in its own form."""
    for n in sorted(os.listdir(cap)):
        name = n.split(".")[0]
        if ENTRY_RE.fullmatch(name):
            form, arrays = load_entry(cap, name)
            keep = arrays["example_id"] % 4 == 0
            for k in ("vectors", "position", "bucket", "example_id"):
                arrays[k] = np.ascontiguousarray(arrays[k][keep])
            save_entry(cap, name, arrays, form)


# --------------------------------------------------------------------------
# reports
# --------------------------------------------------------------------------
PER_HEAD_CSVS = ["head_metrics.csv", "head_bucket_plasticity.csv", "head_profile.csv", "head_component_weights.csv",
                 "qk_pca.csv"]


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return [], []
    return rows[0], rows[1:]


def head_rows(out, fname):
    """{(layer, q_head): sorted list of rows (dicts)} of one per-head CSV."""
    path = os.path.join(out, fname)
    if not os.path.exists(path):
        return None
    header, rows = read_csv(path)
    res = {}
    if "layer" not in header or "q_head" not in header:
        raise Fail("%s: no layer/q_head columns (header %s)" % (fname, header[:6]))
    il, iq = header.index("layer"), header.index("q_head")
    for r in rows:
        res.setdefault((int(r[il]), int(r[iq])), []).append(tuple(zip(header, r)))
    for k in res:
        res[k].sort()
    return res


def entry(layer, head, kind):
    return "l%02dh%02d%s" % (layer, head, kind)


class Baseline:
    def __init__(self, cap, out, fmt):
        self.cap, self.out, self.fmt = cap, out, fmt
        self.csv = {f: head_rows(out, f) for f in PER_HEAD_CSVS}
        header, rows = read_csv(os.path.join(out, "head_metrics.csv"))
        self.metrics_header = header
        il, iq, ik = header.index("layer"), header.index("q_head"), header.index("k_head")
        self.heads = sorted((int(r[il]), int(r[iq]), int(r[ik])) for r in rows)
        if len(self.heads) < 2:
            raise Fail("setup: the clean capture has %d heads" % len(self.heads))
        with open(os.path.join(cap, "manifest.json")) as f:
            self.manifest = json.load(f)

    def q(self, i=0):
        """Entry name of the i-th planned query head."""
        l, h, _ = self.heads[i]
        return entry(l, h, "q")

    def k_of(self, i=0):
        l, _, k = self.heads[i]
        return entry(l, k, "k")

    def readers_of(self, k_name):
        return [h for h in self.heads if entry(h[0], h[2], "k") == k_name]

    def key_with_healthy(self):
        """A key entry read by some planned heads but not all (so healthy heads remain)."""
        ks = sorted({entry(h[0], h[2], "k") for h in self.heads})
        for k in ks:
            if len(self.readers_of(k)) < len(self.heads):
                return k
        return ks[0]


# --------------------------------------------------------------------------
# assertions
# --------------------------------------------------------------------------
class Num:
    """A keyword matching any number in the text equal to `v` (however printed)."""
    RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

    def __init__(self, v):
        self.v = v

    def found(self, text):
        for tok in Num.RE.findall(text):
            try:
                if float(tok) == self.v:
                    return True
            except ValueError:
                pass
        return False

    def __str__(self):
        return "the number %r" % self.v


def unpathed(text):
    """text with the case's folder replaced by <case>: keywords must come from the
    message, never from a path that happens to contain them (the case names do)."""
    ctx = Ctx.current
    for p in (ctx.case_dir, ctx.work, ctx.bases_dir):
        if p:
            text = text.replace(p, "<case>")
    return text


def missing_keywords(text, kws):
    """The keywords (a str, a tuple of alternatives, or a Num) absent from text
    (case-insensitive; the case's folder is cut out of the text first)."""
    text = unpathed(text)
    t = text.lower()
    miss = []
    for k in kws:
        if isinstance(k, Num):
            if not k.found(text):
                miss.append(str(k))
            continue
        alts = k if isinstance(k, tuple) else (k,)
        if not any(a.lower() in t for a in alts):
            miss.append("|".join(alts))
    return miss


ENTRY_RE = re.compile(r"l\d{2,}h\d{2,}[qk]")


def raw_control(text, where):
    """No raw control character (NUL, ESC, CR, ...) from the input reaches a message."""
    bad = sorted({c for c in text if (ord(c) < 32 and c not in "\n\t") or ord(c) == 127})
    if bad:
        raise Fail("raw control characters %s in %s: %r" % ([hex(ord(c)) for c in bad], where, text[:300]))


def expect_error(r, names, kws=(), one_line=True):
    """Exit 1 with one stderr line `qkgeom: error: ...` naming each of `names`
    (file or entry) and containing the keywords."""
    if r.rc != 1:
        raise Fail("expected exit 1, got " + r.brief())
    if "\r" in r.err:
        raise Fail("raw CR in the message: %r" % r.err[:300])
    raw_control(r.err.rstrip("\n"), "stderr")
    lines = [ln for ln in r.err.split("\n") if ln.strip()]
    if one_line and len(lines) != 1:
        raise Fail("expected one stderr line, got %d: %r" % (len(lines), r.err[:400]))
    msg = lines[-1] if lines else ""
    if not msg.startswith("qkgeom: error:"):
        raise Fail("stderr line does not start 'qkgeom: error:': %r" % msg[:300])
    miss = missing_keywords(msg, list(names) + list(kws))
    if miss:
        raise Fail("message lacks %s: %r" % (miss, msg[:400]))
    return msg


def expect_usage(r, kws=()):
    if r.rc != 2:
        raise Fail("expected exit 2 (usage), got " + r.brief())
    miss = missing_keywords(r.err, kws)
    if miss:
        raise Fail("usage message lacks %s: %r" % (miss, r.err[:300]))


def failures_text(out):
    path = os.path.join(out, "failures.txt")
    if not os.path.isfile(path):
        raise Fail("exit 3 but no failures.txt")
    with open(path, "rb") as f:
        raw = f.read()
    if b"\r" in raw:
        raise Fail("raw CR in failures.txt: %r" % raw[:300])
    text = raw.decode("utf-8", "replace")
    raw_control(text.replace("\n", ""), "failures.txt")
    for ln in text.split("\n"):
        if ln.strip() and not ENTRY_RE.search(ln):
            raise Fail("failures.txt line names no entry (lLLhHHq/k) (a raw newline in a message?): %r" % ln[:300])
    return text


def compare_heads(out, base, heads, what="healthy"):
    """The rows of `heads` in every per-head CSV equal the clean run's."""
    for fname in PER_HEAD_CSVS:
        got = head_rows(out, fname)
        if got is None:
            raise Fail("%s missing from the report" % fname)
        for (l, h, _) in heads:
            if got.get((l, h)) != base.csv[fname].get((l, h)):
                g, b = got.get((l, h)) or [], base.csv[fname].get((l, h)) or []
                diff = ""
                if g and b:
                    diff = "; first difference: " + str(
                        [(x, y) for x, y in zip(g[0], b[0]) if x != y][:3])
                raise Fail("%s head %s: %s rows differ from the clean run (%d vs %d rows%s)" % (
                    what, entry(l, h, "q"), fname, len(g), len(b), diff))


def expect_partial(r, out, base, failing, notes, healthy=None):
    """Exit 3; failures.txt names each (name, keywords) of `notes` on one line;
    no healthy head is named there; `failing` heads (by index in base.heads or
    (l, h, k)) are absent from head_metrics.csv; healthy heads identical to the clean run."""
    if r.rc != 3:
        raise Fail("expected exit 3, got " + r.brief())
    text = failures_text(out)
    lines = [ln for ln in text.split("\n") if ln.strip()]
    for name, kws in notes:
        cand = [ln for ln in lines if name.lower() in ln.lower()]
        if not cand:
            raise Fail("failures.txt does not name %s: %r" % (name, text[:400]))
        if not any(not missing_keywords(ln, kws) for ln in cand):
            raise Fail("failures.txt line for %s lacks %s: %r" % (name, missing_keywords(cand[0], kws), cand[0][:400]))
    fail_heads = [base.heads[i] if isinstance(i, int) else i for i in failing]
    if healthy is None:
        healthy = [h for h in base.heads if h not in fail_heads]
    for (l, h, _) in healthy:
        if ("l%02dh%02dq" % (l, h)) in text.lower():
            raise Fail("healthy head %s named in failures.txt: %r" % (entry(l, h, "q"), text[:400]))
    if healthy:
        compare_heads(out, base, healthy)
    metrics = head_rows(out, "head_metrics.csv") or {}
    for (l, h, _) in fail_heads:
        if (l, h) in metrics:
            raise Fail("failed head %s still has a row in head_metrics.csv" % entry(l, h, "q"))
    return text


def expect_ok(r, out, base, identical=True):
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    if identical:
        compare_heads(out, base, base.heads, "every")


def metrics_row(out, l, h):
    rows = (head_rows(out, "head_metrics.csv") or {}).get((l, h))
    if not rows:
        raise Fail("no head_metrics.csv row for %s" % entry(l, h, "q"))
    return dict(rows[0])


def snapshot(path):
    """{relative path: (kind, bytes or link target)} of a tree (not following links)."""
    res = {}
    if os.path.islink(path) or not os.path.isdir(path):
        if os.path.lexists(path):
            res["."] = ("link", os.readlink(path)) if os.path.islink(path) else ("file", open(path, "rb").read())
        return res
    for dp, dns, fns in os.walk(path):
        for n in dns + fns:
            p = os.path.join(dp, n)
            rel = os.path.relpath(p, path)
            if os.path.islink(p):
                res[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                res[rel] = ("dir", None)
            else:
                res[rel] = ("file", open(p, "rb").read())
    return res


# --------------------------------------------------------------------------
# the storage forms: read / write an entry's arrays, raw files
# --------------------------------------------------------------------------
ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "|i1",
             "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "|u1"}
ST_NAMES = {np.dtype(v).str: k for k, v in ST_DTYPES.items()}
MEMBERS = ["vectors", "position", "bucket", "example_id", "sliding_window"]


def entry_form(cap, name):
    if os.path.isdir(os.path.join(cap, name)):
        return "npy"
    p = os.path.join(cap, name + ".npz")
    if os.path.exists(p):
        with zipfile.ZipFile(p) as z:
            deflated = any(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
        return "npz_deflate" if deflated else "npz"
    if os.path.exists(os.path.join(cap, name + ".safetensors")):
        return "safetensors"
    raise Fail("setup: no entry %s in %s" % (name, cap))


def entry_path(cap, name, member="vectors", form=None):
    """The file that holds `member` of the entry."""
    form = form or entry_form(cap, name)
    if form == "npy":
        return os.path.join(cap, name, member + ".npy")
    return os.path.join(cap, name + (".safetensors" if form == "safetensors" else ".npz"))


def st_parse(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n].decode("utf-8"))
    buf = raw[8 + n:]
    meta = hdr.pop("__metadata__", None)
    arrays = {}
    for k, info in hdr.items():
        b0, b1 = info["data_offsets"]
        arrays[k] = np.frombuffer(buf[b0:b1], dtype=ST_DTYPES[info["dtype"]]).reshape(info["shape"]).copy()
    return arrays, meta


def st_bytes(arrays, meta=None, header_extra=None):
    hdr, blobs, off = {}, [], 0
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        b = a.tobytes()
        hdr[k] = {"dtype": ST_NAMES[a.dtype.str], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta is not None:
        hdr["__metadata__"] = meta
    if header_extra:
        hdr.update(header_extra)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def npy_bytes(a):
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def npz_bytes(arrays, deflate=False):
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        for k, v in arrays.items():
            z.writestr(k + ".npy", v if isinstance(v, bytes) else npy_bytes(v))
    return f.getvalue()


def load_entry(cap, name):
    form = entry_form(cap, name)
    arrays = {}
    if form == "npy":
        for m in MEMBERS:
            p = os.path.join(cap, name, m + ".npy")
            if os.path.exists(p):
                arrays[m] = np.load(p)
    elif form == "safetensors":
        with open(entry_path(cap, name, form=form), "rb") as f:
            arrays, _ = st_parse(f.read())
    else:
        with zipfile.ZipFile(entry_path(cap, name, form=form)) as z:
            for i in z.infolist():
                arrays[i.filename[:-4]] = np.load(io.BytesIO(z.read(i)))
    return form, arrays


def remove_entry(cap, name):
    for p in (os.path.join(cap, name), os.path.join(cap, name + ".npz"), os.path.join(cap, name + ".safetensors")):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)


def save_entry(cap, name, arrays, form):
    remove_entry(cap, name)
    if form == "npy":
        os.makedirs(os.path.join(cap, name))
        for k, v in arrays.items():
            with open(os.path.join(cap, name, k + ".npy"), "wb") as f:
                f.write(v if isinstance(v, bytes) else npy_bytes(v))
    elif form == "safetensors":
        with open(os.path.join(cap, name + ".safetensors"), "wb") as f:
            f.write(st_bytes(arrays, {"format": "qkgeom-dataset"}))
    else:
        with open(os.path.join(cap, name + ".npz"), "wb") as f:
            f.write(npz_bytes(arrays, deflate=(form == "npz_deflate")))


def modify_entry(cap, name, fn):
    form, arrays = load_entry(cap, name)
    fn(arrays)
    save_entry(cap, name, arrays, form)


def npy_header_bytes(descr, shape, fortran=False, version=1, raw_dict=None):
    d = raw_dict if raw_dict is not None else "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", "(%s)" % "".join("%d, " % s for s in shape) if len(shape) != 1
        else "(%d,)" % shape[0])
    h = d.encode("latin-1")
    pre = 10 if version == 1 else 12
    pad = (64 - (pre + len(h) + 1) % 64) % 64
    h = h + b" " * pad + b"\n"
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(h)) + h


def edit_manifest(cap, fn=None, text=None, raw=None):
    p = os.path.join(cap, "manifest.json")
    if raw is not None:
        data = raw
    elif text is not None:
        data = text.encode("utf-8")
    else:
        with open(p) as f:
            m = json.load(f)
        fn(m)
        data = json.dumps(m, indent=2).encode("utf-8")
    if os.path.lexists(p):
        os.unlink(p)
    with open(p, "wb") as f:
        f.write(data)


def truncate_file(p, drop):
    with open(p, "rb") as f:
        data = f.read()
    with open(p, "wb") as f:
        f.write(data[:len(data) - drop])


# --------------------------------------------------------------------------
# moments shards (docs/moments.md "Shard file format", include/qkgeom/io/moments_io.hpp)
# --------------------------------------------------------------------------
SHARD_MAGIC = b"QKGMOM\r\n"


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def bucket_stats(bucket, t, x):
    """A bucket record's fields from its rows (positions t, rows x), in double."""
    t = np.asarray(t, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    mt, mx = t.mean(), x.mean(axis=0)
    dt, dx = t - mt, x - mx
    return {"bucket": bucket, "n": len(t), "mean_t": mt, "m2_t": float(dt @ dt), "t_min": float(t.min()),
            "t_max": float(t.max()), "mean_x": mx, "c_xt": dx.T @ dt, "c_xx": dx.T @ dx}


SCHEME_CODES = {"uniform": 0, "log": 1, "all": 2}


def shard_bytes(d, q, k, layer=0, q_head=0, k_head=0, magic=SHARD_MAGIC, version=None, flags=0, n_q=None,
                scheme=None):
    """One shard: q and k are lists of bucket records (bucket_stats dicts).
    scheme = (name or code, width, rate): format version 2 with that bucket
    scheme block; None: version 1 (no scheme)."""
    if version is None:
        version = 1 if scheme is None else 2
    b = bytearray(magic)
    b += struct.pack("<IIqqqQ", version, flags, layer, q_head, k_head, d)
    if scheme is not None:
        code = SCHEME_CODES.get(scheme[0], scheme[0])
        b += struct.pack("<IIqd", code, 0, scheme[1], scheme[2])
    for i, recs in enumerate((q, k)):
        b += struct.pack("<Q", (n_q if (i == 0 and n_q is not None) else len(recs)))
        for r in recs:
            b += struct.pack("<qqdddd", r["bucket"], r["n"], r["mean_t"], r["m2_t"], r["t_min"], r["t_max"])
            b += np.asarray(r["mean_x"], "<f8").tobytes() + np.asarray(r["c_xt"], "<f8").tobytes()
            cxx = np.asarray(r["c_xx"], np.float64)
            b += np.array([cxx[i2, j] for i2 in range(d) for j in range(i2 + 1)], "<f8").tobytes()
    b += struct.pack("<Q", fnv1a64(bytes(b)))
    return bytes(b)


def shard_scheme(raw):
    """The (name, width, rate) bucket scheme of a version 2 shard, None for version 1."""
    if struct.unpack_from("<I", raw, 8)[0] == 1:
        return None
    code, _, width, rate = struct.unpack_from("<IIqd", raw, 48)
    return ({v: k for k, v in SCHEME_CODES.items()}.get(code, code), width, rate)


def parse_shard(raw):
    """(d, {'q': {bucket: (n, mean_t)}, 'k': ...}) of a shard (version 1 or 2), checksum verified."""
    if raw[:8] != SHARD_MAGIC:
        raise Fail("merged shard: bad magic")
    d = struct.unpack_from("<Q", raw, 40)[0]
    rec = 8 * (6 + 2 * d + d * (d + 1) // 2)
    off, res = (48 if shard_scheme(raw) is None else 72), {}
    for kind in ("q", "k"):
        nb = struct.unpack_from("<Q", raw, off)[0]
        off += 8
        res[kind] = {}
        for _ in range(nb):
            bucket, n, mean_t = struct.unpack_from("<qqd", raw, off)
            res[kind][bucket] = (n, mean_t)
            off += rec
    if off + 8 != len(raw):
        raise Fail("merged shard: size %d, expected %d" % (len(raw), off + 8))
    if struct.unpack_from("<Q", raw, off)[0] != fnv1a64(raw[:off]):
        raise Fail("merged shard: checksum does not verify")
    return d, res


def random_shard_records(seed, d, buckets, rows_per_bucket=5, width=256):
    rng = np.random.default_rng(seed)
    out = []
    for b in buckets:
        t = rng.integers(b * width, (b + 1) * width, size=rows_per_bucket)
        x = rng.normal(size=(rows_per_bucket, d)) + 0.1 * t[:, None] / width
        out.append(bucket_stats(b, t, x))
    return out


# --------------------------------------------------------------------------
# the cases
# --------------------------------------------------------------------------
CASES = []  # (class, name, fn)


def case(cls, name):
    def deco(fn):
        CASES.append((cls, name, fn))
        return fn
    return deco


def setup_copy(ctx, fmt="npy", dtype="f32"):
    """(base, a private copy of its capture, OUT path)."""
    base = ctx.base(fmt, dtype)
    cap = os.path.join(ctx.case_dir, "cap")
    shutil.copytree(base.cap, cap, symlinks=True)
    return base, cap, os.path.join(ctx.case_dir, "out")


def set_value(cap, name, row, col, value):
    def fn(a):
        v = a["vectors"].copy()
        v[row, col] = value
        a["vectors"] = v
    modify_entry(cap, name, fn)


# ---- class 1: overflow and non-finite values -------------------------------------
def _overflow_case(value, kws, dtype="f64", key=False):
    def fn(ctx):
        base, cap, out = setup_copy(ctx, "npy", dtype)
        if key:
            k = base.key_with_healthy()
            set_value(cap, k, 3, 5, value)
            r = ctx.analyze(cap, out)
            expect_partial(r, out, base, base.readers_of(k), [(k, kws)])
        else:
            set_value(cap, base.q(0), 3, 5, value)
            r = ctx.analyze(cap, out)
            expect_partial(r, out, base, [0], [(base.q(0), kws)])
    return fn


# The failing head's line names the entry, the row, the column and the value.
case("class1", "f64_query_1e154")(_overflow_case(1e154, ["row 3", "col", Num(1e154)]))
case("class1", "f64_query_3.5e38")(_overflow_case(3.5e38, ["row 3", "col", Num(3.5e38)]))
case("class1", "f64_query_-1e300")(_overflow_case(-1e300, ["row 3", "col", Num(-1e300)]))
case("class1", "f64_key_1e200")(_overflow_case(1e200, ["row 3", "col", Num(1e200)], key=True))
case("class1", "f64_query_nan")(_overflow_case(float("nan"), ["row 3", "col", "nan"]))
case("class1", "f32_query_inf")(_overflow_case(float("inf"), ["row 3", "col", "inf"], dtype="f32"))


@case("class1", "f64_query_3e38_below_limit_is_analysed")
def _(ctx):
    # 3e38 < 2^128: a valid value; the head is analysed and no metric overflows to inf.
    base, cap, out = setup_copy(ctx, "npy", "f64")
    set_value(cap, base.q(0), 3, 5, 3e38)
    r = ctx.analyze(cap, out)
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    compare_heads(out, base, base.heads[1:])
    row = metrics_row(out, *base.heads[0][:2])
    bad = [k for k, v in row.items() if v.strip().lower() in ("inf", "-inf", "+inf")]
    if bad:
        raise Fail("head %s: infinite metrics %s" % (base.q(0), bad))


# ---- class 2: degenerate but valid data: NaN plus a flag -----------------------
# docs/outputs.md, "The flags column": the columns each flag makes NaN.
AP_COLS = ["ap_overall", "ap_first_20pct", "ap_last_20pct", "ap_drop"]
ROTATION_COLS = ["mu_q_a", "mu_k_a", "mu_q_b", "mu_k_b", "alpha_q", "alpha_k", "r_q_a", "r_k_a", "position_r",
                 "bias_strength", "separation_strength", "var_frac_a", "var_frac_b", "plane_var_fraction",
                 "content_var_b", "residual_pos_cov"]
FLAG_NAN = {
    "q_constant": ["pc0_r_q", "q_pos_var_frac", "r_q_a"] + AP_COLS,
    "k_constant": ["pc0_r_k", "k_pos_var_frac", "r_k_a"] + AP_COLS,
    "q_positions_constant": ["q_R2_pos", "pc0_r_q", "q_pos_var_frac", "alpha_q", "r_q_a"],
    "k_positions_constant": ["pc0_r_k", "k_pos_var_frac", "alpha_k", "r_k_a", "bias_strength"],
    "pca_degenerate": ["pc0_r_q", "pc0_r_k"],
    "pc0_q_flat": ["pc0_r_q"],
    "pc0_k_flat": ["pc0_r_k"],
    "drift_degenerate": ROTATION_COLS,
    "separation_degenerate": ["mu_q_b", "mu_k_b", "separation_strength", "var_frac_b", "plane_var_fraction",
                              "content_var_b"],
    "q_beta_zero": [],
    "pos_residual_degenerate": ["pos_skew", "pos_excess_kurtosis", "pos_ks_p"],
    "sem_degenerate": ["sem_median_abs_skew", "sem_median_abs_kurtosis", "sem_median_ks_p", "sem_frac_ks_reject"],
    "no_plasticity_pairs": AP_COLS + ["gaussian_gap"],
}


def _is_nan(s):
    return s.strip().lower() == "nan"


def check_flags(row, name, required):
    """The flags column holds the `required` flags (documented names), only
    known names, and every column a set flag documents as NaN is NaN."""
    if "flags" not in row:
        raise Fail("head_metrics.csv has no flags column")
    flags = [f for f in row["flags"].split(";") if f]
    unknown = [f for f in flags if f not in FLAG_NAN]
    if unknown:
        raise Fail("head %s: unknown flags %s (documented: docs/outputs.md)" % (name, unknown))
    miss = [f for f in required if f not in flags]
    if miss:
        raise Fail("head %s: flags %r lack %s" % (name, row["flags"], miss))
    for f in flags:
        bad = [c for c in FLAG_NAN[f] if c in row and not _is_nan(row[c])]
        if bad:
            raise Fail("head %s: flag %s set but %s not NaN (%s)" % (name, f, bad, [row[c] for c in bad]))


def _degenerate_case(plant, required, key=False):
    """Planted degenerate data in one entry: exit 0, the heads reading it carry
    the documented flags and NaN columns, the other heads are as in the clean run."""
    def fn(ctx):
        base, cap, out = setup_copy(ctx, "npy", "f32")
        name = base.key_with_healthy() if key else base.q(0)
        targets = base.readers_of(name) if key else [base.heads[0]]
        modify_entry(cap, name, plant)
        r = ctx.analyze(cap, out)
        if r.rc != 0:
            raise Fail("expected exit 0 (degenerate data is analysed), got " + r.brief())
        compare_heads(out, base, [h for h in base.heads if h not in targets])
        for (l, h, _) in targets:
            check_flags(metrics_row(out, l, h), entry(l, h, "q"), required)
    return fn


def _identical_rows(a):
    v = a["vectors"].copy()
    v[:] = v[0]
    if not np.any(v[0]):
        raise Fail("setup: first row is zero")
    a["vectors"] = v


def _zero_vectors(a):
    a["vectors"] = np.zeros_like(a["vectors"])


def _one_position(a):
    a["position"] = np.full_like(a["position"], 100)
    a["bucket"] = np.full_like(a["bucket"], 0)  # uniform buckets of 256: position 100 is in bucket 0
    # one token per example (each row its own example at position 100): one example holding
    # position 100 twice would be one token in two rows, which read_head refuses
    a["example_id"] = np.arange(len(a["position"]), dtype=a["example_id"].dtype)


def _one_row(a):
    for k in ("vectors", "position", "bucket", "example_id"):
        a[k] = np.ascontiguousarray(a[k][:1])


case("class2", "identical_query_rows")(_degenerate_case(
    _identical_rows, ["q_constant", "pos_residual_degenerate", "sem_degenerate", "no_plasticity_pairs"]))
case("class2", "zero_query_rows")(_degenerate_case(_zero_vectors, ["q_constant"]))
case("class2", "identical_key_rows")(_degenerate_case(_identical_rows, ["k_constant"], key=True))
case("class2", "query_positions_constant")(_degenerate_case(_one_position, ["q_positions_constant"]))
case("class2", "key_positions_constant")(_degenerate_case(_one_position, ["k_positions_constant"], key=True))
case("class2", "one_query_row")(_degenerate_case(_one_row, ["q_constant", "q_positions_constant"]))


@case("class2", "clean_heads_carry_no_degeneracy_flag")
def _(ctx):
    base = ctx.base("npy", "f32")
    for (l, h, _) in base.heads:
        row = dict(base.csv["head_metrics.csv"][(l, h)][0])
        check_flags(row, entry(l, h, "q"), [])
        bad = [f for f in row["flags"].split(";") if f and f != "q_beta_zero"]
        if bad:
            raise Fail("clean head %s flagged %s" % (entry(l, h, "q"), bad))


# ---- class 3: non-regular files -----------------------------------------------------
NOT_REGULAR = ("regular", "fifo", "pipe", "special", "not a file")


def _replace(p, how):
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.unlink(p)
    if how == "fifo":
        os.mkfifo(p)
    elif how == "dir":
        os.mkdir(p)
        with open(os.path.join(p, "x"), "w") as f:
            f.write("x")
    elif how == "loop":
        os.symlink(os.path.basename(p), p)
    elif how == "devzero":
        os.symlink("/dev/zero", p)
    elif how == "dangling":
        os.symlink(p + ".nowhere", p)


def _nonregular_case(fmt, how, kws, member="vectors", key=False, manifest=False):
    def fn(ctx):
        base, cap, out = setup_copy(ctx, fmt)
        if manifest:
            _replace(os.path.join(cap, "manifest.json"), how)
            expect_error(ctx.analyze(cap, out), ["manifest.json"], kws)
            return
        name = base.key_with_healthy() if key else base.q(0)
        p = entry_path(cap, name, member)
        _replace(p, how)
        r = ctx.analyze(cap, out)
        fails = base.readers_of(name) if key else [0]
        expect_partial(r, out, base, fails, [(name, [os.path.basename(p)] + list(kws))])
    return fn


case("class3", "fifo_as_vectors_npy")(_nonregular_case("npy", "fifo", [NOT_REGULAR]))
case("class3", "fifo_as_key_position_npy")(_nonregular_case("npy", "fifo", [NOT_REGULAR], member="position", key=True))
case("class3", "fifo_as_npz_entry")(_nonregular_case("npz", "fifo", [NOT_REGULAR]))
case("class3", "fifo_as_safetensors_entry")(_nonregular_case("safetensors", "fifo", [NOT_REGULAR]))
case("class3", "fifo_as_manifest")(_nonregular_case("npy", "fifo", [NOT_REGULAR], manifest=True))
case("class3", "dir_as_vectors_npy")(_nonregular_case("npy", "dir", [("director",) + NOT_REGULAR]))
case("class3", "dir_as_manifest")(_nonregular_case("npy", "dir", [("director",) + NOT_REGULAR], manifest=True))
case("class3", "dir_named_like_safetensors_entry")(
    _nonregular_case("safetensors", "dir", [("director",) + NOT_REGULAR]))
case("class3", "dir_named_like_npz_entry")(_nonregular_case("npz_deflate", "dir", [("director",) + NOT_REGULAR]))
case("class3", "symlink_loop_as_vectors_npy")(
    _nonregular_case("npy", "loop", [("loop", "symbolic link", "too many levels")]))
case("class3", "dev_zero_as_vectors_npy")(
    _nonregular_case("npy", "devzero", [NOT_REGULAR + ("device",)]))
case("class3", "dangling_symlink_as_vectors_npy")(
    _nonregular_case("npy", "dangling", [("no such", "missing", "not found", "does not exist")]))


def unprivileged(ctx):
    """None when not root; as root, the uid of nobody (65534) after checking
    that it can run the program and write a scratch folder (else Skip)."""
    if os.geteuid() != 0:
        return None
    probe = os.path.join(ctx.case_dir, "probe")
    os.mkdir(probe)
    os.chmod(probe, 0o777)
    for d in (ctx.case_dir, os.path.join(ctx.case_dir, "cap")):
        if os.path.isdir(d):
            os.chmod(d, 0o777)
    r = ctx.run("synth", os.path.join(probe, "s"), "--layers", 1, "--heads", 1, "--quiet", user=65534)
    if r.rc != 0:
        raise Skip("running as root, and user nobody cannot run the program here: " + r.brief())
    shutil.rmtree(probe)
    return 65534


@case("class3", "unreadable_vectors_npy_names_permission")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    user = unprivileged(ctx)
    p = entry_path(cap, base.q(0))
    os.chmod(p, 0)
    r = ctx.analyze(cap, out, user=user)
    expect_partial(r, out, base, [0], [(base.q(0), ["vectors.npy", "permission"])])


# ---- class 4: silent emptiness and contradictions ------------------------------------
@case("class4", "every_layer_ineligible_zero_heads")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    if "head_count" not in base.manifest.get("capture", {}):
        raise Fail("setup: the clean manifest records no head sample")

    def fn(m):
        m["sliding_window"] = [128] * m["n_layers"]
        m["capture"]["eligibility"] = "full_attention_only"
    edit_manifest(cap, fn)
    expect_error(ctx.analyze(cap, out), ["manifest.json"], [("head",), ("sliding_window", "eligib", "window")])
    if os.path.exists(os.path.join(out, "head_metrics.csv")):
        raise Fail("zero heads: head_metrics.csv written anyway")


@case("class4", "head_count_zero_is_an_error")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    edit_manifest(cap, lambda m: m["capture"].update(head_count=0))
    expect_error(ctx.analyze(cap, out), ["manifest.json"], ["head_count"])


@case("class4", "context_longer_than_the_sequences_says_why_ap_last_is_nan")
def _(ctx):
    # The manifest records a context length far beyond the captured positions
    # (< 4096): no query lies in its last 20 %, so ap_last_20pct and ap_drop are
    # NaN; the run says why (stdout and summary.txt), it does not leave a bare NaN.
    base, cap, out = setup_copy(ctx)
    edit_manifest(cap, lambda m: m.update(context_length=100000))
    r = ctx.analyze(cap, out)
    if r.rc != 0:
        raise Fail("expected exit 0, got %s" % r.brief())
    rows = head_rows(out, "head_metrics.csv")
    if not rows or any(dict(row[0])["ap_last_20pct"] != "nan" for row in rows.values()):
        raise Fail("ap_last_20pct should be nan for every head")
    with open(os.path.join(out, "summary.txt")) as f:
        summary = f.read()
    for where, text in (("stdout", r.out), ("summary.txt", summary)):
        if "ap_last_20pct" not in text or "context length" not in text:
            raise Fail("%s does not say why ap_last_20pct is NaN: %r" % (where, text[-400:]))


def _stray_case(name_fn):
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        src = base.q(0)
        stray = name_fn(base)
        shutil.copytree(os.path.join(cap, src), os.path.join(cap, stray))
        r = ctx.analyze(cap, out)
        expect_partial(r, out, base, [], [(stray, [("stray", "outside", "beyond", "not in the manifest")])])
    return fn


case("class4", "stray_entry_beyond_layers")(_stray_case(lambda b: "l05h00q"))
case("class4", "stray_query_entry_beyond_n_q_heads")(
    _stray_case(lambda b: entry(0, b.manifest["n_q_heads"][0] if isinstance(b.manifest["n_q_heads"], list)
                               else b.manifest["n_q_heads"], "q")))
case("class4", "stray_key_entry_beyond_n_kv_heads")(_stray_case(lambda b: "l00h07k"))


def max_position(cap, base):
    mx = 0
    names = {base.q(i) for i in range(len(base.heads))} | {base.k_of(i) for i in range(len(base.heads))}
    for n in names:
        mx = max(mx, int(load_entry(cap, n)[1]["position"].max()))
    return mx


@case("class4", "context_below_largest_position_fails_every_head")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    L = max_position(cap, base) // 2
    r = ctx.analyze(cap, out, "--context", L)
    expect_partial(r, out, base, list(range(len(base.heads))),
                   [(base.q(i), ["context", "position"]) for i in range(len(base.heads))], healthy=[])


@case("class4", "context_at_largest_position_plus_1_is_accepted")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    L = max_position(cap, base) + 1
    r = ctx.analyze(cap, out, "--context", L)
    expect_ok(r, out, base, identical=False)
    got = head_rows(out, "head_metrics.csv")
    if sorted(got) != sorted((l, h) for l, h, _ in base.heads):
        raise Fail("--context %d: heads %s analysed, expected %s" % (L, sorted(got), base.heads))


@case("class4", "position_equal_to_context_length")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    cl = base.manifest["context_length"]
    width = base.manifest["buckets"]["width"]

    def fn(a):
        p, b = a["position"].copy(), a["bucket"].copy()
        p[2], b[2] = cl, cl // width
        a["position"], a["bucket"] = p, b
    modify_entry(cap, base.q(0), fn)
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), ["position", "context", str(cl)])])


@case("class4", "missing_query_entry")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    remove_entry(cap, base.q(0))
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), [("missing", "not found", "no such", "does not exist", "no entry")])])


@case("class4", "entry_in_two_forms")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    _, arrays = load_entry(cap, base.q(0))
    with open(os.path.join(cap, base.q(0) + ".npz"), "wb") as f:
        f.write(npz_bytes(arrays))
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), [".npz"])])


@case("class4", "entry_window_differs_from_manifest")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    edit_manifest(cap, lambda m: m.update(sliding_window=[None] * m["n_layers"]))
    modify_entry(cap, base.q(0), lambda a: a.update(sliding_window=np.array([64], dtype=np.int64)))
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), ["sliding_window", "64"])])


@case("class4", "query_and_key_windows_differ")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    edit_manifest(cap, lambda m: m.pop("sliding_window", None))  # not recorded: only the entries disagree
    modify_entry(cap, base.q(0), lambda a: a.update(sliding_window=np.array([64], dtype=np.int64)))
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), ["sliding_window"])])


# ---- class 5: stale reports and the output folder --------------------------------------
def _good_run(ctx, cap, out, *extra):
    r = ctx.analyze(cap, out, *extra)
    if r.rc != 0:
        raise Fail("first (clean) run: " + r.brief())
    return snapshot(out)


def _svgs(out):
    return sorted(p for p in snapshot(out) if p.endswith(".svg"))


@case("class5", "rerun_where_every_head_fails_leaves_no_old_file")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    old = _good_run(ctx, cap, out)
    for i in range(len(base.heads)):
        truncate_file(entry_path(cap, base.q(i)), 9)
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, list(range(len(base.heads))), [(base.q(i), []) for i in range(len(base.heads))],
                   healthy=[])
    new = snapshot(out)
    stale = [p for p, v in old.items() if v[0] == "file" and new.get(p) == v and not p.endswith(".qkgeom-report")
             and os.path.basename(p) not in ("failures.txt",)]
    if stale:
        raise Fail("files of the first run remain unchanged: %s" % stale[:6])
    if _svgs(out):
        raise Fail("pictures remain although no head was analysed: %s" % _svgs(out)[:4])
    m = head_rows(out, "head_metrics.csv")
    if m:
        raise Fail("head_metrics.csv still has rows for %s" % sorted(m))


@case("class5", "no_pictures_rerun_removes_old_pictures")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    _good_run(ctx, cap, out)
    if not _svgs(out):
        raise Fail("setup: the first run wrote no pictures")
    r = ctx.analyze(cap, out, "--no-pictures")
    expect_ok(r, out, base)
    left = _svgs(out) + [p for p in snapshot(out) if p.endswith("index.html")]
    if left:
        raise Fail("--no-pictures rerun: old pictures/index.html remain: %s" % left[:5])


def _planted_symlink_case(fname):
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        _good_run(ctx, cap, out)
        outside = os.path.join(ctx.case_dir, "precious.txt")
        with open(outside, "w") as f:
            f.write("precious\n")
        st = os.stat(outside)
        os.unlink(os.path.join(out, fname))
        os.symlink(outside, os.path.join(out, fname))
        r = ctx.analyze(cap, out)
        if r.rc != 0:
            raise Fail("expected exit 0, got " + r.brief())
        with open(outside) as f:
            if f.read() != "precious\n":
                raise Fail("the file %s pointed to was written through" % fname)
        if os.stat(outside).st_mtime_ns != st.st_mtime_ns:
            raise Fail("the file %s pointed to was touched" % fname)
        compare_heads(out, base, base.heads)
    return fn


case("class5", "summary_symlink_not_written_through")(_planted_symlink_case("summary.txt"))
case("class5", "head_metrics_symlink_not_written_through")(_planted_symlink_case("head_metrics.csv"))


def _bad_out_case(make, names_fn, root_ok=True):
    """OUT is unusable: exit 1 before any analysis (one stderr line even
    without --quiet: no progress line), nothing written, OUT's parent unchanged."""
    def fn(ctx):
        base, cap, _ = setup_copy(ctx)
        user = None if root_ok else unprivileged(ctx)
        parent = os.path.join(ctx.case_dir, "parent")
        os.mkdir(parent)
        out = make(parent)
        before = snapshot(parent)
        try:
            r = ctx.analyze(cap, out, quiet=False, user=user)
        finally:
            for dp, dns, _ in os.walk(parent):
                for d in dns:
                    os.chmod(os.path.join(dp, d), 0o755)
            os.chmod(parent, 0o755)
        expect_error(r, names_fn(out))
        if snapshot(parent) != before:
            raise Fail("the output folder's parent changed: %s" % sorted(set(snapshot(parent)) ^ set(before))[:5])
    return fn


def _mk_file(parent):
    p = os.path.join(parent, "out")
    with open(p, "w") as f:
        f.write("not a folder\n")
    return p


def _mk_foreign(parent):
    p = os.path.join(parent, "out")
    os.mkdir(p)
    with open(os.path.join(p, "thesis.tex"), "w") as f:
        f.write("\\chapter{mine}\n")
    return p


def _mk_symlink(parent):
    os.mkdir(os.path.join(parent, "real"))
    os.symlink("real", os.path.join(parent, "out"))
    return os.path.join(parent, "out")


def _mk_unwritable(parent):
    os.mkdir(os.path.join(parent, "ro"))
    os.chmod(os.path.join(parent, "ro"), 0o555)
    return os.path.join(parent, "ro", "out")


def _mk_under_file(parent):
    with open(os.path.join(parent, "file"), "w") as f:
        f.write("x\n")
    return os.path.join(parent, "file", "out")


case("class5", "out_is_a_file")(_bad_out_case(_mk_file, lambda o: ["parent/out"]))
case("class5", "out_is_a_foreign_nonempty_dir")(_bad_out_case(_mk_foreign, lambda o: ["parent/out"]))
case("class5", "out_is_a_symlink")(_bad_out_case(_mk_symlink, lambda o: ["parent/out"]))
case("class5", "out_parent_not_writable")(_bad_out_case(_mk_unwritable, lambda o: ["parent/ro"], root_ok=False))
case("class5", "out_parent_is_a_file")(_bad_out_case(_mk_under_file, lambda o: ["parent/file"]))


@case("class5", "empty_out_dir_accepted_and_marked")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    os.mkdir(out)
    r = ctx.analyze(cap, out)
    expect_ok(r, out, base)
    if not os.path.isfile(os.path.join(out, ".qkgeom-report")):
        raise Fail("no .qkgeom-report marker in the report folder")


@case("class5", "exit_1_leaves_previous_report_unchanged")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    old = _good_run(ctx, cap, out)
    edit_manifest(cap, lambda m: m.update(head_dim=-4))
    expect_error(ctx.analyze(cap, out), ["manifest.json"], ["head_dim"])
    if snapshot(out) != old:
        raise Fail("exit 1 changed the previous report folder")


@case("class5", "summary_and_index_record_the_run")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    r = ctx.analyze(cap, out, "--seed", 7, "--components", 5, "--ks-alpha", "0.01")
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    for f in ("summary.txt", "index.html"):
        p = os.path.join(out, f)
        if not os.path.isfile(p):
            raise Fail("%s not written" % f)
        text = open(p, encoding="utf-8", errors="replace").read()
        miss = [k for k in (cap, base.manifest["model"], "--seed 7", "--components 5", "--ks-alpha 0.01")
                if k not in text]
        if miss:
            raise Fail("%s does not record %s" % (f, miss))


# ---- class 6: small inputs claiming large allocations -----------------------------------
SMALL_RSS_MB = 96.0  # a tiny file claiming gigabytes: the program must not allocate for the claim


def _raw_entry_case(fmt, make_bytes, kws, member="vectors"):
    """Replace the file of q entry 0 by make_bytes(original bytes)."""
    def fn(ctx):
        base, cap, out = setup_copy(ctx, fmt)
        p = entry_path(cap, base.q(0), member)
        with open(p, "rb") as f:
            orig = f.read()
        data = make_bytes(orig)
        os.unlink(p)
        with open(p, "wb") as f:
            f.write(data)
        r = ctx.analyze(cap, out, rss_limit_mb=SMALL_RSS_MB)
        expect_partial(r, out, base, [0], [(base.q(0), [os.path.basename(p)] + list(kws))])
    return fn


def _npy_claim(shape, version=1):
    def mk(orig):
        return npy_header_bytes("<f4", shape, version=version) + orig[128:]
    return mk


case("class6", "npy_shape_2^40_rows")(_raw_entry_case("npy", _npy_claim((1 << 40, 64)), [("shape", "data", "trunc")]))
case("class6", "npy_shape_product_overflows")(
    _raw_entry_case("npy", _npy_claim((1 << 40, 1 << 40)), [("shape", "overflow", "data", "trunc")]))
case("class6", "npy_v2_header_length_4GiB")(
    _raw_entry_case("npy", lambda o: b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFF00) + o[12:], ["header"]))


def _npz_member_claim(orig):
    # A stored archive whose vectors.npy member header claims 2^40 rows.
    with zipfile.ZipFile(io.BytesIO(orig)) as z:
        members = {i.filename[:-4]: z.read(i) for i in z.infolist()}
    members["vectors"] = npy_header_bytes("<f4", (1 << 40, 64)) + members["vectors"][128:]
    return npz_bytes(members)


case("class6", "npz_member_header_claims_2^40_rows")(
    _raw_entry_case("npz", _npz_member_claim, ["vectors", ("shape", "data", "trunc")]))


def _local_header(name, method, crc, csize, usize):
    n = name.encode()
    return struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, method, 0, 0x21, crc, csize, usize, len(n), 0) + n


def _central_header(name, method, crc, csize, usize, offset):
    n = name.encode()
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 20, 20, 0, method, 0, 0x21, crc, csize, usize, len(n),
                       0, 0, 0, 0, 0, offset) + n


def zip_bytes(members, eocd_patch=None):
    """A ZIP written by hand: members = [(name, method, stored bytes, crc, usize)]."""
    body, cd = b"", b""
    for name, method, data, crc, usize in members:
        off = len(body)
        body += _local_header(name, method, crc, len(data), usize) + data
        cd += _central_header(name, method, crc, len(data), usize, off)
    eocd = dict(n=len(members), cd_size=len(cd), cd_off=len(body))
    if eocd_patch:
        eocd.update(eocd_patch)
    return body + cd + struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, eocd["n"], eocd["n"], eocd["cd_size"],
                                   eocd["cd_off"], 0)


def _npz_deflate_claims_2gb(orig):
    # vectors.npy: 2 MiB of deflate stream (incompressible bytes) whose
    # directory entries claim 2,000,000,000 inflated bytes; its npy header
    # claims as much. The real inflated size is ~2 MiB.
    with zipfile.ZipFile(io.BytesIO(orig)) as z:
        members = {i.filename[:-4]: z.read(i) for i in z.infolist()}
    claim = 2_000_000_000
    hdr = npy_header_bytes("<f4", ((claim - 128) // 4,))
    payload = hdr + np.random.default_rng(1).bytes(2 * MB)
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    comp = co.compress(payload) + co.flush()
    out = []
    for k, v in members.items():
        if k == "vectors":
            out.append(("vectors.npy", 8, comp, zlib.crc32(payload), claim))
        else:
            co = zlib.compressobj(6, zlib.DEFLATED, -15)
            c = co.compress(v) + co.flush()
            out.append((k + ".npy", 8, c, zlib.crc32(v), len(v)))
    return zip_bytes(out)


case("class6", "npz_deflated_member_claims_2GB")(
    _raw_entry_case("npz_deflate", _npz_deflate_claims_2gb, ["vectors", ("size", "trunc", "inflate", "shape", "data")]))


def _npz_eocd_lies(orig):
    with zipfile.ZipFile(io.BytesIO(orig)) as z:
        members = [(i.filename, 0, z.read(i), zlib.crc32(z.read(i)), i.file_size) for i in z.infolist()]
    return zip_bytes(members, {"n": 65535, "cd_size": 0xFFFFFF00})


case("class6", "npz_end_record_claims_65535_entries_4GiB_directory")(
    _raw_entry_case("npz", _npz_eocd_lies, [("central", "directory", "entries", "end of")]))


def _zip64_member(name, data, claim):
    """A stored member whose ZIP64 extra fields (local and central) claim `claim` bytes."""
    n = name.encode()
    crc = zlib.crc32(data)
    ext_local = struct.pack("<HHQQ", 1, 16, claim, claim)
    local = struct.pack("<IHHHHHIIIHH", 0x04034b50, 45, 0, 0, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(n),
                        len(ext_local)) + n + ext_local
    return local, crc, n


def _npz_zip64_claim(orig):
    with zipfile.ZipFile(io.BytesIO(orig)) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    body, cd = b"", b""
    for fname, data in members.items():
        off = len(body)
        if fname == "vectors.npy":
            claim = 1 << 40
            local, crc, n = _zip64_member(fname, data, claim)
            body += local + data
            ext = struct.pack("<HHQQ", 1, 16, claim, claim)
            cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 45, 45, 0, 0, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                              len(n), len(ext), 0, 0, 0, 0, off) + n + ext
        else:
            crc = zlib.crc32(data)
            body += _local_header(fname, 0, crc, len(data), len(data)) + data
            cd += _central_header(fname, 0, crc, len(data), len(data), off)
    return body + cd + struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, len(members), len(members), len(cd), len(body), 0)


case("class6", "npz_zip64_member_claims_2^40_bytes")(
    _raw_entry_case("npz", _npz_zip64_claim, ["vectors", ("size", "zip64", "data", "trunc", "beyond", "outside")]))


def _deflate_zeros(nbytes, prefix=b""):
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [co.compress(prefix)]
    chunk = bytes(4 * MB)
    left = nbytes
    while left > 0:
        parts.append(co.compress(chunk[:min(left, len(chunk))]))
        left -= len(chunk)
    parts.append(co.flush())
    crc = zlib.crc32(prefix)
    left = nbytes
    while left > 0:
        crc = zlib.crc32(chunk[:min(left, len(chunk))], crc)
        left -= len(chunk)
    return b"".join(parts), crc, len(prefix) + nbytes


@case("class6", "npz_deflate_bomb_2M_rows_of_zeros")
def _(ctx):
    # An honest archive (~0.6 MB) that inflates to 2,097,152 rows of d = 64 zeros
    # (512 MB of f32; positions 0, bucket 0: every rule holds). An input under
    # 10 MB: the program must stay within the bounds, so it refuses the entry
    # naming it (exit 3), or analyses it within them (exit 0).
    base, cap, out = setup_copy(ctx, "npz_deflate")
    rows, d = 2 * 1024 * 1024, base.manifest["head_dim"]
    members = []
    for key, descr, shape, item in (("vectors", "<f4", (rows, d), 4), ("position", "<i8", (rows,), 8),
                                    ("bucket", "<i8", (rows,), 8), ("example_id", "<i8", (rows,), 8)):
        hdr = npy_header_bytes(descr, shape)
        comp, crc, usize = _deflate_zeros(rows * (d if key == "vectors" else 1) * item, hdr)
        members.append((key + ".npy", 8, comp, crc, usize))
    p = entry_path(cap, base.q(0))
    with open(p, "wb") as f:
        f.write(zip_bytes(members))
    if os.path.getsize(p) > 10 * MB:
        raise Fail("setup: archive over 10 MB")
    r = ctx.analyze(cap, out)
    if r.rc == 0:
        compare_heads(out, base, base.heads[1:])
    else:
        expect_partial(r, out, base, [0], [(base.q(0), [os.path.basename(p)])])


def _st_header_len(n):
    def mk(orig):
        return struct.pack("<Q", n) + orig[8:]
    return mk


case("class6", "safetensors_header_length_2^62")(
    _raw_entry_case("safetensors", _st_header_len(1 << 62), ["header"]))
case("class6", "safetensors_header_length_90MB_in_small_file")(
    _raw_entry_case("safetensors", _st_header_len(90_000_000), ["header"]))


def _st_shape_huge(orig):
    arrays, meta = st_parse(orig)
    raw = st_bytes(arrays, meta)
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr["vectors"]["shape"] = [1 << 40, 64]
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + raw[8 + n:]


case("class6", "safetensors_shape_2^40_rows")(
    _raw_entry_case("safetensors", _st_shape_huge, ["vectors", ("shape", "data_offsets", "size")]))


@case("class6", "safetensors_9MB_header")
def _(ctx):
    # A valid file whose header carries ~9 MB of metadata: within bounds, either
    # read (exit 0, values as the clean run's) or refused naming the file.
    base, cap, out = setup_copy(ctx, "safetensors")
    p = entry_path(cap, base.q(0))
    with open(p, "rb") as f:
        arrays, meta = st_parse(f.read())
    meta = dict(meta or {})
    for i in range(300_000):
        meta["k%06d" % i] = "v" * 14
    data = st_bytes(arrays, meta)
    with open(p, "wb") as f:
        f.write(data)
    if os.path.getsize(p) > 10 * MB:
        raise Fail("setup: file over 10 MB")
    r = ctx.analyze(cap, out)
    if r.rc == 0:
        compare_heads(out, base, base.heads)
    else:
        expect_partial(r, out, base, [0], [(base.q(0), [os.path.basename(p), "header"])])


def _manifest_claim_case(fn, accept=(1, 3), kws=()):
    def case_fn(ctx):
        base, cap, out = setup_copy(ctx)
        edit_manifest(cap, fn)
        r = ctx.analyze(cap, out, rss_limit_mb=SMALL_RSS_MB)
        if r.rc not in accept:
            raise Fail("expected exit %s, got %s" % ("/".join(map(str, accept)), r.brief()))
        if r.rc == 1:
            expect_error(r, ["manifest.json"], kws)
        elif r.rc == 3:
            miss = missing_keywords(failures_text(out), kws)
            if miss:
                raise Fail("failures.txt lacks %s" % miss)
        elif r.rc == 0:
            compare_heads(out, base, base.heads)
    return case_fn


def _heads(nq, nkv, sample):
    def fn(m):
        m["n_q_heads"] = [nq] * m["n_layers"]
        m["n_kv_heads"] = [nkv] * m["n_layers"]
        m.pop("gqa_group_size", None)
        if not sample:
            m.pop("capture", None)
    return fn


case("class6", "manifest_2^40_query_heads")(_manifest_claim_case(_heads(1 << 40, 2, False), kws=["n_q_heads"]))
case("class6", "manifest_2^40_query_heads_sampled")(_manifest_claim_case(_heads(1 << 40, 2, True)))
case("class6", "manifest_10^6_query_heads")(_manifest_claim_case(_heads(10 ** 6, 2, False)))
@case("class6", "manifest_10^6_query_heads_over_1000_layers_small_failures_txt")
def _(ctx):
    # 1000 layers x 1000 query heads (within every manifest limit) over a folder
    # that holds four: the missing heads cost no I/O and collapse into a few
    # lines, so failures.txt stays small (it was 141 MB) and the run fast.
    base, cap, out = setup_copy(ctx)

    def fn(m):
        m.update(n_layers=1000, n_q_heads=[1000] * 1000, n_kv_heads=[2] * 1000)
        for k in ("gqa_group_size", "sliding_window", "capture"):
            m.pop(k, None)
    edit_manifest(cap, fn)
    r = ctx.analyze(cap, out, rss_limit_mb=SMALL_RSS_MB)
    if r.rc != 3:
        raise Fail("expected exit 3, got %s" % r.brief())
    size = os.path.getsize(os.path.join(out, "failures.txt"))
    if size > 64 * 1024:
        raise Fail("failures.txt is %d bytes for a folder of four heads" % size)
    if "planned query heads" not in failures_text(out):
        raise Fail("failures.txt does not collapse the missing entries")


def _layers_2_40(m):
    m.update(n_layers=1 << 40, n_q_heads=m["n_q_heads"][0], n_kv_heads=m["n_kv_heads"][0])
    for k in ("gqa_group_size", "sliding_window", "capture"):
        m.pop(k, None)


case("class6", "manifest_2^40_layers")(_manifest_claim_case(_layers_2_40, kws=["n_layers"]))
case("class6", "manifest_head_dim_2^40")(_manifest_claim_case(lambda m: m.update(head_dim=1 << 40), kws=["head_dim"]))


@case("class6", "manifest_with_300000_keys")
def _(ctx):
    # A valid manifest whose unknown field is an object of 300,000 keys (~5 MB):
    # read within bounds (no quadratic duplicate-key check) or refused naming the file.
    base, cap, out = setup_copy(ctx)
    m = dict(base.manifest)
    m["extra"] = {"k%06d" % i: 0 for i in range(300_000)}
    edit_manifest(cap, text=json.dumps(m))
    r = ctx.analyze(cap, out)
    if r.rc == 0:
        compare_heads(out, base, base.heads)
    else:
        expect_error(r, ["manifest.json"])


@case("class6", "manifest_9MB")
def _(ctx):
    # A valid manifest padded with ~9 MB of an unknown field (ignored on read):
    # within bounds, either read (exit 0, the clean run's values) or refused naming the file.
    base, cap, out = setup_copy(ctx)
    m = dict(base.manifest)
    m["padding"] = list(range(1_100_000))
    edit_manifest(cap, text=json.dumps(m))
    if os.path.getsize(os.path.join(cap, "manifest.json")) > 10 * MB:
        raise Fail("setup: manifest over 10 MB")
    r = ctx.analyze(cap, out)
    if r.rc == 0:
        compare_heads(out, base, base.heads)
    else:
        expect_error(r, ["manifest.json"])


def _shard_file(ctx, name, data):
    p = os.path.join(ctx.case_dir, name)
    with open(p, "wb") as f:
        f.write(data)
    return p


@case("class6", "shard_72_bytes_claiming_d_4096")
def _(ctx):
    hdr = SHARD_MAGIC + struct.pack("<IIqqqQ", 1, 0, 0, 0, 0, 4096) + struct.pack("<Q", 1)
    p = _shard_file(ctx, "tiny.qkm", hdr + struct.pack("<qq", 0, 1))
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", p, "-o", out, rss_limit_mb=SMALL_RSS_MB)
    expect_error(r, ["tiny.qkm"])
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")


@case("class6", "shard_claiming_2^60_buckets")
def _(ctx):
    hdr = SHARD_MAGIC + struct.pack("<IIqqqQ", 1, 0, 0, 0, 0, 4) + struct.pack("<Q", 1 << 60)
    p = _shard_file(ctx, "many.qkm", hdr + b"\0" * 40)
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", p, "-o", out, rss_limit_mb=SMALL_RSS_MB)
    expect_error(r, ["many.qkm"], [("n_buckets", "bucket", "trunc")])
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")


# ---- class 7: messages naming their source ---------------------------------------------
MISSING = ("missing", "not found", "no such", "does not exist", "no entry")


def _key_case(mutate, kws):
    """A key entry at fault: every query head reading it fails, each failure
    naming the key entry; the heads reading the other key entry are intact."""
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        k = base.key_with_healthy()
        mutate(cap, k)
        r = ctx.analyze(cap, out)
        readers = base.readers_of(k)
        expect_partial(r, out, base, readers, [(k, kws)] + [(entry(l, h, "q"), [k]) for l, h, _ in readers])
    return fn


def _zero_rows(cap, name):
    def fn(a):
        a["vectors"] = a["vectors"][:0]
        for m in ("position", "bucket", "example_id"):
            a[m] = a[m][:0]
    modify_entry(cap, name, fn)


case("class7", "key_entry_with_zero_rows_names_the_key_entry")(_key_case(_zero_rows, ["row"]))
case("class7", "missing_key_entry_names_the_key_entry")(_key_case(remove_entry, [MISSING]))
case("class7", "key_entry_bad_bucket_names_the_key_entry")(_key_case(
    lambda cap, k: modify_entry(cap, k, lambda a: a.update(bucket=a["bucket"] + 1)), ["bucket"]))


@case("class7", "query_entry_with_zero_rows")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    _zero_rows(cap, base.q(0))
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), ["row"])])


# Under --strict the message names the head entry, also for an error found by
# the analysis rather than by the reader (zero rows, a value over 2^128: their
# library messages carry no file name of their own).
@case("class7", "strict_names_the_failing_query_head")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    _zero_rows(cap, base.q(1))
    expect_error(ctx.analyze(cap, out, "--strict"), [base.q(1), "row"])


@case("class7", "strict_names_the_failing_key_entry")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    k = base.key_with_healthy()
    _zero_rows(cap, k)
    expect_error(ctx.analyze(cap, out, "--strict"), [k, "row"])


@case("class7", "strict_names_the_head_with_an_overflow")
def _(ctx):
    base, cap, out = setup_copy(ctx, "npy", "f64")
    set_value(cap, base.q(1), 3, 5, 1e154)
    expect_error(ctx.analyze(cap, out, "--strict"), [base.q(1), "row 3", Num(1e154)])


@case("class7", "strict_truncated_file_names_head_and_file")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    truncate_file(entry_path(cap, base.q(1)), 9)
    expect_error(ctx.analyze(cap, out, "--strict"), [base.q(1), "vectors.npy"])


@case("class7", "manifest_with_utf8_bom")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    with open(os.path.join(cap, "manifest.json"), "rb") as f:
        data = f.read()
    edit_manifest(cap, raw=b"\xef\xbb\xbf" + data)
    expect_error(ctx.analyze(cap, out), ["manifest.json"], [("bom", "byte order mark", "byte-order mark")])


@case("class7", "cr_lf_in_manifest_value_not_raw_in_message")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    edit_manifest(cap, lambda m: m["buckets"].update(scheme="uni\r\nform"))
    expect_error(ctx.analyze(cap, out), ["manifest.json", "scheme"])


@case("class7", "cr_lf_in_npy_descr_not_raw_in_message")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    p = entry_path(cap, base.q(0))
    with open(p, "rb") as f:
        orig = f.read()
    hdr = npy_header_bytes(None, None, raw_dict="{'descr': '<f\r\n4', 'fortran_order': False, 'shape': (3, 64), }")
    with open(p, "wb") as f:
        f.write(hdr + orig[128:128 + 3 * 64 * 4])
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), ["vectors.npy", ("descr", "header")])])


@case("class7", "cr_lf_in_shard_magic_not_raw_in_message")
def _(ctx):
    good = shard_bytes(4, random_shard_records(1, 4, [0, 1]), [])
    p = _shard_file(ctx, "crlf.qkm", b"\r\nQKGM\r\n" + good[8:])
    r = ctx.run("merge", p, "-o", os.path.join(ctx.case_dir, "m.qkm"))
    expect_error(r, ["crlf.qkm", "magic"])


def _crlf_dir(ctx, base):
    cap = os.path.join(ctx.case_dir, "ca\r\np")
    shutil.copytree(base.cap, cap, symlinks=True)
    return cap


@case("class7", "cr_lf_in_capture_path_manifest_error")
def _(ctx):
    base = ctx.base("npy", "f32")
    cap = _crlf_dir(ctx, base)
    edit_manifest(cap, lambda m: m.update(head_dim=-4))
    expect_error(ctx.analyze(cap, os.path.join(ctx.case_dir, "out")), ["manifest.json", "head_dim"])


@case("class7", "cr_lf_in_capture_path_entry_error")
def _(ctx):
    base = ctx.base("npy", "f32")
    cap = _crlf_dir(ctx, base)
    out = os.path.join(ctx.case_dir, "out")
    truncate_file(entry_path(cap, base.q(0)), 9)
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), ["vectors.npy"])])


@case("class7", "escape_sequence_in_npy_descr_not_raw_in_message")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    p = entry_path(cap, base.q(0))
    with open(p, "rb") as f:
        orig = f.read()
    hdr = npy_header_bytes(None, None, raw_dict="{'descr': '<f\x1b[2J4', 'fortran_order': False, 'shape': (3, 64), }")
    with open(p, "wb") as f:
        f.write(hdr + orig[128:128 + 3 * 64 * 4])
    r = ctx.analyze(cap, out)
    expect_partial(r, out, base, [0], [(base.q(0), ["vectors.npy"])])


@case("class7", "nul_in_manifest_value_not_raw_in_message")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    edit_manifest(cap, lambda m: m["buckets"].update(scheme="uni\u0000\u001b[2Jform"))
    expect_error(ctx.analyze(cap, out), ["manifest.json", "scheme"])


@case("class7", "usage_error_exit_2")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    expect_usage(ctx.analyze(cap, out, "--jobs", "-3"), ["--jobs"])


# ---- class 8: shards and `qkgeom merge` ---------------------------------------------------
def _merge_expect_error(ctx, shards, bad_name, kws):
    paths = [_shard_file(ctx, n, d) for n, d in shards]
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", *paths, "-o", out)
    expect_error(r, [bad_name], kws)
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")


def _good(seed, buckets=(0, 1, 2), d=4):
    return shard_bytes(d, random_shard_records(seed, d, buckets), random_shard_records(seed + 100, d, buckets))


@case("class8", "merge_counts_are_the_sum")
def _(ctx):
    shards = [("a.qkm", _good(1, (0, 1, 2))), ("b.qkm", _good(2, (1, 2, 5))), ("c.qkm", _good(3, (7,)))]
    paths = [_shard_file(ctx, n, d) for n, d in shards]
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", *paths, "-o", out)
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    with open(out, "rb") as f:
        d, got = parse_shard(f.read())
    want = {"q": {}, "k": {}}
    for _, data in shards:
        _, s = parse_shard(data)
        for kind in ("q", "k"):
            for b, (n, mt) in s[kind].items():
                n0, sum0 = want[kind].get(b, (0, 0.0))
                want[kind][b] = (n0 + n, sum0 + n * mt)
    for kind in ("q", "k"):
        if sorted(got[kind]) != sorted(want[kind]):
            raise Fail("%s buckets %s, expected %s" % (kind, sorted(got[kind]), sorted(want[kind])))
        for b, (n, st) in want[kind].items():
            gn, gm = got[kind][b]
            if gn != n or abs(gm - st / n) > 1e-9 * max(1.0, abs(st / n)):
                raise Fail("%s bucket %d: n %d mean_t %r, expected %d, %r" % (kind, b, gn, gm, n, st / n))
    total_q = sum(n for n, _ in want["q"].values())
    if str(total_q) not in r.out + r.err:
        raise Fail("merge did not print the row count %d: %r" % (total_q, (r.out + r.err)[:300]))


def _recheck(data):
    """Recompute the checksum of a (modified) shard."""
    body = data[:-8]
    return body + struct.pack("<Q", fnv1a64(body))


def _mutate(seed, fn, d=4):
    recs = random_shard_records(seed, d, [0, 1, 2])
    fn(recs)
    return shard_bytes(d, recs, random_shard_records(seed + 1, d, [0, 1]))


@case("class8", "truncated_shard_in_header")
def _(ctx):
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("t.qkm", _good(2)[:30])], "t.qkm", [("trunc", "end of")])


@case("class8", "truncated_shard_in_body")
def _(ctx):
    g = _good(2)
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("t.qkm", g[:len(g) // 2])], "t.qkm",
                        [("trunc", "end of", "bytes left")])


@case("class8", "wrong_magic")
def _(ctx):
    g = _good(2)
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("m.qkm", b"QKGMOX\r\n" + g[8:])], "m.qkm", ["magic"])


@case("class8", "checksum_mismatch")
def _(ctx):
    g = bytearray(_good(2))
    g[-3] ^= 1  # in the stored checksum itself: every field still valid
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("c.qkm", bytes(g))], "c.qkm", ["checksum"])


@case("class8", "one_row_bucket_spanning_positions_checksum_recomputed")
def _(ctx):
    # n = 1 but t_min < t_max and m2_t > 0: a row count the statistics contradict.
    def fn(recs):
        recs[1]["n"] = 1
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("n.qkm", _mutate(5, fn))], "n.qkm", ["buckets"])


@case("class8", "row_count_too_small_for_m2_checksum_recomputed")
def _(ctx):
    # n = 2 with 5 rows' spread: m2_t exceeds n * (t_max - t_min)^2 / 4.
    def fn(recs):
        recs[0]["n"] = 2
        recs[0]["m2_t"] = 4 * (recs[0]["t_max"] - recs[0]["t_min"]) ** 2
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("n.qkm", _mutate(6, fn))], "n.qkm", ["buckets"])


@case("class8", "d_zero")
def _(ctx):
    b = bytearray(_good(2))
    struct.pack_into("<Q", b, 40, 0)
    _merge_expect_error(ctx, [("d.qkm", _recheck(bytes(b)))], "d.qkm", [("d", "dimension")])


@case("class8", "d_above_4096")
def _(ctx):
    b = bytearray(_good(2))
    struct.pack_into("<Q", b, 40, 5000)
    _merge_expect_error(ctx, [("d.qkm", _recheck(bytes(b)))], "d.qkm", [("d", "dimension")])


@case("class8", "different_head_dimensions")
def _(ctx):
    _merge_expect_error(ctx, [("a.qkm", _good(1, d=4)), ("b.qkm", _good(2, d=3))], "b.qkm",
                        [("dimension", "d ")])


@case("class8", "negative_bucket_id")
def _(ctx):
    def fn(recs):
        recs[0]["bucket"] = -1
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("b.qkm", _mutate(7, fn))], "b.qkm", ["bucket"])


@case("class8", "nan_mean_checksum_recomputed")
def _(ctx):
    def fn(recs):
        recs[2]["mean_x"] = recs[2]["mean_x"].copy()
        recs[2]["mean_x"][1] = float("nan")
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("x.qkm", _mutate(8, fn))], "x.qkm", ["mean_x", "nan"])


@case("class8", "trailing_bytes")
def _(ctx):
    _merge_expect_error(ctx, [("a.qkm", _good(1)), ("t.qkm", _good(2) + b"\0")], "t.qkm", [("trailing", "checksum")])


@case("class8", "fifo_as_shard")
def _(ctx):
    p = os.path.join(ctx.case_dir, "f.qkm")
    os.mkfifo(p)
    a = _shard_file(ctx, "a.qkm", _good(1))
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", a, p, "-o", out)
    expect_error(r, ["f.qkm"], [NOT_REGULAR])
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")


@case("class8", "directory_as_shard")
def _(ctx):
    p = os.path.join(ctx.case_dir, "dir.qkm")
    os.mkdir(p)
    a = _shard_file(ctx, "a.qkm", _good(1))
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", a, p, "-o", out)
    expect_error(r, ["dir.qkm"], [("director",) + NOT_REGULAR])
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")


@case("class8", "missing_shard")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _good(1))
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", a, os.path.join(ctx.case_dir, "nope.qkm"), "-o", out)
    expect_error(r, ["nope.qkm"], [MISSING])
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")


# ---- manifest field errors: exit 1 naming manifest.json and the field ----------------------
def _manifest_case(edit, kws, text=None):
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        if text is not None:
            with open(os.path.join(cap, "manifest.json")) as f:
                data = text(f.read())
            edit_manifest(cap, raw=data if isinstance(data, bytes) else data.encode("utf-8"))
        elif edit is not None:
            edit_manifest(cap, edit)
        expect_error(ctx.analyze(cap, out), ["manifest.json"], kws)
    return fn


def _set(**kv):
    return lambda m: m.update(kv)


def _drop(key):
    return lambda m: m.pop(key)


case("manifest", "missing_head_dim")(_manifest_case(_drop("head_dim"), ["head_dim"]))
case("manifest", "missing_model")(_manifest_case(_drop("model"), ["model"]))
case("manifest", "missing_context_length")(_manifest_case(_drop("context_length"), ["context_length"]))
case("manifest", "n_layers_is_a_string")(_manifest_case(_set(n_layers="1"), ["n_layers"]))
case("manifest", "negative_head_dim")(_manifest_case(_set(head_dim=-4), ["head_dim", "-4"]))
case("manifest", "fractional_head_dim")(_manifest_case(_set(head_dim=64.5), ["head_dim", "64.5"]))
def _kv_3(m):
    m.update(n_kv_heads=[3] * m["n_layers"])
    m.pop("gqa_group_size", None)


case("manifest", "n_kv_heads_not_dividing_n_q_heads")(_manifest_case(_kv_3, ["n_kv_heads", "3"]))
case("manifest", "gqa_group_size_contradicts_head_counts")(
    _manifest_case(_set(gqa_group_size=[3]), ["gqa_group_size"]))
case("manifest", "n_q_heads_length_differs_from_n_layers")(
    _manifest_case(lambda m: m.update(n_q_heads=[8, 8]), ["n_q_heads"]))
case("manifest", "unknown_bucket_scheme")(
    _manifest_case(lambda m: m["buckets"].update(scheme="quadratic"), ["scheme", "quadratic"]))
case("manifest", "bucket_width_zero")(_manifest_case(lambda m: m["buckets"].update(width=0), ["width"]))
case("manifest", "bucket_rate_negative")(_manifest_case(lambda m: m["buckets"].update(rate=-1.0), ["rate"]))
case("manifest", "context_length_zero")(_manifest_case(_set(context_length=0), ["context_length"]))
case("manifest", "sliding_window_length_differs")(
    _manifest_case(lambda m: m.update(sliding_window=[None] * (m["n_layers"] + 1)), ["sliding_window"]))
case("manifest", "rope_rotary_dim_odd")(
    _manifest_case(_set(rope={"pairing": "rotate_half", "rotary_dim": 33, "theta": 10000.0}), ["rotary_dim", "33"]))
case("manifest", "capture_seed_negative")(_manifest_case(lambda m: m["capture"].update(seed=-1), ["seed"]))
case("manifest", "truncated_json")(_manifest_case(None, [("json", "end", "trunc")], text=lambda s: s[:len(s) // 2]))
case("manifest", "trailing_comma")(_manifest_case(None, ["json"], text=lambda s: s.rstrip()[:-1] + ",}"))
case("manifest", "duplicate_key")(_manifest_case(None, ["duplicate"], text=lambda s: '{"head_dim": 64,' + s.lstrip()[1:]))
case("manifest", "nesting_100000_deep")(
    _manifest_case(None, [("depth", "nest", "deep")], text=lambda s: '{"x": ' + "[" * 100000 + "]" * 100000 + "," + s.lstrip()[1:]))
case("manifest", "invalid_utf8")(_manifest_case(None, [("utf-8", "utf8")], text=lambda s: s.replace(
    '"model": "', '"model": "\udcff').encode("utf-8", "surrogateescape")))
case("manifest", "empty_file")(_manifest_case(None, [], text=lambda s: b""))


@case("manifest", "missing_manifest_file")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    os.unlink(os.path.join(cap, "manifest.json"))
    expect_error(ctx.analyze(cap, out), ["manifest.json"], [MISSING])


# ---- formats: the same corruptions in every storage form ---------------------------------
FORMATS = ["npy", "npz", "npz_deflate", "safetensors"]
BASES = [(f, "f32") for f in FORMATS] + [("npy", "f64")]


def _fmt_case(fmt, mutate, kws, key=False, raw=False):
    def fn(ctx):
        base, cap, out = setup_copy(ctx, fmt)
        name = base.key_with_healthy() if key else base.q(0)
        if raw:
            mutate(entry_path(cap, name))
        else:
            modify_entry(cap, name, mutate)
        r = ctx.analyze(cap, out)
        fails = base.readers_of(name) if key else [0]
        expect_partial(r, out, base, fails, [(name, kws)])
    return fn


def _int_vectors(a):
    a["vectors"] = np.round(a["vectors"] * 100).astype(np.int32)


def _short_position(a):
    a["position"] = a["position"][:-1]


def _neg_position(a):
    p = a["position"].copy()
    p[5] = -3
    a["position"] = p


def _bad_bucket(a):
    b = a["bucket"].copy()
    b[5] += 1
    a["bucket"] = b


def _long_example_id(a):
    a["example_id"] = np.concatenate([a["example_id"], a["example_id"][:1]])


def _narrow_vectors(a):
    a["vectors"] = np.ascontiguousarray(a["vectors"][:, :-1])


def _nan_vector(a):
    v = a["vectors"].copy()
    v[7, 2] = np.nan
    a["vectors"] = v


def _rank1_position(a):
    a["position"] = a["position"].reshape(-1, 1)


def _float_position(a):
    a["position"] = a["position"].astype(np.float64)


def _drop_member(member):
    def fn(a):
        del a[member]
    return fn


for _fmt in FORMATS:
    _ext = {"npy": "vectors.npy", "npz": ".npz", "npz_deflate": ".npz", "safetensors": ".safetensors"}[_fmt]
    case("formats", _fmt + ".truncated_file")(_fmt_case(_fmt, lambda p: truncate_file(p, 7), [_ext], raw=True))
    case("formats", _fmt + ".trailing_bytes")(
        _fmt_case(_fmt, lambda p: open(p, "ab").write(b"\0" * 8), [_ext], raw=True))
    case("formats", _fmt + ".integer_vectors")(_fmt_case(_fmt, _int_vectors, ["vectors", ("dtype", "descr", "float")]))
    case("formats", _fmt + ".position_shorter_than_vectors")(
        _fmt_case(_fmt, _short_position, ["position", ("length", "rows")]))
    case("formats", _fmt + ".negative_position")(_fmt_case(_fmt, _neg_position, ["position", "-3"]))
    case("formats", _fmt + ".bucket_inconsistent_with_scheme")(_fmt_case(_fmt, _bad_bucket, ["bucket"]))
    case("formats", _fmt + ".example_id_longer_than_vectors")(
        _fmt_case(_fmt, _long_example_id, ["example_id", ("length", "rows")]))
    case("formats", _fmt + ".vectors_one_column_short")(
        _fmt_case(_fmt, _narrow_vectors, ["vectors", ("head_dim", "column"), "63"]))
    case("formats", _fmt + ".nan_in_vectors")(_fmt_case(_fmt, _nan_vector, ["vectors", "nan"]))
    case("formats", _fmt + ".position_rank_2")(_fmt_case(_fmt, _rank1_position, ["position", ("rank", "shape")]))
    case("formats", _fmt + ".float_positions")(_fmt_case(_fmt, _float_position, ["position", ("dtype", "descr", "integer")]))
    case("formats", _fmt + ".missing_example_id_member")(
        _fmt_case(_fmt, _drop_member("example_id"), ["example_id"]))
    case("formats", _fmt + ".key_entry_truncated")(
        _fmt_case(_fmt, lambda p: truncate_file(p, 7), [_ext], key=True, raw=True))


# ---- more of each class -----------------------------------------------------------------
@case("class3", "dev_zero_as_manifest")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    os.unlink(os.path.join(cap, "manifest.json"))
    os.symlink("/dev/zero", os.path.join(cap, "manifest.json"))
    expect_error(ctx.analyze(cap, out), ["manifest.json"], [NOT_REGULAR + ("device",)])


@case("class3", "capture_dir_is_a_file")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    shutil.rmtree(cap)
    with open(cap, "w") as f:
        f.write("x\n")
    expect_error(ctx.analyze(cap, out), ["cap"], [("director", "manifest.json", "not a")])


@case("class3", "capture_dir_missing")
def _(ctx):
    out = os.path.join(ctx.case_dir, "out")
    expect_error(ctx.analyze(os.path.join(ctx.case_dir, "nowhere"), out), ["nowhere"], [MISSING])


def _window_member(value):
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        modify_entry(cap, base.q(0), lambda a: a.update(sliding_window=np.array(value, dtype=np.int64)))
        r = ctx.analyze(cap, out)
        expect_partial(r, out, base, [0], [(base.q(0), ["sliding_window"])])
    return fn


case("class4", "sliding_window_zero")(_window_member([0]))
case("class4", "sliding_window_two_values")(_window_member([64, 64]))


@case("class5", "out_is_the_capture_dir")
def _(ctx):
    base, cap, _ = setup_copy(ctx)
    before = snapshot(cap)
    expect_error(ctx.analyze(cap, cap, quiet=False), ["cap"])
    if snapshot(cap) != before:
        raise Fail("analyze -o CAPTURE changed the capture")


@case("class7", "strict_names_a_stray_entry")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    shutil.copytree(os.path.join(cap, base.q(0)), os.path.join(cap, "l05h00q"))
    expect_error(ctx.analyze(cap, out, "--strict"), ["l05h00q"])


@case("class7", "strict_names_head_below_context")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    expect_error(ctx.analyze(cap, out, "--strict", "--context", 100), ["context"])
    msg = unpathed(ctx.last_err)
    if not ENTRY_RE.search(msg):
        raise Fail("--strict message names no head entry: %r" % msg[:300])


@case("class8", "dev_zero_as_shard")
def _(ctx):
    p = os.path.join(ctx.case_dir, "z.qkm")
    os.symlink("/dev/zero", p)
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", _shard_file(ctx, "a.qkm", _good(1)), p, "-o", out)
    expect_error(r, ["z.qkm"], [NOT_REGULAR + ("device",)])
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")


@case("class8", "failed_merge_leaves_existing_output_unchanged")
def _(ctx):
    out = _shard_file(ctx, "merged.qkm", b"previous result\n")
    g = bytearray(_good(2))
    g[-3] ^= 1
    r = ctx.run("merge", _shard_file(ctx, "a.qkm", _good(1)), _shard_file(ctx, "c.qkm", bytes(g)), "-o", out)
    expect_error(r, ["c.qkm"], ["checksum"])
    if open(out, "rb").read() != b"previous result\n":
        raise Fail("a failed merge changed the existing output file")
    if sorted(os.listdir(ctx.case_dir)) != ["a.qkm", "c.qkm", "merged.qkm"]:
        raise Fail("a failed merge left files behind: %s" % sorted(os.listdir(ctx.case_dir)))


@case("class8", "merge_without_shards")
def _(ctx):
    r = ctx.run("merge", "-o", os.path.join(ctx.case_dir, "m.qkm"))
    if r.rc not in (1, 2):
        raise Fail("expected exit 2 (or 1), got " + r.brief())
    if os.path.lexists(os.path.join(ctx.case_dir, "m.qkm")):
        raise Fail("merge of nothing created its output")


def _fortran_vectors(a):
    a["vectors"] = np.asfortranarray(a["vectors"])


def _st_edit_header(fn):
    """Rewrite a safetensors file's header JSON with fn(header dict)."""
    def mk(p):
        with open(p, "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        fn(hdr)
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    return mk


def _npz_flip_member_byte(p):
    """One flipped byte inside the vectors.npy member's data (CRC-32 / inflate must catch it)."""
    with open(p, "rb") as f:
        raw = bytearray(f.read())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z:
        info = z.getinfo("vectors.npy")
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    data_at = info.header_offset + 30 + name_len + extra_len
    raw[data_at + info.compress_size // 2] ^= 0x10
    with open(p, "wb") as f:
        f.write(bytes(raw))


def _npz_encrypted(p):
    with open(p, "rb") as f:
        raw = bytearray(f.read())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z:
        infos = z.infolist()
    cd = raw.rfind(b"PK\x05\x06")
    cd_off = struct.unpack_from("<I", raw, cd + 16)[0]
    for i in infos:  # general purpose flag bit 0 in the local and the central header
        raw[i.header_offset + 6] |= 1
    at = cd_off
    while raw[at:at + 4] == b"PK\x01\x02":
        raw[at + 8] |= 1
        n, e, c = struct.unpack_from("<HHH", raw, at + 28)
        at += 46 + n + e + c
    with open(p, "wb") as f:
        f.write(bytes(raw))


case("formats", "npy.fortran_order_read_identically")(
    lambda ctx: _valid_variant(ctx, "npy", _fortran_vectors))
case("formats", "npz.fortran_order_read_identically")(
    lambda ctx: _valid_variant(ctx, "npz", _fortran_vectors))


def _valid_variant(ctx, fmt, mutate):
    base, cap, out = setup_copy(ctx, fmt)
    modify_entry(cap, base.q(0), mutate)
    expect_ok(ctx.analyze(cap, out), out, base)


def _big_endian_npy(p):
    with open(p, "rb") as f:
        raw = f.read()
    with open(p, "wb") as f:
        f.write(raw.replace(b"'<f4'", b"'>f4'", 1))


case("formats", "npy.big_endian_descr")(_fmt_case("npy", _big_endian_npy, ["descr", ">f4"], raw=True))
case("formats", "npz.crc_mismatch")(_fmt_case("npz", _npz_flip_member_byte, ["vectors", ("crc", "checksum")], raw=True))
case("formats", "npz_deflate.corrupt_deflate_stream")(
    _fmt_case("npz_deflate", _npz_flip_member_byte, ["vectors"], raw=True))
case("formats", "npz.encrypted_member")(_fmt_case("npz", _npz_encrypted, [("encrypt",)], raw=True))
case("formats", "safetensors.unknown_dtype")(_fmt_case(
    "safetensors", _st_edit_header(lambda h: h["vectors"].update(dtype="F8_E4M3")), ["vectors", ("dtype",)], raw=True))
case("formats", "safetensors.overlapping_tensors")(_fmt_case(
    "safetensors", _st_edit_header(lambda h: h["example_id"].update(
        data_offsets=[h["bucket"]["data_offsets"][0], h["bucket"]["data_offsets"][0] +
                      h["example_id"]["data_offsets"][1] - h["example_id"]["data_offsets"][0]])),
    [("overlap", "hole", "data_offsets")], raw=True))
case("formats", "safetensors.data_offsets_2^62")(_fmt_case(
    "safetensors", _st_edit_header(lambda h: h["vectors"].update(data_offsets=[0, 1 << 62])),
    ["vectors", ("data_offsets",)], raw=True))
case("formats", "safetensors.header_is_an_array")(_fmt_case(
    "safetensors", lambda p: open(p, "r+b").write(struct.pack("<Q", 8) + b"[1,2,3] "), ["header"], raw=True))


def _half_with(value, bf16=False):
    """vectors as f16 (or bf16 bits stored as <V2) with one non-finite value."""
    def fn(a):
        v = a["vectors"].astype(np.float32)
        v[4, 1] = value
        if bf16:
            bits = (v.view(np.uint32) >> 16).astype("<u2")
            a["vectors"] = bits.view("V2")
        else:
            a["vectors"] = v.astype("<f2")
    return fn


@case("class1", "f16_query_inf")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    modify_entry(cap, base.q(0), _half_with(np.inf))
    expect_partial(ctx.analyze(cap, out), out, base, [0], [(base.q(0), ["row 4", "col", "inf"])])


@case("class1", "bf16_query_nan")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    modify_entry(cap, base.q(0), _half_with(np.nan, bf16=True))
    expect_partial(ctx.analyze(cap, out), out, base, [0], [(base.q(0), ["row 4", "col", "nan"])])


# 1e400 is a JSON syntax-level problem (no double holds it): the reason, as for the other syntax errors.
case("manifest", "head_dim_1e400")(_manifest_case(None, [("range", "overflow", "too large", "head_dim")], text=lambda s: s.replace(
    '"head_dim": 64', '"head_dim": 1e400')))
case("manifest", "head_dim_2^63")(_manifest_case(None, ["head_dim"], text=lambda s: s.replace(
    '"head_dim": 64', '"head_dim": 9223372036854775808')))
case("manifest", "n_layers_zero")(_manifest_case(_set(n_layers=0), ["n_layers"]))


@case("class4", "context_2^62_within_bounds")
def _(ctx):
    # A huge --context is a valid override (every position is below it): the
    # run stays within the bounds (no allocation from L) whatever it reports.
    base, cap, out = setup_copy(ctx)
    r = ctx.analyze(cap, out, "--context", 1 << 62)
    if r.rc not in (0, 2):
        raise Fail("expected exit 0 (or a usage error), got " + r.brief())


@case("class4", "jobs_100000_within_bounds")
def _(ctx):
    # -j far above the number of heads: no more threads than work, within bounds, same values.
    base, cap, out = setup_copy(ctx)
    r = ctx.run("analyze", cap, "-o", out, "-j", 100000, "--quiet")
    if r.rc == 2:
        return
    expect_ok(r, out, base)


case("class1", "f64_query_exactly_2^128")(_overflow_case(2.0 ** 128, ["row 3", "col", Num(2.0 ** 128)]))


@case("class1", "f64_query_just_below_2^128_is_analysed")
def _(ctx):
    base, cap, out = setup_copy(ctx, "npy", "f64")
    set_value(cap, base.q(0), 3, 5, float(np.nextafter(2.0 ** 128, 0)))
    r = ctx.analyze(cap, out)
    if r.rc != 0:
        raise Fail("expected exit 0 (the largest double below 2^128 is a valid value), got " + r.brief())
    compare_heads(out, base, base.heads[1:])
    row = metrics_row(out, *base.heads[0][:2])
    bad = [k for k, v in row.items() if v.strip().lower() in ("inf", "-inf", "+inf")]
    if bad:
        raise Fail("head %s: infinite metrics %s" % (base.q(0), bad))


@case("class5", "out_under_missing_parents_is_created")
def _(ctx):
    base, cap, _ = setup_copy(ctx)
    out = os.path.join(ctx.case_dir, "a", "b", "out")
    expect_ok(ctx.analyze(cap, out), out, base)


@case("class5", "no_staging_folder_left_behind")
def _(ctx):
    # Reports are staged next to OUT and swapped in: after a good run, a rerun,
    # a partial run and a refused run, OUT's parent holds OUT only.
    base, cap, out = setup_copy(ctx)
    parent = os.path.dirname(out)
    _good_run(ctx, cap, out)
    r = ctx.analyze(cap, out)
    if r.rc != 0:
        raise Fail("rerun: " + r.brief())
    truncate_file(entry_path(cap, base.q(0)), 9)
    if ctx.analyze(cap, out).rc != 3:
        raise Fail("partial run: expected exit 3")
    edit_manifest(cap, lambda m: m.update(head_dim=-4))
    if ctx.analyze(cap, out).rc != 1:
        raise Fail("refused run: expected exit 1")
    left = sorted(set(os.listdir(parent)) - {"cap", "out"})
    if left:
        raise Fail("left next to OUT: %s" % left)


@case("class8", "merge_output_written_atomically")
def _(ctx):
    shards = [("a.qkm", _good(1)), ("b.qkm", _good(2, (3, 4)))]
    paths = [_shard_file(ctx, n, d) for n, d in shards]
    out = _shard_file(ctx, "merged.qkm", b"previous result\n")
    r = ctx.run("merge", *paths, "-o", out)
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    with open(out, "rb") as f:
        parse_shard(f.read())
    if sorted(os.listdir(ctx.case_dir)) != ["a.qkm", "b.qkm", "merged.qkm"]:
        raise Fail("merge left files behind: %s" % sorted(os.listdir(ctx.case_dir)))


@case("class5", "markup_in_model_name_and_path_is_escaped")
def _(ctx):
    # A model name and an input path carrying HTML and CSV syntax: index.html
    # holds no live markup from them (a page without scripts), model_report.csv
    # reads back the exact name, the per-head values are the clean run's.
    base = ctx.base("npy", "f32")
    cap = os.path.join(ctx.case_dir, "cap<b>x&y")
    shutil.copytree(base.cap, cap, symlinks=True)
    out = os.path.join(ctx.case_dir, "out")
    name = '<script>alert(1)</script> <img src=x onerror=alert(2)>, "quoted"'
    edit_manifest(cap, lambda m: m.update(model=name))
    r = ctx.analyze(cap, out)
    expect_ok(r, out, base)
    for f in sorted(os.listdir(out)):
        if f.endswith((".html", ".svg")):
            text = open(os.path.join(out, f), encoding="utf-8", errors="replace").read()
            for bad in ("<script", "<img src=x", "<b>x"):
                if bad in text:
                    raise Fail("%s carries %r from the model name or path unescaped" % (f, bad))
    header, rows = read_csv(os.path.join(out, "model_report.csv"))
    if not rows or "model" not in header or rows[0][header.index("model")] != name:
        raise Fail("model_report.csv does not read back the model name: %r" % (
            rows[0][header.index("model")] if rows and "model" in header else rows[:1]))


@case("class5", "two_concurrent_runs_never_mix")
def _(ctx):
    # Two runs into one OUT at once (--components 3 and 5), three rounds: each
    # exits 0 or 1, and OUT always holds ONE run: its qk_pca.csv has the number
    # of components that its summary.txt and index.html record.
    base, cap, out = setup_copy(ctx)
    for rnd in range(3):
        procs = []
        for k in (3, 5):
            log = open(os.path.join(ctx.case_dir, "run%d_%d.log" % (rnd, k)), "wb")
            procs.append((k, log, subprocess.Popen(
                [ctx.qkgeom, "analyze", cap, "-o", out, "-j", "1", "--quiet", "--components", str(k)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
        for k, log, p in procs:
            try:
                rc = p.wait(timeout=ctx.hard_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                raise Fail("concurrent run --components %d hung" % k)
            log.close()
            if rc not in (0, 1):
                raise Fail("concurrent run --components %d: exit %d" % (k, rc))
        pca = head_rows(out, "qk_pca.csv")
        counts = {len(v) for v in pca.values()} if pca else set()
        if len(counts) != 1:
            raise Fail("round %d: qk_pca.csv mixes runs (%s components per head)" % (rnd, sorted(counts)))
        n = counts.pop()
        for f in ("summary.txt", "index.html"):
            text = open(os.path.join(out, f), encoding="utf-8", errors="replace").read()
            if "--components %d" % n not in text:
                raise Fail("round %d: qk_pca.csv has %d components per head but %s records another run" % (rnd, n, f))
        snap = snapshot(out)
        if any(p.endswith(".svg") for p in snap) != ("index.html" in snap):
            raise Fail("round %d: pictures and index.html from different runs" % rnd)


# ==========================================================================
# issue 31 ("Reliability"): inputs inside OUT, interruptions, merge checks,
# the command line. Classes `inputs`, `signals`, `merge`, `options`.
# ==========================================================================
def _case_siblings(ctx, keep=("cap", "out")):
    """What lies in the case folder besides `keep` (staging / old folders left behind)."""
    return sorted(set(os.listdir(ctx.case_dir)) - set(keep))


def _report_folder(ctx, name="rep"):
    """A real report folder (a copy of the clean run: it carries .qkgeom-report)."""
    base = ctx.base("npy", "f32")
    rep = os.path.join(ctx.case_dir, name)
    shutil.copytree(base.out, rep, symlinks=True)
    return base, rep


def _refused_keeping(ctx, args, names, kws, watch):
    """Exit 1 with one line naming `names` + `kws`; every folder in `watch` unchanged."""
    before = {p: snapshot(p) for p in watch}
    r = ctx.run(*args)
    expect_error(r, names, kws)
    for p in watch:
        if snapshot(p) != before[p]:
            raise Fail("%s changed (files %s)" % (os.path.basename(p),
                                                   sorted(set(snapshot(p)) ^ set(before[p]))[:5] or "modified"))
    return r


# ---- inputs: a run never deletes (or writes into) what it reads -----------------------------
INSIDE = ("inside", "contains", "is the input", "symbolic link")


@case("inputs", "capture_copied_into_report_then_analysed_into_it")
def _(ctx):
    base, rep = _report_folder(ctx)
    cap = os.path.join(rep, "cap")
    shutil.copytree(base.cap, cap)
    _refused_keeping(ctx, ["analyze", cap, "-o", rep, "--quiet"], ["rep", "cap"], [("contains", "input")], [rep])
    if not os.path.isfile(os.path.join(cap, "manifest.json")):
        raise Fail("the capture inside OUT is gone")


@case("inputs", "capture_inside_out_through_a_symlink")
def _(ctx):
    base, rep = _report_folder(ctx)
    shutil.copytree(base.cap, os.path.join(rep, "cap"))
    link = os.path.join(ctx.case_dir, "link")
    os.symlink(os.path.join(rep, "cap"), link)
    _refused_keeping(ctx, ["analyze", link, "-o", rep], ["link", "rep"], [("contains", "input")], [rep])


@case("inputs", "out_through_a_symlinked_parent_is_the_capture")
def _(ctx):
    base, rep = _report_folder(ctx)
    shutil.copytree(base.cap, os.path.join(rep, "cap"))
    os.symlink(rep, os.path.join(ctx.case_dir, "alias"))
    # OUT spelled through the link: alias == rep, so the capture rep/cap is inside it
    _refused_keeping(ctx, ["analyze", os.path.join(rep, "cap"), "-o", os.path.join(ctx.case_dir, "alias", "")],
                     ["cap"], [INSIDE], [rep])


@case("inputs", "capture_with_report_marker_analysed_into_itself")
def _(ctx):
    base, cap, _ = setup_copy(ctx)
    with open(os.path.join(cap, ".qkgeom-report"), "w") as f:
        f.write("planted\n")
    _refused_keeping(ctx, ["analyze", cap, "-o", cap, "--quiet"], ["cap"], [("is the input", "same")], [cap])


@case("inputs", "out_inside_the_capture")
def _(ctx):
    base, cap, _ = setup_copy(ctx)
    _refused_keeping(ctx, ["analyze", cap, "-o", os.path.join(cap, "report")], ["cap"], [("inside", "input")], [cap])


@case("inputs", "out_spelled_with_dots_and_trailing_slash")
def _(ctx):
    base, rep = _report_folder(ctx)
    shutil.copytree(base.cap, os.path.join(rep, "cap"))
    out = os.path.join(ctx.case_dir, "rep", "..", "rep", "")
    _refused_keeping(ctx, ["analyze", os.path.join(rep, ".", "cap"), "-o", out], ["cap"], [INSIDE], [rep])


@case("inputs", "entry_symlink_into_out")
def _(ctx):
    # The capture lives outside OUT, but one entry member is a link to a file
    # inside OUT: the swap would delete what the run reads.
    base, cap, _ = setup_copy(ctx)
    _, rep = _report_folder(ctx)
    member = entry_path(cap, base.q(0))
    kept = os.path.join(rep, "vectors_kept.npy")
    shutil.move(member, kept)
    os.symlink(kept, member)
    _refused_keeping(ctx, ["analyze", cap, "-o", rep], ["rep", "vectors"], [("symbolic link", "link")], [rep, cap])


def _study(ctx, path, runs, benchmarks=None):
    spec = {"runs": runs}
    if benchmarks:
        spec["benchmarks"] = benchmarks
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


@case("inputs", "study_file_inside_out")
def _(ctx):
    _, rep = _report_folder(ctx)
    st = _study(ctx, os.path.join(rep, "study.json"), [{"name": "a", "metrics": {"ap_drop": 0.1}}])
    _refused_keeping(ctx, ["study", st, "-o", rep, "--quiet"], ["study.json", "rep"], [("contains", "input")], [rep])


@case("inputs", "study_capture_run_inside_out")
def _(ctx):
    base, rep = _report_folder(ctx)
    shutil.copytree(base.cap, os.path.join(rep, "cap"))
    st = _study(ctx, os.path.join(ctx.case_dir, "study.json"), [{"name": "a", "capture": "rep/cap"}])
    _refused_keeping(ctx, ["study", st, "-o", rep, "--quiet"], ["rep", "cap"], [("contains", "input")], [rep])


@case("inputs", "study_analysis_run_inside_out")
def _(ctx):
    base, rep = _report_folder(ctx)
    shutil.copytree(base.out, os.path.join(rep, "ana"))
    st = _study(ctx, os.path.join(ctx.case_dir, "study.json"), [{"name": "a", "analysis": "rep/ana"}])
    _refused_keeping(ctx, ["study", st, "-o", rep, "--quiet"], ["rep", "ana"], [("contains", "input")], [rep])


@case("inputs", "study_benchmark_file_inside_out")
def _(ctx):
    _, rep = _report_folder(ctx)
    with open(os.path.join(rep, "lbp.csv"), "w") as f:
        f.write("model,score\na,1\n")
    st = _study(ctx, os.path.join(ctx.case_dir, "study.json"), [{"name": "a", "metrics": {"ap_drop": 0.1}}],
                [{"name": "LBP", "overall": "rep/lbp.csv"}])
    _refused_keeping(ctx, ["study", st, "-o", rep, "--quiet"], ["lbp.csv"], [("contains", "input")], [rep])


@case("inputs", "outside_inputs_still_accepted")
def _(ctx):
    # The checks refuse only what overlaps: a capture beside OUT is analysed
    # (and a report folder beside the capture replaced) as before.
    base, cap, out = setup_copy(ctx)
    _good_run(ctx, cap, out)
    expect_ok(ctx.analyze(cap, out), out, base)


# ---- signals: interrupted runs, stale folders, failed swaps, stdout -------------------------------
def _big(ctx):
    """A capture whose analysis takes ~1-2 s at -j 1 (4 layers x 8 heads, f16,
    ~8.5 MB) and its clean report; made once per binary (as the bases)."""
    root = os.path.join(ctx.bases_dir, "big_f16")
    cap, out, stamp = os.path.join(root, "capture"), os.path.join(root, "clean"), os.path.join(root, "ok")
    if not (os.path.exists(stamp) and open(stamp).read() == ctx.stamp()):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        save, ctx.case_dir = ctx.case_dir, root
        try:
            r = ctx.run("synth", cap, "--layers", 4, "--dtype", "f16", "--quiet", check_bounds=False)
            if r.rc != 0:
                raise Fail("setup: qkgeom synth --layers 4 --dtype f16: " + r.brief())
            if ctx.sanitized:
                thin_capture(cap)
            r = ctx.analyze(cap, out, check_bounds=False)
            if r.rc != 0:
                raise Fail("setup: clean analyze of the big capture: " + r.brief())
        finally:
            ctx.case_dir = save
        with open(stamp, "w") as f:
            f.write(ctx.stamp())
    return cap, out


def _csvs(out):
    return {f: open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out)) if f.endswith(".csv")}


def _old_report(ctx, clean):
    """OUT: a copy of the clean report, its summary.txt marked as the old one."""
    out = os.path.join(ctx.case_dir, "out")
    shutil.copytree(clean, out)
    with open(os.path.join(out, "summary.txt"), "a") as f:
        f.write("# the old report\n")
    return out, snapshot(out)


def _popen(ctx, args, env=None, stdout=None):
    err = open(os.path.join(ctx.tmp, "stderr"), "wb")
    p = subprocess.Popen([ctx.qkgeom] + [str(a) for a in args], stdout=stdout or subprocess.DEVNULL, stderr=err,
                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    return p, err


def _wait(ctx, p, err):
    try:
        rc = p.wait(timeout=ctx.hard_timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise Fail("hang: killed after %.0f s" % ctx.hard_timeout)
    err.close()
    return rc, open(err.name, encoding="utf-8", errors="replace").read()


def _rerun_is_clean(ctx, cap, clean, out, keep=("out",)):
    """The next run into OUT: exit 0, no folder left next to OUT, the CSVs of a clean run."""
    r = ctx.analyze(cap, out)
    if r.rc != 0:
        raise Fail("the rerun: " + r.brief())
    left = _case_siblings(ctx, keep)
    if left:
        raise Fail("left next to OUT after the rerun: %s" % left)
    if _csvs(out) != _csvs(clean):
        raise Fail("the rerun's CSVs differ from a clean run's")
    if "# the old report" in open(os.path.join(out, "summary.txt")).read():
        raise Fail("the rerun did not replace the old report")
    return r


@case("signals", "report_file_that_cannot_be_written_named_old_out_intact")
def _(ctx):
    # A write of a report file fails (a file size limit: the code path of a full disk, EFBIG
    # here, ENOSPC there): exit 1, the message names the file under OUT (never the staging
    # name) and the OS's reason, the old report is untouched and nothing is left next to it.
    base, cap, _ = setup_copy(ctx)
    clean = os.path.join(ctx.case_dir, "clean")
    if ctx.analyze(cap, clean, "--no-pictures").rc != 0:
        raise Fail("the clean run failed")
    out, old = _old_report(ctx, clean)
    r = ctx.run_argv(["/bin/sh", "-c", "trap '' XFSZ; ulimit -f 40 && exec \"$0\" \"$@\"", ctx.qkgeom, "analyze", cap,
                      "-o", out, "-j", "1", "--quiet", "--no-pictures"], check_bounds=False)
    msg = r.err
    if r.rc != 1:
        raise Fail("expected exit 1: " + r.brief())
    miss = [] if os.path.join(out, "head_") in msg else [os.path.join(out, "head_*.csv")]
    miss += missing_keywords(msg, [".csv", "File too large"])
    if miss or ".staging" in msg:
        raise Fail("the message lacks %s or names the staging folder: %r" % (miss, msg[-400:]))
    if snapshot(out) != old:
        raise Fail("the old OUT changed")
    if _case_siblings(ctx, ("cap", "out", "clean")):
        raise Fail("left next to OUT: %s" % _case_siblings(ctx, ("cap", "out", "clean")))


def _interrupt_case(sigs, delay):
    def fn(ctx):
        cap, clean = _big(ctx)
        out, old = _old_report(ctx, clean)
        # QKGEOM_TEST_FAULT=slow: 50 ms per head, so the signal lands mid-run on any machine
        p, err = _popen(ctx, ["analyze", cap, "-o", out, "-j", 1, "--quiet"],
                        env=dict(os.environ, QKGEOM_TEST_FAULT="slow"))
        time.sleep(delay)
        for i, s in enumerate(sigs):
            if i:
                time.sleep(0.05)
            p.send_signal(s)
        rc, msg = _wait(ctx, p, err)
        want = -signal.SIGKILL if sigs[0] == signal.SIGKILL else 128 + sigs[0]
        if rc == 0:
            raise Fail("the run ended (exit 0) before the signal at %.1f s: make the capture bigger" % delay)
        if rc != want:
            raise Fail("expected exit %d, got %d: %r" % (want, rc, msg[-300:]))
        if snapshot(out) != old:
            raise Fail("the old OUT changed after %s" % "+".join(signal.Signals(s).name for s in sigs))
        if want < 0 and not any(n.startswith(".out.staging-") for n in _case_siblings(ctx, ("out",))):
            raise Fail("no staging folder left by the killed run (killed before it made one?): nothing to clean up")
        if want > 0:
            miss = missing_keywords(msg, [signal.Signals(sigs[0]).name, "interrupt", Num(want)])
            if miss:
                raise Fail("the message lacks %s: %r" % (miss, msg[-300:]))
            raw_control(msg.rstrip("\n"), "stderr")
            if len(sigs) == 1 and _case_siblings(ctx, ("out",)):
                raise Fail("left next to OUT: %s" % _case_siblings(ctx, ("out",)))
        r = _rerun_is_clean(ctx, cap, clean, out)
        if want < 0 and "removed" not in r.err:
            raise Fail("the rerun does not say it removed the killed run's folder: %r" % r.err[-300:])
    return fn


case("signals", "sigint_after_0.1s_old_out_intact")(_interrupt_case([signal.SIGINT], 0.1))
case("signals", "sigint_after_0.3s_old_out_intact")(_interrupt_case([signal.SIGINT], 0.3))
case("signals", "sigterm_after_0.3s_exit_143")(_interrupt_case([signal.SIGTERM], 0.3))
case("signals", "sigkill_after_0.1s_next_run_cleans_up")(_interrupt_case([signal.SIGKILL], 0.1))
case("signals", "sigkill_after_0.3s_next_run_cleans_up")(_interrupt_case([signal.SIGKILL], 0.3))
case("signals", "second_sigint_stops_at_once")(_interrupt_case([signal.SIGINT, signal.SIGINT], 0.3))


@case("signals", "sigkill_unreaped_zombie_next_run_cleans_up")
def _(ctx):
    # A killed run that nobody has reaped yet (an MPI rank whose launcher returned first, a
    # container whose init never reaps) still has a /proc entry with its start time: the next
    # run must count it as gone and remove its staging folder.
    cap, clean = _big(ctx)
    out, old = _old_report(ctx, clean)
    p, err = _popen(ctx, ["analyze", cap, "-o", out, "-j", 1, "--quiet"], env=dict(os.environ, QKGEOM_TEST_FAULT="slow"))
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGKILL)  # not p.kill(), not waited: the child stays a zombie
    deadline = time.time() + 10
    while time.time() < deadline:
        with open("/proc/%d/stat" % p.pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    else:
        raise Fail("the killed run did not become a zombie")
    try:
        if not any(n.startswith(".out.staging-") for n in _case_siblings(ctx, ("out",))):
            raise Fail("no staging folder left by the killed run (killed before it made one?)")
        if snapshot(out) != old:
            raise Fail("the old OUT changed after SIGKILL")
        r = _rerun_is_clean(ctx, cap, clean, out)
        if "removed" not in r.err:
            raise Fail("the rerun does not say it removed the zombie's folder: %r" % r.err[-300:])
    finally:
        _wait(ctx, p, err)


def _study_three(ctx):
    """Three captures (steady, moderate, steep; 2 layers x 8 heads), a study of them and its
    clean report; made once per binary. A run takes ~1.6 s with QKGEOM_TEST_FAULT=slow."""
    root = os.path.join(ctx.bases_dir, "study_three")
    st, clean, stamp = os.path.join(root, "study.json"), os.path.join(root, "clean"), os.path.join(root, "ok")
    if not (os.path.exists(stamp) and open(stamp).read() == ctx.stamp()):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        save, ctx.case_dir = ctx.case_dir, root
        try:
            for fam in ("steady", "moderate", "steep"):
                r = ctx.run("synth", os.path.join(root, fam), "--family", fam, "--layers", 2, "--quiet",
                            check_bounds=False)
                if r.rc != 0:
                    raise Fail("setup: qkgeom synth --family %s: %s" % (fam, r.brief()))
                if ctx.sanitized:
                    thin_capture(os.path.join(root, fam))
            _study(ctx, st, [{"name": n, "capture": f} for n, f in (("a", "steady"), ("b", "moderate"),
                                                                     ("c", "steep"))])
            r = ctx.run("study", st, "-o", clean, "-j", 1, "--quiet", check_bounds=False)
            if r.rc != 0:
                raise Fail("setup: the clean study: " + r.brief())
        finally:
            ctx.case_dir = save
        with open(stamp, "w") as f:
            f.write(ctx.stamp())
    return st, clean


def _study_interrupt_case(sig, delay):
    """`study` stopped by a signal at some point (0.4 s: in the first run; 2.2 s and 3.8 s: in a
    later one at the usual speed, ~1.6 s a run with QKGEOM_TEST_FAULT=slow): the old
    report is left as it was, nothing is left next to OUT (SIGINT, SIGTERM) or what a
    SIGKILL left is removed by the rerun, which completes with a clean run's numbers. Runs
    finished before SIGINT / SIGTERM are kept in OUT/cache (said on stderr), runs finished
    before SIGKILL are taken from the killed study's staging folder by the rerun (said on
    stderr), and the rerun serves both as cached."""
    def fn(ctx):
        st, clean = _study_three(ctx)
        out = os.path.join(ctx.case_dir, "out")
        shutil.copytree(clean, out)
        shutil.rmtree(os.path.join(out, "cache"))  # an older report: every run is analysed again
        with open(os.path.join(out, "summary.txt"), "a") as f:
            f.write("# the old report\n")
        old = snapshot(out)
        p, err = _popen(ctx, ["study", st, "-o", out, "-j", 1, "--quiet"],
                        env=dict(os.environ, QKGEOM_TEST_FAULT="slow"))
        time.sleep(delay)
        p.send_signal(sig)
        rc, msg = _wait(ctx, p, err)
        want = -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig
        if rc == 0:
            raise Fail("the study ended (exit 0) before the signal at %.1f s" % delay)
        if rc != want:
            raise Fail("expected exit %d, got %d: %r" % (want, rc, msg[-300:]))
        now = snapshot(out)
        kept = sorted(n for n in (os.listdir(os.path.join(out, "cache")) if os.path.isdir(os.path.join(out, "cache"))
                                  else []))
        if {k: v for k, v in now.items() if k != "cache" and not k.startswith("cache/")} != old:
            raise Fail("the old report changed after %s" % signal.Signals(sig).name)
        if kept and (want < 0 or "kept the analyses of %d finished run" % len(kept) not in msg):
            raise Fail("%d cache entries in OUT/cache after %s, message %r" % (len(kept), signal.Signals(sig).name,
                                                                               msg[-300:]))
        left = _case_siblings(ctx, ("out",))
        if want > 0:
            miss = missing_keywords(msg, [signal.Signals(sig).name, "interrupt", Num(want)])
            if miss:
                raise Fail("the message lacks %s: %r" % (miss, msg[-300:]))
            if left:
                raise Fail("left next to OUT: %s" % left)
        elif not any(n.startswith(".out.staging-") for n in left):
            raise Fail("no staging folder left by the killed study (killed before it made one?)")
        # a SIGKILLed study's finished entries, in its staging folder's cache: the rerun keeps them
        finished = [e for n in left if n.startswith(".out.staging-")
                    for e in (os.listdir(os.path.join(ctx.case_dir, n, "cache"))
                              if os.path.isdir(os.path.join(ctx.case_dir, n, "cache")) else [])
                    if "." not in e and os.path.isfile(os.path.join(ctx.case_dir, n, "cache", e, "study_key.json"))]
        r = ctx.run("study", st, "-o", out, "-j", 1)
        if r.rc != 0:
            raise Fail("the rerun: " + r.brief())
        if r.err.count(": cached") != len(kept) + len(finished):  # the finished runs are served, the others analysed
            raise Fail("%d runs kept, %d finished in the killed study's staging folder, the rerun says: %r" % (
                len(kept), len(finished), r.err[-400:]))
        if finished and "kept the analyses of %d finished run" % len(finished) not in r.err:
            raise Fail("the rerun does not say it kept the killed study's runs: %r" % r.err[-400:])
        if _case_siblings(ctx, ("out",)):
            raise Fail("left next to OUT after the rerun: %s" % _case_siblings(ctx, ("out",)))
        if _models(out) != _models(clean):
            raise Fail("the rerun's study_models.csv differs from a clean study's")
        if "# the old report" in open(os.path.join(out, "summary.txt")).read():
            raise Fail("the rerun did not replace the old report")
    return fn


case("signals", "study_sigint_after_0.4s_old_out_intact")(_study_interrupt_case(signal.SIGINT, 0.4))
case("signals", "study_sigint_after_2.2s_old_out_intact")(_study_interrupt_case(signal.SIGINT, 2.2))
case("signals", "study_sigterm_after_3.8s_exit_143")(_study_interrupt_case(signal.SIGTERM, 3.8))
case("signals", "study_sigkill_after_0.4s_next_run_cleans_up")(_study_interrupt_case(signal.SIGKILL, 0.4))
case("signals", "study_sigkill_after_2.2s_next_run_cleans_up")(_study_interrupt_case(signal.SIGKILL, 2.2))


def _owner_record(pid, start):
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    return "qkgeom staging folder\npid %d\nstart %s\nboot %s\npidns %s\n" % (
        pid, start, boot, os.readlink("/proc/self/ns/pid"))


def _start_time(pid):
    stat = open("/proc/%d/stat" % pid).read()
    return stat[stat.rindex(")") + 2:].split()[19]


def _stale_case(kind, owner):
    """A folder named like a staging / old folder of OUT: removed by the next
    run only when it carries the owner record of a process that is gone."""
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        _good_run(ctx, cap, out)
        pid, start = os.getpid(), _start_time(os.getpid())
        if owner == "dead":
            p = subprocess.Popen(["sleep", "30"])
            pid, start = p.pid, _start_time(p.pid)
            p.kill()
            p.wait()
        name = ".out.%s-%d-0" % (kind, pid)
        stale = os.path.join(ctx.case_dir, name)
        os.mkdir(stale)
        with open(os.path.join(stale, "notes.txt"), "w") as f:
            f.write("someone's data\n")
        if owner in ("dead", "alive"):
            with open(os.path.join(stale, ".qkgeom-owner"), "w") as f:
                f.write(_owner_record(pid, start))
        before = snapshot(stale)
        r = ctx.analyze(cap, out)
        expect_ok(r, out, base)
        if owner == "dead":
            if os.path.lexists(stale):
                raise Fail("%s of a process that is gone was not removed" % name)
        elif snapshot(stale) != before:
            raise Fail("%s (%s) was touched" % (name, owner))
    return fn


case("signals", "stale_staging_of_a_dead_process_is_removed")(_stale_case("staging", "dead"))
case("signals", "stale_old_of_a_dead_process_is_removed")(_stale_case("old", "dead"))
case("signals", "staging_of_a_live_process_is_kept")(_stale_case("staging", "alive"))
case("signals", "lookalike_without_owner_record_is_kept")(_stale_case("staging", "none"))


def _fault_env(fault):
    env = dict(os.environ)
    env["QKGEOM_TEST_FAULT"] = fault
    return env


@case("signals", "failed_swap_puts_the_old_report_back")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    old = _good_run(ctx, cap, out)
    p, err = _popen(ctx, ["analyze", cap, "-o", out, "-j", 1, "--quiet", "--components", 5], env=_fault_env("swap"))
    rc, msg = _wait(ctx, p, err)
    if rc != 1:
        raise Fail("expected exit 1, got %d: %r" % (rc, msg[-300:]))
    miss = missing_keywords(msg, ["out", "back"])
    if miss:
        raise Fail("the message lacks %s: %r" % (miss, msg[-300:]))
    if snapshot(out) != old:
        raise Fail("the old report changed after a failed swap")
    if _case_siblings(ctx):
        raise Fail("left next to OUT: %s" % _case_siblings(ctx))


@case("signals", "failed_swap_names_where_the_old_report_is")
def _(ctx):
    base, cap, out = setup_copy(ctx)
    old = _good_run(ctx, cap, out)
    p, err = _popen(ctx, ["analyze", cap, "-o", out, "-j", 1, "--quiet"], env=_fault_env("swap-stuck"))
    rc, msg = _wait(ctx, p, err)
    if rc != 1:
        raise Fail("expected exit 1, got %d: %r" % (rc, msg[-300:]))
    m = re.search(r"(\S*\.out\.old-\d+-\d+)", msg)
    if not m or not os.path.isdir(m.group(1).rstrip(".,;)")):
        raise Fail("the message does not name the folder holding the old report: %r" % msg[-400:])
    held = m.group(1).rstrip(".,;)")
    kept = {k: v for k, v in snapshot(held).items() if k != ".qkgeom-owner"}
    if kept != old:
        raise Fail("%s does not hold the old report" % held)
    r = ctx.analyze(cap, out)  # the next run puts it back, then replaces it
    expect_ok(r, out, base)
    if _case_siblings(ctx):
        raise Fail("left next to OUT after the next run: %s" % _case_siblings(ctx))


def _stdout_case(make_stdout, kws):
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        stdout, cleanup = make_stdout()
        try:
            p, err = _popen(ctx, ["analyze", cap, "-o", out, "-j", 1, "--quiet"], stdout=stdout)
        finally:
            cleanup()
        rc, msg = _wait(ctx, p, err)
        if rc != 1:
            raise Fail("expected exit 1, got %d: %r" % (rc, msg[-300:]))
        miss = missing_keywords(msg, ["standard output"] + kws)
        if miss:
            raise Fail("the message lacks %s: %r" % (miss, msg[-300:]))
        compare_heads(out, base, base.heads, "every")  # the reports were written before stdout failed
    return fn


def _closed_pipe():
    r, w = os.pipe()
    os.close(r)
    return w, lambda: os.close(w)


def _dev_full():
    f = open("/dev/full", "wb")
    return f, f.close


case("signals", "stdout_closed_pipe_is_an_error")(_stdout_case(_closed_pipe, [("broken pipe", "epipe")]))
case("signals", "stdout_full_device_is_an_error")(_stdout_case(_dev_full, [("no space", "enospc")]))


# ---- merge: what it cannot check, it refuses ---------------------------------------------------
def _merge_refused(ctx, paths, names, kws):
    out = os.path.join(ctx.case_dir, "merged.qkm")
    before = {p: open(p, "rb").read() for p in set(paths) if os.path.isfile(p)}
    r = ctx.run("merge", *paths, "-o", out)
    expect_error(r, names, kws)
    if os.path.lexists(out):
        raise Fail("merge failed but created its output")
    for p, data in before.items():
        if open(p, "rb").read() != data:
            raise Fail("input shard %s changed" % os.path.basename(p))


def _v2(seed, scheme=("uniform", 256, 1.0), buckets=(0, 1, 2), d=4, width=256):
    return shard_bytes(d, random_shard_records(seed, d, buckets, width=width),
                       random_shard_records(seed + 100, d, buckets, width=width), scheme=scheme)


@case("merge", "same_file_twice")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _good(1))
    b = _shard_file(ctx, "b.qkm", _good(2, (3, 4)))
    _merge_refused(ctx, [a, b, a], ["a.qkm"], [("same file", "twice")])


@case("merge", "same_file_through_a_symlink")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _good(1))
    os.symlink("a.qkm", os.path.join(ctx.case_dir, "alias.qkm"))
    _merge_refused(ctx, [a, os.path.join(ctx.case_dir, "alias.qkm")], ["a.qkm", "alias.qkm"], [("same file",)])


@case("merge", "same_file_through_a_hard_link")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _good(1))
    os.link(a, os.path.join(ctx.case_dir, "hard.qkm"))
    _merge_refused(ctx, [a, os.path.join(ctx.case_dir, "hard.qkm")], ["a.qkm", "hard.qkm"], [("same file",)])


@case("merge", "same_file_spelled_differently")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _good(1))
    other = os.path.join(ctx.case_dir, ".", "..", os.path.basename(ctx.case_dir), "a.qkm")
    _merge_refused(ctx, [a, other], ["a.qkm"], [("same file",)])


@case("merge", "byte_identical_copy")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _good(1))
    c = _shard_file(ctx, "copy.qkm", _good(1))
    _merge_refused(ctx, [a, c], ["a.qkm", "copy.qkm"], [("identical",)])


@case("merge", "200_copies")
def _(ctx):
    data = _good(1)
    paths = [_shard_file(ctx, "s%03d.qkm" % i, data) for i in range(200)]
    _merge_refused(ctx, paths, ["s000.qkm", "s001.qkm"], [("identical",)])


@case("merge", "different_bucket_widths")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _v2(1, ("uniform", 256, 1.0)))
    b = _shard_file(ctx, "b.qkm", _v2(2, ("uniform", 128, 1.0), width=128))
    _merge_refused(ctx, [a, b], ["a.qkm", "b.qkm"], ["bucket_scheme", "width 128", "width 256"])


@case("merge", "different_bucket_schemes")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _v2(1, ("uniform", 256, 1.0)))
    # log scheme with B_min 256: bucket ids from 8 (positions 255..510 are bucket 8)
    recs = [bucket_stats(8, [255, 300, 510], np.ones((3, 4)) * [1, 2, 3, 4] + np.arange(3)[:, None])]
    b = _shard_file(ctx, "b.qkm", shard_bytes(4, recs, recs, scheme=("log", 256, 1.0)))
    _merge_refused(ctx, [a, b], ["a.qkm", "b.qkm"], ["bucket_scheme", "uniform", "log"])


@case("merge", "old_shard_with_a_new_one")
def _(ctx):
    a = _shard_file(ctx, "a.qkm", _v2(1))
    b = _shard_file(ctx, "old.qkm", _good(2, (3, 4)))
    _merge_refused(ctx, [a, b], ["a.qkm", "old.qkm"], ["bucket_scheme", ("version 1", "none")])


@case("merge", "scheme_recorded_and_kept")
def _(ctx):
    shards = [("a.qkm", _v2(1, buckets=(0, 1))), ("b.qkm", _v2(2, buckets=(1, 2, 5)))]
    paths = [_shard_file(ctx, n, d) for n, d in shards]
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", *paths, "-o", out)
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    raw = open(out, "rb").read()
    if shard_scheme(raw) != ("uniform", 256, 1.0):
        raise Fail("the merged shard records the scheme %r, expected uniform 256 1" % (shard_scheme(raw),))
    _, got = parse_shard(raw)
    n = sum(parse_shard(d)[1]["q"][b][0] for _, d in shards for b in parse_shard(d)[1]["q"])
    if sum(v[0] for v in got["q"].values()) != n:
        raise Fail("merged query rows %d, expected %d" % (sum(v[0] for v in got["q"].values()), n))
    if "uniform width 256" not in r.out:
        raise Fail("merge does not print the bucket scheme: %r" % r.out[:300])


@case("merge", "old_shards_still_merge")
def _(ctx):
    paths = [_shard_file(ctx, "a.qkm", _good(1)), _shard_file(ctx, "b.qkm", _good(2, (3, 4)))]
    out = os.path.join(ctx.case_dir, "merged.qkm")
    r = ctx.run("merge", *paths, "-o", out)
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    raw = open(out, "rb").read()
    if shard_scheme(raw) is not None:
        raise Fail("version 1 shards merged into a shard claiming a scheme")
    parse_shard(raw)
    if "not checked" not in r.out:
        raise Fail("merge does not say the scheme of version 1 shards is not checked: %r" % r.out[:300])


@case("merge", "bucket_id_outside_its_scheme")
def _(ctx):
    # positions 0..255 stored under bucket 3 of uniform width 256 (checksum valid)
    recs = random_shard_records(1, 4, [0, 1])
    recs[1]["bucket"] = 3
    b = _shard_file(ctx, "b.qkm", shard_bytes(4, recs, [], scheme=("uniform", 256, 1.0)))
    _merge_refused(ctx, [_shard_file(ctx, "a.qkm", _v2(1)), b], ["b.qkm"], ["q.buckets[1].bucket", "uniform"])


@case("merge", "unknown_scheme_code")
def _(ctx):
    b = _shard_file(ctx, "b.qkm", _v2(1, (7, 256, 1.0)))
    _merge_refused(ctx, [b], ["b.qkm"], ["bucket_scheme", Num(7)])


@case("merge", "scheme_width_zero")
def _(ctx):
    b = _shard_file(ctx, "b.qkm", _v2(1, ("uniform", 0, 1.0)))
    _merge_refused(ctx, [b], ["b.qkm"], ["bucket_width", Num(0)])


# ---- options: the command line never reinterprets or ignores -------------------------------------
def _usage_case(args_fn, kws, created=()):
    """Exit 2, one stderr line naming the option and value; the capture
    unchanged and nothing created in the case folder."""
    def fn(ctx):
        base, cap, out = setup_copy(ctx)
        before = snapshot(ctx.case_dir)
        r = ctx.run(*args_fn(cap, out))
        expect_usage(r, kws)
        lines = [ln for ln in r.err.split("\n") if ln.strip()]
        if len(lines) != 1:
            raise Fail("expected one stderr line, got %r" % r.err[:400])
        if snapshot(ctx.case_dir) != before:
            raise Fail("a refused command line changed the case folder: %s" % sorted(
                set(snapshot(ctx.case_dir)) ^ set(before))[:5])
    return fn


def _an(*extra):
    return lambda cap, out: ["analyze", cap, "-o", out, "--quiet"] + list(extra)


case("options", "jobs_2^32_plus_1")(_usage_case(_an("-j", 4294967297), ["-j", "4294967297", "range"]))
case("options", "jobs_zero")(_usage_case(_an("-j", 0), ["-j", "'0'", "1..4096"]))
case("options", "jobs_negative")(_usage_case(_an("--jobs", -3), ["--jobs", "-3"]))
case("options", "jobs_with_suffix")(_usage_case(_an("-j", "4x"), ["-j", "4x"]))
case("options", "jobs_with_leading_space")(_usage_case(_an("-j", " 4"), ["-j", "' 4'"]))
case("options", "seed_above_2^63")(_usage_case(_an("--seed", 2 ** 63), ["--seed", str(2 ** 63)]))
case("options", "components_zero")(_usage_case(_an("--components", 0), ["--components", "'0'"]))
case("options", "context_above_2^62")(_usage_case(_an("--context", 2 ** 62 + 1), ["--context", str(2 ** 62 + 1)]))
case("options", "ks_alpha_nan")(_usage_case(_an("--ks-alpha", "nan"), ["--ks-alpha", "nan"]))
case("options", "empirical_budget_below_4")(_usage_case(_an("--empirical-budget", 3), ["--empirical-budget", "'3'", "4.."]))
case("options", "empirical_max_exact_negative")(_usage_case(
    _an("--empirical-max-exact", -1), ["--empirical-max-exact", "-1"]))
case("options", "empirical_pairs_above_10^6")(_usage_case(
    _an("--empirical-pairs", 10 ** 6 + 1), ["--empirical-pairs", str(10 ** 6 + 1), "0..1000000"]))
case("options", "empirical_check_unknown")(_usage_case(_an("--empirical-check", "all"), ["--empirical-check", "all", "exact"]))
case("options", "family_on_analyze")(_usage_case(_an("--family", "steady"), ["--family", "analyze", "synth"]))
case("options", "layers_on_analyze")(_usage_case(_an("--layers", 2), ["--layers", "analyze"]))
case("options", "heads_on_analyze")(_usage_case(_an("--heads", 2), ["--heads", "analyze"]))
case("options", "strict_on_study")(_usage_case(
    lambda cap, out: ["study", os.path.join(cap, "manifest.json"), "-o", out, "--strict"], ["--strict", "study"]))
case("options", "jobs_on_synth")(_usage_case(
    lambda cap, out: ["synth", out, "-j", 2], ["-j", "synth"]))
case("options", "out_given_twice")(_usage_case(
    lambda cap, out: ["analyze", cap, "-o", out, "-o", out + "2"], ["-o", "twice", "out2"]))
case("options", "jobs_given_twice_by_two_names")(_usage_case(_an("-j", 2, "--jobs", 3), ["--jobs", "twice"]))
case("options", "out_value_is_an_option")(_usage_case(
    lambda cap, out: ["analyze", cap, "-o", "--quiet"], ["-o", "--quiet", "option"]))
case("options", "seed_value_is_an_option")(_usage_case(_an("--seed", "--no-split"), ["--seed", "--no-split"]))
case("options", "two_capture_folders")(_usage_case(
    lambda cap, out: ["analyze", cap, cap + "2", "-o", out], ["cap2", "one dir"]))
case("options", "synth_heads_beyond_the_capture")(_usage_case(
    lambda cap, out: ["synth", out, "--heads", 1000, "--quiet"], ["--heads", "1000", Num(32)]))
case("options", "synth_heads_beyond_one_layer")(_usage_case(
    lambda cap, out: ["synth", out, "--layers", 1, "--heads", 9, "--quiet"], ["--heads", Num(9), Num(8)]))


def _one_bucket_capture(path, n, d=32):
    """One head whose n query and n key rows all lie in one bucket of one example (the
    worst case for anything quadratic in the rows of a bucket); n * d * 8 bytes in all."""
    os.makedirs(path)
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump({"format": "qkgeom-dataset", "version": 1, "model": "one-bucket", "n_layers": 1,
                   "n_q_heads": [1], "n_kv_heads": [1], "head_dim": d, "context_length": 32768,
                   "buckets": {"scheme": "uniform", "width": 32768}}, f)
    rng = np.random.default_rng(n)
    for k in "qk":
        sub = os.path.join(path, "l00h00" + k)
        os.makedirs(sub)
        np.save(os.path.join(sub, "vectors.npy"), rng.standard_normal((n, d)).astype(np.float32))
        np.save(os.path.join(sub, "position.npy"), np.sort(rng.choice(32768, n, replace=False)).astype(np.int64))
        np.save(os.path.join(sub, "bucket.npy"), np.zeros(n, np.int64))
        np.save(os.path.join(sub, "example_id.npy"), np.zeros(n, np.int64))


@case("inputs", "entry_too_big_for_memory_named_with_its_size")
def _(ctx):
    # An entry of 2^25 x 64 f32 rows (8 GiB on disk, sparse: a few kB used) read under a 2 GiB
    # address-space limit: the head fails naming the entry and its size, never a bare bad_alloc.
    if ctx.sanitized:
        raise Skip("an address-space limit and the sanitizers' shadow memory do not mix")
    base, cap, out = setup_copy(ctx)
    name = "l00h02q"  # a query entry of the base capture's head sample
    p = entry_path(cap, name)
    n, d = 2 ** 25, int(json.load(open(os.path.join(cap, "manifest.json")))["head_dim"])
    with open(p, "wb") as f:
        f.write(npy_header_bytes("<f4", (n, d)))
        off = f.tell()
    os.truncate(p, off + n * d * 4)
    for member in ("position", "bucket", "example_id"):  # sparse too: n zeros (position 0, bucket 0)
        q = entry_path(cap, name, member)
        with open(q, "wb") as f:
            f.write(npy_header_bytes("<i8", (n,)))
            off = f.tell()
        os.truncate(q, off + n * 8)
    r = ctx.run_argv(["/bin/sh", "-c", 'ulimit -v 2000000 && exec "$0" "$@"', ctx.qkgeom, "analyze", cap, "-o", out,
                      "-j", "1", "--quiet", "--no-pictures"], check_bounds=False)
    if r.rc != 3:
        raise Fail("expected exit 3 (the head fails, the others go on): " + r.brief())
    text = failures_text(out)
    size = sum(os.path.getsize(os.path.join(os.path.dirname(p), f)) for f in os.listdir(os.path.dirname(p)))
    miss = missing_keywords(text, [name, "does not fit in memory", str(size)])
    if miss or "std::bad_alloc" in text:
        raise Fail("failures.txt lacks %s: %r" % (miss, text[-400:]))


@case("inputs", "entry_holding_one_token_twice_is_refused")
def _(ctx):
    # Two rows of one query entry with the same example id and position (a capture that ran a
    # batch twice): the head fails naming the entry, the token and both rows; the others go on.
    base, cap, out = setup_copy(ctx)
    name = "l00h02q"
    arrays = {m: np.load(entry_path(cap, name, m)) for m in ("position", "bucket", "example_id")}
    for m, a in arrays.items():  # row 5 becomes the token of row 0 (position, bucket and example)
        a[5] = a[0]
        np.save(entry_path(cap, name, m), a)
    ex, pos = arrays["example_id"], arrays["position"]
    r = ctx.analyze(cap, out, "--no-pictures")
    if r.rc != 3:
        raise Fail("expected exit 3 (the head fails, the others go on): " + r.brief())
    text = failures_text(out)
    miss = missing_keywords(text, [name, "example %d, position %d is held twice" % (ex[0], pos[0]),
                                   "rows 0 and 5", "example_id.npy"])
    if miss:
        raise Fail("failures.txt lacks %s: %r" % (miss, text[-400:]))


@case("options", "rows_per_bucket_peak_memory_grows_linearly")
def _(ctx):
    # Three sizes, doubling: the growth from 2n to 4n rows must stay near twice the growth
    # from n to 2n (linear); a quadratic cost would make it four times. Growths below 4 MB
    # are allocator noise (the rows of 20000 queries are ~5 MB; a quadratic pair buffer
    # would be gigabytes), so the floor of the comparison is 4 MB.
    rss = []
    for n in (5000, 10000, 20000):
        cap, out = os.path.join(ctx.case_dir, "cap%d" % n), os.path.join(ctx.case_dir, "out%d" % n)
        _one_bucket_capture(cap, n)
        r = ctx.analyze(cap, out, "--no-pictures")
        if r.rc != 0:
            raise Fail("n = %d: %s" % (n, r.brief()))
        rss.append(r.rss_mb)
    g1, g2 = rss[1] - rss[0], rss[2] - rss[1]
    if g2 > 3.0 * max(g1, 4.0):
        raise Fail("peak memory %.1f / %.1f / %.1f MB at 5000 / 10000 / 20000 rows of one bucket: growth %.1f then "
                   "%.1f MB, not linear" % (rss[0], rss[1], rss[2], g1, g2))


@case("options", "synth_heads_all_of_one_layer_is_honoured")
def _(ctx):
    out = os.path.join(ctx.case_dir, "cap")
    r = ctx.run("synth", out, "--layers", 1, "--heads", 8, "--quiet")
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    with open(os.path.join(out, "manifest.json")) as f:
        m = json.load(f)
    count = (m.get("capture") or {}).get("head_count")
    entries = sorted(n for n in os.listdir(out) if re.fullmatch(r"l\d+h\d+q(\.\w+)?", n))
    if count not in (None, 8) or len(entries) != 8:
        raise Fail("manifest head_count %r over %d query entries" % (count, len(entries)))


# ---- study_cache: the study cache is verified, self-healing and safe under concurrency --------------
def _study_case(ctx, runs=None, cap_name="cap", benchmarks=None):
    """(base, capture copy, study file, OUT) for a one-run study of a private capture copy."""
    base, cap, out = setup_copy(ctx)
    if cap_name != "cap":
        os.rename(cap, os.path.join(ctx.case_dir, cap_name))
        cap = os.path.join(ctx.case_dir, cap_name)
    st = _study(ctx, os.path.join(ctx.case_dir, "study.json"), runs or [{"name": "a", "capture": cap_name}],
                benchmarks)
    return base, cap, st, out


def _run_study(ctx, st, out, *extra):
    return ctx.run("study", st, "-o", out, "-j", 1, "--quiet", *extra)


def _entry(out):
    """The one cache entry of a study report."""
    d = os.path.join(out, "cache")
    names = sorted(n for n in os.listdir(d)) if os.path.isdir(d) else []
    if len(names) != 1:
        raise Fail("expected one cache entry, found %s" % names)
    return os.path.join(d, names[0])


def _models(out):
    """study_models.csv: {run: row without status, message} (the numbers a clean run must equal)."""
    header, rows = read_csv(os.path.join(out, "study_models.csv"))
    res = {}
    for r in rows:
        d = dict(zip(header, r))
        for k in ("status", "message"):
            d.pop(k, None)
        res[d["run"]] = d
    return res


def _status(out, run="a"):
    header, rows = read_csv(os.path.join(out, "study_models.csv"))
    for r in rows:
        d = dict(zip(header, r))
        if d["run"] == run:
            return d["status"]
    raise Fail("run %s not in study_models.csv" % run)


def _clean_study(ctx, base):
    """study_models.csv of a clean study of the untouched base capture (made per case)."""
    d = os.path.join(ctx.case_dir, "clean")
    os.makedirs(d)
    shutil.copytree(base.cap, os.path.join(d, "cap"), symlinks=True)
    st = _study(ctx, os.path.join(d, "study.json"), [{"name": "a", "capture": "cap"}])
    r = _run_study(ctx, st, os.path.join(d, "out"))
    if r.rc != 0:
        raise Fail("the clean study: " + r.brief())
    return _models(os.path.join(d, "out"))


def _no_internal_names(r):
    for text in (r.err, r.out):
        if ".staging-" in text or ".partial-" in text or ".old-" in text:
            raise Fail("a message names an internal folder: %r" % unpathed(text)[:300])


def _healed(ctx, base, cap, st, out, note_kws):
    """The run after damage: exit 0, one note naming the damage (never a staging folder), the
    run analysed again, the entry and the numbers equal a clean run's; the next run serves it."""
    before = snapshot(cap)
    r = _run_study(ctx, st, out)
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    _no_internal_names(r)
    notes = [ln for ln in r.err.split("\n") if ln.startswith("qkgeom: note:")]
    if not notes or missing_keywords(notes[0], note_kws):
        raise Fail("no note naming %s on stderr: %r" % (note_kws, unpathed(r.err)[:300]))
    if _status(out) != "analysed":
        raise Fail("status %s, expected analysed" % _status(out))
    compare_heads(_entry(out), base, base.heads, "cached")
    if _models(out) != _clean_study(ctx, base):
        raise Fail("study_models.csv differs from a clean study's")
    if snapshot(cap) != before:
        raise Fail("the capture changed")
    r = _run_study(ctx, st, out)
    if r.rc != 0 or _status(out) != "cached" or "note" in r.err:
        raise Fail("the run after healing: %s, status %s" % (r.brief(), _status(out)))


def _damaged_entry_case(damage, note_kws):
    def fn(ctx):
        base, cap, st, out = _study_case(ctx)
        r = _run_study(ctx, st, out)
        if r.rc != 0 or _status(out) != "analysed":
            raise Fail("first run: " + r.brief())
        damage(_entry(out))
        _healed(ctx, base, cap, st, out, note_kws)
    return fn


def _flip_digit(p):
    with open(p, "rb") as f:
        raw = bytearray(f.read())
    i = raw.index(b"\n") + 1
    while not (0x31 <= raw[i] <= 0x39):
        i += 1
    raw[i] = raw[i] - 1
    with open(p, "wb") as f:
        f.write(raw)


def _halve(p):
    with open(p, "rb") as f:
        raw = f.read()
    with open(p, "wb") as f:
        f.write(raw[:len(raw) // 2])


def _replace_by_file(e):
    shutil.rmtree(e)
    with open(e, "w") as f:
        f.write("not an entry\n")


def _link_to_copy(p):
    kept = p + ".kept"
    shutil.move(p, kept)
    os.symlink(os.path.basename(kept), p)


for _n, _d, _k in [
        ("hand_edited_head_metrics_same_size", lambda e: _flip_digit(os.path.join(e, "head_metrics.csv")),
         ["head_metrics.csv", "checksum", "analysed again"]),
        ("hand_edited_head_profile", lambda e: _flip_digit(os.path.join(e, "head_profile.csv")),
         ["head_profile.csv", "checksum"]),
        ("deleted_head_metrics", lambda e: os.remove(os.path.join(e, "head_metrics.csv")),
         ["head_metrics.csv", "missing"]),
        ("deleted_head_profile", lambda e: os.remove(os.path.join(e, "head_profile.csv")),
         ["head_profile.csv", "missing"]),
        ("truncated_head_metrics", lambda e: _halve(os.path.join(e, "head_metrics.csv")),
         ["head_metrics.csv", "bytes"]),
        ("deleted_key_file", lambda e: os.remove(os.path.join(e, "study_key.json")), ["study_key.json"]),
        ("garbage_key_file", lambda e: open(os.path.join(e, "study_key.json"), "w").write("{"), ["study_key.json"]),
        ("extra_file_in_entry", lambda e: open(os.path.join(e, "head_extra.csv"), "w").write("x\n"),
         ["head_extra.csv", "not listed"]),
        ("entry_replaced_by_a_file", _replace_by_file, ["not a folder"]),
        ("cached_file_replaced_by_a_link", lambda e: _link_to_copy(os.path.join(e, "head_metrics.csv")),
         ["head_metrics.csv", "not a regular file"])]:
    case("study_cache", _n + "_is_analysed_again")(_damaged_entry_case(_d, _k))


@case("study_cache", "partial_debris_in_the_cache_is_never_served")
def _(ctx):
    base, cap, st, out = _study_case(ctx)
    if _run_study(ctx, st, out).rc != 0:
        raise Fail("first run failed")
    e = _entry(out)
    shutil.copytree(e, e + ".partial-0123456789abcdef")
    _flip_digit(os.path.join(e + ".partial-0123456789abcdef", "head_metrics.csv"))
    r = _run_study(ctx, st, out)
    if r.rc != 0 or _status(out) != "cached":
        raise Fail("expected a cached run, got %s" % r.brief())
    if os.path.exists(e + ".partial-0123456789abcdef"):
        raise Fail("the debris was carried into the new report's cache")
    compare_heads(_entry(out), base, base.heads, "cached")


def _other_capture(ctx):
    """A second capture with the same layout (another family: other rows)."""
    other = os.path.join(ctx.case_dir, "other")
    r = ctx.run("synth", other, "--layers", 1, "--heads", 4, "--family", "steady", "--format", "npy", "--dtype", "f32",
               "--quiet")
    if r.rc != 0:
        raise Fail("synth: " + r.brief())
    return other


def _edit_behind_link_case(link):
    """A capture whose entry (or member, or the capture itself) is a symbolic link; the
    data behind the link changes: the next run analyses again, never serves the old entry."""
    def fn(ctx):
        base, cap, st, out = _study_case(ctx)
        target, q = link(ctx, cap, base)
        r = _run_study(ctx, st, out)
        if r.rc != 0 or _status(out) != "analysed":
            raise Fail("first run: " + r.brief())
        first = head_rows(_entry(out), "head_metrics.csv")
        other = _other_capture(ctx)
        src = os.path.join(other, q)
        for n in os.listdir(src):
            shutil.copyfile(os.path.join(src, n), os.path.join(target, n))
        r = _run_study(ctx, st, out)
        if r.rc != 0:
            raise Fail("second run: " + r.brief())
        if _status(out) != "analysed":
            raise Fail("the data behind the link changed, yet the run was served %s" % _status(out))
        if head_rows(_entry(out), "head_metrics.csv") == first:
            raise Fail("the analysis did not change with the data behind the link")
    return fn


def _link_entry_dir(ctx, cap, base):
    q = base.q(0)
    target = os.path.join(ctx.case_dir, "elsewhere_" + q)
    shutil.move(os.path.join(cap, q), target)
    os.symlink(target, os.path.join(cap, q))
    return target, q


def _link_whole_capture(ctx, cap, base):
    real = os.path.join(ctx.case_dir, "real_cap")
    shutil.move(cap, real)
    os.symlink(real, cap)
    return os.path.join(real, base.q(0)), base.q(0)


def _link_members(ctx, cap, base):
    q = base.q(0)
    target = os.path.join(ctx.case_dir, "members")
    os.makedirs(target)
    for n in os.listdir(os.path.join(cap, q)):
        shutil.move(os.path.join(cap, q, n), os.path.join(target, n))
        os.symlink(os.path.join(target, n), os.path.join(cap, q, n))
    return target, q


case("study_cache", "entry_folder_symlink_edit_behind_the_link")(_edit_behind_link_case(_link_entry_dir))
case("study_cache", "capture_symlink_edit_behind_the_link")(_edit_behind_link_case(_link_whole_capture))
case("study_cache", "entry_members_symlinks_edit_behind_the_links")(_edit_behind_link_case(_link_members))


@case("study_cache", "sparse_64GB_file_beside_the_entries_is_not_hashed")
def _(ctx):
    base, cap, st, out = _study_case(ctx)
    with open(os.path.join(cap, "junk.bin"), "wb") as f:
        f.truncate(64 << 30)
    r = _run_study(ctx, st, out)
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    compare_heads(_entry(out), base, base.heads, "cached")
    os.remove(os.path.join(cap, "junk.bin"))  # not read by the analysis: not part of the key either
    r = _run_study(ctx, st, out)
    if r.rc != 0 or _status(out) != "cached":
        raise Fail("without junk.bin: %s, status %s" % (r.brief(), _status(out)))


@case("study_cache", "sparse_64GB_stray_entry_fails_fast_by_name")
def _(ctx):
    base, cap, st, out = _study_case(ctx)
    with open(os.path.join(cap, "l00h09q.npz"), "wb") as f:
        f.truncate(64 << 30)
    r = _run_study(ctx, st, out)
    if r.rc != 3:
        raise Fail("expected exit 3 (the run fails: a stray entry), got " + r.brief())
    _no_internal_names(r)
    text = open(os.path.join(out, "failures.txt")).read()
    if missing_keywords(text, ["l00h09q.npz", "stray"]):
        raise Fail("failures.txt lacks the stray entry: %r" % text[:300])


@case("study_cache", "bytes_written_during_the_run_and_put_back_are_never_cached")
def _(ctx):
    cap0, _ = _big(ctx)
    cap = os.path.join(ctx.case_dir, "cap")
    shutil.copytree(cap0, cap)
    st = _study(ctx, os.path.join(ctx.case_dir, "study.json"), [{"name": "a", "capture": "cap"}])
    out = os.path.join(ctx.case_dir, "out")
    member = sorted(p for p in (os.path.join(dp, f) for dp, _, fs in os.walk(cap) for f in fs)
                    if "l03" in p and "vectors" in p or p.endswith(".npz") and "l03" in p)
    if not member:
        raise Fail("no entry of layer 3 in the big capture")
    p, t0 = member[0], time.monotonic()
    proc, err = _popen(ctx, ["study", st, "-o", out, "-j", 1, "--quiet"], env=_fault_env("slow"))
    time.sleep(0.4)  # the analysis is under way (50 ms per safe point, 32 heads)
    with open(p, "rb") as f:
        orig = f.read()
    with open(p, "wb") as f:
        f.write(orig[:-64] + b"\x7f" * 64)  # other bytes, same size ...
    time.sleep(0.05)
    with open(p, "wb") as f:
        f.write(orig)  # ... put back before the analysis ends
    rc, msg = _wait(ctx, proc, err)
    if time.monotonic() - t0 > ctx.wall_limit:
        raise Fail("took %.1f s" % (time.monotonic() - t0))
    if rc != 3:
        raise Fail("expected exit 3 (the run failed: its capture changed), got %s: %r" % (rc, msg[-300:]))
    text = open(os.path.join(out, "failures.txt")).read()
    if missing_keywords(text, ["changed while it was analysed", "neither used nor cached", "l03"]):
        raise Fail("failures.txt does not say the capture changed: %r" % text[:300])
    cache = os.path.join(out, "cache")
    if os.path.isdir(cache) and os.listdir(cache):
        raise Fail("an entry was cached: %s" % os.listdir(cache))
    r = ctx.run("study", st, "-o", out, "-j", 1, "--quiet")
    if r.rc != 0 or _status(out) != "analysed":
        raise Fail("the rerun: %s, status %s" % (r.brief(), _status(out)))


@case("study_cache", "concurrent_studies_of_one_capture_all_succeed_alike")
def _(ctx):
    base, cap, st, _ = _study_case(ctx)
    procs = []
    for i in range(3):
        procs.append(_popen(ctx, ["study", st, "-o", os.path.join(ctx.case_dir, "out%d" % i), "-j", 1, "--quiet"]))
    for p, err in procs:
        rc, msg = _wait(ctx, p, err)
        if rc != 0:
            raise Fail("a concurrent study exited %s: %r" % (rc, msg[-300:]))
    tables = [_models(os.path.join(ctx.case_dir, "out%d" % i)) for i in range(3)]
    if tables[0] != tables[1] or tables[0] != tables[2] or tables[0] != _clean_study(ctx, base):
        raise Fail("concurrent studies differ from a clean one")


# ---- study_numbers: every number of a study is checked, never silently taken or dropped -----------
def _numbers_case(overall=None, by_length=None, runs=None, names=(), kws=(), rc=1, prepare=None):
    """A study of a given run (or `runs`) with score files: exit `rc`; exit 1: one line naming
    `names` + `kws`; exit 3: failures.txt names them; the inputs unchanged."""
    def fn(ctx):
        d = ctx.case_dir
        bms = []
        if overall is not None or by_length is not None:
            b = {"name": "LBP"}
            if overall is not None:
                open(os.path.join(d, "lbp.csv"), "w").write(overall)
                b["overall"] = "lbp.csv"
            if by_length is not None:
                open(os.path.join(d, "lbp_len.csv"), "w").write(by_length)
                b["by_length"] = "lbp_len.csv"
            bms.append(b)
        if prepare:
            prepare(ctx)
        st = _study(ctx, os.path.join(d, "study.json"),
                    runs or [{"name": "a", "model": "qwen3-8b", "metrics": {"ap_drop": 0.1}}], bms)
        watch = [os.path.join(d, n) for n in sorted(os.listdir(d))]
        before = {p: snapshot(p) for p in watch}
        out = os.path.join(d, "out")
        r = ctx.run("study", st, "-o", out, "--quiet")
        if rc == 1:
            expect_error(r, names, kws)
        elif r.rc != rc:
            raise Fail("expected exit %d, got %s" % (rc, r.brief()))
        if rc == 3:
            text = open(os.path.join(out, "failures.txt")).read()
            miss = missing_keywords(text, list(names) + list(kws))
            if miss:
                raise Fail("failures.txt lacks %s: %r" % (miss, unpathed(text)[:400]))
        for p in watch:
            if snapshot(p) != before[p]:
                raise Fail("%s changed" % os.path.basename(p))
    return fn


_LEN = "model,lo,hi,score\nqwen3-8b,0,1024,40\nqwen3-8b,1024,4096,38\n"
for _v in ("nan", "inf", "-inf", "NaN"):
    case("study_numbers", "overall_score_%s" % _v)(_numbers_case(
        "model,score\nqwen3-8b,%s\n" % _v, names=["lbp.csv"], kws=["score", "line 2", _v]))
case("study_numbers", "by_length_score_nan")(_numbers_case(
    None, "model,lo,hi,score\nqwen3-8b,0,1024,nan\n", names=["lbp_len.csv"], kws=["score", "line 2", "nan"]))
case("study_numbers", "model_with_trailing_space_says_did_you_mean")(_numbers_case(
    "model,score\nqwen3-8b ,41.5\n", names=["lbp.csv"], kws=["line 2", "did you mean", "'qwen3-8b'"]))
case("study_numbers", "model_in_other_case_says_did_you_mean")(_numbers_case(
    "model,score\nQwen3-8B,41.5\n", names=["lbp.csv"], kws=["line 2", "did you mean", "'qwen3-8b'", "Qwen3-8B"]))
case("study_numbers", "by_length_model_in_other_case_says_did_you_mean")(_numbers_case(
    None, "model,lo,hi,score\nQWEN3-8B,0,1024,40\n", names=["lbp_len.csv"], kws=["did you mean", "'qwen3-8b'"]))
case("study_numbers", "run_model_with_trailing_space_says_did_you_mean")(_numbers_case(
    "model,score\nqwen3-8b,41.5\n",
    runs=[{"name": "a", "model": "qwen3-8b ", "metrics": {"ap_drop": 0.1}}],
    names=["lbp.csv"], kws=["did you mean", "'qwen3-8b '"]))
case("study_numbers", "header_only_overall_file")(_numbers_case(
    "model,score\n", names=["lbp.csv"], kws=["no score rows"]))
case("study_numbers", "header_only_by_length_file")(_numbers_case(
    None, "model,lo,hi,score\n", names=["lbp_len.csv"], kws=["no score rows"]))
case("study_numbers", "overlapping_length_bins")(_numbers_case(
    None, "model,lo,hi,score\nqwen3-8b,0,2048,40\nqwen3-8b,1024,4096,38\n", names=["lbp_len.csv"],
    kws=["overlaps", "line 2", "line 3", "qwen3-8b"]))
case("study_numbers", "the_same_length_bin_twice")(_numbers_case(
    None, "model,lo,hi,score\nqwen3-8b,0,1024,40\nqwen3-8b,0,1024,41\n", names=["lbp_len.csv"], kws=["overlaps"]))
for _m, _v, _k in [("ap_overall", 7.5, "outside [0, 1]"), ("n_q_tokens", -3, "integer"),
                   ("n_q_tokens", 2.5, "integer"), ("r_q_a", -1.5, "outside [-1, 1]"),
                   ("abs_alpha_k", -0.25, ">= 0"), ("sem_frac_ks_reject", 1.01, "outside")]:
    case("study_numbers", "given_%s_%s" % (_m, _v))(_numbers_case(
        runs=[{"name": "a", "metrics": {_m: _v}}], names=["study.json"],
        kws=["runs[0].metrics." + _m, Num(_v), _k]))


def _edited_analysis(col, value):
    def prepare(ctx):
        base = ctx.base("npy")
        ana = os.path.join(ctx.case_dir, "ana")
        shutil.copytree(base.out, ana)
        p = os.path.join(ana, "head_metrics.csv")
        header, rows = read_csv(p)
        rows[1][header.index(col)] = value
        with open(p, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([header] + rows)
    return prepare


for _m, _v, _k in [("ap_overall", "7.5", "outside [0, 1]"), ("n_q_tokens", "-5", "integer"),
                   ("alpha_k", "inf", "finite"), ("ap_drop", "-inf", "finite"), ("pos_ks_p", "1.5", "outside")]:
    case("study_numbers", "analysis_folder_%s_%s" % (_m, _v))(_numbers_case(
        runs=[{"name": "a", "analysis": "ana"}], rc=3, prepare=_edited_analysis(_m, _v),
        names=["head_metrics.csv"], kws=[_m, "line 3", _v, _k]))


def _incomplete_analysis(ctx):
    base, cap, _ = setup_copy(ctx)
    truncate_file(entry_path(cap, base.q(1)), 100)
    r = ctx.analyze(cap, os.path.join(ctx.case_dir, "ana"))
    if r.rc != 3:
        raise Fail("the analysis of a capture with a truncated entry: expected exit 3, got " + r.brief())
    shutil.rmtree(cap)


case("study_numbers", "analysis_folder_of_a_run_that_exited_3")(_numbers_case(
    runs=[{"name": "a", "analysis": "ana"}], rc=3, prepare=_incomplete_analysis,
    names=["ana", "failures.txt"], kws=["incomplete analysis"]))


@case("study_numbers", "a_run_model_without_a_score_is_said_and_extra_models_are_fine")
def _(ctx):
    d = ctx.case_dir
    open(os.path.join(d, "lbp.csv"), "w").write("model,score\nqwen3-8b,41.5\nnot-in-the-study,12\n")
    st = _study(ctx, os.path.join(d, "study.json"),
                [{"name": "a", "model": "qwen3-8b", "metrics": {"ap_drop": 0.1}},
                 {"name": "b", "model": "llama-3", "metrics": {"ap_drop": 0.2}}],
                [{"name": "LBP", "overall": "lbp.csv"}])
    out = os.path.join(d, "out")
    r = ctx.run("study", st, "-o", out, "--quiet")
    if r.rc != 0:
        raise Fail("expected exit 0, got " + r.brief())
    if missing_keywords(r.err, ["note", "lbp.csv", "LBP", "'llama-3'", "left out"]):
        raise Fail("no note naming the unscored model: %r" % unpathed(r.err)[:300])
    if "qwen3-8b" in r.err:
        raise Fail("the scored model is named in the note: %r" % r.err[:300])
    header, rows = read_csv(os.path.join(out, "study_models.csv"))
    score = {dict(zip(header, x))["run"]: dict(zip(header, x))["score_LBP"] for x in rows}
    if score != {"a": "41.5", "b": "nan"}:
        raise Fail("scores %s" % score)



# ---- python: the Python package refuses what the program refuses (issue 31, classes 2, 7, 10) ----
_PY_PRELUDE = """import sys
sys.path.insert(0, %r)
import numpy as np
import qkgeom as q
rng = np.random.default_rng(0)
spec = q.BucketSpec("uniform", 64, 1.0)
"""


def _py(ctx, body, timeout=None):
    """Runs `body` in a python child with the qkgeom package (bounds as the program's runs): its
    stdout's last line, e.g. 'RAISED ValueError <message>' or 'ACCEPTED'."""
    if not ctx.python_path:
        raise Skip("no --python-path (the qkgeom package was not built)")
    script = (_PY_PRELUDE % ctx.python_path) + "try:\n" + "".join("    " + ln + "\n" for ln in body.splitlines()) + \
        "    print('ACCEPTED')\nexcept Exception as e:\n" \
        "    print('RAISED', type(e).__name__, str(e).replace(chr(10), ' '))\n"
    r = ctx.run_argv([ctx.python, "-c", script], timeout=timeout)
    if r.rc != 0:
        raise Fail("python exited %s: %r" % (r.rc, r.err[-400:]))
    lines = r.out.strip().splitlines()
    return lines[-1] if lines else ""


def _py_refused(body, exc, kws):
    """The call in `body` raises `exc` whose message has every keyword (within the bounds)."""
    def fn(ctx):
        line = _py(ctx, body)
        if not line.startswith("RAISED " + exc + " "):
            raise Fail("expected %s, got %r" % (exc, line[:400]))
        miss = missing_keywords(line, kws)
        if miss:
            raise Fail("the message lacks %s: %r" % (miss, line[:400]))
    return fn


_ROWS = "Q = rng.standard_normal((600, 16)).astype(np.float32)\npos = np.arange(600) % 400\n"
case("python", "analyze_head_4_rows_of_d_30000")(_py_refused(
    "x = rng.standard_normal((4, 30000)).astype(np.float32)\n"
    "q.analyze_head(x, np.arange(4), x, np.arange(4), buckets=spec)",
    "ValueError", ["queries", "d = 30000", "4096"]))
case("python", "head_moments_of_d_200000")(_py_refused(
    "q.HeadMoments(200000)", "ValueError", ["HeadMoments", "200000", "4096"]))
case("python", "analyze_moments_keys_of_d_30000")(_py_refused(
    "m = q.HeadMoments(16)\nx = rng.standard_normal((4, 30000)).astype(np.float32)\n"
    "q.analyze_moments(m, x, np.arange(4), buckets=spec)", "ValueError", ["keys", "30000", "4096"]))
for _name, _v, _r in [("rank_sets", "10**12", "1..1000000"), ("samples", "10**12", "1..1000000000"),
                      ("empirical_budget", "10**12", "4..1000000000"), ("seed", "2**64", "0..9223372036854775807"),
                      ("components", "0", "1..4096")]:
    case("python", "options_%s_%s" % (_name, _v.replace("**", "^")))(_py_refused(
        "q.Options(%s=%s)" % (_name, _v), "ValueError", ["Options." + _name, str(eval(_v)), _r]))
case("python", "options_low_above_high")(_py_refused(
    "q.Options(low=0.8, high=0.2)", "ValueError", ["low", "high", "0.8", "0.2"]))
case("python", "options_nan_threshold")(_py_refused("q.Options(high=float('nan'))", "ValueError", ["Options.high", "nan"]))
case("python", "options_nan_ks_alpha")(_py_refused("q.Options(ks_alpha=float('nan'))", "ValueError", ["ks_alpha", "nan"]))
case("python", "options_string_for_a_boolean")(_py_refused(
    "q.Options(diagnostics='no')", "TypeError", ["Options.diagnostics", "str", "'no'"]))
case("python", "contradiction_set_by_attribute_refused_at_use")(_py_refused(
    _ROWS + "o = q.Options()\no.low = 0.9\nq.analyze_head(Q, pos, Q, pos, buckets=spec, options=o)",
    "ValueError", ["analyze_head", "low", "high", "0.9", "0.7"]))
case("python", "context_length_below_largest_position")(_py_refused(
    _ROWS + "q.analyze_head(Q, pos, Q, pos, buckets=spec, context_length=300)",
    "ValueError", ["q_positions", "context_length", "399", "300"]))
case("python", "analyze_moments_with_another_heads_keys")(_py_refused(
    _ROWS + "m = q.HeadMoments(16)\nb = q.bucket_of(spec, pos)\nm.add('q', Q, pos, b)\nm.add('k', Q, pos, b)\n"
    "q.analyze_moments(m, rng.standard_normal((600, 16)).astype(np.float32), pos, buckets=spec)",
    "ValueError", ["keys", "not the rows the key moments were reduced from"]))
case("python", "bucket_spec_width_0")(_py_refused("q.BucketSpec('uniform', 0)", "ValueError", ["BucketSpec", "width", "0"]))
case("python", "bucket_spec_rate_negative")(_py_refused("q.BucketSpec('log', 64, -1.0)", "ValueError", ["rate", "-1"]))
case("python", "bucket_spec_width_set_to_0")(_py_refused("s = q.BucketSpec()\ns.width = 0", "ValueError", ["width", "0"]))
case("python", "positions_beyond_int64")(_py_refused(
    _ROWS + "q.analyze_head(Q[:2], [0, 2**70], Q[:2], [0, 1], buckets=spec)",
    "ValueError", ["q_positions", str(2**70), "int64"]))
case("python", "analyze_dataset_jobs_4294967297")(_py_refused(
    "q.analyze_dataset('nowhere', jobs=4294967297)", "ValueError", ["jobs", "4294967297", "1..4096"]))


@case("python", "writer_close_after_a_failed_write_writes_no_manifest")
def _(ctx):
    w = os.path.join(ctx.case_dir, "cap")
    line = _py(ctx, (
        "import resource, signal\nfrom qkgeom.capture import manifest_for\n"
        "man = manifest_for(q.ModelLayout(16, [1], [1]), model='m', buckets=spec, context_length=512, seed=0)\n"
        "w = q.DatasetWriter(%r, man, buffer_bytes=1)\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nresource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n    w.append(0, 'q', 0, np.ones((400, 16), np.float32), np.arange(400), np.zeros(400, np.int64))\n"
        "except OSError:\n    pass\n"
        "w.close()") % w)
    if not line.startswith("RAISED OSError") or missing_keywords(line, ["earlier write failed", "manifest.json"]):
        raise Fail("close() after a failed write: %r" % line[:400])
    if os.path.exists(os.path.join(w, "manifest.json")):
        raise Fail("a manifest.json was written for a capture that lacks rows")


@case("python", "sigint_during_analyze_dataset_raises_keyboard_interrupt")
def _(ctx):
    cap = _big(ctx)[0]
    line = _py(ctx, (
        "import os, signal, threading, time\n"
        "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\nt0 = time.monotonic()\n"
        "try:\n    q.analyze_dataset(%r, q.Options(rank_sets=1000), jobs=1)\n    print('DONE')\n"
        "except KeyboardInterrupt:\n    print('INTERRUPTED %%.3f' %% (time.monotonic() - t0 - 0.5))\n"
        "raise SystemExit(0)") % cap)
    if not line.startswith("INTERRUPTED"):
        raise Fail("no KeyboardInterrupt: %r" % line[:300])
    if float(line.split()[1]) > 1.0:
        raise Fail("KeyboardInterrupt %s s after SIGINT (after the heads in progress: < 1 s)" % line.split()[1])


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------
def _make_writable(path):
    for dp, dns, _ in os.walk(path):
        for d in dns:
            p = os.path.join(dp, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)


def run_case(ctx, cls, name, fn):
    d = os.path.join(ctx.work, "cases", cls, name.replace("/", "_"))
    if os.path.exists(d):
        _make_writable(d)
        shutil.rmtree(d)
    os.makedirs(d)
    ctx.case_dir = d
    ctx.max_wall = ctx.max_rss = 0.0
    t0 = time.monotonic()
    try:
        fn(ctx)
        status, why = "PASS", ""
    except Skip as e:
        status, why = "SKIP", str(e)
    except Fail as e:
        status, why = "FAIL", str(e)
    except Exception as e:  # a bug in the case itself, or an unexpected program output
        status, why = "FAIL", "%s: %s" % (type(e).__name__, e)
    finally:
        ctx.case_dir = None
    if status != "FAIL" and not ctx.keep:  # a failing case's files stay for inspection
        _make_writable(d)
        shutil.rmtree(d, ignore_errors=True)
    return status, why, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkgeom", required=False)
    ap.add_argument("--work", required=False)
    ap.add_argument("--class", dest="cls", action="append",
                    help="class to run: 1..8, manifest, formats, inputs, signals, merge, options, study_cache, study_numbers, "
                    "python "
                    "(repeatable; default all)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("-k", dest="substr", action="append", help="run only cases whose name contains this")
    ap.add_argument("--bases", help="folder of the clean captures and their baselines, shared between runs "
                    "(default WORK/base); made when absent or made by another binary")
    ap.add_argument("--setup-only", action="store_true", help="make the clean captures and exit")
    ap.add_argument("--keep", action="store_true", help="keep the folders of passing cases too "
                    "(by default only failing cases' folders stay under WORK/cases)")
    ap.add_argument("--sanitized", action="store_true",
                    help="sanitizer build: no RSS bound, wall-time bound 30 s")
    ap.add_argument("--python-path", help="folder holding the qkgeom package (the class `python`; "
                    "without it those cases SKIP)")
    ap.add_argument("--python", help="interpreter of the class `python` (default: this one)")
    a = ap.parse_args()
    sel = []
    want = None if not a.cls else {("class" + c if c.isdigit() else c) for c in a.cls}
    for cls, name, fn in CASES:
        if want and cls not in want:
            continue
        if a.substr and not any(s in cls + "." + name for s in a.substr):
            continue
        sel.append((cls, name, fn))
    if a.list:
        for cls, name, _ in sel:
            print("%s.%s" % (cls, name))
        print("%d cases" % len(sel))
        return 0
    if not a.qkgeom or not a.work:
        ap.error("--qkgeom and --work are required")
    if not sel and not a.setup_only:
        print("no case selected")
        return 1
    sanitized = a.sanitized or bool(os.environ.get("QKGEOM_SANITIZE"))
    ctx = Ctx(a.qkgeom, a.work, sanitized, a.bases)
    ctx.keep = a.keep
    ctx.python_path = os.path.abspath(a.python_path) if a.python_path else None
    ctx.python = a.python or sys.executable
    t0 = time.monotonic()
    if a.setup_only:
        try:
            for fmt, dtype in BASES:
                ctx.base(fmt, dtype)
            _big(ctx)  # the interruption cases' capture
        except Fail as e:
            print("FAIL setup: %s" % e)
            return 1
        print("hostile: clean captures ready in %s (%.0f s)" % (ctx.bases_dir, time.monotonic() - t0))
        return 0
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for cls, name, fn in sel:
        status, why, dt = run_case(ctx, cls, name, fn)
        counts[status] += 1
        print("%s %s.%s (%.1f s; program max %.2f s, %.0f MB)%s" % (
            status, cls, name, dt, ctx.max_wall, ctx.max_rss, (": " + why) if why else ""), flush=True)
    print("hostile: %d passed, %d failed, %d skipped in %.0f s" % (
        counts["PASS"], counts["FAIL"], counts["SKIP"], time.monotonic() - t0))
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
