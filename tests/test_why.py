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


# ------------------------------------------------------------- the sampler's support (B)
def _lsm(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    out: np.ndarray = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
    return out


def _sampled(sampler: str, seed: int = 0, n: int = 64, length: int = 40, vocab: int = 50) -> Any:
    """Random logits z (scales 0.5-4 by position); the trainer's policy softmax(z); the
    sampler's: top-p 0.8 of it renormalised, softmax(z / 0.7), or softmax(z + N(0, 0.02))
    (a precision mismatch). A token is drawn from the sampler at every position; returns
    the trainer's and the sampler's log-probs of it, the trainer's entropy, and each
    position's kept mass (top-p)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, length, vocab)) * rng.uniform(0.5, 4, size=(n, length, 1))
    lp = _lsm(z)
    p = np.exp(lp)
    kept = np.ones((n, length))
    if sampler == "top-p":
        order = np.argsort(-p, -1)
        ps = np.take_along_axis(p, order, -1)
        keep_sorted = ps.cumsum(-1) - ps < 0.8  # the smallest set whose mass reaches 0.8
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        kept = np.where(keep, p, 0.0).sum(-1)
        q = np.where(keep, p, 0.0) / kept[..., None]
    elif sampler == "tempered":
        q = np.exp(_lsm(z / 0.7))
    else:
        q = np.exp(_lsm(z + rng.normal(size=z.shape) * 0.02))
    tok = (rng.random((n, length, 1)) < q.cumsum(-1)).argmax(-1)
    old = np.take_along_axis(lp, tok[..., None], -1)[..., 0]
    rollout = np.log(np.take_along_axis(q, tok[..., None], -1)[..., 0])
    entropy = -(p * lp).sum(-1)
    return old, rollout, entropy, kept


def _sampler_file(tmp_path: Path, sampler: str, seed: int = 0) -> tuple[Path, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    old, rollout, entropy, kept = _sampled(sampler, seed)
    n = old.shape[0]
    t = pa.table({
        "group": np.repeat(np.arange(n // 8), 8), "reward": np.arange(n) % 3 * 1.0,
        "logp": list(old), "old_logp": list(old), "rollout_logp": list(rollout),
        "entropy": list(entropy),
    })  # fmt: skip
    path = tmp_path / f"{sampler}.parquet"
    pq.write_table(t, path)
    return path, (old, rollout, entropy, kept)


def _rule(cli: Cli, path: Path) -> dict[str, Any]:
    doc = json.loads(cli("check", path, "--beta", "0", "--format", "json").stdout)
    res: dict[str, Any] = next(x for x in doc["results"] if x["rule"] == "sampler-support")
    return res


def test_a_top_p_sampler_is_named_with_its_kept_mass(cli: Cli, tmp_path: Path) -> None:
    path, (old, rollout, entropy, kept) = _sampler_file(tmp_path, "top-p")
    delta = (old - rollout).ravel()
    assert np.allclose(delta, np.log(kept).ravel())  # δ = log kept mass, by construction
    res = _rule(cli, path)
    assert res["status"] == "fail" and res["value"] == pytest.approx(1.0)
    assert res["message"].startswith("a truncated sampler")
    sp = cli.json("objective", path, "--beta", "0")["rollout"]["support"]
    assert sp["below"] == delta.size and sp["above"] == 0
    # ρ raw is the kept mass itself; the geometric mean of the kept mass is exp(mean δ)
    assert sp["is_weight_mean"] == pytest.approx(kept.mean(), rel=1e-9)
    assert sp["kept_mass"] == pytest.approx(np.exp(np.log(kept).mean()), rel=1e-9)
    assert sp["corr_entropy"] < -0.5  # less mass kept where the distribution is flat
    # corrected by entropy bin (0.25 nats): the kept mass divided out, ρ back near 1
    bins = np.minimum((entropy.ravel() / 0.25).astype(int), 39)
    log_k = np.bincount(bins, np.log(kept).ravel(), 40) / np.maximum(np.bincount(bins, None, 40), 1)
    want = np.mean(kept.ravel() / np.exp(log_k[bins]))
    assert sp["corrected_by"] == "entropy"
    assert sp["is_weight_mean_corrected"] == pytest.approx(want, rel=1e-9)
    assert abs(want - 1) < 0.01 < abs(kept.mean() - 1)
    ex = cli.json("explain", path, "--beta", "0")
    f = [x for x in ex["findings"] if x["id"] == "sampler-support"]
    assert len(f) == 1 and f[0]["severity"] == "alarm"
    assert f[0]["evidence"]["signature"] == "truncated"
    assert "keep-sampling mask" in f[0]["message"]


def test_a_tempered_sampler_is_named(cli: Cli, tmp_path: Path) -> None:
    path, (old, rollout, _, _) = _sampler_file(tmp_path, "tempered")
    d, r = (old - rollout).ravel(), rollout.ravel()
    corr = float(np.corrcoef(d, r)[0, 1])
    assert corr < -0.6  # log p_T = log p / T + c: δ falls as the token's log-prob rises
    res = _rule(cli, path)
    assert res["status"] == "warn" and res["value"] == pytest.approx(abs(corr), rel=1e-9)
    assert res["message"].startswith("a tempered sampler (temperature below 1")
    ex = cli.json("explain", path, "--beta", "0")
    f = [x for x in ex["findings"] if x["id"] == "sampler-support"]
    assert len(f) == 1 and f[0]["evidence"]["signature"] == "tempered"
    assert "kept_mass" not in f[0]["evidence"]  # a temperature keeps every token


def test_an_untruncated_sampler_is_not_named(cli: Cli, tmp_path: Path) -> None:
    for seed in (0, 1, 2):
        path, _ = _sampler_file(tmp_path, "precision", seed)
        res = _rule(cli, path)
        assert res["status"] == "pass" and res["value"] < 0.1, res
        assert res["message"].startswith("no sign of")
        ex = cli.json("explain", path, "--beta", "0")
        assert not [x for x in ex["findings"] if x["id"] == "sampler-support"]


def test_the_support_sums_merge() -> None:
    from grpo_cli.fold.sampler import SupportSums

    old, rollout, entropy, _ = _sampled("top-p", 3, n=8)
    d, r, e = (old - rollout).ravel(), rollout.ravel(), entropy.ravel()
    one, a, b = SupportSums(), SupportSums(), SupportSums()
    one.update(d, r, e)
    a.update(d[:100], r[:100], e[:100])
    b.update(d[100:], r[100:], e[100:])
    x, y = one.report(), a.merge(b).report()
    assert x is not None and y is not None
    for k, v in x.to_json().items():
        assert y.to_json()[k] == (pytest.approx(v, rel=1e-9) if isinstance(v, float) else v)


def test_sampling_settings_from_every_trainers_config() -> None:
    from grpo_cli.causes import sampler_in_effect, sampler_settings

    trl = {"temperature": 1.0, "top_p": 0.8, "top_k": 0, "min_p": None,
           "sapo_temperature_neg": 1.05}  # fmt: skip
    verl = {"actor_rollout_ref.rollout.temperature": 0.7, "actor_rollout_ref.rollout.top_k": -1,
            "actor_rollout_ref.rollout.logprobs_mode": "processed_logprobs"}  # fmt: skip
    orl = {"rollout.top_p": 1.0, "rollout.temperature": 1.0}
    assert sampler_in_effect(sampler_settings(trl)) == ["top_p 0.8"]
    assert sampler_settings(verl)["logprobs_mode"] == "processed_logprobs"
    assert sampler_in_effect(sampler_settings(verl)) == ["temperature 0.7"]
    assert sampler_in_effect(sampler_settings(orl)) == []


# ------------------------------------------------- per-process vs global reduction (A)
def _two_ranks(run_dir: Path, to: Path, step: int) -> Path:
    """The run copied with step ``step``'s every call file split into two ranks (its
    first answer on rank 0, the rest on rank 1), as a world of 2 records it."""
    import pyarrow.parquet as pq

    shutil.copytree(run_dir, to)
    meta = json.loads((to / "meta.json").read_text())
    meta["world_size"] = 2
    (to / "meta.json").write_text(json.dumps(meta))
    d = to / f"step_{step:06d}"
    for p in sorted(d.glob("rank000-mb*.parquet")):
        t = pq.read_table(p)
        md = dict(t.schema.metadata or {})
        info = json.loads(md[b"grpo_cli"])
        half = 1
        for rank, part in ((0, t.slice(0, half)), (1, t.slice(half))):
            md[b"grpo_cli"] = json.dumps(info | {"rank": rank, "world_size": 2}).encode()
            name = p.name.replace("rank000", f"rank{rank:03d}")
            pq.write_table(part.replace_schema_metadata(md), d / name)
    for rank in (0, 1):
        (d / f"_DONE.rank{rank:03d}").touch()
    return d


def _entropy_means(d: Path) -> dict[tuple[int, int], tuple[float, int]]:
    """Each (call, rank) file's mean entropy over its valid tokens, and their count."""
    import pyarrow.parquet as pq

    out = {}
    for p in sorted(d.glob("rank*-mb*.parquet")):
        t = pq.read_table(p).to_pydict()
        e = np.concatenate([np.asarray(x, dtype=np.float64) for x in t["entropy"]])
        m = np.concatenate([np.asarray(x, dtype=bool) for x in t["mask"]]) if "mask" in t else None
        e = e if m is None else e[m]
        rank, call = (int(x) for x in p.stem.replace("rank", "").split("-mb"))
        out[(call, rank)] = (float(e.mean()), int(e.size))
    return out


