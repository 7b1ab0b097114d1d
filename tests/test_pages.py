"""The page-level parquet decoder (grpo_cli/io/pages.py): every list column it reads
equals pyarrow's ``read_row_group`` exactly, over files pyarrow writes with every codec,
both data page versions, dictionaries on and off and pages of a few values; what it does
not read falls back to pyarrow; corrupt pages are one line; the CLI's numbers are the same
with the decoder on and off; reading a long row costs its values plus a page."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.errors import InputError
from grpo_cli.io import pages

from .conftest import Cli

ROOT = Path(__file__).resolve().parent.parent
CODECS = ("none", "snappy", "gzip", "zstd", "brotli", "lz4")
TYPES = {
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int8": pa.int8(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint16": pa.uint16(),
    "bool": pa.bool_(),
}


def lists(rng: np.random.Generator, vt: pa.DataType, rows: int = 120, nan: bool = True) -> pa.Array:
    """``rows`` lists of 0-40 values of type ``vt`` (some empty; floats with NaN)."""
    lens = rng.integers(0, 41, rows)
    lens[::17] = 0
    n = int(lens.sum())
    if pa.types.is_boolean(vt):
        vals: Any = rng.random(n) < 0.3
    elif pa.types.is_floating(vt):
        vals = rng.normal(size=n).astype(vt.to_pandas_dtype())
        if nan:
            vals[::11] = np.nan
    else:
        info = np.iinfo(vt.to_pandas_dtype())
        vals = rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(
            vt.to_pandas_dtype()
        )
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(off), pa.array(vals, vt))


def same(path: Path, names: list[str]) -> int:
    """Every row group's ``names`` decoded equal pyarrow's (values bit for bit: NaN too;
    offsets); the row groups the decoder did not handle."""
    pf = pq.ParquetFile(path)
    fell = 0
    for rg in range(pf.metadata.num_row_groups):
        try:
            got = pages.read_list_columns(path, pf, rg, names)
        except pages.NotHandled:
            fell += 1
            continue
        ref = pf.read_row_group(rg, columns=names)
        for name in names:
            want = ref.column(name).combine_chunks()
            arr = got[name].array()
            assert arr.type == want.type, name
            off = want.offsets.to_numpy().astype(np.int64)
            assert np.array_equal(got[name].offsets, off - off[0]), name
            w = want.values.slice(int(off[0]), int(off[-1] - off[0])).to_numpy(zero_copy_only=False)
            v = arr.values.to_numpy(zero_copy_only=False)
            assert v.dtype == w.dtype and v.tobytes() == w.tobytes(), name
    return fell


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [True, False])
@pytest.mark.parametrize("page", [None, 50])
def test_every_codec_version_and_page_size(
    tmp_path: Path, codec: str, version: str, dictionary: bool, page: int | None
) -> None:
    rng = np.random.default_rng(7)
    cols = {name: lists(rng, t) for name, t in TYPES.items()}
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table(cols), path, compression=codec, data_page_version=version,
        use_dictionary=dictionary, data_page_size=page, row_group_size=70,
    )  # fmt: skip
    if page is not None:  # rows cross pages
        md = pq.ParquetFile(path).metadata.row_group(0).column(0)
        assert md.total_uncompressed_size > 10 * 50
    assert same(path, list(TYPES)) == 0


@pytest.mark.parametrize("nullable", [True, False])
def test_required_and_nullable_fields(tmp_path: Path, nullable: bool) -> None:
    rng = np.random.default_rng(1)
    arr = lists(rng, pa.float32())
    t = pa.list_(pa.field("element", pa.float32(), nullable=nullable))
    schema = pa.schema([pa.field("x", t, nullable=nullable)])
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": arr.cast(t)}, schema=schema), path, data_page_size=64)
    assert same(path, ["x"]) == 0


def test_byte_stream_split_and_large_lists(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = lists(rng, pa.float64())
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"x": x, "y": x.cast(pa.large_list(pa.float64()))}), path,
        use_dictionary=False, column_encoding={"x": "BYTE_STREAM_SPLIT", "y": "PLAIN"},
    )  # fmt: skip
    assert same(path, ["x", "y"]) == 0


def test_legacy_two_level_lists(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": lists(rng, pa.float32())}), path, use_compliant_nested_type=False)
    assert same(path, ["x"]) == 0


@pytest.mark.parametrize("what", ["null lists", "null elements"])
def test_nulls_fall_back_to_pyarrow(tmp_path: Path, what: str) -> None:
    x = pa.array([[1.0, 2.0], None, []] if what == "null lists" else [[1.0, None], [], [3.0]])
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": x}), path)
    assert same(path, ["x"]) == 1


def test_other_layouts_are_not_handled(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    s = pa.array([[{"a": 1.0}], []], pa.list_(pa.struct([("a", pa.float64())])))
    pq.write_table(pa.table({"s": s}), path)
    pf = pq.ParquetFile(path)
    with pytest.raises(pages.NotHandled):
        pages.read_list_columns(path, pf, 0, ["s"])
    path2 = tmp_path / "other.parquet"
    h = pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float16()))
    w = pa.array([["a"], []], pa.list_(pa.string()))
    pq.write_table(pa.table({"h": h, "w": w}), path2)
    assert same(path2, ["h"]) == 1 and same(path2, ["w"]) == 1


# ---- corrupt pages
def long_file(path: Path, tokens: int, **kw: Any) -> Path:
    rng = np.random.default_rng(0)
    old = (-rng.exponential(0.5, tokens)).astype(np.float32)
    off = pa.array([0, tokens // 2, tokens], pa.int32())
    cols = {
        "group": ["g0", "g0"],
        "reward": [1.0, 0.0],
        "logp": pa.ListArray.from_arrays(off, pa.array(old + np.float32(0.01))),
        "old_logp": pa.ListArray.from_arrays(off, pa.array(old)),
        "ref_logp": pa.ListArray.from_arrays(off, pa.array(old - np.float32(0.02))),
    }
    pq.write_table(pa.table(cols), path, **kw)
    return path


def corrupt(path: Path, at: str, data: bytes) -> Path:
    """``path`` with ``data`` written over the logp chunk (``at``: "header", the page
    header; "levels", the bytes after it)."""
    md = pq.ParquetFile(path).metadata.row_group(0)
    col = next(
        md.column(c)
        for c in range(md.num_columns)
        if md.column(c).path_in_schema.startswith("logp")
    )
    start = col.data_page_offset
    raw = bytearray(path.read_bytes())
    if at == "levels":
        t = pages.Thrift(bytes(raw[start : start + 4096]))
        t.struct()
        start += t.pos
    raw[start : start + len(data)] = data
    out = path.with_name(f"bad_{at}.parquet")
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize(
    ("at", "data", "codec"),
    [
        ("header", b"\xff" * 16, "none"),
        ("header", b"\x15\x00\x15\xfe\xff\xff\xff\x0f", "none"),  # type 0, a page of 2 GB
        ("levels", b"\xff\xff\xff\x7f", "none"),  # levels of 2 GB
        ("levels", b"\x01\x02\x03\x04" * 8, "snappy"),  # not snappy
    ],
)
def test_corrupt_pages_are_one_line(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, at: str, data: bytes, codec: str
) -> None:
    good = long_file(tmp_path / "t.parquet", 4000, compression=codec, use_dictionary=False)
    bad = corrupt(good, at, data)
    pf = pq.ParquetFile(bad)
    with pytest.raises(InputError, match=r"bad_\w+\.parquet: column 'logp', row group 0: "):
        pages.read_list_columns(bad, pf, 0, ["logp"])
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "100")
    cli.error(["objective", str(bad)], "column 'logp', row group 0")


# ---- end to end
def run(cli: Cli, *args: str | Path) -> Any:
    r = cli(*args)
    assert r.exit_code in (0, 1), r.stderr  # check: 1 when a rule fails
    return json.loads(r.stdout)


@pytest.mark.parametrize("kw", [{}, {"use_dictionary": False, "data_page_version": "2.0"}])
def test_objective_is_the_same_with_the_decoder_off(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]
) -> None:
    path = long_file(tmp_path / "t.parquet", 6000, data_page_size=1000, **kw)
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "1000")
    calls: list[int] = []
    real = pages.read_list_columns

    def counted(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(pages, "read_list_columns", counted)
    commands: list[list[str | Path]] = [
        ["objective", path, "--json"],
        ["kl", path, "--json"],
        ["check", path, "--format", "json"],
    ]
    for cmd in commands:
        on = run(cli, *cmd)
        assert calls, cmd
        monkeypatch.setattr(pages, "ENABLED", False)
        n = len(calls)
        off = run(cli, *cmd)
        assert len(calls) == n
        monkeypatch.setattr(pages, "ENABLED", True)
        on.pop("engine", None), off.pop("engine", None)
        assert on == off, cmd


# the peak of this process's own memory (VmHWM: ru_maxrss starts at the forking parent's)
MEMORY = """
import sys
from pathlib import Path
import pyarrow.parquet as pq
from grpo_cli.io import pages
def peak():
    line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
