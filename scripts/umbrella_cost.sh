#!/usr/bin/env bash
# Compile cost of the umbrella header against <Eigen/Dense> (docs/building.md,
# "Build budget"): `CXX -std=c++20 -fsyntax-only`, median of N runs each (CPU
# seconds of the compiler), for
#   <Eigen/Dense>
#   <qkgeom/plasticity.hpp>                    header-only
#   <qkgeom/plasticity.hpp> with QKGEOM_COMPILED  (a program that links qkgeom::compiled)
# and the two ratios. Prints; asserts nothing (the budget is 2x).
#   scripts/umbrella_cost.sh [N]        (default 5; CXX picks the compiler, default g++)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs="${1:-5}"
cxx="${CXX:-g++}"
eigen_inc="${EIGEN3_INCLUDE_DIR:-/usr/include/eigen3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
printf '#include <Eigen/Dense>\n' > "$work/eigen.cpp"
printf '#include <qkgeom/plasticity.hpp>\n' > "$work/umbrella.cpp"

# median CPU seconds (user + system) of `runs` compiles of one file
median_cost() {
    local times=()
    for _ in $(seq "$runs"); do
        local t
        t=$( { TIMEFORMAT='%U %S'; time "$cxx" -std=c++20 -fsyntax-only -Iinclude -isystem "$eigen_inc" "$@" \
                 >/dev/null 2>&1; } 2>&1 )
        times+=("$(echo "$t" | awk '{print $1 + $2}')")
    done
    printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}

# the files must compile (the timed runs discard the compiler's output)
"$cxx" -std=c++20 -fsyntax-only -Iinclude -isystem "$eigen_inc" "$work/umbrella.cpp"
eigen=$(median_cost "$work/eigen.cpp")
header_only=$(median_cost "$work/umbrella.cpp")
compiled=$(median_cost -DQKGEOM_COMPILED=1 "$work/umbrella.cpp")
awk -v e="$eigen" -v h="$header_only" -v c="$compiled" -v n="$runs" -v cxx="$cxx" 'BEGIN {
    printf "umbrella cost (%s -fsyntax-only, median of %d, CPU s): <Eigen/Dense> %.2f, <qkgeom/plasticity.hpp> %.2f (%.2fx), with QKGEOM_COMPILED %.2f (%.2fx); budget 2x\n",
           cxx, n, e, h, h / e, c, c / e }'
