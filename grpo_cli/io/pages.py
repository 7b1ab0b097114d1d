"""Parquet list columns decoded page by page into preallocated numpy arrays.

pyarrow decodes one list value at once (its levels, its values and their growth), so a
single answer of tens of millions of tokens costs several times its values to read. This
decoder reads one column chunk of one row group a page at a time and writes the values
straight into an array sized by the chunk's own ``num_values`` (an upper bound: levels
count every value and every empty list), with int64 row offsets from the repetition
levels: memory is the chunk's values plus one page (compressed and decompressed).

Formats, as the Apache Parquet format specification (apache/parquet-format, 2.10:
``parquet.thrift``, ``Encodings.md``) defines them:

- page headers in the Thrift compact protocol: ``DATA_PAGE``, ``DATA_PAGE_V2``,
  ``DICTIONARY_PAGE``; any other page (``INDEX_PAGE``) skipped by its size, unknown
  fields skipped by their type;
- levels in the RLE / bit-packed hybrid (V1: a 4-byte length first; V2: lengths in the
  header, never compressed);
- values ``PLAIN``, ``PLAIN_DICTIONARY`` / ``RLE_DICTIONARY`` (a bit width byte, then
  hybrid indices) and ``BYTE_STREAM_SPLIT``; physical types FLOAT, DOUBLE, INT32, INT64,
  BOOLEAN, cast to the Arrow schema's value type (int8, uint16, ... as pyarrow reads them);
- codecs through ``pyarrow.Codec``: uncompressed, snappy, gzip, brotli, zstd, lz4_raw.

Anything else (another encoding, the hadoop LZ4 codec, a null list or a null element, a
nested or non-numeric layout) is :class:`NotHandled`: the caller reads with pyarrow, and
the result is the same either way. Corrupt bytes are an :class:`~grpo_cli.errors.InputError`
naming the file, column and row group; every size is bounded by the chunk's metadata
before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from ..errors import InputError
from .arrow import why
from .paths import InputPath, RemoteFile

__all__ = ["ENABLED", "NotHandled", "PageColumn", "read_list_columns"]

# Off: every row group is read by pyarrow (the tests compare both ways).
ENABLED = True

I64 = NDArray[np.int64]

# PageType and Encoding of parquet.thrift
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY, BYTE_STREAM_SPLIT = 0, 2, 3, 8, 9
PHYSICAL: dict[str, np.dtype] = {
    "FLOAT": np.dtype("<f4"),
    "DOUBLE": np.dtype("<f8"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "BOOLEAN": np.dtype(np.bool_),
}
CODECS = {
    "UNCOMPRESSED": None,
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "BROTLI": "brotli",
    "ZSTD": "zstd",
    "LZ4_RAW": "lz4_raw",
}
HEADER_READ = 1 << 16  # bytes read for a page header first (more if it needs them)
HEADER_MAX = 1 << 24  # a page header longer than this is corrupt
BLOCK = 1 << 20  # dictionary indices unpacked at once


class NotHandled(Exception):
    """A layout, encoding or codec this decoder does not read: read it with pyarrow."""


class Corrupt(Exception):
    """Bytes that contradict the format or the chunk's metadata (what is wrong)."""


