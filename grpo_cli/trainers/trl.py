"""TRL's ``GRPOTrainer`` (TRL 1.16.0): presets, logged metrics.

Its loss (``GRPOTrainer._compute_loss``): advantages with the sample std (NaN-aware) plus
1e-4, ``loss_type`` ``dapo`` by default (token sums over the accumulated batch's tokens:
token-mean), β = 0, no log-ratio clamp, ``use_bias_correction_kl`` on (the per-token KL
times the ratio), GSPO with ``importance_sampling_level="sequence"``.
"""

from __future__ import annotations

from .base import MetricInputs, Trainer

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
    "kl",
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
    "frac_reward_zero_std",
)


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """TRL 1.16.0 (``GRPOTrainer._compute_loss``): ``kl`` is the token mean of the KL as the
    loss takes it (bias-corrected when ``use_bias_correction_kl``), logged only when
    β ≠ 0; ``clip_ratio/*`` count tokens, or sequences under GSPO; ``low_min`` and
    ``high_max`` are the extremes over answers of their clipped shares;
    ``frac_reward_zero_std`` the share of answers whose group std is zero."""
    s, acc, clip = m.settings, m.acc, m.clip
    out: dict[str, float | None] = {}
    if s.beta != 0.0:
        out["kl"] = acc.kl.token / max(acc.tokens, 1)
    out["clip_ratio/low_mean"] = clip.low
    out["clip_ratio/low_min"] = acc.clip_shares.low_min
    out["clip_ratio/high_mean"] = clip.high
    out["clip_ratio/high_max"] = acc.clip_shares.high_max
    out["clip_ratio/region_mean"] = clip.region
    out["frac_reward_zero_std"] = None if m.groups is None else m.groups.frac_zero_std_answers
    return out


TRAINER = Trainer(
    name="trl", version=VERSION, presets=PRESETS, metric_names=METRICS, metrics=metrics
)
