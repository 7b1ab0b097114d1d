"""Mergeable partial statistics: sums, counts, extremes and fixed-bin histograms.

Every class here has ``update(values)`` (fold in a chunk) and ``merge(other)`` (fold in a
partial computed elsewhere), and merging two partials equals computing on the
concatenated data. One small file, a stream of record batches and several worker
processes therefore share one code path. numpy only.

Quantiles: a :class:`Sketch` keeps the values themselves while it holds at most
``exact_cap`` of them, and answers exact quantiles (numpy's default "linear" method);
beyond that it answers from a fixed-bin histogram kept all along. With bin width ``w``,
every in-range value is represented by its bin centre, at most ``w/2`` away, and so is
every reported quantile (an order statistic of perturbed values moves by at most the
largest perturbation). Values outside ``[lo, hi)`` fall into two open bins represented
by the exact minimum and maximum, so quantiles landing there are bounded, not resolved.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ..errors import MergeError
from .ragged import dot

F64 = NDArray[np.float64]

EXACT_CAP = 1 << 20


class Moments:
    """Count, sum, mean, population std (Chan et al. merge), min and max of real values.

    Non-finite values (an overflowed ratio or KL) are counted in ``n_inf``; they make
    ``total`` and ``mean`` infinite and ``std`` undefined (None), never NaN silently.
    """

    __slots__ = ("fast", "hi", "lo", "m2", "mean_f", "n", "n_inf", "total")

    def __init__(self, fast: bool = False) -> None:
        # fast: the spread from power sums (Σx, Σx²), one pass fewer; use it where the std
        # is not tiny against the mean (KL values), not for e.g. ratios near 1.
        self.fast = fast
        self.n = 0
        self.n_inf = 0
        self.total = 0.0
        self.mean_f = 0.0  # mean of the finite values
        self.m2 = 0.0  # Σ (x − mean_f)² over finite values
        self.lo = np.inf
        self.hi = -np.inf

    def update(self, x: F64) -> Moments:
        if x.shape[0] == 0:
            return self
        # values near ±1.8e308 may sum (or square) beyond float64: the total is then inf,
        # and the moments come from the shifted sums of the finite values below
        with np.errstate(over="ignore", invalid="ignore"):
            return self._update(x)

    def _update(self, x: F64) -> Moments:
        other = Moments()
        other.n = int(x.shape[0])
        with np.errstate(invalid="ignore"):
            other.total = float(np.sum(x))
        other.lo = float(np.min(x))
        other.hi = float(np.max(x))
        if math.isfinite(other.total):  # then every value is finite
            xf = x
        else:
            xf = x[np.isfinite(x)]
            other.n_inf = other.n - int(xf.shape[0])
        nf = int(xf.shape[0])
        if nf and self.fast:
            s1 = float(np.sum(xf)) if other.n_inf else other.total
            other.mean_f = s1 / nf
            other.m2 = max(dot(xf, xf) - s1 * s1 / nf, 0.0)
        elif nf:
            # Shifted sums: one subtraction, a sum and a square; exact enough because the
            # shift (the first value) is of the data's own magnitude.
            c = float(xf[0])
            y = xf - c
            s1 = float(np.sum(y))
            other.mean_f = c + s1 / nf
            # np.square + sum, not np.dot: a BLAS call wakes OpenBLAS's spinning thread pool,
            # which then competes with the decoding thread for the second core.
            other.m2 = max(float(np.sum(np.square(y, out=y))) - s1 * s1 / nf, 0.0)
        return self.merge(other)

    @classmethod
    def from_sums(
        cls, n: int, n_inf: int, total: float, s1: float, s2: float, lo: float, hi: float
    ) -> Moments:
        """A partial from power sums over finite values (``s1 = Σx``, ``s2 = Σx²``), as
        ``update`` computes them with ``fast=True``; ``total`` sums every value."""
        m = cls(fast=True)
        if n == 0:
            return m
        m.n, m.n_inf, m.total, m.lo, m.hi = n, n_inf, total, lo, hi
        nf = n - n_inf
        if nf:
            m.mean_f = s1 / nf
            m.m2 = max(s2 - s1 * s1 / nf, 0.0)
        return m

    def merge(self, o: Moments) -> Moments:
        na, nb = self.n - self.n_inf, o.n - o.n_inf
        nf = na + nb
        if nf:
            d = o.mean_f - self.mean_f
            self.mean_f += d * nb / nf
            self.m2 += o.m2 + d * d * na * nb / nf
        self.n += o.n
        self.n_inf += o.n_inf
        self.total += o.total
        self.lo = min(self.lo, o.lo)
        self.hi = max(self.hi, o.hi)
        return self

    @property
    def mean(self) -> float | None:
        if self.n == 0:
            return None
        return self.total / self.n if self.n_inf else self.mean_f

    @property
    def std(self) -> float | None:
        if self.n == 0 or self.n_inf:
            return None
        return float(np.sqrt(self.m2 / self.n))

    @property
    def min(self) -> float | None:
        return self.lo if self.n else None

    @property
    def max(self) -> float | None:
        return self.hi if self.n else None


def quantiles_linear(x: F64, qs: F64) -> F64:
    """``np.quantile(x, qs)`` (method "linear", Hyndman & Fan's 7th) of a 1-D float array,
    bit for bit: the same virtual index, neighbours and two-sided interpolation as numpy 2.
    Not numpy's own: its ``np.unique`` imports ``numpy.ma`` (7 ms of a 20-row run)."""
    y = np.sort(np.asarray(x, dtype=np.float64))
    n = y.shape[0]
    q = np.asarray(qs, dtype=np.float64)
    if n == 0:
        raise ValueError("quantiles_linear: no values")
    if np.isnan(y[-1]):  # NaN sorts last; numpy's answer is NaN throughout
        return np.full(q.shape, np.nan)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above], nxt[above] = -1, -1
    below = virtual < 0
    prev[below], nxt[below] = 0, 0
    i0, i1 = prev.astype(np.intp), nxt.astype(np.intp)
    t = virtual - prev
    a, b = y[i0], y[i1]
    with np.errstate(invalid="ignore"):  # inf − inf: NaN, as numpy gives
        d = b - a
        out = a + d * t
        hi = t >= 0.5
        out[hi] = (b - d * (1 - t))[hi]
    return out


