"""Real verl 0.9.1 GRPO steps on CPU: verl's own workers and trainer glue, below its entry
point (which needs Ray with GPUs and a vLLM/SGLang rollout server).

What runs is verl's: ``ActorRolloutRefWorker(role="actor")`` and ``(role="ref")``
(``workers/engine_workers.py``) with their FSDP2 engine (``workers/engine/fsdp``) and
``ppo_loss`` (``workers/utils/losses.py``), and on the driver side the real
``RayPPOTrainer._compute_old_log_prob``, ``_compute_ref_log_prob`` and ``_update_actor``
(``trainer/ppo/ray_trainer.py``) on a ``RayPPOTrainer`` made without ``__init__``, and
``compute_advantage`` (GRPO). The recorder is installed on that trainer with
``grpo_cli.integrations.verl.install``, as on a real one.

The seam, each piece for a reason verl's code gives:

- the platform: ``tests/real/verl_cpu.py`` (verl ships none for the CPU), loaded by
  ``VERL_USE_EXTERNAL_MODULES`` and chosen by ``VERL_PLATFORM=cpu``;
  ``VERL_ENGINE_DEVICE=cuda`` selects the FSDP engine, registered for cuda/npu only
  (``workers/engine/fsdp/transformer_impl.py`` line 1143).
- the process group: one gloo rank initialised before the workers
  (``utils/distributed.py``, ``initialize_global_process_group_ray``, would ask for
  ``cpu:gloo,cpu:gloo``), with the ``WORLD_SIZE``/``RANK``/``MASTER_*`` variables
  ``single_controller/base/worker.py`` (``Worker.__init__``) reads, as Ray would set them.
- the workers are plain objects: their ``@register`` methods are called directly, where a
  ``RayWorkerGroup`` would dispatch them to one worker (world size 1: the same call).
- the model: strategy ``fsdp2``, float32, ``sdpa`` attention (the default asks for
  flash-attention 2, ``workers/config/model.py`` line 185), no remove-padding (it needs
  flash-attention's kernels), no ``torch.compile`` of the entropy (``transformer_impl.py``
  line 184), no gradient checkpointing.
- the reference is forward-only, and verl gives it ``CPUOffloadPolicy(pin_memory=True)``
  (``transformer_impl.py`` line 462); pinned memory needs a CUDA runtime, so the engine
  module's ``CPUOffloadPolicy`` is one with ``pin_memory=False`` (the parameters stay on the
  CPU either way).
- generation: verl 0.9.1 has no HF rollout left (vLLM, SGLang, TRT-LLM servers only), so
  the answers are sampled with ``transformers``' ``generate`` on the actor's own FSDP
  module; prompts left-padded, answers right-padded, as verl's rollout returns them.
- the reward: a rule on the decoded answer, put on its last valid token, as verl's reward
  managers do.
- TRL beside verl (CI runs this seam in the conformance environment, which holds TRL
  1.16): verl's ``apply_monkey_patch`` (``models/transformers/monkey_patch.py`` line 352)
  patches TRL's value-head model whenever TRL imports, by a name TRL 1.16 no longer has
  (``trl.experimental.ppo.AutoModelForCausalLMWithValueHead``); a policy without a value
  head never reads the patch, so the seam tells that module TRL is absent.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORDS = "a b c d e f g h i j k l m n o p".split()
PROMPT = 3  # prompt tokens
RESPONSE = 8  # max answer tokens
PROMPTS = 4  # prompts per step
N = 4  # answers per prompt (rollout.n)


def setup_environment() -> None:
    """The variables verl reads at import (module docstring); call it before importing
    verl."""
    os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", "tests.real.verl_cpu")
    os.environ["VERL_PLATFORM"] = "cpu"
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    os.environ.setdefault("VERL_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def distributed_environment() -> None:
    """What a Ray worker group sets for its one worker and ``Worker.__init__`` reads."""
    for key, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):  # fmt: skip
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def init_process_group() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", rank=0, world_size=1)


def patch_pinned_memory() -> None:
    """The forward-only engine's ``CPUOffloadPolicy(pin_memory=True)`` without pinned
    memory (module docstring)."""
    import verl.workers.engine.fsdp.transformer_impl as impl
    from torch.distributed.fsdp import CPUOffloadPolicy

    def unpinned(pin_memory: bool = True) -> Any:
        del pin_memory
        return CPUOffloadPolicy(pin_memory=False)

    impl.CPUOffloadPolicy = unpinned


def patch_trl_probe() -> None:
    """verl's monkey patch of TRL's value-head model skipped (module docstring)."""
    import verl.models.transformers.monkey_patch as mp

    mp.is_trl_available = lambda: False


def save_model(directory: Path) -> Path:
    """The tiny Qwen2 and its tokenizer (tests/trl_runs.py), saved where verl's
    ``HFModelConfig.path`` reads them."""
    from ..trl_runs import model, tokenizer

    if not (directory / "config.json").exists():
        tok = tokenizer()
        model(tok).save_pretrained(directory)
        tok.save_pretrained(directory)
    return directory


def config(model_dir: Path, **overrides: Any) -> Any:
    """verl 0.9.1's own trainer config (its generated reference yaml) for this seam, with
    ``overrides`` (dotted keys) on top."""
    import verl.trainer.config as cfg_pkg
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(cfg_pkg.__file__).parent / "_generated_ppo_trainer.yaml")
    a, r, ro, m = ("actor_rollout_ref." + k for k in ("actor.", "ref.", "rollout.", "model."))
    batch = PROMPTS * N
    base: dict[str, Any] = {
        m + "path": str(model_dir),
        m + "use_remove_padding": False,
        m + "enable_gradient_checkpointing": False,
        m + "override_config": {"attn_implementation": "sdpa"},
        a + "strategy": "fsdp2",
        a + "fsdp_config.strategy": "fsdp2",
        a + "fsdp_config.dtype": "float32",
        a + "fsdp_config.model_dtype": "fp32",
        a + "fsdp_config.use_torch_compile": False,
        a + "use_torch_compile": False,
        a + "ppo_mini_batch_size": PROMPTS,
        a + "ppo_micro_batch_size_per_gpu": batch,
        a + "optim.lr": 1e-2,
        a + "optim.clip_grad": 1.0,
        r + "strategy": "fsdp2",
        r + "fsdp_config.strategy": "fsdp2",
        r + "fsdp_config.dtype": "float32",
        r + "fsdp_config.model_dtype": "fp32",
        r + "fsdp_config.use_torch_compile": False,
        r + "use_torch_compile": False,
        r + "log_prob_micro_batch_size_per_gpu": batch,
        ro + "n": N,
        ro + "name": "hf",
        ro + "temperature": 1.0,
        ro + "log_prob_micro_batch_size_per_gpu": batch,
        "algorithm.adv_estimator": "grpo",
        "data.train_batch_size": PROMPTS,
        "data.max_prompt_length": PROMPT,
        "data.max_response_length": RESPONSE,
        "trainer.n_gpus_per_node": 1,
        "trainer.nnodes": 1,
        "trainer.device": "cpu",
    }
    for key, value in {**base, **overrides}.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


@dataclass
class Run:
    """One seam run: the trainer object, the steps' logged metrics (as ``fit`` logs the
    actor's: ``reduce_metrics`` of ``_update_actor``'s output) and rewards."""

    trainer: Any
    logged: dict[int, dict[str, float]] = field(default_factory=dict)
    rewards: dict[int, float] = field(default_factory=dict)


def make_trainer(cfg: Any) -> Any:
    """A ``RayPPOTrainer`` without ``__init__`` (it builds Ray worker groups) holding what
    its methods read: the config, the actor worker as ``actor_rollout_wg``, the reference
    worker as ``ref_policy_wg``, the tokenizer."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from ..trl_runs import tokenizer

    distributed_environment()
    init_process_group()
    patch_pinned_memory()
    patch_trl_probe()
    actor = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor")
    actor.init_model()
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config = cfg
    trainer.actor_rollout_wg = actor
    # the in-memory tokenizer itself: AutoTokenizer would load the saved one as a
    # Qwen2Tokenizer (the model type's), which decodes the word-level ids without spaces
    trainer.tokenizer = tokenizer()
    trainer.use_reference_policy = bool(cfg.actor_rollout_ref.actor.use_kl_loss)
    trainer.ref_in_actor = False
    trainer.use_critic = False
    trainer.global_steps = 0
    if trainer.use_reference_policy:
        ref = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="ref")
        ref.init_model()
        trainer.ref_policy_wg = ref
    return trainer


