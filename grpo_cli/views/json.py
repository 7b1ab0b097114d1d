"""JSON views of the reports: one document per command, stable keys (``schema_version``).

Kept apart from the rich tables of :mod:`grpo_cli.views.tables`, so that ``--json`` never
imports rich.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..records import (
    STEP_KEYS,
    AdvantagesReport,
    CheckReport,
    Finding,
    KLReport,
    ObjectiveReport,
    RegistryEntry,
    TrendReport,
)

if TYPE_CHECKING:
    from ..records import AnswersReport

__all__ = [
    "SCHEMA_VERSION",
    "advantages_json",
    "answers_json",
    "check_json",
    "dumps",
    "explain_json",
    "kl_json",
    "losses_json",
    "objective_json",
    "trend_json",
]

SCHEMA_VERSION = 1


def _clean(x: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dumps(doc: dict[str, Any]) -> str:
    """One JSON document; NaN/inf become null (the report's warnings say why)."""
    return json.dumps(_clean(doc), indent=2, allow_nan=False)


def _finite_list(a: np.ndarray) -> list[Any]:
    out: list[Any] = a.tolist()
    if not np.isfinite(a).all():
        out = _clean(out)
    return out


def advantages_json(r: AdvantagesReport) -> dict[str, Any]:
    adv = r.advantages.reshape(r.shape) if r.shape is not None else r.advantages
    st = r.stats
    groups = [
        {
            "id": gid,
            "size": int(c),
            "mean": float(m),
            "std": float(s),
            "min": float(lo),
            "max": float(hi),
            "zero_variance": bool(lo == hi),
        }
        for gid, c, m, s, lo, hi in zip(
            r.labels,
            st.count.tolist(),
            st.mean.tolist(),
            st.std.tolist(),
            st.min.tolist(),
            st.max.tolist(),
            strict=True,
        )
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "advantages",
        "source": r.source,
        "settings": r.settings.to_json(),
        "engine": r.engine.to_json(r.ran),
        "summary": r.summary.to_json(),
        "reward": r.reward.to_json(),
        "advantage": r.advantage.to_json(),
        "logged_advantages_max_abs_diff": r.logged_max_abs_diff,
        "groups": groups,
        "advantages": _finite_list(adv),
        "warnings": [*r.warnings, *_no_logged_note(r)],
    }


def _no_logged_note(r: AdvantagesReport) -> list[str]:
    """Why ``logged_advantages_max_abs_diff`` is null when the input has none to compare
    (beyond float64 it is null too, with a warning of its own)."""
    if r.logged_max_abs_diff is not None or any(
        "logged_advantages_max_abs_diff" in w for w in r.warnings
    ):
        return []
    return ["null as not applicable: logged_advantages_max_abs_diff (no logged advantages)"]


def kl_json(r: KLReport) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "kl",
        "source": r.source,
        "settings": {
            k: r.settings.to_json()[k] for k in ("kl_estimator", "kl_clamp", "log_ratio_clamp")
        },
        "engine": r.engine.to_json(r.ran),
        "counts": {"answers": r.answers, "tokens": r.tokens},
        "kl": r.token.to_json(),
        "kl_per_answer": r.per_answer.to_json(),
        "lengths": r.lengths.to_json(),
        "warnings": r.warnings,
    }


def objective_json(r: ObjectiveReport) -> dict[str, Any]:
    ratio = r.ratio.to_json()
    ratio.update(
        {
            "overflow_tokens": r.overflow_tokens,
            "extreme_tokens": r.extreme_tokens,
            "band": r.ratio_band,
            "outside_band_share": r.ratio_outside_band,
        }
    )
    doc = {
        "schema_version": SCHEMA_VERSION,
        "command": "objective",
        "source": r.source,
        "objective": r.objective,
        "loss": r.loss,
        "policy_term": r.policy_term,
        "kl_term": r.kl_term,
        "aggregation": r.settings.agg,
        "aggregations": r.aggregations,
        "counts": {"groups": r.groups, "answers": r.answers, "tokens": r.tokens},
        "max_len": r.max_len,
        "on_policy": r.on_policy,
        "advantages_source": r.advantages_source,
        "clip_fraction": r.clip.to_json(),
        "ratio": ratio,
        "ratio_histogram": [{"lo": lo, "hi": hi, "count": c} for lo, hi, c in r.ratio_histogram],
        "kl": r.kl.to_json() if r.kl is not None else None,
        "lengths": r.lengths.to_json(),
        "advantage": r.advantage.to_json(),
        "reward": r.reward.to_json() if r.reward is not None else None,
        "groups": r.group_summary.to_json() if r.group_summary is not None else None,
        "length_weights": r.length_weights,
        "trainer_metrics": _trainer_metrics(r),
        "loss_metrics": r.loss_metrics,
        "rollout": r.rollout.to_json() if r.rollout is not None else None,
        "entropy": r.entropy.to_json() if r.entropy is not None else None,
        "input_checks": r.inputs.to_json() if r.inputs is not None else None,
        "settings": r.settings.to_json(),
        "engine": r.engine.to_json(r.ran),
        "warnings": [*r.warnings, *_absent_note(r)],
    }
    if r.logged is not None:  # only with --logged
        doc["logged"] = r.logged.to_json()
    if r.gradient_asked:  # only with --gradient
        doc["gradient"] = r.gradient
    return doc


CHECK_NULLS = (
    "null as not applicable: a results value when its rule was skipped (its detail says "
    "why); a results threshold's warn or fail when the rule has no such level"
)


