"""Shared helpers of the qkgeom package tests (tests/python/module_*.py): arguments, skipping,
check counting, and the comparison of DataFrames with the CSV files `qkgeom analyze` writes."""

import argparse
import os
import shutil
import subprocess
import sys

SKIP = 77  # CTest SKIP_RETURN_CODE


def setup(description, need_pandas=False):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--qkgeom", default="", help="path of the qkgeom program (bin/qkgeom)")
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    args = ap.parse_args()
    for mod, pkg in [("numpy", "python3-numpy")] + ([("pandas", "python3-pandas")] if need_pandas else []):
        try:
            __import__(mod)
        except ImportError:
            print(f"{mod} is not available to {sys.executable}: skipped (install {pkg})")
            sys.exit(SKIP)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    return args


def run(*argv, expect=0):
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if expect is not None and r.returncode != expect:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {r.returncode}, expected {expect}:\n{r.stderr}{r.stdout}")
    return r


from _common import Checks  # noqa: E402,F401  (one checker for tests/python)


def same_doubles(a, b):
    """Bit-for-bit equality of two float arrays; every NaN equals every NaN (the CSV writes any
    NaN as `nan`)."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    if not np.array_equal(na, nb):
        return False
    return np.array_equal(a[~na].view(np.int64), b[~nb].view(np.int64))


def read_csv(path):
    """A CSV file of qkgeom as pandas reads it back exactly: round-trip doubles, `nan` as NaN,
    empty text fields as ''."""
    import pandas as pd

    return pd.read_csv(path, float_precision="round_trip", keep_default_na=False, na_values=["nan"])


def header_of(path):
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\n").split(",")


def compare_frame_csv(check, frame, path, what):
    """The frame's columns == the CSV's header line, and every value equal bit for bit."""
    import numpy as np

    cols = header_of(path)
    check(list(frame.columns) == cols, f"{what}: columns {list(frame.columns)} != CSV header {cols}")
    csv = read_csv(path)
    if not check(len(csv) == len(frame), f"{what}: {len(frame)} rows, CSV has {len(csv)}"):
        return
    for c in cols:
        if c not in frame.columns:
            continue
        got, want = frame[c].to_numpy(), csv[c].to_numpy()
        if got.dtype.kind in "iuf":
            ok = same_doubles(got, want) if got.dtype.kind == "f" or want.dtype.kind == "f" else np.array_equal(got, want)
            check(ok, f"{what}: column {c} differs from the CSV")
            if got.dtype.kind in "iu":
                check(want.dtype.kind in "iu", f"{what}: column {c} is integer in the frame, {want.dtype} in the CSV")
        else:
            check(
                [str(x) for x in got] == [str(x) for x in want],
                f"{what}: text column {c} differs from the CSV: {list(got)[:3]} vs {list(want)[:3]}",
            )