# ---- Thrift compact protocol (the Apache Thrift compact protocol specification)
class Thrift:
    """A reader of compact-protocol structs in ``buf`` from ``pos``: a struct is a dict
    of field id to value (a nested struct a dict, a list a list)."""

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise EOFError
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        out, shift = 0, 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise Corrupt("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        if depth > 16:
            raise Corrupt("structs nested too deep")
        out: dict[int, Any] = {}
        fid = 0
        while True:
            head = self.byte()
            if head == 0:
                return out
            delta, t = head >> 4, head & 0x0F
            fid = fid + delta if delta else self.zigzag()
            out[fid] = self.value(t, depth)

    def value(self, t: int, depth: int) -> Any:
        if t in (1, 2):  # a boolean field: its value is the type
            return t == 1
        if t == 3:
            return self.byte()
        if t in (4, 5, 6):
            return self.zigzag()
        if t == 7:
            self.pos += 8
            return None
        if t == 8:
            n = self.varint()
            if self.pos + n > len(self.buf):
                raise EOFError
            self.pos += n
            return None
        if t in (9, 10):
            head = self.byte()
            n, et = head >> 4, head & 0x0F
            if n == 15:
                n = self.varint()
            if n > len(self.buf):
                raise Corrupt(f"a list of {n} elements")
            return [self.bool_elem() if et in (1, 2) else self.value(et, depth) for _ in range(n)]
        if t == 11:
            n = self.varint()
            if n > len(self.buf):
                raise Corrupt(f"a map of {n} entries")
            kv = self.byte() if n else 0
            for _ in range(n):
                self.value(kv >> 4, depth)
                self.value(kv & 0x0F, depth)
            return None
        if t == 12:
            return self.struct(depth + 1)
        raise Corrupt(f"Thrift type {t}")

    def bool_elem(self) -> bool:
        return self.byte() == 1


# ---- the RLE / bit-packed hybrid
@dataclass
class Runs:
    """A hybrid stream of ``n`` values: constant runs ``(start, count, value)`` and the
    bit-packed ones unpacked (``packed``: ``(start, values)``), never a value a position
    for a long run."""

    n: int
    constant: list[tuple[int, int, int]]
    packed: list[tuple[int, np.ndarray]]

    def where(self, test: Any) -> I64:
        """Positions whose value passes ``test`` (a vectorised predicate), in order."""
        parts = []
        for start, count, v in self.constant:
            if test(np.int64(v)):
                parts.append((start, np.arange(start, start + count, dtype=np.int64)))
        for start, vals in self.packed:
            parts.append((start, np.flatnonzero(test(vals)).astype(np.int64) + start))
        parts.sort(key=lambda p: p[0])
        return np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)


