"""The command line's options: each defined once, the conventions as one group that every
command whose numbers depend on them takes (:func:`conventions`), and the engine's options
from flags and the environment (the only place the environment is read)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, overload

import typer

from ..errors import SettingError, UsageError
from ..io.fields import FIELDS
from ..losses import CORRECTIONS, LOSSES, MASKS
from ..losses.registry import Spec
from ..settings import CORRECTION_NAMES, LOSS_NAMES, Settings, param_specs
from ..trainers.presets import (
    OFF,
    PRESETS,
    TRAINER_NAMES,
    preset_settings,
    resolve_run_settings,
    resolve_settings,
)

if TYPE_CHECKING:
    from ..io import Source
    from ..io.run import RecordedRun

__all__ = [
    "ADVANTAGE_CONVENTIONS",
    "CONVENTIONS",
    "Conventions",
    "conventions",
    "plain_coercion",
]


def _optional(name: str, text: str | None) -> object:
    """``--dual-clip 3`` → 3.0; ``--dual-clip off`` → OFF; absent → None (keep preset's)."""
    if text is None:
        return None
    if text.strip().lower() in ("off", "none", "no"):
        return OFF
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--{name}: expected a number or 'off', got {text!r}") from None
    if not math.isfinite(value):
        raise UsageError(f"--{name}: expected a finite number, got {text!r}")
    return value


def _choices(values: tuple[str, ...] | list[str]) -> str:
    """A metavar listing the choices: ``[a|b|c]`` (click's way)."""
    return "[" + "|".join(values) + "]"


AGGREGATIONS = (
    "seq-mean-token-mean",
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-sum",
)


def _trainer_presets() -> str:
    named = [name for name, p in PRESETS.items() if p.trainer is not None]
    return ", ".join(named[:-1]) + " and " + named[-1]


Files = Annotated[
    list[str],
    typer.Argument(
        metavar="FILES...",
        help="Input: .npz or .parquet file(s), a directory, a glob, or a recorded step's "
        "or run's directory (grpo_cli.integrations).",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")
]
ColumnOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--column",
        "-c",
        rich_help_panel="Input",
        metavar="FIELD=NAME",
        help=f"Read FIELD ({', '.join(FIELDS)}) from the column/array NAME. Repeatable.",
    ),
]
PresetOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Conventions",
        metavar="PRESET",
        help=f"Set every convention to a trainer's defaults: {', '.join(PRESETS)}; or a "
        "release's, TRAINER@VERSION (trl@0.19, verl@0.6.1, openrlhf@0.8.3: the newest change "
        "point at or before it).",
        show_default=False,
    ),
]
ScaleOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[group|batch|none]",
        rich_help_panel="Advantages",
        help="Advantage scale: group (default), batch, none (Dr. GRPO).",
        show_default=False,
    ),
]
DdofOpt = Annotated[
    int | None,
    typer.Option(
        metavar="[0|1]",
        rich_help_panel="Advantages",
        help="Std of rewards: 0 population (default), 1 sample.",
        show_default=False,
    ),
]
EpsOpt = Annotated[
    float | None,
    typer.Option(
        metavar="X",
        rich_help_panel="Advantages",
        help="ε added to the reward std (default 1e-8).",
        show_default=False,
    ),
]
EstimatorOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[grpo|rloo]",
        rich_help_panel="Advantages",
        help="Advantage baseline: grpo (group mean, default) or rloo (leave-one-out).",
        show_default=False,
    ),
]
SingletonOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[zero|raw]",
        rich_help_panel="Advantages",
        help="Group of one answer: zero (A = 0, default) or raw (verl: A = r/(1+ε)).",
        show_default=False,
    ),
]
ClipOpt = Annotated[
    float | None,
    typer.Option(
        metavar="X",
        rich_help_panel="Ratio and clipping",
        help="Clip range ε (ε_low), default 0.2.",
        show_default=False,
    ),
]
ClipHighOpt = Annotated[
    str | None,
    typer.Option(
        metavar="X|off",
        rich_help_panel="Ratio and clipping",
        help="Upper clip ε_high (DAPO clip-higher); 'off' = ε.",
        show_default=False,
    ),
]
DualClipOpt = Annotated[
    str | None,
    typer.Option(
        metavar="C|off",
        rich_help_panel="Ratio and clipping",
        help="Dual clip c > 1: for A < 0 the term is bounded below by c·A; 'off' to disable.",
        show_default=False,
    ),
]
RatioClampOpt = Annotated[
    str | None,
    typer.Option(
        metavar="X|off",
        rich_help_panel="Ratio and clipping",
        help="Clamp log-ratios to [−X, X] before exp (verl/OpenRLHF: 20); 'off' to disable.",
        show_default=False,
    ),
]
SeqRatioClampOpt = Annotated[
    str | None,
    typer.Option(
        metavar="X|off",
        rich_help_panel="Ratio and clipping",
        help="Bound the sequence log-ratio from above at X, after the mean (verl GSPO: 10); "
        "sequence level only; 'off' to disable.",
        show_default=False,
    ),
]
ClipUnitOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[tokens|sequences]",
        rich_help_panel="Ratio and clipping",
        help="What clip fractions count: tokens (default) or sequences (TRL GSPO: a clipped "
        "answer counts once; needs --ratio-level sequence).",
        show_default=False,
    ),
]
RatioLevelOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[token|sequence]",
        rich_help_panel="Ratio and clipping",
        help="Importance ratio per token (default) or per sequence (GSPO).",
        show_default=False,
    ),
]
BetaOpt = Annotated[
    float | None,
    typer.Option(
        metavar="X", rich_help_panel="KL", help="KL weight β, default 0.04.", show_default=False
    ),
]
KLEstOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[k1|k2|k3]",
        rich_help_panel="KL",
        help="KL estimator: k1, k2, k3 (default).",
        show_default=False,
    ),
]
KLClampOpt = Annotated[
    str | None,
    typer.Option(
        metavar="X|off",
        rich_help_panel="KL",
        help="Clamp the KL estimate to [−X, X] (verl/OpenRLHF: 10); 'off' to disable.",
        show_default=False,
    ),
]
TrainerOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[" + "|".join(TRAINER_NAMES) + "]",
        rich_help_panel="Conventions",
        help=f"Also report the metrics this trainer logs ({', '.join(TRAINER_NAMES)}), under its "
        f"names; the {_trainer_presets()} presets name theirs.",
        show_default=False,
    ),
]
KLBiasOpt = Annotated[
    bool | None,
    typer.Option(
        "--kl-bias-correction/--no-kl-bias-correction",
        rich_help_panel="KL",
        help="Multiply the per-token KL in the loss by the importance ratio (TRL "
        "use_bias_correction_kl; on in the trl, gspo and dr-grpo presets).",
        show_default=False,
    ),
]
KLModeOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[loss|reward]",
        rich_help_panel="KL",
        help="Where β·KL goes: loss (default) or reward (the trainer's way: verl use_kl_in_reward, "
        "OpenRLHF's default; needs --trainer verl|openrlhf or their preset).",
        show_default=False,
    ),
]
KLAggOpt = Annotated[
    str | None,
    typer.Option(
        metavar="AGG",
        rich_help_panel="KL",
        help="Aggregation of the KL term, one of --agg's (default: as --agg; OpenRLHF: "
        "token-mean).",
        show_default=False,
    ),
]
AggOpt = Annotated[
    str | None,
    typer.Option(
        metavar="AGG",
        rich_help_panel="Aggregation",
        help="How per-token terms become J: seq-mean-token-mean (default), token-mean, "
        "seq-mean-token-sum, seq-mean-token-sum-norm or token-sum.",
        show_default=False,
    ),
]
MaxLenOpt = Annotated[
    int | None,
    typer.Option(
        metavar="L",
        rich_help_panel="Aggregation",
        help="L of seq-mean-token-sum-norm (default: the widest row, masked tokens included; dr-grpo preset: 512, TRL's max_completion_length).",
        show_default=False,
    ),
]
NormScaleOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[n-lmax|lmax]",
        rich_help_panel="Aggregation",
        help="seq-mean-token-sum-norm divisor: n-lmax (N·L, default: TRL, verl >= 0.7.1) or lmax (L: verl <= 0.7.0).",
        show_default=False,
    ),
]
LossOpt = Annotated[
    str | None,
    typer.Option(
        "--loss",
        metavar="NAME",
        rich_help_panel="Loss",
        help=f"The policy loss: {', '.join(LOSS_NAMES)} (clip, the default: the clipped "
        "surrogate; a bare config value takes the preset's or --trainer's "
        "trainer). A loss that fixes its aggregation sets --agg.",
        show_default=False,
    ),
]
LOSS_PARAMS = param_specs("loss")  # every loss's and mask's parameter, with its rows
CORRECTION_PARAMS = param_specs("correction")
LossParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--loss-param",
        metavar="KEY=VALUE",
        rich_help_panel="Loss",
        help="A parameter of the loss (or of a trainer's policy-term mask), under the trainer's "
        f"config name: {', '.join(LOSS_PARAMS)} ('off' for none where a parameter takes it; "
        "grpo-cli losses lists each loss's). Repeatable.",
        show_default=False,
    ),
]
CorrectionOpt = Annotated[
    str | None,
    typer.Option(
        "--correction",
        metavar=_choices(CORRECTION_NAMES),
        rich_help_panel="Loss",
        help="The sampler–trainer correction applied with rollout_logp: TRL's vLLM IS "
        "correction, verl's rollout IS weights or OpenRLHF's IS correction (default none).",
        show_default=False,
    ),
]
CorrectionParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--correction-param",
        metavar="KEY=VALUE",
        rich_help_panel="Loss",
        help=f"A parameter of the correction: {', '.join(CORRECTION_PARAMS)} ('off' for "
        "none). Repeatable.",
        show_default=False,
    ),
]


