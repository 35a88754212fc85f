"""Build of the Python package qkgeom (python/qkgeom + the extension qkgeom._qkgeom).

    pip install --no-build-isolation .        (scripts/install-python.sh does this; docs/python.md)

Built with Debian's setuptools, wheel and pybind11 (python3-setuptools, python3-wheel,
python3-pybind11, pybind11-dev); needs the Eigen 3.4 headers (libeigen3-dev; EIGEN3_INCLUDE_DIR
overrides) and uses zlib when its header is found (zlib1g-dev; QKGEOM_WITH_ZLIB=0 turns it off),
as the CMake build does. The version is the CMake project's (CMakeLists.txt). The translation units
compile in parallel (QKGEOM_BUILD_JOBS, default: every core).
"""

import os
import re
import subprocess
import sys
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def cmake_version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*qkgeom\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", f.read())
    if not m:
        sys.exit("setup.py: no 'project(qkgeom VERSION x.y.z' in CMakeLists.txt")
    return m.group(1)


def eigen_include():
    candidates = [os.environ.get("EIGEN3_INCLUDE_DIR", "")]
    try:
        flags = subprocess.run(["pkg-config", "--cflags-only-I", "eigen3"], capture_output=True, text=True).stdout
        candidates += [f[2:] for f in flags.split() if f.startswith("-I")]
    except OSError:
        pass
    candidates += ["/usr/include/eigen3", "/usr/local/include/eigen3"]
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "Eigen", "Core")):
            return c
    sys.exit("setup.py: the Eigen 3.4 headers were not found (Debian: libeigen3-dev); set EIGEN3_INCLUDE_DIR")


def with_zlib():
    if os.environ.get("QKGEOM_WITH_ZLIB", "1") == "0":
        return False
    return any(os.path.exists(os.path.join(d, "zlib.h")) for d in ("/usr/include", "/usr/local/include"))


def unity_sources(batch=6):
    """The bindings in batches of `batch` files, one translation unit each (as the CMake build
    compiles them, docs/building.md "Build budget"); QKGEOM_UNITY_BUILD=0 compiles file by file."""
    files = sorted(glob("python/src/*.cpp"))
    if os.environ.get("QKGEOM_UNITY_BUILD", "1") == "0":
        return files
    out_dir = os.path.join("build-python", "unity")
    os.makedirs(out_dir, exist_ok=True)
    units = []
    for i in range(0, len(files), batch):
        unit = os.path.join(out_dir, f"bindings_{i // batch}.cpp")
        text = "".join(f'#include "{os.path.abspath(f)}"\n' for f in files[i:i + batch])
        if not os.path.exists(unit) or open(unit).read() != text:
            with open(unit, "w") as fh:
                fh.write(text)
        units.append(unit)
    return units


version = cmake_version()
zlib = with_zlib()
ext = Pybind11Extension(
    "qkgeom._qkgeom",
    # The bindings and the compiled part (src/qkgeom_compiled.cpp: the SIMD kernels and the engines,
    # once), as the CMake build links qkgeom::compiled (docs/building.md "Compile model").
    unity_sources() + ["src/qkgeom_compiled.cpp"],
    include_dirs=["include", eigen_include()],
    define_macros=[("QKGEOM_PY_VERSION", f'"{version}"'), ("QKGEOM_COMPILED", "1")] + ([("QKGEOM_HAVE_ZLIB", "1")] if zlib else []),
    libraries=["z"] if zlib else [],
    extra_compile_args=["-g0"],  # no debug information: a 5 MB module instead of 60 MB
    cxx_std=20,
)

ParallelCompile("QKGEOM_BUILD_JOBS", default=0).install()
setup(
    version=version,
    packages=find_packages(where="python"),
    package_dir={"": "python"},
    ext_modules=[ext],
    options={"build": {"build_base": "build-python"}},  # not build/: that is a CMake build folder
    zip_safe=False,
)
