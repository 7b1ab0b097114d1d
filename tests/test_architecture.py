"""The house's rules, measured on the code: imports run one way, files and functions stay
readable, a loss lives in its trainer's files.

The import graph counts every import the code names — module level, inside functions and
under ``TYPE_CHECKING`` — between the files of ``grpo_cli/`` (a file is a node), and
between its rooms (a top-level module or a top-level folder is a node, as the folder's
files are one part of the house).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "grpo_cli"
MAX_LINES = 1000
MAX_FUNCTION = 80
MAX_FLOORS = 15


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module(p): p for p in _files()}


def _imported(path: Path) -> Iterator[str]:
    """Every module of the package ``path`` imports, by absolute name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    mods = _modules()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("grpo_cli"):
                    yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if not name.startswith("grpo_cli"):
                continue
            for a in node.names:  # ``from pkg import submodule`` imports the submodule
                sub = f"{name}.{a.name}"
                yield sub if sub in mods else name


@cache
def file_graph() -> dict[str, set[str]]:
    mods = _modules()
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for target in _imported(path):
            while target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in mods and target != m:
                out[m].add(target)
    return out


def room(module: str) -> str:
    """A top-level module, or the top-level folder a module is in."""
    parts = module.split(".")
    if len(parts) == 1:
        return "grpo_cli/__init__"
    path = PACKAGE.joinpath(*parts[1:])
    return f"{parts[1]}/" if len(parts) > 2 or path.is_dir() else parts[1]


@cache
def room_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in file_graph().items():
        r = room(m)
        out.setdefault(r, set())
        for t in targets:
            if room(t) != r:
                out[r].add(room(t))
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (its nodes in order), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for t in sorted(graph.get(n, ())):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (found := visit(t)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)) is not None:
            return found
    return None


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each node's floor: 1 for a node that imports nothing, else one above the highest it
    imports (the graph has no circle)."""
    out: dict[str, int] = {}

    def floor(n: str) -> int:
        if n not in out:
            out[n] = 1 + max((floor(t) for t in graph.get(n, ())), default=0)
        return out[n]

    for n in graph:
        floor(n)
    return out


def test_no_circle_of_files() -> None:
    assert _cycle(file_graph()) is None, " -> ".join(_cycle(file_graph()) or [])


def test_no_circle_of_rooms_so_no_import_runs_back_up() -> None:
    """With the rooms in no circle, every import runs from a higher floor to a lower one."""
    cycle = _cycle(room_graph())
    assert cycle is None, " -> ".join(cycle or [])
    f = floors(room_graph())
    back = [(a, b) for a, ts in room_graph().items() for b in ts if f[b] >= f[a]]
    assert not back, back


def test_at_most_fifteen_floors() -> None:
    f = floors(room_graph())
    assert max(f.values()) <= MAX_FLOORS, sorted(f.items(), key=lambda kv: kv[1])


def test_nothing_inside_imports_the_package_face() -> None:
    """``grpo_cli/__init__.py`` is the public surface: a module that imports it sits above
    everything it re-exports."""
    importers = [m for m, ts in file_graph().items() if "grpo_cli" in ts]
    assert importers == [], importers


def test_the_layers_run_one_way() -> None:
    """The direction DESIGN.md draws: the math imports nothing of grpo-cli but errors, the
    losses only the math, the settings record no trainer, the readers no fold, the fold no
    command, the recorders no CLI."""
    g = room_graph()
    assert g["core/"] <= {"errors"}
    assert g["losses/"] <= {"core/", "errors"}
    assert g["settings"] <= {"core/", "losses/", "errors"}
    assert "trainers/" not in g["io/"] | g["engine/"]
    assert not g["fold/"] & {"commands/", "check/", "views/", "cli/", "finalize/"}
    assert "cli/" not in g["integrations/"]


def test_the_gate_in_training_imports_no_cli(tmp_path: Path) -> None:
    """The in-training gate checks a recorded step (as ``check=True`` does each step) and
    loads neither typer nor the CLI: it runs inside the trainer's process."""
    code = f"""
import sys
import numpy as np
from grpo_cli.integrations import openrlhf, trl, verl  # noqa: F401
from grpo_cli.integrations._gate import check_config, check_recorded_step
from grpo_cli.integrations._writer import RunWriter, rollout_table
w = RunWriter({str(tmp_path)!r}, trainer="trl", trainer_version="1.16.0",
              config={{"loss_type": "bnpo", "beta": 0.0}})
rng = np.random.default_rng(0)
old = -rng.exponential(1.0, (8, 6))
t = rollout_table(group=[f"g{{i // 4}}" for i in range(8)], reward=rng.integers(0, 2, 8) * 1.0,
                  advantage=rng.normal(0, 1, 8), mask=np.ones((8, 6), bool),
                  tokens={{"logp": old + rng.normal(0, 0.1, (8, 6)), "old_logp": old}})
w.write_micro_batch(1, 0, t, {{"micro_batches": 1, "num_items_in_batch": 48}})
w.finish_step(1)
report = check_recorded_step(w.step_dir(1), check_config(True), logged=False)
assert report.results, report
bad = [m for m in sys.modules if m == "typer" or m.startswith(("typer.", "grpo_cli.cli"))]
print(",".join(bad) or "none")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "none", out.stdout


def test_no_file_over_a_thousand_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _files()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def _is_table(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function that is a table of data: after its docstring, one return of a literal."""
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Dict | ast.List | ast.Tuple)
    )


