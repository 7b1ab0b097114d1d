"""JSONL in grpo-cli's own fields: one answer per line, an object whose keys are the fields
(or any of their aliases): ``group``, ``reward``, ``advantage`` as numbers (or ``reward`` /
``advantage`` as lists, one value per token), and the token fields ``logp``,
``old_logp``, ``ref_logp``, ``rollout_logp``, ``entropy``, ``mask`` as lists of the
answer's own length. Plain or gzip-compressed (``.jsonl``, ``.jsonl.gz``), local or on a
pyarrow filesystem; several files are one dataset, as parquet's are.

Streamed in bounded memory: the file is read a chunk of whole lines at a time (about
:func:`chunk_bytes` of text, a longer line whole) and each chunk parsed by pyarrow's JSON
reader against an explicit schema of the fields read (other keys are skipped), so pass 1
holds the answer fields only and every batch one chunk. ``NaN``, ``Infinity`` and
``-Infinity`` (what Python's ``json.dumps`` writes for non-finite floats) are read as those
floats, then treated as in any format: padding where the mask is False, an error (or, for
``check``, a count) inside it. A ``null`` token value is padding where the mask is False.
The keys and JSON types are those of each file's first line.

The chunk reader and parser here are also NeMo-RL's (:mod:`grpo_cli.io.readers.nemo_rl`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from ...batch import BatchError, RawBatch
from ...errors import InputError
from ..arrow import why
from ..fields import ANSWER_FIELDS, FLAG_FIELDS, PER_TOKEN, TOKEN_VALUES
from ..lists import answer_table, is_list, raw_record_batch
from ..paths import InputPath, RemoteFile
from .base import AnswerColumns, ReadColumns, Unit, token_columns

if TYPE_CHECKING:
    from ..source import Source

__all__ = [
    "SUFFIXES",
    "JsonlReader",
    "chunk_bytes",
    "chunks",
    "count_rows",
    "head",
    "line_types",
    "open_stream",
    "parse",
]

SUFFIXES = (".jsonl", ".jsonl.gz")
# Text read a chunk per batch token (a grpo-cli line takes 40-120 bytes a token, six
# fields of ~16 characters), bounded: a chunk is one batch, parsed whole.
BYTES_PER_TOKEN = 16
CHUNK_MIN, CHUNK_MAX = 1 << 16, 1 << 26
# Pass 1 reads its chunks at this size.
PASS1_BYTES = 1 << 24
# pyarrow's JSON reader parses a chunk as one block: its size is an int32
MAX_LINE = (1 << 31) - 2


def chunk_bytes(batch_tokens: int) -> int:
    """Bytes of text a chunk holds for a batch of about ``batch_tokens`` tokens."""
    return int(min(CHUNK_MAX, max(CHUNK_MIN, batch_tokens * BYTES_PER_TOKEN)))


def open_stream(p: InputPath) -> pa.NativeFile:
    """A byte stream of ``p``, decompressed by its name (``.gz``)."""
    try:
        if isinstance(p, RemoteFile):
            return p.fs.open_input_stream(p.path, compression="detect")
        return pa.input_stream(str(p), compression="detect")
    except Exception as exc:
        raise InputError(f"{p}: cannot open ({why(exc)})") from None


def _blocks(p: InputPath, size: int) -> Iterator[bytes]:
    with open_stream(p) as f:
        while True:
            try:
                block = f.read(size)
            except Exception as exc:  # a corrupt gzip stream, a dropped connection
                raise InputError(f"{p}: cannot read ({why(exc)})") from None
            if not block:
                return
            yield block


def chunks(p: InputPath, size: int) -> Iterator[pa.Buffer]:
    """The text of ``p`` as runs of whole lines of about ``size`` bytes (a longer line
    whole, with what precedes it in its block), in order; the last line needs no
    newline."""
    pending: list[bytes] = []
    for block in _blocks(p, size):
        cut = block.rfind(b"\n")
        if cut < 0:
            pending.append(block)
            continue
        data = b"".join([*pending, block]) if pending else block
        end = len(data) - (len(block) - cut - 1)
        pending = [data[end:]] if end < len(data) else []
        yield pa.py_buffer(data).slice(0, end)
    rest = b"".join(pending)
    if rest.strip():
        yield pa.py_buffer(rest)


def head(p: InputPath, limit: int) -> bytes:
    """The first non-blank line of ``p``, or its first ``limit`` bytes when it is longer
    (b"" for a blank file)."""
    got: list[bytes] = []
    size = 0
    for block in _blocks(p, min(limit, 1 << 20)):
        if not got:
            block = block.lstrip()
        if not block:
            continue
        cut = block.find(b"\n")
        got.append(block if cut < 0 else block[:cut])
        size += len(got[-1])
        if cut >= 0 or size >= limit:
            break
    return b"".join(got)[:limit]


def count_rows(p: InputPath) -> int:
    """The answers of ``p``: its non-blank lines (what the JSON reader reads as rows)."""
    n = 0
    for buf in chunks(p, PASS1_BYTES):
        n += sum(1 for line in buf.to_pybytes().split(b"\n") if line.strip())
    return n


def parse(buf: pa.Buffer, schema: pa.Schema, label: str, row0: int, what: str) -> pa.RecordBatch:
    """A chunk of whole lines as one record batch of ``schema`` (keys not in it skipped,
    keys missing from a line null). ``row0``: the file's row of its first line, for
    messages, which name a field a ``what``."""
    if buf.size > MAX_LINE:
        raise InputError(f"{label}: a line longer than 2 GiB from row {row0} on: cannot be read")
    ro = pj.ReadOptions(use_threads=False, block_size=max(buf.size + 1, 1 << 16))
    po = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(pa.BufferReader(buf), read_options=ro, parse_options=po)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _parse_error(label, exc, row0, what) from None
    table = table.combine_chunks()
    if table.num_rows == 0:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
    batches = table.to_batches()
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _parse_error(label: str, exc: Exception, row0: int, what: str) -> InputError:
    """pyarrow's JSON error as a line naming the file, row and field."""
    text = why(exc).removeprefix("JSON parse error: ")
    m = re.search(r" in row (\d+)", text)
    at = f"row {row0 + int(m.group(1))}" if m else f"a row from {row0} on"
    text = re.sub(r"\s*in row \d+", "", text)
    changed = re.search(r"Column\(/([^/)]*)[^)]*\) changed from (\w+) to (\w+)", text)
    if changed:
        name, was, now = changed.groups()
        return InputError(
            f"{label}: {what} {name!r} holds a {now} at {at} where a {was} was expected (as "
            "on the first line): give every line the same JSON types"
        )
    if "Column() changed from object" in text:
        return InputError(f"{label}: {at} is not a JSON object (one answer per line)")
    return InputError(f"{label}: cannot read {at} as JSON ({text.strip().rstrip('.')})")