def test_a_metric_logged_as_the_mean_of_the_ranks_means(
    cli: Cli, trl_run: Any, tmp_path: Path
) -> None:
    run = trl_run("ga2_dapo")
    d = _two_ranks(run.directory, tmp_path / "w2", 2)
    per = _entropy_means(d)
    calls = sorted({c for c, _ in per})
    pooled = np.mean([
        sum(per[(c, r)][0] * per[(c, r)][1] for r in (0, 1)) / sum(per[(c, r)][1] for r in (0, 1))
        for c in calls
    ])  # fmt: skip
    rank_mean = float(np.mean([np.mean([per[(c, r)][0] for r in (0, 1)]) for c in calls]))
    assert abs(rank_mean - pooled) > 1e-4 * abs(pooled)  # the ranks' token counts differ
    doc = cli.json("objective", d)
    assert doc["trainer_metrics"]["metrics"]["entropy"] == pytest.approx(pooled, rel=1e-9)  # TRL
    assert _causes(doc) == {}  # the split alone changes nothing TRL 1.16 logs
    p = d.parent / "metrics.jsonl"
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    for r in rows:
        if r.get("step") == 2 and "entropy" in r:
            r["entropy"] = float(np.float32(rank_mean))  # as a trainer before TRL #6380 logs it
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # (a difference of 4e-4: under the default tolerance of 1e-3, so asked tighter)
    cause = _causes(cli.json("objective", d, "--logged-tolerance", "1e-5"))["entropy"]
    assert cause["found"] and cause["id"] == "rank-mean" and "#6380" in cause["cite"]
    assert cause["predicted"] == pytest.approx(rank_mean, rel=1e-9)


