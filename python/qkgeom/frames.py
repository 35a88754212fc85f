"""Results as pandas DataFrames with the CSV files' column names (docs/outputs.md).

Each frame holds exactly the columns, in the same order, and the same doubles as the CSV file
``qkgeom analyze`` writes for the same heads: the column lists and the column arrays come from the
C++ library (report/csv.hpp, through ``qkgeom._columns``), never from CSV text. Integer columns are
int64, text columns (taxonomy, flags) are str objects, every other column is float64 (NaN where
the CSV says ``nan``).
"""

from __future__ import annotations

import pandas as pd

from . import _qkgeom

__all__ = [
    "head_metrics_frame",
    "bucket_plasticity_frame",
    "component_weights_frame",
    "qk_pca_frame",
    "frames",
    "FILE_STEMS",
]

#: file stem -> the table's kind in ``qkgeom._columns``
FILE_STEMS = {
    "head_metrics": "head_metrics",
    "head_bucket_plasticity": "head_bucket_plasticity",
    "head_component_weights": "head_component_weights",
    "qk_pca": "qk_pca",
}


def _heads(heads):
    # A DatasetRun (analyze_dataset's result) or any iterable of HeadAnalysis.
    return list(heads.heads if hasattr(heads, "heads") else heads)


def _frame(kind: str, heads) -> pd.DataFrame:
    return pd.DataFrame(_qkgeom._columns(kind, _heads(heads)), copy=False)


def head_metrics_frame(heads) -> pd.DataFrame:
    """head_metrics.csv: one row per head."""
    return _frame("head_metrics", heads)


def bucket_plasticity_frame(heads) -> pd.DataFrame:
    """head_bucket_plasticity.csv: one row per plasticity cell of every head."""
    return _frame("head_bucket_plasticity", heads)


def component_weights_frame(heads) -> pd.DataFrame:
    """head_component_weights.csv: one row per query coordinate of every head."""
    return _frame("head_component_weights", heads)


def qk_pca_frame(heads) -> pd.DataFrame:
    """qk_pca.csv: one row per reported PCA component of every head."""
    return _frame("qk_pca", heads)


def gqa_groups_frame(heads) -> pd.DataFrame:
    """gqa_groups.csv: per layer (then the model, layer -1) and metric, the within / between
    key-head-group variance ratio of the query heads (docs/beyond-gqa.md)."""
    cols = _qkgeom._gqa_groups(_heads(heads))
    if list(cols) != list(_qkgeom._gqa_groups_columns):
        raise RuntimeError("qkgeom: gqa_groups columns differ from report::gqa_groups_columns()")
    return pd.DataFrame(cols)


def frames(heads) -> dict:
    """Every per-head table: ``{file stem: DataFrame}`` (head_metrics, head_bucket_plasticity,
    head_component_weights, qk_pca)."""
    hs = _heads(heads)
    return {stem: _frame(kind, hs) for stem, kind in FILE_STEMS.items()}
