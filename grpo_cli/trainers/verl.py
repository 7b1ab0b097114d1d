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


AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-sum",
)
# kl_loss_type / kl_penalty -> the estimator (verl 0.9.1 ``kl_penalty_forward``)
KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
ACTOR = "actor_rollout_ref.actor."


def from_config(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """verl 0.9.1's dotted config keys as Settings: the advantage estimator and its std
    scaling, the actor's clip ratios, dual clip ``clip_ratio_c``, ``loss_agg_mode`` (and
    ``loss_scale_factor``, the L of seq-mean-token-sum-norm), the policy loss (vanilla: a
    token ratio; gspo: a sequence ratio), the KL loss (``use_kl_loss``, ``kl_loss_coef``,
    ``kl_loss_type``) or the KL in the reward (``use_kl_in_reward``, ``kl_ctrl.kl_coef``,
    ``kl_penalty``)."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    est = c.get("algorithm.adv_estimator")
    if est not in (None, "grpo", "rloo"):
        notes.append(f"algorithm.adv_estimator {est!r}: grpo-cli computes grpo and rloo")
    elif est == "rloo":
        out["estimator"] = "rloo"
    if c.get("algorithm.norm_adv_by_std_in_grpo") is False:
        out["scale"] = "none"
    eps = c.get(ACTOR + "clip_ratio")
    low, high = c.get(ACTOR + "clip_ratio_low"), c.get(ACTOR + "clip_ratio_high")
    low, high = (eps if low is None else low), (eps if high is None else high)
    if isinstance(low, int | float):
        out["clip_eps"] = float(low)
    if isinstance(high, int | float):
        out["clip_eps_high"] = float(high)
    gspo = c.get(ACTOR + "policy_loss.loss_mode") == "gspo"  # its loss has no dual clip
    if isinstance(c.get(ACTOR + "clip_ratio_c"), int | float) and not gspo:
        out["dual_clip"] = float(c[ACTOR + "clip_ratio_c"])
    agg = c.get(ACTOR + "loss_agg_mode")
    if agg in AGGREGATIONS:
        out["agg"] = agg
    elif agg is not None:
        notes.append(f"loss_agg_mode {agg!r} is not one grpo-cli computes")
    if isinstance(c.get(ACTOR + "loss_scale_factor"), int | float):
        out["max_len"] = int(c[ACTOR + "loss_scale_factor"])
    mode = c.get(ACTOR + "policy_loss.loss_mode")
    if mode == "gspo":
        out["ratio_level"] = "sequence"
    elif mode not in (None, "vanilla"):
        notes.append(
            f"policy_loss.loss_mode {mode!r} is not computed by this grpo-cli (vanilla, "
            "gspo): the numbers follow the clipped surrogate"
        )
    if c.get("algorithm.use_kl_in_reward"):
        out["kl_mode"] = "reward"
        if isinstance(c.get("algorithm.kl_ctrl.kl_coef"), int | float):
            out["beta"] = float(c["algorithm.kl_ctrl.kl_coef"])
        penalty = c.get("algorithm.kl_penalty")
        if penalty in KL_ESTIMATORS:
            out["kl_estimator"] = KL_ESTIMATORS[penalty]
    elif c.get(ACTOR + "use_kl_loss") is False:
        out["beta"] = 0.0
    elif c.get(ACTOR + "use_kl_loss"):
        if isinstance(c.get(ACTOR + "kl_loss_coef"), int | float):
            out["beta"] = float(c[ACTOR + "kl_loss_coef"])
        kind = c.get(ACTOR + "kl_loss_type")
        if kind in KL_ESTIMATORS:
            out["kl_estimator"] = KL_ESTIMATORS[kind]
        elif kind is not None:
            notes.append(
                f"kl_loss_type {kind!r} is not one grpo-cli computes (kl, mse, low_var_kl)"
            )
    if c.get("algorithm.rollout_correction.rollout_is") or c.get(
        "algorithm.rollout_correction.rollout_rs"
    ):
        notes.append(
            "algorithm.rollout_correction reweights or rejects tokens by the sampler's "
            "log-probs: not applied here (this grpo-cli does not compute it)"
        )
    return out, notes


TRAINER = Trainer(
    name="verl",
    version=VERSION,
    presets=PRESETS,
    metric_names=METRICS,
    metrics=metrics,
    reward_kl="score",
    dependent=dependent,
    from_config=from_config,
)