def test_one_value_per_optimizer_window() -> None:
    from grpo_cli.fold.calls import Folded, _alternatives
    from grpo_cli.trainers.trl import CALLS

    # a logging interval of two windows: 2 calls, then a short one of 1 (TRL #7047)
    calls: list[dict[str, float | None]] = [{"entropy": 1.0}, {"entropy": 2.0}, {"entropy": 6.0}]
    f = Folded(calls=calls, losses=[[0.1], [0.2], [0.3]], windows=[2, 1])
    flat = (1.0 + 2.0 + 6.0) / 3  # what TRL 1.16 logs: the mean over the calls
    got = _alternatives(CALLS, f, 2, {"entropy": flat})
    assert got["window-mean"] == {"entropy": ((1.0 + 2.0) / 2 + 6.0) / 2}
    assert "rank-mean" not in got  # one rank
    even = Folded(calls=calls[:2], losses=[[0.1], [0.2]], windows=[1, 1])
    assert _alternatives(CALLS, even, 2, {"entropy": 1.5}) == {}  # equal windows: the same


# ------------------------------------------------------- causes from the configuration (C)
A_ = "actor_rollout_ref.actor."
VERL_ON_POLICY = {
    "algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": False,
    A_ + "use_kl_loss": False, A_ + "ppo_epochs": 1, A_ + "ppo_mini_batch_size": 4,
    "data.train_batch_size": 4, A_ + "ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
}  # fmt: skip


def _verl_run(
    root: Path, config: dict[str, Any], *, noise: float, ref: str = "none", step: int = 2
) -> Path:
    """A recorded verl step (``step``; 2: after an update) of 8 answers of 6 tokens:
    logp = old_logp + N(0, noise) (0: the same bits), ref_logp absent, independent
    (``"other"``) or logp itself (``"same"``)."""
    from grpo_cli.integrations._writer import RunWriter, rollout_table

    rng = np.random.default_rng(7)
    n, width = 8, 6
    old = -rng.exponential(1.0, (n, width))
    logp = old + rng.normal(0, noise, (n, width)) if noise else old.copy()
    tokens = {"logp": np.minimum(logp, -1e-3) if noise else logp, "old_logp": old}
    if ref == "other":
        tokens["ref_logp"] = np.minimum(old + rng.normal(0, 0.1, (n, width)), -1e-3)
    elif ref == "same":
        tokens["ref_logp"] = tokens["logp"].copy()
    w = RunWriter(root, trainer="verl", trainer_version="0.9.1", config=config)
    t = rollout_table(
        group=[f"g{i // 4}" for i in range(n)], reward=rng.integers(0, 2, n).astype(float),
        advantage=None,
        mask=np.ones((n, width), bool), tokens=tokens,
    )  # fmt: skip
    w.write_micro_batch(step, 0, t, {"micro_batches": 1})
    w.finish_step(step)
    return root / f"step_{step:06d}"


def _finding(cli: Cli, step: Path, fid: str) -> list[dict[str, Any]]:
    ex = cli.json("explain", step)
    return [x for x in ex["findings"] if x["id"] == fid]


def _config_rule(cli: Cli, step: Path) -> dict[str, Any]:
    doc = json.loads(cli("check", step, "--format", "json").stdout)
    res: dict[str, Any] = next(x for x in doc["results"] if x["rule"] == "config-causes")
    return res


