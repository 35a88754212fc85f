#!/usr/bin/env python3
"""CPU per head: the thesis toolkit against `qkgeom analyze -j 1` (issue 18).

The thesis' own Python toolkit (github.com/viktor-shcherb/attention-plasticity:
attention_plasticity/statistics.py, plasticity.py, driven per head by its
head_analysis.analyze_head) and `qkgeom analyze -j 1` analyse the same rows: a
thesis-shaped capture written by qkgeom's benchmark program (the workload of
benchmarks/workload.hpp: d = 128, 500 sequences of 4,096 tokens, uniform
buckets of 256 tokens at rate 1 -> 16 buckets, about 8,192 query and 8,192 key
rows per head, f32), restricted to the first N query heads of layer 0.

Nothing of the toolkit is vendored: the user points this script at a checkout
(--toolkit DIR or QKGEOM_TOOLKIT_DIR). Without one it prints a SKIPPED line
and exits 0. See docs/benchmarks-toolkit.md.

    benchmarks/toolkit_compare.py --toolkit ~/src/attention-plasticity \\
        --build-dir build-bench [--dataset DIR] [--heads 8] [--python python3]

What is timed (CPU time = user + system of the process and its children, by
os.wait4; every BLAS/OpenMP pool pinned to one thread):
  toolkit  analyze_head(layer, q_head, k_head, **RunnerConfig(...).task_kwargs())
           per head with the toolkit's defaults (256 sampled pairs per cell,
           normality on 64 dimensions, p_alpha 0.01, seed 0): reading the rows,
           orientation, regression, Householder, normality statistics,
           plasticity. Its `datasets` loader is replaced by one that serves the
           capture's .npy rows as the DataFrame `to_pandas()` would give (the
           toolkit reads parquet through Hugging Face `datasets`). Reported:
           the sum of process_time() around the analyze_head calls / heads
           (interpreter start and imports excluded; the whole-process CPU is
           printed too).
  qkgeom   the whole `qkgeom analyze CAPTURE -o OUT -j 1 --quiet` process /
           heads (defaults: exact pairs, PCA, rotation, diagnostics, every
           report and picture; start-up and file I/O included), median of
           --repeat runs.

Standard library only in the parent; the worker (--worker, run with the
toolkit's interpreter) needs what the toolkit needs: numpy, scipy, pandas,
pyyaml.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SKIP_LINE = ("toolkit comparison: SKIPPED — set QKGEOM_TOOLKIT_DIR (or --toolkit) to a checkout of "
             "viktor-shcherb/attention-plasticity")
TARGET = 100.0
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "NUMEXPR_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1"}
TOOLKIT_NEEDS = ("numpy", "scipy", "pandas", "yaml")


class CompareError(Exception):
    """A failure with a message for the user (exit status 1)."""


# --- the parent: dataset, runs, report ------------------------------------

def toolkit_root(path):
    """The checkout root holding attention_plasticity/{plasticity,statistics}.py."""
    root = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(root):
        raise CompareError(f"--toolkit {path}: no such directory (want a checkout of "
                           "viktor-shcherb/attention-plasticity)")
    if os.path.basename(root) == "attention_plasticity" and os.path.isfile(os.path.join(root, "plasticity.py")):
        root = os.path.dirname(root)
    for name in ("plasticity.py", "statistics.py", "head_analysis.py"):
        f = os.path.join(root, "attention_plasticity", name)
        if not os.path.isfile(f):
            raise CompareError(f"--toolkit {path}: {f} not found: not a checkout of "
                               "viktor-shcherb/attention-plasticity")
    return root


def toolkit_revision(root):
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown revision"
    except (OSError, subprocess.SubprocessError):
        return "unknown revision"


def check_python(python):
    probe = ("import importlib.util, sys; "
             f"m = [n for n in {TOOLKIT_NEEDS!r} if importlib.util.find_spec(n) is None]; "
             "print(' '.join(m))")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise CompareError(f"--python {python}: cannot run it ({e})") from e
    if out.returncode != 0:
        raise CompareError(f"--python {python}: probe failed: {out.stderr.strip()}")
    missing = out.stdout.split()
    if missing:
        raise CompareError(f"the toolkit cannot run with {python}: missing Python module(s) "
                           f"{', '.join(missing)} (pip install numpy scipy pandas pyyaml, or pass "
                           "--python / QKGEOM_TOOLKIT_PYTHON an interpreter that has them)")


def run_timed(cmd, env=None, stdout=subprocess.PIPE):
    """Runs cmd; returns (exit status, stdout text, stderr text, CPU seconds of it and its children)."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, env=env, stdout=out if stdout == subprocess.PIPE else stdout, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (p.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                ru.ru_utime + ru.ru_stime)


