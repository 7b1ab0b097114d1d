"""The Ray engine: the same per-batch fold as the local engine, run by Ray tasks.

The plan (:mod:`grpo_cli.engine.run`) cuts the input into *blocks*: runs of consecutive units
(row groups) of one file, of about ``BLOCK_BATCHES`` batches' worth of tokens (an npz is
one block). One Ray task per block streams its units in batches of ``batch_tokens``
(memory bounded by a batch, as locally) and folds them with the very ``fold`` the local
engine uses into the very partial (``TokenPartial``, the check's scan, ``TopAnswers``).
What a fold needs from pass 1 (the group table, the settings) travels inside ``fold``:
put in the object store once, read by every task. Pass 1 itself reads each file's answer
columns in a task (:class:`RayColumns`) and computes the group table on the driver from
them, exactly as the local engine does (its reward and advantage distributions have
exact quantiles).

Partials are merged in the workers, eight at a time in block order (a tree whose shape
depends only on the number of blocks), and the last few on the driver, in block order:
blocks are ordered by (file, row group), so the JSON is the same from run to run. It
differs from the local engine's only in the order floats are added (counts, extremes and
histograms are exact).

Why Ray tasks over row groups rather than ``ray.data.read_parquet``: a Ray Data block
does not say which file and rows it came from, which errors must name and the merge order
is defined by; the tasks read through the same pyarrow readers as the local engine.

A run connects to ``address`` (``--ray-address`` / ``RAY_ADDRESS``), or starts a private
local Ray for the run and shuts it down after, never joining one left running. Ray 2.60
turns token authentication on for a new local Ray and writes a token into
``~/.ray/auth_token``; the private Ray here is started with token authentication and a
token of its own, passed in the environment of its processes, so nothing is written to
the user's home. A cluster's token comes from Ray's own places (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``); a refused connection is a one-line error.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import secrets
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa

from ..batch import BatchError
from ..errors import InputError, UsageError
from ..io.readers.base import Source as SourceView
from .options import EngineOptions, Ran

if TYPE_CHECKING:
    from ..io.source import Source
    from .plan import Block, Plan

__all__ = [
    "RayColumns",
    "RaySession",
    "close",
    "connect",
    "fold_blocks",
    "map_calls",
    "reload_auth_config",
]

M = TypeVar("M")
T = TypeVar("T")
Progress = Callable[[int], None]

FANOUT = 8  # partials merged by one merge task


class _Interrupts:
    """Ctrl-C while Ray works: noted, and raised as KeyboardInterrupt where the driver can
    stop cleanly (after ``ray.init`` returns, between waits), not inside Ray's C++ code,
    where an interrupt can crash the process. Outside the main thread: nothing changes."""

    def __init__(self) -> None:
        self.hit = False
        self.old: Any = None

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.hit = True

    def check(self) -> None:
        if self.hit:
            self.hit = False
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
        self.check()


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--engine ray needs Ray: pip install 'grpo-cli[ray]' (Ray Data, Ray >= 2.9)"
        ) from None
    return ray


def connect(engine: EngineOptions) -> tuple[Any, Ran]:
    """Ray, initialised for this run (:meth:`RaySession.open` of the process's session):
    the process's Ray when it has one (a library caller that ran ``ray.init``), else
    ``engine.address``, else a private local Ray; and the cluster's CPUs as a
    :class:`Ran`'s ``workers`` (no block yet)."""
    ray = RaySession.current().open(engine)
    return ray, Ran(blocks=0, workers=int(ray.cluster_resources().get("CPU", 0)))


class RaySession:
    """The Ray one grpo-cli run uses, and what it changed to get it: whether this run
    started or joined it (``owned``: :meth:`close` shuts it down; a Ray a library caller
    began is left running), and the environment it set for a private Ray's token
    authentication (``saved_env``: given back on close, after Ray's threads no longer
    need it). A process has one at a time (:meth:`current`); the CLI closes it at the end
    of a command, a library caller with ``with RaySession.current():`` or :func:`close`.
    """

    _current: RaySession | None = None

    def __init__(self) -> None:
        self.owned = False
        self.saved_env: dict[str, str | None] | None = None

    @classmethod
    def current(cls) -> RaySession:
        """The process's session (made on first use)."""
        if cls._current is None:
            cls._current = cls()
        return cls._current

    def __enter__(self) -> RaySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, engine: EngineOptions) -> Any:
        """Ray, initialised (see :func:`connect`)."""
        if "ray" not in sys.modules and not engine.address:
            self._private_env()  # before Ray is imported: it reads its config then
        ray = _ray()
        if ray.is_initialized():
            return ray
        quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
        if engine.address:
            _join(ray, engine.address, quiet)
            self.owned = True
            return ray
        if self.saved_env is None:
            self._private_env()
            reload_auth_config()  # Ray was imported already: have it read the environment again
        self.owned = True  # shut down by close() even if interrupted while starting
        try:
            with _Interrupts():
                ray.init(address="local", include_dashboard=False, **quiet)
        except Exception as exc:
            self._restore_env()
            raise UsageError(f"--engine ray: cannot start a local Ray ({_one_line(exc)})") from None
        return ray

    def _private_env(self) -> None:
        """Token authentication with a token of this run's own, in the environment the Ray
        processes inherit (Ray would otherwise write one to ~/.ray/auth_token)."""
        self.saved_env = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)

    def _restore_env(self) -> None:
        saved, self.saved_env = self.saved_env, None
        if saved is None:
            return
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if "ray" in sys.modules:
            reload_auth_config()

    def close(self) -> None:
        """Shut down the Ray this session started or joined (not one a library caller
        began), then give the environment back (after: Ray's threads need the token until
        then)."""
        owned, self.owned = self.owned, False
        if owned:
            import ray

            with _Interrupts():  # a second Ctrl-C must not cut the shutdown short
                ray.shutdown()
        self._restore_env()
        if RaySession._current is self:
            RaySession._current = None


