"""The small mergeable parts a fold is made of: sums, counts, moments and per-answer helpers.

Each part has ``update``/``add`` (one batch) and ``merge`` (another part of the same
settings): merging two equals folding their batches together (to the order of float
additions), wherever they were folded."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..batch import Batch, Part, parts
from ..core import (
    FloatArray,
    SequenceMeans,
    aggregation_divisor,
    aggregation_rule,
    dot,
    log_ratio,
    segment_count,
    segment_sum,
    sequence_sums,
    suffix_sum,
    token_terms,
)
from ..core import kernel as _fast
from ..core.stats import IntCounts
from ..records import RolloutReport
from ..settings import Settings
from .mistakes import LOGP_FIELDS

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
        # the other trainers' mismatch metrics (grpo_cli.finalize.mismatch): Σ exp|δ|,
        # Σ (exp(−δ) + δ − 1), Σ of the Jensen–Shannon terms, Σ δ²; by answer, with m_i =
        # mean_t δ: Σ m, Σ |m|, max −m, min −m, Σ exp(−m), Σ exp(m), Σ mean_t ρ,
        # Σ mean_t (p_old − p_rollout), Σ Σ_t (p_old − p_rollout)
        self.tok = dict.fromkeys(("exp_abs", "reverse_k3", "js", "d2"), 0.0)
        self.seq = dict.fromkeys(
            ("m", "abs_m", "exp_neg_m", "exp_m", "rho_mean", "pdiff_mean", "pdiff_sum"), 0.0
        )
        self.seq_max, self.seq_min, self.seq_n = -math.inf, math.inf, 0

    def update(self, delta: F64, old: FloatArray, rollout: FloatArray, offsets: I64) -> None:
        s, rho, pdiff = self.update_tokens(delta, old, rollout, offsets)
        self.update_answers(s, np.diff(offsets), rho, pdiff)

    def update_tokens(
        self, delta: F64, old: FloatArray, rollout: FloatArray, offsets: I64
    ) -> tuple[F64, F64, F64]:
        """Fold in the tokens; returns each answer's ``Σ_t δ`` (its log weight, or the part
        of it these tokens hold), ``Σ_t ρ`` and ``Σ_t (p_old − p_rollout)``, for
        :meth:`update_answers`."""
        if delta.shape[0] == 0:
            z = np.zeros(offsets.shape[0] - 1)
            return z, z, z
        self.tokens += int(delta.shape[0])
        a = np.abs(delta)
        self.abs_sum += float(np.sum(a))
        self.abs_max = max(self.abs_max, float(np.max(a)))
        self.d_sum += float(np.sum(delta))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            r = _fast.exp(delta)
            k3 = r - delta
            k3 -= 1.0
            self.k3_sum += float(np.sum(k3))
            self.r_sum += float(np.sum(r))
            self.r2_sum += dot(r, r)
            # probabilities: a difference, not a ratio, of exponentials is the metric itself
            lo, lr = np.asarray(old, dtype=np.float64), np.asarray(rollout, dtype=np.float64)
            p_old, p_rollout = _fast.exp(lo), _fast.exp(lr)
            pdiff = p_old - p_rollout
            self.p_sum += float(np.sum(np.abs(pdiff)))
            inv = 1.0 / r  # e^{−δ}; e^{|δ|} and e^{−|δ|} are the larger and the smaller
            self.tok["exp_abs"] += float(np.sum(np.maximum(r, inv)))
            self.tok["reverse_k3"] += float(np.sum(inv + delta - 1.0))
            # JS: ½ k3 of each side against the mixture m = ½ (p_old + p_rollout). With x, y
            # the sides' log ratios to m, e^x + e^y = 2, so the sum is −(x + y)/2 = log m −
            # (lo + lr)/2 = |δ|/2 + log(1 + e^{−|δ|}) − log 2 (= log cosh(δ/2)): δ alone
            js = 0.5 * a + np.log1p(np.minimum(r, inv)) - math.log(2.0)
            self.tok["js"] += float(np.sum(js))
            self.tok["d2"] += dot(delta, delta)
        self.r_min = min(self.r_min, float(np.min(r)))
        self.r_max = max(self.r_max, float(np.max(r)))
        return segment_sum(delta, offsets), segment_sum(r, offsets), segment_sum(pdiff, offsets)

    def update_answers(
        self, s: F64, lengths: I64 | None = None, rho: F64 | None = None, pdiff: F64 | None = None
    ) -> None:
        """Fold in whole answers by their log weights ``s_i = Σ_t δ`` and, with their
        lengths, ``Σ_t ρ`` and ``Σ_t (p_old − p_rollout)``, the per-answer means."""
        if s.shape[0] == 0:
            return
        if lengths is not None and rho is not None and pdiff is not None:
            n = np.maximum(lengths, 1).astype(np.float64)
            m = s / n
            with np.errstate(over="ignore"):
                self.seq["m"] += float(np.sum(m))
                self.seq["abs_m"] += float(np.sum(np.abs(m)))
                self.seq["exp_neg_m"] += float(np.sum(np.exp(-m)))
                self.seq["exp_m"] += float(np.sum(np.exp(m)))
                self.seq["rho_mean"] += float(np.sum(rho / n))
                self.seq["pdiff_mean"] += float(np.sum(pdiff / n))
                self.seq["pdiff_sum"] += float(np.sum(pdiff))
            self.seq_max = max(self.seq_max, float(np.max(-m)))
            self.seq_min = min(self.seq_min, float(np.min(-m)))
            self.seq_n += int(s.shape[0])
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
        for k in self.tok:
            self.tok[k] += o.tok[k]
        for k in self.seq:
            self.seq[k] += o.seq[k]
        self.seq_max, self.seq_min = max(self.seq_max, o.seq_max), min(self.seq_min, o.seq_min)
        self.seq_n += o.seq_n
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
        self.total += dot(x, m)
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
                self.pp[i] += dot(p[i], p[i])
            if gk is not None:
                k = (gk, gk * inv)
                for i in (0, 1):
                    self.kk[i] += dot(k[i], k[i])
                    for j in (0, 1):
                        self.pk[i][j] += dot(p[i], k[j])
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
    rollout_rho: F64 | None = None  # Σ exp(old_logp − rollout_logp)
    rollout_pdiff: F64 | None = None  # Σ (p_old − p_rollout)
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
    (:func:`grpo_cli.core.sequence_sums`)."""
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


def divisor_of(s: Settings, agg: str, answers: int, tokens: int, longest: int) -> float:
    """:func:`grpo_cli.core.aggregation_divisor` under the settings: L is ``max_len``,
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
