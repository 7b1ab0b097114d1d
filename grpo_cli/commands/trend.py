"""``grpo-cli trend``: one row of health metrics per training step, and rules over them.

Each file is one step (its number from the name: the integer after ``step``, else the last
integer, else the file's position). A step's row is exactly what ``grpo-cli objective``
computes on that file alone with the same settings (groups are scoped to their step), so
a trend never disagrees with the single-step numbers it summarises.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..check.base import RuleConfig, _judge, _skip
from ..engine.options import EngineOptions, Ran
from ..errors import InputError, UsageError
from ..io import InputPath, open_source
from ..io.run import RecordedRun, RecordedStep, find_run, infos_cached, recorded_step
from ..io.source import expand_input
from ..records import ObjectiveReport, Result, StepRow, TrendReport
from ..settings import Settings
from .objective import objective_report

__all__ = ["TREND_RULES", "step_number", "trend_report"]


def step_number(path: InputPath, position: int) -> int:
    """``step_300_seed2.parquet`` → 300; else the last integer of the name; else the
    position."""
    name = Path(path.name).stem
    m = re.search(r"step[_\-]?(\d+)", name, re.IGNORECASE)
    if m:
        return int(m.group(1))
    numbers = re.findall(r"\d+", name)
    return int(numbers[-1]) if numbers else position


def _row(step: int, path: InputPath | None, r: ObjectiveReport) -> StepRow:
    g = r.group_summary
    return StepRow(
        {
            "step": step,
            "source": None if path is None else path.name,
            "answers": r.answers,
            "tokens": r.tokens,
            "objective": r.objective,
            "loss": r.loss,
            "clip_fraction_region": r.clip.region,
            "ratio_p99": r.ratio.quantiles.get("p99"),
            "kl_mean": None if r.kl is None else r.kl.mean,
            "entropy_mean": None if r.entropy is None else r.entropy.mean,
            "frac_zero_variance_groups": None if g is None else g.frac_zero_variance_groups,
            "reward_mean": None if r.reward is None else r.reward.mean,
            "length_mean": r.lengths.mean,
            "rollout_kl_k3": None if r.rollout is None else r.rollout.kl_k3,
        }
    )


def trend_report(
    specs: Sequence[str],
    settings: Settings,
    *,
    engine: EngineOptions | None = None,
    column_map: dict[str, str] | None = None,
    rules: dict[str, RuleConfig] | None = None,
    progress: Callable[[int], None] | None = None,
    step_column: str | None = None,
    notes: Sequence[str] = (),
    on_step: Callable[[int, int], None] | None = None,
) -> TrendReport:
    """Every step's row (``objective`` of its file alone), in step order; with ``rules``,
    the trend rules' verdicts. With ``step_column`` the files are one dataset whose rows
    that column assigns to steps: each step's rows are copied, streaming, to a file of
    their own in a temporary directory, then read as one step file each. ``on_step(done,
    total)`` is called before the first step and as each step is done (a progress bar)."""
    engine = (engine or EngineOptions()).resolved()
    paths: list[InputPath] = []
    skipped: list[str] = []
    marker = "_DONE"  # the marker a complete step has (a trainer's layout names its own)
    damaged: list[str] = []  # complete steps that cannot be read (a file cut after _DONE)
    for s in specs:
        run = None if "://" in s or not Path(s).is_dir() else find_run(Path(s))
        if run is None:
            one = None if "://" in s else recorded_step(Path(s))
            paths.extend([Path(s)] if one is not None else expand_input(s))
            continue
        ok, skip, bad = run_steps(run, s)
        paths += [st.directory for st in ok]
        skipped += skip
        damaged += bad
        steps = run.steps()
        marker = steps[0].marker if steps else marker
    if not paths:
        raise InputError("no step file given")
    given: dict[str, InputPath] = {}
    for p in paths:  # the same file twice would be two steps of one batch
        key = str(p) if not isinstance(p, Path) else str(p.resolve())
        if key in given:
            raise InputError(f"{p}: given twice (one file a step: name each step once)")
        given[key] = p
    if step_column is not None:
        if engine.name == "ray":
            raise UsageError(
                "--step-column with --engine ray: the steps would be split into files on this "
                "machine, which the cluster's workers cannot read; write one file a step, or "
                "use the local engine"
            )
        with tempfile.TemporaryDirectory(prefix="grpo-cli-steps-") as tmp:
            split = split_by_step(specs, step_column, Path(tmp), column_map, engine.batch_tokens)
            report = _trend(split, settings, engine, column_map, rules, progress, on_step, False)
        note = f"source is null: the steps are the values of column {step_column!r}"
        return replace(report, warnings=[*report.warnings, note])
    numbered = sorted(
        ((step_number(p, i), p) for i, p in enumerate(paths)), key=lambda x: (x[0], str(x[1]))
    )
    seen: dict[int, InputPath] = {}
    for step, p in numbered:
        if step in seen:
            raise InputError(f"{p}: step {step} again (also {seen[step].name}): one file a step")
        seen[step] = p
    with infos_cached():  # a recorded step's generation metrics read every step's footers
        report = _trend(numbered, settings, engine, column_map, rules, progress, on_step, True)
    notes = [*notes, *skip_notes(skipped, damaged, marker)]
    return replace(report, warnings=[*notes, *report.warnings]) if notes else report


def run_steps(run: RecordedRun, label: str) -> tuple[list[RecordedStep], list[str], list[str]]:
    """A recorded run's complete, readable steps in step order; the names of the steps not
    completely written (no ``_DONE``) and why each complete but damaged step cannot be
    read. A run with step folders none of which can be read is one line naming it."""
    steps = run.steps()
    ok: list[RecordedStep] = []
    skipped: list[str] = []
    damaged: list[str] = []
    for st in steps:
        why = st.problem()
        if why is None:
            ok.append(st)
        elif not st.done:
            skipped.append(st.directory.name)
        else:
            damaged.append(why)
    if not ok and steps:
        raise InputError(
            f"{label}: no step of the run can be read: {len(steps)} step folder(s), "
            f"{len(skipped)} not completely written (no {steps[0].marker} marker)"
            + (f", {len(damaged)} damaged ({damaged[0]})" if damaged else "")
        )
    return ok, skipped, damaged


def skip_notes(skipped: Sequence[str], damaged: Sequence[str], marker: str = "_DONE") -> list[str]:
    """The notes of a run's steps left out (:func:`run_steps`)."""
    notes = []
    if skipped:
        notes.append(
            f"{len(skipped)} recorded step(s) skipped, not completely written (no {marker} "
            f"marker): {', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}"
        )
    notes += [f"recorded step skipped: {why}" for why in damaged[:5]]
    if len(damaged) > 5:
        notes.append(f"... and {len(damaged) - 5} more recorded step(s) skipped as damaged")
    return notes


