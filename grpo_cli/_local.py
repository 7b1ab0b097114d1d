"""The local engine: fold batches into mergeable partials on this machine's threads.

Generic over what is folded: any partial with ``merge``, any batch with ``start`` (the
dataset row of its first answer) and ``n``. ``objective`` and ``kl`` fold validated
:class:`~grpo_cli._io.Batch` es into token partials; ``check`` folds raw batches into an
integrity scan plus a token partial, over the same streams cut at the same rows, so the
two commands add the same numbers in the same order.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from ._io import BatchError, Prefetch
from .errors import InputError

__all__ = ["Chunk", "Mergeable", "fold_batches", "fold_streams"]

Progress = Callable[[int], None]


class Chunk(Protocol):
    """A run of consecutive answers: what a stream yields."""

    @property
    def start(self) -> int: ...

    @property
    def n(self) -> int: ...


class Mergeable(Protocol):
    def merge(self: M, other: M, /) -> M: ...


M = TypeVar("M", bound=Mergeable)
C = TypeVar("C", bound=Chunk)


def fold_batches(
    batches: Iterator[C],
    new: Callable[[], M],
    fold: Callable[[M, C], None],
    *,
    workers: int,
    progress: Progress | None = None,
) -> M:
    """Fold a stream of batches into one partial, on ``workers`` threads.

    numpy releases the GIL inside its loops, so threads run the arithmetic on separate
    cores while the reader thread decodes the next batches. Batch ``i`` always goes to
    worker ``i mod workers`` and the workers' partials are merged in worker order, so the
    result is bit-for-bit the same from run to run (it depends on ``workers``, not on
    timing). Memory stays bounded: each worker's queue holds at most two batches.
    """
    w = workers
    parts = [new() for _ in range(w)]
    if w == 1:
        for b in batches:
            fold(parts[0], b)
            if progress:
                progress(b.n)
        return parts[0]
    queues: list[queue.Queue[C | None]] = [queue.Queue(maxsize=2) for _ in range(w)]
    errors: list[BaseException] = []

    def run(k: int) -> None:
        while (b := queues[k].get()) is not None:
            if errors:
                continue  # drain after a failure elsewhere
            try:
                fold(parts[k], b)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(w)]
    for t in threads:
        t.start()
    try:
        for i, b in enumerate(batches):
            if errors:
                break
            queues[i % w].put(b)
            if progress:
                progress(b.n)
    finally:
        for q in queues:
            q.put(None)
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    total = parts[0]
    for p in parts[1:]:
        total = total.merge(p)
    return total


def fold_streams(
    streams: list[Prefetch[C]],
    new: Callable[[], M],
    fold: Callable[[M, C], None],
    *,
    progress: Progress | None = None,
) -> M:
    """Fold each stream (from :func:`grpo_cli._io.iter_batch_streams`) on its own thread
    into its own partial, then merge them in stream order: bit-for-bit the same result
    from run to run.

    On bad data the error reported is the first in row order, as if read in one stream:
    a stream that meets a problem at row ``r`` lets the others run up to row ``r``.
    """
    parts = [new() for _ in streams]
    failures: list[tuple[int, BaseException]] = []  # (row where it happened, error)
    lock = threading.Lock()

    def first_failure() -> float:
        with lock:
            return min((row for row, _ in failures), default=math.inf)

    def run(k: int) -> None:
        stream = streams[k]
        try:
            for b in stream:
                if b.start >= first_failure():
                    break
                try:
                    fold(parts[k], b)
                except InputError as exc:
                    with lock:
                        failures.append((b.start, exc))
                    break
                if progress:
                    with lock:
                        progress(b.n)
        except BatchError as exc:
            with lock:
                failures.append((exc.start, exc.error))
        except BaseException as exc:  # a bug, not bad data: report it first
            with lock:
                failures.append((-1, exc))
        finally:
            stream.close()  # stops its reader thread

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise min(failures, key=lambda f: f[0])[1]
    total = parts[0]
    for p in parts[1:]:
        total = total.merge(p)
    return total


def fold_source(
    streams: list[Prefetch[C]] | None,
    single: Callable[[], Iterator[C]],
    new: Callable[[], M],
    fold: Callable[[M, C], None],
    *,
    workers: int,
    progress: Progress | None,
) -> M:
    """Pass 2: the parallel row-group ``streams`` when the data has enough row groups
    (None: it has not), else ``single()``, one reader feeding ``workers`` threads."""
    if streams is not None:
        return fold_streams(streams, new, fold, progress=progress)
    return fold_batches(single(), new, fold, workers=workers, progress=progress)
