"""TRL's ``GRPOTrainer``, release by release from 0.14.0 to 1.16.0: presets, logged metrics.

Each :class:`~grpo_cli.trainers.base.Release` below is a change point found by diffing
``trl/trainer/grpo_trainer.py`` and ``grpo_config.py`` of every release wheel from 0.14.0
to 1.16.0 (defaults of ``GRPOConfig``; ``compute_loss`` / ``_compute_loss``; the advantage
lines of ``_generate_and_score_completions`` / ``_prepare_inputs``; the metric lines), and
checked against that release's own code by ``conformance/releases``.

Its newest loss (1.10.0 to 1.16.0, ``GRPOTrainer._compute_loss``): advantages with the
sample std (NaN-aware) plus 1e-4, ``loss_type`` ``dapo`` by default (token sums over the
accumulated batch's tokens: token-mean), β = 0, no log-ratio clamp,
``use_bias_correction_kl`` on (the per-token KL times the ratio), GSPO with
``importance_sampling_level="sequence"``.

Every release's metrics are the values one process logs (TRL gathers per-process values:
on several processes ``clip_ratio/low_min`` up to 1.8.0 is a minimum over processes of
each one's share, which one batch cannot give).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import (
    CallInputs,
    CallRules,
    FileInputs,
    MetricInputs,
    Release,
    Trainer,
    parse_version,
    with_loss_metrics,
)
from .config import Key, boolean, checked, choice, integer, number, text

if TYPE_CHECKING:
    from ..settings import Settings

CLIP_METRICS = (
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
)
METRICS = ("kl", *CLIP_METRICS, "frac_reward_zero_std")
# 1.9.0 on, with the loss and the entropy every release logs recomputed too
METRICS_1_9 = ("loss", "entropy", *METRICS)


def logged_loss_decimals(transformers_version: str | None) -> int | None:
    """The decimals TRL's logged ``loss`` is rounded to: transformers 4.x's
    ``Trainer._maybe_log_save_evaluate`` logs ``round(tr_loss / steps, 4)`` (read in 4.48.3
    and 4.57.3), 5.x the value itself (5.24.0); None when not rounded or unknown.

    Example:
        >>> logged_loss_decimals("4.57.3"), logged_loss_decimals("5.24.0")
        (4, None)
    """
    if transformers_version is None:
        return None
    try:
        major = parse_version(transformers_version)[0]
    except ValueError:
        return None
    return 4 if major < 5 else None


# ----------------------------------------------------------------- metric pieces
def _kl_token_mean(m: MetricInputs) -> float:
    """The token mean of the KL as the loss takes it (bias-corrected when asked)."""
    return m.acc.kl.token / max(m.acc.tokens, 1)


def _has_reference(m: MetricInputs) -> bool:
    kv = m.acc.kl_values
    return kv.n + kv.n_inf > 0


def _frac_zero_std(m: MetricInputs, *, batch_std: bool) -> float | None:
    """``frac_reward_zero_std``: the share of answers whose std is zero (``isclose(std,
    0)``), the std being the group's, or with ``batch_std`` the whole batch's (TRL's
    ``scale_rewards="batch"``; and "group" in 0.22.0–0.22.1): then 1 when every reward of
    the batch is equal, else 0. TRL's test is ``isclose(std, 0)`` (atol 1e-8, the sample
    std): with every group constant it is decided from the rewards' range d = max − min
    over n answers, which bounds that std: d/√(2(n−1)) ≤ std ≤ (d/2)·√(n/(n−1)); in the
    gap between the bounds the std itself would be needed (None)."""
    g = m.groups
    if g is None:
        return None
    if not batch_std or g.groups == 1:
        return g.frac_zero_std_answers
    if g.zero_variance_groups < g.groups:
        return 0.0
    r = m.reward
    if r is None or r.min is None or r.max is None or not r.count:
        return None
    d, n = r.max - r.min, r.count
    if d == 0 or n < 2:
        return 1.0
    if d / math.sqrt(2 * (n - 1)) > ATOL_ZERO_STD:
        return 0.0
    return 1.0 if d / 2 * math.sqrt(n / (n - 1)) <= ATOL_ZERO_STD else None


ATOL_ZERO_STD = 1e-8  # torch.isclose(std, 0)'s default atol


def _clip_means_per_process(m: MetricInputs) -> dict[str, float | None]:
    """0.17.0–1.8.0: each process's share of clipped tokens (of answers under GSPO), then
    the mean, min and max over processes: on one process min = max = mean."""
    c = m.clip
    return {
        "clip_ratio/low_mean": c.low,
        "clip_ratio/low_min": c.low,
        "clip_ratio/high_mean": c.high,
        "clip_ratio/high_max": c.high,
        "clip_ratio/region_mean": c.region,
    }


def _clip_extremes_over_answers(m: MetricInputs) -> dict[str, float | None]:
    """1.9.0 on: the means are global token (or answer) means; ``low_min`` and
    ``high_max`` the extremes over answers of each answer's share."""
    c, shares = m.clip, m.acc.clip_shares
    return {
        "clip_ratio/low_mean": c.low,
        "clip_ratio/low_min": shares.low_min,
        "clip_ratio/high_mean": c.high,
        "clip_ratio/high_max": shares.high_max,
        "clip_ratio/region_mean": c.region,
    }


