"""``grpo-cli check RUN``: a recorded run as the unit. Every complete step is checked as
``check runs/x/step_N`` checks it alone (the same rules, the same numbers), the trend rules
judge the steps' rows as ``trend --check`` does, and each rule gets one verdict for the
run: its worst over the steps, naming the first step at which it warns and fails.

The steps are checked one after the other on the local engine (each step's own pass uses
its threads), one Ray task a step on Ray; only a step's verdicts and its trend row are
kept, so memory is bounded by one step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from ..check.base import CheckConfig, RuleConfig
from ..engine.options import EngineOptions
from ..errors import InputError, UsageError
from ..io import open_source
from ..io.run import RecordedRun, RecordedStep, infos_cached
from ..records import CheckReport, Result, RunVerdict, StepRow, StepVerdict
from ..settings import Settings
from .trend import TREND_RULES, _row, _steps, judge_trend, run_steps, skip_notes

__all__ = ["check_run", "choose_steps", "parse_span"]

_RANK = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}

NOT_PER_CALL = (
    "no logged record (metrics.jsonl) to compare: the trainer's per-call metrics are not "
    "recomputed (logged-metrics is skipped; every other rule reads the whole step)"
)


def parse_span(text: str | None) -> tuple[int | None, int | None] | None:
    """``--steps A:B``: the steps from A to B, both included (either side may be left
    out: ``10:``, ``:20``)."""
    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        low = int(a) if a.strip() else None
        high = int(b) if b.strip() else None
    except ValueError:
        low = high = -1
    if not sep or (low is not None and low < 0) or (high is not None and high < 0):
        raise UsageError(f"--steps {text!r}: expected A:B, the first and last step numbers")
    if low is not None and high is not None and high < low:
        raise UsageError(f"--steps {text!r}: the last step {high} is before the first {low}")
    return low, high


def choose_steps(
    steps: list[RecordedStep],
    label: str,
    *,
    last: int | None = None,
    span: tuple[int | None, int | None] | None = None,
) -> list[RecordedStep]:
    """The complete steps ``--steps A:B`` keeps, then the last ``--last N`` of them; none
    left is one line (a run checked on no step never passes)."""
    if last is not None and last < 1:
        raise UsageError(f"--last: expected a positive number of steps, got {last}")
    chosen = steps
    if span is not None:
        low, high = span
        chosen = [
            s for s in steps if (low is None or s.step >= low) and (high is None or s.step <= high)
        ]
    if last is not None:
        chosen = chosen[-last:]
    if not chosen:
        have = ", ".join(str(s.step) for s in steps[:10]) or "none"
        raise InputError(
            f"{label}: no complete step of the run to check"
            + (f" in --steps {span[0] or ''}:{span[1] or ''}" if span is not None else "")
            + f" (its complete steps: {have}); a run with no step checked does not pass"
        )
    return chosen


def _check_step(
    step: RecordedStep, settings: Settings, cfg: CheckConfig, engine: EngineOptions
) -> tuple[CheckReport, StepRow | None, list[str]]:
    """One step checked as ``check runs/x/step_N`` checks it alone, its trend row and its
    notes (the objective itself is dropped: a run keeps one step's records at a time).

    A step of a trainer that logs per loss call with no record in the run's
    ``metrics.jsonl`` (``logging_steps`` > 1, or no metrics logged) has nothing for
    ``logged-metrics`` to compare: its calls are not folded again (:data:`NOT_PER_CALL`,
    said once); every verdict and trend row is the same as with them."""
    from ..logged import recorded_metrics
    from .check import run_check
    from .objective import logs_per_call

    src = open_source([str(step.directory)])
    logged = None if src.recorded is None else recorded_metrics(src.recorded, 0.0)
    per_call = logged is not None
    r = run_check(src, settings, cfg, engine=engine, logged=logged, per_call=per_call)
    row = None if r.objective is None else _row(step.step, step.directory, r.objective)
    notes = [*src.notes, *([] if r.objective is None else r.objective.warnings)]
    if not per_call and r.objective is not None and logs_per_call(src, settings):
        notes.append(NOT_PER_CALL)
    return replace(r, objective=None), row, notes


def _merged(rid: str, by_step: list[tuple[int, Result]]) -> Result:
    """One rule's verdict for the run: its worst status over the steps (a rule skipped at
    every step is skipped), its value, threshold and places at the first step with that
    status, the message naming that step and how many steps warn and fail."""
    worst = max(by_step, key=lambda sr: _RANK[sr[1].status])[1].status
    step, first = next((st, r) for st, r in by_step if r.status == worst)
    counts = {k: sum(r.status == k for _, r in by_step) for k in ("fail", "warn", "skip")}
    n = len(by_step)
    if worst in ("fail", "warn"):
        more = [f"{counts[k]} of {n} steps {k}" for k in ("fail", "warn") if counts[k]]
        head = f"first {worst}s at step {step} ({', '.join(more)}): "
    elif worst == "pass":
        head = f"passes at every step checked ({n})" if not counts["skip"] else (
            f"passes at {n - counts['skip']} of {n} steps, skipped at {counts['skip']}"
        )  # fmt: skip
        step, first = by_step[-1]
        head += f"; at step {step}: "
    else:
        head = f"skipped at every step ({n}): "
    examples = [{"step": step, **ex} for ex in first.examples]
    return replace(first, message=head + first.message, examples=examples)


def check_run(
    run: RecordedRun,
    settings: Settings,
    cfg: CheckConfig,
    *,
    last: int | None = None,
    span: tuple[int | None, int | None] | None = None,
    engine: EngineOptions | None = None,
    trend_rules: dict[str, RuleConfig] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> tuple[CheckReport, list[str]]:
    """Check every complete step of ``run`` (or those ``span`` and ``last`` choose,
    :func:`choose_steps`) and judge the trend rules over their rows; the run's report
    (one result per rule, :func:`_merged`; the trend rules after the step rules; its
    :class:`RunVerdict`) and the notes (steps skipped, each step's notes once)."""
    engine = (engine or EngineOptions()).resolved()
    label = str(run.root)
    ok, skipped, damaged = run_steps(run, label)
    if not ok:
        raise InputError(f"{label}: a recorded run with no step folder (step_N): nothing to check")
    chosen = choose_steps(ok, label, last=last, span=span)
    with infos_cached():  # each step's generation metrics read every step's footers
        outs = _each_step(chosen, settings, cfg, engine, on_step)
    said: dict[str, list[int]] = {}  # a note -> the steps that give it (said once)
    verdicts, rows, by_rule = [], [], {}  # type: ignore[var-annotated]
    for st, (r, row, step_notes) in zip(chosen, outs, strict=True):
        for n in step_notes:
            said.setdefault(n, []).append(st.step)
        if row is not None:
            rows.append(row)
        for res in r.results:
            by_rule.setdefault(res.rule, []).append((st.step, res))
        verdicts.append(StepVerdict.of(st.step, st.directory.name, r.results, r.why_no_objective))
    notes = skip_notes(skipped, damaged)
    notes += [f"step{'s' if len(v) > 1 else ''} {_steps(v)}: {n}" for n, v in said.items()]
    results = [_merged(rid, v) for rid, v in by_rule.items()]
    rules = trend_rules or {k: v[1] for k, v in TREND_RULES.items()}
    trend, first = judge_trend(rows, rules)
    for rid in first:  # a rule with no step's row to judge (no objective at any step)
        first[rid] = first[rid] if rows else {"warn": None, "fail": None}
    for res in results:
        first[res.rule] = {
            "warn": next((v.step for v in verdicts if res.rule in v.bad), None),
            "fail": next((v.step for v in verdicts if res.rule in v.failing), None),
        }
    failed = [first[r.rule]["fail"] for r in [*results, *trend] if r.status == "fail"]
    at = min((x for x in failed if x is not None), default=None)
    verdict = RunVerdict(label, verdicts, first, [row.values for row in rows], at)
    report = CheckReport(
        source=label, results=[*results, *trend], settings=settings, engine=engine,
        why_no_objective="a run: each step's verdict is under run.steps (objective RUN: its "
        "last step)", run=verdict,
    )  # fmt: skip
    return report, notes


def _each_step(
    chosen: list[RecordedStep],
    settings: Settings,
    cfg: CheckConfig,
    engine: EngineOptions,
    on_step: Callable[[int, int], None] | None,
) -> list[tuple[CheckReport, StepRow | None, list[str]]]:
    """Each step's check: one after the other here (each with the engine's threads), one
    Ray task a step on Ray."""
    total = len(chosen)
    if on_step is not None:
        on_step(0, total)
    if engine.name == "ray":
        from ..engine.ray import map_calls

        inner = replace(engine, name="local", workers=1, prefetch=False)
        calls = [partial(_check_step, st, settings, cfg, inner) for st in chosen]
        outs, _ = map_calls(engine, calls, [str(st.directory) for st in chosen])
        if on_step is not None:
            on_step(total, total)
        return outs
    outs = []
    for k, st in enumerate(chosen):
        outs.append(_check_step(st, settings, cfg, engine))
        if on_step is not None:
            on_step(k + 1, total)
    return outs
