"""Data mistakes a batch can show and a valid file can still carry: padding counted as
tokens, and log-probs aligned one position off the sampler's.

Two mergeable parts of :class:`grpo_cli.fold.tokens.TokenPartial` (each ``update`` with a
batch of valid tokens, ``merge`` with another part's, ``report`` a record): the objective
warns from them (:func:`grpo_cli.finalize.objective.data_mistakes`) and ``check`` has a rule on each
(``unmasked-padding``, ``logp-alignment``).

- :class:`ClosingZeros`: answers whose valid tokens close with a run of exact 0.0 in every
  log-prob field present. A real log-prob is exactly 0.0 only for a token of probability 1
  in the model's dtype; two such tokens closing most answers, in the trainer's and the
  reference's log-probs alike, is the padding value of a file written without its mask.
- :class:`AlignmentSums`: the Pearson correlation of the trainer's log-probs of the sampled
  tokens (``old_logp``, else ``logp``) with ``rollout_logp`` at the same position and at
  the neighbouring ones, within answers. Two policies scoring the same tokens agree token
  by token (correlation near 1; the neighbour's is that of a token with the next one's,
  far lower); one array shifted by a position makes a neighbour's win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..batch import Batch
from ..core import dot
from ..io.fields import LOGP_FIELDS

__all__ = ["ALIGNMENT_EVERY", "CLOSING_RUN", "LOGP_FIELDS", "AlignmentSums", "ClosingZeros"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

CLOSING_RUN = 2  # exact zeros that close an answer to count it as padded
ALIGNMENT_EVERY = 8  # the alignment sums read the answers whose input row is a multiple


@dataclass
class ClosingZeros:
    """Answers of at least :data:`CLOSING_RUN` valid tokens (``answers``), those closing
    with a run of at least that many exact 0.0 in every log-prob field (``closing``), and
    the tokens of those runs (``tokens``)."""

    answers: int = 0
    closing: int = 0
    tokens: int = 0

    def update(self, b: Batch) -> None:
        ends = b.offsets[1:]
        long = np.flatnonzero(np.diff(b.offsets) >= CLOSING_RUN)
        if not long.size:
            return
        self.answers += int(long.size)
        present = [b.fields[f] for f in LOGP_FIELDS if f in b.fields]
        closing = long
        for k in range(1, CLOSING_RUN + 1):  # the last CLOSING_RUN tokens: O(answers)
            for v in present:
                closing = closing[v[ends[closing] - k] == 0]
        if not closing.size:
            return
        self.closing += int(closing.size)
        zero = np.ones(int(b.offsets[-1]), dtype=np.bool_)
        for v in present:
            zero &= v == 0
        # the last nonzero position of each closing answer (its start − 1 when none)
        starts = b.offsets[closing]
        pos = np.append(np.where(zero, -1, np.arange(zero.shape[0])), -1)
        last = np.maximum.reduceat(pos, np.column_stack([starts, ends[closing]]).ravel())[::2]
        last = np.maximum(last, starts - 1)
        self.tokens += int(np.sum(ends[closing] - 1 - last))

    def merge(self, o: ClosingZeros) -> ClosingZeros:
        self.answers += o.answers
        self.closing += o.closing
        self.tokens += o.tokens
        return self

    @property
    def share(self) -> float:
        """The share of the answers examined that close in zeros (0 when none was)."""
        return self.closing / self.answers if self.answers else 0.0


@dataclass
class _Pairs:
    """Sums of ``x``, ``y``, their squares and products over ``n`` pairs."""

    n: int = 0
    sums: F64 = field(default_factory=lambda: np.zeros(5))

    def add(self, x: F64, y: F64) -> None:
        if not x.shape[0]:
            return
        self.n += int(x.shape[0])
        with np.errstate(over="ignore", invalid="ignore"):  # beyond float64: inf, no r
            self.sums += (np.sum(x), np.sum(y), dot(x, x), dot(y, y), dot(x, y))

    def merge(self, o: _Pairs) -> _Pairs:
        self.n += o.n
        self.sums = self.sums + o.sums
        return self

    def correlation(self) -> float | None:
        """Pearson's r (None with fewer than 3 pairs, a constant side, or sums beyond
        float64)."""
        if self.n < 3:
            return None
        sx, sy, sxx, syy, sxy = (float(v) for v in self.sums)
        n = self.n
        vx, vy = sxx - sx * sx / n, syy - sy * sy / n
        if not (vx > 0 and vy > 0 and math.isfinite(vx * vy)):
            return None
        return max(-1.0, min(1.0, (sxy - sx * sy / n) / math.sqrt(vx * vy)))


@dataclass
class AlignmentSums:
    """The sums behind the correlations of the trainer's log-probs with ``rollout_logp``
    at the same position (``same``), with the sampler's next token (``next``: x[t],
    y[t+1]) and the previous one (``previous``: x[t+1], y[t]), over the valid tokens of
    the answers whose input row is a multiple of :data:`ALIGNMENT_EVERY` (the same
    answers however the input is batched), pairs within an answer only.
    Exact zeros (padding) and non-finite values leave their pairs out."""

    same: _Pairs = field(default_factory=_Pairs)
    next: _Pairs = field(default_factory=_Pairs)
    previous: _Pairs = field(default_factory=_Pairs)

    def update(self, b: Batch) -> None:
        y_all = b.fields.get("rollout_logp")
        if y_all is None or not b.n:
            return
        x_all = b.fields.get("old_logp", b.fields["logp"])
        rows = np.arange(b.start, b.start + b.n) if b.rows is None else b.rows
        chosen = np.flatnonzero(rows % ALIGNMENT_EVERY == 0)
        if not chosen.size:
            return
        lo, hi = b.offsets[chosen], b.offsets[chosen + 1]
        # the chosen answers' tokens, and where each answer starts among them
        x = np.concatenate([x_all[a:z] for a, z in zip(lo, hi, strict=True)]).astype(np.float64)
        y = np.concatenate([y_all[a:z] for a, z in zip(lo, hi, strict=True)]).astype(np.float64)
        good = np.isfinite(x) & np.isfinite(y) & (x != 0) & (y != 0)
        self.same.add(x[good], y[good])
        if x.shape[0] < 2:
            return
        # pair t with t+1 unless t+1 starts an answer
        inside = np.ones(x.shape[0] - 1, dtype=np.bool_)
        starts = np.cumsum(hi - lo)[:-1]
        inside[starts[starts < x.shape[0]] - 1] = False
        pn = inside & good[:-1] & good[1:]
        self.next.add(x[:-1][pn], y[1:][pn])
        self.previous.add(x[1:][pn], y[:-1][pn])

    def merge(self, o: AlignmentSums) -> AlignmentSums:
        self.same.merge(o.same)
        self.next.merge(o.next)
        self.previous.merge(o.previous)
        return self

    def report(self) -> dict[str, float | int | None] | None:
        """``pairs`` and the three correlations, or None without ``rollout_logp``."""
        if not self.same.n:
            return None
        return {
            "pairs": self.same.n,
            "same": self.same.correlation(),
            "next": self.next.correlation(),
            "previous": self.previous.correlation(),
        }


def shifted(corr: dict[str, float | int | None] | None) -> str | None:
    """The neighbour (``"next"`` or ``"previous"``) whose correlation beats the same
    position's, or None (no rollout, too few pairs, or the same position wins)."""
    if corr is None or corr["pairs"] is None or int(corr["pairs"]) < 100:
        return None
    same = corr["same"]
    best: tuple[float, str] | None = None
    for side in ("next", "previous"):
        v = corr[side]
        if v is not None and (same is None or v > same) and (best is None or v > best[0]):
            best = (float(v), side)
    return None if best is None else best[1]
