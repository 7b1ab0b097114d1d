"""One plan and one dispatch for every pass over the token columns.

:func:`plan` cuts the input into what the engine folds, from the reader's units (one walk
of the metadata): on the local engine, the row-group *streams* read in parallel (unit
``j`` goes to stream ``j mod workers``), or one stream of the whole input; on Ray, the
*blocks* (runs of consecutive units of one file of about :data:`BLOCK_BATCHES` batches'
tokens), one task each. :func:`run` folds a plan into one partial with a command's ``new``
and ``fold`` (DuckDB's physical plan: the partials are the sinks, ``merge`` the combine):
pass 1's reward-KL pre-pass, the objective, ``check``'s scan, ``answers``, every step of
``trend``. Batches are validated in the stream's thread (or the Ray task) unless the
fold takes them raw (``check`` counts their problems instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any, TypeVar

from .batch import Batch, BatchError, RawBatch, drop_empty, validate
from .engine.local import Mergeable, Prefetch, fold_batches, fold_streams, prefetch
from .engine.options import EngineOptions, Ran
from .errors import InputError
from .io.readers import Unit
from .io.source import Source

__all__ = ["BLOCK_BATCHES", "Block", "Pipeline", "Plan", "batches", "plan", "run"]

M = TypeVar("M", bound=Mergeable)
Progress = Callable[[int], None]

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


class Pipeline:
    """A plan being read: the local engine's streams start decoding when it is made (so
    that they overlap with pass 1), and :meth:`run` folds them; :meth:`close` stops them
    when the fold never runs."""

    def __init__(self, p: Plan, *, validated: bool = True) -> None:
        self.plan, self.validated = p, validated
        e = p.engine
        self._streams: list[Prefetch[Any]] | None = None
        if e.name != "ray" and p.streams is not None:
            self._streams = [
                Prefetch(batches(p.source, s, p.fields, e.batch_tokens, validated=validated))
                for s in p.streams
            ]

    def run(
        self, new: Callable[[], M], fold: Callable[[M, Any], None], progress: Progress | None = None
    ) -> tuple[M, Ran]:
        """Fold every batch into one partial; what the engine did."""
        p, e = self.plan, self.plan.engine
        if e.name == "ray":
            from .engine.ray import fold_blocks

            return fold_blocks(p, new, fold, validated=self.validated, progress=progress)
        if self._streams is not None:
            streams, self._streams = self._streams, None
            return fold_streams(streams, new, fold, progress=progress), Ran()
        items = batches(p.source, None, p.fields, e.batch_tokens, validated=self.validated)
        with closing(prefetch(items, threaded=e.prefetch)) as stream:
            total = fold_batches(
                _unwrapped(stream), new, fold, workers=e.workers, progress=progress
            )
        return total, Ran()

    def close(self) -> None:
        for s in self._streams or []:
            s.close()
        self._streams = None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run(
    p: Plan,
    new: Callable[[], M],
    fold: Callable[[M, Any], None],
    *,
    validated: bool = True,
    progress: Progress | None = None,
) -> tuple[M, Ran]:
    """Fold the plan's batches (validated :class:`Batch` es, or :class:`RawBatch` es) into
    one partial on its engine; what the engine did."""
    with Pipeline(p, validated=validated) as pipe:
        return pipe.run(new, fold, progress)


def iter_batches(
    source: Source, fields: Sequence[str], *, batch_tokens: int = 1 << 20, threaded: bool = True
) -> Iterator[Batch]:
    """The validated batches of ``fields`` of the whole input, in order (for a library
    caller's own loop; commands fold a :class:`Plan`)."""
    items = batches(source, None, fields, batch_tokens)
    with closing(prefetch(items, threaded=threaded)) as stream:
        yield from _unwrapped(stream)


def iter_raw(
    source: Source, fields: Sequence[str], *, batch_tokens: int = 1 << 20
) -> Iterator[RawBatch]:
    """The raw batches of ``fields`` of the whole input, in order (values unchecked)."""
    yield from _unwrapped(batches(source, None, fields, batch_tokens, validated=False))