# ---------------------------------------------------------- metrics, by release
def metrics_0_14(m: MetricInputs) -> dict[str, float | None]:
    """TRL 0.14.0–0.15.2 (``compute_loss``): ``kl`` is the mean over answers of each
    answer's token-mean k3 of ``logp`` against ``ref_logp``, logged whatever β (None
    without ``ref_logp``); no clip metric (the ratio is always 1)."""
    kl = m.acc.kl.answer_means / max(m.acc.answers, 1) if _has_reference(m) else None
    return {"kl": kl}


def metrics_0_16(m: MetricInputs) -> dict[str, float | None]:
    """TRL 0.16.0–0.16.1 (``compute_loss``): ``kl`` the token mean of k3 (β ≠ 0 only);
    ``clip_ratio`` the share of tokens where ``ρ·A < clip(ρ)·A`` (``is_clipped =
    per_token_loss1 < per_token_loss2``) — A > 0 with ρ < 1−ε_low, or A < 0 with ρ >
    1+ε_high: the tokens the clip does *not* touch although ρ is outside the range, over
    the valid tokens (the fold's ``unclipped_min`` part, folded for this release only)."""
    out: dict[str, float | None] = {}
    if m.settings.beta != 0.0:
        out["kl"] = _kl_token_mean(m)
    out["clip_ratio"] = m.acc.unclipped_min.n / max(m.acc.tokens, 1)
    return out


MISSING_ENTROPY = {
    "entropy": "the per-token entropy TRL logs: an entropy column (a recorded run has it)"
}


MISSING_BATCH_STD = {
    "frac_reward_zero_std": (
        "TRL grpo_trainer.py _generate_and_score_completions with the batch std "
        "(scale_rewards='batch'; 'group' in 0.22.0-0.22.1): is_std_zero = isclose(std of "
        "every reward, 0), the same for every answer. When every group is constant and "
        "the rewards' range d leaves d/sqrt(2(n-1)) <= 1e-8 < (d/2)sqrt(n/(n-1)), that std"
    )
}


def metrics_0_17(m: MetricInputs) -> dict[str, float | None]:
    """TRL 0.17.0 (``_compute_loss``): ``kl`` the token mean (β ≠ 0 only), ``clip_ratio/*``
    per process (:func:`_clip_means_per_process`); no ``frac_reward_zero_std`` yet."""
    out: dict[str, float | None] = {}
    if m.settings.beta != 0.0:
        out["kl"] = _kl_token_mean(m)
    out.update(_clip_means_per_process(m))
    return out


def metrics_0_18(m: MetricInputs) -> dict[str, float | None]:
    """TRL 0.18.0–0.21.0 and 0.22.2–1.8.0: as 0.17.0, and ``frac_reward_zero_std`` (the
    group std's zero share; the batch std's with ``scale_rewards="batch"``)."""
    out = metrics_0_17(m)
    out["frac_reward_zero_std"] = _frac_zero_std(m, batch_std=m.settings.scale == "batch")
    return out