def unpack(raw: NDArray[np.uint8], width: int, count: int) -> np.ndarray:
    """``count`` values of ``width`` (<= 32) bits packed LSB first (the hybrid's bit-packed
    runs): value ``i`` is bits ``i·width ...`` of the little-endian bytes, gathered from
    the five bytes it can span, vectorised (no loop a value)."""
    pad = np.zeros(raw.size + 8, np.uint8)
    pad[: raw.size] = raw
    bit = np.arange(count, dtype=np.int64) * width
    at, shift = bit >> 3, (bit & 7).astype(np.uint64)
    word = pad[at].astype(np.uint64)
    for j in range(1, (width + 7 + 7) // 8):
        word |= pad[at + j].astype(np.uint64) << np.uint64(8 * j)
    vals = (word >> shift) & np.uint64((1 << width) - 1)
    return vals.astype(np.uint8 if width <= 8 else np.uint16 if width <= 16 else np.uint32)


def u8(buf: Any) -> memoryview:
    """Bytes of a buffer as unsigned (a pyarrow buffer's memoryview is signed)."""
    return memoryview(np.frombuffer(buf, np.uint8))  # type: ignore[arg-type]


def runs(buf: memoryview, width: int, n: int) -> Iterator[tuple[int, int, int, int]]:
    """The runs of the first ``n`` values of a hybrid stream of ``width``-bit values in
    ``buf``: ``(start, count, value, -1)`` for an RLE run, ``(start, count, byte, bytes)``
    for a bit-packed one."""
    if width > 32:
        raise Corrupt(f"a bit width of {width}")
    t = Thrift(buf)  # type: ignore[arg-type]
    nbytes = (width + 7) // 8
    got = 0
    while got < n:
        head = t.varint()
        if head & 1:
            size = (head >> 1) * width
            if t.pos + size > len(buf) or size == 0:
                raise Corrupt("a bit-packed run past the end of its levels or values")
            take = min((head >> 1) * 8, n - got)
            yield got, take, t.pos, size
            t.pos += size
        else:
            take = min(head >> 1, n - got)
            if t.pos + nbytes > len(buf) or take == 0:
                raise Corrupt("an RLE run past the end of its levels or values")
            yield got, take, int.from_bytes(buf[t.pos : t.pos + nbytes], "little"), -1
            t.pos += nbytes
        got += take


def unpacked(buf: memoryview, width: int, pieces: list[tuple[int, int, int, int]]) -> np.ndarray:
    """The bit-packed runs ``pieces`` of ``buf`` unpacked at once (their bytes joined)."""
    raw = np.frombuffer(buf, np.uint8)
    joined = np.concatenate([raw[p : p + s] for _, _, p, s in pieces])
    return unpack(joined, width, len(joined) * 8 // width)


def hybrid(buf: memoryview, width: int, n: int) -> Runs:
    """The first ``n`` values of a hybrid stream (levels) as runs."""
    if width == 0:
        return Runs(n, [(0, n, 0)], [])
    constant: list[tuple[int, int, int, int]] = []
    pieces: list[tuple[int, int, int, int]] = []
    for r in runs(buf, width, n):
        (pieces if r[3] >= 0 else constant).append(r)
    packed = []
    if pieces:
        vals, at = unpacked(buf, width, pieces), 0
        for start, take, _, size in pieces:
            packed.append((start, vals[at : at + take]))
            at += size * 8 // width
    return Runs(n, [(s, c, v) for s, c, v, _ in constant], packed)


def hybrid_take(buf: memoryview, width: int, dictionary: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = dictionary[index i]`` for the hybrid stream of indices in ``buf``, a
    block of about :data:`BLOCK` indices at a time (an index is never held a page)."""
    size = dictionary.size

    def flush(pieces: list[tuple[int, int, int, int]]) -> None:
        vals = unpacked(buf, width, pieces)
        keep, ends, at = [], [], 0
        for start, take, _, nb in pieces:
            keep.append(vals[at : at + take])
            ends.append((start, take))
            at += nb * 8 // width
        idx = np.concatenate(keep) if len(keep) > 1 else keep[0]
        if idx.size and int(idx.max()) >= size:
            raise Corrupt(f"a dictionary index beyond its {size} values")
        first, last = ends[0][0], ends[-1][0] + ends[-1][1]
        if last - first == idx.size:  # the runs are consecutive: one take
            np.take(dictionary, idx, out=out[first:last])
        else:
            where = np.concatenate([np.arange(s0, s0 + t0) for s0, t0 in ends])
            out[where] = dictionary[idx]

    if width == 0:
        if out.size and not size:
            raise Corrupt("dictionary indices into an empty dictionary")
        out[:] = dictionary[0] if out.size else 0
        return
    pieces: list[tuple[int, int, int, int]] = []
    held = 0
    for r in runs(buf, width, out.size):
        start, take, v, nb = r
        if nb < 0:
            if v >= size:
                raise Corrupt(f"a dictionary index beyond its {size} values")
            out[start : start + take] = dictionary[v]
            continue
        pieces.append(r)
        held += take
        if held >= BLOCK:
            flush(pieces)
            pieces, held = [], 0
    if pieces:
        flush(pieces)


def bit_width(n: int) -> int:
    return int(n).bit_length()


# ---- a column chunk
@dataclass(frozen=True)
class PageColumn:
    """One list column of one row group: flat values (the Arrow value type) and int64
    offsets, ``num_rows + 1`` of them."""

    offsets: I64
    values: np.ndarray
    type: pa.DataType

    def array(self) -> pa.Array:
        """The column as pyarrow reads it: a list (large list beyond int32) array over the
        numpy buffers (values zero copy)."""
        vals = pa.array(self.values)
        if vals.type != self.type.value_type:
            vals = vals.cast(self.type.value_type)
        if pa.types.is_large_list(self.type):
            return pa.LargeListArray.from_arrays(pa.array(self.offsets), vals, type=self.type)
        if int(self.offsets[-1]) > np.iinfo(np.int32).max:
            return pa.LargeListArray.from_arrays(pa.array(self.offsets), vals)
        offsets = pa.array(self.offsets.astype(np.int32))
        return pa.ListArray.from_arrays(offsets, vals, type=self.type)


@dataclass(frozen=True)
class Layout:
    """What a column chunk's levels mean: definition level of a present value and of an
    empty list, whether repetition levels exist."""

    leaf: int
    dtype: np.dtype
    max_def: int
    empty: int
    value_type: pa.DataType
    list_type: pa.DataType


def layout(pf: pq.ParquetFile, name: str) -> Layout:
    """The leaf column of list column ``name`` and its levels; :class:`NotHandled` for
    anything but a list of numbers or booleans with one leaf."""
    field = pf.schema_arrow.field(name)
    t = field.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        raise NotHandled(f"type {t}")
    vt = t.value_type
    if not (pa.types.is_integer(vt) or pa.types.is_floating(vt) or pa.types.is_boolean(vt)):
        raise NotHandled(f"values {vt}")
    schema = pf.schema
    leaves = [i for i in range(len(schema)) if schema.column(i).path.split(".")[0] == name]
    if len(leaves) != 1:
        raise NotHandled("not one leaf")
    col = schema.column(leaves[0])
    dtype = PHYSICAL.get(col.physical_type)
    if dtype is None or col.max_repetition_level != 1 or pa.types.is_float16(vt):
        raise NotHandled(f"{col.physical_type}, repetition {col.max_repetition_level}")
    max_def = col.max_definition_level
    empty = max_def - 1 - int(t.value_field.nullable)
    if empty < 0:
        raise NotHandled("levels")
    return Layout(leaves[0], np.dtype(dtype), max_def, empty, vt, t)


class Chunk:
    """The pages of one column chunk, read from ``f`` a page at a time."""

    def __init__(self, f: Any, start: int, size: int, codec: str | None) -> None:
        self.f, self.pos, self.end = f, start, start + size
        self.codec = pa.Codec(codec) if codec else None
        self.lz4 = False

    def header(self) -> dict[int, Any]:
        want = min(HEADER_READ, self.end - self.pos)
        while True:
            buf = self.f.read_at(want, self.pos)
            try:
                t = Thrift(buf)
                h = t.struct()
            except EOFError:
                if want >= self.end - self.pos or want >= HEADER_MAX:
                    raise Corrupt("a page header past the end of the column chunk") from None
                want = min(want * 16, self.end - self.pos, HEADER_MAX)
                continue
            self.pos += t.pos
            return h

    def body(self, h: dict[int, Any], plain: int = 0, compressed: bool = True) -> tuple[Any, Any]:
        """The page after its header: its first ``plain`` bytes as they are (V2 levels),
        the rest decompressed; each size checked against the chunk before reading."""
        usize, csize = h.get(2, -1), h.get(3, -1)
        if not 0 <= csize <= self.end - self.pos or usize < 0:
            raise Corrupt(f"a page of {csize} bytes past the end of the column chunk")
        if not 0 <= plain <= min(csize, usize):
            raise Corrupt(f"levels of {plain} bytes in a page of {csize}")
        self.f.seek(self.pos)
        # numpy's memory (malloc), not pyarrow's pool: a freed page goes back to the system
        # at once, where jemalloc would keep it (a page of 200 MB held after its column)
        raw = np.empty(csize, np.uint8)
        got = self.f.readinto(raw) if csize else 0
        self.pos += csize
        if got != csize:
            raise Corrupt("the file ends inside a page")
        head, rest = raw[:plain], raw[plain:]
        if self.codec is None or not compressed:
            if usize != csize:
                raise Corrupt(f"an uncompressed page of {csize} bytes says {usize}")
            return head, rest
        if usize - plain > 1024 * max(csize, 1 << 10):
            raise Corrupt(f"a page of {usize} bytes decompressed from {csize}")
        levels = head.tobytes()  # small: the compressed page is freed at once
        del head, raw
        try:
            out = self.codec.decompress(
                rest, decompressed_size=usize - plain, memory_pool=pa.system_memory_pool()
            )
        except (OSError, ValueError, pa.ArrowException) as exc:
            if self.lz4:
                raise NotHandled("LZ4 (hadoop framing)") from None
            raise Corrupt(f"cannot decompress a page ({why(exc)})") from None
        return levels, out

    def skip(self, h: dict[int, Any]) -> None:
        csize = h.get(3, -1)
        if not 0 <= csize <= self.end - self.pos:
            raise Corrupt(f"a page of {csize} bytes past the end of the column chunk")
        self.pos += csize


def plain(buf: Any, at: int, dtype: np.dtype, k: int) -> np.ndarray:
    """``k`` PLAIN values of ``dtype`` in ``buf`` from byte ``at`` (booleans: bits, LSB
    first)."""
    raw = np.frombuffer(buf, np.uint8)
    if dtype == np.bool_:
        need = (k + 7) // 8
        if at + need > len(raw):
            raise Corrupt(f"{k} values in a page of {len(raw)} bytes")
        return np.unpackbits(raw[at : at + need], bitorder="little")[:k].view(np.bool_)
    need = k * dtype.itemsize
    if at + need > len(raw):
        raise Corrupt(f"{k} values in a page of {len(raw)} bytes")
    return raw[at : at + need].view(dtype)


def split(buf: Any, at: int, dtype: np.dtype, k: int) -> np.ndarray:
    """``k`` BYTE_STREAM_SPLIT values: byte ``j`` of every value in stream ``j``."""
    if dtype == np.bool_:
        raise NotHandled("BYTE_STREAM_SPLIT booleans")
    w = dtype.itemsize
    raw = np.frombuffer(buf, np.uint8)
    if at + k * w > len(raw):
        raise Corrupt(f"{k} values in a page of {len(raw)} bytes")
    return raw[at : at + k * w].reshape(w, k).T.copy().view(dtype).reshape(k)


@dataclass
class Into:
    """Where a chunk's pages land: values and row starts so far."""

    values: np.ndarray
    starts: list[I64]
    levels: int = 0
    n: int = 0
    dictionary: np.ndarray | None = None


def dictionary_page(chunk: Chunk, h: dict[int, Any], lay: Layout, into: Into) -> None:
    d = h.get(7) or {}
    n = d.get(1, -1)
    if d.get(2, PLAIN) not in (PLAIN, PLAIN_DICTIONARY):
        raise NotHandled(f"dictionary encoding {d.get(2)}")
    _, buf = chunk.body(h)
    if not 0 <= n <= len(buf):
        raise Corrupt(f"a dictionary of {n} values in {len(buf)} bytes")
    into.dictionary = plain(buf, 0, lay.dtype, n)  # a view of the page


def data_page(chunk: Chunk, h: dict[int, Any], lay: Layout, into: Into) -> None:
    """A V1 or V2 data page: its levels to row starts and holes (empty lists), its
    values into ``into``."""
    v2 = h.get(1) == DATA_PAGE_V2
    d = h.get(8 if v2 else 5) or {}
    k, enc = d.get(1, -1), d.get(4 if v2 else 2, -1)
    if not 0 <= k <= into.values.size - into.levels:
        raise Corrupt(f"a page of {k} values beyond the column chunk's {into.values.size}")
    if v2:
        rlen, dlen = d.get(6, -1), d.get(5, -1)
        if rlen < 0 or dlen < 0:
            raise Corrupt("a V2 page without level lengths")
        head, buf = chunk.body(h, rlen + dlen, bool(d.get(7, True)))
        hm = u8(head)
        rep, dfn, at = hm[:rlen], hm[rlen : rlen + dlen], 0
    else:
        if d.get(3, RLE) != RLE or d.get(4, RLE) != RLE:
            raise NotHandled("BIT_PACKED levels")
        _, buf = chunk.body(h)
        bm = u8(buf)
        rep, at = prefixed(bm, 0)
        dfn, at = prefixed(bm, at) if lay.max_def else (bm[at:at], at)
    rep_runs = hybrid(rep, 1, k)
    def_runs = hybrid(dfn, bit_width(lay.max_def), k)
    starts = rep_runs.where(lambda x: x == 0)
    holes = def_runs.where(lambda x: x != lay.max_def)
    if holes.size and def_runs.where(lambda x: x == lay.empty).size != holes.size:
        raise NotHandled("null lists or null elements")
    kv = k - holes.size
    into.starts.append(into.n + starts - np.searchsorted(holes, starts))
    got = page_values(buf, at, enc, lay, into, kv)
    if got.base is not into.values:  # dictionary indices write in place
        into.values[into.n : into.n + kv] = got
    into.levels += k
    into.n += kv


def prefixed(buf: memoryview, at: int) -> tuple[memoryview, int]:
    """V1 levels: a 4-byte little-endian length, then the hybrid stream."""
    if at + 4 > len(buf):
        raise Corrupt("levels past the end of the page")
    n = int.from_bytes(buf[at : at + 4], "little")
    if at + 4 + n > len(buf):
        raise Corrupt(f"levels of {n} bytes past the end of the page")
    return buf[at + 4 : at + 4 + n], at + 4 + n


def page_values(buf: Any, at: int, enc: int, lay: Layout, into: Into, k: int) -> np.ndarray:
    if enc == PLAIN:
        return plain(buf, at, lay.dtype, k)
    if enc == BYTE_STREAM_SPLIT:
        return split(buf, at, lay.dtype, k)
    if enc == RLE and lay.dtype == np.bool_:
        return rle_booleans(u8(buf), at, k)
    if enc not in (PLAIN_DICTIONARY, RLE_DICTIONARY):
        raise NotHandled(f"encoding {enc}")
    if into.dictionary is None:
        raise Corrupt("dictionary indices without a dictionary page")
    bm = u8(buf)
    out = into.values[into.n : into.n + k]
    if k:
        if at >= len(bm):
            raise Corrupt("dictionary indices past the end of the page")
        hybrid_take(bm[at + 1 :], bm[at], into.dictionary, out)
    return out


def rle_booleans(buf: memoryview, at: int, k: int) -> np.ndarray:
    """``k`` booleans RLE-encoded (bit width 1, a 4-byte length first: V2 pages)."""
    stream, _ = prefixed(buf, at)
    out = np.empty(k, np.bool_)
    r = hybrid(stream, 1, k)
    for start, count, v in r.constant:
        out[start : start + count] = bool(v)
    for start, vals in r.packed:
        out[start : start + len(vals)] = vals.astype(np.bool_)
    return out


def column_chunk(f: Any, md: Any, lay: Layout, rows: int) -> tuple[I64, np.ndarray]:
    """Offsets and values of one column chunk (``md``: its metadata), a page at a time."""
    n = md.num_values
    codec = md.compression
    if codec not in CODECS and codec != "LZ4":
        raise NotHandled(f"codec {codec}")
    limit = 64 * max(md.total_uncompressed_size, 1 << 20) // max(lay.dtype.itemsize, 1)
    if not 0 <= n <= limit or rows < 0:
        raise NotHandled(f"{n} values in {md.total_uncompressed_size} bytes")
    start = md.dictionary_page_offset if md.has_dictionary_page else md.data_page_offset
    if start is None or start < 0 or md.total_compressed_size < 0:
        raise Corrupt("a column chunk without pages")
    chunk = Chunk(f, start, md.total_compressed_size, CODECS.get(codec, "lz4_raw"))
    chunk.lz4 = codec == "LZ4"
    into = Into(np.empty(n, lay.dtype), [])
    while into.levels < n:
        if chunk.pos >= chunk.end:
            raise Corrupt(f"the column chunk ends after {into.levels} of its {n} values")
        h = chunk.header()
        kind = h.get(1)
        if kind == DICTIONARY_PAGE:
            dictionary_page(chunk, h, lay, into)
        elif kind in (DATA_PAGE, DATA_PAGE_V2):
            data_page(chunk, h, lay, into)
        else:
            chunk.skip(h)
    starts = np.concatenate(into.starts) if into.starts else np.zeros(0, np.int64)
    if starts.size != rows or (rows and starts[0] != 0):
        raise Corrupt(f"levels of {starts.size} rows in a row group of {rows}")
    offsets = np.append(starts, np.int64(into.n))
    return offsets, into.values[: into.n]


def open_file(p: InputPath) -> Any:
    if isinstance(p, RemoteFile):
        return p.fs.open_input_file(p.path)
    return pa.OSFile(str(p))


def read_list_columns(
    p: InputPath, pf: pq.ParquetFile, rg: int, names: list[str]
) -> dict[str, PageColumn]:
    """List columns ``names`` of row group ``rg`` of ``p`` (``pf``: its reader), decoded
    page by page. Raises :class:`NotHandled` (read them with pyarrow) or
    :class:`~grpo_cli.errors.InputError` (corrupt bytes)."""
    lays = {name: layout(pf, name) for name in names}
    rgm = pf.metadata.row_group(rg)
    out = {}
    try:
        f = open_file(p)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{p}: cannot read as parquet ({why(exc)})") from None
    with f:
        for name, lay in lays.items():
            try:
                offsets, values = column_chunk(f, rgm.column(lay.leaf), lay, rgm.num_rows)
            except Corrupt as exc:
                raise InputError(
                    f"{p}: column {name!r}, row group {rg}: corrupt pages ({exc}); rewrite the file"
                ) from None
            except (OSError, pa.ArrowException) as exc:
                raise InputError(
                    f"{p}: column {name!r}, row group {rg}: cannot read ({why(exc)})"
                ) from None
            if values.dtype != lay.value_type.to_pandas_dtype() and not pa.types.is_boolean(
                lay.value_type
            ):
                values = values.astype(lay.value_type.to_pandas_dtype())
            out[name] = PageColumn(offsets, values, lay.list_type)
    return out