def check_json(r: CheckReport) -> dict[str, Any]:
    """``check --format json``: the verdicts, and the objective's own document (the same
    ``objective --json`` prints; null when it was not evaluated, ``warnings`` says why)."""
    statuses = ("pass", "warn", "fail", "skip")
    warnings = [] if r.objective is not None else [f"objective: {r.why_no_objective}"]
    warnings.append(CHECK_NULLS)
    if r.run is not None:
        warnings.append(
            "null as not applicable: run.first_failing_step when no rule fails the run; "
            "run.first_bad_step's warn / fail when the rule never warns / fails"
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "check",
        "source": r.source,
        "passed": r.passed,
        "counts": {s: sum(x.status == s for x in r.results) for s in statuses},
        "results": [x.to_json() for x in r.results],
        "objective": None if r.objective is None else objective_json(r.objective),
        "settings": None if r.settings is None else r.settings.to_json(),
        "engine": None if r.engine is None else r.engine.to_json(r.ran),
        "warnings": warnings,
        **({} if r.run is None else {"run": _run_json(r)}),
    }


def _run_json(r: CheckReport) -> dict[str, Any]:
    """``check RUN``'s own block: the first failing step, each rule's first warning and
    failing steps, each step's verdict."""
    assert r.run is not None
    return {
        "root": r.run.root,
        "steps_checked": len(r.run.steps),
        "first_failing_step": r.run.first_failing_step,
        "first_bad_step": r.run.first_bad,
        "steps": [v.to_json() for v in r.run.steps],
    }


def trend_json(r: TrendReport, *, checked: bool) -> dict[str, Any]:
    """``trend --json``: one object per step (keys :data:`grpo_cli.records.STEP_KEYS`), and
    with ``--check`` the trend rules' verdicts."""
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": "trend",
        "settings": r.settings.to_json(),
        "engine": r.engine.to_json(r.ran),
        "steps": [{k: row[k] for k in STEP_KEYS} for row in r.steps],
        "warnings": r.warnings,
    }
    if checked:
        doc["check"] = {
            "passed": r.passed,
            "results": [
                {
                    **{k: v for k, v in x.to_json().items() if k != "examples"},
                    "first_warn_step": r.first_bad.get(x.rule, {}).get("warn"),
                    "first_fail_step": r.first_bad.get(x.rule, {}).get("fail"),
                }
                for x in r.results
            ],
        }
        doc["warnings"] = [*r.warnings, FIRST_STEP_NULLS]
    return doc


FIRST_STEP_NULLS = (
    "null as not applicable: first_warn_step / first_fail_step of a rule that never warns "
    "/ fails over the steps (or was skipped)"
)


def answers_json(r: AnswersReport) -> dict[str, Any]:
    """``answers --json``: the ranked answers, worst first (keys
    :data:`grpo_cli.commands.answers.FIELDS`)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "answers",
        "source": r.source,
        "settings": r.settings.to_json(),
        "engine": r.engine.to_json(r.ran),
        "sort": r.sort,
        "top": r.top,
        "answers": r.rows,
        "warnings": r.warnings,
    }


def explain_json(r: ObjectiveReport, findings: list[Finding]) -> dict[str, Any]:
    """``explain --json``: the findings, most severe first, each with its evidence."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "explain",
        "source": r.source,
        "settings": r.settings.to_json(),
        "engine": r.engine.to_json(r.ran),
        "findings": [f.to_json() for f in findings],
        "warnings": r.warnings,
    }


def _trainer_metrics(r: ObjectiveReport) -> dict[str, Any]:
    """``trainer_metrics``: the trainer's metrics as it logs them; for a recorded step of
    several loss calls also how (``computed``), from how many calls, and the step's
    tokens as one batch (``whole_step``)."""
    out: dict[str, Any] = {
        "trainer": r.settings.trainer,
        "version": r.settings.mirrors,
        "metrics": r.trainer_metrics,
    }
    if r.calls is not None:
        out["computed"] = "per loss call, combined as the trainer logs the step"
        out["calls"] = r.calls
        out["whole_step"] = r.trainer_metrics_whole
    return out


def _absent_note(r: ObjectiveReport) -> list[str]:
    """One warning naming the blocks of ``objective --json`` that are null because the
    input or the settings do not give them (every null in the JSON has its warning)."""
    absent = []
    if r.kl is None:
        absent.append(f"kl (no {'ref_logp'})")
    if r.group_summary is None:
        absent.append("groups and counts.groups (no group ids with rewards)")
    if r.reward is None:
        absent.append(f"reward (no {'reward'})")
    if r.rollout is None:
        absent.append(f"rollout (no {'rollout_logp'})")
    if r.entropy is None:
        absent.append(f"entropy (no {'entropy'})")
    if r.inputs is None:
        absent.append("input_checks (no answers)")
    elif r.inputs.alignment is None:
        absent.append("input_checks.alignment (no rollout_logp)")
    elif None in r.inputs.alignment.values():
        absent.append(
            "an input_checks.alignment correlation (< 3 pairs, a constant side, or sums "
            "beyond float64)"
        )
    if r.clip.dual_clip_lower is None:
        absent.append("clip_fraction.dual_clip_lower (dual clip off)")
    absent.append("the last ratio_histogram bin's hi (the bin is open: up to +inf)")
    return ["null as not applicable: " + "; ".join(absent)]


def losses_json(entries: list[RegistryEntry]) -> dict[str, Any]:
    """``grpo-cli losses --json``: every row of the loss registry."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "losses",
        "rows": [e.to_json() for e in entries],
        "warnings": [],
    }
