#!/usr/bin/env python3
"""Summarise a qkgeom_bench JSON run (Google Benchmark --benchmark_format=json)
into the ratio table of issue 7 (docs/performance.md). Standard library only.

usage: summarise.py RUN.json [--peak-rss-kb N] [--peak-rss-label TEXT]
"""
import argparse
import json
import math
import sys

UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def load(path):
    with open(path) as f:
        run = json.load(f)
    rows = {}
    for b in run["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        name = b["name"]
        for suffix in ("/real_time", "/iterations:1", "/iterations:3"):
            name = name.replace(suffix, "")
        b["seconds"] = b["real_time"] * UNIT[b.get("time_unit", "ns")]
        rows[name] = b
    return run.get("context", {}), rows


def get(rows, name, field="seconds"):
    b = rows.get(name)
    if b is None or field not in b:
        return None
    return b[field]


def fit_exponent(points):
    """Least-squares slope of log(time) on log(size)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x and y and x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    return sxy / sxx if sxx > 0 else None


def series(rows, prefix, arg):
    out = []
    for name, b in rows.items():
        if name.startswith(prefix + "/" + arg + ":"):
            try:
                x = float(name.split(":")[-1])
            except ValueError:
                continue
            out.append((x, b["seconds"]))
    return sorted(out)


def fmt(v, spec="{:.3g}"):
    return "n/a" if v is None else spec.format(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--peak-rss-kb", type=float, default=None)
    ap.add_argument("--peak-rss-label", default="qkgeom analyze, 300-head model")
    args = ap.parse_args()
    ctx, rows = load(args.json)

    gemm = get(rows, "bm_eigen_gemm/n:512", "GFLOP/s")
    lines = []  # (metric, measured, target, holds)

    def check(metric, value, target_text, ok):
        status = "n/a" if ok is None else ("PASS" if ok else "FAIL")
        lines.append((metric, value, target_text, status))

    # 1. moments vs GEMM
    mom = get(rows, "bm_moments_accumulate/d:128", "GFLOP/s")
    r = mom / gemm if mom and gemm else None
    check("moments (d=128) GFLOP/s / GEMM GFLOP/s", fmt(r, "{:.2f}"), ">= 0.60", None if r is None else r >= 0.60)

    # 1b. moments vs the double-precision FMA peak of the widest level (same run)
    levels = [lv for lv in ("avx512", "avx2", "generic") if get(rows, f"bm_fma_peak/{lv}", "GFLOP/s")]
    widest = levels[0] if levels else None
    peak = get(rows, f"bm_fma_peak/{widest}", "GFLOP/s") if widest else None
    for d in (64, 128):
        m = get(rows, f"bm_moments_accumulate/d:{d}", "GFLOP/s")
        r = m / peak if m and peak else None
        check(f"moments (d={d}) GFLOP/s / FMA peak ({widest or 'widest level'})", fmt(r, "{:.2f}"), ">= 0.50",
              None if r is None else r >= 0.50)

    # 2. dense Gram
    for keys in (4096, 16384, 65536):
        g = get(rows, f"bm_dense_gram/keys:{keys}", "gram_GFLOP/s")
        tg = get(rows, f"bm_dense_gram/keys:{keys}")
        tt = get(rows, f"bm_dense_plasticity/keys:{keys}")
        tn = get(rows, f"bm_dense_plasticity_nosplit/keys:{keys}")
        r = g / gemm if g and gemm else None
        check(f"dense Gram {keys // 1024}K keys: Gram GFLOP/s / GEMM", fmt(r, "{:.2f}"), ">= 0.50",
              None if r is None else r >= 0.50)
        # The Φ pass alone (split off), as the target was set; the split's
        # counterfactual profiles (docs/beyond-split.md) reported beside it.
        phi = (tn - tg) if tn is not None and tg is not None else None
        rr = phi / tg if phi is not None and tg else None
        check(f"dense Gram {keys // 1024}K keys: Φ pass / Gram pass time", fmt(rr, "{:.2f}"), "<= 1.00",
              None if rr is None else rr <= 1.0)
        sp = (tt - tn) / tg if tt is not None and tn is not None and tg else None
        check(f"dense Gram {keys // 1024}K keys: split pass / Gram pass time", fmt(sp, "{:.2f}"), "(report)", None)

    # 3. whole model
    m1 = get(rows, "bm_model_memory/threads:1")
    m2 = get(rows, "bm_model_memory/threads:2")
    mo1 = get(rows, "bm_model_moments/threads:1")
    f1 = get(rows, "bm_model_files/threads:1")
    f2 = get(rows, "bm_model_files/threads:2")
    heads = get(rows, "bm_model_memory/threads:1", "heads")
    base = get(rows, "bm_model_scalar_baseline")
    base_heads = get(rows, "bm_model_scalar_baseline", "heads")
    speedup = (base / base_heads) / (m1 / heads) if base and base_heads and m1 and heads else None
    check("whole model: scalar baseline / library (1 thread, per head)", fmt(speedup, "{:.1f}"), ">= 20",
          None if speedup is None else speedup >= 20)
    r = m1 / mo1 if m1 and mo1 else None
    check("whole model / moments-only pass (1 thread)", fmt(r, "{:.2f}"), "<= 3.0", None if r is None else r <= 3.0)
    r = f1 / m1 if f1 and m1 else None
    check("from page-cached files / from memory (1 thread)", fmt(r, "{:.2f}"), "<= 1.10", None if r is None else r <= 1.1)
    r = f2 / m2 if f2 and m2 else None
    check("from page-cached files / from memory (2 threads)", fmt(r, "{:.2f}"), "<= 1.10", None if r is None else r <= 1.1)
    r = m1 / m2 if m1 and m2 else None
    check("whole model: 1-thread time / 2-thread time", fmt(r, "{:.2f}"), ">= 1.70", None if r is None else r >= 1.7)
    api = get(rows, "bm_model_dataset_api/threads:1")
    study = get(rows, "bm_model_study/runs:10")
    r = study / (10 * api) if study and api else None
    check("study of 10 runs / 10 analyses (1 thread)", fmt(r, "{:.3f}"), "<= 1.05", None if r is None else r <= 1.05)
    b0, b1 = get(rows, "bm_head_analyze_beyond/beyond:0"), get(rows, "bm_head_analyze_beyond/beyond:1")
    r = b1 / b0 if b0 and b1 else None
    check("head with the analyses beyond the thesis / without", fmt(r, "{:.3f}"), "<= 1.20",
          None if r is None else r <= 1.20)
    p0, p1 = get(rows, "bm_head_analyze/prefix:0"), get(rows, "bm_head_analyze/prefix:1")
    r = p1 / p0 if p0 and p1 else None
    check("head under prefix pairs / under same_bucket", fmt(r, "{:.2f}"), "<= 2.0", None if r is None else r <= 2.0)
    r = m1 / heads if m1 and heads else None
    check("whole model, 1 thread: seconds per head (300 heads in 7 s)", fmt(r, "{:.4f}"), "<= 0.0233",
          None if r is None else r <= 7.0 / 300)
    if args.peak_rss_kb is not None:
        gb = args.peak_rss_kb * 1024 / 1e9
        check(f"peak RSS, {args.peak_rss_label} (GB)", fmt(gb, "{:.2f}"), "<= 2.0", gb <= 2.0)
    else:
        check("peak RSS of qkgeom analyze (GB)", "n/a", "<= 2.0", None)

    # 4. scaling exponents
    e = fit_exponent(series(rows, "bm_scale_moments_rows", "rows"))
    check("moments: fitted exponent over rows (1K..1M)", fmt(e, "{:.2f}"), "~1 (linear)",
          None if e is None else abs(e - 1) <= 0.15)
    sd = series(rows, "bm_scale_moments_d", "d")
    e = fit_exponent(sd)
    check("moments: fitted exponent over d (32..256)", fmt(e, "{:.2f}"), "info (n·d + n·d²)", None)
    e = fit_exponent([p for p in sd if p[0] >= 128])
    check("moments: fitted exponent over d (128..256)", fmt(e, "{:.2f}"), "-> 2 (n·d²)",
          None if e is None else abs(e - 2) <= 0.35)
    e = fit_exponent(series(rows, "bm_dense_plasticity", "keys"))
    check("dense pairs: fitted exponent over keys/bucket", fmt(e, "{:.2f}"), "~2 (quadratic)",
          None if e is None else abs(e - 2) <= 0.15)

    w = max(len(l[0]) for l in lines)
    print()
    print("qkgeom benchmark summary")
    print(f"  host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs @ {ctx.get('mhz_per_cpu', '?')} MHz,"
          f" load average at start {ctx.get('load_avg', '?')}, libbenchmark build {ctx.get('library_build_type', '?')}")
    print(f"  qkgeom kernels: instruction-set level {ctx.get('qkgeom_isa', '?')} (runtime dispatch, simd/dispatch.hpp)")
    print("  reference points (same run):")
    print(f"    Eigen GEMM (double, 512³):         {fmt(gemm, '{:.1f}')} GFLOP/s")
    xtx = get(rows, "bm_eigen_gemm_xtx/d:128", "GFLOP/s")
    print(f"    Eigen GEMM XᵀX (8192×128, double): {fmt(xtx, '{:.1f}')} GFLOP/s")
    sr = get(rows, "bm_stream_read/d:128", "bytes_per_second")
    mb = get(rows, "bm_moments_accumulate/d:128", "bytes_per_second")
    print(f"    streaming read (f32):              {fmt(sr and sr / 1e9, '{:.1f}')} GB/s;"
          f" moments input rate {fmt(mb and mb / 1e9, '{:.2f}')} GB/s at {fmt(mom, '{:.1f}')} GFLOP/s")
    for lv in ("generic", "avx2", "avx512"):
        pk = get(rows, f"bm_fma_peak/{lv}", "GFLOP/s")
        m64 = get(rows, f"bm_moments_isa/{lv}/d:64", "GFLOP/s")
        m128 = get(rows, f"bm_moments_isa/{lv}/d:128", "GFLOP/s")
        if pk is not None:
            print(f"    FMA peak {lv:<8s} {pk:7.1f} GFLOP/s; moments d=64 {fmt(m64, '{:.1f}')},"
                  f" d=128 {fmt(m128, '{:.1f}')} GFLOP/s"
                  f" ({fmt(m64 and m64 / pk, '{:.2f}')} / {fmt(m128 and m128 / pk, '{:.2f}')} of that peak)")
    if m1:
        print(f"  whole model ({fmt(heads, '{:.0f}')} heads): 1 thread {m1:.1f} s, 2 threads {fmt(m2, '{:.1f}')} s;"
              f" moments-only {fmt(mo1, '{:.2f}')} s; from files {fmt(f1, '{:.1f}')} s / {fmt(f2, '{:.1f}')} s;"
              f" baseline {fmt(base and base / base_heads, '{:.2f}')} s/head vs {m1 / heads:.3f} s/head")
    for name in ("bm_head_moments", "bm_diagnostics", "bm_plasticity_same_bucket", "bm_plasticity_prefix",
                 "bm_plasticity_same_bucket_no_empirical", "bm_head_analyze/prefix:0", "bm_head_analyze/prefix:1",
                 "bm_head_analyze_generic", "bm_head_analyze_beyond/beyond:0", "bm_head_analyze_beyond/beyond:1",
                 "bm_head_analyze_beyond/beyond:2", "bm_head_analyze_beyond/beyond:3", "bm_head_analyze_beyond/beyond:4"):
        t = get(rows, name)
        if t is not None:
            print(f"    {name:<42s} {t * 1e3:9.1f} ms")
    print()
    print(f"  {'metric':<{w}}  {'measured':>9}  {'target':<14}  holds")
    print(f"  {'-' * w}  {'-' * 9}  {'-' * 14}  -----")
    for metric, value, target, status in lines:
        print(f"  {metric:<{w}}  {value:>9}  {target:<14}  {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