def quantiles_from_counts(values: F64, counts: NDArray[np.int64], qs: F64) -> F64:
    """Quantiles of a multiset given as sorted distinct ``values`` with ``counts``.

    Uses numpy's default "linear" rule: position ``h = q (n − 1)`` between order
    statistics ``x_⌊h⌋`` and ``x_⌈h⌉``. Equals ``np.quantile(np.repeat(values, counts), q)``.
    """
    keep = counts > 0
    v, c = values[keep], counts[keep]
    n = int(c.sum())
    cum = np.cumsum(c)  # order statistic k (0-based) is v[searchsorted(cum, k, 'right')]
    h = qs * (n - 1)
    k0 = np.floor(h).astype(np.int64)
    k1 = np.minimum(k0 + 1, n - 1)
    x0 = v[np.searchsorted(cum, k0, side="right")]
    x1 = v[np.searchsorted(cum, k1, side="right")]
    frac = h - k0
    with np.errstate(invalid="ignore"):  # inf − inf where both neighbours are inf
        out = x0 + (x1 - x0) * frac
    return np.where(x0 == x1, x0, out)


def bin_index(x: float, lo: float, inv_width: float, nbins: int) -> int:
    """The bin of ``x`` among ``nbins`` equal bins from ``lo`` (``inv_width``: 1 / their
    width) and the two open end bins (0 and ``nbins + 1``; NaN: the top one), computed
    with the operations of :meth:`Histogram.update` and the compiled kernel."""
    with np.errstate(over="ignore", invalid="ignore"):
        pos = np.float64(x) * inv_width
        pos += 1.0 - lo * inv_width
    if pos != pos:
        return nbins + 1
    return int(min(max(pos, 0.0), float(nbins + 1)))


class BinCounts(NamedTuple):
    """The occupied bins of a histogram (``bins``, ascending) and their counts."""

    bins: NDArray[np.int64]
    counts: NDArray[np.int64]