def _spec(name: str) -> Spec:
    """The spec of a loss's, mask's or correction's parameter (names are the trainers'
    config names: one name is one parameter, whichever rows have it)."""
    for rows in (LOSSES.values(), MASKS.values(), CORRECTIONS.values()):
        for r in rows:
            specs = r.params.specs()
            if name in specs:
                return specs[name]
    raise KeyError(name)


def _params(
    flag: str, given: list[str] | None, allowed: dict[str, tuple[str, ...]]
) -> dict[str, Any]:
    """``--loss-param KEY=VALUE`` items as overrides, each read by its parameter's spec
    (a number, 'off', a boolean, a name); an unknown key or a bad value is one UsageError.
    Whether the settings' loss takes it is its row's to say (:func:`resolve_settings`)."""
    out: dict[str, Any] = {}
    for item in given or ():
        key, eq, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not eq or not key:
            raise UsageError(f"{flag}: expected KEY=VALUE, got {item!r}")
        if key not in allowed:
            raise UsageError(f"{flag}: {key!r} is not one of {', '.join(allowed)}")
        try:
            value = _spec(key).parse(text)
        except ValueError as exc:
            raise UsageError(f"{flag} {key}: {exc}, got {text!r}") from None
        out[key] = OFF if value is None else value
    return out


