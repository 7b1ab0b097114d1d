"""Every trainer's sampler–trainer mismatch metric under its own name and sign (issue 29):
the same tokens' ``δ = old_logp − rollout_logp`` (ρ = exp δ, valid tokens, T of them, N
answers, ``m_i`` = mean over answer i of δ) as each trainer logs it, so that a number on a
dashboard can be matched whatever the stack.

One row a metric (:data:`METRICS`): the trainer, its logged name, the formula, and where it
was read (each from the trainer's source; the values from the sums of
:class:`grpo_cli.fold.parts.RolloutPartial`). Another trainer's metric: one row here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..fold.parts import RolloutPartial

__all__ = ["METRICS", "MismatchMetric", "by_trainer"]


@dataclass(frozen=True)
class MismatchMetric:
    trainer: str
    name: str
    formula: str
    source: str
    value: Callable[[RolloutPartial], float | None]


def _t(p: RolloutPartial, key: str) -> float:
    return p.tok[key] / p.tokens


def _a(p: RolloutPartial, key: str) -> float | None:
    return p.seq[key] / p.seq_n if p.seq_n else None


def _neg_m(p: RolloutPartial) -> float | None:
    m = _a(p, "m")
    return None if m is None else -m


def _abs_std(p: RolloutPartial) -> float | None:
    """The sample standard deviation (ddof 1, torch's default) of |δ|."""
    n = p.tokens
    if n < 2:
        return None
    var = (p.tok["d2"] - p.abs_sum * p.abs_sum / n) / (n - 1)
    return math.sqrt(max(var, 0.0))


def _seq_ratio(p: RolloutPartial) -> float | None:
    """mean over answers of exp(Σ_t δ), from the log-space sums (None beyond float64)."""
    if not p.answers or p.s_max == -math.inf:
        return None
    try:
        return p.s1 * math.exp(p.s_max) / p.answers
    except OverflowError:
        return None


METRICS: tuple[MismatchMetric, ...] = (
    MismatchMetric("trl", "sampling/sampling_logp_difference/mean", "mean |δ|",
                   "TRL 1.16.0 GRPOTrainer._compute_loss", lambda p: p.abs_sum / p.tokens),
    MismatchMetric("trl", "sampling/sampling_logp_difference/max", "max |δ|",
                   "TRL 1.16.0 GRPOTrainer._compute_loss", lambda p: p.abs_max),
    MismatchMetric("verl", "rollout_corr/kl", "mean (rollout − old) = −mean δ",
                   "verl 0.9.1 rollout_corr_helper.compute_offpolicy_metrics",
                   lambda p: -p.d_sum / p.tokens),
    MismatchMetric("verl", "rollout_corr/k3_kl", "mean (ρ − δ − 1)",
                   "verl 0.9.1 compute_offpolicy_metrics", lambda p: p.k3_sum / p.tokens),
    MismatchMetric("verl", "rollout_corr/chi2_token", "mean ρ² − 1",
                   "verl 0.9.1 compute_offpolicy_metrics", lambda p: p.r2_sum / p.tokens - 1.0),
    MismatchMetric("verl", "rollout_corr/log_ppl_diff", "mean over answers of −m_i",
                   "verl 0.9.1 compute_offpolicy_metrics", _neg_m),
    MismatchMetric("verl", "rollout_corr/log_ppl_abs_diff", "mean over answers of |m_i|",
                   "verl 0.9.1 compute_offpolicy_metrics", lambda p: _a(p, "abs_m")),
    MismatchMetric("verl", "rollout_corr/ppl_ratio", "mean over answers of exp(−m_i)",
                   "verl 0.9.1 compute_offpolicy_metrics", lambda p: _a(p, "exp_neg_m")),
    MismatchMetric("verl", "training/rollout_probs_diff_mean", "mean |p_old − p_rollout|",
                   "verl 0.9.1 ray_trainer (rollout_probs_diff)", lambda p: p.p_sum / p.tokens),
    MismatchMetric("openrlhf", "vllm_kl", "mean (rollout − old) = −mean δ",
                   "OpenRLHF 0.11.2 models/loss.py PolicyLoss.forward",
                   lambda p: -p.d_sum / p.tokens),
    MismatchMetric("nemo-rl", "token_mult_prob_error", "mean exp|δ|",
                   "NeMo-RL algorithms/loss_functions.py ClippedPGLossFn",
                   lambda p: _t(p, "exp_abs")),
    MismatchMetric("nemo-rl", "gen_kl_error", "mean (exp δ − δ − 1) (kl_type k3)",
                   "NeMo-RL loss_functions.py (calculate_kl of the generation vs prev)",
                   lambda p: p.k3_sum / p.tokens),
    MismatchMetric("nemo-rl", "policy_kl_error", "mean (exp(−δ) + δ − 1) (kl_type k3)",
                   "NeMo-RL loss_functions.py (calculate_kl of prev vs the generation)",
                   lambda p: _t(p, "reverse_k3")),
    MismatchMetric("nemo-rl", "js_divergence_error",
                   "mean ½ k3(old ‖ M) + ½ k3(rollout ‖ M), M = ½ (p_old + p_rollout)",
                   "NeMo-RL loss_functions.py", lambda p: _t(p, "js")),
    MismatchMetric("skyrl", "policy/rollout_train_logprobs_abs_diff_mean", "mean |δ|",
                   "SkyRL trainer.py (loss_mask > 0)", lambda p: p.abs_sum / p.tokens),
    MismatchMetric("skyrl", "policy/rollout_train_logprobs_abs_diff_std",
                   "std |δ| (ddof 1)", "SkyRL trainer.py", _abs_std),
    MismatchMetric("skyrl", "policy/rollout_train_logprobs_abs_diff_max", "max |δ|",
                   "SkyRL (later releases)", lambda p: p.abs_max),
    MismatchMetric("roll", "actor/train_infer_ratio_token_mean", "mean over answers of mean ρ",
                   "ROLL train_infer_correction.py (seq-mean-token-mean; key tagged @sum)",
                   lambda p: _a(p, "rho_mean")),
    MismatchMetric("roll", "actor/train_infer_ratio_geometric_mean",
                   "mean over answers of exp(m_i)", "ROLL train_infer_correction.py",
                   lambda p: _a(p, "exp_m")),
    MismatchMetric("roll", "actor/train_infer_ratio_sequence_mean",
                   "mean over answers of exp(Σ_t δ)", "ROLL train_infer_correction.py",
                   _seq_ratio),
    MismatchMetric("roll", "actor/train_infer_diff_token_mean",
                   "mean over answers of mean (p_old − p_rollout)",
                   "ROLL train_infer_correction.py", lambda p: _a(p, "pdiff_mean")),
    MismatchMetric("roll", "actor/train_infer_diff_sequence_mean",
                   "mean over answers of Σ_t (p_old − p_rollout)",
                   "ROLL train_infer_correction.py", lambda p: _a(p, "pdiff_sum")),
)  # fmt: skip


def by_trainer(p: RolloutPartial) -> dict[str, dict[str, float]]:
    """Every metric of :data:`METRICS` that has a finite value, by trainer then name."""
    out: dict[str, dict[str, float]] = {}
    if not p.tokens:
        return out
    for row in METRICS:
        v = row.value(p)
        if v is not None and math.isfinite(v):
            out.setdefault(row.trainer, {})[row.name] = v
    return out