def metrics_0_22_0(m: MetricInputs) -> dict[str, float | None]:
    """TRL 0.22.0–0.22.1: ``scale_rewards`` "group" (the default) takes the *batch* std for
    ``frac_reward_zero_std`` and divides by nothing (grpo-cli ``--scale none``); "batch"
    and "none" take the group std (grpo-cli ``--scale group``)."""
    out = metrics_0_17(m)
    out["frac_reward_zero_std"] = _frac_zero_std(m, batch_std=m.settings.scale == "none")
    return out


def metrics_1_9(m: MetricInputs) -> dict[str, float | None]:
    """TRL 1.9.0–1.16.0 (``_compute_loss``): ``loss`` −J under the settings' aggregation
    as one loss call returns it (``dapo``'s ``num_items_in_batch`` is then the batch's
    tokens; a recorded step of several calls: :data:`CALLS`), ``entropy`` the token mean
    of the logged entropy, ``kl`` the token mean of the KL as the loss
    takes it (bias-corrected when ``use_bias_correction_kl``), β ≠ 0 only; ``clip_ratio/*``
    count tokens, or sequences under GSPO, ``low_min`` and ``high_max`` the extremes over
    answers of their clipped shares; ``frac_reward_zero_std`` the share of answers whose
    group std is zero (the batch std's with ``scale_rewards="batch"``)."""
    s, acc = m.settings, m.acc
    # one loss call's loss (a recorded step of several: CALLS) and the entropy's token mean
    out: dict[str, float | None] = {"loss": -acc.objective(s.agg)}
    out["entropy"] = acc.entropy.total / acc.entropy.n if acc.entropy.n else None
    if s.beta != 0.0:
        out["kl"] = _kl_token_mean(m)
    out.update(_clip_extremes_over_answers(m))
    out["frac_reward_zero_std"] = _frac_zero_std(m, batch_std=s.scale == "batch")
    # cispo, sapo, vespo log their own clip metric (or none) instead of clip_ratio/*
    return with_loss_metrics(out, m, CLIP_METRICS)


# ------------------------------------------------------------------- releases
# Every release's preset starts from these (GRPOConfig defaults that never changed: sample
# std, + 1e-4, epsilon 0.2 where it exists, k3, no clamps).
_BASE = {"ddof": 1, "eps": 1e-4}
_F = "trl/trainer/grpo_trainer.py"
_C = "trl/trainer/grpo_config.py"
_NO_VLLM_IS = (
    "the vLLM importance-sampling correction (use_vllm with "
    "vllm_importance_sampling_correction, on by default since 0.23.0) is not part of the "
    "preset: a recorded run's config turns it on, --correction trl-vllm applies it by hand "
    "(1.16.0's sequence_mask with clip_max 3.0 by default; 0.23–0.25's token-level cap 2.0: "
    "--correction-param vllm_is_mode=token_truncate --correction-param vllm_is_clip_max=2)"
)

