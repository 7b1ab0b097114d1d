"""The OpenRLHF recorder against OpenRLHF 0.11.2 itself: real ``Experience`` objects made
by its own ``RemoteExperienceMaker`` (``split_rollout_samples``, ``make_experience``,
``compute_advantages_and_returns``), its ``PolicyLoss`` / ``compute_approx_kl`` /
``aggregate_loss`` as the oracle, and its real ``BasePPOTrainer.train_step`` running through
:func:`grpo_cli.integrations.openrlhf.install` on a private local Ray.

What cannot run on CPU: the DeepSpeed actor and reference models (Ray actor groups on
GPUs). They are stand-ins (:class:`Group`) that answer ``forward`` with fixed log-probs
per token and ``fit`` with a status dict, through real Ray object refs; OpenRLHF's package
``__init__``s and the modules of its GPU stack (DeepSpeed strategy, vLLM engine and sampler,
the Ray actor launcher) are not imported (:func:`load_openrlhf`), none of them runs in
``train_step`` with these groups.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import secrets
import sys
import types
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.integrations import openrlhf as rec

from .conftest import Cli

if os.environ.get("GRPO_CLI_REQUIRE_TRAINERS"):  # CI installs the trainers: must run
    import ray
    import torch
else:
    torch = pytest.importorskip("torch")
    ray = pytest.importorskip("ray")
    if importlib.util.find_spec("openrlhf") is None:
        pytest.skip("openrlhf is not installed", allow_module_level=True)

N = 4  # rollout.n_samples_per_prompt
PROMPTS = 5
VOCAB = 40


def load_openrlhf() -> dict[str, Any]:
    """OpenRLHF's trainer-side modules without its package ``__init__``s (they import
    DeepSpeed and the Ray actor classes) and without the GPU stack's modules, which
    ``ppo_trainer`` imports by name and ``train_step`` never calls."""
    spec = importlib.util.find_spec("openrlhf")
    assert spec is not None and spec.submodule_search_locations
    root = spec.submodule_search_locations[0]
    for name in ("", ".models", ".trainer", ".trainer.ppo_utils", ".trainer.ray", ".utils"):
        pkg = types.ModuleType("openrlhf" + name)
        pkg.__path__ = [root + name.replace(".", "/")]
        sys.modules[pkg.__name__] = pkg
    stubs: dict[str, dict[str, Any]] = {
        "deepspeed": {},
        "openrlhf.trainer.ray.launcher": {"RayActorGroup": object},
        "openrlhf.trainer.ray.vllm_engine": {"batch_vllm_engine_call": None},
        "openrlhf.utils.deepspeed": {"DeepspeedStrategy": object},
        "openrlhf.trainer.ppo_utils.samples_generator": {"SamplesGenerator": object},
    }
    saved = sys.modules.get("deepspeed")
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    import openrlhf.models.loss as loss
    import openrlhf.models.utils as utils
    import openrlhf.trainer.ppo_trainer as trainer
    import openrlhf.trainer.ppo_utils.experience as experience
    import openrlhf.trainer.ppo_utils.experience_maker as maker
    import openrlhf.utils.config as config

    # the stand-in DeepSpeed served OpenRLHF's imports only: libraries that look for the
    # real one (transformers, through TRL) must not find a module without a spec
    if saved is None:
        del sys.modules["deepspeed"]
    else:
        sys.modules["deepspeed"] = saved

    return {
        "loss": loss,
        "utils": utils,
        "maker": maker,
        "experience": experience,
        "trainer": trainer,
        "config": config,
    }


orl = load_openrlhf()
Experience = orl["experience"].Experience


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[EOS]": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[PAD]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", eos_token="[EOS]")


def flat_args(**overrides: Any) -> argparse.Namespace:
    """OpenRLHF's arguments as its argparse leaves them (dotted dests), with its defaults
    for what these code paths read (``cli/train_ppo_ray.py``)."""
    a = {
        "algo.advantage.estimator": "group_norm",
        "algo.advantage.gamma": 1.0,
        "algo.advantage.lambd": 1.0,
        "algo.advantage.no_std_norm": False,
        "algo.advantage.is_correction_level": "off",
        "algo.kl.use_loss": False,
        "algo.kl.estimator": "k1",
        "algo.kl.init_coef": 0.01,
        "algo.kl.target": None,
        "algo.kl.horizon": 10000,
        "algo.dynamic_filtering_enable": False,
        "actor.eps_clip": 0.2,
        "actor.eps_clip_low_high": (0.2, 0.2),
        "actor.dual_clip": None,
        "actor.policy_loss_type": "ppo",
        "actor.loss_agg_mode": "token-mean",
        "actor.num_nodes": 1,
        "actor.num_gpus_per_node": 1,
        "reward.clip_range": (-10, 10),
        "reward.overlong_buffer_len": None,
        "reward.stop_properly_penalty_coef": None,
        "rollout.n_samples_per_prompt": N,
        "rollout.batch_size": PROMPTS,
        "rollout.micro_batch_size": 6,  # experiences cut across groups
        "train.dynamic_batch_enable": False,
        "train.colocate_all": False,
        "train.colocate_actor_ref": False,
        "train.colocate_critic_reward": False,
        "critic.freezing_steps": -1,
        "ds.ring_attn_size": 1,
        "ds.tensor_parallel_size": 1,
        "ds.enable_sleep": False,
        "logger.wandb.key": None,
        "logger.tensorboard_dir": None,
        "ckpt.best_metric_key": "",
        "data.max_len": 64,
    }
    a.update(overrides)
    return argparse.Namespace(**a)


def rollout_samples(seed: int) -> list[Any]:
    """What OpenRLHF's ``SamplesGenerator._process_response_into_experience`` returns, one
    per answer: ``sequences`` (prompt + response), ``action_mask`` over ``sequences[1:]``
    (the response positions), vLLM's log-probs on them, the reward, in prompt order with
    ``N`` answers each (a zero-variance group among them)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in range(PROMPTS):
        prompt = rng.integers(2, VOCAB, size=int(rng.integers(2, 5))).tolist()
        rewards = [0.5] * N if p == 1 else rng.choice([0.0, 0.25, 1.0], size=N).tolist()
        for r in rewards:
            response = rng.integers(2, VOCAB, size=int(rng.integers(1, 9))).tolist()
            tokens = prompt + response
            action = torch.zeros(len(tokens), dtype=torch.long)
            action[len(prompt) :] = 1
            action = action[1:]
            rollout = torch.where(
                action.bool(), torch.tensor(-rng.exponential(1.0, len(action))), 0.0
            )
            out.append(
                Experience(
                    sequences=torch.tensor([tokens]),
                    attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
                    action_mask=action[None],
                    rollout_log_probs=rollout[None],
                    prompts=[f"prompt {p}"],
                    labels=[""],
                    rewards=torch.tensor([r], dtype=torch.float64),
                    response_length=torch.tensor([len(response)]),
                    truncated=torch.tensor([False]),
                    total_length=torch.tensor([float(len(tokens))]),
                    info={"reward": torch.tensor([r], dtype=torch.float64)},
                )
            )
    return out


