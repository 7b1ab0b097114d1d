"""The report to share: one self-contained HTML file (inline CSS and SVG, the explorer's
one inline script, no network), as pytest-html and coverage.py's htmlcov are: it opens
from a CI artifact.

:func:`render_html` renders a :class:`grpo_cli.commands.share.ShareReport`: the one-screen
summary, ``explain``'s findings, ``check``'s verdict, the distributions (log ρ in fine
equal bins around the clip band, the per-token KL's CCDF), the trend over the steps, the
worst answers with their text, and their tokens coloured by KL or |log ρ| (a CSS toggle).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..records import CheckReport, Finding, ObjectiveReport, TrendReport
from .format import evidence_text, example_text, num, pct, settings_text, threshold_text
from .summary import data_rows, headline, health_rows, objective_rows

if TYPE_CHECKING:
    from ..records import AnswerText, ShareReport

__all__ = ["render_html"]

CSS = """
:root{--fg:#1d2430;--mute:#5c6675;--line:#d9dee5;--bg:#fff;--panel:#f6f8fa;
--ok:#2f7d4f;--warn:#b7791f;--fail:#c0392b;--info:#5c6675;--accent:#30638e}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg)}
main{max-width:1180px;margin:0 auto;padding:20px 24px 48px}
h1{font-size:20px;margin:0 0 2px}h2{font-size:16px;margin:28px 0 8px;
border-bottom:1px solid var(--line);padding-bottom:4px}
.sub{color:var(--mute);font-size:13px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;
font-size:12px;color:#fff;vertical-align:1px}
.pass,.ok{background:var(--ok)}.fail,.alarm{background:var(--fail)}
.warn{background:var(--warn)}.skip,.info{background:var(--info)}
.verdict{margin:14px 0;font-size:15px}.verdict .badge{font-size:13px;margin-right:6px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:12px}
.card{background:var(--panel);border:1px solid var(--line);border-radius:6px;padding:10px 14px}
.card h3{margin:0 0 6px;font-size:13px;color:var(--mute);font-weight:600}
table{border-collapse:collapse;width:100%}
td,th{padding:3px 8px;text-align:left;vertical-align:top;border-bottom:1px solid var(--line)}
th{font-size:12px;color:var(--mute);font-weight:600}
.kv td{border:0;padding:1px 0}.kv td.v{text-align:right;font-variant-numeric:tabular-nums}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.finding{margin:8px 0;padding:8px 12px;border-left:4px solid var(--info);background:var(--panel)}
.finding.alarm{border-color:var(--fail)}.finding.warn{border-color:var(--warn)}
.finding p{margin:4px 0 0}
.figs{display:grid;grid-template-columns:repeat(auto-fit,minmax(360px,1fr));gap:12px}
svg{width:100%;height:auto;background:#fff}
svg text{font:11px system-ui,sans-serif;fill:var(--mute)}
.trend{display:grid;grid-template-columns:repeat(auto-fit,minmax(240px,1fr));gap:10px}
pre{white-space:pre-wrap;word-break:break-word;background:var(--panel);padding:8px;
border-radius:4px;margin:4px 0;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
details{margin:8px 0}summary{cursor:pointer;font-weight:600}
.toks{font:12px/1.9 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;
word-break:break-word;background:var(--panel);padding:8px;border-radius:4px}
.toks span{border-radius:2px}
input.by-kl:checked~.toks span{background:rgba(192,57,43,var(--kl))}
input.by-lr:checked~.toks span{background:rgba(48,99,142,var(--lr))}
.coloured label{margin-right:12px;font-size:13px}.coloured input{vertical-align:-2px}
.mute{color:var(--mute)}footer{margin-top:32px;color:var(--mute);font-size:12px}
"""


def _e(x: Any) -> str:
    return escape(str(x), quote=True)


def _kv(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td>{_e(k)}</td><td class=v>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table class=kv>{body}</table>"


def _badge(status: str, text: str | None = None) -> str:
    return f"<span class='badge {_e(status)}'>{_e(text or status.upper())}</span>"


def _worst(findings: list[Finding]) -> str:
    for sev in ("alarm", "warn"):
        if any(f.severity == sev for f in findings):
            return sev
    return "ok"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# ----------------------------------------------------------------------- summary
def _summary(s: ShareReport) -> str:
    r, c = s.objective, s.check
    counts = {k: sum(x.status == k for x in c.results) for k in ("pass", "warn", "fail", "skip")}
    n = {k: sum(f.severity == k for f in s.findings) for k in ("alarm", "warn", "info")}
    check_line = (
        f"{_badge('pass' if c.passed else 'fail', 'PASSED' if c.passed else 'FAILED')} "
        f"check: {counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail, "
        f"{counts['skip']} skip"
    )
    worst = _worst(s.findings)
    explain_line = (
        f"{_badge(worst, worst.upper())} explain: {_plural(n['alarm'], 'alarm')}, "
        f"{_plural(n['warn'], 'warning')}, {n['info']} info"
    )
    cards = [
        ("objective", objective_rows(r)),
        ("health", health_rows(r)),
        ("data", data_rows(r)),
    ]
    grid = "".join(f"<div class=card><h3>{t}</h3>{_kv(rows)}</div>" for t, rows in cards)
    top = "".join(
        f"<li>{_badge(f.severity)} <b>{_e(f.id)}</b> {_e(headline(f))}</li>" for f in s.findings[:4]
    )
    tops = f"<ul style='padding-left:18px;margin:8px 0'>{top}</ul>" if top else ""
    return (
        f"<section id=summary><div class=verdict>{check_line}<br>{explain_line}</div>"
        f"<div class=grid>{grid}</div>{tops}</section>"
    )


def _findings(findings: list[Finding]) -> str:
    if not findings:
        return "<p>No findings: nothing in this batch needs attention.</p>"
    out = []
    for f in findings:
        ev = evidence_text(f.evidence)
        out.append(
            f"<div class='finding {_e(f.severity)}'>{_badge(f.severity)} <b>{_e(f.id)}</b>"
            f"<p>{_e(f.message)}</p><p class=mute>evidence: {_e(ev)}</p></div>"
        )
    return "".join(out)


def _check(c: CheckReport) -> str:
    order = {"fail": 0, "warn": 1, "skip": 2, "pass": 3}
    rows = []
    for res in sorted(c.results, key=lambda x: order[x.status]):
        value = num(res.value)
        where = ""
        if res.examples and res.status in ("fail", "warn"):
            where = f"<br><span class=mute>at {_e(example_text(res.examples[0]))}</span>"
        rows.append(
            f"<tr><td>{_badge(res.status)}</td><td><b>{_e(res.rule)}</b></td>"
            f"<td class=n>{_e(value)}</td><td class=n>{_e(threshold_text(res.threshold))}</td>"
            f"<td>{_e(res.message)}{where}</td></tr>"
        )
    head = (
        "<tr><th></th><th>rule</th><th class=n>value</th><th class=n>threshold</th><th></th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


# ------------------------------------------------------------------------ figures
W, H, PAD_L, PAD_B, PAD_T, PAD_R = 520, 260, 56, 34, 16, 12


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _frame(title: str, xlabel: str, ylabel: str, inner: str, axes: str) -> str:
    return (
        f"<svg viewBox='0 0 {W} {H}' xmlns='http://www.w3.org/2000/svg' role='img'>"
        f"<title>{_e(title)}</title>"
        f"<text x='{W / 2}' y='12' text-anchor='middle' style='font-weight:600'>{_e(title)}</text>"
        f"{inner}{axes}"
        f"<rect x='{PAD_L}' y='{PAD_T}' width='{W - PAD_L - PAD_R}' height='{H - PAD_T - PAD_B}'"
        " fill='none' stroke='#9aa4b1'/>"
        f"<text x='{(PAD_L + W - PAD_R) / 2}' y='{H - 4}' text-anchor='middle'>{_e(xlabel)}</text>"
        f"<text transform='translate(12 {(PAD_T + H - PAD_B) / 2}) rotate(-90)' "
        f"text-anchor='middle'>{_e(ylabel)}</text></svg>"
    )


def _ratio_svg(r: ObjectiveReport) -> str:
    """log ρ in equal bins over the bulk of the tokens, the clip band shaded, log counts."""
    s = r.settings
    title = (
        f"log-ratio per token (clip band ρ in [{num(1 - s.clip_eps, 6)}, {num(1 + s.eps_high, 6)}])"
    )
    if r.log_ratio_bins is None or not r.log_ratio_bins[2].sum():
        return f"<p class=mute>{_e(title)}: no tokens</p>"
    width, edges, counts = r.log_ratio_bins
    edges = np.asarray(edges, dtype=np.float64)
    lo_band, hi_band = math.log(1 - s.clip_eps), math.log(1 + s.eps_high)
    cum = np.cumsum(counts) / counts.sum()
    q_lo = float(edges[int(np.searchsorted(cum, 0.0005))])
    q_hi = float(edges[min(int(np.searchsorted(cum, 0.9995)), len(edges) - 1)]) + width
    x0, x1 = min(q_lo, 2 * lo_band), max(q_hi, 2 * hi_band)
    step = max(width, round((x1 - x0) / 120 / width) * width)
    nb = math.ceil((x1 - x0) / step)
    k = np.floor((edges - x0) / step).astype(np.int64)
    inside = (k >= 0) & (k < nb)
    binned = np.zeros(nb, dtype=np.int64)
    np.add.at(binned, k[inside], counts[inside])
    top = math.log10(max(int(binned.max()), 1)) + 0.3
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def X(v: float) -> float:
        return PAD_L + (v - x0) / (x1 - x0) * pw

    def Y(c: float) -> float:
        return PAD_T + ph * (1 - math.log10(max(c, 1)) / top) if c > 0 else PAD_T + ph

    band = (f"<rect x='{X(lo_band):.1f}' y='{PAD_T}' width='{X(hi_band) - X(lo_band):.1f}' "
            f"height='{ph}' fill='#66a182' fill-opacity='.18'/>")  # fmt: skip
    bars = "".join(
        f"<rect x='{X(x0 + i * step):.1f}' y='{Y(c):.1f}' width='{max(pw / nb - 0.3, 0.6):.1f}' "
        f"height='{PAD_T + ph - Y(c):.1f}' fill='#30638e'/>"
        for i, c in enumerate(binned.tolist())
        if c > 0
    )
    axes = "".join(
        f"<text x='{X(t):.1f}' y='{H - PAD_B + 13}' text-anchor='middle'>{num(t, 6)}</text>"
        for t in _ticks(x0, x1)
    )
    axes += "".join(
        f"<text x='{PAD_L - 4}' y='{Y(10**e) + 4:.1f}' text-anchor='end'>{10**e:,}</text>"
        for e in range(int(top) + 1)
    )
    beyond = int(counts[k < 0].sum() + counts[k >= nb].sum()) + r.extreme_tokens
    note = f"clipped {pct(r.clip.region)}"
    if beyond:
        note += f"; {beyond:,} tokens beyond the axis"
    inner = band + bars + f"<text x='{PAD_L + 6}' y='{PAD_T + 14}'>{_e(note)}</text>"
    return _frame(
        title, "log ρ = logp − old_logp", f"tokens per bin ({num(step, 2)}, log)", inner, axes
    )


def _kl_svg(r: ObjectiveReport, thresholds: dict[str, tuple[float | None, float | None]]) -> str:
    """The share of tokens whose KL exceeds x, on log-log axes."""
    title = f"per-token KL ({r.settings.kl_estimator}): share of tokens above x"
    if r.kl_bins is None or r.kl is None:
        return f"<p class=mute>{_e(title)}: no ref_logp</p>"
    values, counts = r.kl_bins
    above = 1.0 - np.cumsum(counts) / counts.sum()
    keep = (values > 0) & (above > 0)
    if not keep.any():
        return f"<p class=mute>{_e(title)}: every token's KL is 0</p>"
    xs, ys = np.log10(values[keep]), np.log10(above[keep])
    left = max(float(xs[0]), math.log10((r.kl.mean or 1e-12) * 1e-3))
    warn, fail = thresholds.get("kl_max", (None, None))
    right = float(xs[-1]) + 0.3
    for t in (warn, fail):
        if t is not None and math.log10(t) <= right + 1.3:
            right = max(right, math.log10(t) + 0.3)
    bottom = math.floor(float(ys.min()))
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def X(v: float) -> float:
        return PAD_L + (min(max(v, left), right) - left) / (right - left) * pw

    def Y(v: float) -> float:
        return PAD_T + (0 - v) / (0 - bottom) * ph if bottom < 0 else PAD_T

    pts = []
    for x, y in zip(xs.tolist(), ys.tolist(), strict=True):
        if x < left:
            continue
        pts.append(f"{X(x):.1f},{Y(y):.1f}")
    line = f"<polyline points='{' '.join(pts)}' fill='none' stroke='#30638e' stroke-width='1.6'/>"
    marks = ""
    for k, (t, colour, name) in enumerate(((warn, "#b7791f", "warn"), (fail, "#c0392b", "fail"))):
        if t is not None and left < math.log10(t) < right:
            x = X(math.log10(t))
            marks += (f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{PAD_T}' y2='{PAD_T + ph}' "
                      f"stroke='{colour}' stroke-dasharray='4 3'/>"
                      f"<text x='{x - 3:.1f}' y='{PAD_T + 12 + 13 * k}' text-anchor='end'>"
                      f"kl-max {name} {num(t, 6)}</text>")  # fmt: skip
    axes = "".join(
        f"<text x='{X(e):.1f}' y='{H - PAD_B + 13}' text-anchor='middle'>1e{e}</text>"
        for e in range(math.ceil(left), math.floor(right) + 1)
    )
    axes += "".join(
        f"<text x='{PAD_L - 4}' y='{Y(e) + 4:.1f}' text-anchor='end'>1e{e}</text>"
        for e in range(bottom, 1)
    )
    return _frame(title, "KL per token (log)", "share with KL > x (log)", line + marks, axes)


TREND = (
    ("objective", "J"),
    ("clip_fraction_region", "clip region"),
    ("ratio_p99", "ratio ρ p99"),
    ("kl_mean", "KL mean"),
    ("entropy_mean", "entropy mean"),
    ("frac_zero_variance_groups", "zero-variance groups"),
    ("reward_mean", "reward mean"),
    ("length_mean", "length mean"),
    ("rollout_kl_k3", "sampler KL (k3)"),
)
_BASE = {"clip_fraction_region": 0.0, "kl_mean": 0.0, "entropy_mean": 0.0,
         "frac_zero_variance_groups": 0.0, "length_mean": 0.0, "rollout_kl_k3": 0.0,
         "ratio_p99": 1.0}  # fmt: skip


def _trend(t: TrendReport, thresholds: dict[str, tuple[float | None, float | None]]) -> str:
    steps = [row["step"] for row in t.steps]
    out = []
    w, h, pl, pb = 300, 150, 58, 22
    for key, title in TREND:
        vals = [row[key] for row in t.steps]
        fin = [float(v) for v in vals if v is not None and math.isfinite(v)]
        if not fin:
            continue
        lo, hi = min(fin), max(fin)
        base = _BASE.get(key)
        warn, fail = thresholds.get(key, (None, None))
        if base is not None and lo >= base:
            top = max(hi, base + 1e-12)
            if warn is not None and warn <= 3 * top:
                top = max(top, warn)
            y0, y1 = base, base + 1.15 * (top - base)
        else:
            span = max(hi - lo, 0.1 * max(abs(lo), abs(hi)), 1e-12)
            y0, y1 = (lo + hi) / 2 - 0.6 * span, (lo + hi) / 2 + 0.6 * span
        s0, s1 = min(steps), max(steps)

        def X(v: float, s0: float = s0, s1: float = s1) -> float:
            return pl + (v - s0) / ((s1 - s0) or 1) * (w - pl - 8)

        def Y(v: float, y0: float = y0, y1: float = y1) -> float:
            return 14 + (1 - (v - y0) / (y1 - y0)) * (h - 14 - pb)

        pts = " ".join(
            f"{X(s):.1f},{Y(float(v)):.1f}"
            for s, v in zip(steps, vals, strict=True)
            if v is not None and math.isfinite(v)
        )
        bands = ""
        for lvl, colour in ((warn, "#f2c14e"), (fail, "#d1495b")):
            if lvl is not None and y0 < lvl < y1:
                bands += (f"<rect x='{pl}' y='14' width='{w - pl - 8}' height='{Y(lvl) - 14:.1f}'"
                          f" fill='{colour}' fill-opacity='.2'/>")  # fmt: skip
        labels = (f"<text x='{pl - 3}' y='{Y(y1) + 9:.1f}' text-anchor='end'>{num(y1, 3)}</text>"
                  f"<text x='{pl - 3}' y='{Y(y0):.1f}' text-anchor='end'>{num(y0, 3)}</text>"
                  f"<text x='{pl}' y='{h - 6}'>{s0}</text>"
                  f"<text x='{w - 8}' y='{h - 6}' text-anchor='end'>{s1}</text>")  # fmt: skip
        out.append(
            f"<svg viewBox='0 0 {w} {h}' xmlns='http://www.w3.org/2000/svg' role='img'>"
            f"<title>{_e(title)}</title><text x='{w / 2}' y='11' text-anchor='middle' "
            f"style='font-weight:600'>{_e(title)}: {num(fin[0])} → {num(fin[-1])}</text>"
            f"{bands}<rect x='{pl}' y='14' width='{w - pl - 8}' height='{h - 14 - pb}' "
            f"fill='none' stroke='#9aa4b1'/><polyline points='{pts}' fill='none' stroke='#30638e'"
            f" stroke-width='1.6'/>{labels}</svg>"
        )
    return f"<div class=trend>{''.join(out)}</div>"


# ------------------------------------------------------------------------ answers
def _answers(s: ShareReport) -> str:
    a = s.answers
    if a is None or not a.rows:
        return "<p class=mute>No per-token log-probs: no answers to rank.</p>"
    cols = [("source", "file"), ("row", "row"), ("group", "group"), ("reward", "reward"),
            ("advantage", "A"), ("length", "len"), ("kl_mean", "KL mean"),
            ("kl_max", "KL max"), ("log_ratio_max_abs", "|log ρ| max"),
            ("clip_share", "clip")]  # fmt: skip
    head = "".join(
        f"<th class={'n' if k not in ('source', 'group') else ''}>{_e(t)}</th>" for k, t in cols
    )
    body = []
    for row in a.rows:
        cells = []
        for k, _ in cols:
            v = row.get(k)
            text = str(v) if k in ("source", "row", "group") and v is not None else num(v)
            cells.append(f"<td class={'n' if k not in ('source', 'group') else ''}>{_e(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    table = f"<table><tr>{head}</tr>{''.join(body)}</table>"
    texts = "".join(_answer_text(i, t, s.objective) for i, t in enumerate(s.texts))
    if not any(t.completion or t.tokens for t in s.texts):
        texts = ("<p class=mute>The input has no <code>completion</code> column: the answers' "
                 "text is not shown (and no <code>tokens</code> column: no coloured tokens)."
                 "</p>")  # fmt: skip
    return f"<p class=mute>The {len(a.rows)} answers with the largest {_e(a.sort)}, worst first." \
           f"</p>{table}{texts}"  # fmt: skip


def _shade(v: float, top: float) -> str:
    """A token's colour intensity: its value on a log scale over three decades below
    the answer's largest (KL and |log ρ| spread over orders of magnitude)."""
    if not v > top * 1e-3:
        return "0"
    return f"{0.08 + 0.77 * math.log10(v / (top * 1e-3)) / 3:.3f}"


def _answer_text(i: int, t: AnswerText, r: ObjectiveReport) -> str:
    if not (t.completion or t.tokens):
        return ""
    row = t.row
    title = (f"#{i + 1}: {row['source']} row {row['row']}, group {row['group']}, reward "
             f"{num(row['reward'])}, A {num(row['advantage'])}")  # fmt: skip
    parts = [f"<details{' open' if i == 0 else ''}><summary>{_e(title)}</summary>"]
    if t.prompt:
        parts.append(f"<div class=mute>prompt</div><pre>{_e(t.prompt)}</pre>")
    if t.completion:
        cut = " (cut)" if t.truncated else ""
        parts.append(f"<div class=mute>completion{cut}</div><pre>{_e(t.completion)}</pre>")
    if t.tokens and t.token_log_ratio is not None:
        kl = t.token_kl or [0.0] * len(t.tokens)
        lr = [abs(x) for x in t.token_log_ratio]
        kmax = max(max(kl), 1e-12)
        lmax = max(max(lr), 1e-12)
        spans = "".join(
            f"<span style='--kl:{_shade(k, kmax)};--lr:{_shade(x, lmax)}' "
            f"title='KL {num(k)} · log ρ {num(d)}'>{_e(tok)}</span>"
            for tok, k, x, d in zip(t.tokens, kl, lr, t.token_log_ratio, strict=False)
        )
        name = f"c{i}"
        parts.append(
            f"<div class=coloured>tokens coloured (log scale, 3 decades) by "
            f"<input type=radio class=by-kl name={name} id=by-kl-{i} "
            f"{'checked' if t.token_kl else 'disabled'}><label for=by-kl-{i}>KL "
            f"({_e(r.settings.kl_estimator)}, max {num(kmax)})</label>"
            f"<input type=radio class=by-lr name={name} id=by-lr-{i} "
            f"{'' if t.token_kl else 'checked'}><label for=by-lr-{i}>|log ρ| "
            f"(max {num(lmax)})</label><div class=toks>{spans}</div></div>"
        )
    parts.append("</details>")
    return "".join(parts)


# -------------------------------------------------------------------------- page
def _explorer_css(explorer: str) -> str:
    if not explorer:
        return ""
    from .run_html import EXPLORER_CSS

    return EXPLORER_CSS


def render_html(
    s: ShareReport,
    thresholds: dict[str, tuple[float | None, float | None]] | None = None,
    explorer: str = "",
) -> str:
    """The report as one HTML document (a string), self-contained; ``explorer`` the
    step's group and token explorer (:func:`grpo_cli.views.run_html.explorer`), its one
    inline script and data block, after the worst answers."""
    thresholds = thresholds or {}
    r = s.objective
    sections = [
        f"<header><h1>grpo-cli report</h1><div class=sub>{_e(s.source)} · "
        f"{_e(settings_text(r))} · {_e(r.settings.agg)}</div></header>",
        _summary(s),
        f"<h2>Findings</h2>{_findings(s.findings)}",
        f"<h2>Check</h2>{_check(s.check)}",
        "<h2>Distributions</h2><div class=figs>"
        f"<div>{_ratio_svg(r)}</div><div>{_kl_svg(r, thresholds)}</div></div>",
    ]
    if s.trend is not None and len(s.trend.steps) > 1:
        sections.append(f"<h2>Trend over {len(s.trend.steps)} steps</h2>"
                        f"{_trend(s.trend, thresholds)}")  # fmt: skip
    sections.append(f"<h2>Worst answers</h2>{_answers(s)}")
    if explorer:
        sections.append(explorer)
    if r.logged is not None:
        status = {"match": "pass", "differs": "fail"}
        rows = "".join(
            f"<tr><td>{_e(m.metric)}</td><td class=n>{_e(num(m.logged, 7))}</td>"
            f"<td class=n>{_e(num(m.recomputed, 7))}</td><td class=n>{_e(num(m.relative, 3))}"
            f"</td><td>{_badge(status.get(m.verdict, 'skip'), m.verdict)}</td></tr>"
            for m in r.logged.metrics
        )
        sections.append(
            f"<h2>Logged by the trainer vs recomputed</h2><p class=mute>{_e(r.logged.file)}</p>"
            "<table><tr><th>metric</th><th class=n>logged</th><th class=n>recomputed</th>"
            f"<th class=n>relative diff</th><th></th></tr>{rows}</table>"
        )
    notes = [*r.warnings, *s.notes]
    if notes:
        items = "".join(f"<li>{_e(n)}</li>" for n in notes)
        sections.append(f"<h2>Notes</h2><ul class=mute>{items}</ul>")
    sections.append(f"<footer>grpo-cli {_e(__version__)} · every number as "
                    "<code>--json</code> gives it; one file, no network</footer>")  # fmt: skip
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>grpo-cli report: {_e(s.source)}</title><style>{CSS}{_explorer_css(explorer)}"
        "</style></head>"
        f"<body><main>{''.join(sections)}</main></body></html>\n"
    )
