"""Summaries of folded values as records: distributions of sketches and counts, the
group summary, and the singleton-group warning."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ..core import GroupStats
from ..core.stats import IntCounts, Moments, Sketch, quantiles_linear
from ..records import QUANTILE_LEVELS, QUANTILES, Distribution, GroupSummary

if TYPE_CHECKING:
    pass


F64 = NDArray[np.float64]


I64 = NDArray[np.int64]


# ------------------------------------------------------------------- distributions
def distribution(
    m: Moments, s: Sketch | None, f: Callable[[F64], F64] | None = None
) -> Distribution:
    qs: dict[str, float] = {}
    if s is not None and s.n:
        vals = s.quantiles(QUANTILE_LEVELS, f)
        assert vals is not None
        qs = {k: float(v) for k, v in zip(QUANTILES, vals, strict=True)}
    return Distribution(
        count=m.n,
        mean=m.mean,
        std=m.std,
        min=m.min,
        max=m.max,
        quantiles=qs,
        exact=True if s is None else s.is_exact,
    )


def int_distribution(c: IntCounts) -> Distribution:
    if c.n == 0:
        return Distribution(0, None, None, None, None, {})
    mean, std, lo, hi = c.moments()
    vals = c.quantiles(QUANTILE_LEVELS)
    assert vals is not None
    return Distribution(
        count=c.n,
        mean=mean,
        std=std,
        min=float(lo),
        max=float(hi),
        quantiles={k: float(v) for k, v in zip(QUANTILES, vals, strict=True)},
    )


def values_distribution(x: F64) -> Distribution:
    m = Moments().update(x)
    qs: dict[str, float] = {}
    if x.size:
        levels = quantiles_linear(x, QUANTILE_LEVELS)
        qs = {k: float(v) for k, v in zip(QUANTILES, levels, strict=True)}
    return Distribution(count=m.n, mean=m.mean, std=m.std, min=m.min, max=m.max, quantiles=qs)


def group_summary_of(stats: GroupStats) -> GroupSummary:
    zero = stats.min == stats.max
    return GroupSummary(
        groups=int(stats.count.shape[0]),
        answers=int(stats.count.sum()),
        zero_variance_groups=int(zero.sum()),
        zero_variance_answers=int(stats.count[zero].sum()),
        singleton_groups=int((stats.count == 1).sum()),
        min_size=int(stats.count.min()) if stats.count.size else 0,
        max_size=int(stats.count.max()) if stats.count.size else 0,
    )


SINGLETONS = (
    "every group has one answer ({n} groups of one): the group ids look like answer ids. "
    "A group of one has advantage 0 (GRPO), so the policy term is 0: give the prompt's id "
    "as the group (--column group=NAME)"
)


def singleton_warning(groups: GroupSummary | None) -> list[str]:
    """When every group is a singleton (answer ids given as group ids)."""
    if groups is None or groups.groups < 2 or groups.singleton_groups != groups.groups:
        return []
    return [SINGLETONS.format(n=groups.groups)]
