"""Real AReaL 1.0.4 GRPO steps on CPU: the actor's own PPO step, below its entry point
(``areal/trainer/rl_trainer.py`` ``PPOTrainer`` needs an SGLang or vLLM server to roll
out, and a scheduler).

What runs is AReaL's, with no patch of its code: ``FSDPPPOActor``
(``areal/engine/fsdp_engine.py``: FSDP2 on a gloo process group, AReaL's own CPU
platform, ``areal/infra/platforms/cpu.py``, chosen when no accelerator is found) and its
``PPOActor`` (``areal/trainer/ppo/actor.py``): ``compute_logp`` (the reference's, and the
proximal policy's with ``recompute_logprob``), ``compute_advantages``, ``ppo_update``
(``grpo_loss_fn`` → ``ppo_actor_loss_fn`` / ``sapo_loss_fn`` per micro-batch, AdamW
steps per minibatch) and ``export_stats`` (``stats_tracker``), in the order
``PPOTrainer.train`` calls them. The recorder is installed with
``grpo_cli.integrations.areal.install(actor, dir)``.

The seam, each piece for a reason AReaL's code gives:

- ``swanlab``, ``trackio``, ``wandb`` and ``tensorboardX`` are imported unguarded by
  ``areal/utils/stats_logger.py`` (through ``areal/trainer/__init__.py``, which
  ``actor.py``'s package import runs); they are experiment trackers that nothing here
  calls: empty stand-in modules (:func:`stub_trackers`);
- the model and tokenizer: ``FSDPEngine`` reads both from ``config.path``
  (``AutoConfig.from_pretrained``, ``load_hf_tokenizer``), so the tiny Qwen2 and the
  word-level tokenizer built in memory (tests/trl_runs.py) are saved to a temporary
  directory first; float32 (``dtype``), ``attn_impl="sdpa"``;
- ``LOCAL_RANK`` / ``RANK`` / ``WORLD_SIZE`` / ``MASTER_*``: what AReaL's launcher sets
  (``_create_device_model`` reads ``LOCAL_RANK``), one rank;
- generation: AReaL rolls out through an inference server only, so the answers are sampled
  with ``transformers``' ``generate`` on the actor's (FSDP-wrapped) module, and the
  trajectories built as ``areal/workflow/rlvr.py`` builds them (``input_ids``,
  ``loss_mask``, ``logprobs`` of the sampled tokens, ``versions``, ``attention_mask``,
  ``rewards``), one dict of batch size 1 per answer, ``N`` adjacent answers a prompt.
"""

from __future__ import annotations

import importlib.machinery
import os
import socket
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORDS = "a b c d e f g h i j k l m n o p".split()
PROMPT = 3
RESPONSE = 8
PROMPTS = 4
N = 4  # answers per prompt (gconfig.n_samples; NormConfig.group_size)
TRACKERS = ("swanlab", "trackio", "wandb", "tensorboardX")


def stub_trackers() -> None:
    """Empty modules for the experiment trackers ``stats_logger.py`` imports (module
    docstring), each with a spec (``accelerate`` asks ``find_spec`` of tensorboardX)."""
    for name in TRACKERS:
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        if name == "tensorboardX":
            module.SummaryWriter = object  # type: ignore[attr-defined]
        sys.modules[name] = module


def setup_environment() -> None:
    """One rank's launcher variables and the gloo process group (module docstring)."""
    import torch.distributed as dist

    stub_trackers()
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", rank=0, world_size=1)


def save_tiny_model(directory: Path) -> Path:
    """The tiny Qwen2 and its tokenizer (tests/trl_runs.py), saved where AReaL reads them."""
    from ..trl_runs import model, tokenizer

    tok = tokenizer()
    if not (directory / "config.json").exists():
        model(tok, 0).save_pretrained(directory)
        tok.save_pretrained(directory)
    return directory


