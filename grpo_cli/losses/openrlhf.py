"""OpenRLHF's train/rollout importance-sampling correction with its registry row
(:mod:`grpo_cli.losses.registry`); OpenRLHF's policy losses (``ppo``, ``gspo``) are the
core's clipped surrogate (the row ``clip``).

Mirrors OpenRLHF 0.11.2 ``openrlhf/models/loss.py`` (``PolicyLoss``). Its named schemes
are settings of this one correction: TIS = ``is_correction_level=token``,
``is_correction_mode=clip``; ICEPOP = ``token`` with ``mask``; seq-mask-tis = ``seq`` with
``mask`` (``openrlhf/cli/train_ppo_ray.py``). numpy only, no I/O, no globals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..core import RatioLevel, segment_mean
from ..errors import SettingError, UsageError
from .registry import (
    F64,
    I64,
    Correction,
    CorrectionRow,
    Loss,
    Mask,
    Params,
    Spec,
    _choice,
    _exp,
    _inputs,
    param,
)

__all__ = ["CORRECTIONS", "LOSSES", "openrlhf_is_correction"]

OrlLevel = Literal["off", "token", "seq"]
OrlMode = Literal["mask", "clip"]
OrlGating = Literal["ratio", "binary_kl", "tv"]


def openrlhf_is_correction(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    offsets: ArrayLike,
    *,
    level: OrlLevel = "off",
    mode: OrlMode = "mask",
    gating: OrlGating = "ratio",
    threshold: tuple[float, float] = (0.5, 5.0),
) -> Correction:
    """OpenRLHF's train/rollout importance-sampling correction of the PPO loss.

    ``ρ_t = exp(old_logp − rollout_logp)``; a gate reads a statistic per unit (the token,
    or the answer's mean at ``level="seq"``): ``"ratio"`` the ratio (its geometric mean
    per answer), ``"binary_kl"`` ``p·log(p/q) + (1−p)·log((1−p)/(1−q))`` or ``"tv"`` ``|p −
    q|`` with ``p = e^rollout``, ``q = e^old`` clamped to ``[1e-6, 1 − 1e-6]`` (their
    plain mean per answer). ``mode="mask"``: ``w = ρ_t`` where the unit's statistic is
    within ``[low, high]``, else 0; ``"clip"`` (token ratio only): ``w = clip(ρ_t, low,
    high)``. Only for ``policy_loss_type="ppo"``, multiplying the per-token loss (after the
    dual clip). (With ``"gspo"`` and a level other than off, OpenRLHF instead takes the
    sequence ratio against ``rollout_logp``: pass it as ``old_logp`` to the core's sequence
    level; no weight.)

    Mirrors OpenRLHF 0.11.2 ``openrlhf/models/loss.py`` ``PolicyLoss.forward``
    (``--algo.advantage.is_correction_level`` → ``level``, ``_mode`` → ``mode``,
    ``_gating`` → ``gating``, ``_threshold`` → ``threshold``: ``LOW HIGH``, a single value
    meaning ``(0, HIGH)``; TIS = token clip, ICEPOP = token mask, seq-mask-tis = seq mask).
    See "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (Yao et al.
    2025). Metrics (``experience.info``): ``vllm_kl`` = mean over tokens of ``rollout_logp −
    old_logp``; ``is_filter_ratio`` = share of units outside the band (tokens, or answers
    at ``"seq"``). ``level="off"``: weights 1, no metric.

    Folds: per token, or per answer at ``"seq"``.

    Example:
        >>> c = openrlhf_is_correction([-1.0, -1.0], [-1.0, -3.0], [0, 1, 2], level="token")
        >>> c.weight.tolist(), c.metrics["is_filter_ratio"]  # e² = 7.4 > 5: masked
        ([1.0, 0.0], 0.5)
    """
    off, _, x = _inputs(offsets, None, old_logp=old_logp, rollout_logp=rollout_logp)
    _choice("level", level, ("off", "token", "seq"))
    _choice("mode", mode, ("mask", "clip"))
    _choice("gating", gating, ("ratio", "binary_kl", "tv"))
    low, high = threshold
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        raise UsageError('mode="clip" needs level="token" and gating="ratio"')
    if gating != "ratio" and level != "off" and low > 0:
        raise UsageError(f"gating={gating} takes an upper bound only: threshold (0, HIGH)")
    old, roll = x["old_logp"], x["rollout_logp"]
    T = old.shape[0]
    if level == "off":
        return Correction(weight=np.ones(T), keep=np.ones(T, dtype=bool), metrics={})
    with np.errstate(over="ignore", invalid="ignore"):
        lr = old - roll
    rho = _exp(lr)
    seq = level == "seq"
    if gating == "ratio":
        stat = _exp(segment_mean(lr, off)) if seq else rho
    else:
        p = np.clip(_exp(roll), 1e-6, 1 - 1e-6)
        q = np.clip(_exp(old), 1e-6, 1 - 1e-6)
        if gating == "binary_kl":
            s = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
        else:
            s = np.abs(p - q)
        stat = segment_mean(s, off) if seq else s
    if mode == "clip":
        w = np.clip(stat, low, high)
        filtered = (stat < low) | (stat > high)
    else:
        inside = (stat >= low) & (stat <= high)
        filtered = ~inside
        w = np.where(np.repeat(inside, np.diff(off)) if seq else inside, rho, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        vllm_kl = float(np.sum(roll - old) / T)
    metrics = {"vllm_kl": vllm_kl, "is_filter_ratio": float(np.mean(filtered))}
    return Correction(weight=w, keep=np.ones(T, dtype=bool), metrics=metrics)


@dataclass(frozen=True)
class ISParams(Params):
    is_correction_level: str = param(
        "token", Spec("choice", "the gated unit", choices=("off", "token", "seq"))
    )
    is_correction_mode: str = param(
        "mask", Spec("choice", "drop (mask) or clamp (clip) a unit out of band",
                     choices=("mask", "clip")),
    )  # fmt: skip
    is_correction_gating: str = param(
        "ratio", Spec("choice", "the statistic the gate reads",
                      choices=("ratio", "binary_kl", "tv")),
    )  # fmt: skip
    is_correction_low: float = param(0.5, Spec(low=0.0, closed=True, help="the band's low bound"))
    is_correction_high: float = param(5.0, Spec(low=0.0, help="the band's high bound"))

    def check(self) -> None:
        if self.is_correction_low > self.is_correction_high:
            raise SettingError(
                "is_correction_low",
                f"must not exceed is_correction_high ({self.is_correction_high})",
            )
        if self.is_correction_mode == "clip" and (
            self.is_correction_level == "seq" or self.is_correction_gating != "ratio"
        ):
            raise SettingError(
                "is_correction_mode", "clip needs is_correction_level token and gating ratio"
            )
        if self.is_correction_gating != "ratio" and self.is_correction_low > 0:
            raise SettingError(
                "is_correction_low",
                f"gating {self.is_correction_gating} takes an upper bound only: 0",
            )


def _is(old: F64, rollout: F64, offsets: I64, p: Params) -> Correction:
    assert isinstance(p, ISParams)
    return openrlhf_is_correction(
        old, rollout, offsets, level=p.is_correction_level,  # type: ignore[arg-type]
        mode=p.is_correction_mode,  # type: ignore[arg-type]
        gating=p.is_correction_gating,  # type: ignore[arg-type]
        threshold=(p.is_correction_low, p.is_correction_high),
    )  # fmt: skip


def _kind(name: str, seq: bool) -> tuple[str, str]:
    """``vllm_kl`` is a token mean; ``is_filter_ratio`` a share of tokens, of answers at
    the sequence level."""
    return "mean", "answers" if (seq and name == "is_filter_ratio") else "tokens"


def _excludes(p: Params, level: RatioLevel, loss: str) -> tuple[str, str] | None:
    if level == "sequence":
        return "correction", (
            "openrlhf-is with a sequence ratio (gspo) takes the ratio against the sampler's "
            "log-probs instead: give rollout_logp as old_logp"
        )
    return None


LOSSES: tuple[Loss, ...] = ()
CORRECTIONS = (
    CorrectionRow(
        "openrlhf-is", "openrlhf", _is, "OpenRLHF's IS correction",
        params=ISParams,
        per_answer=lambda p: getattr(p, "is_correction_level", "") == "seq",
        metric_kind=_kind, excludes=_excludes,
    ),
)  # fmt: skip
MASKS: tuple[Mask, ...] = ()
