"""The recorded-run layout, written atomically, and the guard that keeps a run alive.

::

    runs/exp1/
      meta.json                trainer, versions, world size, the trainer's own config
      metrics.jsonl            one line per logged step: what the trainer logged
      step_000004/
        rank000-mb000.parquet  one file per loss call (micro-batch) and rank
        _DONE                  last: the step is complete (_DONE.rank003 per rank when
                               the world size is above 1)

Every file is written to a temporary name and renamed, so a reader never sees half a
file. The parquet files hold grpo-cli's schema (README "Input format"): one row per
answer, token fields as lists of the micro-batch's padded width, with the mask.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "DONE",
    "FORMAT",
    "FORMAT_VERSION",
    "META_KEY",
    "Guard",
    "RunWriter",
    "done_name",
    "rollout_table",
    "step_dir_name",
]

FORMAT = "grpo-cli-run"
FORMAT_VERSION = 1
DONE = "_DONE"
META_KEY = b"grpo_cli"  # parquet key-value metadata of a micro-batch file
TOKEN_COLUMNS = ("logp", "old_logp", "ref_logp", "rollout_logp", "entropy")

T = TypeVar("T")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def done_name(rank: int, world_size: int) -> str:
    """The marker a rank writes last: ``_DONE`` alone, ``_DONE.rank003`` among several."""
    return DONE if world_size <= 1 else f"{DONE}.rank{rank:03d}"


def _plain(x: Any) -> Any:
    """A config value as JSON holds it: numbers, strings, booleans, None, lists and dicts
    of those; anything else (an enum, a path, a dtype) as its text; non-finite floats as
    their text too (JSON has no NaN)."""
    if x is None or isinstance(x, bool | int | str):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, np.generic):
        return _plain(x.item())
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    value = getattr(x, "value", None)  # enums
    if isinstance(value, str | int | float | bool):
        return value
    return str(x)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _padded_list(values: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """An ``(N, L)`` array as a list column of N lists of length L (no pandas)."""
    n, width = values.shape
    flat = np.ascontiguousarray(values).reshape(-1)
    if pa.types.is_boolean(dtype):
        child = pa.array(flat.astype(np.bool_), type=pa.bool_())
    elif pa.types.is_integer(dtype):
        child = pa.array(flat.astype(np.int64), type=pa.int64())
    else:
        flat = flat.astype(np.float64 if dtype == pa.float64() else np.float32, copy=False)
        child = pa.Array.from_buffers(dtype, flat.shape[0], [None, pa.py_buffer(flat)])
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width, type=pa.int32())
    return pa.ListArray.from_arrays(offsets, child)


def _width(values: np.ndarray) -> pa.DataType:
    """The float type a token field keeps: float64 for float64, float32 for the rest."""
    return pa.float64() if values.dtype == np.float64 else pa.float32()


def rollout_table(
    *,
    group: list[str],
    reward: np.ndarray | None,
    advantage: np.ndarray | None,
    mask: np.ndarray,
    tokens: Mapping[str, np.ndarray | None],
    completion: list[str] | None = None,
    token_dtype: pa.DataType | None = None,
    token_ids: np.ndarray | None = None,
) -> pa.Table:
    """One micro-batch as grpo-cli's schema: ``group``, ``reward``, ``advantage`` per
    answer (``advantage`` ``(N, L)``: a list column of per-token advantages), every
    present token field of ``tokens`` (``logp``, ``old_logp``, ``ref_logp``,
    ``rollout_logp``, ``entropy``; ``(N, L)``) as lists of ``token_dtype`` (None: the
    array's own width, float64 as float64 and every narrower float, float16 and bfloat16
    included, as float32), ``mask`` ``(N, L)`` as lists of booleans, ``completion`` texts
    when given, ``token_ids`` ``(N, L)`` (the sampled tokens' ids) as lists of int64 in a
    ``token_id`` column when given (left out when its shape is not the mask's: the ids are
    optional, never a reason to fail a recording). Arrays are numpy (the caller moves
    tensors to CPU)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask: expected (N, L), got shape {mask.shape}")
    n = mask.shape[0]
    cols: dict[str, pa.Array] = {"group": pa.array(group, type=pa.string())}
    if len(group) != n:
        raise ValueError(f"group: {len(group)} ids for {n} answers")
    if reward is not None:
        cols["reward"] = pa.array(np.asarray(reward, dtype=np.float64).reshape(n))
    if advantage is not None:
        a = np.asarray(advantage)
        if a.ndim == 2:
            cols["advantage"] = _padded_list(a, token_dtype or _width(a))
        else:
            cols["advantage"] = pa.array(a.astype(np.float64).reshape(n))
    for name in TOKEN_COLUMNS:
        v = tokens.get(name)
        if v is None:
            continue
        v = np.asarray(v)
        if v.shape != mask.shape:
            raise ValueError(f"{name}: shape {v.shape}, but the mask has {mask.shape}")
        cols[name] = _padded_list(v, token_dtype or _width(v))
    cols["mask"] = _padded_list(mask.astype(np.bool_), pa.bool_())
    if token_ids is not None:
        ids = np.asarray(token_ids)
        if ids.shape == mask.shape and np.issubdtype(ids.dtype, np.integer):
            cols["token_id"] = _padded_list(ids.astype(np.int64), pa.int64())
    if completion is not None:
        cols["completion"] = pa.array(list(completion), type=pa.string())
    return pa.table(cols)


class RunWriter:
    """Writes one rank's share of a recorded run under ``directory``.

    ``meta`` (rank 0 writes it, once) carries ``trainer``, ``trainer_version`` and
    ``config`` (the trainer's own config keys); the format, grpo-cli's version, the
    world size and the time are added here.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        trainer: str,
        trainer_version: str | None,
        config: Mapping[str, Any],
        rank: int = 0,
        world_size: int = 1,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.root = Path(directory)
        self.rank, self.world_size = rank, world_size
        self.meta: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "trainer": trainer,
            "trainer_version": trainer_version,
            "grpo_cli_version": _version(),
            "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "world_size": world_size,
            "config": _plain(dict(config)),
            **_plain(dict(extra or {})),
        }
        self._meta_written = False

    def write_meta(self) -> None:
        """``meta.json`` (rank 0 only; again only when it changed)."""
        if self.rank != 0 or self._meta_written:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.meta, indent=2, sort_keys=False) + "\n"
        _atomic_write(self.root / "meta.json", text.encode())
        self._meta_written = True

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def write_micro_batch(
        self, step: int, micro_batch: int, table: pa.Table, info: Mapping[str, Any]
    ) -> Path:
        """One loss call's rollouts as ``step_N/rank{r}-mb{k}.parquet``; ``info`` goes into
        the file's ``grpo_cli`` metadata beside step, rank, micro-batch and world size."""
        self.write_meta()
        d = self.step_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        meta = {
            "step": step,
            "rank": self.rank,
            "micro_batch": micro_batch,
            "world_size": self.world_size,
            **_plain(dict(info)),
        }
        schema_meta = dict(table.schema.metadata or {})
        schema_meta[META_KEY] = json.dumps(meta).encode()
        table = table.replace_schema_metadata(schema_meta)
        path = d / f"rank{self.rank:03d}-mb{micro_batch:03d}.parquet"
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        return path

    def write_call(
        self, step: int, micro_batch: int, micro_batches: int, table: pa.Table,
        info: Mapping[str, Any],
    ) -> Path:  # fmt: skip
        """:meth:`write_micro_batch` of call ``micro_batch`` of ``micro_batches`` (in
        ``info`` as ``micro_batches``), then, after the last, :meth:`finish_step`."""
        path = self.write_micro_batch(
            step, micro_batch, table, {"micro_batches": micro_batches, **info}
        )
        if micro_batch == micro_batches - 1:
            self.finish_step(step)
        return path

    def finish_step(self, step: int) -> None:
        """The step's marker, written after its files: a reader takes the step as whole."""
        d = self.step_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        _atomic_write(d / done_name(self.rank, self.world_size), b"")

    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """One line of ``metrics.jsonl`` (rank 0 only): what the trainer logged."""
        if self.rank != 0:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        line = json.dumps(_plain(dict(record))) + "\n"
        with open(self.root / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(line)  # one write of one line: a reader sees whole lines or none


def _version() -> str:
    from .._version import __version__

    return __version__


class Guard:
    """Runs recording code so that it can never stop training: the first exception is
    one warning (naming grpo-cli, the trainer and the reason) and turns recording off."""

    def __init__(self, trainer: str) -> None:
        self.trainer = trainer
        self.active = True
        self.error: str | None = None

    def run(self, fn: Callable[[], T]) -> T | None:
        if not self.active:
            return None
        try:
            return fn()
        except Exception as exc:  # a recorder bug or a full disk: never the run's problem
            self.active = False
            self.error = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"grpo-cli: recording the {self.trainer} run failed and is turned off "
                f"for the rest of the run; training goes on ({self.error})",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
