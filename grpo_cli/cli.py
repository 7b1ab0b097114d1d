"""The ``grpo-cli`` command line: parse options, call the library, render. Nothing more.

Every :class:`~grpo_cli.errors.GrpoCliError` becomes one line on stderr and exit code 2
(``check`` failures are exit code 1); stdout carries only tables or one JSON document.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from . import __version__
from ._json import advantages_json, dumps, kl_json, objective_json
from ._report import ObjectiveReport, advantages_report, kl_report, objective_report
from ._settings import OFF, PRESETS, TRAINERS, SettingError, Settings, resolve_settings
from .engine.options import DEFAULT_BATCH_TOKENS, DEFAULT_WORKERS, MAX_WORKERS, EngineOptions
from .errors import GrpoCliError, UsageError
from .io import open_source, parse_column_map, write_advantages

if TYPE_CHECKING:
    from rich.console import Console

try:  # typer >= 0.24 vendors click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover
    from click.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
        ClickException,
        NoArgsIsHelpError,
    )


class _OneLineErrors(TyperGroup):
    """Usage errors (an unknown option, a missing argument, a value of the wrong type) as
    the one line every other error is: ``grpo-cli: error: …`` on stderr, exit code 2."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        if sys.stdout is None or sys.stdout.closed:
            typer.echo("grpo-cli: error: stdout is closed: nowhere to write the output", err=True)
            sys.exit(2)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except OSError as exc:  # stdout refused the output (a full disk, /dev/full)
            if exc.errno == errno.EPIPE:  # `| head`: the reader has what it wanted
                raise
            typer.echo(
                f"grpo-cli: error: cannot write the output ({exc.strerror or exc})", err=True
            )
            sys.exit(2)
        except NoArgsIsHelpError as exc:  # `grpo-cli` alone: the help, as asked for
            typer.echo(exc.ctx.get_help())
            sys.exit(0)
        except ClickException as exc:
            where = ""
            ctx = getattr(exc, "ctx", None)
            if ctx is not None and ctx.command_path:
                where = f" (see {ctx.command_path} --help)"
            text = " ".join(exc.format_message().split())
            typer.echo(f"grpo-cli: error: {text}{where}", err=True)
            sys.exit(2)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="grpo-cli",
    help="GRPO loss calculator and diagnostics for logged rollouts (npz or parquet).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=_OneLineErrors,
    # plain help: no markup to escape in option texts, and nothing cut at 80 columns
    rich_markup_mode=None,
)


