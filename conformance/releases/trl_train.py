"""A real TRL training run of one release on CPU: writes its log_history and each step's
tensors as a fixture for tests/test_releases.py.

A tiny randomly initialised Qwen2 (2 layers, hidden 64) built from a config, a word-level
tokenizer trained in memory, 16 prompts, one reward function, float32, 3 optimizer steps,
β = 0.04 and (from 0.16) ``num_iterations=2`` so that the second step's ratio differs
from 1; the release's other ``GRPOConfig`` defaults. Nothing is downloaded. As the
trainer trains, the inputs of every loss call are captured (the completion mask, the
advantages TRL computed, the old and reference log-probs) with the policy's log-probs
of that call, and the rewards from the reward function; the fixture holds them as
rollouts, with what ``trainer.state.log_history`` logged for that step.

Only TRL's own shuffle of a generation batch is turned off (``shuffle_tensor_dict`` /
``shuffle_sequence_dict``): one loss call takes the whole batch, so its metrics do not
depend on the order, and without it the rows stay in the order the rewards were given.

Usage: ``python trl_train.py OUT.json --preset trl@X``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import warnings
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Any

import torch

WORDS = "a b c d e f g h i j k l m n o p".split()
G = 4
STEPS = 3


def v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(".")[:3])


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(
        [" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"])
    )
    # a causal LM's tokenizer gives no token_type_ids (TRL 0.14 passes all it gives to
    # generate, which refuses them)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        model_input_names=["input_ids", "attention_mask"],
    )


def model(tok: Any) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
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


def ragged(x: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [row[m.bool()].double().tolist() for row, m in zip(x, mask, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", required=True)
    opts = parser.parse_args()
    warnings.filterwarnings("ignore")
    import trl.trainer.grpo_trainer as gt
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tv = v(pkg_version("trl"))
    for name in ("shuffle_tensor_dict", "shuffle_sequence_dict"):
        if hasattr(gt, name):
            setattr(gt, name, lambda d: d)
    rewards_log: list[list[float]] = []

    def reward_short(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
        """1 for a completion of fewer than 4 words, a quarter per vowel word besides."""
        out = [
            float(len(c.split()) < 4) + 0.25 * min(2, sum(w in "aeio" for w in c.split()))
            for c in completions
        ]
        rewards_log.append(out)
        return out

    settings: dict[str, Any] = {
        "num_generations": G,
        "max_completion_length": 8,
        "learning_rate": 0.05,
        "beta": 0.04,
        "logging_steps": 1,
        "gradient_accumulation_steps": 1,  # 0.14's default is 8: one loss call a step
        "per_device_train_batch_size": 2 if tv < (0, 15, 0) else 8,
    }
    if tv >= (0, 16, 0):
        settings["num_iterations"] = 2
    work = Path(tempfile.mkdtemp())
    tok = tokenizer()
    model(tok).save_pretrained(work / "model")
    args = GRPOConfig(
        output_dir=str(work / "out"),
        max_steps=STEPS,
        report_to="none",
        save_strategy="no",
        bf16=False,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        **settings,
    )
    prompts = [" ".join(WORDS[(3 * i) % 14 : (3 * i) % 14 + 3]) for i in range(16)]
    trainer = GRPOTrainer(
        model=str(work / "model"),
        reward_funcs=[reward_short],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tok,
    )
    calls: list[dict[str, Any]] = []
    if tv < (0, 15, 0):
        capture_0_14(trainer, calls, rewards_log)
    else:
        capture(trainer, calls, rewards_log, tv)
    trainer.train()
    history = [r for r in trainer.state.log_history if "train_runtime" not in r]
    assert len(calls) == STEPS == len(history), (len(calls), len(history))
    steps = [{"rollouts": c, "logged": h} for c, h in zip(calls, history, strict=True)]
    flags = f"--preset {opts.preset}" + (" --beta 0.04" if tv >= (0, 19, 0) else "")
    tf = pkg_version("transformers")
    doc = {
        "trainer": "trl",
        "version": pkg_version("trl"),
        "versions": {p: pkg_version(p) for p in ("torch", "transformers", "accelerate")},
        "preset": opts.preset,
        "config": "beta0.04" + ("-iter2" if tv >= (0, 16, 0) else ""),
        "settings": settings,
        "flags": flags,
        # transformers 4.x Trainer logs round(loss, 4)
        "loss_decimals": 4 if v(tf)[0] < 5 else None,
        "steps": steps,
    }
    opts.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"trl {doc['version']}: {len(steps)} training steps -> {opts.out}")
    return 0


def _rows(
    rewards: list[float], mask: torch.Tensor, logp: torch.Tensor, old: Any, ref: Any
) -> dict[str, Any]:
    n = len(rewards)
    old = logp if old is None else old
    return {
        "group": [f"p{i // G}" for i in range(n)],
        "reward": rewards,
        "lengths": [int(x) for x in mask.sum(1)],
        "logp": ragged(logp, mask),
        "old_logp": ragged(old, mask),
        "ref_logp": ragged(ref, mask),
    }


def capture(trainer: Any, calls: list[dict[str, Any]], rewards: list[list[float]], tv: Any) -> None:
    """Wrap the loss method and the log-prob method of this trainer object: each loss call
    records its inputs and the policy's log-probs (the first log-prob call inside it that
    is not the reference model's)."""
    name = "_compute_loss" if tv >= (0, 17, 0) else "compute_loss"
    loss_fn = getattr(trainer, name)
    lp_name = "_get_per_token_logps_and_entropies" if tv >= (0, 20, 0) else "_get_per_token_logps"
    lp_fn = getattr(trainer, lp_name)
    state: dict[str, Any] = {"inside": False, "logp": None, "ref": None}

    def logps(model: Any, *a: Any, **k: Any) -> Any:
        out = lp_fn(model, *a, **k)
        if state["inside"]:
            first = out[0] if isinstance(out, tuple) else out
            key = "ref" if model is getattr(trainer, "ref_model", None) else "logp"
            if state[key] is None:
                state[key] = first.detach().clone()
        return out

    def loss(model: Any, inputs: Any, *a: Any, **k: Any) -> Any:
        state.update(inside=True, logp=None, ref=None)
        try:
            out = loss_fn(model, inputs, *a, **k)
        finally:
            state["inside"] = False
        mask = inputs["completion_mask"]
        ref = inputs.get("ref_per_token_logps")
        ref = state["ref"] if ref is None else ref
        rows = _rows(rewards[-1], mask, state["logp"], inputs.get("old_per_token_logps"), ref)
        rows["advantage_trl"] = inputs["advantages"].double().tolist()
        calls.append(rows)
        return out

    object.__setattr__(trainer, lp_name, logps)
    object.__setattr__(trainer, name, loss)


