#!/usr/bin/env bash
# The main job: installs the dependencies, builds the qkgeom program and runs
# `qkgeom demo` on the embedded synthetic study.
#   scripts/demo.sh [OUT_DIR] [qkgeom demo options...]
# The report lands in OUT_DIR (default: out/demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh
OUT="${1:-out/demo}"
shift || true
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DQKGEOM_BUILD_TESTS=OFF -DQKGEOM_BUILD_EXAMPLES=OFF -DQKGEOM_BUILD_PROGRAM=ON >/dev/null
cmake --build build-release -j "$(nproc)" --target qkgeom_cli
build-release/app/qkgeom demo -o "$OUT" "$@"
