"""grpo-cli explain: crafted batches raise the findings they were built to raise, with
evidence computed here from the construction."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .conftest import Cli


def _batch(tmp: Path, name: str, **cols: Any) -> Path:
    """40 answers in 10 groups of 4 with rewards 0/1 mixed, 10 tokens each, on-policy-ish:
    healthy unless a column is overridden."""
    n, L = 40, 10
    rng = np.random.default_rng(0)
    logp = -rng.uniform(0.5, 1.5, (n, L))
    base: dict[str, Any] = {
        "group": [f"p{i // 4}" for i in range(n)],
        "reward": [float(i % 2) for i in range(n)],
        "logp": list(logp),
        "old_logp": list(logp + rng.normal(0, 0.01, (n, L))),
        "ref_logp": list(logp + rng.normal(0, 0.01, (n, L))),
    }
    base.update(cols)
    table = pa.table({k: [np.asarray(x).tolist() for x in v] if k.endswith("logp") or
                      k == "entropy" else v for k, v in base.items()})  # fmt: skip
    path = tmp / f"{name}.parquet"
    pq.write_table(table, path)
    return path


def _findings(cli: Cli, path: Path, *args: str) -> dict[str, dict[str, Any]]:
    r = cli("explain", path, "--json", *args)
    assert r.exit_code == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["command"] == "explain"
    sev = [f["severity"] for f in doc["findings"]]
    order = {"alarm": 0, "warn": 1, "info": 2}
    assert sev == sorted(sev, key=order.__getitem__)  # most severe first
    return {f["id"]: f for f in doc["findings"]}


def test_healthy_batch_has_no_alarm(cli: Cli, tmp_path: Path) -> None:
    f = _findings(cli, _batch(tmp_path, "ok"))
    assert all(x["severity"] != "alarm" for x in f.values())
    assert "near-zero-loss" in f  # on-policy-ish: J ≈ 0, its gradient is not
    assert f["near-zero-loss"]["evidence"]["gradient_norm"] > 0
    for absent in ("clipping", "kl-drift", "ratio-outliers", "entropy-collapse"):
        assert absent not in f
    assert "truncation" not in f  # every answer 10 tokens long: no pile-up at a limit


def test_clipping_kl_ratio_and_negative_loss(cli: Cli, tmp_path: Path) -> None:
    n, L = 40, 10
    logp = np.full((n, L), -1.0)
    old = logp.copy()
    old[:, :5] = -1.5  # ρ = e^0.5 > 1.2 on half of every answer's tokens
    old[0, 9] = -7.0  # one token with ρ = e^6 > 10
    ref = logp + 3.0  # d = 3 everywhere: k3 = e^3 − 4
    adv = [1.0] * n  # every answer pushed up: J > 0, so the loss is negative
    f = _findings(cli, _batch(tmp_path, "hot", logp=list(logp), old_logp=list(old),
                              ref_logp=list(ref), advantage=adv))  # fmt: skip
    assert f["clipping"]["severity"] == "alarm"
    assert f["clipping"]["evidence"]["clip_region"] == pytest.approx((5 * n + 1) / (n * L))
    k3 = math.exp(3) - 4
    assert f["kl-drift"]["severity"] == "alarm"
    assert f["kl-drift"]["evidence"]["kl_mean"] == pytest.approx(k3)
    assert f["ratio-outliers"]["evidence"]["outside_band_share"] == pytest.approx(1 / (n * L))
    assert f["ratio-outliers"]["severity"] == "alarm"  # 1/400 > 1e-3
    assert "negative-loss" in f and f["negative-loss"]["evidence"]["loss"] < 0


def test_zero_variance_sampler_entropy_residual(cli: Cli, tmp_path: Path) -> None:
    n, L = 40, 10
    logp = -np.ones((n, L))
    rewards = [1.0] * 36 + [0.0, 1.0, 0.0, 1.0]  # 9 of 10 groups all 1
    adv = [1e-3] * 36 + [-1.0, 1.0, -1.0, 1.0]  # float32-style residuals in those groups
    f = _findings(cli, _batch(tmp_path, "flat", reward=rewards, advantage=adv,
                              logp=list(logp), old_logp=list(logp), ref_logp=list(logp),
                              rollout_logp=list(logp - 0.5),
                              entropy=list(np.full((n, L), 0.01))))  # fmt: skip
    z = f["zero-variance-groups"]
    assert z["evidence"]["frac_zero_variance_groups"] == pytest.approx(0.9)
    assert z["severity"] == "warn"  # 0.9 > warn 0.5, not > fail 0.9
    # sampler 0.5 nats below the trainer: δ = 0.5, k3 = e^0.5 − 1.5
    s = f["sampler-mismatch"]
    assert s["evidence"]["kl_k3"] == pytest.approx(math.exp(0.5) - 1.5) and s["severity"] == "alarm"
    assert f["entropy-collapse"]["evidence"]["entropy_mean"] == pytest.approx(0.01)
    assert f["residual-advantages"]["evidence"] == {"answers": 36, "max_abs": 0.001}


def test_length_bias_and_truncation(cli: Cli, tmp_path: Path) -> None:
    lengths = [2] * 20 + [20] * 10 + [64] * 10  # 10 answers (25%) at the longest length
    mask = [[t < k for t in range(64)] for k in lengths]
    logp = -np.ones((40, 64))
    path = _batch(tmp_path, "long", logp=list(logp), old_logp=list(logp), ref_logp=list(logp),
                  mask=mask)  # fmt: skip
    f = _findings(cli, path)
    b = f["length-bias"]["evidence"]
    assert (b["p10_length"], b["p90_length"], b["weight_ratio"]) == (2, 64, 32)
    assert f["truncation"]["evidence"] == {"at_longest": 10, "answers": 40, "longest": 64}
    g = _findings(cli, path, "--max-len", "64")
    assert g["truncation"]["evidence"] == {"at_max_len": 10, "answers": 40, "max_len": 64}
    assert "length-bias" not in _findings(cli, path, "--agg", "token-mean")


def test_truncation_of_answers_longer_than_the_dense_counts(cli: Cli, tmp_path: Path) -> None:
    """Answer lengths of 65,536 tokens or more are counted apart (IntCounts.large): explain
    read only the dense counts, so a file whose answers are all that long ended in an
    IndexError traceback, and --max-len at such a length found no answer at it."""
    n, L = 4, 70_000
    logp = pa.array(np.full(n * L, -1.0))
    lists = pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * L, L, dtype=np.int32)), logp)
    path = tmp_path / "long.parquet"
    pq.write_table(pa.table({"group": ["p"] * n, "reward": [0.0, 1.0, 0.0, 1.0], "logp": lists,
                             "old_logp": lists, "ref_logp": lists}), path)  # fmt: skip
    f = _findings(cli, path)  # every answer one length: no pile-up to report
    assert "truncation" not in f
    g = _findings(cli, path, "--max-len", str(L))
    assert g["truncation"]["evidence"] == {"at_max_len": n, "answers": n, "max_len": L}


def test_bad_input_is_exit_2(cli: Cli, tmp_path: Path) -> None:
    cli.error(["explain", str(tmp_path / "missing.parquet")], "missing.parquet")