RELEASES = (
    Release(
        first="0.14.0",
        last="0.15.2",
        checked="0.14.0",
        preset={**_BASE, "beta": 0.04, "agg": "seq-mean-token-mean"},
        metrics=metrics_0_14,
        metric_names=("kl",),
        changes=(
            f"{_C}: GRPOConfig beta 0.04, no epsilon, no loss_type, temperature 0.9",
            f"{_F}: compute_loss: per_token_loss = exp(logp − logp.detach())·A − β·k3, the "
            "ratio always 1 (no clipping), per answer token mean, then mean over answers",
            f"{_F}: compute_loss: advantages (r − mean) / (std + 1e-4), torch std (sample)",
            f"{_F}: compute_loss: kl = mean over answers of each answer's token-mean k3, "
            "logged whatever beta",
            f"{_F}: get_per_token_logps: log-softmax of the raw logits (no temperature)",
        ),
        notes=(
            "the ratio is exp(logp − logp.detach()) = 1: the loss equals grpo-cli's when "
            "old_logp equals logp (these releases compute no old log-probs); with another "
            "old_logp grpo-cli applies a ratio TRL did not",
            "0.15.0 moved generation into _prepare_inputs: the loss and its metric are unchanged",
        ),
    ),
    Release(
        first="0.16.0",
        last="0.16.1",
        checked="0.16.1",
        preset={**_BASE, "beta": 0.04, "agg": "token-mean"},
        metrics=metrics_0_16,
        metric_names=("kl", "clip_ratio"),
        folds=("unclipped_min",),
        changes=(
            f"{_C}: epsilon 0.2 (epsilon_high None), num_iterations 1, scale_rewards True",
            f"{_F}: compute_loss: clipped surrogate min(ρA, clip(ρ, 1−ε, 1+ε_high)A), "
            "old log-probs = logp.detach() when num_iterations == 1",
            f"{_F}: compute_loss: loss = Σ (per-token loss · mask) / Σ mask over the local "
            "batch (token-mean)",
            f"{_F}: compute_loss: kl only when beta != 0, its token mean; clip_ratio = "
            "share of tokens with per_token_loss1 < per_token_loss2",
            f"{_F}: _get_per_token_logps: logits divided by the sampling temperature",
        ),
    ),
    Release(
        first="0.17.0",
        last="0.17.0",
        checked="0.17.0",
        preset={**_BASE, "beta": 0.04, "agg": "token-mean"},
        metrics=metrics_0_17,
        metric_names=("kl", *CLIP_METRICS),
        changes=(
            f"{_C}: loss_type appears, default 'bnpo' (token-mean, the same formula as 0.16)",
            f"{_F}: _compute_loss: 'grpo' (per answer, clamp(min=1)), 'dr_grpo' (Σ / (B · "
            "max_completion_length))",
            f"{_F}: _compute_loss: clip_ratio/low_mean, low_min, high_mean, high_max, "
            "region_mean: ρ < 1−ε_low and A < 0, ρ > 1+ε_high and A > 0; min and max are "
            "nanmin/nanmax over the processes' shares",
        ),
    ),
    Release(
        first="0.18.0",
        last="0.18.2",
        checked="0.18.2",
        preset={**_BASE, "beta": 0.04, "agg": "token-mean"},
        metrics=metrics_0_18,
        metric_names=METRICS,
        changes=(
            f"{_C}: temperature 0.9 → 1.0, top_k 50 → None; delta (two-sided clipping)",
            f"{_F}: _generate_and_score_completions: frac_reward_zero_std = share of "
            "answers with isclose(group std, 0)",
            f"{_F}: _compute_loss: old log-probs None when num_iterations == 1 and "
            "steps_per_generation <= gradient_accumulation_steps (then logp.detach())",
        ),
    ),
    Release(
        first="0.19.0",
        last="0.21.0",
        checked="0.19.1",
        preset={**_BASE, "beta": 0.0, "agg": "token-mean"},
        metrics=metrics_0_18,
        metric_names=METRICS,
        changes=(
            f"{_C}: beta 0.04 → 0.0",
            f"{_F}: _compute_loss (0.20.0): importance_sampling_level 'sequence' (GSPO: clip "
            "metrics per answer), top_entropy_quantile; token-level values unchanged",
        ),
    ),
    Release(
        first="0.22.0",
        last="0.22.1",
        checked="0.22.1",
        preset={**_BASE, "beta": 0.0, "agg": "token-mean", "scale": "none"},
        metrics=metrics_0_22_0,
        metric_names=METRICS,
        missing=MISSING_BATCH_STD,
        changes=(
            f"{_C}: loss_type 'bnpo' → 'dapo' (Σ / num_items_in_batch per process: "
            "token-mean over the generation batch), scale_rewards True → 'group'",
            f"{_F}: _generate_and_score_completions: 'group' takes the batch std "
            "(rewards.std()) and divides by nothing; 'batch' and 'none' take the group std "
            "and divide by it (the branches are swapped; fixed in 0.22.2)",
            f"{_F}: _compute_loss: grpo, bnpo, dr_grpo divided by "
            "current_gradient_accumulation_steps",
        ),
        notes=(
            "TRL's scale_rewards maps onto --scale as: 'group' → none, 'batch' → group, "
            "'none' → group",
        ),
    ),
    Release(
        first="0.22.2",
        last="0.25.1",
        checked="0.22.2",
        preset={**_BASE, "beta": 0.0, "agg": "token-mean"},
        metrics=metrics_0_18,
        metric_names=METRICS,
        missing=MISSING_BATCH_STD,
        changes=(
            f"{_F}: _generate_and_score_completions: scale_rewards 'group' divides by the "
            "group std, 'batch' by the batch std, 'none' by nothing",
            f"{_F}: _compute_loss (0.23.0): with use_vllm, per_token_loss times the "
            "token-level importance ratio, capped at vllm_importance_sampling_cap 2.0",
        ),
        notes=(_NO_VLLM_IS,),
    ),
    Release(
        first="0.26.0",
        last="1.8.0",
        checked="0.26.2",
        preset={**_BASE, "beta": 0.0, "agg": "token-mean"},
        metrics=metrics_0_18,
        metric_names=METRICS,
        missing=MISSING_BATCH_STD,
        changes=(
            f"{_C}: use_bias_correction_kl (False), vllm_importance_sampling_mode "
            "'sequence_mask', cap 2.0 → 3.0; loss types cispo, sapo",
            f"{_F}: _compute_loss: the KL computed after the ratio (times it when "
            "use_bias_correction_kl)",
            f"{_F}: _generate_and_score_completions (0.27.0): reward_std = std of every "
            "reward (before: the mean of the group stds; grpo-cli does not report it)",
        ),
        notes=(
            _NO_VLLM_IS,
            "1.6.0: NaN-aware group mean and std (nanmean, nanstd, nan_to_num): the same "
            "for finite rewards",
        ),
    ),
    Release(
        first="1.9.0",
        last="1.9.2",
        checked="1.9.2",
        preset={**_BASE, "beta": 0.0, "agg": "token-mean"},
        metrics=metrics_1_9,
        metric_names=METRICS_1_9,
        missing={**MISSING_BATCH_STD, **MISSING_ENTROPY},
        changes=(
            f"{_F}: _compute_loss: clip_ratio/low_min and high_max are nanmin/nanmax over "
            "the answers' shares (masked_seq_mean); kl and the clip means are global "
            "token means (accelerator.reduce of sums and counts)",
            f"{_F}: _compute_loss (1.9.1): dapo's normaliser num_items_in_batch scaled by "
            "gradient_accumulation_steps / steps_per_generation in training",
        ),
        notes=(
            _NO_VLLM_IS,
            "1.9.1's dapo normaliser equals grpo-cli's token count when "
            "steps_per_generation equals gradient_accumulation_steps (the default)",
        ),
    ),
    Release(
        first="1.10.0",
        last="1.16.0",
        checked="1.16.0",
        preset={**_BASE, "beta": 0.0, "agg": "token-mean", "kl_bias_correction": True},
        metrics=metrics_1_9,
        metric_names=METRICS_1_9,
        missing={**MISSING_BATCH_STD, **MISSING_ENTROPY},
        changes=(f"{_C}: use_bias_correction_kl False → True, max_completion_length 256 → 512",),
        notes=(_NO_VLLM_IS,),
    ),
)

