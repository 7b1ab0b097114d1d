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

The chunk reader and parser (:mod:`grpo_cli.io.readers._jsonlines`) are also NeMo-RL's;
a line is refused, naming it, beyond :data:`~grpo_cli.io.bounded.MAX_LINE` bytes or
:data:`~grpo_cli.io.bounded.MAX_DEPTH` levels of nesting.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from ...batch import BatchError, RawBatch
from ...errors import InputError
from ..fields import ANSWER_FIELDS, PER_TOKEN
from ..lists import answer_table, is_list, raw_record_batch
from ..paths import InputPath
from ._jsonlines import (
    PASS1_BYTES,
    SUFFIXES,
    chunk_bytes,
    chunks,
    count_rows,
    file_size,
    json_type,
    line_types,
    parse,
)
from .base import AnswerColumns, ReadColumns, Unit, token_columns

if TYPE_CHECKING:
    from .base import Source

__all__ = ["SUFFIXES", "JsonlReader"]


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
            return [Unit(0, -1, 0, -1, file_size(self.paths[0]) // 64)]
        starts = np.cumsum([0, *rows], dtype=np.int64).tolist()
        return [
            Unit(i, -1, int(starts[i]), rows[i], file_size(p) // 64)
            for i, p in enumerate(self.paths)
        ]

    def raw_batches(
        self,
        src: Source,
        units: Sequence[Unit] | None,
        fields: Sequence[str],
        batch_tokens: int,
    ) -> Iterator[RawBatch]:
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
                yield raw
                row += raw.n
