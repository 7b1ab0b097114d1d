"""``trend``'s view: one row a step, a sparkline a metric, the trend rules."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...records import TrendReport
from ..format import num, settings_text
from .check import rule_head
from .layout import Col, FitTable

TREND_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("objective", "J", 3),
    ("clip_fraction_region", "clip", 3),
    ("ratio_p99", "ρ p99", 4),
    ("kl_mean", "KL", 3),
    ("entropy_mean", "H", 3),
    ("frac_zero_variance_groups", "0-var", 3),
    ("reward_mean", "reward", 3),
    ("length_mean", "len", 4),
    ("rollout_kl_k3", "sampler\nKL", 3),
)


def render_trend(r: TrendReport, *, full: bool = False, rows: int = 12) -> RenderableType:
    """One row per step (``rows`` of them on one screen: the first and the last ones),
    a sparkline per metric from the first step to the last, and the trend rules."""
    present = [c for c in TREND_COLUMNS if any(row[c[0]] is not None for row in r.steps)]
    steps = list(r.steps)
    body: list[list[str]] = []
    if full or len(steps) <= rows:
        chosen: list[Any] = steps
    else:
        head = rows // 3
        chosen = [*steps[:head], None, *steps[-(rows - head - 1) :]]
    for row in chosen:
        if row is None:
            body.append(["…"] + [""] * len(present))
            continue
        body.append([str(row["step"]), *(num(row[k], d) for k, _, d in present)])
    t = FitTable(
        f"Training steps ({len(steps)}): H entropy, 0-var zero-variance groups",
        [Col("step")] + [Col(t, drop=1 if k == "rollout_kl_k3" else 0) for k, t, _ in present],
        body,
    )
    spark = Table.grid(padding=(0, 2, 0, 0))
    spark.add_column(no_wrap=True, style="bold")
    spark.add_column(no_wrap=True)
    spark.add_column(no_wrap=True, justify="right")
    spark.add_column(no_wrap=True)
    spark.add_column(no_wrap=True, justify="right")
    for key, title, d in present:
        values = [row[key] for row in steps]
        spark.add_row(
            title.replace("\n", " "), sparkline(values[-60:]), num(values[0], d), "→",
            num(values[-1], d),
        )  # fmt: skip
    parts: list[RenderableType] = [
        Text(f"grpo-cli trend  ·  {settings_text(r)}", style="bold"),
        t,
        Text("first → last step, a character a step (the last 60)", style="dim"),
        spark,
    ]
    if r.results:
        parts.append(Text(""))
        parts.append(rule_head(r.results))
        if full:
            for res in r.results:
                parts.append(Text(f"{res.rule}: {res.message}", style="dim"))
        parts.append(Text("PASSED" if r.passed else "FAILED", style="bold"))
    return Group(*parts)


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None]) -> str:
    """One character per step, the step's value on an eight-level scale (· when absent)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "·" * len(values)
    lo, hi = min(finite), max(finite)
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append("·")
        else:
            k = 0 if hi == lo else round((v - lo) / (hi - lo) * (len(SPARK) - 1))
            out.append(SPARK[k])
    return "".join(out)