def test_unequal_micro_batches_in_an_on_policy_run(cli: Cli, tmp_path: Path) -> None:
    roll = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    cfg = VERL_ON_POLICY | {roll: 16}
    step = _verl_run(tmp_path / "a", cfg, noise=0.2)
    f = _finding(cli, step, "micro-batch-mismatch")
    assert len(f) == 1 and f[0]["evidence"][roll] == 16
    assert f[0]["evidence"]["clip_region"] > 0 and "verl #6280" in f[0]["message"]
    res = _config_rule(cli, step)
    assert res["status"] == "warn" and res["value"] == 1
    assert res["message"].startswith("micro-batch-mismatch: on-policy by its config")
    # equal sizes, ρ = 1 (no symptom), or several epochs (off-policy by design): nothing
    for where, c, noise in (("b", VERL_ON_POLICY, 0.2), ("c", cfg, 0.0),
                            ("d", cfg | {A_ + "ppo_epochs": 2}, 0.2)):  # fmt: skip
        s = _verl_run(tmp_path / where, c, noise=noise)
        assert not _finding(cli, s, "micro-batch-mismatch")
        assert _config_rule(cli, s)["status"] == "pass"


def test_kl_in_the_reward_and_in_the_loss(cli: Cli, tmp_path: Path) -> None:
    both = VERL_ON_POLICY | {
        "algorithm.use_kl_in_reward": True, A_ + "use_kl_loss": True,
        "algorithm.kl_ctrl.kl_coef": 0.001, A_ + "kl_loss_coef": 0.01,
    }  # fmt: skip
    step = _verl_run(tmp_path / "a", both, noise=0.0, ref="other")
    f = _finding(cli, step, "kl-twice")
    assert len(f) == 1 and "kl_loss_coef 0.01" in f[0]["message"]
    assert _config_rule(cli, step)["message"].startswith("kl-twice:")
    one = both | {"algorithm.use_kl_in_reward": False}
    assert not _finding(cli, _verl_run(tmp_path / "b", one, noise=0.0, ref="other"), "kl-twice")


def test_a_reference_that_is_the_policy(cli: Cli, tmp_path: Path) -> None:
    kl = VERL_ON_POLICY | {A_ + "use_kl_loss": True, A_ + "kl_loss_coef": 0.01}
    step = _verl_run(tmp_path / "a", kl, noise=0.0, ref="same")
    f = _finding(cli, step, "reference-is-policy")
    assert len(f) == 1 and f[0]["evidence"]["tokens"] == 48 and f[0]["evidence"]["beta"] == 0.01
    assert _config_rule(cli, step)["value"] == 1
    other = _verl_run(tmp_path / "b", kl, noise=0.0, ref="other")
    assert not _finding(cli, other, "reference-is-policy")
    # the first step is taken before any update: the reference is the policy by design
    first = _verl_run(tmp_path / "d", kl, noise=0.0, ref="same", step=1)
    assert not _finding(cli, first, "reference-is-policy")
    off = VERL_ON_POLICY  # β = 0: a reference that is the policy changes nothing
    assert not _finding(cli, _verl_run(tmp_path / "c", off, noise=0.0, ref="same"),
                        "reference-is-policy")  # fmt: skip


