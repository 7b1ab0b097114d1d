"""Real verl 0.9.1 GRPO steps on CPU (tests/real/verl_seam.py: verl's own workers, FSDP2
engine, ppo_loss and RayPPOTrainer methods), recorded with
``grpo_cli.integrations.verl.install`` on the trainer, and reproduced by
``grpo-cli objective`` / ``check`` with no flag.

The logged numbers compared are the ones verl's step returned (``reduce_metrics`` of
``_update_actor``'s output, as ``fit`` logs them), taken from the trainer in the test,
never from the recorded ``metrics.jsonl``. They are float32 sums in verl: compared to
1e-5 relative (1e-6 absolute, for the on-policy zeros).

Runs in the conformance environment (conformance/run builds it); skipped where verl is not
installed, unless GRPO_CLI_REQUIRE_TRAINERS is set (CI).
"""

from __future__ import annotations

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
from .real import verl_seam as seam

seam.setup_environment()  # before verl is imported (tests/real/verl_cpu.py)
if os.environ.get("GRPO_CLI_REQUIRE_TRAINERS"):
    import verl  # noqa: F401
else:
    pytest.importorskip("verl")
    pytest.importorskip("hydra")

STEPS = 3
A = "actor_rollout_ref.actor."
# verl config overrides per configuration (over tests/real/verl_seam.py's config)
CONFIGS: dict[str, dict[str, Any]] = {
    # one mini-batch, one epoch, no KL loss: the ratio is 1 (verl's recompute of the
    # old log-probs is the same forward)
    "defaults": {},
    # the GRPO recipe's KL loss (low_var_kl), with a coefficient large enough to show
    "kl": {A + "use_kl_loss": True, A + "kl_loss_coef": 0.05},
    # 2 mini-batches × 2 micro-batches × 2 epochs: the ratio moves off 1 and clips;
    # clip-higher, the KL loss
    "minibatches": {
        A + "ppo_mini_batch_size": 2,
        A + "ppo_micro_batch_size_per_gpu": 4,
        A + "ppo_epochs": 2,
        A + "clip_ratio_high": 0.28,
        A + "use_kl_loss": True,
    },
    # seq-mean-token-mean (normalised by global_batch_size) over mini-batches
    "seqmean": {
        A + "loss_agg_mode": "seq-mean-token-mean",
        A + "ppo_mini_batch_size": 2,
        A + "ppo_micro_batch_size_per_gpu": 4,
        A + "ppo_epochs": 2,
    },
    # GSPO (compute_policy_loss_gspo): the sequence-level ratio, its small clip range
    "gspo": {
        A + "policy_loss.loss_mode": "gspo",
        A + "clip_ratio_low": 3e-4,
        A + "clip_ratio_high": 4e-4,
        A + "ppo_mini_batch_size": 2,
        A + "ppo_micro_batch_size_per_gpu": 4,
        A + "ppo_epochs": 2,
    },
}
# what verl's actor logs that grpo-cli computes (actor/grad_norm, lr, perf/* it cannot)
COMPUTED = {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl",
            "actor/loss"}  # fmt: skip


@dataclass(frozen=True)
class Recorded:
    directory: Path | None
    run: seam.Run


@pytest.fixture(scope="session")
def verl_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Recorded]:
    """``verl_run(name, recorded=True)``: configuration ``name`` trained once a session."""
    from grpo_cli.integrations import verl as rec

    model_dir = seam.save_model(tmp_path_factory.mktemp("verl-model"))
    cache: dict[tuple[str, bool], Recorded] = {}

    def get(name: str, recorded: bool = True) -> Recorded:
        if (name, recorded) not in cache:
            trainer = seam.make_trainer(seam.config(model_dir, **CONFIGS[name]))
            directory = None
            if recorded:
                directory = tmp_path_factory.mktemp(f"verl-{name}") / "run"
                rec.install(trainer, directory)
            cache[(name, recorded)] = Recorded(directory, seam.train(trainer, STEPS))
        return cache[(name, recorded)]

    return get


