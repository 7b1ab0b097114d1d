"""Every convention of the computation in one record, and presets of trainers' defaults.

A :class:`Settings` is echoed in every JSON report (``settings``), so a logged number can
always be traced to its definition. Presets set every field at once; explicit options
override a preset field by field (:func:`resolve_settings`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

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
)
from .errors import UsageError

__all__ = ["OFF", "PRESETS", "TRAINERS", "SettingError", "Settings", "resolve_settings"]


Trainer = Literal["trl", "verl", "openrlhf"]
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
    trainer: Trainer | None = None
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

    def term_kwargs(self) -> dict[str, Any]:
        """The per-token terms' settings; with the KL in the reward the loss has none."""
        return {
            "clip_eps": self.clip_eps,
            "clip_eps_high": self.clip_eps_high,
            "dual_clip": self.dual_clip,
            "log_ratio_clamp": self.log_ratio_clamp,
            "seq_ratio_clamp": self.seq_ratio_clamp,
            "ratio_level": self.ratio_level,
            "beta": self.beta if self.kl_mode == "loss" else 0.0,
            "kl_estimator": self.kl_estimator,
            "kl_clamp": self.kl_clamp,
            "kl_bias_correction": self.kl_bias_correction,
        }

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
            "scale": ("group", "batch", "none"),
            "estimator": ("grpo", "rloo"),
            "singleton": ("zero", "raw"),
            "ratio_level": ("token", "sequence"),
            "clip_unit": ("tokens", "sequences"),
            "kl_mode": ("loss", "reward"),
            "kl_estimator": ("k1", "k2", "k3"),
            "agg": AGGREGATIONS,
            "kl_agg": (None, *AGGREGATIONS),
            "norm_scale": NORM_SCALES,
            "trainer": (None, *TRAINERS),
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
        if self.kl_mode == "reward" and self.trainer not in ("verl", "openrlhf"):
            raise SettingError(
                "kl_mode",
                "reward needs trainer verl or openrlhf: they put the KL into the reward in "
                "different ways (name one with --trainer or a preset)",
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


TRAINERS = ("trl", "verl", "openrlhf")
NORM_SCALES = ("n-lmax", "lmax")
_OLD_NORM_SCALES = ("trl", "verl")

# The trainer versions the presets were checked against, function by function, by the
# conformance suite (conformance/): the trainers' own code on the same tensors.
TRL_VERSION = "trl 1.16.0"
VERL_VERSION = "verl 0.9.1"
OPENRLHF_VERSION = "openrlhf 0.11.2"

# Each preset: the trainer's defaults for every convention (README "Presets" maps them to
# the trainers' config keys). _preset_rules below adjusts the fields that, in the trainer's
# code, depend on another choice (the KL estimator, the ratio level).
PRESETS: dict[str, Settings] = {
    # DeepSeekMath (Shao et al. 2024): population std, eps 1e-8, seq-mean-token-mean, k3, beta 0.04.
    "deepseekmath": Settings(preset="deepseekmath"),
    # TRL GRPOTrainer (GRPOConfig defaults): sample std, eps 1e-4, loss_type "dapo"
    # (token-mean), beta 0.0, no clamps, use_bias_correction_kl=True.
    "trl": Settings(
        preset="trl",
        trainer="trl",
        mirrors=TRL_VERSION,
        ddof=1,
        eps=1e-4,
        beta=0.0,
        agg="token-mean",
        kl_bias_correction=True,
    ),
    # verl (adv_estimator=grpo, compute_policy_loss_vanilla, use_kl_loss with low_var_kl):
    # sample std, eps 1e-6, a singleton gets mean 0 std 1, token-mean, dual clip 3 (always on),
    # Δ clamp 20, low_var_kl (k3, exponent clamp 20, value clamp 10), kl_loss_coef 0.001.
    "verl": Settings(
        preset="verl",
        trainer="verl",
        mirrors=VERL_VERSION,
        ddof=1,
        eps=1e-6,
        singleton="raw",
        agg="token-mean",
        dual_clip=3.0,
        log_ratio_clamp=20.0,
        kl_clamp=10.0,
        beta=0.001,
    ),
    # OpenRLHF (--advantage_estimator group_norm, PolicyLoss "ppo"), its default KL in the
    # reward: sample std, eps 1e-9, advantages clipped to ±10 (--reward.clip_range), then
    # −β·k1(old_logp, ref_logp) clamped to ±10 per token, summed from each token to the end;
    # init_kl_coef 0.01; token-mean, Δ clamp 20. --kl-mode loss is --algo.kl.use_loss (the
    # KL loss aggregated per token whatever the policy loss).
    "openrlhf": Settings(
        preset="openrlhf",
        trainer="openrlhf",
        mirrors=OPENRLHF_VERSION,
        ddof=1,
        eps=1e-9,
        adv_clip=10.0,
        agg="token-mean",
        kl_agg="token-mean",
        log_ratio_clamp=20.0,
        kl_estimator="k1",
        kl_clamp=10.0,
        kl_mode="reward",
        beta=0.01,
    ),
    # Dr. GRPO as TRL runs it (loss_type="dr_grpo", scale_rewards="none"): no std division,
    # Σ/(N·L) with L = max_completion_length (512 by default), no KL.
    "dr-grpo": Settings(
        preset="dr-grpo",
        trainer="trl",
        mirrors=TRL_VERSION,
        scale="none",
        agg="seq-mean-token-sum-norm",
        max_len=512,
        beta=0.0,
        kl_bias_correction=True,
    ),
    # DAPO as verl's recipe runs it: clip-higher 0.2/0.28, token-mean, no KL, on verl's
    # vanilla loss (sample std, eps 1e-6, singleton mean 0 std 1, dual clip 3, Δ clamp 20).
    "dapo": Settings(
        preset="dapo",
        trainer="verl",
        mirrors=VERL_VERSION,
        ddof=1,
        eps=1e-6,
        singleton="raw",
        clip_eps=0.2,
        clip_eps_high=0.28,
        dual_clip=3.0,
        log_ratio_clamp=20.0,
        agg="token-mean",
        beta=0.0,
    ),
    # GSPO as TRL runs it (importance_sampling_level="sequence"): sequence ratio, clip
    # 3e-4/4e-4, no KL, seq-mean-token-mean (loss_type "grpo"), clip metrics per sequence.
    "gspo": Settings(
        preset="gspo",
        trainer="trl",
        mirrors=TRL_VERSION,
        ddof=1,
        eps=1e-4,
        ratio_level="sequence",
        clip_eps=3e-4,
        clip_eps_high=4e-4,
        clip_unit="sequences",
        beta=0.0,
        kl_bias_correction=True,
    ),
}


def _preset_rules(s: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """Fields of a preset that, in its trainer's code, follow another choice; only fields
    the user did not give are changed.

    - Any preset at token level: clip fractions count tokens, no sequence-ratio clamp.
    - verl (verl 0.9.1 ``kl_penalty_forward``): only ``low_var_kl`` (k3) is clamped; k1
      (``kl``) and k2 (``mse``) are not. Its GSPO loss (``compute_policy_loss_gspo``) has no
      dual clip and clamps the sequence log-ratio from above at 10. With the KL in the
      reward (``use_kl_in_reward``) the estimator is ``algorithm.kl_penalty``, ``kl`` (k1).
    - OpenRLHF (``PolicyLoss``, ``policy_loss_type="gspo"``): per-sample aggregation
      (``token_level_loss=False``); the KL loss stays per token.
    """
    out: dict[str, Any] = {}

    def default(name: str, value: Any) -> None:
        if name not in given:
            out[name] = value

    level = s["ratio_level"]
    if level == "token":
        default("clip_unit", "tokens")
        default("seq_ratio_clamp", None)
    if s["trainer"] == "verl":
        if s["kl_mode"] == "reward":  # algorithm.kl_penalty: "kl" (k1) by default
            default("kl_estimator", "k1")
        if out.get("kl_estimator", s["kl_estimator"]) != "k3":
            default("kl_clamp", None)
        if level == "sequence":
            default("dual_clip", None)
            default("seq_ratio_clamp", 10.0)
    if s["trainer"] == "openrlhf" and level == "sequence":
        default("agg", "seq-mean-token-mean")
    return out


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
    values = {**asdict(base), **given}
    if preset is not None:
        values.update(_preset_rules(values, set(given)))
    return Settings(**values)
