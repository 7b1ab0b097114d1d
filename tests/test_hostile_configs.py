"""Trainer configs of a recorded run's ``meta.json`` checked where they enter (issue 27):
every key a trainer module reads is declared with its type and range (``CONFIG_KEYS``); a
wrong value is one line naming meta.json, the key, the value and what is expected, never
a flag the user did not pass, and a value that would change the result is never dropped
silently."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_cli.errors import InputError
from grpo_cli.trainers import TRAINERS, openrlhf, trl, verl

from .conftest import Cli
from .test_hostile_runs import make_run, one_line

A = verl.ACTOR
RC = "algorithm.rollout_correction."
TRL_BASE = {"loss_type": "bnpo", "beta": 0.0}

# (trainer, config, the words of the one line): the measured failures of issue 27 and
# their kind; the base config is the trainer's run otherwise fine
WRONG = [
    ("trl", {"loss_type": ["grpo"]}, "'loss_type' is ['grpo']: expected a string"),
    ("trl", {"delta": "2"}, "'delta' is '2': expected a finite number > 1"),
    ("trl", {"delta": {"c": 3}}, "'delta' is {'c': 3}"),
    ("trl", {"epsilon": "0.2"}, "'epsilon' is '0.2': expected a finite number >= 0"),
    ("trl", {"epsilon_high": "0.28"}, "'epsilon_high' is '0.28'"),
    ("trl", {"epsilon": -0.2}, "'epsilon' is -0.2: expected a finite number >= 0"),
    ("trl", {"steps_per_generation": "4"}, "'steps_per_generation' is '4': expected an integer"),
    ("trl", {"steps_per_generation": 2.5}, "'steps_per_generation' is 2.5"),
    ("trl", {"loss_type": "dr_grpo", "max_completion_length": math.nan},
     "'max_completion_length' is nan: expected an integer >= 1"),
    ("trl", {"loss_type": "dr_grpo", "max_completion_length": "inf"},
     "'max_completion_length' is 'inf'"),
    ("trl", {"beta": "0.04"}, "'beta' is '0.04': expected a finite number >= 0"),
    ("trl", {"beta": math.nan}, "'beta' is nan"),
    ("trl", {"beta": 10**400}, "'beta' is <an integer of 401 digits, beyond float>"),
    ("trl", {"scale_rewards": "groups"}, "'scale_rewards' is 'groups': expected one of"),
    ("trl", {"use_bias_correction_kl": "false"}, "'use_bias_correction_kl' is 'false'"),
    ("trl", {"top_entropy_quantile": 2}, "'top_entropy_quantile' is 2"),
    ("trl", {"entropy_coef": "0.05"}, "'entropy_coef' is '0.05'"),
    ("trl", {"logging_steps": 0}, "'logging_steps' is 0"),
    ("verl", {A + "clip_ratio_low": "0.2"}, f"'{A}clip_ratio_low' is '0.2'"),
    ("verl", {A + "clip_ratio_c": {"x": 1}}, f"'{A}clip_ratio_c' is {{'x': 1}}"),
    ("verl", {A + "clip_ratio_c": 0.5}, "expected a finite number > 1"),
    ("verl", {A + "loss_scale_factor": math.nan}, f"'{A}loss_scale_factor' is nan"),
    ("verl", {A + "loss_scale_factor": math.inf}, "expected an integer >= 1"),
    ("verl", {A + "use_kl_loss": True, A + "kl_loss_coef": "0.001"}, "'0.001'"),
    ("verl", {A + "loss_agg_mode": ["token-mean"]}, "expected a string"),
    ("verl", {"algorithm.kl_ctrl.kl_coef": -1}, "expected a finite number >= 0"),
    ("verl", {RC + "rollout_rs": "token"}, "'token' is not one of verl's options"),
    ("verl", {RC + "rollout_rs": "token_k1", RC + "rollout_rs_threshold": 0},
     "token_k1 takes a finite number >= 1 or 'lower_upper', got '0'"),
    ("verl", {RC + "rollout_is": "token", RC + "rollout_is_threshold": "abc"},
     f"'{RC}rollout_is_threshold' is 'abc'"),
    ("trl", {"use_vllm": True, "vllm_importance_sampling_correction": True,
             "vllm_importance_sampling_mode": "token_truncate",
             "vllm_importance_sampling_clip_max": None}, "a truncating mode needs"),
    ("trl", {"use_vllm": True, "vllm_importance_sampling_correction": True,
             "vllm_importance_sampling_clip_min": 5}, "expected below"),
    ("trl", {"vllm_importance_sampling_mode": "auto"}, "'auto': expected one of"),
    ("openrlhf", {"actor.eps_clip_low_high": ["0.2", "0.28"]},
     "'actor.eps_clip_low_high' is ['0.2', '0.28']: expected a list of 2 finite numbers"),
    ("openrlhf", {"actor.eps_clip_low_high": [0.2]}, "expected a list of 2"),
    ("openrlhf", {"reward.clip_range": ["-10", "10"]}, "'reward.clip_range' is ['-10', '10']"),
    ("openrlhf", {"actor.dual_clip": {"c": 3}}, "'actor.dual_clip' is {'c': 3}"),
    ("openrlhf", {"actor.eps_clip": "0.2"}, "'actor.eps_clip' is '0.2'"),
    ("openrlhf", {"algo.kl.init_coef": math.inf}, "'algo.kl.init_coef' is inf"),
    ("openrlhf", {"algo.kl.estimator": "k4"}, "expected one of 'k1', 'k2', 'k3'"),
    ("openrlhf", {"actor.loss_agg_mode": "sum"}, "'actor.loss_agg_mode' is 'sum'"),
]  # fmt: skip


def write_config(run: Path, config: dict[str, Any], trainer: str | None = None) -> None:
    """The run's meta.json with ``config`` (written as Python's json writes it: NaN and
    Infinity as such) and ``trainer``."""
    meta = json.loads((run / "meta.json").read_text())
    meta["config"] = config
    if trainer is not None:
        meta["trainer"] = trainer
        meta["trainer_version"] = TRAINERS[trainer].newest.checked
    (run / "meta.json").write_text(json.dumps(meta))  # a big integer: all its digits


@pytest.mark.parametrize(("trainer", "config", "words"), WRONG)
def test_a_wrong_config_value_is_one_line_naming_meta_json(
    cli: Cli, tmp_path: Path, trainer: str, config: dict[str, Any], words: str
) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    base = TRL_BASE if trainer == "trl" else {}
    write_config(run, {**base, **config}, trainer)
    for cmd in ("objective", "check"):
        line = one_line(cli(cmd, run / "step_000001", "--beta", "0"), "meta.json: config key",
                        words)  # fmt: skip
        assert "--" not in line, line  # no flag named: the user passed none of them
    one_line(cli("trend", run), "meta.json: config key", words)


def test_a_string_beta_is_not_silently_dropped(cli: Cli, tmp_path: Path) -> None:
    """``"beta": "0.04"`` used to be skipped: the KL term left out without a word."""
    run = make_run(tmp_path / "run", steps=(1,))
    write_config(run, {"loss_type": "bnpo", "beta": "0.04"})
    one_line(cli("objective", run / "step_000001"), "config key 'beta' is '0.04'")


def test_a_nan_beta_is_not_blamed_on_a_flag(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    (run / "meta.json").write_text(
        (run / "meta.json").read_text().replace('"beta": 0.0', '"beta": NaN')
    )
    line = one_line(cli("objective", run / "step_000001"), "meta.json: config key 'beta' is nan")
    assert "--beta" not in line


def test_a_flag_still_overrides_a_good_config(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    doc = cli.json("objective", run / "step_000001", "--clip-eps", "0.1")
    assert doc["settings"]["clip_eps"] == 0.1 and doc["settings"]["from"] == "meta.json"


def test_a_config_key_the_module_does_not_read_is_not_checked(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    write_config(run, {**TRL_BASE, "learning_rate": "1e-6", "report_to": ["wandb"]})
    assert cli.json("objective", run / "step_000001")["settings"]["agg"] == "token-mean"


def test_unknown_strings_the_module_cannot_map_are_named_in_notes() -> None:
    _, notes = trl.TRAINER.from_config({"importance_sampling_level": "sequence_token"})
    assert any("importance_sampling_level 'sequence_token'" in n for n in notes)
    _, notes = openrlhf.TRAINER.from_config({"reward.clip_range": [-5, 10]})
    assert any("reward.clip_range [-5, 10]" in n for n in notes)
    c = {"algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "abs"}
    _, notes = verl.TRAINER.from_config(c)
    assert any("kl_penalty 'abs'" in n for n in notes)


# ------------------------------------------------------------- every key read is declared
class Traced(Mapping[str, Any]):
    """A config that records every key read from it (``get``, ``[]``, ``in``)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return key in self.data

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.data.get(key, default)

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("a trainer module reads its keys by name")

    def __len__(self) -> int:
        return len(self.data)


