"""Every convention of the computation in one record, and presets of trainers' defaults.

A :class:`Settings` is echoed in every JSON report (``settings``), so a logged number can
always be traced to its definition. Presets set every field at once; explicit options
override a preset field by field (:func:`resolve_settings`).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ._core import AGGREGATIONS
from .errors import UsageError

__all__ = ["OFF", "PRESETS", "Settings", "resolve_settings"]


def env_int(name: str, default: int, minimum: int = 1) -> int:
    """An integer tuning knob from the environment (``default`` when unset); anything
    else than an integer ``>= minimum`` is a :class:`UsageError`, read when it is used."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}")
    return value


OFF = object()
"""An override meaning "turn this optional convention off" (e.g. a preset's dual clip)."""


@dataclass(frozen=True)
class Settings:
    """The conventions of one computation. Defaults are the seed spec's (DeepSeekMath).

    Advantages: ``scale`` group|batch|none, ``ddof`` 0|1, ``eps``, ``estimator``
    grpo|rloo, ``singleton`` zero|raw. Ratio: ``ratio_level`` token|sequence,
    ``clip_eps`` (ε_low), ``clip_eps_high`` (None: = ε_low), ``dual_clip`` (c or None),
    ``log_ratio_clamp`` (None: off). KL: ``beta``, ``kl_estimator`` k1|k2|k3, ``kl_clamp``.
    Aggregation: ``agg`` and ``max_len`` (for seq-mean-token-sum-norm; None: the longest
    answer), ``norm_scale`` trl|verl (verl divides by L_max only, TRL by N·L_max).
    """

    preset: str | None = None
    scale: str = "group"
    ddof: int = 0
    eps: float = 1e-8
    estimator: str = "grpo"
    singleton: str = "zero"
    ratio_level: str = "token"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    log_ratio_clamp: float | None = None
    beta: float = 0.04
    kl_estimator: str = "k3"
    kl_clamp: float | None = None
    agg: str = "seq-mean-token-mean"
    max_len: int | None = None
    norm_scale: str = "trl"

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def advantage_kwargs(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "ddof": self.ddof,
            "eps": self.eps,
            "estimator": self.estimator,
            "singleton": self.singleton,
        }

    def term_kwargs(self) -> dict[str, Any]:
        return {
            "clip_eps": self.clip_eps,
            "clip_eps_high": self.clip_eps_high,
            "dual_clip": self.dual_clip,
            "log_ratio_clamp": self.log_ratio_clamp,
            "ratio_level": self.ratio_level,
            "beta": self.beta,
            "kl_estimator": self.kl_estimator,
            "kl_clamp": self.kl_clamp,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> Settings:
        choices = {
            "scale": ("group", "batch", "none"),
            "estimator": ("grpo", "rloo"),
            "singleton": ("zero", "raw"),
            "ratio_level": ("token", "sequence"),
            "kl_estimator": ("k1", "k2", "k3"),
            "agg": AGGREGATIONS,
            "norm_scale": ("trl", "verl"),
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise UsageError(
                    f"--{name.replace('_', '-')}: {value!r} is not one of {', '.join(allowed)}"
                )
        if self.ddof not in (0, 1):
            raise UsageError(f"--ddof: must be 0 or 1, got {self.ddof}")
        nonneg = {"eps": self.eps, "clip-eps": self.clip_eps, "beta": self.beta}
        if self.clip_eps_high is not None:
            nonneg["clip-eps-high"] = self.clip_eps_high
        for name, v in nonneg.items():
            if not (math.isfinite(v) and v >= 0):
                raise UsageError(f"--{name}: must be a finite number >= 0, got {v}")
        positive = {
            "dual-clip": self.dual_clip,
            "log-ratio-clamp": self.log_ratio_clamp,
            "kl-clamp": self.kl_clamp,
        }
        for name, p in positive.items():
            if p is not None and not (math.isfinite(p) and p > 0):
                raise UsageError(f"--{name}: must be a finite number > 0, got {p}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise UsageError(f"--dual-clip: must be > 1, got {self.dual_clip}")
        if self.max_len is not None and self.max_len < 1:
            raise UsageError(f"--max-len: must be >= 1, got {self.max_len}")
        return self


# Each preset: the source's defaults for every convention (REFERENCE.md; the README maps
# them to the trainers' config keys).
PRESETS: dict[str, Settings] = {
    # DeepSeekMath / seed 001: population std, eps 1e-8, seq-mean-token-mean, k3, beta 0.04.
    "deepseekmath": Settings(preset="deepseekmath"),
    # TRL GRPOTrainer: sample std, eps 1e-4, loss_type "dapo" (token-mean), beta 0.0, no clamps.
    "trl": Settings(preset="trl", ddof=1, eps=1e-4, beta=0.0, agg="token-mean"),
    # verl: sample std, eps 1e-6, singleton mean 0 std 1, token-mean, dual clip 3,
    # Δ clamp 20, low_var_kl (k3, exponent clamp 20, value clamp 10), kl_loss_coef 0.001.
    "verl": Settings(
        preset="verl",
        ddof=1,
        eps=1e-6,
        singleton="raw",
        agg="token-mean",
        dual_clip=3.0,
        log_ratio_clamp=20.0,
        kl_clamp=10.0,
        beta=0.001,
        norm_scale="verl",
    ),
    # OpenRLHF group_norm: sample std, eps 1e-9, token-mean, Δ clamp 20, KL clamp 10.
    "openrlhf": Settings(
        preset="openrlhf",
        ddof=1,
        eps=1e-9,
        agg="token-mean",
        log_ratio_clamp=20.0,
        kl_clamp=10.0,
        beta=0.01,
    ),
    # Dr. GRPO: no std division, Σ/(N·L_max), no KL.
    "dr-grpo": Settings(preset="dr-grpo", scale="none", agg="seq-mean-token-sum-norm", beta=0.0),
    # DAPO: clip-higher 0.2/0.28, token-mean, no KL (built on verl: sample std, eps 1e-6).
    "dapo": Settings(
        preset="dapo",
        ddof=1,
        eps=1e-6,
        clip_eps=0.2,
        clip_eps_high=0.28,
        agg="token-mean",
        beta=0.0,
    ),
    # GSPO (as TRL runs it): sequence-level ratio, clip 3e-4/4e-4, no KL, seq-mean-token-mean.
    "gspo": Settings(
        preset="gspo",
        ddof=1,
        eps=1e-4,
        ratio_level="sequence",
        clip_eps=3e-4,
        clip_eps_high=4e-4,
        beta=0.0,
    ),
}

_FIELDS = {f.name for f in fields(Settings)}


def resolve_settings(preset: str | None = None, **overrides: Any) -> Settings:
    """Settings of ``preset`` (default: deepseekmath) with every non-None override applied."""
    if preset is None:
        base = Settings()
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise UsageError(f"--preset: {preset!r} is not one of {', '.join(PRESETS)}")
    unknown = set(overrides) - _FIELDS
    if unknown:
        raise UsageError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    given: dict[str, Any] = {
        k: (None if v is OFF else v) for k, v in overrides.items() if v is not None
    }
    return replace(base, **given).validate()
