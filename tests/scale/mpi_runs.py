#!/usr/bin/env python3
"""The program under mpirun (docs/scale.md): the same reports for any number of ranks.

    mpi_runs.py --qkgeom QKGEOM --mpirun MPIRUN --work DIR CASE

CASE:
  analyze       a synthetic capture analysed by one process and by mpirun -n 1, 2, 3, 4:
                every report file byte-identical, the same stdout
  study         a study of three captures (two with the same bytes) and a run with given
                metrics: byte-identical reports, stdout and stderr for n = 1..4
  merge         moments shards merged by one process and by mpirun -n 1..4: the same file
  rank_error    rank 1 of 2 fails: exit 1, the message names the rank, OUT untouched
  rank_killed   rank 1 of 3 killed mid-run: non-zero exit, mpirun names the rank, OUT
                untouched; the next run into OUT completes and leaves no debris
  study_resume  a study with --cache DIR loses rank 1 (SIGKILL) after a run finished: OUT not
                written; the rerun serves the finished runs from DIR as cached, and its tables equal
                a clean run's
  isa_mix       rank 0 capped at generic, rank 1 not: every rank uses generic (said on
                stderr) and the reports equal a one-process generic run

Exit 0 passed, 1 failed, 77 skipped (no mpirun).
"""

import argparse
import filecmp
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hostile"))

# Root is allowed (CI runs as root); no cross-memory-attach between ranks (containers often forbid
# process_vm_readv; shared-memory copies work everywhere).
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
ENV.pop("QKGEOM_TEST_FAULT", None)


class Fail(Exception):
    pass


def run(cmd, cwd, env=None, timeout=120):
    r = subprocess.run(cmd, cwd=cwd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def tree(d):
    out = []
    for root, dirs, files in os.walk(d):
        dirs.sort()
        for f in sorted(files):
            out.append(os.path.relpath(os.path.join(root, f), d))
    return out


def same_tree(a, b):
    ta, tb = tree(a), tree(b)
    if ta != tb:
        raise Fail("different files: %s vs %s" % (sorted(set(ta) ^ set(tb))[:5], b))
    bad = [f for f in ta if not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False)]
    if bad:
        raise Fail("%d file(s) differ between %s and %s: %s" % (len(bad), a, b, bad[:5]))
    return len(ta)


def mpi(a, n, *args):
    return [a.mpirun, "--oversubscribe", "-n", str(n), a.qkgeom, *args]


def synth(a, work, name, *extra):
    rc, _, err = run([a.qkgeom, "synth", os.path.join(work, name), "--quiet", *(extra or ("--layers", "2"))], work)
    if rc != 0:
        raise Fail("synth %s: %s" % (name, err))


def each_n(a, work, args, check_stderr=False):
    """args run in work/one by one process, then in work/nN by mpirun -n N (same relative paths)."""
    base = os.path.join(work, "one")
    os.makedirs(base)
    rc, out1, err1 = run([a.qkgeom, *args], base)
    if rc != 0:
        raise Fail("one process: exit %d: %s" % (rc, err1))
    files = 0
    for n in (1, 2, 3, 4):
        d = os.path.join(work, "n%d" % n)
        os.makedirs(d)
        rc, out, err = run(mpi(a, n, *args), d)
        if rc != 0:
            raise Fail("mpirun -n %d: exit %d: %s" % (n, rc, err))
        files = same_tree(os.path.join(base, "out"), os.path.join(d, "out"))
        if out != out1:
            raise Fail("mpirun -n %d: stdout differs:\n%s\nvs\n%s" % (n, out, out1))
        if check_stderr and err != err1:
            raise Fail("mpirun -n %d: stderr differs:\n%s\nvs\n%s" % (n, err, err1))
    print("%s: %d report files byte-identical for 1 process and mpirun -n 1..4" % (args[0], files))


def case_analyze(a, work):
    synth(a, work, "cap")
    each_n(a, work, ["analyze", "../cap", "-o", "out", "-j", "1", "--quiet"])