def line_types(p: InputPath) -> dict[str, pa.DataType]:
    """The keys of the first line of ``p``, in order, with the types pyarrow infers."""
    line = head(p, MAX_LINE)
    if not line.strip():
        raise InputError(f"{p}: no answers (the file is empty)")
    buf = pa.py_buffer(line)
    try:
        ro = pj.ReadOptions(use_threads=False, block_size=max(buf.size + 1, 1 << 16))
        table = pj.read_json(pa.BufferReader(buf), read_options=ro)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _parse_error(str(p), exc, 0, "field") from None
    return {f.name: f.type for f in table.schema}


def json_type(field: str, seen: pa.DataType | None) -> pa.DataType:
    """The type a field is parsed as, from the type its first line holds (``seen``): token
    values as lists of floats (JSON integers read as floats); a mask (and a 0/1 flag such
    as ``entropy_mask``) of booleans or of numbers; a group id as integers or strings
    (anything else as it came, refused when encoded); a reward or advantage as a float, or
    a list of floats (one a token)."""
    if field in TOKEN_VALUES and field not in FLAG_FIELDS:
        return pa.list_(pa.float64())
    if field == "mask" or field in FLAG_FIELDS:
        boolean = seen is not None and is_list(seen) and pa.types.is_boolean(seen.value_type)
        return pa.list_(pa.bool_() if boolean else pa.float64())
    if field == "group":
        if seen is None or pa.types.is_null(seen) or pa.types.is_string(seen):
            return pa.string()
        return pa.int64() if pa.types.is_integer(seen) else seen
    if seen is not None and is_list(seen):
        return pa.list_(pa.float64())
    return pa.float64()


