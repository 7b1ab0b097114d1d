"""The table view of every record: rich renderables (JSON: :mod:`grpo_cli.views.json`).

Render functions return renderables and never print; nothing is computed here beyond
formatting and picking which rows to show.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from rich import box
from rich.console import Group, RenderableType
from rich.padding import Padding
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
    ObjectiveReport,
    TrendReport,
)

if TYPE_CHECKING:
    from .._answers import AnswersReport

__all__ = [
    "fmt",
    "render_advantages",
    "render_answers",
    "render_check",
    "render_explain",
    "render_kl",
    "render_objective",
]


# ---------------------------------------------------------------------------- tables
def fmt(x: float | int | None, digits: int = 6) -> str:
    if x is None:
        return "-"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _table(title: str, **kw: Any) -> Table:
    """A table whose title never wraps: at least as wide as its title."""
    kw.setdefault("box", box.SIMPLE_HEAVY)
    kw.setdefault("pad_edge", False)
    kw.setdefault("collapse_padding", True)
    return Table(title=title, title_justify="left", min_width=len(title) + 1, **kw)


def _kv_table(title: str, rows: list[tuple[str, str]], note: str | None = None) -> Table:
    t = _table(title, show_header=False, caption=note, caption_justify="left")
    t.add_column("name", style="bold")
    t.add_column("value", justify="right")
    for k, v in rows:
        t.add_row(k, v)
    return t


def _dist_table(title: str, dists: dict[str, Distribution], digits: int = 6) -> Table:
    """One column per distribution, one row per statistic: narrow enough for 80 columns."""
    t = _table(title)
    t.add_column("")
    for name in dists:
        t.add_column(name, justify="right")
    rows = ["mean", "std", "min", *QUANTILES, "max"]
    for stat in rows:
        cells = []
        for d in dists.values():
            vals = {"mean": d.mean, "std": d.std, "min": d.min, "max": d.max, **d.quantiles}
            cells.append(fmt(vals.get(stat), digits))
        t.add_row(stat, *cells)
    binned = [name for name, d in dists.items() if not d.exact]
    if binned:
        t.caption = f"quantiles of {', '.join(binned)}: from a fine histogram (see README)"
        t.caption_justify = "left"
    return t


def _settings_line(r: Any) -> Text:
    s = r.settings
    parts = [f"preset {s.preset or 'default (deepseekmath)'}"]
    return Text(f"{r.source}  ·  " + ", ".join(parts), style="dim")


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
            f"{fmt(g.zero_variance_groups)} ({pct(g.frac_zero_variance_groups)})",
        ),
        ("answers with zero group std", pct(g.frac_zero_std_answers)),
        ("singleton groups", fmt(g.singleton_groups)),
    ]


def render_advantages(r: AdvantagesReport, max_groups: int = 20) -> RenderableType:
    s = r.settings
    title = (
        f"Group advantages  (scale {s.scale}, ddof {s.ddof}, eps {s.eps:g}, "
        f"estimator {s.estimator})"
    )
    t = _table(title)
    for c, j in (
        ("group", "left"),
        ("size", "right"),
        ("mean", "right"),
        ("std", "right"),
        ("min", "right"),
        ("max", "right"),
        ("0-var", "center"),
    ):
        t.add_column(
            c,
            justify=j,  # type: ignore[arg-type]
            no_wrap=True,
            min_width=len(c),
            max_width=20 if c == "group" else None,
        )
    t.add_column("advantages (row order)", no_wrap=True, overflow="ellipsis", max_width=29)
    P = len(r.labels)
    order = np.argsort(r.codes, kind="stable")
    starts = np.searchsorted(r.codes[order], np.arange(P + 1))
    shown = min(P, max_groups)
    for g in range(shown):
        idx = order[starts[g] : starts[g + 1]]
        adv = r.advantages[idx]
        head = " ".join(f"{a:+.2f}" for a in adv[:16]) + (" …" if adv.size > 16 else "")
        st = r.stats
        zero = bool(st.min[g] == st.max[g])
        t.add_row(
            str(r.labels[g]),
            str(int(st.count[g])),
            fmt(st.mean[g], 4),
            fmt(st.std[g], 4),
            fmt(st.min[g], 4),
            fmt(st.max[g], 4),
            "yes" if zero else "",
            head,
        )
    if shown < P:
        t.caption = f"{shown} of {P:,} groups shown (--max-groups; --json lists all)"
        t.caption_justify = "left"
    rows = _groups_rows(r.summary)
    if r.logged_max_abs_diff is not None:
        rows.append(("max |logged − recomputed| advantage", fmt(r.logged_max_abs_diff)))
    totals = _kv_table("Totals", rows)
    dist = _dist_table("Distributions", {"reward": r.reward, "advantage": r.advantage})
    return Group(_settings_line(r), t, totals, dist)


def render_kl(r: KLReport) -> RenderableType:
    s = r.settings
    title = f"KL estimate {s.kl_estimator} per token" + (
        f" (clamped to ±{s.kl_clamp:g})" if s.kl_clamp is not None else ""
    )
    counts = _kv_table("Counts", [("answers", fmt(r.answers)), ("tokens", fmt(r.tokens))])
    dist = _dist_table(title, {"per token": r.token, "per-answer mean": r.per_answer})
    lengths = _dist_table("Answer lengths (valid tokens)", {"length": r.lengths}, digits=5)
    return Group(_settings_line(r), counts, dist, lengths)


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
            f"J ≈ {fmt(r.objective, 2)} but ‖∂J/∂logp‖ = {fmt(g['norm'], 2)}: the batch still "
            "teaches."
        )
    else:
        say = f"‖∂J/∂logp‖ = {fmt(g['norm'], 2)} over the valid tokens."
    t = _kv_table(
        "Gradient of J with respect to the log-probs",
        [
            ("‖∂J/∂logp‖", fmt(g["norm"], 6)),
            ("policy part", fmt(g["policy_norm"], 6)),
            ("KL part", fmt(g["kl_norm"], 6)),
            ("tokens with a policy gradient", pct(g["tokens_with_policy_gradient"])),
            ("answers with a policy gradient", pct(g["answers_with_policy_gradient"])),
        ],
    )
    return Group(t, Text(say + "\n", style="dim"))


def render_objective(r: ObjectiveReport, compare: bool = False) -> RenderableType:
    s = r.settings
    parts: list[RenderableType] = [_settings_line(r)]
    if s.kl_mode == "reward" and s.beta:
        kl_part = f"the KL is in the reward (β = {s.beta:g}, {s.trainer}'s way): none in the loss"
    elif s.beta:
        kl_part = f"β·KL = {s.beta:g} × {fmt(r.kl_term / s.beta)}"
    else:
        kl_part = "β = 0: no KL term"
    main = _kv_table(
        f"GRPO objective  (aggregation {s.agg})",
        [
            ("objective J", fmt(r.objective, 10)),
            ("loss = −J", fmt(r.loss, 10)),
            ("policy term", fmt(r.policy_term, 10)),
            ("KL term", fmt(r.kl_term, 10)),
            ("", kl_part),
        ],
    )
    parts.append(main)
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
        ("low  (ρ < 1−ε, A < 0)", pct(r.clip.low)),
        ("high (ρ > 1+ε, A > 0)", pct(r.clip.high)),
        ("region (low or high)", pct(r.clip.region)),
        ("outside [1−ε, 1+ε]", pct(r.clip.outside_range)),
    ]
    if r.clip.dual_clip_lower is not None:
        clip_rows.append((f"dual clip (A < 0, ρ > {s.dual_clip:g})", pct(r.clip.dual_clip_lower)))
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
    h.add_column("ρ range", justify="right")
    h.add_column("tokens", justify="right")
    h.add_column("share", justify="right")
    h.add_column("", justify="left")
    total = sum(c for _, _, c in r.ratio_histogram)
    for lo, hi, c in r.ratio_histogram:
        h.add_row(f"[{lo:.6g}, {hi:.6g})", fmt(c), pct(c / total if total else 0.0), _bar(c, total))
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
        ("on-policy (no old_logp)", "yes" if r.on_policy else "no"),
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
    if r.logged is not None:
        t = _table(
            f"Logged by the trainer ({r.logged.file}"
            + (f", step {r.logged.step}" if r.logged.step is not None else "")
            + f") vs recomputed; tolerance {r.logged.tolerance:g}"
        )
        for col in ("metric", "logged", "recomputed", "relative diff", "verdict"):
            t.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
        for m in r.logged.metrics:
            t.add_row(
                m.metric,
                fmt(m.logged, 10),
                "—" if m.recomputed is None else fmt(m.recomputed, 10),
                "—" if m.relative is None else fmt(m.relative, 3),
                m.verdict,
            )
        parts.append(t)
    if compare:
        parts.append(_compare_table(r))
    for w in r.warnings:
        parts.append(Text(f"note: {w}", style="yellow"))
    return Group(*parts)


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
    t.add_column("aggregation")
    t.add_column("objective J", justify="right")
    t.add_column("loss", justify="right")
    for a in r.aggregations:
        mark = " ◀" if a == r.settings.agg else ""
        t.add_row(a + mark, fmt(r.aggregations[a], 10), fmt(-r.aggregations[a], 10))
    w = _table(f"Share of the objective one answer carries, by its length (L_max = {r.max_len})")
    w.add_column("aggregation", no_wrap=True, min_width=23)
    for row in r.length_weights:
        w.add_column(f"{row['length']}={row['tokens']:.4g}", justify="right", no_wrap=True)
    for a in r.aggregations:
        w.add_row(a, *(fmt(row[f"{a}/answer"], 3) for row in r.length_weights))
    w.caption = (
        "seq-mean-token-mean gives every answer 1/N whatever its length; the others "
        "weight an answer in proportion to its length."
    )
    w.caption_justify = "left"
    return Group(t, w)


# ----------------------------------------------------------------------------- check
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def _value(v: float | int | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    return fmt(v, 4)


def _threshold(t: dict[str, float | None] | None) -> str:
    if not t:
        return "-"
    parts = [f"{k} > {fmt(v, 4)}" for k, v in t.items() if v is not None]
    return ", ".join(parts) or "-"


def _example(ex: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in ex.items())


def render_check(r: CheckReport) -> RenderableType:
    """Every rule: status, id, value and threshold on one line, the message indented below,
    and for failures and warnings the places to look. Reads the same in a terminal and in a
    CI log of any width (no colour when not a terminal)."""
    width = max(len(x.rule) for x in r.results)
    lines: list[RenderableType] = [Text(f"grpo-cli check  {r.source}", style="bold"), Text("")]
    for res in r.results:
        head = Text()
        head.append(f"{res.status.upper():<5}", style=_STYLE[res.status])
        head.append(f" {res.rule:<{width}}  ", style="bold")
        head.append(f"value {_value(res.value):<12} threshold {_threshold(res.threshold)}")
        lines.append(head)
        lines.append(Padding(Text(res.message), (0, 0, 0, 6)))
        if res.status in ("fail", "warn"):
            for ex in res.examples:
                lines.append(Padding(Text(f"at {_example(ex)}", style="dim"), (0, 0, 0, 8)))
    counts = {s: sum(x.status == s for x in r.results) for s in ("pass", "warn", "fail", "skip")}
    lines.append(Text(""))
    lines.append(
        Text(
            ("PASSED" if r.passed else "FAILED")
            + f"  ({counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail, "
            f"{counts['skip']} skip)",
            style="bold green" if r.passed else "bold red",
        )
    )
    return Group(*lines)


def render_trend(r: TrendReport) -> RenderableType:
    """One row per step, a sparkline per metric, and the trend rules' verdicts."""
    cols: list[tuple[str, str, int]] = [
        ("objective", "J", 3),
        ("clip_fraction_region", "clip", 3),
        ("ratio_p99", "ρ p99", 4),
        ("kl_mean", "KL", 3),
        ("entropy_mean", "H", 3),
        ("frac_zero_variance_groups", "0-var", 3),
        ("reward_mean", "reward", 3),
        ("length_mean", "len", 4),
        ("rollout_kl_k3", "sampler KL", 3),
    ]
    t = _table(f"Training steps ({len(r.steps)}); H: entropy, 0-var: zero-variance groups")
    t.add_column("step", justify="right")
    for _, title, _ in cols:
        t.add_column(title, justify="right")
    for row in r.steps:
        t.add_row(str(row["step"]), *(fmt(row[k], d) for k, _, d in cols))
    spark = _table("Over the steps (first → last)")
    spark.add_column("metric")
    spark.add_column("")
    spark.add_column("first", justify="right")
    spark.add_column("last", justify="right")
    for key, title, d in cols:
        values = [row[key] for row in r.steps]
        spark.add_row(title, sparkline(values), fmt(values[0], d), fmt(values[-1], d))
    parts: list[RenderableType] = [t, spark]
    if r.results:
        v = _table("Trend rules")
        for col in ("rule", "status", "value", "message"):
            v.add_column(col)
        for res in r.results:
            value = "—" if res.value is None else fmt(float(res.value), 4)
            v.add_row(res.rule, res.status.upper(), value, res.message)
        parts.append(v)
        parts.append(Text("PASSED" if r.passed else "FAILED", style="bold"))
    for w in r.warnings:
        parts.append(Text(f"note: {w}", style="yellow"))
    return Group(*parts)