def case_study(a, work):
    synth(a, work, "cap_a")
    synth(a, work, "cap_b")                      # the same bytes as cap_a: one cache key
    synth(a, work, "cap_c", "--layers", "2", "--family", "steady")
    with open(os.path.join(work, "study.json"), "w") as f:
        f.write('{"title": "ranks", "runs": ['
                '{"name": "a", "family": "f", "model": "m1", "checkpoint": {"step": 1, "order": 0}, "capture": "cap_a"},'
                '{"name": "b", "family": "f", "model": "m1", "checkpoint": {"step": 2, "order": 1}, "capture": "cap_b"},'
                '{"name": "c", "family": "f", "model": "m2", "checkpoint": {"step": 1, "order": 0}, "capture": "cap_c"},'
                '{"name": "d", "family": "f", "model": "m3", "metrics": {"ap_drop": 0.1, "bias_strength": 0.001}}]}')
    each_n(a, work, ["study", "../study.json", "-o", "out", "-j", "1"], check_stderr=True)
    with open(os.path.join(work, "n4", "out", "summary.txt")) as f:
        text = f.read()
    if " cached " not in text or text.count(" analysed ") != 2:
        raise Fail("the run table is not one process's (a, c analysed, b cached):\n" + text)


def case_merge(a, work):
    import numpy as np
    from hostile import bucket_stats, shard_bytes
    rng = np.random.default_rng(3)
    d, names = 5, []
    for s in range(4):
        recs = []
        for kind in range(2):
            rows = []
            for b in range(3):
                t = np.arange(b * 100 + s * 10, b * 100 + s * 10 + 8)
                rows.append(bucket_stats(b, t, 1e3 + rng.standard_normal((8, d))))
            recs.append(rows)
        names.append("s%d.qkm" % s)
        with open(os.path.join(work, names[-1]), "wb") as f:
            f.write(shard_bytes(d, recs[0], recs[1], scheme=("uniform", 100, 1.0)))
    os.makedirs(os.path.join(work, "one"))
    args = ["merge", *["../" + x for x in names], "-o", "merged.qkm"]
    rc, out1, err = run([a.qkgeom, *args], os.path.join(work, "one"))
    if rc != 0:
        raise Fail("one process: " + err)
    with open(os.path.join(work, "one", "merged.qkm"), "rb") as f:
        want = f.read()
    for n in (1, 2, 3, 4):
        dn = os.path.join(work, "n%d" % n)
        os.makedirs(dn)
        rc, out, err = run(mpi(a, n, *args), dn)
        if rc != 0 or out != out1:
            raise Fail("mpirun -n %d: exit %d, stdout %r: %s" % (n, rc, out, err))
        with open(os.path.join(dn, "merged.qkm"), "rb") as f:
            if f.read() != want:
                raise Fail("mpirun -n %d: merged shard differs" % n)
    print("merge: %d bytes identical for 1 process and mpirun -n 1..4" % len(want))


def old_report(a, work, layers="2"):
    """An earlier report in work/run/out (a snapshot in work/snapshot); returns work/run."""
    synth(a, work, "cap", "--layers", layers)
    d = os.path.join(work, "run")
    os.makedirs(d)
    rc, _, err = run([a.qkgeom, "analyze", "../cap", "-o", "out", "-j", "1", "--quiet", "--context", "4096"], d)
    if rc != 0:
        raise Fail("the earlier report: " + err)
    shutil.copytree(os.path.join(d, "out"), os.path.join(work, "snapshot"))
    return d


def case_rank_error(a, work):
    d = old_report(a, work)
    env = dict(ENV, QKGEOM_TEST_FAULT="rank-error")
    rc, _, err = run([a.mpirun, "--oversubscribe", "-x", "QKGEOM_TEST_FAULT", "-n", "2", a.qkgeom, "analyze", "../cap",
                      "-o", "out", "-j", "1", "--quiet"], d, env=env)
    if rc != 1 or "rank 1 of 2: the planted failure" not in err:
        raise Fail("exit %d, stderr:\n%s" % (rc, err))
    if err.count("qkgeom: error") != 1:
        raise Fail("the error is not said once:\n" + err)
    same_tree(os.path.join(work, "snapshot"), os.path.join(d, "out"))
    if sorted(os.listdir(d)) != ["out"]:
        raise Fail("debris next to OUT: %s" % os.listdir(d))
    print("rank_error: exit 1, 'rank 1 of 2' named once, the earlier report untouched, no debris")


