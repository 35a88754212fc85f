#!/usr/bin/env bash
# Installs qkgeom's dependencies from Debian packages. Idempotent: does nothing
# when every package of the group is already installed.
#   scripts/install-deps.sh [program|tests]
#   program  what the qkgeom program needs (scripts/demo.sh, the main job):
#            a compiler, CMake, Eigen, zlib
#   tests    (default) everything the tests, examples and benchmarks use
#            (scripts/test.sh, .ci/run)
set -euo pipefail
GROUP="${1:-tests}"

PROGRAM_PACKAGES=(
  build-essential cmake pkg-config g++
  libeigen3-dev                 # Eigen 3.4 (core)
  zlib1g-dev                    # zlib: deflate-compressed .npz entries (io/npz.hpp)
)
TEST_PACKAGES=(
  "${PROGRAM_PACKAGES[@]}"
  ninja-build                   # Ninja (scripts/test.sh uses it when present: .ninja_log has the time of every step)
  clang                         # clang++ 14 (sanitizer build)
  libboost-dev                  # Boost 1.74 headers, tests only: Boost.Multiprecision references (the library needs no Boost)
  librange-v3-dev               # range-v3 0.12 (adapter tests)
  libxtensor-dev libxtensor-blas-dev  # xtensor 0.24 + xtensor-blas (adapter)
  catch2                        # Catch2 2.13 (tests)
  libbenchmark-dev              # Google Benchmark (benchmarks)
  python3-numpy                 # cross-checks of .npy/.npz against NumPy itself (tests)
  python3-dev pybind11-dev python3-pybind11  # the Python package's extension (python/, issue 15)
  python3-pandas                # qkgeom.frames: results as DataFrames (tests)
  python3-torch                 # the Python capture and the trained tiny model (tests)
  python3-matplotlib python3-nbclient python3-nbformat python3-ipykernel  # the example notebook, run by the tests
  libtorch-dev                  # LibTorch 1.13 CPU (adapters/torch, qkgeom::torch)
  chromium                      # headless render of the HTML report (one test)
  time                          # /usr/bin/time -v: peak memory in scripts/bench.sh
  libopenmpi-dev openmpi-bin    # Open MPI: the program under mpirun (QKGEOM_WITH_MPI, docs/scale.md; tests scale.mpi.*)
  pmccabe                       # function lengths (scripts/function_lengths.sh, CTest lint.function_lengths)
)

case "$GROUP" in
  program) PACKAGES=("${PROGRAM_PACKAGES[@]}") ;;
  tests) PACKAGES=("${TEST_PACKAGES[@]}") ;;
  *) echo "install-deps: unknown group '$GROUP' (program or tests)" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages of the $GROUP group present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
