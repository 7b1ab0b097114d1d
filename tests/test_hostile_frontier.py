"""The readers added after issue 27's hostile work, tried as a new user and an attacker
would (issue 27, second round): slime ``--dump-details`` directories, their ``.pt`` dumps
and ``args.json``; prime-rl output directories, their token exports, traces and
``configs/trainer.json``; AReaL's recorder. Every case ends in a result or in exit 2 with
one ``grpo-cli: error:`` line naming the file (and the field, key or line); a FIFO or a
device is refused at once (run in a child process, so a hang fails the test instead of
stalling it); the API checks its arguments at setup."""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import struct
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from grpo_cli.errors import InputError
from grpo_cli.io import torch_pickle
from grpo_cli.io.torch_pickle import load

from .conftest import Cli
from .test_hostile_runs import child_line, one_line, run_cli
from .test_torch_pickle import Ops

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "conformance" / "frontier" / "fixtures"
SLIME, PRIME = FIX / "slime_dump", FIX / "prime_rl_run"
TRAIN, ROLL = "train_data/0.pt", "rollout_data/0.pt"
RANK0 = "token_exports/step_1/rank_0.jsonl"
TRACES = "rollouts/step_1/train/effective/traces.jsonl"


def save(path: Path, obj: Any) -> Path:
    """``obj`` as a torch.save-shaped archive (its arrays pickled as NumPy arrays, which
    the reader admits), so the tests need no torch."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(obj, protocol=2))
        z.writestr("archive/byteorder", "little")
    return path


def slime_dump(
    tmp: Path,
    train: Callable[[dict[str, Any]], Any] | None = None,
    rollout: Callable[[dict[str, Any]], Any] | None = None,
) -> Path:
    """Rollout 0 of the fixture dump, its train (``train``) or rollout dict edited."""
    d = tmp / "dump"
    for sub in ("train_data", "rollout_data"):
        (d / sub).mkdir(parents=True)
        shutil.copy(SLIME / sub / "0.pt", d / sub / "0.pt")
    for name, edit in ((TRAIN, train), (ROLL, rollout)):
        if edit is not None:
            obj = load(d / name)
            edit(obj)
            save(d / name, obj)
    return d


def sample(key: str, value: Any, at: int = 0) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        obj["samples"][at][key] = value

    return edit


def loss(cli: Cli, *args: str | Path) -> float:
    return float(cli.json("objective", *args)["loss"])


# ------------------------------------------------------------------ slime: the dumps
BAD_SAMPLES = [
    # (train edit, rollout edit, the words of the one line)
    (sample("loss_masks", np.array([0.5], np.float32)), None,
     "field 'loss_masks' holds np.float32(0.5) at token 0: expected 0 or 1"),
    (sample("loss_masks", np.array([2], np.int32)), None, "'loss_masks' holds np.int32(2)"),
    (sample("loss_masks", np.array([np.nan])), None, "'loss_masks' holds np.float64(nan)"),
    (sample("loss_masks", ["a"]), None, "'loss_masks' is missing or not one list of 0/1"),
    (sample("loss_masks", [[1], [1, 0]]), None,
     "field 'loss_masks' is not one list of numbers (ragged or mixed values)"),
    (sample("log_probs", [[1.0], [1.0, 2.0]]), None, "field 'log_probs' is not one list"),
    (sample("log_probs", np.array([1 + 2j])), None,
     "field 'log_probs' has shape (1,) (complex128), expected 1 real numbers"),
    (sample("log_probs", np.zeros(3, np.float32)), None,
     "field 'log_probs' has shape (3,) (float32), expected 1 real numbers"),
    (sample("log_probs", np.array([True])), None, "'log_probs' has shape (1,) (bool)"),
    (sample("advantages", ["x"]), None, "'advantages' has shape (1,) (<U1)"),
    (sample("entropy", np.zeros(1, np.float32)), None,
     "field 'entropy' is dumped for some samples only"),
    (sample("rollout_mask_sums", "x"), None, "'rollout_mask_sums' is missing or not one number"),
    (sample("rollout_mask_sums", [1, 2]), None, "'rollout_mask_sums' is missing or not one"),
    (lambda t: t["dp_shards"][0].__setitem__("partition", [None] * 8), None,
     "dp_shards[0]: partition holds a value that is not a rollout position"),
    (lambda t: t["dp_shards"][0].__setitem__("partition", [str(i) for i in range(8)]), None,
     "partition holds a value that is not a rollout position"),
    (lambda t: t["dp_shards"][0].__setitem__("micro_batch_indices", "ab"), None,
     "dp_shards[0]: field 'micro_batch_indices' is str"),
    (lambda t: [s.__setitem__("global_batch_sizes", [10**18, 8]) for s in t["dp_shards"]],
     None, "global_batch_sizes[0] is 1000000000000000000"),
    (lambda t: t.__setitem__("rollout_id", 1), None,
     "rollout_id is 1, the file's name says 0"),
    (lambda t: t.__setitem__("rollout_id", "0"), None, "field 'rollout_id' is str"),
    (lambda t: t.__setitem__("format_version", "2"), None, "format_version is '2'"),
    (lambda t: t.__setitem__("samples", "abc"), None, "field 'samples' is str"),
    (lambda t: t.__setitem__("dp_shards", [5]), None, "dp_shards[0]: no field 'partition'"),
    (lambda t: (sample("rollout_position", None)(t), sample("sample_index", [0])(t)), None,
     "samples[0]: joins no sample of"),
    (None, sample("group_index", 10**30), "group_index is 1000000000000000000000000000000"),
    (None, sample("group_index", "g"), "group_index is 'g'"),
    (None, sample("reward", "1"), "reward is '1', not a number"),
    (None, sample("reward", float("nan")), "field 'reward' has non-finite value nan"),
    (None, lambda r: r.__setitem__("samples", {"a": 1}), "field 'samples' is dict"),
]  # fmt: skip


@pytest.mark.parametrize(("train", "rollout", "words"), BAD_SAMPLES)
def test_a_wrong_dump_field_is_one_line_naming_it(
    cli: Cli, tmp_path: Path, train: Any, rollout: Any, words: str
) -> None:
    d = slime_dump(tmp_path, train, rollout)
    runs: list[list[str | Path]] = [["objective", d / TRAIN], ["trend", d], ["check", d]]
    for args in runs:
        r = cli(*args)
        if args[0] == "objective" or r.exit_code == 2:
            one_line(r, words)
        else:  # trend and check skip a rollout they cannot read, naming it
            assert r.exit_code in (0, 1), r.stderr


def test_dump_values_of_other_numeric_types_read_as_the_same_numbers(
    cli: Cli, tmp_path: Path
) -> None:
    """A NumPy scalar reward or group, an index that is a list (unused: the position
    joins), a float 0/1 mask: the same step as slime's own dump, to the last digit."""
    want = loss(cli, SLIME / TRAIN)
    r0 = load(SLIME / ROLL)["samples"][0]
    t0 = load(SLIME / TRAIN)["samples"][0]
    edits = [
        (None, sample("reward", np.float32(r0["reward"]))),
        (None, sample("group_index", np.int64(r0["group_index"]))),
        (None, sample("index", [1])),
        (sample("loss_masks", t0["loss_masks"].astype(np.float64)), None),
    ]
    for i, (train, rollout) in enumerate(edits):
        d = slime_dump(tmp_path / str(i), train, rollout)
        assert loss(cli, d / TRAIN) == want


