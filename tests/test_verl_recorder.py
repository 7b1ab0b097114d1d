"""The verl recorder against verl 0.9.1 itself: real DataProto batches, verl's own
advantage and loss functions as the oracle, and its real ``RayPPOTrainer._update_actor``
running through :func:`grpo_cli.integrations.verl.install`.

What cannot run on CPU: verl's actor workers (Ray worker groups around an FSDP engine that
verl 0.9.1 registers for cuda/npu only). The worker group that ``_update_actor`` calls is
therefore a stand-in that keeps what it was sent and answers with metrics in the worker's
format; everything on the driver side (``DataProto.to_tensordict``,
``left_right_2_no_padding``, the metric renaming, ``reduce_metrics``) is verl's.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.integrations import verl as rec

from .conftest import Cli

if os.environ.get("GRPO_CLI_REQUIRE_TRAINERS"):  # CI installs the trainers: must run
    import torch
    import verl  # noqa: F401
else:
    torch = pytest.importorskip("torch")
    pytest.importorskip("verl")
    pytest.importorskip("omegaconf")

warnings.filterwarnings("ignore", message=r".*engine is not available")

import verl.trainer.ppo.core_algos as ca  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.metric import reduce_metrics  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

GROUPS = [4, 4, 3, 1, 4, 2]  # a singleton (verl: mean 0, std 1) and uneven groups
PROMPT = 3
WIDTH = 9
VOCAB = 40


def tokenizer() -> Any:
    """A word-level tokenizer built in memory: id i is the word ``w{i}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[EOS]": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[PAD]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", eos_token="[EOS]")


def rollouts(seed: int, *, dtype: torch.dtype = torch.float32) -> tuple[DataProto, dict[str, Any]]:
    """A batch as verl's ``fit`` has it before the actor update: ragged answers (lengths
    1..WIDTH, right-padded), groups in shuffled order under uuid-like ``uid``s, the score
    on each answer's last valid token (a zero-variance group among them), the policies'
    log-probs (0 on padding), and advantages from verl's own ``compute_advantage``."""
    rng = np.random.default_rng(seed)
    uid = np.array([f"uid-{seed}-{g}" for g, n in enumerate(GROUPS) for _ in range(n)], object)
    n = len(uid)
    order = rng.permutation(n)
    uid = uid[order]
    lengths = rng.integers(1, WIDTH + 1, size=n)
    lengths[0] = WIDTH
    mask = np.arange(WIDTH)[None, :] < lengths[:, None]
    score = rng.choice([0.0, 0.5, 1.0], size=n)
    score[uid == f"uid-{seed}-1"] = 0.5  # all equal: advantage 0
    scores = np.zeros((n, WIDTH))
    scores[np.arange(n), lengths - 1] = score
    responses = np.where(mask, rng.integers(2, VOCAB, size=(n, WIDTH)), 0)
    prompts = rng.integers(2, VOCAB, size=(n, PROMPT))
    attention = np.concatenate([np.ones((n, PROMPT), bool), mask], axis=1)
    old = np.where(mask, -rng.exponential(1.0, (n, WIDTH)), 0.0)
    arrays = {
        "old_log_probs": old,
        "ref_log_prob": np.where(mask, old + rng.normal(0, 0.3, (n, WIDTH)), 0.0),
        "rollout_log_probs": np.where(mask, old + rng.normal(0, 0.01, (n, WIDTH)), 0.0),
        "log_probs": np.where(mask, old + rng.normal(0, 0.3, (n, WIDTH)), 0.0),
        "entropys": np.where(mask, rng.exponential(1.0, (n, WIDTH)), 0.0),
    }
    arrays["log_probs"][1, 0] = old[1, 0] + 25.0  # beyond verl's ±20 log-ratio clamp
    tensors = {
        "prompts": torch.tensor(prompts),
        "responses": torch.tensor(responses),
        "input_ids": torch.tensor(np.concatenate([prompts, responses], axis=1)),
        "attention_mask": torch.tensor(attention, dtype=torch.long),
        "position_ids": torch.tensor(np.cumsum(attention, axis=1) - 1),
        "response_mask": torch.tensor(mask, dtype=torch.long),
        "token_level_scores": torch.tensor(scores, dtype=dtype),
        "token_level_rewards": torch.tensor(scores, dtype=dtype),
        "old_log_probs": torch.tensor(arrays["old_log_probs"], dtype=dtype),
        "ref_log_prob": torch.tensor(arrays["ref_log_prob"], dtype=dtype),
        "rollout_log_probs": torch.tensor(arrays["rollout_log_probs"], dtype=dtype),
    }
    batch = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})
    batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=4)
    current = {k: torch.tensor(arrays[k], dtype=dtype) for k in ("log_probs", "entropys")}
    return batch, {"mask": mask, "score": score, "uid": uid, "responses": responses, **current}


