"""The same rollouts written by pyarrow, pandas and polars (the writers users have) give the
same numbers: every command reads each file alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .conftest import Cli

pd = pytest.importorskip("pandas")
pl = pytest.importorskip("polars")


def _rollouts() -> dict[str, Any]:
    rng = np.random.default_rng(4)
    n = 24
    lengths = rng.integers(1, 40, n)
    out: dict[str, Any] = {
        "prompt_id": [f"q{i // 4}" for i in range(n)],
        "score": rng.integers(0, 2, n).astype(np.float64).tolist(),
    }
    for name, shift in (("log_probs", 0.0), ("old_log_probs", 0.05), ("ref_log_prob", 0.2)):
        out[name] = [
            np.minimum(-rng.exponential(1.0, k) + rng.normal(0, shift, k), -1e-4).tolist()
            for k in lengths
        ]
    out["response_mask"] = [(rng.random(k) < 0.9).tolist() for k in lengths]
    for m in out["response_mask"]:
        m[0] = True
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("clients")
    data = _rollouts()
    paths = {w: d / f"{w}.parquet" for w in ("pyarrow", "pandas", "polars")}
    pq.write_table(pa.table(data), paths["pyarrow"])
    pd.DataFrame(data).to_parquet(paths["pandas"])  # pandas' own metadata, its index
    pl.DataFrame(data).write_parquet(paths["polars"])  # large_list, large_string
    return paths


@pytest.mark.parametrize("cmd", ["advantages", "kl", "objective", "answers", "explain"])
def test_every_writer_gives_the_same_numbers(cli: Cli, files: dict[str, Path], cmd: str) -> None:
    docs = {}
    for writer, path in files.items():
        doc = cli.json(cmd, path)
        for volatile in ("source", "engine"):
            doc.pop(volatile, None)
        if cmd == "answers":
            for a in doc["answers"]:
                a.pop("source")
        docs[writer] = doc
    assert docs["pandas"] == docs["pyarrow"]
    assert docs["polars"] == docs["pyarrow"]


def test_check_passes_alike(cli: Cli, files: dict[str, Path]) -> None:
    codes = {w: cli("check", p, "--format", "json").exit_code for w, p in files.items()}
    assert set(codes.values()) == {codes["pyarrow"]} and codes["pyarrow"] in (0, 1)