def ranks_of(mpirun_pid):
    """{rank: pid} of the processes mpirun started (their environment names the rank)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
            if b"OMPI_COMM_WORLD_RANK" in env:
                found[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return found


def wait_gone(pids, limit):
    """Seconds until every process in `pids` has exited (gone or a zombie); Fail after `limit`."""
    t0 = time.time()
    while True:
        alive = []
        for pid in pids:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        alive.append(pid)
            except (OSError, IndexError):
                pass
        if not alive:
            return time.time() - t0
        if time.time() - t0 > limit:
            raise Fail("the killed run's ranks %s still run after %d s" % (alive, limit))
        time.sleep(0.05)


def case_rank_killed(a, work):
    d = old_report(a, work, "6")  # 48 heads
    env = dict(ENV, QKGEOM_TEST_FAULT="slow")
    p = subprocess.Popen([a.mpirun, "--oversubscribe", "-x", "QKGEOM_TEST_FAULT", "-n", "3", a.qkgeom, "analyze",
                          "../cap", "-o", "out", "-j", "1", "--quiet"], cwd=d, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    deadline, pids = time.time() + 20, {}
    while time.time() < deadline and len(pids) < 3:
        time.sleep(0.05)
        pids = ranks_of(p.pid)
    if 1 not in pids:
        p.kill()
        raise Fail("rank 1's process not found: %s" % pids)
    time.sleep(0.4)  # mid-run: 48 heads at 100 ms each of planted delay, on 3 ranks
    os.kill(pids[1], signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    err = err.decode()
    if p.returncode == 0:
        raise Fail("a killed rank left exit 0")
    if "rank 1" not in err:
        raise Fail("the message does not name rank 1:\n" + err)
    same_tree(os.path.join(work, "snapshot"), os.path.join(d, "out"))
    # mpirun may return before its other ranks have exited; a staging folder whose owner still runs is
    # rightly left alone, so the rerun waits for them (a zombie counts as gone)
    waited = wait_gone(pids.values(), 30)
    rc, _, err2 = run([a.qkgeom, "analyze", "../cap", "-o", "out", "-j", "1", "--quiet", "--context", "4096"], d)
    if rc != 0 or sorted(os.listdir(d)) != ["out"]:
        raise Fail("the rerun (ranks gone after %.1f s): exit %d, folder %s: %s" % (waited, rc, os.listdir(d), err2))
    same_tree(os.path.join(work, "snapshot"), os.path.join(d, "out"))
    print("rank_killed: exit %d, rank 1 named, the earlier report untouched; the rerun completes, no debris"
          % p.returncode)


def whole_entries(cache):
    return sorted(e for e in os.listdir(cache) if "." not in e and
                  os.path.isfile(os.path.join(cache, e, "study_key.json"))) if os.path.isdir(cache) else []


def tables_without_status(out):
    """Every study_*.csv of a report, study_models.csv without its status column."""
    import csv
    got = {}
    for f in sorted(os.listdir(out)):
        if f.startswith("study_") and f.endswith(".csv"):
            with open(os.path.join(out, f), newline="") as fh:
                rows = list(csv.reader(fh))
            if f == "study_models.csv":
                k = rows[0].index("status")
                rows = [r[:k] + r[k + 1:] for r in rows]
            got[f] = rows
    return got


def case_study_resume(a, work):
    for name, family in (("cap_a", "steep"), ("cap_b", "moderate"), ("cap_c", "steady")):
        synth(a, work, name, "--layers", "2", "--family", family)
    with open(os.path.join(work, "study.json"), "w") as f:
        f.write('{"title": "resume", "runs": [' + ",".join(
            '{"name": "%s", "family": "f", "model": "m%d", "checkpoint": {"step": 1, "order": 0}, "capture": "cap_%s"}'
            % (x, i, x) for i, x in enumerate("abc")) + "]}")
    clean = os.path.join(work, "clean")
    os.makedirs(clean)
    rc, _, err = run([a.qkgeom, "study", "../study.json", "-o", "out", "-j", "1", "--quiet", "--cache", "c"], clean)
    if rc != 0:
        raise Fail("clean run: " + err)
    d = os.path.join(work, "run")
    os.makedirs(d)
    args = ["study", "../study.json", "-o", "out", "-j", "1", "--cache", "../cache"]
    p = subprocess.Popen([a.mpirun, "--oversubscribe", "-x", "QKGEOM_TEST_FAULT", "-n", "2", a.qkgeom, *args], cwd=d,
                         env=dict(ENV, QKGEOM_TEST_FAULT="slow"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cache = os.path.join(work, "cache")
    deadline = time.time() + 60
    while time.time() < deadline and not whole_entries(cache):
        time.sleep(0.05)
    pids = ranks_of(p.pid)
    finished = whole_entries(cache)
    if not finished or 1 not in pids:
        p.kill()
        raise Fail("no run finished before the kill, or rank 1 not found (%s, %s)" % (finished, pids))
    os.kill(pids[1], signal.SIGKILL)  # a node lost
    p.communicate(timeout=60)
    wait_gone(pids.values(), 30)  # mpirun may return before rank 0 has exited
    if p.returncode == 0:
        raise Fail("the study with a killed rank exited 0 (all its runs had finished: too fast to test)")
    kept = whole_entries(cache)
    if os.path.exists(os.path.join(d, "out")):
        raise Fail("a failed study wrote OUT")
    rc, _, err = run(mpi(a, 2, *args), d)
    if rc != 0:
        raise Fail("the resumed study: exit %d: %s" % (rc, err))
    served = err.count(": cached")
    if served < len(kept):
        raise Fail("%d entries kept, %d runs served from the cache:\n%s" % (len(kept), served, err))
    if tables_without_status(os.path.join(d, "out")) != tables_without_status(os.path.join(clean, "out")):
        raise Fail("the resumed study's tables differ from a clean run's")
    print("study_resume: rank 1 killed after %d run(s) finished; the rerun served %d from --cache and its "
          "tables equal a clean run's" % (len(finished), served))


def case_isa_mix(a, work):
    synth(a, work, "cap")
    one = os.path.join(work, "one")
    os.makedirs(one)
    rc, _, err = run([a.qkgeom, "analyze", "../cap", "-o", "out", "-j", "1", "--quiet"], one,
                     env=dict(ENV, QKGEOM_ISA="generic"))
    if rc != 0:
        raise Fail(err)
    mix = os.path.join(work, "mix")
    os.makedirs(mix)
    args = ["analyze", "../cap", "-o", "out", "-j", "1", "--quiet"]
    rc, _, err = run([a.mpirun, "--oversubscribe", "-n", "1", "-x", "QKGEOM_ISA=generic", a.qkgeom, *args, ":",
                      "-n", "1", a.qkgeom, *args], mix)
    if rc != 0:
        raise Fail("exit %d: %s" % (rc, err))
    probe = subprocess.run(["grep", "-c", "-E", "avx2|avx512", "/proc/cpuinfo"], stdout=subprocess.PIPE)
    if probe.stdout.strip() not in (b"", b"0") and "every rank uses generic" not in err:
        raise Fail("no note on the pinned level:\n" + err)
    same_tree(os.path.join(one, "out"), os.path.join(mix, "out"))
    print("isa_mix: pinned to generic (%s), reports equal a one-process generic run" % err.strip()[:80])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--qkgeom", required=True)
    p.add_argument("--mpirun", default="")
    p.add_argument("--work", required=True)
    p.add_argument("case")
    a = p.parse_args()
    if not a.mpirun or not os.path.exists(a.mpirun):
        print("mpirun not found: skipped")
        return 77
    work = os.path.join(a.work, a.case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    random.seed(1)
    try:
        globals()["case_" + a.case](a, work)
    except Fail as e:
        print("FAIL %s: %s" % (a.case, e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
