"""Every convention of the computation in one record.

A :class:`Settings` is echoed in every JSON report (``settings``), so a logged number can
always be traced to its definition. The policy loss, the sampler–trainer correction and
the policy-term masks are rows of the loss registry (:mod:`grpo_cli.losses`): the settings
name them and hold each one's parameter record, which the row checks. Presets and a
recorded run's configuration resolve to a Settings in :mod:`grpo_cli.trainers.presets`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

from .core import (
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
from .errors import SettingError
from .losses import CORRECTIONS, LOSSES, MASKS, NONE
from .losses.registry import CorrectionRow, Loss, Mask, NoParams, Params

__all__ = [
    "CORRECTION_NAMES",
    "LOSS_NAMES",
    "NORM_SCALES",
    "SettingError",
    "Settings",
    "correction_row",
    "loss_row",
    "param_specs",
    "qualify_loss",
]


KLMode = Literal["loss", "reward"]
NORM_SCALES: tuple[NormScale, ...] = get_args(NormScale)
_OLD_NORM_SCALES = ("trl", "verl")
LOSS_NAMES: tuple[str, ...] = tuple(LOSSES)
CORRECTION_NAMES: tuple[str, ...] = (NONE, *CORRECTIONS)


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

    Loss: ``loss`` "clip" (the clipped surrogate above) or a trainer's own, a name of the
    loss registry (``trainer/config value``; a bare config value takes the settings'
    trainer), with ``loss_params`` its parameter record (a mapping of parameter names is
    made into it; missing ones take the trainer's defaults). A trainer's loss reads its
    clip bounds from ``clip_eps``/``clip_eps_high`` and a ratio cap from ``dual_clip`` as
    its row says. Correction (applied where ``rollout_logp`` is given): ``correction``
    none or a registered one, with ``correction_params``. Masks: ``masks``, the
    policy-term masks applied with their records; a mask whose record turns it off is left
    out. ``grpo-cli losses`` lists every row and its parameters.
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
    # the policy loss, the correction and the masks: registry rows and their records
    loss: str = "clip"
    loss_params: Params = field(default_factory=NoParams)
    correction: str = NONE
    correction_params: Params = field(default_factory=NoParams)
    masks: tuple[tuple[str, Params], ...] = ()
    # the optional parts of the fold the mirrored release's metrics read (set by its preset;
    # not a convention, so not in the JSON)
    folds: tuple[str, ...] = ()

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def kl_aggregation(self) -> Aggregation:
        """The aggregation of the KL term (``kl_agg``, else ``agg``)."""
        return self.agg if self.kl_agg is None else self.kl_agg

    @property
    def loss_row(self) -> Loss:
        return LOSSES[self.loss]

    @property
    def correction_row(self) -> CorrectionRow | None:
        return CORRECTIONS.get(self.correction)

    @property
    def mask_rows(self) -> tuple[tuple[Mask, Params], ...]:
        return tuple((MASKS[name], p) for name, p in self.masks)

    def mask(self, name: str) -> Params | None:
        """The record of the mask ``name`` when it is applied, else None."""
        return next((p for n, p in self.masks if n == name), None)

    @property
    def numpy_only(self) -> bool:
        """Whether the loss, a correction or a mask is the trainer's own (folded in
        numpy: the compiled kernel computes the clipped surrogate only)."""
        return self.loss_row.terms is not None or self.correction != NONE or bool(self.masks)

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
        """The record as JSON: every convention, each row's parameters under it
        (``loss_params``, ``correction_params``, ``masks``), ``from`` last."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("origin", "loss_params", "correction_params", "masks", "folds"):
                continue
            out[f.name] = getattr(self, f.name)
            if f.name == "loss":
                out["loss_params"] = self.loss_params.to_json()
            elif f.name == "correction":
                out["correction_params"] = self.correction_params.to_json()
        out["masks"] = {name: p.to_json() for name, p in self.masks}
        out["from"] = self.origin
        return out

    def values(self) -> dict[str, Any]:
        """Every field by name, the records as records (``dataclasses.asdict`` would turn
        them into dicts): what ``Settings(**values)`` makes again."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def loss_family(self) -> str | None:
        """The trainer whose loss ``loss`` is (its name's prefix), None for clip."""
        return self.loss_row.trainer

    def __post_init__(self) -> None:
        # a bare loss name (a trainer's config value) is the settings' trainer's
        object.__setattr__(self, "loss", qualify_loss(self.loss, self.trainer))
        row = LOSSES[self.loss]
        object.__setattr__(self, "loss_params", _record(row.params, self.loss_params, row.name))
        c = self.correction
        if c != NONE and c not in CORRECTIONS:
            raise SettingError("correction", f"{c!r} is not one of {', '.join(CORRECTION_NAMES)}")
        crow = CORRECTIONS.get(c)
        cls = NoParams if crow is None else crow.params
        object.__setattr__(
            self, "correction_params", _record(cls, self.correction_params, c, "correction")
        )
        object.__setattr__(self, "masks", _masks(self.masks))
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
        if self.trainer is not None and not isinstance(self.trainer, str):
            raise SettingError("trainer", f"expected a trainer's name, got {self.trainer!r}")
        if self.ddof not in (0, 1):
            raise SettingError("ddof", f"must be 0 or 1, got {self.ddof}")
        nonneg = {"eps": self.eps, "clip_eps": self.clip_eps, "beta": self.beta}
        if self.clip_eps_high is not None:
            nonneg["clip_eps_high"] = self.clip_eps_high
        for name, v in nonneg.items():
            if not (_finite(v) and v >= 0):
                raise SettingError(name, f"must be a finite number >= 0, got {v}")
        positive = {
            "adv_clip": self.adv_clip,
            "dual_clip": self.dual_clip,
            "log_ratio_clamp": self.log_ratio_clamp,
            "seq_ratio_clamp": self.seq_ratio_clamp,
            "kl_clamp": self.kl_clamp,
        }
        for name, p in positive.items():
            if p is not None and not (_finite(p) and p > 0):
                raise SettingError(name, f"must be a finite number > 0, got {p}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise SettingError("dual_clip", f"must be > 1, got {self.dual_clip}")
        if self.max_len is not None and not (
            isinstance(self.max_len, int)
            and not isinstance(self.max_len, bool)
            and self.max_len >= 1
        ):
            raise SettingError("max_len", f"must be an integer >= 1, got {self.max_len}")

    def _check_combination(self) -> None:
        """Fields that only make sense together."""
        if self.kl_mode == "reward" and self.trainer is None:
            raise SettingError(
                "kl_mode",
                "reward needs a trainer: trainers put the KL into the reward in different "
                "ways (name one with --trainer or a preset)",
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
        """What the loss, the correction and the masks need of the rest, by their rows."""
        row = self.loss_row
        family = row.trainer
        if family is not None and self.trainer is not None and family != self.trainer:
            raise SettingError(
                "loss", f"{self.loss} is {family}'s loss, the settings' trainer is {self.trainer}"
            )
        if row.agg is not None and self.agg != row.agg:
            raise SettingError(
                "agg", f"{self.loss} aggregates as {row.agg} whatever the config, got {self.agg}"
            )
        if row.token_ratio and self.ratio_level != "token":
            raise SettingError("ratio_level", f"sequence is not one {self.loss} takes (token only)")
        crow = self.correction_row
        if crow is not None:
            if self.trainer is not None and crow.trainer != self.trainer:
                raise SettingError(
                    "correction",
                    f"{crow.name} is {crow.trainer}'s, the settings' trainer is {self.trainer}",
                )
            if row.correction == "own":
                raise SettingError(
                    "correction",
                    f"{crow.name}: {self.loss} computes its own correction (its parameters: "
                    f"{', '.join(row.params.names())}): correction none",
                )
            problem = crow.excludes(self.correction_params, self.ratio_level, self.loss)
            if problem is not None:
                raise SettingError(*problem)
        for mask, _ in self.mask_rows:
            if self.trainer is not None and mask.trainer != self.trainer:
                name = next(iter(mask.params.names()))
                raise SettingError(
                    name,
                    f"is {mask.trainer}'s ({mask.name}), the settings' trainer is {self.trainer}",
                )


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _record(cls: type[Params], given: object, owner: str, what: str = "loss") -> Params:
    """``given`` as the record ``cls`` of ``owner``: the record itself, or a mapping of its
    parameter names (the others take their defaults); a name it does not have is a
    :class:`SettingError` naming it and the parameters ``owner`` has."""
    if isinstance(given, cls) and type(given) is cls:
        return given
    if isinstance(given, Params) and not given.names():
        given = {}  # no parameters given (a NoParams left from another loss)
    if isinstance(given, Params):
        given = given.to_json()
    if not isinstance(given, Mapping):
        raise SettingError(f"{what}_params", f"expected a mapping of parameters, got {given!r}")
    unknown = [k for k in given if k not in cls.names()]
    if unknown:
        have = ", ".join(cls.names()) or "none"
        raise SettingError(unknown[0], f"is not a parameter of {owner} (its parameters: {have})")
    return cls(**given)


def _masks(given: object) -> tuple[tuple[str, Params], ...]:
    """The applied masks as ``(name, record)`` in the registry's order: a mapping or pairs
    of names and records (or mappings of their parameters); one a record turns off is left
    out."""
    items = given.items() if isinstance(given, Mapping) else given
    out: dict[str, Params] = {}
    for name, p in items:  # type: ignore[attr-defined]
        row = MASKS.get(name)
        if row is None:
            raise SettingError("masks", f"{name!r} is not one of {', '.join(MASKS)}")
        record = _record(row.params, p, name, "mask")
        if row.on(record):
            out[name] = record
    return tuple((n, out[n]) for n in MASKS if n in out)


def qualify_loss(loss: str, trainer: str | None) -> str:
    """``loss`` as a name of the loss registry: itself, or a bare config value qualified by
    the one trainer that has it, else by ``trainer`` (two trainers' losses of one value
    differ).

    Raises:
        SettingError: an unknown loss, or a bare name two trainers have and no trainer.

    Example:
        >>> two = [n for n in LOSSES if n.startswith("verl/") and f"trl/{n[5:]}" in LOSSES]
        >>> qualify_loss(two[0][5:], "verl") == two[0], qualify_loss("clip", None)
        (True, 'clip')
    """
    if not isinstance(loss, str):
        raise SettingError("loss", f"expected a loss's name, got {loss!r}")
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


def loss_row(name: str, trainer: str | None = None) -> Loss:
    """The registry row of the loss ``name`` (qualified by ``trainer`` when bare)."""
    return LOSSES[qualify_loss(name, trainer)]


def correction_row(name: str) -> CorrectionRow | None:
    """The registry row of the correction ``name`` (None for none)."""
    if name != NONE and name not in CORRECTIONS:
        raise SettingError("correction", f"{name!r} is not one of {', '.join(CORRECTION_NAMES)}")
    return CORRECTIONS.get(name)


def param_specs(kind: Literal["loss", "correction"]) -> dict[str, tuple[str, ...]]:
    """Every parameter name a ``--loss-param`` (the losses' and the masks') or a
    ``--correction-param`` takes, with the rows that have it."""
    out: dict[str, list[str]] = {}
    rows: list[tuple[str, type[Params]]]
    if kind == "loss":
        rows = [(r.name, r.params) for r in LOSSES.values()]
        rows += [(m.name, m.params) for m in MASKS.values()]
    else:
        rows = [(r.name, r.params) for r in CORRECTIONS.values()]
    for owner, cls in rows:
        for n in cls.names():
            out.setdefault(n, []).append(owner)
    return {k: tuple(v) for k, v in out.items()}
