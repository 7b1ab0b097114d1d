"""grpo-cli trend: each step's row is objective on that file alone; steps in step order;
the trend rules judge first against last."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.commands.trend import step_number
from grpo_cli.records import STEP_KEYS
from grpo_cli.views.tables import sparkline

from .conftest import Cli


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    d = tmp_path_factory.mktemp("steps")
    runner = CliRunner()
    for step in (300, 20, 100):  # written out of order
        name = d / f"run_step_{step}_seed2.parquet"
        r = runner.invoke(app, ["sample", str(name), "--groups", "6", "--seed", str(step),
                                "--extras"])  # fmt: skip
        assert r.exit_code == 0
    return d


def test_each_step_is_objective_on_its_own_file(cli: Cli, steps: Path) -> None:
    doc = cli.json("trend", steps, "--preset", "verl")
    assert doc["command"] == "trend" and [s["step"] for s in doc["steps"]] == [20, 100, 300]
    for row in doc["steps"]:
        assert list(row) == list(STEP_KEYS)
        one = cli.json("objective", steps / row["source"], "--preset", "verl")
        assert row["objective"] == one["objective"] and row["loss"] == one["loss"]
        assert row["clip_fraction_region"] == one["clip_fraction"]["region"]
        assert row["ratio_p99"] == one["ratio"]["p99"]
        assert row["kl_mean"] == one["kl"]["mean"]
        assert row["entropy_mean"] == one["entropy"]["mean"]
        assert row["frac_zero_variance_groups"] == one["groups"]["frac_zero_variance_groups"]
        assert row["length_mean"] == one["lengths"]["mean"]
        assert row["rollout_kl_k3"] == one["rollout"]["kl_k3"]
        table = pq.read_table(steps / row["source"])
        assert row["reward_mean"] == pytest.approx(float(np.mean(table.column("reward"))))
        counts = one["counts"]
        assert (row["answers"], row["tokens"]) == (counts["answers"], counts["tokens"])
    assert "check" not in doc


@pytest.mark.parametrize(
    "flags",
    [
        ("--agg", "token-mean", "--clip-eps", "0.1", "--beta", "0.1"),
        ("--preset", "openrlhf", "--kl-mode", "loss", "--dual-clip", "2.5", "--kl-agg",
         "seq-mean-token-sum"),
        ("--preset", "gspo", "--clip-eps-high", "0.01", "--scale", "batch"),
    ],
)  # fmt: skip
def test_every_convention_reaches_each_step(cli: Cli, steps: Path, flags: tuple[str, ...]) -> None:
    """trend takes the conventions objective takes: a step's row equals objective on that
    step with the same flags (and those flags change the numbers: they are not ignored)."""
    doc = cli.json("trend", steps, *flags)
    assert (
        doc["settings"]
        == cli.json("objective", steps / doc["steps"][0]["source"], *flags)["settings"]
    )
    for row in doc["steps"]:
        one = cli.json("objective", steps / row["source"], *flags)
        default = cli.json("objective", steps / row["source"])
        assert row["objective"] == one["objective"] and row["loss"] == one["loss"]
        assert row["clip_fraction_region"] == one["clip_fraction"]["region"]
        assert row["kl_mean"] == one["kl"]["mean"]
        assert row["objective"] != default["objective"]


def test_step_numbers() -> None:
    assert step_number(Path("step_300_seed2.parquet"), 0) == 300
    assert step_number(Path("ckpt-12-part7.parquet"), 0) == 7
    assert step_number(Path("rollouts.parquet"), 4) == 4
    assert sparkline([1.0, None, 3.0, 2.0]) == "▁·█▅"


def test_rules_judge_first_against_last(cli: Cli, tmp_path: Path) -> None:
    """Entropy falls to 10% of the first step's: entropy-drop fails and --check exits 1."""
    for step, entropy in ((1, 1.0), (2, 0.6), (3, 0.1)):
        n = 8
        table = pa.table({
            "group": [i // 4 for i in range(n)],
            "reward": [float(i % 2) for i in range(n)],
            "logp": [[-1.0, -0.5]] * n,
            "entropy": [[entropy, entropy]] * n,
        })  # fmt: skip
        pq.write_table(table, tmp_path / f"step_{step}.parquet")
    r = cli("trend", tmp_path, "--check", "--json", "--beta", "0")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    results = {x["rule"]: x for x in doc["check"]["results"]}
    assert results["entropy-drop"]["status"] == "fail"
    assert results["entropy-drop"]["value"] == pytest.approx(0.1)
    assert results["kl-growth"]["status"] == "skip"  # no ref_logp
    assert doc["check"]["passed"] is False
    relaxed = cli("trend", tmp_path, "--check", "--json", "--beta", "0",
                  "--rule", "entropy-drop.fail=0.05")  # fmt: skip
    assert relaxed.exit_code == 0
    assert json.loads(relaxed.stdout)["check"]["results"][0]["status"] == "warn"
    assert any("kl_mean is null for step(s) 1, 2, 3" in w for w in doc["warnings"])
    bad = cli("trend", tmp_path, "--check", "--rule", "nope.fail=1")
    assert bad.exit_code == 2 and "unknown rule 'nope'" in bad.stderr


def test_one_file_a_step(cli: Cli, tmp_path: Path) -> None:
    table = pa.table({"group": [0, 0], "reward": [1.0, 0.0], "logp": [[-1.0], [-2.0]]})
    pq.write_table(table, tmp_path / "a_step_5.parquet")
    pq.write_table(table, tmp_path / "b_step_5.parquet")
    r = cli("trend", tmp_path, "--beta", "0")
    assert r.exit_code == 2 and "step 5 again" in r.stderr


def test_step_column_equals_one_file_a_step(
    cli: Cli, steps: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step files concatenated into one dataset (rows of the steps interleaved, split in
    two files) with a ``step`` column give the same rows as the files one a step."""
    per_file = cli.json("trend", steps, "--preset", "verl")
    tables = []
    for row in per_file["steps"]:
        t = pq.read_table(steps / row["source"])
        tables.append(t.append_column("step", pa.array([row["step"]] * t.num_rows, pa.int64())))
    both = pa.concat_tables(tables)
    order = np.argsort(np.arange(both.num_rows) % 7, kind="stable")  # interleave the steps
    both = both.take(pa.array(order))
    half = both.num_rows // 2
    d = tmp_path / "ds"
    d.mkdir()
    pq.write_table(both.slice(0, half), d / "part-0.parquet", row_group_size=50)
    pq.write_table(both.slice(half), d / "part-1.parquet", row_group_size=50)
    monkeypatch.setattr("grpo_cli.commands.trend.MAX_OPEN_STEPS", 2)  # two passes over the dataset
    doc = cli.json("trend", d, "--step-column", "step", "--preset", "verl")
    assert [s["step"] for s in doc["steps"]] == [20, 100, 300]
    for a, b in zip(doc["steps"], per_file["steps"], strict=True):
        assert a["source"] is None
        for k in STEP_KEYS:
            if k == "source":
                continue
            want = b[k]
            assert a[k] == (pytest.approx(want, rel=1e-12, abs=1e-14) if isinstance(want, float)
                            else want), k  # fmt: skip
    assert any("source is null" in w for w in doc["warnings"])


def test_step_column_errors(cli: Cli, steps: Path) -> None:
    cli.error(["trend", str(steps), "--step-column", "nope"], "no column 'nope'")
    cli.error(["trend", str(steps), "--step-column", "reward"], "expected integers")


def test_the_same_file_twice_is_refused(cli: Cli, steps: Path) -> None:
    one = steps / "run_step_20_seed2.parquet"
    cli.error(["trend", str(one), str(one)], "given twice")
    cli.error(["trend", str(steps), str(one)], "given twice")  # in the directory and by name


def test_objective_on_step_files_points_to_trend(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for step in (1, 2):  # the same prompts at every step: group ids repeat across files
        pq.write_table(pa.table({
            "group": ["p0", "p0", "p1", "p1"], "reward": rng.random(4),
            "logp": [[-1.0, -0.5]] * 4,
        }), tmp_path / f"step_{step}.parquet")  # fmt: skip
    r = cli("objective", tmp_path, "--beta", "0")
    assert r.exit_code == 0
    assert "these files are named as steps: `grpo-cli trend` gives one row a step" in r.stderr
