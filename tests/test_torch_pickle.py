"""``grpo_cli.io.torch_pickle``: torch.save files read without torch and without running
their pickle's code.

Expected values come from torch itself: ``tests/data/torch_pickle/make.py`` saved
``tensors.pt`` with torch and wrote what ``torch.load`` gives back (``expected.npz``,
``expected.json``), so this suite needs no torch; where torch is installed, a second test
saves random views itself and compares with ``torch.load`` directly. The refusals are
pickles written opcode by opcode here, each shown to be live (the standard unpickler,
in a subprocess, does run it) before the reader is shown to refuse it and run nothing.
"""

from __future__ import annotations

import json
import math
import pickle
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_cli.errors import InputError
from grpo_cli.io import torch_pickle
from grpo_cli.io.torch_pickle import load

DATA = Path(__file__).resolve().parent / "data" / "torch_pickle"
RNG_SEED = 2028

# ---------------------------------------------------------------------------------------
# the committed fixture, against what torch.load gave


def _compare(got: Any, want: Any, arrays: Any, path: str) -> None:
    if isinstance(want, dict) and "tensor" in want:
        expected = arrays[want["tensor"].lstrip("/")]
        assert isinstance(got, np.ndarray), path
        assert got.shape == tuple(want["shape"]) == expected.shape, path
        assert got.dtype == expected.dtype, (path, got.dtype, expected.dtype)
        assert np.array_equal(got, expected, equal_nan=got.dtype.kind in "fc"), path
        return
    if isinstance(want, dict) and "ndarray" in want:
        expected = arrays[want["ndarray"].lstrip("/")]
        assert isinstance(got, np.ndarray) and got.dtype == expected.dtype, path
        assert np.array_equal(got, expected), path
        return
    if isinstance(want, dict) and len(want) == 1:
        (kind, body), *_ = want.items()
        if kind == "dict":
            assert type(got) is dict and list(got) == list(body), path
            for k, v in body.items():
                _compare(got[k], v, arrays, f"{path}/{k}")
            return
        if kind == "ordered":
            assert isinstance(got, OrderedDict) and list(got) == [k for k, _ in body], path
            for k, v in body:
                _compare(got[k], v, arrays, f"{path}/{k}")
            return
        if kind in ("list", "tuple"):
            assert type(got) is (list if kind == "list" else tuple) and len(got) == len(body)
            for i, v in enumerate(body):
                _compare(got[i], v, arrays, f"{path}/{i}")
            return
        if kind == "set":
            assert got == set(body), path
            return
        if kind == "bytes":
            assert got == bytes.fromhex(body), path
            return
        if kind == "complex":
            assert got == complex(*body), path
            return
        if kind == "float":
            assert isinstance(got, float) and math.isnan(got), path
            return
        if kind == "bigint":
            assert got == int(body), path
            return
    if isinstance(want, dict) and "np_scalar" in want:
        assert isinstance(got, np.generic) and got.dtype.str == want["np_scalar"], path
        assert got.item() == want["value"], path
        return
    assert type(got) is type(want) and got == want, (path, got, want)


def test_the_committed_dump_reads_as_torch_load_read_it() -> None:
    doc = json.loads((DATA / "expected.json").read_text())
    with np.load(DATA / "expected.npz") as arrays:
        _compare(load(DATA / "tensors.pt"), doc["object"], arrays, "")


def test_the_fixture_holds_every_dtype_and_kind_of_view() -> None:
    """The comparison above is only as wide as the fixture: every storage type a dump may
    hold, bf16 among them, and every kind of view."""
    doc = json.loads((DATA / "expected.json").read_text())["object"]["dict"]
    dtypes = {v["dtype"] for v in doc["dtypes"]["dict"].values()}
    assert dtypes == {
        f"torch.{t}"
        for t in "float64 float32 float16 bfloat16 int8 int16 int32 int64 uint8 uint16 "
        "uint32 uint64 bool complex64 complex128".split()
    }
    got = load(DATA / "tensors.pt")
    assert got["dtypes"]["bfloat16"].dtype == np.float32  # widened, exactly
    views = got["views"]
    assert views["transposed"].shape == (7, 5) and views["scalar"].shape == ()
    assert views["empty"].shape == (5, 0) and views["empty_2d"].shape == (0, 4)
    np.testing.assert_array_equal(views["shared_a"], np.arange(3, 9))
    np.testing.assert_array_equal(views["shared_b"], np.arange(1, 40, 8))
    assert got["samples"][0]["ref_log_probs"] is None