def write_bench_dataset(bench, where):
    """The benchmark workload of one layer (12 heads), written by qkgeom_bench."""
    if not bench or not os.access(bench, os.X_OK):
        raise CompareError(f"no --dataset given and the benchmark program {bench} is not built "
                           "(cmake --build BUILD --target qkgeom_bench)")
    env = dict(os.environ, QKGEOM_BENCH_LAYERS="1", QKGEOM_BENCH_DIR=where)
    rc, out, err, _ = run_timed([bench, "--benchmark_filter=^bm_model_files/threads:1/",
                                 "--benchmark_min_time=0.001"], env=env)
    if rc != 0 or not os.path.isfile(os.path.join(where, "manifest.json")):
        raise CompareError(f"{bench} did not write the dataset {where} (exit {rc}): {err.strip()[-400:]}")


def entry_path(dataset, name):
    for cand in (name, name + ".npz", name + ".safetensors"):
        p = os.path.join(dataset, cand)
        if os.path.exists(p):
            return p
    raise CompareError(f"{dataset}: entry {name} not found")


def per_layer(value, layer, field, source):
    v = value[layer] if isinstance(value, list) else value
    if not isinstance(v, int) or v < 1:
        raise CompareError(f"{source}: {field}[{layer}]: not an integer >= 1 (value {v!r})")
    return v


