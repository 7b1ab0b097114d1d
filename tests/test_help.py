"""``--help`` reads like the anchors' (ruff, typer's docs): each command's summary whole in
the command list at any width, ``FILES...`` in the usage line, choices listed (never a
bare type like ``<str>``), an Examples block per command whose options exist, numbers that
agree with the docs (docs/scale.md); and typer >= 0.29 never imports pydantic on a run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from typer.testing import CliRunner

from grpo_cli.cli import app

from .conftest import SAMPLE

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]


def help_of(*args: str, width: int = 80) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.stderr
    out: str = r.stdout
    return out


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_command_list_gives_every_summary_whole(width: int) -> None:
    text = help_of(width=width)
    listed = text.split("Commands:")[1]
    assert "…" not in listed and "..." not in listed
    for c in app.registered_commands:
        assert c.short_help and " ".join(c.short_help.split()) in " ".join(listed.split())
    assert set(COMMANDS) >= {"objective", "check", "report", "trend", "explain"}


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_help(command: str) -> None:
    text = help_of(command)
    usage = text.splitlines()[0]
    if command == "losses":  # reads the registry, no file
        assert usage == f"Usage: grpo-cli {command} [OPTIONS]"
    elif command != "sample":
        assert usage == f"Usage: grpo-cli {command} [OPTIONS] FILES..."
    assert not re.search(r"<(str|int|float|path|int range)>|\{files\}", text), text
    examples = text.split("Examples:")[1].strip().splitlines()
    assert len(examples) >= 2
    params = {o for p in _params(command) for o in p.opts + p.secondary_opts}
    for line in examples:
        words = line.split()
        assert words[:2] == ["grpo-cli", command]
        for w in words[2:]:
            if w.startswith("-"):
                assert w.split("=")[0] in params, (line, w)


def _params(command: str) -> list[Any]:
    import typer.main

    group = typer.main.get_command(app)
    return list(group.commands[command].params)  # type: ignore[attr-defined]


def test_choices_are_the_values_accepted() -> None:
    from grpo_cli.cli.app import CHECK_FORMATS
    from grpo_cli.commands.answers import SORT_KEYS
    from grpo_cli.core import AGGREGATIONS, KLEstimator, RatioLevel, Scale
    from grpo_cli.trainers.presets import PRESETS

    def metavar(command: str, name: str) -> str:
        p = next(p for p in _params(command) if name in p.opts)
        return str(p.metavar)

    assert metavar("answers", "--sort") == "[" + "|".join(SORT_KEYS) + "]"
    assert metavar("check", "--format") == "[" + "|".join(CHECK_FORMATS) + "]"
    assert metavar("objective", "--kl-estimator") == "[" + "|".join(get_args(KLEstimator)) + "]"
    assert metavar("objective", "--scale") == "[" + "|".join(get_args(Scale)) + "]"
    assert metavar("objective", "--ratio-level") == "[" + "|".join(get_args(RatioLevel)) + "]"
    # click wraps help at hyphens: "seq-mean-token-" / "mean"
    text = " ".join(help_of("objective", width=200).split()).replace("- ", "-")
    for a in AGGREGATIONS:
        assert a in text.split("--agg AGG")[1].split("--max-len")[0]
    for p in PRESETS:
        assert p in text.split("--preset PRESET")[1].split("--trainer")[0]
    from grpo_cli.io import FIELDS

    column = text.split("--column FIELD=NAME")[1].split("--group-scope")[0]
    assert all(f in column for f in FIELDS)


def test_numbers_agree_with_the_docs() -> None:
    text = " ".join(help_of("objective", width=200).split())
    workers = text.split("--workers N")[1].split("--engine")[0]
    page = " ".join((ROOT / "docs" / "scale.md").read_text().split())
    tuning = page.split("Results depend on the worker count")[1][:400]
    for figure in ("1e-15", "1e-12"):
        assert figure in workers and figure in tuning
    assert "1e-13 level" not in page


def test_no_pydantic_on_a_run() -> None:
    """typer 0.29 converts options through pydantic; grpo-cli's plain options do not."""
    code = (
        "import sys\n"
        "from grpo_cli.cli import app\n"
        f"sys.argv = ['grpo-cli', 'objective', {str(SAMPLE / 'batch.parquet')!r}, '--json',\n"
        "            '--workers', '2', '--clip-eps', '0.2', '-c', 'logp=logp', '--no-progress']\n"
        "try:\n"
        "    app()\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, file=sys.stderr)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert '"objective"' in r.stdout, r.stderr
    assert r.stderr.strip().splitlines()[-2:] == ["exit 0", "[]"], r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "abc"], "--workers"),
        (["--workers", "0"], "--workers"),
        (["--clip-eps", "x"], "--clip-eps"),
        (["--max-len", "1.5"], "--max-len"),
    ],
)
def test_bad_values_are_one_line(args: list[str], message: str) -> None:
    r = CliRunner().invoke(app, ["objective", str(SAMPLE / "batch.parquet"), *args])
    assert r.exit_code == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("grpo-cli: error: Invalid value for ") and message in line