# ----------------------------------------------------------------------- plumbing
@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except GrpoCliError as exc:
        typer.echo(f"grpo-cli: error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:  # Ctrl-C: the work stops (a Ray run's tasks too), one line
        typer.echo("grpo-cli: interrupted", err=True)
        raise typer.Exit(130) from None
    finally:
        if "grpo_cli.engine.ray" in sys.modules:  # stop the Ray this run started or joined
            sys.modules["grpo_cli.engine.ray"].close()


# rich (tables, progress) and the check rules are imported where they are used: `--json`
# runs, the ones a pipeline times, then start without them
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _stdout() -> Console:
    """The console of tables: no markup is parsed (a group id like ``[INST]a[/INST]`` is
    shown as it is) and control characters of user strings are shown escaped (``\x1b``),
    never sent to the terminal."""
    from rich.console import Console
    from rich.text import Text

    class SafeConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Text:
            clean = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
            return super().render_str(clean, **kwargs)

    return SafeConsole(soft_wrap=False, highlight=False, markup=False)


def _emit_json(doc: dict[str, Any]) -> None:
    sys.stdout.write(dumps(doc) + "\n")


def _note(text: str) -> None:
    typer.echo(f"grpo-cli: note: {text}", err=True)


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


@contextmanager
def _progress(
    enabled: bool, total: int | None, what: str
) -> Iterator[Callable[[int], None] | None]:
    if not enabled or not sys.stderr.isatty() or not total or total < 10_000:
        yield None  # a bar only where it helps: big inputs, a terminal to draw on
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn(what),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as prog:
        task = prog.add_task(what, total=total)
        yield lambda n: prog.advance(task, n)


# ------------------------------------------------------------------------ options
def _trainer_presets() -> str:
    named = [name for name, p in PRESETS.items() if p.trainer is not None]
    return ", ".join(named[:-1]) + " and " + named[-1]


Files = Annotated[
    list[str],
    typer.Argument(
        help="Input: .npz or .parquet file(s), a directory, or a glob.", show_default=False
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
        help="Read FIELD (group, reward, advantage, logp, old_logp, ref_logp, mask) "
        "from the column/array NAME. Repeatable.",
    ),
]
PresetOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Conventions",
        help=f"Set every convention to a trainer's defaults: {', '.join(PRESETS)}.",
    ),
]
ScaleOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Advantages",
        help="Advantage scale: group (default), batch, none (Dr. GRPO).",
        show_default=False,
    ),
]
DdofOpt = Annotated[
    int | None,
    typer.Option(
        rich_help_panel="Advantages",
        help="Std of rewards: 0 population (default), 1 sample.",
        show_default=False,
    ),
]
EpsOpt = Annotated[
    float | None,
    typer.Option(
        rich_help_panel="Advantages",
        help="ε added to the reward std (default 1e-8).",
        show_default=False,
    ),
]
EstimatorOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Advantages",
        help="Advantage baseline: grpo (group mean, default) or rloo (leave-one-out).",
        show_default=False,
    ),
]
SingletonOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Advantages",
        help="Group of one answer: zero (A = 0, default) or raw (verl: A = r/(1+ε)).",
        show_default=False,
    ),
]
ClipOpt = Annotated[
    float | None,
    typer.Option(
        rich_help_panel="Ratio and clipping",
        help="Clip range ε (ε_low), default 0.2.",
        show_default=False,
    ),
]
ClipHighOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Ratio and clipping",
        help="Upper clip ε_high (DAPO clip-higher); 'off' = ε.",
        show_default=False,
    ),
]
DualClipOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Ratio and clipping",
        help="Dual clip c > 1: for A < 0 the term is bounded below by c·A; 'off' to disable.",
        show_default=False,
    ),
]
RatioClampOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Ratio and clipping",
        help="Clamp log-ratios to [−X, X] before exp (verl/OpenRLHF: 20); 'off' to disable.",
        show_default=False,
    ),
]
SeqRatioClampOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Ratio and clipping",
        help="Bound the sequence log-ratio from above at X, after the mean (verl GSPO: 10); "
        "sequence level only; 'off' to disable.",
        show_default=False,
    ),
]
ClipUnitOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Ratio and clipping",
        help="What clip fractions count: tokens (default) or sequences (TRL GSPO: a clipped "
        "answer counts once; needs --ratio-level sequence).",
        show_default=False,
    ),
]
RatioLevelOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Ratio and clipping",
        help="Importance ratio per token (default) or per sequence (GSPO).",
        show_default=False,
    ),
]
BetaOpt = Annotated[
    float | None,
    typer.Option(rich_help_panel="KL", help="KL weight β, default 0.04.", show_default=False),
]
KLEstOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="KL", help="KL estimator: k1, k2, k3 (default).", show_default=False
    ),
]
KLClampOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="KL",
        help="Clamp the KL estimate to [−X, X] (verl/OpenRLHF: 10); 'off' to disable.",
        show_default=False,
    ),
]
TrainerOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Conventions",
        help=f"Also report the metrics this trainer logs ({', '.join(TRAINERS)}), under its "
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
        rich_help_panel="KL",
        help="Where β·KL goes: loss (default) or reward (the trainer's way: verl use_kl_in_reward, "
        "OpenRLHF's default; needs --trainer verl|openrlhf or their preset).",
        show_default=False,
    ),
]
KLAggOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="KL",
        help="Aggregation of the KL term (default: as --agg; OpenRLHF: token-mean).",
        show_default=False,
    ),
]
AggOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Aggregation",
        help="Aggregation: seq-mean-token-mean (default), token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, token-sum.",
        show_default=False,
    ),
]
MaxLenOpt = Annotated[
    int | None,
    typer.Option(
        rich_help_panel="Aggregation",
        help="L of seq-mean-token-sum-norm (default: the widest row, masked tokens included; dr-grpo preset: 512, TRL's max_completion_length).",
        show_default=False,
    ),
]
NormScaleOpt = Annotated[
    str | None,
    typer.Option(
        rich_help_panel="Aggregation",
        help="seq-mean-token-sum-norm divisor: n-lmax (N·L, default: TRL, verl >= 0.7.1) or lmax (L: verl <= 0.7.0).",
        show_default=False,
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Compute threads, 1 to 64 (default 2 on every machine, or GRPO_CLI_WORKERS; the "
        "result depends on it only at the 1e-15 level, through the order of float additions; "
        "JSON echoes it in engine).",
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
        rich_help_panel="Trainer",
        help="Metrics the trainer logged (JSON object, or JSON lines with a step), in its names; "
        "each is compared with grpo-cli's value.",
        show_default=False,
    ),
]
LoggedStepOpt = Annotated[
    int | None,
    typer.Option(
        rich_help_panel="Trainer",
        help="The step of --logged to compare (default: the last record).",
        show_default=False,
    ),
]
LoggedTolOpt = Annotated[
    float,
    typer.Option(
        rich_help_panel="Trainer",
        help="Relative difference from which a logged metric differs (objective; check: "
        "the logged-metrics rule's fail threshold).",
    ),
]
GroupScopeOpt = Annotated[
    str,
    typer.Option(
        help="dataset: a group id is one group across files (the shards of one step); file: "
        "ids are scoped to their file (one step per file).",
    ),
]
ProgressOpt = Annotated[
    bool,
    typer.Option(
        "--progress/--no-progress", help="Progress bar on stderr (only when it is a terminal)."
    ),
]


def env_int(name: str, default: int, minimum: int = 1) -> int:
    """An integer tuning knob from the environment (``default`` when unset); anything
    else than an integer ``>= minimum`` is a :class:`UsageError`."""
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


def _backend() -> str:
    """``GRPO_CLI_KERNEL``: auto (default), c, or numpy."""
    m = os.environ.get("GRPO_CLI_KERNEL", "auto").strip().lower() or "auto"
    if m not in ("auto", "c", "numpy"):
        raise UsageError(f"GRPO_CLI_KERNEL must be auto, c or numpy, got {m!r}")
    return m


def _engine(
    workers: int | None = None, name: str = "local", ray_address: str | None = None
) -> EngineOptions:
    """The engine options from ``--workers``, ``--engine``, ``--ray-address`` and the
    environment: ``GRPO_CLI_WORKERS`` (0: the default), ``GRPO_CLI_BATCH_TOKENS``,
    ``GRPO_CLI_NO_PREFETCH`` (any value: decode in the computing threads),
    ``GRPO_CLI_KERNEL`` and ``RAY_ADDRESS``. The only place the environment is read."""
    if ray_address is not None and name != "ray":
        raise UsageError("--ray-address: only with --engine ray")
    if workers is not None and name == "ray":
        raise UsageError(
            "--workers: the local engine's threads; with --engine ray the cluster's CPUs fold "
            "the blocks (engine.workers in JSON says how many)"
        )
    address = None
    if name == "ray":
        address = ray_address or os.environ.get("RAY_ADDRESS", "").strip() or None
    if workers is None:
        workers = env_int("GRPO_CLI_WORKERS", 0, minimum=0) or DEFAULT_WORKERS
    if workers > MAX_WORKERS:
        raise UsageError(f"--workers / GRPO_CLI_WORKERS: at most {MAX_WORKERS}, got {workers}")
    try:
        return EngineOptions(
            workers=workers,
            batch_tokens=env_int("GRPO_CLI_BATCH_TOKENS", DEFAULT_BATCH_TOKENS),
            prefetch=not os.environ.get("GRPO_CLI_NO_PREFETCH"),
            backend=_backend(),
            name=name,
            address=address,
        ).resolved()
    except UsageError as exc:
        if "not built" in str(exc):
            raise UsageError(f"GRPO_CLI_KERNEL=c but {str(exc).split(': ', 1)[1]}") from None
        raise


def _logged_metrics(
    path: Path, step: int | None, tolerance: float
) -> tuple[dict[str, float], int | None]:
    from ._logged import load_logged

    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise UsageError(f"--logged-tolerance: must be a finite number >= 0, got {tolerance}")
    return load_logged(path, step)


def _with_logged(
    report: ObjectiveReport, path: Path, step: int | None, tolerance: float
) -> ObjectiveReport:
    """The report with what the trainer logged compared to its trainer metrics."""
    from dataclasses import replace

    from ._logged import compare_logged

    metrics, got = _logged_metrics(path, step, tolerance)
    cmp = compare_logged(str(path), metrics, got, report.trainer_metrics, tolerance=tolerance)
    warnings = list(report.warnings)
    if not report.trainer_metrics:
        warnings.append(
            "--logged: no trainer metrics to compare (name the trainer: --preset or --trainer)"
        )
    differ = [c.metric for c in cmp.metrics if c.verdict == "differs"]
    if differ:
        warnings.append(
            f"--logged: {len(differ)} metric(s) differ from the trainer's by more than "
            f"{tolerance:g} (relative): {', '.join(differ)}"
        )
    return replace(report, logged=cmp, warnings=warnings)


def _settings(**kw: Any) -> Settings:
    for name in ("clip_eps_high", "dual_clip", "log_ratio_clamp", "seq_ratio_clamp", "kl_clamp"):
        kw[name] = _optional(name.replace("_", "-"), kw.get(name))
    preset = kw.pop("preset", None)
    trainer = kw.get("trainer")
    named = PRESETS[preset].trainer if preset in PRESETS else None
    if trainer is not None and named is not None and trainer != named:
        raise UsageError(f"--trainer {trainer}: the {preset} preset mirrors {named}")
    try:
        return resolve_settings(preset, **kw)
    except SettingError as exc:  # the library names the field; a user typed the flag
        flag = "--" + exc.field.replace("_", "-")
        problem = exc.problem.replace("ratio_level", "--ratio-level")
        raise UsageError(f"{flag}: {problem}") from None


# ----------------------------------------------------------------------- commands
@app.command()
def advantages(
    files: Files,
    json_out: JsonOpt = False,
    out: Annotated[
        Path | None, typer.Option(help="Write the advantages to this .npz or .parquet file.")
    ] = None,
    max_groups: Annotated[int, typer.Option(help="Groups shown in the table.")] = 20,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    preset: PresetOpt = None,
    scale: ScaleOpt = None,
    ddof: DdofOpt = None,
    eps: EpsOpt = None,
    estimator: EstimatorOpt = None,
    singleton: SingletonOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """Group-relative advantages from rewards and group ids, with per-group statistics."""
    with _errors():
        settings = _settings(
            preset=preset, scale=scale, ddof=ddof, eps=eps, estimator=estimator, singleton=singleton
        )
        if out is not None and out.suffix.lower() not in (".npz", ".parquet", ".pq"):
            raise UsageError(f"--out {out}: the file must end in .npz or .parquet")
        src = open_source(files, parse_column_map(column), group_scope=group_scope)
        report = advantages_report(src, settings, engine=_engine(None, engine, ray_address))
        for w in report.warnings:
            _note(w)
        if out is not None:
            adv = report.advantages.reshape(report.shape) if report.shape else report.advantages
            labels = [report.labels[c] for c in report.codes.tolist()]
            write_advantages(out, adv, labels)
        if json_out:
            _emit_json(advantages_json(report))
        else:
            from ._render import render_advantages

            _stdout().print(render_advantages(report, max_groups=max_groups))


@app.command()
def kl(
    files: Files,
    json_out: JsonOpt = False,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    preset: PresetOpt = None,
    kl_estimator: KLEstOpt = None,
    kl_clamp: KLClampOpt = None,
    log_ratio_clamp: RatioClampOpt = None,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """KL(π_θ ‖ π_ref) estimate per token: statistics, quantiles, per-answer distribution."""
    with _errors():
        settings = _settings(
            preset=preset,
            kl_estimator=kl_estimator,
            kl_clamp=kl_clamp,
            log_ratio_clamp=log_ratio_clamp,
        )
        src = open_source(files, parse_column_map(column), group_scope=group_scope)
        with _progress(progress, src.n_rows(), "kl") as tick:
            report = kl_report(
                src, settings, progress=tick, engine=_engine(workers, engine, ray_address)
            )
        for w in report.warnings:
            _note(w)
        if json_out:
            _emit_json(kl_json(report))
        else:
            from ._render import render_kl

            _stdout().print(render_kl(report))


PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="PATH.png",
        help="Also draw the figures to PATH (.png, .svg, .pdf); needs the [plot] extra.",
    ),
]


@app.command()
def objective(
    files: Files,
    json_out: JsonOpt = False,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Show the objective under every aggregation and each answer's weight by length.",
        ),
    ] = False,
    recompute_advantages: Annotated[
        bool,
        typer.Option(
            "--recompute-advantages",
            help="Ignore the file's advantages; compute them from rewards and groups.",
        ),
    ] = False,
    plot: PlotOpt = None,
    gradient: Annotated[
        bool,
        typer.Option(
            "--gradient",
            help="Also compute ‖∂J/∂logp‖ over the valid tokens and its policy and KL parts "
            "(folds in numpy: slower).",
        ),
    ] = False,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    preset: PresetOpt = None,
    trainer: TrainerOpt = None,
    clip_eps: ClipOpt = None,
    clip_eps_high: ClipHighOpt = None,
    dual_clip: DualClipOpt = None,
    log_ratio_clamp: RatioClampOpt = None,
    seq_ratio_clamp: SeqRatioClampOpt = None,
    ratio_level: RatioLevelOpt = None,
    clip_unit: ClipUnitOpt = None,
    beta: BetaOpt = None,
    kl_estimator: KLEstOpt = None,
    kl_clamp: KLClampOpt = None,
    kl_bias_correction: KLBiasOpt = None,
    kl_mode: KLModeOpt = None,
    kl_agg: KLAggOpt = None,
    agg: AggOpt = None,
    max_len: MaxLenOpt = None,
    norm_scale: NormScaleOpt = None,
    scale: ScaleOpt = None,
    ddof: DdofOpt = None,
    eps: EpsOpt = None,
    estimator: EstimatorOpt = None,
    singleton: SingletonOpt = None,
    logged: LoggedOpt = None,
    logged_step: LoggedStepOpt = None,
    logged_tolerance: LoggedTolOpt = 1e-3,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """GRPO objective J, loss −J, its policy and KL parts, clip fractions, ratio and KL stats."""
    with _errors():
        settings = _settings(
            preset=preset,
            trainer=trainer,
            clip_eps=clip_eps,
            clip_eps_high=clip_eps_high,
            dual_clip=dual_clip,
            log_ratio_clamp=log_ratio_clamp,
            seq_ratio_clamp=seq_ratio_clamp,
            ratio_level=ratio_level,
            clip_unit=clip_unit,
            beta=beta,
            kl_estimator=kl_estimator,
            kl_clamp=kl_clamp,
            kl_bias_correction=kl_bias_correction,
            kl_mode=kl_mode,
            kl_agg=kl_agg,
            agg=agg,
            max_len=max_len,
            norm_scale=norm_scale,
            scale=scale,
            ddof=ddof,
            eps=eps,
            estimator=estimator,
            singleton=singleton,
        )
        from ._plot import require_plot

        require_plot(plot)
        src = open_source(files, parse_column_map(column), group_scope=group_scope)
        with _progress(progress, src.n_rows(), "objective") as tick:
            report = objective_report(
                src,
                settings,
                progress=tick,
                recompute_advantages=recompute_advantages,
                engine=_engine(workers, engine, ray_address),
                gradient=gradient,
            )
        if logged is not None:
            report = _with_logged(report, logged, logged_step, logged_tolerance)
        if plot is not None:
            from ._plot import plot_objective

            plot_objective(report, plot)
        for w in report.warnings:
            _note(w)
        if json_out:
            _emit_json(objective_json(report))
        else:
            from ._render import render_objective

            _stdout().print(render_objective(report, compare=compare))


