"""``check``'s view: the one screen (the failing and warning rules with their message
and first place to look, the others by name) and ``--full`` (every rule)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...records import CheckReport, Finding, Result
from ..format import example_text, num, threshold_text
from .layout import ByWidth, Indented
from .screen import plural, summary

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def rule_head(results: list[Result]) -> Table:
    """status, rule, value and threshold in columns: a threshold is never broken."""
    t = Table.grid(padding=(0, 2, 0, 0))
    t.add_column(no_wrap=True)
    t.add_column(no_wrap=True, style="bold")
    t.add_column(no_wrap=True)
    t.add_column(no_wrap=True)
    for res in results:
        t.add_row(
            Text(f"{res.status.upper():<4}", style=_STYLE[res.status]),
            res.rule,
            f"value {num(res.value)}",
            f"threshold {threshold_text(res.threshold)}",
        )
    return t


def _check_counts(r: CheckReport) -> Text:
    counts = {s: sum(x.status == s for x in r.results) for s in ("pass", "warn", "fail", "skip")}
    return Text(
        ("PASSED" if r.passed else "FAILED")
        + f"  ({counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail, "
        f"{counts['skip']} skip)",
        style="bold green" if r.passed else "bold red",
    )


def render_check(
    r: CheckReport, findings: list[Finding] | None = None, *, full: bool = False
) -> RenderableType:
    """One screen: the batch's numbers, every failing and warning rule with its message
    and first place to look, the skipped rules one line each, the passing rules by name,
    the verdict. ``full``: every rule with its value, threshold, message and places (the
    same in a CI log of any width; no colour when not a terminal)."""
    if full:
        return _check_full(r)
    parts: list[RenderableType] = []
    if r.run is not None:
        parts += _run_head(r)
    elif r.objective is not None:
        parts += summary(r.objective, title="check")
    else:
        parts.append(Text(f"grpo-cli check  {r.source}", style="bold"))
        if r.why_no_objective:
            parts.append(Text(f"no objective: {r.why_no_objective}", style="dim"))
    parts.append(Text(""))
    bad = [x for x in r.results if x.status in ("fail", "warn")]
    bad.sort(key=lambda x: x.status != "fail")
    for res in bad:
        parts.append(rule_head([res]))
        parts.append(Indented(Text(res.message), 6))
        if res.examples:
            more = len(res.examples) - 1
            at = f"at {example_text(res.examples[0])}" + (
                f" (+{more} more: --full)" if more else ""
            )
            parts.append(Indented(Text(at, style="dim"), 8))
    for status in ("skip", "pass"):
        rules = [x.rule for x in r.results if x.status == status]
        if not rules:
            continue
        word = Text(f"{status.upper()}  ", style=_STYLE[status])
        named = word + Text(f"{plural(len(rules), 'rule')}: {', '.join(rules)}")
        counted = word + Text(f"{plural(len(rules), 'rule')} (--full: which" + (
            " and why)" if status == "skip" else ")"))  # fmt: skip
        parts.append(ByWidth(named, counted))
    parts.append(Text(""))
    line = _check_counts(r)
    line.append("   --full: every rule", style="dim")
    parts.append(line)
    return Group(*parts)


def _run_head(r: CheckReport) -> list[RenderableType]:
    """A run's head: its steps checked, and its first failing step (or none)."""
    assert r.run is not None
    steps = r.run.steps
    span = f"steps {steps[0].step}–{steps[-1].step}" if len(steps) > 1 else f"step {steps[0].step}"
    failing = sum(not v.passed for v in steps)
    first = r.run.first_failing_step
    said = "no step fails" if first is None else f"first failing step {first}"
    return [
        Text(f"grpo-cli check  {r.source}", style="bold"),
        Text(f"a recorded run: {plural(len(steps), 'step')} checked ({span}), "
             f"{failing} failing; {said}"),
    ]  # fmt: skip


def _check_full(r: CheckReport) -> RenderableType:
    head = (
        _run_head(r) if r.run is not None else [Text(f"grpo-cli check  {r.source}", style="bold")]
    )
    lines: list[RenderableType] = [*head, Text("")]
    for res in r.results:
        lines.append(rule_head([res]))
        lines.append(Indented(Text(res.message), 6))
        if res.status in ("fail", "warn"):
            for ex in res.examples:
                lines.append(Indented(Text(f"at {example_text(ex)}", style="dim"), 8))
    lines.append(Text(""))
    lines.append(_check_counts(r))
    return Group(*lines)
