#!/usr/bin/env bash
# Builds qkgeom's tests and examples and runs them with CTest.
#   scripts/test.sh [BUILD_DIR] [extra cmake args...]
# Environment: CXX (compiler), QKGEOM_SANITIZE (e.g. address,undefined),
# QKGEOM_WERROR=1 (warnings are errors; set by CI), JOBS (parallelism).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

BUILD_DIR="${1:-build}"
shift || true
JOBS="${JOBS:-$(nproc)}"
args=(-DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DQKGEOM_BUILD_TESTS=ON -DQKGEOM_BUILD_EXAMPLES=ON
      -DQKGEOM_BUILD_BENCHMARKS=ON)
[ -n "${QKGEOM_SANITIZE:-}" ] && args+=(-DQKGEOM_SANITIZE="${QKGEOM_SANITIZE}")
[ "${QKGEOM_WERROR:-0}" = "1" ] && args+=(-DQKGEOM_WARNINGS_AS_ERRORS=ON)

cmake -S . -B "$BUILD_DIR" "${args[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" -j "$JOBS" --output-on-failure
