#!/usr/bin/env bash
# Builds qkgeom's tests, examples and program and runs them with CTest.
#   scripts/test.sh [BUILD_DIR] [extra cmake args...]
# Environment:
#   CXX              the compiler (default: c++, g++ 12 on Debian bookworm)
#   BUILD_TYPE       CMake build type (default Release)
#   QKGEOM_OPT_FLAGS the flags of that build type (default "-O2 -DNDEBUG": no
#                    debug information, which costs a quarter of the build time)
#   QKGEOM_SANITIZE  sanitizers, e.g. address,undefined
#   QKGEOM_WERROR=1  warnings are errors (set by CI)
#   QKGEOM_CTEST_ARGS extra ctest arguments (e.g. -E 'pattern')
#   QKGEOM_CTEST_SKIP_LABEL the labels of tests left out (default ^(scale|notebook)$:
#                    the runs across processes, scale.mpi.* and python.capture.*sharded,
#                    which .ci/run runs in step 3, and the example notebook, which step 2
#                    runs against the installed package; set it empty to run them here too)
#   JOBS             parallelism (default: every core)
# Prints the build and test times at the end (docs/building.md, "Build budget").
# The header tests (every public header compiled alone, header.*) are off here
# to fit the budget; CI's clang++ build runs them (.ci/run, step 4). Add
# -DQKGEOM_TEST_HEADERS=ON to run them with this compiler.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh tests

BUILD_DIR="${1:-build}"
shift || true
JOBS="${JOBS:-$(nproc)}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
OPT_FLAGS="${QKGEOM_OPT_FLAGS:--O2 -DNDEBUG}"
type_upper=$(echo "$BUILD_TYPE" | tr '[:lower:]' '[:upper:]')
args=(-DCMAKE_BUILD_TYPE="$BUILD_TYPE" "-DCMAKE_CXX_FLAGS_${type_upper}=${OPT_FLAGS}"
      -DQKGEOM_BUILD_TESTS=ON -DQKGEOM_BUILD_EXAMPLES=ON -DQKGEOM_TEST_HEADERS=OFF -DQKGEOM_WITH_MPI=ON)
[ -n "${QKGEOM_SANITIZE:-}" ] && args+=(-DQKGEOM_SANITIZE="${QKGEOM_SANITIZE}")
[ "${QKGEOM_WERROR:-0}" = "1" ] && args+=(-DQKGEOM_WARNINGS_AS_ERRORS=ON)
generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then generator=(-G Ninja); fi

t0=$(date +%s)
cmake -S . -B "$BUILD_DIR" "${generator[@]}" "${args[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
t1=$(date +%s)
# shellcheck disable=SC2086  # QKGEOM_CTEST_ARGS is a list of words
skip=()
skip_label="${QKGEOM_CTEST_SKIP_LABEL-^(scale|notebook)\$}"
[ -n "$skip_label" ] && skip=(-LE "$skip_label")
ctest --test-dir "$BUILD_DIR" -j "$JOBS" --output-on-failure "${skip[@]}" ${QKGEOM_CTEST_ARGS:-}
t2=$(date +%s)
echo "test.sh: build $((t1 - t0)) s, tests $((t2 - t1)) s (${BUILD_DIR}, ${JOBS} jobs; budget: 12 min in all on 2 cores, docs/building.md)"