def _join(ray: Any, address: str, quiet: dict[str, Any]) -> None:
    """``ray.init`` on a running cluster at ``address``: a refusal is one line (token
    authentication's named)."""
    _listening(address)
    log = tempfile.TemporaryFile(mode="w+b")
    try:
        with _Interrupts(), _stderr_to(log):  # Ray's C++ retries log a line a second
            ray.init(address=address, **quiet)
    except Exception as exc:
        log.seek(0)
        if b"InvalidAuthToken" in log.read():
            why = (
                "the cluster uses token authentication and refused this driver's token: "
                "give its token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, with "
                "RAY_AUTH_MODE=token (`ray get-auth-token` on the head prints it)"
            )
        else:
            why = _one_line(exc)
        raise UsageError(f"--ray-address {address}: cannot connect: {why}") from None
    finally:
        log.close()


def _listening(address: str) -> None:
    """A HOST:PORT address where nothing listens is an error at once (Ray would retry it
    for minutes); other forms (``auto``, ``ray://``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise UsageError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); "
            "is the cluster's head running (`ray status`)?"
        ) from None


@contextlib.contextmanager
def _stderr_to(f: Any) -> Iterator[None]:
    """File descriptor 2 (where Ray's C++ code logs) into ``f`` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(f.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def reload_auth_config() -> None:
    """Have an imported Ray read ``RAY_AUTH_MODE`` and its token from the environment again
    (it reads them once, at import)."""
    try:  # what Ray's own ray.init does when it turns token authentication on (2.60)
        import ray._raylet as raylet

        getattr(raylet, "Config").initialize("")  # noqa: B009 (not in Ray's stubs)
        getattr(raylet, "AuthenticationTokenLoader").instance().reset_cache()  # noqa: B009
    except (ImportError, AttributeError):  # another Ray: it reads the environment itself
        pass


def close() -> None:
    """Close the process's Ray session (:meth:`RaySession.close`), if one was opened."""
    if RaySession._current is not None:
        RaySession._current.close()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def _fold_block(
    p: Plan,
    block: Block,
    validated: bool,
    task: tuple[Callable[[], Any], Callable[[Any, Any], None]],
) -> tuple[tuple[int, InputError] | None, Any]:
    """One task: fold the block's batches into a new partial. Bad data is returned, not
    raised, as (dataset row where it starts, error), so the driver reports the first in
    row order."""
    from .plan import batches

    new, fold = task
    part = new()
    row = block.start
    try:
        items = batches(p.source, block.units, p.fields, p.engine.batch_tokens, validated=validated)
        for b in items:
            row = b.start
            fold(part, b)
    except BatchError as exc:
        return (exc.start, exc.error), None
    except InputError as exc:
        return (row, exc), None
    return None, part


def _where(src: Source, b: Block) -> str:
    """A block as errors name it: its file and its rows within the file."""
    if b.rows < 0:
        return src.label
    first = b.start - src.first_row(b.file)
    return f"{src.paths[b.file]} (rows {first}-{first + b.rows - 1})"


def _merge(*parts: Any) -> Any:
    """The partials merged in the order given. They come from Ray's object store, whose
    arrays are read-only: merged into writable copies."""
    total = copy.deepcopy(parts[0])
    for p in parts[1:]:
        total = total.merge(copy.deepcopy(p))
    return total


def fold_blocks(
    p: Plan,
    new: Callable[[], M],
    fold: Callable[[M, Any], None],
    *,
    validated: bool = True,
    progress: Progress | None = None,
) -> tuple[M, Ran]:
    """Fold the plan's blocks on Ray: one task per block, partials merged in block order;
    bad data is the local engine's error for the first bad row. ``validated``: fold
    validated batches, else raw ones (``check``)."""
    ray, ran = connect(p.engine)
    blocks = list(p.blocks)
    fold_task = ray.remote(num_returns=2, max_retries=0)(_fold_block)
    task_ref = ray.put((new, fold))
    plan_ref = ray.put(p)
    status, parts = [], []
    for b in blocks:
        s, part = fold_task.remote(plan_ref, b, validated, task_ref)
        status.append(s)
        parts.append(part)
    try:
        with _Interrupts() as interrupts:
            total = _collect(ray, p.source, blocks, status, parts, progress, interrupts)
    except KeyboardInterrupt:
        ray_cancel(ray, status)
        raise
    return cast(M, total), Ran(blocks=len(blocks), workers=ran.workers)


def _collect(
    ray: Any,
    src: Source,
    blocks: list[Block],
    status: list[Any],
    parts: list[Any],
    progress: Progress | None,
    interrupts: _Interrupts,
) -> Any:
    """Wait for the blocks (progress as each ends); then merge their partials in block
    order, :data:`FANOUT` at a time in the workers and the last few here."""
    index = {ref: k for k, ref in enumerate(status)}
    failures: list[tuple[int, InputError]] = []
    pending = list(status)
    while pending:
        interrupts.check()
        done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
        for ref in done:
            k = index[ref]
            got = _get(ray, ref, _where(src, blocks[k]))
            if got is not None:
                failures.append(got)
                # blocks after the bad row need not be waited for (they are left to
                # finish: cancelling a task as it completes can abort Ray 2.60's driver)
                pending = [r for r in pending if blocks[index[r]].start <= got[0]]
            elif progress is not None and blocks[k].rows > 0:
                progress(blocks[k].rows)
    if failures:
        raise min(failures, key=lambda f: f[0])[1]
    merge_task = ray.remote(max_retries=0)(_merge)
    level = parts
    while len(level) > FANOUT:
        level = [merge_task.remote(*level[i : i + FANOUT]) for i in range(0, len(level), FANOUT)]
    return _merge(*[_get(ray, r, src) for r in level])


def _call(fn: Callable[[], Any]) -> tuple[InputError | None, Any]:
    try:
        return None, fn()
    except InputError as exc:
        return exc, None


def map_calls(
    engine: EngineOptions, calls: Sequence[Callable[[], T]], labels: Sequence[str]
) -> tuple[list[T], Ran]:
    """Run each call as a Ray task, all at once (``trend``: one task a step file); their
    results in the order given, and the tasks run as the :class:`Ran`'s blocks. Bad data
    in a call is its error, the first in that order; ``labels`` name the calls in the
    error of a failed task."""
    ray, ran = connect(engine)
    task = ray.remote(max_retries=0)(_call)
    refs = [task.remote(c) for c in calls]
    out: list[T] = []
    try:
        with _Interrupts() as interrupts:
            for ref, label in zip(refs, labels, strict=True):
                while not ray.wait([ref], timeout=0.2)[0]:
                    interrupts.check()
                err, value = _get(ray, ref, label)
                if err is not None:
                    raise err
                out.append(value)
        return out, Ran(blocks=len(calls), workers=ran.workers)
    except KeyboardInterrupt:
        ray_cancel(ray, refs)
        raise


class RayColumns:
    """Pass 1's reading on Ray (a ``read`` for :func:`grpo_cli.io.load_answers`): the
    answer columns of every file, a task a file, in file order (a few bytes an answer;
    the group statistics are then computed from them on the driver exactly as locally).
    The first unreadable file is the error; :attr:`ran` is what the tasks did."""

    def __init__(self, engine: EngineOptions) -> None:
        self.engine = engine
        # an npz is read here, never by these tasks: the run still records Ray's CPUs
        self.ran = connect(engine)[1]

    def __call__(self, src: SourceView, cols: list[str]) -> list[pa.Table]:
        read = src.reader.read_file_columns
        calls = [partial(read, src, i, cols) for i in range(len(src.paths))]
        tables, self.ran = map_calls(self.engine, calls, [str(p) for p in src.paths])
        return tables


def ray_cancel(ray: Any, refs: list[Any]) -> None:
    for r in refs:
        try:
            ray.cancel(r)
        except Exception:  # finished already, or not cancellable: nothing to stop
            pass


def _get(ray: Any, ref: Any, src: SourceView | str) -> Any:
    """The task's value; its failure as one line naming the input."""
    label = src if isinstance(src, str) else src.label
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, InputError):
            raise cause from None
        raise InputError(f"{label}: a Ray task failed ({_one_line(exc)})") from None
    except ray.exceptions.RayError as exc:
        raise InputError(f"{label}: a Ray worker failed ({_one_line(exc)})") from None
