"""Bad input: exit code 2 and one line on stderr naming the file, array or column, and what
is wrong. Never a traceback, never a number."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .conftest import SAMPLE, Cli, random_batch, write_npz, write_parquet


def _fails(cli: Cli, *args: Any, contains: list[str]) -> str:
    r = cli(*args)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("grpo-cli: error: ")
    for text in contains:
        assert text in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture
def batch() -> dict[str, Any]:
    return random_batch(np.random.default_rng(21), n=6, width=5, groups=2)


def test_missing_file(cli: Cli, tmp_path: Path) -> None:
    _fails(cli, "objective", tmp_path / "nope.npz", contains=["nope.npz", "no such file"])


def test_unknown_extension(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("a,b\n")
    _fails(cli, "kl", tmp_path / "x.csv", contains=["x.csv", "expected .parquet", ".npz", ".jsonl"])


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_corrupt_file(cli: Cli, tmp_path: Path, suffix: str) -> None:
    p = tmp_path / f"bad{suffix}"
    p.write_bytes(b"this is not a real file" * 10)
    _fails(cli, "objective", p, contains=[str(p), "cannot read"])


def test_missing_array(cli: Cli, tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", rewards=np.ones((2, 2)))
    _fails(cli, "objective", tmp_path / "a.npz", contains=["a.npz", "'logp' is missing"])
    np.savez(tmp_path / "b.npz", logp=np.zeros((2, 2)))
    _fails(cli, "advantages", tmp_path / "b.npz", contains=["b.npz", "'rewards' is missing"])


def test_shape_mismatch(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    p = write_npz(tmp_path / "a.npz", batch, old_logp=np.zeros((6, 99)))
    width = max(batch["lengths"])
    _fails(
        cli, "objective", p, contains=["a.npz", "'old_logp'", "(6, 99)", f"'logp' has (6, {width})"]
    )


def test_rows_vs_answers_mismatch(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    p = write_npz(tmp_path / "a.npz", batch, rewards=np.ones(5), group=np.zeros(5, int))
    _fails(cli, "objective", p, contains=["a.npz", "6 rows", "5 answers"])


def test_nan_inside_mask_names_answer_and_token(
    cli: Cli, tmp_path: Path, batch: dict[str, Any]
) -> None:
    batch["ref_logp"][3][1] = np.nan
    p = write_npz(tmp_path / "a.npz", batch)
    _fails(cli, "objective", p, contains=["a.npz", "'ref_logp'", "nan", "answer 3, token 1"])
    q = write_parquet(tmp_path / "a.parquet", batch)
    _fails(cli, "kl", q, contains=["a.parquet", "'ref_logp'", "nan", "row 3, token 1"])


def test_inf_reward(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    batch["reward"] = batch["reward"].copy()
    batch["reward"][2] = np.inf
    p = write_npz(tmp_path / "a.npz", batch)
    _fails(cli, "advantages", p, contains=["a.npz", "'rewards'", "inf", "answer 2"])


def test_wrong_dtype(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    width = max(batch["lengths"])
    p = write_npz(tmp_path / "a.npz", batch, logp=np.full((6, width), "x"))
    _fails(cli, "objective", p, contains=["a.npz", "'logp'", "dtype <U1", "expected floats"])
    q = write_npz(tmp_path / "b.npz", batch, mask=np.full((6, width), 0.5))
    _fails(cli, "objective", q, contains=["b.npz", "'mask'", "0/1"])


def test_object_array_is_refused_without_pickle(
    cli: Cli, tmp_path: Path, batch: dict[str, Any]
) -> None:
    obj = np.empty(6, dtype=object)
    obj[:] = [[1.0]] * 6
    p = write_npz(tmp_path / "a.npz", batch, rewards=obj)
    _fails(cli, "advantages", p, contains=["a.npz", "'rewards'", "cannot be loaded"])


def test_empty_mask_row(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    p = write_npz(tmp_path / "a.npz", batch)
    with np.load(p) as z:
        arrays = dict(z)
    arrays["mask"][4] = False
    np.savez(p, **arrays)
    _fails(cli, "objective", p, contains=["a.npz", "answer 4 has no valid token"])


def test_parquet_lengths_differ(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    batch["old_logp"][2] = (
        batch["old_logp"][2][:-1] if len(batch["old_logp"][2]) > 1 else np.zeros(3)
    )
    p = write_parquet(tmp_path / "a.parquet", batch)
    _fails(cli, "objective", p, contains=["a.parquet", "row 2", "'old_logp'", "tokens but 'logp'"])


def test_parquet_null_list_and_not_a_list(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    p = write_parquet(tmp_path / "a.parquet", batch)
    t = pq.read_table(p)
    logp = t.column("logp").to_pylist()
    logp[1] = None
    t = t.set_column(t.schema.get_field_index("logp"), "logp", pa.array(logp))
    pq.write_table(t, p)
    _fails(cli, "kl", p, contains=["a.parquet", "'logp'", "null at row 1"])
    t2 = t.set_column(t.schema.get_field_index("logp"), "logp", pa.array(np.zeros(6)))
    pq.write_table(t2, tmp_path / "b.parquet")
    _fails(cli, "kl", tmp_path / "b.parquet", contains=["'logp'", "expected a list column"])


def test_parquet_missing_group(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    p = write_parquet(tmp_path / "a.parquet", batch)
    pq.write_table(pq.read_table(p).drop(["group"]), p)
    _fails(cli, "advantages", p, contains=["a.parquet", "'group' is missing"])


def test_beta_needs_ref_logp(cli: Cli, tmp_path: Path, batch: dict[str, Any]) -> None:
    p = write_parquet(tmp_path / "a.parquet", batch)
    pq.write_table(pq.read_table(p).drop(["ref_logp"]), p)
    _fails(cli, "objective", p, contains=["a.parquet", "'ref_logp' is missing", "beta = 0.04"])
    r = cli("objective", p, "--beta", "0", "--json")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--scale", "bogus"], "--scale: 'bogus' is not one of group, batch, none"),
        (["--agg", "mean"], "--agg: 'mean' is not one of"),
        (["--ddof", "2"], "--ddof: must be 0 or 1"),
        (["--clip-eps", "-1"], "--clip-eps: must be a finite number >= 0"),
        (["--dual-clip", "0.5"], "--dual-clip: must be > 1"),
        (["--dual-clip", "abc"], "--dual-clip: expected a number or 'off'"),
        (["--preset", "nope"], "--preset: 'nope' is not one of"),
        (["--column", "logp"], "expected FIELD=NAME"),
        (["--column", "foo=bar"], "unknown field 'foo'"),
        (["--column", "logp=missing"], "'missing' (given for logp with --column) not found"),
    ],
)
def test_bad_options(cli: Cli, args: list[str], text: str) -> None:
    _fails(cli, "objective", SAMPLE / "batch.parquet", *args, contains=[text])


def test_max_len_shorter_than_longest_answer(cli: Cli) -> None:
    _fails(
        cli,
        "objective",
        SAMPLE / "seed_example.npz",
        "--agg",
        "seq-mean-token-sum-norm",
        "--max-len",
        "2",
        contains=["--max-len 2", "widest row (3 tokens, masked ones included)"],
    )


def test_usage_errors_exit_2(cli: Cli) -> None:
    r = cli("objective")
    assert r.exit_code == 2
    r = cli("objective", SAMPLE / "batch.parquet", "--clip-eps", "abc")
    assert r.exit_code == 2 and "Traceback" not in r.stderr


@pytest.mark.parametrize("cmd", ["objective", "kl", "advantages", "check"])
def test_empty_input_is_a_clear_error(cli: Cli, tmp_path: Path, cmd: str) -> None:
    t = pa.table(
        {
            "group": pa.array([], pa.int64()),
            "reward": pa.array([], pa.float64()),
            **{f: pa.array([], pa.list_(pa.float32())) for f in ("logp", "old_logp", "ref_logp")},
        }
    )
    pq.write_table(t, tmp_path / "empty.parquet")
    _fails(cli, cmd, tmp_path / "empty.parquet", contains=["empty.parquet", "no answers"])
    empty = np.zeros((0, 3))
    np.savez(
        tmp_path / "empty.npz", rewards=np.zeros((0, 4)), logp=empty, old_logp=empty, ref_logp=empty
    )
    _fails(cli, cmd, tmp_path / "empty.npz", contains=["empty.npz", "no answers"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["objective", "--foo"], "No such option: --foo (see grpo-cli objective --help)"),
        (["objective"], "Missing argument"),
        (["kl", str(SAMPLE / "batch.parquet"), "--workers", "0"], "Invalid value for '--workers'"),
        (["objective", str(SAMPLE / "batch.parquet"), "--ddof", "abc"], "'--ddof'"),
        (["check", str(SAMPLE / "batch.parquet"), "--baseline"], "requires an argument"),
        (["nonsense"], "No such command"),
    ],
)
def test_parser_errors_are_one_line_too(cli: Cli, args: list[str], message: str) -> None:
    """The argument parser's own errors take the same one-line form as every other."""
    _fails(cli, *args, contains=[message])