@app.command()
def check(
    files: Files,
    config: Annotated[
        Path | None,
        typer.Option(
            help="TOML file of rule settings (default: [tool.grpo-cli.check] in ./pyproject.toml)."
        ),
    ] = None,
    output_format: Annotated[
        str,
        typer.Option(
            "--format", help="table, json, github (annotations + $GITHUB_STEP_SUMMARY) or junit."
        ),
    ] = "table",
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="A previous `check --format json` report: fail on relative drift beyond baseline-tolerance."
        ),
    ] = None,
    report_path: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Also write the JSON report to this file (e.g. the next run's baseline).",
        ),
    ] = None,
    rule: Annotated[
        list[str] | None,
        typer.Option(
            "--rule",
            "-r",
            metavar="RULE.KEY=VALUE",
            help="Override a rule: RULE.warn=X, RULE.fail=X, RULE.enabled=false, RULE.severity=warn. Repeatable.",
        ),
    ] = None,
    on_policy: Annotated[
        bool,
        typer.Option(
            "--on-policy", help="Declare the log on-policy: logp must equal old_logp exactly."
        ),
    ] = False,
    require: Annotated[
        list[str] | None,
        typer.Option(
            "--require",
            metavar="RULE",
            help="A rule that must be evaluated: its skip fails the check. Repeatable.",
        ),
    ] = None,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    preset: PresetOpt = None,
    clip_eps: ClipOpt = None,
    clip_eps_high: ClipHighOpt = None,
    logged: LoggedOpt = None,
    logged_step: LoggedStepOpt = None,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """Gate a rollout log in CI: integrity and training-health rules; exit 1 when one fails."""
    from ._check import load_config, run_check
    from ._render import check_github, check_junit, render_check

    with _errors():
        if output_format not in ("table", "json", "github", "junit"):
            raise UsageError(
                f"--format: {output_format!r} is not one of table, json, github, junit"
            )
        settings = _settings(preset=preset, clip_eps=clip_eps, clip_eps_high=clip_eps_high)
        cfg = load_config(config, rule, on_policy, require=require)
        base = None
        if baseline is not None:
            try:
                base = json.loads(baseline.read_text())
            except (OSError, ValueError) as exc:
                raise UsageError(
                    f"--baseline {baseline}: cannot read a JSON report ({exc})"
                ) from None
        logged_in = None
        if logged is not None:
            metrics, got = _logged_metrics(logged, logged_step, 0.0)
            logged_in = (str(logged), metrics, got)
        src = open_source(files, parse_column_map(column), group_scope=group_scope)
        with _progress(progress, src.n_rows(), "check") as tick:
            report = run_check(
                src,
                settings,
                cfg,
                baseline=base,
                progress=tick,
                engine=_engine(workers, engine, ray_address),
                logged=logged_in,
            )
        from ._json import check_json

        doc = check_json(report)
        if report_path is not None:
            try:
                report_path.write_text(dumps(doc) + "\n")
            except OSError as exc:
                raise UsageError(
                    f"--report {report_path}: cannot write ({exc.strerror or exc})"
                ) from None
        if output_format == "json":
            _emit_json(doc)
        elif output_format == "github":
            lines, summary = check_github(report)
            target = os.environ.get("GITHUB_STEP_SUMMARY")
            if target:  # before any annotation: a failure here leaves stdout empty
                try:
                    with open(target, "a", encoding="utf-8") as fh:
                        fh.write(summary)
                except OSError as exc:
                    raise UsageError(
                        f"$GITHUB_STEP_SUMMARY {target}: cannot write ({exc.strerror or exc})"
                    ) from None
            for line in lines:
                sys.stdout.write(line + "\n")
        elif output_format == "junit":
            sys.stdout.write(check_junit(report))
        else:
            _stdout().print(render_check(report))
    if not report.passed:
        raise typer.Exit(1)


