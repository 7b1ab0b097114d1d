"""``--plot PATH.png``: figures of a report, drawn with matplotlib (the ``[plot]`` extra).

Views only: every number plotted is in the report record already (the distributions as
the partials' fixed-bin histograms: ``ObjectiveReport.log_ratio_bins`` and ``kl_bins``);
thresholds come from the caller (``check``'s rules), named by metric.

- the ratio: a histogram of log ρ in fine equal bins, the clip band shaded, log counts;
- the per-token KL: the share of tokens above x (a CCDF) on log-log axes, with kl-max's
  thresholds;
- the answers: length against advantage;
- trend: one panel a metric on a shared step axis, titled with the source and settings,
  ``check``'s thresholds as bands, and y-limits that keep a flat metric flat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .format import num, pct

if TYPE_CHECKING:
    from ..records import ObjectiveReport, TrendReport

__all__ = ["TREND_PANELS", "Thresholds", "plot_objective", "plot_trend", "require_plot"]

DPI = 100  # figures are 12 inches wide: 1200 px
Thresholds = Mapping[str, tuple[float | None, float | None]]  # metric: (warn, fail)
_WARN, _FAIL, _CLIP = "#f2c14e", "#d1495b", "#66a182"


def _pyplot(path: Path) -> Any:
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UsageError(f"--plot {path}: expected a .png, .svg or .pdf file name")
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'grpo-cli[plot]'") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def require_plot(path: Path | None) -> None:
    """Fail before any work when ``--plot`` cannot be honoured."""
    if path is not None:
        _pyplot(path)


def _save(plt: Any, fig: Any, path: Path) -> None:
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as exc:
        raise UsageError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _settings_text(r: Any) -> str:
    s = r.settings
    who = f"preset {s.preset}" if s.preset else "defaults (DeepSeekMath)"
    if s.origin:
        who = f"settings from {s.origin}"
    eps = f"ε {num(s.clip_eps, 6)}" + (
        f"/{num(s.eps_high, 6)}" if s.clip_eps_high is not None else ""
    )
    loss = "" if s.loss == "clip" else f" · loss {s.loss}"
    return f"{who}{loss} · {s.agg} · {eps} · β {num(s.beta, 6)} ({s.kl_estimator})"


# ------------------------------------------------------------------------ objective
def _ratio_histogram(ax: Any, r: ObjectiveReport) -> None:
    """log ρ in equal bins (multiples of the sketch's 1e-4) over the bulk of the tokens
    and the clip band; the clip band shaded; tokens beyond the range counted."""
    import numpy as np

    s = r.settings
    lo_band, hi_band = math.log(1 - s.clip_eps), math.log(1 + s.eps_high)
    ax.set_title(f"log-ratio per token (clip band shaded: ρ in [{num(1 - s.clip_eps, 6)}, "
                 f"{num(1 + s.eps_high, 6)}])", fontsize=10)  # fmt: skip
    if r.log_ratio_bins is None or r.log_ratio_bins[2].sum() == 0:
        _empty(ax, "no tokens")
        return
    width, edges, counts = r.log_ratio_bins
    edges = np.asarray(edges, dtype=np.float64)
    cum = np.cumsum(counts) / counts.sum()
    q_lo = float(edges[np.searchsorted(cum, 0.0005)])
    q_hi = float(edges[min(int(np.searchsorted(cum, 0.9995)), len(edges) - 1)]) + width
    span_lo = min(q_lo, 2 * lo_band)
    span_hi = max(q_hi, 2 * hi_band)
    step = max(width, round((span_hi - span_lo) / 160 / width) * width)
    nb = math.ceil((span_hi - span_lo) / step)
    binned = np.zeros(nb, dtype=np.int64)
    k = np.floor((edges - span_lo) / step).astype(np.int64)
    inside = (k >= 0) & (k < nb)
    np.add.at(binned, k[inside], counts[inside])
    left = int(counts[k < 0].sum()) + (r.extreme_tokens if edges[0] < 0 else 0)
    right = int(counts[k >= nb].sum())
    x = span_lo + np.arange(nb) * step
    ax.axvspan(lo_band, hi_band, color=_CLIP, alpha=0.18, lw=0, label="clip band")
    ax.bar(x, np.where(binned > 0, binned, np.nan), width=step, align="edge",
           color="#30638e", lw=0)  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlim(span_lo, span_hi)
    ax.set_xlabel("log ρ = logp − old_logp")
    ax.set_ylabel(f"tokens per bin (bin {num(step, 2)})")
    beyond = []
    if left:
        beyond.append(f"{left:,} below")
    if right:
        beyond.append(f"{right:,} above")
    note = (f"clipped: {pct(r.clip.region)} (low {pct(r.clip.low)}, "
            f"high {pct(r.clip.high)})")  # fmt: skip
    if beyond:
        note += "\ntokens beyond the axis: " + ", ".join(beyond)
    ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", fontsize=8,
            bbox={"fc": "white", "ec": "0.8", "alpha": 0.85})  # fmt: skip
    ax.grid(alpha=0.25, which="both", axis="y")

    def to_log(rho: Any) -> Any:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(np.maximum(rho, 1e-300))

    top = ax.secondary_xaxis("top", functions=(np.exp, to_log))
    top.set_xlabel("ρ", fontsize=8, labelpad=1)
    top.tick_params(labelsize=7)


def _kl_ccdf(ax: Any, r: ObjectiveReport, thresholds: Thresholds) -> None:
    """The share of tokens whose KL exceeds x, log-log, with kl-max's thresholds."""
    import numpy as np

    s = r.settings
    ax.set_title(f"per-token KL ({s.kl_estimator}): share of tokens above x", fontsize=10)
    if r.kl_bins is None or r.kl is None:
        _empty(ax, "no ref_logp: no KL")
        return
    values, counts = r.kl_bins
    total = counts.sum()
    above = 1.0 - np.cumsum(counts) / total  # share strictly above each value
    keep = (values > 0) & (above > 0)
    if not keep.any():
        _empty(ax, "every token's KL is 0")
        return
    ax.step(values[keep], above[keep], where="post", color="#30638e")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("KL per token (log)")
    ax.set_ylabel("share of tokens with KL > x (log)")
    warn, fail = thresholds.get("kl_max", (None, None))
    top = max(float(values[-1]), r.kl.max or 0.0)
    right = top * 2
    for level, colour, name in ((warn, _WARN, "warn"), (fail, _FAIL, "fail")):
        if level is not None and level <= 20 * top:
            ax.axvline(level, color=colour, lw=1.5, ls="--", label=f"kl-max {name} {num(level, 6)}")
            right = max(right, level * 2)
    # the smallest bins of d hold KL values below the histogram's resolution: start the
    # axis a thousandth of the mean below it
    first = float(values[keep][0])
    left = max(first, (r.kl.mean or first) * 1e-3)
    ax.set_xlim(left, right)
    if r.kl.mean is not None and r.kl.mean > 0:
        ax.axvline(r.kl.mean, color="0.3", lw=1, ls=":", label=f"mean {num(r.kl.mean, 3)}")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.25, which="both")


