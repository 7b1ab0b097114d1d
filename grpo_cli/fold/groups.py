"""Pass 1's group table: each group's reward statistics over the whole input, mergeable
(:class:`GroupPartial`), and the advantages a batch computes from it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core import GroupStats, group_stats, overall_std
from ..core.stats import Moments
from ..errors import InputError
from ..io.answers import Answers
from ..io.arrow import group_ids, null_rows, numpy_of
from ..settings import Settings
from .parts import F64, I64


# ---------------------------------------------------------------- objective command
@dataclass(frozen=True)
class GroupTable:
    """The reward statistics of every group of the input (pass 1), keyed by group id: a
    batch of answers from anywhere in the input computes its own advantages from it
    (:func:`grpo_cli.core.advantages_from_stats`), with the same result bit for bit as
    the whole input at once. Small: one row per group.
    """

    ids: pa.Array
    stats: GroupStats
    batch_std: float  # the std of every reward (scale "batch")

    def codes(self, groups: pa.Array, where: str) -> I64:
        groups = group_ids(groups)
        idx = pc.index_in(groups, value_set=self.ids)
        if idx.null_count:
            k = int(null_rows(idx)[0])
            raise InputError(f"{where}: group id {groups[k].as_py()!r} is not in pass 1's table")
        return numpy_of(idx).astype(np.int64)


def group_table(answers: Answers, settings: Settings) -> GroupTable | None:
    """Pass 1's :class:`GroupTable` (None without rewards and group ids)."""
    if answers.reward is None or answers.codes is None or answers.group_ids is None:
        return None
    r, P = answers.reward, len(answers.group_ids)
    stats = group_stats(r, answers.codes, n_groups=P, ddof=settings.ddof)
    ddof = settings.ddof
    batch_std = overall_std(r, ddof=ddof) if settings.scale == "batch" and r.size > ddof else 0.0
    return GroupTable(answers.group_ids, stats, batch_std)


class GroupPartial:
    """Pass 1 as a mergeable partial: per group id, the count, mean and squared deviations
    (merged with Chan et al.'s formula), min and max of the rewards, plus the same over
    every reward (for ``scale="batch"``). Merged in any order over any blocks, its
    :meth:`table` equals :func:`group_table` of the whole input to rounding (1e-15 relative;
    counts, extremes and zero-variance flags exactly). The local engine computes the table
    in two passes over the rewards in memory; a cluster merges these.
    """

    def __init__(self) -> None:
        self.ids: pa.Array | None = None
        self.count = np.zeros(0, dtype=np.int64)
        self.mean = np.zeros(0)
        self.m2 = np.zeros(0)
        self.lo = np.zeros(0)
        self.hi = np.zeros(0)
        self.all = Moments()

    def update(self, groups: pa.Array, rewards: F64) -> GroupPartial:
        """Fold in a block of answers: their group ids and rewards."""
        if len(groups) == 0:
            return self
        enc = groups.dictionary_encode()
        codes = numpy_of(enc.indices).astype(np.int64)
        s = group_stats(rewards, codes, n_groups=len(enc.dictionary), ddof=0)
        other = GroupPartial()
        other.ids = enc.dictionary
        other.count, other.mean, other.lo, other.hi = s.count, s.mean, s.min, s.max
        other.m2 = s.std * s.std * s.count
        other.all.update(rewards)
        return self.merge(other)

    def merge(self, o: GroupPartial) -> GroupPartial:
        if o.ids is None:
            return self
        if self.ids is None:
            self.ids, self.count, self.mean, self.m2 = o.ids, o.count, o.mean, o.m2
            self.lo, self.hi, self.all = o.lo, o.hi, Moments().merge(o.all)
            return self
        ids = pa.concat_arrays([self.ids, o.ids]).unique()
        a = numpy_of(pc.index_in(self.ids, value_set=ids)).astype(np.int64)
        b = numpy_of(pc.index_in(o.ids, value_set=ids)).astype(np.int64)
        P = len(ids)
        na, nb = np.zeros(P, dtype=np.int64), np.zeros(P, dtype=np.int64)
        na[a], nb[b] = self.count, o.count
        ma, mb, qa, qb = np.zeros(P), np.zeros(P), np.zeros(P), np.zeros(P)
        ma[a], mb[b], qa[a], qb[b] = self.mean, o.mean, self.m2, o.m2
        n = na + nb
        d = mb - ma
        self.mean = ma + d * nb / n
        self.m2 = qa + qb + d * d * na * nb / n
        lo, hi = np.full(P, np.inf), np.full(P, -np.inf)
        lo[a], hi[a] = self.lo, self.hi
        lo[b], hi[b] = np.minimum(lo[b], o.lo), np.maximum(hi[b], o.hi)
        self.ids, self.count, self.lo, self.hi = ids, n, lo, hi
        self.all.merge(o.all)
        return self

    def table(self, settings: Settings) -> GroupTable | None:
        if self.ids is None:
            return None
        ddof = settings.ddof
        with np.errstate(divide="ignore", invalid="ignore"):
            std = np.sqrt(self.m2 / (self.count - ddof))
        stats = GroupStats(
            count=self.count,
            total=self.mean * self.count,
            mean=self.mean,
            std=std,
            min=self.lo,
            max=self.hi,
        )
        n = self.all.n
        batch_std = 0.0
        if settings.scale == "batch" and n > ddof:
            batch_std = math.sqrt(self.all.m2 / (n - ddof))
        return GroupTable(self.ids, stats, batch_std)