p = Path(sys.argv[1])
pf = pq.ParquetFile(p)
before = peak()
cols = pages.read_list_columns(p, pf, 0, ["logp"]) if sys.argv[2] == "pages" else None
if cols is None:
    for rb in pf.iter_batches(batch_size=1, columns=["logp"], use_threads=False):
        pass
print(peak() - before)
"""


def test_a_long_row_costs_its_values_plus_a_page(tmp_path: Path) -> None:
    tokens = 4_000_000
    path = long_file(tmp_path / "t.parquet", tokens, use_dictionary=False)
    values = tokens * 4
    md = pq.ParquetFile(path).metadata.row_group(0).column(2)
    assert md.path_in_schema.startswith("logp")
    page = md.total_uncompressed_size  # the largest page is at most the chunk
    env = {"PYTHONPATH": str(ROOT)}

    def grown(how: str) -> int:
        r = subprocess.run(
            [sys.executable, "-c", MEMORY, str(path), how],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        return int(r.stdout)

    ours = grown("pages")
    assert ours <= values + 2 * page + (8 << 20), (ours, values, page)
    assert ours < grown("pyarrow")


def test_a_file_on_a_filesystem(tmp_path: Path) -> None:
    """A file on a pyarrow filesystem (s3://, gs://, ...) is read through ``fs``: the
    same columns."""
    from pyarrow import fs

    from grpo_cli.io.paths import RemoteFile

    path = long_file(tmp_path / "t.parquet", 5000, data_page_size=500)
    remote = RemoteFile(fs.LocalFileSystem(), str(path), f"mem://{path.name}")
    pf = pq.ParquetFile(path)
    local = pages.read_list_columns(path, pf, 0, ["logp", "ref_logp"])
    there = pages.read_list_columns(remote, pf, 0, ["logp", "ref_logp"])
    for name in local:
        assert local[name].array().equals(there[name].array())
    assert same(path, ["logp", "ref_logp"]) == 0