def plot_objective(r: ObjectiveReport, path: Path, thresholds: Thresholds | None = None) -> None:
    """The ratio's histogram of log ρ around the clip band, the per-token KL's CCDF and
    the answers' length against their advantage."""
    plt = _pyplot(path)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), layout="constrained")
    _ratio_histogram(axes[0], r)
    _kl_ccdf(axes[1], r, thresholds or {})
    _length_advantage(axes[2], r)
    fig.suptitle(f"{r.source}: J = {num(r.objective)}, loss {num(r.loss)} · {_settings_text(r)}",
                 fontsize=11)  # fmt: skip
    _save(plt, fig, path)


def _length_advantage(ax: Any, r: ObjectiveReport) -> None:
    """Answers by length (log) and advantage: a 2-D histogram with log-scaled colours."""
    import numpy as np
    from matplotlib.colors import LogNorm

    ax.set_title("answers: length against advantage", fontsize=10)
    counts = r.length_adv
    if counts is None or r.length_adv_edges is None or not counts.any():
        _empty(ax, "no answers")
        return
    LENGTH_EDGES, ADV_EDGES = r.length_adv_edges
    x = np.clip(ADV_EDGES, -5.5, 5.5)  # the open ends drawn half a unit wide
    # row k counts lengths in [edges[k], edges[k+1]); the last row is open, drawn √2 tall
    edges = np.concatenate((LENGTH_EDGES, [LENGTH_EDGES[-1] * 2**0.5]))
    edges[0] = 0.5  # the [0, 1) row, for the log axis (answers have at least one token)
    rows = np.flatnonzero(counts.any(axis=1))
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    masked = np.ma.masked_equal(counts[lo:hi], 0)
    mesh = ax.pcolormesh(x, edges[lo : hi + 1], masked, norm=LogNorm(), cmap="viridis")
    ax.set_yscale("log")
    ax.set_xlabel("advantage")
    ax.set_ylabel("valid tokens")
    ax.figure.colorbar(mesh, ax=ax, label="answers")


