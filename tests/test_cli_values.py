"""More numbers through the CLI, each computed independently: KL, advantage variants,
aggregations, overflow. And the public surface."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import grpo_cli

from .conftest import Cli, random_batch, write_parquet


def test_the_public_surface_is_whole() -> None:
    """Every name in __all__ exists, and every type a public function takes or returns is
    public too (a caller of objective_report can name the record it gets)."""
    import inspect
    import typing

    public = set(grpo_cli.__all__)
    assert all(hasattr(grpo_cli, name) for name in public)
    own = {
        name
        for name in dir(grpo_cli)
        if isinstance(getattr(grpo_cli, name), type)
        and getattr(grpo_cli, name).__module__.startswith("grpo_cli")
    }
    for name in public:
        obj = getattr(grpo_cli, name)
        if not inspect.isfunction(obj):
            continue
        names = {n: getattr(grpo_cli, n) for n in public}  # names only imported for typing
        hints = typing.get_type_hints(obj, localns=names)
        for hint in hints.values():
            for t in (hint, *typing.get_args(hint)):
                mod = getattr(t, "__module__", "")
                if isinstance(t, type) and mod.startswith("grpo_cli"):
                    assert t.__name__ in public, (name, t.__name__)
    assert own <= public | {"SampleSpec"}, own - public


def test_kl_command_values(cli: Cli, tmp_path: Path) -> None:
    b = random_batch(np.random.default_rng(41), n=25, width=10)
    path = write_parquet(tmp_path / "b.parquet", b)
    x = [lp - r for lp, r in zip(b["logp"], b["ref_logp"], strict=True)]  # log π/π_ref
    k3 = [np.exp(-v) + v - 1 for v in x]
    doc = cli.json("kl", path)
    flat = np.concatenate(k3)
    assert doc["counts"] == {"answers": 25, "tokens": flat.size}
    assert math.isclose(doc["kl"]["mean"], flat.mean(), rel_tol=1e-12)
    assert math.isclose(doc["kl"]["std"], flat.std(), rel_tol=1e-9)
    assert doc["kl"]["min"] == flat.min() and doc["kl"]["max"] == flat.max()
    assert math.isclose(doc["kl"]["p95"], float(np.quantile(flat, 0.95)), rel_tol=1e-12)
    per_answer = np.array([v.mean() for v in k3])
    assert math.isclose(doc["kl_per_answer"]["mean"], per_answer.mean(), rel_tol=1e-12)
    assert math.isclose(doc["kl_per_answer"]["p50"], float(np.median(per_answer)), rel_tol=1e-12)
    k1 = cli.json("kl", path, "--kl-estimator", "k1")
    assert math.isclose(k1["kl"]["mean"], np.concatenate(x).mean(), rel_tol=1e-12)
    k2 = cli.json("kl", path, "--kl-estimator", "k2", "--kl-clamp", "0.01")
    assert k2["kl"]["max"] == 0.01
    assert k2["settings"] == {"kl_estimator": "k2", "kl_clamp": 0.01, "log_ratio_clamp": None}


def test_advantage_variants_through_the_cli(cli: Cli, tmp_path: Path) -> None:
    r = np.array([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]])
    np.savez(tmp_path / "r.npz", rewards=r)
    batch = cli.json("advantages", tmp_path / "r.npz", "--scale", "batch", "--eps", "0")
    centred = r - r.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(batch["advantages"], centred / r.std(), rtol=1e-14)
    rloo = cli.json("advantages", tmp_path / "r.npz", "--estimator", "rloo", "--scale", "none")
    np.testing.assert_allclose(rloo["advantages"], centred * 3 / 2, rtol=1e-14)
    sample = cli.json("advantages", tmp_path / "r.npz", "--ddof", "1", "--eps", "0")
    np.testing.assert_allclose(
        sample["advantages"], centred / r.std(axis=1, ddof=1)[:, None], rtol=1e-14
    )
    assert sample["groups"][0]["std"] == r[0].std(ddof=1)


def test_aggregations_in_json_by_hand(cli: Cli, tmp_path: Path) -> None:
    # two answers with advantages from the file, on-policy, beta 0: term = A per token
    logp = np.array([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, 0.0, 0.0]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=bool)
    np.savez(tmp_path / "a.npz", logp=logp, mask=mask, advantages=np.array([1.0, -3.0]))
    r = cli("objective", tmp_path / "a.npz", "--beta", "0", "--json")
    assert r.exit_code == 0 and "on-policy" in r.stderr
    agg = json.loads(r.stdout)["aggregations"]
    assert agg["seq-mean-token-mean"] == (1.0 - 3.0) / 2
    assert agg["token-mean"] == (4 * 1.0 - 2 * 3.0) / 6
    assert agg["seq-mean-token-sum"] == (4.0 - 6.0) / 2
    assert agg["seq-mean-token-sum-norm"] == (4.0 - 6.0) / (2 * 4)


def test_overflowing_ratio_is_reported_not_nan(cli: Cli, tmp_path: Path) -> None:
    logp = np.array([[-1.0, -1.0], [-1.0, -1.0]])
    old = np.array([[-801.0, -1.0], [-1.0, -1.0]])  # exp(800) overflows
    np.savez(tmp_path / "o.npz", logp=logp, old_logp=old, advantages=np.array([0.0, 1.0]))
    r = cli("objective", tmp_path / "o.npz", "--beta", "0", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["objective"] == 0.5  # A = 0 on the overflowing token: it contributes 0
    assert doc["ratio"]["overflow_tokens"] == 1 and doc["ratio"]["max"] is None  # inf → null
    assert doc["ratio"]["mean"] is None
    assert any("overflow" in w for w in doc["warnings"])
    np.savez(tmp_path / "n.npz", logp=logp, old_logp=old, advantages=np.array([-1.0, 1.0]))
    r = cli("objective", tmp_path / "n.npz", "--beta", "0", "--json")
    doc = json.loads(r.stdout)
    assert doc["objective"] is None and doc["loss"] is None  # −inf: no bound without dual clip
    assert any("not finite" in w for w in doc["warnings"])
    dual = cli.json("objective", tmp_path / "n.npz", "--beta", "0", "--dual-clip", "3")
    assert dual["objective"] == ((-3.0 - 1.0) / 2 + 1.0) / 2
    assert "NaN" not in r.stdout and "Infinity" not in r.stdout


def test_singleton_group_and_zero_variance_summary(cli: Cli, tmp_path: Path) -> None:
    b = random_batch(np.random.default_rng(42), n=5, width=4)
    b["group"] = np.array([0, 0, 1, 1, 2])
    b["reward"] = np.array([1.0, 0.0, 2.0, 2.0, 5.0])
    doc = cli.json("objective", write_parquet(tmp_path / "s.parquet", b))
    g = doc["groups"]
    assert (g["groups"], g["singleton_groups"], g["zero_variance_groups"]) == (3, 1, 2)
    assert g["frac_zero_std_answers"] == 3 / 5


def test_sampler_vs_trainer_by_hand(cli: Cli, tmp_path: Path) -> None:
    old = np.array([[-1.0, -1.0], [-2.0, 0.0]])
    rollout = np.array([[-1.5, -0.8], [-2.0, 0.0]])  # δ = old − rollout: 0.5, −0.2 | 0
    mask = np.array([[True, True], [True, False]])
    np.savez(
        tmp_path / "r.npz",
        logp=old,
        old_logp=old,
        rollout_log_probs=rollout,
        mask=mask,
        advantages=np.array([1.0, -1.0]),
    )
    ro = cli.json("objective", tmp_path / "r.npz", "--beta", "0")["rollout"]
    d = np.array([0.5, -0.2, 0.0])
    rho = np.exp(d)
    assert ro["tokens"] == 3 and ro["answers"] == 2
    assert math.isclose(ro["abs_diff_mean"], 0.7 / 3, rel_tol=1e-12)
    assert ro["abs_diff_max"] == 0.5
    assert math.isclose(ro["kl_k1"], -0.1, rel_tol=1e-12)
    assert math.isclose(ro["kl_k3"], float(np.mean(rho - d - 1)), rel_tol=1e-12)
    assert math.isclose(ro["chi2_token"], float(np.mean(rho**2)) - 1, rel_tol=1e-12)
    assert math.isclose(ro["is_weight_mean"], float(rho.mean()), rel_tol=1e-12)
    assert math.isclose(ro["is_weight_min"], math.exp(-0.2), rel_tol=1e-14)
    assert ro["is_weight_max"] == math.exp(0.5)
    assert math.isclose(ro["ess_token"], float(rho.mean() ** 2 / np.mean(rho**2)), rel_tol=1e-12)
    w = np.array([math.exp(0.3), 1.0])  # answer weights exp(Σ δ)
    assert math.isclose(ro["ess_sequence"], float(w.sum() ** 2 / (2 * (w**2).sum())), rel_tol=1e-12)
    dp = [abs(math.exp(-1.0) - math.exp(-1.5)), abs(math.exp(-1.0) - math.exp(-0.8)), 0.0]
    assert math.isclose(ro["prob_abs_diff_mean"], sum(dp) / 3, rel_tol=1e-12)
    # no rollout_logp: the section is absent
    assert (
        cli.json("objective", tmp_path / "r.npz", "-c", "rollout_logp=logp", "--beta", "0")[
            "rollout"
        ]["kl_k3"]
        == 0.0
    )


def test_sampler_vs_trainer_streams_like_one_batch(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    b = random_batch(np.random.default_rng(43), n=80, width=15)
    rng = np.random.default_rng(44)
    rollout = [o + rng.normal(0, 0.05, size=o.size) for o in b["old_logp"]]
    col = pa.array([r.tolist() for r in rollout], type=pa.list_(pa.float64()))
    path = write_parquet(tmp_path / "b.parquet", b, rollout_logp=col)
    whole = cli.json("objective", path)["rollout"]
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "40")
    parts = cli.json("objective", path)["rollout"]
    support, support_parts = whole.pop("support"), parts.pop("support")
    named, named_parts = whole.pop("by_trainer"), parts.pop("by_trainer")
    for trainer, values in named.items():  # every trainer's mismatch metric merges too
        for k, v in values.items():
            assert math.isclose(named_parts[trainer][k], v, rel_tol=1e-9, abs_tol=1e-12), k
    for k, v in whole.items():  # chi² = mean(ρ²) − 1 is a difference near 0: absolute
        assert math.isclose(parts[k], v, rel_tol=1e-12, abs_tol=1e-12), k
    assert support.keys() == support_parts.keys()  # the sampler's support merges too
    for k, v in support.items():
        assert math.isclose(support_parts[k], v, rel_tol=1e-12, abs_tol=1e-12), k


def test_entropy_statistics_and_checks(cli: Cli, tmp_path: Path) -> None:
    import pyarrow as pa

    b = random_batch(np.random.default_rng(45), n=30, width=12)
    rng = np.random.default_rng(46)
    ent = [rng.exponential(1.0, size=k) for k in b["lengths"]]
    col = pa.array([e.tolist() for e in ent], type=pa.list_(pa.float64()))
    path = write_parquet(tmp_path / "e.parquet", b, entropys=col)  # verl's name
    doc = cli.json("objective", path)
    flat = np.concatenate(ent)
    e = doc["entropy"]
    assert e["count"] == flat.size and e["max"] == flat.max() and e["min"] == flat.min()
    assert math.isclose(e["mean"], flat.mean(), rel_tol=1e-12)
    assert math.isclose(e["p50"], float(np.median(flat)), rel_tol=1e-12)
    assert cli.json("objective", write_parquet(tmp_path / "n.parquet", b))["entropy"] is None
    # entropies are positive: check must not count them as log-probs above 0
    r = cli("check", path, "--format", "json")
    rng_rule = next(x for x in json.loads(r.stdout)["results"] if x["rule"] == "logp-range")
    positive = sum(int((x > 0).sum()) for f in ("logp", "old_logp", "ref_logp") for x in b[f])
    assert rng_rule["value"] == positive
    assert all(ex["field"] != "entropys" for ex in rng_rule["examples"])
    # a NaN entropy inside the mask: objective refuses, check points at it
    ent[4][2] = np.nan
    col = pa.array([x.tolist() for x in ent], type=pa.list_(pa.float64()))
    bad = write_parquet(tmp_path / "b.parquet", b, entropys=col)
    r = cli("objective", bad)
    assert (
        r.exit_code == 2
        and "'entropys' has nan (no mask: every token counts) at row 4, token 2" in r.stderr
    )
    r = cli("check", bad, "--format", "json")
    finite = next(x for x in json.loads(r.stdout)["results"] if x["rule"] == "finite")
    assert r.exit_code == 1 and finite["examples"][0]["field"] == "entropys"