# Each preset: the Settings fields GRPOConfig's defaults set (README "Presets"). "trl" is
# the newest release's; "trl@X" (grpo_cli.settings) any release's.
PRESETS = {
    # GRPOConfig defaults: sample std, eps 1e-4, loss_type "dapo" (token-mean), beta 0.0,
    # no clamps, use_bias_correction_kl=True.
    "trl": dict(RELEASES[-1].preset),
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

# GRPOConfig.loss_type -> the aggregation of the loss over one call's tokens (TRL 1.16.0
# ``_compute_loss``): grpo and sapo a mean over answers of their token means; bnpo, dapo,
# cispo and vespo a mean over tokens (dapo: over the generation batch's tokens, which for a
# whole step is its own); dr_grpo Σ/(N·max_completion_length); luspo a mean over answers of
# their token sums
AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "luspo": "seq-mean-token-sum",
    "cispo": "token-mean",
    "sapo": "seq-mean-token-mean",
    "vespo": "token-mean",
}
# loss_type -> Settings.loss (the clipped surrogate for the rest)
LOSSES = {"cispo": "trl/cispo", "sapo": "trl/sapo", "luspo": "trl/luspo", "vespo": "trl/vespo"}
# GRPOConfig's loss parameters, by the same names in Settings
LOSS_PARAMS = (
    "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos",
    "vespo_k_neg", "vespo_lambda_neg",
)  # fmt: skip
SCALE = {"group": "group", "batch": "batch", "none": "none", True: "group", False: "none"}

