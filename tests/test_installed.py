"""grpo-cli installed from its wheel or its sdist, not from the checkout (.ci/package).

.ci/package copies tests/ and sample_data/ out of the checkout and runs this file (with a
few others) against the installed package, with ``GRPO_CLI_INSTALLED`` set to ``wheel`` or
``sdist`` (the sdist installed where no C compiler is found) and ``GRPO_CLI_SOURCE`` to the
checkout; without them the installation tests skip. The sample's J, from loops written
here, is checked wherever the suite runs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import grpo_cli

from .conftest import SAMPLE, pad, reference_objective

INSTALLED = os.environ.get("GRPO_CLI_INSTALLED", "")
installed = pytest.mark.skipif(
    INSTALLED not in ("wheel", "sdist"), reason="GRPO_CLI_INSTALLED unset: run by .ci/package"
)
PACKAGE = Path(grpo_cli.__file__).resolve().parent
SCRIPT = Path(sys.executable).parent / "grpo-cli"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "GRPO_CLI_KERNEL"} | env
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, check=False, env=environ,
        cwd=SAMPLE.parent,
    )  # fmt: skip


def _source_version() -> str:
    text = (Path(os.environ["GRPO_CLI_SOURCE"]) / "grpo_cli" / "_version.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    assert m, "the checkout's grpo_cli/_version.py"
    return m.group(1)


def _expected_kernel() -> str:
    """The name --version should give, from the platform and the CPU's flags: setup.py
    builds the AVX2 path on x86-64 glibc Linux, and it runs where the CPU has AVX2 and FMA."""
    if INSTALLED == "sdist":
        return "numpy"  # installed with no compiler: no kernel
    vector = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
    vector = vector and platform.libc_ver()[0] == "glibc"
    flags: set[str] = set()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return "c+avx2" if vector and {"avx2", "fma"} <= flags else "c"


@installed
def test_the_package_is_the_installed_one_not_the_checkout() -> None:
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert PACKAGE.parent in site, PACKAGE
    assert not PACKAGE.is_relative_to(Path(os.environ["GRPO_CLI_SOURCE"]).resolve())
    assert SCRIPT.is_file()


@installed
def test_the_installed_version_is_the_version_file() -> None:
    v = _source_version()
    assert importlib.metadata.version("grpo-cli") == grpo_cli.__version__ == v
    r = _run("--version")
    assert (r.returncode, r.stdout, r.stderr) == (
        0, f"grpo-cli {v} (token kernel: {_expected_kernel()})\n", ""
    )  # fmt: skip


@installed
def test_the_kernel_is_there_exactly_when_a_compiler_was() -> None:
    kernels = sorted(p.name for p in PACKAGE.glob("_kernel*.so"))
    recorded = [str(f) for f in importlib.metadata.files("grpo-cli") or [] if "_kernel." in str(f)]
    if INSTALLED == "wheel":
        assert len(kernels) == 1 and any(f.endswith(".so") for f in recorded), kernels
        assert _run("--version", GRPO_CLI_KERNEL="c").returncode == 0
    else:
        assert kernels == [] and not any(f.endswith(".so") for f in recorded)
        r = _run("objective", "sample_data/batch.parquet", GRPO_CLI_KERNEL="c")
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, r.stderr
        assert lines[0].startswith("grpo-cli: error: GRPO_CLI_KERNEL=c but "), lines[0]


def _sample_objective() -> float:
    """J of sample_data/batch.parquet under the defaults, from the seed formula written with
    loops (tests/conftest.py): advantages (r - mean) / (std + 1e-8) per group, population std
    (DeepSeekMath, Shao et al. 2024, §4.1.2; grpo-cli's default eps), every token counted."""
    table = pq.read_table(SAMPLE / "batch.parquet").to_pydict()
    rewards = np.asarray(table["reward"], dtype=np.float64)
    adv = np.empty_like(rewards)
    for g in set(table["group"]):
        rows = [i for i, x in enumerate(table["group"]) if x == g]
        r = rewards[rows]
        adv[rows] = (r - r.mean()) / (r.std() + 1e-8)
    width = max(len(x) for x in table["logp"])

    def col(name: str) -> np.ndarray:
        return pad([np.asarray(x, dtype=np.float64) for x in table[name]], width)

    mask = pad([np.ones(len(x)) for x in table["logp"]], width)
    return reference_objective(col("logp"), col("old_logp"), col("ref_logp"), adv, mask)


def test_the_readme_sample_gives_the_formulas_objective() -> None:
    """The README's first command's job, run by the console script of the environment
    (the installed one under .ci/package)."""
    if not SCRIPT.is_file():
        pytest.skip(f"no console script {SCRIPT} (the package is not installed here)")
    table = _run("objective", "sample_data/batch.parquet")
    assert table.returncode == 0 and table.stdout.startswith("grpo-cli objective"), table.stderr
    r = _run("objective", "sample_data/batch.parquet", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["objective"] == pytest.approx(_sample_objective(), rel=1e-12, abs=0)
    assert doc["counts"]["answers"] == len(pq.read_table(SAMPLE / "batch.parquet"))