WorkersOpt = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        min=1,
        help="Compute threads, 1 to 64 (default 2 on every machine, or GRPO_CLI_WORKERS). "
        "Results depend on it only through the order of float additions: about 1e-15 "
        "relative, up to 1e-12 for small differences of large sums (chi2_token, J near 0); "
        "JSON echoes it in engine.",
        show_default=False,
    ),
]


def _engine_name(value: str) -> str:
    if value not in ("local", "ray"):
        raise typer.BadParameter(f"expected local or ray, got {value!r}")
    return value


EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        callback=_engine_name,
        metavar="local|ray",
        help="local: this machine's threads; ray: Ray tasks over the dataset's blocks (needs "
        "the [ray] extra; same numbers to the order of float additions).",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDR",
        help="The Ray cluster to run on (default: RAY_ADDRESS, else a private local Ray "
        "started for the run and stopped after it).",
        show_default=False,
    ),
]
LoggedOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        rich_help_panel="Trainer",
        help="Metrics the trainer logged (JSON object, or JSON lines with a step), in its names; "
        "each is compared with grpo-cli's value.",
        show_default=False,
    ),
]
LoggedStepOpt = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        rich_help_panel="Trainer",
        help="The step of --logged to compare (default: the last record).",
        show_default=False,
    ),
]
LoggedTolOpt = Annotated[
    float,
    typer.Option(
        metavar="X",
        rich_help_panel="Trainer",
        help="Relative difference from which a logged metric differs (objective; check: "
        "the logged-metrics rule's fail threshold).",
    ),
]
GroupScopeOpt = Annotated[
    str,
    typer.Option(
        metavar="[dataset|file]",
        help="dataset: a group id is one group across files (the shards of one step); file: "
        "ids are scoped to their file (one step per file).",
        show_default=True,
    ),
]
ProgressOpt = Annotated[
    bool,
    typer.Option(
        "--progress/--no-progress", help="Progress bar on stderr (only when it is a terminal)."
    ),
]


