"""Bounded reading of outside JSON: every JSON or JSON-lines file grpo-cli reads (a recorded
run's ``meta.json`` and ``metrics.jsonl``, ``trainer_state.json`` and other ``--logged``
files, a micro-batch file's ``grpo_cli`` metadata, JSONL and NeMo-RL dumps) passes here
before a parser sees its bytes.

The limits, each checked by a cheap scan of the bytes (no parser involved), and each
refusal one line naming the file and the line:

- :data:`MAX_DEPTH`: arrays and objects nested at most this deep. pyarrow's JSON parser
  recurses once per level and kills the process (SIGSEGV) on a line of 20,000 ``[``;
  Python's raises RecursionError. grpo-cli's own files nest 3 levels deep (NeMo-RL's
  ``[[...]]`` inside a line's object), so the limit leaves room without risk.
- :data:`MAX_LINE`: one line of a JSONL or NeMo-RL dump, parsed into arrays by pyarrow.
  Its text is held whole with the arrays it becomes and their checks (a 64 MiB line of
  one token field, 13M tokens, peaks at 0.55 GB in ``objective``), so this bounds the
  memory of one answer: a longer answer goes in parquet.
- :data:`MAX_DOCUMENT`: a JSON document or line read into Python objects (``meta.json``,
  a metrics line, ``trainer_state.json``, a file's metadata), which take about ten times
  their text.

Only regular files are read where a file is expected (:func:`regular`): a FIFO would
block, a device such as ``/dev/zero`` never ends. An integer beyond float's range
(``10**400``, 5,000 digits; Python's ``json`` reads it as an int that ``float()`` cannot
take) is read as a :class:`BeyondFloat`, which its reader turns into a null with a warning.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT",
    "MAX_LINE",
    "BeyondFloat",
    "check_depth",
    "loads",
    "mib",
    "read_document",
    "regular",
]

MAX_DEPTH = 64
"""Arrays and objects nested at most this deep in any JSON line or document."""

MAX_LINE = 64 << 20
"""Bytes of one JSONL or NeMo-RL line (one answer), parsed by pyarrow: 64 MiB."""

MAX_DOCUMENT = 64 << 20
"""Bytes of one JSON document or line read into Python objects: 64 MiB."""

# a window of the structural bytes scanned at once (bounded work arrays)
_WINDOW = 1 << 20
_KEEP = b'[]{}"\n'
_DROP = bytes(sorted(set(range(256)) - set(_KEEP)))
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


class BeyondFloat:
    """A JSON integer too large for a float (``10**400``): read as this, then null."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits, beyond float>"


def _int(text: str) -> int | BeyondFloat:
    """A JSON integer: an int when a float can hold it, else :class:`BeyondFloat`."""
    digits = len(text.lstrip("-"))
    if digits > 310:  # 1.8e308 has 309 digits; beyond, no float (and no slow int parse)
        return BeyondFloat(digits)
    v = int(text)
    try:
        float(v)
    except OverflowError:
        return BeyondFloat(digits)
    return v


def regular(path: Path, what: str = "file") -> os.stat_result:
    """The ``stat`` of ``path``, refused unless it is a regular file (it is not opened:
    opening a FIFO blocks until someone writes to it)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a directory" if stat.S_ISDIR(st.st_mode)
            else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file"
        )  # fmt: skip
        raise InputError(f"{path}: {kind}, not a regular file: give the {what} itself")
    return st


def read_document(path: Path, what: str = "file", limit: int = MAX_DOCUMENT) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (refused beyond,
    naming the limit; the file is not read further)."""
    regular(path, what)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise InputError(
            f"{path}: the {what} is larger than {mib(limit)}, grpo-cli's limit for a JSON "
            "document read whole"
        )
    return data


def check_depth(data: bytes | bytearray, label: str, line0: int = 1) -> int:
    """Refuse ``data`` (JSON text, one or several lines) when a line nests arrays or objects
    deeper than :data:`MAX_DEPTH`, naming its line (``line0``: the number of ``data``'s
    first line in the file). Brackets inside strings do not count. Returns the newlines of
    ``data``. The scan keeps only the bracket, quote and newline bytes (escaped quotes and
    backslashes removed first), then follows each line's depth with running sums."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    s = np.frombuffer(data.translate(None, _DROP), dtype=np.uint8)
    newlines = 0
    depth0 = quote0 = 0  # the unfinished line's depth and string parity at a window's start
    for lo in range(0, s.shape[0], _WINDOW):
        w = s[lo : lo + _WINDOW]
        nl = w == ord("\n")
        line = np.cumsum(nl)
        ends = np.flatnonzero(nl)
        qc = np.cumsum(w == ord('"')) + quote0
        qbase = np.concatenate(([0], qc[ends]))[line]
        outside = ((qc - qbase) & 1) == 0
        d = _STEP[w].astype(np.int64) * outside
        dc = np.cumsum(d) + depth0
        depth = dc - np.concatenate(([0], dc[ends]))[line]
        if depth.shape[0] and int(depth.max()) > MAX_DEPTH:
            at = line0 + newlines + int(line[int(np.argmax(depth > MAX_DEPTH))])
            raise InputError(
                f"{label}: line {at}: JSON nested deeper than {MAX_DEPTH} levels (grpo-cli's "
                "limit; its formats nest 3): not read"
            )
        if w.shape[0]:
            depth0 = int(depth[-1])
            quote0 = int((qc[-1] - qbase[-1]) & 1)
        newlines += int(ends.shape[0])
    return newlines


def loads(data: bytes, label: str, line: int | None = None) -> Any:
    """One JSON document (or line ``line`` of a file), read into Python objects within the
    limits: UTF-8, :data:`MAX_DOCUMENT` bytes, :data:`MAX_DEPTH` levels; an integer beyond
    float as a :class:`BeyondFloat`. Any refusal names ``label`` and the line."""
    at = f"{label}: line {line}" if line is not None else label
    if len(data) > MAX_DOCUMENT:
        raise InputError(f"{at}: longer than {mib(MAX_DOCUMENT)} (grpo-cli's limit): not read")
    check_depth(data, label, line or 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{at}: not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text, parse_int=_int)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}" if line is None else f"column {exc.colno}"
        raise InputError(f"{at}: not JSON ({exc.msg} at {where})") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept as a line, not a crash
        raise InputError(f"{at}: JSON nested too deeply") from None
