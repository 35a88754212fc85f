"""Studies from Python (docs/python.md#studies, docs/study.md): ``qkgeom.study(file)`` runs a
study file — every run analysed once (or taken from the cache, its analysis folder or the file's
numbers) — and returns its tables as pandas DataFrames.

The tables are the C++ library's (report/study_tables.hpp, through ``qkgeom._qkgeom.run_study``): the
same columns, in the same order, and the same values as the study_*.csv files ``qkgeom study``
writes. Integer columns are int64, text columns str, number columns float64 (NaN where the CSV
says ``nan``); a column mixing integers with NaN (``step``: NaN where a run has no step) is
float64.
"""

from __future__ import annotations

import os
import warnings

from . import _qkgeom

__all__ = ["study", "Study", "TABLES", "DEFAULT_CACHE"]

#: the tables, in file order: name -> CSV file (study_<name>.csv)
TABLES = (
    "models",
    "profiles",
    "trajectory",
    "taxonomy",
    "depth",
    "correlations",
    "length",
    "head_trajectories",
)

#: the default cache folder, next to the study file
DEFAULT_CACHE = ".qkgeom-study-cache"


class Study:
    """A computed study: ``tables`` ({name: DataFrame}, names as in :data:`TABLES`), also as
    attributes (``st.models``, ``st.correlations``, ...); ``runs`` ([{"name", "status",
    "message", "note"}], study file order; status "analysed", "cached", "read", "given" or "failed");
    ``title``; ``cache`` (the cache folder used)."""

    def __init__(self, tables, runs, title="", cache=""):
        self.tables = tables
        self.runs = runs
        self.title = title
        self.cache = cache

    def __getattr__(self, name):
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(f"'Study' object has no attribute {name!r} (tables: {', '.join(tables)})")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.__dict__.get("tables", {})))

    @property
    def failed(self):
        """The runs that failed: [{"name", "status", "message"}]."""
        return [r for r in self.runs if r["status"] == "failed"]

    def __repr__(self):
        counts = {}
        for r in self.runs:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        what = ", ".join(f"{n} {s}" for s, n in counts.items())
        return f"Study({self.title!r}: {len(self.runs)} runs ({what}); tables {', '.join(self.tables)})"


def _frame(pd, t):
    cols = t["columns"]
    return pd.DataFrame(dict(zip(cols, t["data"])), columns=cols)


def study(study_file, cache=None, options=None, jobs=0, context=0, window=-1) -> Study:
    """Run a study file (docs/study.md#the-study-file) and return its tables as DataFrames.

    study_file: the study's JSON file (relative paths in it resolve against its folder).
    cache: where analysed captures are kept (one folder per capture content + options + qkgeom
        version, docs/study.md#caching); default: ``.qkgeom-study-cache`` next to the study file.
    options: the analysis Options of every capture (default: Options()).
    jobs: worker threads of an analysis (0: every core). context: context length override (0: the
        capture's). window: sliding window for heads whose capture records none (-1: the capture's).

    A broken run does not stop the study: its status is "failed" with its message (``st.failed``).
    A damaged cache entry is analysed again and said: a warning, and the run's "note".
    Raises qkgeom.InputError (.source, .field, .value) for a bad study file or score file.
    The GIL is released while the study runs.
    """
    import pandas as pd  # lazily, as qkgeom.frames: the package imports without pandas

    study_file = os.fspath(study_file)
    if cache is None:
        cache = os.path.join(os.path.dirname(os.path.abspath(study_file)), DEFAULT_CACHE)
    cache = os.fspath(cache)
    r = _qkgeom.run_study(study_file, cache, options, jobs=jobs, context=context, window=window)
    for run in r["runs"]:
        if run.get("note"):  # a damaged cache entry analysed again: said, as the program says it on stderr
            warnings.warn(f"qkgeom.study: run {run['name']}: {run['note']}", stacklevel=2)
    tables = {}
    for stem, t in r["tables"].items():
        name = stem[len("study_"):] if stem.startswith("study_") else stem
        tables[name] = _frame(pd, t)
    return Study(tables, r["runs"], r["title"], cache)
