"""Why, not only what (issue 29): the cause of a logged difference, found on data made to
have it and not reported on data without it.

The recorded runs are TRL 1.16.0's GRPOTrainer (tests/trl_runs.py); a run's logged
``loss`` is multiplied in a copy of its ``metrics.jsonl`` by a count read independently
(the step's recorded call files, the configuration the run was made with)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_cli.causes import FACTORS, CauseContext, explain, factors_of
from grpo_cli.causes import Alternative as Alt

from .conftest import Cli


def _scaled_copy(run_dir: Path, to: Path, factor: float) -> Path:
    """The run copied with every step record's ``loss`` × ``factor``."""
    shutil.copytree(run_dir, to)
    p = to / "metrics.jsonl"
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    for r in rows:
        if "loss" in r and "train_runtime" not in r:
            r["loss"] *= factor
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return to


def _causes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["metric"]: m["cause"] for m in doc["logged"]["metrics"] if "cause" in m}


def test_a_loss_logged_times_its_micro_batch_count(cli: Cli, trl_run: Any, tmp_path: Path) -> None:
    run = trl_run("ga2_dapo")
    step = run.directory / "step_000002"
    calls = len(list(step.glob("rank000-mb*.parquet")))  # the step's loss calls, as recorded
    assert calls == run.settings["gradient_accumulation_steps"] == 2
    copy = _scaled_copy(run.directory, tmp_path / "x2", calls)
    doc = cli.json("objective", copy / "step_000002")
    cause = _causes(doc)["loss"]
    assert cause["found"] and cause["id"] == "times:calls"
    assert "gradient_accumulation_steps" in cause["words"]  # the same count, named too
    assert "verl PR #4711" in cause["cite"]
    assert abs(cause["ratio"] - calls) < 1e-5 * calls and cause["relative"] <= 1e-5
    assert set(_causes(doc)) == {"loss"}  # the other metrics still match
    # check and explain name it in one line
    chk = json.loads(cli("check", copy / "step_000002", "--format", "json").stdout)
    res = next(x for x in chk["results"] if x["rule"] == "logged-metrics")
    assert res["status"] == "fail" and "why: logged = recomputed × 2" in res["message"]
    ex = cli.json("explain", copy / "step_000002")
    f = [x for x in ex["findings"] if x["id"] == "logged-factor"]
    assert len(f) == 1 and f[0]["evidence"]["cause"]["id"] == "times:calls"


def test_a_loss_logged_times_steps_per_generation(cli: Cli, trl_run: Any, tmp_path: Path) -> None:
    run = trl_run("ga2_dapo")
    spg = run.settings["steps_per_generation"]
    assert spg == 4
    copy = _scaled_copy(run.directory, tmp_path / "x4", spg)
    cause = _causes(cli.json("objective", copy / "step_000003"))["loss"]
    assert cause["found"] and cause["id"] == "times:steps_per_generation"
    copy = _scaled_copy(run.directory, tmp_path / "over2", 0.5)
    cause = _causes(cli.json("objective", copy / "step_000003"))["loss"]
    assert cause["found"] and cause["id"] == "over:calls"


def test_no_cause_without_a_mismatch(cli: Cli, trl_run: Any) -> None:
    run = trl_run("ga2_dapo")
    for n in (1, 2, 3, 4):
        doc = cli.json("objective", run.directory / f"step_{n:06d}")
        assert all(m["verdict"] != "differs" for m in doc["logged"]["metrics"])
        assert _causes(doc) == {}
    ex = cli.json("explain", run.directory / "step_000002")
    assert not [x for x in ex["findings"] if x["id"].startswith("logged-")]


def test_a_factor_no_count_explains_shows_the_ratio(cli: Cli, trl_run: Any, tmp_path: Path) -> None:
    run = trl_run("ga2_dapo")
    copy = _scaled_copy(run.directory, tmp_path / "x3_7", 3.7)
    doc = cli.json("objective", copy / "step_000002")
    cause = _causes(doc)["loss"]
    assert not cause["found"] and cause["id"] == "unexplained"
    assert abs(cause["ratio"] - 3.7) < 1e-5 and "3.7" in cause["words"]
    out = cli("explain", copy / "step_000002").stdout
    assert "logged-differs" in out and "no known factor" in out


# ------------------------------------------------------------------ the search itself
def test_factors_from_the_config_and_the_step() -> None:
    config = {"gradient_accumulation_steps": 4, "steps_per_generation": 1, "num_iterations": True}
    got = {row.key: n for row, n in factors_of(config, calls=4, world_size=2)}
    assert got == {"@calls": 4.0, "gradient_accumulation_steps": 4.0, "@world_size": 2.0}
    assert all(row.cite for row in FACTORS)


def test_the_closest_explanation_within_float32_rounding() -> None:
    rows = {row.key: row for row in FACTORS}
    ctx = CauseContext(
        ((rows["@world_size"], 8.0), (rows["gradient_accumulation_steps"], 3.0)),
        (Alt("aggregation:token-mean", "the loss aggregated as token-mean", "TRL #7011",
             {"loss": 0.123456}),),
    )  # fmt: skip
    # 0.5 / 8 logged as a float32
    c = explain("loss", float(np.float32(0.0625)), 0.5, ctx)
    assert c.found and c.id == "over:world_size" and c.predicted == 0.0625
    c = explain("loss", 0.123456 * (1 + 3e-6), 0.2, ctx)
    assert c.found and c.id == "aggregation:token-mean"
    c = explain("loss", 0.5 * 3 * (1 + 1e-4), 0.5, ctx)  # beyond float32 rounding
    assert not c.found and c.ratio == pytest.approx(3 * (1 + 1e-4))
    c = explain("loss", 1.0, 0.0, ctx)  # nothing to scale: no ratio
    assert not c.found and c.ratio is None and "ratio" not in c.to_json()