GOOD = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0.0, 0.2, 0.28, 1.5, 3.0, 4, 512]),
    st.sampled_from(["token", "sequence", "seq", "grpo", "dr_grpo", "gspo", "vanilla",
                     "low_var_kl", "k3", "group", "none", "token-mean", "clip", "ppo_clip",
                     "sapo", "cispo", "rloo", "group_norm", "1_2", "token_truncate"]),
    st.just([0.2, 0.28]), st.just([-10, 10]),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(TRAINERS)))
def test_every_key_a_module_reads_is_declared(data: st.DataObject, name: str) -> None:
    t = TRAINERS[name]
    keys = t.from_config.keys  # type: ignore[attr-defined]
    chosen = data.draw(st.lists(st.sampled_from(sorted(keys)), unique=True, max_size=12))
    config = Traced({k: data.draw(GOOD) for k in chosen})
    try:
        t.from_config(config)
    except InputError:
        pass
    assert config.read <= set(keys), sorted(config.read - set(keys))
    calls = t.calls
    if calls is not None:  # TRL's call rules read the config as well
        config.read.clear()
        from grpo_cli.trainers.base import FileInputs

        f = FileInputs(4, 0, 8, -1.0, -0.5, 2.0, 8, {"micro_batches": 2, "num_items_in_batch": 8})
        try:
            calls.file_loss(None, f, config)  # type: ignore[arg-type]
            calls.file_metrics(None, f, config)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass  # a drawn value of another type: the check before the fold refuses it
        assert config.read <= set(keys), sorted(config.read - set(keys))


