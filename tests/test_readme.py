"""The README's two set-up commands stay true: CI runs the second one verbatim."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_starts_with_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("# grpo-cli\n\n```bash\n")
    cmds = _setup_commands()
    assert len(cmds) == 2
    assert cmds[0].endswith("grpo-cli objective sample_data/batch.parquet")
    assert (ROOT / "sample_data" / "batch.parquet").is_file()


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _setup_commands()[1] in ci
