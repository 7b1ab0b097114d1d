"""Data mistakes that are valid input but almost surely not what was meant: each is a
warning (in ``warnings`` in JSON), and where a gate should stop on it, a check rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .conftest import Cli


def _ragged(tmp_path: Path, group: list[str], lengths: list[int], *, probs: bool = False) -> Path:
    rng = np.random.default_rng(3)
    lp = [-rng.exponential(1.0, k) for k in lengths]
    if probs:
        lp = [np.exp(x) for x in lp]  # probabilities given instead of log-probs
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({
        "group": group, "reward": rng.integers(0, 2, len(group)).astype(float),
        "logp": [x.tolist() for x in lp],
    }), p)  # fmt: skip
    return p


def test_answer_ids_given_as_group_ids(cli: Cli, tmp_path: Path) -> None:
    p = _ragged(tmp_path, [f"answer-{i}" for i in range(6)], [3, 4, 5, 3, 4, 5])
    doc = cli.json("objective", p, "--beta", "0")
    assert any("every group has one answer (6 groups of one)" in w for w in doc["warnings"])
    assert doc["policy_term"] == 0.0  # every advantage is 0: the reason it matters
    r = cli("check", p, "--format", "json", "--beta", "0")
    group = next(x for x in json.loads(r.stdout)["results"] if x["rule"] == "group-size")
    assert group["status"] == "fail" and "look like answer ids" in group["message"]
    ex = cli.json("explain", p, "--beta", "0")
    ids = [f["id"] for f in ex["findings"]]
    assert "singleton-groups" in ids and "zero-variance-groups" not in ids
    adv = cli.json("advantages", p)
    assert any("groups of one" in w for w in adv["warnings"])


def test_rewards_of_shape_n_by_1(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "a.npz"
    np.savez(p, logp=np.full((4, 3), -1.0), rewards=np.array([[1.0], [0.0], [1.0], [0.0]]))
    doc = cli.json("advantages", p)
    assert any("shape (4, 1): read as 4 groups of one answer" in w for w in doc["warnings"])


def test_every_answer_as_long_as_the_longest(cli: Cli, tmp_path: Path) -> None:
    p = _ragged(tmp_path, ["a", "a", "b", "b"], [5, 5, 5, 5])
    doc = cli.json("objective", p, "--beta", "0")
    assert any("every answer has exactly 5 valid tokens" in w for w in doc["warnings"])
    q = _ragged(tmp_path, ["a", "a", "b", "b"], [5, 4, 5, 5])  # one shorter: no warning
    doc = cli.json("objective", q, "--beta", "0")
    assert not any("valid tokens:" in w for w in doc["warnings"])


def test_probabilities_instead_of_log_probs(cli: Cli, tmp_path: Path) -> None:
    p = _ragged(tmp_path, ["a", "a", "b", "b"], [3, 4, 5, 6], probs=True)
    doc = cli.json("objective", p, "--beta", "0")
    assert any("these look like probabilities" in w for w in doc["warnings"])
    r = cli("check", p, "--format", "json", "--beta", "0")
    rng = next(x for x in json.loads(r.stdout)["results"] if x["rule"] == "logp-range")
    assert r.exit_code == 1 and rng["status"] == "fail"