# ------------------------------------------------------------- where it happens (D)
def _entropy_file(tmp_path: Path, k: int | None, name: str) -> Path:
    """24 answers of 100 tokens whose logged entropy is U(1, 3) nats, then, from position
    ``k`` on (None: never), U(0, 0.02)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(11)
    n, length = 24, 100
    ent = rng.uniform(1, 3, (n, length))
    if k is not None:
        ent[:, k:] = rng.uniform(0, 0.02, (n, length - k))
    old = -rng.exponential(1.0, (n, length))
    t = pa.table({
        "group": np.repeat(np.arange(n // 4), 4), "reward": np.arange(n) % 2 * 1.0,
        "logp": list(old), "old_logp": list(old), "entropy": list(ent),
    })  # fmt: skip
    path = tmp_path / f"{name}.parquet"
    pq.write_table(t, path)
    return path


@pytest.mark.parametrize("k", [40, 48, 70])
def test_explain_names_the_positions_where_the_entropy_collapses(
    cli: Cli, tmp_path: Path, k: int
) -> None:
    from grpo_cli.fold.where import POSITION_EDGES

    path = _entropy_file(tmp_path, k, f"k{k}")
    ex = cli.json("explain", path, "--beta", "0")
    f = [x for x in ex["findings"] if x["id"] == "entropy-collapse-position"]
    assert len(f) == 1
    lo, hi = f[0]["evidence"]["positions"]
    i = int(np.searchsorted(POSITION_EDGES, k, side="right")) - 1  # the bucket holding k
    assert (lo, hi) == (POSITION_EDGES[i], POSITION_EDGES[i + 1]) and lo <= k < hi
    assert f"positions {lo}–{hi - 1}" in f[0]["message"]
    assert f[0]["evidence"]["entropy_before"] > 1 > 0.02 > f[0]["evidence"]["entropy_after"]
    # the buckets' token counts are the answers' positions, counted independently
    counts = {b["lo"]: b["tokens"] for b in f[0]["evidence"]["buckets"]}
    assert counts[0] == 24 * 16 and counts[96] == 24 * 4 and sum(counts.values()) == 2400


def test_no_collapse_no_position_finding(cli: Cli, tmp_path: Path) -> None:
    ex = cli.json("explain", _entropy_file(tmp_path, None, "flat"), "--beta", "0")
    assert not [x for x in ex["findings"] if x["id"].endswith("-position")]
    # objective and check do not fold positions at all
    doc = cli.json("objective", _entropy_file(tmp_path, 40, "k"), "--beta", "0")
    assert "positions" not in json.dumps(doc)


def test_position_sums_merge_across_batches() -> None:
    from grpo_cli.batch import Batch
    from grpo_cli.fold.where import PositionSums

    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 700, 30)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ent = rng.uniform(0, 3, int(offsets[-1]))
    logp = -rng.exponential(1.0, int(offsets[-1]))

    def batch(i: int, j: int) -> Batch:
        lo, hi = int(offsets[i]), int(offsets[j])
        return Batch(start=i, offsets=offsets[i : j + 1] - lo,
                     fields={"logp": logp[lo:hi], "entropy": ent[lo:hi]},
                     width=lengths[i:j].astype(np.int64))  # fmt: skip

    one, a, b = PositionSums(True), PositionSums(True), PositionSums(True)
    one.update(batch(0, 30), lambda d: d)
    a.update(batch(0, 11), lambda d: d)
    b.update(batch(11, 30), lambda d: d)
    x, y = one.report(), a.merge(b).report()
    assert x is not None and y is not None and len(x) == len(y)
    for p, q in zip(x, y, strict=True):
        assert (p.lo, p.hi, p.tokens) == (q.lo, q.hi, q.tokens)
        assert p.entropy == pytest.approx(q.entropy, rel=1e-12)
    # position t of an answer is in bucket t // 16 below 512: counted by hand
    want = sum(int(min(n, 16)) for n in lengths)
    assert x[0].lo == 0 and x[0].tokens == want


# ----------------------------------------- every trainer's mismatch metric by its name (E)
def test_every_trainers_mismatch_metric(cli: Cli, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grpo_cli.losses.openrlhf import openrlhf_is_correction
    from grpo_cli.losses.trl import trl_vllm_is_correction
    from grpo_cli.losses.verl_rollout import verl_rollout_correction

    rng = np.random.default_rng(5)
    lengths = rng.integers(3, 30, 40)
    old_l = [-rng.exponential(1.0, n) for n in lengths]
    roll_l = [np.minimum(o + rng.normal(0, 0.1, o.size), -1e-4) for o in old_l]
    t = pa.table({"group": np.repeat(np.arange(10), 4), "reward": np.arange(40) % 2 * 1.0,
                  "logp": old_l, "old_logp": old_l, "rollout_logp": roll_l})  # fmt: skip
    path = tmp_path / "m.parquet"
    pq.write_table(t, path)
    got = cli.json("objective", path, "--beta", "0")["rollout"]["by_trainer"]
    old, roll = np.concatenate(old_l), np.concatenate(roll_l)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    d = old - roll
    m = np.array([x.mean() - y.mean() for x, y in zip(old_l, roll_l, strict=True)])
    pd = [np.exp(x) - np.exp(y) for x, y in zip(old_l, roll_l, strict=True)]
    mix = np.log(0.5 * np.exp(old) + 0.5 * np.exp(roll))

    def k3(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.exp(x) - x - 1
        return out

    want = {
        ("nemo-rl", "token_mult_prob_error"): np.mean(np.exp(np.abs(d))),
        ("nemo-rl", "gen_kl_error"): np.mean(k3(d)),
        ("nemo-rl", "policy_kl_error"): np.mean(k3(-d)),
        ("nemo-rl", "js_divergence_error"): np.mean(0.5 * k3(old - mix) + 0.5 * k3(roll - mix)),
        ("skyrl", "policy/rollout_train_logprobs_abs_diff_mean"): np.mean(np.abs(d)),
        ("skyrl", "policy/rollout_train_logprobs_abs_diff_std"): np.std(np.abs(d), ddof=1),
        ("roll", "actor/train_infer_ratio_token_mean"):
            np.mean([np.exp(x - y).mean() for x, y in zip(old_l, roll_l, strict=True)]),
        ("roll", "actor/train_infer_ratio_geometric_mean"): np.mean(np.exp(m)),
        ("roll", "actor/train_infer_ratio_sequence_mean"):
            np.mean([np.exp(np.sum(x - y)) for x, y in zip(old_l, roll_l, strict=True)]),
        ("roll", "actor/train_infer_diff_token_mean"): np.mean([x.mean() for x in pd]),
        ("roll", "actor/train_infer_diff_sequence_mean"): np.mean([x.sum() for x in pd]),
        ("verl", "rollout_corr/log_ppl_abs_diff"): np.mean(np.abs(m)),
    }  # fmt: skip
    # the trainers' own metrics, as grpo-cli's mirrors of their code compute them
    # (conformance/losses.py checks the mirrors against the trainers themselves)
    v = verl_rollout_correction(old, roll, offsets).metrics
    for k in ("kl", "k3_kl", "chi2_token", "log_ppl_diff", "ppl_ratio"):
        want[("verl", f"rollout_corr/{k}")] = v[f"rollout_corr/{k}"]
    o = openrlhf_is_correction(old, roll, offsets, level="token").metrics
    want[("openrlhf", "vllm_kl")] = o["vllm_kl"]
    tr = trl_vllm_is_correction(old, roll, offsets).metrics
    for k in ("mean", "max"):
        name = f"sampling/sampling_logp_difference/{k}"
        want[("trl", name)] = tr[name]
    for (trainer, name), value in want.items():
        assert got[trainer][name] == pytest.approx(value, rel=1e-6, abs=1e-12), (trainer, name)


def test_the_runs_sampling_settings_are_named(cli: Cli, tmp_path: Path) -> None:
    from grpo_cli.integrations._writer import RunWriter, rollout_table

    old, rollout, _, _ = _sampled("top-p", 4, n=16)
    roll = "actor_rollout_ref.rollout."
    cfg = VERL_ON_POLICY | {roll + "top_p": 0.8, roll + "temperature": 1.0, roll + "top_k": -1,
                            roll + "logprobs_mode": "processed_logprobs"}  # fmt: skip
    w = RunWriter(tmp_path / "run", trainer="verl", trainer_version="0.9.1", config=cfg)
    t = rollout_table(
        group=[f"g{i // 4}" for i in range(16)], reward=np.arange(16) % 2 * 1.0,
        advantage=None, mask=np.ones(old.shape, bool),
        tokens={"logp": old, "old_logp": old, "rollout_logp": rollout},
    )  # fmt: skip
    w.write_micro_batch(1, 0, t, {"micro_batches": 1})
    w.finish_step(1)
    res = _rule(cli, tmp_path / "run" / "step_000001")
    assert res["status"] == "fail" and res["message"].startswith("a truncated sampler")
    assert res["message"].endswith(
        "; the run's config: top_p 0.8, logprobs_mode processed_logprobs"
    )  # temperature 1 and top_k -1 change nothing: not named
    # without the entropy logged, the kept mass is divided out over the batch
    assert "divided out" in res["message"] and "over the batch" in res["message"]


def test_explain_names_where_the_kl_sits_when_it_drifts(cli: Cli, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(12)
    n, length = 16, 100
    logp = -rng.exponential(1.0, (n, length))
    ref = logp - rng.normal(0, 0.01, (n, length))
    ref[:, 64:80] = logp[:, 64:80] - 3.0  # the reference far away at positions 64-79 only
    t = pa.table({"group": np.repeat(np.arange(4), 4), "reward": np.arange(n) % 2 * 1.0,
                  "logp": list(logp), "old_logp": list(logp), "ref_logp": list(ref)})  # fmt: skip
    path = tmp_path / "kl.parquet"
    pq.write_table(t, path)
    ex = cli.json("explain", path)
    f = [x for x in ex["findings"] if x["id"] == "kl-position"]
    assert len(f) == 1 and f[0]["evidence"]["positions"] == [64, 80]
    k3 = np.exp(ref - logp) - (ref - logp) - 1  # the per-token KL, by hand
    assert f[0]["evidence"]["share"] == pytest.approx(k3[:, 64:80].sum() / k3.sum(), rel=1e-9)
    assert f[0]["evidence"]["token_share"] == pytest.approx(16 / 100)
    # the KL spread evenly: kl-mean does not warn, no position is named
    even = pa.table({"group": np.repeat(np.arange(4), 4), "reward": np.arange(n) % 2 * 1.0,
                     "logp": list(logp), "old_logp": list(logp),
                     "ref_logp": list(logp - rng.normal(0, 0.01, (n, length)))})  # fmt: skip
    pq.write_table(even, tmp_path / "even.parquet")
    ex = cli.json("explain", tmp_path / "even.parquet")
    assert not [x for x in ex["findings"] if x["id"] == "kl-position"]


# ------------------------------------------------------- before vs after the IS weights' cap
def _capped_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """Answers whose sampler log-probs are far enough from the trainer's that some of the
    ratios exp(old − rollout) exceed 2; the raw ratios, flat."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    lengths = rng.integers(5, 20, 32)
    old = [-rng.exponential(1.0, n) for n in lengths]
    roll = [np.minimum(o - rng.normal(0, 0.6, o.size), -1e-4) for o in old]
    t = pa.table({"group": np.repeat(np.arange(8), 4), "reward": np.arange(32) % 2 * 1.0,
                  "logp": old, "old_logp": old, "rollout_logp": roll})  # fmt: skip
    path = tmp_path / "capped.parquet"
    pq.write_table(t, path)
    return path, np.exp(np.concatenate(old) - np.concatenate(roll))