def forward(shift: float) -> Any:
    """A model's log-probs of ``sequences[1:]`` (what the actor or reference group's
    ``forward`` returns): a fixed function of each token and position, 0 off the action."""

    def logp(sequences: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
        tok = sequences[:, 1:].double()
        pos = torch.arange(tok.shape[1], dtype=torch.float64)
        value = -0.05 - 0.1 * torch.remainder(7 * tok + 3 * pos + shift, 13)
        return value * action_mask

    return logp


ACTOR, REFERENCE = forward(0.0), forward(5.0)


def experiences(seed: int, args: argparse.Namespace) -> list[Any]:
    """One step's experiences from OpenRLHF's own experience maker: its split of the
    rollout into micro-batches, its KL (``compute_approx_kl``) and advantages; the model
    forwards are :data:`ACTOR` and :data:`REFERENCE`."""
    nested = orl["config"].hierarchize(args)
    cls = orl["maker"].RemoteExperienceMaker
    maker = cls.__new__(cls)  # __init__ only stores its arguments, here set by hand
    maker.strategy = types.SimpleNamespace(args=nested)
    maker.args = nested
    maker.advantage_estimator = nested.algo.advantage.estimator
    maker.tokenizer = types.SimpleNamespace(pad_token_id=0)
    maker.kl_ctl = types.SimpleNamespace(value=nested.algo.kl.init_coef)
    out = maker.split_rollout_samples(rollout_samples(seed))
    for e in out:  # make_experience's arithmetic, on the forwards' values
        e.action_log_probs = ACTOR(e.sequences, e.action_mask)
        base = REFERENCE(e.sequences, e.action_mask)
        if nested.algo.kl.use_loss:
            e.kl = torch.zeros_like(e.action_log_probs)
            e.base_action_log_probs = base
        else:
            e.kl = orl["utils"].compute_approx_kl(e.action_log_probs, base, kl_estimator="k1")
    result: list[Any] = maker.compute_advantages_and_returns(out)
    return result


def read(path: Path) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    table = pq.read_table(path)
    return table.to_pydict(), json.loads(table.schema.metadata[b"grpo_cli"])


def padded(tensors: list[torch.Tensor]) -> np.ndarray:
    width = max(t.shape[1] for t in tensors)
    rows = [np.pad(t.numpy(), ((0, 0), (0, width - t.shape[1]))) for t in tensors]
    return np.concatenate(rows)


# ----------------------------------------------------------------- the columns
def test_columns_are_the_experiences(tmp_path: Path) -> None:
    args = flat_args()
    exps = experiences(1, args)
    assert len(exps) == 4 and len({e.action_mask.shape[1] for e in exps}) > 1  # ragged
    path = rec.write_experiences(
        exps, tmp_path, 3, n_samples_per_prompt=N, args=args, tokenizer=tokenizer()
    )
    assert path is not None
    cols, meta = read(path)
    mask = padded([e.action_mask for e in exps]).astype(bool)
    index = [i for e in exps for i in e.index]
    assert meta == {
        "step": 3, "rank": 0, "micro_batch": 0, "world_size": 1, "micro_batches": 1,
        "answers": PROMPTS * N, "tokens": int(mask.sum()), "experiences": 4,
        "n_samples_per_prompt": N, "advantage_source": "per token",
    }  # fmt: skip
    assert cols["group"] == [f"g000003-p{i // N:05d}" for i in index]
    assert cols["reward"] == [float(r) for e in exps for r in e.rewards]
    assert cols["mask"] == mask.tolist()
    # the KL in the reward (OpenRLHF's default): advantages vary over the tokens. The
    # cumulative returns run on through the masked prompt positions; masked values are 0
    adv = np.where(mask, padded([e.advantages for e in exps]), 0.0)
    assert cols["advantage"] == adv.tolist()  # each field at the width it had (float64 here)
    for column, name in (("old_logp", "action_log_probs"), ("rollout_logp", "rollout_log_probs")):
        expected = padded([getattr(e, name) for e in exps])
        assert cols[column] == expected.tolist(), column
    assert "ref_logp" not in cols  # make_experience drops it without --algo.kl.use_loss
    seq = [(s, m) for e in exps for s, m in zip(e.sequences, e.action_mask.bool(), strict=True)]
    words = [" ".join(f"w{t}" for t in s[1:][m[: len(s) - 1]].tolist()) for s, m in seq]
    assert cols["completion"] == words
    ids = padded([e.sequences[:, -e.action_mask.shape[1] :] for e in exps])  # the response ids
    assert cols["token_id"] == ids.astype(np.int64).tolist()
    doc = json.loads((tmp_path / "meta.json").read_text())
    assert (doc["trainer"], doc["trainer_version"]) == ("openrlhf", version("openrlhf"))
    assert doc["config"]["rollout.n_samples_per_prompt"] == N
    assert doc["config"]["reward.clip_range"] == [-10, 10]
    assert doc["config"]["algo.kl.init_coef"] == 0.01
    nested = orl["config"].hierarchize(args)
    assert rec.config_items(nested) == rec.config_items(args) == doc["config"]


def test_index_none_is_one_warning(tmp_path: Path) -> None:
    exps = experiences(2, flat_args())
    exps[1].index = None  # what balance_experiences leaves
    with pytest.warns(RuntimeWarning, match=r"grpo-cli.*experiences\[1\]\.index"):
        assert rec.write_experiences(exps, tmp_path, 1, n_samples_per_prompt=N) is None


# ------------------------------------------------- grpo-cli equals OpenRLHF's loss
@pytest.mark.parametrize("kind", ["ppo", "gspo"])
def test_cli_on_the_step_equals_openrlhf(tmp_path: Path, cli: Cli, kind: str) -> None:
    """``--algo.kl.use_loss`` (advantages per answer): the policy term at 1e-9 in float64
    (``token_dtype=float64``), the loss with OpenRLHF's KL at 1e-6 (compute_approx_kl works
    in float32), the advantages recomputed from the reward and group columns."""
    args = flat_args(**{"algo.kl.use_loss": True, "actor.policy_loss_type": kind})
    exps = experiences(3, args)
    rng = np.random.default_rng(3)
    current = [
        e.action_log_probs + torch.tensor(rng.normal(0, 0.3, e.action_mask.shape)) * e.action_mask
        for e in exps
    ]
    rec.write_experiences(
        exps, tmp_path, 1, n_samples_per_prompt=N, log_probs=current, token_dtype=pa.float64()
    )
    step = tmp_path / "step_000001"
    cat = {
        "logp": torch.tensor(padded(current)),
        "old": torch.tensor(padded([e.action_log_probs for e in exps])),
        "ref": torch.tensor(padded([e.base_action_log_probs for e in exps])),
        "adv": torch.tensor(padded([e.advantages for e in exps])),
        "mask": torch.tensor(padded([e.action_mask for e in exps])).bool(),
    }
    policy = orl["loss"].PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, policy_loss_type=kind)
    pg_loss, clip_ratio, ppo_kl, *_ = policy(
        cat["logp"], cat["old"], cat["adv"], action_mask=cat["mask"]
    )
    kl = orl["utils"].compute_approx_kl(cat["logp"], cat["ref"], kl_estimator="k1")
    kl_loss = orl["loss"].aggregate_loss(kl, cat["mask"])  # token-level, as training_step
    flags = ["--preset", "openrlhf", "--kl-mode", "loss"]
    if kind == "gspo":
        flags += ["--ratio-level", "sequence"]
    doc = cli.json("objective", step, *flags)
    # GSPO's per-sample loss divides by |o_i| + 1e-8: 1e-7 (the conformance suite's bound)
    assert doc["policy_term"] == pytest.approx(-float(pg_loss), rel=1e-9 if kind == "ppo" else 1e-7)
    assert doc["loss"] == pytest.approx(float(pg_loss) + 0.01 * float(kl_loss), rel=1e-6)
    tm = doc["trainer_metrics"]["metrics"]
    assert tm["ppo_clip_ratio"] == pytest.approx(float(clip_ratio), rel=1e-6)
    assert tm["ppo_kl"] == pytest.approx(float(ppo_kl), rel=1e-6)
    ours = cli.json("advantages", step, "--preset", "openrlhf")["advantages"]
    first = cat["mask"].float().argmax(dim=1)
    theirs = cat["adv"][torch.arange(len(first)), first].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------- install: train_step
