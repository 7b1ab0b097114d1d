"""The reader protocol: what a format gives grpo-cli, and nothing about any format.

A reader knows one file format. It names what the input holds, counts its answers,
reads the answer columns for pass 1, describes its *units* (the pieces it can read
independently: parquet row groups, one npz) for the plan, and decodes a list of units into
:class:`~grpo_cli.batch.RawBatch` es. Everything after that (validation, folding,
engines) is the same for every format.

Formats that share a file name ending (NeMo-RL's ``train_data_step{N}.jsonl`` and
grpo-cli's own JSONL) tell their files apart with an optional classmethod
``claims(path) -> bool`` (see :func:`claims`): the registry takes the first reader whose
ending matches and which claims the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from ...batch import RawBatch
    from ...errors import InputError
    from ..paths import InputPath
    from ..run import RecordedStep

__all__ = ["AnswerColumns", "ReadColumns", "Reader", "Source", "Unit", "token_columns"]


@dataclass(frozen=True)
class Unit:
    """A piece of the input a reader reads on its own: row group ``part`` of file ``file``
    (-1: the whole file), its first answer's row in the input (``start``), its answers
    (``rows``, -1: unknown until read) and its token values (``tokens``, an estimate from
    metadata: what plans balance)."""

    file: int
    part: int
    start: int
    rows: int
    tokens: int


@dataclass(frozen=True)
class AnswerColumns:
    """Pass 1's input: the answer fields (``group``, ``reward``, ``advantage``) of every
    file, one table per file, in file order, each field in the column ``names`` gives
    (the input's own name, so that messages name it); ``shape`` ``(P, G)`` when the
    rewards came as one group per row; ``n`` the answers (None: the reader cannot say
    without the token columns)."""

    tables: list[pa.Table]
    names: dict[str, str]
    n: int | None
    shape: tuple[int, int] | None = None
    # what the reader says about what it read (samples it left out, how it grouped them)
    notes: tuple[str, ...] = ()


class Source(Protocol):
    """What a reader (and pass 1) reads of the opened input: its label, the fields it holds
    and the column naming each (``name``, ``has``, ``present``, ``missing``), its files,
    group scope, reader, recorded step and units (:class:`grpo_cli.io.source.Source` is the
    one there is; a reader knows no more of it, so the readers import nothing above them)."""

    @property
    def label(self) -> str: ...
    @property
    def present(self) -> tuple[str, ...]: ...
    @property
    def group_scope(self) -> str: ...
    @property
    def recorded(self) -> RecordedStep | None: ...
    @property
    def reader(self) -> Reader: ...
    @property
    def paths(self) -> tuple[InputPath, ...]: ...
    def name(self, field: str) -> str: ...
    def has(self, field: str) -> bool: ...
    def missing(self, field: str, why: str = "") -> InputError: ...
    def units(self) -> list[Unit]: ...


# How pass 1 reads the answer columns of each file (here, or in Ray tasks): (source,
# column names) -> one table per file.
ReadColumns = Callable[["Source", list[str]], list[pa.Table]]


class Reader(Protocol):
    """One input format. ``what`` names where a field lives in messages (``column``,
    ``array``, ``field``), ``unit`` how an answer is named (``row``, ``answer``);
    ``suffixes`` are the file name endings the format is recognised by (lower case, e.g.
    ``.jsonl.gz``). A reader may also define ``claims`` (see :func:`claims`)."""

    format: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    what: ClassVar[str]
    unit: ClassVar[str]
    # several files of the format form one dataset
    datasets: ClassVar[bool]
    # the format can be read from a pyarrow filesystem (s3://, gs://, ...)
    remote: ClassVar[bool]

    @property
    def paths(self) -> tuple[InputPath, ...]:
        """The files, in order."""
        ...

    def names(self) -> list[str]:
        """Every column (array) name the input has, in its order."""
        ...

    def default_name(self, field: str) -> str:
        """The name ``field`` has by default in this format (npz: ``rewards``)."""
        ...

    def rows_per_file(self) -> list[int] | None:
        """Each file's answers, from metadata; None when not known without reading."""
        ...

    def answer_columns(
        self, src: Source, need_rewards: bool, allow_nonfinite: bool, read: ReadColumns | None
    ) -> AnswerColumns:
        """Pass 1's columns (see :class:`AnswerColumns`), checked for this format's own
        layout rules; ``read``: how to read each file's columns (None: here)."""
        ...

    def read_file_columns(self, src: Source, i: int, cols: list[str]) -> pa.Table:
        """Columns ``cols`` of file ``i`` (what ``read`` calls per file)."""
        ...

    def units(self, src: Source) -> list[Unit]:
        """Every unit of the input in order, from metadata (one walk, cached by Source)."""
        ...

    def raw_batches(
        self,
        src: Source,
        units: Sequence[Unit] | None,
        fields: Sequence[str],
        batch_tokens: int,
    ) -> Iterator[RawBatch]:
        """The token ``fields`` present of ``units`` in order (None: the whole input),
        decoded in batches of about ``batch_tokens`` tokens; unreadable data raises
        :class:`~grpo_cli.batch.BatchError` at the row where it starts."""
        ...


def token_columns(
    src: Source, wanted: Sequence[str]
) -> tuple[list[str], str | None, list[str], dict[str, str]]:
    """The input's names of the ``wanted`` token fields, of the mask (None: no mask), the
    columns to read, and the answer columns read along (group, reward, advantage: what
    lets any batch compute its own advantages)."""
    from ..fields import ANSWER_FIELDS

    names = [src.name(f) for f in wanted]
    mname = src.name("mask") if src.has("mask") else None
    answer = {f: src.name(f) for f in ANSWER_FIELDS if src.has(f)}
    cols = names + ([mname] if mname else [])
    return names, mname, cols + [c for c in answer.values() if c not in cols], answer


def suffix_of(p: InputPath | Path | Any) -> str:
    return str(getattr(p, "suffix", "")).lower()


def ending_of(p: InputPath | Path | Any, suffixes: Sequence[str]) -> str | None:
    """The longest of ``suffixes`` that ``p``'s name ends with, in any case (None: none)."""
    name = str(getattr(p, "name", "")).lower()
    found = [s for s in suffixes if name.endswith(s)]
    return max(found, key=len) if found else None


def claims(reader: type[Reader], p: InputPath) -> bool:
    """Whether ``reader`` takes ``p``: its name ends with one of the reader's suffixes and,
    when the reader defines ``claims(path) -> bool`` (formats sharing an ending, told
    apart by the file's start), the reader claims it."""
    if ending_of(p, reader.suffixes) is None:
        return False
    check: Callable[[InputPath], bool] | None = getattr(reader, "claims", None)
    return True if check is None else bool(check(p))
