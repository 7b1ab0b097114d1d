"""Regenerate the example outputs of README.md and of the docs pages: what the commands
print at 80 columns.

    python docs/readme_outputs.py          # rewrite every example block
    python docs/readme_outputs.py --check  # exit 1 when a block is not what the command prints

Each example in README.md or a page under docs/ is a line ``<!-- output: NAME -->``
followed by a fenced block; :data:`EXAMPLES` says which command prints it (run
in-process, stdout only, trailing spaces removed). ``tests/test_views.py`` keeps them in
step, and every example is shown on some page.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


WIDTH = 80

# name: (the command as README shows it, whether it runs in the three-step directory)
EXAMPLES: dict[str, tuple[str, bool]] = {
    "commands": ("grpo-cli --help", False),
    "objective": ("grpo-cli objective sample_data/batch.parquet", False),
    "check": ("grpo-cli check sample_data/broken/kl_spike.parquet", False),
    "explain": ("grpo-cli explain sample_data/batch.parquet", False),
    "answers": ("grpo-cli answers sample_data/batch.parquet --top 3", False),
    "trend": ("grpo-cli trend logs/step_*.parquet", True),
}
# the three steps of the trend example, as README says they were written
STEPS = [
    f"grpo-cli sample logs/step_{s}.parquet --groups 16 --seed {s} --extras"
    for s in (100, 200, 300)
]


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _run(command: str) -> str:
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    args = command.split()[1:]
    r = CliRunner().invoke(app, args, env={"COLUMNS": str(WIDTH), "LINES": "24"})
    if r.exit_code not in (0, 1):
        raise RuntimeError(f"{command}: exit {r.exit_code}: {r.stderr}")
    return "\n".join(line.rstrip() for line in r.stdout.rstrip("\n").splitlines())


def outputs() -> dict[str, str]:
    """Every example's output, as the commands print it now."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as d:
        steps = Path(d)
        (steps / "logs").mkdir()
        with _cwd(steps):
            for cmd in STEPS:
                _run(cmd)
        for name, (cmd, in_steps) in EXAMPLES.items():
            with _cwd(steps if in_steps else ROOT):
                out[name] = _run(cmd)
    return out


# the marker, the opening fence, the body (empty, or lines ending in a newline), the fence
BLOCK = re.compile(
    r"(<!-- output: (?P<name>[\w-]+) -->\n```[^\n]*\n)(?P<body>(?:.*?\n)??)(```)", re.S
)


def update(text: str, new: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with every example block replaced by ``new``; the names that changed."""
    changed: list[str] = []

    def put(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in new:
            raise KeyError(f"no example named {name!r} in docs/readme_outputs.py")
        body = new[name] + "\n"
        if m.group("body") != body:
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(put, text), changed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only say whether they are current")
    args = ap.parse_args()
    new = outputs()
    stale = 0
    for page in pages():
        text = page.read_text()
        new_text, changed = update(text, new)
        if not changed:
            continue
        where = page.relative_to(ROOT)
        if args.check:
            print(f"{where}: examples out of date: {', '.join(changed)}", file=sys.stderr)
            stale += 1
        else:
            page.write_text(new_text)
            print(f"{where}: {len(changed)} example(s) rewritten: {', '.join(changed)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
