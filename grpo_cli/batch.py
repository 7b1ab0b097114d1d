"""Batches: a run of consecutive answers, raw as stored or validated, and how a long
answer is cut into slices.

A :class:`RawBatch` holds token fields exactly as a reader decoded them (lists may disagree
in length, values are unchecked); :func:`validate` turns it into a :class:`Batch` of valid
tokens only, or raises on the first problem. The integrity predicates are defined once
here: validation raises the first, ``grpo-cli check`` counts them all. :func:`parts` cuts
a batch into runs of whole answers and answers longer than :data:`SLICE_TOKENS`, which
every per-token consumer then folds a slice at a time (bounded memory whatever an
answer's length).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from .core import FloatArray, segment_count
from .errors import InputError

__all__ = [
    "SLICE_TOKENS",
    "TURN_FIELD",
    "Batch",
    "BatchError",
    "Part",
    "RawBatch",
    "drop_empty",
    "empty_answers",
    "length_mismatches",
    "nonfinite_flags",
    "parts",
    "token_ranges",
    "valid_lengths",
    "validate",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

# An answer longer than this is folded a slice of this many tokens at a time: a few
# float64 temporaries of 8 MiB, whatever the answer's length.
SLICE_TOKENS = 1 << 20


@dataclass(frozen=True)
class Batch:
    """A run of consecutive answers, valid tokens only.

    ``start`` is the dataset index of the first answer; ``offsets`` ``(n+1,)`` delimit the
    answers in every flat ``(T_b,)`` token field of ``fields`` (floating: float32 as logged, or
    float64; every computation on them produces float64); ``width`` ``(n,)``
    is each answer's token-run length before the mask (the padded width for npz).
    """

    start: int
    offsets: I64
    fields: Mapping[str, FloatArray]
    width: I64
    answer: Mapping[str, pa.Array] = dataclass_field(default_factory=dict)
    # the input row of each answer when they are not ``start, start + 1, ...`` (answers
    # left out before: :func:`drop_empty`), else None
    rows: I64 | None = None

    def row(self, i: int) -> int:
        """The input row of answer ``i`` of the batch."""
        return self.start + i if self.rows is None else int(self.rows[i])

    @property
    def n(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> I64:
        return np.diff(self.offsets)

    def answers(self, i: int, j: int) -> Batch:
        """Answers ``i .. j-1`` of the batch (views, no copy)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[j])
        return Batch(
            start=self.start + i,
            offsets=self.offsets[i : j + 1] - lo,
            fields={k: v[lo:hi] for k, v in self.fields.items()},
            width=self.width[i:j],
            answer={k: v.slice(i, j - i) for k, v in self.answer.items()},
            rows=None if self.rows is None else self.rows[i:j],
        )

    def tokens(self, lo: int, hi: int) -> Batch:
        """Tokens ``lo .. hi-1`` of a one-answer batch, as a batch of one answer (a slice
        of a long answer: its sums add up with the other slices')."""
        return Batch(
            start=self.start,
            offsets=np.array([0, hi - lo], dtype=np.int64),
            fields={k: v[lo:hi] for k, v in self.fields.items()},
            width=np.array([hi - lo], dtype=np.int64),
            answer=self.answer,
            rows=self.rows,
        )


@dataclass(frozen=True)
class RawBatch:
    """Token fields exactly as stored, for integrity checks that must not stop at the first
    problem: per field its flat values and offsets (lists may disagree in length), and the
    flat mask aligned with the first field (None: no mask, or its lengths disagree).

    ``names`` maps each field (and ``mask``) to its column or array in the input, ``what``
    says which (``column``, ``array``), ``unit`` how messages name an answer (``row``,
    ``answer``). ``padded``: the values are an ``(N, L)`` array flattened (``offsets`` are
    ``i·L``) and the mask is that array's, so every field has the same offsets.
    """

    start: int
    label: str
    unit: str
    offsets: dict[str, I64]
    values: dict[str, np.ndarray]
    mask: NDArray[np.bool_] | None
    answer: Mapping[str, pa.Array] = dataclass_field(default_factory=dict)
    # the input row of its file's first row: messages name rows within the file
    file_start: int = 0
    names: Mapping[str, str] = dataclass_field(default_factory=dict)
    what: str = "column"
    padded: bool = False
    rows: I64 | None = None  # as Batch.rows

    @property
    def n(self) -> int:
        first = next(iter(self.offsets.values()))
        return int(first.shape[0] - 1)

    @property
    def fields(self) -> list[str]:
        """The token value fields, the first one first (the others align with it)."""
        return list(self.values)

    def name(self, field: str) -> str:
        return self.names.get(field, field)