def capture_0_14(trainer: Any, calls: list[dict[str, Any]], rewards: list[list[float]]) -> None:
    """0.14 computes everything in ``compute_loss``: forward hooks on the policy and the
    reference model keep each call's input ids and logits, from which the log-probs are
    taken as its ``get_per_token_logps`` takes them (log-softmax of each row, gathered at
    the completion tokens); the mask by its EOS rule."""
    seen: dict[str, Any] = {}

    def hook(key: str) -> Any:
        def fn(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            seen[key] = (args[0] if args else kwargs["input_ids"], output.logits.detach())

        return fn

    trainer.model.register_forward_hook(hook("logp"), with_kwargs=True)
    trainer.ref_model.register_forward_hook(hook("ref"), with_kwargs=True)
    loss_fn = trainer.compute_loss
    eos = trainer.processing_class.eos_token_id

    def per_token(ids: torch.Tensor, logits: torch.Tensor, k: int) -> torch.Tensor:
        logits = logits[:, :-1, :]
        rows = []
        for lrow, irow in zip(logits, ids[:, -k:], strict=True):
            rows.append(torch.gather(lrow.log_softmax(dim=-1), 1, irow.unsqueeze(1)).squeeze(1))
        return torch.stack(rows)

    def loss(model: Any, inputs: Any, *a: Any, **k: Any) -> Any:
        seen.clear()
        out = loss_fn(model, inputs, *a, **k)
        ids, logits = seen["logp"]
        k_ = logits.shape[1] - 1
        comp = ids[:, -k_:]
        is_eos = comp == eos
        eos_idx = torch.full((comp.shape[0],), comp.shape[1], dtype=torch.long)
        eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
        mask = (torch.arange(comp.shape[1]).expand(comp.shape[0], -1) <= eos_idx[:, None]).int()
        logp = per_token(ids, logits, k_)
        ref_ids, ref_logits = seen["ref"]
        ref = per_token(ref_ids, ref_logits, k_)
        calls.append(_rows(rewards[-1], mask, logp, None, ref))
        return out

    object.__setattr__(trainer, "compute_loss", loss)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
