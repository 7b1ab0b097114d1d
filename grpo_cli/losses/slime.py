"""slime's policy losses, its off-policy corrections (TIS, ICEPOP), its OPSM mask, its KL
loss and its reducer, with their registry rows (:mod:`grpo_cli.losses.registry`).

Read from slime (THUDM) at commit ``624b824a898ab0ec1fcb4d373004c7f3852bf515``:
``slime/utils/ppo_utils.py`` (``compute_approx_kl`` 11-51, ``compute_opsm_mask`` 54-92,
``compute_gspo_kl`` 95-121, ``compute_policy_loss`` 124-148, ``compute_cispo_loss``
151-171), ``slime/backends/megatron_utils/loss.py`` (``vanilla_tis_function`` 884-905,
``icepop_function`` 908-931, ``policy_loss_function`` 934-1173) and
``slime/backends/megatron_utils/cp_utils.py`` (``get_sum_of_sample_mean`` 47-124); the
numbers are checked against that code run on crafted batches
(``conformance/frontier/fixtures/slime.json``, ``tests/test_slime.py``).

Notation: per token Δ = ``ppo_kl`` = old_logp − logp (slime's sign), ρ = e^(−Δ), A the
advantage; arrays hold the loss-mask tokens only, ``offsets`` ``(N+1,)`` their samples.
Every function here is numpy only, float64, and writes to no input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..core import segment_mean, segment_sum
from ..errors import SettingError
from .registry import (
    F64,
    I64,
    Correction,
    CorrectionRow,
    Loss,
    LossCall,
    Mask,
    Metric,
    Params,
    PolicyTerms,
    Spec,
    _choice,
    _exp,
    _inputs,
    param,
)
from .trl import cispo_terms

__all__ = [
    "CORRECTIONS",
    "LOSSES",
    "MASKS",
    "slime_kl",
    "slime_opsm_keep",
    "slime_policy_terms",
    "slime_reduce",
    "slime_tis",
]

SlimeKL = Literal["k1", "k2", "k3", "low_var_kl"]
TisKind = Literal["off", "vanilla", "icepop"]


def slime_policy_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    gspo: bool = False,
) -> PolicyTerms:
    """slime's PPO clip, with its dual clip and its GSPO sequence ratio.

    ``ℓ = max(−ρA, −clip(ρ, 1 − eps_clip, 1 + eps_clip_high)·A)``, for ``A < 0`` with
    ``eps_clip_c``: ``ℓ = min(−eps_clip_c·A, ℓ)``; ``term = −ℓ``. GSPO (``--advantage-estimator
    gspo``): Δ is the sample's mean of (old − logp) on each of its tokens. Flags:
    ``clipped`` where the clipped loss is the larger (``pg_clipfrac``); values: ``ppo_kl``
    = Δ (the one the loss used). ``grad`` is ``ρA`` where the unclipped branch is taken,
    else 0 (None at the sequence level).

    Mirrors slime 624b824a ``compute_policy_loss`` (ppo_utils.py:124-148) and
    ``compute_gspo_kl`` (95-121). See PPO (Schulman et al. 2017), dual clip (Ye et al.
    2020), GSPO (Zheng et al. 2025).

    Example:
        >>> t = slime_policy_terms([-1.0, -1.0], [-1.0, -2.0], [1.0], [0, 2])
        >>> t.term.tolist(), t.flags["clipped"].tolist()
        ([1.0, 1.2], [False, True])
    """
    off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    high = eps_clip if eps_clip_high is None else eps_clip_high
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise SettingError("eps_clip_c", f"must be > 1 (slime asserts it), got {eps_clip_c}")
    with np.errstate(over="ignore", invalid="ignore"):
        kl = x["old_logp"] - x["logp"]
    if gspo:
        kl = np.repeat(segment_mean(kl, off), np.diff(off))
    rho = _exp(-kl)
    pg1 = -rho * a
    pg2 = -np.clip(rho, 1.0 - eps_clip, 1.0 + high) * a
    clipped = pg2 > pg1
    loss = np.maximum(pg1, pg2)
    unclipped = ~clipped
    if eps_clip_c is not None:
        pg3 = -eps_clip_c * a
        dual = (a < 0) & (pg3 < loss)
        loss = np.where(a < 0, np.minimum(pg3, loss), loss)
        unclipped &= ~dual
    grad = None if gspo else np.where(unclipped, rho * a, 0.0)
    return PolicyTerms(
        term=-loss, grad=grad, ratio=rho, flags={"clipped": clipped}, values={"ppo_kl": kl},
        level="sequence" if gspo else "token",
    )  # fmt: skip


def slime_tis(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    offsets: ArrayLike,
    *,
    kind: TisKind = "vanilla",
    tis_clip: float = 2.0,
    tis_clip_low: float = 0.0,
    per_token: bool = False,
) -> Correction:
    """slime's train/rollout importance weights and their metrics.

    ``w = exp(old_logp − rollout_logp)`` (the *old* log-probs, ``batch["log_probs"]``);
    ``kind="vanilla"`` (``--use-tis``): the loss times ``clamp(w, tis_clip_low, tis_clip)``;
    ``"icepop"`` (``--custom-tis-function-path …icepop_function``): times ``w`` inside
    ``[tis_clip_low, tis_clip]``, 0 outside; ``"off"``: weight 1. Metrics, each slime's
    reducer over the batch's samples (the mean over samples of each sample's token mean;
    over tokens with ``per_token``, ``--calculate-per-token-loss``):
    ``train_rollout_logprob_abs_diff`` = |old − rollout| (always), and with TIS ``tis`` = w,
    ``tis_clipfrac`` = [the clamp changed w] (vanilla) or [w outside the band] (icepop),
    ``tis_abs`` = |w − 1|.

    Mirrors slime 624b824a ``vanilla_tis_function`` (loss.py:884-905), ``icepop_function``
    (908-931), their metrics (1040-1092). See "Your Efficient RL Framework Secretly Brings
    You Off-Policy RL Training" (Yao et al. 2025), IcePop (Ling Team 2025).

    Example:
        >>> c = slime_tis([-1.0, -1.0], [-1.0, -3.0], [0, 2])
        >>> c.weight.tolist(), c.metrics["tis_clipfrac"]
        ([1.0, 2.0], 0.5)
    """
    off, _, x = _inputs(offsets, None, old_logp=old_logp, rollout_logp=rollout_logp)
    _choice("kind", kind, ("off", "vanilla", "icepop"))
    old, roll = x["old_logp"], x["rollout_logp"]
    with np.errstate(over="ignore", invalid="ignore"):
        d = old - roll
    mean = (lambda v: float(np.mean(v))) if per_token else (lambda v: _sample_mean(v, off))
    metrics = {"train_rollout_logprob_abs_diff": mean(np.abs(d))}
    if kind == "off":
        return Correction(weight=np.ones(d.shape), keep=np.ones(d.shape, bool), metrics=metrics)
    w = _exp(d)
    outside = (w < tis_clip_low) | (w > tis_clip)
    weight = np.clip(w, tis_clip_low, tis_clip) if kind == "vanilla" else np.where(outside, 0.0, w)
    metrics.update(
        tis=mean(w), tis_clipfrac=mean(outside.astype(np.float64)), tis_abs=mean(np.abs(w - 1.0))
    )
    return Correction(weight=weight, keep=np.ones(d.shape, bool), metrics=metrics)


def slime_opsm_keep(
    logp: ArrayLike, old_logp: ArrayLike, adv: ArrayLike, offsets: ArrayLike, *, opsm_delta: float
) -> F64:
    """slime's OPSM mask as a 0/1 weight of the policy loss: 0 on the ``A < 0`` tokens of a
    sample whose mean of (old − logp) exceeds ``opsm_delta``, 1 elsewhere.

    Mirrors slime 624b824a ``compute_opsm_mask`` (ppo_utils.py:54-92; ``ℓ·(1 − mask)``,
    loss.py:1029-1038).

    Example:
        >>> slime_opsm_keep([-2.0, -2.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, 1.0, -1.0],
        ...                 [0, 2, 3], opsm_delta=1e-4).tolist()
        [0.0, 1.0, 1.0]
    """
    off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    with np.errstate(over="ignore", invalid="ignore"):
        over = segment_mean(x["old_logp"] - x["logp"], off) > opsm_delta
    return np.where(np.repeat(over, np.diff(off)) & (a < 0), 0.0, 1.0)


def slime_kl(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    old_logp: ArrayLike | None = None,
    *,
    kl_loss_type: SlimeKL = "k1",
    use_unbiased_kl: bool = False,
) -> F64:
    """slime's per-token KL estimate of the policy against the reference.

    With ``x = logp − ref_logp``: ``k1 = x``, ``k2 = x²/2``, ``k3`` = ``low_var_kl`` =
    ``e^(−x) − 1 + x``; ``use_unbiased_kl``: times ``exp(logp − old_logp)`` (DeepSeek-V3.2);
    ``low_var_kl`` then clamped to ``[−10, 10]``. These are grpo-cli's k1/k2/k3 (the
    core's ``--kl-estimator``) and ``--kl-clamp 10`` for ``low_var_kl``.

    Mirrors slime 624b824a ``compute_approx_kl`` (ppo_utils.py:11-51). See Schulman,
    "Approximating KL divergence" (2020).

    Example:
        >>> slime_kl([-1.0], [-1.0], kl_loss_type="low_var_kl").tolist()
        [0.0]
    """
    _choice("kl_loss_type", kl_loss_type, ("k1", "k2", "k3", "low_var_kl"))
    lp = np.asarray(logp, dtype=np.float64)
    x = lp - np.asarray(ref_logp, dtype=np.float64)
    if kl_loss_type == "k1":
        k = x
    elif kl_loss_type == "k2":
        k = x * x / 2.0
    else:
        k = _exp(-x) - 1.0 + x
    if use_unbiased_kl:
        old = lp if old_logp is None else np.asarray(old_logp, dtype=np.float64)
        k = k * _exp(lp - old)
    return np.clip(k, -10.0, 10.0) if kl_loss_type == "low_var_kl" else k


def slime_reduce(
    x: ArrayLike, offsets: ArrayLike, denominators: ArrayLike, *, per_token: bool = False
) -> float:
    """slime's reducer over one micro-batch: ``S(x) = Σ_i Σ_t x_it / max(D_i, 1)`` with
    ``D_i`` = ``rollout_mask_sums[i]``, or ``Σ_i Σ_t x_it`` with ``per_token``
    (``--calculate-per-token-loss``). Arrays hold the loss-mask tokens.

    Mirrors slime 624b824a ``get_sum_of_sample_mean`` (cp_utils.py:47-124, CP = 1).

    Example:
        >>> slime_reduce([1.0, 3.0, 5.0], [0, 2, 3], [2.0, 1.0])
        7.0
    """
    v = np.asarray(x, dtype=np.float64)
    off = np.asarray(offsets, dtype=np.int64)
    if per_token:
        return float(np.sum(v))
    d = np.maximum(np.asarray(denominators, dtype=np.float64), 1.0)
    return float(np.sum(segment_sum(v, off) / d))


def _sample_mean(v: F64, off: I64) -> float:
    return float(np.mean(segment_mean(v, off))) if off.shape[0] > 1 else 0.0


# ---------------------------------------------------------------------- registry rows
def _unit(p: Params) -> Literal["answers", "tokens"]:
    return "tokens" if getattr(p, "calculate_per_token_loss", False) else "answers"


@dataclass(frozen=True)
class ClipParams(Params):
    calculate_per_token_loss: bool = param(
        False, Spec("bool", "metrics as token means (slime's per-token reducer)")
    )


def _clip_metrics(p: Params) -> tuple[Metric, ...]:
    u = _unit(p)
    return (
        Metric("pg_clipfrac", "clipped", u, "tokens whose clipped loss is the larger"),
        Metric("ppo_kl", "ppo_kl", u, "old_logp − logp"),
    )


def _ppo(c: LossCall) -> PolicyTerms:
    return slime_policy_terms(
        c.logp, c.old, c.adv, c.offsets, eps_clip=c.clip_low, eps_clip_high=c.clip_high,
        eps_clip_c=c.dual_clip, gspo=c.ratio_level == "sequence",
    )  # fmt: skip


def _cispo(c: LossCall) -> PolicyTerms:
    # slime's compute_cispo_loss is TRL/verl's CISPO with lower = 1 − eps_clip and
    # upper = 1 + eps_clip_high and no log-ratio clamp: the same function
    t = cispo_terms(
        c.logp, c.old, c.adv, c.offsets, lower=1.0 - c.clip_low, upper=1.0 + c.clip_high
    )
    return t


def _cispo_metrics(p: Params) -> tuple[Metric, ...]:
    u = _unit(p)
    return (
        Metric("pg_clipfrac", "clipped", u, "tokens whose weight differs from ρ"),
        Metric("ppo_kl", "ppo_kl", u, "old_logp − logp"),
    )


@dataclass(frozen=True)
class TisParams(Params):
    tis_kind: str = param(
        "vanilla",
        Spec("choice", "off (metrics only), vanilla (--use-tis) or icepop",
             choices=("off", "vanilla", "icepop")),
    )  # fmt: skip
    tis_clip: float = param(2.0, Spec(low=0.0, help="the weights' upper bound"))
    tis_clip_low: float = param(0.0, Spec(low=0.0, closed=True, help="their lower bound"))
    tis_per_token: bool = param(
        False, Spec("bool", "metrics as token means (slime's --calculate-per-token-loss)")
    )

    def check(self) -> None:
        if self.tis_clip_low > self.tis_clip:
            raise SettingError("tis_clip_low", f"must not exceed tis_clip ({self.tis_clip})")


def _tis(old: F64, rollout: F64, offsets: I64, p: Params) -> Correction:
    assert isinstance(p, TisParams)
    return slime_tis(
        old, rollout, offsets, kind=p.tis_kind,  # type: ignore[arg-type]
        tis_clip=p.tis_clip, tis_clip_low=p.tis_clip_low, per_token=p.tis_per_token,
    )  # fmt: skip


def _tis_kind(name: str, seq: bool) -> tuple[str, str]:
    """Each metric is slime's reducer: a mean over samples (``per_answer``: tokens with
    the per-token reducer)."""
    del name
    return "mean", "answers" if seq else "tokens"


@dataclass(frozen=True)
class OpsmParams(Params):
    use_opsm: bool = param(False, Spec("bool", "apply slime's off-policy sequence mask"))
    opsm_delta: float = param(1e-4, Spec(help="the mean (old − logp) above which A < 0 drops"))


def _opsm(c: LossCall) -> F64:
    p = c.params
    delta = getattr(p, "opsm_delta", 1e-4)
    return slime_opsm_keep(c.logp, c.old, c.adv, c.offsets, opsm_delta=float(delta))


LOSSES = (
    Loss("slime/ppo_eps_clip", _ppo,
         "slime's PPO clip (eps_clip, eps_clip_high, the dual clip eps_clip_c; GSPO's "
         "sequence ratio at --ratio-level sequence)",
         params=ClipParams, metrics=_clip_metrics, clip=("pg_clipfrac",)),
    Loss("slime/cispo", _cispo,
         "slime's CISPO (the ratio clipped to [1 − eps_clip, 1 + eps_clip_high], detached, "
         "times A·logp)",
         params=ClipParams, token_ratio=True, metrics=_cispo_metrics,
         clip=("pg_clipfrac",)),
)  # fmt: skip
CORRECTIONS = (
    CorrectionRow(
        "slime-tis", "slime", _tis,
        "slime's TIS / ICEPOP weights exp(old − rollout) and its mismatch metrics",
        params=TisParams,
        per_answer=lambda p: not getattr(p, "tis_per_token", False),
        metric_kind=_tis_kind,
    ),
)  # fmt: skip
MASKS = (
    Mask(
        "slime/opsm", OpsmParams, on=lambda p: bool(getattr(p, "use_opsm", False)),
        weight=_opsm,
        words="slime's OPSM (the A < 0 tokens of samples whose mean old − logp exceeds "
        "opsm_delta leave the policy term)",
    ),
)  # fmt: skip