def test_no_arguments_prints_the_help(cli: Cli) -> None:
    r = cli()
    assert r.exit_code == 0 and "Usage: grpo-cli" in r.stdout and r.stderr == ""


# ------------------------------------------------ each of these was a Python traceback
def test_an_empty_last_answer_is_counted_not_a_crash(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "e.parquet"
    table = pa.table({"group": ["a", "a"], "reward": [1.0, 0.0], "logp": [[-1.0], []]})
    pq.write_table(table, path)
    r = cli("check", path, "--format", "json")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    import json

    doc = json.loads(r.stdout)
    empty = next(x for x in doc["results"] if x["rule"] == "mask-nonempty")
    assert empty["status"] == "fail" and empty["examples"][0]["answer"] == 1


def test_markup_and_control_characters_in_ids_are_shown_as_they_are(
    cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "m.parquet"
    ids = ["[INST]a[/INST]"] * 2 + ["[bold]g0[/bold]"] * 2 + ["x\x1b[31m"] * 2
    pq.write_table(
        pa.table({"group": ids, "reward": [1.0, 0.0, 1.0, 0.5, 0.0, 1.0],
                  "logp": [[-1.0]] * 6}), path)  # fmt: skip
    r = cli("advantages", path)
    assert r.exit_code == 0, r.stderr
    assert "[INST]a[/INST]" in r.stdout and "[bold]g0[/bold]" in r.stdout
    assert "\x1b" not in r.stdout and "x\\x1b[31m" in r.stdout


def test_junit_stays_valid_xml_with_control_characters(cli: Cli, tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    path = tmp_path / "j.parquet"
    pq.write_table(pa.table({"group": ["\x01g", "\x01g"], "reward": [1.0, 0.0],
                             "logp": [[-1.0, float("nan")], [-1.0]]}), path)  # fmt: skip
    r = cli("check", path, "--format", "junit")
    ET.fromstring(r.stdout)  # parses
    assert "\\x01g" in r.stdout


@pytest.mark.parametrize(
    ("make", "message"),
    [
        ("dup", "column(s) 'logp' appear more than once"),
        ("complex", "has dtype complex128, expected integers or strings"),
        ("surrogate", "array 'group' cannot be read as group ids ('utf-8' codec can't encode"),
    ],
)
def test_unreadable_columns_are_named(cli: Cli, tmp_path: Path, make: str, message: str) -> None:
    if make == "dup":
        path = tmp_path / "d.parquet"
        t = pa.Table.from_arrays(
            [pa.array(["a", "a"]), pa.array([1.0, 0.0]), pa.array([[-1.0], [-2.0]]),
             pa.array([[-1.0], [-2.0]])], names=["group", "reward", "logp", "logp"])  # fmt: skip
        pq.write_table(t, path)
    elif make == "surrogate":  # a lone surrogate in a numpy string: no UTF-8 for it
        path = tmp_path / "s.npz"
        np.savez(path, rewards=np.array([1.0, 0.0]), group=np.array(["a\ud800", "b"]))
    else:
        path = tmp_path / "c.npz"
        np.savez(path, rewards=np.array([1.0, 0.0]), group=np.array([1 + 1j, 1 + 1j]),
                 logp=np.full((2, 2), -1.0))  # fmt: skip
    _fails(cli, "advantages", path, contains=[message])


def test_big_endian_group_ids_are_valid(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "be.npz"
    np.savez(path, rewards=np.array([1.0, 0.0, 1.0, 0.0]), group=np.array([1, 1, 2, 2], ">i8"),
             logp=np.full((4, 2), -1.0))  # fmt: skip
    adv = cli.json("advantages", path)["advantages"]
    assert adv == [pytest.approx(x) for x in (1.0, -1.0, 1.0, -1.0)]


def test_huge_rewards_keep_their_advantages(cli: Cli, tmp_path: Path) -> None:
    """±1e200: the squares overflowed and the advantages came out 0, not ±1."""
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"group": ["a", "a", "b", "b", "b"],
                             "reward": [1e200, -1e200, 1e308, 1.5e308, 1e308],
                             "logp": [[-1.0]] * 5}), path)  # fmt: skip
    adv = cli.json("advantages", path)["advantages"]
    assert adv[:2] == [pytest.approx(1.0), pytest.approx(-1.0)]
    assert adv[2:] == [pytest.approx(-(2**-0.5)), pytest.approx(2**0.5), pytest.approx(-(2**-0.5))]


def test_logprobs_too_far_apart_give_inf_and_a_warning(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "h.parquet"
    pq.write_table(pa.table({"group": ["a", "a"], "reward": [1.0, 0.0],
                             "logp": [[-1e308], [-1.0]], "old_logp": [[-1.0], [-1.0]],
                             "ref_logp": [[1e308], [-1.0]]}), path)  # fmt: skip
    for cmd in ("kl", "objective"):
        r = cli(cmd, path, "--json")
        assert r.exit_code == 0 and "Traceback" not in r.stderr and "Warning" not in r.stderr
        import json

        doc = json.loads(r.stdout)
        assert doc["kl"]["mean"] is None
        assert any("non-finite KL estimate" in w for w in doc["warnings"])


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--seed", "-1"], "--seed: must be >= 0"), (["--mean-len", "100000000000000000000"], "")],
)
def test_sample_refuses_what_it_cannot_make(
    cli: Cli, tmp_path: Path, args: list[str], message: str
) -> None:
    _fails(cli, "sample", tmp_path / "s.parquet", *args, contains=[message])


def test_an_unwritable_step_summary_leaves_stdout_empty(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))  # a directory
    _fails(cli, "check", SAMPLE / "broken" / "kl_spike.parquet", "--format", "github",
           contains=["$GITHUB_STEP_SUMMARY", "cannot write"])  # fmt: skip


