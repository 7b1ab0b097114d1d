"""Mergeable partial statistics: what one batch folds into, and how two merge.

:class:`TokenPartial` is made of parts, each with its own ``merge``; merging two partials
equals folding their batches together (to the order of float additions), wherever and in
whatever order they were folded. :class:`GroupPartial` is pass 1 as a partial, and
:class:`GroupTable` the small per-group table any batch computes its advantages from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from . import _fast
from ._core import (
    AGGREGATIONS,
    ClipCounts,
    FloatArray,
    GroupStats,
    SequenceMeans,
    TokenTerms,
    aggregation_divisor,
    aggregation_rule,
    aggregation_weights,
    answer_clip_tokens,
    clip_counts_of,
    difference,
    group_stats,
    kl_from_log_ratio,
    log_ratio,
    overall_std,
    ratio_moments,
    segment_count,
    segment_sum,
    sequence_sums,
    suffix_sum,
    token_gradients,
    token_terms,
)
from ._loss_fold import (
    WEIGHT_FIELD,
    LossMetrics,
    bonus_mask_of,
    correction_of,
    mask_of,
    own_correction_of,
    policy_terms,
    rejects,
)
from ._mistakes import LOGP_FIELDS, AlignmentSums, ClosingZeros
from ._stats import IntCounts, Moments, Sketch
from .batch import Batch, Part, parts
from .errors import InputError, MergeError
from .io.answers import Answers
from .io.arrow import group_ids, null_rows, numpy_of
from .losses.registry import drop_tokens
from .records import QUANTILE_LEVELS, QUANTILES, Distribution, RolloutReport
from .settings import Settings

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


# Fine histograms behind streamed quantiles (README "Quantile resolution").
LOG_RATIO_BINS = (-20.0, 20.0, 400_000)  # width 1e-4 on log-ratios: Δ and logp − ref_logp
ANSWER_BINS = (-10.0, 10.0, 200_000)  # width 1e-4 on per-answer means
ENTROPY_BINS = (0.0, 20.0, 200_000)  # width 1e-4 on per-token entropies (nats)


class RolloutPartial:
    """Mergeable sums behind :class:`RolloutReport`; answer weights kept in log space
    (running max plus rescaled sums), so no sequence weight ever overflows."""

    def __init__(self) -> None:
        self.tokens = 0
        self.answers = 0
        self.abs_sum = 0.0
        self.abs_max = 0.0
        self.d_sum = 0.0
        self.k3_sum = 0.0
        self.r_sum = 0.0
        self.r2_sum = 0.0
        self.r_min = math.inf
        self.r_max = -math.inf
        self.p_sum = 0.0
        # answers' log weights s_i = Σ_t δ: their max, Σ exp(s − max), Σ exp(2(s − max))
        self.s_max = -math.inf
        self.s1 = 0.0
        self.s2 = 0.0

    def update(self, delta: F64, old: FloatArray, rollout: FloatArray, offsets: I64) -> None:
        self.update_answers(self.update_tokens(delta, old, rollout, offsets))

    def update_tokens(self, delta: F64, old: FloatArray, rollout: FloatArray, offsets: I64) -> F64:
        """Fold in the tokens; returns each answer's ``Σ_t δ`` (its log weight, or the part
        of it these tokens hold), for :meth:`update_answers`."""
        if delta.shape[0] == 0:
            return np.zeros(offsets.shape[0] - 1)
        self.tokens += int(delta.shape[0])
        a = np.abs(delta)
        self.abs_sum += float(np.sum(a))
        self.abs_max = max(self.abs_max, float(np.max(a)))
        self.d_sum += float(np.sum(delta))
        with np.errstate(over="ignore", invalid="ignore"):
            r = np.exp(delta)
            k3 = r - delta
            k3 -= 1.0
            self.k3_sum += float(np.sum(k3))
            self.r_sum += float(np.sum(r))
            self.r2_sum += float(np.einsum("i,i->", r, r))
            # probabilities: a difference, not a ratio, of exponentials is the metric itself
            p_old = np.exp(np.asarray(old, dtype=np.float64))
            p_rollout = np.exp(np.asarray(rollout, dtype=np.float64))
            self.p_sum += float(np.sum(np.abs(p_old - p_rollout)))
        self.r_min = min(self.r_min, float(np.min(r)))
        self.r_max = max(self.r_max, float(np.max(r)))
        return segment_sum(delta, offsets)

    def update_answers(self, s: F64) -> None:
        """Fold in whole answers by their log weights ``s_i = Σ_t δ``."""
        if s.shape[0] == 0:
            return
        self.answers += int(s.shape[0])
        top = float(np.max(s))
        self._merge_weights(
            top, float(np.sum(np.exp(s - top))), float(np.sum(np.exp(2.0 * (s - top))))
        )

    def _merge_weights(self, m: float, s1: float, s2: float) -> None:
        if m == -math.inf:
            return
        if self.s_max == -math.inf:
            self.s_max, self.s1, self.s2 = m, s1, s2
            return
        top = max(self.s_max, m)
        self.s1 = self.s1 * math.exp(self.s_max - top) + s1 * math.exp(m - top)
        self.s2 = self.s2 * math.exp(2.0 * (self.s_max - top)) + s2 * math.exp(2.0 * (m - top))
        self.s_max = top

    def merge(self, o: RolloutPartial) -> RolloutPartial:
        self.tokens += o.tokens
        self.answers += o.answers
        self.abs_sum += o.abs_sum
        self.abs_max = max(self.abs_max, o.abs_max)
        self.d_sum += o.d_sum
        self.k3_sum += o.k3_sum
        self.r_sum += o.r_sum
        self.r2_sum += o.r2_sum
        self.r_min = min(self.r_min, o.r_min)
        self.r_max = max(self.r_max, o.r_max)
        self.p_sum += o.p_sum
        self._merge_weights(o.s_max, o.s1, o.s2)
        return self

    def report(self) -> RolloutReport | None:
        n = self.tokens
        if n == 0:
            return None
        mean_r, mean_r2 = self.r_sum / n, self.r2_sum / n
        # Σρ² beyond float64: one weight dominates (ESS → 0); below it (every ρ² underflows
        # to 0) the ratio is not representable: NaN, null in JSON with a warning
        ess_token = 0.0 if not math.isfinite(mean_r2) else math.nan
        if math.isfinite(mean_r2) and mean_r2 > 0.0:
            ess_token = mean_r * mean_r / mean_r2
        return RolloutReport(
            tokens=n,
            answers=self.answers,
            abs_diff_mean=self.abs_sum / n,
            abs_diff_max=self.abs_max,
            kl_k1=-self.d_sum / n,
            kl_k3=self.k3_sum / n,
            chi2_token=mean_r2 - 1.0,
            is_weight_mean=mean_r,
            is_weight_min=self.r_min,
            is_weight_max=self.r_max,
            ess_token=ess_token,
            ess_sequence=self.s1 * self.s1 / (self.answers * self.s2),
            prob_abs_diff_mean=self.p_sum / n,
        )


@dataclass
class AnswerCounts:
    """How many answers and valid tokens, the widest row, and every answer's length."""

    answers: int = 0
    tokens: int = 0
    max_width: int = 0
    lengths: IntCounts = field(default_factory=IntCounts)

    def update(self, b: Batch) -> None:
        self.answers += b.n
        self.tokens += int(b.offsets[-1])
        self.max_width = max(self.max_width, int(b.width.max()) if b.n else 0)
        self.lengths.update(b.lengths)

    def merge(self, o: AnswerCounts) -> AnswerCounts:
        self.answers += o.answers
        self.tokens += o.tokens
        self.max_width = max(self.max_width, o.max_width)
        self.lengths.merge(o.lengths)
        return self


