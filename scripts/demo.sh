#!/usr/bin/env bash
# The main job: installs what the program needs (a compiler, CMake, Eigen,
# zlib: scripts/install-deps.sh program), builds the qkgeom program and runs
# `qkgeom demo` on the embedded synthetic study.
#   scripts/demo.sh [OUT_DIR] [qkgeom demo options...]
# The report lands in OUT_DIR (default: out/demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh program
OUT="${1:-out/demo}"
shift || true
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DQKGEOM_BUILD_TESTS=OFF -DQKGEOM_BUILD_EXAMPLES=OFF \
  -DQKGEOM_BUILD_PROGRAM=ON -DQKGEOM_BUILD_PYTHON=OFF -DQKGEOM_BUILD_TORCH_ADAPTER=OFF >/dev/null
cmake --build build-release -j "$(nproc)" --target qkgeom_cli
build-release/app/qkgeom demo -o "$OUT" "$@"