CAPS = {
    "trl": ("sampling/importance_sampling_ratio/mean",
            ["--preset", "trl", "--correction", "trl-vllm", "--correction-param",
             "vllm_is_mode=token_truncate", "--correction-param", "vllm_is_clip_max=2"]),
    "verl": ("rollout_corr/rollout_is_mean",
             ["--preset", "verl", "--beta", "0", "--correction", "verl-rollout",
              "--correction-param", "rollout_is=token",
              "--correction-param", "rollout_is_threshold=2"]),
}  # fmt: skip


@pytest.mark.parametrize("trainer", list(CAPS))
def test_an_is_weight_logged_before_its_cap(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer: str
) -> None:
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "40")  # several batches: the partial merges
    path, rho = _capped_file(tmp_path)
    assert 0.05 < np.mean(rho > 2) < 0.5  # the cap binds on some tokens
    metric, flags = CAPS[trainer]
    capped, raw = np.minimum(rho, 2.0).mean(), rho.mean()  # the trainer's, the raw (by hand)
    logged = tmp_path / "logged.json"

    def cause_of(value: float) -> dict[str, Any] | None:
        logged.write_text(json.dumps({metric: value}))
        doc = cli.json("objective", path, *flags, "--logged", logged)
        row = next(m for m in doc["logged"]["metrics"] if m["metric"] == metric)
        assert row["recomputed"] == pytest.approx(capped, rel=1e-7)
        return row.get("cause")

    cause = cause_of(float(np.float32(raw)))  # logged as a float32, before the cap
    assert cause is not None and cause["found"] and cause["id"] == "before-cap"
    assert cause["predicted"] == pytest.approx(raw, rel=1e-7)
    assert "before their cap" in cause["words"] and "compute_is_metrics" in cause["cite"]
    assert cause_of(float(capped)) is None  # the trainer's own value: nothing to explain
    cause = cause_of(float(raw * 1.01))  # another number: before-cap does not reproduce it
    assert cause is not None and not cause["found"]