class BatchError(Exception):
    """An :class:`InputError` met while reading the batch that starts at dataset row
    ``start``, raised by a stream so that the consumer can report the first problem in
    row order, whichever stream met it first."""

    def __init__(self, start: int, error: InputError) -> None:
        super().__init__(str(error))
        self.start, self.error = start, error


# ------------------------------------------------------------------- the predicates
def length_mismatches(raw: RawBatch) -> Iterator[tuple[str, I64]]:
    """``(field, answers)``: each field (``mask`` included) whose lists disagree in length
    with the first field's, and the batch's answers where they do."""
    first = raw.fields[0]
    ref = np.diff(raw.offsets[first])
    for f, off in raw.offsets.items():
        if f == first or np.array_equal(off, raw.offsets[first]):
            continue
        yield f, np.flatnonzero(np.diff(off) != ref)


def valid_lengths(raw: RawBatch) -> I64:
    """Each answer's valid tokens (under the mask; all of them without one)."""
    off = raw.offsets[raw.fields[0]]
    if raw.mask is None:
        return np.diff(off)
    return segment_count(raw.mask, off)


def empty_answers(raw: RawBatch) -> I64:
    """The batch's answers without a valid token (an empty list, or a mask all False)."""
    return np.flatnonzero(valid_lengths(raw) == 0)


def drop_empty(raw: RawBatch) -> tuple[RawBatch, int]:
    """The batch without its answers that have no valid token, and how many there were
    (a trainer's loss counts such answers, e.g. TRL's truncated completions under
    ``mask_truncated_completions``: their row is all masked). Rows keep their order; the
    batch's ``start`` is its first row's, so later messages count the kept rows."""
    lengths = valid_lengths(raw)
    keep = lengths > 0
    dropped = int(np.count_nonzero(~keep))
    if not dropped:
        return raw, 0
    rows = np.flatnonzero(keep)
    offsets: dict[str, I64] = {}
    values: dict[str, np.ndarray] = {}
    mask = raw.mask
    first = raw.fields[0]
    for f, off in raw.offsets.items():
        width = np.diff(off)[rows]
        idx = _token_index(off, rows, width)
        offsets[f] = np.concatenate([np.zeros(1, np.int64), np.cumsum(width, dtype=np.int64)])
        if f in raw.values:
            values[f] = raw.values[f][idx]
        if f == first and mask is not None:
            mask = mask[idx]
    answer = {k: v.take(pa.array(rows)) for k, v in raw.answer.items()}
    return dataclasses.replace(
        raw, offsets=offsets, values=values, mask=mask, answer=answer
    ), dropped


def _token_index(off: I64, rows: I64, width: I64) -> I64:
    """The flat token positions of answers ``rows`` (their widths ``width``), in order."""
    total = int(width.sum())
    starts = np.repeat(off[rows] - np.concatenate([[0], np.cumsum(width)[:-1]]), width)
    return starts + np.arange(total, dtype=np.int64)


def nonfinite_flags(values: np.ndarray, mask: NDArray[np.bool_] | None) -> NDArray[np.bool_]:
    """Valid tokens (``mask``: None for all) whose value is NaN or infinite."""
    bad = ~np.isfinite(values)
    if mask is not None:
        bad &= mask
    return bad


def _first_nonfinite(
    raw: np.ndarray, m: NDArray[np.bool_] | None, offsets: I64
) -> tuple[int, int, int] | None:
    """``(flat index, answer, count)`` of the first non-finite valid value, or None: one
    pass when the values' sum is finite (then every value is), else the flags."""
    if raw.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):  # ±1e308s may sum to inf
            if math.isfinite(np.add.reduce(raw)):
                return None
    bad = nonfinite_flags(raw, m)
    if not bad.any():
        return None
    k = int(np.flatnonzero(bad)[0])
    i = int(np.searchsorted(offsets, k, side="right") - 1)
    return k, i, int(bad.sum())


# ------------------------------------------------------------------- validation
def validate(raw: RawBatch, *, checked: bool = False) -> Batch:
    """A :class:`RawBatch` as a :class:`Batch` of valid tokens, or the
    :class:`InputError` of its first problem, naming the row (or answer), column and
    token: lists of unequal lengths, an answer without a valid token, NaN or inf inside
    the mask. ``checked``: the predicates were evaluated already (``check``'s scan) and
    found nothing; only the valid tokens are gathered."""
    if raw.padded:
        return _padded(raw, checked)
    return _ragged(raw, checked)


# a per-token field of a batch whose answers have several turns (runs of valid tokens):
# each valid token's turn, 0 for the first run of mask = 1 of its answer (issue 29: by turn)
TURN_FIELD = "_turn"


