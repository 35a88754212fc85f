"""Benchmarks of the Python path (docs/performance.md#python); not a test.

    python_bench.py --bench BUILD/benchmarks/qkgeom_bench [--layers N] [--repeat R]
                    [--model tests/data/tiny_llama] [--skip-model] [--skip-capture]

Run with PYTHONPATH pointing at the built package (BUILD/python) or with the package
installed. Two measurements, each reported as a ratio within one run:

1. The 300-head model (25 layers x 12 query heads, QKGEOM_BENCH_LAYERS overrides) from dataset
   files, one thread: qkgeom_bench's bm_model_dataset_api/threads:1 (the C++ API
   io::analyze_dataset, what `qkgeom analyze` calls, + summarise_model) against
   qkgeom.analyze_dataset(dir, jobs=1) plus the head_metrics DataFrame, on the same files (the
   benchmark writes them to QKGEOM_BENCH_DIR); also bm_model_files/threads:1, the benchmark's own
   loop (read_capture + analyze_head per head), for reference.
   Target: the Python path within 5 % of the C++ API. --repeat rounds, C++ and Python
   interleaved (a change of load hits both); the best of each, and each round's ratio.
2. The capture overhead per forward pass of the trained tiny Llama (examples/python/tiny_llama.py):
   backbone forward alone, with a Recorder into moments, and with a Recorder into a DatasetWriter
   (every head, every token kept), per forward pass (median of --repeat x 10 passes).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def load_line():
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def cpp_model_files_once(bench: str, data_dir: Path, name: str) -> float:
    env = dict(os.environ, QKGEOM_BENCH_DIR=str(data_dir))
    out = subprocess.run([bench, f"--benchmark_filter=^{name}/threads:1/", "--benchmark_format=json"],
                         env=env, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)["benchmarks"][0]
    return r["real_time"] * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[r["time_unit"]]


def python_model_files_once(qkgeom, data_dir: Path):
    import qkgeom.frames as qf

    t0 = time.perf_counter()
    run = qkgeom.analyze_dataset(data_dir, qkgeom.Options(), jobs=1)
    df = qf.head_metrics_frame(run.heads)
    t = time.perf_counter() - t0
    if run.failures:
        raise SystemExit(f"python_bench: {len(run.failures)} heads failed: {run.failures[:3]}")
    return t, len(df)


def model_files(qkgeom, bench: str, data_dir: Path, repeat: int):
    """C++ and Python interleaved (API, hand loop, Python, API, ...): a load change hits all; best of each."""
    api, loop, py, n = [], [], [], 0
    for _ in range(repeat):
        api.append(cpp_model_files_once(bench, data_dir, "bm_model_dataset_api"))
        loop.append(cpp_model_files_once(bench, data_dir, "bm_model_files"))
        t, n = python_model_files_once(qkgeom, data_dir)
        py.append(t)
    return min(api), min(loop), min(py), n, [p / c for c, p in zip(api, py)]


def capture_overhead(qkgeom, model_dir: Path, repeat: int):
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "python"))
    import tiny_llama as tl
    from qkgeom.capture import manifest_for

    torch.set_num_threads(1)
    model = tl.load_model(model_dir)
    cfg = model.cfg
    B, T = 8, cfg.context_length
    rng = np.random.default_rng(1)
    tokens = torch.from_numpy(tl.synthetic_batch(rng, B, T, cfg.vocab_size))
    positions = torch.arange(T).expand(B, -1)
    layout = qkgeom.ModelLayout(cfg.head_dim, [cfg.n_heads] * cfg.n_layers, [cfg.n_kv_heads] * cfg.n_layers)
    spec = qkgeom.BucketSpec("uniform", 32, 1.0)

    def timed(make_recorder):
        times = []
        with torch.no_grad():
            for _ in range(repeat):
                rec, cleanup = make_recorder()
                for _ in range(10):
                    t0 = time.perf_counter()
                    if rec is None:
                        model.backbone(tokens, positions)
                    else:
                        with rec.patch(tl, "apply_rotary_pos_emb"):
                            rec.set_batch(positions)
                            model.backbone(tokens, positions)
                    times.append(time.perf_counter() - t0)
                cleanup(rec)
        return statistics.median(times)

    tmp = Path(tempfile.mkdtemp(prefix="qkgeom-capbench-"))
    counter = {"i": 0}

    def none():
        return None, lambda r: None

    def moments():
        return qkgeom.Recorder(layout, buckets=spec, sink="moments", context_length=T), lambda r: r.moments()

    def dataset():
        counter["i"] += 1
        d = tmp / f"run{counter['i']}"
        w = qkgeom.DatasetWriter(d, manifest_for(layout, model="tiny-llama", buckets=spec, context_length=T))
        return qkgeom.Recorder(layout, buckets=spec, sink=w, context_length=T), lambda r: r.close()

    base = timed(none)
    with_m = timed(moments)
    with_d = timed(dataset)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return B, T, base, with_m, with_d


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", help="the qkgeom_bench binary (Release build)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_llama"))
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--skip-capture", action="store_true")
    a = ap.parse_args()
    import qkgeom

    print(f"python_bench: qkgeom {qkgeom.__version__} from {qkgeom.__file__}; load average {load_line()}")
    if not a.skip_model:
        if not a.bench:
            raise SystemExit("python_bench: --bench BUILD/benchmarks/qkgeom_bench is needed (or --skip-model)")
        with tempfile.TemporaryDirectory(prefix="qkgeom-pybench-") as d:
            data = Path(d) / "dataset"
            api, loop, py, n, rounds = model_files(qkgeom, a.bench, data, a.repeat)
        print(f"  model from files, 1 thread ({n} heads), best of {a.repeat} interleaved: C++ API "
              f"(io::analyze_dataset) {api:.3f} s, Python {py:.3f} s: Python / C++ API = {py / api:.3f} "
              f"(target <= 1.05; per round " + ", ".join(f"{r:.3f}" for r in rounds) + ")")
        print(f"  the benchmark's own loop (bm_model_files: read_capture + analyze_head per head) {loop:.3f} s: "
              f"C++ API / own loop = {api / loop:.3f}, Python / own loop = {py / loop:.3f}")
    if not a.skip_capture:
        B, T, base, m, dset = capture_overhead(qkgeom, Path(a.model), a.repeat)
        print(f"  tiny Llama forward, batch {B} x {T} tokens, 1 thread: {base * 1e3:.1f} ms; "
              f"with Recorder -> moments {m * 1e3:.1f} ms ({m / base:.2f}x), "
              f"-> DatasetWriter {dset * 1e3:.1f} ms ({dset / base:.2f}x)")
    print(f"python_bench: load average after {load_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
