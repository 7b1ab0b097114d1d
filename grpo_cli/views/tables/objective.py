"""``objective``'s view: the one screen, and with ``--full`` every table (the objective
and its parts, the gradient, clip fractions, ratio and KL, counts, the sampler, the
trainer's own metrics, logged vs recomputed); ``--compare`` the aggregations."""

from __future__ import annotations

import re
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...records import EXTREME, Cause, Finding, GroupSummary, LoggedReport, ObjectiveReport
from ..format import num, pct, span
from .layout import Col, FitTable, dist_table, kv_table, table
from .screen import finding_lines, summary, verdict


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
    parts: list[RenderableType] = summary(r, title="objective")
    if r.logged is not None:
        parts.append(Text(""))
        parts += _logged_block(r.logged, limit=4)
    if findings:
        parts.append(Text(""))
        parts += finding_lines(findings, limit=4)
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
    out += [_cause_line(m.cause) for m in shown if m.cause is not None]
    more = len([m for m in lg.metrics if m.recomputed is not None]) - len(shown)
    if more > 0:
        out.append(Text(f"  … {more} more compared (--full lists them)", style="dim"))
    return out


def _cause_line(c: Cause) -> Text:
    """Why a logged metric differs, in one line: the explanation found and its trainer
    line, or that none reproduces it and the ratio."""
    line = Text("  why ", style="bold")
    line.append(f"{c.metric}: ")
    if c.found:
        refs = dict.fromkeys(re.findall(r"[A-Za-z-]+(?: PR)? #\d+", c.cite or ""))
        line.append(c.words)
        line.append(f" (rel {num(c.relative, 2)}; {', '.join(refs) or c.cite})", style="dim")
    else:
        line.append(c.words, style="yellow")
    return line


def _objective_tables(r: ObjectiveReport) -> list[RenderableType]:
    """``--full``'s tables, in reading order: J and its parts, the gradient, clipping,
    the ratio and KL, the counts and distributions, the sampler, the trainer's own
    metrics, logged vs recomputed."""
    parts: list[RenderableType] = [*_objective_table(r)]
    if r.gradient is not None:
        parts.append(_gradient_table(r))
    parts.append(_clip_table(r))
    parts += _ratio_tables(r)
    parts += _count_tables(r)
    if r.rollout is not None:
        parts.append(_rollout_table(r))
    parts += _trainer_tables(r)
    if r.logged is not None:
        parts.append(_logged_table(r.logged))
    return parts


def _objective_table(r: ObjectiveReport) -> list[RenderableType]:
    s = r.settings
    if s.kl_mode == "reward" and s.beta:
        kl_part = (
            f"the KL is in the reward (β = {num(s.beta, 6)}, {s.trainer}'s way): none in the loss"
        )
    elif s.beta:
        kl_part = f"β·KL = {num(s.beta, 6)} × {num(r.kl_term / s.beta, 6)}"
    else:
        kl_part = "β = 0: no KL term"
    t = kv_table(
        f"GRPO objective  (aggregation {s.agg})",
        [
            ("objective J", num(r.objective, 10)),
            ("loss = −J", num(r.loss, 10)),
            ("policy term", num(r.policy_term, 10)),
            ("KL term", num(r.kl_term, 10)),
            ("", kl_part),
        ],
    )
    say = Text(
        "J = policy term − KL term. The loss is negative whenever the policy term exceeds the "
        "KL term, and near 0 on-policy because advantages cancel within a group; its gradient "
        "still learns.\n",
        style="dim",
    )
    return [t, say]


def _clip_table(r: ObjectiveReport) -> RenderableType:
    s = r.settings
    clip_rows = [
        ("low  (ρ < 1−ε, A < 0)", pct(r.clip.low)),
        ("high (ρ > 1+ε, A > 0)", pct(r.clip.high)),
        ("region (low or high)", pct(r.clip.region)),
        ("outside [1−ε, 1+ε]", pct(r.clip.outside_range)),
    ]
    if r.clip.dual_clip_lower is not None:
        clip_rows.append(
            (f"dual clip (A < 0, ρ > {num(s.dual_clip, 6)})", pct(r.clip.dual_clip_lower))
        )
    eps_text = f"ε = {num(s.clip_eps, 6)}" + (
        f", ε_high = {num(s.eps_high, 6)}" if s.clip_eps_high is not None else ""
    )
    unit = "share of answers" if r.clip.unit == "sequences" else "share of tokens"
    return kv_table(f"Clip fractions ({eps_text}, {s.ratio_level} ratio; {unit})", clip_rows)


def _ratio_tables(r: ObjectiveReport) -> list[RenderableType]:
    """The ratio's and the KL's distributions, the ratio's histogram, the extreme tokens."""
    ratio_dist = {"ratio ρ": r.ratio}
    if r.kl is not None:
        ratio_dist[f"KL {r.settings.kl_estimator}"] = r.kl
    h = table("Ratio histogram", box=box.SIMPLE)
    h.add_column("ρ range", justify="right", no_wrap=True)
    h.add_column("tokens", justify="right", no_wrap=True)
    h.add_column("share", justify="right", no_wrap=True)
    h.add_column("", justify="left", no_wrap=True)
    total = sum(c for _, _, c in r.ratio_histogram)
    for lo, hi, c in r.ratio_histogram:
        h.add_row(
            f"[{num(lo, 6)}, {num(hi, 6)})",
            num(c),
            pct(c / total if total else 0.0),
            _bar(c, total),
        )
    parts: list[RenderableType] = [dist_table("Importance ratio and KL per token", ratio_dist), h]
    if r.overflow_tokens or r.extreme_tokens:
        parts.append(
            Text(
                f"{r.extreme_tokens:,} token(s) with {EXTREME}; "
                f"{r.overflow_tokens:,} overflow to inf",
                style="bold red",
            )
        )
    return parts


