"""Data mistakes that are valid input but almost surely not what was meant: each is a
warning (in ``warnings`` in JSON), and where a gate should stop on it, a check rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from grpo_cli.fold import mistakes as _mistakes

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


def _padded(tmp_path: Path, lengths: list[int], width: int, *, mask: bool) -> Path:
    """An npz of log-probs padded with 0.0 to ``width``, with or without its mask."""
    rng = np.random.default_rng(5)
    n = len(lengths)
    valid = np.arange(width)[None, :] < np.array(lengths)[:, None]
    arrays: dict[str, Any] = {}
    for name in ("logp", "old_logp", "ref_logp"):
        arrays[name] = np.where(valid, -rng.exponential(1.0, (n, width)) - 1e-3, 0.0)
    arrays["rewards"] = rng.integers(0, 2, n).astype(float)
    arrays["groups"] = np.repeat(np.arange(n // 2), 2)
    if mask:
        arrays["mask"] = valid
    p = tmp_path / f"padded_{int(mask)}.npz"
    np.savez(p, **arrays)
    return p


def test_padding_without_a_mask(cli: Cli, tmp_path: Path) -> None:
    lengths, width = [3, 6, 2, 8, 5, 8], 8
    bare = cli.json("objective", _padded(tmp_path, lengths, width, mask=False))
    masked = cli.json("objective", _padded(tmp_path, lengths, width, mask=True))
    # answers closing in 2+ zeros: those at least 2 shorter than the width
    closing = [L for L in lengths if width - L >= 2]
    ic = bare["input_checks"]
    assert ic["answers"] == 6 and ic["closing_zeros"] == len(closing) == 4
    assert ic["closing_zero_tokens"] == sum(width - L for L in closing)
    assert any("4 of 6 answers close with 2 or more exact 0.0" in w for w in bare["warnings"])
    assert any("--column mask=NAME" in w for w in bare["warnings"])
    # the padding dilutes the KL: k3 is 0 where every log-prob is 0, so the unmasked
    # token mean is the true one scaled by the real tokens' share
    assert bare["counts"]["tokens"] == 6 * width
    share = sum(lengths) / (6 * width)
    assert abs(bare["kl"]["mean"] - masked["kl"]["mean"] * share) < 1e-12
    assert masked["input_checks"]["closing_zeros"] == 0
    assert not any("exact 0.0" in w for w in masked["warnings"])
    r = json.loads(cli("check", _padded(tmp_path, lengths, width, mask=False), "--format",
                       "json").stdout)  # fmt: skip
    rule = next(x for x in r["results"] if x["rule"] == "unmasked-padding")
    assert rule["status"] == "fail" and rule["value"] == 4 / 6
    r = json.loads(cli("check", _padded(tmp_path, lengths, width, mask=True), "--format",
                       "json").stdout)  # fmt: skip
    assert next(x for x in r["results"] if x["rule"] == "unmasked-padding")["status"] == "pass"


def test_a_confident_last_token_is_not_padding(cli: Cli, tmp_path: Path) -> None:
    """One exact 0.0 closing every answer (an EOS of probability 1) is not a run."""
    rng = np.random.default_rng(2)
    lp = [np.append(-rng.exponential(1.0, k), 0.0) for k in (3, 4, 5, 6)]
    p = tmp_path / "eos.parquet"
    pq.write_table(pa.table({"group": ["a", "a", "b", "b"], "reward": [1.0, 0.0, 1.0, 0.0],
                             "logp": [x.tolist() for x in lp]}), p)  # fmt: skip
    doc = cli.json("objective", p, "--beta", "0")
    assert doc["input_checks"]["closing_zeros"] == 0
    assert not any("exact 0.0" in w for w in doc["warnings"])


def _rollout(tmp_path: Path, shift: int, *, row_group: int = 3) -> Path:
    """Answers whose ``rollout_logp`` is ``old_logp`` plus noise, shifted by ``shift``
    positions within each answer (``shift`` 1: the sampler's token t+1 is the trainer's t)."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(20, 60, 48)
    old, roll = [], []
    for k in lengths:
        x = -rng.exponential(1.0, k) - 1e-3
        y = x * np.exp(rng.normal(0, 0.01, k))  # log-probs stay < 0
        if shift:
            y = np.concatenate([x[:1] - 0.5, x[:-1]]) if shift == 1 else np.append(x[1:], -0.5)
        old.append(x.tolist())
        roll.append(y.tolist())
    p = tmp_path / f"rollout_{shift}.parquet"
    pq.write_table(pa.table({
        "group": np.repeat(np.arange(24), 2).astype(str), "reward": [1.0, 0.0] * 24,
        "logp": old, "old_logp": old, "rollout_logp": roll,
    }), p, row_group_size=row_group)  # fmt: skip
    return p


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(x, y)[0, 1])