@dataclasses.dataclass(frozen=True)
class JsonlReader:
    """The files of one JSONL dataset and the keys of their first lines."""

    format: ClassVar[str] = "jsonl"
    suffixes: ClassVar[tuple[str, ...]] = SUFFIXES
    what: ClassVar[str] = "field"
    unit: ClassVar[str] = "row"
    datasets: ClassVar[bool] = True
    remote: ClassVar[bool] = True

    paths: tuple[InputPath, ...]
    types: tuple[tuple[str, pa.DataType], ...] = dataclasses.field(compare=False, repr=False)

    @classmethod
    def open(cls, paths: Sequence[InputPath]) -> JsonlReader:
        """The first line of every file (every file must have the same keys)."""
        first: dict[str, pa.DataType] | None = None
        for p in paths:
            types = line_types(p)
            if first is None:
                first = types
            elif set(types) != set(first):
                raise InputError(
                    f"{p}: fields differ from {paths[0]}: {sorted(set(types) ^ set(first))}"
                )
        assert first is not None
        return cls(tuple(paths), tuple(first.items()))

    def names(self) -> list[str]:
        return [n for n, _ in self.types]

    def default_name(self, field: str) -> str:
        return field

    def rows_per_file(self) -> list[int] | None:
        """Known without reading for one file (its rows start at 0); several files are
        counted once (their non-blank lines), for each file's first row."""
        return None if len(self.paths) == 1 else list(self._rows)

    @functools.cached_property
    def _rows(self) -> tuple[int, ...]:
        return tuple(count_rows(p) for p in self.paths)

    def schema(self, fields: Mapping[str, str]) -> pa.Schema:
        """The parse schema of ``fields`` (key: the field it holds), each key once."""
        seen = dict(self.types)
        return pa.schema([(name, json_type(f, seen.get(name))) for name, f in fields.items()])

    def _listed(self, name: str) -> bool:
        t = dict(self.types).get(name)
        return t is not None and is_list(t)

    # ---- pass 1
    def read_file_columns(self, src: Source, i: int, cols: list[str]) -> pa.Table:
        """The answer columns ``cols`` of file ``i``, a chunk at a time; a reward or
        advantage given per token is reduced with the mask to one value per answer."""
        of = {src.name(f): f for f in ANSWER_FIELDS if src.has(f)}
        fields = {of.get(c, c): c for c in cols}
        listed = any(f in PER_TOKEN and self._listed(c) for f, c in fields.items())
        mname = src.name("mask") if listed and src.has("mask") else None
        keys = {c: f for f, c in fields.items()}
        if mname is not None:
            keys.setdefault(mname, "mask")
        schema = self.schema(keys)
        p, label = self.paths[i], str(self.paths[i])
        pieces, row = [], 0
        for buf in chunks(p, PASS1_BYTES):
            rb = parse(buf, schema, label, row, self.what)
            if rb.num_rows:
                pieces.append(answer_table(rb, fields, mname, label, row, what=self.what))
                row += rb.num_rows
        if not pieces:
            empty = pa.table({f.name: pa.array([], f.type) for f in schema})
            return answer_table(empty, fields, mname, label, 0, what=self.what)
        return pa.concat_tables(pieces)

    def answer_columns(
        self, src: Source, need_rewards: bool, allow_nonfinite: bool, read: ReadColumns | None
    ) -> AnswerColumns:
        names = {f: src.name(f) for f in ANSWER_FIELDS if src.has(f)}
        cols = list(dict.fromkeys(names.values()))
        if not cols:
            rows = self.rows_per_file()
            n = sum(rows) if rows is not None else count_rows(self.paths[0])
            return AnswerColumns([], names, n)
        if read is None:
            tables = [self.read_file_columns(src, i, cols) for i in range(len(self.paths))]
        else:
            tables = read(src, cols)
        return AnswerColumns(tables, names, sum(t.num_rows for t in tables))

    # ---- units and token batches
    def units(self, src: Source) -> list[Unit]:
        """A unit a file (its lines are read in order), with its first row."""
        rows = self.rows_per_file()
        if rows is None:
            return [Unit(0, -1, 0, -1, _size(self.paths[0]) // 64)]
        starts = np.cumsum([0, *rows], dtype=np.int64).tolist()
        return [
            Unit(i, -1, int(starts[i]), rows[i], _size(p) // 64) for i, p in enumerate(self.paths)
        ]

    def raw_batches(
        self,
        src: Source,
        units: Sequence[Unit] | None,
        fields: Sequence[str],
        batch_tokens: int,
    ) -> Iterator[RawBatch]:
        from ..answers import scoped

        wanted = [f for f in fields if src.has(f)]
        if not wanted:
            return
        names, mname, _, answer = token_columns(src, wanted)
        keys: dict[str, str] = {}
        for f, name in [*zip(wanted, names, strict=True), *answer.items()]:
            keys.setdefault(name, f)
        if mname is not None:
            keys.setdefault(mname, "mask")
        schema = self.schema(keys)
        size = chunk_bytes(batch_tokens)
        for u in src.units() if units is None else units:
            p = self.paths[u.file]
            label, row = str(p), u.start
            for buf in chunks(p, size):
                try:
                    rb = parse(buf, schema, label, row - u.start, self.what)
                    if not rb.num_rows:
                        continue
                    raw = raw_record_batch(
                        rb, wanted, names, mname, row, label, answer, u.start, what=self.what
                    )
                except InputError as exc:
                    raise BatchError(row, exc) from None
                yield scoped(src, raw, u.file)
                row += raw.n


def _size(p: InputPath) -> int:
    """The file's size in bytes (0 when it cannot be told): what plans balance."""
    try:
        if isinstance(p, RemoteFile):
            return int(p.fs.get_file_info(p.path).size or 0)
        return p.stat().st_size
    except Exception:  # a size is only an estimate for plans
        return 0
