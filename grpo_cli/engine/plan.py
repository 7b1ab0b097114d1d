"""The plan of a pass: the input's units (row groups, files, line ranges) grouped into
blocks of about ``batch_tokens`` tokens, and the batches a block reads."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..batch import BatchError, drop_empty, validate
from ..errors import InputError
from ..io.readers import Unit
from ..io.source import Source
from .local import Mergeable
from .options import EngineOptions

M = TypeVar("M", bound=Mergeable)


# A Ray block holds about this many batches' tokens: enough work per task to hide Ray's
# per-task cost (milliseconds), small enough to spread a step over a cluster.
BLOCK_BATCHES = 16


@dataclass(frozen=True)
class Block:
    """Consecutive units of one file; ``start``: the input row of its first answer,
    ``rows``: its answers (-1: not known before reading)."""

    file: int
    units: tuple[Unit, ...]
    start: int
    rows: int


@dataclass(frozen=True)
class Plan:
    """What one pass reads (``fields`` of ``source``) and how ``engine`` cuts it:
    ``streams`` (local: the units of each parallel stream; None: one stream of the whole
    input) or ``blocks`` (Ray)."""

    source: Source
    fields: tuple[str, ...]
    engine: EngineOptions
    streams: tuple[tuple[Unit, ...], ...] | None = None
    blocks: tuple[Block, ...] = ()


def blocks_of(units: Sequence[Unit], block_tokens: int) -> list[Block]:
    """Runs of consecutive units of one file of at most ``block_tokens`` tokens (a larger
    unit alone), in order."""
    out: list[Block] = []
    run: list[Unit] = []
    tokens = 0
    for u in units:
        size = max(u.rows, u.tokens)
        if run and (u.file != run[0].file or tokens + size > block_tokens):
            out.append(_block(run))
            run, tokens = [], 0
        run.append(u)
        tokens += size
    if run:
        out.append(_block(run))
    return out


def _block(units: list[Unit]) -> Block:
    rows = -1 if any(u.rows < 0 for u in units) else sum(u.rows for u in units)
    return Block(units[0].file, tuple(units), units[0].start, rows)


def plan(source: Source, fields: Sequence[str], engine: EngineOptions) -> Plan:
    """The plan of one pass over ``fields`` of ``source`` on ``engine``."""
    units = source.units()
    if engine.name == "ray":
        blocks = blocks_of(units, BLOCK_BATCHES * engine.batch_tokens)
        return Plan(source, tuple(fields), engine, blocks=tuple(blocks))
    w = engine.workers
    if w < 2 or not engine.prefetch or len(units) < w:
        return Plan(source, tuple(fields), engine)
    streams = tuple(tuple(units[k::w]) for k in range(w))
    return Plan(source, tuple(fields), engine, streams=streams)


def batches(
    source: Source,
    units: Sequence[Unit] | None,
    fields: Sequence[str],
    batch_tokens: int,
    *,
    validated: bool = True,
) -> Iterator[Any]:
    """The batches of ``units`` (None: the whole input) in order: raw, or validated (a
    recorded step's answers without a valid token left out: the trainer masks them
    whole); unreadable or invalid data raises :class:`BatchError` at the row where it
    starts."""
    recorded = source.recorded is not None
    for raw in source.raw_batches(units, fields, batch_tokens):
        if not validated:
            yield raw
            continue
        if recorded:  # a trainer's answers masked whole (truncated completions): left out
            raw, _ = drop_empty(raw)
            if not raw.n:
                continue
        try:
            yield validate(raw)
        except InputError as exc:
            raise BatchError(raw.start, exc) from None


def _unwrapped(items: Iterator[Any]) -> Iterator[Any]:
    """A single stream's items, its :class:`BatchError` as the :class:`InputError` it is."""
    try:
        yield from items
    except BatchError as exc:
        raise exc.error from None
