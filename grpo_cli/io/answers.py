"""Pass 1: the answer fields of the whole input (group ids, rewards, advantages), for any
format: each reader gives its answer columns (:meth:`Reader.answer_columns`), this module
checks and encodes them the same way for all. Rewards and advantages stored one value per
token come reduced to one per answer with a flag column each (:mod:`grpo_cli.io.lists`):
this module says which they were, and whether the advantages must be folded per token."""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from ..errors import InputError
from .arrow import group_ids, null_rows, numpy_of
from .lists import OUTSIDE, VARIES
from .readers.base import ReadColumns

if TYPE_CHECKING:
    from ..batch import RawBatch
    from .readers.base import Source

__all__ = ["Answers", "encode_groups", "load_answers", "scoped"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


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
    shared_ids: int = 0  # group ids found in more than one file (dataset scope)
    # the file's advantages are per token and vary within answers: folded per token
    # (``advantage`` then holds each answer's mean over its valid tokens)
    per_token_advantage: bool = False


def encode_groups(
    values: pa.Array | pa.ChunkedArray, label: str, what: str
) -> tuple[I64, list[Any], pa.Array]:
    """Group ids to codes into the first-seen distinct ids (as a list and as an Arrow array
    of the column's own type, for joins by id)."""
    arr = group_ids(values)
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


def scoped_ids(src: Source, ids: pa.Array | pa.ChunkedArray, file: int) -> pa.Array:
    """Group ids as the input's scope reads them: with ``file`` (a dataset format),
    ``name:id`` for the file's name, so that equal ids of two files are two groups."""
    ids = group_ids(ids)
    if src.group_scope != "file" or not src.reader.datasets:
        return ids
    prefix = pa.scalar(f"{src.paths[file].name}:")
    return pc.binary_join_element_wise(prefix, pc.cast(ids, pa.string()), "")


def scoped(src: Source, raw: RawBatch, file: int) -> RawBatch:
    """A batch of file ``file`` with its group ids as pass 1 read them
    (``--group-scope``)."""
    import dataclasses

    if src.group_scope != "file" or "group" not in raw.answer:
        return raw
    answer = {**raw.answer, "group": scoped_ids(src, raw.answer["group"], file)}
    return dataclasses.replace(raw, answer=answer)


def load_answers(
    src: Source,
    *,
    need_rewards: bool,
    allow_nonfinite: bool = False,
    read: ReadColumns | None = None,
) -> Answers:
    """Pass 1: group ids, rewards and advantages of every answer (small columns only).

    Non-finite rewards or advantages are an error, unless ``allow_nonfinite`` (``check``
    counts them instead). ``read``: how each file's columns are read, in file order
    (default: here; the Ray engine reads them in its tasks).
    """
    cols = src.reader.answer_columns(src, need_rewards, allow_nonfinite, read)
    what = src.reader.what
    seen: dict[Any, list[int]] = {}  # group id -> the files holding it
    gname = cols.names.get("group")
    tables = []
    for i, t in enumerate(cols.tables):
        if gname is not None and gname in t.column_names:
            ids = group_ids(t.column(gname))
            if len(cols.tables) > 1 and src.group_scope == "dataset":
                for v in pc.unique(ids).to_pylist():
                    seen.setdefault(v, []).append(i)
            t = t.set_column(t.schema.get_field_index(gname), gname, scoped_ids(src, ids, i))
        tables.append(t)
    if need_rewards and not src.has("reward"):
        raise src.missing("reward", " (the advantages are computed from the rewards)")
    table = None
    if tables and tables[0].num_columns:
        try:  # int64 in one file, double in another; nullable or not: one type
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(_incompatible(src, tables, exc)) from None
    codes = labels = r = a = ids = None
    if table is not None and "reward" in cols.names:
        name = cols.names["reward"]
        r = _float_column(table.column(name), src, name, allow_nonfinite)
        if gname is None:
            raise src.missing("group", " (every answer needs its group id)")
        codes, labels, ids = encode_groups(table.column(gname), src.label, f"{what} {gname!r}")
    if table is not None and "advantage" in cols.names:
        name = cols.names["advantage"]
        a = _float_column(table.column(name), src, name, allow_nonfinite)
    n = cols.n
    if n is None:
        n = r.shape[0] if r is not None else (a.shape[0] if a is not None else 0)
    # a recorded step's calls split its groups: shared ids across its files are expected
    shared = [] if src.recorded is not None else _shared_note(src, seen)
    notes = [*cols.notes, *shared]
    per_token = False
    if table is not None:
        per_token, said = _per_token_notes(table, cols.names, src)
        notes += said
    answers = Answers(
        n=n, codes=codes, labels=labels, reward=r, advantage=a, shape=cols.shape,
        group_ids=ids, notes=notes, per_token_advantage=per_token,
        shared_ids=sum(len(f) > 1 for f in seen.values()) if shared else 0,
    )  # fmt: skip
    if answers.n == 0:
        raise InputError(f"{src.label}: no answers (0 rows): nothing to compute")
    return answers


def _flag_column(table: pa.Table, name: str) -> NDArray[np.bool_] | None:
    if name not in table.column_names:
        return None
    col = table.column(name).combine_chunks().fill_null(False)
    return numpy_of(col)


def _per_token_notes(table: pa.Table, names: dict[str, str], src: Source) -> tuple[bool, list[str]]:
    """Whether the advantages vary within answers (then folded per token), and what pass 1
    says of per-token rewards and advantages (which way each was read)."""
    what, notes, per_token = src.reader.what, [], False
    if "reward" in names:
        name = names["reward"]
        outside = _flag_column(table, name + OUTSIDE)
        if outside is not None:
            note = (
                f"{what} {name!r} holds one reward per token: each answer's reward is their "
                "sum over its row, masked positions included, as verl 0.9.1's "
                "compute_grpo_outcome_advantage sums token_level_rewards"
            )
            k = int(np.count_nonzero(outside))
            if k:
                note += f" ({k} answer(s) hold nonzero scores outside the mask, counted)"
            notes.append(note)
    if "advantage" in names:
        name = names["advantage"]
        varies = _flag_column(table, name + VARIES)
        if varies is not None:
            k = int(np.count_nonzero(varies))
            per_token = k > 0
            if per_token:
                notes.append(
                    f"{what} {name!r} holds one advantage per token, varying within {k} of "
                    f"{varies.shape[0]} answers (e.g. OpenRLHF's KL in the reward): folded "
                    "per token; an answer's advantage in the statistics is its mean over "
                    "its valid tokens"
                )
            else:
                notes.append(
                    f"{what} {name!r} holds one advantage per token, constant over each "
                    "answer's valid tokens: read as that answer's advantage"
                )
    return per_token, notes


def _incompatible(src: Source, tables: list[pa.Table], exc: BaseException) -> str:
    """Which file's answer column has a type the first file's cannot take."""
    first = tables[0].schema
    for i, t in enumerate(tables[1:], start=1):
        for name in t.column_names:
            a, b = first.field(name).type, t.schema.field(name).type
            if a == b:
                continue
            try:
                pa.concat_tables(
                    [tables[0].select([name]), t.select([name])], promote_options="permissive"
                )
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                return (
                    f"{src.paths[i]}: column {name!r} has type {b}, but {src.paths[0].name} "
                    f"has {a}: the files of one dataset need compatible types (write them alike)"
                )
    return f"{src.label}: the files' answer columns have incompatible types ({exc})"


def _shared_note(src: Source, seen: dict[Any, list[int]]) -> list[str]:
    shared = {v: f for v, f in seen.items() if len(f) > 1}
    if not shared:
        return []
    files = sorted({k for f in shared.values() for k in f})
    names = ", ".join(src.paths[k].name for k in files[:4]) + (" ..." if len(files) > 4 else "")
    some = ", ".join(repr(v) for v in list(shared)[:3])
    steps = [k for k in files if _STEP_NAME.search(src.paths[k].name)]
    advice = (
        # files named as steps: the likely intent is one step a file
        "these files are named as steps: `grpo-cli trend` gives one row a step, and "
        "--group-scope file keeps each file's groups its own"
        if len(steps) > 1
        else "with one step per file, pass --group-scope file"
    )
    return [
        f"{len(shared)} group id(s) ({some}{' ...' if len(shared) > 3 else ''}) appear in "
        f"more than one file ({names}): each is read as one group across files "
        f"(--group-scope dataset, right when the shards of one step split a group); {advice}"
    ]


_STEP_NAME = re.compile(r"step[_\-]?\d+", re.IGNORECASE)


def _float_column(
    col: pa.ChunkedArray | pa.Array, src: Source, name: str, allow_nonfinite: bool = False
) -> F64:
    label, what, unit = src.label, src.reader.what, src.reader.unit
    t = col.type
    if pa.types.is_decimal(t):  # duckdb writes VALUES literals as DECIMAL
        col = col.cast(pa.float64())
        t = col.type
    if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t)):
        raise InputError(f"{label}: {what} {name!r} has type {t}, expected numbers")
    if col.null_count:
        row = int(null_rows(col)[0])
        raise InputError(f"{label}: {what} {name!r} is null at {unit} {row}")
    flat = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    x = np.asarray(numpy_of(flat), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size and not allow_nonfinite:
        raise InputError(
            f"{label}: {what} {name!r} has non-finite value {x[bad[0]]} at {unit} {int(bad[0])}"
        )
    return x
