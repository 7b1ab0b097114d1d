"""The version is written in one place, ``grpo_cli/_version.py``: the package, its metadata
(pyproject.toml reads it from there), ``--version`` and the docs all take it from that file.

.ci/package checks the other end: the built wheel's and sdist's names and installed metadata
carry this version (tests/test_installed.py)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

import grpo_cli
from grpo_cli import _version

from .conftest import Cli
from .test_docs import ref

ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = ROOT / "grpo_cli" / "_version.py"
TEXT = {".md", ".yml", ".yaml", ".py", ".toml", ".txt"}

# PEP 440, Appendix B: a version in its canonical form
CANONICAL = re.compile(
    r"^([1-9][0-9]*!)?(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*((a|b|rc)(0|[1-9][0-9]*))?"
    r"(\.post(0|[1-9][0-9]*))?(\.dev(0|[1-9][0-9]*))?$"
)


def _written_version() -> str:
    """The literal assigned to ``__version__`` in _version.py, read without importing it."""
    tree = ast.parse(VERSION_FILE.read_text(encoding="utf-8"))
    values = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
        and isinstance(node.value, ast.Constant)
    ]
    assert len(values) == 1, "_version.py assigns __version__ once, to a string literal"
    assert isinstance(values[0], str)
    return values[0]


def test_the_version_file_is_the_packages_version() -> None:
    v = _written_version()
    assert CANONICAL.match(v), f"{v!r} is not a canonical PEP 440 version"
    assert grpo_cli.__version__ == _version.__version__ == v


def test_pyproject_reads_the_version_from_the_file() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "grpo_cli._version.__version__"}


def test_no_other_file_of_the_package_assigns_a_version() -> None:
    for path in sorted((ROOT / "grpo_cli").rglob("*.py")):
        if path == VERSION_FILE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [getattr(t, "id", None) for t in targets]
                assert "__version__" not in names, path


def test_no_page_repeats_the_version_by_hand() -> None:
    """README and the docs pages show the version only through a generated block, so a new
    version changes them with no edit (CHANGELOG's release headings name versions on
    purpose; pyproject.toml is the test above)."""
    v = _written_version()
    literal = re.compile(rf"(?<![\d.]){re.escape(v)}(?![\w]|\.\d)")  # also in v0.1.0
    assert literal.search(f"rev: v{v}") and literal.search(f"grpo-cli {v} (token")
    assert not literal.search(f"1{v}") and not literal.search(f"{v}.1")
    pages = [ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / ".pre-commit-hooks.yaml"]
    pages += [p for p in sorted((ROOT / "docs").rglob("*")) if p.suffix in TEXT]
    assert len(pages) > 20
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not literal.search(text), f"{page.relative_to(ROOT)} writes the version {v}"


def test_the_generated_examples_carry_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    v = _written_version()
    assert f"\ngrpo-cli {v} (token kernel: c+avx2)\n" in ref.version_example()
    assert f"\n    rev: v{v}\n" in ref.pre_commit_config()
    # a new version changes the pages with no edit of them
    monkeypatch.setattr(_version, "__version__", "9.8.7rc1")
    page = ref.expand((ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8"))
    assert "grpo-cli 9.8.7rc1 (token kernel: c+avx2)" in page
    page = ref.expand((ROOT / "docs" / "ci.md").read_text(encoding="utf-8"))
    assert "rev: v9.8.7rc1" in page


def test_version_names_the_numpy_backend_with_or_without_the_kernel(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/test_kernel.py (skipped where no kernel was built) checks the compiled names;
    the numpy one is checked wherever the suite runs."""
    monkeypatch.setenv("GRPO_CLI_KERNEL", "numpy")
    r = cli("--version")
    assert (r.exit_code, r.stdout, r.stderr) == (0, f"grpo-cli {_written_version()} "
                                                    "(token kernel: numpy)\n", "")  # fmt: skip
