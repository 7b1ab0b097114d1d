"""Arrow record batches of one row per answer as :class:`~grpo_cli.batch.RawBatch` es:
list columns to flat values and offsets, for every reader that decodes into Arrow
(parquet, JSONL, a Ray block, a table in memory); and answer fields stored one value per
token (verl's ``(N, L)`` ``advantages`` and ``token_level_scores``) reduced to one value
per answer, the same way in pass 1 (:func:`answer_table`) and in every batch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from ..batch import RawBatch, mask_values
from ..core import segment_count, segment_sum
from ..errors import InputError
from .arrow import arrow_of, null_rows, numpy_of
from .fields import ANSWER_FIELDS, FLAG_FIELDS, PER_TOKEN, TOKEN_IDS, TOKEN_VALUES

if TYPE_CHECKING:
    from ..batch import Batch

__all__ = [
    "OUTSIDE",
    "TOKEN_ADVANTAGE",
    "VARIES",
    "answer_table",
    "batch_token_advantages",
    "constant_advantages",
    "flag_array",
    "is_list",
    "joined",
    "list_array",
    "list_column",
    "list_tokens",
    "raw_from_arrow",
    "raw_record_batch",
    "score_sums",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
Flags = NDArray[np.bool_]

# A batch's per-token advantages (an input whose advantages vary within answers): one list
# an answer of its valid tokens' values, in the batch's answer columns under this key (the
# answer's own value is under ``advantage``, as for any input).
TOKEN_ADVANTAGE = "advantage (per token)"
# Pass 1's companion of a per-token answer column, one flag an answer: its advantages vary
# over its valid tokens (VARIES); its row holds a nonzero score outside the mask (OUTSIDE).
VARIES = " (varies within an answer)"
OUTSIDE = " (nonzero outside the mask)"


def is_list(t: pa.DataType) -> bool:
    """A list type of any layout (list, large, fixed-size, view)."""
    is_view = getattr(pa.types, "is_list_view", None)
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or bool(is_view is not None and is_view(t))
    )


# ------------------------------------------------------------- per-token answer fields
def score_sums(values: np.ndarray, offsets: I64, mask: Flags | None) -> tuple[F64, Flags]:
    """Each answer's reward from per-token scores, ``R_i = Σ_t r_{i,t}`` over every
    position of its row, masked ones included, in float64: verl 0.9.1
    ``core_algos.compute_grpo_outcome_advantage`` takes ``token_level_rewards.sum(dim=-1)``
    (no mask; verl's reward managers put the score on the last valid token and 0
    elsewhere). Also, per answer, whether the row holds a nonzero (or NaN) score where the
    ``mask`` is False: what verl counts and a masked sum would not.

    Args:
        values: ``(T,)`` numbers, the rows one after the other.
        offsets: ``(N+1,)`` int64, the rows' bounds in ``values``.
        mask: ``(T,)`` booleans aligned with ``values``, or None (every position valid).

    Returns:
        ``(N,)`` float64 sums (an empty row: 0) and ``(N,)`` booleans.

    Example:
        >>> s, out = score_sums(np.array([0.0, 1.0, 0.5]), np.array([0, 2, 3]),
        ...                     np.array([True, True, False]))
        >>> s.tolist(), out.tolist()
        ([1.0, 0.5], [False, True])
    """
    v = np.asarray(values, dtype=np.float64)
    sums = segment_sum(v, offsets)
    if mask is None:
        return sums, np.zeros(sums.shape[0], dtype=np.bool_)
    with np.errstate(invalid="ignore"):
        off_mask = (v != 0.0) & ~mask
    return sums, segment_count(off_mask, offsets) > 0


def constant_advantages(
    values: np.ndarray, offsets: I64, mask: Flags | None
) -> tuple[F64, Flags, F64, I64]:
    """Per-token advantages ``A_{i,t}`` to one value per answer: ``A_i`` the value its valid
    tokens all hold when they hold one (GRPO: verl's ``scores.unsqueeze(-1) *
    response_mask``, NeMo-RL's ``advantages.expand(mask.shape)``), else their mean over the
    valid tokens (OpenRLHF's returns with the KL in the reward, GAE, NeMo-RL's message
    penalties: the loss then takes the per-token values, the mean only summarises).

    Args:
        values: ``(T,)`` numbers, the rows one after the other.
        offsets: ``(N+1,)`` int64, the rows' bounds in ``values``.
        mask: ``(T,)`` booleans aligned with ``values``, or None (every position valid).

    Returns:
        ``A_i`` ``(N,)`` float64 (an answer without a valid token: 0, which validation
        names); ``(N,)`` booleans, True where the valid values are not all equal (a NaN
        among them included); the valid tokens' values ``(T_valid,)`` float64 and their
        offsets ``(N+1,)``.

    Example:
        >>> a, varies, v, off = constant_advantages(
        ...     np.array([2.0, 2.0, 9.0, 1.0, 3.0]), np.array([0, 3, 5]),
        ...     np.array([True, True, False, True, True]))
        >>> a.tolist(), varies.tolist(), v.tolist(), off.tolist()
        ([2.0, 2.0], [False, True], [2.0, 2.0, 1.0, 3.0], [0, 2, 4])
    """
    v = np.asarray(values, dtype=np.float64)
    n = int(offsets.shape[0] - 1)
    if mask is None:
        valid, off = v, np.asarray(offsets, dtype=np.int64)
    else:
        valid = v[mask]
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(segment_count(mask, offsets), out=off[1:])
    lengths = np.diff(off)
    nonempty = lengths > 0
    first = np.zeros(n, dtype=np.float64)
    first[nonempty] = valid[off[:-1][nonempty]]
    with np.errstate(invalid="ignore"):
        differs = valid != np.repeat(first, lengths)
    varies = segment_count(differs, off) > 0
    with np.errstate(invalid="ignore", over="ignore"):
        mean = segment_sum(valid, off) / np.maximum(lengths, 1)
    return np.where(varies, mean, first), varies, valid, off


def _per_token(
    field: str,
    arr: pa.Array,
    mask_arr: pa.Array | None,
    label: str,
    name: str,
    mname: str | None,
    row0: int,
    what: str,
) -> tuple[F64, Flags, I64, pa.Array | None]:
    """A per-token answer column reduced (:func:`score_sums` for ``reward``,
    :func:`constant_advantages` for ``advantage``): the per-answer values, their flags, the
    column's offsets, and for advantages the valid tokens' values as a list array."""
    masked = field == "advantage" and mask_arr is not None
    off, vals = list_column(arr, label, name, row0, masked=masked, what=what, expected="numbers")
    m = None
    if mask_arr is not None:
        assert mname is not None
        moff, mvals = list_column(mask_arr, label, mname, row0, boolean=True, what=what)
        if not np.array_equal(moff, off):
            i = int(np.flatnonzero(np.diff(moff) != np.diff(off))[0])
            raise InputError(
                f"{label}: row {row0 + i}: {what} {name!r} has {int(off[i + 1] - off[i])} "
                f"values but the mask {mname!r} has {int(moff[i + 1] - moff[i])}"
            )
        m = mask_values(mvals, label, f"{what} {mname!r}")
    if field == "reward":
        sums, outside = score_sums(vals, off, m)
        return sums, outside, off, None
    value, varies, valid, voff = constant_advantages(vals, off, m)
    return value, varies, off, list_array(valid, voff)


def list_array(values: F64, offsets: I64) -> pa.Array:
    """Flat float64 values and their offsets as a list array (large beyond int32)."""
    if offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(arrow_of(offsets.astype(np.int32)), arrow_of(values))
    return pa.LargeListArray.from_arrays(arrow_of(offsets), arrow_of(values))


def flag_array(x: Flags) -> pa.Array:
    """Booleans as an Arrow array (built from their bytes: no pandas)."""
    return pc.cast(arrow_of(x.astype(np.uint8)), pa.bool_())


def answer_table(
    rb: pa.RecordBatch | pa.Table,
    fields: Mapping[str, str],
    mname: str | None,
    label: str,
    row0: int,
    *,
    what: str = "column",
) -> pa.Table:
    """Pass 1's answer columns of a record batch (``fields``: field to column name): as
    they are, but a ``reward`` or ``advantage`` stored per token (a list column) reduced to
    one value per answer (:func:`score_sums`, :func:`constant_advantages`, under the mask
    column ``mname``) and its flags beside it (the column's name + :data:`OUTSIDE` or
    :data:`VARIES`). ``row0``: the row of its first answer within the file ``label``."""
    out: dict[str, pa.Array | pa.ChunkedArray] = {}
    for f, name in fields.items():
        arr = rb.column(name)
        if f not in PER_TOKEN or not is_list(arr.type):
            out[name] = arr
            continue
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        m = None
        if mname is not None:
            m = rb.column(mname)
            m = m.combine_chunks() if isinstance(m, pa.ChunkedArray) else m
        value, flags, _, _ = _per_token(f, arr, m, label, name, mname, row0, what)
        out[name] = arrow_of(value)
        out[name + (VARIES if f == "advantage" else OUTSIDE)] = flag_array(flags)
    return pa.table(out)


def batch_token_advantages(b: Batch, where: str) -> F64:
    """The per-token advantages a batch carries (:data:`TOKEN_ADVANTAGE`), ``(T_b,)``
    float64 aligned with its valid tokens."""
    col = b.answer.get(TOKEN_ADVANTAGE)
    if col is None:
        raise InputError(f"{where}: the batch carries no per-token advantages")
    x = np.asarray(numpy_of(col.flatten()), dtype=np.float64)
    if x.shape[0] != int(b.offsets[-1]):
        raise InputError(
            f"{where}: {x.shape[0]} per-token advantages for {int(b.offsets[-1])} valid tokens"
        )
    return x


# ------------------------------------------------------------------ record batches


def raw_record_batch(
    rb: pa.RecordBatch,
    wanted: list[str],
    names: list[str],
    mname: str | None,
    start: int,
    label: str,
    answer: Mapping[str, str],
    file_start: int = 0,
    *,
    what: str = "column",
) -> RawBatch:
    """The list columns of a record batch as flat arrays and offsets, values unchecked;
    the ``answer`` columns (field: column name) as they are, but a reward or advantage
    stored per token reduced to one value per answer as pass 1 reduces it (and the
    advantages' valid tokens under :data:`TOKEN_ADVANTAGE`). ``start``: the input row of
    its first row; ``file_start``: that of its file's first row (messages count rows
    within the file ``label`` names, and call a column ``what``)."""
    offs: dict[str, I64] = {}
    vals: dict[str, np.ndarray] = {}
    row0 = start - file_start
    for f, name in zip(wanted, names, strict=True):
        flag = f in FLAG_FIELDS  # 0/1 per token, booleans welcome
        offs[f], vals[f] = list_column(
            rb.column(name), label, name, row0, masked=mname is not None and not flag,
            boolean=flag, what=what,
        )  # fmt: skip
        if flag:
            vals[f] = mask_values(vals[f], label, f"{what} {name!r}")
    mask = None
    if mname is not None:
        moff, mvals = list_column(rb.column(mname), label, mname, row0, boolean=True, what=what)
        if np.array_equal(moff, offs[wanted[0]]):
            mask = mask_values(mvals, label, f"{what} {mname!r}")
        else:
            offs["mask"] = moff
    answers: dict[str, pa.Array] = {}
    for f, name in answer.items():
        col = rb.column(name)
        if f not in PER_TOKEN or not is_list(col.type):
            answers[f] = col
            continue
        m = rb.column(mname) if mname is not None else None
        value, _, off, tokens = _per_token(f, col, m, label, name, mname, row0, what)
        ref = offs[wanted[0]]
        if tokens is not None and not np.array_equal(off, ref):
            i = int(np.flatnonzero(np.diff(off) != np.diff(ref))[0])
            raise InputError(
                f"{label}: row {row0 + i}: {what} {name!r} has {int(off[i + 1] - off[i])} "
                f"values but {what} {names[0]!r} has {int(ref[i + 1] - ref[i])} (per-token "
                "advantages need one value per token)"
            )
        answers[f] = arrow_of(value)
        if tokens is not None:
            answers[TOKEN_ADVANTAGE] = tokens
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
    what: str = "column",
    expected: str = "log-probs",
) -> tuple[I64, np.ndarray]:
    """A list column as flat values and offsets. Fixed-size lists (polars ``Array``) and
    decimal values (duckdb) are converted; with a mask (``masked``) a null value is a
    padding NaN (an error only inside the mask, where validation finds it), else an error.
    Messages call the column a ``what`` and its values ``expected`` (when booleans).
    """
    t = arr.type
    if is_list(t) and not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        arr = arr.cast(pa.list_(t.value_type))
        t = arr.type
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_decimal(t.value_type):
        arr = arr.cast(pa.list_(pa.float64()))
        t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        raise InputError(
            f"{label}: {what} {name!r} has type {t}, expected a list {what} "
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
        raise InputError(f"{label}: {what} {name!r} holds {vt} values, expected numbers")
    if not boolean and pa.types.is_boolean(vt):
        raise InputError(f"{label}: {what} {name!r} holds booleans, expected {expected}")
    if arr.null_count:
        row = int(null_rows(arr)[0])
        raise InputError(f"{label}: {what} {name!r} is null at row {row0 + row}")
    off = numpy_of(arr.offsets).astype(np.int64)
    values = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    if values.null_count and masked and not boolean and pa.types.is_floating(vt):
        values = values.fill_null(float("nan"))  # padding; inside the mask: a non-finite value
    if values.null_count:
        k = int(null_rows(values)[0])
        i = int(np.searchsorted(off - off[0], k, side="right") - 1)
        raise InputError(
            f"{label}: {what} {name!r} has a null value at row {row0 + i}, "
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
    wanted = [f for f in (*TOKEN_VALUES, *TOKEN_IDS) if f in columns]
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