FullOpt = Annotated[
    bool,
    typer.Option(
        "--full",
        help="Print every table (the default view is one screen: the numbers that matter, "
        "the top findings and a verdict).",
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="PATH",
        help="Also draw the figures to PATH (.png, .svg or .pdf) and say where; needs the "
        "[plot] extra.",
    ),
]


# ------------------------------------------------------------------ check's own options
CHECK_FORMATS = ("table", "json", "github", "junit", "html")
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="TOML file of rule settings (default: [tool.grpo-cli.check] in ./pyproject.toml).",
    ),
]
CheckFormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        metavar="[table|json|github|junit|html]",
        help="table; json; github (annotations and $GITHUB_STEP_SUMMARY); junit; html "
        "(the report grpo-cli report writes: one self-contained file, a CI artifact).",
    ),
]
BaselineOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="A previous `check --format json` report: fail on relative drift beyond baseline-tolerance.",
    ),
]
ReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--report",
        metavar="FILE",
        help="Also write the JSON report to this file (e.g. the next run's baseline).",
    ),
]
CheckRuleOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--rule",
        "-r",
        metavar="RULE.KEY=VALUE",
        help="Override a rule: RULE.warn=X, RULE.fail=X, RULE.enabled=false, RULE.severity=warn. Repeatable.",
    ),
]
OnPolicyOpt = Annotated[
    bool,
    typer.Option(
        "--on-policy", help="Declare the log on-policy: logp must equal old_logp exactly."
    ),
]
ReportHtmlOpt = Annotated[
    Path | None,
    typer.Option(
        "--report-html",
        metavar="FILE",
        help="Also write the HTML report (grpo-cli report's) to this file: a CI artifact.",
    ),
]
LastOpt = Annotated[
    int | None,
    typer.Option(
        "--last", metavar="N", help="A recorded run: check its last N complete steps only."
    ),
]
StepsOpt = Annotated[
    str | None,
    typer.Option(
        "--steps",
        metavar="A:B",
        help="A recorded run: check its steps A to B (both included; 10: or :20 too).",
    ),
]
RequireOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--require",
        metavar="RULE",
        help="A rule that must be evaluated: its skip fails the check. Repeatable.",
    ),
]


@overload
def _settings(*, run: None = None, **kw: Any) -> Settings: ...
@overload
def _settings(*, run: RecordedRun, **kw: Any) -> tuple[Settings, list[str]]: ...
def _settings(
    *, run: RecordedRun | None = None, **kw: Any
) -> Settings | tuple[Settings, list[str]]:
    """Settings from convention flags (flag values as typed: 'off' turns an optional
    convention off), on a recorded run's settings when ``run`` is given (then with the
    notes); a :class:`SettingError` becomes a UsageError naming the flag."""
    for name in ("clip_eps_high", "dual_clip", "log_ratio_clamp", "seq_ratio_clamp", "kl_clamp"):
        kw[name] = _optional(name.replace("_", "-"), kw.get(name))
    from_loss = _params("--loss-param", kw.pop("loss_param", None), LOSS_PARAMS)
    from_correction = _params(
        "--correction-param", kw.pop("correction_param", None), CORRECTION_PARAMS
    )
    kw.update(from_loss)
    kw.update(from_correction)
    preset = kw.pop("preset", None)
    trainer = kw.get("trainer")
    named = preset_settings(preset)[0].trainer if preset is not None else None
    if run is not None:
        named, preset = run.trainer, None
    if trainer is not None and named is not None and trainer != named:
        whose = f"the {preset} preset mirrors" if run is None else "the recorded run is of"
        raise UsageError(f"--trainer {trainer}: {whose} {named}")
    try:
        if run is not None:
            kw.pop("trainer", None)  # the run's own (checked above)
            return resolve_run_settings(
                run.trainer, run.trainer_version, run.config, origin=run.config_file, **kw
            )
        with warnings.catch_warnings():  # a release preset's warning: Conventions.notes
            warnings.simplefilter("ignore", UserWarning)
            return resolve_settings(preset, **kw)
    except SettingError as exc:  # the library names the field; a user typed the flag
        flag = "--" + exc.field.replace("_", "-")
        if exc.field in from_correction or (
            exc.field in CORRECTION_PARAMS and exc.field not in from_loss
        ):
            flag = f"--correction-param {exc.field}"
        elif exc.field in LOSS_PARAMS:
            flag = f"--loss-param {exc.field}"
        problem = exc.problem.replace("ratio_level", "--ratio-level")
        raise UsageError(f"{flag}: {problem}") from None


