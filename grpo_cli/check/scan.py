"""The check's own pass over the raw batches: integrity counts and the places they were
found (:class:`Scan`, mergeable as :class:`CheckPartial`), and the facts the rules read."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import batch as _batch
from ..batch import RawBatch, length_mismatches, nonfinite_flags, token_ranges, valid_lengths
from ..fold.tokens import TokenPartial
from ..io import Answers, Source
from ..io.fields import FLAG_FIELDS, LOGP_FIELDS
from ..logged import LoggedInput
from ..records import ObjectiveReport
from .base import MAX_EXAMPLES, CheckConfig


# ----------------------------------------------------------------------------- facts
@dataclass
class Scan:
    """What the integrity scan of the raw token arrays found."""

    tokens: int = 0
    rows: int = 0
    nonfinite: int = 0
    nonfinite_ex: list[dict[str, Any]] = field(default_factory=list)
    positive: int = 0
    positive_ex: list[dict[str, Any]] = field(default_factory=list)
    zero: int = 0
    mismatch: int = 0
    mismatch_ex: list[dict[str, Any]] = field(default_factory=list)
    empty: int = 0
    empty_ex: list[dict[str, Any]] = field(default_factory=list)
    offpolicy: int = 0
    offpolicy_max: float = 0.0
    offpolicy_ex: list[dict[str, Any]] = field(default_factory=list)
    # answers of a recorded step without a valid token: the trainer masks them whole (TRL's
    # truncated completions), so they are left out, not an integrity problem
    masked_whole: int = 0

    def problems(self) -> tuple[int, int, int]:
        """The counts that make a batch unusable for the objective."""
        return (self.nonfinite, self.mismatch, self.empty)

    def merge(self, o: Scan) -> Scan:
        """Counts add up; the examples kept are the first by row (then token), as if one
        scan had read every batch in row order."""
        for name in (
            "tokens",
            "rows",
            "nonfinite",
            "positive",
            "zero",
            "mismatch",
            "empty",
            "masked_whole",
        ):
            setattr(self, name, getattr(self, name) + getattr(o, name))
        self.offpolicy += o.offpolicy
        self.offpolicy_max = max(self.offpolicy_max, o.offpolicy_max)
        for name in ("nonfinite_ex", "positive_ex", "mismatch_ex", "empty_ex", "offpolicy_ex"):
            both = getattr(self, name) + getattr(o, name)
            both.sort(key=lambda e: (e["answer"], e.get("token", -1)))
            setattr(self, name, both[:MAX_EXAMPLES])
        return self


@dataclass
class CheckPartial:
    """What ``check`` folds from each raw batch: the integrity scan and, while every batch
    so far was clean, the objective's token partial."""

    scan: Scan
    objective: TokenPartial | None
    invalid: bool = False  # a batch failed integrity: the objective will not be reported

    def merge(self, o: CheckPartial) -> CheckPartial:
        self.scan.merge(o.scan)
        if self.objective is not None and o.objective is not None:
            self.objective.merge(o.objective)
        self.invalid = self.invalid or o.invalid
        return self


@dataclass
class Facts:
    src: Source
    answers: Answers
    scan: Scan
    report: ObjectiveReport | None
    why_no_report: str
    advantages: NDArray[np.float64] | None
    config: CheckConfig
    logged: LoggedInput | None = None

    def where(self, row: int, **extra: Any) -> dict[str, Any]:
        return _location(self.answers, self._file_of(row), row, **extra)

    def _file_of(self, row: int) -> str:
        return str(self.src.paths[self.src.file_of(row)[0]])


# ------------------------------------------------------------------------------- scan
def _location(answers: Answers, file: str, row: int, **extra: Any) -> dict[str, Any]:
    """An example location: file, answer index, group id, and whatever else is given."""
    out: dict[str, Any] = {"file": file, "answer": int(row)}
    if answers.codes is not None and answers.labels is not None and row < answers.codes.shape[0]:
        out["group"] = answers.labels[int(answers.codes[row])]
    out.update(extra)
    return out


def _flagged(
    flags: NDArray[np.bool_], offsets: NDArray[np.int64], room: int, base: int = 0
) -> tuple[int, list[tuple[int, int, int]]]:
    """How many flags are set, and (flat index, answer in batch, token) of the first
    ``room``; ``flags`` cover the batch's tokens from ``base`` on."""
    idx = np.flatnonzero(flags)
    places = []
    for k in idx[: max(0, room)] + base:
        i = int(np.searchsorted(offsets, k, side="right") - 1)
        places.append((int(k), i, int(k - offsets[i])))
    return int(idx.size), places