def render_answers(r: AnswersReport) -> RenderableType:
    """The ranked answers, worst first: where each is, and its statistics (all of them,
    with ``kl_max``, are in ``--json``)."""
    cols: list[tuple[str, str, int]] = [
        ("advantage", "A", 3),
        ("length", "len", 0),
        (
            "kl_max" if r.sort == "kl-max" else "kl_mean",
            "KL max" if r.sort == "kl-max" else "KL",
            3,
        ),
        ("log_ratio_max_abs", "|log ρ|", 3),
        ("clip_share", "clip", 2),
        ("gradient_share", "‖g‖² share", 3),
    ]
    t = _table(f"Top {len(r.rows)} answers by {r.sort} (of {r.source})")
    for title in ("file", "row", "group", "reward"):
        t.add_column(title, justify="right" if title == "row" else "left", overflow="fold")
    for _, title, _ in cols:
        t.add_column(title, justify="right")
    for row in r.rows:
        t.add_row(
            str(row["source"]),
            str(row["row"]),
            "—" if row["group"] is None else str(row["group"]),
            "—" if row["reward"] is None else str(row["reward"]),
            *(fmt(row[k], d) for k, _, d in cols),
        )
    return t


def render_explain(findings: list[Finding]) -> RenderableType:
    """One paragraph per finding, most severe first."""
    if not findings:
        return Text("No findings: nothing in this batch needs attention.")
    style = {"alarm": "bold red", "warn": "yellow", "info": "dim"}
    parts: list[RenderableType] = []
    for f in findings:
        head = Text(f"{f.severity.upper():5}  {f.id}", style=style[f.severity])
        parts.append(head)
        parts.append(Padding(Text(f.message), (0, 0, 1, 7)))
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
