#!/usr/bin/env bash
# Installs every build/test dependency of qkgeom from Debian packages.
# Idempotent: does nothing when all packages are already installed.
# Used by both README commands (scripts/test.sh, and the main job later).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  g++ clang                     # g++ 12 (default build), clang++ 14 (sanitizer build)
  libeigen3-dev                 # Eigen 3.4 (core)
  libboost-dev                  # Boost 1.74 headers, tests only: Boost.Multiprecision references (the library needs no Boost)
  librange-v3-dev               # range-v3 0.12 (adapter tests)
  libxtensor-dev libxtensor-blas-dev  # xtensor 0.24 + xtensor-blas (adapter)
  catch2                        # Catch2 2.13 (tests)
  libbenchmark-dev              # Google Benchmark (benchmarks)
  zlib1g-dev                    # zlib: deflate-compressed .npz entries (io/npz.hpp)
  python3-numpy                 # cross-checks of .npy/.npz against NumPy itself (tests)
  python3-dev pybind11-dev python3-pybind11  # the Python package's extension (python/, issue 15)
  python3-pandas                # qkgeom.frames: results as DataFrames (tests)
  python3-torch                 # the Python capture and the trained tiny model (tests)
  python3-matplotlib python3-nbclient python3-nbformat python3-ipykernel  # the example notebook, run by the tests
  libtorch-dev                  # LibTorch 1.13 CPU (adapters/torch, qkgeom::torch)
  chromium                      # headless render of the HTML report (one test)
  time                          # /usr/bin/time -v: peak memory in scripts/bench.sh
  pmccabe                       # function lengths (scripts/function_lengths.sh, CTest lint.function_lengths)
)

missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
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
