"""NumPy / torch arrays as the extension reads them, without copying.

``as_rows(x)`` returns ``(ndarray, dtype_tag)``: a NumPy view of the rows (float16, float32 or
float64, any strides) and its tag ``"f16" | "f32" | "f64"``; a torch bfloat16 tensor becomes its
int16 bits (``t.view(torch.int16).numpy()``) tagged ``"bf16"``. ``as_indices(x)`` returns a 1-D
int64/int32 array (a view when it already is one; integer sequences and other integer widths are
converted). Anything else raises TypeError / ValueError naming the argument, its dtype and shape.

torch is never imported here: a tensor is recognised by its type's module, so the package works
without torch installed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["as_rows", "as_indices"]

_ROW_TAGS = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
_TAGS = ("f64", "f32", "f16", "bf16")


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def _describe(a) -> str:
    return f"dtype {a.dtype}, shape {tuple(a.shape)}"


def _host_tensor(x, name: str):
    t = x.detach()
    if t.device.type != "cpu":
        raise ValueError(
            f"{name}: a {t.device.type} tensor ({_describe(t)}): the extension reads host memory in place; "
            "move the rows to the host first (.cpu())"
        )
    return t


def as_rows(x, name: str = "rows"):
    """``(ndarray, tag)`` for rows given as a NumPy array, a torch CPU tensor or an
    ``(ndarray, tag)`` pair; no copy is made."""
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str):
        arr, tag = x
        if tag not in _TAGS:
            raise ValueError(f"{name}: unknown dtype tag {tag!r} (one of {' | '.join(_TAGS)})")
        if not isinstance(arr, np.ndarray):
            arr, _ = as_rows(arr, name)  # a bf16 tensor gives its bits; the extension checks tag vs dtype
        return arr, tag
    if _is_torch(x):
        t = _host_tensor(x, name)
        if str(t.dtype) == "torch.bfloat16":
            return _bf16_bits(t, name), "bf16"
        if str(t.dtype) not in ("torch.float16", "torch.float32", "torch.float64"):
            raise TypeError(f"{name}: unsupported tensor {_describe(t)}: expected float16/bfloat16/float32/float64 rows")
        x = t.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"{name}: expected a 2-D NumPy array or torch tensor of rows, got {type(x).__module__}.{type(x).__name__}"
        )
    tag = _ROW_TAGS.get(x.dtype.newbyteorder("="))
    if tag is None:
        hint = " (bfloat16 bits: pass (array, 'bf16'))" if x.dtype.kind in "iu" and x.dtype.itemsize == 2 else ""
        raise TypeError(f"{name}: unsupported {_describe(x)}: expected float16, float32 or float64 rows{hint}")
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array of rows (tokens x head_dim), got {_describe(x)}")
    return x, tag


def _bf16_bits(t, name: str):
    t = _host_tensor(t, name)
    import torch  # only reached with a torch tensor in hand

    return t.view(torch.int16).numpy()


_INT64 = np.iinfo(np.int64)


def _check_int64_objects(x, name: str):
    """An object array from a sequence: its first integer outside int64, or its first non-integer, named."""
    for i, v in enumerate(x.reshape(-1)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name}: expected integers, got {type(v).__name__} {v!r} at index {i}")
        if not _INT64.min <= int(v) <= _INT64.max:
            raise ValueError(f"{name}: value {int(v)} at index {i} does not fit in int64 "
                             f"(positions, buckets and example ids are 64-bit integers, {_INT64.min}..{_INT64.max})")
    raise TypeError(f"{name}: expected a 1-D integer array, got {_describe(x)}")


def as_indices(x, name: str = "indices"):
    """A 1-D int64 (or int32) NumPy array of the integers ``x`` holds: a view for an int64/int32
    array or CPU tensor, a converted copy for sequences and other integer widths."""
    if _is_torch(x):
        x = _host_tensor(x, name).numpy()
    if not isinstance(x, np.ndarray):
        if isinstance(x, (str, bytes)) or not hasattr(x, "__len__"):
            raise TypeError(f"{name}: expected a 1-D integer array or sequence, got {type(x).__name__}")
        x = np.asarray(x) if len(x) else np.zeros(0, dtype=np.int64)
    if x.dtype == np.object_:
        _check_int64_objects(x, name)  # Python ints beyond int64 make an object array: name the value
    if x.dtype.kind not in "iu" or x.dtype == np.bool_:
        raise TypeError(f"{name}: expected integers, got {_describe(x)}")
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D integer array, got {_describe(x)}")
    if x.dtype.kind == "i" and x.dtype.itemsize in (4, 8) and x.dtype.isnative:
        return x
    if x.dtype == np.uint64 and x.size and int(x.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: value {int(x.max())} does not fit in int64 ({_describe(x)})")
    return x.astype(np.int64)