def turn_index(m: NDArray[np.bool_], offsets: I64, valid: int) -> F64 | None:
    """Each valid token's turn: the index of its maximal run of ``m`` = True within its
    answer (answers delimited by ``offsets`` over ``m``, before the mask is applied), or
    None when no answer has more than one run (``valid``: the answers with a valid token;
    the usual case costs one comparison of neighbours, nothing more)."""
    T = m.shape[0]
    if T == 0:
        return None
    rise = np.empty(T, dtype=np.bool_)  # a run starts: valid, and not after a valid token
    rise[0] = m[0]
    np.greater(m[1:], m[:-1], out=rise[1:])
    starts = offsets[:-1][offsets[:-1] < offsets[1:]]  # every non-empty answer's first token
    rise[starts] = m[starts]
    if int(np.count_nonzero(rise)) <= valid:
        return None  # one run an answer
    c = np.cumsum(rise, dtype=np.int64)
    before = np.zeros(offsets.shape[0] - 1, dtype=np.int64)  # runs before each answer
    inner = offsets[:-1] > 0
    before[inner] = c[offsets[:-1][inner] - 1]
    turn = c - np.repeat(before, np.diff(offsets)) - 1
    out: F64 = turn[m].astype(np.float64)
    return out


def _ragged(raw: RawBatch, checked: bool) -> Batch:
    label, start = raw.label, raw.start - raw.file_start  # messages: rows within the file
    wanted = raw.fields
    offsets = raw.offsets[wanted[0]]
    if not checked:
        for f, bad in length_mismatches(raw):
            i = int(bad[0])
            a, b = np.diff(raw.offsets[f]), np.diff(offsets)
            raise InputError(
                f"{label}: row {start + i}: column {raw.name(f)!r} has {a[i]} tokens but "
                f"{raw.name(wanted[0])!r} has {b[i]}"
            )
    width = np.diff(offsets)
    m = raw.mask
    if m is not None:  # valid tokens before each position, read at the answers' offsets
        counts = np.zeros(m.shape[0] + 1, dtype=np.int64)
        np.cumsum(m, out=counts[1:])
        new_offsets = counts[offsets]
    else:
        new_offsets = offsets
    if not checked:
        empty = np.flatnonzero(np.diff(new_offsets) == 0)
        if empty.size:
            raise InputError(
                f"{label}: row {start + int(empty[0])} has no valid token (empty list or mask "
                f"all False; {empty.size} such row(s) in this batch)"
            )
    out: dict[str, F64] = {}
    for f in wanted:
        values = raw.values[f]
        if not checked:
            what = f"column {raw.name(f)!r}"
            _raise_nonfinite(values, m, offsets, start, label, what, "row", m is not None)
        out[f] = _floating(values if m is None else values[m])
    if m is not None:
        turn = turn_index(m, offsets, int(np.count_nonzero(np.diff(new_offsets))))
        if turn is not None:
            out[TURN_FIELD] = turn
    return Batch(
        start=raw.start, offsets=new_offsets, fields=out, width=width, answer=raw.answer,
        rows=raw.rows,
    )  # fmt: skip


