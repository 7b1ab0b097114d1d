"""The one screen every batch view opens with (``objective``, ``check``, ``explain``): the
title, the conventions line, the numbers that matter side by side where they fit, the
findings one line each and the verdict line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...records import Finding, ObjectiveReport
from ..format import num, settings_text, span
from ..summary import data_rows, headline, health_rows, objective_rows
from .layout import ByWidth, grid

SEVERITY_STYLE = {"alarm": "bold red", "warn": "yellow", "info": "dim"}
SEVERITY_WORD = {"alarm": "ALARM", "warn": "WARN", "info": "INFO"}


def _title(command: str, r: Any) -> Text:
    t = Text()
    t.append(f"grpo-cli {command}", style="bold")
    t.append(f"  {r.source}")
    return t


def _conventions_text(r: ObjectiveReport) -> Text:
    """Where the settings come from and the conventions J depends on most, one line."""
    s = r.settings
    eps = f"ε {num(s.clip_eps, 6)}" + (
        f"/{num(s.eps_high, 6)}" if s.clip_eps_high is not None else ""
    )
    where = "defaults" if not (s.origin or s.preset) else settings_text(r)
    parts = [where, s.agg, eps if s.ratio_level == "token" else f"sequence ratio, {eps}"]
    if s.loss != "clip":  # a trainer's own loss in place of the clipped surrogate
        parts.insert(1, f"loss {s.loss}")
    if s.correction != "none":
        parts.append(f"{s.correction} correction")
    if s.dual_clip is not None:
        parts.append(f"dual clip {num(s.dual_clip, 6)}")
    if s.beta == 0:
        parts.append("β 0")
    else:
        place = "in the reward" if s.kl_mode == "reward" else "in the loss"
        parts.append(f"{s.kl_estimator} KL, β {num(s.beta, 6)}, {place}")
    return Text(" · ".join(parts), style="dim")


def _data_text(r: ObjectiveReport) -> Text:
    parts = []
    g = r.group_summary
    if g is not None:
        parts.append(f"{g.groups:,} groups of {span(g.min_size, g.max_size)}")
    L = r.lengths
    parts.append(f"lengths {num(L.min)}–{num(L.max)}, mean {num(L.mean)}")
    parts.append(f"A from {r.advantages_source}")
    parts.append("on-policy: no old_logp, ρ = 1" if r.on_policy else "ρ from old_logp")
    if r.calls is not None:
        parts.append(f"{r.calls} loss calls")
    return Text(" · ".join(parts), style="dim")


def block(rows: Sequence[tuple[str, str]]) -> Table:
    g = Table.grid(padding=(0, 1, 0, 0))
    g.add_column(no_wrap=True)
    g.add_column(no_wrap=True, justify="right")
    for name, value in rows:
        g.add_row(Text(name, style="bold"), value)
    return g


def summary(r: ObjectiveReport, *, title: str) -> list[RenderableType]:
    """The numbers that matter: three blocks side by side where they fit (120 columns),
    else two and a line, else stacked."""
    left, right = block(objective_rows(r)), block(health_rows(r))
    data = block(data_rows(r))
    return [
        _title(title, r),
        _conventions_text(r),
        Text(""),
        ByWidth(
            grid(left, right, data, gap=5),
            Group(grid(left, right, gap=5), _data_text(r)),
            Group(left, Text(""), right, _data_text(r)),
        ),
    ]


def finding_lines(
    findings: list[Finding], limit: int, id_width: int | None = None
) -> list[RenderableType]:
    """The findings one line each (a long one wraps under its text, never under the
    severity); ``id_width`` aligns lines rendered apart."""
    if not findings:
        return []
    t = Table.grid(padding=(0, 2, 0, 0))
    t.add_column(no_wrap=True, min_width=5)
    t.add_column(no_wrap=True, min_width=id_width)
    t.add_column()
    for f in findings[:limit]:
        t.add_row(
            Text(SEVERITY_WORD[f.severity], style=SEVERITY_STYLE[f.severity]),
            Text(f.id, style="bold"),
            headline(f),
        )
    out: list[RenderableType] = [t]
    if len(findings) > limit:
        out.append(Text(f"… {len(findings) - limit} more (grpo-cli explain)", style="dim"))
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def verdict(findings: list[Finding]) -> Text:
    """The verdict line of a batch's findings: the worst severity and the counts."""
    n = {s: sum(f.severity == s for f in findings) for s in ("alarm", "warn", "info")}
    t = Text()
    if n["alarm"]:
        t.append("ALARM", style="bold red")
    elif n["warn"]:
        t.append("WARN", style="bold yellow")
    else:
        t.append("OK", style="bold green")
    t.append(f"  {plural(n['alarm'], 'alarm')}, {plural(n['warn'], 'warning')}, {n['info']} info")
    return t