@dataclass
class TermSums:
    """``Σ_t v`` over every token and ``Σ_i mean_t v`` over answers of a per-token value:
    every aggregation of it follows (:meth:`TokenPartial.aggregate`)."""

    token: float = 0.0
    answer_means: float = 0.0

    def add(self, per_answer: F64, lengths: I64) -> F64:
        """Fold in per-answer sums; returns the per-answer means."""
        means = per_answer / lengths
        self.token += float(np.sum(per_answer))
        self.answer_means += float(np.sum(means))
        return means

    def merge(self, o: TermSums) -> TermSums:
        self.token += o.token
        self.answer_means += o.answer_means
        return self


@dataclass
class MaskedSums:
    """``Σ x·m`` and ``Σ m`` of a per-token value under 0/1 weights ``m``."""

    total: float = 0.0
    n: int = 0

    def add(self, x: F64, m: F64) -> None:
        self.total += float(np.dot(x, m))
        self.n += int(np.count_nonzero(m))

    def merge(self, o: MaskedSums) -> MaskedSums:
        self.total += o.total
        self.n += o.n
        return self


@dataclass
class RatioMoments:
    """``Σρ``, ``Σρ²`` and overflow count of the raw ratio (:func:`ratio_moments`); ρ is
    near 1 with a spread of 1e-3..1, so ``Σρ²`` has no cancellation issue."""

    total: float = 0.0
    sq: float = 0.0
    n_inf: int = 0

    def add(self, total: float, sq: float, n_inf: int) -> None:
        self.total += total
        self.sq += sq
        self.n_inf += n_inf

    def merge(self, o: RatioMoments) -> RatioMoments:
        self.add(o.total, o.sq, o.n_inf)
        return self


@dataclass
class LogRatioSums:
    """``Σ Δ`` (raw), ``Σ clamp(Δ, ±20)`` and ``Σ d`` over valid tokens, with ``Δ = logp −
    old_logp`` and ``d = ref_logp − logp``: the trainers' ``ppo_kl`` (the mean of −Δ;
    verl's vanilla loss clamps Δ first) and OpenRLHF's ``logprobs_diff`` (the mean of −d)."""

    delta: float = 0.0
    delta20: float = 0.0
    ref: float = 0.0

    def add(self, delta: float, delta20: float, ref: float) -> None:
        self.delta += delta
        self.delta20 += delta20
        self.ref += ref

    def merge(self, o: LogRatioSums) -> LogRatioSums:
        self.add(o.delta, o.delta20, o.ref)
        return self


@dataclass
class ClipShares:
    """Over answers, the least share of low-clipped and the largest share of high-clipped
    tokens (at sequence level an answer's share is its flag, 0 or 1): TRL's
    ``clip_ratio/low_min`` and ``clip_ratio/high_max``."""

    low_min: float = math.inf
    high_max: float = -math.inf

    def add(self, low: I64, high: I64, lengths: I64, unit: str) -> None:
        if low.shape[0] == 0:
            return
        if unit == "sequences":
            lo, hi = np.minimum(low, 1), np.minimum(high, 1)
        else:
            lo, hi = low / lengths, high / lengths
        self.low_min = min(self.low_min, float(np.min(lo)))
        self.high_max = max(self.high_max, float(np.max(hi)))

    def merge(self, o: ClipShares) -> ClipShares:
        self.low_min = min(self.low_min, o.low_min)
        self.high_max = max(self.high_max, o.high_max)
        return self


@dataclass
class GradientSums:
    """Sums for ``‖∂J/∂logp‖`` over the valid tokens (:func:`token_gradients`).

    ``J = c_p Σ u_p·policy − β c_k Σ u_k·kl_loss``, where each aggregation is a global
    constant ``c`` (1/N, 1/T, 1/(N·L), 1) times a per-token ``u``: ``1/|o_i|`` for
    seq-mean-token-mean, else 1. So ``‖g‖²`` is a combination of ``Σ (u g_p)²``,
    ``Σ (u g_k)²`` and ``Σ u u' g_p g_k`` under both kinds of ``u``, all mergeable sums;
    the constants apply in :meth:`TokenPartial.gradient`.
    """

    # index 0: u = 1, index 1: u = 1/|o_i|
    pp: list[float] = field(default_factory=lambda: [0.0, 0.0])
    kk: list[float] = field(default_factory=lambda: [0.0, 0.0])
    pk: list[list[float]] = field(default_factory=lambda: [[0.0, 0.0], [0.0, 0.0]])
    tokens_policy: int = 0
    answers_policy: int = 0

    def add(self, gp: F64, gk: F64 | None, offsets: I64, lengths: I64 | None = None) -> I64:
        """Fold in the tokens of answers at ``offsets`` whose whole lengths are ``lengths``
        (default: as ``offsets`` gives; a slice of an answer passes the whole answer's);
        returns each answer's tokens of nonzero policy gradient (:meth:`count_answers`)."""
        if lengths is None:
            lengths = np.diff(offsets)
        inv = np.repeat(1.0 / lengths, np.diff(offsets))
        with np.errstate(over="ignore", invalid="ignore"):
            p = (gp, gp * inv)
            for i in (0, 1):
                self.pp[i] += float(np.dot(p[i], p[i]))
            if gk is not None:
                k = (gk, gk * inv)
                for i in (0, 1):
                    self.kk[i] += float(np.dot(k[i], k[i]))
                    for j in (0, 1):
                        self.pk[i][j] += float(np.dot(p[i], k[j]))
        nz = gp != 0.0
        self.tokens_policy += int(np.count_nonzero(nz))
        return segment_count(nz, offsets)

    def add_answers(self, g: _fast.GradientParts, lengths: I64) -> I64:
        """Fold in per-answer sums of the derivatives (the compiled kernel's) of answers
        (or slices of answers) whose whole lengths are ``lengths``: ``Σ (u g)²`` is
        ``u² Σ g²`` with ``u`` constant within an answer. Returns ``g.nonzero``."""
        inv = 1.0 / lengths
        inv2 = inv * inv
        with np.errstate(over="ignore", invalid="ignore"):
            self.pp[0] += float(np.sum(g.pp))
            self.pp[1] += float(np.sum(g.pp * inv2))
            if g.kk is not None and g.pk is not None:
                self.kk[0] += float(np.sum(g.kk))
                self.kk[1] += float(np.sum(g.kk * inv2))
                self.pk[0][0] += float(np.sum(g.pk))
                one_inv = float(np.sum(g.pk * inv))
                self.pk[0][1] += one_inv
                self.pk[1][0] += one_inv
                self.pk[1][1] += float(np.sum(g.pk * inv2))
        self.tokens_policy += int(np.sum(g.nonzero))
        return g.nonzero

    def count_answers(self, nonzero: I64) -> None:
        """Answers with a nonzero policy gradient, from :meth:`add`'s counts."""
        self.answers_policy += int(np.count_nonzero(nonzero))

    def merge(self, o: GradientSums) -> GradientSums:
        for i in (0, 1):
            self.pp[i] += o.pp[i]
            self.kk[i] += o.kk[i]
            for j in (0, 1):
                self.pk[i][j] += o.pk[i][j]
        self.tokens_policy += o.tokens_policy
        self.answers_policy += o.answers_policy
        return self


