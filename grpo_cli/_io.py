"""Reading rollout logs (npz, parquet) into canonical answer fields and ragged token batches.

The forgiving boundary: whatever a file holds (float32, int rewards, int or float 0/1
masks, list columns, a framework's own names) becomes canonical float64 arrays here,
and anything that cannot is an :class:`InputError` naming the file, the array or column
and what is wrong. Padding is dropped at load time, so it never reaches a result.

Two passes, as the design says: :func:`load_answers` reads the answer-level columns
(group, reward, advantage: small), :func:`iter_batches` streams the token columns.
"""

from __future__ import annotations

import dataclasses
import functools
import glob as globlib
import math
import queue
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from ._core import FloatArray
from ._engine import DEFAULT_BATCH_TOKENS
from .errors import InputError, UsageError

__all__ = [
    "ALIASES",
    "Answers",
    "Batch",
    "BatchError",
    "RawBatch",
    "Source",
    "answer_runs",
    "iter_batch_streams",
    "iter_batches",
    "iter_raw",
    "iter_raw_streams",
    "load_answers",
    "open_source",
    "parse_column_map",
    "raw_from_arrow",
    "raw_to_batch",
    "token_ranges",
    "validate_raw",
    "write_advantages",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

ANSWER_FIELDS = ("group", "reward", "advantage")
# per-token values, and with the mask every per-token field (the one list of them)
TOKEN_VALUES = ("logp", "old_logp", "ref_logp", "rollout_logp", "entropy")
TOKEN_FIELDS = (*TOKEN_VALUES, "mask")
FIELDS = ANSWER_FIELDS + TOKEN_FIELDS

# Canonical name first; then the names trainers use for the same thing (DESIGN.md).
ALIASES: dict[str, tuple[str, ...]] = {
    "group": ("group", "groups", "group_id", "prompt_id", "uid"),
    "reward": ("reward", "rewards", "score", "scores"),
    "advantage": ("advantage", "advantages"),
    "logp": ("logp", "log_prob", "log_probs", "per_token_logps"),
    "old_logp": ("old_logp", "old_log_probs", "old_per_token_logps", "action_log_probs"),
    "ref_logp": ("ref_logp", "ref_log_prob", "ref_per_token_logps", "base_action_log_probs"),
    "rollout_logp": (
        "rollout_logp",
        "rollout_log_probs",
        "sampling_per_token_logps",
        "rollout_logprobs",
    ),
    "entropy": ("entropy", "entropys", "entropies", "token_entropy"),
    "mask": ("mask", "response_mask", "completion_mask", "action_mask", "loss_mask"),
}


def parse_column_map(items: Sequence[str] | None) -> dict[str, str]:
    """``["logp=lp", ...]`` from ``--column`` into ``{"logp": "lp"}``, validated."""
    out: dict[str, str] = {}
    for item in items or ():
        field, sep, name = item.partition("=")
        field, name = field.strip(), name.strip()
        if not sep or not field or not name:
            raise UsageError(f"--column {item!r}: expected FIELD=NAME, e.g. logp=log_probs")
        if field not in FIELDS:
            raise UsageError(
                f"--column {item!r}: unknown field {field!r}; fields: {', '.join(FIELDS)}"
            )
        out[field] = name
    return out


# ---------------------------------------------------------------------------- arrow -> numpy
def numpy_of(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of a numeric or boolean Arrow array without nulls, as numpy (a view when
    the layout allows). Not ``Array.to_numpy``: that goes through pyarrow's pandas
    conversion, which imports pandas whenever it is installed (0.3 s a run)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if arr.null_count:
        raise ValueError("numpy_of: the array has nulls")
    if pa.types.is_boolean(t):
        return numpy_of(pc.cast(arr, pa.uint8())).view(np.bool_)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        kind = "f" if pa.types.is_floating(t) else "iu"[pa.types.is_unsigned_integer(t)]
        dtype = np.dtype(f"{kind}{t.bit_width // 8}")
        buf = arr.buffers()[1]
        if buf is None or len(arr) == 0:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    return arr.to_numpy(zero_copy_only=False)


def arrow_of(values: np.ndarray | Sequence[Any]) -> pa.Array:
    """numpy numbers or strings (or a list of ints or strs) as an Arrow array. Numbers and
    strings are built from their buffers: ``pa.array`` imports pandas whenever it is
    installed; anything else (objects, mixed lists) falls back to it."""
    x = np.asarray(values)
    if x.dtype.kind in "iuf" and x.ndim == 1:
        x = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
        t = pa.from_numpy_dtype(x.dtype)
        return pa.Array.from_buffers(t, len(x), [None, pa.py_buffer(x)])
    if x.dtype.kind in "U" and x.ndim == 1:
        data = [v.encode("utf-8") for v in x.tolist()]  # a lone surrogate: UnicodeEncodeError
        ends = np.cumsum([len(d) for d in data], dtype=np.int64)
        offsets = np.concatenate([np.zeros(1, np.int64), ends])
        if offsets[-1] < 2**31:
            t, offsets = pa.string(), offsets.astype(np.int32)
        else:
            t = pa.large_string()
        return pa.Array.from_buffers(
            t, len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
        )
    return pa.array(values)


def null_rows(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The indices of the nulls of ``arr``."""
    return np.flatnonzero(numpy_of(arr.is_null()))


# ----------------------------------------------------------------------------- source
@dataclass(frozen=True)
class Source:
    """Resolved input: files of one format and which column/array holds each field."""

    paths: tuple[InputPath, ...]  # Path, or RemoteFile for a filesystem URI
    kind: str  # "npz" | "parquet"
    columns: dict[str, str | None]
    label: str  # how errors name the input
    present: tuple[str, ...] = ()  # every column/array name the input has
    # "dataset": a group id names one group across files (the shards of one step);
    # "file": ids are scoped to their file (one step per file: ids restart each step)
    group_scope: str = "dataset"
    # parquet: each file's footer, parsed once by open_source and reused by every reader
    footers: tuple[pq.FileMetaData, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def name(self, field: str) -> str:
        """The column/array holding ``field``, or the name it would have by default."""
        col = self.columns.get(field)
        if col is not None:
            return col
        if self.kind == "npz" and field in ("reward", "advantage"):
            return field + "s"  # npz arrays: rewards (P, G) or (N,), advantages (N,)
        return field

    def has(self, field: str) -> bool:
        return self.columns.get(field) is not None

    def n_rows(self) -> int | None:
        """Answers in the dataset from parquet metadata (no data read); None for npz."""
        if self.kind != "parquet":
            return None
        return sum(self.rows_per_file())

    def rows_per_file(self) -> list[int]:
        """Rows of each parquet file, from its footer."""
        return [int(md.num_rows) for md in self.footers]

    def file_of(self, row: int) -> tuple[int, int]:
        """The file holding input row ``row`` (its index in ``paths``) and the input row of
        that file's first row (an npz is one file)."""
        if len(self.paths) == 1 or not self.footers:
            return 0, 0
        starts = self._file_starts
        k = min(int(np.searchsorted(starts, row, side="right") - 1), len(self.paths) - 1)
        return k, int(starts[k])

    @functools.cached_property
    def _file_starts(self) -> I64:
        """The input row of each file's first row, and the total: once, from the footers."""
        return np.cumsum([0, *self.rows_per_file()], dtype=np.int64)

    def npz_path(self) -> Path:
        """The npz file (always local: open_source refuses a remote one)."""
        p = self.paths[0]
        assert isinstance(p, Path)
        return p

    def first_row(self, i: int) -> int:
        """The input row of file ``i``'s first row (0 for an npz)."""
        return int(self._file_starts[i]) if self.footers else 0

    def parquet_file(self, i: int) -> pq.ParquetFile:
        """A reader of file ``i`` that does not parse its footer again."""
        return _parquet_file(self.paths[i], self.footers[i])


@dataclass(frozen=True)
class RemoteFile:
    """A file on a pyarrow filesystem (``s3://``, ``gs://``, ``hdfs://``, ...): named by
    its URI in messages, read through ``fs``; picklable, so Ray tasks read it too."""

    fs: Any  # pyarrow.fs.FileSystem
    path: str  # within fs
    uri: str

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    @property
    def parent(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[0]


InputPath = Path | RemoteFile


def _expand(spec: str) -> list[InputPath]:
    if "://" in spec:
        return _expand_uri(spec)
    return list(_expand_local(spec))


def _expand_uri(spec: str) -> list[InputPath]:
    """A URI pyarrow's filesystems understand: a file, a directory (prefix) of files, or
    a pattern of file names in one directory. ``file://`` is the local path; options
    after ``?`` (``endpoint_override=...``) are the filesystem's."""
    import fnmatch

    import pyarrow.fs as pafs

    base, q, query = spec.partition("?")
    head, _, name = base.rpartition("/")
    pattern = any(ch in name for ch in "*?[")
    try:  # a pattern: the directory opens the filesystem, file names are matched
        fs, path = pafs.FileSystem.from_uri((head if pattern else base) + q + query)
    except Exception as exc:
        raise InputError(f"{spec}: cannot open ({_why(exc)})") from None
    if isinstance(fs, pafs.LocalFileSystem):
        return list(_expand_local(f"{path}/{name}" if pattern else path))
    scheme = base.split("://", 1)[0]

    def found(infos: list[Any], keep: Callable[[str], bool]) -> list[InputPath]:
        names = sorted(i.path for i in infos if i.type == pafs.FileType.File and keep(i.base_name))
        return [RemoteFile(fs, f, f"{scheme}://{f}") for f in names]

    try:
        if pattern:
            listed = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            files = found(listed, lambda n: fnmatch.fnmatch(n, name))
            if not files:
                raise InputError(f"{spec}: no file matches this pattern")
            return files
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            listed = fs.get_file_info(pafs.FileSelector(path))
            files = found(listed, lambda n: _kind_of(Path(n)) is not None)
            if not files:
                raise InputError(f"{spec}: directory holds no .parquet, .pq or .npz file")
            return files
        if info.type == pafs.FileType.File:
            return [RemoteFile(fs, path, f"{scheme}://{path}")]
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{spec}: cannot list ({_why(exc)})") from None
    raise InputError(f"{spec}: no such file")


def _expand_local(spec: str) -> list[Path]:
    p = Path(spec)
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.is_file() and _kind_of(q) is not None)
        if not files:
            raise InputError(f"{spec}: directory holds no .parquet, .pq or .npz file")
        return files
    if p.is_file():  # a file named like a pattern (run[1].parquet) is that file
        return [p]
    if any(ch in spec for ch in "*?["):
        files = sorted(Path(f) for f in globlib.glob(spec, recursive=True) if Path(f).is_file())
        if not files:
            raise InputError(f"{spec}: no file matches this pattern")
        return files
    if not p.exists():
        raise InputError(f"{spec}: no such file")
    if not p.is_file():
        raise InputError(f"{spec}: not a regular file")
    return [p]


def open_source(
    specs: Sequence[str | InputPath],
    column_map: dict[str, str] | None = None,
    *,
    group_scope: str = "dataset",
) -> Source:
    """Resolve paths (files, directories, globs) and map every field to a column or array;
    ``group_scope`` says whether a group id spans files (``dataset``) or not (``file``)."""
    if not specs:
        raise UsageError("no input file given")
    if group_scope not in ("dataset", "file"):
        raise UsageError(f"--group-scope: {group_scope!r} is not one of dataset, file")
    paths: list[InputPath] = []
    for s in specs:  # a path of an expanded input is taken as it is
        paths.extend(_expand(s) if isinstance(s, str) else [s])
    kinds = {_kind(p) for p in paths}
    if len(kinds) > 1:
        raise InputError("inputs mix .npz and .parquet files; give one format at a time")
    kind = kinds.pop()
    label = str(paths[0]) if len(paths) == 1 else f"{paths[0].parent}/ ({len(paths)} files)"
    if kind == "npz":
        if len(paths) > 1:
            raise InputError(
                f"{len(paths)} .npz files given: one .npz at a time (use parquet for datasets)"
            )
        if isinstance(paths[0], RemoteFile):
            raise InputError(
                f"{paths[0]}: .npz is read from local files only (copy it here, or write parquet)"
            )
        names, footers = _npz_names(paths[0]), list[pq.FileMetaData]()
    else:
        names, footers = _parquet_names(paths)
    columns = _map_columns(names, column_map or {}, label, "array" if kind == "npz" else "column")
    return Source(
        paths=tuple(paths),
        kind=kind,
        columns=columns,
        label=label,
        present=tuple(names),
        footers=tuple(footers),
        group_scope=group_scope,
    )


def scoped_ids(src: Source, ids: pa.Array | pa.ChunkedArray, file: int) -> pa.Array:
    """Group ids as the input's scope reads them: with ``file``, ``name:id`` for the file's
    name, so that equal ids of two files are two groups."""
    ids = group_ids(ids)
    if src.group_scope != "file" or src.kind == "npz":
        return ids
    prefix = pa.scalar(f"{src.paths[file].name}:")
    return pc.binary_join_element_wise(prefix, pc.cast(ids, pa.string()), "")


def _kind_of(p: InputPath) -> str | None:
    """``npz`` or ``parquet`` by the suffix, in any case (.parquet, .pq, .PARQUET, .npz)."""
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    return None


def _kind(p: InputPath) -> str:
    kind = _kind_of(p)
    if kind is None:
        suffix = p.suffix.lower()
        raise InputError(
            f"{p}: unknown file type {suffix or '(none)'!r}; expected .npz or .parquet"
        )
    return kind


def _map_columns(
    names: Sequence[str], explicit: dict[str, str], label: str, what: str
) -> dict[str, str | None]:
    present = set(names)
    out: dict[str, str | None] = {}
    for field in FIELDS:
        if field in explicit:
            if explicit[field] not in present:
                raise InputError(
                    f"{label}: {what} {explicit[field]!r} (given for {field} with --column) "
                    f"not found; the file has: {', '.join(names)}"
                )
            out[field] = explicit[field]
            continue
        out[field] = next((a for a in ALIASES[field] if a in present), None)
    return out


def _npz_names(path: Path) -> list[str]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return list(z.files)
    except Exception as exc:  # zipfile/OSError/ValueError: all mean the same to a user
        raise InputError(f"{path}: cannot read as .npz ({_why(exc)})") from None


def _parquet_names(paths: Sequence[InputPath]) -> tuple[list[str], list[pq.FileMetaData]]:
    """The columns of a parquet dataset (every file must have the same) and each footer."""
    first: list[str] | None = None
    footers = []
    for p in paths:
        pf = _parquet_file(p)
        names = pf.schema_arrow.names
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InputError(f"{p}: column(s) {', '.join(map(repr, twice))} appear more than once")
        footers.append(pf.metadata)
        if first is None:
            first = names
        elif set(names) != set(first):
            raise InputError(
                f"{p}: columns differ from {paths[0]}: {sorted(set(names) ^ set(first))}"
            )
    assert first is not None
    return first, footers


def _parquet_file(p: InputPath, footer: pq.FileMetaData | None = None) -> pq.ParquetFile:
    # Buffered reads without pre-buffering: a row group is decoded page by page as record
    # batches are pulled, so memory is bounded by the batch, not by the row group.
    try:
        if isinstance(p, RemoteFile):
            return pq.ParquetFile(
                p.path, metadata=footer, pre_buffer=False, buffer_size=1 << 20, filesystem=p.fs
            )
        return pq.ParquetFile(p, metadata=footer, pre_buffer=False, buffer_size=1 << 20)
    except Exception as exc:
        raise InputError(f"{p}: cannot read as parquet ({_why(exc)})") from None


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------- answers
@dataclass(frozen=True)
class Answers:
    """Answer-level fields of the whole dataset, in row order.

    ``codes`` index ``labels`` (group ids in first-seen order). ``shape`` is ``(P, G)``
    when the rewards came as a 2-D array, else None.
    """

    n: int
    codes: I64 | None
    labels: list[Any] | None
    reward: F64 | None
    advantage: F64 | None
    shape: tuple[int, int] | None
    group_ids: pa.Array | None = None  # ``labels`` as an Arrow array, for joins by group id
    notes: list[str] = dataclass_field(default_factory=list)  # e.g. ids shared by files


def _real(label: str, what: str, arr: np.ndarray) -> F64:
    if arr.dtype == np.bool_:
        return arr.astype(np.float64)
    if arr.dtype.kind in "fiu":  # not timedelta64 (a numpy integer subtype) nor datetime64
        return arr.astype(np.float64, copy=False)
    raise InputError(f"{label}: {what} has dtype {arr.dtype}, expected numbers")


def _encode_groups(
    values: pa.Array | np.ndarray, label: str, what: str
) -> tuple[I64, list[Any], pa.Array]:
    """Group ids to codes into the first-seen distinct ids (as a list and as an Arrow array
    of the column's own type, for joins by id)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iuUSO":
            raise InputError(
                f"{label}: {what} has dtype {values.dtype}, expected integers or strings"
            )
        if values.dtype.byteorder not in ("=", "|"):  # big-endian ids: valid, stored swapped
            values = values.astype(values.dtype.newbyteorder("="))
    try:
        arr = values if isinstance(values, pa.Array | pa.ChunkedArray) else arrow_of(values)
    except (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        UnicodeEncodeError,
    ) as exc:
        raise InputError(f"{label}: {what} cannot be read as group ids ({exc})") from None
    arr = group_ids(arr)
    if arr.null_count:
        row = int(null_rows(arr)[0])
        raise InputError(f"{label}: {what} is null at row {row}")
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise InputError(f"{label}: {what} has type {t}, expected integers or strings")
    enc = arr.dictionary_encode()
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.unify_dictionaries().combine_chunks()
    codes = numpy_of(enc.indices).astype(np.int64)
    return codes, enc.dictionary.to_pylist(), enc.dictionary


def group_ids(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Group ids in a plain type: categorical ids (pandas ``Categorical``, polars
    ``Categorical``/``Enum``: Arrow dictionaries) decoded, ``string_view`` as ``string``, so
    that ids compare equal across files and batches whatever their writer."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_string_view(t):
        arr = arr.cast(pa.string())
    return arr


ReadColumns = Callable[[Source, list[str]], list[pa.Table]]


def load_answers(
    src: Source,
    *,
    need_rewards: bool,
    allow_nonfinite: bool = False,
    read: ReadColumns | None = None,
) -> Answers:
    """Pass 1: group ids, rewards and advantages of every answer (small columns only).

    Non-finite rewards or advantages are an error, unless ``allow_nonfinite`` (``check``
    counts them instead). ``read``: how each parquet file's columns are read, in file
    order (default: here; the Ray engine reads them in its tasks).
    """
    answers = (
        _npz_answers(src, need_rewards, allow_nonfinite)
        if src.kind == "npz"
        else _parquet_answers(src, need_rewards, allow_nonfinite, read or read_columns)
    )
    if answers.n == 0:
        raise InputError(f"{src.label}: no answers (0 rows): nothing to compute")
    return answers


def _token_scores_hint(src: Source) -> str:
    """What to do with verl's per-token scores, when they are what the input has."""
    for name in ("token_level_scores", "token_level_rewards"):
        if name in src.present:
            return (
                f"; {name!r} is verl's per-token score: grpo-cli takes one reward per answer, "
                f"its sum over the response mask (verl's sequence score): save that as "
                f"{src.name('reward')!r}"
            )
    return ""


def _npz_answers(src: Source, need_rewards: bool, allow_nonfinite: bool = False) -> Answers:
    path = src.npz_path()
    with np.load(path, allow_pickle=False) as z:
        get = _npz_getter(z, src)
        reward = get("reward")
        group = get("group")
        adv = get("advantage")
    # the token arrays' row count from their header: pass 1 decompresses no token array
    declared = npz_declared(path, src.name("logp")) if src.has("logp") else None
    n_tokens = declared[0][0] if declared is not None and len(declared[0]) >= 1 else None
    rname, gname, aname = src.name("reward"), src.name("group"), src.name("advantage")
    shape: tuple[int, int] | None = None
    codes = labels = r = None
    ids: pa.Array | None = None
    if reward is not None:
        r2 = _real(f"{path}", f"array {rname!r}", reward)
        if r2.ndim == 2:
            if group is not None:
                raise InputError(
                    f"{path}: array {rname!r} is 2-D (P, G), so array {gname!r} must not be given"
                )
            P, G = r2.shape
            shape = (P, G)
            r = r2.reshape(-1)
            codes = np.repeat(np.arange(P, dtype=np.int64), G)
            labels = list(range(P))
        elif r2.ndim == 1:
            r = r2
            if group is None:
                raise InputError(
                    f"{path}: array {rname!r} is 1-D, so an array {gname!r} (N,) of group ids "
                    f"is required (or give {rname!r} as (P, G))"
                )
            if group.ndim != 1 or group.shape[0] != r.shape[0]:
                raise InputError(
                    f"{path}: array {gname!r} has shape {group.shape}, expected ({r.shape[0]},) "
                    f"like {rname!r}"
                )
            codes, labels, ids = _encode_groups(group, str(path), f"array {gname!r}")
            if pa.types.is_integer(ids.type) and ids.type != pa.uint64():
                ids = ids.cast(pa.int64())  # one id type whatever the array's width
        else:
            raise InputError(
                f"{path}: array {rname!r} has shape {reward.shape}, expected (P, G) or (N,)"
            )
        bad = np.flatnonzero(~np.isfinite(r))
        if bad.size and not allow_nonfinite:
            raise InputError(
                f"{path}: array {rname!r} has non-finite value {r[bad[0]]} at answer {int(bad[0])}"
            )
    n = r.shape[0] if r is not None else n_tokens
    a = None
    if adv is not None:
        a = _real(str(path), f"array {aname!r}", adv)
        if a.ndim == 2 and shape is not None and a.shape == shape:
            a = a.reshape(-1)
        if a.ndim != 1 or (n is not None and a.shape[0] != n):
            raise InputError(f"{path}: array {aname!r} has shape {adv.shape}, expected ({n},)")
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size and not allow_nonfinite:
            raise InputError(
                f"{path}: array {aname!r} has non-finite value at answer {int(bad[0])}"
            )
        n = a.shape[0]
    if need_rewards and r is None:
        raise InputError(
            f"{path}: array {rname!r} is missing (the file has: {', '.join(src.present)})"
            + _token_scores_hint(src)
        )
    if n is None:
        raise InputError(f"{path}: no {rname!r}, {aname!r} or {src.name('logp')!r} array found")
    if n_tokens is not None and n_tokens != n:
        raise InputError(
            f"{path}: array {src.name('logp')!r} has {n_tokens} rows but there are {n} answers"
        )
    if labels is not None and ids is None:  # rewards (P, G): the groups are 0 .. P-1
        ids = arrow_of(np.arange(len(labels), dtype=np.int64))
    return Answers(
        n=n, codes=codes, labels=labels, reward=r, advantage=a, shape=shape, group_ids=ids
    )


# An npz is read whole (padded (N, L) arrays): its declared sizes are checked before any
# member is decompressed, so a small file that inflates to gigabytes is refused, not loaded.
NPZ_MAX_BYTES = 1 << 30


def npz_declared(path: Path, name: str) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """The shape and dtype an npz member declares in its .npy header (None: no such
    member), read without decompressing its data."""
    try:
        with zipfile.ZipFile(path) as zf:
            try:
                fh = zf.open(name + ".npy")
            except KeyError:
                return None
            with fh:
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: array {name!r} is unreadable ({_why(exc)})") from None
    return tuple(shape), dtype


def _check_npz_size(src: Source, fields: Sequence[str]) -> None:
    """Refuse an npz whose token arrays declare more than :data:`NPZ_MAX_BYTES` together."""
    path, total = src.npz_path(), 0
    for f in fields:
        if not src.has(f):
            continue
        declared = npz_declared(path, src.name(f))
        if declared is None:
            continue
        shape, dtype = declared
        total += int(np.prod(shape, dtype=np.float64)) * max(dtype.itemsize, 1)
    if total > NPZ_MAX_BYTES:
        raise InputError(
            f"{path}: its token arrays declare {total / 2**30:.1f} GiB once decompressed "
            f"(more than {NPZ_MAX_BYTES / 2**30:.0f} GiB read at once): give the rollouts as "
            "parquet, which is streamed"
        )


def _npz_getter(z: Any, src: Source) -> Any:
    def get(field: str) -> np.ndarray | None:
        if not src.has(field):
            return None
        name = src.name(field)
        try:
            return np.asarray(z[name])
        except ValueError as exc:  # object arrays need pickle: refuse
            raise InputError(
                f"{src.paths[0]}: array {name!r} cannot be loaded ({_why(exc)})"
            ) from None
        except Exception as exc:
            raise InputError(
                f"{src.paths[0]}: array {name!r} is unreadable ({_why(exc)})"
            ) from None

    return get


def read_columns(src: Source, cols: list[str]) -> list[pa.Table]:
    """Columns ``cols`` of every parquet file of ``src``, in file order."""
    return [read_file_columns(src, i, cols) for i in range(len(src.paths))]


def read_file_columns(src: Source, i: int, cols: list[str]) -> pa.Table:
    try:
        return src.parquet_file(i).read(columns=cols)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{src.paths[i]}: cannot read columns {cols} ({_why(exc)})") from None


def _parquet_answers(
    src: Source, need_rewards: bool, allow_nonfinite: bool, read: ReadColumns
) -> Answers:
    fields = [f for f in ("group", "reward", "advantage") if src.has(f)]
    cols = [src.name(f) for f in fields]
    tables = []
    n_rows = src.n_rows() or 0
    seen: dict[Any, list[int]] = {}  # group id -> the files holding it
    gname = src.name("group") if src.has("group") else None
    if cols:
        for i, t in enumerate(read(src, cols)):
            if gname is not None:
                ids = group_ids(t.column(gname))
                if len(src.paths) > 1 and src.group_scope == "dataset":
                    for v in pc.unique(ids).to_pylist():
                        seen.setdefault(v, []).append(i)
                t = t.set_column(t.schema.get_field_index(gname), gname, scoped_ids(src, ids, i))
            tables.append(t)
    if need_rewards and not src.has("reward"):
        raise InputError(
            f"{src.label}: column {src.name('reward')!r} is missing "
            f"(the file has: {', '.join(src.present)})" + _token_scores_hint(src)
        )
    table = None
    if tables:
        try:  # int64 in one file, double in another; nullable or not: one type
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(
                f"{src.label}: the files' columns {cols} have incompatible types ({exc})"
            ) from None
    codes = labels = r = a = ids = None
    if table is not None and src.has("reward"):
        name = src.name("reward")
        r = _float_column(table.column(name), src.label, name, allow_nonfinite)
        if not src.has("group"):
            raise InputError(
                f"{src.label}: column {src.name('group')!r} is missing "
                f"(every answer needs its group id)"
            )
        codes, labels, ids = _encode_groups(
            table.column(src.name("group")), src.label, f"column {src.name('group')!r}"
        )
    if table is not None and src.has("advantage"):
        a = _float_column(
            table.column(src.name("advantage")), src.label, src.name("advantage"), allow_nonfinite
        )
    shared = {v: f for v, f in seen.items() if len(f) > 1}
    notes = []
    if shared:
        files = sorted({k for f in shared.values() for k in f})
        names = ", ".join(src.paths[k].name for k in files[:4]) + (" ..." if len(files) > 4 else "")
        some = ", ".join(repr(v) for v in list(shared)[:3])
        notes.append(
            f"{len(shared)} group id(s) ({some}{' ...' if len(shared) > 3 else ''}) appear in "
            f"more than one file ({names}): each is read as one group across files "
            "(--group-scope dataset, right when the shards of one step split a group); with "
            "one step per file, pass --group-scope file"
        )
    return Answers(
        n=n_rows, codes=codes, labels=labels, reward=r, advantage=a, shape=None,
        group_ids=ids, notes=notes,
    )  # fmt: skip


def _float_column(
    col: pa.ChunkedArray, label: str, name: str, allow_nonfinite: bool = False
) -> F64:
    t = col.type
    if pa.types.is_decimal(t):  # duckdb writes VALUES literals as DECIMAL
        col = col.cast(pa.float64())
        t = col.type
    if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t)):
        raise InputError(f"{label}: column {name!r} has type {t}, expected numbers")
    if col.null_count:
        row = int(null_rows(col)[0])
        raise InputError(f"{label}: column {name!r} is null at row {row}")
    flat = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    x = np.asarray(numpy_of(flat), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size and not allow_nonfinite:
        raise InputError(
            f"{label}: column {name!r} has non-finite value {x[bad[0]]} at row {int(bad[0])}"
        )
    return x


# ---------------------------------------------------------------------------- tokens
@dataclass(frozen=True)
class Batch:
    """A run of consecutive answers, valid tokens only.

    ``start`` is the dataset index of the first answer; ``offsets`` ``(n+1,)`` delimit the
    answers in every flat ``(T_b,)`` token field of ``fields`` (floating: float32 as logged, or
    float64; every computation on them produces float64); ``width`` ``(n,)``
    is each answer's token-run length before the mask (the padded width for npz).
    """

    start: int
    offsets: I64
    fields: Mapping[str, FloatArray]
    width: I64
    answer: Mapping[str, pa.Array] = dataclass_field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> I64:
        return np.diff(self.offsets)

    def answers(self, i: int, j: int) -> Batch:
        """Answers ``i .. j-1`` of the batch (views, no copy)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[j])
        return Batch(
            start=self.start + i,
            offsets=self.offsets[i : j + 1] - lo,
            fields={k: v[lo:hi] for k, v in self.fields.items()},
            width=self.width[i:j],
            answer={k: v.slice(i, j - i) for k, v in self.answer.items()},
        )

    def tokens(self, lo: int, hi: int) -> Batch:
        """Tokens ``lo .. hi-1`` of a one-answer batch, as a batch of one answer (a slice
        of a long answer: its sums add up with the other slices')."""
        return Batch(
            start=self.start,
            offsets=np.array([0, hi - lo], dtype=np.int64),
            fields={k: v[lo:hi] for k, v in self.fields.items()},
            width=np.array([hi - lo], dtype=np.int64),
            answer=self.answer,
        )


def answer_runs(b: Batch, long: int) -> Iterator[tuple[int, int, bool]]:
    """``(i, j, is_long)``: the batch cut into runs of answers of at most ``long`` tokens,
    each answer longer than that a run of its own."""
    big = np.flatnonzero(np.diff(b.offsets) > long)
    i = 0
    for k in big.tolist():
        if k > i:
            yield i, k, False
        yield k, k + 1, True
        i = k + 1
    if i < b.n or b.n == 0:
        yield i, b.n, False


def token_ranges(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` ranges of at most ``size`` that cover ``0 .. n-1``."""
    return ((lo, min(n, lo + size)) for lo in range(0, n, size))


def iter_batches(
    src: Source,
    fields: Sequence[str],
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    threaded: bool = True,
) -> Iterator[Batch]:
    """Pass 2: stream the requested token fields (of ``logp``, ``old_logp``, ``ref_logp``).

    Every answer must have at least one valid token; NaN/inf inside the mask, lists of
    unequal lengths across fields, nulls: each is an :class:`InputError` naming where.
    """
    wanted = [f for f in fields if src.has(f)]
    if src.kind == "npz":
        yield from _npz_batches(src, wanted)
    else:
        batches = _parquet_batches(src, wanted, batch_tokens)
        with closing(prefetch(batches, threaded=threaded)) as stream:
            yield from stream


def _npz_arrays(src: Source, wanted: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The requested ``(N, L)`` token arrays of an npz and its boolean mask (all True when
    absent), with shapes and dtypes checked: anything else is an :class:`InputError`."""
    path = src.npz_path()
    _check_npz_size(src, [*wanted, "mask"])
    with np.load(path, allow_pickle=False) as z:
        get = _npz_getter(z, src)
        raw = {f: get(f) for f in wanted}
        mask_raw = get("mask")
    ref_name = src.name(wanted[0])
    ref_shape = raw[wanted[0]].shape
    for f, arr in raw.items():
        assert arr is not None
        if arr.ndim != 2:
            raise InputError(
                f"{path}: array {src.name(f)!r} has shape {arr.shape}, expected (N, L)"
            )
        if arr.shape != ref_shape:
            raise InputError(
                f"{path}: array {src.name(f)!r} has shape {arr.shape}, "
                f"but {ref_name!r} has {ref_shape}"
            )
        if arr.dtype.kind not in "fiu":  # numpy counts timedelta64 as an integer: refused
            raise InputError(
                f"{path}: array {src.name(f)!r} has dtype {arr.dtype}, expected floats"
            )
    if mask_raw is None:
        return raw, np.ones(ref_shape, dtype=np.bool_)
    mname = src.name("mask")
    if mask_raw.shape != ref_shape:
        raise InputError(
            f"{path}: array {mname!r} has shape {mask_raw.shape}, but {ref_name!r} has {ref_shape}"
        )
    return raw, _mask_values(mask_raw, str(path), f"array {mname!r}")


def _npz_batches(src: Source, wanted: list[str]) -> Iterator[Batch]:
    raw, mask = _npz_arrays(src, wanted)
    yield _npz_batch(src, raw, mask, _npz_answer_columns(src))


def _npz_answer_columns(src: Source) -> dict[str, pa.Array]:
    """The answer fields of an npz (group ids per answer, rewards, advantages) as columns,
    as parquet batches carry them."""
    a = _npz_answers(src, need_rewards=False, allow_nonfinite=True)
    out: dict[str, pa.Array] = {}
    if a.codes is not None and a.group_ids is not None:
        out["group"] = a.group_ids.take(arrow_of(a.codes))
    if a.reward is not None:
        out["reward"] = arrow_of(a.reward)
    if a.advantage is not None:
        out["advantage"] = arrow_of(a.advantage)
    return out


def _npz_batch(
    src: Source,
    raw: dict[str, np.ndarray],
    mask: NDArray[np.bool_],
    answer: Mapping[str, pa.Array],
) -> Batch:
    """Padded ``(N, L)`` arrays and mask to one validated batch of valid tokens."""
    path = src.npz_path()
    N, L = mask.shape
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise InputError(
            f"{path}: answer {int(empty[0])} has no valid token (its {src.name('mask')!r} row "
            f"is all False; {empty.size} such answer(s))"
        )
    lengths = mask.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat: dict[str, F64] = {}
    padded_offsets = np.arange(N + 1, dtype=np.int64) * L  # token = column of the padded array
    full = bool(offsets[-1] == N * L)  # no padding: the rows are the tokens (a view, no copy)
    for f, arr in raw.items():
        what = f"array {src.name(f)!r}"
        _check_finite(
            arr.reshape(-1), mask.reshape(-1), padded_offsets, 0, str(path), what, unit="answer"
        )
        flat[f] = _floating(np.ascontiguousarray(arr).reshape(-1) if full else arr[mask])
    width = np.full(N, L, dtype=np.int64)
    return Batch(start=0, offsets=offsets, fields=flat, width=width, answer=answer)


def raw_from_arrow(
    rb: pa.RecordBatch, columns: Mapping[str, str], *, start: int = 0, label: str = "batch"
) -> RawBatch:
    """A record batch of one row per answer (from any reader: a file, a Ray block, a
    table in memory) as a :class:`RawBatch`. ``columns`` maps fields (``logp``,
    ``old_logp``, ``ref_logp``, ``rollout_logp``, ``entropy``, ``mask``, ``group``,
    ``reward``, ``advantage``) to column names; ``start`` is the row of its first answer
    in the input and ``label`` names it in messages. Values are not checked: see
    :func:`validate_raw`."""
    wanted = [f for f in TOKEN_VALUES if f in columns]
    if not wanted:
        raise InputError(f"{label}: no token column among {sorted(columns)}")
    answer = {f: columns[f] for f in ANSWER_FIELDS if f in columns}
    names = [columns[f] for f in wanted]
    return _raw_record_batch(rb, wanted, names, columns.get("mask"), start, label, answer)


def validate_raw(raw: RawBatch, columns: Mapping[str, str]) -> Batch:
    """A :class:`RawBatch` of :func:`raw_from_arrow` checked into a :class:`Batch` (valid
    tokens only), or the :class:`InputError` naming the row, column and token."""
    wanted = [f for f in TOKEN_VALUES if f in raw.values]
    return _record_batch(raw, wanted, [columns[f] for f in wanted], columns.get("mask"))


def raw_to_batch(src: Source, raw: RawBatch, fields: Sequence[str]) -> Batch:
    """Validate a :class:`RawBatch` from :func:`iter_raw` into a :class:`Batch`, or raise
    the same :class:`InputError` :func:`iter_batches` would."""
    wanted = [f for f in fields if src.has(f)]
    if raw.unit == "answer":  # npz: the padded arrays, flattened
        assert raw.mask is not None
        N = raw.n
        L = int(raw.mask.shape[0] // N) if N else 0
        arrays = {f: raw.values[f].reshape(N, L) for f in wanted}
        return _npz_batch(src, arrays, raw.mask.reshape(N, L), raw.answer)
    names, mname, _, _ = _token_columns(src, wanted)
    return _record_batch(raw, wanted, names, mname)


def _floating(v: np.ndarray) -> F64:
    """Floating arrays as they are (float32 stays float32: the kernels ask numpy for float64
    results, converting on the fly); anything else to float64."""
    if np.issubdtype(v.dtype, np.floating):
        return v
    return v.astype(np.float64)


def _mask_values(m: np.ndarray, label: str, what: str) -> NDArray[np.bool_]:
    if m.dtype == np.bool_:
        return m
    if np.issubdtype(m.dtype, np.integer) or np.issubdtype(m.dtype, np.floating):
        ok = (m == 0) | (m == 1)
        if not ok.all():
            bad = np.argwhere(~ok)[0]
            raise InputError(
                f"{label}: {what} holds {m[tuple(bad)]} at {tuple(int(i) for i in bad)}; "
                f"expected booleans or 0/1"
            )
        return m.astype(np.bool_)
    raise InputError(f"{label}: {what} has dtype {m.dtype}, expected booleans or 0/1")


def _rows_per_batch(pf: pq.ParquetFile, col: str, batch_tokens: int) -> int:
    """Rows per record batch so that a batch holds about ``batch_tokens`` tokens, from the
    file metadata (values stored in ``col``'s column chunks / rows); 256 tokens a row when
    the metadata does not say."""
    md = pf.metadata
    rows = max(md.num_rows, 1)
    values = 0
    for rg in range(md.num_row_groups):
        rgm = md.row_group(rg)
        for c in range(rgm.num_columns):
            cc = rgm.column(c)
            if cc.path_in_schema.split(".")[0] == col:
                values += cc.num_values
    per_row = values / rows if values else 256.0
    return int(max(16, min(rows, batch_tokens / max(per_row, 1.0))))


# Record batches are read this many times smaller than a batch (in rows, from the file's
# average), then joined up to a batch of tokens (:func:`_joined`): a run of answers much
# longer than the average then makes a batch of few rows, not one of many times the tokens
# (2,000 answers of 32k tokens among 200k of 20: 3.2-4.2 GiB peak before, 0.5 GiB now); on
# the 70M-token benchmark the time is the same in paired runs.
READ_SPLIT = 64


def _rows_per_read(pf: pq.ParquetFile, col: str, batch_tokens: int) -> int:
    return max(1, _rows_per_batch(pf, col, batch_tokens) // READ_SPLIT)


def _list_tokens(arr: pa.Array) -> int:
    """Values held by a list column's slice (its rows otherwise)."""
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        off = arr.offsets
        return int(off[len(off) - 1].as_py()) - int(off[0].as_py())
    if pa.types.is_fixed_size_list(t):
        return len(arr) * t.list_size
    return len(arr)


def _joined(it: Iterable[pa.RecordBatch], col: str, batch_tokens: int) -> Iterator[pa.RecordBatch]:
    """Consecutive record batches joined while they hold at most ``batch_tokens`` values of
    ``col`` (a single longer one is yielded alone)."""
    pending: list[pa.RecordBatch] = []
    tokens = 0
    for rb in it:
        n = _list_tokens(rb.column(col))
        if pending and tokens + n > batch_tokens:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, tokens = [], 0
        pending.append(rb)
        tokens += n
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def _parquet_record_batches(
    src: Source, cols: list[str], batch_tokens: int
) -> Iterator[tuple[pa.RecordBatch, int, int]]:
    """(record batch, dataset index of its first row, file index) over every file, in order."""
    start = 0
    for i, p in enumerate(src.paths):
        pf = src.parquet_file(i)
        rows = _rows_per_read(pf, cols[0], batch_tokens)
        it = pf.iter_batches(batch_size=rows, columns=cols, use_threads=False)
        for rb in _joined(_read(p, it, cols), cols[0], batch_tokens):
            yield rb, start, i
            start += rb.num_rows


def _scoped(src: Source, raw: RawBatch, file: int) -> RawBatch:
    """The batch with its group ids as pass 1 read them (:func:`scoped_ids`)."""
    if src.group_scope != "file" or "group" not in raw.answer:
        return raw
    answer = {**raw.answer, "group": scoped_ids(src, raw.answer["group"], file)}
    return dataclasses.replace(raw, answer=answer)


def _read(p: InputPath, it: Iterator[pa.RecordBatch], cols: list[str]) -> Iterator[pa.RecordBatch]:
    """The record batches of ``it``; a failure to read them is an :class:`InputError`."""
    while True:
        try:
            rb = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise InputError(f"{p}: cannot read columns {cols} ({_why(exc)})") from None
        yield rb


def _token_columns(
    src: Source, wanted: list[str]
) -> tuple[list[str], str | None, list[str], dict[str, str]]:
    """The file's names of the ``wanted`` token fields, of the mask (None: no mask), the
    columns to read, and the answer columns read along (group, reward, advantage: what
    lets any batch compute its own advantages)."""
    names = [src.name(f) for f in wanted]
    mname = src.name("mask") if src.has("mask") else None
    answer = {f: src.name(f) for f in ANSWER_FIELDS if src.has(f)}
    cols = names + ([mname] if mname else [])
    return names, mname, cols + [c for c in answer.values() if c not in cols], answer


def _parquet_batches(src: Source, wanted: list[str], batch_tokens: int) -> Iterator[Batch]:
    names, mname, cols, answer = _token_columns(src, wanted)
    for rb, start, i in _parquet_record_batches(src, cols, batch_tokens):
        raw = _raw_record_batch(
            rb, wanted, names, mname, start, str(src.paths[i]), answer, src.first_row(i)
        )
        yield _record_batch(_scoped(src, raw, i), wanted, names, mname)


class BatchError(Exception):
    """An :class:`InputError` met while reading the batch that starts at dataset row
    ``start``, raised by a stream of :func:`iter_batch_streams` so that the consumer can
    report the first problem in row order, whichever stream met it first."""

    def __init__(self, start: int, error: InputError) -> None:
        super().__init__(str(error))
        self.start, self.error = start, error


def _parquet_chunks(src: Source) -> list[tuple[int, int, int]]:
    """Every non-empty row group: (file index, row group, dataset index of its first row)."""
    chunks, start = [], 0
    for i, md in enumerate(src.footers):
        for rg in range(md.num_row_groups):
            rows = md.row_group(rg).num_rows
            if rows:
                chunks.append((i, rg, start))
            start += rows
    return chunks


def iter_batch_streams(
    src: Source,
    fields: Sequence[str],
    streams: int,
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    threaded: bool = True,
) -> list[Prefetch[Batch]] | None:
    """Pass 2 as ``streams`` parallel streams of validated batches (see
    :func:`_stream_chunks`); None when one stream serves (:func:`iter_batches`)."""
    chunks = _stream_chunks(src, streams, threaded)
    if chunks is None:
        return None
    wanted = [f for f in fields if src.has(f)]
    return [Prefetch(chunk_batches(src, c, wanted, batch_tokens)) for c in chunks]


def iter_raw_streams(
    src: Source,
    fields: Sequence[str],
    streams: int,
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    threaded: bool = True,
) -> list[Prefetch[RawBatch]] | None:
    """:func:`iter_batch_streams` of unvalidated :class:`RawBatch` es: the same row groups
    in the same streams, cut at the same rows, so a fold over them (``check``) adds the
    same numbers in the same order as one over validated batches (``objective``)."""
    chunks = _stream_chunks(src, streams, threaded)
    if chunks is None:
        return None
    wanted = [f for f in fields if src.has(f)]
    return [Prefetch(raw_chunks(src, c, wanted, batch_tokens)) for c in chunks]


def _stream_chunks(
    src: Source, streams: int, threaded: bool
) -> list[list[tuple[int, int, int]]] | None:
    """Pass 2 as ``streams`` streams read in parallel, each by its own thread: row group
    ``j`` of the dataset (files in order) goes to stream ``j mod streams``, so decoding, the
    slowest part once the kernel is compiled, uses every core too.

    Each stream yields its batches in row order and raises :class:`BatchError` on bad
    data; its thread starts decoding at once, and ``close()`` stops it. None when there
    are fewer row groups than streams (or one npz), or without ``threaded`` (no reader
    threads): then :func:`iter_batches` is the one stream.
    """
    if src.kind == "npz" or streams < 2 or not threaded:
        return None
    chunks = _parquet_chunks(src)
    if len(chunks) < streams:
        return None
    return [chunks[k::streams] for k in range(streams)]


def raw_chunks(
    src: Source, chunks: list[tuple[int, int, int]], wanted: list[str], batch_tokens: int
) -> Iterator[RawBatch]:
    """The raw batches of the given row groups, in order; unreadable data raises
    :class:`BatchError` at the row where it starts."""
    names, mname, cols, answer = _token_columns(src, wanted)
    current: tuple[int, pq.ParquetFile, int] | None = None
    for i, rg, start in chunks:
        if current is None or current[0] != i:
            pf = src.parquet_file(i)
            current = (i, pf, _rows_per_read(pf, cols[0], batch_tokens))
        _, pf, rows = current
        p = src.paths[i]
        it = pf.iter_batches(batch_size=rows, row_groups=[rg], columns=cols, use_threads=False)
        try:
            for rb in _joined(_read(p, it, cols), cols[0], batch_tokens):
                raw = _raw_record_batch(
                    rb, wanted, names, mname, start, str(p), answer, src.first_row(i)
                )
                yield _scoped(src, raw, i)
                start += raw.n
        except InputError as exc:
            raise BatchError(start, exc) from None


def chunk_batches(
    src: Source, chunks: list[tuple[int, int, int]], wanted: list[str], batch_tokens: int
) -> Iterator[Batch]:
    """:func:`raw_chunks`, validated (in the reader's thread)."""
    names, mname, _, _ = _token_columns(src, wanted)
    for raw in raw_chunks(src, chunks, wanted, batch_tokens):
        try:
            yield _record_batch(raw, wanted, names, mname)
        except InputError as exc:
            raise BatchError(raw.start, exc) from None


@dataclass(frozen=True)
class RawBatch:
    """Token fields exactly as stored, for integrity checks that must not stop at the first
    problem: per field its flat values and offsets (lists may disagree in length), and the
    flat mask aligned with the first field (None: no mask, or its lengths disagree).

    ``unit`` is how messages name an answer: "row" (parquet) or "answer" (npz).
    """

    start: int
    label: str
    unit: str
    offsets: dict[str, I64]
    values: dict[str, np.ndarray]
    mask: NDArray[np.bool_] | None
    answer: Mapping[str, pa.Array] = dataclass_field(default_factory=dict)
    # the input row of its file's first row: messages name rows within the file
    file_start: int = 0

    @property
    def n(self) -> int:
        first = next(iter(self.offsets.values()))
        return int(first.shape[0] - 1)


def iter_raw(
    src: Source, fields: Sequence[str], *, batch_tokens: int = DEFAULT_BATCH_TOKENS
) -> Iterator[RawBatch]:
    """Stream token fields without validating their values (``grpo-cli check``).

    Unreadable data (a column that is not a list of numbers, nulls, arrays of different
    shapes) is still an :class:`InputError`; NaN, positive log-probs, lists of unequal
    lengths and empty answers are left for the caller to count.
    """
    wanted = [f for f in fields if src.has(f)]
    if not wanted:
        return
    if src.kind == "npz":
        raw, mask = _npz_arrays(src, wanted)
        N, L = mask.shape
        offsets = np.arange(N + 1, dtype=np.int64) * L
        yield RawBatch(
            start=0,
            label=str(src.paths[0]),
            unit="answer",
            offsets={f: offsets for f in raw},
            values={f: a.reshape(-1) for f, a in raw.items()},
            mask=mask.reshape(-1),
            answer=_npz_answer_columns(src),
        )
        return
    names, mname, cols, answer = _token_columns(src, wanted)
    for rb, start, i in _parquet_record_batches(src, cols, batch_tokens):
        batch = _raw_record_batch(
            rb, wanted, names, mname, start, str(src.paths[i]), answer, src.first_row(i)
        )
        yield _scoped(src, batch, i)


def _raw_record_batch(
    rb: pa.RecordBatch,
    wanted: list[str],
    names: list[str],
    mname: str | None,
    start: int,
    label: str,
    answer: dict[str, str],
    file_start: int = 0,
) -> RawBatch:
    """The list columns of a record batch as flat arrays and offsets, values unchecked;
    the ``answer`` columns (field: column name) as they are. ``start``: the input row of
    its first row; ``file_start``: that of its file's first row (messages count rows
    within the file ``label`` names)."""
    offs: dict[str, I64] = {}
    vals: dict[str, np.ndarray] = {}
    row0 = start - file_start
    for f, name in zip(wanted, names, strict=True):
        offs[f], vals[f] = _list_column(
            rb.column(name), label, name, row0, masked=mname is not None
        )
    mask = None
    if mname is not None:
        moff, mvals = _list_column(rb.column(mname), label, mname, row0, boolean=True)
        if np.array_equal(moff, offs[wanted[0]]):
            mask = _mask_values(mvals, label, f"column {mname!r}")
        else:
            offs["mask"] = moff
    answers = {f: rb.column(name) for f, name in answer.items()}
    return RawBatch(
        start=start, label=label, unit="row", offsets=offs, values=vals, mask=mask,
        answer=answers, file_start=file_start,
    )  # fmt: skip


def _list_column(
    arr: pa.Array,
    label: str,
    name: str,
    row0: int,
    *,
    boolean: bool = False,
    masked: bool = False,
) -> tuple[I64, np.ndarray]:
    """A list column as flat values and offsets. Fixed-size lists (polars ``Array``) and
    decimal values (duckdb) are converted; with a mask (``masked``) a null value is a
    padding NaN (an error only inside the mask, where validation finds it), else an error.
    """
    t = arr.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t):
        arr = arr.cast(pa.list_(t.value_type))
        t = arr.type
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_decimal(t.value_type):
        arr = arr.cast(pa.list_(pa.float64()))
        t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        raise InputError(
            f"{label}: column {name!r} has type {t}, expected a list column "
            f"(one list of per-token values per answer)"
        )
    vt = t.value_type
    ok = (
        pa.types.is_boolean(vt)
        or pa.types.is_integer(vt)
        or (not boolean and pa.types.is_floating(vt))
        or (boolean and pa.types.is_floating(vt))
    )
    if not ok:
        raise InputError(f"{label}: column {name!r} holds {vt} values, expected numbers")
    if not boolean and pa.types.is_boolean(vt):
        raise InputError(f"{label}: column {name!r} holds booleans, expected log-probs")
    if arr.null_count:
        row = int(null_rows(arr)[0])
        raise InputError(f"{label}: column {name!r} is null at row {row0 + row}")
    off = numpy_of(arr.offsets).astype(np.int64)
    values = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    if values.null_count and masked and not boolean and pa.types.is_floating(vt):
        values = values.fill_null(float("nan"))  # padding; inside the mask: a non-finite value
    if values.null_count:
        k = int(null_rows(values)[0])
        i = int(np.searchsorted(off - off[0], k, side="right") - 1)
        raise InputError(
            f"{label}: column {name!r} has a null value at row {row0 + i}, "
            f"token {k - int(off[i] - off[0])}"
        )
    off = off - off[0]
    return off, numpy_of(values)


def _record_batch(raw: RawBatch, wanted: list[str], names: list[str], mname: str | None) -> Batch:
    """Validate a raw record batch into a :class:`Batch` (valid tokens only), or raise."""
    label, start = raw.label, raw.start - raw.file_start  # messages: rows within the file
    offsets = raw.offsets[wanted[0]]
    for f, name in zip(wanted[1:], names[1:], strict=True):
        if not np.array_equal(raw.offsets[f], offsets):
            _raise_length_mismatch(raw.offsets[f], offsets, label, name, names[0], start)
    if "mask" in raw.offsets:
        assert mname is not None
        _raise_length_mismatch(raw.offsets["mask"], offsets, label, mname, names[0], start)
    width = np.diff(offsets)
    m = raw.mask
    if m is not None:  # valid tokens before each position, read at the answers' offsets
        counts = np.zeros(m.shape[0] + 1, dtype=np.int64)
        np.cumsum(m, out=counts[1:])
        new_offsets = counts[offsets]
    else:
        new_offsets = offsets
    lengths = np.diff(new_offsets)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise InputError(
            f"{label}: row {start + int(empty[0])} has no valid token (empty list or mask all "
            f"False; {empty.size} such row(s) in this batch)"
        )
    out: dict[str, F64] = {}
    for f, name in zip(wanted, names, strict=True):
        values = raw.values[f]
        _check_finite(values, m, offsets, start, label, f"column {name!r}")
        out[f] = _floating(values if m is None else values[m])
    return Batch(start=raw.start, offsets=new_offsets, fields=out, width=width, answer=raw.answer)


def _check_finite(
    raw: np.ndarray,
    m: NDArray[np.bool_] | None,
    offsets: I64,
    start: int,
    label: str,
    what: str,
    unit: str = "row",
) -> None:
    """Raise on the first NaN/inf of ``raw`` where the mask ``m`` (None: everywhere) is True,
    naming the answer and its token position (in a padded array, the column)."""
    if raw.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):  # ±1e308s may sum to inf
            if math.isfinite(np.add.reduce(raw)):
                return  # a finite sum: every value is finite (one pass, no temporary)
    bad = ~np.isfinite(raw)
    if m is not None:
        bad &= m
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        i = int(np.searchsorted(offsets, k, side="right") - 1)
        raise InputError(
            f"{label}: {what} has {raw[k]} inside the mask at {unit} {start + i}, "
            f"token {k - int(offsets[i])} ({int(bad.sum())} non-finite valid token(s) in this "
            f"batch)"
        )


def _raise_length_mismatch(
    off: I64, ref: I64, label: str, name: str, ref_name: str, start: int
) -> None:
    a, b = np.diff(off), np.diff(ref)
    i = int(np.flatnonzero(a != b)[0])
    raise InputError(
        f"{label}: row {start + i}: column {name!r} has {a[i]} tokens but {ref_name!r} has {b[i]}"
    )


# ----------------------------------------------------------------------------- output
def write_advantages(out: Path, advantages: np.ndarray, groups: list[Any]) -> None:
    """Write advantages: .npz ``advantages`` (shaped like the rewards), or .parquet with
    ``group`` and ``advantage`` per answer in row order."""
    try:
        if out.suffix.lower() == ".npz":
            np.savez(out, advantages=advantages)
        else:
            table = pa.table({"group": groups, "advantage": advantages.reshape(-1)})
            pq.write_table(table, out)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------- prefetch
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