@app.command()
def trend(
    files: Files,
    json_out: JsonOpt = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Judge the trend rules (entropy-drop, kl-growth, clip-growth, "
            "zero-variance-growth); exit 1 when one fails.",
        ),
    ] = False,
    rule: Annotated[
        list[str] | None,
        typer.Option(
            "--rule", metavar="RULE.KEY=VALUE", help="Set a trend rule, e.g. kl-growth.fail=50."
        ),
    ] = None,
    plot: PlotOpt = None,
    step_column: Annotated[
        str | None,
        typer.Option(
            "--step-column",
            metavar="NAME",
            help="The files are one dataset; this integer column gives each row's step.",
        ),
    ] = None,
    column: ColumnOpt = None,
    preset: PresetOpt = None,
    trainer: TrainerOpt = None,
    beta: BetaOpt = None,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """Health metrics step by step (one file a step, in step order) and rules over them."""
    from ._check import rule_flags
    from ._trend import TREND_RULES, trend_report

    with _errors():
        settings = _settings(preset=preset, trainer=trainer, beta=beta)
        rules = rule_flags(rule, TREND_RULES) if check or rule else None
        from ._plot import require_plot

        require_plot(plot)
        report = trend_report(
            files,
            settings,
            engine=_engine(workers, engine, ray_address),
            column_map=parse_column_map(column),
            rules=rules if check else None,
            step_column=step_column,
        )
        if plot is not None:
            from ._plot import plot_trend

            plot_trend(report, plot)
        for w in report.warnings:
            _note(w)
        if json_out:
            from ._json import trend_json

            _emit_json(trend_json(report, checked=check))
        else:
            from ._render import render_trend

            _stdout().print(render_trend(report))
    if check and not report.passed:
        raise typer.Exit(1)