def verl_config(**overrides: Any) -> Any:
    """verl 0.9.1's own trainer config (its generated reference yaml), with overrides."""
    import verl.trainer.config as cfg_pkg

    path = Path(cfg_pkg.__file__).parent / "_generated_ppo_trainer.yaml"
    cfg = OmegaConf.load(path)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def read(path: Path) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"grpo_cli"])
    return table.to_pydict(), meta


# ----------------------------------------------------------------- the columns
def test_columns_are_the_batch(tmp_path: Path) -> None:
    batch, x = rollouts(1)
    cfg = verl_config(**{"actor_rollout_ref.rollout.n": 4, "algorithm.adv_estimator": "grpo"})
    path = rec.write_batch(
        batch,
        tmp_path,
        7,
        config=cfg,
        log_probs=x["log_probs"],
        entropys=x["entropys"],
        tokenizer=tokenizer(),
    )
    assert path is not None and path == tmp_path / "step_000007" / "rank000-mb000.parquet"
    assert (tmp_path / "step_000007" / "_DONE").exists()
    cols, meta = read(path)
    mask, n = x["mask"], len(x["uid"])
    assert meta == {
        "step": 7, "rank": 0, "micro_batch": 0, "world_size": 1, "micro_batches": 1,
        "answers": n, "tokens": int(mask.sum()), "width": WIDTH,
        "reward_source": "token_level_scores", "advantage_source": "per answer",
    }  # fmt: skip
    assert cols["group"] == [f"g000007-{u}" for u in x["uid"]]
    assert cols["reward"] == x["score"].tolist()  # the score sits on one token: exact
    adv = batch.batch["advantages"].numpy()
    assert cols["advantage"] == [float(adv[i, 0]) for i in range(n)]  # float32 -> float64
    assert cols["mask"] == mask.tolist()
    for column, key in (
        ("old_logp", "old_log_probs"),
        ("ref_logp", "ref_log_prob"),
        ("rollout_logp", "rollout_log_probs"),
    ):
        assert cols[column] == batch.batch[key].numpy().tolist(), column  # float32 exactly
    assert cols["logp"] == x["log_probs"].numpy().tolist()
    assert cols["entropy"] == x["entropys"].numpy().tolist()
    expected = [" ".join(f"w{t}" for t in r[m]) for r, m in zip(x["responses"], mask, strict=True)]
    assert cols["completion"] == expected
    doc = json.loads((tmp_path / "meta.json").read_text())
    assert (doc["format"], doc["trainer"], doc["trainer_version"]) == (
        "grpo-cli-run",
        "verl",
        version("verl"),
    )
    config = doc["config"]
    assert config["actor_rollout_ref.rollout.n"] == 4
    assert config["algorithm.adv_estimator"] == "grpo"
    assert config["algorithm.kl_ctrl.kl_coef"] == cfg.algorithm.kl_ctrl.kl_coef
    assert config["actor_rollout_ref.actor.loss_scale_factor"] is None  # a null is kept
    assert config["actor_rollout_ref.actor.policy_loss.loss_mode"] == "vanilla"
    assert config["data.max_response_length"] == cfg.data.max_response_length
    assert "actor_rollout_ref.rollout.name" not in config  # "???" in verl's yaml: unset
    assert set(config) <= set(rec.CONFIG_KEYS)
    assert len(config) == len(rec.CONFIG_KEYS) - 1


