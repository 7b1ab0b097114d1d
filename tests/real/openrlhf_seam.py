"""Real OpenRLHF 0.11.2 GRPO steps on CPU: the policy actor's own training step, below its
entry point (``cli/train_ppo_ray.py`` needs GPUs for DeepSpeed and vLLM).

What runs is OpenRLHF's: ``ActorPPOTrainer.ppo_train`` → ``training_step``
(``trainer/ray/ppo_actor.py``: ``Actor.forward``, ``PolicyLoss``, the KL loss,
``iter_grad_accum_global_norm``'s loss normalisers), its ``NaiveReplayBuffer``, ``Actor``
(``models/actor.py``) around the model, and the experiences' KL and advantages from
``RemoteExperienceMaker`` (``split_rollout_samples``, ``compute_advantages_and_returns``;
``make_experience``'s own arithmetic on the two models' log-probs, its Ray dispatch left
out). The recorder is installed on the ``ActorPPOTrainer`` with
``grpo_cli.integrations.openrlhf.install``.

The seam, each piece for a reason OpenRLHF's code gives:

- ``deepspeed``, ``vllm`` and ``flash_attn`` are CUDA builds that are not installed:
  their imports (``trainer/ray/ppo_actor.py``, ``utils/deepspeed/*.py``,
  ``trainer/ray/vllm_engine.py``, ``models/ring_attn_utils.py``) get stand-in modules that
  raise when anything in them is called (:class:`_Absent`, :data:`ABSENT`).
- the unconditional CUDA calls: ``torch.cuda.current_device()`` in ``ppo_train``
  (``trainer/ray/ppo_actor.py`` line 171: the device each micro-batch moves to) answers
  ``"cpu"`` during the step, and in ``NaiveReplayBuffer.__init__``
  (``trainer/ppo_utils/replay_buffer.py`` line 40: the device of its ``sample()``, which
  ``ppo_train`` never calls) answers 0 while the trainer is made; ``ActorPPOTrainer.__init__``'s
  ``torch_dist_barrier_and_cuda_sync()`` (``ppo_actor.py`` line 106, a barrier and a CUDA
  synchronize) is a gloo barrier.
- the strategy: DeepSpeed's (``utils/deepspeed/deepspeed.py``) is CUDA only; :class:`Strategy`
  does what ``training_step`` asks of it as DeepSpeed's engine does: ``backward`` of the
  loss divided by the accumulation steps, ``optimizer_step`` a no-op until the
  accumulation boundary, then the gradient clipped to ``actor.max_norm`` and one AdamW
  step, ``get_grad_norm``, ``all_reduce`` over the (one) rank.
- the model: ``Actor`` around the tiny Qwen2 object in float32 (given a path it loads in
  bf16 or fp16 only, ``utils/utils.py`` ``convert_to_torch_dtype``); that branch of
  ``Actor.__init__`` leaves ``packing_samples`` unset, so it is set (False).
- generation: vLLM only in OpenRLHF, so the answers are sampled with ``transformers``'
  ``generate`` on the actor's model and turned into ``Experience`` objects as
  ``SamplesGenerator._process_response_into_experience`` makes them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

WORDS = "a b c d e f g h i j k l m n o p".split()
PROMPT = 3
RESPONSE = 8
PROMPTS = 4
N = 4  # rollout.n_samples_per_prompt
# the packages (every module) and the single modules that get stand-ins: flash-attn's
# padding and gather helpers are imported unconditionally (models/ring_attn_utils.py,
# used with packed samples only); its fused
# cross entropy is imported in a try whose ImportError falls back to torch
# (models/utils.py, log_probs_from_logits), so it stays absent
ABSENT = ("deepspeed", "vllm")
ABSENT_MODULES = (
    "flash_attn",
    "flash_attn.bert_padding",
    "flash_attn.utils",
    "flash_attn.utils.distributed",
)


class _Absent(types.ModuleType):
    """A module of a package that is not installed: any attribute is another such module
    (``from deepspeed.ops.adam import FusedAdam`` imports), and calling one raises."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Absent(f"{self.__name__}.{name}")
        setattr(self, name, sub)
        return sub

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__}: a CUDA-only package's stand-in, not to be called")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # a class that derives from one (vLLM's worker extensions)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in ABSENT or name in ABSENT_MODULES:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = _Absent(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: Any) -> None:
        return None


