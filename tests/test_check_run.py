"""``check RUN``: a recorded run checked step by step, one verdict, the first failing step;
``objective RUN`` (its last step); ``trend`` naming the first step each rule warns and
fails at. Every run-level number is compared with single-step checks of the same steps."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from grpo_cli.integrations._writer import RunWriter, rollout_table

from .conftest import Cli


def _run(root: Path, *, bad: tuple[int, ...] = (), steps: tuple[int, ...] = (1, 2, 3, 4),
         done: tuple[int, ...] | None = None) -> Path:  # fmt: skip
    """A recorded run: 8 answers a step in groups of 4, rewards 0/1 alternating, the policy
    a hair from the sampler; at the steps ``bad`` the reference is 2 nats below the sampler
    everywhere, so log π/π_ref ≈ 2 and k3 ≈ e⁻² + 2 − 1 = 1.135 > kl-mean's fail 1."""
    rng = np.random.default_rng(5)
    w = RunWriter(root, trainer="trl", trainer_version="1.16.0",
                  config={"loss_type": "bnpo", "beta": 0.0})  # fmt: skip
    for step in steps:
        n, width = 8, 6
        old = -rng.exponential(1.0, (n, width))
        logp = old + rng.normal(0, 0.01, (n, width))
        ref = old - (2.0 if step in bad else 0.0)
        t = rollout_table(
            group=[f"g{step}-{i // 4}" for i in range(n)],
            reward=np.tile([0.0, 1.0], n // 2),
            advantage=None,
            mask=np.ones((n, width), bool),
            tokens={"logp": logp, "old_logp": old, "ref_logp": ref},
        )
        w.write_micro_batch(step, 0, t, {"micro_batches": 1, "num_items_in_batch": n * width})
        if done is None or step in done:
            w.finish_step(step)
    return root


def _check(cli: Cli, *args: str | Path) -> tuple[int, dict[str, Any]]:
    r = cli("check", *args, "--format", "json")
    return r.exit_code, json.loads(r.stdout)


def _same_as_single_steps(cli: Cli, root: Path, doc: dict[str, Any]) -> None:
    """Each step's verdict is what ``check`` of that step alone gives, and each rule's run
    status the worst of its single-step statuses."""
    rank = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}
    worst: dict[str, str] = {}
    for v in doc["run"]["steps"]:
        _, one = _check(cli, root / v["name"])
        failing = [x["rule"] for x in one["results"] if x["status"] == "fail"]
        assert v["failing"] == failing and v["passed"] == one["passed"]
        for x in one["results"]:
            if rank[x["status"]] >= rank.get(worst.get(x["rule"], "skip"), 0):
                worst[x["rule"]] = x["status"]
    run_status = {x["rule"]: x["status"] for x in doc["results"]}
    assert {k: run_status[k] for k in worst} == worst


def test_a_run_failing_from_a_known_step(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path / "run", bad=(3, 4))
    code, doc = _check(cli, root)
    assert code == 1 and not doc["passed"]
    assert doc["run"]["first_failing_step"] == 3
    assert doc["run"]["first_bad_step"]["kl-mean"] == {"warn": 3, "fail": 3}
    kl = next(x for x in doc["results"] if x["rule"] == "kl-mean")
    assert kl["status"] == "fail" and kl["message"].startswith("first fails at step 3 (2 of 4")
    assert kl["examples"][0]["step"] == 3 and "step_000003" in kl["examples"][0]["file"]
    # its value is step 3's own, as check of that step alone gives it
    _, three = _check(cli, root / "step_000003")
    assert kl["value"] == next(x for x in three["results"] if x["rule"] == "kl-mean")["value"]
    assert math.isclose(kl["value"], math.exp(-2) + 1, rel_tol=0.05)
    _same_as_single_steps(cli, root, doc)


def test_a_healthy_run_passes(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path / "run")
    code, doc = _check(cli, root)
    assert code == 0 and doc["passed"] and doc["run"]["first_failing_step"] is None
    assert [v["step"] for v in doc["run"]["steps"]] == [1, 2, 3, 4]
    _same_as_single_steps(cli, root, doc)
    table = cli("check", root)
    assert table.exit_code == 0 and "4 steps checked (steps 1–4), 0 failing" in table.stdout


def test_last_and_steps_choose_the_steps(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path / "run", bad=(3,))
    _, doc = _check(cli, root, "--last", "2")
    assert [v["step"] for v in doc["run"]["steps"]] == [3, 4]
    code, doc = _check(cli, root, "--steps", "1:2")
    assert code == 0 and [v["step"] for v in doc["run"]["steps"]] == [1, 2]
    _, doc = _check(cli, root, "--steps", "4:")
    assert [v["step"] for v in doc["run"]["steps"]] == [4]
    cli.error(["check", str(root), "--steps", "7:9"], "no complete step of the run to check")
    cli.error(["check", str(root), "--steps", "3"], "--steps '3': expected A:B")
    cli.error(["check", str(root), "--last", "0"], "--last: expected a positive number")
    cli.error(["check", str(root / "step_000001"), "--last", "1"], "take a recorded run's")


def test_a_run_with_no_complete_step_is_an_error(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path / "run", steps=(1, 2), done=())
    cli.error(["check", str(root)], "no step of the run can be read")
    part = _run(tmp_path / "part", steps=(1, 2), done=(1,))
    r = cli("check", part, "--format", "json")
    assert r.exit_code == 0 and [v["step"] for v in json.loads(r.stdout)["run"]["steps"]] == [1]
    assert "1 recorded step(s) skipped, not completely written" in r.stderr