def _step_report(
    p: InputPath,
    column_map: dict[str, str] | None,
    settings: Settings,
    engine: EngineOptions,
    progress: Callable[[int], None] | None = None,
) -> ObjectiveReport:
    """One step's objective, from its file (or recorded step directory) alone (on Ray:
    inside a task)."""
    spec: str | InputPath = str(p) if isinstance(p, Path) and p.is_dir() else p
    return objective_report(
        open_source([spec], column_map), settings, engine=engine, progress=progress
    )


def _trend(
    numbered: Sequence[tuple[int, InputPath]],
    settings: Settings,
    engine: EngineOptions,
    column_map: dict[str, str] | None,
    rules: dict[str, RuleConfig] | None,
    progress: Callable[[int], None] | None,
    on_step: Callable[[int, int], None] | None,
    named: bool,
) -> TrendReport:
    steps, warnings = [], []
    total = len(numbered)
    if on_step is not None:
        on_step(0, total)
    if engine.name == "ray":  # one task a step, all at once: each step folds in a worker
        from ..engine.ray import map_calls

        inner = replace(engine, name="local", workers=1, prefetch=False)
        calls = [partial(_step_report, p, column_map, settings, inner) for _, p in numbered]
        reports, ran = map_calls(engine, calls, [str(p) for _, p in numbered])
        if on_step is not None:
            on_step(total, total)
    else:
        reports = []
        for k, (_, p) in enumerate(numbered):
            reports.append(_step_report(p, column_map, settings, engine, progress))
            if on_step is not None:
                on_step(k + 1, total)
        ran = Ran()
    for (step, p), r in zip(numbered, reports, strict=True):
        steps.append(_row(step, p if named else None, r))
        warnings += [f"step {step}: {w}" for w in r.warnings]
    for key in ("kl_mean", "entropy_mean", "reward_mean", "rollout_kl_k3", "ratio_p99"):
        missing = [row["step"] for row in steps if row[key] is None]
        if missing:
            warnings.append(
                f"{key} is null for step(s) {_steps(missing)}: not in the input (or not finite)"
            )
    results, first = ([], {}) if rules is None else judge_trend(steps, rules)
    return TrendReport(settings, engine, steps, results, warnings, ran, first)


