"""Where it happens: the entropy, the KL to the reference and the sampler–trainer mismatch
by position along the answer, as a mergeable partial (issue 29).

A token's position is its index among its answer's valid tokens (0 = the first token the
loss counts). Positions fall in fixed buckets (:data:`POSITION_EDGES`: 16 tokens wide up
to 512, then doubling), so partials of any batching merge by adding their arrays; each
bucket holds its token count and, where the field is logged, the sums of the entropy, of
the per-token KL (the settings' estimator of ``logp`` vs ``ref_logp``) and of
``|old_logp − rollout_logp|``. Folded only when asked (``explain``), so ``objective`` and
``check`` pay nothing for it.

The same values by the sampled token's id (:class:`TokenIdSums`, when the input has a
``token_id`` column: exact sums for ids below :data:`ID_CAP`, the rest in one slot), and
by turn of a multi-turn mask (a turn: a maximal run of mask = 1 within an answer, counted
before the loader drops the masked tokens, :data:`grpo_cli.batch.TURN_FIELD`; turns from
:data:`MAX_TURNS` − 1 on share the last slot).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from ..batch import TURN_FIELD, Batch
from ..records import PositionBucket, TokenIdRow, TokenIds

__all__ = ["ID_CAP", "MAX_TURNS", "POSITION_EDGES", "PositionSums", "TokenIdSums"]

F64 = NDArray[np.float64]

# left edges of the position buckets: 0, 16, ..., 496, then 512, 1024, ..., 2**20
POSITION_EDGES = np.array([*range(0, 512, 16), *(2**k for k in range(9, 21))], dtype=np.int64)
_B = POSITION_EDGES.shape[0]
_KEYS = ("entropy", "kl", "mismatch")
MAX_TURNS = 64  # turns from the 64th on are summed together


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
        self.by_id = TokenIdSums()  # by token id, for batches that have one
        # by turn, for batches whose answers have several: tokens, then each value's sum
        self.turns = np.zeros((1 + len(_KEYS), MAX_TURNS))

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
        if "token_id" in f:
            self.by_id.update(f["token_id"], values)
        if TURN_FIELD in f:
            turn = np.minimum(np.asarray(f[TURN_FIELD]).astype(np.int64), MAX_TURNS - 1)
            self.turns[0] += np.bincount(turn, minlength=MAX_TURNS)
            for j, k in enumerate(_KEYS, 1):
                v = values[k]
                if v is not None:
                    w = np.where(np.isfinite(v), v, 0.0)
                    self.turns[j] += np.bincount(turn, weights=w, minlength=MAX_TURNS)
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
        self.by_id.merge(o.by_id)
        self.turns = self.turns + o.turns
        return self

    def by_turn(self) -> list[PositionBucket] | None:
        """Per turn (``lo`` the turn's index, 0 the first; ``hi`` None: the last, open
        slot): tokens, and the means and sums of the values (None: no multi-turn answer)."""
        if not self.wanted or not self.turns[0].any():
            return None
        out = []
        present = {k: bool(self.counts[k].any()) for k in _KEYS}
        for i in np.flatnonzero(self.turns[0]):
            n = float(self.turns[0][i])
            mean = {k: float(self.turns[j][i]) / n if present[k] else None
                    for j, k in enumerate(_KEYS, 1)}  # fmt: skip
            out.append(PositionBucket(
                int(i), int(i) + 1 if i + 1 < MAX_TURNS else None, int(n), mean["entropy"],
                mean["kl"], mean["mismatch"], int(n) if present["kl"] else 0,
                float(self.turns[2][i]), float(self.turns[3][i]),
            ))  # fmt: skip
        return out

    def token_ids(self) -> TokenIds | None:
        """The values by token id (None: not folded, or no token had an id)."""
        if not self.wanted:
            return None
        return self.by_id.report([k for k in self.counts if self.counts[k].any()])

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


# ------------------------------------------------------------------------ by token id
# ids 0 .. ID_CAP − 1 are summed exactly, one slot an id (every vocabulary up to 262,144
# tokens: Llama 3's 128,256, Qwen's 151,936, Gemma's 262,144); an id outside is summed in
# one "other" slot. The arrays grow to the largest id seen, so memory stays at most
# ID_CAP · 4 · 8 bytes (8 MiB) a partial, whatever the batch.
ID_CAP = 1 << 18


class TokenIdSums:
    """Per sampled token id: its tokens and the sums of the entropy, KL and ``|δ|`` over
    them (exact, mergeable by adding the arrays), for a batch that has ``token_id``."""

    def __init__(self) -> None:
        self.tokens = np.zeros(0, dtype=np.int64)
        self.sums = {k: np.zeros(0) for k in _KEYS}
        self.other = np.zeros(1 + len(_KEYS))  # ids outside [0, ID_CAP): tokens, sums

    def _grow(self, n: int) -> None:
        if n <= self.tokens.shape[0]:
            return
        self.tokens = np.concatenate([self.tokens, np.zeros(n - self.tokens.shape[0], np.int64)])
        for k in _KEYS:
            self.sums[k] = np.concatenate([self.sums[k], np.zeros(n - self.sums[k].shape[0])])

    def update(self, ids: NDArray[np.floating], values: dict[str, F64 | None]) -> None:
        """Fold in a batch's token ids and the per-token values (None: not logged; a
        non-finite value adds nothing)."""
        raw = np.asarray(ids, dtype=np.float64)
        inside = (raw >= 0) & (raw < ID_CAP) & (raw == np.floor(raw))
        idx = raw[inside].astype(np.int64)
        self._grow(int(idx.max()) + 1 if idx.size else 0)
        n = self.tokens.shape[0]
        self.tokens += np.bincount(idx, minlength=n)
        self.other[0] += float(np.count_nonzero(~inside))
        for j, k in enumerate(_KEYS, 1):
            v = values.get(k)
            if v is None:
                continue
            w = np.where(np.isfinite(v), v, 0.0)
            self.sums[k] += np.bincount(idx, weights=w[inside], minlength=n)
            self.other[j] += float(w[~inside].sum())

    def merge(self, o: TokenIdSums) -> TokenIdSums:
        self._grow(o.tokens.shape[0])
        n = o.tokens.shape[0]
        self.tokens[:n] += o.tokens
        for k in _KEYS:
            self.sums[k][:n] += o.sums[k]
        self.other = self.other + o.other
        return self

    def top(self, key: str, k: int = 10) -> list[TokenIdRow]:
        """The ``k`` ids holding the largest sums of ``key``, largest first."""
        s = self.sums[key]
        if not s.size:
            return []
        order = np.argsort(-s, kind="stable")[:k]
        return [
            TokenIdRow(int(i), int(self.tokens[i]), *(float(self.sums[x][i]) for x in _KEYS))
            for i in order
            if s[i] > 0
        ]

    def report(self, present: Sequence[str]) -> TokenIds | None:
        """The top ids of each logged value (``present``), with the totals."""
        if not self.tokens.any() and not self.other[0]:
            return None
        total = {k: float(self.sums[k].sum() + self.other[1 + j]) for j, k in enumerate(_KEYS)}
        return TokenIds(
            tokens=int(self.tokens.sum() + self.other[0]), ids=int(np.count_nonzero(self.tokens)),
            outside=int(self.other[0]), totals={k: total[k] for k in present},
            top={k: self.top(k) for k in present},
        )  # fmt: skip