# answer lengths: 0 then powers of 2^(1/2) up to 2^24; advantages: [-5, 5] by 0.25, and
# the open ends beyond
LENGTH_EDGES = np.concatenate(([0.0], 2.0 ** np.arange(0, 24.5, 0.5)))
ADV_EDGES = np.concatenate(([-np.inf], np.linspace(-5.0, 5.0, 41), [np.inf]))


@dataclass
class LengthAdvantage:
    """Answers counted by (length, advantage) in fixed bins (:data:`LENGTH_EDGES` ×
    :data:`ADV_EDGES`, left-closed): the plot of length against advantage in bounded memory.
    Per-token advantages (KL in the reward) count by the answer's mean."""

    counts: NDArray[np.int64] = field(
        default_factory=lambda: np.zeros((LENGTH_EDGES.shape[0], ADV_EDGES.shape[0] - 1), np.int64)
    )

    def update(self, lengths: I64, a: F64) -> None:
        """Count answers of ``lengths`` with (mean) advantages ``a``."""
        ok = np.isfinite(a)
        i = np.searchsorted(LENGTH_EDGES, lengths[ok], side="right") - 1
        j = np.searchsorted(ADV_EDGES, a[ok], side="right") - 1
        np.add.at(self.counts, (i, np.minimum(j, ADV_EDGES.shape[0] - 2)), 1)

    def merge(self, o: LengthAdvantage) -> LengthAdvantage:
        self.counts += o.counts
        return self


@dataclass
class PositiveLogp:
    """Valid tokens whose log-prob is above 0 (a probability above 1), by field: ``check``
    fails on them, the objective computes on and says so."""

    counts: dict[str, int] = field(default_factory=dict)

    FIELDS = LOGP_FIELDS

    def update(self, b: Batch) -> None:
        for f in self.FIELDS:
            v = b.fields.get(f)
            if v is not None and v.shape[0] and np.max(v) > 0:  # counted only when present
                self.counts[f] = self.counts.get(f, 0) + int(np.count_nonzero(v > 0))

    def merge(self, o: PositiveLogp) -> PositiveLogp:
        for f, n in o.counts.items():
            self.counts[f] = self.counts.get(f, 0) + n
        return self


def _times(a: F64, w: F64) -> F64:
    """``a·w``, 0 where the weight is 0 (a masked token), even where ``a`` is ±inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = a * w
    return np.where(w == 0.0, 0.0, out)


def _plus(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a + b


@dataclass
class AnswerSums:
    """Per answer, what the answer-level parts of :class:`TokenPartial` take from its
    tokens: sums of token values and counts of flagged tokens, ``(n,)`` each or None when
    they do not apply. The sums over the slices of an answer add up to the whole answer's."""

    term: F64 | None = None
    policy: F64 | None = None
    kl: F64 | None = None  # the KL the loss takes
    kl_raw: F64 | None = None  # the KL estimate, when the loss takes another (bias-corrected)
    low: I64 | None = None  # clipped tokens by class (answer_clip_tokens)
    high: I64 | None = None
    outside: I64 | None = None  # with dual: given when the clip counts are made per answer
    dual: I64 | None = None
    rollout: F64 | None = None  # Σ (old_logp − rollout_logp)
    reward_kl: F64 | None = None
    old_ref: F64 | None = None
    adv: F64 | None = None  # Σ of per-token advantages (None: one advantage per answer)
    grad_nz: I64 | None = None  # tokens of nonzero policy gradient

    def __add__(self, o: AnswerSums) -> AnswerSums:
        return AnswerSums(
            **{f.name: _plus(getattr(self, f.name), getattr(o, f.name)) for f in fields(self)}
        )


@dataclass(frozen=True)
class Whole:
    """What a fold of some tokens knows of their answers as wholes: their lengths, whether
    the advantages are per token, and (when the tokens are a slice of one answer and the
    ratio is per sequence) the answer's mean ``Δ`` and the means its gradient takes."""

    lengths: I64
    per_token: bool
    seq_mean: F64 | None = None
    grad_means: SequenceMeans | None = None  # the sequence-level gradient's answer means
    # whether the fold takes the entropy, sampler, reward-KL and log-prob checks of these
    # tokens (False: a batch whose rejected tokens were removed; its whole batch gave them)
    extras: bool = True


def answer_sums(b: Batch, per_token: Callable[[Batch], F64]) -> F64:
    """Each answer's ``Σ_t per_token(batch)[t]``, a slice at a time in an answer longer
    than :data:`grpo_cli.batch.SLICE_TOKENS`."""
    out = np.empty(b.n)
    for part in parts(b):
        if part.long:
            out[part.first] = sum(float(np.sum(per_token(p))) for _, _, p, _ in part.slices())
        elif part.batch.n:
            out[part.first : part.stop] = segment_sum(per_token(part.batch), part.batch.offsets)
    return out


def suffix_sums(b: Batch, per_token: Callable[[Batch], F64], out: F64, scale: float) -> None:
    """``out[t] -= scale · Σ_{t' ≥ t} per_token(batch)[t']`` within each answer (OpenRLHF's
    returns), a slice at a time from the end in an answer longer than a slice."""
    for part in parts(b):
        sub, base = part.batch, int(b.offsets[part.first])
        if not part.long:
            if sub.n:
                out[base : base + int(sub.offsets[-1])] -= scale * suffix_sum(
                    per_token(sub), sub.offsets
                )
            continue
        later = 0.0  # the sum over the slices after this one
        for lo, hi, piece, _ in part.slices(reverse=True):
            tail = np.cumsum(per_token(piece)[::-1])[::-1] + later
            out[base + lo : base + hi] -= scale * tail
            later = float(tail[0])


def seq_mean(part: Part) -> F64:
    """A long answer's mean ``Δ = logp − old_logp``, a slice at a time."""
    logp = part.batch.fields["logp"]
    total = 0.0
    if "old_logp" in part.batch.fields:
        for _, _, piece, _ in part.slices():
            total += float(np.sum(log_ratio(piece.fields["logp"], piece.fields["old_logp"])))
    return np.array([total / logp.shape[0]])


