#!/usr/bin/env bash
# THE install command of the Python package qkgeom (README, docs/python.md):
#
#   scripts/install-python.sh
#
# 1. installs the Debian packages it needs (python3-dev, python3-numpy, python3-pandas,
#    pybind11-dev, python3-pybind11, python3-pip, python3-setuptools, python3-wheel, and the
#    library's libeigen3-dev, zlib1g-dev, g++), with sudo when not root;
# 2. builds and installs the package with Debian's build tools, no download:
#      pip install --no-build-isolation --no-deps .
#    into the active virtual environment when VIRTUAL_ENV is set (make it with
#    `python3 -m venv --system-site-packages DIR` so Debian's NumPy/pandas/torch are visible),
#    else into /usr/local (/usr/local/lib/python3.X/dist-packages, Debian's place for local
#    packages; Debian's pip needs --break-system-packages for that, PEP 668);
# 3. imports it from another folder and prints its version.
# QKGEOM_BUILD_JOBS sets the parallel compile jobs (default: every core).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

PACKAGES=(python3-dev python3-numpy python3-pandas pybind11-dev python3-pybind11 python3-pip python3-setuptools
          python3-wheel libeigen3-dev zlib1g-dev g++)
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "install-python: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-python: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
  echo "install-python: into the virtual environment $VIRTUAL_ENV"
  (cd "$ROOT" && "$PY" -m pip install --no-build-isolation --no-deps .)
else
  PY=/usr/bin/python3
  echo "install-python: into /usr/local (Debian's pip: --break-system-packages)"
  (cd "$ROOT" && $SUDO "$PY" -m pip install --no-build-isolation --no-deps --break-system-packages .)
fi
cd /
"$PY" -c "import qkgeom; print('install-python: qkgeom', qkgeom.__version__, 'from', qkgeom.__file__)"
