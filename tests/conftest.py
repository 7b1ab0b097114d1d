"""Shared helpers: an independent padded reference of the seed formula, file writers, CLI."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from grpo_cli.cli import app

from .trl_runs import trl_run

__all__ = ["trl_run"]  # real TRL runs, trained once a session (tests/trl_runs.py)

# fixture writers (tests/data/*/make.py import torch): run by hand, never collected
collect_ignore = ["data"]

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"


def reference_objective(
    logp: np.ndarray,
    old_logp: np.ndarray,
    ref_logp: np.ndarray,
    adv: np.ndarray,
    mask: np.ndarray,
    clip_eps: float = 0.2,
    beta: float = 0.04,
) -> float:
    """The seed formula written the plain way, row by row with Python loops over answers.

    Independent of the package's ragged kernels: it is what a reader of the spec writes.
    """
    per_answer = []
    for i in range(logp.shape[0]):
        m = mask[i].astype(bool)
        lp, olp, rlp = logp[i][m], old_logp[i][m], ref_logp[i][m]
        ratio = np.exp(lp - olp)
        surr = np.minimum(ratio * adv[i], np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv[i])
        d = rlp - lp
        kl = np.exp(d) - d - 1
        per_answer.append(np.mean(surr - beta * kl))
    return float(np.mean(per_answer))


def random_batch(
    rng: np.random.Generator, n: int = 12, width: int = 9, groups: int = 3
) -> dict[str, Any]:
    """Ragged random rollouts: lengths 1..width, rewards in groups, as lists per answer."""
    lengths = rng.integers(1, width + 1, size=n)
    old = [-rng.exponential(0.5, size=k) for k in lengths]
    logp = [o + rng.normal(0, 0.3, size=o.shape[0]) for o in old]
    ref = [o + rng.normal(0, 0.2, size=o.shape[0]) for o in old]
    group = rng.integers(0, groups, size=n)
    reward = rng.integers(0, 3, size=n).astype(float)
    return {
        "logp": logp,
        "old_logp": old,
        "ref_logp": ref,
        "group": group,
        "reward": reward,
        "lengths": lengths,
    }


def pad(rows: Sequence[np.ndarray], width: int, fill: float = 0.0) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=np.float64)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def write_npz(path: Path, batch: dict[str, Any], fill: float = 0.0, **extra: Any) -> Path:
    width = int(max(batch["lengths"]))
    mask = np.arange(width)[None, :] < np.asarray(batch["lengths"])[:, None]
    arrays = {f: pad(batch[f], width, fill) for f in ("logp", "old_logp", "ref_logp")}
    arrays.update(mask=mask, rewards=np.asarray(batch["reward"]), group=np.asarray(batch["group"]))
    arrays.update(extra)
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def write_parquet(path: Path, batch: dict[str, Any], **extra: Any) -> Path:
    cols: dict[str, Any] = {
        "group": pa.array(np.asarray(batch["group"])),
        "reward": pa.array(np.asarray(batch["reward"], dtype=float)),
    }
    for f in ("logp", "old_logp", "ref_logp"):
        cols[f] = pa.array(
            [np.asarray(r, dtype=float).tolist() for r in batch[f]], type=pa.list_(pa.float64())
        )
    cols.update(extra)
    pq.write_table(pa.table(cols), path)
    return path


def sample_steps(d: Path, steps: int, *args: str) -> Path:
    """``steps`` files ``step_{i}.parquet`` in ``d`` written by ``grpo-cli sample`` (seed i,
    the other options ``args``): a multi-file dataset, one step a file."""
    import subprocess
    import sys

    for i in range(steps):
        r = subprocess.run(
            [sys.executable, "-m", "grpo_cli", "sample", str(d / f"step_{i}.parquet"),
             "--seed", str(i), *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    return d


class Cli:
    """Runs the app in-process and gives exit code, stdout and stderr apart."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str | Path) -> Any:
        return self.runner.invoke(app, [str(a) for a in args])

    def json(self, *args: str | Path) -> dict[str, Any]:
        r = self(*args, "--json")
        assert r.exit_code == 0, r.stderr
        doc: dict[str, Any] = json.loads(r.stdout)
        return doc

    def error(self, args: list[str], message: str) -> None:
        """The command fails with exit code 2 and one ``grpo-cli: error:`` line holding
        ``message``."""
        r = self(*args)
        assert r.exit_code == 2, r.stdout
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: "), r.stderr
        assert message in lines[0], lines[0]


@pytest.fixture
def cli() -> Cli:
    return Cli()
