"""The factor behind a logged difference: when a metric the trainer logged disagrees with
grpo-cli's value of it, the known explanations are tried against the recomputed value and
the one that reproduces the logged value within float32 rounding is named, with the
trainer's issue or code line; none reproduces it: the ratio logged / recomputed is shown.

The explanations are data (:data:`FACTORS`, :data:`ALTERNATIVES`), one row each:

- a **factor**: the logged value is the recomputed one × or ÷ a count the recorded step or
  the trainer's config holds (the step's loss calls, ``gradient_accumulation_steps``,
  ``steps_per_generation``, the world size, ...): a normaliser applied once too often or
  not at all (verl PR #4711: ``actor/pg_loss`` scaled by the number of micro-batches
  twice, ``dp_actor.py`` L533 and ``utils/metric/utils.py`` L53 at cd4072d; verl #3129:
  ``loss_scale_factor`` in the logged ``pg_loss``; TRL #7011: ``policy_loss`` of
  the loss types normalised by the window's tokens logged per micro-batch, not per
  optimizer window);
- an **alternative**: another way of combining the same tokens that grpo-cli computes as
  well (the step's tokens as one batch instead of the mean over loss calls, TRL #7047; the
  loss under another aggregation, a loss-type scale; the IS weights' statistics before
  their cap: ``before-cap``).

This is looked for only when a metric differs (:func:`explain`), never on the happy path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .records import Cause, Finding, ObjectiveReport

__all__ = [
    "ALTERNATIVES",
    "CONFIG_CAUSES",
    "FACTORS",
    "FLOAT32_ROUNDING",
    "SAMPLER_KEYS",
    "Alternative",
    "CauseContext",
    "FactorRow",
    "config_causes",
    "explain",
    "factors_of",
    "sampler_in_effect",
    "sampler_settings",
]

# float32 carries 24 bits (ε = 1.19e-7); a logged value summed over a few hundred float32
# terms or micro-batches keeps ~1e-6 of relative error, so 1e-5 separates "the same number
# scaled" from another number (the factors are integers ≥ 2, an alternative is another sum)
FLOAT32_ROUNDING = 1e-5


@dataclass(frozen=True)
class FactorRow:
    """A count a logged value may be multiplied or divided by: where it is read (a key of
    the run's ``meta.json`` config, or ``@calls``: the step's recorded loss calls,
    ``@world_size``: meta.json's world size), its words, and the trainer line behind it."""

    key: str
    words: str
    cite: str


# One row a count. Another trainer's: one line here (its config key, words, issue or code).
FACTORS: tuple[FactorRow, ...] = (
    FactorRow(
        "@calls",
        "the step's loss calls (micro-batches)",
        "verl PR #4711 (pg_loss scaled by the micro-batch count twice: dp_actor.py L533, "
        "utils/metric/utils.py L53 at cd4072d)",
    ),
    FactorRow(
        "gradient_accumulation_steps",
        "gradient_accumulation_steps",
        "TRL #7011 (the window-normalised loss types' policy_loss logged without the × "
        "current_gradient_accumulation_steps, TRL PR #7042)",
    ),
    FactorRow(
        "steps_per_generation",
        "steps_per_generation",
        "TRL GRPOTrainer._compute_loss (1.16.0): dapo's normaliser is num_items_in_batch · "
        "gradient_accumulation_steps / steps_per_generation",
    ),
    FactorRow(
        "num_iterations",
        "num_iterations",
        "TRL GRPOConfig.num_iterations: each generation batch is trained on that many times",
    ),
    FactorRow(
        "@world_size",
        "the world size (processes)",
        "a per-process sum or mean logged instead of the global one (verl #3129: the loss "
        "scaled to be parallelism-ignorant; accelerate's gather vs reduce)",
    ),
    FactorRow(
        "actor_rollout_ref.actor.ppo_epochs",
        "ppo_epochs",
        "verl dp_actor.update_policy: metrics appended once per epoch and micro-batch",
    ),
    FactorRow(
        "actor_rollout_ref.actor.loss_scale_factor",
        "loss_scale_factor",
        "verl #3129: actor/pg_loss logged × loss_scale_factor (dp_actor.py L477 at afd7597)",
    ),
)


@dataclass(frozen=True)
class Alternative:
    """Another value of the same metrics grpo-cli computes too: its id, words, the trainer
    line, and its metrics (by the trainer's names)."""

    id: str
    words: str
    cite: str
    metrics: Mapping[str, float]


# The alternatives' ids, words and trainer lines; their values come from the record
# (grpo_cli.finalize.objective.cause_context).
ALTERNATIVES: dict[str, tuple[str, str]] = {
    "whole-step": (
        "the step's tokens as one batch, not the mean over its loss calls",
        "TRL #7047: loss-path metrics averaged over micro-batch entries, so uneven "
        "accumulation windows are weighted by their size",
    ),
    "rank-mean": (
        "the mean of each process's own value (per-process, then averaged), not the value "
        "over every process's tokens",
        "TRL PR #6380 (token means were a per-rank mean averaged over ranks, biased when the "
        "ranks' token counts differ; now sums and counts are reduced jointly)",
    ),
    "window-mean": (
        "one value per optimizer window, then their mean, not the flat mean over the "
        "logging interval's loss calls",
        "TRL #7047 (loss-path metrics averaged over micro-batch entries, so uneven "
        "accumulation windows are weighted by their size; TRL PR #7053)",
    ),
    "before-cap": (
        "the IS weights' statistic before their cap (the raw ratio exp(old_logp − "
        "rollout_logp), not the truncated or masked weight the loss used)",
        "TRL 1.16 GRPOTrainer._generate_and_score_completions logs sampling/"
        "importance_sampling_ratio/* of the weight after vllm_importance_sampling_mode's "
        "truncation or mask; verl 0.9.1 rollout_corr_helper.compute_is_metrics logs "
        "rollout_is_mean of the TIS-truncated or IcePop-masked weight, but rollout_is_max / "
        "_min at sequence level of the raw ratio",
    ),
    "aggregation": (
        "the loss aggregated as {agg} (a loss-type scale)",
        "TRL #7011 (policy_loss logged at two scales by loss_type); verl agg_loss "
        "(loss_agg_mode); README 'Aggregation'",
    ),
}


@dataclass(frozen=True)
class CauseContext:
    """What :func:`explain` tries: the counts (words, value, trainer line) and the
    alternatives."""

    factors: tuple[tuple[FactorRow, float], ...] = ()
    alternatives: tuple[Alternative, ...] = ()


def factors_of(
    config: Mapping[str, object], *, calls: int | None, world_size: int | None
) -> tuple[tuple[FactorRow, float], ...]:
    """The counts of :data:`FACTORS` this step has, each above 1 (a count of 1 explains
    nothing): ``@calls`` and ``@world_size`` from the arguments, the others from
    ``config`` (a number; a bool or anything else is left out)."""
    out = []
    for row in FACTORS:
        if row.key == "@calls":
            v: object = calls
        elif row.key == "@world_size":
            v = world_size
        else:
            v = config.get(row.key)
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if math.isfinite(v) and v > 1:
            out.append((row, float(v)))
    return tuple(out)


def _relative(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def explain(metric: str, logged: float, recomputed: float, ctx: CauseContext) -> Cause:
    """The explanation that reproduces ``logged`` from ``recomputed`` within
    :data:`FLOAT32_ROUNDING` (relative), the closest if several do (counts of the same
    value named together); else ``found`` False with the ratio logged / recomputed.

    Candidates, in order: recomputed × n and ÷ n for each count n of ``ctx.factors``, then
    each alternative's value of ``metric``.
    """
    tried: list[tuple[float, str, str, str]] = []  # (predicted, id, words, cite)
    for row, n in ctx.factors:
        key = row.key.lstrip("@")
        tried.append((recomputed * n, f"times:{key}", f"× {n:g}: {row.words}", row.cite))
        tried.append((recomputed / n, f"over:{key}", f"÷ {n:g}: {row.words}", row.cite))
    for alt in ctx.alternatives:
        v = alt.metrics.get(metric)
        if v is not None and math.isfinite(v):
            tried.append((v, alt.id, alt.words, alt.cite))
    ok = [(_relative(p, logged), p, i, w, c) for p, i, w, c in tried if math.isfinite(p)]
    ok = [t for t in ok if t[0] <= FLOAT32_ROUNDING]
    ratio = logged / recomputed if recomputed != 0 else None
    if ratio is not None and not math.isfinite(ratio):
        ratio = None
    if not ok:
        return Cause(
            metric,
            False,
            "unexplained",
            f"none of {len(tried)} known explanations reproduces it"
            + (f"; logged / recomputed = {ratio:.6g}" if ratio is not None else ""),
            None,
            None,
            None,
            ratio,
        )
    ok.sort(key=lambda t: t[0])
    rel, predicted, cid, _, _ = ok[0]
    same = [t for t in ok if _relative(t[1], predicted) <= 1e-12]
    words = same[0][3] + "".join(f" = {t[3].split(': ', 1)[-1]}" for t in same[1:])
    cites = "; ".join(dict.fromkeys(t[4] for t in same))
    scaled = cid.startswith(("times:", "over:"))
    text = f"logged = recomputed {words}" if scaled else f"logged = {words}"
    return Cause(metric, True, cid, text, cites, predicted, rel, ratio)


# ------------------------------------------------------------------- the sampler's support
# The sampling parameters a recorder writes to meta.json, by the last part of their key:
# TRL's GRPOConfig (``temperature``, ``top_p``, ``top_k``, ``min_p``), verl's
# ``actor_rollout_ref.rollout.*`` (``logprobs_mode``: vLLM's raw or processed log-probs),
# OpenRLHF's ``rollout.*``.
SAMPLER_KEYS = ("temperature", "top_p", "top_k", "min_p", "logprobs_mode")


def sampler_settings(config: Mapping[str, object]) -> dict[str, object]:
    """The sampling parameters of a run's config (:data:`SAMPLER_KEYS`), by their short
    name: a top-level key (TRL) or one under ``rollout.`` (verl, OpenRLHF)."""
    out: dict[str, object] = {}
    for key, v in config.items():
        last = key.rsplit(".", 1)[-1]
        if last in SAMPLER_KEYS and (key == last or key.endswith("rollout." + last)):
            out[last] = v
    return out


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def sampler_in_effect(s: Mapping[str, object]) -> list[str]:
    """The settings of :func:`sampler_settings` that change the sampler's distribution:
    a temperature other than 1, top_p below 1, top_k above 0 (verl's -1 and HF's 0 are
    off), min_p above 0."""
    out = []
    t, p, k, m = (_number(s.get(x)) for x in ("temperature", "top_p", "top_k", "min_p"))
    if t is not None and t != 1.0:
        out.append(f"temperature {t:g}")
    if p is not None and p < 1.0:
        out.append(f"top_p {p:g}")
    if k is not None and k > 0:
        out.append(f"top_k {k:g}")
    if m is not None and m > 0.0:
        out.append(f"min_p {m:g}")
    return out


# ------------------------------------------------------------ causes from the configuration
_ACTOR = "actor_rollout_ref.actor."
_ROLLOUT_MB = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
_ACTOR_MB = _ACTOR + "ppo_micro_batch_size_per_gpu"


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _on_policy_config(c: Mapping[str, object]) -> bool:
    """verl's config says each rollout is trained on once, in one mini-batch: one epoch
    and a mini-batch of the whole train batch (both in prompts)."""
    epochs = _int(c.get(_ACTOR + "ppo_epochs"))
    mini, batch = _int(c.get(_ACTOR + "ppo_mini_batch_size")), _int(c.get("data.train_batch_size"))
    return epochs in (None, 1) and mini is not None and batch is not None and mini >= batch


def _micro_batches(r: ObjectiveReport) -> Finding | None:
    """On-policy by its config, yet ρ ≠ 1: the rollout's and the actor's log-prob passes
    ran at different micro-batch sizes (verl #6280, #2088, #2305)."""
    c = r.run_config
    roll, actor = _int(c.get(_ROLLOUT_MB)), _int(c.get(_ACTOR_MB))
    if roll is None or actor is None or roll == actor or c.get(_ACTOR + "use_dynamic_bsz"):
        return None
    lo, hi = r.ratio.min, r.ratio.max
    moved = lo is not None and hi is not None and (lo != 1.0 or hi != 1.0)
    if not (_on_policy_config(c) and (r.clip.region > 0 or moved)):
        return None
    return Finding(
        "micro-batch-mismatch", "warn",
        f"on-policy by its config (ppo_epochs 1, one mini-batch), yet {100 * r.clip.region:.3g}% "
        f"of tokens are clipped and ρ spans [{lo:.6g}, {hi:.6g}]: old_logp came from a "
        f"forward pass of micro-batches of {roll} ({_ROLLOUT_MB}) and logp from one of {actor} "
        f"({_ACTOR_MB}), and the kernels' results depend on the batch shape (verl #6280, "
        f"#2088, #2305). Set both to the same size (or turn on use_dynamic_bsz with one "
        "token budget) so that ρ = 1 on-policy.",
        {"clip_region": r.clip.region, "ratio_min": lo, "ratio_max": hi,
         _ROLLOUT_MB: roll, _ACTOR_MB: actor},
    )  # fmt: skip


def _kl_twice(r: ObjectiveReport) -> Finding | None:
    """The KL to the reference in the reward and in the loss at once (verl)."""
    c = r.run_config
    if c.get("algorithm.use_kl_in_reward") is not True or c.get(_ACTOR + "use_kl_loss") is not True:
        return None
    rc, lc = c.get("algorithm.kl_ctrl.kl_coef"), c.get(_ACTOR + "kl_loss_coef")
    return Finding(
        "kl-twice", "warn",
        f"the KL to the reference is both in the reward (algorithm.use_kl_in_reward, kl_coef "
        f"{rc}) and in the loss (actor.use_kl_loss, kl_loss_coef {lc}): the policy is "
        "penalised twice, at two strengths (verl's GRPO documentation puts the KL in the "
        "loss instead of the reward). grpo-cli follows the reward's KL; set use_kl_in_reward false "
        "for GRPO (or use_kl_loss false for PPO's reward penalty).",
        {"algorithm.use_kl_in_reward": True, _ACTOR + "use_kl_loss": True,
         "algorithm.kl_ctrl.kl_coef": rc, _ACTOR + "kl_loss_coef": lc},
    )  # fmt: skip


def _reference_is_policy(r: ObjectiveReport) -> Finding | None:
    """A recorded run with β > 0 and the KL to the reference exactly 0 at every token:
    ref_logp is logp (a file of its own, with no run config, is not judged: hand-made
    examples often copy the column; nor is a run's first step, taken before any update)."""
    kl = r.kl
    if not (r.run_config and r.settings.beta > 0 and kl is not None and kl.count > 0):
        return None
    if kl.min != 0.0 or kl.max != 0.0:
        return None
    if r.recorded_step is not None and r.recorded_step <= 1:
        return None  # the first optimizer step: no update yet, the policy is the reference
    return Finding(
        "reference-is-policy", "warn",
        f"β = {r.settings.beta:g} but the KL to the reference is exactly 0 at all {kl.count} "
        "tokens: ref_logp equals the policy's log-probs bit for bit, so the KL term does "
        "nothing. Expected before the first update only; later, the reference is not frozen "
        "(it shares the actor's weights: a LoRA reference without its adapter disabled, ref "
        "log-probs computed by the actor, a copied column). Score ref_logp with the frozen "
        "initial model.",
        {"beta": r.settings.beta, "tokens": kl.count, "kl_max": kl.max},
    )  # fmt: skip


# One function a cause; another: one function here (None when its symptom is absent).
CONFIG_CAUSES = (_micro_batches, _kl_twice, _reference_is_policy)


def config_causes(r: ObjectiveReport) -> list[Finding]:
    """The causes from the configuration (and the data) that apply to a report: each a
    finding with its evidence and what to change."""
    return [f for find in CONFIG_CAUSES if (f := find(r)) is not None]
