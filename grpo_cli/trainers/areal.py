"""AReaL (inclusionAI) 1.0.4: the preset, its actor config (``PPOActorConfig``) as
settings, and the ``ppo_actor/update/*`` statistics its PPO update logs.

Read from the areal 1.0.4 wheel: ``areal/utils/functional/functional.py``
(``ppo_actor_loss_fn``: ratio π_θ/π_prox unclamped, ``eps_clip`` / ``eps_clip_higher``,
the dual clip ``c_clip`` as ``min(loss, c·|A|)``, the per-token loss summed over the
micro-batch's ``loss_mask`` and divided by its count; ``importance_sampling_level=
"sequence"``: GSPO's exp(mean Δ) for every token of a sequence, its advantage the
sequence's mean; ``sapo_loss_fn``), ``areal/trainer/ppo/actor.py`` (``grpo_loss_fn``,
``PPOActor._compute_advantages``: the KL only as reward shaping, −``kl_ctl``·KL(old, ref)
per token, the score at the last response token, GAE with ``discount`` and
``gae_lambda``; ``_ppo_update``: ``ppo_n_minibatches`` optimizer steps over one
rollout batch) and ``areal/utils/stats_tracker.py`` (``stat(..., denominator=
"n_valid_tokens")``: every recorded tensor summed where its denominator mask is set,
over every micro-batch of the update, and divided by the mask's count: a token mean
over the step's loss tokens; ``export`` adds ``/avg``, ``/min``, ``/max``).

So the step's ``ppo_actor/update/actor_loss/avg`` is grpo-cli's ``token-mean`` of the
per-token loss over every answer of the step, whatever the minibatches; the ratio's
denominator is the proximal policy (``prox_logp``: the recomputed log-probs, or the
sampler's when ``recompute_logprob`` is off), which a recorded run holds as
``old_logp``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import MetricInputs, Release, Trainer, with_loss_metrics
from .config import Key, boolean, checked, choice, integer, number, text

P = "ppo_actor/update/"
METRICS = (
    P + "actor_loss/avg",
    P + "importance_weight/avg",
    P + "approx_kl/avg",
    P + "clip_ratio/avg",
    P + "dual_clip_ratio/avg",
    P + "entropy/avg",
    P + "new_logp/avg",
    P + "old_logp/avg",
    "ppo_actor/kl_rewards/avg",
)

MISSING = {
    P + "new_logp/avg": (
        "the token mean of the current log-probs themselves: not one of the fold's sums "
        "(its ratio and KL sums are of differences)"
    ),
    P + "old_logp/avg": (
        "the token mean of the behaviour log-probs themselves: not one of the fold's sums"
    ),
    # None only where the input or the settings do not give it
    P + "importance_weight/avg": (
        "importance_sampling_level sequence: AReaL's token mean of each sequence's "
        "exp(mean Δ), broadcast to its tokens; the fold sums the token ratios"
    ),
    P + "entropy/avg": "the token mean of the training forward's entropy: not recorded",
}


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """AReaL 1.0.4's ``ppo_actor/update/*/avg`` of one ``ppo_update`` (module docstring):
    ``actor_loss`` the token mean of the per-token loss (−the policy term, token-mean),
    ``importance_weight`` the token mean of ρ (token level), ``approx_kl`` the token mean
    of ``logp − prox_logp`` (its sign, not verl's), ``clip_ratio`` the share of tokens
    in the clip region, ``dual_clip_ratio`` the share the dual clip bounds (0 without
    ``c_clip``), ``entropy`` the token mean of the recorded entropy; ``kl_rewards`` (the
    reward shaping) the token mean of −``kl_ctl``·KL(old, ref)."""
    s, acc = m.settings, m.acc
    t = max(acc.tokens, 1)
    lr = acc.log_ratios
    out: dict[str, float | None] = {P + "actor_loss/avg": -m.policy_term}
    token = s.ratio_level == "token"
    out[P + "importance_weight/avg"] = acc.ratio.total / t if token else None
    out[P + "approx_kl/avg"] = lr.delta / t
    out[P + "clip_ratio/avg"] = m.clip.region if s.loss == "clip" else 0.0
    dual = m.clip.dual_clip_lower
    out[P + "dual_clip_ratio/avg"] = 0.0 if dual is None or s.loss != "clip" else dual
    ent = acc.entropy
    out[P + "entropy/avg"] = ent.mean if getattr(ent, "n", 0) > 0 else None
    out[P + "new_logp/avg"] = None
    out[P + "old_logp/avg"] = None
    if s.kl_mode == "reward":
        out["ppo_actor/kl_rewards/avg"] = -s.beta * acc.reward_kl.token / t if s.beta else 0.0
    out = with_loss_metrics(out, m, ())
    return {k: out[k] for k in (*METRICS, *out) if k in out}


PRESET: dict[str, Any] = {
    # the advantages AReaL's GRPO recipes configure (adv_norm mean_level/std_level
    # "group"): NormConfig's unbiased std, eps 1e-5 (a recorded run's own advantages
    # are used whatever these say)
    "ddof": 1,
    "eps": 1e-5,
    # ppo_actor_loss_fn: the PPO clip 0.2 both sides, no dual clip, Δ not clamped,
    # token-mean over the step (stats_tracker's n_valid_tokens)
    "agg": "token-mean",
    "clip_eps": 0.2,
    "clip_eps_high": None,
    "dual_clip": None,
    "log_ratio_clamp": None,
    # kl_ctl 0.1, kl_estimator k1: the KL as reward shaping, summed from each token on
    # (GAE with discount = gae_lambda = 1, no values), never a loss term
    "kl_mode": "reward",
    "beta": 0.1,
    "kl_estimator": "k1",
    "kl_clamp": None,
}

RELEASES = (
    Release(
        first="1.0.4",
        last="1.0.4",
        checked="1.0.4",
        preset=PRESET,
        metrics=metrics,
        metric_names=METRICS,
        missing=MISSING,
        changes=(
            "areal/utils/functional/functional.py ppo_actor_loss_fn, sapo_loss_fn; "
            "areal/trainer/ppo/actor.py grpo_loss_fn, PPOActor._compute_advantages, "
            "_ppo_update; areal/utils/stats_tracker.py",
        ),
        notes=(
            "decoupled PPO's behaviour weight (use_decoupled_loss with rejection_sampling) "
            "is not applied",
        ),
    ),
)

_LEVELS = ("batch", "group", None)


def _norm(c: Mapping[str, Any], name: str, out: dict[str, Any], notes: list[str]) -> None:
    """``adv_norm`` / ``reward_norm`` (a NormConfig, flattened ``name.mean_level`` ...)."""
    mean, std = c.get(name + ".mean_level"), c.get(name + ".std_level")
    if mean is None and std is None:
        return
    if mean == std == "group":
        out["scale"] = "group"
    elif mean == std == "batch" and name == "reward_norm":
        notes.append(f"{name}: batch mean and std: the recorded advantages are used")
    elif mean == "group" and std is None:
        out["scale"] = "none"
    else:
        notes.append(f"{name}: mean {mean}, std {std}: the recorded advantages are used")
    if isinstance(c.get(name + ".std_unbiased"), bool):
        out["ddof"] = 1 if c[name + ".std_unbiased"] else 0
    if isinstance(c.get(name + ".eps"), int | float):
        out["eps"] = float(c[name + ".eps"])
    if c.get(name + ".mean_leave1out"):
        notes.append(f"{name}.mean_leave1out: the recorded advantages are used")


def from_config(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """AReaL 1.0.4's ``PPOActorConfig`` fields (``actor.*`` of its YAML, NormConfigs
    flattened as ``adv_norm.mean_level`` ...) as Settings: ``eps_clip``,
    ``eps_clip_higher``, ``c_clip``, ``importance_sampling_level`` (sequence: GSPO's
    ratio), ``use_sapo_loss`` (``areal/sapo``, ``sapo_tau_pos``/``_neg``), ``kl_ctl`` and
    ``kl_estimator`` (the reward shaping), ``reward_norm`` / ``adv_norm``; what is not
    computed is named in a note."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    if isinstance(c.get("eps_clip"), int | float):
        out["clip_eps"] = float(c["eps_clip"])
    if "eps_clip_higher" in c:
        high = c["eps_clip_higher"]
        out["clip_eps_high"] = None if high is None else float(high)
    if "c_clip" in c:
        out["dual_clip"] = None if c["c_clip"] is None else float(c["c_clip"])
    if c.get("importance_sampling_level") == "sequence":
        out["ratio_level"] = "sequence"
    if c.get("use_sapo_loss"):
        out["loss"] = "areal/sapo"
        params = {}
        for key in ("sapo_tau_pos", "sapo_tau_neg"):
            if isinstance(c.get(key), int | float):
                params[key] = float(c[key])
        if params:
            out["loss_params"] = params
    if isinstance(c.get("kl_ctl"), int | float):
        out["beta"] = float(c["kl_ctl"])
    if c.get("kl_estimator") in ("k1", "k2", "k3"):
        out["kl_estimator"] = c["kl_estimator"]
    _norm(c, "reward_norm", out, notes)
    _norm(c, "adv_norm", out, notes)
    if c.get("use_decoupled_loss") and c.get("rejection_sampling.level") is not None:
        notes.append(
            "use_decoupled_loss with rejection_sampling: AReaL's behaviour importance weight "
            "(prox vs behaviour log-probs) is not applied"
        )
    if c.get("use_decoupled_loss") and c.get("kl_ctl", 0.1):
        notes.append(
            "use_decoupled_loss: AReaL's KL shaping takes the behaviour log-probs "
            "(rollout_logp), the kl_rewards here the proximal ones (old_logp)"
        )
    if c.get("m2_threshold") is not None:
        notes.append("m2_threshold: AReaL's M2PO token mask is not applied")
    for key, neutral in (("discount", 1.0), ("gae_lambda", 1.0)):
        if isinstance(c.get(key), int | float) and float(c[key]) != neutral:
            notes.append(f"{key} {c[key]}: the recorded advantages are used")
    return out, notes


