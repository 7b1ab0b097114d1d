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


AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def from_config(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """OpenRLHF 0.11.2's arguments (dotted, as argparse holds them) as Settings: the
    advantage estimator (group_norm; dr_grpo: no std), ``algo.kl.use_loss`` (the KL in the
    loss, else in the reward), ``init_coef``, ``estimator``, the clip ``eps_clip`` (or
    ``eps_clip_low_high``), ``dual_clip``, ``policy_loss_type`` (ppo: a token ratio; gspo: a
    sequence ratio), ``loss_agg_mode`` and the reward clip range."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    est = c.get("algo.advantage.estimator")
    if est == "dr_grpo" or c.get("algo.advantage.no_std_norm"):
        out["scale"] = "none"
    elif est not in (None, "group_norm"):
        notes.append(f"algo.advantage.estimator {est!r}: grpo-cli computes group_norm and dr_grpo")
    if isinstance(c.get("algo.kl.use_loss"), bool):
        out["kl_mode"] = "loss" if c["algo.kl.use_loss"] else "reward"
        if c["algo.kl.use_loss"]:
            out["kl_agg"] = "token-mean"
    if isinstance(c.get("algo.kl.init_coef"), int | float):
        out["beta"] = float(c["algo.kl.init_coef"])
    if c.get("algo.kl.estimator") in ("k1", "k2", "k3"):
        out["kl_estimator"] = c["algo.kl.estimator"]
    low_high = c.get("actor.eps_clip_low_high")
    if isinstance(low_high, list | tuple) and len(low_high) == 2:
        out["clip_eps"], out["clip_eps_high"] = float(low_high[0]), float(low_high[1])
    elif isinstance(c.get("actor.eps_clip"), int | float):
        out["clip_eps"] = float(c["actor.eps_clip"])
    if "actor.dual_clip" in c:
        out["dual_clip"] = None if c["actor.dual_clip"] is None else float(c["actor.dual_clip"])
    kind = c.get("actor.policy_loss_type")
    if kind == "gspo":
        out["ratio_level"] = "sequence"
    elif kind not in (None, "ppo"):
        notes.append(f"actor.policy_loss_type {kind!r}: grpo-cli computes ppo and gspo")
    if c.get("actor.loss_agg_mode") in AGGREGATIONS:
        out["agg"] = c["actor.loss_agg_mode"]
    clip = c.get("reward.clip_range")
    if isinstance(clip, list | tuple) and len(clip) == 2 and -clip[0] == clip[1] > 0:
        out["adv_clip"] = float(clip[1])
    if c.get("algo.advantage.is_correction_level") not in (None, "off"):
        notes.append(
            "algo.advantage.is_correction reweights tokens by the sampler's log-probs: not "
            "applied here (this grpo-cli does not compute it)"
        )
    return out, notes


TRAINER = Trainer(
    name="openrlhf",
    version=VERSION,
    presets=PRESETS,
    metric_names=METRICS,
    metrics=metrics,
    reward_kl="returns",
    dependent=dependent,
    from_config=from_config,
)
