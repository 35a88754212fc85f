"""Shared helpers of the tests/python drivers (argument parsing, the checker, skipping)."""

import argparse
import os
import shutil
import subprocess
import sys

SKIP = 77  # CTest SKIP_RETURN_CODE


def setup(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--checker", required=True, help="path of qkgeom_py_check")
    ap.add_argument("--scripts", required=True, help="the repository's scripts/ directory")
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    args = ap.parse_args()
    try:
        import numpy  # noqa: F401
    except ImportError:
        print(f"NumPy is not available to {sys.executable}: skipped (install python3-numpy)")
        sys.exit(SKIP)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    sys.path.insert(0, args.scripts)
    return args


def run(checker, *argv, expect_ok=True):
    r = subprocess.run([checker, *map(str, argv)], capture_output=True, text=True)
    if expect_ok and r.returncode != 0:
        raise AssertionError(f"{checker} {' '.join(map(str, argv))} failed ({r.returncode}):\n{r.stderr}{r.stdout}")
    return r


def parse_dump(text):
    """The checker's `dump` output: {key: (dtype, descr, fortran, shape, [values as str])}."""
    out = {}
    lines = text.splitlines()
    for i in range(0, len(lines), 2):
        head = lines[i].split()
        assert head[0] == "array", lines[i]
        key, dt, descr, fortran = head[1], head[2], head[3], head[4] == "1"
        shape = tuple(int(x) for x in head[6:])
        vals = lines[i + 1].split()
        assert vals[0] == "values", lines[i + 1]
        out[key] = (dt, descr, fortran, shape, vals[1:])
    return out


class Checks:
    """Counts checks; prints failures and exits 1 at the end if any failed."""

    def __init__(self):
        self.n = 0
        self.failed = []

    def __call__(self, cond, what):
        self.n += 1
        if not cond:
            self.failed.append(what)
            print("FAILED:", what)
        return bool(cond)

    def raises(self, exc, fn, must_contain, what):
        """fn() raises exc whose message contains every string of must_contain."""
        try:
            fn()
        except exc as e:
            msg = str(e)
            ok = all(s in msg for s in must_contain)
            return self(ok, f"{what}: message {msg!r} lacks {must_contain}")
        except Exception as e:  # noqa: BLE001
            return self(False, f"{what}: raised {type(e).__name__}: {e}, expected {exc.__name__}")
        return self(False, f"{what}: no exception, expected {exc.__name__}")

    def finish(self, name):
        if self.failed:
            print(f"{name}: {len(self.failed)} of {self.n} checks failed")
            sys.exit(1)
        print(f"{name}: all {self.n} checks passed")
