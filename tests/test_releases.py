"""Each release preset against that release's own code, from recorded fixtures.

``conformance/releases/run`` calls, in each release's own environment, that release's
loss function on fixed rollouts (``trl_release.py``, ``verl_release.py``,
``openrlhf_release.py``) and trains a tiny model on CPU with it (``*_train.py``), and
writes what the release computed and logged as JSON under
``conformance/releases/fixtures/``. These tests run grpo-cli on the same rollouts with the
release's preset and compare: no old release is installed here.

``GRPO_CLI_RELEASE_FIXTURES=DIR`` points them at freshly written fixtures (the run script
does, after writing them), instead of the committed ones.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.trainers import TRAINERS
from grpo_cli.trainers.base import parse_version
from grpo_cli.trainers.presets import PRESETS, RELEASE_PRESETS, preset_for, preset_settings
from grpo_cli.trainers.trl import logged_loss_decimals

from .conftest import Cli

HERE = Path(__file__).resolve().parent.parent / "conformance" / "releases" / "fixtures"
FIXTURES = Path(os.environ.get("GRPO_CLI_RELEASE_FIXTURES", HERE))
REL = 1e-9  # float64 on both sides
ABS = 1e-12
METRIC = 1e-6  # the trainers' clip shares are means of float32 masks

# Releases whose code the suite cannot run, with why (README "Conformance").
NOT_RUN: dict[str, str] = {
    "slime@0.3.1": "not on the package index (no release environment): proved against its "
    "own code at commit 624b824a by conformance/frontier/record.py's fixtures "
    "(tests/test_slime.py)",
    "prime_rl@0.8.0": "not on the package index (no release environment): proved against its "
    "own code at commit 559b4477 by conformance/frontier/record.py's fixtures "
    "(tests/test_prime_rl.py)",
    "areal@1.0.4": (
        "AReaL's own ppo_actor_loss_fn, sapo_loss_fn and stats_tracker are run by "
        "conformance/areal/record.py (its fixtures: tests/test_areal.py) and its real step "
        "by tests/test_real_areal.py"
    ),
}


def fixtures(kind: str, where: Path = FIXTURES) -> list[Path]:
    return sorted(where.glob(f"*-{kind}.json"))


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def tensor_cases() -> list[Any]:
    out = []
    for path in fixtures("loss"):
        doc = load(path)
        for i, case in enumerate(doc["cases"]):
            out.append(pytest.param(path, i, id=f"{path.stem}:{case['flags']}"))
    return out


def write_rollouts(data: dict[str, Any], path: Path, *, advantage: bool = False) -> Path:
    cols: dict[str, Any] = {
        "group": data["group"],
        "reward": data["reward"],
        "logp": data["logp"],
        "old_logp": data["old_logp"],
        "ref_logp": data["ref_logp"],
    }
    if advantage:
        cols["advantage"] = data["advantage"]
    pq.write_table(pa.table(cols), path)
    return path


def advantage_flags(flags: str) -> list[str]:
    """The flags of ``flags`` that the ``advantages`` command takes."""
    words, out = flags.split(), []
    for i, flag in enumerate(words[:-1]):
        if flag in ("--preset", "--scale", "--ddof", "--eps", "--estimator", "--singleton"):
            out += [flag, words[i + 1]]
    return out


def close(theirs: float, ours: float, rel: float) -> bool:
    return abs(theirs - ours) <= rel * abs(theirs) + ABS


def release_of(doc: dict[str, Any]) -> Any:
    trainer = TRAINERS[doc["trainer"]]
    settings, warning = preset_settings(doc["preset"])
    assert warning is None
    return trainer, trainer.release_of(settings.mirrors)


# ------------------------------------------------------------------ registry
def test_every_release_has_fixtures_or_a_reason() -> None:
    """Each release preset is proved by a fixture of the release its ``mirrors`` names (or
    is listed in NOT_RUN with why); every fixture's release lies in its preset's range
    (the last release of a range is checked too where it differs)."""
    proved = {load(p)["preset"] for p in fixtures("loss", HERE)}
    for name in RELEASE_PRESETS:
        assert name in proved or name in NOT_RUN, f"{name}: no fixture and no reason"
    checked = set()
    for p in fixtures("loss", HERE):
        doc = load(p)
        _, release = release_of(doc)
        v = parse_version(doc["version"])
        assert release.key <= v <= parse_version(release.last), p.name  # within its range
        assert preset_for(doc["trainer"], doc["version"]) == (doc["preset"], None), p.name
        if v == parse_version(release.checked):
            checked.add(doc["preset"])
    for p in fixtures("train", HERE):
        assert (HERE / p.name.replace("-train", "-loss")).exists(), p.name
    missing = {n for n in RELEASE_PRESETS if n not in checked and n not in NOT_RUN}
    assert not missing, f"no fixture of the release named in mirrors: {sorted(missing)}"


def test_trainer_presets_are_their_newest_release() -> None:
    for t in TRAINERS.values():
        newest = RELEASE_PRESETS[f"{t.name}@{t.newest.first}"]
        own = PRESETS[t.name]
        assert {**asdict(own), "preset": None} == {**asdict(newest), "preset": None}


@pytest.mark.parametrize(
    ("trainer", "version", "preset", "warned"),
    [
        ("trl", "0.14.0", "trl@0.14.0", False),
        ("trl", "0.15.2", "trl@0.14.0", False),
        ("trl", "0.20.0", "trl@0.19.0", False),  # between two change points: the earlier
        ("trl", "0.22.1", "trl@0.22.0", False),
        ("trl", "0.22.2", "trl@0.22.2", False),
        ("trl", "1.16.0", "trl@1.10.0", False),
        ("trl", "1.17.0", "trl@1.10.0", True),  # newer than the newest known
        ("trl", "0.12.0", "trl@0.14.0", True),
        ("trl", "1.16.0.dev0", "trl@1.10.0", False),
        ("verl", "0.3.0.post1", "verl@0.3.0", False),
        ("verl", "0.7.0", "verl@0.6.0", False),
        ("verl", "0.9.1", "verl@0.9.1", False),
        ("openrlhf", "0.8.10", "openrlhf@0.8.9", False),
        ("openrlhf", "0.11.2", "openrlhf@0.10.3", False),
        ("openrlhf", None, "openrlhf", True),
        ("openrlhf", "main", "openrlhf", True),
    ],
)
def test_preset_for(trainer: str, version: str | None, preset: str, warned: bool) -> None:
    name, warning = preset_for(trainer, version)
    assert name == preset
    assert (warning is not None) == warned
    if warning is not None:
        assert name in warning or str(PRESETS[name].mirrors) in warning  # names the preset


def test_version_between_change_points_resolves_to_the_earlier() -> None:
    s, warning = preset_settings("trl@0.21")
    assert (s.preset, s.mirrors, warning) == ("trl@0.19.0", "trl 0.19.1", None)
    s, warning = preset_settings("trl@9.0")
    assert s.preset == "trl@1.10.0" and warning is not None and "trl 9.0" in warning


def test_unknown_release_preset_names() -> None:
    from grpo_cli.errors import UsageError

    for bad, message in (
        ("nope@1.0", "'nope' is not a trainer"),
        ("trl@x", "is not a release number"),
        ("trl-0.19", "is not one of"),
    ):
        with pytest.raises(UsageError, match=message):
            preset_settings(bad)


# ------------------------------------------------------------ the release's code
@pytest.mark.parametrize(("path", "index"), tensor_cases())
def test_release_loss_and_metrics(cli: Cli, tmp_path: Path, path: Path, index: int) -> None:
    """grpo-cli's ``objective --preset TRAINER@X`` on the rollouts the release's own loss
    function was called on: the same loss (1e-9 relative), the same logged metrics (1e-6),
    and every metric the release logs either computed or left out with its reason."""
    doc = load(path)
    case = doc["cases"][index]
    trainer, release = release_of(doc)
    data = write_rollouts(doc["rollouts"], tmp_path / "rollouts.parquet")
    out = cli.json("objective", data, *case["flags"].split())
    assert out["settings"]["mirrors"] == trainer.mirrors(release)
    rel = case.get("loss_rel", REL)
    assert close(case["loss"], out["loss"], rel), (case["loss"], out["loss"])
    if "advantages" in case:
        adv = cli.json("advantages", data, *advantage_flags(case["flags"]))["advantages"]
        a, b = np.asarray(case["advantages"]), np.asarray(adv)
        assert float(np.max(np.abs(a - b))) <= REL * max(float(np.max(np.abs(a))), 1.0)
    ours = out["trainer_metrics"]["metrics"]
    logged_elsewhere = set(case.get("logged_elsewhere", ()))
    for name in release.metric_names:
        if name in logged_elsewhere:
            continue  # logged outside the loss function: the training runs check it
        if name == "loss" and "loss" in ours:  # the loss the function returned, above
            assert close(case["loss"], ours["loss"], rel), (case["loss"], ours["loss"])
            continue
        theirs = case["metrics"].get(name)
        if name not in ours:  # not logged here either, or left out with its reason
            if theirs is not None:
                assert name in release.missing, (name, theirs)
                assert any(name in w for w in out["warnings"]), out["warnings"]
            continue
        assert theirs is not None, (name, "grpo-cli gives it, the release did not log it")
        assert close(theirs, ours[name], METRIC), (name, theirs, ours[name])


def train_cases() -> list[Any]:
    """The training runs: fresh ones when the run script wrote them (``--train``), else
    the committed ones."""
    out = []
    for path in fixtures("train") or fixtures("train", HERE):
        doc = load(path)
        for i in range(len(doc["steps"])):
            out.append(pytest.param(path, i, id=f"{path.stem}:{doc['config']}:step{i + 1}"))
    return out


@pytest.mark.parametrize(("path", "index"), train_cases())
def test_release_training_run(cli: Cli, tmp_path: Path, path: Path, index: int) -> None:
    """A tiny CPU training run of the release: grpo-cli on each step's recorded tensors
    (log-probs, rewards, groups) with the release's preset gives the metrics the release
    logged for that step (its float32 arithmetic: 1e-5 relative; the loss as its logger
    rounded it)."""
    doc = load(path)
    step = doc["steps"][index]
    _, release = release_of(doc)
    data = write_rollouts(step["rollouts"], tmp_path / "rollouts.parquet")
    out = cli.json("objective", data, *doc["flags"].split())
    ours = out["trainer_metrics"]["metrics"]
    logged = step["logged"]
    compared = 0
    for name in release.metric_names:
        if name not in logged:  # e.g. generation-time metrics on a step reusing a batch
            continue
        if name not in ours:
            assert name in release.missing, (name, sorted(ours))
            continue
        assert abs(logged[name] - ours[name]) <= 1e-5 * abs(logged[name]) + 1e-6, (
            name,
            logged[name],
            ours[name],
        )
        compared += 1
    if "loss" in logged:
        # the logger's rounding (transformers 4.x: 4 decimals), then float32
        decimals = logged_loss_decimals(doc["versions"]["transformers"])
        assert decimals == doc["loss_decimals"]  # what the run script read
        half = 0.5 * 10.0**-decimals if decimals is not None else 0.0
        assert abs(logged["loss"] - out["loss"]) <= half + 1e-5 * abs(out["loss"]) + 1e-7, (
            logged["loss"],
            out["loss"],
        )
        compared += 1
    assert compared, "nothing compared"


@pytest.mark.skipif(FIXTURES == HERE, reason="GRPO_CLI_RELEASE_FIXTURES not set: no fresh run")
def test_fresh_fixtures_match_committed() -> None:
    """The release code run now computes what the committed fixtures say (so that the
    tests above, run without the releases installed, check the releases' numbers)."""
    for fresh in fixtures("loss"):
        committed = HERE / fresh.name
        assert committed.exists(), (
            f"{fresh.name}: not committed (conformance/releases/run --record)"
        )
        a, b = load(fresh), load(committed)
        assert a["rollouts"] == b["rollouts"] and len(a["cases"]) == len(b["cases"])
        for x, y in zip(a["cases"], b["cases"], strict=True):
            assert x["flags"] == y["flags"]
            assert close(y["loss"], x["loss"], 1e-12), (fresh.name, x["flags"])
            assert x["metrics"].keys() == y["metrics"].keys()
            for k, val in x["metrics"].items():
                assert close(y["metrics"][k], val, 1e-12), (fresh.name, x["flags"], k)


def test_fixture_numbers_are_finite() -> None:
    for path in fixtures("loss"):
        for case in load(path)["cases"]:
            assert math.isfinite(case["loss"]), (path.name, case["flags"])


def test_trl_0_16_clip_ratio_by_hand(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL 0.16's clip_ratio counts the tokens whose minimum is the unclipped term outside
    the range (A > 0 with ρ < 0.8, A < 0 with ρ > 1.2), whatever the batches: by hand."""
    ln = np.log
    # answers: A > 0 (group a, reward 1) and A < 0 (group a, reward 0); ρ per token
    ratios = [[0.7, 0.9, 1.3], [0.7, 1.25, 1.0], [0.5, 1.5], [1.0, 1.0]]
    rows = {
        "group": ["a", "a", "b", "b"], "reward": [1.0, 0.0, 1.0, 1.0],  # b: A = 0
        "logp": [[-1.0] * len(r) for r in ratios],
        "old_logp": [[-1.0 - float(ln(x)) for x in r] for r in ratios],
    }  # fmt: skip
    p = tmp_path / "r.parquet"
    pq.write_table(pa.table(rows), p, row_group_size=1)
    # A > 0 answer: 0.7 < 0.8 counts; A < 0 answer: 1.25 > 1.2 counts; A = 0: none
    want = 2 / 10
    one = cli.json("objective", p, "--preset", "trl@0.16.0", "--beta", "0")
    assert one["trainer_metrics"]["metrics"]["clip_ratio"] == pytest.approx(want, rel=1e-12)
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "3")  # a batch an answer: the parts merge
    out = cli.json("objective", p, "--preset", "trl@0.16.0", "--beta", "0", "--workers", "2")
    assert out["trainer_metrics"]["metrics"]["clip_ratio"] == pytest.approx(want, rel=1e-12)
    later = cli.json(
        "objective", p, "--preset", "trl@0.17.0", "--beta", "0"
    )  # another release: not folded
    assert "clip_ratio" not in later["trainer_metrics"]["metrics"]


@pytest.mark.parametrize(
    "rewards",
    [[1.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0 + 1e-12, 1.0 + 1e-12],
     [1.0, 1.0, 1.0 + 2e-8, 1.0 + 2e-8]],
)  # fmt: skip
def test_trl_batch_std_zero_share_when_every_group_is_constant(
    cli: Cli, tmp_path: Path, rewards: list[float]
) -> None:
    """scale_rewards="batch": TRL's frac_reward_zero_std is isclose(sample std of every
    reward, 0) (atol 1e-8) for every answer — 0 or 1, computed here with numpy; when the
    rewards' range cannot tell (2e-8 apart over 4 answers: std 1.15e-8, but the range
    bounds it only to [8.2e-9, 1.15e-8]) it is left out with its warning."""
    p = tmp_path / "r.parquet"
    pq.write_table(pa.table({"group": ["a", "a", "b", "b"], "reward": rewards,
                             "logp": [[-1.0, -0.5]] * 4}), p)  # fmt: skip
    out = cli.json("objective", p, "--preset", "trl", "--scale", "batch")
    got = out["trainer_metrics"]["metrics"].get("frac_reward_zero_std")
    if abs(rewards[2] - rewards[0] - 2e-8) < 1e-15:  # the undecidable case
        assert got is None and any("frac_reward_zero_std" in w for w in out["warnings"])
    else:
        assert got == (1.0 if np.std(rewards, ddof=1) <= 1e-8 else 0.0)