# ------------------------------------------------------- valid inputs that were refused
def _objective_of(cli: Cli, path: Path) -> float:
    doc = cli.json("objective", path, "--beta", "0")
    value: float = doc["objective"]
    return value


def test_writers_column_types_give_the_same_numbers(cli: Cli, tmp_path: Path) -> None:
    """Categorical ids, fixed-size lists, decimals, string_view, nulls where the mask is
    False: the same objective as the plain types."""
    import decimal

    plain: dict[str, Any] = {
        "group": ["a", "a", "b", "b"],
        "reward": [1.0, 0.0, 1.0, 0.5],
        "logp": [[-1.0, -2.0], [-0.5, -1.0], [-0.25, -3.0], [-1.5, -0.75]],
        "old_logp": [[-1.1, -2.0], [-0.5, -0.9], [-0.25, -3.2], [-1.4, -0.75]],
    }
    base = tmp_path / "plain.parquet"
    pq.write_table(pa.table(plain), base)
    expected = _objective_of(cli, base)
    variants: dict[str, dict[str, Any]] = {
        "dict": {**plain, "group": pa.array(plain["group"]).dictionary_encode()},
        "view": {**plain, "group": pa.array(plain["group"], pa.string_view())},
        "fixed": {**plain, "logp": pa.array(plain["logp"], pa.list_(pa.float64(), 2)),
                  "old_logp": pa.array(plain["old_logp"], pa.list_(pa.float64(), 2))},
        "decimal": {**plain, "reward": pa.array([decimal.Decimal(str(r)) for r in plain["reward"]],
                                                pa.decimal128(4, 2))},
    }  # fmt: skip
    for name, cols in variants.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table(cols), path)
        assert _objective_of(cli, path) == expected, name
    # a null where the mask is False is padding; the same answers with one more token
    masked: dict[str, Any] = {k: [list(v) for v in vals] if k in ("logp", "old_logp") else vals
                              for k, vals in plain.items()}  # fmt: skip
    masked["logp"][0] = [*masked["logp"][0], None]
    masked["old_logp"][0] = [*masked["old_logp"][0], None]
    masked["mask"] = [[True, True, False], [True, True], [True, True], [True, True]]
    path = tmp_path / "masked.parquet"
    pq.write_table(pa.table(masked), path)
    assert _objective_of(cli, path) == expected
    masked["mask"][0][2] = True  # inside the mask: an error naming the place
    pq.write_table(pa.table(masked), path)
    _fails(cli, "objective", path, "--beta", "0", contains=["'logp'", "row 0, token 2"])


