"""What the JSON-lines readers share (grpo-cli's JSONL, :mod:`.jsonl`, and NeMo-RL's dumps,
:mod:`.nemo_rl`): the file read a chunk of whole lines at a time, within the limits of
:mod:`grpo_cli.io.bounded` (a line of at most :data:`~grpo_cli.io.bounded.MAX_LINE` bytes,
nested at most :data:`~grpo_cli.io.bounded.MAX_DEPTH` deep, checked on the bytes before
pyarrow's parser sees them), each chunk parsed by pyarrow's JSON reader against an
explicit schema, and pyarrow's errors as lines naming the file, the row and the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj

from ...errors import InputError
from ..arrow import why
from ..bounded import MAX_LINE, check_depth, mib, regular
from ..fields import FLAG_FIELDS, TOKEN_VALUES
from ..lists import is_list
from ..paths import InputPath, RemoteFile

__all__ = [
    "PASS1_BYTES",
    "SUFFIXES",
    "chunk_bytes",
    "chunks",
    "count_rows",
    "file_size",
    "head",
    "json_type",
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


def chunk_bytes(batch_tokens: int) -> int:
    """Bytes of text a chunk holds for a batch of about ``batch_tokens`` tokens."""
    return int(min(CHUNK_MAX, max(CHUNK_MIN, batch_tokens * BYTES_PER_TOKEN)))


def open_stream(p: InputPath) -> pa.NativeFile:
    """A byte stream of ``p`` (a regular file), decompressed by its name (``.gz``)."""
    if isinstance(p, Path):
        regular(p)
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


def _too_long(label: str, line: int) -> InputError:
    return InputError(
        f"{label}: line {line} is longer than {mib(MAX_LINE)}, grpo-cli's limit for one "
        "JSON line (one answer): not read; write answers this long as parquet"
    )


def chunks(p: InputPath, size: int) -> Iterator[pa.Buffer]:
    """The text of ``p`` as runs of whole lines of about ``size`` bytes (a longer line
    whole, with what precedes it in its block), in order; the last line needs no
    newline. A line longer than :data:`MAX_LINE` or nested deeper than ``MAX_DEPTH`` is
    refused, naming its line, before anything parses it."""
    label = str(p)
    line = 1  # the file's line number of the next chunk's first line
    pending = bytearray()  # the unfinished line at the end of the blocks so far
    # a line within one block is within the limit: only lines across blocks are measured
    for block in _blocks(p, min(size, MAX_LINE)):
        cut = block.rfind(b"\n")
        if cut < 0:
            pending += block
            if len(pending) > MAX_LINE:
                raise _too_long(label, line)
            continue
        if len(pending) + block.find(b"\n") > MAX_LINE:
            raise _too_long(label, line)
        data: bytes | bytearray = block
        end = cut + 1
        if pending:
            pending += block
            data, end = pending, len(pending) - (len(block) - cut - 1)
        line += check_depth(data, label, line)  # the unfinished tail too: harmless
        pending = bytearray(data[end:]) if end < len(data) else bytearray()
        yield pa.py_buffer(data).slice(0, end)
    if pending.strip():
        check_depth(pending, label, line)
        yield pa.py_buffer(pending)


def head(p: InputPath, limit: int) -> bytearray:
    """The first non-blank line of ``p``, or its first ``limit`` bytes when it is longer
    (b"" for a blank file)."""
    got = bytearray()  # grown in place: at most ``limit`` and a block held
    for block in _blocks(p, min(limit, 1 << 20)):
        if not got:
            block = block.lstrip()
        if not block:
            continue
        cut = block.find(b"\n")
        got += block if cut < 0 else block[:cut]
        if cut >= 0 or len(got) >= limit:
            break
    del got[limit:]
    return got


def count_rows(p: InputPath) -> int:
    """The answers of ``p``: its non-blank lines (what the JSON reader reads as rows)."""
    n = 0
    for buf in chunks(p, PASS1_BYTES):
        n += sum(1 for line in buf.to_pybytes().split(b"\n") if line.strip())
    return n


def parse(buf: pa.Buffer, schema: pa.Schema, label: str, row0: int, what: str) -> pa.RecordBatch:
    """A chunk of whole lines (from :func:`chunks`: within the limits) as one record batch
    of ``schema`` (keys not in it skipped, keys missing from a line null). ``row0``: the
    file's row of its first line, for messages, which name a field a ``what``."""
    ro = pj.ReadOptions(use_threads=False, block_size=max(buf.size + 1, 1 << 16))
    po = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(pa.BufferReader(buf), read_options=ro, parse_options=po)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _parse_error(label, exc, row0, what) from None
    except UnicodeDecodeError:
        raise _not_utf8(label, row0) from None
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
    """The keys of the first line of ``p``, in order, with the types pyarrow infers (the
    line checked against the limits first)."""
    line = head(p, MAX_LINE + 1)
    if not line.strip():
        raise InputError(f"{p}: no answers (the file is empty)")
    if len(line) > MAX_LINE:
        raise InputError(
            f"{p}: the first answer's line is longer than {mib(MAX_LINE)}, grpo-cli's limit "
            "for one JSON line (one answer): not read; write answers this long as parquet"
        )
    check_depth(line, str(p), 1)
    buf = pa.py_buffer(line)
    try:
        ro = pj.ReadOptions(use_threads=False, block_size=max(buf.size + 1, 1 << 16))
        table = pj.read_json(pa.BufferReader(buf), read_options=ro)
        return {f.name: f.type for f in table.schema}
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _parse_error(str(p), exc, 0, "field") from None
    except UnicodeDecodeError:  # a key of bytes that are not UTF-8
        raise _not_utf8(str(p), 0) from None


def _not_utf8(label: str, row0: int) -> InputError:
    return InputError(f"{label}: a row from {row0} on holds text that is not UTF-8")


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


def file_size(p: InputPath) -> int:
    """The file's size in bytes (0 when it cannot be told): what plans balance."""
    try:
        if isinstance(p, RemoteFile):
            return int(p.fs.get_file_info(p.path).size or 0)
        return p.stat().st_size
    except Exception:  # a size is only an estimate for plans
        return 0