def test_the_ci_formats_of_a_run(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path / "run", bad=(3,))
    gh = cli("check", root, "--format", "github").stdout.splitlines()
    assert any(
        x.startswith("::error title=grpo-cli check kl-mean::first fails at step 3") for x in gh
    )
    junit = cli("check", root, "--format", "junit").stdout
    assert '<testcase classname="grpo-cli.check" name="kl-mean">' in junit
    assert "first fails at step 3" in junit


def test_objective_of_a_run_is_its_last_step(cli: Cli, tmp_path: Path) -> None:
    root = _run(tmp_path / "run", steps=(1, 2, 3), done=(1, 2))
    r = cli("objective", root, "--json")
    assert r.exit_code == 0 and "objective gives its last" in r.stderr and "step_000002" in r.stderr
    assert json.loads(r.stdout) == cli.json("objective", root / "step_000002")


def test_trend_names_the_first_step_each_rule_warns_and_fails(cli: Cli, tmp_path: Path) -> None:
    """KL grows from about 0 at steps 1, 2 to about 1.1 at steps 3, 4: kl-growth (last over
    first) is beyond 100 from step 3 on, judged from step 1 to each step; the same verdict
    trend gives on the first three steps alone."""
    root = _run(tmp_path / "run", bad=(3, 4))
    doc = json.loads(cli("trend", root, "--check", "--json").stdout)
    kl = next(x for x in doc["check"]["results"] if x["rule"] == "kl-growth")
    assert (kl["first_warn_step"], kl["first_fail_step"]) == (3, 3)
    assert "fails from step 3" in kl["message"]
    steps = [root / f"step_00000{k}" for k in (1, 2)]
    two = json.loads(cli("trend", *steps, "--check", "--json").stdout)
    assert next(x for x in two["check"]["results"] if x["rule"] == "kl-growth")["status"] == "pass"
    three = json.loads(cli("trend", *steps, root / "step_000003", "--check", "--json").stdout)
    assert (
        next(x for x in three["check"]["results"] if x["rule"] == "kl-growth")["status"] == "fail"
    )


def test_a_real_trl_run(cli: Cli, trl_run: Any) -> None:
    """TRL's GRPOTrainer, 4 steps: each step's verdict is the single-step check's; with
    kl-mean's fail threshold between step 2's and step 3's KL (each from objective of
    that step alone), the rule first fails at step 3."""
    run = trl_run("iterations")
    _, doc = _check(cli, run.directory)
    _same_as_single_steps(cli, run.directory, doc)
    kls = [cli.json("objective", run.directory / f"step_00000{k}")["kl"]["mean"] for k in (1, 2, 3)]
    if not kls[2] > kls[1] >= kls[0]:  # the KL grows as the policy leaves the reference
        raise AssertionError(kls)
    mid = (kls[1] + kls[2]) / 2
    _, doc = _check(
        cli, run.directory, "--rule", f"kl-mean.fail={mid}", "--rule", "kl-mean.warn=none"
    )
    assert doc["run"]["first_bad_step"]["kl-mean"]["fail"] == 3


def test_loss_calls_are_folded_only_at_steps_with_a_logged_record(
    cli: Cli, tmp_path: Path, monkeypatch: Any
) -> None:
    """A step with no record in metrics.jsonl has nothing for logged-metrics to compare:
    check RUN does not fold its loss calls again (said once, naming the steps); a step
    with one is compared as check of that step alone compares it. A logged loss of 123
    is far from any loss of these steps (|J| < 1): logged-metrics fails at steps 2 and 4,
    the two logged."""
    import grpo_cli.commands.check as check_mod

    root = _run(tmp_path / "run")
    with open(root / "metrics.jsonl", "w", encoding="utf-8") as fh:
        fh.write('{"step": 2, "loss": 123.0}\n{"step": 4, "loss": 123.0}\n')
    folded: list[int] = []
    real = check_mod.recorded_calls

    def counted(src: Any, *args: Any, **kw: Any) -> Any:
        folded.append(src.recorded.step)
        return real(src, *args, **kw)

    monkeypatch.setattr(check_mod, "recorded_calls", counted)
    r = cli("check", root, "--format", "json")
    doc = json.loads(r.stdout)
    assert folded == [2, 4]
    assert "steps 1, 3: no logged record (metrics.jsonl) to compare" in r.stderr
    lm = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert lm["status"] == "fail" and lm["message"].startswith("first fails at step 2 (2 of 4")
    assert doc["run"]["first_bad_step"]["logged-metrics"] == {"warn": 2, "fail": 2}
    folded.clear()
    _same_as_single_steps(cli, root, doc)  # each step alone folds its calls
    assert folded == [1, 2, 3, 4]


def test_a_files_metadata_is_read_once_within_a_run_command(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """file_info inside infos_cached reads a file's footer once while the file is
    unchanged, again once it is rewritten, and every time outside the block."""
    import grpo_cli.io.run as run_mod

    root = _run(tmp_path / "run", steps=(1,))
    path = next((root / "step_000001").glob("*.parquet"))
    reads: list[Path] = []
    real = run_mod._read_info

    def counted(p: Any) -> dict[str, Any]:
        reads.append(p)
        return real(p)

    monkeypatch.setattr(run_mod, "_read_info", counted)
    with run_mod.infos_cached():
        first = run_mod.file_info(path)
        first["step"] = -1  # a copy: the cached one is not changed
        assert run_mod.file_info(path)["step"] == 1 and len(reads) == 1
        st = path.stat()  # the same bytes, a new modification time: read again
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        run_mod.file_info(path)
        assert len(reads) == 2
    run_mod.file_info(path)
    run_mod.file_info(path)
    assert len(reads) == 4 and not run_mod._INFO_CACHE
