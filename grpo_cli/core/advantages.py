"""Group-relative advantages: group statistics, the GRPO and RLOO estimators, the seed's
``group_advantages``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InputError, UsageError
from .types import (
    F64,
    I64,
    AdvantageEstimator,
    Scale,
    Singleton,
    _check_eps,
    _check_rank,
    _real_array,
    _same_shape,
)


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
    _check_conventions(eps, ddof, scale, estimator, singleton)
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


def _check_conventions(eps: float, ddof: int, scale: str, estimator: str, singleton: str) -> None:
    """The advantage conventions' values, each named when it is not one the kernel takes."""
    _check_eps(eps)
    if ddof not in (0, 1):
        raise UsageError(f"ddof must be 0 or 1, got {ddof}")
    if scale not in ("group", "batch", "none"):
        raise UsageError(f"scale must be group, batch or none, got {scale!r}")
    if estimator not in ("grpo", "rloo"):
        raise UsageError(f"estimator must be grpo or rloo, got {estimator!r}")
    if singleton not in ("zero", "raw"):
        raise UsageError(f"singleton must be zero or raw, got {singleton!r}")


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
