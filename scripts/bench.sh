#!/usr/bin/env bash
# qkgeom benchmarks: configure a Release build with the benchmarks, run them
# with JSON output and print the ratio table of docs/performance.md.
#
#   scripts/bench.sh [--quick] [--native] [--no-cli] [--build-dir DIR] [-- extra benchmark flags]
#
#   --quick      a 2-layer model (24 heads) instead of 300 heads, no 64K dense case
#   --native     also compile the benchmarks with -march=native (QKGEOM_BENCH_NATIVE)
#   --no-cli     skip the peak-memory run of `qkgeom analyze` (/usr/bin/time -v)
#   --no-build   use the binaries already built in the build directory
#
# Output: DIR/bench.json (raw Google Benchmark JSON) and the table on stdout.
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
    --) shift; extra=("$@"); break ;;
    *) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

jobs="$(nproc 2>/dev/null || echo 2)"
if [ "$build_it" = 1 ]; then
  cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQKGEOM_BUILD_BENCHMARKS=ON \
    -DQKGEOM_BUILD_EXAMPLES=ON -DQKGEOM_BENCH_NATIVE="$native" >/dev/null
  cmake --build "$build" -j"$jobs" --target qkgeom_bench qkgeom_cli
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
"$build/benchmarks/qkgeom_bench" "${args[@]}" "${extra[@]}"

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
