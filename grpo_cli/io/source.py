"""The input: files of one format, read by one reader, and which column or array holds
each field."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ..errors import InputError, UsageError
from .fields import ALIASES, TOKEN_VALUES, map_columns
from .paths import InputPath, RemoteFile, expand
from .readers import Reader, Unit, directory_files, reader_for, suffix_list
from .run import RecordedStep, find_run, recorded_step

if TYPE_CHECKING:
    from ..batch import RawBatch

__all__ = ["Source", "expand_input", "open_source"]

I64 = NDArray[np.int64]


@dataclass(frozen=True)
class Source:
    """Resolved input: its reader, which column/array holds each field, how messages name
    it (``label``), every name it has (``present``), and whether a group id spans files
    (``group_scope`` ``dataset``: the shards of one step) or not (``file``: one step per
    file, ids restart each step)."""

    reader: Reader
    columns: dict[str, str | None]
    label: str
    present: tuple[str, ...] = ()
    group_scope: str = "dataset"
    # a recorded step (grpo_cli.integrations): its run's meta.json and metrics.jsonl
    recorded: RecordedStep | None = None
    # what a report should say about the input before anything is read (in its warnings)
    notes: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[InputPath, ...]:
        return self.reader.paths

    def name(self, field: str) -> str:
        """The column/array holding ``field``, or the name it would have by default."""
        col = self.columns.get(field)
        if col is not None:
            return col
        return self.reader.default_name(field)

    def has(self, field: str) -> bool:
        return self.columns.get(field) is not None

    def token_fields(self) -> list[str]:
        """The per-token value fields the input has (log-probs, entropy, recorded 0/1
        masks), in :data:`~grpo_cli.io.fields.TOKEN_VALUES` order: what a pass over the
        tokens reads."""
        return [f for f in TOKEN_VALUES if self.has(f)]

    def missing(self, field: str, why: str = "") -> InputError:
        """The one error of a field the input lacks, for every command: its name, why it
        is needed, the names tried (its aliases), what the input has, a name of the input
        that looks like it, and the ``--column FIELD=NAME`` fix."""
        what = self.reader.what
        tried = [a for a in ALIASES.get(field, (field,)) if a != self.name(field)]
        has = ", ".join(self.present) or "no column"
        like = _looks_like(self, field)
        fix = f"--column {field}={like or 'NAME'}"
        hint = f"if {like!r} holds it, pass {fix}" if like else f"map yours with {fix}"
        return InputError(
            f"{self.label}: {what} {self.name(field)!r} is missing{why}; also tried "
            f"{', '.join(tried) or 'no other name'}; the file has: {has}; {hint}"
        )

    def n_rows(self) -> int | None:
        """Answers in the input from metadata (no data read); None when the format does
        not say."""
        rows = self.reader.rows_per_file()
        return None if rows is None else sum(rows)

    def file_of(self, row: int) -> tuple[int, int]:
        """The file holding input row ``row`` (its index in ``paths``) and the input row of
        that file's first row."""
        starts = self._file_starts
        if len(self.paths) == 1 or starts is None:
            return 0, 0
        k = min(int(np.searchsorted(starts, row, side="right") - 1), len(self.paths) - 1)
        return k, int(starts[k])

    def first_row(self, i: int) -> int:
        """The input row of file ``i``'s first row."""
        starts = self._file_starts
        return 0 if starts is None else int(starts[i])

    @functools.cached_property
    def _file_starts(self) -> I64 | None:
        """The input row of each file's first row, and the total: once, from metadata."""
        rows = self.reader.rows_per_file()
        return None if rows is None else np.cumsum([0, *rows], dtype=np.int64)

    def subset(self, files: list[int]) -> Source:
        """The input of some of its files alone (a dataset format's files; a recorded
        step's loss calls), named by its file when there is one."""
        sub = getattr(self.reader, "subset", None)
        if sub is None:
            raise InputError(f"{self.label}: a {self.reader.format} input is one file")
        reader = sub(files)
        label = str(reader.paths[0]) if len(files) == 1 else self.label
        return dataclasses.replace(self, reader=reader, label=label)

    def units(self) -> list[Unit]:
        """The reader's units, walked once (from metadata) and kept."""
        return self._units

    @functools.cached_property
    def _units(self) -> list[Unit]:
        return self.reader.units(self)

    def raw_batches(
        self, units: Sequence[Unit] | None, fields: Sequence[str], batch_tokens: int
    ) -> Iterator[RawBatch]:
        """The token ``fields`` of ``units`` (None: the whole input), raw, with their group
        ids as pass 1 read them (``--group-scope``: applied here, once, for every reader)."""
        batches = self.reader.raw_batches(self, units, fields, batch_tokens)
        if self.group_scope != "file" or not self.reader.datasets:
            return batches
        from .answers import scoped

        index = {str(p): i for i, p in enumerate(self.paths)}
        return (scoped(self, raw, index[raw.label]) for raw in batches)


# words of the names people give each field, for the missing-field hint
_LIKE = {
    "group": ("group", "prompt", "uid", "query", "question"),
    "reward": ("reward", "score", "return"),
    "advantage": ("adv",),
    "logp": ("logp", "logprob", "log_prob"),
    "old_logp": ("old",),
    "ref_logp": ("ref", "base"),
    "mask": ("mask",),
}