def test_no_function_over_eighty_lines() -> None:
    long = []
    for p in _files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION and not _is_table(node):
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} {n}")
    assert not long, "\n".join(long)


def _mentions(word: str) -> set[str]:
    pattern = re.compile(rf"(?<![\w/-]){re.escape(word)}(?![\w-])")
    return {str(p.relative_to(PACKAGE)) for p in _files() if pattern.search(p.read_text())}


def _homes(trainer: str) -> set[str]:
    """A trainer's loss modules (``losses/verl.py``, ``losses/verl_rollout.py``), its
    trainer module and its recorder."""
    losses = {str(p.relative_to(PACKAGE)) for p in (PACKAGE / "losses").glob(f"{trainer}*.py")}
    return {*losses, f"trainers/{trainer}.py", f"integrations/{trainer}.py"}


def test_a_loss_lives_in_its_trainer_s_files() -> None:
    """Every loss, correction and mask of the registry is named only in its trainer's loss
    module, its trainer module and its recorder (at most 3 files): the fold, the settings,
    the CLI and the views look it up. A bare config value two trainers share (``cispo``)
    may be named in both trainers' files. (A trainer's loss module may be split by job,
    ``losses/verl.py`` and ``losses/verl_rollout.py``: a name is in one of them.)"""
    from grpo_cli.losses import CORRECTIONS, LOSSES, MASKS

    rows = [(r.name, r.trainer) for r in LOSSES.values() if r.trainer is not None]
    rows += [(r.name, r.trainer) for r in CORRECTIONS.values()]
    rows += [(r.name, r.trainer) for r in MASKS.values()]
    assert len(rows) > 15
    bare: dict[str, set[str]] = {}
    for name, trainer in rows:
        bare.setdefault(name.split("/", 1)[-1], set()).add(trainer)
    bad = []
    for name, trainer in rows:
        files = _mentions(name)
        if not files <= _homes(trainer) or len(files) > 3:
            bad.append(f"{name}: {sorted(files)}")
        value = name.split("/", 1)[-1]
        allowed = set().union(*(_homes(t) for t in bare[value]))
        if value != name and not _mentions(value) <= allowed:
            bad.append(f"{value} ({name}): {sorted(_mentions(value) - allowed)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("graph", ["files", "rooms"])
def test_the_measure_sees_the_imports(graph: str) -> None:
    """The graph is not vacuous: the CLI reaches the core through the layers."""
    g = file_graph() if graph == "files" else room_graph()
    assert sum(len(t) for t in g.values()) > (150 if graph == "files" else 40)
