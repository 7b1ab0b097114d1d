"""Aggregation of per-token terms into one number, its weights, and the clip counts and
ratio moments the diagnostics merge."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InputError
from .ragged import dot, segment_count, segment_sum
from .types import (
    F64,
    I64,
    Aggregation,
    ClipUnit,
    NormScale,
    aggregation_divisor,
    aggregation_rule,
    check_offsets,
)


# --------------------------------------------------------------------- diagnostics
@dataclass(frozen=True)
class ClipCounts:
    """Clip counts of one batch (TRL / verl / OpenRLHF definitions), in ``unit``s.

    ``low``: ρ < 1−ε_low and A < 0 (TRL ``clip_ratio/low_mean``); ``high``: ρ > 1+ε_high
    and A > 0; ``region`` = low + high, the tokens whose gradient the clip removes (TRL
    ``region_mean``, verl ``pg_clipfrac``, OpenRLHF ``ppo_clip_ratio``); ``outside``: ρ
    outside [1−ε_low, 1+ε_high] whatever A; ``dual``: A < 0 and ρ > c (verl
    ``pg_clipfrac_lower``; 0 without a dual clip). They merge by addition (:meth:`merge`).
    """

    low: int = 0
    high: int = 0
    region: int = 0
    outside: int = 0
    dual: int = 0

    def merge(self, o: ClipCounts) -> ClipCounts:
        """The counts of both (a new record: counts are values)."""
        return ClipCounts(
            self.low + o.low,
            self.high + o.high,
            self.region + o.region,
            self.outside + o.outside,
            self.dual + o.dual,
        )


def clip_counts(
    ratio: F64,
    adv: F64,
    offsets: I64,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    unit: ClipUnit = "tokens",
) -> ClipCounts:
    """Count the tokens (``unit="tokens"``) or answers (``"sequences"``: an answer counts
    once if any of its tokens is clipped, as TRL logs GSPO) of each clip class.

    Args:
        ratio: ``(T,)`` the ratio the surrogate used (token or sequence level).
        adv: ``(N,)`` one advantage per answer, or ``(T,)`` one per token (OpenRLHF's KL
            in the reward makes them vary within an answer).
        offsets: ``(N+1,)``.

    Returns:
        :class:`ClipCounts`.

    Example:
        >>> clip_counts(np.array([0.5, 1.0, 1.5]), np.array([-1.0, 1.0]), np.array([0, 2, 3]))
        ClipCounts(low=1, high=1, region=2, outside=2, dual=0)
    """
    counts = answer_clip_tokens(
        ratio, adv, offsets, clip_eps=clip_eps, clip_eps_high=clip_eps_high, dual_clip=dual_clip
    )
    return clip_counts_of(*counts, unit=unit)


def answer_clip_tokens(
    ratio: F64,
    adv: F64,
    offsets: I64,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[I64, I64, I64, I64]:
    """Per answer, its tokens of each clip class of :class:`ClipCounts`: ``(low, high,
    outside, dual)``, ``(N,)`` counts each (counts of a token range add up, so an answer
    can be counted a slice at a time); :func:`clip_counts` sums them in its unit."""
    offsets = check_offsets(offsets, ratio.shape[0])
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    is_below, is_above = ratio < 1.0 - clip_eps, ratio > 1.0 + hi
    outside = segment_count(is_below | is_above, offsets)
    no_dual = np.zeros(offsets.shape[0] - 1, dtype=np.int64)
    if adv.shape == ratio.shape and adv.shape != (offsets.shape[0] - 1,):  # per token
        neg_t = adv < 0
        low = segment_count(is_below & neg_t, offsets)
        high = segment_count(is_above & (adv > 0), offsets)
        dual = no_dual if dual_clip is None else segment_count((ratio > dual_clip) & neg_t, offsets)
        return low, high, outside, dual
    if adv.shape != (offsets.shape[0] - 1,):
        raise InputError(f"adv: expected shape ({offsets.shape[0] - 1},), got {adv.shape}")
    neg = adv < 0
    low, high = segment_count(is_below, offsets), segment_count(is_above, offsets)
    low[~neg] = 0
    high[~(adv > 0)] = 0  # NaN advantages clip neither way (as the kernel counts)
    dual = no_dual
    if dual_clip is not None:
        dual = segment_count(ratio > dual_clip, offsets)
        dual[~neg] = 0
    return low, high, outside, dual


def clip_counts_of(
    low: I64, high: I64, outside: I64, dual: I64, unit: ClipUnit = "tokens"
) -> ClipCounts:
    """:class:`ClipCounts` from :func:`answer_clip_tokens`' per-answer counts: their sums
    (``unit="tokens"``), or the answers with any such token (``"sequences"``)."""
    if unit == "sequences":
        low, high = np.minimum(low, 1), np.minimum(high, 1)
        outside, dual = np.minimum(outside, 1), np.minimum(dual, 1)
    lo, hi = int(low.sum()), int(high.sum())
    return ClipCounts(lo, hi, lo + hi, int(outside.sum()), int(dual.sum()))


def answer_clip_counts(
    ratio: F64,
    adv: F64,
    offsets: I64,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> tuple[I64, I64]:
    """Per answer, its low-clipped (ρ < 1−ε_low, A < 0) and high-clipped (ρ > 1+ε_high,
    A > 0) tokens: ``(N,)`` counts each. TRL logs the extremes of their shares
    (``clip_ratio/low_min``, ``clip_ratio/high_max``).

    Example:
        >>> answer_clip_counts(np.array([0.5, 0.7, 1.5]), np.array([-1.0, 1.0]),
        ...                    np.array([0, 2, 3]))
        (array([2, 0]), array([0, 1]))
    """
    low, high, _, _ = answer_clip_tokens(
        ratio, adv, offsets, clip_eps=clip_eps, clip_eps_high=clip_eps_high
    )
    return low, high


def ratio_moments(delta: F64) -> tuple[float, float, int]:
    """``(Σρ, Σρ², n_inf)`` of the raw per-token ratio ``ρ = exp(Δ)``, ``Δ = logp − old_logp``
    before any clamp: the ratio's mean and spread merge from these; ``n_inf`` counts ratios
    that overflow to inf (then Σρ is inf and no spread is defined).

    Example:
        >>> ratio_moments(np.log(np.array([0.5, 2.0])))
        (2.5, 4.25, 0)
    """
    with np.errstate(over="ignore"):
        r = np.exp(delta)
    total = float(np.sum(r))
    n_inf = int(np.count_nonzero(np.isinf(r))) if math.isinf(total) else 0
    return total, dot(r, r), n_inf


def aggregation_weights(
    lengths: ArrayLike,
    *,
    agg: Aggregation = "seq-mean-token-mean",
    answers: int | None = None,
    tokens: int | None = None,
    max_len: int | None = None,
    norm_scale: NormScale = "n-lmax",
) -> F64:
    """The weight of one token of an answer of each length in :func:`aggregate`:
    ``aggregate(v) = Σ_i w(|o_i|) Σ_t v_{i,t}``.

    ``seq-mean-token-mean`` ``1/(N·|o_i|)``; ``token-mean`` ``1/T``; ``seq-mean-token-sum``
    ``1/N``; ``seq-mean-token-sum-norm`` ``1/(N·L)`` (``lmax``: ``1/L``); ``token-sum`` 1.
    ``answers`` (N), ``tokens`` (T) and ``max_len`` (L) default to those of ``lengths``.

    Example:
        >>> aggregation_weights([1, 3], agg="seq-mean-token-mean").tolist()
        [0.5, 0.16666666666666666]
    """
    ln = np.asarray(lengths, dtype=np.float64)
    rule = aggregation_rule(agg)
    n = ln.shape[0] if answers is None else answers
    t = float(ln.sum()) if tokens is None else tokens
    lmax = (float(ln.max()) if ln.shape[0] else 0.0) if max_len is None else float(max_len)
    d = aggregation_divisor(agg, answers=n, tokens=t, max_len=lmax, norm_scale=norm_scale)
    if rule.answer_mean:
        return 1.0 / (d * ln)
    return np.full(ln.shape, 1.0 / d)


# ----------------------------------------------------------------------- aggregation
def aggregate(
    values: F64,
    offsets: I64,
    *,
    agg: Aggregation = "seq-mean-token-mean",
    max_len: int | None = None,
    norm_scale: NormScale = "n-lmax",
) -> float:
    """Reduce per-token values to one number.

    - ``seq-mean-token-mean``: ``(1/N) Σ_i (1/|o_i|) Σ_t v`` (DeepSeekMath, Shao et al. 2024);
    - ``token-mean``: ``Σ v / T`` (DAPO, Yu et al. 2025; TRL ``dapo``, verl's default);
    - ``seq-mean-token-sum``: ``(1/N) Σ_i Σ_t v`` (verl);
    - ``seq-mean-token-sum-norm``: ``Σ v / (N · L)`` (Dr. GRPO, Liu et al. 2025; TRL
      ``dr_grpo`` with L = ``max_completion_length``; verl >= 0.7.1 ``agg_loss`` with L =
      ``loss_scale_factor``, else the padded width), ``L = max_len`` or the widest row;
      ``norm_scale="lmax"`` divides by ``L`` alone (verl <= 0.7.0);
    - ``token-sum``: ``Σ v`` (verl 0.9.1 ``token-sum``).

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets`, an answer has
            no token, or there is no answer.

    Example:
        >>> from grpo_cli.core import AGGREGATIONS
        >>> off = np.array([0, 1, 4])
        >>> [aggregate(np.ones(4), off, agg=a) for a in AGGREGATIONS]
        [1.0, 1.0, 2.0, 0.6666666666666666, 4.0]
    """
    offsets = check_offsets(offsets, values.shape[0], nonempty=True)
    if offsets.shape[0] < 2:
        raise InputError("offsets: no answer to aggregate")
    lengths = np.diff(offsets)
    rule = aggregation_rule(agg)
    lmax = int(lengths.max()) if max_len is None else int(max_len)
    d = aggregation_divisor(
        agg, answers=lengths.shape[0], tokens=values.shape[0], max_len=lmax, norm_scale=norm_scale
    )
    total = np.sum(segment_sum(values, offsets) / lengths) if rule.answer_mean else np.sum(values)
    return float(total / d)