@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A private local Ray (token authentication, as tests/test_ray.py starts it)."""
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


class Group:
    """Stands in for a ``RayActorGroup`` of DeepSpeed models: ``forward`` answers with
    ``model``'s log-probs of every batch, ``append`` keeps the experiences, ``fit``
    answers with a status; all through Ray object refs, as the real group does."""

    STATUS: ClassVar[dict[str, float]] = {
        "policy_loss": -0.125,
        "kl": 0.0625,
        "ppo_clip_ratio": 0.25,
        "actor_lr": 1e-6,
    }

    def __init__(self, model: Any) -> None:
        self.model = model
        self.appended: list[Any] = []

    def async_run_method_batch(self, method_name: str, **kwargs: Any) -> list[Any]:
        if method_name == "forward":
            pairs = zip(kwargs["sequences"], kwargs["action_mask"], strict=True)
            return [ray.put([self.model(s, m) for s, m in pairs])]
        assert method_name == "append"
        self.appended = copy.deepcopy(kwargs["experience"])
        return [ray.put(None)]

    def async_run_method(self, method_name: str, **kwargs: Any) -> list[Any]:
        assert method_name == "fit"
        return [ray.put(dict(self.STATUS))]


def trainer(args: argparse.Namespace) -> Any:
    """OpenRLHF's ``BasePPOTrainer``, built by its own ``__init__`` (its KL controller and
    ``RemoteExperienceMaker``), with the stand-in groups and no vLLM engines."""
    nested = orl["config"].hierarchize(args)
    strategy = types.SimpleNamespace(args=nested)
    return orl["trainer"].BasePPOTrainer(
        strategy, Group(ACTOR), None, None, Group(REFERENCE), None, tokenizer()
    )


def without_timing(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if not k.startswith("timing/")}


@pytest.mark.usefixtures("local_ray")
def test_install_records_train_step(tmp_path: Path) -> None:
    args = flat_args()
    plain = trainer(args)
    expected, next_step = plain.train_step(rollout_samples(4), 4)
    t = rec.install(trainer(args), tmp_path)
    got, step = t.train_step(rollout_samples(4), 4)
    assert step == next_step == 5
    assert without_timing(got) == without_timing(expected)
    sent, plain_sent = t.actor_model_group.appended, plain.actor_model_group.appended
    assert len(sent) == len(plain_sent)
    for a, b in zip(sent, plain_sent, strict=True):
        assert torch.equal(a.advantages, b.advantages) and a.index == b.index
    cols, meta = read(tmp_path / "step_000005" / "rank000-mb000.parquet")
    assert (tmp_path / "step_000005" / "_DONE").exists()
    assert "current log-probs" in meta["scope"]
    assert cols["group"] == [f"g000005-p{i // N:05d}" for e in sent for i in e.index]
    mask = padded([e.action_mask for e in sent]).astype(bool)
    adv = np.where(mask, padded([e.advantages for e in sent]), 0.0)
    assert cols["advantage"] == adv.tolist()
    assert cols["old_logp"] == padded([e.action_log_probs for e in sent]).tolist()
    assert cols["reward"] == [float(r) for e in sent for r in e.rewards]
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    status = {k: v for k, v in got.items() if k != "generated_samples"}
    assert logged == [{"step": 5, **status}]
    assert json.loads((tmp_path / "meta.json").read_text())["config"] == rec.config_items(args)


@pytest.mark.usefixtures("local_ray")
@pytest.mark.parametrize("failure", ["unwritable", "injected"])
def test_install_never_harms_train_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    args = flat_args()
    expected, _ = trainer(args).train_step(rollout_samples(5), 0)
    if failure == "unwritable":
        (tmp_path / "file").write_text("")
        directory, reason = tmp_path / "file" / "run", "NotADirectoryError"
    else:

        def boom(*a: Any, **k: Any) -> Any:
            raise RuntimeError("injected")

        monkeypatch.setattr(rec, "experiences_table", boom)
        directory, reason = tmp_path / "run", "injected"
    t = rec.install(trainer(args), directory, every_steps=1)
    with pytest.warns(RuntimeWarning) as caught:
        got, step = t.train_step(rollout_samples(5), 0)
    assert len(caught) == 1 and "grpo-cli" in str(caught[0].message)
    assert reason in str(caught[0].message)
    assert step == 1 and without_timing(got) == without_timing(expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, step = t.train_step(rollout_samples(5), 1)  # quiet, still training
    assert step == 2 and without_timing(got) == without_timing(expected)
    assert not list(tmp_path.glob("run/step_*"))


def test_recording_installs_at_init(tmp_path: Path) -> None:
    base = orl["trainer"].BasePPOTrainer
    cls = rec.recording(base, tmp_path, every_steps=3)
    assert issubclass(cls, base) and cls.__name__ == base.__name__
    nested = orl["config"].hierarchize(flat_args())
    t = cls(types.SimpleNamespace(args=nested), Group(ACTOR), None, None, None, None, None)
    assert t._grpo_cli_recorder.every_steps == 3
    assert t.experience_maker.make_experience_batch.__wrapped__.__self__ is t.experience_maker
    remote = rec.recording(orl["trainer"].PPOTrainer, tmp_path)  # the @ray.remote class
    original = orl["trainer"].PPOTrainer.__ray_actor_class__
    assert issubclass(remote.__ray_actor_class__, original)
    assert remote.__ray_actor_class__.__init__ is not original.__init__
