"""OpenRLHF's PPO trainer with ``--advantage_estimator group_norm`` (OpenRLHF 0.11.2):
presets, dependent settings, the KL in the reward, logged metrics.

Its default puts the KL into the reward: −β·k1(old_logp, ref_logp), clamped to ±10 per
token, joins every token's reward after the group normalisation and is summed from each
token to the end (``get_cumulative_returns``). ``--algo.kl.use_loss`` puts it into the
loss instead, aggregated per token whatever the policy loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Default, MetricInputs, Trainer

VERSION = "openrlhf 0.11.2"

PRESETS = {
    # --advantage_estimator group_norm, PolicyLoss "ppo", the KL in the reward: sample std,
    # eps 1e-9, advantages clipped to ±10 (--reward.clip_range), then −β·k1(old_logp,
    # ref_logp) clamped to ±10 per token, summed from each token to the end;
    # init_kl_coef 0.01; token-mean, Δ clamp 20. --kl-mode loss is --algo.kl.use_loss.
    "openrlhf": {
        "ddof": 1,
        "eps": 1e-9,
        "adv_clip": 10.0,
        "agg": "token-mean",
        "kl_agg": "token-mean",
        "log_ratio_clamp": 20.0,
        "kl_estimator": "k1",
        "kl_clamp": 10.0,
        "kl_mode": "reward",
        "beta": 0.01,
    },
}

METRICS = ("policy_loss", "ppo_clip_ratio", "ppo_kl", "kl", "logprobs_diff")


def dependent(values: Mapping[str, Any], default: Default) -> None:
    """OpenRLHF 0.11.2 ``PolicyLoss`` with ``policy_loss_type="gspo"``: per-sample
    aggregation (``token_level_loss=False``); the KL loss stays per token."""
    if values["ratio_level"] == "sequence":
        default("agg", "seq-mean-token-mean")


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """OpenRLHF 0.11.2 (``PolicyLoss``, ``--algo.kl.use_loss``): ``policy_loss`` the
    aggregated policy loss, ``ppo_clip_ratio`` the clip region's share, ``ppo_kl`` the
    token mean of the raw ``old_logp − logp``, ``kl`` the token mean of the KL estimate,
    ``logprobs_diff`` the token mean of ``logp − ref_logp``; with the KL in the reward,
    ``kl`` and ``logprobs_diff`` are means over answers of old vs ref (0 when β = 0)."""
    s, acc = m.settings, m.acc
    t = max(acc.tokens, 1)
    lr = acc.log_ratios
    out: dict[str, float | None] = {
        "policy_loss": -m.policy_term,
        "ppo_clip_ratio": m.clip.region,
        "ppo_kl": -lr.delta / t,
    }
    if s.kl_mode == "reward":  # per-answer means of old vs ref, over answers
        n = max(acc.answers, 1)
        out["kl"] = acc.reward_kl.answer_means / n if s.beta != 0.0 else 0.0
        out["logprobs_diff"] = acc.old_ref.answer_means / n if s.beta != 0.0 else 0.0
    else:
        out["kl"] = acc.kl.token / t if s.beta != 0.0 else 0.0
        out["logprobs_diff"] = -lr.ref / t if s.beta != 0.0 else 0.0
    return out


TRAINER = Trainer(
    name="openrlhf",
    version=VERSION,
    presets=PRESETS,
    metric_names=METRICS,
    metrics=metrics,
    reward_kl="returns",
    dependent=dependent,
)
