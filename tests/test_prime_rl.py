"""prime-rl's loss rows against its own compute_loss (conformance/frontier/fixtures/prime_rl.json,
recorded from prime-rl 559b4477 by conformance/frontier/record.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from grpo_cli.losses.prime_rl import dppo_binary_terms

from .conftest import Cli

FIXTURE = Path(__file__).parent.parent / "conformance" / "frontier" / "fixtures" / "prime_rl.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_micro_batch_loss_and_metric_is_prime_rl_s(case: dict) -> None:
    cfg = case["loss"]
    kw = (
        {"rule": "tv", "mask_low": cfg["dppo_mask_low"], "mask_high": cfg["dppo_mask_high"]}
        if cfg["type"] == "default"
        else {"rule": "ipo", "ipo_threshold": cfg["ipo_threshold"]}
    )
    for st in case["steps"]:
        for mb in st["micro_batches"]:
            starts = np.cumsum([0, *mb["sequence_lengths"]])
            tl = np.array(mb["trainer_logprobs"])
            total = 0.0
            for j, si in enumerate(mb["samples"]):
                b = st["branches"][si]
                m = np.array(b["loss_mask"])
                lp = tl[starts[j] : starts[j] + m.shape[0]][m]
                t = dppo_binary_terms(
                    lp, np.array(b["inference_logprobs"])[m], np.array(b["advantages"])[m],
                    [0, lp.shape[0]], adv_tau=cfg["adv_tau"], kl_tau=cfg["kl_tau"], **kw,
                )  # fmt: skip
                total -= float(t.term.sum())
                for key, logged in mb["loss_tensors"].items():
                    # one value per packed sequence: the padding lengthens the last one
                    # (pad_micro_batch), it is no sequence of its own
                    assert len(logged) == len(mb["samples"]), key
                    per_answer = t.answer_values
                    mine = per_answer[key][0] if key in per_answer else t.flags[key].mean()
                    assert mine == pytest.approx(logged[j], rel=1e-5, abs=1e-6), key
            assert total / st["rl_scale"] == pytest.approx(mb["loss"], rel=1e-5, abs=1e-7)


# ------------------------------------------- the output directory read with no flag
RUN = FIXTURE.parent / "prime_rl_run"
DEFAULT = next(c for c in CASES if c["name"] == "default")  # the case prime_rl_run holds
# what prime-rl logs and grpo-cli recomputes from a token export (trainers/prime_rl.py)
RECOMPUTED = {
    "loss/mean", "entropy/all/mean", "entropy/all/std", "entropy/all/max",
    "mismatch_kl/all/mean", "mismatch_kl/all/std", "mismatch_kl/all/max", "kl_ent_ratio/mean",
    *(f"{k}/{s}" for k in ("is_masked", "is_masked_low", "is_masked_high",
                           "masked_advantage_positive", "masked_advantage_negative",
                           "masked_mismatch_kl", "unmasked_mismatch_kl") for s in ("mean", "max")),
}  # fmt: skip


def _metrics_line(step: int) -> dict:
    """prime-rl's own metrics.jsonl line of ``step`` (its FileMonitor wrote it)."""
    lines = [json.loads(x) for x in (RUN / "metrics.jsonl").read_text().splitlines()]
    return next(d for d in lines if d["step"] == step)


@pytest.mark.parametrize("step", [1, 2])
def test_a_token_export_step_gives_prime_rl_s_loss_and_metrics(cli: Cli, step: int) -> None:
    """``objective token_exports/step_N``: the step's loss (every rank's micro-batch losses
    summed, prime-rl's compute_loss over rl_scale) and every logged metric grpo-cli
    recomputes, within float32 rounding of prime-rl's own."""
    doc = cli.json("objective", RUN / "token_exports" / f"step_{step}")
    st = DEFAULT["steps"][step - 1]
    assert doc["loss"] == pytest.approx(sum(mb["loss"] for mb in st["micro_batches"]),
                                        rel=1e-5, abs=1e-7)  # fmt: skip
    got = doc["trainer_metrics"]["metrics"]
    logged = _metrics_line(step)
    assert set(got) == RECOMPUTED
    for k, v in got.items():
        assert v == pytest.approx(logged[k], rel=1e-5, abs=1e-6), k
        assert v == pytest.approx(st["logged"][k], rel=1e-5, abs=1e-6), k  # the same record
    # joined to the traces by content: the recorder's 4 groups of 4 branches
    g = doc["groups"]
    assert (g["groups"], g["min_group_size"], g["max_group_size"]) == (4, 4, 4)


def test_the_output_directory_is_a_run_for_every_command(cli: Cli, tmp_path: Path) -> None:
    """The output directory with no flag: ``objective`` its last STABLE step (said),
    ``check`` and ``trend`` every STABLE step, a step without STABLE skipped with a note
    naming the marker; ``report`` an HTML page."""
    run = tmp_path / "outputs"
    shutil.copytree(RUN, run)
    r = cli("objective", run, "--json")
    assert r.exit_code == 0, r.stderr
    assert "objective gives its last" in r.stderr and "step_2" in r.stderr
    assert json.loads(r.stdout)["trainer_metrics"]["metrics"]["loss/mean"] == pytest.approx(
        _metrics_line(2)["loss/mean"], rel=1e-5
    )
    # a step still being written: its rank files, no STABLE yet
    shutil.copytree(run / "token_exports" / "step_2", run / "token_exports" / "step_3")
    (run / "token_exports" / "step_3" / "STABLE").unlink()
    trend = cli.json("trend", run)
    assert [s["step"] for s in trend["steps"]] == [1, 2]
    assert any("step_3" in w and "STABLE" in w for w in trend["warnings"]), trend["warnings"]
    r = cli("check", run, "--format", "json")
    checked = json.loads(r.stdout)
    assert [v["step"] for v in checked["run"]["steps"]] == [1, 2]
    logged = next(x for x in checked["results"] if x["rule"] == "logged-metrics")
    assert logged["status"] == "pass", logged
    html = tmp_path / "r.html"
    assert cli("report", run, "--html", html).exit_code == 0
    assert html.stat().st_size > 1000


def test_one_step_directory_for_check_and_trend(cli: Cli) -> None:
    step = RUN / "token_exports" / "step_1"
    r = cli("check", step, "--format", "json")
    doc = json.loads(r.stdout)
    assert "run" not in doc
    logged = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert logged["status"] == "pass", logged
    trend = cli.json("trend", step)
    assert [s["step"] for s in trend["steps"]] == [1]
    want = sum(mb["loss"] for mb in DEFAULT["steps"][0]["micro_batches"])
    assert trend["steps"][0]["loss"] == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_an_unexported_sequence_is_said_not_guessed(cli: Cli, tmp_path: Path) -> None:
    """A packed sequence with no loss token is not exported, yet prime-rl's compute_loss
    gives it per-sample metrics of 0: a gap in micro_sequence_idx is named in a note."""
    run = tmp_path / "outputs"
    shutil.copytree(RUN, run)
    f = run / "token_exports" / "step_1" / "rank_0.jsonl"
    recs = [json.loads(x) for x in f.read_text().splitlines()]
    last = max(i for i, r in enumerate(recs) if r["micro_step"] == 0)
    recs[last]["micro_sequence_idx"] += 1  # one sequence before it left no record
    f.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    doc = cli.json("objective", run / "token_exports" / "step_1")
    assert any("1 packed sequence(s) without a loss token" in w for w in doc["warnings"])
    plain = cli.json("objective", RUN / "token_exports" / "step_1")
    assert not any("packed sequence" in w for w in plain["warnings"])
