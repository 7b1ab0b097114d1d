"""``--plot PATH.png``: figures of a report, drawn with matplotlib (the ``[plot]`` extra).

Views only: every number plotted is in the report record already.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from ..records import Distribution, ObjectiveReport, TrendReport

__all__ = ["plot_objective", "plot_trend", "require_plot"]

DPI = 100  # figures are 12 inches wide: 1200 px


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


def _quantile_curve(
    ax: Any, d: Distribution | None, title: str, xlabel: str, *, log: bool = False
) -> None:
    ax.set_title(title)
    if d is None or not d.quantiles:
        ax.text(0.5, 0.5, "not in this input", ha="center", va="center", transform=ax.transAxes)
        return
    pts = [(0.0, d.min)] + [(float(k[1:]) / 100, v) for k, v in d.quantiles.items()]
    pts.append((1.0, d.max))
    pts = [(q, v) for q, v in pts if v is not None and math.isfinite(v)]
    ax.plot([v for _, v in pts], [q for q, _ in pts], marker="o")
    if log:  # KL: most tokens near 0, a few far out
        ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of values ≤ x")
    ax.grid(alpha=0.3)


def plot_objective(r: ObjectiveReport, path: Path) -> None:
    """Ratio histogram around the clip band (log counts), the per-token KL as a quantile
    curve, and the answers' length against their advantage."""
    plt = _pyplot(path)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4), layout="constrained")
    ax = axes[0]
    labels = [f"{lo:.3g}–{hi:.3g}" for lo, hi, _ in r.ratio_histogram]
    counts = [c for _, _, c in r.ratio_histogram]
    lo, hi = 1 - r.settings.clip_eps, 1 + r.settings.eps_high
    inside = [lo <= a and b <= hi for a, b, _ in r.ratio_histogram]
    ax.bar(range(len(counts)), [max(c, 0.8) for c in counts],
           color=["tab:blue" if i else "tab:red" for i in inside])  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_title(f"ratio ρ per token (red: outside [{lo:g}, {hi:g}])")
    ax.set_ylabel("tokens (log)")
    _quantile_curve(axes[1], r.kl, f"per-token KL ({r.settings.kl_estimator})", "KL", log=True)
    _length_advantage(axes[2], r)
    fig.suptitle(f"{r.source}: J = {r.objective:.4g}")
    _save(plt, fig, path)


def _length_advantage(ax: Any, r: ObjectiveReport) -> None:
    """Answers by length (log) and advantage: a 2-D histogram with log-scaled colours."""
    import numpy as np
    from matplotlib.colors import LogNorm

    ax.set_title("answers: length against advantage")
    counts = r.length_adv
    if counts is None or r.length_adv_edges is None or not counts.any():
        ax.text(0.5, 0.5, "no answers", ha="center", va="center", transform=ax.transAxes)
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


TREND_PANELS = (
    ("objective", "J"),
    ("clip_fraction_region", "clip region"),
    ("ratio_p99", "ratio p99"),
    ("kl_mean", "KL mean"),
    ("entropy_mean", "entropy mean"),
    ("frac_zero_variance_groups", "zero-variance groups"),
    ("reward_mean", "reward mean"),
    ("length_mean", "length mean"),
    ("rollout_kl_k3", "sampler KL (k3)"),
)


def plot_trend(r: TrendReport, path: Path) -> None:
    """One panel per trend metric over the steps (a gap where a step lacks it)."""
    plt = _pyplot(path)
    fig, axes = plt.subplots(3, 3, figsize=(12, 9), layout="constrained", sharex=True)
    steps = [row["step"] for row in r.steps]
    for ax, (key, title) in zip(axes.flat, TREND_PANELS, strict=True):
        values = [math.nan if row[key] is None else row[key] for row in r.steps]
        ax.plot(steps, values, marker="o")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    _save(plt, fig, path)