# ---------------------------------------------------------------------------- trend
TREND_PANELS = (
    ("objective", "J (objective)"),
    ("clip_fraction_region", "clip region (share of tokens)"),
    ("ratio_p99", "ratio ρ p99"),
    ("kl_mean", "KL mean per token"),
    ("entropy_mean", "entropy mean (nats)"),
    ("frac_zero_variance_groups", "zero-variance groups (share)"),
    ("reward_mean", "reward mean"),
    ("length_mean", "length mean (tokens)"),
    ("rollout_kl_k3", "sampler vs trainer KL (k3)"),
)


# metrics whose natural zero (or one) the axis starts from: a share, a mean KL, a length
# moving in its last digits then looks flat; ratio p99 starts from 1 (ρ = 1 on-policy)
_BASE = {
    "clip_fraction_region": 0.0,
    "kl_mean": 0.0,
    "entropy_mean": 0.0,
    "frac_zero_variance_groups": 0.0,
    "length_mean": 0.0,
    "rollout_kl_k3": 0.0,
    "ratio_p99": 1.0,
}


def _limits(key: str, values: list[float], warn: float | None) -> tuple[float, float]:
    """y-limits that keep a flat metric flat: from the metric's natural base (0, or 1 for
    ρ p99) when every value is on its side, up to the largest value (and to check's
    warn threshold when it is near); else around the values with a span of at least 10%
    of their magnitude."""
    lo, hi = min(values), max(values)
    base = _BASE.get(key)
    if base is not None and lo >= base:
        top = hi if hi > base else base + 1e-12
        if warn is not None and base < warn <= 3 * top:
            top = max(top, warn)
        return base, base + 1.15 * (top - base)
    mid = (lo + hi) / 2
    span = max(hi - lo, 0.1 * max(abs(lo), abs(hi)), 1e-12)
    return mid - 0.6 * span, mid + 0.6 * span


def _bands(ax: Any, warn: float | None, fail: float | None, ylim: tuple[float, float]) -> None:
    """check's thresholds: the warn zone and the fail zone shaded where they reach the
    panel; a threshold above the panel is named in a corner."""
    lo, hi = ylim
    off = []
    if warn is not None:
        if warn < hi:
            ax.axhspan(max(warn, lo), hi if fail is None else min(fail, hi), color=_WARN,
                       alpha=0.25, lw=0)  # fmt: skip
            ax.axhline(warn, color=_WARN, lw=1)
        else:
            off.append(f"warn > {num(warn, 6)}")
    if fail is not None:
        if fail < hi:
            ax.axhspan(max(fail, lo), hi, color=_FAIL, alpha=0.25, lw=0)
            ax.axhline(fail, color=_FAIL, lw=1)
        else:
            off.append(f"fail > {num(fail, 6)}")
    if off:
        ax.text(0.98, 0.95, "check: " + ", ".join(off) + " (above)", transform=ax.transAxes,
                ha="right", va="top", fontsize=7, color="0.35")  # fmt: skip


def plot_trend(r: TrendReport, path: Path, thresholds: Thresholds | None = None) -> None:
    """One panel a trend metric on a shared step axis (a gap where a step lacks it),
    ``check``'s thresholds as bands, titled with the steps' source and the settings."""
    plt = _pyplot(path)
    thresholds = thresholds or {}
    fig, axes = plt.subplots(3, 3, figsize=(12, 9), layout="constrained", sharex=True)
    steps = [row["step"] for row in r.steps]
    for ax, (key, title) in zip(axes.flat, TREND_PANELS, strict=True):
        raw = [row[key] for row in r.steps]
        finite = [float(v) for v in raw if v is not None and math.isfinite(v)]
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if not finite:
            ax.text(0.5, 0.5, "not in these inputs", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")  # fmt: skip
            continue
        values = [math.nan if v is None else float(v) for v in raw]
        ax.plot(steps, values, marker="o", ms=3, color="#30638e")
        warn, fail = thresholds.get(key, (None, None))
        ylim = _limits(key, finite, warn)
        ax.set_ylim(*ylim)
        _bands(ax, warn, fail, ylim)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useOffset=False)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    sources = [str(row["source"]) for row in r.steps if row["source"] is not None]
    if not sources:
        where = "one dataset (--step-column)"
    elif len(sources) == 1:
        where = sources[0]
    else:
        where = f"{sources[0]} … {sources[-1]}"
    fig.suptitle(f"grpo-cli trend: {len(steps)} steps, {where} · {_settings_text(r)}",
                 fontsize=11)  # fmt: skip
    _save(plt, fig, path)