def test_log_probs_shifted_against_the_sampler(cli: Cli, tmp_path: Path) -> None:
    ok = cli.json("objective", _rollout(tmp_path, 0), "--beta", "0")
    al = ok["input_checks"]["alignment"]
    assert al["same"] > 0.99 and al["next"] < 0.5 and al["previous"] < 0.5
    assert not any("shifted by one" in w for w in ok["warnings"])
    for shift, side in ((1, "next"), (-1, "previous")):
        p = _rollout(tmp_path, shift)
        doc = cli.json("objective", p, "--beta", "0")
        al = doc["input_checks"]["alignment"]
        # the correlations by hand, over every within-answer pair of the file
        t = pq.read_table(p)
        every = _mistakes.ALIGNMENT_EVERY  # the answers the check reads: every 8th by row
        xs = [np.array(v) for v in t["old_logp"].to_pylist()[::every]]
        ys = [np.array(v) for v in t["rollout_logp"].to_pylist()[::every]]
        same = _pearson(np.concatenate(xs), np.concatenate(ys))
        nxt = _pearson(np.concatenate([x[:-1] for x in xs]), np.concatenate([y[1:] for y in ys]))
        prev = _pearson(np.concatenate([x[1:] for x in xs]), np.concatenate([y[:-1] for y in ys]))
        assert al["pairs"] == sum(len(x) for x in xs)
        assert abs(al["same"] - same) < 1e-9 and abs(al["next"] - nxt) < 1e-9
        assert abs(al["previous"] - prev) < 1e-9
        assert max(al["next"], al["previous"]) == al[side] > 0.99 > al["same"]
        assert any(f"at the {side} position" in w for w in doc["warnings"])
        r = json.loads(cli("check", p, "--format", "json", "--beta", "0").stdout)
        rule = next(x for x in r["results"] if x["rule"] == "logp-alignment")
        assert rule["status"] == "fail" and f"the {side} position wins" in rule["message"]
    r = json.loads(cli("check", _rollout(tmp_path, 0), "--format", "json", "--beta", "0").stdout)
    assert next(x for x in r["results"] if x["rule"] == "logp-alignment")["status"] == "pass"


def test_check_places_are_the_answers_beyond_the_threshold(cli: Cli) -> None:
    """kl_spike: one answer's KL spikes (84.5); the others' largest KL is ~0.005, far
    below the threshold of 50: only the spike is a place to look."""
    from grpo_cli.core import kl_from_log_ratio

    path = Path(__file__).resolve().parents[1] / "sample_data" / "broken" / "kl_spike.parquet"
    t = pq.read_table(path)
    mask = t["mask"].to_pylist() if "mask" in t.column_names else None
    maxima = []
    for i, (lp, ref) in enumerate(
        zip(t["logp"].to_pylist(), t["ref_logp"].to_pylist(), strict=True)
    ):
        d = np.array(ref) - np.array(lp)
        if mask is not None:
            d = d[np.array(mask[i], dtype=bool)]
        maxima.append(float(np.max(kl_from_log_ratio(d, estimator="k3"))))
    beyond = [i for i, m in enumerate(maxima) if m > 50.0]
    r = json.loads(cli("check", path, "--format", "json").stdout)
    rule = next(x for x in r["results"] if x["rule"] == "kl-max")
    assert rule["status"] == "fail" and len(beyond) == 1
    assert [e["answer"] for e in rule["examples"]] == beyond
    assert "contribute most" not in rule["message"]


def test_alignment_sums_beyond_float64_are_no_correlation(cli: Cli, tmp_path: Path) -> None:
    """A sampler log-prob of 1e155 (its square overflows): no warning raised as an error,
    the correlation is null with its warning, the run goes on (found by test_fuzz)."""
    lp = [[-0.5, -1.0, -0.2, -0.7]] * 3
    roll = [[-0.5, 1e155, -0.2, -0.7]] * 3
    path = tmp_path / "huge.parquet"
    pq.write_table(pa.table({"logp": lp, "rollout_logp": roll, "advantage": [0.5, -0.5, 0.0]}),
                   path)  # fmt: skip
    doc = cli.json("objective", path, "--beta", "0")
    assert doc["input_checks"]["alignment"]["same"] is None
    assert any("beyond float64" in w for w in doc["warnings"])
    p = _mistakes._Pairs()
    with np.errstate(all="raise"):
        p.add(np.array([1e155, 1.0, 2.0]), np.array([1e155, 1.0, 3.0]))
    assert p.correlation() is None