def _scan_batch(s: Scan, rb: RawBatch, src: Source, cfg: CheckConfig) -> None:
    """Fold one raw batch into the integrity scan: count every problem (the predicates of
    :mod:`grpo_cli.batch`, which validation raises on), keep a few places. Token values are
    scanned a slice of :data:`grpo_cli.batch.SLICE_TOKENS` at a time, so that one answer
    of millions of tokens costs a few temporaries of that size, not of its length."""
    fields = rb.fields
    groups = rb.answer.get("group")

    def where(file: str, row: int, **extra: Any) -> dict[str, Any]:
        """A place in this batch: its group id from the batch's own column, so the scan
        needs no table of the whole input (any block of rows scans anywhere)."""
        out: dict[str, Any] = {"file": file, "answer": int(row)}
        if rb.unit == "row":  # parquet: the row within its file too
            out["row"] = int(row - rb.file_start)
        if groups is not None:
            out["group"] = groups[row - rb.start].as_py()
        out.update(extra)
        return out

    first = fields[0]
    off0 = rb.offsets[first]
    lengths0 = np.diff(off0)
    s.rows += rb.n
    m = rb.mask  # None: every token valid

    def where_token(k: int, i: int, t: int, **extra: Any) -> dict[str, Any]:
        return where(rb.label, rb.start + i, token=t, **extra)

    misaligned = set()
    for f, bad in sorted(length_mismatches(rb), key=lambda fb: fb[0] != "mask"):
        misaligned.add(f)
        s.mismatch += int(bad.size)
        lengths = np.diff(rb.offsets[f])
        for i in bad[: max(0, MAX_EXAMPLES - len(s.mismatch_ex))]:
            s.mismatch_ex.append(
                where(
                    rb.label,
                    rb.start + int(i),
                    field="mask" if f == "mask" else src.name(f),
                    length=int(lengths[i]),
                    expected=int(lengths0[i]),
                )
            )
    valid_per_row = valid_lengths(rb)  # an empty last answer included
    valid_per_row[lengths0 == 0] = 0
    s.tokens += int(valid_per_row.sum())
    empty = np.flatnonzero(valid_per_row == 0)
    s.empty += int(empty.size)
    for i in empty[: max(0, MAX_EXAMPLES - len(s.empty_ex))]:
        s.empty_ex.append(where(rb.label, rb.start + int(i), tokens=int(lengths0[i])))
    for f in fields:
        if f in misaligned or f in FLAG_FIELDS:
            # values of a misaligned field cannot be matched to the mask; a 0/1 flag is no
            # log-prob (its own row checks its values: ``entropy_mask_of``)
            continue
        v = rb.values[f]
        for lo, hi in token_ranges(v.shape[0], _batch.SLICE_TOKENS):
            ms = None if m is None else m[lo:hi]
            _scan_values(s, f, src.name(f), v[lo:hi], ms, lo, off0, where_token)
    if cfg.on_policy and "old_logp" in fields and "old_logp" not in misaligned:
        for lo, hi in token_ranges(int(off0[-1]), _batch.SLICE_TOKENS):
            ms = None if m is None else m[lo:hi]
            a = rb.values["logp"][lo:hi].astype(np.float64, copy=False)
            b = rb.values["old_logp"][lo:hi].astype(np.float64, copy=False)
            with np.errstate(invalid="ignore"):
                diff = (a != b) & np.isfinite(a) & np.isfinite(b)
            if ms is not None:
                diff &= ms
            n, places = _flagged(diff, off0, MAX_EXAMPLES - len(s.offpolicy_ex), lo)
            if n:
                s.offpolicy += n
                s.offpolicy_max = max(s.offpolicy_max, float(np.max(np.abs(a[diff] - b[diff]))))
                s.offpolicy_ex += [
                    where_token(k, i, t, logp=float(a[k - lo]), old_logp=float(b[k - lo]))
                    for k, i, t in places
                ]


def _scan_values(
    s: Scan,
    f: str,
    name: str,
    v: np.ndarray,
    m: NDArray[np.bool_] | None,
    lo: int,
    offsets: NDArray[np.int64],
    where_token: Callable[..., dict[str, Any]],
) -> None:
    """The token checks of field ``f`` (named ``name`` in the file) over the tokens
    ``lo ..`` of a batch of answers at ``offsets`` (``m``: their mask, None when every token
    is valid); ``where_token(k, i, t, **extra)`` places token ``k`` (answer ``i``, token
    ``t``).

    A clean slice (the common case) costs two reductions over its valid values as stored
    (gathered under the mask first: numpy's masked reductions are slower than the gather):
    a finite sum means every valid value is finite, and the maximum says that none is
    positive (below 0 for ``logp``: none is 0 either). Anything else is counted, and
    placed, token by token."""
    if v.dtype.kind == "f" and v.shape[0]:
        valid = v if m is None else v[m]
        with np.errstate(over="ignore", invalid="ignore"):  # ±1e308s may sum to inf
            finite = math.isfinite(np.add.reduce(valid))
            if finite and f == "entropy":
                return
            top = np.maximum.reduce(valid, initial=-np.inf)
        if finite and (top < 0 or (top == 0 and f != "logp")):
            return
    vf = v.astype(np.float64, copy=False)

    def count(attr: str, flags: NDArray[np.bool_], value: Callable[[int], Any]) -> None:
        """Count the flagged valid tokens into ``s.<attr>``, a few places into ``<attr>_ex``."""
        if m is not None:
            flags &= m
        ex: list[dict[str, Any]] = getattr(s, f"{attr}_ex")
        n, places = _flagged(flags, offsets, MAX_EXAMPLES - len(ex), lo)
        setattr(s, attr, getattr(s, attr) + n)
        ex += [where_token(k, i, t, field=name, value=value(k - lo)) for k, i, t in places]

    count("nonfinite", nonfinite_flags(vf, None), lambda j: str(vf[j]))
    if f == "entropy":  # an entropy is >= 0 by nature: only its finiteness is checked
        return
    with np.errstate(invalid="ignore"):
        count("positive", vf > 0, lambda j: float(vf[j]))
    if f == "logp":
        zero = vf == 0
        if m is not None:
            zero &= m
        s.zero += int(np.count_nonzero(zero))


def _fields(src: Source) -> list[str]:
    """The log-prob fields present."""
    return [f for f in LOGP_FIELDS if src.has(f)]


def _token_fields(src: Source) -> list[str]:
    """The per-token fields the objective reads, as ``objective`` reads them: the
    log-probs, the entropy and the recorded masks (TRL's ``entropy_mask``) present."""
    return src.token_fields()
