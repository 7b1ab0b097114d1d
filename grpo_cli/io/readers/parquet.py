"""Parquet: one row per answer, token fields as list columns of the answer's own length.
Several files (a directory, a glob, a prefix on object storage) are one dataset; row
groups are the units, read in batches of about ``batch_tokens`` tokens, page by page.
A reward or advantage may be a list column (one value per token, as verl keeps them):
pass 1 reads it with the mask a record batch at a time and reduces it to one value per
answer (:func:`grpo_cli.io.lists.answer_table`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...batch import BatchError, RawBatch
from ...core import answer_runs
from ...errors import InputError
from .. import pages
from ..arrow import why
from ..fields import ANSWER_FIELDS, PER_TOKEN, TOKEN_VALUES
from ..lists import answer_table, is_list, joined, raw_record_batch
from ..paths import InputPath, RemoteFile
from .base import AnswerColumns, ReadColumns, Unit, token_columns

if TYPE_CHECKING:
    from .base import Source

__all__ = ["READ_SPLIT", "ParquetReader"]

# Record batches are read this many times smaller than a batch (in rows, from the file's
# average), then joined up to a batch of tokens (:func:`grpo_cli.io.lists.joined`): a run
# of answers much longer than the average then makes a batch of few rows, not one of many
# times the tokens (2,000 answers of 32k tokens among 200k of 20: 3.2-4.2 GiB peak before,
# 0.5 GiB now); on the 70M-token benchmark the time is the same in paired runs.
READ_SPLIT = 64
# Tokens a record batch of pass 1 holds when it reads a per-token reward or advantage.
PASS1_TOKENS = 1 << 20


def parquet_file(p: InputPath, footer: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """A reader of ``p`` (``footer``: its parsed footer, not parsed again). Buffered reads
    without pre-buffering: a row group is decoded page by page as record batches are
    pulled, so memory is bounded by the batch, not by the row group."""
    try:
        if isinstance(p, RemoteFile):
            return pq.ParquetFile(
                p.path, metadata=footer, pre_buffer=False, buffer_size=1 << 20, filesystem=p.fs
            )
        return pq.ParquetFile(p, metadata=footer, pre_buffer=False, buffer_size=1 << 20)
    except Exception as exc:
        raise InputError(f"{p}: cannot read as parquet ({why(exc)})") from None


def read_batches(
    p: InputPath, it: Iterator[pa.RecordBatch], cols: list[str]
) -> Iterator[pa.RecordBatch]:
    """The record batches of ``it``; a failure to read them is an :class:`InputError`."""
    while True:
        try:
            rb = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise InputError(f"{p}: cannot read columns {cols} ({why(exc)})") from None
        yield rb


@dataclasses.dataclass(frozen=True)
class ParquetReader:
    """The files of one parquet dataset and their footers, parsed once."""

    format: ClassVar[str] = "parquet"
    suffixes: ClassVar[tuple[str, ...]] = (".parquet", ".pq")
    what: ClassVar[str] = "column"
    unit: ClassVar[str] = "row"
    datasets: ClassVar[bool] = True
    remote: ClassVar[bool] = True

    paths: tuple[InputPath, ...]
    footers: tuple[pq.FileMetaData, ...] = dataclasses.field(compare=False, repr=False)
    columns: tuple[str, ...] = ()

    @classmethod
    def open(cls, paths: Sequence[InputPath]) -> ParquetReader:
        """Every file's footer and columns (every file must have the same columns)."""
        first: list[str] | None = None
        footers = []
        for p in paths:
            pf = parquet_file(p)
            names = pf.schema_arrow.names
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise InputError(
                    f"{p}: column(s) {', '.join(map(repr, twice))} appear more than once"
                )
            footers.append(pf.metadata)
            if first is None:
                first = names
            elif set(names) != set(first):
                raise InputError(
                    f"{p}: columns differ from {paths[0]}: {sorted(set(names) ^ set(first))}"
                )
        assert first is not None
        return cls(tuple(paths), tuple(footers), tuple(first))

    def names(self) -> list[str]:
        return list(self.columns)

    def subset(self, files: list[int]) -> ParquetReader:
        """The dataset of some of its files (their footers as parsed already)."""
        return ParquetReader(
            tuple(self.paths[i] for i in files), tuple(self.footers[i] for i in files), self.columns
        )

    def default_name(self, field: str) -> str:
        return field

    def rows_per_file(self) -> list[int]:
        return [int(md.num_rows) for md in self.footers]

    def file(self, i: int) -> pq.ParquetFile:
        """A reader of file ``i`` that does not parse its footer again."""
        return parquet_file(self.paths[i], self.footers[i])

    # ---- pass 1
    def read_file_columns(self, src: Source, i: int, cols: list[str]) -> pa.Table:
        """Columns ``cols`` of file ``i``; a reward or advantage stored per token (a list
        column) is read with the mask a record batch at a time (bounded memory) and reduced
        to one value per answer, with its flag column."""
        fields = {src.name(f): f for f in ANSWER_FIELDS if src.has(f)}
        schema = self.file(i).schema_arrow
        listed = [c for c in cols if fields.get(c) in PER_TOKEN and is_list(schema.field(c).type)]
        try:
            if not listed:
                return self.file(i).read(columns=cols)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{self.paths[i]}: cannot read columns {cols} ({why(exc)})") from None
        mname = src.name("mask") if src.has("mask") else None
        read = cols + ([mname] if mname is not None and mname not in cols else [])
        p, label, row = self.paths[i], str(self.paths[i]), 0
        rows = self._rows_per_read(src, i, PASS1_TOKENS)
        it = self.file(i).iter_batches(batch_size=rows, columns=read, use_threads=False)
        pieces = []
        by_field = {fields.get(c, c): c for c in cols}
        for rb in read_batches(p, it, read):
            pieces.append(answer_table(rb, by_field, mname, label, row))
            row += rb.num_rows
        if not pieces:
            empty = pa.table({c: pa.array([], schema.field(c).type) for c in read})
            return answer_table(empty, by_field, mname, label, 0)
        return pa.concat_tables(pieces)

    def answer_columns(
        self, src: Source, need_rewards: bool, allow_nonfinite: bool, read: ReadColumns | None
    ) -> AnswerColumns:
        names = {f: src.name(f) for f in ANSWER_FIELDS if src.has(f)}
        cols = list(names.values())
        tables: list[pa.Table] = []
        if cols:
            if read is None:
                tables = [self.read_file_columns(src, i, cols) for i in range(len(self.paths))]
            else:
                tables = read(src, cols)
        return AnswerColumns(tables, names, sum(self.rows_per_file()))

    # ---- units and token batches
    def units(self, src: Source) -> list[Unit]:
        """Every non-empty row group, with the values its first token column holds."""
        col = next((src.name(f) for f in TOKEN_VALUES if src.has(f)), None)
        out, start = [], 0
        for i, md in enumerate(self.footers):
            for rg in range(md.num_row_groups):
                rgm = md.row_group(rg)
                rows, values = rgm.num_rows, 0
                for c in range(rgm.num_columns):
                    cc = rgm.column(c)
                    if col is not None and cc.path_in_schema.split(".")[0] == col:
                        values += cc.num_values
                if rows:
                    out.append(Unit(i, rg, start, rows, values))
                start += rows
        return out

    @functools.cached_property
    def _file_starts(self) -> list[int]:
        return np.cumsum([0, *self.rows_per_file()], dtype=np.int64).tolist()

    def _rows_per_batch(self, src: Source, i: int, batch_tokens: int) -> int:
        """Rows of file ``i`` that hold about ``batch_tokens`` tokens: the file's average
        tokens a row, from its footer (256 when it does not say)."""
        rows = max(int(self.footers[i].num_rows), 1)
        values = sum(u.tokens for u in src.units() if u.file == i)
        per_row = values / rows if values else 256.0
        return int(max(16, min(rows, batch_tokens / max(per_row, 1.0))))

    def _rows_per_read(self, src: Source, i: int, batch_tokens: int) -> int:
        """Rows per record batch read from file ``i``: :data:`READ_SPLIT` times fewer than
        a batch's."""
        return max(1, self._rows_per_batch(src, i, batch_tokens) // READ_SPLIT)

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
        names, mname, cols, answer = token_columns(src, wanted)
        for i, start, records in self._record_batches(src, units, cols, batch_tokens):
            p = str(self.paths[i])
            try:
                for rb in records:
                    raw = raw_record_batch(
                        rb, wanted, names, mname, start, p, answer, self._file_starts[i]
                    )
                    yield raw
                    start += raw.n
            except InputError as exc:
                raise BatchError(start, exc) from None

    def _record_batches(
        self, src: Source, units: Sequence[Unit] | None, cols: list[str], batch_tokens: int
    ) -> Iterator[tuple[int, int, Iterator[pa.RecordBatch]]]:
        """``(file, input row of the first, record batches)`` per file (``units`` None: the
        whole input) or per row group, joined up to ``batch_tokens`` values of the first
        column."""
        if units is None and any(self._long(u, batch_tokens) for u in src.units()):
            units = src.units()  # a row group of long answers read from its pages
        if units is None:
            for i, p in enumerate(self.paths):
                pf = self.file(i)
                rows = self._rows_per_read(src, i, batch_tokens)
                it = pf.iter_batches(batch_size=rows, columns=cols, use_threads=False)
                yield (
                    i,
                    self._file_starts[i],
                    joined(read_batches(p, it, cols), cols[0], batch_tokens),
                )
            return
        current: tuple[int, pq.ParquetFile, int] | None = None
        for u in units:
            if current is None or current[0] != u.file:
                current = (
                    u.file,
                    self.file(u.file),
                    self._rows_per_read(src, u.file, batch_tokens),
                )
            _, pf, rows = current
            p = self.paths[u.file]
            paged = self._paged(pf, u, cols, batch_tokens) if self._long(u, batch_tokens) else None
            if paged is not None:
                yield u.file, u.start, paged
                continue
            it = pf.iter_batches(
                batch_size=rows, row_groups=[u.part], columns=cols, use_threads=False
            )
            yield u.file, u.start, joined(read_batches(p, it, cols), cols[0], batch_tokens)

    @staticmethod
    def _long(u: Unit, batch_tokens: int) -> bool:
        """Row group ``u``'s average answer holds more than a batch of tokens."""
        return pages.ENABLED and u.rows > 0 and u.tokens > batch_tokens * u.rows

    def _paged(
        self, pf: pq.ParquetFile, u: Unit, cols: list[str], batch_tokens: int
    ) -> Iterator[pa.RecordBatch] | None:
        """Row group ``u`` with its list columns decoded page by page
        (:mod:`grpo_cli.io.pages`: their values at once, plus a page, not pyarrow's
        several times an answer), its other columns by pyarrow; record batches of
        consecutive rows up to ``batch_tokens`` tokens of ``cols[0]`` (one row at least).
        None: a layout the decoder does not read (pyarrow reads it)."""
        p = self.paths[u.file]
        schema = pf.schema_arrow
        listed = [c for c in cols if is_list(schema.field(c).type)]
        if cols[0] not in listed:
            return None
        try:
            decoded = pages.read_list_columns(p, pf, u.part, listed)
        except pages.NotHandled:
            return None
        rest = [c for c in cols if c not in listed]
        try:
            small = pf.read_row_group(u.part, columns=rest, use_threads=False) if rest else None
        except Exception as exc:
            raise InputError(f"{p}: cannot read columns {rest} ({why(exc)})") from None
        arrays = [
            decoded[c].array() if c in decoded else small.column(c).combine_chunks()  # type: ignore[union-attr]
            for c in cols
        ]
        rb = pa.RecordBatch.from_arrays(arrays, names=cols)
        return _row_slices(rb, decoded[cols[0]].offsets, batch_tokens)

    # ---- steps in a column (trend --step-column)
    def split_by_column(
        self, src: Source, column: str, out: Path, batch_tokens: int, max_open: int
    ) -> list[tuple[int, Path]]:
        """Copy each step's rows to ``out/<step>.parquet``, in bounded memory (a record
        batch at a time; at most ``max_open`` writers open, so many steps take several
        passes). Steps are the integer values of ``column``."""
        if column not in src.present:
            raise InputError(
                f"{src.label}: no column {column!r} for --step-column "
                f"(the file has: {', '.join(src.present)})"
            )
        values: set[int] = set()
        for i, p in enumerate(self.paths):
            pf = self.file(i)
            t = pf.schema_arrow.field(column).type
            if not pa.types.is_integer(t):
                raise InputError(f"{p}: column {column!r} has type {t}, expected integers")
            batches = pf.iter_batches(columns=[column], batch_size=1 << 16, use_threads=False)
            for rb in read_batches(p, batches, [column]):
                col = rb.column(0)
                if col.null_count:
                    raise InputError(f"{p}: column {column!r} has nulls: every row needs a step")
                values.update(pc.unique(col).to_pylist())
        steps = sorted(values)
        if not steps:
            raise InputError(f"{src.label}: no rows, so no step")
        schema = None
        for lo in range(0, len(steps), max_open):
            chunk = set(steps[lo : lo + max_open])
            writers: dict[int, pq.ParquetWriter] = {}
            try:
                for i, p in enumerate(self.paths):
                    pf = self.file(i)
                    rows = self._rows_per_batch(src, i, batch_tokens)
                    every = pf.iter_batches(batch_size=rows, use_threads=False)
                    for rb in read_batches(p, every, list(src.present)):
                        if schema is None:
                            schema = rb.schema
                        if rb.schema != schema:
                            try:
                                rb = rb.cast(schema)
                            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                                raise InputError(
                                    f"{p}: its columns' types differ from "
                                    f"{self.paths[0].name}'s: cannot be split into steps together"
                                ) from None
                        col = rb.column(column)
                        for step in pc.unique(col).to_pylist():
                            if step not in chunk:
                                continue
                            if step not in writers:
                                writers[step] = pq.ParquetWriter(out / f"{step}.parquet", schema)
                            writers[step].write_batch(rb.filter(pc.equal(col, step)))
            finally:
                for w in writers.values():
                    w.close()
        return [(step, out / f"{step}.parquet") for step in steps]


def _row_slices(
    rb: pa.RecordBatch, offsets: np.ndarray, batch_tokens: int
) -> Iterator[pa.RecordBatch]:
    """Consecutive rows of ``rb`` (zero-copy slices) holding at most ``batch_tokens``
    tokens by ``offsets``, one row at least."""
    for i, j in answer_runs(offsets, batch_tokens):
        yield rb.slice(i, j - i)