# The convention options: every field of Settings a user can set, in the order --help
# lists them. A command takes them all (CONVENTIONS) or the advantages' (``advantages``).
CONVENTIONS: dict[str, Any] = {
    "preset": PresetOpt,
    "trainer": TrainerOpt,
    "clip_eps": ClipOpt,
    "clip_eps_high": ClipHighOpt,
    "dual_clip": DualClipOpt,
    "log_ratio_clamp": RatioClampOpt,
    "seq_ratio_clamp": SeqRatioClampOpt,
    "ratio_level": RatioLevelOpt,
    "clip_unit": ClipUnitOpt,
    "beta": BetaOpt,
    "kl_estimator": KLEstOpt,
    "kl_clamp": KLClampOpt,
    "kl_bias_correction": KLBiasOpt,
    "kl_mode": KLModeOpt,
    "kl_agg": KLAggOpt,
    "agg": AggOpt,
    "max_len": MaxLenOpt,
    "norm_scale": NormScaleOpt,
    "scale": ScaleOpt,
    "ddof": DdofOpt,
    "eps": EpsOpt,
    "estimator": EstimatorOpt,
    "singleton": SingletonOpt,
    "loss": LossOpt,
    "loss_param": LossParamOpt,
    "correction": CorrectionOpt,
    "correction_param": CorrectionParamOpt,
}
ADVANTAGE_CONVENTIONS = ("preset", "scale", "ddof", "eps", "estimator", "singleton")


@dataclass(frozen=True)
class Conventions:
    """The convention flags a command was given (None: not given, the preset's or the
    default value holds): :meth:`settings` resolves them."""

    values: dict[str, Any]

    def settings(self, **extra: Any) -> Settings:
        """The Settings of these flags (``extra``: more, from a command's own logic); a
        bad value is a :class:`UsageError` naming its flag."""
        return _settings(**{**self.values, **extra})

    def for_run(self, run: RecordedRun | None) -> tuple[Settings, list[str]]:
        """The settings of a recorded run (its ``meta.json``: the trainer's preset and
        config), each flag given overriding one setting; a ``--preset`` given replaces the
        run's settings altogether. Without a run: :meth:`settings`. Notes say what the
        run's config asks that is not computed."""
        if run is None:
            return self.settings(), []
        if self.values.get("preset") is not None:
            note = f"--preset {self.values['preset']}: {run.root / 'meta.json'} is not used"
            return self.settings(), [note]
        return _settings(run=run, **self.values)

    def notes(self) -> list[str]:
        """What the flags' preset says of itself (a release newer than any known)."""
        preset = self.values.get("preset")
        if preset is None:
            return []
        warning = preset_settings(preset)[1]
        return [] if warning is None else [warning]

    def for_source(self, src: Source) -> tuple[Settings, Source]:
        """The settings for ``src`` (:meth:`for_run` of its recorded run, if it is one), and
        the source carrying their notes."""
        run = src.recorded.run if src.recorded is not None else getattr(src.reader, "run", None)
        settings, notes = self.for_run(run)
        if src.recorded is None:
            notes = [*self.notes(), *notes]
        if notes:
            src = dataclasses.replace(src, notes=(*src.notes, *notes))
        return settings, src