def subset_capture(dataset, n_heads, where):
    """A capture of the first n_heads query heads of layer 0 of `dataset`: its
    manifest with capture.heads, the entries linked (not copied)."""
    src = os.path.join(dataset, "manifest.json")
    try:
        with open(src, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise CompareError(f"{src}: cannot read the manifest ({e})") from e
    nq = per_layer(m.get("n_q_heads"), 0, "n_q_heads", src)
    nkv = per_layer(m.get("n_kv_heads"), 0, "n_kv_heads", src)
    if n_heads > nq:
        raise CompareError(f"{src}: layer 0 has {nq} query heads, fewer than --heads {n_heads}")
    if m.get("head_dim") != 128 or m.get("buckets", {}).get("scheme") != "uniform":
        print(f"toolkit comparison: note: {src} is not thesis-shaped (head_dim {m.get('head_dim')}, "
              f"buckets {m.get('buckets')})", file=sys.stderr)
    group = nq // nkv
    heads = [(0, h, h // group) for h in range(n_heads)]
    cap = m.get("capture") if isinstance(m.get("capture"), dict) else {}
    for k in ("head_count", "head_seed", "eligibility"):
        cap.pop(k, None)
    cap["heads"] = [[layer, q] for layer, q, _ in heads]
    m["capture"] = cap
    os.makedirs(where)
    with open(os.path.join(where, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(m, f, indent=2)
    for name in sorted({f"l00h{q:02d}q" for _, q, _ in heads} | {f"l00h{k:02d}k" for _, _, k in heads}):
        p = entry_path(dataset, name)
        os.symlink(os.path.abspath(p), os.path.join(where, os.path.basename(p)))
    return heads


def run_toolkit(python, root, capture, heads, work):
    env = dict(os.environ, **ONE_THREAD)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [python, os.path.abspath(__file__), "--worker", root, capture, json.dumps(heads), work]
    rc, out, err, cpu = run_timed(cmd, env=env)
    if rc != 0:
        raise CompareError(f"the toolkit's pipeline failed (exit {rc}):\n{err.strip()[-2000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise CompareError(f"the toolkit worker printed no result:\n{out[-1000:]}{err[-1000:]}")
    res = json.loads(lines[-1])
    res["process_cpu_s"] = cpu
    return res


def qkgeom_mean_ap(out_dir):
    """Mean head-level plasticity in qkgeom's head_metrics.csv (a sanity line)."""
    import csv
    try:
        with open(os.path.join(out_dir, "head_metrics.csv"), newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None, 0
    col = next((c for c in ("ap_overall", "ap_head", "ap") if rows and c in rows[0]), None)
    vals = []
    for r in rows:
        try:
            v = float(r[col]) if col else float("nan")
        except ValueError:
            v = float("nan")
        if v == v:
            vals.append(v)
    return (sum(vals) / len(vals) if vals else None), len(rows)


def run_qkgeom(qkgeom, capture, work, repeat, n_heads):
    cpus = []
    out = os.path.join(work, "qkgeom_out")
    for i in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        rc, _, err, cpu = run_timed([qkgeom, "analyze", capture, "-o", out, "-j", "1", "--quiet"],
                                    env=dict(os.environ, **ONE_THREAD))
        if rc != 0:
            raise CompareError(f"{qkgeom} analyze {capture} failed (exit {rc}): {err.strip()[-1000:]}")
        cpus.append(cpu)
    ap, rows = qkgeom_mean_ap(out)
    if rows != n_heads:
        raise CompareError(f"{out}/head_metrics.csv has {rows} heads, expected {n_heads}")
    return statistics.median(cpus), cpus, ap


def find_program(explicit, build_dir, rel):
    if explicit:
        return explicit
    return os.path.join(build_dir, rel) if build_dir else None


def report(res, n_heads, rev, q_cpu, q_runs, q_ap, shape):
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            load = f.read().split()[:3]
    except OSError:
        load = ["?"]
    pipe = sum(h["cpu_s"] for h in res["heads"])
    tk = pipe / n_heads
    qk = q_cpu / n_heads
    ratio = tk / qk if qk > 0 else float("inf")
    aps = [h["ap_overall"] for h in res["heads"] if h["ap_overall"] == h["ap_overall"]]
    cells = sum(h["cells"] for h in res["heads"])
    print(f"toolkit comparison: {n_heads} heads of {shape}; one thread; load average {' '.join(load)}")
    print(f"  toolkit attention-plasticity@{rev} (defaults: {res['pairs_per_cell']} sampled pairs per cell): "
          f"{tk:.3f} CPU s/head (analyze_head; whole process {res['process_cpu_s'] / n_heads:.3f} s/head "
          f"with interpreter start and imports), {cells} cells, mean ap_overall "
          f"{(sum(aps) / len(aps)) if aps else float('nan'):.4f}")
    print(f"  qkgeom analyze -j 1 (defaults: exact pairs, full analysis, reports and pictures): "
          f"{qk:.4f} CPU s/head (whole process, median of {len(q_runs)}: "
          f"{', '.join(f'{c:.2f}' for c in q_runs)} s), mean plasticity {q_ap if q_ap is not None else float('nan'):.4f}")
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(f"  ratio toolkit / qkgeom: {ratio:.1f}x less CPU per head (target >= {TARGET:.0f}x: {verdict})")
    return ratio


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toolkit", default=os.environ.get("QKGEOM_TOOLKIT_DIR", ""),
                    help="checkout of viktor-shcherb/attention-plasticity (env QKGEOM_TOOLKIT_DIR)")
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(here), "build-bench"),
                    help="build directory holding app/qkgeom and benchmarks/qkgeom_bench (build-bench)")
    ap.add_argument("--qkgeom", help="the qkgeom program (default BUILD/app/qkgeom)")
    ap.add_argument("--bench", help="qkgeom_bench, writes the dataset when --dataset is not given")
    ap.add_argument("--dataset", help="a qkgeom dataset shaped like the benchmark workload "
                                      "(scripts/bench.sh passes its own)")
    ap.add_argument("--heads", type=int, default=8, help="query heads of layer 0 analysed (8)")
    ap.add_argument("--repeat", type=int, default=3, help="qkgeom runs, median reported (3)")
    ap.add_argument("--python", default=os.environ.get("QKGEOM_TOOLKIT_PYTHON", sys.executable),
                    help="interpreter for the toolkit (env QKGEOM_TOOLKIT_PYTHON; default this one)")
    ap.add_argument("--keep", help="keep the capture and outputs in this new directory")
    args = ap.parse_args(argv)

    if not args.toolkit:
        print(SKIP_LINE)
        return 0
    try:
        if args.heads < 1 or args.repeat < 1:
            raise CompareError(f"--heads and --repeat must be >= 1 (values {args.heads}, {args.repeat})")
        root = toolkit_root(args.toolkit)
        check_python(args.python)
        qkgeom = find_program(args.qkgeom, args.build_dir, os.path.join("app", "qkgeom"))
        if not qkgeom or not os.access(qkgeom, os.X_OK):
            raise CompareError(f"the qkgeom program {qkgeom} is not built "
                               "(cmake --build BUILD --target qkgeom_cli, or pass --qkgeom)")
        work = args.keep or tempfile.mkdtemp(prefix="qkgeom-toolkit.")
        if args.keep:
            os.makedirs(work)
        try:
            dataset = args.dataset
            if not dataset:
                dataset = os.path.join(work, "dataset")
                write_bench_dataset(find_program(args.bench, args.build_dir,
                                                 os.path.join("benchmarks", "qkgeom_bench")), dataset)
            capture = os.path.join(work, "capture")
            heads = subset_capture(dataset, args.heads, capture)
            res = run_toolkit(args.python, root, capture, heads, work)
            q_cpu, q_runs, q_ap = run_qkgeom(qkgeom, capture, work, args.repeat, args.heads)
            report(res, args.heads, toolkit_revision(root), q_cpu, q_runs, q_ap, res["shape"])
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    except CompareError as e:
        print(f"toolkit comparison: FAILED — {e}", file=sys.stderr)
        return 1
    return 0


# --- the worker: the toolkit's own per-head pipeline -------------------------

def _read_entry(capture, name):
    """The rows of one entry (npy directory or .npz) as numpy arrays."""
    import numpy as np

    def fix(a):
        if a.dtype.kind == "V" and a.dtype.itemsize == 2:  # bf16 as written by qkgeom
            return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return a

    d = os.path.join(capture, name)
    if os.path.isdir(d):
        cols = {k: np.load(os.path.join(d, k + ".npy")) for k in ("vectors", "position", "bucket", "example_id")}
    elif os.path.isfile(d + ".npz"):
        with np.load(d + ".npz") as z:
            cols = {k: z[k] for k in ("vectors", "position", "bucket", "example_id")}
    else:
        raise SystemExit(f"toolkit worker: {d}: only the npy and npz forms are read here")
    cols["vectors"] = fix(cols["vectors"])
    return cols


class _Rows:
    """What datasets.load_dataset(...) gives the toolkit: an object with to_pandas()."""

    def __init__(self, cols):
        self.cols = cols

    def to_pandas(self):
        import pandas as pd
        c = self.cols
        return pd.DataFrame({"bucket": c["bucket"], "position": c["position"],
                             "vector": list(c["vectors"]), "example_id": c["example_id"]})


def worker(root, capture, heads_json, work):
    import types
    marker_root = os.path.join(work, "toolkit_root")

    def load_dataset(_fmt, data_files, split="train"):
        return _Rows(_read_entry(capture, os.path.basename(os.path.dirname(data_files))))

    # The toolkit reads parquet through Hugging Face `datasets` (and hf_hub for
    # remote files): replaced by the loader above (local rows only).
    sys.modules["datasets"] = types.ModuleType("datasets")
    sys.modules["datasets"].load_dataset = load_dataset
    hub = types.ModuleType("huggingface_hub")
    hub.hf_hub_url = lambda **kw: (_ for _ in ()).throw(RuntimeError("remote datasets are not used here"))
    sys.modules["huggingface_hub"] = hub
    sys.path.insert(0, root)
    from attention_plasticity import head_analysis, plasticity
    from attention_plasticity.config import RunnerConfig
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)

    heads = json.loads(heads_json)
    for layer, q, k in heads:
        for name in (f"l{layer:02d}h{q:02d}q", f"l{layer:02d}h{k:02d}k"):
            os.makedirs(os.path.join(marker_root, "bench", name), exist_ok=True)
            open(os.path.join(marker_root, "bench", name, "data.parquet"), "w").close()
    cfg = RunnerConfig(model_dir="bench", num_layers=1, num_q_heads=len(heads), num_k_heads=1,
                       dataset_local_root=marker_root)
    kwargs = cfg.task_kwargs()
    out = []
    shape = None
    for layer, q, k in heads:
        t0 = time.process_time()
        row, bucket_rows, _ = head_analysis.analyze_head(layer=layer, q_head=q, k_head=k, **kwargs)
        cpu = time.process_time() - t0
        out.append({"head": [layer, q, k], "cpu_s": cpu, "ap_overall": float(row["ap_overall"]),
                    "cells": sum(1 for r in bucket_rows if r["ap_bucket"] == r["ap_bucket"])})
        shape = (f"d = {row['d_model']}, {row['n_q_tokens']} query + {row['n_k_tokens']} key rows")
    nb = len(set(int(b) for b in _read_entry(capture, f"l00h{heads[0][1]:02d}q")["bucket"]))
    print(json.dumps({"heads": out, "pairs_per_cell": plasticity.NUM_PAIRS_PER_BUCKET,
                      "shape": f"{shape} (head {heads[0][1]}), {nb} buckets"}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        sys.exit(worker(*sys.argv[2:]))
    sys.exit(main())