def test_tensordict_and_dict_give_the_same_table(tmp_path: Path) -> None:
    batch, _ = rollouts(2)
    td = batch.to_tensordict()  # tensors and a NonTensorStack of uids
    plain = {**{k: v for k, v in batch.batch.items()}, "uid": list(batch.non_tensor_batch["uid"])}
    tables = [rec.batch_table(b, 3)[0] for b in (batch, td, plain)]
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
    before = {k: v.clone() for k, v in batch.batch.items()}
    rec.batch_table(batch, 3)
    assert all(torch.equal(before[k], v) for k, v in batch.batch.items())  # not mutated


def test_per_token_advantages_are_lists(tmp_path: Path) -> None:
    batch, _ = rollouts(3)
    gae = torch.randn(batch.batch["advantages"].shape) * batch.batch["response_mask"]
    batch.batch["advantages"] = gae  # e.g. GAE: varies over the answer's tokens
    path = rec.write_batch(batch, tmp_path, 1)
    assert path is not None
    cols, meta = read(path)
    assert meta["advantage_source"] == "per token"
    assert cols["advantage"] == gae.numpy().tolist()


def test_bad_batch_is_one_warning_naming_the_field(tmp_path: Path) -> None:
    batch, _ = rollouts(4)
    batch.pop(non_tensor_batch_keys=["uid"])
    with pytest.warns(RuntimeWarning, match="grpo-cli.*uid: absent"):
        assert rec.write_batch(batch, tmp_path, 1) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rec.write_batch(rollouts(5)[0], tmp_path, 2) is None  # recording is off
    assert not (tmp_path / "step_000002").exists()


