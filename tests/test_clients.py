"""The same rollouts written by pyarrow, pandas, polars, duckdb and HF datasets (the writers
users have) give the same numbers: every command reads each file alike."""

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
duckdb = pytest.importorskip("duckdb")
hf = pytest.importorskip("datasets")


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
    writers = ("pyarrow", "pandas", "polars", "duckdb", "datasets")
    paths = {w: d / f"{w}.parquet" for w in writers}
    table = pa.table(data)
    pq.write_table(table, paths["pyarrow"])
    pd.DataFrame(data).to_parquet(paths["pandas"])  # pandas' own metadata, its index
    pl.DataFrame(data).write_parquet(paths["polars"])  # large_list, large_string
    con = duckdb.connect()
    con.register("t", table)
    # the rewards as DECIMAL, as duckdb types a literal like 1.0; its own row groups
    con.sql(
        "COPY (SELECT prompt_id, CAST(score AS DECIMAL(3, 1)) AS score, log_probs, "
        f"old_log_probs, ref_log_prob, response_mask FROM t) TO '{paths['duckdb']}' "
        "(FORMAT PARQUET)"
    )
    hf.Dataset.from_dict(data).to_parquet(str(paths["datasets"]))  # its own schema metadata
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
    for writer in ("pandas", "polars", "duckdb", "datasets"):
        assert docs[writer] == docs["pyarrow"], writer


def test_check_passes_alike(cli: Cli, files: dict[str, Path]) -> None:
    codes = {w: cli("check", p, "--format", "json").exit_code for w, p in files.items()}
    assert set(codes.values()) == {codes["pyarrow"]} and codes["pyarrow"] in (0, 1)
