"""The one dispatch: a plan's blocks folded here (threads) or on Ray, and pass 1's answer
columns read the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from typing import Any

from ..batch import Batch, RawBatch
from ..io import Source
from ..io.readers import ReadColumns
from .local import Prefetch, fold_batches, fold_streams, prefetch
from .options import EngineOptions, Ran
from .plan import M, Plan, _unwrapped, batches

Progress = Callable[[int], None]


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
            from .ray import fold_blocks

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


def columns_reader(engine: EngineOptions | None) -> ReadColumns | None:
    """How pass 1 reads the answer columns: here (None), or in Ray tasks (whose
    :class:`~grpo_cli.engine.options.Ran` the reader keeps)."""
    if engine is None or engine.name != "ray":
        return None
    from .ray import RayColumns

    return RayColumns(engine)


def ran_by(read: ReadColumns | None) -> Ran:
    """What pass 1's reading did (on Ray: its tasks)."""
    return getattr(read, "ran", Ran())
