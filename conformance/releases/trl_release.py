"""One TRL release's own loss code on fixed rollouts: writes a fixture for tests/test_releases.py.

Runs inside that release's environment (``conformance/releases/run`` builds it: torch CPU,
the release, the transformers of its time). For every configuration below it calls the
installed release's ``GRPOTrainer`` loss method on the same padded tensors (float64), the
model call replaced by the log-probs and the trainer object holding only the attributes
the method reads, and records the loss and the metrics the method logged:

- 0.14.x: ``compute_loss`` did generation, rewards and advantages itself, so it runs whole
  on a stand-in model whose log-softmax gives exactly the rollouts' log-probs and a
  stand-in tokenizer (its advantages, KL and loss are its own code's);
- 0.15.0 on: ``compute_loss`` / ``_compute_loss`` on given advantages, the log-prob call
  replaced. Their advantages come from ``_generate_and_score_completions`` (which needs a
  model and reward functions): they are written here from that release's lines
  (``(r − mean) / (std + 1e-4)``, the branches of ``scale_rewards``), in float64, and
  checked end to end by the training runs (``trl_train.py``).

Usage: ``python trl_release.py OUT.json``. Nothing is downloaded; no model is loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import types
from collections import defaultdict
from collections.abc import Iterator
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Any

import numpy as np
import torch

G = 4
SEED = 20
PAD, EOS, WORD = 0, 1, 2


def v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(".")[:3])


def rollouts() -> dict[str, Any]:
    """Six contiguous groups of four, ragged lengths 1–30 (one answer of the full width, no
    EOS), binary and graded rewards, a zero-variance group, an answer whose ratio is e^1.5
    on every token (beyond clip and dual clip), one below 1 − ε, log-probs < 0."""
    rng = np.random.default_rng(SEED)
    B, L = 6 * G, 30
    reward = rng.choice([0.0, 0.25, 0.5, 1.0], size=B)
    reward[4:8] = 0.5  # the second group: all equal
    reward[8:12] = [1.0, 0.0, 0.5, 0.0]  # an answer at its group's mean: A = 0 exactly
    lengths = rng.integers(1, L, size=B)
    lengths[0], lengths[1] = 1, L
    mask = np.arange(L)[None, :] < lengths[:, None]
    logp = -(rng.exponential(1.0, size=(B, L)) + 0.01)
    old = np.minimum(logp + rng.normal(0.0, 0.3, size=(B, L)), -1e-3)
    ref = np.minimum(logp + rng.normal(0.0, 0.3, size=(B, L)), -1e-3)
    old[3] = logp[3] - 1.5  # ratio e^1.5 on every token
    old[9] = np.minimum(logp[9] + 0.4, -1e-3)  # ratio below 1 − ε
    for a in (logp, old, ref):
        a[~mask] = 0.0
    return {
        "group": [f"p{i // G}" for i in range(B)],
        "reward": reward.tolist(),
        "lengths": lengths.tolist(),
        "logp": [logp[i, : lengths[i]].tolist() for i in range(B)],
        "old_logp": [old[i, : lengths[i]].tolist() for i in range(B)],
        "ref_logp": [ref[i, : lengths[i]].tolist() for i in range(B)],
    }


def padded(data: dict[str, Any], name: str) -> torch.Tensor:
    lengths = data["lengths"]
    L = max(lengths)
    out = torch.zeros(len(lengths), L, dtype=torch.float64)
    for i, row in enumerate(data[name]):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return out


def mask_of(data: dict[str, Any]) -> torch.Tensor:
    lengths = torch.tensor(data["lengths"])
    return (torch.arange(max(data["lengths"]))[None, :] < lengths[:, None]).long()


def advantages(data: dict[str, Any], scale: str) -> torch.Tensor:
    """``_generate_and_score_completions`` (0.16–1.16; ``_prepare_inputs`` in 0.15):
    ``rewards.view(-1, G)`` mean and ``std`` (torch: sample std), ``(r − mean) / (std +
    1e-4)`` with ``scale`` group (the group std), batch (the std of every reward) or none."""
    r = torch.tensor(data["reward"], dtype=torch.float64)
    mean = r.view(-1, G).mean(dim=1).repeat_interleave(G)
    if scale == "none":
        return r - mean
    std = r.view(-1, G).std(dim=1).repeat_interleave(G) if scale == "group" else r.std()
    return (r - mean) / (std + 1e-4)


class Accelerator:
    num_processes = 1
    process_index = 0
    device = torch.device("cpu")
    sync_gradients = True
    is_main_process = True

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_for_metrics(self, x: Any) -> Any:
        return x

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x

    def unwrap_model(self, model: Any) -> Any:
        return model


# ------------------------------------------------------------------ 0.14: whole
class Logits:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class StandInModel:
    """A causal LM whose next-token distribution at completion position t of row b puts
    probability exp(logp[b, t]) on the token generated there (the rest spread evenly over
    the other two of a three-token vocabulary): TRL's log-softmax and gather give back
    ``logp``. ``generate`` returns the prompts followed by the fixed completions."""

    def __init__(self, completion_ids: torch.Tensor, logp: torch.Tensor) -> None:
        self.ids, self.logp = completion_ids, logp

    def generate(self, input_ids: torch.Tensor, **kw: Any) -> torch.Tensor:
        prompts = input_ids.repeat_interleave(G, dim=0)
        return torch.cat([prompts, self.ids], dim=1)

    def __call__(self, input_ids: torch.Tensor, num_logits_to_keep: int) -> Logits:
        B, L = self.ids.shape
        assert num_logits_to_keep == L + 1 and torch.equal(input_ids[:, -L:], self.ids)
        p = self.logp.exp()
        q = ((1.0 - p) / 2.0).unsqueeze(-1).expand(B, L, 3).clone()
        q.scatter_(2, self.ids.unsqueeze(-1), p.unsqueeze(-1))
        last = torch.full((B, 1, 3), 1.0 / 3.0, dtype=q.dtype)  # the dropped last logit
        return Logits(torch.cat([q.log(), last], dim=1))


class StandInTokenizer:
    eos_token_id, pad_token_id = EOS, PAD

    def __call__(self, texts: list[str], **kw: Any) -> dict[str, torch.Tensor]:
        n = len(texts)
        return {
            "input_ids": torch.full((n, 1), WORD, dtype=torch.long),
            "attention_mask": torch.ones(n, 1, dtype=torch.long),
        }

    def batch_decode(self, ids: torch.Tensor, **kw: Any) -> list[str]:
        return [" ".join(str(int(t)) for t in row) for row in ids]


def completion_ids(data: dict[str, Any]) -> torch.Tensor:
    """Words, then EOS as the answer's last token (an answer of the full width has none),
    then padding: TRL's EOS mask gives back the answer's length."""
    lengths = data["lengths"]
    L = max(lengths)
    ids = torch.full((len(lengths), L), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = WORD
        if n < L:
            ids[i, n - 1] = EOS
    return ids


def loss_0_14(data: dict[str, Any], beta: float) -> tuple[float, dict[str, float]]:
    """TRL 0.14 ``GRPOTrainer.compute_loss`` whole: generation (the stand-in model),
    rewards (a function returning the rollouts' rewards), advantages, KL, loss, metrics."""
    import trl.trainer.grpo_trainer as gt

    ids = completion_ids(data)
    model = StandInModel(ids, padded(data, "logp"))
    ref = StandInModel(ids, padded(data, "ref_logp"))
    rewards = data["reward"]

    def reward_fn(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
        assert len(completions) == len(rewards)
        return list(rewards)

    @contextlib.contextmanager
    def unwrapped(m: Any, accelerator: Any) -> Iterator[Any]:
        yield m

    trainer = gt.GRPOTrainer.__new__(gt.GRPOTrainer)
    attrs = {
        "accelerator": Accelerator(),
        "args": types.SimpleNamespace(
            use_vllm=False, device=torch.device("cpu"), past_index=-1, report_to=[]
        ),
        "is_deepspeed_enabled": False,
        "processing_class": StandInTokenizer(),
        "max_prompt_length": None,
        "generation_config": None,
        "ref_model": ref,
        "reward_funcs": [reward_fn],
        "reward_processing_classes": [None],
        "num_generations": G,
        "beta": beta,
        "_metrics": defaultdict(list),
    }
    for k, val in attrs.items():
        object.__setattr__(trainer, k, val)
    inputs = [{"prompt": f"p{i}"} for i in range(len(rewards) // G)]
    saved = gt.unwrap_model_for_generation
    gt.unwrap_model_for_generation = unwrapped
    try:
        loss = trainer.compute_loss(model, inputs)
    finally:
        gt.unwrap_model_for_generation = saved
    return float(loss), {k: float(val[-1]) for k, val in trainer._metrics.items()}


# --------------------------------------------------------- 0.15 on: given tensors
def loss_given(
    data: dict[str, Any],
    adv: torch.Tensor,
    *,
    beta: float,
    loss_type: str | None = None,
    eps: tuple[float, float] = (0.2, 0.2),
    level: str = "token",
    delta: float | None = None,
    bias_correction: bool = False,
    max_completion_length: int = 256,
) -> tuple[float, dict[str, float]]:
    """The installed release's ``compute_loss`` (which calls ``_compute_loss`` from 0.17.0)
    on the rollouts' log-probs, with ``num_iterations`` 2 so that the old log-probs are
    used (0.16–0.17; from 0.18 they are used whenever given)."""
    from trl import GRPOTrainer

    trl_v = v(pkg_version("trl"))
    logp, old, ref, m = (
        padded(data, "logp"),
        padded(data, "old_logp"),
        padded(data, "ref_logp"),
        mask_of(data),
    )
    B, L = logp.shape
    ref_model = object()

    def logps(model: Any, *a: Any, **kw: Any) -> Any:
        out = ref if model is ref_model else logp
        if trl_v < (0, 20, 0):
            return out
        if trl_v < (1, 7, 0):
            return out, torch.zeros_like(out)
        return out, torch.zeros_like(out), None

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    metrics: Any = (
        defaultdict(list)
        if trl_v < (0, 16, 0)
        else {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }
    )
    attrs: dict[str, Any] = {
        "model": types.SimpleNamespace(training=True),
        "ref_model": ref_model,
        "accelerator": Accelerator(),
        "args": types.SimpleNamespace(
            use_bias_correction_kl=bias_correction,
            delta=delta,
            steps_per_generation=1,
            vllm_importance_sampling_correction=False,
            report_to=[],
        ),
        "control": types.SimpleNamespace(should_evaluate=False),
        "beta": beta,
        "loss_type": loss_type,
        "epsilon_low": eps[0],
        "epsilon_high": eps[1],
        "num_iterations": 2,
        "importance_sampling_level": level,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "use_vllm": False,
        "vllm_importance_sampling_correction": False,
        "use_liger_loss": False,
        "use_liger_kernel": False,
        "tools": None,
        "_entropy_bonus_enabled": False,
        "aux_loss_enabled": False,
        "current_gradient_accumulation_steps": 1,
        "max_completion_length": max_completion_length,
        "_metrics": metrics,
        "_get_per_token_logps": logps,
        "_get_per_token_logps_and_entropies": logps,
    }
    for k, val in attrs.items():
        object.__setattr__(trainer, k, val)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, L, dtype=torch.long),
        "completion_mask": m,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": m.sum().double(),
    }
    loss = trainer.compute_loss(None, inputs)
    logged = metrics if trl_v < (0, 16, 0) else metrics["train"]
    return float(loss), {k: float(val[-1]) for k, val in logged.items()}


def cases(trl_v: tuple[int, ...]) -> list[dict[str, Any]]:
    """What to call for this release: grpo-cli flags, the loss method's settings, the
    advantages' scale. Flags start with the release's preset (filled in by main)."""
    out: list[dict[str, Any]] = []
    default_beta = 0.04 if trl_v < (0, 19, 0) else 0.0
    other_beta = 0.0 if default_beta else 0.04
    if trl_v < (0, 15, 0):
        return [
            {"flags": "", "whole": True, "beta": 0.04},
            {"flags": "--beta 0", "whole": True, "beta": 0.0},
        ]
    # the release's default advantage scale, in grpo-cli's words
    scale = "group"
    if (0, 22, 0) <= trl_v < (0, 22, 2):
        scale = "none"  # scale_rewards="group" divides by nothing there
    loss_type = None
    if trl_v >= (0, 17, 0):
        loss_type = "bnpo" if trl_v < (0, 22, 0) else "dapo"
    bias = trl_v >= (1, 10, 0)
    max_len = 512 if trl_v >= (1, 10, 0) else 256
    base = {"scale": scale, "loss_type": loss_type, "bias_correction": bias}
    out.append({"flags": "", "beta": default_beta, **base})
    flag = "--beta 0.04" if other_beta else "--beta 0"
    out.append({"flags": flag, "beta": other_beta, **base})
    if trl_v < (0, 16, 0):
        return out
    out.append(
        {"flags": "--beta 0.04 --clip-eps-high 0.28", "beta": 0.04, "eps": (0.2, 0.28), **base}
    )
    if trl_v >= (0, 17, 0):
        grpo = {**base, "loss_type": "grpo"}
        out.append({"flags": "--beta 0.04 --agg seq-mean-token-mean", "beta": 0.04, **grpo})
        dr = {**base, "loss_type": "dr_grpo", "max_completion_length": max_len}
        out.append(
            {
                "flags": f"--beta 0.04 --agg seq-mean-token-sum-norm --max-len {max_len}",
                "beta": 0.04,
                **dr,
            }
        )
        if trl_v >= (0, 22, 0):
            # scale_rewards "none" and "batch": 0.22.0-0.22.1 divide both by the group std
            swapped = trl_v < (0, 22, 2)
            for theirs, ours in (("none", "none"), ("batch", "batch")):
                ours = "group" if swapped else ours
                out.append(
                    {
                        "flags": f"--beta 0.04 --agg seq-mean-token-mean --scale {ours}",
                        "beta": 0.04,
                        **grpo,
                        "scale": ours,
                        "scale_rewards": theirs,
                    }
                )
    if trl_v >= (0, 18, 0):
        out.append({"flags": "--beta 0.04 --dual-clip 3", "beta": 0.04, "delta": 3.0, **base})
    if trl_v >= (0, 20, 0):
        out.append(
            {
                "flags": "--ratio-level sequence --clip-eps 3e-4 --clip-eps-high 4e-4 "
                "--clip-unit sequences --agg seq-mean-token-mean --beta 0.04",
                "beta": 0.04,
                **base,
                "loss_type": "grpo",
                "level": "sequence",
                "eps": (3e-4, 4e-4),
            }
        )
    if (0, 26, 0) <= trl_v < (1, 10, 0):
        out.append(
            {"flags": "--beta 0.04 --kl-bias-correction", "beta": 0.04, **base, "bias": True}
        )
    if trl_v >= (1, 10, 0):
        out.append(
            {"flags": "--beta 0.04 --no-kl-bias-correction", "beta": 0.04, **base, "bias": False}
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", required=True, help="the grpo-cli preset, e.g. trl@0.19.0")
    opts = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    trl_v = v(pkg_version("trl"))
    data = rollouts()
    if trl_v < (0, 16, 0):  # no old log-probs before 0.16: a run of these has old = logp
        data["old_logp"] = data["logp"]
    rows = []
    for c in cases(trl_v):
        flags = f"--preset {opts.preset} {c['flags']}".strip()
        row: dict[str, Any] = {"flags": flags, "config": {k: c[k] for k in c if k != "flags"}}
        if c.get("whole"):
            loss, logged = loss_0_14(data, c["beta"])
        else:
            bias = c.get("bias", c["bias_correction"])
            adv = advantages(data, c["scale"])
            row["advantages"] = adv.tolist()
            loss, logged = loss_given(
                data,
                adv,
                beta=c["beta"],
                loss_type=c["loss_type"],
                eps=c.get("eps", (0.2, 0.2)),
                level=c.get("level", "token"),
                delta=c.get("delta"),
                bias_correction=bias,
                max_completion_length=c.get("max_completion_length", 256),
            )
        # frac_reward_zero_std is logged where the advantages are made, not by the loss
        row.update(loss=loss, metrics=logged, logged_elsewhere=["frac_reward_zero_std"])
        rows.append(row)
    doc = {
        "trainer": "trl",
        "version": pkg_version("trl"),
        "versions": {p: pkg_version(p) for p in ("torch", "transformers", "accelerate")},
        "preset": opts.preset,
        "rollouts": data,
        "cases": rows,
    }
    opts.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"trl {doc['version']}: {len(rows)} cases -> {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