def sequence_means(part: Part, s: Settings, seq: F64) -> SequenceMeans:
    """The answer means the sequence-level gradient of a long answer takes: its mean
    ``Δ`` ``seq`` (:func:`seq_mean`), and the rest from a first pass over its slices
    (:func:`grpo_cli._core.sequence_sums`)."""
    n = int(part.batch.offsets[-1])
    p = 0.0
    kl: float | None = None
    for _, _, piece, a in part.slices():
        assert a is not None
        f = piece.fields
        o = s.term_options()
        terms = token_terms(
            f["logp"], f.get("old_logp"), f.get("ref_logp"), a, piece.offsets, options=o,
            seq_mean=seq,
        )  # fmt: skip
        sp, sk = sequence_sums(terms, piece.offsets, options=o)
        p += float(sp[0])
        kl = None if sk is None else (kl or 0.0) + float(sk[0])
    return SequenceMeans(seq, np.array([p / n]), None if kl is None else np.array([kl / n]))


@dataclass
class UnclippedMinimum:
    """Valid tokens where the clipped surrogate's minimum is the *unclipped* term although
    ρ is outside ``[1−ε_low, 1+ε_high]``: A > 0 with ρ < 1−ε_low, or A < 0 with ρ >
    1+ε_high — what TRL 0.16.1 counts as ``clip_ratio`` (grpo_trainer.py ``compute_loss``:
    ``is_clipped = per_token_loss1 < per_token_loss2``, with ``per_token_loss1 = ρ·A``).
    Folded only when ``wanted`` (the release's ``folds``); ρ = exp(logp − old_logp), 1
    without ``old_logp`` (then no token)."""

    wanted: bool = False
    n: int = 0

    def update(self, b: Batch, adv: F64, s: Settings) -> None:
        old = b.fields.get("old_logp")
        if old is None or not b.n:
            return
        a = np.repeat(adv, b.lengths) if adv.shape[0] == b.n else adv  # one per token
        ratio = np.exp(log_ratio(b.fields["logp"], old))
        with np.errstate(invalid="ignore"):  # NaN advantages count neither way
            below = (a > 0) & (ratio < 1.0 - s.clip_eps)
            above = (a < 0) & (ratio > 1.0 + s.eps_high)
        self.n += int(np.count_nonzero(below | above))

    def merge(self, o: UnclippedMinimum) -> UnclippedMinimum:
        self.n += o.n
        return self


