"""Real AReaL 1.0.4 GRPO steps on CPU (tests/real/areal_seam.py: the actor's own
``FSDPPPOActor`` with its CPU platform, gloo and FSDP2: ``compute_logp``,
``compute_advantages``, ``ppo_update``, ``export_stats``), recorded with
``grpo_cli.integrations.areal.install`` on the actor, and reproduced by
``grpo-cli objective`` / ``check`` with no flag.

The logged numbers compared are what ``export_stats`` returned (what AReaL's trainer
commits to its loggers), taken in the test, never from the recorded ``metrics.jsonl``:
float32 sums in AReaL (``stats_tracker``), compared to 1e-5 relative (1e-6 absolute).

Runs in its own environment (tests/real/areal_env.sh builds .areal-venv); skipped where
AReaL is not installed, unless GRPO_CLI_REQUIRE_TRAINERS is set (CI).
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
from .real import areal_seam as seam

if os.environ.get("GRPO_CLI_REQUIRE_TRAINERS"):
    import areal  # noqa: F401
elif importlib.util.find_spec("areal") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("areal is not installed", allow_module_level=True)

STEPS = 3
U = "ppo_actor/update/"
GROUP = {"mean_level": "group", "std_level": "group", "group_size": seam.N}
# PPOActorConfig overrides per configuration
CONFIGS: dict[str, dict[str, Any]] = {
    # AReaL's defaults: 4 minibatches (4 optimizer steps: the ratio moves off 1 after the
    # first), the KL as reward shaping (kl_ctl 0.1, k1), no normalisation
    "defaults": {},
    # the GRPO recipe: group-normalised advantages, the proximal log-probs recomputed,
    # clip-higher, no KL
    "grpo": {
        "adv_norm": GROUP,
        "recompute_logprob": True,
        "eps_clip_higher": 0.28,
        "kl_ctl": 0.0,
        "ppo_n_minibatches": 2,
    },
    # the dual clip, a large step so that ratios pass c
    "dual_clip": {"adv_norm": GROUP, "c_clip": 1.5, "ppo_n_minibatches": 4, "lr": 0.1},
    # decoupled PPO (behaviour, proximal and current policies): the proximal log-probs
    # recomputed, the ratio against them, the behaviour's recorded as rollout_logp; no
    # rejection sampling (AReaL 1.0.4's default: no behaviour weight); no KL shaping (it
    # takes the behaviour log-probs there)
    "decoupled": {
        "adv_norm": GROUP,
        "use_decoupled_loss": True,
        "kl_ctl": 0.0,
        "ppo_n_minibatches": 2,
    },
    # GSPO: the sequence-level ratio
    "gspo": {
        "adv_norm": GROUP,
        "importance_sampling_level": "sequence",
        "eps_clip": 3e-4,
        "eps_clip_higher": 4e-4,
        "ppo_n_minibatches": 2,
    },
}
COMPUTED = {
    U + "actor_loss/avg",
    U + "approx_kl/avg",
    U + "clip_ratio/avg",
    U + "dual_clip_ratio/avg",
    U + "entropy/avg",
    "ppo_actor/kl_rewards/avg",
}


@dataclass(frozen=True)
class Recorded:
    directory: Path | None
    run: seam.Run


def _config(name: str) -> tuple[float, dict[str, Any]]:
    from areal.api.cli_args import NormConfig

    over = dict(CONFIGS[name])
    lr = float(over.pop("lr", 1e-2))
    if "adv_norm" in over:
        over["adv_norm"] = NormConfig(**over["adv_norm"])
    return lr, over


@pytest.fixture(scope="session")
def areal_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Recorded]:
    """``areal_run(name, recorded=True)``: configuration ``name`` trained once a session."""
    from grpo_cli.integrations import areal as rec

    seam.setup_environment()
    path = seam.save_tiny_model(tmp_path_factory.mktemp("areal-model"))
    ref = seam.make_actor(path, lr=0.0)
    cache: dict[tuple[str, bool], Recorded] = {}

    def get(name: str, recorded: bool = True) -> Recorded:
        if (name, recorded) not in cache:
            lr, over = _config(name)
            actor = seam.make_actor(path, lr=lr, **over)
            directory = None
            if recorded:
                directory = tmp_path_factory.mktemp(f"areal-{name}") / "run"
                rec.install(actor, directory, group_size=seam.N)
            cache[(name, recorded)] = Recorded(directory, seam.train(actor, ref, STEPS))
        return cache[(name, recorded)]

    return get


def close(ours: float, logged: float) -> bool:
    return math.isclose(ours, logged, rel_tol=1e-5, abs_tol=1e-6)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_logged_actor_metric_with_no_flag(cli: Cli, areal_run: Any, name: str) -> None:
    r = areal_run(name)
    assert r.directory is not None
    computed = set(COMPUTED)
    if CONFIGS[name].get("importance_sampling_level") != "sequence":
        computed.add(U + "importance_weight/avg")
    for step, logged in r.run.logged.items():
        doc = cli.json("objective", r.directory / f"step_{step:06d}")
        s = doc["settings"]
        assert (s["from"], s["trainer"], s["mirrors"]) == ("meta.json", "areal", "areal 1.0.4")
        ours = doc["trainer_metrics"]["metrics"]
        assert computed <= set(ours) and computed <= set(logged)
        bad = [
            f"step {step} {k}: ours {ours[k]!r}, AReaL {float(logged[k])!r}"
            for k in sorted(computed)
            if not close(ours[k], float(logged[k]))
        ]
        assert not bad, "\n".join(bad)
        verdicts = {m["metric"]: m["verdict"] for m in doc["logged"]["metrics"]}
        assert {verdicts[k] for k in computed} == {"match"}, verdicts
    steps = list(r.run.logged.values())
    # several minibatches: every step's later updates are off-policy
    assert all(float(x[U + "approx_kl/avg"]) != 0.0 for x in steps)
    if name == "dual_clip":
        assert any(float(x[U + "dual_clip_ratio/avg"]) > 0.0 for x in steps)
    if name in ("grpo", "gspo", "defaults"):
        assert any(float(x[U + "clip_ratio/avg"]) > 0.0 for x in steps)


def test_the_files_are_the_loss_calls(areal_run: Any) -> None:
    """16 answers, 2 minibatches (one micro-batch each): 2 files a step, every answer
    once, in groups of N, with the proximal, reference and current log-probs."""
    r = areal_run("grpo")
    step = r.directory / "step_000002"
    files = sorted(step.glob("rank000-mb*.parquet"))
    assert [p.name for p in files] == [f"rank000-mb{k:03d}.parquet" for k in range(2)]
    infos = [json.loads(pq.read_schema(p).metadata[b"grpo_cli"]) for p in files]
    positions = sorted(x for i in infos for x in i["positions"])
    assert positions == list(range(seam.PROMPTS * seam.N))
    groups = [g for p in files for g in pq.read_table(p)["group"].to_pylist()]
    assert sorted(groups.count(g) for g in set(groups)) == [seam.N] * seam.PROMPTS
    cols = pq.read_table(files[0]).column_names
    assert {"logp", "old_logp", "ref_logp", "entropy", "advantage", "reward", "mask"} <= set(cols)
    assert (step / "_DONE").exists()
    meta = json.loads((r.directory / "meta.json").read_text())
    assert meta["trainer"] == "areal" and meta["config"]["adv_norm.group_size"] == seam.N


def test_recording_leaves_training_unchanged(areal_run: Any) -> None:
    recorded, plain = areal_run("grpo").run, areal_run("grpo", recorded=False).run
    for step in range(1, STEPS + 1):
        a, b = recorded.logged[step], plain.logged[step]
        assert {k: a[k] for k in b if "timeperf" not in k} == {
            k: b[k] for k in b if "timeperf" not in k
        }


def test_check_with_no_flag_passes_the_logged_metrics(cli: Cli, areal_run: Any) -> None:
    r = areal_run("grpo")
    out = cli("check", r.directory / f"step_{STEPS:06d}", "--format", "json")
    doc = json.loads(out.stdout)
    logged = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert logged["status"] == "pass" and logged["value"] <= 1e-5


def test_decoupled_ppo_records_the_three_policies(areal_run: Any) -> None:
    """With ``use_decoupled_loss`` the behaviour log-probs (the sampler's, from
    ``generate``) are ``rollout_logp`` and the recomputed proximal ones ``old_logp``: two
    computations of the same policy at step 1, which differ (AReaL's packed training
    forward on CPU against ``generate``'s batched one: up to a few 1e-2 here) but not by
    much."""
    import numpy as np

    r = areal_run("decoupled")
    t = pq.read_table(r.directory / "step_000001" / "rank000-mb000.parquet").to_pydict()
    assert {"rollout_logp", "old_logp", "logp"} <= set(t)
    mask = np.concatenate([np.asarray(m, bool) for m in t["mask"]])
    roll = np.concatenate([np.asarray(v) for v in t["rollout_logp"]])[mask]
    old = np.concatenate([np.asarray(v) for v in t["old_logp"]])[mask]
    gap = float(np.max(np.abs(roll - old)))
    assert 0.0 < gap < 0.5, gap
