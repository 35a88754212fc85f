#!/usr/bin/env python3
"""Analysis throughput of `qkgeom analyze` under mpirun at 1, 2, 4 ... ranks (docs/scale.md).

    benchmarks/ranks_throughput.py --qkgeom QKGEOM [--mpirun MPIRUN] [--dataset DIR | --layers 8]
                                   [--ranks 1,2,4] [--repeats 3] [--work DIR]

Analyses DIR, or writes a synthetic capture (`qkgeom synth --layers L`: 8 small query heads a
layer; a thesis-shaped layer of 12 heads is what `QKGEOM_BENCH_LAYERS=1 QKGEOM_BENCH_DIR=DIR
qkgeom_bench --benchmark_filter=^bm_model_files/threads:1/` writes, docs/performance.md), then per
rank count N runs `mpirun -n N qkgeom analyze CAP -o OUT -j 1` `--repeats` times and
prints, from the fastest run: wall seconds, heads per second, the speed-up over one rank,
and the bytes of results rank 0 received per head (the program's own count: the only
traffic between ranks besides one 8-byte atomic per head handed out). A whole-process
run without mpirun is the baseline row. Timings mean something only on an idle machine;
with more ranks than cores (`--oversubscribe`) the ranks share the cores.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def timed(cmd, cwd, env):
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit("failed (exit %d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr.decode()))
    return wall, r.stderr.decode()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--qkgeom", required=True)
    p.add_argument("--mpirun", default=shutil.which("mpirun") or "")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dataset", default="")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default="")
    a = p.parse_args()
    if not a.mpirun:
        print("mpirun not found: SKIPPED")
        return 0
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    work = a.work or tempfile.mkdtemp(prefix="qkgeom-ranks-")
    if a.dataset:
        cap = os.path.abspath(a.dataset)
        with open(os.path.join(cap, "manifest.json")) as f:
            import json
            m = json.load(f)
        heads = len(m["sampled_heads"]) if m.get("sampled_heads") else sum(m["n_q_heads"]) if isinstance(
            m.get("n_q_heads"), list) else None
        what = "%s" % cap
    else:
        cap = os.path.join(work, "cap")
        shutil.rmtree(cap, ignore_errors=True)
        subprocess.run([a.qkgeom, "synth", cap, "--layers", str(a.layers), "--quiet"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        heads = 8 * a.layers
        what = "qkgeom synth --layers %d" % a.layers
    rows = []
    best = min(timed([a.qkgeom, "analyze", cap, "-o", os.path.join(work, "out"), "-j", "1", "--quiet"], work, env)[0]
               for _ in range(a.repeats))
    rows.append(("1 process, no mpirun", best, ""))
    for n in [int(x) for x in a.ranks.split(",")]:
        runs = [timed([a.mpirun, "--oversubscribe", "-n", str(n), a.qkgeom, "analyze", cap, "-o",
                       os.path.join(work, "out"), "-j", "1"], work, env) for _ in range(a.repeats)]
        wall, err = min(runs)
        m = re.search(r"\((\d+) bytes a head\)", err)
        rows.append(("mpirun -n %d" % n, wall, m.group(1) if m else "-"))
    base = rows[1][1]
    m = re.search(r"qkgeom: (\d+) heads on", err)
    heads = heads or (int(m.group(1)) if m else 1)
    print("%d heads (%s), -j 1 per rank, %d cores, best of %d" % (heads, what, os.cpu_count(), a.repeats))
    print("%-22s %8s %9s %9s %15s" % ("run", "wall s", "heads/s", "speed-up", "bytes a head"))
    for name, wall, b in rows:
        print("%-22s %8.2f %9.1f %8.2fx %15s" % (name, wall, heads / wall, base / wall, b))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
