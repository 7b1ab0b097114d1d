"""A reader whose step is one table held in memory: read whole when the input is opened
(slime's joined rollout dump, prime-rl's joined token export), then served to the
readers' protocol from memory — its answer columns, its one unit, its batches.

A reader using it holds the table (:meth:`TableReader.held`), names it
(:meth:`TableReader.label`), gives its notes (:meth:`TableReader.held_notes`) and says which
of its list columns counts each answer's token positions (``token_column``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from ...batch import BatchError, RawBatch
from ...errors import InputError
from ..fields import ANSWER_FIELDS
from ..lists import answer_table, raw_record_batch
from .base import AnswerColumns, ReadColumns, Unit, token_columns

if TYPE_CHECKING:
    from .base import Source

__all__ = ["TableReader"]


class TableReader:
    """The reader protocol's reading methods over one in-memory table (module docstring)."""

    what: ClassVar[str] = "field"
    # the list column whose lengths are the answers' token positions
    token_column: ClassVar[str]

    def held(self) -> pa.Table:
        raise NotImplementedError

    def label(self) -> str:
        raise NotImplementedError

    def held_notes(self) -> tuple[str, ...]:
        return ()

    def names(self) -> list[str]:
        return list(self.held().column_names)

    def _answer_names(self, src: Source) -> dict[str, str]:
        return {f: src.name(f) for f in ANSWER_FIELDS if src.has(f)}

    def read_file_columns(self, src: Source, i: int, cols: list[str]) -> pa.Table:
        """The answer columns of the whole table (it is one file: ``i`` and ``cols`` do
        not narrow it)."""
        del i, cols
        mname = src.name("mask") if src.has("mask") else None
        return answer_table(self.held(), self._answer_names(src), mname, self.label(), 0,
                            what=self.what)  # fmt: skip

    def answer_columns(
        self, src: Source, need_rewards: bool, allow_nonfinite: bool, read: ReadColumns | None
    ) -> AnswerColumns:
        """The table's answers, read when the input was opened, with its notes."""
        del need_rewards, allow_nonfinite, read
        table = self.read_file_columns(src, 0, [])
        names = self._answer_names(src)
        return AnswerColumns([table], names, table.num_rows, notes=self.held_notes())

    def _lengths(self) -> np.ndarray:
        col = self.held().column(self.token_column).combine_chunks()
        return np.diff(np.asarray(col.offsets)).astype(np.int64)

    def units(self, src: Source) -> list[Unit]:
        del src
        return [Unit(0, -1, 0, self.held().num_rows, int(self._lengths().sum()))]

    def raw_batches(
        self, src: Source, units: Sequence[Unit] | None, fields: Sequence[str], batch_tokens: int
    ) -> Iterator[RawBatch]:
        """The table's answers in order, about ``batch_tokens`` token positions a batch
        (one answer at least)."""
        del units
        wanted = [f for f in fields if src.has(f)]
        if not wanted:
            return
        names, mname, cols, answer = token_columns(src, wanted)
        t = self.held().select(cols)
        lengths = self._lengths()
        row = 0
        while row < t.num_rows:
            end = row + max(1, int(np.searchsorted(np.cumsum(lengths[row:]), batch_tokens)))
            rb = t.slice(row, end - row).combine_chunks().to_batches()[0]
            try:
                raw = raw_record_batch(rb, wanted, names, mname, row, self.label(), answer, 0,
                                       what=self.what)  # fmt: skip
            except InputError as exc:
                raise BatchError(row, exc) from None
            yield raw
            row = end