def _looks_like(src: Source, field: str) -> str | None:
    """A name of the input no field took that looks like ``field``'s (None: none)."""
    taken = {c for c in src.columns.values() if c is not None}
    words = _LIKE.get(field, (field,))
    return next(
        (n for n in src.present if n not in taken and any(w in n.lower() for w in words)), None
    )


def expand_input(spec: str) -> list[InputPath]:
    """The files one input argument names (a file, a directory of files some reader
    takes, a glob, a URI, a directory a reader knows by its layout: a slime dump)."""
    found = None if "://" in spec else directory_files(Path(spec))
    if found is not None:
        return list(found)
    return expand(spec, lambda p: reader_for(p) is not None, suffix_list())


def _recorded(specs: Sequence[str | InputPath]) -> RecordedStep | None:
    """The recorded step the input is (one local step directory of a recorded run), or
    None; a run's own directory is refused (it is many steps)."""
    if len(specs) != 1 or not isinstance(specs[0], str) or "://" in specs[0]:
        return None
    d = Path(specs[0])
    if not d.is_dir():
        return None
    run = find_run(d)
    latest = None if run is None else run.latest()
    if latest is not None:  # a trainer's output directory: its last complete step
        latest.require_readable()
        return latest
    if run is not None:
        steps = run.steps()
        example = steps[-1].directory if steps else d / "step_000001"
        raise InputError(
            f"{d}: a recorded run of {len(steps)} step(s): give one step ({example}), or "
            f"its steps in order with grpo-cli trend {d}"
        )
    step = recorded_step(d)
    if step is None:
        return None
    step.require_readable()
    return step


def _format(p: InputPath) -> type[Reader]:
    cls = reader_for(p)
    if cls is None:
        suffix = p.suffix.lower()
        raise InputError(f"{p}: unknown file type {suffix or '(none)'!r}; expected {suffix_list()}")
    return cls


def open_source(
    specs: Sequence[str | InputPath],
    column_map: dict[str, str] | None = None,
    *,
    group_scope: str = "dataset",
) -> Source:
    """Resolve paths (files, directories, globs, URIs) and map every field to a column or
    array; ``group_scope`` says whether a group id spans files (``dataset``) or not
    (``file``).

    Args:
      specs: the inputs, a list of paths (``str``, ``pathlib.Path`` or a
        :class:`~grpo_cli.io.paths.RemoteFile`); one path alone is taken as a list of one.
      column_map: field → the input's name for it (``--column FIELD=NAME``), or None.
      group_scope: ``dataset`` or ``file``.

    Raises:
      TypeError: ``specs`` or ``column_map`` of another type (named).
      grpo_cli.errors.InputError: an input that cannot be read (named)."""
    if isinstance(specs, str | os.PathLike | RemoteFile):
        specs = [specs if isinstance(specs, str | RemoteFile) else os.fspath(specs)]
    if not isinstance(specs, Sequence) or not all(
        isinstance(s, str | Path | RemoteFile) for s in specs
    ):
        raise TypeError(
            f"specs: expected a list of paths (str, pathlib.Path), got {type(specs).__name__}"
            + ("" if not isinstance(specs, Sequence) else " holding other values")
        )
    if column_map is not None and not (
        isinstance(column_map, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in column_map.items())
    ):
        raise TypeError(
            f"column_map: expected a mapping of field names to column names (str to str), "
            f"got {type(column_map).__name__}"
        )
    if not specs:
        raise UsageError("no input file given")
    if group_scope not in ("dataset", "file"):
        raise UsageError(f"--group-scope: {group_scope!r} is not one of dataset, file")
    step = _recorded(specs)
    paths: list[InputPath] = []
    if step is not None:
        paths = list(step.files)
    for s in specs if step is None else ():  # a path of an expanded input: as it is
        paths.extend(expand_input(s) if isinstance(s, str) else [s])
    kinds = {_format(p) for p in paths}
    if len(kinds) > 1:
        names = " and ".join(sorted(k.format for k in kinds))
        raise InputError(f"inputs mix {names} files; give one format at a time")
    cls = kinds.pop()
    label = str(paths[0]) if len(paths) == 1 else f"{paths[0].parent}/ ({len(paths)} files)"
    if step is not None:
        label = str(step.directory)
    reader = cls.open(paths)  # type: ignore[attr-defined]
    names = reader.names()
    columns = map_columns(names, column_map or {}, label, cls.what)
    notes: tuple[str, ...] = ()
    old = columns.get("old_logp")
    if step is not None and columns.get("logp") is None and old is not None:
        if "logp" not in (column_map or {}):  # a recorder given no current log-probs
            columns = {**columns, "logp": old}
            notes = (
                f"{label}: no current-policy log-probs recorded (logp): the step is read as "
                f"its first update, which is on-policy: logp = old_logp ({old!r}), ratio 1, "
                "as the trainer's first update computes it",
            )
    return Source(
        reader=reader,
        columns=columns,
        label=label,
        present=tuple(names),
        group_scope=group_scope,
        recorded=step,
        notes=notes,
    )
