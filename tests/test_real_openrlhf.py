"""Real OpenRLHF 0.11.2 GRPO steps on CPU (tests/real/openrlhf_seam.py: the policy actor's
own ``ActorPPOTrainer.ppo_train`` → ``training_step``, ``PolicyLoss``, the KL loss, its
replay buffer, ``RemoteExperienceMaker``'s KL and advantages), recorded with
``grpo_cli.integrations.openrlhf.install`` on the ``ActorPPOTrainer``, and reproduced by
``grpo-cli objective`` / ``check`` with no flag.

The logged numbers compared are the status ``ppo_train`` returned (what ``PPOTrainer``
logs of the actor), taken in the test, never from the recorded ``metrics.jsonl``:
float32 sums in OpenRLHF, compared to 1e-5 relative (1e-6 absolute).

All configurations take ``--algo.kl.use_loss``: with the KL in the reward (OpenRLHF's
default) ``make_experience`` drops the reference log-probs before training
(``base_action_log_probs = None``), so a recorded step has no ``ref_logp`` and grpo-cli
says so (:func:`test_the_kl_in_the_reward_is_refused_by_name`).

Runs in the conformance environment (conformance/run builds it); skipped where OpenRLHF
is not installed, unless GRPO_CLI_REQUIRE_TRAINERS is set (CI).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from .conftest import Cli
from .real import openrlhf_seam as seam

if os.environ.get("GRPO_CLI_REQUIRE_TRAINERS"):
    import openrlhf  # noqa: F401
elif importlib.util.find_spec("openrlhf") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("openrlhf is not installed", allow_module_level=True)

STEPS = 3
KL = {"algo.kl.use_loss": True, "algo.kl.estimator": "k3"}
# OpenRLHF argument overrides per configuration (over tests/real/openrlhf_seam.py's)
CONFIGS: dict[str, dict[str, Any]] = {
    # the KL loss, one optimizer step of 2 accumulated micro-batches, one epoch: ratio 1
    "kl_loss": {**KL},
    # an optimizer step per micro-batch of 8, 2 epochs: the ratio moves and clips;
    # clip-higher; the k1 KL
    "epochs": {
        **KL,
        "algo.kl.estimator": "k1",
        "train.batch_size": 8,
        "train.max_epochs": 2,
        "actor.eps_clip_low_high": (0.2, 0.28),
    },
    # the per-sample loss (seq-mean-token-mean), normalised by the step's sample count
    "seqmean": {
        **KL,
        "train.batch_size": 8,
        "train.max_epochs": 2,
        "actor.loss_agg_mode": "seq-mean-token-mean",
    },
    # GSPO: the sequence-level ratio
    "gspo": {
        **KL,
        "train.batch_size": 8,
        "train.max_epochs": 2,
        "actor.policy_loss_type": "gspo",
    },
}
COMPUTED = {"policy_loss", "ppo_clip_ratio", "ppo_kl", "kl", "logprobs_diff"}


@dataclass(frozen=True)
class Recorded:
    directory: Path | None
    run: seam.Run


@pytest.fixture(scope="session")
def openrlhf_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Recorded]:
    """``openrlhf_run(name, recorded=True)``: configuration ``name`` trained once a session."""
    from grpo_cli.integrations import openrlhf as rec

    cache: dict[tuple[str, bool], Recorded] = {}

    def get(name: str, recorded: bool = True) -> Recorded:
        if (name, recorded) not in cache:
            trainer = seam.make_trainer(seam.flat_args(**CONFIGS[name]))
            directory = None
            if recorded:
                directory = tmp_path_factory.mktemp(f"openrlhf-{name}") / "run"
                rec.install(trainer, directory)
            cache[(name, recorded)] = Recorded(directory, seam.train(trainer, STEPS))
        return cache[(name, recorded)]

    return get


def close(ours: float, logged: float) -> bool:
    return math.isclose(ours, logged, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_logged_actor_metric_with_no_flag(cli: Cli, openrlhf_run: Any, name: str) -> None:
    r = openrlhf_run(name)
    assert r.directory is not None
    for step, logged in r.run.logged.items():
        doc = cli.json("objective", r.directory / f"step_{step:06d}")
        s = doc["settings"]
        assert (s["from"], s["trainer"], s["mirrors"]) == ("meta.json", "openrlhf",
                                                           "openrlhf 0.11.2")  # fmt: skip
        ours = doc["trainer_metrics"]["metrics"]
        assert COMPUTED <= set(ours) and COMPUTED <= set(logged)
        bad = [
            f"step {step} {k}: ours {ours[k]!r}, OpenRLHF {float(logged[k])!r}"
            for k in COMPUTED
            if not close(ours[k], float(logged[k]))
        ]
        assert not bad, "\n".join(bad)
        verdicts = {m["metric"]: m["verdict"] for m in doc["logged"]["metrics"]}
        assert {verdicts[k] for k in COMPUTED} == {"match"}, verdicts
    if CONFIGS[name].get("train.max_epochs", 1) > 1:  # the policy moved within the step
        steps = r.run.logged.values()
        assert all(float(x["ppo_kl"]) != 0.0 for x in steps)
        assert any(float(x["ppo_clip_ratio"]) > 0.0 for x in steps)


def test_the_files_are_the_training_steps(openrlhf_run: Any) -> None:
    """16 answers, micro-batches of 8, 2 epochs: 4 training steps a step, each file one
    with the current log-probs, the optimizer step's normalisers and every answer's
    rollout position (its group)."""
    r = openrlhf_run("epochs")
    step = r.directory / "step_000002"
    files = sorted(step.glob("rank000-mb*.parquet"))
    assert [p.name for p in files] == [f"rank000-mb{k:03d}.parquet" for k in range(4)]
    infos = [json.loads(pq.read_schema(p).metadata[b"grpo_cli"]) for p in files]
    assert sum(i["answers"] for i in infos) == 2 * seam.PROMPTS * seam.N
    assert all(i["dp_size"] == 1.0 and i["global_batch_size"] == 8.0 for i in infos)
    assert [i["epoch"] for i in infos] == [0, 0, 1, 1]
    # each epoch's pass over a group is its own group of n
    groups = [g for p in files for g in pq.read_table(p)["group"].to_pylist()]
    assert sorted(groups.count(g) for g in set(groups)) == [seam.N] * (2 * seam.PROMPTS)
    cols = pq.read_table(files[0]).column_names
    assert {"logp", "old_logp", "ref_logp", "advantage", "reward", "group", "mask"} <= set(cols)
    assert (step / "_DONE").exists()


def test_recording_leaves_training_unchanged(openrlhf_run: Any) -> None:
    recorded, plain = openrlhf_run("epochs").run, openrlhf_run("epochs", recorded=False).run
    for step in range(1, STEPS + 1):
        assert recorded.logged[step] == plain.logged[step]


def test_check_with_no_flag_passes_the_logged_metrics(cli: Cli, openrlhf_run: Any) -> None:
    r = openrlhf_run("epochs")
    out = cli("check", r.directory / f"step_{STEPS:06d}", "--format", "json")
    doc = json.loads(out.stdout)
    logged = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert logged["status"] == "pass" and logged["value"] <= 1e-5


def test_the_kl_in_the_reward_is_refused_by_name(cli: Cli, tmp_path: Path) -> None:
    """OpenRLHF's default (the KL in the reward): the reference log-probs are gone before
    training, and grpo-cli names the missing column rather than guess the KL."""
    from grpo_cli.integrations import openrlhf as rec

    trainer = seam.make_trainer(seam.flat_args())
    rec.install(trainer, tmp_path / "run")
    seam.train(trainer, 1)
    cli.error(["objective", str(tmp_path / "run" / "step_000001")], "'ref_logp' is missing")


def test_recording_a_policy_actor_class_installs_on_its_trainer(tmp_path: Path) -> None:
    """``recording(PolicyModelActor, dir)``: the class installs on the ``ActorPPOTrainer``
    its ``init_model_from_pretrained`` makes (here a class of that shape, without Ray)."""
    from grpo_cli.integrations import openrlhf as rec

    class PolicyActor:
        def init_model_from_pretrained(self, args: Any) -> str:
            self.trainer = seam.make_trainer(args)
            return "made"

    actor = rec.recording(PolicyActor, tmp_path / "run")()
    assert actor.init_model_from_pretrained(seam.flat_args(**KL)) == "made"
    seam.train(actor.trainer, 1)
    step = tmp_path / "run" / "step_000001"
    assert (step / "_DONE").exists() and len(list(step.glob("rank000-mb*.parquet"))) == 2