def test_a_bad_rollout_dump_file(cli: Cli, tmp_path: Path) -> None:
    """A rollout dump that is text, cut, empty, or missing: named; trend and check skip
    the rollout (here the only one: no step can be read)."""
    whole = (SLIME / ROLL).read_bytes()
    for body, words in [(b"hello", "not a zip archive"), (whole[: len(whole) // 2], "not a zip"),
                        (b"", "not a zip archive")]:  # fmt: skip
        d = slime_dump(tmp_path / str(len(body)))
        (d / ROLL).write_bytes(body)
        one_line(cli("objective", d / TRAIN), f"{d / ROLL}", words)
        one_line(cli("trend", d), "no step of the run can be read", f"{d / ROLL}")
    (d / ROLL).unlink()
    one_line(cli("objective", d / TRAIN), "no rollout_data/0.pt beside it")


def two_rollouts(tmp: Path) -> Path:
    d = tmp / "two"
    for sub in ("train_data", "rollout_data"):
        shutil.copytree(SLIME / sub, d / sub)
    return d


def test_a_damaged_rollout_dump_is_skipped_and_the_other_read(cli: Cli, tmp_path: Path) -> None:
    d = two_rollouts(tmp_path)
    whole = loss(cli, d / "train_data" / "1.pt")
    (d / "rollout_data" / "0.pt").write_bytes(b"PK\x03\x04 cut")
    trend = cli.json("trend", d)
    assert [s["step"] for s in trend["steps"]] == [1]
    assert trend["steps"][0]["loss"] == whole
    assert any("skipped" in w and "rollout_data/0.pt" in w for w in trend["warnings"])


@pytest.mark.parametrize("kind", ["fifo", "dev/zero", "directory"])
@pytest.mark.parametrize("where", [TRAIN, ROLL, "args.json"])
def test_a_fifo_or_a_device_in_a_dump_is_named_at_once(
    tmp_path: Path, kind: str, where: str
) -> None:
    d = slime_dump(tmp_path)
    p = d / where
    p.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    else:
        p.symlink_to("/dev/zero")
    words = {"fifo": "FIFO", "dev/zero": "device", "directory": "directory"}[kind]
    t0 = time.monotonic()
    if where == TRAIN:  # the input itself: refused before any reader opens it
        own = "directory holds no" if kind == "directory" else "not a regular file"
        child_line(run_cli("objective", d / TRAIN, timeout=30), str(p), own)
    else:
        child_line(run_cli("objective", d / TRAIN, timeout=30), str(p), words)
    child_line(run_cli("trend", d, timeout=30), str(p), words)
    assert time.monotonic() - t0 < 30


def test_a_dangling_args_json_is_named_not_taken_for_the_defaults(cli: Cli, tmp_path: Path) -> None:
    d = slime_dump(tmp_path)
    (d / "args.json").symlink_to(tmp_path / "gone.json")
    one_line(cli("objective", d / TRAIN), f"{d / 'args.json'}: no such args.json")


ARGS = [
    (b'{"eps_clip": NaN}', "args.json: config key 'eps_clip' is nan: expected a finite number"),
    (b'{"eps_clip": Infinity}', "config key 'eps_clip' is inf"),
    (b'{"eps_clip": ' + b"9" * 400 + b"}",
     "'eps_clip' is <an integer of 400 digits, beyond float>"),
    (b'{"eps_clip": "0.2"}', "'eps_clip' is '0.2': expected a finite number >= 0"),
    (b'{"eps_clip_c": 0.5}', "'eps_clip_c' is 0.5: expected a finite number > 1"),
    (b'{"use_kl_loss": "true"}', "'use_kl_loss' is 'true': expected true or false"),
    (b'{"use_kl_loss": true, "kl_loss_coef": [0.1]}', "'kl_loss_coef' is [0.1]"),
    (b'{"kl_loss_type": "k9"}', "'kl_loss_type' is 'k9': expected one of"),
    (b'{"use_tis": true, "tis_clip": "2"}', "'tis_clip' is '2'"),
    (b'{"advantage_estimator": 7}', "'advantage_estimator' is 7: expected a string"),
    (b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", "line 1: JSON nested deeper than 64 levels"),
    (b'{"eps_clip": "\xff"}', "args.json: not UTF-8 text (byte 14)"),
    (b'"hello"', "args.json: expected a JSON object of slime's options (vars(args)), found str"),
    (b"[1]", "expected a JSON object of slime's options"),
    (b"", "args.json: not JSON"),
    (b'{"eps_clip": 0.2', "args.json: not JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "words"), ARGS)
def test_a_wrong_args_json_is_one_line_naming_it(
    cli: Cli, tmp_path: Path, body: bytes, words: str
) -> None:
    d = slime_dump(tmp_path)
    (d / "args.json").write_bytes(body)
    runs: list[list[str | Path]] = [["objective", d / TRAIN], ["trend", d], ["check", d]]
    for args in runs:
        one_line(cli(*args), words)


# ---------------------------------------------------------------- slime: the .pt zips
def bomb(path: Path, numel: int) -> Path:
    """A train-dump-shaped archive whose one storage is ``numel`` float32 zeros,
    deflated (torch.save stores them): about a thousandth of its size on disk."""
    pkl = Ops().raw(b"}").text("x").tensor("0", numel, 0, (numel,), (1,)).raw(b"s").done()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        info = zipfile.ZipInfo("archive/data/0")
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as f:
            for _ in range(numel * 4 // (1 << 22)):
                f.write(bytes(1 << 22))
    return path


def test_a_zip_bomb_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """256 MiB of zeros deflated to 0.25 MB: over 16 times the file's size (and over the
    64 MiB floor), refused before its storage is read; the process does not grow by it."""
    p = bomb(tmp_path / "bomb.pt", 2**26)
    size = p.stat().st_size
    assert size < 2**20
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match=r"16 times the file's \d+ bytes.*zip bomb") as e:
        load(p)
    assert f"over the limit of {64 * 2**20}" in str(e.value)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown_mib < 64, grown_mib
    # a storage within 16 times its file is read: the bound is not below a real dump's
    small = bomb(tmp_path / "small.pt", 2**20)
    assert load(small)["x"].shape == (2**20,)
    assert torch_pickle.MAX_EXPANSION == 16


def test_a_storage_shorter_than_its_directory_says_is_named(tmp_path: Path) -> None:
    """The zip's directory claims 4 MiB for a storage entry of 16 bytes: damaged."""
    numel = 2**20
    pkl = Ops().raw(b"}").text("x").tensor("0", numel, 0, (numel,), (1,)).raw(b"s").done()
    p = tmp_path / "liar.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/data/0", b"A" * 16)
    b = bytearray(p.read_bytes())
    struct.pack_into("<II", b, b.rfind(b"PK\x01\x02") + 20, numel * 4, numel * 4)
    struct.pack_into("<II", b, b.rfind(b"PK\x03\x04") + 18, numel * 4, numel * 4)
    p.write_bytes(bytes(b))
    with pytest.raises(InputError, match=r"storage '0' cannot be read from the archive .*damaged"):
        load(p)


def test_a_damaged_pickle_entry_is_named(tmp_path: Path) -> None:
    """data.pkl whose bytes were changed after the zip was written: its CRC fails."""
    p = tmp_path / "crc.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": [1, 2, 3]}, protocol=2))
    b = bytearray(p.read_bytes())
    at = b.index(b"K\x01K\x02")  # inside the pickle: [1, 2, 3] becomes [1, 5, 3]
    b[at + 3] = 5
    p.write_bytes(bytes(b))
    with pytest.raises(InputError, match=r"archive/data\.pkl cannot be read .*damaged"):
        load(p)


def pickle_archive(path: Path, ops: Ops) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", ops.done())
    return path


def test_a_pickle_no_recursive_walk_survives_is_refused(tmp_path: Path) -> None:
    """5,000 nested lists (10 KB: their repr raised RecursionError, a traceback), a list
    holding itself, and 60 levels of a list of two references to the next (2⁶⁰
    elements expanded): each refused by what it is, at once."""
    n = 5_000
    deep = pickle_archive(tmp_path / "deep.pt", Ops().raw(b"]" * n + b"a" * (n - 1)))
    with pytest.raises(InputError, match="containers nested deeper than 64 levels"):
        load(deep)
    itself = pickle_archive(tmp_path / "self.pt", Ops().raw(b"]q\x00h\x00a"))
    with pytest.raises(InputError, match="a container holds itself"):
        load(itself)
    laughs = Ops().raw(b"]").num(1).raw(b"aq\x00")
    for i in range(1, 60):
        laughs.raw(b"]h" + bytes([i - 1]) + b"ah" + bytes([i - 1]) + b"aq" + bytes([i]))
    t0 = time.monotonic()
    with pytest.raises(InputError, match="containers shared so often that they expand"):
        load(pickle_archive(tmp_path / "laughs.pt", laughs))
    assert time.monotonic() - t0 < 5
    # sharing within the budget reads: 2 levels of two references, 4 leaves
    fine = Ops().raw(b"]").num(1).raw(b"aq\x00]h\x00ah\x00aq\x01]h\x01ah\x01a")
    assert load(pickle_archive(tmp_path / "fine.pt", fine)) == [[[1], [1]], [[1], [1]]]


def test_a_deep_reward_in_a_rollout_dump_is_one_line(cli: Cli, tmp_path: Path) -> None:
    n = 5_000
    ops = Ops().raw(b"}").text("rollout_id").num(0).raw(b"s").text("samples").raw(b"]")
    for i in range(16):
        ops.raw(b"}").text("reward").raw(b"]" * n + b"a" * (n - 1)).raw(b"s")
        ops.text("group_index").num(0).raw(b"s").text("index").num(i).raw(b"sa")
    d = slime_dump(tmp_path)
    pickle_archive(d / ROLL, ops.raw(b"s"))
    one_line(cli("objective", d / TRAIN), str(d / ROLL), "nested deeper than 64 levels")


@pytest.mark.parametrize("kind", ["fifo", "dev/zero"])
def test_load_opens_only_a_regular_file(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "x.pt"
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to("/dev/zero")
    t0 = time.monotonic()
    with pytest.raises(InputError, match="not a regular file"):
        load(p)
    assert time.monotonic() - t0 < 5


def test_a_global_outside_the_allow_list_in_a_dump_is_refused_by_name(
    cli: Cli, tmp_path: Path
) -> None:
    d = slime_dump(tmp_path)
    marker = tmp_path / "ran"
    pkl = Ops().glob("os", "system").raw(b"(").text(f"touch {marker}").raw(b"tR").done()
    with zipfile.ZipFile(d / ROLL, "w") as z:
        z.writestr("archive/data.pkl", pkl)
    one_line(cli("objective", d / TRAIN), str(d / ROLL), "the global os.system")
    assert not marker.exists()


# ------------------------------------------------------------- prime-rl: the exports
def prime_run(tmp: Path, edit: Callable[[Path], Any] | None = None) -> Path:
    d = tmp / "run"
    shutil.copytree(PRIME, d)
    if edit is not None:
        edit(d)
    return d


def record(fn: Callable[[dict[str, Any]], Any], line: int = 0) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        p = d / RANK0
        lines = p.read_text().splitlines()
        rec = json.loads(lines[line])
        fn(rec)
        lines[line] = json.dumps(rec)
        p.write_text("\n".join(lines) + "\n")

    return edit


def text_edit(path: str, fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        (d / path).write_bytes(fn((d / path).read_bytes()))

    return edit


FIRST_LP = b"-3.3662874698638916"  # the first record's one loss-token trainer log-prob
BAD_RECORDS = [
    (record(lambda r: r.__setitem__("trainer_logprobs", [str(x) for x in r["trainer_logprobs"]])),
     "rank_0.jsonl:1: field 'trainer_logprobs' holds '-2.397895336151123' at position 0: "
     "expected a number"),
    (record(lambda r: r.__setitem__("advantages", [True] * len(r["advantages"]))),
     "field 'advantages' holds True at position 0"),
    (text_edit(RANK0, lambda b: b.replace(FIRST_LP, b"9" * 400, 1)),
     "'trainer_logprobs' holds <an integer of 400 digits, beyond float> at position 4"),
    (text_edit(RANK0, lambda b: b.replace(FIRST_LP, b"NaN", 1)),
     "field 'trainer_logprobs' is null or non-finite at loss token position 4"),
    (text_edit(RANK0, lambda b: b.replace(FIRST_LP, b"null", 1)),
     "'trainer_logprobs' is null or non-finite at loss token position 4"),
    (record(lambda r: r.__setitem__("entropy", r["entropy"][:-1])),
     "rank_0.jsonl:1: field 'entropy' has 4 values: expected a list of 5 numbers"),
    (record(lambda r: r.__setitem__("token_ids", ["a"] * len(r["token_ids"]))),
     "field 'token_ids' is not a list of token ids"),
    (record(lambda r: r.__setitem__("token_ids", [10**30] * len(r["token_ids"]))),
     "field 'token_ids' is not a list of token ids (integers from 0 to 2**63 - 1)"),
    (record(lambda r: r.__setitem__("loss_mask", [int(x) for x in r["loss_mask"]])),
     "field 'loss_mask' is not a list of 5 booleans"),
    (record(lambda r: r.__setitem__("micro_step", -5)),
     "field 'micro_step' is -5: expected an integer from 0 to 2147483647"),
    (record(lambda r: r.__setitem__("micro_step", 10**18)), "'micro_step' is 1000000000000000000"),
    (record(lambda r: r.__setitem__("rank", -3)), "field 'rank' is -3"),
    (record(lambda r: r.__setitem__("rank", "0")), "field 'rank' is '0'"),
    (record(lambda r: r.__setitem__("micro_sequence_idx", 10**18)),
     "field 'micro_sequence_idx' is 1000000000000000000"),
    (record(lambda r: r.__setitem__("step", 7)), "'step' is 7 in the directory of step 1"),
    (record(lambda r: r.__setitem__("schema_version", 2)), "schema_version 2"),
    (text_edit(RANK0, lambda b: b[:-300]), "rank_0.jsonl: line 8: not JSON"),
    (text_edit(RANK0, lambda b: b"[1,2]\n" + b), "rank_0.jsonl:1: not a JSON object"),
    (text_edit(RANK0, lambda b: b"\xff\xfe\n" + b), "rank_0.jsonl: line 1: not UTF-8 text"),
    (text_edit(RANK0, lambda b: b'{"a":' + b"[" * 70 + b"]" * 70 + b"}\n" + b),
     "rank_0.jsonl: line 1: JSON nested deeper than 64 levels"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "words"), BAD_RECORDS)
def test_a_wrong_token_record_is_one_line_and_trend_skips_its_step(
    cli: Cli, tmp_path: Path, edit: Any, words: str
) -> None:
    d = prime_run(tmp_path, edit)
    one_line(cli("objective", d / "token_exports" / "step_1"), words)
    whole = cli.json("trend", PRIME)["steps"][1]
    trend = cli.json("trend", d)
    assert [s["step"] for s in trend["steps"]] == [2]
    assert trend["steps"][0]["loss"] == whole["loss"]
    assert any("skipped" in w and words.split(":")[0] in w for w in trend["warnings"])


def test_a_rank_file_of_no_record_is_said(cli: Cli, tmp_path: Path) -> None:
    """An empty rank file of a STABLE step: the other rank's records, and a note that
    loss/mean counts none of its micro-batches."""
    d = prime_run(tmp_path, text_edit("token_exports/step_1/rank_1.jsonl", lambda b: b""))
    r = cli("objective", d / "token_exports" / "step_1", "--json")
    assert r.exit_code == 0, r.stderr
    assert "rank_1.jsonl of" in r.stderr and "loss/mean counts none of them" in r.stderr
    assert json.loads(r.stdout)["counts"]["answers"] == len((d / RANK0).read_text().splitlines())


@pytest.mark.parametrize("kind", ["fifo", "dev/zero", "directory"])
@pytest.mark.parametrize("where", ["token_exports/step_1/rank_1.jsonl", TRACES,
                                   "configs/trainer.json"])  # fmt: skip
def test_a_fifo_or_a_device_in_an_output_dir_is_named(
    tmp_path: Path, kind: str, where: str
) -> None:
    """Never left out (a rank file was: the step then read without that rank's records),
    never waited on."""
    d = prime_run(tmp_path)
    p = d / where
    p.unlink()
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    else:
        p.symlink_to("/dev/zero")
    words = {"fifo": "FIFO", "dev/zero": "device", "directory": "directory"}[kind]
    child_line(run_cli("objective", d / "token_exports" / "step_1", timeout=30), str(p), words)


def test_damaged_traces_leave_the_groups_out_with_a_note(cli: Cli, tmp_path: Path) -> None:
    """Trace lines of any wrong shape are counted and named; the loss is the same."""
    want = loss(cli, PRIME / "token_exports" / "step_1")
    lines = [
        '{"traces": [{"nodes": [{"token_ids": 5, "mask": {"a": 1}, "logprobs": 3}], '
        '"rewards": {"a": {"score": 1}}}], "group": {"id": 1}}',
        '{"traces": [{"nodes": [{"token_ids": [1, 2], "mask": [true, "x"], "logprobs": ["a"]}],'
        ' "rewards": {"a": {"score": 1}}}], "group": {"id": 1}}',
        '{"traces": [{"nodes": [{"token_ids": [1e400, 2], "mask": [1, 1], "logprobs": [1, 2]}],'
        ' "rewards": {"a": {"score": 1}}}], "group": {"id": 1}}',
        '{"traces": [{"nodes": [], "rewards": {"a": {"score": "x"}}}], "group": {"id": [1]}}',
        '{"traces": "x"',
    ]
    d = prime_run(tmp_path, lambda d: (d / TRACES).write_text("\n".join(lines) + "\n"))
    r = cli("objective", d / "token_exports" / "step_1", "--json")
    assert r.exit_code == 0, r.stderr
    assert "5 line(s) of rollouts/step_1" in r.stderr
    assert json.loads(r.stdout)["loss"] == want


CONFIGS = [
    (b'{"loss": {"kl_tau": NaN}}', "configs/trainer.json: config key 'loss.kl_tau' is nan"),
    (b'{"loss": {"kl_tau": -1}}', "'loss.kl_tau' is -1: expected a finite number >= 0"),
    (b'{"loss": {"type": 5}}', "'loss.type' is 5: expected one of 'default', 'ipo'"),
    (b'{"loss": {"dppo_mask_low": "0.2"}}', "'loss.dppo_mask_low' is '0.2'"),
    (b'{"loss": {"adv_tau": ' + b"9" * 400 + b"}}", "'loss.adv_tau' is <an integer of 400"),
    (b'{"loss": {"type": "custom"}}', "loss.type 'custom' runs the user's own loss"),
    (b'{"loss": [1]}', "trainer.json: 'loss' is a list: expected an object"),
    (b"[1, 2]", "trainer.json: not a JSON object"),
    (b'{"loss": ' + b"[" * 100 + b"]" * 100 + b"}", "line 1: JSON nested deeper than 64"),
    (b'{"loss": {"type": "\xff"}}', "trainer.json: not UTF-8 text"),
    (b"", "trainer.json: not JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "words"), CONFIGS)
def test_a_wrong_trainer_config_is_one_line_naming_it(
    cli: Cli, tmp_path: Path, body: bytes, words: str
) -> None:
    d = prime_run(tmp_path, lambda d: (d / "configs" / "trainer.json").write_bytes(body))
    runs: list[list[str | Path]] = [["objective", d / "token_exports" / "step_1"], ["trend", d]]
    for args in runs:
        one_line(cli(*args), words)


def test_a_loss_key_grpo_cli_does_not_read_is_named(cli: Cli, tmp_path: Path) -> None:
    """Never dropped silently: a key of another loss, or of another release's."""
    cfg = {"loss": {"type": "default", "ipo_threshold": 0.5, "ratio_type": "sequence"}}
    d = prime_run(tmp_path, lambda d: (d / "configs" / "trainer.json").write_text(json.dumps(cfg)))
    r = cli("objective", d / "token_exports" / "step_1", "--json")
    assert r.exit_code == 0, r.stderr
    assert "loss.ipo_threshold = 0.5, loss.ratio_type = 'sequence'" in r.stderr
    assert "not applied" in r.stderr
    # the loss is the default's: the keys were not applied
    assert json.loads(r.stdout)["loss"] == loss(cli, PRIME / "token_exports" / "step_1")


def test_absurd_or_missing_steps(cli: Cli, tmp_path: Path) -> None:
    """A step folder of 30 digits is no step_N prime-rl writes (not read); an empty one
    and one without STABLE are skipped by trend, naming them."""

    def edit(d: Path) -> None:
        (d / "token_exports" / ("step_" + "9" * 30)).mkdir()
        (d / "token_exports" / "step_5").mkdir()
        (d / "token_exports" / "step_2" / "STABLE").unlink()

    d = prime_run(tmp_path, edit)
    trend = cli.json("trend", d)
    assert [s["step"] for s in trend["steps"]] == [1]
    one_line(cli("objective", d / "token_exports" / "step_2"), "no STABLE marker")
    one_line(cli("objective", d / "token_exports" / "step_5"), "no STABLE marker")


# ------------------------------------------------------------------ AReaL: the recorder
def _actor() -> Any:
    from .test_areal import _Actor

    return _Actor()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"tokenizer": 5}, TypeError, "tokenizer: expected None or a tokenizer with batch_decode"),
        ({"every_steps": "2"}, TypeError, "every_steps: expected an integer >= 1, got '2'"),
        ({"every_steps": True}, TypeError, "every_steps: expected an integer >= 1, got True"),
        ({"first_step": 0}, ValueError, "first_step: expected an integer >= 1, got 0"),
        ({"group_size": True}, TypeError, "group_size: expected an integer >= 1"),
        ({"token_dtype": np.float32}, TypeError, "token_dtype: expected None, pyarrow"),
    ],
)  # fmt: skip
def test_install_names_each_wrong_argument(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    from grpo_cli.integrations import areal

    with pytest.raises(error, match=words.replace("(", r"\(")):
        areal.install(_actor(), tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


def test_install_names_a_directory_that_is_not_a_path(tmp_path: Path) -> None:
    """Not a path: a TypeError at setup. An existing file where the run goes is, as for
    every recorder, the environment's: one warning at the first step, training goes on."""
    from grpo_cli.integrations import areal

    from .test_areal import _trajectories

    for wrong in (None, 5, ""):
        with pytest.raises(TypeError, match="directory: expected a directory path"):
            areal.install(_actor(), wrong)  # type: ignore[arg-type]
    (tmp_path / "f").write_text("x")
    actor = areal.install(_actor(), tmp_path / "f", group_size=2)
    with pytest.warns(RuntimeWarning, match="recording the areal run failed"):
        actor.ppo_update(_trajectories())
    assert actor.export_stats() == {"ppo_actor/update/actor_loss/avg": 0.5}


@pytest.mark.parametrize(
    ("norm", "error", "words"),
    [
        (5, TypeError, "config.adv_norm: expected a NormConfig"),
        (SimpleNamespace(mean_level="group", std_level="group", group_size="2"), TypeError,
         "config.adv_norm.group_size: expected an integer >= 1, got '2'"),
        ({"mean_level": "group", "std_level": "batch", "group_size": 0}, ValueError,
         "config.adv_norm.group_size: expected an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_install_checks_the_actor_config_at_setup(
    tmp_path: Path, norm: Any, error: type[Exception], words: str
) -> None:
    from grpo_cli.integrations import areal

    actor = _actor()
    actor.config.adv_norm = norm
    with pytest.raises(error, match=words):
        areal.install(actor, tmp_path / "run")


def test_a_dict_norm_config_gives_the_groups(tmp_path: Path) -> None:
    """AReaL's NormConfig as a dict (a YAML config loaded plainly) is read as the
    dataclass: answers i // group_size are a group (was an AttributeError in the step)."""
    import pyarrow.parquet as pq

    from grpo_cli.integrations import areal

    from .test_areal import _trajectories

    actor = _actor()
    actor.config.adv_norm = {"mean_level": "group", "std_level": "group", "group_size": 2}
    areal.install(actor, tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actor.ppo_update(_trajectories())
    t = pq.read_table(tmp_path / "run" / "step_000001" / "rank000-mb000.parquet")
    assert t.column("group").to_pylist() == ["g000001-p00000"] * 2 + ["g000001-p00001"] * 2
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["config"]["adv_norm.group_size"] == 2


def test_config_items_names_a_wrong_config() -> None:
    from grpo_cli.integrations import areal

    for wrong in (5, "cfg", [1]):
        with pytest.raises(TypeError, match="config: expected a PPOActorConfig, a dict or None"):
            areal.config_items(wrong)
    with pytest.raises(TypeError, match=r"config\.reward_norm: expected a NormConfig"):
        areal.config_items({"reward_norm": 3})
    assert areal.config_items(None) == {}
    assert areal.config_items({"eps_clip": 0.2, "adv_norm": {"group_size": 4}}) == {
        "eps_clip": 0.2, "adv_norm.group_size": 4}  # fmt: skip


def test_the_actors_own_tokenizer_without_batch_decode_is_not_used(tmp_path: Path) -> None:
    """The actor's ``tokenizer`` attribute that cannot decode: no completions, and the
    step is recorded (was a warning and recording off at the first step)."""
    import pyarrow.parquet as pq

    from grpo_cli.integrations import areal

    from .test_areal import _trajectories

    actor = _actor()
    actor.tokenizer = "not a tokenizer"
    areal.install(actor, tmp_path / "run", group_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actor.ppo_update(_trajectories())
    t = pq.read_table(tmp_path / "run" / "step_000001" / "rank000-mb000.parquet")
    assert t.num_rows == 4 and (tmp_path / "run" / "step_000001" / "_DONE").exists()