MAX_OPEN_STEPS = 128  # step files written at once; more steps take more passes


def split_by_step(
    specs: Sequence[str],
    column: str,
    out: Path,
    column_map: dict[str, str] | None,
    batch_tokens: int,
) -> list[tuple[int, Path]]:
    """Copy each step's rows of a dataset to ``out/<step>.parquet`` (the reader's
    ``split_by_column``: parquet can, in bounded memory). Steps are the integer values of
    ``column``."""
    src = open_source(list(specs), column_map)
    split = getattr(src.reader, "split_by_column", None)
    if split is None:
        raise InputError(f"{src.label}: --step-column needs parquet input")
    steps: list[tuple[int, Path]] = split(src, column, out, batch_tokens, MAX_OPEN_STEPS)
    return steps


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")


def _ends(steps: list[StepRow], key: str) -> tuple[float, float] | None:
    """The metric at the first and last step that have it (finite)."""
    vals = [row[key] for row in steps if row[key] is not None and math.isfinite(row[key])]
    return (vals[0], vals[-1]) if len(vals) >= 2 else None


def _below(rule: str, c: RuleConfig, value: float, message: str) -> Result:
    """A rule that alarms when the value falls *below* its thresholds."""
    status = "pass"
    if c.fail is not None and value < c.fail:
        status = "fail" if c.severity == "fail" else "warn"
    elif c.warn is not None and value < c.warn:
        status = "warn"
    return Result(rule, status, value, {"warn": c.warn, "fail": c.fail}, message)


def rule_entropy_drop(steps: list[StepRow], c: RuleConfig) -> Result:
    """Entropy collapse: the last step's mean token entropy as a share of the first's. Half
    the entropy gone is a policy turning deterministic; four fifths gone, it no longer
    explores (the usual precursor of reward plateaus and mode collapse)."""
    ends = _ends(steps, "entropy_mean")
    if ends is None or not c.enabled:
        return _skip("entropy-drop", "needs logged entropy at two steps or more")
    first, last = ends
    share = last / first if first > 0 else math.inf
    return _below("entropy-drop", c, share, f"entropy {last:.4g} at the last step, "
                  f"{share:.1%} of the first step's {first:.4g}")  # fmt: skip


def rule_kl_growth(steps: list[StepRow], c: RuleConfig) -> Result:
    """KL to the reference, last step over first: growing tenfold is drift worth watching,
    a hundredfold is a policy far from where it started (reward hacking, or β too small)."""
    ends = _ends(steps, "kl_mean")
    if ends is None or not c.enabled:
        return _skip("kl-growth", "needs the KL (ref_logp) at two steps or more")
    first, last = ends
    ratio = last / first if first > 0 else (math.inf if last > 0 else 1.0)
    return _judge("kl-growth", c, ratio, f"KL mean {first:.4g} → {last:.4g} ({ratio:.3g}x)")


