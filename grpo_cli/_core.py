"""Pure numpy kernels of GRPO: advantages, KL estimators, clipped surrogate, aggregation.

No I/O, no globals, numpy only. Every convention on which trainers disagree is a
keyword with a documented default (the defaults follow the seed spec and DeepSeekMath).

Shape legend, used in every docstring of the package:

- ``P`` groups (prompts) of a ``(P, G)`` reward array, ``G`` answers per group;
- ``N`` answers, ``L`` padded length of an ``(N, L)`` token array;
- ``T`` valid tokens in all (``T = Σ mask``).

Ragged layout: a token field is a flat ``(T,)`` array holding the valid tokens of answer
0, then answer 1, ...; ``offsets`` is ``(N+1,)`` int64 with ``offsets[0] == 0`` and
``offsets[-1] == T``, and answer ``i`` owns ``flat[offsets[i]:offsets[i+1]]``. This is how
Arrow list columns store the data already, and padding never exists in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, NamedTuple, TypedDict, Unpack, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import InputError, UsageError

__all__ = [
    "AGGREGATIONS",
    "AGGREGATION_RULES",
    "AdvantageEstimator",
    "Aggregation",
    "AggregationRule",
    "ClipCounts",
    "ClipUnit",
    "GroupStats",
    "KLEstimator",
    "NormScale",
    "RatioLevel",
    "Scale",
    "Singleton",
    "TermConventions",
    "TermOptions",
    "TokenTerms",
    "advantages_by_group",
    "advantages_from_stats",
    "aggregate",
    "aggregation_divisor",
    "aggregation_weights",
    "answer_clip_counts",
    "answer_clip_tokens",
    "check_offsets",
    "clip_counts",
    "clip_counts_of",
    "clipped_surrogate",
    "difference",
    "flatten_padded",
    "group_advantages",
    "group_stats",
    "grpo_objective",
    "kl_estimate",
    "kl_from_log_ratio",
    "kl_k3",
    "log_ratio",
    "ratio_moments",
    "segment_count",
    "segment_mean",
    "segment_sum",
    "sequence_log_ratio",
    "suffix_sum",
    "token_gradients",
    "token_terms",
    "used_log_ratio",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
# Log-probs as logged: float32 or float64; arithmetic on them asks numpy for float64 results.
FloatArray = NDArray[np.floating[Any]]

Scale = Literal["group", "batch", "none"]
AdvantageEstimator = Literal["grpo", "rloo"]
Singleton = Literal["zero", "raw"]
KLEstimator = Literal["k1", "k2", "k3"]
RatioLevel = Literal["token", "sequence"]
Aggregation = Literal[
    "seq-mean-token-mean",
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-sum",
]
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)
NormScale = Literal["n-lmax", "lmax"]
ClipUnit = Literal["tokens", "sequences"]
# What an aggregation divides by: N answers, T tokens, N·L or L (seq-mean-token-sum-norm,
# by ``norm_scale``), or nothing.
Divisor = Literal["answers", "tokens", "norm", "one"]


class AggregationRule(NamedTuple):
    """An aggregation as ``(1/D) Σ_i u_i Σ_t v_{i,t}``: the divisor ``D``'s kind (one
    constant of the whole input: :func:`aggregation_divisor`) and whether the per-answer
    factor is ``u_i = 1/|o_i|`` (``answer_mean``) or 1. The weight of one token is
    ``u_i / D`` (:func:`aggregation_weights`); ``∂J/∂logp_t`` carries the same factor."""

    divisor: Divisor
    answer_mean: bool


# The one table of the aggregations (see :func:`aggregate` for the papers and trainers).
AGGREGATION_RULES: dict[str, AggregationRule] = {
    "seq-mean-token-mean": AggregationRule("answers", answer_mean=True),
    "token-mean": AggregationRule("tokens", answer_mean=False),
    "seq-mean-token-sum": AggregationRule("answers", answer_mean=False),
    "seq-mean-token-sum-norm": AggregationRule("norm", answer_mean=False),
    "token-sum": AggregationRule("one", answer_mean=False),
}


def aggregation_rule(agg: str) -> AggregationRule:
    """The rule of ``agg`` (a :class:`UsageError` listing the aggregations otherwise)."""
    rule = AGGREGATION_RULES.get(agg)
    if rule is None:
        raise UsageError(f"unknown aggregation {agg!r}; choose one of {', '.join(AGGREGATIONS)}")
    return rule


def aggregation_divisor(
    agg: str, *, answers: int, tokens: float, max_len: float, norm_scale: NormScale = "n-lmax"
) -> float:
    """The constant ``D`` of ``agg`` (:data:`AGGREGATION_RULES`) for ``answers`` (N),
    ``tokens`` (T) and ``max_len`` (L): N, T, N·L (``norm_scale="lmax"``: L) or 1.

    Example:
        >>> aggregation_divisor("seq-mean-token-sum-norm", answers=4, tokens=10, max_len=8)
        32.0
    """
    kind = aggregation_rule(agg).divisor
    if kind == "answers":
        return float(answers)
    if kind == "tokens":
        return float(tokens)
    if kind == "norm":
        return float(max_len if norm_scale == "lmax" else answers * max_len)
    return 1.0


# exp(x) overflows float64 above this.
EXP_MAX = float(np.log(np.finfo(np.float64).max))


# --------------------------------------------------------------------------- checks
def _real_array(name: str, x: ArrayLike, *, keep_float: bool = False) -> F64:
    """``x`` as a float64 array (a copy when the dtype changes; never written to).

    With ``keep_float``, float16/float32 arrays are returned as they are: the arithmetic
    that reads them asks numpy for float64 results (``np.subtract(a, b, dtype=float64)``),
    which converts on the fly without a float64 copy of the input.
    """
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise InputError(f"{name}: expected a real-valued array, got dtype {arr.dtype}")
    if keep_float and np.issubdtype(arr.dtype, np.floating):
        return arr
    return arr.astype(np.float64, copy=False)


def _bool_array(name: str, x: ArrayLike) -> NDArray[np.bool_]:
    arr = np.asarray(x)
    if arr.dtype == np.bool_:
        return arr
    if np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        if not np.isin(arr, (0, 1)).all():
            raise InputError(f"{name}: expected booleans or 0/1 values, found other values")
        return arr.astype(np.bool_)
    raise InputError(f"{name}: expected a boolean array, got dtype {arr.dtype}")


def _same_shape(**arrays: np.ndarray) -> None:
    shapes = {name: a.shape for name, a in arrays.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{n} {s}" for n, s in shapes.items())
        raise InputError(f"arrays must have the same shape, got {listed}")


def _check_rank(name: str, arr: np.ndarray, rank: int, legend: str) -> None:
    if arr.ndim != rank:
        raise InputError(f"{name}: expected shape {legend}, got {arr.shape}")


def check_offsets(offsets: ArrayLike, n_values: int, *, nonempty: bool = False) -> I64:
    """``offsets`` as int64 after checking the ragged-layout contract: 1-D integers,
    ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == n_values`` (the token count);
    with ``nonempty`` no answer may be empty (a mean over its tokens is taken).

    Raises:
        InputError: naming ``offsets`` and what is wrong.

    Example:
        >>> check_offsets([0, 2, 5], 5).dtype
        dtype('int64')
    """
    o = np.asarray(offsets)
    if o.ndim != 1 or o.shape[0] < 1:
        raise InputError(f"offsets: expected shape (N+1,), got {o.shape}")
    if not np.issubdtype(o.dtype, np.integer):
        raise InputError(f"offsets: expected integers, got dtype {o.dtype}")
    o = o.astype(np.int64, copy=False)
    if o[0] != 0 or o[-1] != n_values:
        raise InputError(
            f"offsets: must start at 0 and end at the number of values ({n_values}), "
            f"got {int(o[0])} and {int(o[-1])}"
        )
    steps = np.diff(o)
    if steps.shape[0] and steps.min() < 0:
        i = int(np.flatnonzero(steps < 0)[0])
        raise InputError(f"offsets: must not decrease, but offsets[{i + 1}] < offsets[{i}]")
    if nonempty and steps.shape[0] and steps.min() == 0:
        i = int(np.flatnonzero(steps == 0)[0])
        raise InputError(f"offsets: answer {i} has no token, and a mean over its tokens is taken")
    return o


def _check_eps(eps: float) -> None:
    if not (np.isfinite(eps) and eps >= 0):
        raise UsageError(f"eps must be a finite number >= 0, got {eps}")


# ------------------------------------------------------------------- ragged helpers
def segment_sum(values: F64, offsets: I64) -> F64:
    """Per-answer sums of a ragged token field: ``out[i] = Σ values[offsets[i]:offsets[i+1]]``.

    Args:
        values: ``(T,)`` float64.
        offsets: ``(N+1,)`` int64, non-decreasing, ``offsets[-1] == T``.

    Returns:
        ``(N,)`` float64; an empty answer sums to 0.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets`.

    Example:
        >>> segment_sum(np.array([1.0, 2.0, 3.0]), np.array([0, 2, 2, 3]))
        array([3., 0., 3.])
    """
    offsets = check_offsets(offsets, values.shape[0])
    lengths = np.diff(offsets)
    out = np.zeros(lengths.shape[0], dtype=np.float64)
    nonempty = lengths > 0
    if values.shape[0]:
        with np.errstate(over="ignore"):  # a sum beyond float64 is ±inf
            out[nonempty] = np.add.reduceat(values, offsets[:-1][nonempty])
    return out


def segment_mean(values: F64, offsets: I64) -> F64:
    """Per-answer means ``Σ_t values / |o_i|``; every answer must have a token.

    Raises:
        InputError: ``offsets`` breaks the contract, or an answer has no token.

    Example:
        >>> segment_mean(np.array([1.0, 2.0, 3.0]), np.array([0, 2, 3]))
        array([1.5, 3. ])
    """
    offsets = check_offsets(offsets, values.shape[0], nonempty=True)
    return segment_sum(values, offsets) / np.diff(offsets)


def flatten_padded(mask: NDArray[np.bool_], *fields: F64) -> tuple[I64, list[F64]]:
    """Drop padding: ``(N, L)`` fields plus mask to ragged ``(T,)`` fields and offsets.

    Row-major selection keeps answer ``i``'s tokens in order, in its own run. The
    inputs are not modified; padding values are never read into the result.

    Example:
        >>> off, (x,) = flatten_padded(np.array([[1, 1, 0], [1, 0, 0]], bool),
        ...                            np.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]))
        >>> off.tolist(), x.tolist()
        ([0, 2, 3], [1.0, 2.0, 3.0])
    """
    lengths = mask.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, [f[mask] for f in fields]


# ----------------------------------------------------------------------- advantages
@dataclass(frozen=True)
class GroupStats:
    """Per-group reward statistics, ``(P,)`` arrays: count, total, mean, std (with ddof), min, max.

    ``std`` is NaN for a group with ``count <= ddof``; ``min == max`` marks zero variance.
    ``scale`` (a power of two per group, None: 1) is what the rewards were divided by before
    summing and squaring, ``mean_scaled`` and ``std_scaled`` the moments of the scaled
    rewards: advantages are computed on the scaled values, so tiny (subnormal) rewards keep
    their advantages.
    """

    count: I64
    total: F64
    mean: F64
    std: F64
    min: F64
    max: F64
    scale: F64 | None = None
    std_scaled: F64 | None = None
    mean_scaled: F64 | None = None


def group_stats(rewards: F64, codes: I64, *, n_groups: int, ddof: int = 0) -> GroupStats:
    """Group statistics of rewards labelled by integer group codes (two-pass, float64).

    Example:
        >>> s = group_stats(np.array([1.0, 3.0, 5.0]), np.array([0, 0, 1]), n_groups=2)
        >>> s.mean.tolist(), s.std.tolist()
        ([2.0, 5.0], [1.0, 0.0])
    """
    P = n_groups
    count = np.bincount(codes, minlength=P).astype(np.int64)
    lo = np.full(P, np.inf)
    hi = np.full(P, -np.inf)
    np.minimum.at(lo, codes, rewards)
    np.maximum.at(hi, codes, rewards)
    # Each group's rewards are divided by a power of two near their magnitude before they
    # are summed and squared: exact (no rounding), and no sum or square overflows, so
    # rewards of ±1e200 or sums beyond 1.8e308 still give their true mean and std.
    big = np.maximum(np.abs(lo), np.abs(hi), where=count > 0, out=np.zeros(P))
    _, exp = np.frexp(np.where(np.isfinite(big) & (big > 0), big, 1.0))
    scale = np.ldexp(1.0, exp - 1)  # at most 2^1023: finite
    s = scale[codes]
    total_s = np.bincount(codes, weights=rewards / s, minlength=P)
    mean_s = np.divide(total_s, count, out=np.zeros(P), where=count > 0)
    dev = rewards / s - mean_s[codes]
    sq = np.bincount(codes, weights=dev * dev, minlength=P)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        std_s = np.sqrt(sq / (count - ddof))
        std = std_s * scale
        mean = mean_s * scale
        total = total_s * scale  # inf when the true sum is beyond float64
    return GroupStats(
        count=count, total=total, mean=mean, std=std, min=lo, max=hi, scale=scale,
        std_scaled=std_s, mean_scaled=mean_s,
    )  # fmt: skip


def advantages_by_group(
    rewards: ArrayLike,
    codes: ArrayLike,
    *,
    n_groups: int | None = None,
    scale: Scale = "group",
    ddof: int = 0,
    eps: float = 1e-8,
    estimator: AdvantageEstimator = "grpo",
    singleton: Singleton = "zero",
    clip: float | None = None,
) -> F64:
    """Group-relative advantages of answers labelled by group: ``A_i = (r_i − b_i) / (s + ε)``.

    - ``estimator="grpo"``: baseline ``b_i = μ_g``, the mean reward of the answer's group
      (DeepSeekMath, Shao et al. 2024, eq. 3).
    - ``estimator="rloo"``: ``b_i`` is the mean of the *other* answers of the group,
      ``(Σ_g r − r_i) / (G − 1)`` (Ahmadian et al. 2024, "Back to Basics"; OpenRLHF ``rloo``).
    - ``scale="group"``: ``s = σ_g``, the group's standard deviation with ``ddof``;
      ``"batch"``: ``s`` is the std of all ``N`` rewards (TRL ``scale_rewards="batch"``);
      ``"none"``: no division and no ε (Dr. GRPO, Liu et al. 2025).

    A group whose rewards are all equal (max == min, decided exactly in float64) gets
    ``A = 0`` exactly. A group of one answer gets ``A = 0`` with ``singleton="zero"``
    (seed, TRL) or ``r / (1 + ε)`` with ``singleton="raw"`` (verl: mean 0, std 1).

    Args:
        rewards: ``(N,)`` real rewards.
        codes: ``(N,)`` integer group index in ``[0, n_groups)``; answers of a group need
            not be adjacent.
        n_groups: number of groups ``P`` (default ``max(codes) + 1``).
        scale: ``"group" | "batch" | "none"``.
        ddof: 0 (population std, seed default) or 1 (sample std: TRL, verl, OpenRLHF).
        eps: ε added to the std, ``>= 0``.
        estimator: ``"grpo" | "rloo"``.
        singleton: ``"zero" | "raw"``.
        clip: bound ``|A|`` at this value after the normalisation (OpenRLHF clips to ±10,
            ``--reward.clip_range``), or None.

    Returns:
        ``(N,)`` float64 advantages in the order of ``rewards``.

    Example:
        >>> advantages_by_group([1.0, 3.0, 5.0, 5.0], [0, 0, 1, 1]).round(6).tolist()
        [-1.0, 1.0, 0.0, 0.0]
    """
    r = _real_array("rewards", rewards)
    g = np.asarray(codes)
    _check_rank("rewards", r, 1, "(N,)")
    if not np.issubdtype(g.dtype, np.integer):
        raise InputError(f"codes: expected integer group indices, got dtype {g.dtype}")
    _same_shape(rewards=r, codes=g)
    _check_eps(eps)
    if ddof not in (0, 1):
        raise UsageError(f"ddof must be 0 or 1, got {ddof}")
    if scale not in ("group", "batch", "none"):
        raise UsageError(f"scale must be group, batch or none, got {scale!r}")
    if estimator not in ("grpo", "rloo"):
        raise UsageError(f"estimator must be grpo or rloo, got {estimator!r}")
    if singleton not in ("zero", "raw"):
        raise UsageError(f"singleton must be zero or raw, got {singleton!r}")
    n = r.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    if not np.isfinite(r).all():
        i = int(np.flatnonzero(~np.isfinite(r))[0])
        raise InputError(f"rewards: non-finite value {r[i]} at answer {i}")
    P = int(g.max()) + 1 if n_groups is None else int(n_groups)
    if g.min() < 0 or g.max() >= P:
        raise InputError(f"codes: group indices must lie in [0, {P})")

    stats = group_stats(r, g, n_groups=P, ddof=ddof)
    batch_std = overall_std(r, ddof=ddof) if scale == "batch" and n > ddof else 0.0
    return advantages_from_stats(
        r,
        g,
        stats,
        scale=scale,
        eps=eps,
        estimator=estimator,
        singleton=singleton,
        batch_std=batch_std,
        clip=clip,
    )


def overall_std(values: F64, *, ddof: int = 0) -> float:
    """The std of every value (``scale="batch"``), computed as :func:`group_stats` does: on
    values divided by a power of two near their magnitude, so no square overflows.

    Example:
        >>> overall_std(np.array([1e200, -1e200]))
        1e+200
    """
    if values.shape[0] <= ddof:
        return 0.0
    big = float(np.max(np.abs(values))) if values.shape[0] else 0.0
    scale = math.ldexp(1.0, math.frexp(big)[1] - 1) if math.isfinite(big) and big > 0 else 1.0
    with np.errstate(over="ignore"):
        return float(np.std(values / scale, ddof=ddof)) * scale


def advantages_from_stats(
    rewards: F64,
    codes: I64,
    stats: GroupStats,
    *,
    scale: Scale = "group",
    eps: float = 1e-8,
    estimator: AdvantageEstimator = "grpo",
    singleton: Singleton = "zero",
    batch_std: float = 0.0,
    clip: float | None = None,
) -> F64:
    """The advantages of any subset of answers, given the statistics of their groups over
    the whole batch (:func:`group_stats`): the formula of :func:`advantages_by_group`, one
    answer at a time, so answers may be folded in any blocks, anywhere, with the same
    result bit for bit. ``batch_std`` is the std of every reward (``scale="batch"``).

    Args:
        rewards: ``(n,)`` float64 rewards of the answers.
        codes: ``(n,)`` their groups' indices into ``stats``.
        stats: the groups' statistics, ``(P,)`` arrays.

    Returns:
        ``(n,)`` float64 advantages.

    Example:
        >>> s = group_stats(np.array([1.0, 3.0, 5.0, 5.0]), np.array([0, 0, 1, 1]), n_groups=2)
        >>> advantages_from_stats(np.array([5.0, 3.0]), np.array([1, 0]), s).round(6).tolist()
        [0.0, 1.0]
    """
    r, g = rewards, codes
    total, mean, std = stats.total, stats.mean, stats.std
    constant = (stats.min == stats.max)[g]
    size = stats.count[g]

    if (
        scale == "group"
        and stats.scale is not None
        and stats.std_scaled is not None
        and stats.mean_scaled is not None
    ):
        # on the rewards divided by their group's power of two: exact for ordinary rewards
        # (the same bits as unscaled), and subnormal ones keep their advantages
        s = stats.scale[g]
        if estimator == "grpo":
            centred_s = r / s - stats.mean_scaled[g]
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                centred_s = r / s - (total[g] / s - r / s) / (size - 1)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            adv = centred_s / (stats.std_scaled[g] + eps / s)
    else:
        if estimator == "grpo":
            centred = r - mean[g]
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                centred = r - (total[g] - r) / (size - 1)
        with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 of constant groups, reset below
            if scale == "group":
                adv = centred / (std[g] + eps)
            elif scale == "batch":
                adv = centred / (batch_std + eps)
            else:
                adv = centred.copy()

    adv[constant] = 0.0
    if singleton == "raw":
        one = size == 1
        adv[one] = r[one] if scale == "none" else r[one] / (1.0 + eps)
    if clip is not None:
        np.clip(adv, -clip, clip, out=adv)
    return adv


def group_advantages(rewards: ArrayLike, eps: float = 1e-8) -> F64:
    """GRPO group-relative advantages of a ``(P, G)`` reward array, one group per row.

    ``A_{p,i} = (r_{p,i} − μ_p) / (σ_p + ε)`` with the population std (divide by G).
    See DeepSeekMath (Shao et al. 2024), outcome supervision. A row of equal rewards
    gives zeros exactly. This is the seed spec's function; the general, ragged version
    with every trainer's convention is :func:`advantages_by_group`.

    Args:
        rewards: ``(P, G)`` real rewards.
        eps: ε added to the std.

    Returns:
        ``(P, G)`` float64; each row sums to ~0 (exactly 0 for a constant row).

    Example:
        >>> group_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])).round(8)
        array([[ 0.99999998, -0.99999998, -0.99999998,  0.99999998],
               [-0.57735026, -0.57735026,  1.73205077, -0.57735026]])
    """
    r = _real_array("rewards", rewards)
    _check_rank("rewards", r, 2, "(P, G)")
    P, G = r.shape
    codes = np.repeat(np.arange(P, dtype=np.int64), G)
    flat = advantages_by_group(r.reshape(-1), codes, n_groups=P, eps=eps)
    return flat.reshape(P, G)


# ------------------------------------------------------------------------------- KL
def kl_estimate(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    *,
    estimator: KLEstimator = "k3",
    clamp: float | None = None,
    log_ratio_clamp: float | None = None,
) -> F64:
    """Per-token estimate of KL(π_θ ‖ π_ref) from log-probs of sampled tokens.

    With ``x = logp − ref_logp`` and ``d = −x = ref_logp − logp`` (Schulman 2020,
    "Approximating KL divergence"):

    - ``k1 = x`` (unbiased, can be negative);
    - ``k2 = x² / 2``;
    - ``k3 = exp(d) − d − 1`` (unbiased, ``>= 0``; DeepSeekMath eq. 4, the seed's form).

    ``log_ratio_clamp`` clamps ``d`` to ``[−c, c]`` before the exponential of k3 (verl
    ``low_var_kl`` uses 20); ``clamp`` clamps the estimate to ``[−c, c]`` (verl, OpenRLHF: 10).

    Args:
        logp, ref_logp: real arrays of equal shape.

    Returns:
        float64 array of the inputs' shape.

    Example:
        >>> kl_estimate([-1.0, -2.0], [-1.5, -1.0], estimator="k1").tolist()
        [0.5, -1.0]
    """
    a = _real_array("logp", logp, keep_float=True)
    b = _real_array("ref_logp", ref_logp, keep_float=True)
    _same_shape(logp=a, ref_logp=b)
    d = difference(b, a)
    return kl_from_log_ratio(d, estimator=estimator, clamp=clamp, log_ratio_clamp=log_ratio_clamp)


def kl_from_log_ratio(
    d: F64,
    *,
    estimator: KLEstimator = "k3",
    clamp: float | None = None,
    log_ratio_clamp: float | None = None,
) -> F64:
    """The KL estimate as a function of ``d = ref_logp − logp`` (see :func:`kl_estimate`).

    ``k1 = −d``, ``k2 = d²/2``, ``k3 = exp(d) − d − 1``, evaluated in that order of
    operations. ``d`` is not modified.

    Example:
        >>> kl_from_log_ratio(np.array([0.0, -1.0]), estimator="k2").tolist()
        [0.0, 0.5]
    """
    if estimator == "k3":
        if log_ratio_clamp is not None:
            d = np.clip(d, -log_ratio_clamp, log_ratio_clamp)
        with np.errstate(over="ignore", invalid="ignore"):
            k = np.exp(d)
            k -= d
            k -= 1.0
        k[d == np.inf] = np.inf  # e^d − d at d = +inf: inf − inf, whose limit is +inf
    elif estimator == "k2":
        k = 0.5 * d
        k *= d
    elif estimator == "k1":
        k = np.negative(d)
    else:
        raise UsageError(f"KL estimator must be k1, k2 or k3, got {estimator!r}")
    if clamp is not None:
        np.clip(k, -clamp, clamp, out=k)
    return k


def kl_k3(logp: ArrayLike, ref_logp: ArrayLike) -> F64:
    """k3 estimate of KL(π_θ ‖ π_ref) per token: ``π_ref/π_θ − log(π_ref/π_θ) − 1``.

    Computed in log space as ``exp(d) − d − 1`` with ``d = ref_logp − logp``, so it never
    divides probabilities. Always ``>= 0``, and 0 exactly where the log-probs agree.
    See DeepSeekMath (Shao et al. 2024) eq. 4; Schulman (2020).

    Args:
        logp: log π_θ of the sampled tokens, any shape.
        ref_logp: log π_ref, the same shape.

    Returns:
        float64 array of the inputs' shape.

    Example:
        >>> kl_k3(np.array([-1.0, -2.0, -0.5]), np.array([-1.0, -1.5, -1.0]))
        array([0.        , 0.14872127, 0.10653066])
    """
    return kl_estimate(logp, ref_logp, estimator="k3")


# ------------------------------------------------------------------- ratio and clip
def difference(a: FloatArray, b: FloatArray) -> F64:
    """``a − b`` in float64 (float32 inputs widen inside the subtraction). Finite log-probs
    of ±1e308 can differ by more than float64 holds: the result is then ±inf, which the
    statistics count and report, never a warning on stderr.

    Example:
        >>> difference(np.array([-1e308]), np.array([1e308])).tolist()
        [-inf]
    """
    with np.errstate(over="ignore"):
        return np.subtract(a, b, dtype=np.float64)


def log_ratio(logp: FloatArray, old_logp: FloatArray, *, clamp: float | None = None) -> F64:
    """Per-token log importance ratio ``Δ = logp − old_logp`` in float64 (float32 inputs are
    widened inside the subtraction), optionally clamped to ``[−c, c]``.

    verl and OpenRLHF clamp at 20 before ``exp``; TRL does not clamp.
    """
    d = difference(logp, old_logp)
    if clamp is not None:
        np.clip(d, -clamp, clamp, out=d)
    return d


def sequence_log_ratio(
    delta: F64, offsets: I64, *, upper: float | None = None, mean: F64 | None = None
) -> F64:
    """GSPO sequence-level log-ratio, broadcast to tokens: ``log s_i = mean_t Δ_{i,t}``.

    See Zheng et al. 2025, "Group Sequence Policy Optimization", eq. 7: the ratio of an
    answer is the geometric mean of its token ratios, applied to each of its tokens.
    ``upper`` bounds ``log s_i`` from above, after the mean (verl 0.9.1 clamps at 10).
    ``mean``: the answers' mean ``Δ`` when known beyond ``delta`` (an answer folded a slice
    of its tokens at a time).

    Returns:
        ``(T,)``: answer ``i``'s mean log-ratio repeated over its tokens.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets` (without
            ``mean``, an answer without a token too), or ``mean`` is not ``(N,)``.
    """
    offsets = check_offsets(offsets, delta.shape[0], nonempty=mean is None)
    if mean is not None and np.shape(mean) != (offsets.shape[0] - 1,):
        raise InputError(f"mean: expected shape ({offsets.shape[0] - 1},), got {np.shape(mean)}")
    seq = segment_mean(delta, offsets) if mean is None else np.array(mean, dtype=np.float64)
    if upper is not None:
        np.minimum(seq, upper, out=seq)
    return np.repeat(seq, np.diff(offsets))


def clipped_surrogate(
    ratio: F64,
    adv: F64,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
) -> F64:
    """PPO clipped surrogate per token (maximised): ``min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)``.

    See Schulman et al. 2017 (PPO) eq. 7; decoupled ``ε_high`` is DAPO's clip-higher
    (Yu et al. 2025); with ``dual_clip = c`` the term of a token with ``A < 0`` is bounded
    below by ``c·A`` (Ye et al. 2020, dual-clip PPO; verl ``clip_ratio_c``).

    A token with ``A = 0`` contributes exactly 0, even where ``ρ`` overflowed to inf.

    Args:
        ratio: ``(T,)`` importance ratios ``ρ >= 0`` (may hold inf).
        adv: ``(T,)`` advantages.
        clip_eps: ε_low (and ε_high unless given), ``>= 0``.
        clip_eps_high: ε_high.
        dual_clip: ``c > 1`` or None.

    Returns:
        ``(T,)`` float64 per-token policy term.

    Example:
        >>> clipped_surrogate(np.array([1.5, 0.5, 1.5]), np.array([1.0, -1.0, -1.0])).tolist()
        [1.2, -0.8, -1.5]
    """
    if ratio.ndim != 1 or ratio.shape != adv.shape:
        raise InputError(f"ratio, adv: expected equal shapes (T,), got {ratio.shape}, {adv.shape}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    for name, e in (("clip_eps", clip_eps), ("clip_eps_high", high)):
        if not (np.isfinite(e) and e >= 0):
            raise UsageError(f"{name}: must be a finite number >= 0, got {e}")
    if dual_clip is not None and not dual_clip > 1:
        raise UsageError(f"dual_clip: must be > 1, got {dual_clip}")
    lo = 1.0 - clip_eps
    hi = 1.0 + high
    # inf·0 (a ratio that overflowed, on a token with A = 0) is the only invalid operation
    # possible; catching the floating-point flag costs nothing when it does not happen.
    with np.errstate(over="ignore", invalid="raise"):
        try:
            return _surrogate(ratio, adv, lo, hi, dual_clip)
        except FloatingPointError:
            pass
    with np.errstate(over="ignore", invalid="ignore"):
        term = _surrogate(ratio, adv, lo, hi, dual_clip)
    term[np.isnan(term) & (adv == 0)] = 0.0
    return term


def _surrogate(ratio: F64, adv: F64, lo: float, hi: float, dual_clip: float | None) -> F64:
    term = ratio * adv
    clipped = np.clip(ratio, lo, hi)
    clipped *= adv
    np.minimum(term, clipped, out=term)
    if dual_clip is not None:  # max(term, c·A) where A < 0; untouched where A >= 0
        floor = adv * dual_clip
        floor[adv >= 0] = -np.inf
        np.maximum(term, floor, out=term)
    return term


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


def suffix_sum(values: F64, offsets: I64) -> F64:
    """Within each answer, the sum of this token's value and every later one's:
    ``out[t] = Σ_{t' ≥ t} values[t']`` (a return with γ = 1, as OpenRLHF's
    ``get_cumulative_returns``).

    Example:
        >>> suffix_sum(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 3, 4])).tolist()
        [6.0, 5.0, 3.0, 4.0]
    """
    offsets = check_offsets(offsets, values.shape[0])
    out = np.empty_like(values, dtype=np.float64)
    for i in range(offsets.shape[0] - 1):  # answers: N small loops of reversed cumsums
        a, b = int(offsets[i]), int(offsets[i + 1])
        out[a:b] = np.cumsum(values[a:b][::-1])[::-1]
    return out


def segment_count(flags: NDArray[np.bool_], offsets: I64) -> I64:
    """How many flags are set in each answer's run (0 for an empty answer, wherever it is).

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets`.

    Example:
        >>> segment_count(np.array([True, False, True]), np.array([0, 2, 3, 3])).tolist()
        [1, 1, 0]
    """
    offsets = check_offsets(offsets, flags.shape[0])
    counts = np.zeros(offsets.shape[0] - 1, dtype=np.int64)
    T = flags.shape[0]
    # reduceat casts its whole input to int64 first: 8 bytes a flag, so long runs of flags
    # are counted a chunk at a time
    for lo in range(0, T, COUNT_CHUNK):
        hi = min(T, lo + COUNT_CHUNK)
        a0 = int(np.searchsorted(offsets, lo, side="right")) - 1  # the answer holding lo
        a1 = int(np.searchsorted(offsets, hi, side="left"))  # the first starting at hi or after
        local = np.clip(offsets[a0 : a1 + 1], lo, hi) - lo
        nonempty = local[1:] > local[:-1]
        counts[a0:a1][nonempty] += np.add.reduceat(
            flags[lo:hi], local[:-1][nonempty], dtype=np.int64
        )
    return counts


COUNT_CHUNK = 1 << 20


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
    return total, float(np.einsum("i,i->", r, r)), n_inf


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


# ------------------------------------------------------------------- per-token terms
@dataclass(frozen=True)
class TokenTerms:
    """Every per-token quantity of the GRPO objective, ragged ``(T,)`` arrays.

    ``term = policy − β·kl_loss`` is the per-token objective; ``delta`` is the raw token
    log-ratio ``logp − old_logp`` (before any clamp), ``ratio`` the ratio the surrogate used
    (after the clamps, at token or sequence level).
    ``kl`` is the KL estimate of ``logp`` against ``ref_logp`` (None without a reference
    policy), ``kl_loss`` the KL as it enters the loss (``kl · ratio`` with the bias
    correction, else ``kl`` itself); ``ref_delta`` is ``ref_logp − logp``, the KL's argument.
    """

    delta: F64
    ratio: F64
    adv: F64
    policy: F64
    kl: F64 | None
    term: F64
    ref_delta: F64 | None = None
    kl_loss: F64 | None = None


@dataclass(frozen=True)
class TermOptions:
    """The conventions of the per-token terms, in one record: what :func:`token_terms`,
    :func:`token_gradients` and the compiled kernel (:func:`grpo_cli._fast.fold`) take.

    ``clip_eps`` ε_low (and ε_high unless ``clip_eps_high``), ``dual_clip`` c (None: off),
    ``log_ratio_clamp`` (None: off; clamps Δ before ``exp`` at token level, and k3's
    exponent), ``seq_ratio_clamp`` (the sequence log-ratio's upper bound),
    ``ratio_level`` token|sequence, ``beta`` β, ``kl_estimator`` k1|k2|k3, ``kl_clamp``,
    ``kl_bias_correction`` (TRL: the loss's KL times the ratio). The functions also take
    these as keywords (:class:`TermConventions`), which override ``options``.

    Example:
        >>> TermOptions(beta=0.0).eps_high
        0.2
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    log_ratio_clamp: float | None = None
    seq_ratio_clamp: float | None = None
    ratio_level: RatioLevel = "token"
    beta: float = 0.04
    kl_estimator: KLEstimator = "k3"
    kl_clamp: float | None = None
    kl_bias_correction: bool = False

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @classmethod
    def of(cls, source: object, **overrides: Any) -> TermOptions:
        """The options named like attributes of ``source`` (e.g. a
        :class:`~grpo_cli._settings.Settings`), then ``overrides``."""
        values = {f.name: getattr(source, f.name) for f in fields(cls)}
        return cls(**{**values, **overrides})


class TermConventions(TypedDict, total=False):
    """:class:`TermOptions` as keywords (the same names and types; tests/test_core.py
    checks that the two agree)."""

    clip_eps: float
    clip_eps_high: float | None
    dual_clip: float | None
    log_ratio_clamp: float | None
    seq_ratio_clamp: float | None
    ratio_level: RatioLevel
    beta: float
    kl_estimator: KLEstimator
    kl_clamp: float | None
    kl_bias_correction: bool


def term_options(options: TermOptions | None, conventions: TermConventions) -> TermOptions:
    """``options`` (default: :class:`TermOptions`'s defaults) with the keyword
    ``conventions`` applied."""
    base = TermOptions() if options is None else options
    return replace(base, **conventions) if conventions else base


def used_log_ratio(
    delta: F64,
    offsets: I64,
    *,
    ratio_level: RatioLevel = "token",
    log_ratio_clamp: float | None = None,
    seq_ratio_clamp: float | None = None,
    seq_mean: F64 | None = None,
) -> F64:
    """The log of the ratio the surrogate uses, per token, from the raw ``Δ = logp − old_logp``.

    - ``"token"``: ``Δ`` clamped to ``[−c, c]`` with ``c = log_ratio_clamp`` (verl and
      OpenRLHF clamp at 20 before ``exp``; TRL does not clamp).
    - ``"sequence"`` (GSPO, Zheng et al. 2025, eq. 7): the answer's mean of the *raw* ``Δ``
      (no trainer clamps before the mean: verl 0.9.1 ``compute_policy_loss_gspo``,
      OpenRLHF 0.11.2 ``PolicyLoss``, TRL 1.16.0), then bounded from above by
      ``seq_ratio_clamp`` (verl: 10), repeated over the answer's tokens.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets` (at sequence
            level an answer without a token too, when ``seq_mean`` is not given).

    Example:
        >>> used_log_ratio(np.array([30.0, -1.0]), np.array([0, 1, 2]), log_ratio_clamp=20.0)
        array([20., -1.])
        >>> used_log_ratio(np.array([30.0, -2.0]), np.array([0, 2]), ratio_level="sequence",
        ...                seq_ratio_clamp=10.0)
        array([10., 10.])
    """
    sequence = ratio_level == "sequence"
    offsets = check_offsets(offsets, delta.shape[0], nonempty=sequence and seq_mean is None)
    if sequence:
        return sequence_log_ratio(delta, offsets, upper=seq_ratio_clamp, mean=seq_mean)
    if log_ratio_clamp is None:
        return delta
    return np.clip(delta, -log_ratio_clamp, log_ratio_clamp)


def token_terms(
    logp: FloatArray,
    old_logp: FloatArray | None,
    ref_logp: FloatArray | None,
    adv: F64,
    offsets: I64,
    *,
    options: TermOptions | None = None,
    seq_mean: F64 | None = None,
    **conventions: Unpack[TermConventions],
) -> TokenTerms:
    """Per-token GRPO terms of ragged data: ``policy − β · KL`` (DeepSeekMath eq. 3).

    The ratio is :func:`used_log_ratio`'s, exponentiated. With ``kl_bias_correction`` the
    per-token KL entering the loss is multiplied by that ratio (TRL 1.16.0
    ``use_bias_correction_kl``: an importance weight, since the tokens were sampled from
    π_θold); the KL statistics keep describing ``logp`` against ``ref_logp``.

    Args:
        logp: ``(T,)`` log π_θ, float32 or float64 (every result is float64).
        old_logp: ``(T,)`` log π_θold, or None for an on-policy batch (ρ = 1).
        ref_logp: ``(T,)`` log π_ref, or None (then ``beta`` must be 0).
        adv: ``(N,)`` one advantage per answer, or ``(T,)`` one per token.
        offsets: ``(N+1,)``.
        options: the conventions (:class:`TermOptions`; default its defaults), each of
            which a keyword of the same name (``clip_eps=``, ``beta=``, ...) overrides.
        seq_mean: ``(N,)`` the answers' mean ``Δ`` for the sequence-level ratio, when the
            batch holds a slice of an answer's tokens (else computed from ``offsets``).

    Returns:
        :class:`TokenTerms`.

    Raises:
        InputError: ``offsets`` breaks its contract (no empty answer), or the arrays'
            shapes disagree with it.
    """
    T = logp.shape[0]
    offsets = check_offsets(offsets, T, nonempty=True)
    o = term_options(options, conventions)
    for name, a in (("old_logp", old_logp), ("ref_logp", ref_logp)):
        if a is not None and a.shape != logp.shape:
            raise InputError(f"{name}: expected shape {logp.shape} like logp, got {a.shape}")
    per_token = adv.shape == (T,) and adv.shape != (offsets.shape[0] - 1,)
    if not per_token and adv.shape != (offsets.shape[0] - 1,):
        raise InputError(
            f"adv: expected shape ({offsets.shape[0] - 1},) or ({T},), got {adv.shape}"
        )
    lengths = np.diff(offsets)
    if old_logp is None:
        delta = np.zeros(logp.shape[0], dtype=np.float64)
    else:
        delta = log_ratio(logp, old_logp)
    used = used_log_ratio(
        delta,
        offsets,
        ratio_level=o.ratio_level,
        log_ratio_clamp=o.log_ratio_clamp,
        seq_ratio_clamp=o.seq_ratio_clamp,
        seq_mean=seq_mean,
    )
    with np.errstate(over="ignore"):
        ratio = np.exp(used)
    adv_tok = adv if per_token else np.repeat(adv, lengths)
    policy = clipped_surrogate(
        ratio, adv_tok, clip_eps=o.clip_eps, clip_eps_high=o.clip_eps_high, dual_clip=o.dual_clip
    )
    kl = kl_loss = d = None
    if ref_logp is not None:
        d = difference(ref_logp, logp)
        kl = kl_loss = kl_from_log_ratio(
            d, estimator=o.kl_estimator, clamp=o.kl_clamp, log_ratio_clamp=o.log_ratio_clamp
        )
        if o.kl_bias_correction:
            with np.errstate(over="ignore", invalid="ignore"):
                kl_loss = kl * ratio
            kl_loss[kl == 0.0] = 0.0  # an overflowed ratio times a zero KL is no NaN
    require_reference(o.beta, ref_logp)
    if o.beta != 0.0:
        assert kl_loss is not None
        term = np.multiply(kl_loss, o.beta)
        np.subtract(policy, term, out=term)
    else:
        term = policy
    return TokenTerms(
        delta=delta,
        ratio=ratio,
        adv=adv_tok,
        policy=policy,
        kl=kl,
        term=term,
        ref_delta=d,
        kl_loss=kl_loss,
    )


@dataclass(frozen=True)
class SequenceMeans:
    """Per answer, the means over its tokens that every token's sequence-level gradient
    takes (:func:`token_gradients`): ``Δ``, the active ``ρA``, and the KL (or None)."""

    delta: F64
    policy: F64
    kl: F64 | None


def _unclipped(terms: TokenTerms, o: TermOptions) -> NDArray[np.bool_]:
    """Tokens where ``min`` takes the unclipped branch and no dual clip binds."""
    rho, a = terms.ratio, terms.adv
    active = ((a > 0) & (rho <= 1.0 + o.eps_high)) | ((a < 0) & (rho >= 1.0 - o.clip_eps))
    if o.dual_clip is not None:
        active &= ~((a < 0) & (rho > o.dual_clip))
    return active


def sequence_sums(
    terms: TokenTerms,
    offsets: I64,
    *,
    options: TermOptions | None = None,
    **conventions: Unpack[TermConventions],
) -> tuple[F64, F64 | None]:
    """Per answer, the sums behind :class:`SequenceMeans` (active ``ρA``, KL; the mean
    ``Δ`` is the ratio's own, known before) over the tokens of ``terms``: sums of an
    answer's slices add up to the answer's.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets`.
    """
    offsets = check_offsets(offsets, terms.ratio.shape[0])
    active = _unclipped(terms, term_options(options, conventions))
    with np.errstate(over="ignore", invalid="ignore"):
        per = np.where(active, terms.ratio * terms.adv, 0.0)
    kl = None if terms.kl is None else segment_sum(terms.kl, offsets)
    return segment_sum(per, offsets), kl


def token_gradients(
    terms: TokenTerms,
    *,
    offsets: I64 | None = None,
    options: TermOptions | None = None,
    answer_means: SequenceMeans | None = None,
    **conventions: Unpack[TermConventions],
) -> tuple[F64, F64 | None]:
    """Each token's ``∂policy/∂logp_t`` and ``∂kl_loss/∂logp_t`` for the terms of
    :func:`token_terms`, before the aggregation weights (which are constant within an
    answer under every aggregation, so ``∂J/∂logp_t = c·u_i·(g_p − β·g_k)``).

    Token-level ratio (PPO's clipped surrogate, Schulman et al. 2017): with ``ρ = exp(Δ')``
    and ``Δ'`` the clamped ``Δ = logp − old_logp``, ``g_p = ρA`` where the unclipped branch
    is the one ``min`` takes (``A > 0, ρ ≤ 1+ε_high``, or ``A < 0, ρ ≥ 1−ε_low``) and no
    bound binds: 0 where the clip, the dual clip (``A < 0, ρ > c``) or ``log_ratio_clamp``
    (``|Δ| > c``) binds, and 0 for ``A = 0``.

    Sequence-level ratio (GSPO, Zheng et al. 2025): every token of answer ``i`` shares
    ``s_i = exp(min(mean_t Δ, c))`` and ``∂s_i/∂logp_t = s_i/|o_i|``, so the answer's terms
    all move together: ``g_p = mean_{t'∈i}(s_i·A_{t'}·[t' active])`` on each of its tokens
    (``s_i·A`` when the advantage is the answer's), 0 where ``seq_ratio_clamp`` binds.

    KL with ``d = ref_logp − logp`` (``∂d/∂logp = −1``): k1 ``= −d`` gives 1; k2 ``= d²/2``
    gives ``−d``; k3 ``= e^d − d − 1`` gives ``1 − e^d`` (0 where ``log_ratio_clamp`` binds
    on ``d``); 0 where ``kl_clamp`` binds. With ``kl_bias_correction`` the loss takes
    ``kl·ρ`` (TRL 1.16.0 multiplies by the undetached ratio): ``g_k = kl'·ρ + kl·ρ`` per
    token (token level, where ``Δ`` is free), ``kl'·s_i + s_i·mean_i(kl)`` (sequence level).
    The KL in the reward enters through the advantages, which the trainers detach: no term.
    ``answer_means`` gives the answer means of the sequence level when ``terms`` hold a
    slice of an answer (:func:`sequence_sums` over its slices, divided by its length).
    ``options`` and the keywords as :func:`token_terms` takes them (β plays no part).

    Raises:
        InputError: ``offsets`` (needed at sequence level) breaks the contract of
            :func:`check_offsets`.
    """
    o = term_options(options, conventions)
    rho, a = terms.ratio, terms.adv
    if offsets is not None:
        offsets = check_offsets(offsets, rho.shape[0], nonempty=answer_means is None)
    active = _unclipped(terms, o)
    if o.ratio_level == "sequence":
        if offsets is None:
            raise UsageError("the sequence-level gradient needs the answers' offsets")
        lengths = np.diff(offsets)
        m = answer_means
        free: NDArray[np.bool_] = np.ones(rho.shape, dtype=bool)
        if o.seq_ratio_clamp is not None:
            mean_delta = segment_mean(terms.delta, offsets) if m is None else m.delta
            free = np.repeat(mean_delta <= o.seq_ratio_clamp, lengths)
        with np.errstate(over="ignore", invalid="ignore"):
            per = np.where(active, rho * a, 0.0)
            mean_per = segment_mean(per, offsets) if m is None else m.policy
            gp = np.where(free, np.repeat(mean_per, lengths), 0.0)
    else:
        free = np.ones(rho.shape, dtype=bool)  # ∂Δ'/∂logp = 1: no log-ratio clamp binds
        if o.log_ratio_clamp is not None:
            free = np.abs(terms.delta) <= o.log_ratio_clamp
        with np.errstate(over="ignore", invalid="ignore"):
            gp = np.where(active & free, rho * a, 0.0)
    if terms.ref_delta is None or terms.kl is None:
        return gp, None
    d = terms.ref_delta
    lrc = o.log_ratio_clamp
    if o.kl_estimator == "k1":
        gk = np.ones(d.shape)
    elif o.kl_estimator == "k2":
        gk = -d
    else:
        dc = d if lrc is None else np.clip(d, -lrc, lrc)
        with np.errstate(over="ignore"):
            gk = 1.0 - np.exp(dc)
        if lrc is not None:
            gk[np.abs(d) > lrc] = 0.0
    if o.kl_clamp is not None:
        gk[np.abs(terms.kl) >= o.kl_clamp] = 0.0  # the clamp binds (kl is clamped already)
    if o.kl_bias_correction:
        with np.errstate(over="ignore", invalid="ignore"):
            if o.ratio_level == "sequence":
                assert offsets is not None
                kl_means = answer_means.kl if answer_means is not None else None
                if kl_means is None:
                    kl_means = segment_mean(terms.kl, offsets)
                mean_kl = np.repeat(kl_means, np.diff(offsets))
                gk = gk * rho + np.where(free, rho * mean_kl, 0.0)
            else:
                gk = gk * rho + np.where(free, terms.kl * rho, 0.0)
    return gp, gk


def require_reference(beta: float, ref_logp: object) -> None:
    """A KL term (``beta != 0``) needs the reference log-probs."""
    if beta != 0.0 and ref_logp is None:
        raise UsageError("beta > 0 needs ref_logp (the reference policy's log-probs)")


def grpo_objective(
    logp: ArrayLike,
    old_logp: ArrayLike,
    ref_logp: ArrayLike,
    advantages: ArrayLike,
    mask: ArrayLike,
    clip_eps: float = 0.2,
    beta: float = 0.04,
) -> float:
    """GRPO objective J (maximised; the loss is −J), DeepSeekMath (Shao et al. 2024) eq. 3.

    ``J = (1/N) Σ_i (1/|o_i|) Σ_{t∈o_i} [min(ρ A_i, clip(ρ, 1−ε, 1+ε) A_i) − β k3]``
    with ``ρ = exp(logp − old_logp)`` and k3 as in :func:`kl_k3`. Padding (mask False)
    may hold any finite value and never changes the result; inputs are not modified.

    Args:
        logp, old_logp, ref_logp: ``(N, L)`` real log-probs.
        advantages: ``(N,)`` one advantage per answer.
        mask: ``(N, L)`` bool (or 0/1); every row has at least one True.
        clip_eps: ε, ``>= 0``.
        beta: KL weight β, ``>= 0``.

    Returns:
        J as a Python float.

    Example:
        >>> logp = np.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
        >>> old = np.array([[-1.1, -0.5, -1.0], [-0.6, -1.0, 0.0]])
        >>> ref = np.array([[-1.2, -0.4, -1.5], [-0.4, -1.1, 0.0]])
        >>> m = np.array([[True, True, True], [True, True, False]])
        >>> grpo_objective(logp, old, ref, np.array([1.0, -1.0]), m)
        -0.13122323326245566
    """
    m = _bool_array("mask", mask)
    a = _real_array("logp", logp)
    o = _real_array("old_logp", old_logp)
    r = _real_array("ref_logp", ref_logp)
    adv = _real_array("advantages", advantages)
    _check_rank("logp", a, 2, "(N, L)")
    _same_shape(logp=a, old_logp=o, ref_logp=r, mask=m)
    _check_rank("advantages", adv, 1, "(N,)")
    if adv.shape[0] != a.shape[0]:
        raise InputError(f"advantages: expected shape ({a.shape[0]},), got {adv.shape}")
    if not (np.isfinite(clip_eps) and clip_eps >= 0):
        raise UsageError(f"clip_eps must be a finite number >= 0, got {clip_eps}")
    if not (np.isfinite(beta) and beta >= 0):
        raise UsageError(f"beta must be a finite number >= 0, got {beta}")
    empty = np.flatnonzero(~m.any(axis=1))
    if empty.size:
        raise InputError(f"mask: answer {int(empty[0])} has no valid token")
    offsets, (lp, olp, rlp) = flatten_padded(m, a, o, r)
    for name, v in (("logp", lp), ("old_logp", olp), ("ref_logp", rlp)):
        if not np.isfinite(v).all():
            raise InputError(f"{name}: non-finite value inside the mask")
    terms = token_terms(lp, olp, rlp, adv, offsets, clip_eps=clip_eps, beta=beta)
    return aggregate(terms.term, offsets, agg="seq-mean-token-mean")
