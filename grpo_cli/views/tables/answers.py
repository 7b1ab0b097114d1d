"""The per-answer and per-group views: ``answers`` (the answers to blame), ``advantages``
(each group's) and ``kl`` (the per-token KL's distribution)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from rich.console import Group, RenderableType
from rich.text import Text

from ...records import AdvantagesReport, KLReport
from ..format import NONE, num, settings_text
from .layout import ByWidth, Col, FitTable, dist_table, grid, kv_table
from .objective import groups_rows

if TYPE_CHECKING:
    from ...records import AnswersReport


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
            NONE if row["group"] is None else str(row["group"]),
            num(row["reward"], 3),
        ]
        cells += [num(row[k], d) if d else num(row[k]) for k, _, d, _ in stats]
        body.append(cells)
    where = f" (of {r.source}" + (f": {next(iter(files))}" if one_file and r.rows else "") + ")"
    return FitTable(f"Top {len(r.rows)} answers by {r.sort}{where}", cols, body)


# ---------------------------------------------------------------------- advantages
def render_advantages(r: AdvantagesReport, max_groups: int = 20) -> RenderableType:
    s = r.settings
    title = (
        f"Group advantages  (scale {s.scale}, ddof {s.ddof}, eps {num(s.eps, 6)}, "
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
    rows = groups_rows(r.summary)
    if r.logged_max_abs_diff is not None:
        rows.append(("max |logged − recomputed| advantage", num(r.logged_max_abs_diff, 6)))
    totals = kv_table("Totals", rows)
    dist = dist_table("Distributions", {"reward": r.reward, "advantage": r.advantage})
    title_line = Text(f"{r.source}  ·  {settings_text(r)}", style="dim")
    return Group(title_line, t, ByWidth(grid(totals, dist), Group(totals, dist)))


# ------------------------------------------------------------------------------- kl
def render_kl(r: KLReport) -> RenderableType:
    s = r.settings
    title = f"KL estimate {s.kl_estimator} per token" + (
        f" (clamped to ±{num(s.kl_clamp, 6)})" if s.kl_clamp is not None else ""
    )
    counts = kv_table("Counts", [("answers", num(r.answers)), ("tokens", num(r.tokens))])
    dist = dist_table(title, {"per token": r.token, "per-answer mean": r.per_answer})
    lengths = dist_table("Answer lengths (valid tokens)", {"length": r.lengths}, digits=5)
    title_line = Text(f"{r.source}  ·  {settings_text(r)}", style="dim")
    return Group(title_line, counts, ByWidth(grid(dist, lengths), Group(dist, lengths)))
