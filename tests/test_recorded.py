"""Recorded runs read with no flags: ``grpo-cli objective runs/x/step_N`` gives the number
the trainer logged. The real runs are TRL 1.16.0's GRPOTrainer (tests/trl_runs.py); the
logged values are taken from ``trainer.state.log_history`` in the test, never from the
recorded ``metrics.jsonl``. Crafted runs (the writer of grpo_cli.integrations) test the
layout's edge cases without a trainer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_cli.integrations._writer import RunWriter, rollout_table

from .conftest import Cli
from .trl_runs import STEPS, step_records

# every configuration whose conventions grpo-cli computes
EXACT = (
    "defaults", "beta", "iterations", "gspo", "ga2_bnpo", "ga2_dapo", "log2", "entropy", "masks",
    "opsm",
)  # fmt: skip


def close(ours: float, logged: float) -> bool:
    return abs(ours - logged) <= 1e-6 or abs(ours - logged) <= 1e-5 * max(abs(logged), abs(ours))


@pytest.mark.parametrize("name", EXACT)
def test_every_logged_metric_with_no_flag(cli: Cli, trl_run: Any, name: str) -> None:
    run = trl_run(name)
    logged = step_records(run.log_history)
    compared: set[str] = set()
    for step, record in logged.items():
        doc = cli.json("objective", run.directory / f"step_{step:06d}")
        assert doc["settings"]["from"] == "meta.json" and doc["settings"]["trainer"] == "trl"
        tm = doc["trainer_metrics"]
        ours = tm["metrics"]
        bad = [
            f"step {step} {k}: ours {ours[k]!r}, logged {v!r}"
            for k, v in record.items()
            if k in ours and not (v is None and ours[k] is None) and not close(ours[k], v)
        ]
        assert not bad, "\n".join(bad)
        compared |= {k for k in record if k in ours}
        # the logged record was compared with no --logged flag: the run's metrics.jsonl
        verdicts = {m["metric"]: m["verdict"] for m in doc["logged"]["metrics"]}
        assert all(verdicts[k] == "match" for k in ours if k in verdicts), verdicts
        if tm.get("calls", 1) > 1:  # the whole step as one batch, alongside and labelled
            assert tm["computed"].startswith("per loss call") and tm["whole_step"]
    assert {"loss", "entropy", "clip_ratio/region_mean", "clip_ratio/high_max"} <= compared
    if run.settings.get("beta"):
        assert "kl" in compared
    if run.settings.get("entropy_coef"):  # the bonus is in the loss; the loss before it
        assert {"policy_loss", "entropy_coef"} <= compared


def test_gradient_accumulation_is_what_a_whole_step_file_cannot_give(
    cli: Cli, trl_run: Any
) -> None:
    """With two loss calls a step, TRL's logged numbers are means over calls: the step's
    tokens as one batch differ (the reason the recorder writes one file a call)."""
    run = trl_run("ga2_bnpo")
    record = step_records(run.log_history)[2]
    doc = cli.json("objective", run.directory / "step_000002")
    whole, per_call = doc["trainer_metrics"]["whole_step"], doc["trainer_metrics"]["metrics"]
    assert doc["trainer_metrics"]["calls"] == 2
    assert close(per_call["clip_ratio/high_max"], record["clip_ratio/high_max"])
    assert not close(whole["clip_ratio/high_max"], record["clip_ratio/high_max"])


def test_the_entropy_mask_is_what_makes_the_loss(cli: Cli, trl_run: Any) -> None:
    """top_entropy_quantile 0.5: meta.json turns the entropy mask on; the loss matches with
    it (test above) and not without it, the metrics that do not involve it either way."""
    run = trl_run("masks")
    step = run.directory / "step_000002"
    doc = cli.json("objective", step)
    assert doc["settings"]["masks"] == {"trl/top_entropy_mask": {"entropy_mask": True}}
    record = step_records(run.log_history)[2]
    assert close(doc["trainer_metrics"]["metrics"]["loss"], record["loss"])
    off = cli.json("objective", step, "--loss-param", "entropy_mask=false")
    ours = off["trainer_metrics"]["metrics"]
    assert not close(ours["loss"], record["loss"])
    for k in ("entropy", "kl", "clip_ratio/region_mean"):
        assert close(ours[k], record[k]), k


def test_the_off_policy_mask_is_what_makes_the_loss(cli: Cli, trl_run: Any) -> None:
    """off_policy_mask_threshold: meta.json turns DeepSeek-V3.2's sequence mask on; on the
    second pass over a generation batch (steps 2 and 4) it drops answers, and the loss
    matches with it (the test above, every step) and not without it; the metrics it does not
    enter match either way."""
    run = trl_run("opsm")
    logged = step_records(run.log_history)
    differs = 0
    for step in (2, 4):
        path = run.directory / f"step_{step:06d}"
        doc = cli.json("objective", path)
        assert doc["settings"]["masks"] == {
            "trl/off_policy_mask": {"off_policy_mask_threshold": 0.002}
        }
        assert close(doc["trainer_metrics"]["metrics"]["loss"], logged[step]["loss"])
        off = cli.json("objective", path, "--loss-param", "off_policy_mask_threshold=off")
        ours = off["trainer_metrics"]["metrics"]
        differs += not close(ours["loss"], logged[step]["loss"])
        for k in ("entropy", "kl", "clip_ratio/region_mean"):
            assert close(ours[k], logged[step][k]), k
    assert differs, "the mask dropped no answer: the run does not exercise it"


def test_check_and_trend_read_a_run(cli: Cli, trl_run: Any) -> None:
    run = trl_run("ga2_dapo")
    doc = json.loads(cli("check", run.directory / "step_000003", "--format", "json").stdout)
    logged = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert logged["status"] == "pass" and logged["value"] <= 1e-5
    trend = cli.json("trend", run.directory)
    assert [s["step"] for s in trend["steps"]] == list(range(1, STEPS + 1))
    one = cli.json("objective", run.directory / "step_000004")
    assert trend["steps"][-1]["objective"] == one["objective"]


def test_a_flag_overrides_one_setting(cli: Cli, trl_run: Any) -> None:
    run = trl_run("beta")
    base = cli.json("objective", run.directory / "step_000001")
    doc = cli.json("objective", run.directory / "step_000001", "--clip-eps", "0.1")
    s0, s1 = base["settings"], doc["settings"]
    assert s1["clip_eps"] == 0.1 and s0["clip_eps"] == 0.2
    assert {k: v for k, v in s1.items() if k != "clip_eps"} == {
        k: v for k, v in s0.items() if k != "clip_eps"
    }
    other = cli.json("objective", run.directory / "step_000001", "--preset", "verl")
    assert other["settings"]["preset"] == "verl" and other["settings"]["from"] is None


# ------------------------------------------------------------ crafted recorded runs
def _run(tmp_path: Path, *, steps: tuple[int, ...] = (1, 2), done: tuple[int, ...] = (1, 2),
         config: dict[str, Any] | None = None, version: str = "1.16.0",
         trainer: str = "trl", ref: bool = False) -> Path:  # fmt: skip
    rng = np.random.default_rng(5)
    root = tmp_path / "run"
    w = RunWriter(root, trainer=trainer, trainer_version=version,
                  config=config or {"loss_type": "bnpo", "beta": 0.0})  # fmt: skip
    for step in steps:
        n, width = 8, 6
        old = -rng.exponential(1.0, (n, width))
        tokens = {"logp": old + rng.normal(0, 0.1, (n, width)), "old_logp": old}
        if ref:
            tokens["ref_logp"] = old
        t = rollout_table(
            group=[f"g{step}-{i // 4}" for i in range(n)],
            reward=rng.integers(0, 2, n).astype(float),
            advantage=rng.normal(0, 1, n),
            mask=np.ones((n, width), bool),
            tokens=tokens,
        )
        w.write_micro_batch(step, 0, t, {"micro_batches": 1, "num_items_in_batch": n * width})
        if step in done:
            w.finish_step(step)
    return root


def test_a_step_not_completely_written(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path, done=(1,))
    cli.error(["objective", str(root / "step_000002")], "no _DONE marker")
    r = cli("trend", root, "--json")
    doc = json.loads(r.stdout)
    assert [s["step"] for s in doc["steps"]] == [1]
    assert any("skipped" in w and "step_000002" in w for w in doc["warnings"])


def test_a_run_directory_is_many_steps(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path)
    cli.error(["kl", str(root)], "a recorded run of 2 step(s): give one step")


def test_an_unknown_release_warns_and_names_the_conventions(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path, version="9.0.0")
    doc = cli.json("objective", root / "step_000001")
    said = [w for w in doc["warnings"] if "trl 9.0.0 is newer than the newest release" in w]
    assert said and "trl@1.10.0 preset" in said[0]
    assert doc["settings"]["agg"] == "token-mean"  # bnpo, from the run's config


def test_a_run_of_an_older_release_takes_its_preset(cli: Cli, tmp_path: Path) -> None:
    """TRL 0.19.1 recorded it: the 0.19 change point's preset, the config on top, no
    warning about the release."""
    root = _run(tmp_path, version="0.19.1", config={"beta": 0.0})
    doc = cli.json("objective", root / "step_000001")
    s = doc["settings"]
    assert (s["preset"], s["mirrors"], s["from"]) == ("trl@0.19.0", "trl 0.19.1", "meta.json")
    assert not any("release" in w for w in doc["warnings"])


def test_an_unknown_trainer_is_refused(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path, trainer="nemo-rl")
    cli.error(["objective", str(root / "step_000001")], "trainer 'nemo-rl' is not one")


def test_a_column_the_config_needs_is_named(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path, config={"loss_type": "bnpo", "beta": 0.04})
    want = "'ref_logp' is missing, but meta.json's config sets beta = 0.04"
    cli.error(["objective", str(root / "step_000001")], want)


def test_the_recorded_loss_by_hand(cli: Cli, tmp_path: Path) -> None:
    """bnpo, one call, on-policy-free: the loss is minus the token mean of the clipped
    surrogate, computed here by hand from the written arrays."""
    import pyarrow.parquet as pq

    root = _run(tmp_path, steps=(1,), done=(1,))
    t = pq.read_table(root / "step_000001" / "rank000-mb000.parquet").to_pydict()
    terms = []
    for lp, old, a in zip(t["logp"], t["old_logp"], t["advantage"], strict=True):
        r = np.exp(np.array(lp, float) - np.array(old, float))
        terms.append(np.minimum(r * a, np.clip(r, 0.8, 1.2) * a))
    want = -float(np.concatenate(terms).mean())
    doc = cli.json("objective", root / "step_000001")
    assert math.isclose(doc["trainer_metrics"]["metrics"]["loss"], want, rel_tol=1e-12)


def test_a_loss_the_logger_rounded_to_4_decimals_matches(tmp_path: Path) -> None:
    """transformers 4.x logs round(loss, 4): within half its last decimal it matches; an
    unrounded logged loss, or another metric, keeps the relative tolerance."""
    from grpo_cli.logged import compare_logged

    ours = {"loss": 0.012345678, "kl": 0.0123}
    rounded = compare_logged("f", {"loss": 0.0123, "kl": 0.0124}, 1, ours, tolerance=1e-3)
    verdict = {m.metric: m.verdict for m in rounded.metrics}
    assert verdict == {"loss": "match", "kl": "differs"}
    exact = compare_logged("f", {"loss": 0.0123001}, 1, ours, tolerance=1e-3)
    assert exact.metrics[0].verdict == "differs"


def test_the_entropy_bonus_by_hand() -> None:
    """TRL 1.16.0's static entropy bonus on one rank's call: the policy loss minus coef ×
    the call's token-mean entropy / the step's loss calls, for every loss type; the loss
    before it is logged as policy_loss (before the accumulation divisor); without the
    recorded entropy the loss is unknown (None), not the loss without its bonus."""
    from grpo_cli.settings import Settings
    from grpo_cli.trainers import trl
    from grpo_cli.trainers.base import FileInputs

    s = Settings(trainer="trl")
    f = FileInputs(answers=4, empty=0, tokens=10, term_sum=2.0, term_answer_means=1.2,
                   entropy_sum=15.0, entropy_tokens=10, info={"micro_batches": 2})  # fmt: skip
    cfg = {"loss_type": "bnpo", "entropy_coef": 0.1}
    assert trl.file_loss(s, f, cfg) == pytest.approx(-2.0 / 10 / 2 - 0.1 * 1.5 / 2)
    assert trl.file_metrics(s, f, cfg) == {"policy_loss": pytest.approx(-0.2), "entropy_coef": 0.1}
    cfg = {"loss_type": "grpo", "entropy_coef": 0.1}
    assert trl.file_loss(s, f, cfg) == pytest.approx(-1.2 / 4 / 2 - 0.1 * 1.5 / 2)
    dapo = FileInputs(4, 0, 10, 2.0, 1.2, 15.0, 10, {"micro_batches": 2, "num_items_in_batch": 20})
    cfg = {"loss_type": "dapo", "entropy_coef": 0.1, "steps_per_generation": 2}
    assert trl.file_loss(s, dapo, cfg) == pytest.approx(-2.0 / 20 - 0.1 * 1.5 / 2)
    assert trl.file_metrics(s, dapo, cfg)["policy_loss"] == pytest.approx(-2.0 / 20)
    no_entropy = FileInputs(4, 0, 10, 2.0, 1.2, 0.0, 0, {"micro_batches": 2})
    assert trl.file_loss(s, no_entropy, {"loss_type": "bnpo", "entropy_coef": 0.1}) is None
    assert trl.file_metrics(s, f, {"loss_type": "bnpo"}) == {}


def test_the_vllm_sampling_metrics_are_the_generation_s(cli: Cli, tmp_path: Path) -> None:
    """TRL logs sampling/* once per generation batch (each process over its share of the
    generation, then the mean of the processes' means and the max / min of their
    extremes), not per loss call: a crafted run of 2 ranks × 2 calls with calls of unequal
    lengths, where the mean over calls would differ, against TRL's formulas by hand."""
    rng = np.random.default_rng(9)
    cfg = {
        "loss_type": "bnpo", "beta": 0.0, "use_vllm": True,
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": 2.0, "gradient_accumulation_steps": 2,
        "steps_per_generation": 2,
    }  # fmt: skip
    root = tmp_path / "run"
    per_rank: list[list[np.ndarray]] = [[], []]  # each rank's old − rollout, call by call
    per_call: list[float] = []
    for rank in (0, 1):
        w = RunWriter(root, trainer="trl", trainer_version="1.16.0", config=cfg, rank=rank,
                      world_size=2)  # fmt: skip
        for mb, width in enumerate((3, 9)):
            n = 4
            old = -rng.exponential(1.0, (n, width))
            roll = old + rng.normal(0, 0.4 if mb else 0.05, (n, width))
            t = rollout_table(
                group=[f"r{rank}-{i // 2}" for i in range(n)],
                reward=rng.integers(0, 2, n).astype(float), advantage=rng.normal(0, 1, n),
                mask=np.ones((n, width), bool),
                tokens={"logp": old + rng.normal(0, 0.1, (n, width)), "old_logp": old,
                        "rollout_logp": roll},
            )  # fmt: skip
            info = {"micro_batches": 2, "num_items_in_batch": 48, "generation": 0,
                    "generated_at_step": 1, "iteration": 0, "chunk": mb}  # fmt: skip
            w.write_micro_batch(1, mb, t, info)
            d = old - roll  # float64 arrays are recorded as float64
            per_rank[rank].append(d.ravel())
            per_call.append(float(np.abs(d).mean()))
        w.finish_step(1)
    doc = cli.json("objective", root / "step_000001")
    got = doc["trainer_metrics"]["metrics"]
    d0, d1 = (np.concatenate(r) for r in per_rank)
    w0, w1 = (np.minimum(np.exp(d), 2.0) for d in (d0, d1))
    want = {
        "sampling/sampling_logp_difference/mean": (np.abs(d0).mean() + np.abs(d1).mean()) / 2,
        "sampling/sampling_logp_difference/max": max(np.abs(d0).max(), np.abs(d1).max()),
        "sampling/importance_sampling_ratio/min": min(w0.min(), w1.min()),
        "sampling/importance_sampling_ratio/mean": (w0.mean() + w1.mean()) / 2,
        "sampling/importance_sampling_ratio/max": max(w0.max(), w1.max()),
    }
    for k, v in want.items():
        assert math.isclose(got[k], v, rel_tol=1e-9), (k, got[k], v)
    per_call_mean = sum(per_call) / len(per_call)  # what a per-call mean would have given
    assert not math.isclose(want["sampling/sampling_logp_difference/mean"], per_call_mean,
                            rel_tol=1e-3)  # fmt: skip


@pytest.mark.parametrize("name", EXACT)
def test_check_reads_what_objective_reads(cli: Cli, trl_run: Any, name: str) -> None:
    """``check`` on each recorded step of a healthy run reads every recorded token field
    ``objective`` reads (TRL's ``entropy_mask`` too, as 0/1, not as a log-prob): no input
    error, no integrity rule failing, the logged metrics matched as objective matches them."""
    run = trl_run(name)
    for step in step_records(run.log_history):
        r = cli("check", run.directory / f"step_{step:06d}", "--format", "json")
        assert r.exit_code in (0, 1), r.stderr
        results = {x["rule"]: x for x in json.loads(r.stdout)["results"]}
        for rule in ("finite", "logp-range", "lengths-match"):
            assert results[rule]["status"] == "pass", results[rule]["message"]
        logged = results.get("logged-metrics")
        if logged is not None and logged["status"] != "skip":
            assert logged["status"] == "pass", logged["message"]
