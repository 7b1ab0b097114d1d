"""TRL's ``GRPOTrainer`` (TRL 1.16.0): presets, logged metrics.

Its loss (``GRPOTrainer._compute_loss``): advantages with the sample std (NaN-aware) plus
1e-4, ``loss_type`` ``dapo`` by default (token sums over the accumulated batch's tokens:
token-mean), β = 0, no log-ratio clamp, ``use_bias_correction_kl`` on (the per-token KL
times the ratio), GSPO with ``importance_sampling_level="sequence"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import CallInputs, CallRules, FileInputs, MetricInputs, Trainer

if TYPE_CHECKING:
    from .._settings import Settings

VERSION = "trl 1.16.0"

# Each preset: the Settings fields GRPOConfig's defaults set (README "Presets").
PRESETS = {
    # GRPOConfig defaults: sample std, eps 1e-4, loss_type "dapo" (token-mean), beta 0.0,
    # no clamps, use_bias_correction_kl=True.
    "trl": {
        "ddof": 1,
        "eps": 1e-4,
        "beta": 0.0,
        "agg": "token-mean",
        "kl_bias_correction": True,
    },
    # Dr. GRPO as TRL runs it (loss_type="dr_grpo", scale_rewards="none"): no std division,
    # Σ/(N·L) with L = max_completion_length (512 by default), no KL.
    "dr-grpo": {
        "scale": "none",
        "agg": "seq-mean-token-sum-norm",
        "max_len": 512,
        "beta": 0.0,
        "kl_bias_correction": True,
    },
    # GSPO as TRL runs it (importance_sampling_level="sequence"): sequence ratio, clip
    # 3e-4/4e-4, no KL, seq-mean-token-mean (loss_type "grpo"), clip metrics per sequence.
    "gspo": {
        "ddof": 1,
        "eps": 1e-4,
        "ratio_level": "sequence",
        "clip_eps": 3e-4,
        "clip_eps_high": 4e-4,
        "clip_unit": "sequences",
        "beta": 0.0,
        "kl_bias_correction": True,
    },
}

METRICS = (
    "loss",
    "entropy",
    "kl",
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
    "frac_reward_zero_std",
)


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """TRL 1.16.0 (``GRPOTrainer._compute_loss``), for a step of one loss call (a
    recorded step of several: :data:`CALLS`): ``loss`` is −J under the settings'
    aggregation (``dapo``'s ``num_items_in_batch`` is then the batch's tokens), ``entropy``
    the token mean of the logged entropy; ``kl`` is the token mean of the KL as the
    loss takes it (bias-corrected when ``use_bias_correction_kl``), logged only when
    β ≠ 0; ``clip_ratio/*`` count tokens, or sequences under GSPO; ``low_min`` and
    ``high_max`` are the extremes over answers of their clipped shares;
    ``frac_reward_zero_std`` the share of answers whose group std is zero."""
    s, acc, clip = m.settings, m.acc, m.clip
    out: dict[str, float | None] = {"loss": -acc.objective(s.agg)}
    if s.beta != 0.0:
        out["kl"] = acc.kl.token / max(acc.tokens, 1)
    if acc.entropy.n:
        out["entropy"] = acc.entropy.total / acc.entropy.n
    out["clip_ratio/low_mean"] = clip.low
    out["clip_ratio/low_min"] = acc.clip_shares.low_min
    out["clip_ratio/high_mean"] = clip.high
    out["clip_ratio/high_max"] = acc.clip_shares.high_max
    out["clip_ratio/region_mean"] = clip.region
    out["frac_reward_zero_std"] = None if m.groups is None else m.groups.frac_zero_std_answers
    return out


# GRPOConfig.loss_type -> the aggregation of the loss over one call's tokens (TRL 1.16.0
# ``_compute_loss``): grpo a mean over answers of their token means; bnpo and dapo a mean
# over tokens (dapo: over the generation batch's tokens, which for a whole step is its own);
# dr_grpo Σ/(N·max_completion_length); luspo a mean over answers of their token sums
AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "luspo": "seq-mean-token-sum",
}
SCALE = {"group": "group", "batch": "batch", "none": "none", True: "group", False: "none"}


def from_config(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """GRPOConfig's keys (TRL 1.16.0) as Settings: ``loss_type`` the aggregation,
    ``beta``, ``epsilon``/``epsilon_high`` the clip range, ``delta`` the dual clip,
    ``importance_sampling_level`` the ratio's level (a clipped sequence counts once in the
    clip metrics), ``scale_rewards``, ``use_bias_correction_kl``, ``max_completion_length``
    (dr_grpo's L). What it does not compute is said in the notes."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    loss = c.get("loss_type")
    if loss is not None:
        if loss not in AGGREGATION:
            notes.append(
                f"loss_type {loss!r} is not computed by this grpo-cli (it computes "
                f"{', '.join(AGGREGATION)}): the numbers follow the clipped surrogate"
            )
        else:
            out["agg"] = AGGREGATION[loss]
            if loss == "dr_grpo" and c.get("max_completion_length") is not None:
                out["max_len"] = int(c["max_completion_length"])
    for key, name in (("beta", "beta"), ("epsilon", "clip_eps"), ("epsilon_high", "clip_eps_high")):
        if isinstance(c.get(key), int | float) and not isinstance(c.get(key), bool):
            out[name] = float(c[key])
    if "delta" in c:
        out["dual_clip"] = None if c["delta"] is None else float(c["delta"])
    if c.get("importance_sampling_level") == "sequence":
        out["ratio_level"] = "sequence"
        out["clip_unit"] = "sequences"
    elif c.get("importance_sampling_level") == "token":
        out["ratio_level"] = "token"
    if c.get("scale_rewards") in SCALE:
        out["scale"] = SCALE[c["scale_rewards"]]
    if isinstance(c.get("use_bias_correction_kl"), bool):
        out["kl_bias_correction"] = c["use_bias_correction_kl"]
    if c.get("use_vllm") and c.get("vllm_importance_sampling_correction"):
        notes.append(
            "vllm_importance_sampling_correction multiplies TRL's per-token loss by the "
            "sampler's importance weights: not applied here (this grpo-cli does not compute it)"
        )
    if isinstance(c.get("top_entropy_quantile"), int | float) and c["top_entropy_quantile"] < 1:
        notes.append(
            f"top_entropy_quantile {c['top_entropy_quantile']}: TRL's policy term covers only "
            "the high-entropy tokens (the recorder's entropy_mask column); not applied here"
        )
    if c.get("off_policy_mask_threshold") is not None:
        notes.append("off_policy_mask_threshold masks off-policy sequences: not applied here")
    return out, notes


# ------------------------------------------------ a step of several loss calls, as logged
def call_metrics(s: Settings, c: CallInputs, config: Mapping[str, Any]) -> dict[str, float | None]:
    """What one ``_compute_loss`` call appends to TRL's metric lists (TRL 1.16.0), over
    every rank (sums and counts all-reduced, then divided): ``kl`` (the KL the loss takes,
    when β ≠ 0) and ``entropy`` token means, the clip ratios (token means; under GSPO
    shares of the call's answers, every answer counted, empty ones too), ``low_min`` and
    ``high_max`` (extremes over its answers with a valid token)."""
    del config
    acc = c.acc
    t = max(acc.tokens, 1)
    out: dict[str, float | None] = {}
    if s.beta != 0.0:
        out["kl"] = acc.kl.token / t
    out["entropy"] = acc.entropy.total / acc.entropy.n if acc.entropy.n else None
    units = acc.answers + c.empty if s.clip_unit == "sequences" else acc.tokens
    u = max(units, 1)
    out["clip_ratio/low_mean"] = acc.clip.low / u
    out["clip_ratio/high_mean"] = acc.clip.high / u
    out["clip_ratio/region_mean"] = acc.clip.region / u
    if acc.answers:
        out["clip_ratio/low_min"] = acc.clip_shares.low_min
        out["clip_ratio/high_max"] = acc.clip_shares.high_max
    return out


def file_loss(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> float | None:
    """One rank's loss of one call as ``_compute_loss`` returns it (TRL 1.16.0), from the
    per-token term (``policy − β·KL``, so the loss is its negative): ``grpo`` the mean over
    the call's answers (empty ones count 0) of their token means, ``bnpo`` the token mean,
    ``dr_grpo`` the sum over answers × ``max_completion_length``, ``luspo`` the mean over
    answers of their sums, each divided by the loss calls of the step; ``dapo`` the sum over
    ``num_items_in_batch`` / world size × calls / ``steps_per_generation``."""
    loss_type = config.get("loss_type", "dapo")
    k = int(f.info.get("micro_batches", 1)) or 1
    n = f.answers + f.empty
    if loss_type == "grpo":
        value = f.term_answer_means / max(n, 1) / k
    elif loss_type == "bnpo":
        value = f.term_sum / max(f.tokens, 1) / k
    elif loss_type == "dr_grpo":
        value = f.term_sum / (n * float(config.get("max_completion_length") or 1)) / k
    elif loss_type == "luspo":
        value = f.term_sum / max(n, 1) / k
    elif loss_type == "dapo":
        items = f.info.get("num_items_in_batch")
        if not isinstance(items, int | float):
            return None
        world = int(f.info.get("world_size", 1)) or 1
        spg = float(config.get("steps_per_generation") or k)
        value = f.term_sum / (max(items, 1) / world * k / spg)
    else:
        return None
    return -value


def generation_metrics(s: Settings, rows: Mapping[str, Any]) -> dict[str, float | None]:
    """What TRL logs once per generation batch (``_generate_and_score_completions``):
    ``reward`` (nan-mean), ``reward_std`` (sample std), ``frac_reward_zero_std`` (the share
    of answers whose group's sample std is 0, by ``torch.isclose``'s default tolerance)."""
    del s
    reward = np.asarray(rows["reward"], dtype=np.float64)
    if reward.size == 0:
        return {}
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(rows["group"]):
        groups.setdefault(g, []).append(i)
    zero = np.zeros(reward.shape[0], dtype=bool)
    for idx in groups.values():
        r = reward[idx]
        r = r[~np.isnan(r)]
        std = float(np.std(r, ddof=1)) if r.size > 1 else math.nan
        zero[idx] = abs(std) <= 1e-8  # isclose(std, 0): atol 1e-8; NaN is not close
    finite = reward[~np.isnan(reward)]
    return {
        "reward": float(np.mean(finite)) if finite.size else None,
        "reward_std": float(np.std(finite, ddof=1)) if finite.size > 1 else None,
        "frac_reward_zero_std": float(np.mean(zero)),
    }


def combine(
    calls: list[dict[str, float | None]],
    losses: list[list[float | None]],
    steps: int,
    generations: list[dict[str, float | None]],
) -> dict[str, float | None]:
    """The logged record (TRL's ``log``, transformers' ``Trainer``): each metric the mean
    of its calls' values (None and NaN left out), ``loss`` the sum over calls of the losses
    (mean over ranks) divided by the window's optimizer steps, the generation metrics the
    mean over the window's generations."""
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(k for c in calls for k in c):
        values = [v for c in calls if (v := c.get(name)) is not None and not math.isnan(v)]
        out[name] = sum(values) / len(values) if values else None
    per_call: list[float] = []
    for ranks in losses:
        if any(x is None for x in ranks):
            per_call = []
            break
        per_call.append(sum(x for x in ranks if x is not None) / max(len(ranks), 1))
    out["loss"] = sum(per_call) / steps if per_call else None
    for name in dict.fromkeys(k for g in generations for k in g):
        values = [v for g in generations if (v := g.get(name)) is not None]
        out[name] = sum(values) / len(values) if values else None
    return out


CALLS = CallRules(call_metrics, file_loss, generation_metrics, combine)


TRAINER = Trainer(
    name="trl",
    version=VERSION,
    presets=PRESETS,
    metric_names=METRICS,
    metrics=metrics,
    from_config=from_config,
    calls=CALLS,
)
