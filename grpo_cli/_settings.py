"""Every convention of the computation in one record, and presets of trainers' defaults.

A :class:`Settings` is echoed in every JSON report (``settings``), so a logged number can
always be traced to its definition. Presets set every field at once; explicit options
override a preset field by field (:func:`resolve_settings`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

from ._core import (
    AGGREGATIONS,
    AdvantageEstimator,
    Aggregation,
    ClipUnit,
    KLEstimator,
    NormScale,
    RatioLevel,
    Scale,
    Singleton,
    TermOptions,
)
from .errors import UsageError
from .trainers import TRAINERS as _TRAINERS

__all__ = ["OFF", "PRESETS", "TRAINERS", "SettingError", "Settings", "resolve_settings"]


KLMode = Literal["loss", "reward"]

OFF = object()
"""An override meaning "turn this optional convention off" (e.g. a preset's dual clip)."""


@dataclass(frozen=True)
class Settings:
    """The conventions of one computation. Defaults are the seed spec's (DeepSeekMath).

    Advantages: ``scale`` group|batch|none, ``ddof`` 0|1, ``eps``, ``estimator``
    grpo|rloo, ``singleton`` zero|raw. Ratio: ``ratio_level`` token|sequence,
    ``clip_eps`` (ε_low), ``clip_eps_high`` (None: = ε_low), ``dual_clip`` (c or None),
    ``log_ratio_clamp`` (None: off; clamps per-token log-ratios before ``exp`` at token
    level, and k3's exponent), ``seq_ratio_clamp`` (upper bound of the sequence log-ratio
    after the mean; sequence level only), ``clip_unit`` tokens|sequences (what a clip
    fraction counts). KL: ``beta``, ``kl_estimator`` k1|k2|k3, ``kl_clamp``,
    ``kl_bias_correction`` (the per-token KL times the importance ratio, TRL),
    ``kl_agg`` (None: as ``agg``), ``kl_mode`` loss|reward (the KL in the loss, or in the
    reward, the trainer's way), ``adv_clip`` (bound |A|: OpenRLHF's reward clip).
    Aggregation: ``agg``, ``max_len`` (L of seq-mean-token-sum-norm; None: the widest row)
    and ``norm_scale`` n-lmax|lmax.
    ``trainer`` and ``mirrors`` name the trainer (and version) a preset reproduces.
    """

    preset: str | None = None
    trainer: str | None = None  # a registered trainer (grpo_cli.trainers)
    mirrors: str | None = None
    scale: Scale = "group"
    ddof: int = 0
    eps: float = 1e-8
    estimator: AdvantageEstimator = "grpo"
    singleton: Singleton = "zero"
    adv_clip: float | None = None
    ratio_level: RatioLevel = "token"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    log_ratio_clamp: float | None = None
    seq_ratio_clamp: float | None = None
    clip_unit: ClipUnit = "tokens"
    beta: float = 0.04
    kl_estimator: KLEstimator = "k3"
    kl_clamp: float | None = None
    kl_bias_correction: bool = False
    kl_mode: KLMode = "loss"
    agg: Aggregation = "seq-mean-token-mean"
    kl_agg: Aggregation | None = None
    max_len: int | None = None
    norm_scale: NormScale = "n-lmax"

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def kl_aggregation(self) -> Aggregation:
        """The aggregation of the KL term (``kl_agg``, else ``agg``)."""
        return self.agg if self.kl_agg is None else self.kl_agg

    def advantage_kwargs(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "ddof": self.ddof,
            "eps": self.eps,
            "estimator": self.estimator,
            "singleton": self.singleton,
            "clip": self.adv_clip,
        }

    def term_options(self) -> TermOptions:
        """The per-token terms' options; with the KL in the reward the loss has none."""
        return TermOptions.of(self, beta=self.beta if self.kl_mode == "loss" else 0.0)

    def term_kwargs(self) -> dict[str, Any]:
        """:meth:`term_options` as keywords (for callers of the keyword form)."""
        return asdict(self.term_options())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def __post_init__(self) -> None:
        self._check_fields()
        self._check_combination()

    def validate(self) -> Settings:
        """The settings themselves: they were checked when made (kept for callers)."""
        return self

    def _check_fields(self) -> None:
        """Each field on its own; a problem is a :class:`SettingError` naming the field."""
        choices: dict[str, tuple[Any, ...]] = {
            "scale": get_args(Scale),
            "estimator": get_args(AdvantageEstimator),
            "singleton": get_args(Singleton),
            "ratio_level": get_args(RatioLevel),
            "clip_unit": get_args(ClipUnit),
            "kl_mode": get_args(KLMode),
            "kl_estimator": get_args(KLEstimator),
            "agg": AGGREGATIONS,
            "kl_agg": (None, *AGGREGATIONS),
            "norm_scale": NORM_SCALES,
            "trainer": (None, *_TRAINERS),
        }
        if self.norm_scale in _OLD_NORM_SCALES:
            raise SettingError(
                "norm_scale",
                f"{self.norm_scale!r} was renamed: use n-lmax (Σ/(N·L): TRL dr_grpo and "
                "verl >= 0.7.1) or lmax (Σ/L: verl <= 0.7.0)",
            )
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                listed = ", ".join(a for a in allowed if a is not None)
                raise SettingError(name, f"{value!r} is not one of {listed}")
        if self.ddof not in (0, 1):
            raise SettingError("ddof", f"must be 0 or 1, got {self.ddof}")
        nonneg = {"eps": self.eps, "clip_eps": self.clip_eps, "beta": self.beta}
        if self.clip_eps_high is not None:
            nonneg["clip_eps_high"] = self.clip_eps_high
        for name, v in nonneg.items():
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise SettingError(name, f"must be a finite number >= 0, got {v}")
        positive = {
            "adv_clip": self.adv_clip,
            "dual_clip": self.dual_clip,
            "log_ratio_clamp": self.log_ratio_clamp,
            "seq_ratio_clamp": self.seq_ratio_clamp,
            "kl_clamp": self.kl_clamp,
        }
        for name, p in positive.items():
            if p is not None and not (isinstance(p, int | float) and math.isfinite(p) and p > 0):
                raise SettingError(name, f"must be a finite number > 0, got {p}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise SettingError("dual_clip", f"must be > 1, got {self.dual_clip}")
        if self.max_len is not None and self.max_len < 1:
            raise SettingError("max_len", f"must be >= 1, got {self.max_len}")

    def _check_combination(self) -> None:
        """Fields that only make sense together."""
        able = [t.name for t in _TRAINERS.values() if t.reward_kl is not None]
        named = _TRAINERS.get(self.trainer) if self.trainer is not None else None
        if self.kl_mode == "reward" and (named is None or named.reward_kl is None):
            raise SettingError(
                "kl_mode",
                f"reward needs trainer {' or '.join(able)}: they put the KL into the reward "
                "in different ways (name one with --trainer or a preset)",
            )
        if self.ratio_level == "token":
            if self.clip_unit == "sequences":
                raise SettingError(
                    "clip_unit",
                    "sequences needs ratio_level sequence (with a token ratio every token "
                    "is clipped on its own)",
                )
            if self.seq_ratio_clamp is not None:
                raise SettingError("seq_ratio_clamp", "needs ratio_level sequence")


class SettingError(UsageError):
    """A field of :class:`Settings` is invalid; ``field`` names it (the CLI shows the flag)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


NORM_SCALES: tuple[NormScale, ...] = get_args(NormScale)
_OLD_NORM_SCALES = ("trl", "verl")
TRAINERS = tuple(_TRAINERS)


def _presets() -> dict[str, Settings]:
    """DeepSeekMath's (the defaults), then every registered trainer's presets, each as the
    trainer's defaults for every convention (README "Presets" maps them to the trainers'
    config keys); :func:`_preset_rules` then adjusts the fields that, in the trainer's
    code, depend on another choice."""
    # DeepSeekMath (Shao et al. 2024): population std, eps 1e-8, seq-mean-token-mean, k3,
    # beta 0.04.
    out = {"deepseekmath": Settings(preset="deepseekmath")}
    for t in _TRAINERS.values():
        for name, values in t.presets.items():
            out[name] = Settings(preset=name, trainer=t.name, mirrors=t.version, **values)
    return out


def _preset_rules(s: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """Fields of a preset that, in its trainer's code, follow another choice; only fields
    the user did not give are changed.

    - Any preset at token level: clip fractions count tokens, no sequence-ratio clamp.
    - The trainer's own rules (:attr:`grpo_cli.trainers.Trainer.dependent`).
    """
    out: dict[str, Any] = {}

    def default(name: str, value: Any) -> Any:
        if name not in given:
            out[name] = value
        return out.get(name, s[name])

    if s["ratio_level"] == "token":
        default("clip_unit", "tokens")
        default("seq_ratio_clamp", None)
    t = _TRAINERS.get(s["trainer"]) if s["trainer"] is not None else None
    if t is not None:
        t.dependent(s, default)
    return out


_FIELDS = {f.name for f in fields(Settings)}
PRESETS: dict[str, Settings] = _presets()


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
    values = {**asdict(base), **given}
    if preset is not None:
        values.update(_preset_rules(values, set(given)))
    return Settings(**values)
