"""Arrow and numpy, both ways, without pandas; group ids in one plain type."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["arrow_of", "group_ids", "null_rows", "numpy_of", "why"]


def numpy_of(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of a numeric or boolean Arrow array without nulls, as numpy (a view when
    the layout allows). Not ``Array.to_numpy``: that goes through pyarrow's pandas
    conversion, which imports pandas whenever it is installed (0.3 s a run)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if arr.null_count:
        raise ValueError("numpy_of: the array has nulls")
    if pa.types.is_boolean(t):
        return numpy_of(pc.cast(arr, pa.uint8())).view(np.bool_)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        kind = "f" if pa.types.is_floating(t) else "iu"[pa.types.is_unsigned_integer(t)]
        dtype = np.dtype(f"{kind}{t.bit_width // 8}")
        buf = arr.buffers()[1]
        if buf is None or len(arr) == 0:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    return arr.to_numpy(zero_copy_only=False)


def arrow_of(values: np.ndarray | Sequence[Any]) -> pa.Array:
    """numpy numbers or strings (or a list of ints or strs) as an Arrow array. Numbers and
    strings are built from their buffers: ``pa.array`` imports pandas whenever it is
    installed; anything else (objects, mixed lists) falls back to it."""
    x = np.asarray(values)
    if x.dtype.kind in "iuf" and x.ndim == 1:
        x = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
        t = pa.from_numpy_dtype(x.dtype)
        return pa.Array.from_buffers(t, len(x), [None, pa.py_buffer(x)])
    if x.dtype.kind in "U" and x.ndim == 1:
        data = [v.encode("utf-8") for v in x.tolist()]  # a lone surrogate: UnicodeEncodeError
        ends = np.cumsum([len(d) for d in data], dtype=np.int64)
        offsets = np.concatenate([np.zeros(1, np.int64), ends])
        if offsets[-1] < 2**31:
            t, offsets = pa.string(), offsets.astype(np.int32)
        else:
            t = pa.large_string()
        return pa.Array.from_buffers(
            t, len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
        )
    return pa.array(values)


def null_rows(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The indices of the nulls of ``arr``."""
    return np.flatnonzero(numpy_of(arr.is_null()))


def group_ids(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Group ids in a plain type: categorical ids (pandas ``Categorical``, polars
    ``Categorical``/``Enum``: Arrow dictionaries) decoded, ``string_view`` as ``string``, so
    that ids compare equal across files and batches whatever their writer."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_string_view(t):
        arr = arr.cast(pa.string())
    return arr


def why(exc: BaseException) -> str:
    """The first line of an exception's text (its type's name when it has none)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