def make_actor(path: Path, lr: float = 1e-2, **overrides: Any) -> Any:
    """AReaL's ``FSDPPPOActor`` on the tiny model, initialised as ``PPOTrainer`` does
    (``create_process_group``, ``initialize``); ``overrides``: ``PPOActorConfig`` fields."""
    from areal.api.cli_args import OptimizerConfig, PPOActorConfig
    from areal.api.io_struct import FinetuneSpec
    from areal.engine.fsdp_engine import FSDPPPOActor

    optimizer = None
    if lr:
        optimizer = OptimizerConfig(
            lr=lr, weight_decay=0.0, lr_scheduler_type="constant", warmup_steps_proportion=0.0
        )
    config = PPOActorConfig(
        experiment_name="grpo-cli", trial_name="real", path=str(path), dtype="float32",
        optimizer=optimizer, backend="fsdp:d1", attn_impl="sdpa", **overrides,
    )  # fmt: skip
    actor = FSDPPPOActor(config)
    actor.create_process_group()
    spec = FinetuneSpec(total_train_epochs=1, dataset_size=64, train_batch_size=PROMPTS * N)
    actor.initialize(None, spec)
    return actor


def reward(text: str) -> float:
    words = text.split()
    if len(words) < 4:
        return 1.0
    return min(0.75, 0.25 * sum(w in "aeio" for w in words))


def rollout(actor: Any, step: int) -> list[dict[str, Any]]:
    """One step's trajectories, as ``RLVRWorkflow.arun_episode`` returns them (module
    docstring): the sampled tokens' log-probs from ``generate``'s scores."""
    import numpy as np
    import torch

    tok = actor.tokenizer
    ids = [tok.convert_tokens_to_ids(w) for w in WORDS]
    rng = np.random.default_rng(step)
    prompts = torch.tensor(
        [rng.choice(ids, size=PROMPT).tolist() for _ in range(PROMPTS)], dtype=torch.long
    ).repeat_interleave(N, dim=0)
    torch.manual_seed(1000 + step)
    model = actor.model
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=RESPONSE,
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
    trajectories = []
    for i, row in enumerate(out.sequences):
        answer = row[PROMPT:].tolist()
        if tok.eos_token_id in answer:  # up to and including the first EOS
            answer = answer[: answer.index(tok.eos_token_id) + 1]
        logps = [
            float(torch.log_softmax(out.scores[t][i].float(), -1)[a]) for t, a in enumerate(answer)
        ]
        seq = prompts[i].tolist() + answer
        traj = {
            "input_ids": torch.tensor(seq, dtype=torch.int32),
            "loss_mask": torch.tensor([0] * PROMPT + [1] * len(answer), dtype=torch.int32),
            "logprobs": torch.tensor([0.0] * PROMPT + logps, dtype=torch.float32),
            "versions": torch.tensor([-1] * PROMPT + [step - 1] * len(answer), dtype=torch.int32),
            "attention_mask": torch.ones(len(seq), dtype=torch.bool),
            "rewards": torch.tensor(reward(tok.decode(answer, skip_special_tokens=True))),
        }
        trajectories.append({k: v.unsqueeze(0) for k, v in traj.items()})
    return trajectories


@dataclass
class Run:
    actor: Any
    logged: dict[int, dict[str, float]] = field(default_factory=dict)
    rewards: dict[int, float] = field(default_factory=dict)


def step(actor: Any, ref: Any, number: int, run: Run) -> None:
    """One step as ``PPOTrainer.train`` takes it: the reference's log-probs, the proximal
    ones when the config asks (``should_compute_prox_logp``), the advantages, the update,
    the stats exported (what ``_export_and_commit_stats`` commits)."""
    batch = rollout(actor, number)
    for traj, logp in zip(batch, ref.compute_logp(batch), strict=True):
        traj["ref_logp"] = logp
    if actor.config.should_compute_prox_logp():
        for traj, logp in zip(batch, actor.compute_logp(batch), strict=True):
            traj["prox_logp"] = logp
    adv = actor.compute_advantages(batch)
    actor.ppo_update(adv)
    actor.step_lr_scheduler()
    actor.set_version(number)
    run.logged[number] = dict(actor.export_stats())
    run.rewards[number] = float(sum(float(t["rewards"].sum()) for t in batch)) / (PROMPTS * N)


def train(actor: Any, ref: Any, steps: int) -> Run:
    run = Run(actor)
    for number in range(1, steps + 1):
        step(actor, ref, number, run)
    return run