VLLM_CLIP_MAX = 3.0  # GRPOConfig's vllm_importance_sampling_clip_max default (TRL 1.16.0)

# Every GRPOConfig key this module reads (from_config and the call rules below), with its
# type and range (TRL 1.16.0 GRPOConfig; transformers' logging_steps may be a ratio < 1)
CONFIG_KEYS: dict[str, Key] = {
    "loss_type": text(),
    "max_completion_length": integer(low=1, null=True),
    **{key: number(low=0, low_open=True) for key in LOSS_PARAMS if "temperature" in key},
    **{key: number() for key in LOSS_PARAMS if key.startswith("vespo")},
    "beta": number(low=0),
    "epsilon": number(low=0),
    "epsilon_high": number(low=0, null=True),
    "delta": number(low=1, low_open=True, null=True),
    "importance_sampling_level": text(),
    "scale_rewards": choice("group", "batch", "none", True, False),
    "use_bias_correction_kl": boolean(),
    "use_vllm": boolean(),
    "vllm_importance_sampling_correction": boolean(),
    "vllm_importance_sampling_mode": choice(
        "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ),
    "vllm_importance_sampling_clip_max": number(low=0, low_open=True, null=True),
    "vllm_importance_sampling_cap": number(low=0, low_open=True, null=True),
    "vllm_importance_sampling_clip_min": number(low=0, null=True),
    "top_entropy_quantile": number(low=0, high=1),
    "off_policy_mask_threshold": number(null=True),
    "use_adaptive_entropy": boolean(),
    "entropy_coef": number(),
    "steps_per_generation": integer(low=1, null=True),
    "logging_steps": number(low=0, low_open=True),
}


def from_config(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """GRPOConfig's keys (TRL 1.16.0) as Settings: ``loss_type`` the loss (cispo, sapo,
    luspo, vespo: ``trl/<type>``, with ``sapo_temperature_*`` and ``vespo_*``) and the
    aggregation, ``use_vllm`` with ``vllm_importance_sampling_correction`` the vLLM IS
    correction (``_mode``, ``_clip_max`` or its alias ``_cap``, ``_clip_min``),
    ``beta``, ``epsilon``/``epsilon_high`` the clip range, ``delta`` the dual clip,
    ``importance_sampling_level`` the ratio's level (a clipped sequence counts once in the
    clip metrics), ``scale_rewards``, ``use_bias_correction_kl``, ``max_completion_length``
    (dr_grpo's L), ``top_entropy_quantile`` < 1 the high-entropy mask,
    ``off_policy_mask_threshold`` the off-policy sequence mask. What it does not compute is
    said in the notes."""
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
            if loss in LOSSES:
                out["loss"] = LOSSES[loss]
            if loss == "dr_grpo" and c.get("max_completion_length") is not None:
                out["max_len"] = int(c["max_completion_length"])
    for key in LOSS_PARAMS:
        if isinstance(c.get(key), int | float) and not isinstance(c.get(key), bool):
            out[key] = float(c[key])
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
    elif "importance_sampling_level" in c:
        notes.append(
            f"importance_sampling_level {c['importance_sampling_level']!r} is not computed by "
            "this grpo-cli (token, sequence): the numbers follow a token ratio"
        )
    if c.get("scale_rewards") in SCALE:
        out["scale"] = SCALE[c["scale_rewards"]]
    if isinstance(c.get("use_bias_correction_kl"), bool):
        out["kl_bias_correction"] = c["use_bias_correction_kl"]
    if c.get("use_vllm") and c.get("vllm_importance_sampling_correction"):
        out["correction"] = "trl-vllm"
        if isinstance(c.get("vllm_importance_sampling_mode"), str):
            out["vllm_is_mode"] = c["vllm_importance_sampling_mode"]
        for key in ("vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap"):
            if key in c:  # the cap is clip_max's deprecated alias
                out["vllm_is_clip_max"] = None if c[key] is None else float(c[key])
                break
        if "vllm_importance_sampling_clip_min" in c:
            v = c["vllm_importance_sampling_clip_min"]
            out["vllm_is_clip_min"] = None if v is None else float(v)
    if isinstance(c.get("top_entropy_quantile"), int | float) and c["top_entropy_quantile"] < 1:
        out["entropy_mask"] = True  # the policy term on the recorder's entropy_mask tokens
    if isinstance(c.get("off_policy_mask_threshold"), int | float):  # DeepSeek-V3.2's OPSM
        out["off_policy_mask_threshold"] = float(c["off_policy_mask_threshold"])
    if c.get("use_adaptive_entropy"):
        notes.append(
            f"use_adaptive_entropy (entropy_coef {c.get('entropy_coef')} to start): TRL "
            "subtracts coef × the token-mean entropy from its loss with a coefficient that "
            "moves step by step; not applied here (the logged loss differs by it; the policy "
            "term, KL and clip metrics do not)"
        )
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
    if s.loss != "clip":  # the loss's own clip metric (cispo, vespo), or none (sapo)
        out = {k: v for k, v in out.items() if k not in CLIP_METRICS}
        out.update(
            # the vLLM correction's sampling/* are logged once per generation instead
            {k: v for k, v in acc.loss_metrics.values().items() if not k.startswith("sampling/")}
        )
    return out


def _policy_loss(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> tuple[float, int] | None:
    """One rank's policy loss of one call before the entropy bonus, as ``_compute_loss``
    returns it, and the accumulation divisor already in it (``k``; 1 for ``dapo``, whose
    normaliser takes it): see :func:`file_loss`."""
    del s
    loss_type = config.get("loss_type", "dapo")
    k = int(f.info.get("micro_batches", 1)) or 1
    n = f.answers + f.empty
    if loss_type in ("grpo", "sapo"):
        value = f.term_answer_means / max(n, 1) / k
    elif loss_type == "bnpo":
        value = f.term_sum / max(f.tokens, 1) / k
    elif loss_type == "dr_grpo":
        value = f.term_sum / (n * float(config.get("max_completion_length") or 1)) / k
    elif loss_type == "luspo":
        value = f.term_sum / max(n, 1) / k
    elif loss_type in ("dapo", "cispo", "vespo"):
        items = f.info.get("num_items_in_batch")
        if not isinstance(items, int | float):
            return None
        world = int(f.info.get("world_size", 1)) or 1
        spg = float(config.get("steps_per_generation") or k)
        return -f.term_sum / (max(items, 1) / world * k / spg), 1
    else:
        return None
    return -value, k


def entropy_coef(config: Mapping[str, Any]) -> float | None:
    """TRL's static entropy bonus coefficient (``entropy_coef`` ≠ 0 without
    ``use_adaptive_entropy``); None when off or adaptive (its coefficient moves step by
    step with the window's entropy: not followed here, said in a note)."""
    coef = config.get("entropy_coef")
    if config.get("use_adaptive_entropy") or not isinstance(coef, int | float) or coef == 0:
        return None
    return float(coef)


def file_loss(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> float | None:
    """One rank's loss of one call as ``_compute_loss`` returns it (TRL 1.16.0), from the
    per-token term (``policy − β·KL``, so the loss is its negative): ``grpo`` the mean over
    the call's answers (empty ones count 0) of their token means, ``bnpo`` the token mean,
    ``dr_grpo`` the sum over answers × ``max_completion_length``, ``luspo`` the mean over
    answers of their sums, each divided by the loss calls of the step; ``dapo`` the sum over
    ``num_items_in_batch`` / world size × calls / ``steps_per_generation``. ``sapo`` is
    aggregated as ``grpo``, ``cispo`` and ``vespo`` as ``dapo``. With a static
    ``entropy_coef`` its bonus is subtracted: coef × the token mean of the rank's entropy /
    the loss calls of the step, whatever the loss type (None when the entropy was not
    recorded)."""
    got = _policy_loss(s, f, config)
    if got is None:
        return None
    loss = got[0]
    coef = entropy_coef(config)
    if coef is not None:
        if f.tokens and not f.entropy_tokens:
            return None  # the bonus needs the recorded entropy
        k = int(f.info.get("micro_batches", 1)) or 1
        loss -= coef * f.entropy_sum / max(f.entropy_tokens, 1) / k
    return loss


def file_metrics(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> dict[str, float]:
    """What TRL 1.16.0 logs of one rank's call with the entropy bonus on: ``policy_loss``
    (the loss before the bonus and before the accumulation divisor) and ``entropy_coef``."""
    coef = entropy_coef(config)
    got = _policy_loss(s, f, config)
    if coef is None or got is None:
        return {}
    return {"policy_loss": got[0] * got[1], "entropy_coef": coef}


def generation_metrics(s: Settings, rows: Mapping[str, Any]) -> dict[str, float | None]:
    """What TRL logs once per generation batch (``_generate_and_score_completions``):
    ``reward`` (nan-mean), ``reward_std`` (sample std), ``frac_reward_zero_std`` (the share
    of answers whose group's sample std is 0, by ``torch.isclose``'s default tolerance);
    with the vLLM IS correction its ``sampling/*`` metrics, each process's over its share
    of the generation, then gathered: the mean of the processes' means, the max of their
    maxima, the min of their minima."""
    del s
    out = _sampling(rows.get("corrections") or [])
    reward = np.asarray(rows["reward"], dtype=np.float64)
    if reward.size == 0:
        return out
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
        **out,
    }


def _sampling(ranks: list[Mapping[str, float]]) -> dict[str, float | None]:
    """The ``sampling/*`` metrics of a generation from each rank's (TRL 1.16.0 gathers
    ``mean_delta``, ``max_delta`` and the IS ratio's min, mean, max across processes, then
    takes their mean, max, nanmin/nanmean/nanmax)."""
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(k for r in ranks for k in r if k.startswith("sampling/")):
        values = [v for r in ranks if (v := r.get(name)) is not None and not math.isnan(v)]
        if not values:
            out[name] = None
        elif name.endswith("/max"):
            out[name] = max(values)
        elif name.endswith("/min"):
            out[name] = min(values)
        else:
            out[name] = sum(values) / len(values)
    return out


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


CALLS = CallRules(call_metrics, file_loss, generation_metrics, combine, file_metrics)


def _vllm_keys(c: Mapping[str, Any]) -> str | None:
    """The vLLM correction's keys read together (when it is on): a truncating mode needs
    a bound, and ``clip_min`` is below ``clip_max``."""
    v = "vllm_importance_sampling_"
    if not (c.get("use_vllm") and c.get(v + "correction")):
        return None
    mode = c.get(v + "mode")
    high = next((c[k] for k in (v + "clip_max", v + "cap") if k in c), VLLM_CLIP_MAX)
    low = c.get(v + "clip_min")
    if isinstance(mode, str) and mode.endswith("truncate") and high is None and low is None:
        return f"config key '{v}mode' is {mode!r}: a truncating mode needs {v}clip_max or clip_min"
    if low is not None and high is not None and low >= high:
        return f"config key '{v}clip_min' is {low!r}: expected below {v}clip_max ({high!r})"
    return None


TRAINER = Trainer(
    name="trl",
    releases=RELEASES,
    presets=PRESETS,
    from_config=checked(CONFIG_KEYS, from_config, (_vllm_keys,)),
    calls=CALLS,
)