def import_openrlhf() -> dict[str, Any]:
    """OpenRLHF's modules the step runs, with the absent packages' stand-ins (module
    docstring)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    import openrlhf.models as models
    import openrlhf.trainer.ppo_utils.experience as experience
    import openrlhf.trainer.ppo_utils.experience_maker as maker
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    import openrlhf.utils.config as config

    ppo_actor.torch_dist_barrier_and_cuda_sync = _barrier
    return {"models": models, "experience": experience, "maker": maker,
            "ppo_actor": ppo_actor, "config": config}  # fmt: skip


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def cpu_device(answer: Any = "cpu") -> Iterator[None]:
    """``torch.cuda.current_device()`` answers ``answer`` (module docstring)."""
    import torch

    cuda: Any = torch.cuda
    saved = cuda.current_device
    cuda.current_device = lambda: answer
    try:
        yield
    finally:
        cuda.current_device = saved


def init_process_group() -> None:
    import os
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    dist.init_process_group(backend="gloo", rank=0, world_size=1)


def flat_args(**overrides: Any) -> argparse.Namespace:
    """OpenRLHF 0.11.2's arguments as its argparse leaves them (dotted dests), its defaults
    for what these code paths read (``cli/train_ppo_ray.py``), with ``overrides``."""
    a: dict[str, Any] = {
        "algo.advantage.estimator": "group_norm",
        "algo.advantage.gamma": 1.0,
        "algo.advantage.lambd": 1.0,
        "algo.advantage.no_std_norm": False,
        "algo.advantage.is_correction_level": "off",
        "algo.advantage.is_correction_mode": "mask",
        "algo.advantage.is_correction_gating": "ratio",
        "algo.advantage.is_correction_threshold": [0.5, 5.0],
        "algo.kl.use_loss": False,
        "algo.kl.estimator": "k1",
        "algo.kl.init_coef": 0.01,
        "algo.kl.unbiased_gradient": False,
        "algo.kl.target": None,
        "algo.kl.horizon": 10000,
        "algo.dynamic_filtering_enable": False,
        "actor.eps_clip": 0.2,
        "actor.eps_clip_low_high": (0.2, 0.2),
        "actor.dual_clip": None,
        "actor.policy_loss_type": "ppo",
        "actor.loss_agg_mode": "token-mean",
        "actor.entropy_coef": None,
        "actor.aux_loss_coef": 0.0,
        "actor.max_norm": 1.0,
        "actor.num_nodes": 1,
        "actor.num_gpus_per_node": 1,
        "reward.clip_range": (-10, 10),
        "reward.normalize_enable": False,
        "reward.overlong_buffer_len": None,
        "reward.overlong_penalty_factor": 1.0,
        "reward.stop_properly_penalty_coef": None,
        "rollout.n_samples_per_prompt": N,
        "rollout.batch_size": PROMPTS,
        "rollout.micro_batch_size": 8,
        "rollout.temperature": 1.0,
        "rollout.max_new_tokens": RESPONSE,
        "train.batch_size": PROMPTS * N,
        "train.micro_batch_size": 8,
        "train.max_epochs": 1,
        "train.dynamic_batch_enable": False,
        "train.colocate_all": False,
        "train.async_enable": False,
        "train.enable_ema": False,
        "critic.freezing_steps": -1,
        "ds.ring_attn_size": 1,
        "ds.tensor_parallel_size": 1,
        "ds.packing_samples": False,
        "vllm.sync_backend": "gloo",
        "data.max_len": PROMPT + RESPONSE,
    }
    a.update(overrides)
    return argparse.Namespace(**a)


class Strategy:
    """What ``training_step`` and ``ppo_train`` ask of OpenRLHF's ``DeepspeedStrategy``,
    done as DeepSpeed's engine does it on one rank (module docstring)."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.accumulated_gradient = max(args.train.batch_size // args.train.micro_batch_size, 1)
        self.ring_attn_group = None
        self.micro_steps = 0
        self.grad_norm = 0.0

    def backward(self, loss: Any, model: Any, optimizer: Any) -> None:
        (loss / self.accumulated_gradient).backward()

    def optimizer_step(self, optimizer: Any, model: Any, scheduler: Any, name: str = "") -> None:
        import torch

        self.micro_steps += 1
        if self.micro_steps % self.accumulated_gradient:
            return  # DeepSpeed's engine.step() before the accumulation boundary
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.actor.max_norm)
        self.grad_norm = float(norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

    def get_grad_norm(self, model: Any) -> float:
        return self.grad_norm

    def all_reduce(self, data: Any, op: str = "mean") -> Any:
        return data  # one rank

    def is_rank_0(self) -> bool:
        return True

    def print(self, *args: Any) -> None:
        return None


def tiny_model(seed: int = 0) -> Any:
    from ..trl_runs import model, tokenizer

    return model(tokenizer(), seed)


@dataclass
class Run:
    trainer: Any
    logged: dict[int, dict[str, float]] = field(default_factory=dict)
    rewards: dict[int, float] = field(default_factory=dict)


def make_trainer(args: argparse.Namespace, lr: float = 1e-2) -> Any:
    """OpenRLHF's ``ActorPPOTrainer`` around the tiny model, as ``PolicyModelActor
    .init_model_from_pretrained`` makes it (DeepSpeed's optimizer and scheduler as plain
    torch ones), and the reference model."""
    import torch

    from ..trl_runs import tokenizer

    orl = import_openrlhf()
    init_process_group()
    nested = orl["config"].hierarchize(args)
    actor = orl["models"].Actor(tiny_model(), temperature=nested.rollout.temperature)
    ref = orl["models"].Actor(tiny_model(), temperature=nested.rollout.temperature)
    for a in (actor, ref):  # Actor(model) (not a path) leaves it unset (models/actor.py)
        a.packing_samples = nested.ds.packing_samples
    ref.eval()
    optim = torch.optim.AdamW(actor.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: 1.0)
    strategy = Strategy(nested)
    with cpu_device(0):
        trainer = orl["ppo_actor"].ActorPPOTrainer(
            strategy, actor, ema_model=None, actor_optim=optim, actor_scheduler=scheduler,
            micro_train_batch_size=nested.train.micro_batch_size, tokenizer=tokenizer(),
            eps_clip=nested.actor.eps_clip, dataloader_pin_memory=False, vllm_engines=None,
        )  # fmt: skip
    trainer.reference = ref
    trainer.orl = orl
    return trainer


def reward(text: str) -> float:
    words = text.split()
    if len(words) < 4:
        return 1.0
    return min(0.75, 0.25 * sum(w in "aeio" for w in words))


def rollout(trainer: Any, step: int) -> list[Any]:
    """One step's samples, one ``Experience`` per answer as OpenRLHF's samples generator
    makes them: ``sequences`` prompt + answer, ``action_mask`` over ``sequences[1:]``, the
    reward; ``N`` answers per prompt in order."""
    import numpy as np
    import torch

    Experience = trainer.orl["experience"].Experience
    tok = trainer.tokenizer
    ids = [tok.convert_tokens_to_ids(w) for w in WORDS]
    rng = np.random.default_rng(step)
    prompts = torch.tensor(
        [rng.choice(ids, size=PROMPT).tolist() for _ in range(PROMPTS)], dtype=torch.long
    ).repeat_interleave(N, dim=0)
    torch.manual_seed(1000 + step)
    model = trainer.actor.model
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=RESPONSE,
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, use_cache=True,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    samples = []
    for i, row in enumerate(out):
        answer = row[PROMPT:].tolist()
        if tok.eos_token_id in answer:  # up to and including the first EOS
            answer = answer[: answer.index(tok.eos_token_id) + 1]
        tokens = prompts[i].tolist() + answer
        action = torch.zeros(len(tokens), dtype=torch.long)
        action[PROMPT:] = 1
        action = action[1:]
        r = reward(tok.decode(answer, skip_special_tokens=True))
        samples.append(
            Experience(
                sequences=torch.tensor([tokens]),
                attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
                action_mask=action[None],
                prompts=[tok.decode(prompts[i].tolist())],
                labels=[""],
                rewards=torch.tensor([r]),
                response_length=torch.tensor([float(len(answer))]),
                truncated=torch.tensor([tok.eos_token_id not in answer]),
                total_length=torch.tensor([float(len(tokens))]),
                info={"reward": torch.tensor([r])},
            )
        )
    return samples


def experiences(trainer: Any, samples: list[Any]) -> list[Any]:
    """``RemoteExperienceMaker``'s experiences: its split into micro-batches, then
    ``make_experience``'s arithmetic (the actor's and the reference's log-probs, the KL
    per token in the reward unless ``algo.kl.use_loss``), then its
    ``compute_advantages_and_returns``."""
    import torch

    orl, args = trainer.orl, trainer.args
    compute_approx_kl = orl["models"].utils.compute_approx_kl
    masked_mean = orl["models"].utils.masked_mean
    cls = orl["maker"].RemoteExperienceMaker
    maker = cls.__new__(cls)  # __init__ only stores its arguments (Ray groups): set here
    maker.strategy = trainer.strategy
    maker.args = args
    maker.advantage_estimator = args.algo.advantage.estimator
    maker.tokenizer = trainer.tokenizer
    maker.kl_ctl = types.SimpleNamespace(value=args.algo.kl.init_coef)
    out = maker.split_rollout_samples(samples)
    for e in out:
        with torch.no_grad():
            trainer.actor.eval()
            old = trainer.actor(e.sequences, e.action_mask, e.attention_mask)
            base = trainer.reference(e.sequences, e.action_mask, e.attention_mask)
        if not args.algo.kl.use_loss:
            kl = compute_approx_kl(old, base, kl_estimator=args.algo.kl.estimator)
            diff = old.float() - base.float()
        else:
            kl = torch.zeros_like(old)
            diff = torch.zeros_like(old)
        e.action_log_probs = old
        e.base_action_log_probs = base if args.algo.kl.use_loss else None
        e.values = None
        e.kl = kl
        e.info["kl"] = masked_mean(kl, e.action_mask, dim=-1)
        e.info["logprobs_diff"] = masked_mean(diff, e.action_mask, dim=-1)
    result: list[Any] = maker.compute_advantages_and_returns(out)
    return result


def step(trainer: Any, number: int, run: Run) -> None:
    """One step as ``PPOTrainer.train_step`` and ``PolicyModelActor.fit`` take it, without
    Ray: experiences into the replay buffer, ``ppo_train``, the buffer cleared."""
    exps = experiences(trainer, rollout(trainer, number))
    for e in exps:
        trainer.replay_buffer.append(e)
    trainer.actor.train()
    with cpu_device():  # PPOTrainer passes kl_ctl.value: FixedKLController's init_coef
        status = trainer.ppo_train(trainer.args.algo.kl.init_coef)
    trainer.replay_buffer.clear()
    run.logged[number] = dict(status)
    run.rewards[number] = float(sum(float(e.rewards.sum()) for e in exps)) / (PROMPTS * N)


def train(trainer: Any, steps: int) -> Run:
    run = Run(trainer)
    for number in range(1, steps + 1):
        step(trainer, number, run)
    return run