def _padded(raw: RawBatch, checked: bool) -> Batch:
    """Padded ``(N, L)`` arrays (flattened) and their mask to one batch of valid tokens."""
    label, N = raw.label, raw.n
    assert raw.mask is not None
    flat_mask = raw.mask
    L = int(flat_mask.shape[0] // N) if N else 0
    mask = flat_mask.reshape(N, L)
    if not checked:
        empty = np.flatnonzero(~mask.any(axis=1))
        if empty.size:
            raise InputError(
                f"{label}: answer {int(empty[0])} has no valid token (its "
                f"{raw.name('mask')!r} row is all False; {empty.size} such answer(s))"
            )
    lengths = mask.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    padded_offsets = np.arange(N + 1, dtype=np.int64) * L  # token = column of the array
    full = bool(offsets[-1] == N * L)  # no padding: the rows are the tokens (a view, no copy)
    flat: dict[str, F64] = {}
    for f, values in raw.values.items():
        if not checked:
            what = f"{raw.what} {raw.name(f)!r}"
            given = "mask" in raw.names  # an npz without a mask array: every token counts
            _raise_nonfinite(values, flat_mask, padded_offsets, 0, label, what, "answer", given)
        flat[f] = _floating(values if full else values[flat_mask])
    turn = None if full else turn_index(flat_mask, padded_offsets, int(np.count_nonzero(lengths)))
    if turn is not None:
        flat[TURN_FIELD] = turn
    width = np.full(N, L, dtype=np.int64)
    return Batch(
        start=raw.start, offsets=offsets, fields=flat, width=width, answer=raw.answer,
        rows=raw.rows,
    )  # fmt: skip


def _raise_nonfinite(
    raw: np.ndarray,
    m: NDArray[np.bool_] | None,
    offsets: I64,
    start: int,
    label: str,
    what: str,
    unit: str,
    masked: bool,
) -> None:
    """Raise on the first NaN/inf of ``raw`` where the mask ``m`` (None: everywhere) is True,
    naming the answer and its token position (in a padded array, the column); without a
    mask in the input (``masked`` False), how to give one."""
    got = _first_nonfinite(raw, m, offsets)
    if got is None:
        return
    k, i, count = got
    where = "inside the mask" if masked else "(no mask: every token counts)"
    hint = "" if masked else "; if it marks padding, give the mask (--column mask=NAME)"
    raise InputError(
        f"{label}: {what} has {raw[k]} {where} at {unit} {start + i}, "
        f"token {k - int(offsets[i])} ({count} non-finite valid token(s) in this batch){hint}"
    )


def _floating(v: np.ndarray) -> F64:
    """Floating arrays as they are (float32 stays float32: the kernels ask numpy for float64
    results, converting on the fly); anything else to float64."""
    if np.issubdtype(v.dtype, np.floating):
        return v
    return v.astype(np.float64)


def mask_values(m: np.ndarray, label: str, what: str) -> NDArray[np.bool_]:
    """A mask as booleans: booleans as they are, 0/1 integers or floats converted; any
    other value or dtype is an :class:`InputError` naming ``what``."""
    if m.dtype == np.bool_:
        return m
    if np.issubdtype(m.dtype, np.integer) or np.issubdtype(m.dtype, np.floating):
        ok = (m == 0) | (m == 1)
        if not ok.all():
            bad = np.argwhere(~ok)[0]
            raise InputError(
                f"{label}: {what} holds {m[tuple(bad)]} at {tuple(int(i) for i in bad)}; "
                f"expected booleans or 0/1"
            )
        return m.astype(np.bool_)
    raise InputError(f"{label}: {what} has dtype {m.dtype}, expected booleans or 0/1")


# --------------------------------------------------------------------- slicing
def token_ranges(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` ranges of at most ``size`` that cover ``0 .. n-1``."""
    return ((lo, min(n, lo + size)) for lo in range(0, n, size))


@dataclass(frozen=True)
class Part:
    """A run of a batch's answers: whole answers, or one answer longer than
    :data:`SLICE_TOKENS` (``long``), which its consumer folds a slice at a time
    (:meth:`slices`). ``first`` is the batch's index of its first answer; ``adv`` the
    run's advantages (one per answer, or one per token: ``per_token``), or None."""

    first: int
    batch: Batch
    adv: F64 | None
    long: bool
    per_token: bool

    @property
    def stop(self) -> int:
        return self.first + self.batch.n

    def slices(self, *, reverse: bool = False) -> Iterator[tuple[int, int, Batch, F64 | None]]:
        """``(lo, hi, piece, adv)``: the answer's tokens ``lo .. hi-1`` as a one-answer
        batch and their advantages (the answer's one, or the piece's per-token ones)."""
        n = int(self.batch.offsets[-1])
        ranges = list(token_ranges(n, SLICE_TOKENS))
        for lo, hi in reversed(ranges) if reverse else ranges:
            a = self.adv
            if a is not None and self.per_token:
                a = a[lo:hi]
            yield lo, hi, self.batch.tokens(lo, hi), a


def parts(b: Batch, adv: F64 | None = None) -> Iterator[Part]:
    """The batch cut into runs of whole answers, and each answer longer than
    :data:`SLICE_TOKENS` a run of its own; ``adv``: ``(b.n,)`` or ``(T_b,)``, cut along."""
    per_token = adv is not None and adv.shape != (b.n,)
    big = np.flatnonzero(np.diff(b.offsets) > SLICE_TOKENS)
    i = 0
    for k in [*big.tolist(), None]:
        j = b.n if k is None else k
        if j > i or (k is None and i == 0 and b.n == 0):
            yield _part(b, adv, per_token, i, j, long=False)
        if k is not None:
            yield _part(b, adv, per_token, k, k + 1, long=True)
            i = k + 1


def _part(b: Batch, adv: F64 | None, per_token: bool, i: int, j: int, *, long: bool) -> Part:
    sub = b if (i, j) == (0, b.n) else b.answers(i, j)
    a = adv
    if adv is not None and sub is not b:
        a = adv[b.offsets[i] : b.offsets[j]] if per_token else adv[i:j]
    return Part(i, sub, a, long, per_token)