class TokenPartial:
    """Mergeable partial statistics of the per-token GRPO terms over a run of answers.

    Made of parts (:data:`PARTS`), each with its own ``merge``: a new statistic is a new
    part, its update in the fold, and its view. Two ways to fold a batch, with the same
    results (tests/test_kernel.py): the compiled kernel of :mod:`grpo_cli._fast` (backend
    ``c``: one pass over the token columns, when the ratio is per token and the KL has no
    bias correction, the gradient's sums included), else numpy, composed of the core's
    definitions (:func:`token_terms`, :func:`clip_counts`, :func:`ratio_moments`,
    :func:`token_gradients`).

    A loss other than the clipped surrogate (``Settings.loss``), or a sampler–trainer
    correction (``Settings.correction``), always folds in numpy, whole answers at a time
    (the kernel computes the clipped surrogate only): the loss's terms
    (:func:`grpo_cli._loss_fold.policy_terms`, the rows of :mod:`grpo_cli.losses`)
    replace the policy term, the KL term stays the settings' (β, estimator, ``kl_agg``),
    the gradient is the loss's, and its logged metrics fold in ``loss_metrics``
    (:class:`~grpo_cli._loss_fold.LossMetrics`). A loss whose row needs the whole batch
    (``Loss.whole_batch``) chooses tokens over each batch folded (the trainer's micro-batch
    when a batch is one: ``loss_metrics.notes()`` says so).
    """

    PARTS = (
        "counts",
        "term",
        "policy",
        "kl",
        "clip",
        "clip_shares",
        "ratio",
        "log_ratios",
        "delta",
        "kl_values",
        "kl_d",
        "kl_answer",
        "kl_answer_q",
        "rollout",
        "entropy",
        "entropy_q",
        "bonus_entropy",
        "reward_kl",
        "old_ref",
        "grad",
        "positive",
        "length_adv",
        "closing_zeros",
        "alignment",
        "loss_metrics",
        "unclipped_min",
    )
    OPTIONAL = ("unclipped_min",)  # folded only for a release whose metrics read them

    def __init__(
        self,
        settings: Settings,
        *,
        backend: str = "numpy",
        exact_cap: int | None = None,
        gradient: bool = False,
    ) -> None:
        self.settings = settings
        self.options = settings.term_options()
        self.gradient_wanted = gradient  # ‖∂J/∂logp‖
        self.grad = GradientSums()
        self.positive = PositiveLogp()  # log-probs > 0 inside the mask, by field
        self.length_adv = LengthAdvantage()  # answers by (length, advantage): the plot
        self.closing_zeros = ClosingZeros()  # answers closing in exact zeros (padding?)
        self.alignment = AlignmentSums()  # logp against rollout_logp, position by position
        self.exact_cap = exact_cap
        cap = {} if exact_cap is None else {"exact_cap": exact_cap}
        self.counts = AnswerCounts()
        self.term, self.policy = TermSums(), TermSums()  # policy − β·KL, and the policy part
        self.kl = TermSums()  # the KL as the loss takes it (bias-corrected when asked)
        self.clip = ClipCounts()
        self.clip_shares = ClipShares()
        self.ratio = RatioMoments()
        self.log_ratios = LogRatioSums()
        self.delta = Sketch(*LOG_RATIO_BINS, **cap)  # Δ = logp − old_logp; ρ = exp(Δ)
        self.kl_values = Moments(fast=True)  # the per-token KL estimate of logp vs ref_logp
        self.kl_d = Sketch(*LOG_RATIO_BINS, **cap)  # d = ref_logp − logp; KL is f(d)
        self.kl_answer = Moments()
        self.kl_answer_q = Sketch(*ANSWER_BINS, **cap)
        self.rollout = RolloutPartial()
        self.entropy = Moments()
        self.entropy_q = Sketch(*ENTROPY_BINS, **cap)
        self.bonus_entropy = MaskedSums()  # the entropy over the masks the trainer's bonus takes
        # with the KL in the reward: the KL the reward took (old_logp vs ref_logp) and the
        # raw old_logp − ref_logp, for the trainers' logged kl and logprobs_diff
        self.reward_kl = TermSums()
        self.old_ref = TermSums()
        # the compiled kernel folds token-level ratios; GSPO's sequence ratio and TRL's
        # bias-corrected KL stay in numpy
        # ... and a loss other than the clipped surrogate, or a correction, in numpy too
        self.compiled = (
            backend == "c" and _fast.supports_options(self.options) and not settings.numpy_only
        )
        self.loss_metrics = LossMetrics.of(settings)  # the loss's and correction's metrics
        self.unclipped_min = UnclippedMinimum(wanted="unclipped_min" in settings.folds)
        self.vector = True  # the kernel's AVX2 path where the CPU has it (tests turn it off)

    # the counts, by name
    @property
    def answers(self) -> int:
        return self.counts.answers

    @property
    def tokens(self) -> int:
        return self.counts.tokens

    @property
    def max_width(self) -> int:
        """The widest row folded (a row verl's rejection sampling removed whole included)."""
        return max(self.counts.max_width, self.loss_metrics.seen_width)

    @property
    def rows(self) -> int:
        """The answers folded and those a rejection removed whole (:meth:`_rejected`): the
        rows a trainer's seq-mean divides by."""
        return self.counts.answers + self.loss_metrics.rejected_answers

    @property
    def lengths(self) -> IntCounts:
        return self.counts.lengths

    def _kl_answers(self, per_answer: F64) -> None:
        """Fold in the per-answer mean KL."""
        self.kl_answer.update(per_answer)
        self.kl_answer_q.update(per_answer)

    # ---- the fold: token parts from the tokens, answer parts from per-answer sums
    #
    # Every batch folds in two steps: ``_tokens`` folds the parts that count tokens and
    # returns per-answer sums (:class:`AnswerSums`); ``_answers`` folds the parts that count
    # answers from those sums. An answer longer than SLICE_TOKENS goes through ``_tokens`` a
    # slice at a time and its sums add up, so that no per-token array is ever longer than a
    # slice: the answer-level results are those of the whole answer.

    def _runs(
        self,
        b: Batch,
        adv: F64 | None,
        step: Callable[[Batch, F64 | None, Whole], AnswerSums],
        *,
        extras: bool = True,
    ) -> Iterator[tuple[Batch, F64 | None, AnswerSums]]:
        for part in parts(b, adv):
            sub, a, per_token = part.batch, part.adv, part.per_token
            if not part.long or self.settings.numpy_only:  # a loss takes whole answers
                sums = step(sub, a, Whole(sub.lengths, per_token, extras=extras))
                if per_token:
                    assert a is not None
                    sums.adv = segment_sum(a, sub.offsets)
                yield sub, a, sums
                continue
            seq = grad = None
            if self.settings.ratio_level == "sequence":
                seq = seq_mean(part)
                if self.gradient_wanted and a is not None:
                    grad = sequence_means(part, self.settings, seq)
            whole = Whole(sub.lengths, per_token, seq, grad)
            total = AnswerSums()
            for k, (_, _, piece, pad) in enumerate(part.slices()):
                got = step(piece, pad, whole)
                if per_token:
                    assert pad is not None
                    got.adv = np.array([np.sum(pad)])
                total = got if k == 0 else total + got
            yield sub, a, total

    def update_kl(self, b: Batch) -> None:
        """Statistics of the KL estimate alone (``grpo-cli kl``)."""
        with np.errstate(over="ignore"):  # sums beyond float64 are inf, reported as such
            for sub, _, sums in self._runs(b, None, self._kl_tokens):
                self.counts.update(sub)
                assert sums.kl is not None
                self._kl_answers(self.kl.add(sums.kl, sub.lengths))

    def _kl_tokens(self, b: Batch, adv: F64 | None, whole: Whole) -> AnswerSums:
        d = difference(b.fields["ref_logp"], b.fields["logp"])
        k = self.kl_function()(d)
        self.kl_values.update(k)
        self.kl_d.update(d)
        return AnswerSums(kl=segment_sum(k, b.offsets))

    def update(self, b: Batch, adv: F64) -> None:
        """Fold in a batch of answers with their advantages: ``(b.n,)``, or one per token
        (the kernel takes one per answer: per-token advantages fold in numpy)."""
        self.closing_zeros.update(b)
        self.alignment.update(b)
        extras = True
        with np.errstate(over="ignore"):  # sums beyond float64 are inf, reported as such
            if rejects(self.settings):
                b, adv = self._rejected(b, adv)
                extras = False
            for sub, a, sums in self._runs(b, adv, self._tokens, extras=extras):
                assert a is not None
                self._answers(sub, a, sums)

    def _rejected(self, b: Batch, adv: F64) -> tuple[Batch, F64]:
        """verl's rejection sampling on a batch: the correction of the whole batch (its
        weights, rejection and metrics: over every token, as verl computes them before the
        update), the statistics verl takes over every token (entropy, the sampler's, the KL
        in the reward: ``_extras``) and the batch without its rejected tokens, their weights
        as :data:`WEIGHT_FIELD`, and its advantages (computed over every answer: verl's
        GRPO scores do not read the mask). An answer rejected whole leaves the batch; the
        seq-mean aggregations still count it (verl's ``global_batch_size`` is the
        mini-batch's rows)."""
        corr = correction_of(self.settings, b.fields, b.offsets)
        assert corr is not None
        self.loss_metrics.add(None, corr, b.offsets)
        self._extras(b)
        keep = corr.keep
        offsets, _, kept = drop_tokens(keep, b.offsets)
        self.loss_metrics.add_rejection(keep, kept, b.width)
        fields = {k: v[keep] for k, v in b.fields.items()}
        fields[WEIGHT_FIELD] = corr.weight[keep]
        rows = np.arange(b.start, b.start + b.n, dtype=np.int64) if b.rows is None else b.rows
        reduced = Batch(
            start=b.start, offsets=offsets, fields=fields, width=b.width[kept],
            answer={k: v.take(pa.array(kept)) for k, v in b.answer.items()}, rows=rows[kept],
        )  # fmt: skip
        return reduced, (adv[kept] if adv.shape == (b.n,) else adv[keep])

    def _extras(self, b: Batch) -> None:
        """The entropy, sampler-vs-trainer, reward-KL and positive-log-prob parts of a
        whole batch, alone (:meth:`_rejected`)."""
        for part in parts(b):
            sub = part.batch
            sums = AnswerSums()
            self._extras_tokens(sub, sums)
            self.positive.update(sub)
            self._extras_answers(sums, sub.lengths)

    def _tokens(self, b: Batch, adv: F64 | None, whole: Whole) -> AnswerSums:
        assert adv is not None
        if self.compiled and not whole.per_token:
            sums = self._tokens_compiled(b, adv, whole)
        else:
            sums = self._tokens_numpy(b, adv, whole)
        if whole.extras:
            self._extras_tokens(b, sums)
            self.positive.update(b)
        return sums

    def _answers(self, b: Batch, adv: F64, sums: AnswerSums) -> None:
        """The answer-level parts, from the per-answer sums of :meth:`_tokens`."""
        s, lengths = self.settings, b.lengths
        if self.unclipped_min.wanted:
            self.unclipped_min.update(b, adv, s)
        assert sums.term is not None and sums.policy is not None
        assert sums.low is not None and sums.high is not None
        self.counts.update(b)
        self.term.add(sums.term, lengths)
        self.policy.add(sums.policy, lengths)
        if sums.kl is not None:
            means = self.kl.add(sums.kl, lengths)
            self._kl_answers(means if sums.kl_raw is None else sums.kl_raw / lengths)
        if sums.outside is not None and sums.dual is not None:  # numpy: counted per answer
            self.clip = self.clip.merge(
                clip_counts_of(sums.low, sums.high, sums.outside, sums.dual, s.clip_unit)
            )
        self.clip_shares.add(sums.low, sums.high, lengths, s.clip_unit)
        if sums.grad_nz is not None:
            self.grad.count_answers(sums.grad_nz)
        self._extras_answers(sums, lengths)
        self.length_adv.update(lengths, adv if sums.adv is None else sums.adv / lengths)

    def _extras_answers(self, sums: AnswerSums, lengths: I64) -> None:
        """The answer-level parts of :meth:`_extras_tokens`' sums (reward KL, sampler)."""
        if sums.reward_kl is not None and sums.old_ref is not None:
            self.reward_kl.add(sums.reward_kl, lengths)
            self.old_ref.add(sums.old_ref, lengths)
        if sums.rollout is not None:
            self.rollout.update_answers(sums.rollout)

    def _tokens_compiled(self, b: Batch, adv: F64, whole: Whole) -> AnswerSums:
        """The same statistics as :meth:`_tokens_numpy`, from one pass of the kernel: its
        histogram counts merge into the two sketches, its per-answer gradient sums into
        :class:`GradientSums`."""
        f = b.fields
        logp, old, ref = f["logp"], f.get("old_logp"), f.get("ref_logp")
        out = _fast.fold(
            logp,
            old,
            ref,
            adv,
            b.offsets,
            options=self.options,
            bins=LOG_RATIO_BINS,
            gradient=self.gradient_wanted,
            vector=self.vector,
        )
        t, n = out.totals, int(b.offsets[-1])
        if out.kl is not None:
            assert ref is not None and out.x_counts is not None
            self.kl_values.merge(
                Moments.from_sums(
                    n, t.k_inf, float(np.sum(out.kl)), t.kf_sum, t.kf_sq, t.k_min, t.k_max
                )
            )
            self.kl_d.counted(n, out.x_counts, t.x_min, t.x_max, lambda: difference(ref, logp))
        # the kernel counts clipped tokens (its ratio is per token)
        self.clip = self.clip.merge(
            ClipCounts(t.n_low, t.n_high, t.n_low + t.n_high, t.n_outside, t.n_dual)
        )
        self.ratio.add(t.r_sum, t.r2_sum, t.r_inf)
        self.log_ratios.add(t.d_sum, t.d20_sum, t.x_sum)

        def delta() -> F64:
            return np.zeros(n) if old is None else log_ratio(logp, old)

        assert out.d_counts is not None
        self.delta.counted(n, out.d_counts, t.d_min, t.d_max, delta)
        sums = AnswerSums(term=out.term, policy=out.policy, kl=out.kl, low=out.low, high=out.high)
        if out.gradient is not None:
            sums.grad_nz = self.grad.add_answers(out.gradient, whole.lengths)
        return sums

    def _tokens_numpy(self, b: Batch, adv: F64, whole: Whole) -> AnswerSums:
        s = self.settings
        terms = token_terms(
            b.fields["logp"],
            b.fields.get("old_logp"),
            b.fields.get("ref_logp"),
            adv,
            b.offsets,
            options=self.options,
            seq_mean=whole.seq_mean,
        )
        loss_grad: F64 | None = None
        if s.numpy_only:  # the settings' loss in place of the clipped surrogate
            terms, loss_grad = self._loss_terms(b, adv, terms)
        sums = AnswerSums(
            term=segment_sum(terms.term, b.offsets), policy=segment_sum(terms.policy, b.offsets)
        )
        if terms.kl is not None and terms.ref_delta is not None:
            self.kl_values.update(terms.kl)
            self.kl_d.update(terms.ref_delta)
            sums.kl = segment_sum(terms.kl, b.offsets)
            if terms.kl_loss is not terms.kl:  # the loss's KL (bias-corrected) is summed; the
                assert terms.kl_loss is not None  # statistics describe the KL itself
                sums.kl_raw, sums.kl = sums.kl, segment_sum(terms.kl_loss, b.offsets)
        # clip counts on the ratio the surrogate used; the ratio's moments from the raw Δ
        sums.low, sums.high, sums.outside, sums.dual = answer_clip_tokens(
            terms.ratio,
            adv,
            b.offsets,
            clip_eps=s.clip_eps,
            clip_eps_high=s.clip_eps_high,
            dual_clip=s.dual_clip,
        )
        self.ratio.add(*ratio_moments(terms.delta))
        d = terms.delta
        ref = 0.0 if terms.ref_delta is None else float(np.sum(terms.ref_delta))
        self.log_ratios.add(float(np.sum(d)), float(np.sum(np.clip(d, -20.0, 20.0))), ref)
        self.delta.update(terms.delta)
        if self.gradient_wanted:
            gp, gk = token_gradients(
                terms, offsets=b.offsets, options=self.options, answer_means=whole.grad_means
            )
            gk = gk if self.options.beta else None  # with the KL in the reward: no KL term
            if s.numpy_only:
                gp = loss_grad if loss_grad is not None else np.zeros_like(gp)
            sums.grad_nz = self.grad.add(gp, gk, b.offsets, whole.lengths)
        return sums

    def _loss_terms(self, b: Batch, adv: F64, terms: TokenTerms) -> tuple[TokenTerms, F64 | None]:
        """``terms`` with the settings' loss (its registry row's function:
        :func:`grpo_cli._loss_fold.policy_terms`) as the policy term, the correction and the
        policy-term masks applied, the KL term unchanged; and the policy term's gradient
        (None: no closed form, the fold's gradient is then null). Folds the loss's and the
        correction's metrics."""
        s = self.settings
        row = s.loss_row
        if row.correction == "own":  # the loss computes its own correction
            own = own_correction_of(s, b.fields, adv, b.offsets)
            self.loss_metrics.add(None, own.correction, b.offsets)
            self.loss_metrics.add(own.kept, None, own.kept_offsets, batch=False)
            return self._with_kl(terms, own.terms.term), own.terms.grad
        corr = correction_of(s, b.fields, b.offsets)
        folded = WEIGHT_FIELD in b.fields  # the whole batch's correction was folded
        pt = None
        if row.terms is not None:
            pt = policy_terms(s, b.fields, adv, b.offsets, corr)
            policy, grad = pt.term, pt.grad
        else:
            policy = terms.policy if corr is None else _times(terms.policy, corr.weight)
            grad = None
            if self.gradient_wanted:
                gp, _ = token_gradients(terms, offsets=b.offsets, options=self.options)
                grad = gp if corr is None else _times(gp, corr.weight)
        mask = mask_of(s, b.fields, adv, b.offsets)
        if mask is not None:  # the trainer's masks of the policy term, its counts unchanged
            policy = _times(policy, mask)
            grad = None if grad is None else _times(grad, mask)
        if pt is not None or corr is not None:
            self.loss_metrics.add(pt, None if folded else corr, b.offsets, batch=not folded)
        return self._with_kl(terms, policy), grad

    def _with_kl(self, terms: TokenTerms, policy: F64) -> TokenTerms:
        """``terms`` with ``policy`` as the policy term, the KL term the settings'."""
        term = policy
        if terms.kl_loss is not None and self.options.beta:
            with np.errstate(over="ignore", invalid="ignore"):
                term = policy - self.options.beta * terms.kl_loss
        return dataclasses.replace(terms, policy=policy, term=term)

    def _extras_tokens(self, b: Batch, sums: AnswerSums) -> None:
        """Entropy, sampler-vs-trainer and reward-KL statistics, when they apply."""
        s = self.settings
        if s.kl_mode == "reward" and "ref_logp" in b.fields:
            old = b.fields.get("old_logp", b.fields["logp"])
            raw = difference(old, b.fields["ref_logp"])
            k = kl_from_log_ratio(
                -raw,
                estimator=s.kl_estimator,
                clamp=s.kl_clamp,
                log_ratio_clamp=s.log_ratio_clamp,
            )
            sums.reward_kl = segment_sum(k, b.offsets)
            sums.old_ref = segment_sum(raw, b.offsets)
        entropy = b.fields.get("entropy")
        if entropy is not None:
            e = np.asarray(entropy, dtype=np.float64)
            self.entropy.update(e)
            self.entropy_q.update(e)
            bonus = [m for m, _ in s.mask_rows if m.entropy_bonus]
            if bonus and all(f in b.fields for m in bonus for f in m.needs):
                self.bonus_entropy.add(e, bonus_mask_of(s, b.fields, b.offsets))
        rollout = b.fields.get("rollout_logp")
        if rollout is not None:  # the trainer's old policy is logp itself when on-policy
            old = b.fields.get("old_logp", b.fields["logp"])
            delta_r = difference(old, rollout)
            sums.rollout = self.rollout.update_tokens(delta_r, old, rollout, b.offsets)

    def merge(self, o: TokenPartial) -> TokenPartial:
        """Every part merges with its own; partials of other settings are refused."""
        if o.settings != self.settings:
            raise MergeError("partials of different settings")
        for name in self.PARTS:
            setattr(self, name, getattr(self, name).merge(getattr(o, name)))
        return self

    # ---- results
    @property
    def overflow(self) -> int:
        """Tokens whose ratio exp(Δ) overflowed to inf."""
        return self.ratio.n_inf

    def ratio_distribution(self) -> Distribution:
        """ρ = exp(Δ): mean from Σρ, extremes and quantiles from Δ's (exp is monotone)."""
        n = self.delta.n
        if n == 0:
            return Distribution(0, None, None, None, None, {})
        with np.errstate(over="ignore"):  # every Δ may be above 709.78: ρ = inf
            lo, hi = np.exp(self.delta.hist.vmin), np.exp(self.delta.hist.vmax)
        vals = self.delta.quantiles(QUANTILE_LEVELS, np.exp)
        assert vals is not None
        mean = self.ratio.total / n
        std = math.sqrt(max(self.ratio.sq / n - mean * mean, 0.0)) if not self.ratio.n_inf else None
        return Distribution(
            count=n,
            mean=mean,
            std=std,
            min=float(lo),
            max=float(hi),
            quantiles={k: float(v) for k, v in zip(QUANTILES, vals, strict=True)},
            exact=self.delta.is_exact,
        )

    @property
    def extreme(self) -> int:
        """Tokens with Δ outside [−20, 20), where verl and OpenRLHF clamp: the open end bins
        of the log-ratio histogram (LOG_RATIO_BINS)."""
        return int(self.delta.hist.counts[0] + self.delta.hist.counts[-1])

    def aggregate(self, key: str, agg: str) -> float:
        """:func:`grpo_cli._core.aggregate` of a per-token value, from the partial's sums
        (the rule of :data:`grpo_cli._core.AGGREGATION_RULES`)."""
        sums: TermSums = getattr(self, key)
        total = sums.answer_means if aggregation_rule(agg).answer_mean else sums.token
        return total / self.divisor(agg)

    def divisor(self, agg: str) -> float:
        """The constant ``D`` of ``agg`` for this partial's answers, tokens and width (L:
        ``max_len``, else the widest row: its padded width, masked tokens included, as
        verl's ``loss_mask.shape[-1]``)."""
        return divisor_of(self.settings, agg, self.rows, self.tokens, self.max_width)

    def objective(self, agg: str) -> float:
        """J under the policy aggregation ``agg``; the KL term keeps the settings' own
        (``kl_agg``): one sum of per-token terms when the two agree."""
        s = self.settings
        if s.kl_agg is None or s.kl_agg == agg or not s.beta or s.kl_mode == "reward":
            return self.aggregate("term", agg)  # (with the KL in the reward: the policy term)
        return self.aggregate("policy", agg) - s.beta * self.aggregate("kl", s.kl_agg)

    def gradient(self) -> dict[str, float] | None:
        """``‖∂J/∂logp‖`` over the valid tokens and its policy and KL parts, and the shares
        of tokens and answers whose policy part is nonzero; None when not folded."""
        g, s = self.grad, self.settings
        if not self.gradient_wanted or not self.answers or self.loss_metrics.gradient_missing:
            return None
        cp, i = agg_factor(s, s.agg, self.rows, self.tokens, self.max_width)
        kl_on = self.options.beta != 0.0
        ck, j = (
            agg_factor(s, s.kl_aggregation, self.rows, self.tokens, self.max_width)
            if kl_on
            else (0.0, 0)
        )
        beta = s.beta if kl_on else 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            pp = cp * cp * g.pp[i]
            kk = (beta * ck) ** 2 * g.kk[j]
            total = pp + kk - 2.0 * beta * cp * ck * g.pk[i][j]
        return {
            "norm": math.sqrt(max(total, 0.0)),
            "policy_norm": math.sqrt(pp),
            "kl_norm": math.sqrt(kk),
            "tokens_with_policy_gradient": g.tokens_policy / self.tokens,
            "answers_with_policy_gradient": g.answers_policy / self.answers,
        }

    def kl_function(self) -> Callable[[F64], F64]:
        """The KL estimate as a function of d = ref_logp − logp (also for its quantiles)."""
        s = self.settings

        def f(d: F64) -> F64:
            return kl_from_log_ratio(
                d,
                estimator=s.kl_estimator,
                clamp=s.kl_clamp,
                log_ratio_clamp=s.log_ratio_clamp,
            )

        return f

    def ratio_histogram(self) -> list[tuple[float, float, int]]:
        lo, hi = self.settings.clip_eps, self.settings.eps_high
        edges = [0.0, 1 - 2 * lo, 1 - lo, 1 - lo / 2, 1.0, 1 + hi / 2, 1 + hi, 1 + 2 * hi, math.inf]
        edges = sorted({e for e in edges if e >= 0})
        inner = np.log(np.array(edges[1:-1]))
        if self.delta.is_exact:
            x = np.concatenate(self.delta.exact) if self.delta.exact else np.zeros(0)
            counts = np.bincount(np.searchsorted(inner, x, side="right"), minlength=len(edges) - 1)
        else:
            rep = self.delta.hist.representatives()
            counts = np.bincount(
                np.searchsorted(inner, rep, side="right"),
                weights=self.delta.hist.counts,
                minlength=len(edges) - 1,
            )
        return [(edges[i], edges[i + 1], int(counts[i])) for i in range(len(edges) - 1)]


