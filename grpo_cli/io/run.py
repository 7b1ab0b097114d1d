"""Recorded runs: what :mod:`grpo_cli.integrations` writes, read back.

::

    runs/exp1/meta.json           the trainer, its version, its own config keys
    runs/exp1/metrics.jsonl       what the trainer logged, one line per logged step
    runs/exp1/step_000004/        one parquet file per loss call and rank, then _DONE

A step directory given as input is read as one dataset of its files (every micro-batch of
the step), with the run's ``meta.json`` at hand for the settings
(:func:`grpo_cli.trainers.base.Trainer.settings_from_config`) and its ``metrics.jsonl``
for ``--logged``.

A trainer's own output directory that holds the same things in its own layout (prime-rl's
``token_exports/step_N/`` with its ``STABLE`` marker, its ``configs/trainer.json`` and
``metrics.jsonl``) is a :class:`Layout`: its reader module registers one with
:func:`register_layout` (in :mod:`grpo_cli.io.readers`), and :func:`find_run` and
:func:`recorded_step` ask each after grpo-cli's own ``meta.json``.
"""

from __future__ import annotations

import copy
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ..errors import InputError
from .arrow import why
from .bounded import MAX_DOCUMENT, BeyondFloat, loads, mib, read_document

__all__ = [
    "FORMAT",
    "Layout",
    "RecordedRun",
    "RecordedStep",
    "file_info",
    "find_run",
    "infos_cached",
    "recorded_step",
    "register_layout",
    "step_of_dir",
]

FORMAT = "grpo-cli-run"  # meta.json's "format" (grpo_cli.integrations._writer)
DONE = "_DONE"
# step and file numbers of at most 18 digits (an int64; a longer one is no step of a run)
_STEP_DIR = re.compile(r"step_(\d{1,18})$")
_CALL_FILE = re.compile(r"rank(\d{1,9})-mb(\d{1,9})\.parquet$")
MAX_WORLD_SIZE = 1 << 20
"""The largest world size a recorded run may name (its ranks' markers are looked up)."""


@dataclass(frozen=True)
class RecordedRun:
    """A run directory with its ``meta.json`` (read once)."""

    root: Path
    meta: dict[str, Any] = field(compare=False, repr=False)

    @property
    def trainer(self) -> str | None:
        t = self.meta.get("trainer")
        return t if isinstance(t, str) else None

    @property
    def trainer_version(self) -> str | None:
        v = self.meta.get("trainer_version")
        return str(v) if v is not None else None

    @property
    def config(self) -> dict[str, Any]:
        c = self.meta.get("config")
        return c if isinstance(c, dict) else {}

    @property
    def world_size(self) -> int:
        w = self.meta.get("world_size", 1)
        return w if isinstance(w, int) and w >= 1 else 1

    @property
    def config_file(self) -> str:
        """The file the run's config comes from, as the settings name it."""
        return "meta.json"

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    def latest(self) -> RecordedStep | None:
        """The step a command given the run's own directory reads (None: it is refused as
        many steps; a layout may read its last complete one)."""
        return None

    def steps(self) -> list[RecordedStep]:
        """Every step directory of the run, in step order (complete or not)."""
        out = []
        for d in self.root.iterdir():
            step = step_of_dir(d)
            if step is not None and d.is_dir():
                out.append(_step(self, d, step))
        return sorted(out, key=lambda s: s.step)


@dataclass(frozen=True)
class RecordedStep:
    """One recorded optimizer step: its loss calls' files (``rank{r}-mb{k}.parquet``, by
    rank then call), and whether every rank finished writing it (``done``)."""

    run: RecordedRun
    step: int
    directory: Path
    files: tuple[Path, ...]
    done: bool
    # the file whose presence says every rank finished writing the step
    marker: ClassVar[str] = DONE

    def calls(self) -> dict[int, list[int]]:
        """The loss calls of the step: call index (micro-batch) → the indices in ``files``
        of its ranks' files (TRL reduces a call's metrics over ranks)."""
        out: dict[int, list[int]] = {}
        for i, p in enumerate(self.files):
            m = _CALL_FILE.search(p.name)
            k = int(m.group(2)) if m else i
            out.setdefault(k, []).append(i)
        return dict(sorted(out.items()))

    def require_done(self) -> None:
        """A step whose writing did not finish is refused, naming it."""
        if not self.done:
            raise InputError(
                f"{self.directory}: no {DONE} marker: the step was not completely written "
                "(the run stopped while recording it, or a rank has not finished); trend "
                "skips such steps"
            )

    def require_readable(self) -> None:
        """The step is complete and each of its files has a whole footer and metadata the
        recorder writes (checked before anything is folded); else one line naming the
        step or the file. ``trend`` skips such a step with a warning instead."""
        self.require_done()
        if not self.files:
            raise InputError(
                f"{self.directory}: a recorded step without a micro-batch file (rank*-mb*.parquet)"
            )
        for p in self.files:
            file_info(p)

    def problem(self) -> str | None:
        """Why the step cannot be read (:meth:`require_readable`), or None."""
        try:
            self.require_readable()
        except InputError as exc:
            return str(exc)
        return None