@app.command()
def answers(
    files: Files,
    sort: Annotated[
        str,
        typer.Option(
            "--sort",
            metavar="KEY",
            help="Rank by kl (mean KL to the reference), kl-max, ratio (max |log ρ|), "
            "clip (share of clipped tokens), length or advantage (|A|).",
        ),
    ] = "kl",
    top: Annotated[int, typer.Option("--top", help="How many answers to list.")] = 20,
    json_out: JsonOpt = False,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    preset: PresetOpt = None,
    trainer: TrainerOpt = None,
    clip_eps: ClipOpt = None,
    clip_eps_high: ClipHighOpt = None,
    log_ratio_clamp: RatioClampOpt = None,
    ratio_level: RatioLevelOpt = None,
    beta: BetaOpt = None,
    kl_estimator: KLEstOpt = None,
    kl_clamp: KLClampOpt = None,
    kl_mode: KLModeOpt = None,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """The answers to blame, worst first: each one's file, row, group, reward, advantage,
    length, KL, largest log-ratio and share of clipped tokens."""
    from ._answers import answers_report

    with _errors():
        settings = _settings(
            preset=preset,
            trainer=trainer,
            clip_eps=clip_eps,
            clip_eps_high=clip_eps_high,
            log_ratio_clamp=log_ratio_clamp,
            ratio_level=ratio_level,
            beta=beta,
            kl_estimator=kl_estimator,
            kl_clamp=kl_clamp,
            kl_mode=kl_mode,
        )
        src = open_source(files, parse_column_map(column), group_scope=group_scope)
        with _progress(progress, src.n_rows(), "answers") as tick:
            report = answers_report(
                src,
                settings,
                sort=sort,
                top=top,
                engine=_engine(workers, engine, ray_address),
                progress=tick,
            )
        for w in report.warnings:
            _note(w)
        if json_out:
            from ._json import answers_json

            _emit_json(answers_json(report))
        else:
            from ._render import render_answers

            _stdout().print(render_answers(report))


@app.command()
def explain(
    files: Files,
    json_out: JsonOpt = False,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    preset: PresetOpt = None,
    trainer: TrainerOpt = None,
    clip_eps: ClipOpt = None,
    clip_eps_high: ClipHighOpt = None,
    beta: BetaOpt = None,
    kl_estimator: KLEstOpt = None,
    agg: AggOpt = None,
    max_len: MaxLenOpt = None,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """The numbers read as findings, most severe first, each with its evidence and what to
    do. Informational: exit 0 whatever it finds."""
    from ._explain import explain_findings

    with _errors():
        settings = _settings(
            preset=preset,
            trainer=trainer,
            clip_eps=clip_eps,
            clip_eps_high=clip_eps_high,
            beta=beta,
            kl_estimator=kl_estimator,
            agg=agg,
            max_len=max_len,
        )
        src = open_source(files, parse_column_map(column), group_scope=group_scope)
        with _progress(progress, src.n_rows(), "explain") as tick:
            report = objective_report(
                src,
                settings,
                progress=tick,
                engine=_engine(workers, engine, ray_address),
                gradient=True,
            )
        findings = explain_findings(report)
        for w in report.warnings:
            _note(w)
        if json_out:
            from ._json import explain_json

            _emit_json(explain_json(report, findings))
        else:
            from ._render import render_explain

            _stdout().print(render_explain(findings))


@app.command()
def sample(
    out: Annotated[
        Path, typer.Argument(help="Output file, .parquet (streamed, ragged) or .npz (padded).")
    ],
    groups: Annotated[int, typer.Option(help="Number of groups (prompts).")] = 64,
    group_size: Annotated[int, typer.Option(help="Answers per group.")] = 8,
    mean_len: Annotated[int, typer.Option(help="Mean answer length in tokens (log-normal).")] = 200,
    max_len: Annotated[int | None, typer.Option(help="Longest answer (default 8 × mean).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    row_group_rows: Annotated[
        int, typer.Option(help=".parquet: answers per row group (readers parallelise over them).")
    ] = 1 << 14,
    rewards_only: Annotated[
        bool, typer.Option("--rewards-only", help=".npz only: write just rewards (P, G).")
    ] = False,
    extras: Annotated[
        bool,
        typer.Option(
            "--extras", help="Also write rollout_logp (the sampler's log-probs) and entropy."
        ),
    ] = False,
) -> None:
    """Write synthetic GRPO rollouts of any size (for demos, tests and benchmarks)."""
    with _errors():
        if rewards_only and out.suffix.lower() != ".npz":
            raise UsageError("--rewards-only writes .npz files only")
        from ._sample import SampleSpec, write_sample  # only this command needs it

        spec = SampleSpec(
            extras=extras,
            groups=groups,
            group_size=group_size,
            mean_len=mean_len,
            max_len=max_len,
            seed=seed,
            rewards_only=rewards_only,
            row_group_rows=row_group_rows,
        )
        try:
            n, t = write_sample(out, spec)
        except OSError as exc:
            raise UsageError(f"{out}: cannot write ({exc.strerror or exc})") from None
        typer.echo(f"wrote {out}: {n:,} answers, {t:,} tokens", err=True)


def _version(value: bool) -> None:
    if value:
        from ._fast import kernel_name

        with _errors():  # a bad GRPO_CLI_KERNEL is a one-line error here too
            kernel = kernel_name(_engine().backend)
        # the token kernel in use: results differ between kernels in the last digits only
        typer.echo(f"grpo-cli {__version__} (token kernel: {kernel})")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """GRPO loss calculator and diagnostics for logged rollouts."""


def _tune_allocator() -> None:
    """Keep freed memory in glibc's heap instead of returning it to the OS after every batch.

    Streaming allocates and frees the same few MB of temporaries per record batch; with
    glibc's defaults the heap is trimmed (brk) and regrown each time, and the page faults
    cost more system time than the arithmetic. Elsewhere (musl, macOS) this does nothing.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 512 << 20)


def _asked_for(first: list[str], commands: list[Any]) -> list[Any]:
    """The command a run names as its first argument, alone: typer builds the options of
    every registered command at each run (~14 ms of start-up for all of them). Anything
    else (no command, ``--help``, ``--version``, a typo to report) gets them all."""
    chosen = [
        c for c in commands
        if c.callback and first == [c.name or typer.main.get_command_name(c.callback.__name__)]
    ]  # fmt: skip
    return chosen or commands


def main() -> None:
    """Console-script entry point."""
    _tune_allocator()
    # everything imported so far lives as long as the process: keep the garbage collector
    # from traversing it again on every full collection while batches stream
    gc.freeze()
    everything = app.registered_commands
    app.registered_commands = _asked_for(sys.argv[1:2], everything)
    try:
        app()
    except BrokenPipeError:  # `grpo-cli ... | head`
        sys.stderr.close()
        sys.exit(0)
    finally:
        app.registered_commands = everything