def divisor_of(s: Settings, agg: str, answers: int, tokens: int, longest: int) -> float:
    """:func:`grpo_cli._core.aggregation_divisor` under the settings: L is ``max_len``,
    else ``longest`` (the widest row)."""
    lmax = s.max_len if s.max_len is not None else longest
    return aggregation_divisor(
        agg, answers=answers, tokens=tokens, max_len=lmax, norm_scale=s.norm_scale
    )


def agg_factor(s: Settings, agg: str, answers: int, tokens: int, longest: int) -> tuple[float, int]:
    """An aggregation as a global constant ``c = 1/D`` and which per-token ``u`` it
    multiplies (0: 1, 1: ``1/|o_i|``): the token weight of :func:`aggregation_weights` is
    ``c·u``."""
    rule = aggregation_rule(agg)
    return 1.0 / divisor_of(s, agg, answers, tokens, longest), int(rule.answer_mean)


def length_weights(p: TokenPartial) -> list[dict[str, float]]:
    """Weight of one token, and of a whole answer, under each aggregation, by length."""
    q = p.lengths.quantiles(np.array([0.0, 0.25, 0.5, 0.75, 1.0]))
    assert q is not None
    lmax = p.settings.max_len if p.settings.max_len is not None else p.max_width
    per_token = {
        agg: aggregation_weights(
            q,
            agg=agg,
            answers=p.answers,
            tokens=p.tokens,
            max_len=lmax,
            norm_scale=p.settings.norm_scale,
        )
        for agg in AGGREGATIONS
    }
    rows = []
    for j, (label, length) in enumerate(zip(("min", "p25", "p50", "p75", "max"), q, strict=True)):
        row: dict[str, Any] = {"length": label, "tokens": float(length)}
        for agg in AGGREGATIONS:
            row[f"{agg}/token"] = float(per_token[agg][j])
            row[f"{agg}/answer"] = float(per_token[agg][j]) * length
        rows.append(row)
    return rows


