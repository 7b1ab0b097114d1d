"""Presets of trainers' defaults, and the resolution of options, presets and a recorded
run's configuration into one :class:`~grpo_cli.settings.Settings`.

Presets set every field at once; explicit options override a preset field by field
(:func:`resolve_settings`). A loss's, a correction's or a mask's parameter is given by its
trainer's config name and lands in the
record of the row that has it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ..errors import SettingError, UsageError
from ..losses import CORRECTIONS, LOSSES, MASKS
from ..losses.registry import CorrectionRow, Loss, Mask
from ..settings import Settings, qualify_loss
from . import TRAINERS

__all__ = [
    "OFF",
    "PRESETS",
    "RELEASE_PRESETS",
    "TRAINER_NAMES",
    "preset_for",
    "preset_settings",
    "resolve_run_settings",
    "resolve_settings",
]

OFF = object()
"""An override meaning "turn this optional convention off" (e.g. a preset's dual clip)."""

TRAINER_NAMES = tuple(TRAINERS)
_FIELDS = {f.name for f in fields(Settings)}
_RECORDS = ("loss_params", "correction_params", "masks")


def _presets() -> dict[str, Settings]:
    """DeepSeekMath's (the defaults), then every registered trainer's presets, each as the
    trainer's defaults for every convention (README "Presets" maps them to the trainers'
    config keys); :func:`_preset_rules` then adjusts the fields that, in the trainer's
    code, depend on another choice. A trainer's own name is its newest release's preset."""
    # DeepSeekMath (Shao et al. 2024): population std, eps 1e-8, seq-mean-token-mean, k3,
    # beta 0.04.
    out = {"deepseekmath": Settings(preset="deepseekmath")}
    for t in TRAINERS.values():
        for name, values in t.presets.items():
            folds = t.newest.folds
            out[name] = Settings(
                preset=name, trainer=t.name, mirrors=t.version, folds=folds, **values
            )
    return out


def _release_presets() -> dict[str, Settings]:
    """``TRAINER@FIRST`` for every release change point of every trainer (``trl@0.19.0``):
    that release's defaults, ``mirrors`` naming the release its code was checked on."""
    out: dict[str, Settings] = {}
    for t in TRAINERS.values():
        for r in t.releases:
            name = f"{t.name}@{r.first}"
            out[name] = Settings(
                preset=name, trainer=t.name, mirrors=t.mirrors(r), folds=r.folds, **r.preset
            )
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
    t = TRAINERS.get(s["trainer"]) if s["trainer"] is not None else None
    if t is not None:
        t.dependent_for(s["mirrors"])(s, default)
    return out


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
            f"(or TRAINER@VERSION: {', '.join(f'{t}@X.Y' for t in TRAINERS)})"
        )
    trainer = TRAINERS.get(name)
    if trainer is None:
        raise UsageError(
            f"--preset: {preset!r}: {name!r} is not a trainer with releases ({', '.join(TRAINERS)})"
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
    t = TRAINERS.get(trainer)
    if t is None:
        raise UsageError(
            f"trainer {trainer!r} has no presets: grpo-cli knows {', '.join(TRAINERS)}"
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


def _route(
    params: Mapping[str, Any], loss: str, correction: str, *, strict: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """Parameters by their config names into the loss's, the correction's and the masks'
    records. ``strict``: a name none of them has is a :class:`SettingError` (a flag the user
    typed); else it is left out (a trainer's config names every loss's parameters)."""
    lp, mp = LOSSES[loss].params.names(), {}
    cp: tuple[str, ...] = ()
    if correction in CORRECTIONS:
        cp = CORRECTIONS[correction].params.names()
    for m in MASKS.values():
        mp.update(dict.fromkeys(m.params.names(), m.name))
    out_l: dict[str, Any] = {}
    out_c: dict[str, Any] = {}
    out_m: dict[str, dict[str, Any]] = {}
    for k, v in params.items():
        if k in lp:
            out_l[k] = v
        elif k in cp:
            out_c[k] = v
        elif k in mp:
            out_m.setdefault(mp[k], {})[k] = v
        elif strict:
            raise SettingError(k, _not_taken(k, loss, correction))
    return out_l, out_c, out_m


def _not_taken(name: str, loss: str, correction: str) -> str:
    """Why a parameter is refused: whose parameter it is, and what the settings take."""
    rows: list[Loss | CorrectionRow | Mask] = [
        *LOSSES.values(),
        *CORRECTIONS.values(),
        *MASKS.values(),
    ]
    owners = [r.name for r in rows if name in r.params.names()]
    whose = f"a parameter of {', '.join(owners)}" if owners else "no loss's or correction's"
    takes = [f"the loss {loss} takes {', '.join(LOSSES[loss].params.names()) or 'none'}"]
    if correction in CORRECTIONS:
        names = CORRECTIONS[correction].params.names()
        takes.append(f"the correction {correction} {', '.join(names) or 'none'}")
    masks = [n for m in MASKS.values() for n in m.params.names()]
    takes.append(f"the masks {', '.join(masks)}")
    return f"{whose}, not of these settings ({'; '.join(takes)})"


def resolve_settings(preset: str | None = None, **overrides: Any) -> Settings:
    """Settings of ``preset`` (default: deepseekmath; ``TRAINER@VERSION`` a release's,
    :func:`preset_settings`) with every non-None override applied: a field of
    :class:`~grpo_cli.settings.Settings`, or a parameter of the loss, the correction or a
    mask under its config name (a parameter neither has is an error). A release preset's
    warning (a version newer than any known) is issued as a :class:`UserWarning`; callers
    that collect warnings use :func:`preset_settings` first."""
    return _resolve(preset, overrides, strict=True)


def _resolve(preset: str | None, overrides: Mapping[str, Any], *, strict: bool) -> Settings:
    if preset is None:
        base = Settings()
    else:
        base, warning = preset_settings(preset)
        if warning is not None:
            warnings.warn(warning, UserWarning, stacklevel=3)
    given: dict[str, Any] = {
        k: (None if v is OFF else v) for k, v in overrides.items() if v is not None
    }
    params = {k: v for k, v in given.items() if k not in _FIELDS}
    given = {k: v for k, v in given.items() if k in _FIELDS}
    if strict:
        known = {*_FIELDS} | {n for r in LOSSES.values() for n in r.params.names()}
        known |= {n for r in CORRECTIONS.values() for n in r.params.names()}
        known |= {n for r in MASKS.values() for n in r.params.names()}
        unknown = set(params) - known
        if unknown:
            raise UsageError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    values = {**base.values(), **given}
    if preset is not None:
        values.update(_preset_rules(values, set(given)))
    values.update(_loss_rules(values, set(given)))
    _check_trainer(values)
    loss, correction = values["loss"], values["correction"]
    lp, cp, mp = _route(params, loss, correction, strict=strict)
    if lp or "loss_params" not in given:
        base_lp = values["loss_params"]
        keep = base_lp.to_json() if type(base_lp) is LOSSES[loss].params else {}
        values["loss_params"] = {**keep, **dict(given.get("loss_params", {})), **lp}
    if cp or "correction_params" not in given:
        base_cp = values["correction_params"]
        row = CORRECTIONS.get(correction)
        keep = base_cp.to_json() if row is not None and type(base_cp) is row.params else {}
        values["correction_params"] = {**keep, **dict(given.get("correction_params", {})), **cp}
    if mp:
        masks = {n: p.to_json() for n, p in base.masks} | dict(given.get("masks", {}))
        for name, ps in mp.items():
            masks[name] = {**dict(masks.get(name, {})), **ps}
        values["masks"] = masks
    return Settings(**values)


def _check_trainer(values: Mapping[str, Any]) -> None:
    """The settings' trainer is registered, and puts the KL into the reward when asked."""
    trainer = values["trainer"]
    if trainer is not None and trainer not in TRAINERS:
        raise SettingError("trainer", f"{trainer!r} is not one of {', '.join(TRAINERS)}")
    if values["kl_mode"] == "reward":
        named = TRAINERS.get(trainer) if trainer is not None else None
        if named is None or named.reward_kl is None:
            able = [t.name for t in TRAINERS.values() if t.reward_kl is not None]
            raise SettingError(
                "kl_mode",
                f"reward needs trainer {' or '.join(able)}: they put the KL into the reward "
                "in different ways (name one with --trainer or a preset)",
            )


def _loss_rules(s: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """A loss that forces its aggregation sets ``agg`` unless it was given (then
    :class:`Settings` checks it); verl aggregates its KL loss by ``loss_agg_mode`` still,
    so the aggregation the settings had before stays the KL's (``kl_agg``)."""
    loss = qualify_loss(s["loss"], s["trainer"])
    forced = LOSSES[loss].agg
    if forced is None or "agg" in given or s["agg"] == forced:
        return {"loss": loss}
    out: dict[str, Any] = {"loss": loss, "agg": forced}
    t = TRAINERS.get(LOSSES[loss].trainer or "")
    if t is not None and t.kl_agg_follows_config and s["kl_agg"] is None and "kl_agg" not in given:
        out["kl_agg"] = s["agg"]
    return out


def resolve_run_settings(
    trainer: str | None,
    version: str | None,
    config: dict[str, Any],
    *,
    origin: str = "meta.json",
    **overrides: Any,
) -> tuple[Settings, list[str]]:
    """The settings of a recorded run: its trainer's preset, then what the trainer's config
    (``meta.json``) sets (:attr:`grpo_cli.trainers.Trainer.from_config`), then every
    non-None override (flags); and notes on what the config asks that is not computed.
    A config names every loss's parameters: those of the loss, correction and masks it
    chooses are taken. ``origin`` names the config's file (a trainer's own layout has its
    own).

    Raises:
        UsageError: the run's trainer is not one grpo-cli knows.
    """
    if not isinstance(trainer, str) or trainer not in TRAINERS:
        known = ", ".join(TRAINERS)
        raise UsageError(
            f"meta.json: trainer {trainer!r} is not one grpo-cli reproduces ({known}); "
            "name the conventions with --preset and flags"
        )
    t = TRAINERS[trainer]
    preset, warning = preset_for(t.name, version)  # the recorded release's own preset
    read, notes = t.from_config(config)
    values = {k: (OFF if v is None else v) for k, v in read.items()}  # None in a config: off
    if warning is not None:
        notes.insert(0, f"meta.json: {warning}; the run's config sets the conventions it names")
    given = {k: v for k, v in overrides.items() if v is not None}
    typed = {k for k in given if k not in _FIELDS}  # parameters the user typed: strict
    with warnings.catch_warnings():  # preset_for said it already
        warnings.simplefilter("ignore", UserWarning)
        settings = _resolve(preset, {**values, **given, "origin": origin}, strict=False)
    if typed:  # a typed parameter the run's loss, correction and masks do not take
        _route({k: given[k] for k in typed}, settings.loss, settings.correction, strict=True)
    return settings, notes
