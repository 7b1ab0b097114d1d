"""Arrow record batches of one row per answer as :class:`~grpo_cli.batch.RawBatch` es:
list columns to flat values and offsets, for every reader that decodes into Arrow
(parquet, a Ray block, a table in memory)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ..batch import RawBatch, mask_values
from ..errors import InputError
from .arrow import null_rows, numpy_of
from .fields import ANSWER_FIELDS, TOKEN_VALUES

__all__ = ["joined", "list_column", "list_tokens", "raw_from_arrow", "raw_record_batch"]

I64 = NDArray[np.int64]


def raw_record_batch(
    rb: pa.RecordBatch,
    wanted: list[str],
    names: list[str],
    mname: str | None,
    start: int,
    label: str,
    answer: Mapping[str, str],
    file_start: int = 0,
) -> RawBatch:
    """The list columns of a record batch as flat arrays and offsets, values unchecked;
    the ``answer`` columns (field: column name) as they are. ``start``: the input row of
    its first row; ``file_start``: that of its file's first row (messages count rows
    within the file ``label`` names)."""
    offs: dict[str, I64] = {}
    vals: dict[str, np.ndarray] = {}
    row0 = start - file_start
    for f, name in zip(wanted, names, strict=True):
        offs[f], vals[f] = list_column(rb.column(name), label, name, row0, masked=mname is not None)
    mask = None
    if mname is not None:
        moff, mvals = list_column(rb.column(mname), label, mname, row0, boolean=True)
        if np.array_equal(moff, offs[wanted[0]]):
            mask = mask_values(mvals, label, f"column {mname!r}")
        else:
            offs["mask"] = moff
    answers = {f: rb.column(name) for f, name in answer.items()}
    field_names = dict(zip(wanted, names, strict=True))
    if mname is not None:
        field_names["mask"] = mname
    return RawBatch(
        start=start, label=label, unit="row", offsets=offs, values=vals, mask=mask,
        answer=answers, file_start=file_start, names=field_names,
    )  # fmt: skip


def list_column(
    arr: pa.Array,
    label: str,
    name: str,
    row0: int,
    *,
    boolean: bool = False,
    masked: bool = False,
) -> tuple[I64, np.ndarray]:
    """A list column as flat values and offsets. Fixed-size lists (polars ``Array``) and
    decimal values (duckdb) are converted; with a mask (``masked``) a null value is a
    padding NaN (an error only inside the mask, where validation finds it), else an error.
    """
    t = arr.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t):
        arr = arr.cast(pa.list_(t.value_type))
        t = arr.type
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_decimal(t.value_type):
        arr = arr.cast(pa.list_(pa.float64()))
        t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        raise InputError(
            f"{label}: column {name!r} has type {t}, expected a list column "
            f"(one list of per-token values per answer)"
        )
    vt = t.value_type
    ok = (
        pa.types.is_boolean(vt)
        or pa.types.is_integer(vt)
        or (not boolean and pa.types.is_floating(vt))
        or (boolean and pa.types.is_floating(vt))
    )
    if not ok:
        raise InputError(f"{label}: column {name!r} holds {vt} values, expected numbers")
    if not boolean and pa.types.is_boolean(vt):
        raise InputError(f"{label}: column {name!r} holds booleans, expected log-probs")
    if arr.null_count:
        row = int(null_rows(arr)[0])
        raise InputError(f"{label}: column {name!r} is null at row {row0 + row}")
    off = numpy_of(arr.offsets).astype(np.int64)
    values = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    if values.null_count and masked and not boolean and pa.types.is_floating(vt):
        values = values.fill_null(float("nan"))  # padding; inside the mask: a non-finite value
    if values.null_count:
        k = int(null_rows(values)[0])
        i = int(np.searchsorted(off - off[0], k, side="right") - 1)
        raise InputError(
            f"{label}: column {name!r} has a null value at row {row0 + i}, "
            f"token {k - int(off[i] - off[0])}"
        )
    off = off - off[0]
    return off, numpy_of(values)


def raw_from_arrow(
    rb: pa.RecordBatch, columns: Mapping[str, str], *, start: int = 0, label: str = "batch"
) -> RawBatch:
    """A record batch of one row per answer (from any reader: a file, a Ray block, a
    table in memory) as a :class:`RawBatch`. ``columns`` maps fields (``logp``,
    ``old_logp``, ``ref_logp``, ``rollout_logp``, ``entropy``, ``mask``, ``group``,
    ``reward``, ``advantage``) to column names; ``start`` is the row of its first answer
    in the input and ``label`` names it in messages. Values are not checked: see
    :func:`grpo_cli.batch.validate`."""
    wanted = [f for f in TOKEN_VALUES if f in columns]
    if not wanted:
        raise InputError(f"{label}: no token column among {sorted(columns)}")
    answer = {f: columns[f] for f in ANSWER_FIELDS if f in columns}
    names = [columns[f] for f in wanted]
    return raw_record_batch(rb, wanted, names, columns.get("mask"), start, label, answer)


def list_tokens(arr: pa.Array) -> int:
    """Values held by a list column's slice (its rows otherwise)."""
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        off = arr.offsets
        return int(off[len(off) - 1].as_py()) - int(off[0].as_py())
    if pa.types.is_fixed_size_list(t):
        return len(arr) * t.list_size
    return len(arr)


def joined(it: Iterable[pa.RecordBatch], col: str, batch_tokens: int) -> Iterator[pa.RecordBatch]:
    """Consecutive record batches joined while they hold at most ``batch_tokens`` values of
    ``col`` (a single longer one is yielded alone)."""
    pending: list[pa.RecordBatch] = []
    tokens = 0
    for rb in it:
        n = list_tokens(rb.column(col))
        if pending and tokens + n > batch_tokens:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, tokens = [], 0
        pending.append(rb)
        tokens += n
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