_NORM: dict[str, Key] = {
    f"{n}.{k}": key
    for n in ("adv_norm", "reward_norm")
    for k, key in (
        ("mean_level", choice(*_LEVELS, null=True)),
        ("std_level", choice(*_LEVELS, null=True)),
        ("std_unbiased", boolean()),
        ("eps", number(low=0)),
        ("group_size", integer(low=1)),
        ("mean_leave1out", boolean()),
    )
}
# Every PPOActorConfig field this module reads, with its type and range
CONFIG_KEYS: dict[str, Key] = {
    "eps_clip": number(low=0),
    "eps_clip_higher": number(low=0, null=True),
    "c_clip": number(low=1, low_open=True, null=True),
    "importance_sampling_level": choice("token", "sequence"),
    "use_sapo_loss": boolean(),
    "sapo_tau_pos": number(low=0, low_open=True),
    "sapo_tau_neg": number(low=0, low_open=True),
    "kl_ctl": number(low=0),
    "kl_estimator": text(),
    "use_decoupled_loss": boolean(),
    "rejection_sampling.level": text(null=True),
    "m2_threshold": number(null=True),
    "discount": number(low=0),
    "gae_lambda": number(low=0),
    **_NORM,
}

TRAINER = Trainer(
    name="areal",
    releases=RELEASES,
    presets={"areal": PRESET},
    reward_kl="returns",
    from_config=checked(CONFIG_KEYS, from_config),
)