# ---------------------------------------------------------------- objective command
@dataclass(frozen=True)
class GroupTable:
    """The reward statistics of every group of the input (pass 1), keyed by group id: a
    batch of answers from anywhere in the input computes its own advantages from it
    (:func:`grpo_cli._core.advantages_from_stats`), with the same result bit for bit as
    the whole input at once. Small: one row per group.
    """

    ids: pa.Array
    stats: GroupStats
    batch_std: float  # the std of every reward (scale "batch")

    def codes(self, groups: pa.Array, where: str) -> I64:
        groups = group_ids(groups)
        idx = pc.index_in(groups, value_set=self.ids)
        if idx.null_count:
            k = int(null_rows(idx)[0])
            raise InputError(f"{where}: group id {groups[k].as_py()!r} is not in pass 1's table")
        return numpy_of(idx).astype(np.int64)


def group_table(answers: Answers, settings: Settings) -> GroupTable | None:
    """Pass 1's :class:`GroupTable` (None without rewards and group ids)."""
    if answers.reward is None or answers.codes is None or answers.group_ids is None:
        return None
    r, P = answers.reward, len(answers.group_ids)
    stats = group_stats(r, answers.codes, n_groups=P, ddof=settings.ddof)
    ddof = settings.ddof
    batch_std = overall_std(r, ddof=ddof) if settings.scale == "batch" and r.size > ddof else 0.0
    return GroupTable(answers.group_ids, stats, batch_std)


