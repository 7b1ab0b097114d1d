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
  ``dapo``/``cispo``/``vespo`` logged per micro-batch, not per optimizer window);
- an **alternative**: another way of combining the same tokens that grpo-cli computes as
  well (the step's tokens as one batch instead of the mean over loss calls, TRL #7047; the
  loss under another aggregation, a loss-type scale; the metric before clipping).

This is looked for only when a metric differs (:func:`explain`), never on the happy path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .records import Cause

__all__ = [
    "ALTERNATIVES",
    "FACTORS",
    "FLOAT32_ROUNDING",
    "SAMPLER_KEYS",
    "Alternative",
    "CauseContext",
    "FactorRow",
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
        "TRL #7011 (dapo/cispo/vespo policy_loss logged without the × "
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