def step_of_dir(d: Path) -> int | None:
    m = _STEP_DIR.search(d.name)
    return int(m.group(1)) if m else None


def _read_meta(path: Path) -> dict[str, Any] | None:
    """A recorded run's ``meta.json``, its fields checked (the config's keys are checked by
    the trainer's module); None for someone else's ``meta.json``."""
    meta = loads(read_document(path, "meta.json"), str(path))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None  # someone else's meta.json: not a recorded run
    version = meta.get("format_version")
    if version != 1:
        raise InputError(
            f"{path}: a recorded run of format version {version!r}; this grpo-cli reads "
            "version 1 (upgrade grpo-cli)"
        )
    bad = _bad_meta(meta)
    if bad:
        raise InputError(f"{path}: {bad}")
    return meta


def _bad_meta(meta: dict[str, Any]) -> str | None:
    """What is wrong with a recorded run's own fields (None: nothing)."""
    t = meta.get("trainer")
    if not isinstance(t, str) or not t.strip():
        return f"'trainer' is {t!r}: expected the trainer's name as a string (trl, verl, openrlhf)"
    v = meta.get("trainer_version")
    if v is not None and not isinstance(v, str):
        return f"'trainer_version' is {v!r}: expected a release as a string (\"1.16.0\") or null"
    w = meta.get("world_size", 1)
    if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WORLD_SIZE:
        return f"'world_size' is {w!r}: expected an integer from 1 to {MAX_WORLD_SIZE}"
    c = meta.get("config", {})
    if not isinstance(c, dict):
        return f"'config' is a {type(c).__name__}: expected an object of the trainer's keys"
    return None


class Layout(Protocol):
    """A trainer's own output directory read as a recorded run: its run and step
    directories (None: ``d`` is not one of its)."""

    def find_run(self, d: Path) -> RecordedRun | None: ...
    def recorded_step(self, d: Path) -> RecordedStep | None: ...


_LAYOUTS: list[Layout] = []


def register_layout(layout: Layout) -> None:
    """Add a trainer's output layout (once: the readers' registry calls it at import)."""
    if layout not in _LAYOUTS:
        _LAYOUTS.append(layout)


def find_run(d: Path) -> RecordedRun | None:
    """The recorded run rooted at directory ``d`` (its ``meta.json``, else a registered
    trainer layout's), or None. A ``meta.json`` that is not a regular file (a FIFO, a
    device) is refused."""
    meta_path = d / "meta.json"
    if not meta_path.exists():
        return next((r for lay in _LAYOUTS if (r := lay.find_run(d)) is not None), None)
    meta = _read_meta(meta_path)
    return None if meta is None else RecordedRun(d, meta)


# The recorder's metadata of each micro-batch file (its ``grpo_cli`` key): key -> (the
# kind of value, the least value allowed, the largest).
INFO_KEYS: dict[str, tuple[str, float, float]] = {
    "step": ("int", 0, 2**63 - 1),
    "rank": ("int", 0, MAX_WORLD_SIZE - 1),
    "micro_batch": ("int", 0, 2**31 - 1),
    "world_size": ("int", 1, MAX_WORLD_SIZE),
    "micro_batches": ("int", 1, 2**31 - 1),
    "generation": ("int", 0, 2**63 - 1),
    "iteration": ("int", 0, 2**31 - 1),
    "generated_at_step": ("int", -1, 2**63 - 1),
    "num_items_in_batch": ("number", 0, math.inf),
}


