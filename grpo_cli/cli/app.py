"""The ``grpo-cli`` command line: parse options, call the library, render. Nothing more.

Every :class:`~grpo_cli.errors.GrpoCliError` becomes one line on stderr and exit code 2
(``check`` failures are exit code 1); stdout carries only tables or one JSON document.
Options are defined once in :mod:`grpo_cli.cli.options`.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from .._version import __version__
from ..commands.objective import advantages_report, kl_report, objective_report
from ..env import engine_options, github_step_summary
from ..errors import GrpoCliError, UsageError
from ..io import open_source, parse_column_map, write_advantages
from ..views.json import (
    advantages_json,
    answers_json,
    dumps,
    explain_json,
    kl_json,
    objective_json,
    trend_json,
)
from .options import (
    ADVANTAGE_CONVENTIONS,
    CHECK_FORMATS,
    BaselineOpt,
    CheckFormatOpt,
    CheckRuleOpt,
    ColumnOpt,
    ConfigOpt,
    Conventions,
    EngineOpt,
    Files,
    FullOpt,
    GroupScopeOpt,
    JsonOpt,
    LastOpt,
    LoggedOpt,
    LoggedStepOpt,
    LoggedTolOpt,
    OnPolicyOpt,
    PlotOpt,
    ProgressOpt,
    RayAddressOpt,
    ReportHtmlOpt,
    ReportOpt,
    RequireOpt,
    StepsOpt,
    WorkersOpt,
    conventions,
    plain_coercion,
)
from .progress import progress_bar, steps_bar
from .runs import check_a_run, last_step, report_run, run_html, run_root, step_explorer, write_page

if TYPE_CHECKING:
    from rich.console import Console

    from ..engine.options import EngineOptions
    from ..io import Source
    from ..io.run import RecordedRun
    from ..logged import LoggedInput
    from ..records import AnswersReport, ObjectiveReport
    from ..settings import Settings

try:  # typer >= 0.24 vendors click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover
    from click.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
        ClickException,
        NoArgsIsHelpError,
    )

__all__ = ["app", "main"]


class _Command(TyperCommand):
    """A command whose plain options are converted without pydantic (typer >= 0.29)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return plain_coercion(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """``FILES...`` in the usage line, as ruff and click write it (typer: ``{files}``,
        or ``{FILES...}...``)."""
        return [_braced(p) for p in super().collect_usage_pieces(ctx)]

    def get_help(self, ctx: Any) -> str:
        """The help under either typer: ``FILES...`` and ``OUT`` in the usage line, and
        without the Python type typer 0.29 adds to an argument (``FILES... <list[str]>``)."""
        text = _braced(super().get_help(ctx))
        return _TYPED.sub(lambda m: m.group(1).ljust(len(m.group())), text)


_BRACED = re.compile(r"\{([A-Z]+)((?:\.\.\.)?)\}((?:\.\.\.)?)")
_TYPED = re.compile(r"(?m)^(  [A-Z]+(?:\.\.\.)?) <[\w\[\], ]+>")


def _braced(text: str) -> str:
    return _BRACED.sub(lambda m: m.group(1) + ("..." if m.group(2) or m.group(3) else ""), text)


class _OneLineErrors(TyperGroup):
    """Usage errors (an unknown option, a missing argument, a value of the wrong type) as
    the one line every other error is: ``grpo-cli: error: …`` on stderr, exit code 2."""

    def get_params(self, ctx: Any) -> list[Any]:
        return plain_coercion(super().get_params(ctx))

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
        from ..engine.ray import close  # the Ray session this run opened, if any

        close()


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
    """A note on stderr: one line for a log or a pipe; in a terminal, wrapped at its width
    between words, the continuation lines indented."""
    line = f"grpo-cli: note: {text}"
    if sys.stderr.isatty():
        import shutil
        import textwrap

        width = shutil.get_terminal_size((80, 24)).columns
        if len(line) > width:
            line = textwrap.fill(line, width=max(width - 1, 40), subsequent_indent="  ",
                                 break_on_hyphens=False)  # fmt: skip
    typer.echo(line, err=True)


def _plot_thresholds() -> dict[str, tuple[float | None, float | None]]:
    """check's default thresholds (warn, fail) by the metric the figures plot."""
    from ..check.rules import RULES

    rules = {
        "kl_max": "kl-max",
        "kl_mean": "kl-mean",
        "clip_fraction_region": "clip-region",
        "frac_zero_variance_groups": "zero-std-groups",
        "rollout_kl_k3": "rollout-mismatch",
    }
    return {k: (RULES[v][1].warn, RULES[v][1].fail) for k, v in rules.items()}


def _logged(
    path: Path | None, step: int | None, tolerance: float, src: Source
) -> LoggedInput | None:
    """What ``--logged`` names: the step's metrics as the trainer logged them; for a
    recorded step without ``--logged``, its record in the run's ``metrics.jsonl``."""
    from ..logged import LoggedInput, load_logged, recorded_metrics

    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise UsageError(f"--logged-tolerance: must be a finite number >= 0, got {tolerance}")
    if path is None:
        return None if src.recorded is None else recorded_metrics(src.recorded, tolerance)
    metrics, got, notes = load_logged(path, step)
    return LoggedInput(str(path), metrics, got, tolerance, tuple(notes))


def _recorded_run(specs: Sequence[str]) -> RecordedRun | None:
    """The recorded run ``trend``'s inputs are steps of (a run's directory, or step
    directories of one run): its settings apply; None for other inputs."""
    from ..io.run import find_run, recorded_step

    for spec in specs:
        if "://" in spec or not Path(spec).is_dir():
            continue
        run = find_run(Path(spec))
        step = recorded_step(Path(spec)) if run is None else None
        if run is not None or step is not None:
            return run if run is not None else step.run  # type: ignore[union-attr]
    from ..io.readers import run_of  # a dump naming its trainer's options (slime's args.json)

    for spec in specs:
        if "://" not in spec and Path(spec).exists():
            found = run_of(Path(spec))
            if found is not None:
                return found
    return None


# ----------------------------------------------------------------------- commands
Tick = Callable[[int], None] | None


class _Report(Protocol):
    @property
    def warnings(self) -> list[str]: ...


R = TypeVar("R", bound=_Report)


@dataclass(frozen=True)
class _Input:
    """What a command that reads rollouts is given: the files and how to read them
    (``--column``, ``--group-scope``), the conventions, the progress bar and the engine."""

    files: list[str]
    column: list[str] | None
    group_scope: str
    conventions: Conventions
    progress: bool = True
    workers: int | None = None
    engine: str = "local"
    ray_address: str | None = None

    def open(self) -> tuple[Source, Settings]:
        """The source and its settings (the flags', or its recorded run's with the flags)."""
        src = open_source(self.files, parse_column_map(self.column), group_scope=self.group_scope)
        settings, src = self.conventions.for_source(src)
        return src, settings

    def engine_options(self) -> EngineOptions:
        return engine_options(self.workers, self.engine, self.ray_address)

    def run(self, what: str, compute: Callable[[Source, Settings, Tick], R]) -> R:
        """Open the source and ``compute`` its report, with a progress bar named ``what``."""
        src, settings = self.open()
        with progress_bar(self.progress, src.n_rows() if self.progress else None, what) as tick:
            return compute(src, settings, tick)


def _tables() -> Any:
    """The table views, imported when a table is printed (``--json`` runs start without
    rich)."""
    from ..views import tables

    return tables


def _notes(texts: Sequence[str]) -> None:
    for text in texts:
        _note(text)


def _view(
    report: R,
    json_out: bool,
    json_view: Callable[[R], dict[str, Any]],
    table_view: Callable[[R], Any],
) -> None:
    """The report on stdout: its JSON document (``--json``) or its tables."""
    if json_out:
        _emit_json(json_view(report))
    else:
        _stdout().print(table_view(report))


def _report_command(
    what: str,
    inp: _Input,
    compute: Callable[[Source, Settings, Tick], R],
    json_out: bool,
    json_view: Callable[[R], dict[str, Any]],
    table_view: Callable[[R], Any],
    *,
    then: Callable[[R], None] | None = None,
) -> R:
    """The body of a command that reads rollouts: open the source, resolve its settings,
    ``compute`` the report (a progress bar named ``what`` on a terminal), ``then`` (the
    figures), the report's notes on stderr, its JSON or its tables on stdout."""
    report = inp.run(what, compute)
    if then is not None:
        then(report)
    _notes(report.warnings)
    _view(report, json_out, json_view, table_view)
    return report


def _plot(path: Path | None, which: str, report: Any) -> None:
    """``--plot PATH``: the report's figures (``objective``'s or ``trend``'s), and where."""
    if path is None:
        return
    from ..views import plot as figures

    draw = figures.plot_trend if which == "trend" else figures.plot_objective
    draw(report, path, _plot_thresholds())
    typer.echo(f"wrote {path}", err=True)


def _examples(*lines: str) -> str:
    """An Examples block for a command's help, kept as written (click's \\b)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def _command(short: str, *examples: str) -> Any:
    """A command with its one-line summary (the command list shows it whole) and its
    Examples block."""
    return app.command(cls=_Command, short_help=short, epilog=_examples(*examples))


@_command(
    "Group-relative advantages from rewards and group ids.",
    "grpo-cli advantages sample_data/rewards.npz",
    "grpo-cli advantages logs/step_300.parquet --preset verl --max-groups 5",
    "grpo-cli advantages run.parquet --estimator rloo --out advantages.parquet",
)
@conventions(ADVANTAGE_CONVENTIONS)
def advantages(
    files: Files,
    conventions: Conventions,
    json_out: JsonOpt = False,
    out: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Write the advantages to this .npz or .parquet file."),
    ] = None,
    max_groups: Annotated[int, typer.Option(metavar="N", help="Groups shown in the table.")] = 20,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """Group-relative advantages from rewards and group ids, with per-group statistics."""
    inp = _Input(files, column, group_scope, conventions, False, None, engine, ray_address)
    with _errors():
        if out is not None and out.suffix.lower() not in (".npz", ".parquet", ".pq"):
            raise UsageError(f"--out {out}: the file must end in .npz or .parquet")
        report = inp.run(
            "advantages", lambda src, s, _: advantages_report(src, s, engine=inp.engine_options())
        )
        _notes(report.warnings)  # then the file, then the view
        if out is not None:
            adv = report.advantages.reshape(report.shape) if report.shape else report.advantages
            write_advantages(out, adv, [report.labels[c] for c in report.codes.tolist()])
        _view(report, json_out, advantages_json,
              lambda r: _tables().render_advantages(r, max_groups=max_groups))  # fmt: skip


@_command(
    "Per-token KL estimate: statistics, quantiles, per-answer means.",
    "grpo-cli kl sample_data/batch.parquet",
    "grpo-cli kl logs/ --kl-estimator k1 --json",
)
@conventions()
def kl(
    files: Files,
    conventions: Conventions,
    json_out: JsonOpt = False,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """KL(π_θ ‖ π_ref) estimate per token: statistics, quantiles, per-answer distribution."""
    inp = _Input(files, column, group_scope, conventions, progress, workers, engine, ray_address)
    with _errors():
        _report_command(
            "kl",
            inp,
            lambda src, s, tick: kl_report(src, s, progress=tick, engine=inp.engine_options()),
            json_out,
            kl_json,
            lambda r: _tables().render_kl(r),
        )


@_command(
    "Objective J, loss −J, its parts, clipping, ratio and KL.",
    "grpo-cli objective sample_data/batch.parquet",
    "grpo-cli objective logs/step_300.parquet --preset verl --full",
    "grpo-cli objective runs/x/step_12 --logged metrics.jsonl",
    "grpo-cli objective run.parquet --compare --gradient --plot objective.png",
)
@conventions()
def objective(
    files: Files,
    conventions: Conventions,
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
    full: FullOpt = False,
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
    logged: LoggedOpt = None,
    logged_step: LoggedStepOpt = None,
    logged_tolerance: LoggedTolOpt = 1e-3,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """GRPO objective J, loss −J, its policy and KL parts, clip fractions, ratio and KL stats."""
    inp = _Input(files, column, group_scope, conventions, progress, workers, engine, ray_address)

    def compute(src: Source, settings: Settings, tick: Tick) -> ObjectiveReport:
        return objective_report(
            src,
            settings,
            progress=tick,
            recompute_advantages=recompute_advantages,
            engine=inp.engine_options(),
            gradient=gradient,
            logged=_logged(logged, logged_step, logged_tolerance, src),
        )

    def table(r: ObjectiveReport) -> Any:
        from ..commands.explain import explain_findings

        return _tables().render_objective(r, explain_findings(r), full=full, compare=compare)

    with _errors():
        from ..views.plot import require_plot

        require_plot(plot)
        one, said = last_step(files)
        _notes(said)
        inp = replace(inp, files=one)
        _report_command("objective", inp, compute, json_out, objective_json, table,
                        then=lambda r: _plot(plot, "objective", r))  # fmt: skip


@_command(
    "CI gate: integrity and health rules; exit 1 when one fails.",
    "grpo-cli check sample_data/batch.parquet",
    "grpo-cli check logs/ --format github --report check.json",
    "grpo-cli check run.parquet --baseline last/check.json --rule kl-mean.fail=0.5",
    "grpo-cli check run.parquet --report-html check.html",
)
@conventions()
def check(
    files: Files,
    conventions: Conventions,
    config: ConfigOpt = None,
    output_format: CheckFormatOpt = "table",
    baseline: BaselineOpt = None,
    report_path: ReportOpt = None,
    rule: CheckRuleOpt = None,
    on_policy: OnPolicyOpt = False,
    report_html: ReportHtmlOpt = None,
    require: RequireOpt = None,
    full: FullOpt = False,
    last: LastOpt = None,
    steps: StepsOpt = None,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    logged: LoggedOpt = None,
    logged_step: LoggedStepOpt = None,
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """Gate a rollout log in CI: integrity and training-health rules; exit 1 when one fails.
    A recorded run (its directory) is checked step by step: one verdict, the first failing
    step."""
    from ..check.baseline import read_baseline
    from ..check.config import load_config
    from ..commands.check import run_check
    from .outputs import write_outputs

    inp = _Input(files, column, group_scope, conventions, progress, workers, engine, ray_address)
    with _errors():
        if output_format not in CHECK_FORMATS:
            raise UsageError(
                f"--format: {output_format!r} is not one of {', '.join(CHECK_FORMATS)}"
            )
        cfg = load_config(config, rule, on_policy, require=require)
        base = None if baseline is None else read_baseline(baseline)
        html_path = report_html
        if output_format == "html" and html_path is None:
            html_path = Path("grpo-cli-report.html")
        run = run_root(files)
        if run is not None or last is not None or steps is not None:
            settings, notes = inp.conventions.for_run(run)
            report, notes = check_a_run(run, settings, cfg, last, steps, inp.engine_options(),
                                        inp.progress, base is not None, notes)  # fmt: skip
            _notes(notes)
            if html_path is not None:
                _write_run_html(run, settings, inp.engine_options(), html_path, report)
        else:
            src, settings = inp.open()  # the sources and settings the HTML report reads too
            logged_in = _logged(logged, logged_step, 0.0, src)
            with progress_bar(progress, src.n_rows(), "check") as tick:
                report = run_check(src, settings, cfg, baseline=base, progress=tick,
                                   engine=inp.engine_options(), logged=logged_in)  # fmt: skip
            if html_path is not None:
                _write_html(files, src, settings, inp.engine_options(), html_path, check=report)
        fmt = "table" if output_format == "html" else output_format
        out = write_outputs(report, fmt, report_path, github_step_summary())
        if out is None:
            _stdout().print(_tables().render_check(report, full=full))
        else:
            sys.stdout.write(out)
    if not report.passed:
        raise typer.Exit(1)


def _write_run_html(
    run: RecordedRun | None, settings: Any, engine: Any, path: Path, check: Any
) -> None:
    """``check RUN --report-html``: the run's page of the steps checked."""
    assert run is not None
    text, notes = run_html(run, settings, engine, check, False)
    _notes(notes)
    write_page(path, text)


def _write_html(
    specs: Sequence[str],
    src: Source,
    settings: Any,
    engine: Any,
    path: Path,
    *,
    top: int = 10,
    check: Any = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Build the report to share and write it to ``path`` (one HTML file); say where."""
    from ..commands.share import share_report
    from ..views.html import render_html

    share = share_report(specs, src, settings, engine=engine, top=top, check=check,
                         progress=progress)  # fmt: skip
    write_page(
        path, render_html(share, _plot_thresholds(), step_explorer(specs, share, settings, engine))
    )


@_command(
    "A report to share: one self-contained HTML file (summary, findings, check, answers).",
    "grpo-cli report sample_data/batch.parquet --html report.html",
    "grpo-cli report logs/step_*.parquet --preset verl --html steps.html",
    "grpo-cli report runs/x/step_12 --html step12.html --top 20",
    "grpo-cli report runs/x --html run.html",
)
@conventions()
def report(
    files: Files,
    conventions: Conventions,
    html: Annotated[
        Path,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Where to write the report (one file: inline CSS, SVG and script, no network).",
        ),
    ] = Path("grpo-cli-report.html"),
    top: Annotated[
        int, typer.Option("--top", metavar="N", help="Worst answers listed (with their text).")
    ] = 10,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """One self-contained HTML file to share: the one-screen summary, explain's findings,
    check's verdict, the distributions, the trend when the input is several steps, the
    worst answers with their text and tokens, and the step's groups with their token layers.
    A recorded run's directory gives the run's page: check RUN's trend, a step picker, the
    groups, token layers and counterfactuals of each step (docs/run.md)."""
    inp = _Input(files, column, group_scope, conventions, progress, workers, engine, ray_address)
    with _errors():
        if top < 1:
            raise UsageError(f"--top: expected a positive number of answers, got {top}")
        if (run := run_root(files)) is not None:  # a recorded run: check RUN, its page
            text, notes = report_run(run, *conventions.for_run(run), inp.engine_options(), progress)
            _notes(notes)
            return write_page(html, text)
        src, settings = inp.open()
        _notes(src.notes)
        eng = inp.engine_options()
        with progress_bar(progress, src.n_rows(), "report") as tick:
            _write_html(files, src, settings, eng, html, top=top, progress=tick)


@_command(
    "Health metrics step by step, and rules over the steps.",
    "grpo-cli trend logs/step_*.parquet",
    "grpo-cli trend runs/x --check --plot trend.png",
    "grpo-cli trend all_steps.parquet --step-column step --json",
)
@conventions()
def trend(
    files: Files,
    conventions: Conventions,
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
    full: FullOpt = False,
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
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """Health metrics step by step (one file a step, in step order) and rules over them."""
    from ..check.config import rule_flags
    from ..commands.trend import TREND_RULES, trend_report

    with _errors():
        settings, notes = conventions.for_run(_recorded_run(files))
        rules = rule_flags(rule, TREND_RULES) if check or rule else None
        from ..views.plot import require_plot

        require_plot(plot)
        with steps_bar(progress) as on_step:
            report = trend_report(
                files,
                settings,
                engine=engine_options(workers, engine, ray_address),
                column_map=parse_column_map(column),
                rules=rules if check else None,
                step_column=step_column,
                notes=notes,
                on_step=on_step,
            )
        _plot(plot, "trend", report)
        _notes(report.warnings)
        _view(report, json_out, lambda r: trend_json(r, checked=check),
              lambda r: _tables().render_trend(r, full=full))  # fmt: skip
    if check and not report.passed:
        raise typer.Exit(1)


@_command(
    "The answers to blame, worst first (by KL, ratio, clipping, |A|).",
    "grpo-cli answers sample_data/batch.parquet --top 5",
    "grpo-cli answers logs/ --sort ratio --json",
    "grpo-cli answers run.parquet --sort gradient --preset gspo",
)
@conventions()
def answers(
    files: Files,
    conventions: Conventions,
    sort: Annotated[
        str,
        typer.Option(
            "--sort",
            metavar="[kl|kl-max|ratio|clip|length|advantage|gradient|rollout]",
            help="Rank by kl (mean KL to the reference), kl-max (its largest token), ratio "
            "(max |log ρ|), clip (share of clipped tokens), length, advantage (|A|), gradient "
            "(share of ‖∂J/∂logp‖², one more pass) or rollout (sampler vs trainer KL).",
        ),
    ] = "kl",
    top: Annotated[int, typer.Option("--top", metavar="N", help="How many answers to list.")] = 20,
    json_out: JsonOpt = False,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """The answers to blame, worst first: each one's file, row, group, reward, advantage,
    length, KL, largest log-ratio and share of clipped tokens."""
    from ..commands.answers import answers_report

    inp = _Input(files, column, group_scope, conventions, progress, workers, engine, ray_address)

    def compute(src: Source, settings: Settings, tick: Tick) -> AnswersReport:  # one pass
        return answers_report(src, settings, sort=sort, top=top,
                              engine=inp.engine_options(), progress=tick)  # fmt: skip

    with _errors():
        _report_command("answers", inp, compute, json_out, answers_json,
                        lambda r: _tables().render_answers(r))  # fmt: skip


@_command(
    "The numbers read as findings, with what to do.",
    "grpo-cli explain sample_data/batch.parquet",
    "grpo-cli explain logs/step_300.parquet --preset verl --full",
)
@conventions()
def explain(
    files: Files,
    conventions: Conventions,
    json_out: JsonOpt = False,
    full: FullOpt = False,
    column: ColumnOpt = None,
    group_scope: GroupScopeOpt = "dataset",
    progress: ProgressOpt = True,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
) -> None:
    """The numbers read as findings, most severe first, each with its evidence and what to
    do. Informational: exit 0 whatever it finds."""
    from ..commands.explain import explain_findings

    inp = _Input(files, column, group_scope, conventions, progress, workers, engine, ray_address)

    def compute(src: Source, settings: Settings, tick: Tick) -> ObjectiveReport:
        # a recorded step's own metrics.jsonl: a logged difference is a finding, with its cause
        return objective_report(src, settings, progress=tick, engine=inp.engine_options(),
                                gradient=True, logged=_logged(None, None, 1e-3, src),
                                where=True)  # fmt: skip

    with _errors():
        _report_command(
            "explain",
            inp,
            compute,
            json_out,
            lambda r: explain_json(r, explain_findings(r)),
            lambda r: _tables().render_explain(r, explain_findings(r), full=full),
        )


@_command(
    "The trainers' own losses, corrections and masks, with their parameters.",
    "grpo-cli losses",
    "grpo-cli losses --trainer verl --json",
)
def losses(
    trainer: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="Only this trainer's rows (and the clipped surrogate)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """List the loss registry: every loss (--loss), correction (--correction) and policy-term
    mask with its parameters under the trainer's config names (--loss-param,
    --correction-param) and their defaults, the aggregation it forces, and the metrics its
    trainer logs (--json: each parameter's kind and help, each metric's unit and definition)."""
    with _errors():
        from ..commands.losses import registry_entries
        from ..views.json import losses_json

        entries = registry_entries(trainer)
        if json_out:
            typer.echo(dumps(losses_json(entries)))
        else:
            _stdout().print(_tables().render_losses(entries))


@_command(
    "Synthetic rollouts of any size (demos, tests, benchmarks).",
    "grpo-cli sample demo.parquet --groups 16 --extras",
    "grpo-cli sample big.parquet --groups 6400 --mean-len 1367 --max-len 8192",
)
def sample(
    out: Annotated[
        Path,
        typer.Argument(
            metavar="OUT", help="Output file, .parquet (streamed, ragged) or .npz (padded)."
        ),
    ],
    groups: Annotated[int, typer.Option(metavar="N", help="Number of groups (prompts).")] = 64,
    group_size: Annotated[int, typer.Option(metavar="G", help="Answers per group.")] = 8,
    mean_len: Annotated[
        int, typer.Option(metavar="L", help="Mean answer length in tokens (log-normal).")
    ] = 200,
    max_len: Annotated[
        int | None, typer.Option(metavar="L", help="Longest answer (default 8 × mean).")
    ] = None,
    seed: Annotated[int, typer.Option(metavar="N", help="Random seed.")] = 0,
    row_group_rows: Annotated[
        int,
        typer.Option(
            metavar="N", help=".parquet: answers per row group (readers parallelise over them)."
        ),
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
        from ..commands.sample import SampleSpec, write_sample

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
        from ..core.kernel import kernel_name

        with _errors():  # a bad GRPO_CLI_KERNEL is a one-line error here too
            kernel = kernel_name(engine_options().backend)
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