# ----------------------------------------------------- grpo-cli equals verl's loss
def actor_config(agg: str, n: int, high: float = 0.2) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=n,
        ppo_micro_batch_size_per_gpu=n,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=high,
        loss_agg_mode=agg,
        use_dynamic_bsz=False,
        rollout_n=1,
    )


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_cli_on_the_step_equals_verl(tmp_path: Path, cli: Cli, agg: str) -> None:
    """float64 tensors and ``token_dtype=float64``: what is compared is the formula on the
    recorded columns, not float32 rounding (1e-9 relative, as the conformance suite)."""
    batch, x = rollouts(6, dtype=torch.float64)
    rec.write_batch(batch, tmp_path, 1, log_probs=x["log_probs"], token_dtype=pa.float64())
    step = tmp_path / "step_000001"
    b = batch.batch
    m = b["response_mask"].bool()
    vanilla: Any = ca.compute_policy_loss_vanilla  # registered: its decorator hides the types
    pg_loss, metrics = vanilla(
        b["old_log_probs"],
        x["log_probs"],
        b["advantages"],
        m,
        loss_agg_mode=agg,
        config=actor_config(agg, m.shape[0]),
    )
    kld = ca.kl_penalty(x["log_probs"], b["ref_log_prob"], kl_penalty="low_var_kl")
    kl_loss = float(ca.agg_loss(loss_mat=kld, loss_mask=m, loss_agg_mode=agg))
    doc = cli.json("objective", step, "--preset", "verl", "--agg", agg)
    assert doc["policy_term"] == pytest.approx(-float(pg_loss), rel=1e-9)
    assert doc["loss"] == pytest.approx(float(pg_loss) + 0.001 * kl_loss, rel=1e-9)
    tm = doc["trainer_metrics"]["metrics"]
    for k in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
        assert tm[k] == pytest.approx(metrics[k], rel=1e-6), k  # float32 masks in verl
    assert doc["counts"] == {"groups": len(GROUPS), "answers": m.shape[0], "tokens": m.sum()}
    # the reward and group columns: grpo-cli's advantages from them are verl's
    ours = cli.json("advantages", step, "--preset", "verl")["advantages"]
    theirs = b["advantages"][torch.arange(m.shape[0]), 0].numpy()
    # verl's singleton group divides by its float32 std 1 plus 1e-6, rounded in float32
    # (1.00000095): 5e-8 relative, which grpo-cli (dividing by 1 + 1e-6) does not copy
    single = x["uid"] == "uid-6-3"
    np.testing.assert_allclose(np.array(ours)[~single], theirs[~single], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.array(ours)[single], theirs[single], rtol=1e-7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_cli_with_no_flag_reads_the_config(tmp_path: Path, cli: Cli, agg: str) -> None:
    """The recorded step with no flag: the settings come from meta.json (verl's own
    config: loss_agg_mode, the KL loss with low_var_kl and its coefficient, the clip ratios
    and clip_ratio_c), and the loss is verl's."""
    batch, x = rollouts(8, dtype=torch.float64)
    actor = "actor_rollout_ref.actor."
    cfg = verl_config(**{
        actor + "loss_agg_mode": agg, actor + "use_kl_loss": True, actor + "kl_loss_coef": 0.002,
        actor + "kl_loss_type": "low_var_kl", actor + "clip_ratio_low": 0.2,
        actor + "clip_ratio_high": 0.28, "algorithm.adv_estimator": "grpo",
    })  # fmt: skip
    rec.write_batch(
        batch, tmp_path, 1, config=cfg, log_probs=x["log_probs"], token_dtype=pa.float64()
    )
    b = batch.batch
    m = b["response_mask"].bool()
    vanilla: Any = ca.compute_policy_loss_vanilla
    config = actor_config(agg, m.shape[0], high=0.28)
    pg_loss, _ = vanilla(
        b["old_log_probs"], x["log_probs"], b["advantages"], m, loss_agg_mode=agg, config=config
    )
    kld = ca.kl_penalty(x["log_probs"], b["ref_log_prob"], kl_penalty="low_var_kl")
    kl_loss = float(ca.agg_loss(loss_mat=kld, loss_mask=m, loss_agg_mode=agg))
    doc = cli.json("objective", tmp_path / "step_000001")
    s = doc["settings"]
    assert (s["from"], s["trainer"], s["agg"], s["beta"]) == ("meta.json", "verl", agg, 0.002)
    assert (s["clip_eps"], s["clip_eps_high"], s["dual_clip"]) == (0.2, 0.28, 3.0)
    assert doc["policy_term"] == pytest.approx(-float(pg_loss), rel=1e-7)
    assert doc["loss"] == pytest.approx(float(pg_loss) + 0.002 * kl_loss, rel=1e-7)


# ------------------------------------------------------------ install: _update_actor
class WorkerGroup:
    """Stands in for ``trainer.actor_rollout_wg`` (Ray workers around a GPU engine):
    keeps what ``update_actor`` was sent, answers as ``TrainingWorker.train_mini_batch``
    does (``{"metrics": {name: [one value per micro-batch]}}``)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def update_actor(self, td: Any) -> Any:
        self.sent.append(td)
        metrics = {
            "actor/pg_loss": [0.25, -0.5],
            "actor/pg_clipfrac": [0.125, 0.0],
            "actor/ppo_kl": [1e-3, 2e-3],
            "grad_norm": [0.75],
            "mfu": [0.5],
        }
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


def trainer(step: int) -> Any:
    """A ``RayPPOTrainer`` with what ``_update_actor`` reads: verl's config, the worker
    group, the step counter (``RayPPOTrainer.__init__`` needs Ray and the workers)."""
    t = RayPPOTrainer.__new__(RayPPOTrainer)
    t.config = verl_config(**{"actor_rollout_ref.rollout.n": 4, "algorithm.adv_estimator": "grpo"})
    t.actor_rollout_wg = WorkerGroup()
    t.global_steps = step
    t.tokenizer = tokenizer()
    return t


def same(a: Any, b: Any) -> bool:
    """Two ``update_actor`` inputs or outputs hold the same entries."""
    if set(a.keys()) != set(b.keys()):
        return False
    for k in a.keys():
        x, y = tu.get(a, k), tu.get(b, k)
        if isinstance(x, torch.Tensor):
            x = x.values() if x.is_nested else x
            y = y.values() if y.is_nested else y
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def test_install_records_the_update(tmp_path: Path) -> None:
    batch, x = rollouts(7)
    plain = trainer(3)
    expected = plain._update_actor(copy.deepcopy(batch))  # verl's method, not recorded
    t = rec.install(trainer(3), tmp_path / "run")
    got = t._update_actor(batch)
    assert got.meta_info == expected.meta_info  # the same metrics, returned unchanged
    assert same(t.actor_rollout_wg.sent[0], plain.actor_rollout_wg.sent[0])
    step = tmp_path / "run" / "step_000003"
    assert (step / "_DONE").exists()
    cols, meta = read(step / "rank000-mb000.parquet")
    assert meta["micro_batches"] == 1 and "current log-probs" in meta["scope"]
    assert cols["group"] == [f"g000003-{u}" for u in x["uid"]]
    assert cols["old_logp"] == batch.batch["old_log_probs"].numpy().tolist()
    assert "logp" not in cols and "entropy" not in cols
    assert cols["completion"][0] == " ".join(f"w{t}" for t in x["responses"][0][x["mask"][0]])
    assert cols["token_id"] == np.asarray(x["responses"]).tolist()  # the sampled ids
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert logged == [{"step": 3, **reduce_metrics(dict(expected.meta_info["metrics"]))}]
    doc = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert doc["config"] == rec.config_items(t.config)


def test_install_every_steps(tmp_path: Path) -> None:
    t = rec.install(trainer(1), tmp_path, every_steps=2)
    for step in (1, 2, 3, 4):
        t.global_steps = step
        t._update_actor(rollouts(10 + step)[0])
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002", "step_000004"]
    again = rec.install(t, tmp_path / "other")  # replaces, does not wrap twice
    assert again._update_actor.__wrapped__ == t._grpo_cli_recorder.original
    assert "grpo_cli" not in getattr(t._grpo_cli_recorder.original, "__module__", "")


@pytest.mark.parametrize("failure", ["unwritable", "injected"])
def test_install_never_harms_the_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    batch, _ = rollouts(8)
    expected = trainer(1)._update_actor(copy.deepcopy(batch))
    if failure == "unwritable":
        (tmp_path / "file").write_text("")
        directory, reason = tmp_path / "file" / "run", "NotADirectoryError"
    else:

        def boom(*a: Any, **k: Any) -> Any:
            raise RuntimeError("injected")

        monkeypatch.setattr(rec, "batch_table", boom)
        directory, reason = tmp_path / "run", "injected"
    t = rec.install(trainer(1), directory)
    with pytest.warns(RuntimeWarning) as caught:
        got = t._update_actor(batch)
    assert len(caught) == 1 and "grpo-cli" in str(caught[0].message)
    assert reason in str(caught[0].message)
    assert got.meta_info == expected.meta_info and len(t.actor_rollout_wg.sent) == 1
    t.global_steps = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert t._update_actor(batch).meta_info == expected.meta_info  # quiet, still training
    assert not list(tmp_path.glob("run/step_*"))


def test_install_refuses_what_is_not_a_verl_trainer() -> None:
    with pytest.raises(TypeError, match="_update_actor"):
        rec.install(object(), "runs")


def test_import_is_light() -> None:
    code = (
        "import sys, grpo_cli.integrations.verl, grpo_cli.integrations.openrlhf\n"
        "heavy = ('torch', 'verl', 'openrlhf', 'ray', 'transformers')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