def test_files_named_like_patterns_and_upper_case_suffixes(cli: Cli, tmp_path: Path) -> None:
    table = pq.read_table(SAMPLE / "batch.parquet")
    literal = tmp_path / "run[1].parquet"
    pq.write_table(table, literal)
    expected = cli.json("objective", SAMPLE / "batch.parquet")["objective"]
    assert cli.json("objective", literal)["objective"] == expected
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(table.slice(0, 100), d / "a.PARQUET")
    pq.write_table(table.slice(100), d / "b.pq")
    assert math.isclose(cli.json("objective", d)["objective"], expected, rel_tol=1e-12)


def test_files_whose_types_differ_compatibly_are_one_dataset(cli: Cli, tmp_path: Path) -> None:
    a = {"group": ["a", "a"], "reward": pa.array([1, 0], pa.int64()), "logp": [[-1.0], [-2.0]]}
    b = {"group": ["b", "b"], "reward": pa.array([1.0, 0.5]), "logp": [[-1.0], [-3.0]]}
    pq.write_table(pa.table(a), tmp_path / "a.parquet")
    pq.write_table(pa.table(b), tmp_path / "b.parquet")
    adv = cli.json("advantages", tmp_path)["advantages"]
    assert adv == [pytest.approx(x) for x in (1.0, -1.0, 1.0, -1.0)]