def rule_clip_growth(steps: list[StepRow], c: RuleConfig) -> Result:
    """Clip region share, last step minus first: +0.1 means one token in ten more loses its
    gradient (steps too large or data too stale); +0.3 is most of a batch learning nothing."""
    ends = _ends(steps, "clip_fraction_region")
    if ends is None or not c.enabled:
        return _skip("clip-growth", "needs two steps or more")
    first, last = ends
    return _judge("clip-growth", c, last - first, f"clip region {first:.3g} → {last:.3g}")


def rule_zero_variance_growth(steps: list[StepRow], c: RuleConfig) -> Result:
    """Share of zero-variance groups, last minus first: a quarter more groups with no
    learning signal means the task got too easy (or too hard) for the policy; half, that
    most of the compute is spent on groups that teach nothing (what DAPO filters)."""
    ends = _ends(steps, "frac_zero_variance_groups")
    if ends is None or not c.enabled:
        return _skip("zero-variance-growth", "needs rewards and group ids at two steps or more")
    first, last = ends
    return _judge(
        "zero-variance-growth", c, last - first, f"zero-variance groups {first:.3g} → {last:.3g}"
    )


TREND_RULES: dict[str, tuple[Callable[[list[StepRow], RuleConfig], Result], RuleConfig]] = {
    "entropy-drop": (rule_entropy_drop, RuleConfig(warn=0.5, fail=0.2)),
    "kl-growth": (rule_kl_growth, RuleConfig(warn=10.0, fail=100.0)),
    "clip-growth": (rule_clip_growth, RuleConfig(warn=0.1, fail=0.3)),
    "zero-variance-growth": (rule_zero_variance_growth, RuleConfig(warn=0.25, fail=0.5)),
}


# the step metric each trend rule reads (at the first and the last step that have it)
TREND_KEYS = {
    "entropy-drop": "entropy_mean",
    "kl-growth": "kl_mean",
    "clip-growth": "clip_fraction_region",
    "zero-variance-growth": "frac_zero_variance_groups",
}


def first_bad(steps: list[StepRow], rid: str, c: RuleConfig) -> dict[str, int | None]:
    """The first step at which trend rule ``rid``, judged from the run's first step to that
    one, warns (``warn``: warns or fails) and fails. The rules read their metric at the
    first and the last step that have it, so each later step is judged against the first
    alone: one pass over the steps."""
    fn, key = TREND_RULES[rid][0], TREND_KEYS[rid]
    rows = [row for row in steps if row[key] is not None and math.isfinite(row[key])]
    out: dict[str, int | None] = {"warn": None, "fail": None}
    for row in rows[1:]:
        status = fn([rows[0], row], c).status
        if status in ("warn", "fail") and out["warn"] is None:
            out["warn"] = row["step"]
        if status == "fail":
            out["fail"] = row["step"]
            break
    return out


def judge_trend(
    steps: list[StepRow], rules: dict[str, RuleConfig]
) -> tuple[list[Result], dict[str, dict[str, int | None]]]:
    """Every trend rule's verdict over ``steps``, its message naming the first step at
    which it warns and fails (:func:`first_bad`); and those steps by rule."""
    results, first = [], {}
    for rid, (fn, _) in TREND_RULES.items():
        res = fn(steps, rules[rid])
        at = first_bad(steps, rid, rules[rid]) if res.status != "skip" else {}
        said = [f"{k}s from step {v}" for k, v in at.items() if v is not None]
        if said:
            res = replace(res, message=f"{res.message}; {', '.join(said)}")
        results.append(res)
        first[rid] = at or {"warn": None, "fail": None}
    return results, first
