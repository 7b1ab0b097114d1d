"""A recorded run's directory given to a command of one step or of the whole run:
``check RUN`` (every complete step, one verdict) and ``objective RUN`` (its last step)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..engine.options import EngineOptions
from ..errors import InputError, UsageError
from ..io.run import RecordedRun, find_run
from ..records import CheckReport
from ..settings import Settings
from .progress import steps_bar

__all__ = [
    "check_a_run",
    "last_step",
    "report_run",
    "run_html",
    "run_root",
    "step_explorer",
    "write_page",
]


def run_root(files: Sequence[str]) -> RecordedRun | None:
    """The recorded run the one input is (its own directory, with ``meta.json``), or None."""
    if len(files) != 1 or "://" in files[0] or not Path(files[0]).is_dir():
        return None
    return find_run(Path(files[0]))


def last_step(files: list[str]) -> tuple[list[str], list[str]]:
    """``objective RUN``: the run's last complete step and a note saying so; other inputs
    as they are, no note."""
    run = run_root(files)
    if run is None:
        return files, []
    from ..commands.trend import run_steps  # only for a run: a file's --json stays light

    ok = run_steps(run, files[0])[0]
    if not ok:
        raise InputError(f"{files[0]}: a recorded run with no step folder (step_N)")
    note = (
        f"{files[0]} is a recorded run of {len(ok)} complete step(s): objective gives its "
        f"last, {ok[-1].directory} (check or trend: every step)"
    )
    return [str(ok[-1].directory)], [note]


def check_a_run(
    run: RecordedRun | None,
    settings: Settings,
    cfg: Any,
    last: int | None,
    steps: str | None,
    engine: EngineOptions,
    progress: bool,
    baseline: bool,
    notes: list[str],
) -> tuple[CheckReport, list[str]]:
    """``check RUN``: every complete step (``--last``, ``--steps``) with a steps bar, one
    verdict; the report and the notes (``notes``, the run's settings', first)."""
    from ..commands.check_run import check_run, parse_span

    if run is None:
        raise UsageError("--last and --steps take a recorded run's directory (with meta.json)")
    if baseline:
        raise UsageError("--baseline compares one step's report: give one step of the run")
    span = parse_span(steps)
    with steps_bar(progress) as on_step:
        report, more = check_run(
            run, settings, cfg, last=last, span=span, engine=engine, on_step=on_step
        )
    return report, [*notes, *more]


def write_page(path: Path, text: str) -> None:
    """Write an HTML page and say where (one line on stderr)."""
    import typer

    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None
    typer.echo(f"wrote {path} ({len(text.encode()) / 1024:,.0f} KiB)", err=True)


def run_html(
    run: RecordedRun, settings: Settings, engine: EngineOptions, check: CheckReport,
    progress: bool, config: dict[str, Any] | None = None,
) -> tuple[str, list[str]]:  # fmt: skip
    """The page of a run (``report RUN --html``, ``check RUN --report-html``) for the
    steps ``check`` judged, and its notes."""
    from ..commands.run_page import run_page
    from ..views.html import CSS
    from ..views.run_html import render_run_html

    assert check.run is not None
    specs = [(v.step, str(run.root / v.name)) for v in check.run.steps]
    with steps_bar(progress) as on_step:
        page = run_page(specs, settings, engine=engine, check=check, title=str(run.root),
                        config=config if config is not None else run.config,
                        on_step=on_step)  # fmt: skip
    return render_run_html(page, CSS), page["notes"]


def report_run(
    run: RecordedRun, settings: Settings, notes: list[str], engine: EngineOptions,
    progress: bool,
) -> tuple[str, list[str]]:  # fmt: skip
    """``report RUN --html``: ``check RUN`` (every complete step, its default rules), then
    the run's page; the page and the notes."""
    from ..check.config import load_config

    report, notes = check_a_run(run, settings, load_config(None), None, None, engine,
                                progress, False, notes)  # fmt: skip
    text, more = run_html(run, settings, engine, report, progress)
    return text, [*notes, *(n for n in more if n not in notes)]


def step_explorer(
    specs: Sequence[str], share: Any, settings: Settings, engine: EngineOptions
) -> str:
    """``report STEP --html``: the step's group and token explorer (the run page's, for
    one step), or '' when the input is several steps or has no per-token log-probs."""
    from ..commands.run_page import run_page
    from ..views.run_html import explorer

    if len(specs) != 1 or share.answers is None or share.trend is not None:
        return ""
    spec = specs[0]
    run = None if "://" in spec or not Path(spec).is_dir() else find_run(Path(spec).parent)
    page = run_page([(None, spec)], settings, engine=engine, title=share.source,
                    config=None if run is None else run.config)  # fmt: skip
    return explorer(page)