def test_every_null_number_has_its_warning(cli: Cli, tmp_path: Path) -> None:
    """A sampler 1e4 nats off overflows exp(δ); subnormal rewards with --eps 0 gave null
    advantages: now ±1, and the overflowed rollout statistics are named in warnings."""
    roll = tmp_path / "r.parquet"
    pq.write_table(pa.table({"group": ["a", "a"], "reward": [1.0, 0.0],
                             "logp": [[-1.0], [-2.0]], "old_logp": [[-1.0], [-2.0]],
                             "rollout_logp": [[-9999.0], [-2.0]]}), roll)  # fmt: skip
    doc = cli.json("objective", roll, "--beta", "0")
    assert doc["rollout"]["kl_k3"] is None
    assert any("rollout.kl_k3" in w for w in doc["warnings"])
    sub = tmp_path / "s.parquet"
    pq.write_table(pa.table({"group": ["a", "a"], "reward": [5e-324, 0.0],
                             "logp": [[-1.0], [-2.0]]}), sub)  # fmt: skip
    assert cli.json("advantages", sub, "--eps", "0")["advantages"] == [1.0, -1.0]


def test_an_npz_that_inflates_to_gigabytes_is_refused_unread(cli: Cli, tmp_path: Path) -> None:
    """A 1 MiB npz declaring a (40000, 4000) float64 logp: advantages never decompress it
    (its row count comes from the header), objective refuses it before loading."""
    import io
    import resource
    import zipfile

    path = tmp_path / "bomb.npz"
    n, width = 40_000, 4_000
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("logp.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(
                fh, {"descr": "<f8", "fortran_order": False, "shape": (n, width)}
            )
            block = np.zeros((1000, width)).tobytes()
            for _ in range(n // 1000):
                fh.write(block)
        for name, arr in (("rewards", np.zeros(n)), ("group", np.arange(n) // 8)):
            buf = io.BytesIO()
            np.save(buf, arr)
            zf.writestr(f"{name}.npy", buf.getvalue())
    assert path.stat().st_size < 2**21
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert len(cli.json("advantages", path)["advantages"]) == n
    _fails(cli, "objective", path, "--beta", "0", contains=["declare 1.2 GiB", "parquet"])
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 300 * 1024  # the 1.2 GiB array was never materialised


def test_timedelta_arrays_are_refused(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "td.npz"
    np.savez(f, logp=np.array([[1, 2]], dtype="timedelta64[s]"), advantages=np.array([1.0]))
    cli.error(["objective", str(f), "--beta", "0"], "'logp' has dtype timedelta64[s]")
    g = tmp_path / "td_rewards.npz"
    np.savez(g, rewards=np.array([[1, 2]], dtype="timedelta64[s]"))
    cli.error(["advantages", str(g)], "'rewards' has dtype timedelta64[s]")


def test_objective_warns_on_positive_log_probs(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "pos.npz"
    logp = np.array([[0.5, -1.0, 0.7], [-0.2, 0.1, -0.3]])
    mask = np.array([[True, True, False], [True, True, True]])  # 0.7 is padding: not counted
    np.savez(f, logp=logp, old_logp=logp - 0.01, advantages=np.array([1.0, -1.0]), mask=mask)
    doc = cli.json("objective", f, "--beta", "0")
    said = [w for w in doc["warnings"] if "log-prob > 0" in w]
    assert len(said) == 2
    assert said[0].startswith("2 valid token(s) of 'logp'")
    assert said[1].startswith("2 valid token(s) of 'old_logp'")  # 0.49 and 0.09


def test_logged_advantages_beyond_float64_are_null_with_a_warning(cli: Cli, tmp_path: Path) -> None:
    # found by the fuzz suite: recomputed − logged overflowed with a RuntimeWarning
    f = tmp_path / "ov.parquet"
    pq.write_table(pa.table({"group": [0, 0, 1, 0, 0], "reward": [0, 0, 7.98e307, 0, 0],
                             "advantage": [0, 0, -1e308, 0, 0]}), f)  # fmt: skip
    doc = cli.json("advantages", f, "--preset", "verl")
    assert doc["logged_advantages_max_abs_diff"] is None
    assert any("logged_advantages_max_abs_diff is null" in w for w in doc["warnings"])


def _warnings(x: Any) -> list[str]:
    """Every warning of a document, nested ones too (check's objective has its own)."""
    if isinstance(x, dict):
        own = list(x.get("warnings") or [])
        return own + [w for k, v in x.items() if k != "warnings" for w in _warnings(v)]
    if isinstance(x, list):
        return [w for v in x for w in _warnings(v)]
    return []


def _null_paths(x: Any, path: str = "") -> list[str]:
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in _null_paths(v, f"{path}.{k}")]
    if isinstance(x, list):
        return [p for i, v in enumerate(x) for p in _null_paths(v, f"{path}[{i}]")]
    return [path] if x is None else []


@pytest.mark.parametrize("with_extras", [False, True])
def test_every_null_of_objective_json_has_its_warning(
    cli: Cli, tmp_path: Path, with_extras: bool
) -> None:
    """Outside `settings` and the trainer's name (null: off, documented), each null names
    its block in a warning."""
    f = tmp_path / "few.parquet"
    cols: dict[str, Any] = {"advantage": [1.0, -1.0], "logp": [[-1.0, -2.0], [-0.5]]}
    if with_extras:
        cols |= {"old_logp": [[-1.1, -2.0], [-0.4]], "ref_logp": [[-1.0, -2.5], [-0.6]],
                 "reward": [1.0, 0.0], "group": ["a", "a"]}  # fmt: skip
    pq.write_table(pa.table(cols), f)
    doc = cli.json("objective", f, "--beta", "0")
    nulls = [p for p in _null_paths(doc) if not p.startswith((".settings", ".trainer_metrics"))]
    assert nulls  # e.g. the open ratio bin
    for p in nulls:
        block = p.split(".")[1].split("[")[0]
        named = p[1:].split("[")[0] if block == "counts" else block
        assert any(named in w for w in doc["warnings"]), (p, doc["warnings"])


@pytest.mark.parametrize("with_extras", [False, True])
@pytest.mark.parametrize(
    "cmd", ["kl", "advantages", "answers", "trend", "explain", "check"], ids=str
)
def test_every_null_of_every_command_has_its_warning(
    cli: Cli, tmp_path: Path, with_extras: bool, cmd: str
) -> None:
    """The same walk for the other commands' JSON: a null outside ``settings`` names its
    block (or, in a list of rows, its field) in a warning of the document."""
    f = tmp_path / "step_3.parquet"
    cols: dict[str, Any] = {
        "group": ["a", "a", "b"],
        "reward": [1.0, 0.0, 1.0],
        "logp": [[-1.0, -2.0], [-0.5], [-0.7]],
        "ref_logp": [[-1.0, -2.5], [-0.6], [-0.8]],
    }
    if with_extras:
        cols |= {"old_logp": [[-1.1, -2.0], [-0.4], [-0.7]],
                 "rollout_logp": [[-1.1, -2.1], [-0.4], [-0.7]],
                 "entropy": [[0.5, 0.4], [0.3], [0.2]]}  # fmt: skip
    pq.write_table(pa.table(cols), f)
    if cmd == "check":
        r = cli("check", f, "--format", "json")
        assert r.exit_code in (0, 1), r.stderr
        doc = json.loads(r.stdout)
    else:
        doc = cli.json(cmd, f)
    nulls = [p for p in _null_paths(doc) if not p.startswith((".settings", ".trainer_metrics"))]
    nulls = [p for p in nulls if not p.startswith((".objective.settings", ".objective.trainer_m"))]
    said = " ".join(_warnings(doc))
    for p in nulls:
        parts = [q.split("[")[0] for q in p[1:].split(".")]
        assert any(part and part in said for part in parts), (p, doc.get("warnings"))


# ------------------------------------------------------------- one hint policy (issue 21)
def test_a_missing_field_names_its_aliases_what_the_file_has_and_the_fix(
    cli: Cli, tmp_path: Path
) -> None:
    p = tmp_path / "a.parquet"
    pq.write_table(
        pa.table({"prompt": ["a", "a"], "reward": [1.0, 0.0], "logp": [[-1.0], [-2.0]]}), p
    )
    line = _fails(cli, "advantages", p, contains=["'group' is missing", "--column group=prompt"])
    assert "group_id" in line and "uid" in line and "the file has: prompt, reward, logp" in line
    line = _fails(cli, "kl", p, contains=["'ref_logp' is missing", "--column ref_logp=NAME"])
    assert "ref_log_prob" in line and "base_action_log_probs" in line


def test_nan_without_a_mask_says_there_is_no_mask(cli: Cli, tmp_path: Path) -> None:
    lp = np.full((2, 3), -1.0)
    lp[1, 2] = np.nan  # padding written as NaN, and no mask array
    p = tmp_path / "a.npz"
    np.savez(p, logp=lp, rewards=np.array([[1.0, 0.0]]))
    want = ["no mask: every token counts", "answer 1, token 2", "--column mask="]
    _fails(cli, "objective", p, "--beta", "0", contains=want)


def test_a_token_array_of_the_wrong_rank_says_the_shape_expected(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "a.npz"
    np.savez(p, logp=np.full(6, -1.0), rewards=np.array([[1.0, 0.0]]))
    _fails(cli, "objective", p, "--beta", "0", contains=["'logp' has shape (6,)", "(N, L)"])


def test_an_absurd_declared_shape_names_its_array(cli: Cli, tmp_path: Path) -> None:
    import io
    import zipfile

    path = tmp_path / "absurd.npz"
    with zipfile.ZipFile(path, "w") as zf:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": "<f8", "fortran_order": False, "shape": (1 << 20, 1 << 17)}
        )
        zf.writestr("ref_logp.npy", buf.getvalue())  # a header and no data
        for name, arr in (("logp", np.zeros((1, 1))), ("rewards", np.zeros((1, 1)))):
            b = io.BytesIO()
            np.save(b, arr)
            zf.writestr(f"{name}.npy", b.getvalue())
    _fails(cli, "objective", path, contains=["array 'ref_logp' alone declares", "parquet"])


def test_files_of_incompatible_types_name_the_file(cli: Cli, tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    base = {"group": ["a", "a"], "logp": [[-1.0], [-2.0]]}
    pq.write_table(pa.table({**base, "reward": [1.0, 0.0]}), d / "a.parquet")
    pq.write_table(pa.table({**base, "reward": ["1", "0"]}), d / "b.parquet")
    want = ["b.parquet: column 'reward' has type string", "a.parquet has double"]
    _fails(cli, "objective", d, "--beta", "0", contains=want)


def test_a_deeply_nested_baseline_is_one_line(cli: Cli, tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text("[" * 100_000 + "]" * 100_000)
    r = cli("check", SAMPLE / "batch.parquet", "--baseline", base)
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: --baseline"), r.stderr
