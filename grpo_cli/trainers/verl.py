"""verl's PPO trainer with ``adv_estimator=grpo``, release by release from 0.3.0 to 0.9.1:
presets, dependent settings, the KL in the reward, logged metrics.

Each :class:`~grpo_cli.trainers.base.Release` is a change point found by diffing, between
consecutive release wheels, ``verl/trainer/ppo/core_algos.py`` (``compute_policy_loss`` /
``compute_policy_loss_vanilla`` / ``_gspo``, ``agg_loss``,
``compute_grpo_outcome_advantage``, ``kl_penalty``), ``verl/workers/actor/dp_actor.py``
(what is logged), ``verl/trainer/ppo/ray_trainer.py`` (``apply_kl_penalty``) and the
default config (``ppo_trainer.yaml``), and checked by ``conformance/releases``.

Its newest loss (0.9.1: ``compute_policy_loss_vanilla``, ``agg_loss``): advantages with the
sample std plus 1e-6 (a singleton group: mean 0, std 1), token-mean, dual clip 3 (always
on), Δ clamped to ±20 before ``exp``, ``low_var_kl`` (k3, exponent clamped to ±20, value
to ±10) with ``kl_loss_coef`` 0.001 (the GRPO recipe's ``use_kl_loss=True``; the config's
own default is False).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..losses import LOSSES
from .base import (
    CallInputs,
    CallRules,
    Default,
    FileInputs,
    Folded,
    MetricInputs,
    Release,
    Trainer,
    with_loss_metrics,
)

if TYPE_CHECKING:
    from ..settings import Settings
from .config import Key, boolean, checked, either, integer, number, text

NAMES = (
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/reward_kl_penalty",
    "actor/reward_kl_penalty_coeff",
)
METRICS = NAMES  # the newest release's


def _kl_rules(values: Mapping[str, Any], default: Default) -> None:
    """``kl_penalty``: only ``low_var_kl`` (k3) is clamped; k1 (``kl``) and k2 (``mse``)
    are not. With the KL in the reward the estimator is ``algorithm.kl_penalty``, ``kl``
    (k1)."""
    estimator = values["kl_estimator"]
    if values["kl_mode"] == "reward":  # algorithm.kl_penalty: "kl" (k1) by default
        estimator = default("kl_estimator", "k1")
    if estimator != "k3":
        default("kl_clamp", None)


def _no_gspo(values: Mapping[str, Any], default: Default) -> None:
    """verl 0.3.0–0.5.0: no sequence-level loss (``compute_policy_loss_gspo`` is 0.6.0's)."""
    _kl_rules(values, default)
    if values["ratio_level"] == "sequence":
        from ..errors import SettingError

        raise SettingError(
            "ratio_level",
            f"sequence: {values['mirrors']} has no GSPO loss (verl added it in 0.6.0)",
        )


def dependent_0_6(values: Mapping[str, Any], default: Default) -> None:
    """verl 0.6.0–0.9.0 ``compute_policy_loss_gspo``: no dual clip, the sequence log-ratio
    clamped from above at 10, and the policy loss always ``seq-mean-token-mean`` (the KL
    loss keeps ``loss_agg_mode``)."""
    _kl_rules(values, default)
    if values["ratio_level"] == "sequence":
        default("dual_clip", None)
        default("seq_ratio_clamp", 10.0)
        default("kl_agg", values["agg"])
        default("agg", "seq-mean-token-mean")


def dependent(values: Mapping[str, Any], default: Default) -> None:
    """verl 0.9.1 ``kl_penalty_forward``: only ``low_var_kl`` (k3) is clamped; k1 (``kl``)
    and k2 (``mse``) are not. Its GSPO loss (``compute_policy_loss_gspo``) has no dual clip,
    clamps the sequence log-ratio from above at 10 and aggregates with ``loss_agg_mode``.
    With the KL in the reward (``use_kl_in_reward``) the estimator is
    ``algorithm.kl_penalty``, ``kl`` (k1)."""
    _kl_rules(values, default)
    if values["ratio_level"] == "sequence":
        default("dual_clip", None)
        default("seq_ratio_clamp", 10.0)


def _metrics(m: MetricInputs, *, clamped_ppo_kl: bool, dual: bool) -> dict[str, float | None]:
    s, acc, clip = m.settings, m.acc, m.clip
    t = max(acc.tokens, 1)
    lr = acc.log_ratios
    gspo = s.ratio_level == "sequence"
    out: dict[str, float | None] = {
        "actor/pg_loss": -m.policy_term,
        "actor/pg_clipfrac": clip.region,
    }
    if dual:
        out["actor/pg_clipfrac_lower"] = 0.0 if gspo else clip.dual_clip_lower
    out["actor/ppo_kl"] = -(lr.delta20 if clamped_ppo_kl and not gspo else lr.delta) / t
    if s.kl_mode == "reward":
        names = ("actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff")
        if not dual:  # 0.3.0: apply_kl_penalty's metrics were critic/kl, critic/kl_coeff
            names = ("critic/kl", "critic/kl_coeff")
        out[names[0]] = acc.reward_kl.answer_means / max(acc.rows, 1)
        out[names[1]] = s.beta
    elif s.beta != 0.0:
        out["actor/kl_loss"] = acc.aggregate("kl", s.kl_aggregation)
    return out


def metrics_0_3(m: MetricInputs) -> dict[str, float | None]:
    """verl 0.3.0 (``compute_policy_loss``, ``dp_actor``): ``actor/pg_loss`` the token-mean
    policy loss, ``actor/pg_clipfrac`` the clip region's share, ``actor/ppo_kl`` the token
    mean of ``old_logp − logp`` (not clamped), ``actor/kl_loss`` the token-mean KL; no
    dual clip, no ``pg_clipfrac_lower``; the KL in the reward logs ``critic/kl`` (the mean
    over answers of their token-mean KL) and ``critic/kl_coeff``."""
    return _metrics(m, clamped_ppo_kl=False, dual=False)


def metrics_0_4(m: MetricInputs) -> dict[str, float | None]:
    """verl 0.4.0: as 0.3.0 with the dual clip's ``actor/pg_clipfrac_lower`` and the
    reward KL as ``actor/reward_kl_penalty`` and ``_coeff``; ``ppo_kl`` not clamped."""
    return _metrics(m, clamped_ppo_kl=False, dual=True)


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """verl 0.4.1–0.9.1 (``compute_policy_loss_vanilla`` / ``_gspo``, ``agg_loss``):
    ``actor/pg_loss`` is the aggregated policy loss, ``actor/ppo_kl`` the token mean of
    ``old_logp − logp`` (clamped to ±20 first by the vanilla loss, not by GSPO's),
    ``actor/pg_clipfrac_lower`` the dual-clip share (0 under GSPO), ``actor/kl_loss`` the
    aggregated KL (with ``use_kl_loss``, i.e. β ≠ 0); with the KL in the reward,
    ``apply_kl_penalty``'s ``actor/reward_kl_penalty`` (the mean over answers of their
    token-mean KL) and its coefficient."""
    out = _metrics(m, clamped_ppo_kl=True, dual=True)
    # another loss logs its own (compute_policy_loss_<mode>'s pg_metrics), or none (gpg)
    return with_loss_metrics(out, m, _LOSS_METRIC_NAMES)


_LOSS_METRIC_NAMES = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")


# the GRPO recipe on verl's vanilla loss: sample std + 1e-6, a singleton group mean 0 std 1,
# token-mean, use_kl_loss with low_var_kl (clamped to ±10), kl_loss_coef 0.001
_BASE = {
    "ddof": 1,
    "eps": 1e-6,
    "singleton": "raw",
    "agg": "token-mean",
    "kl_clamp": 10.0,
    "beta": 0.001,
}
_A = "verl/trainer/ppo/core_algos.py"
_D = "verl/workers/actor/dp_actor.py"
_GSPO_AGG = (
    "with --ratio-level sequence the preset sets --agg seq-mean-token-mean and --kl-agg to "
    "the --agg it had; an --agg given is the policy's: verl's loss_agg_mode X under GSPO "
    "is --kl-agg X"
)
_OLD_NORM = (
    "agg_loss seq-mean-token-sum-norm: Σ over the batch / loss_mask.shape[-1] (L), not "
    "/ (N · L): --norm-scale lmax"
)

RELEASES = (
    Release(
        first="0.3.0",
        last="0.3.0.post1",
        checked="0.3.0.post1",
        preset={**_BASE, "norm_scale": "lmax"},
        metrics=metrics_0_3,
        metric_names=(
            "actor/pg_loss",
            "actor/pg_clipfrac",
            "actor/ppo_kl",
            "actor/kl_loss",
            "critic/kl",
            "critic/kl_coeff",
        ),
        dependent=_no_gspo,
        changes=(
            f"{_A}: compute_policy_loss: max(−Aρ, −A clip(ρ, 1±ε)), masked_mean (token-mean), "
            "no dual clip, Δ not clamped; pg_clipfrac = gt(pg_losses2, pg_losses)",
            f"{_A}: kl_penalty low_var_kl: exp(ref − logp) − (ref − logp) − 1 clamped to "
            "±10, the exponent not clamped",
            f"{_A}: compute_grpo_outcome_advantage: (score − mean) / (std + 1e-6), a "
            "singleton group mean 0 std 1",
            f"{_D}: kl_loss = masked_mean(kld) (token-mean)",
        ),
    ),
    Release(
        first="0.4.0",
        last="0.4.0",
        checked="0.4.0",
        preset={**_BASE, "dual_clip": 3.0, "norm_scale": "lmax"},
        metrics=metrics_0_4,
        metric_names=NAMES,
        dependent=_no_gspo,
        changes=(
            f"{_A}: compute_policy_loss: dual clip clip_ratio_c 3.0 (always on), "
            "clip_ratio_low / _high, loss_agg_mode (token-mean) through agg_loss",
            f"{_D}: kl_loss = agg_loss(kld, loss_agg_mode); pg_clipfrac_lower logged",
            f"{_A}: agg_loss: {_OLD_NORM}",
            "verl/trainer/ppo/ray_trainer.py: apply_kl_penalty logs actor/reward_kl_penalty "
            "(was critic/kl) when algorithm.use_kl_in_reward",
        ),
    ),
    Release(
        first="0.4.1",
        last="0.5.0",
        checked="0.4.1",
        preset={**_BASE, "dual_clip": 3.0, "log_ratio_clamp": 20.0, "norm_scale": "lmax"},
        metrics=metrics,
        metric_names=NAMES,
        dependent=_no_gspo,
        changes=(
            f"{_A}: compute_policy_loss: Δ = logp − old_logp clamped to ±20 before exp "
            "(ppo_kl from the clamped Δ)",
            f"{_A}: kl_penalty low_var_kl: the exponent clamped to ±20",
        ),
    ),
    Release(
        first="0.6.0",
        last="0.7.0",
        checked="0.6.0",
        preset={**_BASE, "dual_clip": 3.0, "log_ratio_clamp": 20.0, "norm_scale": "lmax"},
        metrics=metrics,
        metric_names=NAMES,
        dependent=dependent_0_6,
        notes=(_GSPO_AGG,),
        changes=(
            f"{_A}: compute_policy_loss_gspo (loss_mode 'gspo'): the sequence log-ratio "
            "clamped from above at 10, no dual clip, the policy loss always "
            "seq-mean-token-mean (loss_agg_mode aggregates the KL loss only)",
            f"{_A}: agg_loss (0.6.1): seq-mean-* skip empty answers; seq-mean-token-mean "
            "divides by |o_i| + 1e-8",
        ),
    ),
    Release(
        first="0.7.1",
        last="0.9.0",
        checked="0.7.1",
        preset={**_BASE, "dual_clip": 3.0, "log_ratio_clamp": 20.0},
        metrics=metrics,
        metric_names=NAMES,
        dependent=dependent_0_6,
        notes=(_GSPO_AGG,),
        changes=(
            f"{_A}: agg_loss: seq-mean-token-sum-norm = Σ / (N · L), L = loss_scale_factor "
            "or the padded width (was Σ / L)",
            f"{_A}: agg_loss (0.9.0): token-sum",
        ),
    ),
    Release(
        first="0.9.1",
        last="0.9.1",
        checked="0.9.1",
        preset={**_BASE, "dual_clip": 3.0, "log_ratio_clamp": 20.0},
        metrics=metrics,
        metric_names=NAMES,
        changes=(f"{_A}: compute_policy_loss_gspo: the policy loss takes loss_agg_mode",),
    ),
)

PRESETS = {
    # adv_estimator=grpo, compute_policy_loss_vanilla, use_kl_loss with low_var_kl.
    "verl": dict(RELEASES[-1].preset),
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
    elif isinstance(mode, str) and f"verl/{mode}" in LOSSES:
        out["loss"] = f"verl/{mode}"
        for key, name in LOSS_KEYS.items():
            v = c.get(ACTOR + key)
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[name] = float(v)
    elif mode not in (None, "vanilla"):
        notes.append(
            f"policy_loss.loss_mode {mode!r} is not computed by this grpo-cli (vanilla, "
            f"gspo, {', '.join(k.split('/', 1)[1] for k in LOSSES if k.startswith('verl/'))}): "
            "the numbers follow the clipped surrogate"
        )
    _kl_keys(c, out, notes)
    _rollout_keys_of(c, mode, out, notes)
    return out, notes


def _kl_keys(c: Mapping[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    """The KL in the reward (``use_kl_in_reward``, ``kl_ctrl.kl_coef``, ``kl_penalty``) or
    the KL loss (``use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type``) into ``out``."""
    if c.get("algorithm.use_kl_in_reward"):
        out["kl_mode"] = "reward"
        if isinstance(c.get("algorithm.kl_ctrl.kl_coef"), int | float):
            out["beta"] = float(c["algorithm.kl_ctrl.kl_coef"])
        penalty = c.get("algorithm.kl_penalty")
        if penalty in KL_ESTIMATORS:
            out["kl_estimator"] = KL_ESTIMATORS[penalty]
        elif penalty is not None:
            notes.append(
                f"kl_penalty {penalty!r} is not one grpo-cli computes (kl, mse, low_var_kl)"
            )
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


def _rollout_keys_of(
    c: Mapping[str, Any], mode: Any, out: dict[str, Any], notes: list[str]
) -> None:
    """``algorithm.rollout_correction``: the decoupled correction's IS weights and
    rejection, or the bypass mode (a loss of its own that replaces ``policy_loss.loss_mode``
    ``mode``) into ``out``."""
    rc = "algorithm.rollout_correction."
    level, rs = c.get(rc + "rollout_is"), c.get(rc + "rollout_rs")
    bypass = bool(c.get(rc + "bypass_mode"))
    if level not in (None, "token", "sequence"):
        notes.append(f"{rc}rollout_is {level!r}: grpo-cli computes token and sequence")
    elif (level is not None or isinstance(rs, str)) and not bypass:
        # verl 0.9.1 compute_rollout_correction_and_add_to_batch: IS weights when
        # rollout_is is set, the rejection (rollout_rs) whether or not
        out["correction"] = "verl-rollout"
        out.update(_rollout_section(c, rc, level, rs))
    if bypass and level in (None, "token", "sequence"):
        # verl 0.9.1 apply_bypass_mode: old_log_probs = rollout_log_probs, the policy loss
        # compute_policy_loss_bypass_mode with the section's IS and rejection
        if "loss" in out or out.get("ratio_level") == "sequence":
            notes.append(
                f"{rc}bypass_mode replaces policy_loss.loss_mode {mode!r}: the numbers follow "
                "verl/bypass_mode"
            )
            out.pop("ratio_level", None)
        out["loss"] = "verl/bypass_mode"
        kind = c.get(rc + "loss_type")
        if kind in ("ppo_clip", "reinforce"):
            out["bypass_loss_type"] = kind
        elif kind is not None:
            notes.append(f"{rc}loss_type {kind!r}: verl's bypass mode takes ppo_clip, reinforce")
        out.update(_rollout_section(c, rc, level, rs))


def _rollout_section(c: Mapping[str, Any], rc: str, level: Any, rs: Any) -> dict[str, Any]:
    """``algorithm.rollout_correction``'s IS and rejection keys as Settings (a threshold
    only beside what it bounds)."""
    out: dict[str, Any] = {"rollout_is": level}
    if isinstance(c.get(rc + "rollout_is_threshold"), int | float | str):
        out["rollout_is_threshold"] = c[rc + "rollout_is_threshold"]
    if isinstance(c.get(rc + "rollout_is_batch_normalize"), bool):
        out["rollout_is_batch_normalize"] = c[rc + "rollout_is_batch_normalize"]
    if isinstance(rs, str) and rs.strip():
        out["rollout_rs"] = rs
        threshold = c.get(rc + "rollout_rs_threshold")
        if isinstance(threshold, int | float | str) and not isinstance(threshold, bool):
            out["rollout_rs_threshold"] = threshold
    return out


# verl 0.9.1 ActorConfig / PolicyLossConfig keys of the losses' parameters -> Settings
LOSS_KEYS = {
    "tau_pos": "sapo_temperature_pos",
    "tau_neg": "sapo_temperature_neg",
    "policy_loss.clip_cov_ratio": "clip_cov_ratio",
    "policy_loss.clip_cov_lb": "clip_cov_lb",
    "policy_loss.clip_cov_ub": "clip_cov_ub",
    "policy_loss.kl_cov_ratio": "kl_cov_ratio",
    "policy_loss.ppo_kl_coef": "ppo_kl_coef",
    "policy_loss.dro_beta": "dro_beta",
}


# ------------------------------------------- a step of several loss calls, as logged
# verl 0.9.1 (workers/utils/losses.py ppo_loss, workers/engine_workers.py train_mini_batch,
# utils/metric/utils.py Metric, reduce_metrics): each call of the actor loss (one
# micro-batch on one data-parallel rank) gives its metrics; within a mini-batch a metric
# is averaged over the ranks, then summed over the micro-batches (the losses, normalised
# by the whole mini-batch: AggregationType.SUM) or averaged over them (the policy loss's
# own metrics: MEAN); the step logs the mean over its mini-batches (every epoch's).
_SUMMED = ("actor/pg_loss", "actor/kl_loss", "actor/loss")
_MINI_BATCH = "_mini_batch"  # which mini-batch a call is in (from its files' metadata)


def _contribution(acc: Folded, key: str, agg: str, info: Mapping[str, Any]) -> float:
    """One micro-batch's share of a loss verl aggregates over the mini-batch
    (``core_algos.agg_loss`` with the global batch info ``ppo_loss`` passes): Σ over the
    micro-batch divided by the mini-batch's tokens (``batch_num_tokens``) or answers
    (``global_batch_size``) and multiplied by ``dp_size``; a file without them (a batch
    recorded whole) is its own mini-batch."""
    tokens, answers = info.get("batch_num_tokens"), info.get("global_batch_size")
    if not isinstance(tokens, int) or not isinstance(answers, int):
        return acc.aggregate(key, agg)
    dp = int(info.get("dp_size", 1) or 1)
    sums = getattr(acc, key)
    if agg == "token-mean":
        return sums.token / max(tokens, 1) * dp
    if agg == "token-sum":
        return sums.token * dp
    if agg == "seq-mean-token-mean":
        return sums.answer_means / max(answers, 1) * dp
    value = sums.token / max(answers, 1) * dp  # seq-mean-token-sum(-norm)
    if agg == "seq-mean-token-sum-norm":
        value /= acc.settings.max_len if acc.settings.max_len is not None else acc.max_width
    return value


def file_metrics(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> dict[str, float]:
    """What one call of verl 0.9.1's ``ppo_loss`` logs on one rank (its ``Metric``s):
    ``actor/pg_loss`` and ``actor/kl_loss`` as shares of the mini-batch's aggregate
    (:func:`_contribution`), ``actor/loss`` (their sum with ``kl_loss_coef``, as the
    engine sums its micro-batches' losses), and the policy loss's own metrics over the
    micro-batch: ``pg_clipfrac``, ``pg_clipfrac_lower`` (token shares), ``ppo_kl`` (the token
    mean of ``old_logp − logp``, clamped to ±20 by the vanilla loss)."""
    del config
    acc = f.acc
    if acc is None:
        return {}
    gspo = s.ratio_level == "sequence"
    t = max(acc.tokens, 1)
    pg = -_contribution(acc, "policy", s.agg, f.info)
    out: dict[str, float] = {"actor/pg_loss": pg}
    loss = pg
    if s.beta != 0.0 and s.kl_mode == "loss":
        kl = _contribution(acc, "kl", s.kl_aggregation, f.info)
        out["actor/kl_loss"] = kl
        loss += s.beta * kl
    out["actor/loss"] = loss
    if s.loss == "clip":
        out["actor/pg_clipfrac"] = acc.clip.region / t
        out["actor/pg_clipfrac_lower"] = 0.0 if gspo else acc.clip.dual / t
        lr = acc.log_ratios
        out["actor/ppo_kl"] = -(lr.delta if gspo else lr.delta20) / t
    else:  # another loss logs its own metrics (compute_policy_loss_<mode>)
        out.update({k: v for k, v in acc.loss_metrics.values().items() if v is not None})
    out[_MINI_BATCH] = float(f.info.get("mini_batch", 0))
    return out


def call_metrics(s: Settings, c: CallInputs, config: Mapping[str, Any]) -> dict[str, float | None]:
    """Nothing over the ranks pooled: verl averages each rank's values (:func:`file_metrics`)."""
    del s, c, config
    return {}


def _file_loss(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> float | None:
    del s, f, config
    return None  # verl's step loss is actor/loss, of file_metrics


def _generation_metrics(s: Settings, rows: Mapping[str, Any]) -> dict[str, float | None]:
    del s, rows
    return {}


def combine(
    calls: list[dict[str, float | None]],
    losses: list[list[float | None]],
    steps: int,
    generations: list[dict[str, float | None]],
) -> dict[str, float | None]:
    """The step's logged actor metrics (``reduce_metrics`` of ``_update_actor``'s output):
    within each mini-batch a loss summed over its calls, any other metric averaged over
    them; then the mean over the mini-batches."""
    del losses, steps, generations
    groups: dict[float, list[dict[str, float | None]]] = {}
    for c in calls:
        groups.setdefault(c.get(_MINI_BATCH) or 0.0, []).append(c)
    per_mini: list[dict[str, float]] = []
    for members in groups.values():
        one: dict[str, float] = {}
        for name in dict.fromkeys(k for c in members for k in c if k != _MINI_BATCH):
            values = [v for c in members if (v := c.get(name)) is not None]
            if values:
                total = sum(values)
                one[name] = total if name in _SUMMED else total / len(values)
        per_mini.append(one)
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(k for m in per_mini for k in m):
        values = [m[name] for m in per_mini if name in m]
        out[name] = sum(values) / len(values) if values else None
    return out


CALLS = CallRules(call_metrics, _file_loss, _generation_metrics, combine, file_metrics)
_RC = "algorithm.rollout_correction."
# Every verl 0.9.1 config key this module reads (dotted, as meta.json holds them), with its
# type and range (verl's ActorConfig, PolicyLossConfig, AlgoConfig dataclasses)
CONFIG_KEYS: dict[str, Key] = {
    "algorithm.adv_estimator": text(),
    "algorithm.norm_adv_by_std_in_grpo": boolean(),
    ACTOR + "clip_ratio": number(low=0, null=True),
    ACTOR + "clip_ratio_low": number(low=0, null=True),
    ACTOR + "clip_ratio_high": number(low=0, null=True),
    ACTOR + "clip_ratio_c": number(low=1, low_open=True, null=True),
    ACTOR + "policy_loss.loss_mode": text(null=True),
    ACTOR + "loss_agg_mode": text(null=True),
    ACTOR + "loss_scale_factor": integer(low=1, null=True),
    "algorithm.use_kl_in_reward": boolean(),
    "algorithm.kl_ctrl.kl_coef": number(low=0),
    "algorithm.kl_penalty": text(null=True),
    ACTOR + "use_kl_loss": boolean(),
    ACTOR + "kl_loss_coef": number(low=0),
    ACTOR + "kl_loss_type": text(null=True),
    _RC + "rollout_is": text(null=True),
    _RC + "rollout_rs": text(null=True),
    _RC + "bypass_mode": boolean(null=True),
    _RC + "loss_type": text(null=True),
    _RC + "rollout_is_threshold": either(number(low=0, low_open=True), text(), null=True),
    _RC + "rollout_is_batch_normalize": boolean(null=True),
    _RC + "rollout_rs_threshold": either(number(), text(), null=True),
    **{ACTOR + key: number(null=True) for key in LOSS_KEYS},
}

# verl 0.9.1's rejection options (algorithm.rollout_correction.rollout_rs, comma-separated)
RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3",
)  # fmt: skip


def _bound(text: str, band: bool, ratio: bool = False) -> bool:
    """One threshold of verl's: a number > 0, or (``band``) ``"lower_upper"`` with
    0 < lower <= upper; a single ``ratio`` bound ``u`` is the band ``1/u_u`` (u >= 1)."""
    try:
        if "_" in text:
            lo, hi = (float(x) for x in text.split("_", 1))
            return band and 0 < lo <= hi
        u = float(text)
        return 1 <= u < math.inf if ratio else u > 0
    except ValueError:
        return False


def _rollout_keys(c: Mapping[str, Any]) -> str | None:
    """The rollout correction's option strings, read as verl reads them: ``rollout_is``'s
    threshold a number or a ``lower_upper`` band; ``rollout_rs`` known options, with one
    threshold shared or one each (a k1 option's may be a band)."""
    t = c.get(_RC + "rollout_is_threshold")
    if isinstance(t, str) and not _bound(t.strip(), band=True):
        return (
            f"config key '{_RC}rollout_is_threshold' is {t!r}: expected a number > 0 or "
            "'lower_upper' with 0 < lower <= upper"
        )
    rs = c.get(_RC + "rollout_rs")
    if not isinstance(rs, str) or not rs.strip():
        return None
    options = list(dict.fromkeys(o.strip() for o in rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in RS_OPTIONS]
    if unknown:
        return (
            f"config key '{_RC}rollout_rs' is {rs!r}: {unknown[0]!r} is not one of verl's "
            f"options ({', '.join(RS_OPTIONS)})"
        )
    spec = c.get(_RC + "rollout_rs_threshold")
    raw = [str(spec)] if not isinstance(spec, str) else [x.strip() for x in spec.split(",")]
    raw = [x for x in raw if x and spec is not None]
    key = f"config key '{_RC}rollout_rs_threshold'"
    if len(raw) not in (1, len(options)):
        return f"{key} is {spec!r}: expected one threshold, or one per rollout_rs option"
    for opt, x in zip(options, raw * len(options) if len(raw) == 1 else raw, strict=True):
        k1 = opt.endswith("k1")  # a ratio's bounds
        if not _bound(x, band=k1, ratio=k1):
            want = "a finite number >= 1 or 'lower_upper'" if k1 else "a number > 0"
            return f"{key} is {spec!r}: {opt} takes {want}, got {x!r}"
    return None


TRAINER = Trainer(
    name="verl",
    releases=RELEASES,
    presets=PRESETS,
    reward_kl="score",
    kl_agg_follows_config=True,
    dependent=dependent,
    from_config=checked(CONFIG_KEYS, from_config, (_rollout_keys,)),
    calls=CALLS,
)
