#!/usr/bin/env bash
# Function lengths of the library, the program and the Python extension, measured with pmccabe
# (Debian package pmccabe): lists the longest functions and fails when one is
# longer than LIMIT lines (default 150, the project's standard).
#   scripts/function_lengths.sh [LIMIT]
# pmccabe does not parse C++17 nested namespace definitions
# (`namespace qkgeom::io {`) and silently skips such files, so each file is
# measured from a copy in which they are spelled as one name.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
limit="${1:-150}"
command -v pmccabe >/dev/null || { echo "function_lengths: pmccabe not installed (apt-get install pmccabe)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in include/qkgeom/*.hpp include/qkgeom/*/*.hpp app/*.cpp app/*.hpp python/src/*.cpp python/src/*.hpp \
         tests/python/model/*.cpp; do
  [ -f "$f" ] || continue
  sed -E ':a; s/^(namespace [A-Za-z_0-9]*)::([A-Za-z_0-9:]*) \{/\1_\2 {/; ta' "$f" > "$tmp/$(echo "$f" | tr / _)"
done
# pmccabe columns: modified CCN, CCN, statements, first line, lines, file(line): function
report=$(pmccabe "$tmp"/* 2>/dev/null | sort -k5 -n -r | sed "s|$tmp/||")
echo "longest functions (lines, file(line): function):"
echo "$report" | awk 'NR <= 5 { $1 = $2 = $3 = $4 = ""; print }'  # awk reads it all: no SIGPIPE under pipefail
over=$(echo "$report" | awk -v l="$limit" '$5 > l')
if [ -n "$over" ]; then
  echo "function_lengths: functions longer than $limit lines:" >&2
  echo "$over" >&2
  exit 1
fi
echo "function_lengths: every function is at most $limit lines"