def _count_tables(r: ObjectiveReport) -> list[RenderableType]:
    count_rows = [
        ("groups", num(r.groups)),
        ("answers", num(r.answers)),
        ("tokens", num(r.tokens)),
        ("advantages from", r.advantages_source),
        ("ratio from", "logp only: on-policy, ρ = 1" if r.on_policy else "logp − old_logp"),
    ]
    if r.group_summary is not None:
        count_rows += groups_rows(r.group_summary)[3:5]
    dists = {"length": r.lengths, "advantage": r.advantage}
    if r.entropy is not None:
        dists["entropy"] = r.entropy
    return [
        kv_table("Counts", count_rows),
        dist_table("Answer lengths, advantages and entropy", dists, digits=5),
    ]


def _trainer_tables(r: ObjectiveReport) -> list[RenderableType]:
    """What the trainer logs for this batch, under its names: its metrics, and its loss's
    and correction's."""
    s = r.settings
    parts: list[RenderableType] = []
    if r.trainer_metrics:
        who = s.mirrors or s.trainer
        parts.append(
            kv_table(
                f"What {who} logs for this batch (its names, its formulas)",
                [(k, num(v, 10)) for k, v in r.trainer_metrics.items()],
            )
        )
    if r.loss_metrics:
        what = " and ".join(x for x in (s.loss, s.correction) if x not in ("clip", "none"))
        parts.append(
            kv_table(
                f"What the trainer logs for {what} (its names)",
                [(k, num(v, 10)) for k, v in r.loss_metrics.items()],
            )
        )
    return parts


def _logged_table(lg: LoggedReport) -> RenderableType:
    where = lg.file + (f", step {lg.step}" if lg.step is not None else "")
    return FitTable(
        f"Logged by the trainer ({where}) vs recomputed; tolerance {num(lg.tolerance, 6)}",
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
                num(m.recomputed, 7),
                num(m.relative, 3),
                m.verdict,
            ]
            for m in lg.metrics
        ],
    )


def groups_rows(g: GroupSummary) -> list[tuple[str, str]]:
    return [
        ("groups", num(g.groups)),
        ("answers", num(g.answers)),
        ("group size", span(g.min_size, g.max_size)),
        (
            "zero-variance groups",
            f"{num(g.zero_variance_groups)} ({pct(g.frac_zero_variance_groups)})",
        ),
        ("answers with zero group std", pct(g.frac_zero_std_answers)),
        ("singleton groups", num(g.singleton_groups)),
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
    t = kv_table(
        "Gradient of J with respect to the log-probs",
        [
            ("‖∂J/∂logp‖", num(g["norm"], 6)),
            ("policy part", num(g["policy_norm"], 6)),
            ("KL part", num(g["kl_norm"], 6)),
            ("tokens with a policy gradient", pct(g["tokens_with_policy_gradient"])),
            ("answers with a policy gradient", pct(g["answers_with_policy_gradient"])),
        ],
    )
    return Group(t, Text(say + "\n", style="dim"))


def _rollout_table(r: ObjectiveReport) -> RenderableType:
    ro = r.rollout
    assert ro is not None
    old = "logp (on-policy)" if r.on_policy else "old_logp"
    return kv_table(
        f"Sampler vs trainer  (rollout_logp vs {old}, δ = trainer − sampler)",
        [
            ("mean |δ|", num(ro.abs_diff_mean, 6)),
            ("max |δ|", num(ro.abs_diff_max, 6)),
            ("mismatch KL k1  mean(−δ)", num(ro.kl_k1, 6)),
            ("mismatch KL k3  mean(ρ − δ − 1)", num(ro.kl_k3, 6)),
            ("chi² per token  mean(ρ²) − 1", num(ro.chi2_token, 6)),
            (
                "IS weight ρ mean [min, max]",
                f"{num(ro.is_weight_mean, 6)} "
                f"[{num(ro.is_weight_min, 4)}, {num(ro.is_weight_max, 4)}]",
            ),
            ("ESS tokens / answers", f"{num(ro.ess_token, 4)} / {num(ro.ess_sequence, 4)}"),
            ("mean |p_trainer − p_sampler|", num(ro.prob_abs_diff_mean, 6)),
        ],
        note="Alarms practitioners use: |mismatch KL| > 0.1, IS mean outside [0.5, 2], "
        "ESS < 0.3, mean |Δp| > 0.01 (engine precision).",
    )


def _compare_table(r: ObjectiveReport) -> RenderableType:
    t = table("Objective under every aggregation")
    t.add_column("aggregation", no_wrap=True)
    t.add_column("objective J", justify="right", no_wrap=True)
    t.add_column("loss", justify="right", no_wrap=True)
    for a in r.aggregations:
        mark = " ◀" if a == r.settings.agg else ""
        t.add_row(a + mark, num(r.aggregations[a], 10), num(-r.aggregations[a], 10))
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