def test_no_before_cap_without_a_cap(cli: Cli, tmp_path: Path) -> None:
    path, rho = _capped_file(tmp_path)
    logged = tmp_path / "logged.json"
    logged.write_text(json.dumps({"sampling/importance_sampling_ratio/mean": float(rho.mean())}))
    flags = [*CAPS["trl"][1][:-1], "vllm_is_clip_max=1e9"]  # a bound no ratio reaches
    doc = cli.json("objective", path, *flags, "--logged", logged)
    assert not [m for m in doc["logged"]["metrics"] if "cause" in m]  # raw = capped: equal


# ------------------------------------------------------------------------ by token id
def _ids_file(tmp_path: Path, hot: bool) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    """16 answers of 60 tokens, ids drawn from 500; with ``hot`` the reference is 3 nats
    away at every token of id 7 only. The path, the ids, logp and ref_logp."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(21)
    n, length = 16, 60
    ids = rng.integers(0, 500, (n, length))
    ids[:, ::10] = 7  # id 7 at one token in ten
    logp = -rng.exponential(1.0, (n, length))
    ref = logp - rng.normal(0, 0.01, (n, length))
    if hot:
        ref = np.where(ids == 7, logp - 3.0, ref)
    t = pa.table({"group": np.repeat(np.arange(4), 4), "reward": np.arange(n) % 2 * 1.0,
                  "logp": list(logp), "old_logp": list(logp), "ref_logp": list(ref),
                  "token_id": [list(map(int, r)) for r in ids]})  # fmt: skip
    path = tmp_path / f"ids{int(hot)}.parquet"
    pq.write_table(t, path)
    return path, ids, logp, ref


def test_explain_names_the_token_id_carrying_the_kl(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "100")  # many batches: the sums merge
    path, ids, logp, ref = _ids_file(tmp_path, hot=True)
    f = [x for x in cli.json("explain", path)["findings"] if x["id"] == "kl-token"]
    assert len(f) == 1
    ev = f[0]["evidence"]
    d = ref - logp
    k3 = np.exp(d) - d - 1  # the per-token KL, by hand
    assert ev["top"][0]["token_id"] == 7 and ev["top"][0]["tokens"] == np.count_nonzero(ids == 7)
    assert ev["shares"][0] == pytest.approx(k3[ids == 7].sum() / k3.sum(), rel=1e-9)
    assert ev["shares"][0] > 0.9 and ev["ids"] == np.unique(ids).size
    second = max((k3[ids == i].sum(), i) for i in np.unique(ids) if i != 7)
    assert ev["top"][1]["token_id"] == second[1]
    assert "id 7 " in f[0]["message"]
    # objective never reads the column: same numbers with and without it
    a = cli.json("objective", path)
    assert "token_ids" not in a


def test_no_token_finding_without_a_hot_token(cli: Cli, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path, *_ = _ids_file(tmp_path, hot=False)
    assert not [x for x in cli.json("explain", path)["findings"] if x["id"] == "kl-token"]
    # the KL large at every token alike: kl-mean warns, but no id carries it
    t = pq.read_table(path)
    ref = [list(np.asarray(x) - 3.0) for x in t.column("logp").to_pylist()]
    pq.write_table(t.set_column(t.schema.get_field_index("ref_logp"), "ref_logp", [ref]),
                   tmp_path / "even.parquet")  # fmt: skip
    ids = {x["id"] for x in cli.json("explain", tmp_path / "even.parquet")["findings"]}
    assert "kl-drift" in ids and "kl-token" not in ids


def test_token_id_sums_merge_and_cap() -> None:
    from grpo_cli.fold.where import ID_CAP, TokenIdSums

    ids = np.array([3.0, 3.0, 5.0, ID_CAP + 1.0, -1.0])
    kl = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    one = TokenIdSums()
    one.update(ids, {"kl": kl, "entropy": None, "mismatch": None})
    a, b = TokenIdSums(), TokenIdSums()
    a.update(ids[:2], {"kl": kl[:2]})
    b.update(ids[2:], {"kl": kl[2:]})
    merged = a.merge(b)
    for x in (one, merged):
        r = x.report(["kl"])
        assert r is not None and r.tokens == 5 and r.ids == 2 and r.outside == 2
        assert r.totals == {"kl": 31.0}  # the ids outside the exact range still count
        assert [(t.token_id, t.tokens, t.kl_sum) for t in r.top["kl"]] == [(5, 1, 4.0), (3, 2, 3.0)]


# ---------------------------------------------------------------------------- by turn
def _turns_file(tmp_path: Path, hot: bool, npz: bool = False) -> Path:
    """12 answers of three turns (mask runs of 20 tokens, 5 masked tool tokens between
    them, 5 of padding after); with ``hot`` the reference is 3 nats away in turn 2 only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(8)
    n, runs = 12, [(0, 20), (25, 45), (50, 70)]
    width = 75
    mask = np.zeros((n, width), bool)
    for a, z in runs:
        mask[:, a:z] = True
    logp = -rng.exponential(1.0, (n, width))
    ref = logp - rng.normal(0, 0.01, (n, width))
    if hot:
        ref[:, 25:45] = logp[:, 25:45] - 3.0
    ref[:, 45:50] = logp[:, 45:50] - 9.0  # masked tool output: its KL must not count
    path = tmp_path / f"turns{int(hot)}.{'npz' if npz else 'parquet'}"
    if npz:
        np.savez(path, logp=logp, old_logp=logp, ref_logp=ref, mask=mask,
                 rewards=(np.arange(n) % 2 * 1.0).reshape(3, 4))  # fmt: skip
        return path
    t = pa.table({"group": np.repeat(np.arange(3), 4), "reward": np.arange(n) % 2 * 1.0,
                  "logp": list(logp), "old_logp": list(logp), "ref_logp": list(ref),
                  "mask": list(mask)})  # fmt: skip
    pq.write_table(t, path)
    return path


