"""Real TRL ``GRPOTrainer`` runs, recorded with :func:`grpo_cli.integrations.trl.record`.

A tiny randomly initialised Qwen2 (2 layers, hidden 64) built from a config, a word-level
tokenizer trained in memory, 16 in-memory prompts, cheap reward functions, CPU, float32,
4 optimizer steps, nothing downloaded, nothing saved but the recorded run. Each named
configuration of :data:`CONFIGS` trains once per test session (:func:`trl_run`, a
session-scoped factory fixture) and gives a :class:`Run`: the run directory and
``trainer.state.log_history`` taken from the trainer itself.

Torch, transformers and TRL are imported when a run is trained, so importing this module
(pytest's doctest collection does) needs none of them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

WORDS = "a b c d e f g h i j k l m n o p".split()
STEPS = 4
MAX_COMPLETION = 12
TIMING_KEYS = frozenset(
    {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}
)

# GRPOConfig settings per configuration, over BASE. "lr" moves the policy enough that the
# second pass over a generation batch (num_iterations=2) clips.
BASE: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "max_completion_length": MAX_COMPLETION,
    "learning_rate": 1e-2,
    "logging_steps": 1,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},  # dapo, beta 0, one pass: ratio 1
    "beta": {"beta": 0.04, "reward_weights": [1.0, 0.5]},
    "iterations": {"num_iterations": 2, "beta": 0.04, "loss_type": "grpo", "learning_rate": 0.05},
    "gspo": {
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",
        "num_iterations": 2,
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
        "learning_rate": 0.05,
    },
    "ga2_bnpo": {
        "gradient_accumulation_steps": 2,
        "loss_type": "bnpo",
        "num_iterations": 2,
        "learning_rate": 0.05,
    },
    # two optimizer steps per generation batch: old log-probs computed, dapo's normaliser
    # scaled by gradient_accumulation_steps / steps_per_generation
    "ga2_dapo": {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
    # TRL's high-entropy mask (the policy term on the recorded entropy_mask tokens only)
    # with the entropy bonus over the same tokens
    "masks": {
        "mask_truncated_completions": True,
        "top_entropy_quantile": 0.5,
        "entropy_coef": 0.05,
        "beta": 0.04,
        "num_iterations": 2,
        "delta": 1.5,
        "learning_rate": 0.05,
    },
    # a log every second step: TRL's means over a window of 4 loss calls, its loss summed
    # and divided by 2, the window's one generation batch
    "log2": {
        "logging_steps": 2,
        "gradient_accumulation_steps": 2,
        "loss_type": "grpo",
        "num_iterations": 2,
        "learning_rate": 0.05,
    },
    # TRL's own losses (tests/test_loss_fold.py): CISPO's weight capped at epsilon_high
    # (an absolute cap on ρ: 1.0 caps the ratios above 1), SAPO's soft gate with a KL term
    "cispo": {
        "loss_type": "cispo",
        "num_iterations": 2,
        "epsilon_high": 1.0,
        "learning_rate": 0.05,
    },
    "sapo": {"loss_type": "sapo", "num_iterations": 2, "beta": 0.04, "learning_rate": 0.05},
    # DeepSeek-V3.2's off-policy sequence mask: on the second pass over a generation batch
    # an answer with A < 0 whose mean old-minus-current log-prob exceeds δ leaves the loss
    "opsm": {
        "off_policy_mask_threshold": 0.002,
        "loss_type": "grpo",
        "num_iterations": 2,
        "beta": 0.04,
        "learning_rate": 0.05,
    },
    # TRL's entropy bonus (a static entropy_coef): coef × each call's token-mean entropy
    # over the accumulation steps off the loss, whatever the loss type; policy_loss logged
    "entropy": {
        "entropy_coef": 0.05,
        "gradient_accumulation_steps": 2,
        "loss_type": "grpo",
        "num_iterations": 2,
        "learning_rate": 0.05,
    },
}
# configurations with two reward functions (weights in reward_weights)
TWO_REWARDS = frozenset({"beta"})


@dataclass(frozen=True)
class Run:
    name: str
    directory: Path | None  # the recorded run; None when trained without record()
    log_history: list[dict[str, Any]]  # trainer.state.log_history, as the trainer holds it
    settings: dict[str, Any]  # the GRPOConfig keywords the run was made with
    reward_calls: list[dict[str, Any]]  # RewardLog.calls: prompts, completions, rewards


class RewardLog:
    """What TRL passed to the reward functions, call by call (one entry per generation
    batch, in TRL's order before its shuffle): an independent record of which prompt each
    completion answered and of each function's rewards."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def functions(self, two: bool) -> list[Callable[..., list[float]]]:
        log = self.calls

        def reward_short(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
            """1 for a completion of fewer than 8 words (ended by EOS early), else 0."""
            out = [1.0 if len(c.split()) < 8 else 0.0 for c in completions]
            log.append(
                {"prompts": list(prompts), "completions": list(completions), "rewards": [out]}
            )
            return out

        def reward_vowels(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
            """A quarter point per vowel word, at most 1."""
            out = [min(1.0, 0.25 * sum(w in "aeio" for w in c.split())) for c in completions]
            log[-1]["rewards"].append(out)
            return out

        return [reward_short, reward_vowels] if two else [reward_short]


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(
        [" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"])
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def model(tok: Any, seed: int = 0) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def require_trl() -> None:
    """Skip without TRL, unless GRPO_CLI_REQUIRE_TRAINERS is set (CI): then fail."""
    if os.environ.get("GRPO_CLI_REQUIRE_TRAINERS"):
        import trl  # noqa: F401
    else:
        pytest.importorskip("trl")


def make_trainer(
    name: str,
    output_dir: Path,
    rewards: RewardLog | None = None,
    trainer_class: Any = None,
    **overrides: Any,
) -> Any:
    """A fresh GRPOTrainer (or ``trainer_class``) of configuration ``name``: the same
    seed and the same model each time."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    settings = {**BASE, **CONFIGS[name], **overrides}
    with _quiet():
        args = GRPOConfig(
            output_dir=str(output_dir),
            max_steps=STEPS,
            report_to="none",
            save_strategy="no",
            bf16=False,
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
            **settings,
        )
    tok = tokenizer()
    # saved and passed by path: TRL builds the reference model (beta != 0) from the
    # policy's path, as it does for a hub model
    model_dir = output_dir.parent / "model"
    if not model_dir.exists():
        model(tok).save_pretrained(model_dir)
    prompts = [" ".join(WORDS[(3 * i) % 14 : (3 * i) % 14 + 3]) for i in range(16)]
    funcs: Any = (rewards or RewardLog()).functions(name in TWO_REWARDS)
    with _quiet():
        return (trainer_class or GRPOTrainer)(
            model=str(model_dir),
            reward_funcs=funcs,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tok,
        )


def train(
    name: str,
    workdir: Path,
    *,
    directory: Path | None = None,
    recorded: bool = True,
    trainer_class: Any = None,
    **record_kwargs: Any,
) -> Run:
    """Train configuration ``name`` for STEPS optimizer steps, recorded under
    ``directory`` (default ``workdir/run``) with ``record_kwargs`` unless ``recorded`` is
    False."""
    from grpo_cli.integrations.trl import record

    workdir.mkdir(parents=True, exist_ok=True)
    rewards = RewardLog()
    trainer = make_trainer(name, workdir / "out", rewards, trainer_class)
    run_dir = None
    if recorded:
        run_dir = directory if directory is not None else workdir / "run"
        trainer = record(trainer, run_dir, **record_kwargs)
    with _quiet():
        trainer.train()
    history = [dict(r) for r in trainer.state.log_history]
    return Run(name, run_dir, history, {**BASE, **CONFIGS[name]}, rewards.calls)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Transformers' deprecation FutureWarnings about gradient checkpointing (TRL 1.16
    calls the old names) are not this project's."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def step_records(history: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """log_history's per-step records by step (train()'s closing summary, which repeats
    the last step with train_runtime and train_loss, left out)."""
    return {int(r["step"]): r for r in history if "train_runtime" not in r and "loss" in r}


def without_timing(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in history]


@pytest.fixture(scope="session")
def trl_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Run]:
    """``trl_run(name, recorded=True)``: configuration ``name`` trained once per session
    (recorded, or not), its Run."""
    require_trl()
    cache: dict[tuple[str, bool], Run] = {}

    def get(name: str, recorded: bool = True) -> Run:
        key = (name, recorded)
        if key not in cache:
            workdir = tmp_path_factory.mktemp(f"trl-{name}-{'rec' if recorded else 'plain'}")
            cache[key] = train(name, workdir, recorded=recorded)
        return cache[key]

    return get