# file_info of files already read, by (path, inode, size, mtime), while a command over a
# whole run holds :func:`infos_cached`: each step's generation metrics read the footers of
# every step of the run, O(steps²) reads over the run without it
_INFO_CACHE: OrderedDict[tuple[str, int, int, int], dict[str, Any]] = OrderedDict()
_INFO_LOCK = threading.Lock()
_INFO_USERS = [0]  # the infos_cached blocks open
INFO_CACHED = 65_536  # files' metadata kept at most (a few hundred bytes each)


@contextmanager
def infos_cached() -> Iterator[None]:
    """Within the block, a local file's :func:`file_info` is read once while the file is
    unchanged (the same inode, size and modification time); forgotten when the outermost
    block ends."""
    with _INFO_LOCK:
        _INFO_USERS[0] += 1
    try:
        yield
    finally:
        with _INFO_LOCK:
            _INFO_USERS[0] -= 1
            if not _INFO_USERS[0]:
                _INFO_CACHE.clear()


def _info_key(path: Any) -> tuple[str, int, int, int] | None:
    if not _INFO_USERS[0] or not isinstance(path, Path):
        return None
    try:
        st = path.stat()
    except OSError:
        return None  # read, which says what is wrong
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


def file_info(path: Any) -> dict[str, Any]:
    """A recorded file's ``grpo_cli`` metadata (its step, rank, call, normalisers), read
    from its footer: a file whose footer cannot be read (cut mid-write) or whose metadata
    is not the recorder's (a key of :data:`INFO_KEYS` of another type or range) is one
    line naming the file and the key. Inside :func:`infos_cached`, read once (a copy is
    returned)."""
    key = _info_key(path)
    if key is not None:
        with _INFO_LOCK:
            got = _INFO_CACHE.get(key)
            if got is not None:
                _INFO_CACHE.move_to_end(key)
                return copy.deepcopy(got)
    info = _read_info(path)
    if key is not None:
        with _INFO_LOCK:
            _INFO_CACHE[key] = copy.deepcopy(info)
            while len(_INFO_CACHE) > INFO_CACHED:
                _INFO_CACHE.popitem(last=False)
    return info


def _read_info(path: Any) -> dict[str, Any]:
    """:func:`file_info` of ``path``, read from its footer."""
    import pyarrow.parquet as pq

    try:
        md = pq.read_schema(path).metadata or {}
    except Exception as exc:
        raise InputError(
            f"{path}: cannot read the file's parquet footer ({why(exc)}): the file was cut "
            "or damaged after it was written"
        ) from None
    raw = md.get(b"grpo_cli")
    if not raw:
        return {}
    if len(raw) > MAX_DOCUMENT:
        raise InputError(f"{path}: its grpo_cli metadata is longer than {mib(MAX_DOCUMENT)}")
    info = loads(raw, f"{path}: its grpo_cli metadata")
    if not isinstance(info, dict):
        raise InputError(f"{path}: its grpo_cli metadata is not a JSON object")
    for key, (kind, low, high) in INFO_KEYS.items():
        if key not in info:
            continue
        v = info[key]
        ok = not isinstance(v, bool | BeyondFloat) and (
            isinstance(v, int) if kind == "int" else isinstance(v, int | float)
        )
        if not ok or not (low <= v <= high):
            what = "an integer" if kind == "int" else "a number"
            top = "" if math.isinf(high) else f" to {high:g}"
            raise InputError(
                f"{path}: its grpo_cli metadata has {key!r} = {v!r}: expected {what} from "
                f"{low:g}{top} (the recorder writes it)"
            )
    return info


def _step(run: RecordedRun, d: Path, step: int) -> RecordedStep:
    files = sorted(
        (p for p in d.iterdir() if p.is_file() and _CALL_FILE.search(p.name)),
        key=lambda p: tuple(int(x) for x in _CALL_FILE.search(p.name).groups()),  # type: ignore[union-attr]
    )
    markers = {p.name for p in d.iterdir() if p.name.startswith(DONE)}
    ws = run.world_size
    done = DONE in markers if ws <= 1 else all(f"{DONE}.rank{r:03d}" in markers for r in range(ws))
    return RecordedStep(run, step, d, tuple(files), done)


def recorded_step(d: Path) -> RecordedStep | None:
    """The recorded step directory ``d`` (``step_N`` inside a run with ``meta.json``), or
    None when ``d`` is not one."""
    step = step_of_dir(d)
    if step is None or not d.is_dir():
        return None
    run = find_run(d.parent)
    if run is None:
        return next((s for lay in _LAYOUTS if (s := lay.recorded_step(d)) is not None), None)
    return _step(run, d, step)
