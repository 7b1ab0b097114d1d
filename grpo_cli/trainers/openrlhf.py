"""OpenRLHF's PPO trainer with ``--advantage_estimator group_norm``, release by release from
0.6.0 to 0.11.2: presets, dependent settings, the KL in the reward, logged metrics.

Each :class:`~grpo_cli.trainers.base.Release` is a change point found by diffing, between
consecutive release wheels, ``openrlhf/models/loss.py`` (``PolicyLoss``,
``aggregate_loss``), ``openrlhf/models/utils.py`` (``compute_approx_kl``,
``compute_reward``), ``openrlhf/trainer/ppo_utils/experience_maker.py`` (the group_norm
advantages, the per-answer ``kl`` and ``logprobs_diff``), ``openrlhf/trainer/ray/
ppo_actor.py`` (the KL loss and what is logged) and ``openrlhf/cli/train_ppo_ray.py`` (the
defaults), and checked by ``conformance/releases``.

Its default puts the KL into the reward: −β·k1(old_logp, ref_logp), clamped to ±10 per
token (from 0.8.6), joins every token's reward after the group normalisation and is
summed from each token to the end (``get_cumulative_returns``). ``--algo.kl.use_loss``
(``--use_kl_loss`` before 0.10.2) puts it into the loss instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
from .config import Key, boolean, checked, choice, number, numbers, text

METRICS = ("policy_loss", "ppo_clip_ratio", "ppo_kl", "kl", "logprobs_diff")


def dependent(values: Mapping[str, Any], default: Default) -> None:
    """OpenRLHF 0.8.9–0.11.2 ``PolicyLoss`` with ``policy_loss_type="gspo"``: per-sample
    aggregation (``token_level_loss=False``); the KL loss stays per token."""
    if values["ratio_level"] == "sequence":
        default("agg", "seq-mean-token-mean")


def _no_gspo(values: Mapping[str, Any], default: Default) -> None:
    """OpenRLHF 0.6.0–0.8.7: no sequence-level loss (``policy_loss_type`` is 0.8.8's)."""
    del default
    if values["ratio_level"] == "sequence":
        from ..errors import SettingError

        raise SettingError(
            "ratio_level",
            f"sequence: {values['mirrors']} has no GSPO loss (OpenRLHF added it in 0.8.8)",
        )


def _gspo_token_mean(values: Mapping[str, Any], default: Default) -> None:
    """OpenRLHF 0.8.8: GSPO aggregated as the ppo loss (token-mean): nothing follows."""
    del values, default


def _metrics(
    m: MetricInputs,
    *,
    clip_ratio: bool = True,
    ppo_kl: bool = True,
    logprobs_diff: bool = True,
    answer_kl: bool = True,
) -> dict[str, float | None]:
    s, acc = m.settings, m.acc
    t = max(acc.tokens, 1)
    lr = acc.log_ratios
    out: dict[str, float | None] = {"policy_loss": -m.policy_term}
    if clip_ratio:
        out["ppo_clip_ratio"] = m.clip.region
    if ppo_kl:
        out["ppo_kl"] = -lr.delta / t
    if s.kl_mode == "reward":  # per-answer means of old vs ref, over answers
        n = max(acc.answers, 1)
        if answer_kl:
            out["kl"] = acc.reward_kl.answer_means / n if s.beta != 0.0 else 0.0
        else:
            out["kl"] = None
        if logprobs_diff:
            out["logprobs_diff"] = acc.old_ref.answer_means / n if s.beta != 0.0 else 0.0
    else:
        out["kl"] = acc.aggregate("kl", s.kl_aggregation) if s.beta != 0.0 else 0.0
        if logprobs_diff:
            out["logprobs_diff"] = -lr.ref / t if s.beta != 0.0 else 0.0
    return out


def metrics_0_6(m: MetricInputs) -> dict[str, float | None]:
    """OpenRLHF 0.6.0–0.8.2: ``policy_loss`` and ``kl`` only (with the KL in the reward,
    the mean over answers of each answer's token-mean KL; with ``--use_kl_loss`` the KL
    loss as aggregated)."""
    return _metrics(m, clip_ratio=False, ppo_kl=False, logprobs_diff=False)


def metrics_0_7_0(m: MetricInputs) -> dict[str, float | None]:
    """OpenRLHF 0.7.0–0.7.1: as 0.6.0, but ``make_experience``'s per-answer ``kl`` is
    ``masked_mean(kl, None, dim=-1)``: a mean over the padded width, padding positions
    (the models' log-probs of pad tokens) included. The input holds no padding
    log-probs: left out with the KL in the reward (:data:`MISSING_0_7_0`)."""
    return _metrics(m, clip_ratio=False, ppo_kl=False, logprobs_diff=False, answer_kl=False)


MISSING_0_7_0 = {
    "kl": (
        "OpenRLHF 0.7.0–0.7.1 experience_maker.py make_experience: kl_mean = "
        "masked_mean(kl, None, dim=-1), the per-answer mean of compute_approx_kl over the "
        "padded response width (pad positions' log-probs included), then the mean over "
        "answers. Needs per answer the sum of the KL over its padding positions and the "
        "padded width: the input does not record padding log-probs"
    )
}


def metrics_0_8_3(m: MetricInputs) -> dict[str, float | None]:
    """OpenRLHF 0.8.3–0.8.7: ``ppo_clip_ratio`` (``lt(surr2, surr1)``: the clip region)."""
    return _metrics(m, ppo_kl=False, logprobs_diff=False)


def metrics_0_8_8(m: MetricInputs) -> dict[str, float | None]:
    """OpenRLHF 0.8.8–0.9.1: ``ppo_kl`` (the token mean of the raw ``old_logp − logp``)."""
    return _metrics(m, logprobs_diff=False)


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """OpenRLHF 0.9.2–0.11.2 (``PolicyLoss``, ``--algo.kl.use_loss``): ``policy_loss`` the
    aggregated policy loss, ``ppo_clip_ratio`` the clip region's share, ``ppo_kl`` the
    token mean of the raw ``old_logp − logp``, ``kl`` the KL loss as aggregated (the token
    mean), ``logprobs_diff`` the token mean of ``logp − ref_logp``; with the KL in the
    reward, ``kl`` and ``logprobs_diff`` are means over answers of old vs ref (0 when
    β = 0); with the IS correction its ``vllm_kl`` and ``is_filter_ratio``."""
    return with_loss_metrics(_metrics(m), m, ())


# --advantage_estimator group_norm: sample std, eps 1e-9, the normalised reward clipped to
# ±10 (--reward_clip_range), the KL in the reward, k1, init_kl_coef 0.01
_BASE = {
    "ddof": 1,
    "eps": 1e-9,
    "adv_clip": 10.0,
    "kl_estimator": "k1",
    "kl_mode": "reward",
    "beta": 0.01,
}
_L = "openrlhf/models/loss.py"
_U = "openrlhf/models/utils.py"
_A = "openrlhf/trainer/ray/ppo_actor.py"
_E = "openrlhf/trainer/ppo_utils/experience_maker.py"
_NO_IS = "the vLLM importance-sampling correction (0.8.9 on) is not applied"

RELEASES = (
    Release(
        first="0.6.0",
        last="0.6.4",
        checked="0.6.4",
        preset={**_BASE, "agg": "seq-mean-token-mean", "kl_agg": "seq-mean-token-mean"},
        metrics=metrics_0_6,
        metric_names=("policy_loss", "kl"),
        dependent=_no_gspo,
        changes=(
            f"{_L}: PolicyLoss: −min(ρA, clip(ρ, 1±ε)A), masked_mean(dim=-1).mean() "
            "(seq-mean-token-mean), Δ not clamped",
            f"{_U}: compute_approx_kl: k1 (k3 with use_kl_estimator_k3; k2 and "
            "kl_estimator from 0.6.1), not clamped",
            f"{_E}: group_norm (r − mean) / (std + 1e-9), compute_reward clamps to "
            "reward_clip_range (−10, 10)",
            f"{_A} / ppo_trainer.py: --use_kl_loss: masked_mean(kl, dim=-1).mean() "
            "(seq-mean-token-mean)",
        ),
    ),
    Release(
        first="0.7.0",
        last="0.7.1",
        checked="0.7.1",
        preset={**_BASE, "agg": "token-mean", "kl_agg": "seq-mean-token-mean"},
        metrics=metrics_0_7_0,
        metric_names=("policy_loss", "kl"),
        missing=MISSING_0_7_0,
        dependent=_no_gspo,
        changes=(
            f"{_L}: PolicyLoss(token_level_loss=True): masked_mean over all tokens (token-mean)",
            f"{_E}: make_experience: kl_mean = masked_mean(kl, None, dim=-1) (the padded width)",
        ),
    ),
    Release(
        first="0.7.2",
        last="0.8.2",
        checked="0.8.2",
        preset={**_BASE, "agg": "token-mean", "kl_agg": "token-mean"},
        metrics=metrics_0_6,
        metric_names=("policy_loss", "kl"),
        dependent=_no_gspo,
        changes=(
            f"{_A}: --use_kl_loss: kl_loss = masked_mean(kl, action_mask) (token-mean)",
            f"{_E}: make_experience: kl_mean over the action mask again",
            f"{_L} (0.8.2): clip_eps_low / clip_eps_high (--eps_clip_low_high)",
        ),
    ),
    Release(
        first="0.8.3",
        last="0.8.5",
        checked="0.8.5",
        preset={**_BASE, "agg": "token-mean", "kl_agg": "token-mean"},
        metrics=metrics_0_8_3,
        metric_names=("policy_loss", "ppo_clip_ratio", "kl"),
        dependent=_no_gspo,
        changes=(f"{_L}: PolicyLoss returns clip_ratio = masked_mean(lt(surr2, surr1))",),
    ),
    Release(
        first="0.8.6",
        last="0.8.7",
        checked="0.8.7",
        preset={**_BASE, "agg": "token-mean", "kl_agg": "token-mean", "kl_clamp": 10.0},
        metrics=metrics_0_8_3,
        metric_names=("policy_loss", "ppo_clip_ratio", "kl"),
        dependent=_no_gspo,
        changes=(
            f"{_U}: compute_approx_kl: the estimate clamped to ±10",
            f"{_L}: PolicyLoss dual_clip (--dual_clip)",
        ),
    ),
    Release(
        first="0.8.8",
        last="0.8.8",
        checked="0.8.8",
        preset={**_BASE, "agg": "token-mean", "kl_agg": "token-mean", "kl_clamp": 10.0},
        metrics=metrics_0_8_8,
        metric_names=("policy_loss", "ppo_clip_ratio", "ppo_kl", "kl"),
        dependent=_gspo_token_mean,
        changes=(
            f"{_L}: PolicyLoss policy_loss_type 'gspo' (aggregated as 'ppo': token-mean); "
            "returns ppo_kl = masked_mean(−(logp − old_logp))",
        ),
    ),
    Release(
        first="0.8.9",
        last="0.9.1",
        checked="0.9.1",
        preset={**_BASE, "agg": "token-mean", "kl_agg": "token-mean", "kl_clamp": 10.0},
        metrics=metrics_0_8_8,
        metric_names=("policy_loss", "ppo_clip_ratio", "ppo_kl", "kl"),
        changes=(
            f"{_L}: PolicyLoss: gspo sets token_level_loss=False (seq-mean-token-mean); "
            "vllm_is_truncated_threshold (TIS)",
        ),
        notes=(_NO_IS,),
    ),
    Release(
        first="0.9.2",
        last="0.10.2",
        checked="0.10.2",
        preset={**_BASE, "agg": "token-mean", "kl_agg": "token-mean", "kl_clamp": 10.0},
        metrics=metrics,
        metric_names=METRICS,
        changes=(
            f"{_A}, {_E}: logprobs_diff logged (the token mean of logp − ref_logp with the "
            "KL loss; the mean over answers of old_logp − ref_logp with the KL in the "
            "reward)",
        ),
        notes=(_NO_IS,),
    ),
    Release(
        first="0.10.3",
        last="0.11.2",
        checked="0.11.2",
        preset={
            **_BASE,
            "agg": "token-mean",
            "kl_agg": "token-mean",
            "kl_clamp": 10.0,
            "log_ratio_clamp": 20.0,
        },
        metrics=metrics,
        metric_names=METRICS,
        changes=(
            f"{_L}: PolicyLoss 'ppo': Δ clamped to ±20 before exp (ppo_kl from the raw Δ); "
            "aggregate_loss",
            f"{_U} (0.11.2): k3's log-ratio clamped at −10 before exp: the same value "
            "after the ±10 clamp",
        ),
        notes=(_NO_IS,),
    ),
)

PRESETS = {
    # --advantage_estimator group_norm, PolicyLoss "ppo", the KL in the reward: sample std,
    # eps 1e-9, advantages clipped to ±10 (--reward.clip_range), then −β·k1(old_logp,
    # ref_logp) clamped to ±10 per token, summed from each token to the end;
    # init_kl_coef 0.01; token-mean, Δ clamp 20. --kl-mode loss is --algo.kl.use_loss.
    "openrlhf": dict(RELEASES[-1].preset),
}

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
    # PolicyLoss with policy_loss_type "gspo" aggregates per sample whatever
    # loss_agg_mode says (models/loss.py: token_level_loss = False): the dependent rule
    if c.get("actor.loss_agg_mode") in AGGREGATIONS and kind != "gspo":
        out["agg"] = c["actor.loss_agg_mode"]
    clip = c.get("reward.clip_range")
    if isinstance(clip, list | tuple) and len(clip) == 2 and -clip[0] == clip[1] > 0:
        out["adv_clip"] = float(clip[1])
    elif clip is not None:
        notes.append(f"reward.clip_range {clip}: grpo-cli clips advantages to a range ±c only")
    adv = "algo.advantage.is_correction_"
    level = c.get(adv + "level")
    if level in ("token", "seq") and kind == "gspo":
        notes.append(
            f"{adv}level {level!r} with gspo takes the sequence ratio against the sampler's "
            "log-probs: not applied here (give rollout_logp as old_logp)"
        )
    elif level in ("token", "seq"):
        out["correction"] = "openrlhf-is"
        out["is_correction_level"] = level
        for key in ("mode", "gating"):
            if isinstance(c.get(adv + key), str):
                out[f"is_correction_{key}"] = c[adv + key]
        t = c.get(adv + "threshold")
        if isinstance(t, int | float) and not isinstance(t, bool):
            t = [t]
        if isinstance(t, list | tuple) and len(t) in (1, 2):
            low, high = (0.0, t[0]) if len(t) == 1 else (t[0], t[1])  # one value: HIGH
            out["is_correction_low"], out["is_correction_high"] = float(low), float(high)
    elif level not in (None, "off"):
        notes.append(f"{adv}level {level!r}: grpo-cli computes off, token and seq")
    return out, notes


# ------------------------------------------- a step of several loss calls, as logged
# OpenRLHF 0.11.2 (trainer/ray/ppo_actor.py ActorPPOTrainer.ppo_train): each
# training_step (one micro-batch on one rank) gives its metrics, a 0-D tensor weighted
# by the micro-batch's action tokens ("token"), a per-sample one by its samples
# ("sample"); ppo_train all-reduces value × weight and the weights over the ranks, divides,
# and logs the mean over all micro-batches (every epoch's) weighted the same way: the
# weighted mean over every rank's micro-batch. A call's losses are normalised by its
# optimizer step's tokens (loss_batch_info, utils/loss_utils.py).
_TOKENS, _SAMPLES = "_tokens", "_samples"


def _loss_share(acc: Folded, key: str, agg: str, info: Mapping[str, Any]) -> float:
    """One micro-batch's loss as ``aggregate_loss`` gives it with ``loss_batch_info``: its
    sum over the optimizer step's ``batch_num_tokens`` (token-mean) or ``global_batch_size``
    (per-sample means), times ``dp_size``; without them the micro-batch's own mean."""
    tokens, answers = info.get("batch_num_tokens"), info.get("global_batch_size")
    if not isinstance(tokens, int | float) or not isinstance(answers, int | float):
        return acc.aggregate(key, agg)
    dp = float(info.get("dp_size") or 1)
    sums = getattr(acc, key)
    if agg == "token-mean":
        return sums.token / max(float(tokens), 1e-30) * dp
    return sums.answer_means / max(float(answers), 1e-30) * dp


def file_metrics(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> dict[str, float]:
    """One ``training_step``'s metrics on one rank, each times its weight (the micro-batch's
    action tokens or samples, summed by :func:`combine`): ``policy_loss`` and, with the KL
    loss, ``kl`` (normalised by the optimizer step, :func:`_loss_share`), ``ppo_clip_ratio``
    and ``ppo_kl`` (token means), ``logprobs_diff`` (the token mean of ``logp − ref_logp``);
    with the KL in the reward, ``kl`` and ``logprobs_diff`` are the experiences' per-sample
    values (old vs ref)."""
    del config
    acc = f.acc
    if acc is None:
        return {}
    t, n = float(acc.tokens), float(acc.answers + f.empty)
    lr = acc.log_ratios
    out = {
        _TOKENS: t,
        _SAMPLES: n,
        "policy_loss": -_loss_share(acc, "policy", s.agg, f.info) * t,
        "ppo_clip_ratio": float(acc.clip.region),
        "ppo_kl": -lr.delta,
    }
    if s.kl_mode == "reward":
        out["kl"] = acc.reward_kl.answer_means if s.beta != 0.0 else 0.0
        out["logprobs_diff"] = acc.old_ref.answer_means if s.beta != 0.0 else 0.0
    elif s.beta != 0.0:
        out["kl"] = _loss_share(acc, "kl", s.kl_aggregation, f.info) * t
        out["logprobs_diff"] = -lr.ref
    return out


_PER_SAMPLE = ("kl", "logprobs_diff")  # with the KL in the reward


def combine(
    calls: list[dict[str, float | None]],
    losses: list[list[float | None]],
    steps: int,
    generations: list[dict[str, float | None]],
) -> dict[str, float | None]:
    """``ppo_train``'s status: each metric's weighted sum over the calls over the sum of
    the weights (module comment above :data:`_TOKENS`)."""
    del losses, steps, generations
    tokens = sum(c.get(_TOKENS) or 0.0 for c in calls)
    samples = sum(c.get(_SAMPLES) or 0.0 for c in calls)
    in_reward = bool(calls and calls[0].get("_kl_in_reward"))
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(k for c in calls for k in c if not k.startswith("_")):
        total = sum(v for c in calls if (v := c.get(name)) is not None)
        weight = samples if in_reward and name in _PER_SAMPLE else tokens
        out[name] = total / weight if weight else None
    return out


def call_metrics(s: Settings, c: CallInputs, config: Mapping[str, Any]) -> dict[str, float | None]:
    """Whether the KL is the reward's (its per-sample ``kl`` is weighted by samples)."""
    del c, config
    return {"_kl_in_reward": 1.0 if s.kl_mode == "reward" else 0.0}


def _file_loss(s: Settings, f: FileInputs, config: Mapping[str, Any]) -> float | None:
    del s, f, config
    return None


def _generation_metrics(s: Settings, rows: Mapping[str, Any]) -> dict[str, float | None]:
    del s, rows
    return {}


CALLS = CallRules(call_metrics, _file_loss, _generation_metrics, combine, file_metrics)

_ADV = "algo.advantage.is_correction_"
# Every OpenRLHF 0.11.2 argument this module reads (dotted, as argparse holds them), with
# its type and range
CONFIG_KEYS: dict[str, Key] = {
    "algo.advantage.estimator": text(null=True),
    "algo.advantage.no_std_norm": boolean(null=True),
    "algo.kl.use_loss": boolean(),
    "algo.kl.init_coef": number(low=0),
    "algo.kl.estimator": choice("k1", "k2", "k3", null=True),
    "actor.eps_clip_low_high": numbers(2, low=0, null=True),
    "actor.eps_clip": number(low=0),
    "actor.dual_clip": number(low=1, low_open=True, null=True),
    "actor.policy_loss_type": text(null=True),
    "actor.loss_agg_mode": choice(*AGGREGATIONS, null=True),
    "reward.clip_range": numbers(2, null=True),
    _ADV + "level": text(null=True),  # off, token, seq; another is named in a note
    _ADV + "mode": choice("mask", "clip", null=True),  # OpenRLHF 0.11.2's argparse choices
    _ADV + "gating": choice("ratio", "binary_kl", "tv", null=True),
    _ADV + "threshold": numbers(1, 2, low=0, one=True, null=True),
}

TRAINER = Trainer(
    name="openrlhf",
    releases=RELEASES,
    presets=PRESETS,
    reward_kl="returns",
    dependent=dependent,
    from_config=checked(CONFIG_KEYS, from_config),
    calls=CALLS,
)
