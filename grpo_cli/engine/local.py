"""The local engine: fold batches into mergeable partials on this machine's threads.

Generic over what is folded: any partial with ``merge``, any batch with ``start`` (the
dataset row of its first answer) and ``n``. ``objective`` and ``kl`` fold validated
:class:`~grpo_cli.batch.Batch` es into token partials; ``check`` folds raw batches into an
integrity scan plus a token partial, over the same streams cut at the same rows, so the
two commands add the same numbers in the same order. The plan (:mod:`grpo_cli.engine.run`)
says which streams there are.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from ..batch import BatchError
from ..errors import InputError

__all__ = ["Chunk", "Mergeable", "Prefetch", "fold_batches", "fold_streams", "prefetch"]

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
    """Fold each stream (the plan's row-group streams) on its own thread
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


T = TypeVar("T")
_DONE = object()


class Prefetch(Iterator[T]):
    """``items`` produced by a background thread, ``depth`` ahead of the consumer; the
    thread starts at once, so decoding begins while the caller still prepares.

    Decoding (pyarrow, GIL released) then overlaps with the computation on the other
    core. Exceptions are re-raised in the consumer. ``close()`` stops the thread; a
    consumer that may stop early must call it.
    """

    def __init__(self, items: Iterable[T], depth: int = 2) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._th = threading.Thread(
            target=self._run, args=(items,), daemon=True, name="grpo-cli-prefetch"
        )
        self._th.start()

    def _run(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if self._stop.is_set():
                    return
                self._q.put(item)
            self._q.put(_DONE)
        except BaseException as exc:
            self._q.put(exc)

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._q.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        out: T = item
        return out

    def close(self) -> None:
        self._done = True
        self._stop.set()
        while self._th.is_alive():  # unblock a producer waiting on a full queue
            try:
                self._q.get_nowait()
            except queue.Empty:
                self._th.join(timeout=0.05)


class _Inline(Iterator[T]):
    """``items`` in the consumer's thread, with the same ``close()``."""

    def __init__(self, items: Iterable[T]) -> None:
        self._it = iter(items)

    def __next__(self) -> T:
        return next(self._it)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def prefetch(
    items: Iterable[T], depth: int = 2, *, threaded: bool = True
) -> Prefetch[T] | _Inline[T]:
    """:class:`Prefetch` of ``items``, or, without ``threaded``, ``items`` in the caller's
    thread (both have ``close()``)."""
    if not threaded:
        return _Inline(items)
    return Prefetch(items, depth)
