"""Where it happens: the entropy, the KL to the reference and the sampler–trainer mismatch
by position along the answer, as a mergeable partial (issue 29).

A token's position is its index among its answer's valid tokens (0 = the first token the
loss counts). Positions fall in fixed buckets (:data:`POSITION_EDGES`: 16 tokens wide up
to 512, then doubling), so partials of any batching merge by adding their arrays; each
bucket holds its token count and, where the field is logged, the sums of the entropy, of
the per-token KL (the settings' estimator of ``logp`` vs ``ref_logp``) and of
``|old_logp − rollout_logp|``. Folded only when asked (``explain``), so ``objective`` and
``check`` pay nothing for it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from ..batch import Batch
from ..records import PositionBucket

__all__ = ["POSITION_EDGES", "PositionSums"]

F64 = NDArray[np.float64]

# left edges of the position buckets: 0, 16, ..., 496, then 512, 1024, ..., 2**20
POSITION_EDGES = np.array([*range(0, 512, 16), *(2**k for k in range(9, 21))], dtype=np.int64)
_B = POSITION_EDGES.shape[0]


def positions(offsets: NDArray[np.int64]) -> NDArray[np.int64]:
    """Each token's index within its answer, for answers delimited by ``offsets``."""
    n = int(offsets[-1])
    starts = np.repeat(offsets[:-1], np.diff(offsets))
    out: NDArray[np.int64] = np.arange(n, dtype=np.int64) - starts
    return out


def bucket_of(pos: NDArray[np.int64]) -> NDArray[np.int64]:
    """Each position's bucket of :data:`POSITION_EDGES`, by arithmetic: ``pos // 16``
    below 512, then ``32 + ⌊log₂ pos⌋ − 9`` (the exponent of ``frexp``), the last open."""
    exp = np.frexp(pos.astype(np.float64))[1].astype(np.int64)  # ⌊log₂ pos⌋ + 1
    out: NDArray[np.int64] = np.where(pos < 512, pos >> 4, np.minimum(exp + 22, _B - 1))
    return out


class PositionSums:
    """Per position bucket: tokens, and the sums (and counts) of the entropy, the KL and
    the sampler–trainer ``|δ|`` over the tokens that have them."""

    def __init__(self, wanted: bool = False) -> None:
        self.wanted = wanted
        self.tokens = np.zeros(_B, dtype=np.int64)
        self.sums = {k: np.zeros(_B) for k in ("entropy", "kl", "mismatch")}
        self.counts = {k: np.zeros(_B, dtype=np.int64) for k in ("entropy", "kl", "mismatch")}

    def update(self, b: Batch, kl: Callable[[F64], F64]) -> None:
        """Fold in a batch of whole answers; ``kl`` maps ``ref_logp − logp`` to the
        per-token KL."""
        if not self.wanted or not b.n or int(b.offsets[-1]) == 0:
            return
        idx = bucket_of(positions(b.offsets))
        per = np.bincount(idx, minlength=_B)
        self.tokens += per
        f = b.fields
        values: dict[str, F64 | None] = {"entropy": None, "kl": None, "mismatch": None}
        if "entropy" in f:
            values["entropy"] = np.asarray(f["entropy"], dtype=np.float64)
        logp = np.asarray(f["logp"], dtype=np.float64)
        if "ref_logp" in f:
            with np.errstate(over="ignore", invalid="ignore"):
                values["kl"] = kl(np.asarray(f["ref_logp"], dtype=np.float64) - logp)
        if "rollout_logp" in f:
            old = np.asarray(f["old_logp"], dtype=np.float64) if "old_logp" in f else logp
            values["mismatch"] = np.abs(old - np.asarray(f["rollout_logp"], dtype=np.float64))
        for k, v in values.items():
            if v is None:
                continue
            good = np.isfinite(v)
            if good.all():  # (the usual case: no copy, the token counts are the counts)
                self.sums[k] += np.bincount(idx, weights=v, minlength=_B)
                self.counts[k] += per
            else:
                self.sums[k] += np.bincount(idx[good], weights=v[good], minlength=_B)
                self.counts[k] += np.bincount(idx[good], minlength=_B)

    def merge(self, o: PositionSums) -> PositionSums:
        self.wanted = self.wanted or o.wanted
        self.tokens = self.tokens + o.tokens
        for k in self.sums:
            self.sums[k] = self.sums[k] + o.sums[k]
            self.counts[k] = self.counts[k] + o.counts[k]
        return self

    def report(self) -> list[PositionBucket] | None:
        """The occupied buckets in order (None when not folded or no token)."""
        if not self.wanted or not self.tokens.any():
            return None
        out = []
        for i in np.flatnonzero(self.tokens):
            hi = int(POSITION_EDGES[i + 1]) if i + 1 < _B else None

            def mean(k: str, i: int = int(i)) -> float | None:
                n = int(self.counts[k][i])
                return float(self.sums[k][i]) / n if n else None

            out.append(PositionBucket(
                int(POSITION_EDGES[i]), hi, int(self.tokens[i]), mean("entropy"), mean("kl"),
                mean("mismatch"), int(self.counts["kl"][i]), float(self.sums["kl"][i]),
                float(self.sums["mismatch"][i]),
            ))  # fmt: skip
        return out
