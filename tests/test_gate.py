"""The gate inside training: ``record(trainer, dir, check=...)`` on TRL 1.16.0's real
GRPOTrainer (tests/trl_runs.py), and ``install(..., check=...)`` on verl's real
``RayPPOTrainer._update_actor`` and OpenRLHF's real ``PPOTrainer.fit`` (the stand-ins of
their recorder tests for what needs GPUs).

Three TRL trainings, shared by the tests: ``stopped`` (β 0.04, a check.toml whose
``kl-mean`` fails above 0.01, ``stop_on_fail``), ``goes_on`` (the same without
``stop_on_fail``) and ``broken`` (TRL's defaults, ``check=True``, an exception injected
into the gate at step 3). The KL of the β run is 0 at step 1 (the policy is the reference)
and about 0.045 from step 2 on (TRL logs it: the tests read it from log_history), so the
rule fails first at step 2. Every in-process verdict is compared with ``grpo-cli check``
run on the recorded step afterwards.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from grpo_cli.errors import UsageError
from grpo_cli.integrations import _gate
from grpo_cli.integrations._gate import KEYS, CheckFailedWarning
from grpo_cli.views.json import check_json, dumps

from .conftest import Cli
from .trl_runs import STEPS, Run, require_trl, step_records, train

KL_FAILS = "[rules.kl-mean]\nfail = 0.01\n"
INJECTED_AT = 3


@dataclass
class Gated:
    """A gated training: the run, the gate's reports by step (``on_check``), the
    warnings grpo-cli gave, and the config file (None: ``check=True``)."""

    run: Run
    config: Path | None
    reports: dict[int, Any] = field(default_factory=dict)
    warned: list[warnings.WarningMessage] = field(default_factory=list)

    def of(self, category: type[Warning]) -> list[str]:
        return [str(w.message) for w in self.warned if issubclass(w.category, category)]


def _train(workdir: Path, name: str, config: str | None, **options: Any) -> Gated:
    path = None
    check: Any = True
    if config is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "check.toml"
        path.write_text(config)
        check = path
    reports: dict[int, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = train(
            name, workdir, check=check, on_check=lambda s, r: reports.__setitem__(s, r), **options
        )
    mine = [w for w in caught if "grpo-cli" in str(w.message)]
    return Gated(run, path, reports, mine)


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Gated]:
    require_trl()
    cache: dict[str, Gated] = {}

    def get(kind: str) -> Gated:
        if kind not in cache:
            workdir = tmp_path_factory.mktemp(f"gate-{kind}")
            if kind == "stopped":
                cache[kind] = _train(workdir, "beta", KL_FAILS, stop_on_fail=True)
            elif kind == "goes_on":
                cache[kind] = _train(workdir, "beta", KL_FAILS)
            else:
                assert kind == "broken"
                real = _gate.check_recorded_step

                def injected(directory: Any, *a: Any, **k: Any) -> Any:
                    if Path(directory).name == f"step_{INJECTED_AT:06d}":
                        raise RuntimeError("injected into the gate")
                    return real(directory, *a, **k)

                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(_gate, "check_recorded_step", injected)
                    cache[kind] = _train(workdir, "defaults", None)
        return cache[kind]

    return get


def gate_keys(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k.startswith("grpo_cli/")}


def close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= 1e-6 or abs(a - b) <= rel * max(abs(a), abs(b))


# ------------------------------------------------------------------------- TRL
def test_check_true_logs_its_numbers_in_the_trainers_log(gated: Any) -> None:
    g = gated("broken")
    logged = step_records(g.run.log_history)
    for step in range(1, INJECTED_AT):
        numbers = gate_keys(logged[step])
        # β = 0: no reference log-probs, so no KL; every other key, every checked step
        assert set(numbers) == set(KEYS) - {"grpo_cli/kl_mean"}, step
        report = g.reports[step]
        assert numbers["grpo_cli/check_passed"] == (1.0 if report.passed else 0.0)
        assert numbers["grpo_cli/objective"] == report.objective.objective
        assert numbers["grpo_cli/check_seconds"] > 0


def test_the_numbers_are_the_trainers_own(gated: Any) -> None:
    """What the gate logs next to TRL's numbers agrees with them where both measure the
    same thing (one loss call a step: TRL's means over calls are the step's values)."""
    g = gated("goes_on")
    for step, record in step_records(g.run.log_history).items():
        ours = gate_keys(record)
        assert close(ours["grpo_cli/kl_mean"], record["kl"]), step
        assert close(ours["grpo_cli/clip_fraction_region"], record["clip_ratio/region_mean"])
        # groups of equal size: the share of groups is the share of answers TRL counts
        assert ours["grpo_cli/frac_zero_variance_groups"] == record["frac_reward_zero_std"]
        assert close(-ours["grpo_cli/objective"], record["loss"]), step


def test_a_failing_rule_stops_training_with_one_warning(gated: Any) -> None:
    g = gated("stopped")
    logged = step_records(g.run.log_history)
    assert sorted(logged) == [1, 2]  # stopped at step 2 of STEPS
    assert STEPS > 2
    assert logged[2]["kl"] > 0.01 >= logged[1]["kl"]  # TRL's own KL crosses the threshold
    (message,) = g.of(CheckFailedWarning)
    assert "step 2" in message and "rule kl-mean failed" in message
    assert "should_training_stop" in message
    assert not g.of(RuntimeWarning)
    # the stopping step was logged, with the verdict in it
    assert gate_keys(logged[2])["grpo_cli/check_passed"] == 0.0
    assert gate_keys(logged[2])["grpo_cli/failed_rules"] == 1.0
    assert gate_keys(logged[1])["grpo_cli/check_passed"] == 1.0
    assert not (g.run.directory / "step_000003").exists()


def test_without_stop_on_fail_training_completes(gated: Any, cli: Cli) -> None:
    g = gated("goes_on")
    logged = step_records(g.run.log_history)
    assert sorted(logged) == list(range(1, STEPS + 1))
    failed = {s: gate_keys(r)["grpo_cli/failed_rules"] for s, r in logged.items()}
    kl_over = {s: r["kl"] > 0.01 for s, r in logged.items()}
    assert failed == {s: float(over) for s, over in kl_over.items()}
    # one warning, at the first failure; the later ones are in the numbers only
    (message,) = g.of(CheckFailedWarning)
    assert "step 2" in message and "rule kl-mean failed" in message
    assert "training goes on" in message
    # metrics.jsonl stays what TRL logged: the gate's keys are not compared as TRL's
    lines = [json.loads(x) for x in (g.run.directory / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, STEPS + 1))
    assert not any(k.startswith("grpo_cli/") for x in lines for k in x)
    doc = cli.json("objective", g.run.directory / f"step_{STEPS:06d}")
    assert all(m["verdict"] == "match" for m in doc["logged"]["metrics"] if m["recomputed"])


def test_an_exception_in_the_gate_turns_it_off_and_nothing_else(gated: Any) -> None:
    g = gated("broken")
    (message,) = g.of(RuntimeWarning)
    assert "check gate" in message and f"step {INJECTED_AT}" in message
    assert "injected into the gate" in message and "recording and training go on" in message
    logged = step_records(g.run.log_history)
    assert sorted(logged) == list(range(1, STEPS + 1))  # training completed
    assert [s for s in logged if gate_keys(logged[s])] == list(range(1, INJECTED_AT))
    for step in range(1, STEPS + 1):  # every step still recorded
        d = g.run.directory / f"step_{step:06d}"
        assert (d / "_DONE").exists() and list(d.glob("rank000-mb*.parquet"))
    assert sorted(g.reports) == list(range(1, INJECTED_AT))


@pytest.mark.parametrize("kind", ["stopped", "goes_on", "broken"])
def test_in_process_verdicts_are_grpo_cli_checks(gated: Any, cli: Cli, kind: str) -> None:
    """Each step's report, made inside training, is the document ``grpo-cli check STEP
    --format json`` prints afterwards (with ``--config`` when the gate had one): every
    rule's status, value, message and examples, the objective, the settings, ``logged-
    metrics`` included (judged on TRL's log of the step)."""
    g = gated(kind)
    assert g.reports
    for step, report in g.reports.items():
        flags = [] if g.config is None else ["--config", str(g.config)]
        r = cli("check", g.run.directory / f"step_{step:06d}", "--format", "json", *flags)
        assert r.exit_code == (0 if report.passed else 1), r.stderr
        doc = json.loads(r.stdout)
        assert json.loads(dumps(check_json(report))) == doc, step
        verdicts = {x["rule"]: x["status"] for x in doc["results"]}
        assert verdicts["logged-metrics"] == "pass", step  # TRL's log, compared


def test_options_are_checked_before_training(tmp_path: Path) -> None:
    from grpo_cli.integrations import openrlhf, trl, verl

    for install in (trl.record, verl.install, openrlhf.install):
        with pytest.raises(ValueError, match="stop_on_fail: needs check"):
            install(object(), tmp_path, stop_on_fail=True)
        with pytest.raises(UsageError, match="cannot read"):
            install(object(), tmp_path, check=tmp_path / "missing.toml")
        (tmp_path / "bad.toml").write_text("[rules.no-such-rule]\nfail = 1\n")
        with pytest.raises(UsageError, match="no-such-rule"):
            install(object(), tmp_path, check=tmp_path / "bad.toml")
        with pytest.raises(TypeError, match="check: expected"):
            install(object(), tmp_path, check=3)  # type: ignore[arg-type]


# ---------------------------------------------------------------- verl, OpenRLHF
def _skip_unless(module: str) -> None:
    import importlib.util
    import os

    if not os.environ.get("GRPO_CLI_REQUIRE_TRAINERS") and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def _compare(cli: Cli, step: Path, report: Any, config: Path | None = None) -> None:
    """``report`` is ``grpo-cli check STEP -c logp=old_logp`` (``--config``) but for
    ``logged-metrics``, which the gate does not judge on a step without the current
    log-probs."""
    flags = [] if config is None else ["--config", str(config)]
    r = cli("check", step, "-c", "logp=old_logp", "--format", "json", *flags)
    doc = json.loads(r.stdout)
    mine = json.loads(dumps(check_json(report)))
    assert mine["objective"] == doc["objective"] and mine["settings"] == doc["settings"]
    theirs = {x["rule"]: x for x in doc["results"]}
    for x in mine["results"]:
        if x["rule"] == "logged-metrics":
            assert x["status"] == "skip" and "no current log-probs" in x["message"]
        else:
            assert x == theirs[x["rule"]], x["rule"]


def test_verl_gate_logs_with_the_actor_and_ends_fit_at_the_next_step(
    tmp_path: Path, cli: Cli
) -> None:
    _skip_unless("verl")
    from grpo_cli.integrations import verl

    from .test_verl_recorder import rollouts, trainer

    reports: dict[int, Any] = {}
    t = verl.install(
        trainer(3), tmp_path, check=True, stop_on_fail=True, on_check=reports.__setitem__
    )
    t.total_training_steps = 10
    batch, _ = rollouts(7)
    with pytest.warns(CheckFailedWarning) as caught:
        out = t._update_actor(batch)
    (message,) = [str(w.message) for w in caught]
    report = reports[3]
    failed = [r.rule for r in report.results if r.status == "fail"]
    assert failed and all(f"rule {rule} failed" in message for rule in failed)
    assert "verl step 3" in message and "total_training_steps" in message
    assert t.total_training_steps == 4  # verl's is_last_step at step 4: fit returns after it
    metrics = out.meta_info["metrics"]
    assert metrics["grpo_cli/check_passed"] == 0.0
    assert metrics["grpo_cli/failed_rules"] == float(len(failed))
    # verl's own reduction, as fit() logs them: the gate's numbers pass through unchanged
    from verl.utils.metric import reduce_metrics

    reduced = reduce_metrics(dict(metrics))
    assert reduced["grpo_cli/failed_rules"] == float(len(failed))
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert not any(k.startswith("grpo_cli/") for k in line)
    _compare(cli, tmp_path / "step_000003", report)


@dataclass
class Generator:
    """Stands in for OpenRLHF's ``SamplesGenerator`` (vLLM behind it): ``batches`` rollouts
    per episode, then the prompts are exhausted, as ``generate_samples`` reports it."""

    make: Callable[[int], list[Any]]
    batches: int
    calls: int = 0

    def generate_samples(self, **kwargs: Any) -> tuple[list[Any], float | None, int, bool]:
        self.calls += 1
        k = (self.calls - 1) % self.batches
        return self.make(100 + self.calls), None, 5, k == self.batches - 1


@pytest.fixture(scope="module")
def openrlhf_ray() -> Iterator[None]:
    """A private local Ray, as tests/test_openrlhf_recorder.py starts it."""
    _skip_unless("openrlhf")
    import os
    import secrets

    import ray

    from grpo_cli.engine.ray import reload_auth_config

    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    reload_auth_config()
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reload_auth_config()


@pytest.mark.usefixtures("openrlhf_ray")
def test_openrlhf_gate_ends_ppotrainers_fit(tmp_path: Path, cli: Cli) -> None:
    """OpenRLHF 0.11.2's own ``PPOTrainer.fit`` loop (two episodes of three steps) on the
    recorder tests' trainer: a failing rule at the first step ends it there."""
    from grpo_cli.integrations import openrlhf

    from . import test_openrlhf_recorder as o

    args = o.flat_args(
        **{
            # the KL in the loss: per-answer advantages (check reads no per-token ones yet)
            "algo.kl.use_loss": True,
            "train.num_episodes": 2,
            "eval.steps": math.inf,
            "ckpt.save_steps": math.inf,
            "ckpt.path": str(tmp_path / "ckpt"),
            "ckpt.load_enable": False,
            "logger.logging_steps": 1,
        }
    )
    config = tmp_path / "check.toml"
    # one prompt of five has four equal rewards (the recorder tests' rollouts)
    config.write_text("[rules.zero-std-groups]\nfail = 0.1\n")

    def fit_steps(check: Path | None) -> tuple[int, int, dict[int, Any], list[str]]:
        t = o.trainer(args)
        t.samples_generator = Generator(o.rollout_samples, batches=3)
        t.prompts_dataloader = _Loader(3)
        t.generate_kwargs, t.eval_dataloader = {}, None
        steps: list[int] = []
        reports: dict[int, Any] = {}
        original = t.train_step

        def counted(samples: Any, global_step: int) -> Any:
            steps.append(global_step + 1)
            return original(samples, global_step)

        t.train_step = counted
        run = tmp_path / ("gated" if check else "plain")
        if check is not None:
            openrlhf.install(t, run, check=check, stop_on_fail=True, on_check=reports.__setitem__)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            o.orl["trainer"].PPOTrainer.__ray_actor_class__.fit(t)
        told = [str(w.message) for w in caught if issubclass(w.category, CheckFailedWarning)]
        assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
        return len(steps), t.samples_generator.calls, reports, told

    assert fit_steps(None)[:2] == (6, 6)  # the loop as it runs without the gate
    n, calls, reports, told = fit_steps(config)
    # one step; every later call of generate_samples (both episodes') answered "exhausted"
    # without asking the generator
    assert n == 1 and calls == 1
    (message,) = told
    assert "openrlhf step 1" in message and "rule zero-std-groups failed" in message
    report = reports[1]
    assert not report.passed
    _compare(cli, tmp_path / "gated" / "step_000001", report, config)


class _Loader:
    """Stands in for the prompts dataloader ``fit`` reads (its length and state)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, Any]:
        return {}
