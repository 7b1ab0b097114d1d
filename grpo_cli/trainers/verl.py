"""verl's PPO trainer with ``adv_estimator=grpo`` (verl 0.9.1): presets, dependent
settings, the KL in the reward, logged metrics.

Its loss (``compute_policy_loss_vanilla``, ``agg_loss``): advantages with the sample std
plus 1e-6 (a singleton group: mean 0, std 1), token-mean, dual clip 3 (always on), Δ
clamped to ±20 before ``exp``, ``low_var_kl`` (k3, exponent clamped to ±20, value to ±10)
with ``kl_loss_coef`` 0.001.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Default, MetricInputs, Trainer

VERSION = "verl 0.9.1"

PRESETS = {
    # adv_estimator=grpo, compute_policy_loss_vanilla, use_kl_loss with low_var_kl.
    "verl": {
        "ddof": 1,
        "eps": 1e-6,
        "singleton": "raw",
        "agg": "token-mean",
        "dual_clip": 3.0,
        "log_ratio_clamp": 20.0,
        "kl_clamp": 10.0,
        "beta": 0.001,
    },
    # DAPO as verl's recipe runs it: clip-higher 0.2/0.28, token-mean, no KL, on verl's
    # vanilla loss (sample std, eps 1e-6, singleton mean 0 std 1, dual clip 3, Δ clamp 20).
    "dapo": {
        "ddof": 1,
        "eps": 1e-6,
        "singleton": "raw",
        "clip_eps": 0.2,
        "clip_eps_high": 0.28,
        "dual_clip": 3.0,
        "log_ratio_clamp": 20.0,
        "agg": "token-mean",
        "beta": 0.0,
    },
}

METRICS = (
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/reward_kl_penalty",
    "actor/reward_kl_penalty_coeff",
)


def dependent(values: Mapping[str, Any], default: Default) -> None:
    """verl 0.9.1 ``kl_penalty_forward``: only ``low_var_kl`` (k3) is clamped; k1 (``kl``)
    and k2 (``mse``) are not. Its GSPO loss (``compute_policy_loss_gspo``) has no dual clip
    and clamps the sequence log-ratio from above at 10. With the KL in the reward
    (``use_kl_in_reward``) the estimator is ``algorithm.kl_penalty``, ``kl`` (k1)."""
    estimator = values["kl_estimator"]
    if values["kl_mode"] == "reward":  # algorithm.kl_penalty: "kl" (k1) by default
        estimator = default("kl_estimator", "k1")
    if estimator != "k3":
        default("kl_clamp", None)
    if values["ratio_level"] == "sequence":
        default("dual_clip", None)
        default("seq_ratio_clamp", 10.0)


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """verl 0.9.1 (``compute_policy_loss_vanilla`` / ``_gspo``, ``agg_loss``):
    ``actor/pg_loss`` is the aggregated policy loss, ``actor/ppo_kl`` the token mean of
    ``old_logp − logp`` (clamped to ±20 first by the vanilla loss, not by GSPO's),
    ``actor/pg_clipfrac_lower`` the dual-clip share (0 under GSPO), ``actor/kl_loss`` the
    aggregated KL (with ``use_kl_loss``, i.e. β ≠ 0); with the KL in the reward,
    ``apply_kl_penalty``'s ``actor/reward_kl_penalty`` (the mean over answers of their
    token-mean KL) and its coefficient."""
    s, acc, clip = m.settings, m.acc, m.clip
    t = max(acc.tokens, 1)
    lr = acc.log_ratios
    gspo = s.ratio_level == "sequence"
    out: dict[str, float | None] = {
        "actor/pg_loss": -m.policy_term,
        "actor/pg_clipfrac": clip.region,
        "actor/pg_clipfrac_lower": 0.0 if gspo else clip.dual_clip_lower,
        "actor/ppo_kl": -(lr.delta if gspo else lr.delta20) / t,
    }
    if s.kl_mode == "reward":
        out["actor/reward_kl_penalty"] = acc.reward_kl.answer_means / max(acc.answers, 1)
        out["actor/reward_kl_penalty_coeff"] = s.beta
    elif s.beta != 0.0:
        out["actor/kl_loss"] = acc.aggregate("kl", s.kl_aggregation)
    return out


TRAINER = Trainer(
    name="verl",
    version=VERSION,
    presets=PRESETS,
    metric_names=METRICS,
    metrics=metrics,
    reward_kl="score",
    dependent=dependent,
)
