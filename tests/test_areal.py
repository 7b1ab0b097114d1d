"""AReaL 1.0.4: the preset and its loss rows against AReaL's own code, and its config.

The oracle is AReaL's ``grpo_loss_fn`` (``ppo_actor_loss_fn``, ``sapo_loss_fn``) and
``stats_tracker`` run on crafted batches by ``conformance/areal/record.py``:
``conformance/areal/fixtures/areal.json`` holds, per case (a ``PPOActorConfig``
subset), every answer's current, proximal and behaviour log-probs, advantages, rolled
loss mask and entropy, its micro-batch, each micro-batch's loss as ``grpo_loss_fn``
returned it and the ``ppo_actor/update/*/avg`` statistics AReaL exported. Each case is
written as a recorded run (``meta.json`` with the case's config, one file per
micro-batch, the statistics as ``metrics.jsonl``) and read by ``grpo-cli objective`` with
no flag. Nothing here is a number copied from grpo-cli's output: each expected value is
AReaL's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_cli.integrations._writer import RunWriter, rollout_table
from grpo_cli.trainers import TRAINERS

from .conftest import Cli

ROOT = Path(__file__).resolve().parent.parent
ORACLE = json.loads((ROOT / "conformance" / "areal" / "fixtures" / "areal.json").read_text())
CASES = {c["name"]: c for c in ORACLE["cases"]}
U = "ppo_actor/update/"
# AReaL sums float32 tensors (torch.where(...).sum() per call, then the calls)
RTOL, ATOL = 2e-5, 2e-6
NOT_RECOMPUTED = {U + "new_logp/avg", U + "old_logp/avg"}


def _table(answers: list[dict[str, Any]], rows: list[int], old: str) -> Any:
    width = max(len(answers[i]["mask"]) for i in rows)

    def padded(key: str, dtype: Any = np.float32) -> np.ndarray:
        out = np.zeros((len(rows), width), dtype=dtype)
        for k, i in enumerate(rows):
            v = answers[i][key]
            out[k, : len(v)] = v
        return out

    mask = padded("mask", bool)
    return rollout_table(
        group=[f"g{i // 2}" for i in rows],
        reward=np.zeros(len(rows)),
        advantage=np.array([answers[i]["advantage"][0] for i in rows], dtype=np.float64),
        mask=mask,
        tokens={f: np.where(mask, padded(k), 0.0).astype(np.float32) for f, k in
                (("logp", "logp"), ("old_logp", old), ("entropy", "entropy"))},
    )  # fmt: skip


def _run(tmp: Path, case: dict[str, Any], calls: list[list[int]], logged: Any) -> Path:
    """The case as a recorded run of one step: its micro-batches ``calls``."""
    config = {**case["config"], "kl_ctl": 0.0}  # no reference in the crafted batches
    # the ratio's denominator: the proximal policy's, but sapo_loss_fn takes the behaviour
    # log-probs (grpo_loss_fn: old_logprobs=input_data["logprobs"]), what the recorder
    # writes as old_logp with use_sapo_loss
    old = "logprobs" if config.get("use_sapo_loss") else "prox_logp"
    w = RunWriter(tmp / "run", trainer="areal", trainer_version=ORACLE["version"], config=config)
    for k, rows in enumerate(calls):
        w.write_micro_batch(1, k, _table(case["answers"], rows, old), {"answers": len(rows)})
    w.finish_step(1)
    if logged is not None:
        w.append_metrics({"step": 1, **logged})
    return tmp / "run" / "step_000001"


@pytest.mark.parametrize("name", list(CASES))
def test_the_update_statistics_with_no_flag(cli: Cli, tmp_path: Path, name: str) -> None:
    case = CASES[name]
    doc = cli.json("objective", _run(tmp_path, case, case["micro_batches"], case["logged"]))
    s = doc["settings"]
    assert (s["from"], s["trainer"], s["mirrors"]) == ("meta.json", "areal", "areal 1.0.4")
    ours = doc["trainer_metrics"]["metrics"]
    sequence = case["config"].get("importance_sampling_level") == "sequence"
    compared = set(case["logged"]) - NOT_RECOMPUTED - ({U + "importance_weight/avg"} if
                                                        sequence else set())  # fmt: skip
    bad = [
        f"{k}: ours {ours[k]!r}, AReaL {case['logged'][k]!r}"
        for k in sorted(compared)
        if not math.isclose(ours[k], case["logged"][k], rel_tol=RTOL, abs_tol=ATOL)
    ]
    assert not bad, "\n".join(bad)
    verdicts = {m["metric"]: m["verdict"] for m in doc["logged"]["metrics"]}
    assert {verdicts[k] for k in compared} == {"match"}, verdicts
    # what is not recomputed is left out with a warning, and the release says why
    missing = NOT_RECOMPUTED | ({U + "importance_weight/avg"} if sequence else set())
    assert not missing & set(ours)
    assert all(any(repr(k) in w for w in doc["warnings"]) for k in missing), doc["warnings"]
    assert missing <= set(TRAINERS["areal"].newest.missing)


@pytest.mark.parametrize("name", list(CASES))
def test_each_micro_batch_loss_is_grpo_loss_fn_s(cli: Cli, tmp_path: Path, name: str) -> None:
    """A micro-batch alone: its loss (grpo-cli's −policy term, token-mean) is the one
    ``grpo_loss_fn`` returned for it."""
    case = CASES[name]
    for k, (rows, loss) in enumerate(zip(case["micro_batches"], case["losses"], strict=True)):
        doc = cli.json("objective", _run(tmp_path / str(k), case, [rows], None))
        ours = -doc["trainer_metrics"]["metrics"][U + "actor_loss/avg"]
        assert math.isclose(-ours, loss, rel_tol=RTOL, abs_tol=ATOL), (k, -ours, loss)


def test_the_dual_clip_and_the_clip_metrics_are_exercised() -> None:
    """The fixture is not trivial: the clip, the dual clip and off-policy ratios occur."""
    logged = {n: c["logged"] for n, c in CASES.items()}
    assert logged["clip_higher_dual"][U + "dual_clip_ratio/avg"] > 0
    assert all(logged[n][U + "clip_ratio/avg"] > 0 for n in ("defaults", "gspo", "gspo_dual"))
    assert all(abs(v[U + "approx_kl/avg"]) > 1e-3 for v in logged.values())


def test_the_config_maps_onto_the_settings() -> None:
    from_config = TRAINERS["areal"].from_config
    out, notes = from_config(
        {
            "eps_clip": 0.1,
            "eps_clip_higher": 0.3,
            "c_clip": 3.0,
            "importance_sampling_level": "sequence",
            "kl_ctl": 0.05,
            "kl_estimator": "k3",
            "adv_norm.mean_level": "group",
            "adv_norm.std_level": "group",
            "adv_norm.std_unbiased": False,
            "adv_norm.eps": 1e-6,
            "use_decoupled_loss": True,
            "rejection_sampling.level": "token",
        }
    )
    assert out == {
        "clip_eps": 0.1, "clip_eps_high": 0.3, "dual_clip": 3.0, "ratio_level": "sequence",
        "beta": 0.05, "kl_estimator": "k3", "scale": "group", "ddof": 0, "eps": 1e-6,
    }  # fmt: skip
    assert len(notes) == 2 and "behaviour importance weight" in notes[0]
    assert "KL shaping takes the behaviour log-probs" in notes[1]
    out, _ = from_config({"use_sapo_loss": True, "sapo_tau_neg": 2.0})
    assert out == {"loss": "areal/sapo", "loss_params": {"sapo_tau_neg": 2.0}}


def test_a_wrong_config_value_is_one_line_naming_meta_json(cli: Cli, tmp_path: Path) -> None:
    case = CASES["defaults"]
    step = _run(tmp_path, {**case, "config": {"c_clip": 0.5}}, case["micro_batches"], None)
    cli.error(["objective", str(step)], "c_clip")


# ------------------------------------------------------------------ the recorder
class _Actor:
    """The shape of AReaL's ``FSDPPPOActor`` the recorder hooks (numpy in place of
    tensors): ``ppo_update`` packs its trajectories into one micro-batch and calls
    ``self.train_batch`` with its loss function, as ``PPOActor._ppo_update`` does."""

    def __init__(self, fail: bool = False) -> None:
        from types import SimpleNamespace

        self.config = SimpleNamespace(eps_clip=0.2, importance_sampling_level="token",
                                      adv_norm=None, reward_norm=None)  # fmt: skip
        self.fail = fail
        self.stats: dict[str, float] = {}

    def train_batch(self, mb: dict[str, Any], loss_fn: Any, loss_weight_fn: Any) -> dict:
        logp = mb["logprobs"] + 0.1
        return {"loss": loss_fn(logp, np.ones_like(logp), mb)}

    def ppo_update(self, data: list[dict[str, Any]]) -> None:
        ids = np.concatenate([d["input_ids"][0] for d in data])
        cu = np.cumsum([0] + [d["input_ids"].shape[1] for d in data])
        mb = {k: np.concatenate([d[k][0] for d in data]) for k in
              ("input_ids", "logprobs", "advantages", "loss_mask")}  # fmt: skip
        mb["input_ids"], mb["cu_seqlens"] = ids, cu
        if self.fail:
            mb.pop("advantages")  # a recording failure: the recorder cannot read it
        self.train_batch(mb, lambda lp, ent, d: float(np.sum(lp * d["loss_mask"])), None)
        self.stats = {"ppo_actor/update/actor_loss/avg": 0.5}

    def export_stats(self) -> dict[str, float]:
        return dict(self.stats)


def _trajectories() -> list[dict[str, Any]]:
    out = []
    for i in range(4):
        n = 3 + i
        out.append({
            "input_ids": np.arange(10 * i, 10 * i + n)[None],
            "attention_mask": np.ones((1, n), bool),
            "loss_mask": np.array([[0] + [1] * (n - 2) + [0]]),
            "logprobs": np.full((1, n), -1.0 - i, np.float32),
            "advantages": np.full((1, n), float(i - 1.5), np.float32),
            "rewards": np.array([float(i)]),
        })  # fmt: skip
    return out


def test_install_records_each_loss_call_and_the_exported_stats(tmp_path: Path) -> None:
    from grpo_cli.integrations import areal as rec

    actor = rec.install(_Actor(), tmp_path / "run", group_size=2)
    actor.ppo_update(_trajectories())
    assert actor.export_stats() == {"ppo_actor/update/actor_loss/avg": 0.5}
    step = tmp_path / "run" / "step_000001"
    import pyarrow.parquet as pq

    t = pq.read_table(step / "rank000-mb000.parquet").to_pydict()
    assert t["group"] == ["g000001-p00000"] * 2 + ["g000001-p00001"] * 2
    assert t["reward"] == [0.0, 1.0, 2.0, 3.0] and t["advantage"] == [-1.5, -0.5, 0.5, 1.5]
    # logp the loss was given (old + 0.1), old_logp the behaviour's (no prox_logp)
    assert t["mask"][1] == [False, True, True, False, False, False]  # padded to 6
    assert t["old_logp"][1][1] == -2.0 and math.isclose(t["logp"][1][1], -1.9, rel_tol=1e-6)
    assert (step / "_DONE").exists()
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert line == {"step": 1, "ppo_actor/update/actor_loss/avg": 0.5}


def test_a_recording_failure_is_one_warning_and_training_goes_on(tmp_path: Path) -> None:
    from grpo_cli.integrations import areal as rec

    actor = rec.install(_Actor(fail=True), tmp_path / "run", group_size=2)
    with pytest.warns(RuntimeWarning, match="grpo-cli: recording the areal run failed"):
        actor.ppo_update(_trajectories())
    actor.ppo_update(_trajectories())  # no second warning, training goes on
    assert actor.export_stats() == {"ppo_actor/update/actor_loss/avg": 0.5}
    assert not (tmp_path / "run" / "step_000001" / "_DONE").exists()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"every_steps": 0}, "every_steps"),
        ({"group_size": 1.5}, "group_size"),
        ({"token_dtype": "f4"}, "token_dtype"),
    ],
)
def test_install_names_a_wrong_argument(tmp_path: Path, kwargs: dict[str, Any], words: str) -> None:
    from grpo_cli.integrations import areal as rec

    with pytest.raises((TypeError, ValueError), match=words):
        rec.install(_Actor(), tmp_path / "run", **kwargs)
    with pytest.raises(TypeError, match="FSDPPPOActor"):
        rec.install(object(), tmp_path / "run")


def test_installing_twice_records_once(tmp_path: Path) -> None:
    from grpo_cli.integrations import areal as rec

    actor = rec.install(_Actor(), tmp_path / "a", group_size=2)
    rec.install(actor, tmp_path / "b", group_size=2)
    actor.ppo_update(_trajectories())
    actor.export_stats()
    assert not (tmp_path / "a").exists()
    names = sorted(p.name for p in (tmp_path / "b" / "step_000001").iterdir())
    assert names == ["_DONE", "rank000-mb000.parquet"]
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 1