@pytest.mark.parametrize("npz", [False, True])
def test_explain_names_the_turn_carrying_the_kl(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, npz: bool
) -> None:
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "150")  # batches of a few answers: merged
    path = _turns_file(tmp_path, hot=True, npz=npz)
    f = [x for x in cli.json("explain", path)["findings"] if x["id"] == "kl-turn"]
    assert len(f) == 1 and f[0]["evidence"]["turn"] == 2 and "turn 2 holds" in f[0]["message"]
    turns = f[0]["evidence"]["turns"]
    assert [t["tokens"] for t in turns] == [12 * 20] * 3  # the tool tokens left out
    d = -3.0  # turn 2's KL per token is k3(-3) = e^-3 + 2, by hand
    assert turns[1]["kl"] == pytest.approx(np.exp(d) - d - 1, rel=1e-12)
    assert turns[0]["kl"] < 1e-3 and turns[2]["kl"] < 1e-3
    share = turns[1]["kl_sum"] / sum(t["kl_sum"] for t in turns)
    assert f[0]["evidence"]["share"] == pytest.approx(share) and share > 0.99


def test_no_turn_finding_without_it(cli: Cli, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = {x["id"] for x in cli.json("explain", _turns_file(tmp_path, hot=False))["findings"]}
    assert "kl-turn" not in ids
    # one run an answer (padding after): no turns folded, whatever the KL
    rng = np.random.default_rng(2)
    logp = -rng.exponential(1.0, (8, 30))
    mask = np.arange(30)[None, :] < 20 + np.arange(8)[:, None]
    t = pa.table({"group": np.repeat(np.arange(2), 4), "reward": np.arange(8) % 2 * 1.0,
                  "logp": list(logp), "old_logp": list(logp), "ref_logp": list(logp - 3.0),
                  "mask": list(mask)})  # fmt: skip
    pq.write_table(t, tmp_path / "one.parquet")
    ids = {x["id"] for x in cli.json("explain", tmp_path / "one.parquet")["findings"]}
    assert "kl-drift" in ids and "kl-turn" not in ids


def test_turn_index_before_the_mask_drops_tokens() -> None:
    from grpo_cli.batch import turn_index

    # answers: 3 runs; 2 runs (its first token right after a valid one: a new answer is a
    # new run); empty; 1 run
    m = np.array([1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0, 1], bool)
    off = np.array([0, 6, 10, 10, 13])
    got = turn_index(m, off, 3)
    assert got is not None
    assert got.tolist() == [0, 0, 1, 2, 0, 1, 1, 0]  # by hand, per valid token
    assert turn_index(np.array([0, 1, 1, 1, 1, 0], bool), np.array([0, 3, 6]), 2) is None