class GroupPartial:
    """Pass 1 as a mergeable partial: per group id, the count, mean and squared deviations
    (merged with Chan et al.'s formula), min and max of the rewards, plus the same over
    every reward (for ``scale="batch"``). Merged in any order over any blocks, its
    :meth:`table` equals :func:`group_table` of the whole input to rounding (1e-15 relative;
    counts, extremes and zero-variance flags exactly). The local engine computes the table
    in two passes over the rewards in memory; a cluster merges these.
    """

    def __init__(self) -> None:
        self.ids: pa.Array | None = None
        self.count = np.zeros(0, dtype=np.int64)
        self.mean = np.zeros(0)
        self.m2 = np.zeros(0)
        self.lo = np.zeros(0)
        self.hi = np.zeros(0)
        self.all = Moments()

    def update(self, groups: pa.Array, rewards: F64) -> GroupPartial:
        """Fold in a block of answers: their group ids and rewards."""
        if len(groups) == 0:
            return self
        enc = groups.dictionary_encode()
        codes = numpy_of(enc.indices).astype(np.int64)
        s = group_stats(rewards, codes, n_groups=len(enc.dictionary), ddof=0)
        other = GroupPartial()
        other.ids = enc.dictionary
        other.count, other.mean, other.lo, other.hi = s.count, s.mean, s.min, s.max
        other.m2 = s.std * s.std * s.count
        other.all.update(rewards)
        return self.merge(other)

    def merge(self, o: GroupPartial) -> GroupPartial:
        if o.ids is None:
            return self
        if self.ids is None:
            self.ids, self.count, self.mean, self.m2 = o.ids, o.count, o.mean, o.m2
            self.lo, self.hi, self.all = o.lo, o.hi, Moments().merge(o.all)
            return self
        ids = pa.concat_arrays([self.ids, o.ids]).unique()
        a = numpy_of(pc.index_in(self.ids, value_set=ids)).astype(np.int64)
        b = numpy_of(pc.index_in(o.ids, value_set=ids)).astype(np.int64)
        P = len(ids)
        na, nb = np.zeros(P, dtype=np.int64), np.zeros(P, dtype=np.int64)
        na[a], nb[b] = self.count, o.count
        ma, mb, qa, qb = np.zeros(P), np.zeros(P), np.zeros(P), np.zeros(P)
        ma[a], mb[b], qa[a], qb[b] = self.mean, o.mean, self.m2, o.m2
        n = na + nb
        d = mb - ma
        self.mean = ma + d * nb / n
        self.m2 = qa + qb + d * d * na * nb / n
        lo, hi = np.full(P, np.inf), np.full(P, -np.inf)
        lo[a], hi[a] = self.lo, self.hi
        lo[b], hi[b] = np.minimum(lo[b], o.lo), np.maximum(hi[b], o.hi)
        self.ids, self.count, self.lo, self.hi = ids, n, lo, hi
        self.all.merge(o.all)
        return self

    def table(self, settings: Settings) -> GroupTable | None:
        if self.ids is None:
            return None
        ddof = settings.ddof
        with np.errstate(divide="ignore", invalid="ignore"):
            std = np.sqrt(self.m2 / (self.count - ddof))
        stats = GroupStats(
            count=self.count,
            total=self.mean * self.count,
            mean=self.mean,
            std=std,
            min=self.lo,
            max=self.hi,
        )
        n = self.all.n
        batch_std = 0.0
        if settings.scale == "batch" and n > ddof:
            batch_std = math.sqrt(self.all.m2 / (n - ddof))
        return GroupTable(self.ids, stats, batch_std)