class Histogram:
    """Fixed-bin histogram of ``nbins`` equal bins on ``[lo, hi)`` plus two open end bins.

    Tracks the exact min and max; bin ``j`` is represented by its centre, clamped into
    ``[min, max]``, and the end bins by min and max.
    """

    __slots__ = ("counts", "hi", "inv_width", "lo", "nbins", "vmax", "vmin")

    def __init__(self, lo: float, hi: float, nbins: int) -> None:
        self.lo, self.hi, self.nbins = float(lo), float(hi), int(nbins)
        self.inv_width = self.nbins / (self.hi - self.lo)
        self.counts = np.zeros(self.nbins + 2, dtype=np.int64)
        self.vmin, self.vmax = np.inf, -np.inf

    @property
    def width(self) -> float:
        return (self.hi - self.lo) / self.nbins

    def update(self, x: F64, lo: float | None = None, hi: float | None = None) -> Histogram:
        """Count ``x``; pass its min and max when already known to save two passes."""
        if x.shape[0] == 0:
            return self
        # position + 1, so that the underflow bin is 0 and truncation is floor
        with np.errstate(over="ignore", invalid="ignore"):  # ±1e308: an end bin, not a warning
            pos = np.multiply(x, self.inv_width)
            pos += 1.0 - self.lo * self.inv_width
        np.clip(pos, 0.0, float(self.nbins + 1), out=pos)
        pos[np.isnan(pos)] = float(self.nbins + 1)  # a NaN: the top open bin, not an index
        idx = pos.astype(np.intp)
        if idx.shape[0] * 64 < self.nbins:  # a few values (per-answer means): no full pass
            np.add.at(self.counts, idx, 1)
        else:
            self.counts += np.bincount(idx, minlength=self.nbins + 2)
        self.vmin = min(self.vmin, float(np.min(x)) if lo is None else lo)
        self.vmax = max(self.vmax, float(np.max(x)) if hi is None else hi)
        return self

    def bin_of(self, x: float) -> int:
        """The bin :meth:`update` counts ``x`` in (0 and ``nbins + 1``: the open ends)."""
        return bin_index(x, self.lo, self.inv_width, self.nbins)

    def add_counts(self, c: BinCounts, lo: float, hi: float) -> Histogram:
        """Add the counts ``c`` (binned as :meth:`update` bins, e.g. by the compiled
        kernel) of values whose min and max are ``lo`` and ``hi``."""
        if c.bins.shape[0] and not (0 <= c.bins[0] and c.bins[-1] < self.counts.shape[0]):
            raise MergeError(f"histogram counts of bins beyond the {self.counts.shape[0]} bins")
        if lo > hi:  # no value
            return self
        self.counts[c.bins] += c.counts
        self.vmin = min(self.vmin, lo)
        self.vmax = max(self.vmax, hi)
        return self

    def layout(self) -> tuple[float, float, int]:
        return (self.lo, self.hi, self.nbins)

    def merge(self, o: Histogram) -> Histogram:
        if o.layout() != self.layout():
            raise MergeError(f"histograms of bins {self.layout()} and {o.layout()}")
        if o.vmin > o.vmax:  # empty: nothing to add (and no pass over 400,000 bins)
            return self
        if self.vmin > self.vmax:
            self.counts = o.counts.copy()
        else:
            self.counts += o.counts
        self.vmin = min(self.vmin, o.vmin)
        self.vmax = max(self.vmax, o.vmax)
        return self

    # On the wire (pickle: worker processes, a cluster) only the occupied bins travel: a
    # 400,000-bin histogram of one batch holds a few thousand.
    def __getstate__(self) -> dict[str, object]:
        idx = np.flatnonzero(self.counts)
        return {
            "layout": self.layout(),
            "vmin": self.vmin,
            "vmax": self.vmax,
            "idx": idx.astype(np.int32),
            "counts": self.counts[idx],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        lo, hi, nbins = state["layout"]
        self.lo, self.hi, self.nbins = float(lo), float(hi), int(nbins)
        self.inv_width = self.nbins / (self.hi - self.lo)
        self.counts = np.zeros(self.nbins + 2, dtype=np.int64)
        self.counts[state["idx"]] = state["counts"]
        self.vmin, self.vmax = state["vmin"], state["vmax"]

    def representatives(self) -> F64:
        centres = self.lo + (np.arange(self.nbins) + 0.5) * self.width
        rep = np.concatenate(([self.vmin], centres, [self.vmax]))
        return np.clip(rep, self.vmin, self.vmax)


class Sketch:
    """Quantiles of a stream: exact up to ``exact_cap`` values, then from a :class:`Histogram`.

    ``quantiles(qs, f)`` returns quantiles of ``f(x)`` for any elementwise ``f`` (the
    ratio is ``exp`` of the histogrammed log-ratio; KL is a function of ``logp − ref_logp``),
    so one histogram of the log-ratio serves every derived distribution.
    """

    __slots__ = ("exact", "exact_cap", "hist", "n")

    def __init__(self, lo: float, hi: float, nbins: int, exact_cap: int = EXACT_CAP) -> None:
        self.hist = Histogram(lo, hi, nbins)
        self.exact_cap = exact_cap
        self.exact: list[F64] | None = []
        self.n = 0

    @property
    def is_exact(self) -> bool:
        return self.exact is not None

    def update(self, x: F64, lo: float | None = None, hi: float | None = None) -> Sketch:
        self.hist.update(x, lo, hi)
        return self._keep(int(x.shape[0]), lambda: np.array(x, dtype=np.float64, copy=True))

    def counted(
        self, n: int, counts: BinCounts, lo: float, hi: float, values: Callable[[], F64]
    ) -> Sketch:
        """Add ``n`` values already binned into ``counts`` (min ``lo``, max ``hi``; by the
        compiled kernel: :meth:`Histogram.add_counts`); ``values()`` gives them, asked only
        while the sketch is exact."""
        if n == 0:
            return self
        self.hist.add_counts(counts, lo, hi)
        return self._keep(n, values)

    def _keep(self, n: int, values: Callable[[], F64]) -> Sketch:
        """Count ``n`` more values; keep them (``values()``) while at most ``exact_cap``."""
        self.n += n
        if self.exact is not None:
            if self.n <= self.exact_cap:
                self.exact.append(values())
            else:
                self.exact = None
        return self

    def merge(self, o: Sketch) -> Sketch:
        if o.exact_cap != self.exact_cap:
            raise MergeError(f"sketches of exact caps {self.exact_cap} and {o.exact_cap}")
        self.hist.merge(o.hist)
        self.n += o.n
        if self.exact is not None and o.exact is not None and self.n <= self.exact_cap:
            self.exact.extend(o.exact)
        else:
            self.exact = None
        return self

    def count_outside(self, lo: float, hi: float) -> int:
        """Values below ``lo`` or above ``hi``: exact while exact, else by bin representative
        (so within one bin width of the bounds)."""
        if self.exact is not None:
            return sum(int(np.count_nonzero((x < lo) | (x > hi))) for x in self.exact)
        rep = self.hist.representatives()
        return int(self.hist.counts[(rep < lo) | (rep > hi)].sum())

    def quantiles(self, qs: F64, f: Callable[[F64], F64] | None = None) -> F64 | None:
        if self.n == 0:
            return None
        if self.exact is not None:
            x = np.concatenate(self.exact)
            with np.errstate(over="ignore", invalid="ignore"):
                y = x if f is None else f(x)
                q = quantiles_linear(y, qs)
            if np.isnan(q).any() and not np.isnan(y).any():
                # interpolating towards an overflowed (inf) value: the quantile is inf
                q = np.where(np.isnan(q), np.quantile(y, qs, method="higher"), q)
            return q
        rep = self.hist.representatives()
        vals = rep if f is None else f(rep)
        if np.all(vals[1:] >= vals[:-1]):  # f monotone (exp of a log-ratio): no sort needed
            return quantiles_from_counts(vals, self.hist.counts, qs)
        order = np.argsort(vals, kind="stable")
        return quantiles_from_counts(vals[order], self.hist.counts[order], qs)


class IntCounts:
    """Exact counts of non-negative integers (answer lengths): a growing bincount below
    :attr:`DENSE`, and the rare larger values (an answer of millions of tokens) by value,
    so that memory follows the distinct values, not the largest one."""

    DENSE = 1 << 16

    __slots__ = ("counts", "large")

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)
        self.large: dict[int, int] = {}

    def update(self, x: NDArray[np.int64]) -> IntCounts:
        if x.shape[0] == 0:
            return self
        big = x >= self.DENSE
        if big.any():
            for v in x[big].tolist():  # rare: answers longer than 65,536 tokens
                self.large[v] = self.large.get(v, 0) + 1
            x = x[~big]
        if x.shape[0]:
            self._add(np.bincount(x))
        return self

    def merge(self, o: IntCounts) -> IntCounts:
        self._add(o.counts)
        for v, c in o.large.items():
            self.large[v] = self.large.get(v, 0) + c
        return self

    def _add(self, c: NDArray[np.int64]) -> None:
        if c.shape[0] > self.counts.shape[0]:
            c = c.copy()
            c[: self.counts.shape[0]] += self.counts
            self.counts = c
        else:
            self.counts[: c.shape[0]] += c

    def values(self) -> tuple[F64, NDArray[np.int64]]:
        """The distinct counted integers, ascending, and their counts."""
        nz = np.flatnonzero(self.counts)
        v, c = nz.astype(np.float64), self.counts[nz]
        if self.large:
            keys = sorted(self.large)
            v = np.concatenate([v, np.array(keys, dtype=np.float64)])
            c = np.concatenate([c, np.array([self.large[k] for k in keys], dtype=np.int64)])
        return v, c

    @property
    def n(self) -> int:
        return int(self.counts.sum()) + sum(self.large.values())

    def count_of(self, v: int) -> int:
        """How many times ``v`` was counted (in the dense counts or among the large)."""
        if v >= self.counts.shape[0]:
            return self.large.get(v, 0)
        return int(self.counts[v])

    def largest(self) -> int | None:
        """The largest counted integer (None: nothing counted)."""
        if self.large:
            return max(self.large)
        nz = np.flatnonzero(self.counts)
        return int(nz[-1]) if nz.size else None

    def quantiles(self, qs: F64) -> F64 | None:
        if self.n == 0:
            return None
        return quantiles_from_counts(*self.values(), qs)

    def moments(self) -> tuple[float, float, int, int]:
        """(mean, population std, min, max) of the counted integers."""
        v, c = self.values()
        n = int(c.sum())
        mean = float(np.sum(v * c) / n)
        var = float(np.sum((v - mean) ** 2 * c) / n)
        return mean, float(np.sqrt(var)), int(v[0]), int(v[-1])