def conventions(
    names: tuple[str, ...] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command that takes the convention options (``names``: a subset; all by default),
    given to it as one ``conventions: Conventions`` parameter: the options are written
    once here, and every command lists them the same way in ``--help``."""
    chosen = {k: CONVENTIONS[k] for k in (names or tuple(CONVENTIONS))}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(command, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "conventions"]
        added = [
            inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=a)
            for k, a in chosen.items()
        ]
        first_kw = next((i for i, p in enumerate(own) if p.kind == p.KEYWORD_ONLY), len(own))
        params = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if i >= first_kw else p
            for i, p in enumerate(own)
        ]

        @functools.wraps(command)
        def wrapper(*args: Any, **kw: Any) -> Any:
            given = {k: kw.pop(k, None) for k in chosen}
            return command(*args, conventions=Conventions(given), **kw)

        whole = [*params, *added]
        wrapper.__signature__ = sig.replace(parameters=whole)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in whole}
        return wrapper

    return decorate


# ----------------------------------------------------------------- fast coercion
# typer >= 0.29 converts every parameter's value (None and defaults included) through a
# pydantic TypeAdapter it builds at the first use: importing pydantic and building ~30
# adapters costs ~0.1 s of CPU at every run, for options that are plain str, int, float,
# Path or list[str]. These are converted here instead, the way click converts them; any
# other parameter (or a typer without the hook) keeps typer's own conversion.
_PLAIN: dict[Any, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    Path: "a path",
    bool: "true or false",
}
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False,
          "no": False, "off": False}  # fmt: skip


@dataclass(frozen=True)
class _PlainParam:
    """typer's runtime-parameter contract (``coerce(value, param, ctx)``) for a plain
    type, with the bounds ``min``/``max`` of an ``int`` or ``float`` option."""

    kind: Any
    low: float | None = None
    high: float | None = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        if multi:
            if isinstance(value, str):
                raise typer.BadParameter("expected several values", ctx=ctx, param=param)
            return [self._one(v, param, ctx) for v in value]
        return self._one(value, param, ctx)

    def _one(self, value: Any, param: Any, ctx: Any) -> Any:
        kind = self.kind
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if kind is str:
            return str(value)
        if kind is Path:
            return value if isinstance(value, Path) else Path(value)
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in _BOOLS:
                raise typer.BadParameter(
                    f"expected {_PLAIN[kind]}, got {value!r}", ctx=ctx, param=param
                )
            return _BOOLS[text]
        if isinstance(value, bool) or not isinstance(value, kind):
            try:
                value = kind(str(value).strip())
            except ValueError:
                raise typer.BadParameter(
                    f"expected {_PLAIN[kind]}, got {value!r}", ctx=ctx, param=param
                ) from None
        if self.low is not None and value < self.low:
            raise typer.BadParameter(
                f"expected at least {self.low:g}, got {value!r}", ctx=ctx, param=param
            )
        if self.high is not None and value > self.high:
            raise typer.BadParameter(
                f"expected at most {self.high:g}, got {value!r}", ctx=ctx, param=param
            )
        return value

    @classmethod
    def of(cls, descriptor: Any) -> _PlainParam | None:
        """The plain conversion of a typer type descriptor, or None (typer's own)."""
        info = descriptor.parameter_info
        ann = descriptor.annotation
        if getattr(info, "parser", None) is not None or descriptor.file_annotation is not None:
            return None
        if getattr(ann, "__origin__", None) is list and len(ann.__args__) == 1:
            ann = ann.__args__[0]
        if ann not in _PLAIN:
            return None
        if ann is Path and (info.exists or info.resolve_path or not info.file_okay
                            or not info.dir_okay or info.writable):  # fmt: skip
            return None
        if getattr(info, "clamp", False):
            return None
        if (info.min is not None or info.max is not None) and ann not in (int, float):
            return None
        return cls(ann, info.min, info.max)


def plain_coercion(params: list[Any]) -> list[Any]:
    """Give the plain ones of ``params`` (a command's, as ``get_params`` lists them: the
    help option too) a :class:`_PlainParam` conversion; ``params`` back. Nothing changes
    with a typer that converts through click (no ``_runtime_param``)."""
    for p in params:
        descriptor = getattr(p, "type_descriptor", None)
        if descriptor is None or getattr(p, "_runtime_param", False) is not None:
            continue
        fast = _PlainParam.of(descriptor)
        if fast is not None:
            p._runtime_param = fast
    return params
