"""qkgeom: position vs content geometry of transformer attention heads.

The analyses, the samplers and the dataset reader/writer are the C++ library's (the extension
``qkgeom._qkgeom``, re-exported here); ``qkgeom.frames`` turns results into pandas DataFrames with
the CSV column names; ``qkgeom.study(file)`` runs a study (docs/study.md) into DataFrames. See
docs/python.md.
"""

from ._qkgeom import *  # noqa: F401,F403  (the extension's names; __all__ below)
from ._qkgeom import __version__  # = the CMake project version
from . import _qkgeom as _ext
from .study import Study, study  # (pandas imported on the first call; rebinds qkgeom.study to the function)

__all__ = [n for n in dir(_ext) if not n.startswith("_")] + [
    "_columns", "frames", "distributed", "Recorder", "Study", "study", "__version__"]
_columns = _ext._columns


def __getattr__(name):
    # Submodules needing optional packages are imported on first use: frames (pandas), the
    # capture (Recorder) and the capture across processes (distributed: torch.distributed).
    import importlib

    if name in ("frames", "distributed"):
        return importlib.import_module("." + name, __name__)
    if name == "Recorder":
        return importlib.import_module(".capture", __name__).Recorder
    raise AttributeError(f"module 'qkgeom' has no attribute {name!r}")