def test_arrays_are_independent_and_writeable() -> None:
    """Two views of one storage come back as two arrays: writing one changes neither the
    other nor a second load."""
    got = load(DATA / "tensors.pt")
    a, b = got["views"]["shared_a"], got["views"]["shared_b"]
    a[:] = -1
    assert b[0] == 1 and load(DATA / "tensors.pt")["views"]["shared_a"][0] == 3


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"
)
def test_random_views_match_torch_load(tmp_path: Path) -> None:
    import torch

    rng = np.random.default_rng(RNG_SEED)
    kinds = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]
    kinds += [torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
    obj: dict[str, Any] = {}
    for i in range(60):
        dims = list(rng.integers(1, 6, size=int(rng.integers(1, 4))))
        t = torch.from_numpy(rng.normal(size=dims) * 50).to(kinds[i % len(kinds)])
        for d in range(t.ndim):
            start = int(rng.integers(0, t.shape[d]))
            t = t.narrow(d, start, t.shape[d] - start)[
                tuple([slice(None)] * d + [slice(None, None, int(rng.integers(1, 3)))])
            ]
        if t.ndim > 1 and rng.random() < 0.5:
            t = t.transpose(0, t.ndim - 1)
        obj[f"t{i}"] = [t, {"none": None, "n": i}]
    torch.save(obj, tmp_path / "r.pt")
    want = torch.load(tmp_path / "r.pt", weights_only=True)
    got = load(tmp_path / "r.pt")
    for k, (t, extra) in want.items():
        ref = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        assert got[k][0].dtype == ref.dtype and got[k][0].shape == ref.shape, k
        np.testing.assert_array_equal(got[k][0], ref)
        assert got[k][1] == extra


# ---------------------------------------------------------------------------------------
# pickles written opcode by opcode (protocol 2 subset), in a torch.save-shaped archive


class Ops:
    """Builds a pickle from opcodes, so the test needs neither torch nor the globals."""

    def __init__(self) -> None:
        self.b = bytearray(b"\x80\x02")

    def glob(self, module: str, name: str) -> Ops:
        self.b += b"c" + module.encode() + b"\n" + name.encode() + b"\n"
        return self

    def raw(self, code: bytes) -> Ops:
        self.b += code
        return self

    def num(self, v: int) -> Ops:
        self.b += b"J" + struct.pack("<i", v)
        return self

    def text(self, s: str) -> Ops:
        e = s.encode()
        self.b += b"X" + struct.pack("<I", len(e)) + e
        return self

    def ints(self, vals: tuple[int, ...]) -> Ops:
        self.raw(b"(")
        for v in vals:
            self.num(v)
        return self.raw(b"t")

    def tensor(
        self, key: str, numel: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
    ) -> Ops:
        self.glob("torch._utils", "_rebuild_tensor_v2").raw(b"(")
        self.raw(b"(").text("storage").glob("torch", "FloatStorage").text(key).text("cpu")
        self.num(numel).raw(b"tQ")
        self.num(offset).ints(size).ints(stride).raw(b"\x89")
        self.glob("collections", "OrderedDict").raw(b")R")
        return self.raw(b"tR")

    def done(self) -> bytes:
        return bytes(self.b + b".")


def archive(path: Path, pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for key, raw in (storages or {}).items():
            z.writestr(f"archive/data/{key}", raw)
        z.writestr("archive/version", "3\n")
    return path


def test_the_opcode_builder_writes_what_the_reader_reads(tmp_path: Path) -> None:
    """A tensor written here by opcodes (a strided view at an offset) reads back as the
    hand-computed elements: the builder used by the refusals below writes real dumps."""
    storage = np.arange(12, dtype="<f4").tobytes()
    pkl = Ops().raw(b"}").text("x").tensor("0", 12, 1, (2, 3), (4, 2)).raw(b"s").done()
    got = load(archive(tmp_path / "ok.pt", pkl, {"0": storage}))
    np.testing.assert_array_equal(got["x"], [[1, 3, 5], [5, 7, 9]])


PAYLOADS = {
    "os.system": lambda cmd: Ops().glob("os", "system").raw(b"(").text(cmd).raw(b"tR"),
    "posix.system": lambda cmd: Ops().glob("posix", "system").raw(b"(").text(cmd).raw(b"tR"),
    "builtins.exec": lambda cmd: (
        Ops().glob("builtins", "exec").raw(b"(").text(f"import os; os.system({cmd!r})").raw(b"tR")
    ),
    "subprocess.call": lambda cmd: (
        Ops()
        .glob("subprocess", "call")
        .raw(b"((")
        .text(cmd.split()[0])
        .text(cmd.split()[1])
        .raw(b"ltR")
    ),
    # the code hidden inside an allowed tensor rebuild's arguments
    "inside a tensor": lambda cmd: (
        Ops()
        .glob("torch._utils", "_rebuild_tensor_v2")
        .raw(b"(")
        .glob("os", "system")
        .raw(b"(")
        .text(cmd)
        .raw(b"tR")
        .num(0)
        .raw(b"))\x89}tR")
    ),
    # the INST opcode (module, name and a call in one)
    "INST os.system": lambda cmd: Ops().raw(b"(").text(cmd).raw(b"ios\nsystem\n"),
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_pickle_that_would_run_code_is_refused_and_nothing_ran(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "ran"
    pkl = PAYLOADS[name](f"touch {marker}").done()
    # live: the standard unpickler runs it (in a child process; torch._utils stood in for
    # where torch is not installed, so the payload inside a tensor rebuild is reached)
    child = (
        "import pickle, sys, types\n"
        "try:\n    import torch._utils\n"
        "except ImportError:\n"
        "    t, u = types.ModuleType('torch'), types.ModuleType('torch._utils')\n"
        "    u._rebuild_tensor_v2 = lambda *a: None\n"
        "    t._utils = u; sys.modules.update({'torch': t, 'torch._utils': u})\n"
        "pickle.loads(sys.stdin.buffer.read())\n"
    )
    subprocess.run(
        [sys.executable, "-c", child],
        input=pkl,
        check=False,
        capture_output=True,
    )
    assert marker.exists(), f"the {name} payload did not run under pickle.loads"
    marker.unlink()
    pt = archive(tmp_path / "evil.pt", pkl)
    with pytest.raises(InputError) as e:
        load(pt)
    message = str(e.value)
    assert "\n" not in message and str(pt) in message and "refused" in message
    named = {"posix.system": "posix.system", "builtins.exec": "builtins.exec"}
    assert named.get(name, "subprocess.call" if "subprocess" in name else "os.system") in message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("torch._utils", "_rebuild_parameter"),
        ("torch._tensor", "_rebuild_from_type_v2"),
        ("builtins", "getattr"),
        ("builtins", "eval"),
        ("numpy", "load"),
        ("collections", "defaultdict"),
        ("copyreg", "_reconstructor"),
    ],
)
def test_any_other_global_is_refused_by_name(tmp_path: Path, module: str, name: str) -> None:
    pt = archive(tmp_path / "g.pt", Ops().glob(module, name).raw(b")R").done())
    with pytest.raises(InputError, match=rf"global {module}\.{name},"):
        load(pt)


def test_an_extension_code_goes_through_the_allow_list(tmp_path: Path) -> None:
    """EXT1 looks its global up in copyreg's registry: still refused unless admitted."""
    import copyreg

    copyreg.add_extension("os", "system", 0xF1)
    try:
        pt = archive(
            tmp_path / "e.pt", Ops().raw(b"\x82\xf1").raw(b"(").text("true").raw(b"tR").done()
        )
        with pytest.raises(InputError, match=r"global os\.system"):
            load(pt)
    finally:
        copyreg.remove_extension("os", "system", 0xF1)


def test_builtins_cannot_allocate_from_a_size(tmp_path: Path) -> None:
    pkl = Ops().glob("builtins", "bytearray").raw(b"(").num(2**31 - 1).raw(b"tR").done()
    with pytest.raises(InputError, match=r"builtins\.bytearray is built from"):
        load(archive(tmp_path / "b.pt", pkl))


@pytest.mark.parametrize(
    ("numel", "offset", "size", "stride", "match"),
    [
        (4, 2, (3,), (1,), "reaches past the 4 elements"),
        (4, 0, (2, 2), (2, 2), "reaches past"),
        (4, -1, (1,), (1,), "bad offset"),
        (8, 0, (2,), (1,), "holds 16 bytes, 32 expected"),
        (4, 0, (2**20, 2**20), (0, 0), "over the limit"),
    ],
)
def test_a_tensor_outside_its_storage_is_refused(
    tmp_path: Path,
    numel: int,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    match: str,
) -> None:
    pkl = Ops().tensor("0", numel, offset, size, stride).done()
    pt = archive(tmp_path / "t.pt", pkl, {"0": np.zeros(4, "<f4").tobytes()})
    with pytest.raises(InputError, match=match):
        load(pt, max_array_bytes=2**20)


def test_a_storage_missing_from_the_archive_is_named(tmp_path: Path) -> None:
    pt = archive(tmp_path / "m.pt", Ops().tensor("7", 1, 0, (1,), (1,)).done())
    with pytest.raises(InputError, match=r"storage '7' is not in the archive"):
        load(pt)


def test_the_bounds_are_checked_before_reading(tmp_path: Path) -> None:
    big = archive(tmp_path / "big.pt", Ops().text("x" * 5000).done())
    with pytest.raises(InputError, match=r"over the limit of 1000 \(max_pickle_bytes\)"):
        load(big, max_pickle_bytes=1000)
    assert load(big) == "x" * 5000
    with pytest.raises(InputError, match=r"max_array_bytes"):
        load(DATA / "tensors.pt", max_array_bytes=1000)
    assert torch_pickle.MAX_PICKLE_BYTES == 512 * 2**20
    assert torch_pickle.MAX_ARRAY_BYTES == 4 * 2**30


def test_what_is_not_a_torch_save_zip_is_named(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(InputError, match=r"legacy.pt: not a zip archive.*legacy format"):
        load(legacy)
    with pytest.raises(InputError, match="no such file"):
        load(tmp_path / "absent.pt")
    with pytest.raises(InputError, match="is a directory"):
        load(tmp_path)
    two = tmp_path / "two.pt"
    with zipfile.ZipFile(two, "w") as z:
        z.writestr("a/data.pkl", Ops().done())
        z.writestr("b/data.pkl", Ops().done())
    with pytest.raises(InputError, match=r"holds one <prefix>/data\.pkl, this one 2"):
        load(two)
    torn = archive(tmp_path / "torn.pt", b"\x80\x02}X")
    with pytest.raises(InputError, match=r"data\.pkl is not a readable pickle"):
        load(torn)


def test_a_numpy_object_array_is_refused(tmp_path: Path) -> None:
    arr = np.array([1, "a"], dtype=object)
    raw = pickle.dumps({"a": arr}, protocol=2)
    with pytest.raises(InputError, match="refused"):
        load(archive(tmp_path / "o.pt", raw))
    fine = np.arange(6, dtype=">i4").reshape(2, 3)
    got = load(
        archive(tmp_path / "n.pt", pickle.dumps({"a": fine, "s": np.float32(2.5)}, protocol=2))
    )
    np.testing.assert_array_equal(got["a"], fine)
    assert got["s"] == np.float32(2.5) and got["s"].dtype == np.float32


# ---------------------------------------------------------------------------------------
# slime's own dumps (conformance/frontier/record.py ran slime's writers)

FRONTIER = Path(__file__).resolve().parent.parent / "conformance" / "frontier" / "fixtures"


@pytest.mark.parametrize("rollout", [0, 1])
def test_a_slime_dump_reads_as_slime_wrote_it(rollout: int) -> None:
    """slime's train and rollout dumps (written by its ``_build_dump_payload`` +
    ``torch.save`` and ``save_debug_rollout_data``) against the per-token values the
    recorder took from slime's tensors before saving them (``slime.json``)."""
    doc = json.loads((FRONTIER / "slime.json").read_text())
    rec = next(d for d in doc["dumps"] if d["name"] == f"slime_dump_tis/{rollout}")
    rows = {r["position"]: r for r in rec["samples"]}
    train = load(FRONTIER / "slime_dump_tis" / "train_data" / f"{rollout}.pt")
    assert train["format_version"] == 2 and train["rollout_id"] == rollout
    positions = [s["rollout_position"] for s in train["samples"]]
    assert positions == sorted(rows)
    for s in train["samples"]:
        row = rows[s["rollout_position"]]
        assert s["sample_index"] == row["index"]
        for field, key in (
            ("rollout_log_probs", "rollout_logp"),
            ("log_probs", "old_logp"),
            ("ref_log_probs", "ref_logp"),
            ("advantages", "advantages"),
        ):
            assert s[field].dtype == np.float32
            np.testing.assert_array_equal(s[field], np.float32(row[key]))
        np.testing.assert_array_equal(s["loss_masks"], row["loss_mask"])
        assert (
            s["rollout_mask_sums"].shape == ()
            and float(s["rollout_mask_sums"]) == row["rollout_mask_sum"]
        )
    shards = train["dp_shards"]
    assert [sh["partition"] for sh in shards] == rec["schedule"]["partitions"]
    assert shards[0]["num_microbatches"] == rec["schedule"]["num_microbatches"]
    dumped = load(FRONTIER / "slime_dump_tis" / "rollout_data" / f"{rollout}.pt")
    assert [s["index"] for s in dumped["samples"]] == sorted(rows)
    for s in dumped["samples"]:
        np.testing.assert_array_equal(
            np.float32(s["rollout_log_probs"]), np.float32(rows[s["index"]]["rollout_logp"])
        )
        assert s["group_index"] == rows[s["index"]]["group_index"] and s["status"] in (
            "completed",
            "truncated",
        )


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch not installed"
)
def test_slime_dumps_match_torch_load() -> None:
    import torch

    def same(a: Any, b: Any) -> None:
        if torch.is_tensor(b):
            np.testing.assert_array_equal(a, b.numpy())
            assert a.dtype == b.numpy().dtype
        elif isinstance(b, dict):
            assert list(a) == list(b)
            for k in b:
                same(a[k], b[k])
        elif isinstance(b, (list, tuple)):
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            assert a == b and type(a) is type(b)

    for pt in sorted(FRONTIER.glob("slime_dump*/*/*.pt")):
        same(load(pt), torch.load(pt, weights_only=False))