def close(ours: float, logged: float) -> bool:
    return math.isclose(ours, logged, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_logged_actor_metric_with_no_flag(cli: Cli, verl_run: Any, name: str) -> None:
    r = verl_run(name)
    assert r.directory is not None
    compared: set[str] = set()
    for step, logged in r.run.logged.items():
        doc = cli.json("objective", r.directory / f"step_{step:06d}")
        s = doc["settings"]
        assert (s["from"], s["trainer"], s["mirrors"]) == ("meta.json", "verl", "verl 0.9.1")
        ours = doc["trainer_metrics"]["metrics"]
        names = COMPUTED | ({"actor/kl_loss"} if "actor/kl_loss" in logged else set())
        assert names <= set(ours), sorted(names - set(ours))
        bad = [
            f"step {step} {k}: ours {ours[k]!r}, verl {float(logged[k])!r}"
            for k in names
            if not close(ours[k], float(logged[k]))
        ]
        assert not bad, "\n".join(bad)
        compared |= names
        # and with no --logged flag: the run's metrics.jsonl, every shared metric a match
        verdicts = {m["metric"]: m["verdict"] for m in doc["logged"]["metrics"]}
        assert {verdicts[k] for k in names} == {"match"}, verdicts
    assert COMPUTED <= compared
    cfg = CONFIGS[name]
    if cfg.get(A + "use_kl_loss"):
        assert "actor/kl_loss" in compared
    if cfg.get(A + "ppo_epochs", 1) > 1:  # the policy moved within the step: not ratio 1
        last = r.run.logged[STEPS]
        assert float(last["actor/ppo_kl"]) != 0.0
        if cfg.get(A + "policy_loss.loss_mode") != "gspo":
            assert float(last["actor/pg_clipfrac"]) > 0.0


def test_the_files_are_the_loss_calls(verl_run: Any) -> None:
    """2 mini-batches of 8 answers, micro-batches of 4, 2 epochs: 8 loss calls a step,
    each file one call with the current log-probs, its mini-batch and verl's
    normalisers; together every answer of both epochs."""
    r = verl_run("minibatches")
    step = r.directory / "step_000002"
    files = sorted(step.glob("rank000-mb*.parquet"))
    assert [p.name for p in files] == [f"rank000-mb{k:03d}.parquet" for k in range(8)]
    infos = [json.loads(pq.read_schema(p).metadata[b"grpo_cli"]) for p in files]
    assert [i["mini_batch"] for i in infos] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert {i["global_batch_size"] for i in infos} == {8} and {i["dp_size"] for i in infos} == {1}
    assert sum(i["answers"] for i in infos) == 2 * seam.PROMPTS * seam.N
    cols = pq.read_table(files[-1]).column_names
    assert {"logp", "old_logp", "ref_logp", "advantage", "reward", "group", "mask"} <= set(cols)
    # each epoch's pass over a group is its own group of n (not one group of 2n)
    assert [i["epoch"] for i in infos] == [0, 0, 0, 0, 1, 1, 1, 1]
    groups = [g for p in files for g in pq.read_table(p)["group"].to_pylist()]
    assert sorted(groups.count(g) for g in set(groups)) == [seam.N] * (2 * seam.PROMPTS)
    assert (step / "_DONE").exists()


def test_recording_leaves_training_unchanged(verl_run: Any) -> None:
    """The recorded run and a run without the recorder log the same numbers: verl's own
    loss computes the step either way."""
    recorded, plain = verl_run("minibatches").run, verl_run("minibatches", recorded=False).run
    for step in range(1, STEPS + 1):
        a, b = recorded.logged[step], plain.logged[step]
        assert {k: float(v) for k, v in a.items() if "perf/" not in k} == {
            k: float(v) for k, v in b.items() if "perf/" not in k
        }


def test_check_with_no_flag_passes_the_logged_metrics(cli: Cli, verl_run: Any) -> None:
    r = verl_run("minibatches")
    out = cli("check", r.directory / f"step_{STEPS:06d}", "--format", "json")
    doc = json.loads(out.stdout)
    logged = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert logged["status"] == "pass" and logged["value"] <= 1e-5
