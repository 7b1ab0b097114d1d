"""The input formats grpo-cli reads, one reader module each, registered here.

Adding a format: a module with a reader class (the :class:`~grpo_cli.io.readers.base.Reader`
protocol: its names, rows, answer columns, units and raw batches), one line below, and its
tests. Nothing outside the readers tests a format's name.
"""

from __future__ import annotations

from ..paths import InputPath
from .base import AnswerColumns, ReadColumns, Reader, Unit
from .npz import NpzReader
from .parquet import ParquetReader

__all__ = [
    "READERS",
    "AnswerColumns",
    "ReadColumns",
    "Reader",
    "Unit",
    "reader_for",
    "suffix_list",
]

READERS: tuple[type[Reader], ...] = (ParquetReader, NpzReader)


def reader_for(p: InputPath) -> type[Reader] | None:
    """The reader of a file by its name's ending, in any case (None: no reader takes it)."""
    suffix = p.suffix.lower()
    return next((r for r in READERS if suffix in r.suffixes), None)


def suffix_list(conjunction: str = "or") -> str:
    """Every suffix a reader takes, for messages: ``.parquet, .pq or .npz``."""
    every = [s for r in READERS for s in r.suffixes]
    return ", ".join(every[:-1]) + f" {conjunction} " + every[-1]