def reward(text: str) -> float:
    """1 for an answer of fewer than 4 words (ended early by EOS), else a quarter point per
    vowel word, at most 0.75."""
    words = text.split()
    if len(words) < 4:
        return 1.0
    return min(0.75, 0.25 * sum(w in "aeio" for w in words))


def generate(trainer: Any, step: int) -> Any:
    """A rollout batch as verl's ``fit`` has it after generation: ``PROMPTS`` prompts
    repeated ``N`` times (interleaved), sampled with HF ``generate`` on the actor's module,
    left-padded prompts and right-padded answers, the reward on each answer's last token."""
    import numpy as np
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    tok = trainer.tokenizer
    module = trainer.actor_rollout_wg.actor.engine.module
    ids = [tok.convert_tokens_to_ids(w) for w in WORDS]
    rng = np.random.default_rng(step)
    prompts = torch.tensor(
        [rng.choice(ids, size=PROMPT).tolist() for _ in range(PROMPTS)], dtype=torch.long
    ).repeat_interleave(N, dim=0)
    torch.manual_seed(1000 + step)
    module.eval()
    with torch.no_grad():
        out = module.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=RESPONSE,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    responses = out[:, PROMPT:]
    width = responses.shape[1]
    if width < RESPONSE:  # every answer ended early: pad to the configured length
        pad = torch.full((responses.shape[0], RESPONSE - width), tok.pad_token_id)
        responses = torch.cat([responses, pad], dim=1)
    # valid: up to and including the first EOS (generate pads after it)
    is_eos = responses == tok.eos_token_id
    after = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    valid = (after == 0).long()
    responses = torch.where(valid.bool(), responses, torch.full_like(responses, tok.pad_token_id))
    attention = torch.cat([torch.ones_like(prompts), valid], dim=1)
    position = torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0)
    lengths = valid.sum(dim=1)
    texts = tok.batch_decode(
        [r[: int(n)].tolist() for r, n in zip(responses, lengths, strict=True)],
        skip_special_tokens=True,
    )
    scores = torch.zeros(responses.shape, dtype=torch.float32)
    for i, (text, n) in enumerate(zip(texts, lengths.tolist(), strict=True)):
        scores[i, max(n - 1, 0)] = reward(text)
    uids = np.array([str(uuid.uuid4()) for _ in range(PROMPTS)], dtype=object)
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": position,
        },
        non_tensors={"uid": np.repeat(uids, N)},
        meta_info={"temperature": 1.0},
    )
    batch.batch["response_mask"] = compute_response_mask(batch)
    batch.batch["token_level_scores"] = scores
    batch.batch["token_level_rewards"] = scores
    # as fit() sets it (the workers' FLOPs counter reads it)
    batch.meta_info["global_token_num"] = attention.sum(dim=-1).tolist()
    return batch


def step(trainer: Any, number: int, run: Run) -> None:
    """One GRPO step as verl's ``fit`` takes it (its order of calls, without Ray)."""
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils.metric import reduce_metrics

    trainer.global_steps = number
    batch = generate(trainer, number)
    old, _mfu = trainer._compute_old_log_prob(batch)
    old.batch.pop("entropys")
    batch = batch.union(old)
    if trainer.use_reference_policy:
        batch = batch.union(trainer._compute_ref_log_prob(batch))
    algo = trainer.config.algorithm
    batch = compute_advantage(
        batch,
        adv_estimator=algo.adv_estimator,
        gamma=algo.gamma,
        lam=algo.lam,
        num_repeat=trainer.config.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True),
        config=algo,
    )
    output = trainer._update_actor(batch)
    run.logged[number] = reduce_metrics(dict(output.meta_info["metrics"]))
    run.rewards[number] = float(batch.batch["token_level_scores"].sum(-1).mean())


def train(trainer: Any, steps: int) -> Run:
    run = Run(trainer)
    for number in range(1, steps + 1):
        step(trainer, number, run)
    return run
