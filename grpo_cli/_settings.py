"""Every convention of the computation in one record, and presets of trainers' defaults.

A :class:`Settings` is echoed in every JSON report (``settings``), so a logged number can
always be traced to its definition. Presets set every field at once; explicit options
override a preset field by field (:func:`resolve_settings`).
"""

from __future__ import annotations

import math
import warnings
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
from ._losses import (
    FORCED_AGGREGATION,
    TOKEN_RATIO_LOSSES,
    BypassLoss,
    CorrectionName,
    LossName,
    OrlGating,
    OrlLevel,
    OrlMode,
    TrlISMode,
    VerlISLevel,
    _is_threshold,
    rejection_options,
)
from .errors import UsageError
from .trainers import TRAINERS as _TRAINERS

__all__ = [
    "CORRECTIONS",
    "CORRECTION_PARAMS",
    "LOSSES",
    "LOSS_PARAMS",
    "OFF",
    "PRESETS",
    "RELEASE_PRESETS",
    "TRAINERS",
    "SettingError",
    "Settings",
    "preset_for",
    "preset_settings",
    "qualify_loss",
    "resolve_run_settings",
    "resolve_settings",
]


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

    Loss (:mod:`grpo_cli._losses`): ``loss`` "clip" (the clipped surrogate above) or a
    trainer's own, ``trainer/value`` as its config names it (``trl/cispo``, ``verl/dppo_tv``;
    a bare ``cispo`` takes the settings' trainer), with its parameters under the trainer's
    config names: TRL ``sapo_temperature_pos``/``_neg``, ``vespo_k_pos``,
    ``vespo_lambda_pos``, ``vespo_k_neg``, ``vespo_lambda_neg``; verl ``clip_cov_ratio``,
    ``clip_cov_lb``, ``clip_cov_ub``, ``kl_cov_ratio``, ``ppo_kl_coef``, ``dro_beta``;
    ``verl/bypass_mode`` (the sampler's log-probs as the old policy) ``bypass_loss_type``
    (``rollout_correction.loss_type``) and the correction's ``rollout_*`` fields below;
    ``entropy_mask`` (TRL's ``top_entropy_quantile`` < 1, any loss: the policy term times
    the recorded ``entropy_mask`` field, the KL term and the aggregation's counts not). The
    clip bounds of cispo, dppo, clip_cov and geo_mean are ``clip_eps``/``clip_eps_high``
    (TRL's cispo caps ρ at ``clip_eps_high`` itself, verl's at ``1 + clip_eps_high``), dppo's
    ratio cap is ``dual_clip`` (verl's ``clip_ratio_c``; 3.0 when off).
    Correction (applied where ``rollout_logp`` is given): ``correction`` none|trl-vllm|
    verl-rollout|openrlhf-is; TRL ``vllm_is_mode``, ``vllm_is_clip_max``, ``vllm_is_clip_min``
    (``vllm_importance_sampling_mode``/``_clip_max``/``_clip_min``); verl ``rollout_is``,
    ``rollout_is_threshold``, ``rollout_is_batch_normalize``, ``rollout_rs``,
    ``rollout_rs_threshold`` (rejection sampling: the rejected tokens leave the loss, as
    verl's modified ``response_mask``); OpenRLHF
    ``is_correction_level``, ``_mode``, ``_gating``, ``_low``, ``_high`` (its threshold).
    """

    preset: str | None = None
    trainer: str | None = None  # a registered trainer (grpo_cli.trainers)
    mirrors: str | None = None
    # where the settings came from besides flags: "meta.json" for a recorded run's config
    origin: str | None = None
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
    # the policy loss and its parameters (defaults: the trainers' config defaults)
    loss: LossName = "clip"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: float | None = None
    # verl's bypass mode (loss verl/bypass_mode): rollout_correction.loss_type
    bypass_loss_type: BypassLoss = "ppo_clip"
    # TRL's top_entropy_quantile < 1: the policy term only where the entropy_mask field is 1
    entropy_mask: bool = False
    # the sampler–trainer correction and its parameters
    correction: CorrectionName = "none"
    vllm_is_mode: TrlISMode = "sequence_mask"
    vllm_is_clip_max: float | None = 3.0
    vllm_is_clip_min: float | None = None
    rollout_is: VerlISLevel | None = "sequence"
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None
    is_correction_level: OrlLevel = "token"
    is_correction_mode: OrlMode = "mask"
    is_correction_gating: OrlGating = "ratio"
    is_correction_low: float = 0.5
    is_correction_high: float = 5.0

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
        out = asdict(self)
        out["from"] = out.pop("origin")
        return out

    @property
    def loss_family(self) -> str | None:
        """The trainer whose loss ``loss`` is (``"trl"`` for ``trl/cispo``), None for clip."""
        return None if self.loss == "clip" else self.loss.split("/", 1)[0]

    def __post_init__(self) -> None:
        # a bare loss name ("cispo") is the settings' trainer's
        object.__setattr__(self, "loss", qualify_loss(self.loss, self.trainer))
        self._check_fields()
        self._check_combination()
        self._check_loss()

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
            "correction": CORRECTIONS,
            "vllm_is_mode": get_args(TrlISMode),
            "rollout_is": (None, *get_args(VerlISLevel)),
            "bypass_loss_type": get_args(BypassLoss),
            "is_correction_level": get_args(OrlLevel),
            "is_correction_mode": get_args(OrlMode),
            "is_correction_gating": get_args(OrlGating),
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

    def _check_loss(self) -> None:
        """The loss's and the correction's parameters, and what they need of the rest."""
        positive = {
            "sapo_temperature_pos": self.sapo_temperature_pos,
            "sapo_temperature_neg": self.sapo_temperature_neg,
            "vespo_k_pos": self.vespo_k_pos,
            "vespo_k_neg": self.vespo_k_neg,
            "vespo_lambda_pos": self.vespo_lambda_pos,
            "vespo_lambda_neg": self.vespo_lambda_neg,
            "clip_cov_ratio": self.clip_cov_ratio,
            "kl_cov_ratio": self.kl_cov_ratio,
            "is_correction_high": self.is_correction_high,
        }
        for name in ("dro_beta", "vllm_is_clip_max", "vllm_is_clip_min"):
            if getattr(self, name) is not None:
                positive[name] = getattr(self, name)
        for name, v in positive.items():
            if not _finite(v) or v <= 0:
                raise SettingError(name, f"must be a finite number > 0, got {v}")
        for name in ("ppo_kl_coef", "is_correction_low", "clip_cov_lb", "clip_cov_ub"):
            v = getattr(self, name)
            if not _finite(v) or (v < 0 and name != "clip_cov_lb"):
                raise SettingError(name, f"must be a finite number >= 0, got {v}")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise SettingError(
                "clip_cov_lb",
                f"must be below clip_cov_ub ({self.clip_cov_ub}), got {self.clip_cov_lb}",
            )
        family = self.loss_family
        if family is not None and self.trainer is not None and family != self.trainer:
            raise SettingError(
                "loss", f"{self.loss} is {family}'s loss, the settings' trainer is {self.trainer}"
            )
        forced = FORCED_AGGREGATION.get(self.loss)
        if forced is not None and self.agg != forced:
            raise SettingError(
                "agg", f"{self.loss} aggregates as {forced} whatever the config, got {self.agg}"
            )
        if self.loss in TOKEN_RATIO_LOSSES and self.ratio_level != "token":
            raise SettingError("ratio_level", f"sequence is not one {self.loss} takes (token only)")
        if self.loss == "verl/dro" and self.dro_beta is None:
            raise SettingError("dro_beta", "verl/dro needs it (policy_loss.dro_beta > 0)")
        self._check_correction()

    def _check_correction(self) -> None:
        c = self.correction
        owner = {"trl-vllm": "trl", "verl-rollout": "verl", "openrlhf-is": "openrlhf"}.get(c)
        if owner is not None and self.trainer is not None and owner != self.trainer:
            raise SettingError(
                "correction", f"{c} is {owner}'s, the settings' trainer is {self.trainer}"
            )
        if c == "openrlhf-is" and self.ratio_level == "sequence":
            raise SettingError(
                "correction",
                "openrlhf-is with a sequence ratio (gspo) takes the ratio against the "
                "sampler's log-probs instead: give rollout_logp as old_logp",
            )
        if c == "trl-vllm" and self.loss == "trl/vespo" and self.vllm_is_mode.startswith("seq"):
            raise SettingError(
                "vllm_is_mode",
                "trl/vespo takes TRL's token-level ratio only (token_truncate, token_mask)",
            )
        lo, hi = self.vllm_is_clip_min, self.vllm_is_clip_max
        if lo is not None and hi is not None and lo >= hi:
            raise SettingError(
                "vllm_is_clip_min", f"must be below vllm_is_clip_max ({hi}), got {lo}"
            )
        if self.vllm_is_mode.endswith("truncate") and lo is None and hi is None:
            raise SettingError(
                "vllm_is_mode", f"{self.vllm_is_mode} needs vllm_is_clip_max or _min"
            )
        try:
            _is_threshold(self.rollout_is_threshold)
        except UsageError as exc:
            raise SettingError("rollout_is_threshold", str(exc).split(": ", 1)[-1]) from None
        if self.entropy_mask and self.trainer not in (None, "trl"):
            raise SettingError(
                "entropy_mask", f"is TRL's (top_entropy_quantile), the settings' trainer is "
                f"{self.trainer}"
            )  # fmt: skip
        bypass = self.loss == "verl/bypass_mode"
        if bypass and c != "none":
            raise SettingError(
                "correction",
                f"{c}: verl/bypass_mode computes its own correction (rollout_is, rollout_rs, "
                "their thresholds): correction none",
            )
        if self.rollout_rs is not None:
            if c != "verl-rollout" and not bypass:
                raise SettingError(
                    "rollout_rs",
                    "is verl's rollout correction's: needs correction verl-rollout or loss "
                    "verl/bypass_mode",
                )
            try:
                rejection_options(self.rollout_rs, self.rollout_rs_threshold)
            except UsageError as exc:
                name, _, why = str(exc).partition(": ")
                raise SettingError(name, why) from None
        elif self.rollout_rs_threshold is not None:
            raise SettingError("rollout_rs_threshold", "needs rollout_rs (the options it bounds)")
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


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


LOSSES: tuple[str, ...] = get_args(LossName)
CORRECTIONS: tuple[str, ...] = get_args(CorrectionName)
# the Settings fields that are a loss's or a correction's parameters (--loss-param,
# --correction-param)
LOSS_PARAMS = (
    "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos",
    "vespo_k_neg", "vespo_lambda_neg", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
    "kl_cov_ratio", "ppo_kl_coef", "dro_beta", "bypass_loss_type", "entropy_mask", "rollout_is",
    "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs", "rollout_rs_threshold",
)  # fmt: skip
CORRECTION_PARAMS = (
    "vllm_is_mode", "vllm_is_clip_max", "vllm_is_clip_min", "rollout_is",
    "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs", "rollout_rs_threshold",
    "is_correction_level", "is_correction_mode", "is_correction_gating", "is_correction_low",
    "is_correction_high",
)  # fmt: skip


def qualify_loss(loss: str, trainer: str | None) -> str:
    """``loss`` as a value of :data:`LOSSES`: itself, or a bare trainer value (``cispo``)
    qualified by the one trainer that has it, else by ``trainer`` (TRL's and verl's cispo
    and sapo differ).

    Raises:
        SettingError: an unknown loss, or a bare name two trainers have and no trainer.

    Example:
        >>> qualify_loss("cispo", "verl"), qualify_loss("dppo_tv", None)
        ('verl/cispo', 'verl/dppo_tv')
    """
    if loss in LOSSES:
        return loss
    owners = [k for k in LOSSES if k.split("/", 1)[-1] == loss]
    if trainer is not None:
        mine = [k for k in owners if k.startswith(f"{trainer}/")]
        if mine:
            return mine[0]
    if len(owners) == 1:
        return owners[0]
    if owners:
        raise SettingError(
            "loss", f"{loss!r} is {' or '.join(owners)}: name one, or the trainer (--trainer)"
        )
    raise SettingError("loss", f"{loss!r} is not one of {', '.join(LOSSES)}")


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
    code, depend on another choice. A trainer's own name is its newest release's preset."""
    # DeepSeekMath (Shao et al. 2024): population std, eps 1e-8, seq-mean-token-mean, k3,
    # beta 0.04.
    out = {"deepseekmath": Settings(preset="deepseekmath")}
    for t in _TRAINERS.values():
        for name, values in t.presets.items():
            out[name] = Settings(preset=name, trainer=t.name, mirrors=t.version, **values)
    return out


def _release_presets() -> dict[str, Settings]:
    """``TRAINER@FIRST`` for every release change point of every trainer (``trl@0.19.0``):
    that release's defaults, ``mirrors`` naming the release its code was checked on."""
    out: dict[str, Settings] = {}
    for t in _TRAINERS.values():
        for r in t.releases:
            name = f"{t.name}@{r.first}"
            out[name] = Settings(preset=name, trainer=t.name, mirrors=t.mirrors(r), **r.preset)
    return out


def _preset_rules(s: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """Fields of a preset that, in its trainer's code, follow another choice; only fields
    the user did not give are changed.

    - Any preset at token level: clip fractions count tokens, no sequence-ratio clamp.
    - The trainer's own rules (:attr:`grpo_cli.trainers.Trainer.dependent`), or the
      release's the preset mirrors.
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
        t.dependent_for(s["mirrors"])(s, default)
    return out


_FIELDS = {f.name for f in fields(Settings)}
PRESETS: dict[str, Settings] = _presets()
RELEASE_PRESETS: dict[str, Settings] = _release_presets()


def preset_settings(preset: str) -> tuple[Settings, str | None]:
    """The Settings of ``preset`` and a warning (or None): a name of :data:`PRESETS`, or
    ``TRAINER@VERSION`` (``trl@0.19``, ``verl@0.6.1``): the release preset of the newest
    change point at or before that version; a version newer than the newest known takes
    the newest, older than the oldest the oldest, with a warning naming the preset used.

    Raises:
        UsageError: an unknown preset or trainer, or a version that is no release number.
    """
    if preset in PRESETS:
        return PRESETS[preset], None
    if preset in RELEASE_PRESETS:
        return RELEASE_PRESETS[preset], None
    name, at, version = preset.partition("@")
    if not at:
        raise UsageError(
            f"--preset: {preset!r} is not one of {', '.join(PRESETS)} "
            f"(or TRAINER@VERSION: {', '.join(f'{t}@X.Y' for t in _TRAINERS)})"
        )
    trainer = _TRAINERS.get(name)
    if trainer is None:
        raise UsageError(
            f"--preset: {preset!r}: {name!r} is not a trainer with releases "
            f"({', '.join(_TRAINERS)})"
        )
    try:
        release, warning = trainer.release_for(version)
    except ValueError as exc:
        raise UsageError(f"--preset: {preset!r}: {exc}") from None
    return RELEASE_PRESETS[f"{name}@{release.first}"], warning


def preset_for(trainer: str, version: str | None) -> tuple[str, str | None]:
    """The preset that reproduces a recorded run of ``trainer`` at ``version`` (its
    ``meta.json``'s ``trainer`` and ``trainer_version``), and a warning or None.

    The release preset of the newest change point at or before ``version``
    (``("trl@0.19.0", None)`` for 0.20.0); an unknown or missing version the trainer's
    own preset (its newest release), a version newer than the newest known or older than
    the oldest the nearest, each with a warning naming the preset used.

    Raises:
        UsageError: ``trainer`` is not a registered trainer.

    Example:
        >>> preset_for("trl", "0.20.0")
        ('trl@0.19.0', None)
    """
    t = _TRAINERS.get(trainer)
    if t is None:
        raise UsageError(
            f"trainer {trainer!r} has no presets: grpo-cli knows {', '.join(_TRAINERS)}"
        )
    if version is None or not str(version).strip():
        return t.name, (
            f"{trainer}: the run does not name its version: using the {t.name} preset "
            f"(mirrors {t.version})"
        )
    try:
        release, warning = t.release_for(str(version))
    except ValueError:
        return t.name, (
            f"{trainer} {version!r} is no release number: using the {t.name} preset "
            f"(mirrors {t.version})"
        )
    return f"{t.name}@{release.first}", warning


def resolve_settings(preset: str | None = None, **overrides: Any) -> Settings:
    """Settings of ``preset`` (default: deepseekmath; ``TRAINER@VERSION`` a release's,
    :func:`preset_settings`) with every non-None override applied. A release preset's
    warning (a version newer than any known) is issued as a :class:`UserWarning`; callers
    that collect warnings use :func:`preset_settings` first."""
    if preset is None:
        base = Settings()
    else:
        base, warning = preset_settings(preset)
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=2)
    unknown = set(overrides) - _FIELDS
    if unknown:
        raise UsageError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    given: dict[str, Any] = {
        k: (None if v is OFF else v) for k, v in overrides.items() if v is not None
    }
    values = {**asdict(base), **given}
    if preset is not None:
        values.update(_preset_rules(values, set(given)))
    values.update(_loss_rules(values, set(given)))
    return Settings(**values)


def _loss_rules(s: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """A loss that forces its aggregation sets ``agg`` unless it was given (then
    :class:`Settings` checks it); verl aggregates its KL loss by ``loss_agg_mode`` still,
    so the aggregation the settings had before stays the KL's (``kl_agg``)."""
    loss = qualify_loss(s["loss"], s["trainer"])
    forced = FORCED_AGGREGATION.get(loss)
    if forced is None or "agg" in given or s["agg"] == forced:
        return {"loss": loss}
    out: dict[str, Any] = {"loss": loss, "agg": forced}
    if loss.startswith("verl/") and s["kl_agg"] is None and "kl_agg" not in given:
        out["kl_agg"] = s["agg"]
    return out


def resolve_run_settings(
    trainer: str | None,
    version: str | None,
    config: dict[str, Any],
    **overrides: Any,
) -> tuple[Settings, list[str]]:
    """The settings of a recorded run: its trainer's preset, then what the trainer's config
    (``meta.json``) sets (:attr:`grpo_cli.trainers.Trainer.from_config`), then every
    non-None override (flags); and notes on what the config asks that is not computed.

    Raises:
        UsageError: the run's trainer is not one grpo-cli knows.
    """
    if trainer not in _TRAINERS:
        known = ", ".join(_TRAINERS)
        raise UsageError(
            f"meta.json: trainer {trainer!r} is not one grpo-cli reproduces ({known}); "
            "name the conventions with --preset and flags"
        )
    t = _TRAINERS[trainer]
    preset, warning = preset_for(t.name, version)  # the recorded release's own preset
    read, notes = t.from_config(config)
    values = {k: (OFF if v is None else v) for k, v in read.items()}  # None in a config: off
    if warning is not None:
        notes.insert(0, f"meta.json: {warning}; the run's config sets the conventions it names")
    given = {k: v for k, v in overrides.items() if v is not None}
    with warnings.catch_warnings():  # preset_for said it already
        warnings.simplefilter("ignore", UserWarning)
        settings = resolve_settings(preset, **{**values, **given, "origin": "meta.json"})
    return settings, notes
