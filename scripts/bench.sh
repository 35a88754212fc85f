#!/usr/bin/env bash
# qkgeom benchmarks: configure a Release build with the benchmarks, run them
# with JSON output and print the ratio table of docs/performance.md.
#
#   scripts/bench.sh [--quick] [--native] [--no-cli] [--build-dir DIR] [--toolkit DIR] [-- extra benchmark flags]
#
#   --quick      a 2-layer model (24 heads) instead of 300 heads, no 64K dense case,
#                4 heads in the toolkit comparison
#   --native     also compile the benchmarks with -march=native (QKGEOM_BENCH_NATIVE)
#   --no-cli     skip the peak-memory run of `qkgeom analyze` (/usr/bin/time -v)
#   --no-build   use the binaries already built in the build directory
#   --toolkit DIR  a checkout of viktor-shcherb/attention-plasticity (or set
#                QKGEOM_TOOLKIT_DIR): CPU per head against `qkgeom analyze -j 1`
#                (benchmarks/toolkit_compare.py, docs/benchmarks-toolkit.md);
#                without it that step prints SKIPPED. QKGEOM_TOOLKIT_PYTHON: the
#                interpreter with the toolkit's numpy/scipy/pandas/pyyaml.
#
# After the table: the LibTorch benchmarks (qkgeom_bench_torch, built where
# LibTorch is found; CUDA cases print "no CUDA device: skipped" without a GPU)
# and the toolkit comparison.
# Output: DIR/bench.json (raw Google Benchmark JSON), DIR/bench_torch.json and
# the table on stdout.
# Timings are only meaningful on an otherwise idle machine: the script prints
# the load average before it starts and the table repeats it.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$here/build-bench"
quick=0
native=OFF
cli=1
build_it=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --native) native=ON ;;
    --no-cli) cli=0 ;;
    --no-build) build_it=0 ;;
    --build-dir) build="$2"; shift ;;
    --toolkit) export QKGEOM_TOOLKIT_DIR="$2"; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

jobs="$(nproc 2>/dev/null || echo 2)"
if [ "$build_it" = 1 ]; then
  cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQKGEOM_BUILD_BENCHMARKS=ON \
    -DQKGEOM_BUILD_EXAMPLES=ON -DQKGEOM_BENCH_NATIVE="$native" >/dev/null
  targets=(qkgeom_bench qkgeom_cli)
  if [ "$(cat "$build/benchmarks/qkgeom_bench_torch.enabled" 2>/dev/null)" = ON ]; then
    targets+=(qkgeom_bench_torch)
  fi
  cmake --build "$build" -j"$jobs" --target "${targets[@]}"
fi

filter='.'
if [ "$quick" = 1 ]; then
  export QKGEOM_BENCH_LAYERS=2
  filter='-keys:65536'
fi
data="$(mktemp -d "${TMPDIR:-/tmp}/qkgeom-bench.XXXXXX")"
trap 'rm -rf "$data"' EXIT
export QKGEOM_BENCH_DIR="$data/dataset"   # the 300-head dataset, kept for the CLI run

echo "bench.sh: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
args=(--benchmark_format=console --benchmark_out="$build/bench.json" --benchmark_out_format=json)
if [ "$quick" = 1 ]; then args+=("--benchmark_filter=$filter"); fi
# The benchmarks run under the program's allocator settings (app/main.cpp,
# keep_freed_pages: freed head buffers stay in the heap). Without them glibc's
# dynamic mmap threshold decides, run by run, whether every head's buffers are
# faulted in afresh: bm_head_analyze_beyond/beyond:0 read 32 or 99 ms per head.
kept="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}$kept" "$build/benchmarks/qkgeom_bench" "${args[@]}" "${extra[@]}"

rss=()
if [ "$cli" = 1 ] && [ -x /usr/bin/time ] && [ -f "$QKGEOM_BENCH_DIR/manifest.json" ]; then
  /usr/bin/time -v "$build/app/qkgeom" analyze "$QKGEOM_BENCH_DIR" -o "$data/out" -j "$jobs" --quiet \
    >/dev/null 2>"$data/time.txt" || { cat "$data/time.txt" >&2; exit 1; }
  kb="$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$data/time.txt")"
  wall="$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): *//p' "$data/time.txt")"
  echo "bench.sh: qkgeom analyze -j $jobs: peak RSS $kb kB, wall $wall" >&2
  rss=(--peak-rss-kb "$kb")
elif [ "$cli" = 1 ]; then
  echo "bench.sh: peak memory not measured (needs /usr/bin/time: apt-get install time)" >&2
fi
python3 "$here/benchmarks/summarise.py" "$build/bench.json" "${rss[@]}"

# The LibTorch adapter on its devices: GEMM rate, device moments, Gram
# plasticity (benchmarks/bench_torch.cpp). Without CUDA the CUDA cases say so.
torch_bench="$build/benchmarks/qkgeom_bench_torch"
if [ -x "$torch_bench" ]; then
  echo
  echo "LibTorch adapter (qkgeom_bench_torch; ratios to the same device's torch::mm rate):"
  tfilter='.'
  if [ "$quick" = 1 ]; then tfilter='-keys:16384'; fi
  "$torch_bench" --benchmark_format=console --benchmark_out="$build/bench_torch.json" \
    --benchmark_out_format=json "--benchmark_filter=$tfilter" 2>&1 | sed 's/^/  /'
else
  echo
  echo "LibTorch adapter benchmarks: SKIPPED — qkgeom_bench_torch not built (LibTorch not found)"
fi

# Against the thesis toolkit (skipped, visibly, without a checkout of it).
echo
heads=8
if [ "$quick" = 1 ]; then heads=4; fi
tk=(--build-dir "$build" --heads "$heads")
if [ -f "$QKGEOM_BENCH_DIR/manifest.json" ]; then tk+=(--dataset "$QKGEOM_BENCH_DIR"); fi
python3 "$here/benchmarks/toolkit_compare.py" "${tk[@]}"
