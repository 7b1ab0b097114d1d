"""The table view of every record: rich renderables (JSON: :mod:`grpo_cli.views.json`).

Render functions return renderables and never print; nothing is computed here beyond
formatting and picking which rows to show. Every command's default view is one screen
(24 lines at 80 columns: the numbers that matter, the top findings one line each, a
verdict line, as ``ruff`` and ``uv`` report); ``--full`` adds every table. Tables fit
the console: a number is never cut (at least 3 significant digits), text wraps by
column, and a table too wide for the console leaves out its optional columns, saying so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..records import (
    EXTREME,
    QUANTILES,
    AdvantagesReport,
    CheckReport,
    Distribution,
    Finding,
    GroupSummary,
    KLReport,
    LoggedReport,
    ObjectiveReport,
    Result,
    TrendReport,
)
from ._format import (
    data_rows,
    evidence_text,
    headline,
    health_rows,
    num,
    objective_rows,
    settings_text,
)

if TYPE_CHECKING:
    from ..records import AnswersReport

__all__ = [
    "SCREEN",
    "fmt",
    "headline",
    "num",
    "render_advantages",
    "render_answers",
    "render_check",
    "render_explain",
    "render_kl",
    "render_objective",
    "render_trend",
    "sparkline",
    "verdict",
]

SCREEN = 24  # lines of the one-screen views at 80 columns
_SEVERITY_STYLE = {"alarm": "bold red", "warn": "yellow", "info": "dim"}
_SEVERITY_WORD = {"alarm": "ALARM", "warn": "WARN", "info": "INFO"}


# ------------------------------------------------------------------------- numbers
def fmt(x: float | int | None, digits: int = 6) -> str:
    """``x`` with ``digits`` significant digits (integers with thousands separators)."""
    if x is None:
        return "-"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def _pct2(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


# ------------------------------------------------------------------ table helpers
def _table(title: str, **kw: Any) -> Table:
    """A table whose title never wraps: at least as wide as its title."""
    kw.setdefault("box", box.SIMPLE_HEAVY)
    kw.setdefault("pad_edge", False)
    kw.setdefault("collapse_padding", True)
    return Table(title=title, title_justify="left", min_width=len(title) + 1, **kw)


def _kv_table(title: str, rows: list[tuple[str, str]], note: str | None = None) -> Table:
    t = _table(title, show_header=False, caption=note, caption_justify="left")
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True)
    for k, v in rows:
        t.add_row(k, v)
    return t


def _dist_table(title: str, dists: dict[str, Distribution], digits: int = 6) -> Table:
    """One column per distribution, one row per statistic: narrow enough for 80 columns."""
    t = _table(title)
    t.add_column("", no_wrap=True)
    for name in dists:
        t.add_column(name, justify="right", no_wrap=True)
    rows = ["mean", "std", "min", *QUANTILES, "max"]
    for stat in rows:
        cells = []
        for d in dists.values():
            vals = {"mean": d.mean, "std": d.std, "min": d.min, "max": d.max, **d.quantiles}
            cells.append(num(vals.get(stat), digits))
        t.add_row(stat, *cells)
    binned = [name for name, d in dists.items() if not d.exact]
    if binned:
        t.caption = f"quantiles of {', '.join(binned)}: from a fine histogram (see README)"
        t.caption_justify = "left"
    return t


@dataclass
class Col:
    """A column of a :class:`FitTable`: ``drop`` > 0 may be left out when the table is
    too wide (the highest first); ``wrap`` text may wrap (numbers never do)."""

    title: str
    justify: str = "right"
    drop: int = 0
    wrap: bool = False
    min_width: int | None = None


@dataclass
class FitTable:
    """A table that fits the console: when its columns' narrowest widths add up to more
    than the console has, the optional columns (:attr:`Col.drop`) are left out, highest
    first, and the caption names them. Numbers are never wrapped nor cut."""

    title: str
    cols: list[Col]
    rows: list[list[str]]
    caption: str | None = None
    box: Any = box.SIMPLE_HEAVY
    left_out_note: str = "--json has them"

    def _build(self, keep: list[int]) -> Table:
        t = _table(self.title, box=self.box)
        for i in keep:
            c = self.cols[i]
            widest = max([len(x) for x in c.title.split("\n")] + [len(r[i]) for r in self.rows])
            t.add_column(
                c.title,
                justify=c.justify,  # type: ignore[arg-type]
                no_wrap=not c.wrap,
                overflow="fold" if c.wrap else "ellipsis",
                min_width=c.min_width if c.wrap else widest,
            )
        for row in self.rows:
            t.add_row(*(row[i] for i in keep))
        dropped = [self.cols[i].title for i in range(len(self.cols)) if i not in keep]
        notes = [self.caption] if self.caption else []
        if dropped:
            notes.append(f"left out at this width: {', '.join(dropped)} ({self.left_out_note})")
        if notes:
            t.caption = "\n".join(notes)
            t.caption_justify = "left"
        return t

    def fitted(self, width: int, console: Console, options: ConsoleOptions) -> Table:
        keep = list(range(len(self.cols)))
        while True:
            t = self._build(keep)
            need = Measurement.get(console, options.update(width=10_000), t).minimum
            optional = [i for i in keep if self.cols[i].drop > 0]
            if need <= width or not optional:
                return t
            worst = max(optional, key=lambda i: (self.cols[i].drop, i))
            keep.remove(worst)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width, console, options)


class ByWidth:
    """One of several renderables, by the console's width: the first whose minimum width
    fits (side-by-side layouts first, stacked last)."""

    def __init__(self, *choices: RenderableType) -> None:
        self.choices = choices

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for c in self.choices[:-1]:
            need = Measurement.get(console, options.update(width=10_000), c).maximum
            if need <= options.max_width:
                yield c
                return
        yield self.choices[-1]


def _grid(*blocks: RenderableType, gap: int = 3) -> Table:
    g = Table.grid(padding=(0, gap, 0, 0))
    for _ in blocks:
        g.add_column(no_wrap=True, vertical="top")
    g.add_row(*blocks)
    return g


# ---------------------------------------------------------------- the one screen
def _title(command: str, r: Any) -> Text:
    t = Text()
    t.append(f"grpo-cli {command}", style="bold")
    t.append(f"  {r.source}")
    return t


def _conventions_text(r: ObjectiveReport) -> Text:
    """Where the settings come from and the conventions J depends on most, one line."""
    s = r.settings
    eps = f"ε {s.clip_eps:g}" + (f"/{s.eps_high:g}" if s.clip_eps_high is not None else "")
    where = "defaults" if not (s.origin or s.preset) else settings_text(r)
    parts = [where, s.agg, eps if s.ratio_level == "token" else f"sequence ratio, {eps}"]
    if s.loss != "clip":  # a trainer's own loss in place of the clipped surrogate
        parts.insert(1, f"loss {s.loss}")
    if s.correction != "none":
        parts.append(f"{s.correction} correction")
    if s.dual_clip is not None:
        parts.append(f"dual clip {s.dual_clip:g}")
    if s.beta == 0:
        parts.append("β 0")
    else:
        place = "in the reward" if s.kl_mode == "reward" else "in the loss"
        parts.append(f"{s.kl_estimator} KL, β {s.beta:g}, {place}")
    return Text(" · ".join(parts), style="dim")


def _data_text(r: ObjectiveReport) -> Text:
    parts = []
    g = r.group_summary
    if g is not None:
        size = f"{g.min_size}" if g.min_size == g.max_size else f"{g.min_size}–{g.max_size}"
        parts.append(f"{g.groups:,} groups of {size}")
    L = r.lengths
    parts.append(f"lengths {num(L.min)}–{num(L.max)}, mean {num(L.mean)}")
    parts.append(f"A from {r.advantages_source}")
    parts.append("on-policy: no old_logp, ρ = 1" if r.on_policy else "ρ from old_logp")
    if r.calls is not None:
        parts.append(f"{r.calls} loss calls")
    return Text(" · ".join(parts), style="dim")


def _block(rows: Sequence[tuple[str, str]]) -> Table:
    g = Table.grid(padding=(0, 1, 0, 0))
    g.add_column(no_wrap=True)
    g.add_column(no_wrap=True, justify="right")
    for name, value in rows:
        g.add_row(Text(name, style="bold"), value)
    return g


def _summary(r: ObjectiveReport, *, title: str) -> list[RenderableType]:
    """The numbers that matter: three blocks side by side where they fit (120 columns),
    else two and a line, else stacked."""
    left, right = _block(objective_rows(r)), _block(health_rows(r))
    data = _block(data_rows(r))
    return [
        _title(title, r),
        _conventions_text(r),
        Text(""),
        ByWidth(
            _grid(left, right, data, gap=5),
            Group(_grid(left, right, gap=5), _data_text(r)),
            Group(left, Text(""), right, _data_text(r)),
        ),
    ]


def _logged_block(lg: LoggedReport, *, limit: int) -> list[RenderableType]:
    verdicts = [m.verdict for m in lg.metrics]
    counts = {v: verdicts.count(v) for v in ("match", "differs", "not recomputed")}
    head = Text()
    head.append("logged vs recomputed", style="bold")
    where = lg.file + (f", step {lg.step}" if lg.step is not None else "")
    head.append(f"  {where}: ")
    head.append(f"{counts['match']} match", style="green")
    head.append(", ")
    head.append(f"{counts['differs']} differ", style="bold red" if counts["differs"] else "")
    head.append(f", {counts['not recomputed']} not recomputed")
    worst = lg.max_relative
    if worst is not None:
        head.append(f"; max relative diff {num(worst, 3)}", style="dim")
    out: list[RenderableType] = [head]
    shown = sorted(
        (m for m in lg.metrics if m.recomputed is not None),
        key=lambda m: (m.verdict != "differs", -(m.relative or 0.0)),
    )[:limit]
    if shown:
        t = Table.grid(padding=(0, 2, 0, 0))
        t.add_column(no_wrap=True)
        for _ in range(3):
            t.add_column(no_wrap=True, justify="right")
        t.add_column(no_wrap=True)
        for m in shown:
            style = "bold red" if m.verdict == "differs" else ""
            t.add_row(
                "  " + m.metric,
                num(m.logged, 7),
                num(m.recomputed, 7),
                "rel " + num(m.relative, 3),
                Text(m.verdict, style=style),
            )
        out.append(t)
    more = len([m for m in lg.metrics if m.recomputed is not None]) - len(shown)
    if more > 0:
        out.append(Text(f"  … {more} more compared (--full lists them)", style="dim"))
    return out


def _finding_lines(
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
            Text(_SEVERITY_WORD[f.severity], style=_SEVERITY_STYLE[f.severity]),
            Text(f.id, style="bold"),
            headline(f),
        )
    out: list[RenderableType] = [t]
    if len(findings) > limit:
        out.append(Text(f"… {len(findings) - limit} more (grpo-cli explain)", style="dim"))
    return out


def _plural(n: int, word: str) -> str:
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
    t.append(f"  {_plural(n['alarm'], 'alarm')}, {_plural(n['warn'], 'warning')}, {n['info']} info")
    return t


# ------------------------------------------------------------------------ objective
def render_objective(
    r: ObjectiveReport,
    findings: list[Finding] | None = None,
    *,
    full: bool = False,
    compare: bool = False,
) -> RenderableType:
    """One screen: the objective, the health numbers, the trainer's logged metrics
    against grpo-cli's (a recorded step, ``--logged``), the top findings and a verdict
    line; ``full`` adds every table, ``compare`` the aggregations."""
    findings = findings or []
    parts: list[RenderableType] = _summary(r, title="objective")
    if r.logged is not None:
        parts.append(Text(""))
        parts += _logged_block(r.logged, limit=4)
    if findings:
        parts.append(Text(""))
        parts += _finding_lines(findings, limit=4)
    parts.append(Text(""))
    line = verdict(findings)
    if not full:
        line.append("   explain: what to do · --full: every table", style="dim")
    parts.append(line)
    if full:
        parts.append(Text(""))
        parts += _objective_tables(r)
    if compare:
        parts.append(Text(""))
        parts.append(_compare_table(r))
    return Group(*parts)


def _objective_tables(r: ObjectiveReport) -> list[RenderableType]:
    s = r.settings
    parts: list[RenderableType] = []
    if s.kl_mode == "reward" and s.beta:
        kl_part = f"the KL is in the reward (β = {s.beta:g}, {s.trainer}'s way): none in the loss"
    elif s.beta:
        kl_part = f"β·KL = {s.beta:g} × {fmt(r.kl_term / s.beta)}"
    else:
        kl_part = "β = 0: no KL term"
    parts.append(
        _kv_table(
            f"GRPO objective  (aggregation {s.agg})",
            [
                ("objective J", fmt(r.objective, 10)),
                ("loss = −J", fmt(r.loss, 10)),
                ("policy term", fmt(r.policy_term, 10)),
                ("KL term", fmt(r.kl_term, 10)),
                ("", kl_part),
            ],
        )
    )
    parts.append(
        Text(
            "J = policy term − KL term. The loss is negative whenever the policy term exceeds the "
            "KL term, and near 0 on-policy because advantages cancel within a group; its gradient "
            "still learns.\n",
            style="dim",
        )
    )
    if r.gradient is not None:
        parts.append(_gradient_table(r))
    clip_rows = [
        ("low  (ρ < 1−ε, A < 0)", _pct2(r.clip.low)),
        ("high (ρ > 1+ε, A > 0)", _pct2(r.clip.high)),
        ("region (low or high)", _pct2(r.clip.region)),
        ("outside [1−ε, 1+ε]", _pct2(r.clip.outside_range)),
    ]
    if r.clip.dual_clip_lower is not None:
        clip_rows.append((f"dual clip (A < 0, ρ > {s.dual_clip:g})", _pct2(r.clip.dual_clip_lower)))
    eps_text = f"ε = {s.clip_eps:g}" + (
        f", ε_high = {s.eps_high:g}" if s.clip_eps_high is not None else ""
    )
    unit = "share of answers" if r.clip.unit == "sequences" else "share of tokens"
    parts.append(
        _kv_table(f"Clip fractions ({eps_text}, {s.ratio_level} ratio; {unit})", clip_rows)
    )
    ratio_dist = {"ratio ρ": r.ratio}
    if r.kl is not None:
        ratio_dist[f"KL {s.kl_estimator}"] = r.kl
    parts.append(_dist_table("Importance ratio and KL per token", ratio_dist))
    h = _table("Ratio histogram", box=box.SIMPLE)
    h.add_column("ρ range", justify="right", no_wrap=True)
    h.add_column("tokens", justify="right", no_wrap=True)
    h.add_column("share", justify="right", no_wrap=True)
    h.add_column("", justify="left", no_wrap=True)
    total = sum(c for _, _, c in r.ratio_histogram)
    for lo, hi, c in r.ratio_histogram:
        h.add_row(
            f"[{lo:.6g}, {hi:.6g})", fmt(c), _pct2(c / total if total else 0.0), _bar(c, total)
        )
    parts.append(h)
    if r.overflow_tokens or r.extreme_tokens:
        parts.append(
            Text(
                f"{r.extreme_tokens:,} token(s) with {EXTREME}; "
                f"{r.overflow_tokens:,} overflow to inf",
                style="bold red",
            )
        )
    count_rows = [
        ("groups", fmt(r.groups)),
        ("answers", fmt(r.answers)),
        ("tokens", fmt(r.tokens)),
        ("advantages from", r.advantages_source),
        ("ratio from", "logp only: on-policy, ρ = 1" if r.on_policy else "logp − old_logp"),
    ]
    if r.group_summary is not None:
        count_rows += _groups_rows(r.group_summary)[3:5]
    parts.append(_kv_table("Counts", count_rows))
    dists = {"length": r.lengths, "advantage": r.advantage}
    if r.entropy is not None:
        dists["entropy"] = r.entropy
    parts.append(_dist_table("Answer lengths, advantages and entropy", dists, digits=5))
    if r.rollout is not None:
        parts.append(_rollout_table(r))
    if r.trainer_metrics:
        who = s.mirrors or s.trainer
        parts.append(
            _kv_table(
                f"What {who} logs for this batch (its names, its formulas)",
                [(k, fmt(v, 10)) for k, v in r.trainer_metrics.items()],
            )
        )
    if r.loss_metrics:
        what = " and ".join(x for x in (s.loss, s.correction) if x not in ("clip", "none"))
        parts.append(
            _kv_table(
                f"What the trainer logs for {what} (its names)",
                [(k, fmt(v, 10)) for k, v in r.loss_metrics.items()],
            )
        )
    if r.logged is not None:
        parts.append(_logged_table(r.logged))
    return parts


def _logged_table(lg: LoggedReport) -> RenderableType:
    where = lg.file + (f", step {lg.step}" if lg.step is not None else "")
    return FitTable(
        f"Logged by the trainer ({where}) vs recomputed; tolerance {lg.tolerance:g}",
        [
            Col("metric", "left"),
            Col("logged"),
            Col("recomputed"),
            Col("relative diff"),
            Col("verdict", "left", wrap=True),
        ],
        [
            [
                m.metric,
                num(m.logged, 7),
                "—" if m.recomputed is None else num(m.recomputed, 7),
                "—" if m.relative is None else num(m.relative, 3),
                m.verdict,
            ]
            for m in lg.metrics
        ],
    )


def _groups_rows(g: GroupSummary) -> list[tuple[str, str]]:
    return [
        ("groups", fmt(g.groups)),
        ("answers", fmt(g.answers)),
        (
            "group size",
            f"{g.min_size}" if g.min_size == g.max_size else f"{g.min_size}-{g.max_size}",
        ),
        (
            "zero-variance groups",
            f"{fmt(g.zero_variance_groups)} ({_pct2(g.frac_zero_variance_groups)})",
        ),
        ("answers with zero group std", _pct2(g.frac_zero_std_answers)),
        ("singleton groups", fmt(g.singleton_groups)),
    ]


def _bar(count: int, total: int, width: int = 30) -> str:
    if total == 0:
        return ""
    n = count / total * width
    full = int(n)
    return "█" * full + ("▌" if n - full >= 0.5 else "")


def _gradient_table(r: ObjectiveReport) -> RenderableType:
    g = r.gradient
    assert g is not None
    if g["norm"] == 0.0:
        say = "‖∂J/∂logp‖ = 0: no token moves the policy (every token clipped, or A = 0)."
    elif abs(r.objective) < 0.1 * g["norm"]:
        say = (
            f"J ≈ {num(r.objective, 3)} but ‖∂J/∂logp‖ = {num(g['norm'], 3)}: the batch still "
            "teaches."
        )
    else:
        say = f"‖∂J/∂logp‖ = {num(g['norm'], 3)} over the valid tokens."
    t = _kv_table(
        "Gradient of J with respect to the log-probs",
        [
            ("‖∂J/∂logp‖", fmt(g["norm"], 6)),
            ("policy part", fmt(g["policy_norm"], 6)),
            ("KL part", fmt(g["kl_norm"], 6)),
            ("tokens with a policy gradient", _pct2(g["tokens_with_policy_gradient"])),
            ("answers with a policy gradient", _pct2(g["answers_with_policy_gradient"])),
        ],
    )
    return Group(t, Text(say + "\n", style="dim"))


def _rollout_table(r: ObjectiveReport) -> RenderableType:
    ro = r.rollout
    assert ro is not None
    old = "logp (on-policy)" if r.on_policy else "old_logp"
    return _kv_table(
        f"Sampler vs trainer  (rollout_logp vs {old}, δ = trainer − sampler)",
        [
            ("mean |δ|", fmt(ro.abs_diff_mean)),
            ("max |δ|", fmt(ro.abs_diff_max)),
            ("mismatch KL k1  mean(−δ)", fmt(ro.kl_k1)),
            ("mismatch KL k3  mean(ρ − δ − 1)", fmt(ro.kl_k3)),
            ("chi² per token  mean(ρ²) − 1", fmt(ro.chi2_token)),
            (
                "IS weight ρ mean [min, max]",
                f"{fmt(ro.is_weight_mean)} "
                f"[{fmt(ro.is_weight_min, 4)}, {fmt(ro.is_weight_max, 4)}]",
            ),
            ("ESS tokens / answers", f"{fmt(ro.ess_token, 4)} / {fmt(ro.ess_sequence, 4)}"),
            ("mean |p_trainer − p_sampler|", fmt(ro.prob_abs_diff_mean)),
        ],
        note="Alarms practitioners use: |mismatch KL| > 0.1, IS mean outside [0.5, 2], "
        "ESS < 0.3, mean |Δp| > 0.01 (engine precision).",
    )


def _compare_table(r: ObjectiveReport) -> RenderableType:
    t = _table("Objective under every aggregation")
    t.add_column("aggregation", no_wrap=True)
    t.add_column("objective J", justify="right", no_wrap=True)
    t.add_column("loss", justify="right", no_wrap=True)
    for a in r.aggregations:
        mark = " ◀" if a == r.settings.agg else ""
        t.add_row(a + mark, fmt(r.aggregations[a], 10), fmt(-r.aggregations[a], 10))
    # an answer's weight in J relative to the median-length answer's: the shape of each
    # aggregation's length dependence, whatever its scale (token-sum weighs in tokens)
    by: dict[Any, dict[str, Any]] = {row["length"]: row for row in r.length_weights}
    mid = by.get("p50")
    w = FitTable(
        "Weight of one answer in J, by its length, relative to an answer of median length"
        + (f" ({num(mid['tokens'])} tokens)" if mid else ""),
        [Col("aggregation", "left")]
        + [Col(f"{row['length']} {num(row['tokens'])}") for row in r.length_weights],
        [
            [a]
            + [
                num(row[f"{a}/answer"] / mid[f"{a}/answer"], 3)
                if mid and mid[f"{a}/answer"]
                else num(row[f"{a}/answer"], 3)
                for row in r.length_weights
            ]
            for a in r.aggregations
        ],
        caption="seq-mean-token-mean gives every answer 1/N whatever its length; the others "
        "weight an answer in proportion to its length (absolute weights: --json, "
        "length_weights).",
    )
    return Group(t, w)


# ----------------------------------------------------------------------------- check
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def _value(v: float | int | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    return num(v, 4)


def _threshold(t: dict[str, float | None] | None) -> str:
    if not t:
        return "-"
    parts = [f"{k} > {num(v, 4)}" for k, v in t.items() if v is not None]
    return ", ".join(parts) or "-"


def _example(ex: dict[str, Any]) -> str:
    def show(v: Any) -> str:
        return num(v, 6) if isinstance(v, float) else str(v)

    return ", ".join(f"{k} {show(v)}" for k, v in ex.items())


def _rule_head(results: list[Result]) -> Table:
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
            f"value {_value(res.value)}",
            f"threshold {_threshold(res.threshold)}",
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
    if r.objective is not None:
        parts += _summary(r.objective, title="check")
    else:
        parts.append(Text(f"grpo-cli check  {r.source}", style="bold"))
        if r.why_no_objective:
            parts.append(Text(f"no objective: {r.why_no_objective}", style="dim"))
    parts.append(Text(""))
    bad = [x for x in r.results if x.status in ("fail", "warn")]
    bad.sort(key=lambda x: x.status != "fail")
    for res in bad:
        parts.append(_rule_head([res]))
        parts.append(Indented(Text(res.message), 6))
        if res.examples:
            more = len(res.examples) - 1
            at = f"at {_example(res.examples[0])}" + (f" (+{more} more: --full)" if more else "")
            parts.append(Indented(Text(at, style="dim"), 8))
    for status in ("skip", "pass"):
        rules = [x.rule for x in r.results if x.status == status]
        if not rules:
            continue
        word = Text(f"{status.upper()}  ", style=_STYLE[status])
        named = word + Text(f"{_plural(len(rules), 'rule')}: {', '.join(rules)}")
        counted = word + Text(f"{_plural(len(rules), 'rule')} (--full: which" + (
            " and why)" if status == "skip" else ")"))  # fmt: skip
        parts.append(ByWidth(named, counted))
    parts.append(Text(""))
    line = _check_counts(r)
    line.append("   --full: every rule", style="dim")
    parts.append(line)
    return Group(*parts)


def _check_full(r: CheckReport) -> RenderableType:
    lines: list[RenderableType] = [Text(f"grpo-cli check  {r.source}", style="bold"), Text("")]
    for res in r.results:
        lines.append(_rule_head([res]))
        lines.append(Indented(Text(res.message), 6))
        if res.status in ("fail", "warn"):
            for ex in res.examples:
                lines.append(Indented(Text(f"at {_example(ex)}", style="dim"), 8))
    lines.append(Text(""))
    lines.append(_check_counts(r))
    return Group(*lines)


# ----------------------------------------------------------------------------- trend
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
        parts.append(_rule_head(r.results))
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


# --------------------------------------------------------------------------- answers
def render_answers(r: AnswersReport) -> RenderableType:
    """The ranked answers, worst first: where each is, and its statistics (all of them,
    with ``kl_max``, are in ``--json``). File and group names are never wrapped: a table
    too wide leaves out the least needed statistics instead, saying which."""
    sort_col = "kl_max" if r.sort == "kl-max" else "kl_mean"
    stats: list[tuple[str, str, int, int]] = [  # key, title, digits, drop order
        ("advantage", "A", 3, 0),
        ("length", "len", 0, 0),
        (sort_col, "KL max" if r.sort == "kl-max" else "KL", 3, 3),
        ("log_ratio_max_abs", "|log ρ|", 3, 2),
        ("clip_share", "clip", 2, 4),
        ("gradient_share", "‖g‖²\nshare", 3, 1),
    ]
    if r.sort == "rollout":
        stats.append(("rollout_kl_mean", "sampler\nKL", 3, 0))
    sort_key = {"kl": sort_col, "kl-max": sort_col, "ratio": "log_ratio_max_abs",
                "clip": "clip_share", "gradient": "gradient_share"}.get(r.sort)  # fmt: skip
    files = {row["source"] for row in r.rows}
    one_file = len(files) == 1
    cols = [Col("row")] if one_file else [Col("file", "left"), Col("row")]
    cols += [Col("group", "left"), Col("reward", drop=5)]
    cols += [Col(title, drop=0 if key == sort_key else drop) for key, title, _, drop in stats]
    body = []
    for row in r.rows:
        cells = [] if one_file else [str(row["source"])]
        cells += [
            str(row["row"]),
            "—" if row["group"] is None else str(row["group"]),
            "—" if row["reward"] is None else num(row["reward"], 3),
        ]
        cells += [num(row[k], d) if d else num(row[k]) for k, _, d, _ in stats]
        body.append(cells)
    where = f" (of {r.source}" + (f": {next(iter(files))}" if one_file and r.rows else "") + ")"
    return FitTable(f"Top {len(r.rows)} answers by {r.sort}{where}", cols, body)


# ---------------------------------------------------------------------- advantages
def render_advantages(r: AdvantagesReport, max_groups: int = 20) -> RenderableType:
    s = r.settings
    title = (
        f"Group advantages  (scale {s.scale}, ddof {s.ddof}, eps {s.eps:g}, "
        f"estimator {s.estimator})"
    )
    P = len(r.labels)
    order = np.argsort(r.codes, kind="stable")
    starts = np.searchsorted(r.codes[order], np.arange(P + 1))
    shown = min(P, max_groups)
    limit = 16
    body = []
    for g in range(shown):
        idx = order[starts[g] : starts[g + 1]]
        adv = r.advantages[idx]
        head = " ".join(f"{a:+.2f}" for a in adv[:limit])
        if adv.size > limit:
            head += f" (+{adv.size - limit} more)"
        st = r.stats
        zero = bool(st.min[g] == st.max[g])
        body.append(
            [
                str(r.labels[g]),
                str(int(st.count[g])),
                num(st.mean[g], 4),
                num(st.std[g], 4),
                num(st.min[g], 4),
                num(st.max[g], 4),
                "yes" if zero else "",
                head,
            ]
        )
    caption = None
    if shown < P:
        caption = f"{shown} of {P:,} groups shown (--max-groups; --json lists all)"
    t = FitTable(
        title,
        [
            Col("group", "left", wrap=True),
            Col("size"),
            Col("mean"),
            Col("std"),
            Col("min", drop=2),
            Col("max", drop=2),
            Col("0-var", "center", drop=1),
            Col("advantages (row order)", "left", wrap=True, min_width=17),
        ],
        body,
        caption=caption,
    )
    rows = _groups_rows(r.summary)
    if r.logged_max_abs_diff is not None:
        rows.append(("max |logged − recomputed| advantage", fmt(r.logged_max_abs_diff)))
    totals = _kv_table("Totals", rows)
    dist = _dist_table("Distributions", {"reward": r.reward, "advantage": r.advantage})
    title_line = Text(f"{r.source}  ·  {settings_text(r)}", style="dim")
    return Group(title_line, t, ByWidth(_grid(totals, dist), Group(totals, dist)))


# ------------------------------------------------------------------------------- kl
def render_kl(r: KLReport) -> RenderableType:
    s = r.settings
    title = f"KL estimate {s.kl_estimator} per token" + (
        f" (clamped to ±{s.kl_clamp:g})" if s.kl_clamp is not None else ""
    )
    counts = _kv_table("Counts", [("answers", fmt(r.answers)), ("tokens", fmt(r.tokens))])
    dist = _dist_table(title, {"per token": r.token, "per-answer mean": r.per_answer})
    lengths = _dist_table("Answer lengths (valid tokens)", {"length": r.lengths}, digits=5)
    title_line = Text(f"{r.source}  ·  {settings_text(r)}", style="dim")
    return Group(title_line, counts, ByWidth(_grid(dist, lengths), Group(dist, lengths)))


# --------------------------------------------------------------------------- explain
@dataclass
class Indented:
    """``text`` wrapped at the console's width less ``indent``, each line indented (no
    trailing padding, unlike a rich Padding)."""

    text: Text
    indent: int = 7

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width - self.indent, 20)
        for line in self.text.wrap(console, width):
            line.rstrip()
            yield Text(" " * self.indent) + line


@dataclass
class OneScreen:
    """``head``, then as many of ``full`` as fill the screen (``budget`` lines in all at
    the console's width), the others as their ``short`` forms, then ``tail``."""

    head: list[RenderableType]
    full: list[RenderableType]
    short: list[RenderableType]
    tail: list[RenderableType] = field(default_factory=list)
    budget: int = SCREEN

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        def lines(items: Sequence[RenderableType]) -> int:
            return sum(len(console.render_lines(x, options, pad=False)) for x in items)

        left = self.budget - lines(self.head) - lines(self.tail)
        out: list[RenderableType] = []
        for i, item in enumerate(self.full):
            rest = lines(self.short[i + 1 :])
            n = lines([item])
            if n + rest > left:
                out += self.short[i:]
                break
            out.append(item)
            left -= n
        yield from self.head
        yield from out
        yield from self.tail


def render_explain(
    r: ObjectiveReport, findings: list[Finding], *, full: bool = False
) -> RenderableType:
    """The batch's numbers, then each finding with what to do, most severe first: as
    many paragraphs as one screen holds, the others one line each (``full``: every
    paragraph and its evidence)."""
    head: list[RenderableType] = [*_summary(r, title="explain"), Text("")]
    if not findings:
        return Group(*head, Text("No findings: nothing in this batch needs attention."))
    paragraphs: list[RenderableType] = []
    for f in findings:
        title = Text()
        title.append(f"{_SEVERITY_WORD[f.severity]:<5}", style=_SEVERITY_STYLE[f.severity])
        title.append(f"  {f.id}", style="bold")
        items: list[RenderableType] = [title, Indented(Text(f.message))]
        if full:
            ev = evidence_text(f.evidence)
            items.append(Indented(Text(f"evidence: {ev}", style="dim")))
        paragraphs.append(Group(*items))
    line = verdict(findings)
    if full:
        return Group(*head, *paragraphs, Text(""), line)
    line.append("   --full: with the evidence", style="dim")
    width = max(len(f.id) for f in findings)
    short = [_finding_lines([f], 1, width)[0] for f in findings]
    return OneScreen(head, paragraphs, short, [Text(""), line])