WRONGS = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
    st.lists(st.one_of(st.floats(), st.text(max_size=2)), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)  # fmt: skip


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), name=st.sampled_from(sorted(TRAINERS)))
def test_random_config_values_end_in_a_result_or_one_line(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, name: str
) -> None:
    keys = TRAINERS[name].from_config.keys  # type: ignore[attr-defined]
    chosen = data.draw(st.lists(st.sampled_from(sorted(keys)), unique=True, max_size=5))
    config = {k: data.draw(st.one_of(GOOD, WRONGS)) for k in chosen}
    if name == "trl":
        config = {**TRL_BASE, **config}
    run = make_run(tmp_path_factory.mktemp("cfg") / "run", steps=(1,))
    write_config(run, config, name)
    cmd = data.draw(st.sampled_from(["objective", "check"]))
    r = cli(cmd, run / "step_000001", *(["--format", "json"] if cmd == "check" else ["--json"]))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code in ((0, 1, 2) if cmd == "check" else (0, 2)), r.stderr
    if r.exit_code == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: "), r.stderr
        assert "--" not in lines[0].split("error: ", 1)[1].split(" ")[0], lines[0]


def test_the_declared_vocabularies_are_the_settings_own() -> None:
    """The option names a trainer module accepts are the ones its losses compute (the
    loss module's lists, read here so the two cannot drift apart)."""
    from typing import get_args

    from grpo_cli.losses import openrlhf as lo
    from grpo_cli.losses import trl as lt
    from grpo_cli.losses import verl_rollout as lv

    assert verl.RS_OPTIONS == lv.RS_OPTIONS
    modes = trl.CONFIG_KEYS["vllm_importance_sampling_mode"]
    assert all(modes.ok(m) for m in get_args(lt.TrlISMode)) and not modes.ok("auto")
    for key, kind in (("mode", lo.OrlMode), ("gating", lo.OrlGating)):
        spec = openrlhf.CONFIG_KEYS["algo.advantage.is_correction_" + key]
        assert all(spec.ok(v) for v in get_args(kind)) and not spec.ok("x")


THRESHOLDS = st.one_of(
    st.none(), st.floats(-1, 5), st.sampled_from(["0.5_2", "2_0.5", "2", "-1", "abc", "0_1",
    "0.1,0.2", "0.5_2,3", "1e400", "nan", "", " 2 ", "1_2_3"]),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    rs=st.lists(st.sampled_from([*verl.RS_OPTIONS, "token", "x"]), min_size=1, max_size=3),
    threshold=THRESHOLDS,
    is_threshold=THRESHOLDS,
)
def test_the_rollout_keys_are_read_as_the_loss_reads_them(
    rs: list[str], threshold: Any, is_threshold: Any
) -> None:
    """meta.json's rollout correction strings are refused at the boundary exactly when the
    loss module's own parsers refuse them (else they were blamed on --loss-param)."""
    from grpo_cli.errors import UsageError
    from grpo_cli.losses import verl_rollout as losses

    rc = "algorithm.rollout_correction."
    c = {rc + "rollout_rs": ",".join(rs), rc + "rollout_rs_threshold": threshold}
    ours = verl._rollout_keys(c) is None
    try:
        losses.rejection_options(",".join(rs), threshold)
        theirs = True
    except UsageError:
        theirs = False
    assert ours == theirs, (c, verl._rollout_keys(c))
    if isinstance(is_threshold, str):
        c = {rc + "rollout_is_threshold": is_threshold}
        try:
            losses._is_threshold(is_threshold)
            theirs = True
        except UsageError:
            theirs = False
        assert (verl._rollout_keys(c) is None) == theirs, is_threshold
