"""Hostile and random inputs: every run ends in exit 0 (results finite, or null with a
warning) or in exit 2 with one line on stderr; never a traceback, never exit 1 outside
check's verdict.

Hypothesis writes random parquet and npz files, valid and broken in the ways logs break
(NaN/inf, nulls, empty lists, ragged fields, huge or subnormal values, odd types, odd
group ids), and runs every command on them in-process.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Cli

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, -0.0, -1e-320, 1e308, -1e308, -1000.0, 5e-324, 1.0, -1.0]),
)
IDS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.text(min_size=0, max_size=6),
    st.sampled_from(["[INST]", "[/b]", "\x1b[31m", "", "a\nb"]),
)


def _nulls(vals: list[Any], flags: list[bool]) -> list[Any]:
    return [None if f else v for v, f in zip(vals, flags, strict=True)]


# moderate log-probs: sums in any order agree to rounding (no overflow to tell apart)
MODERATE = st.floats(-30.0, 0.0, allow_nan=False)


@st.composite
def parquet_tables(draw: st.DrawFn) -> pa.Table:
    n = draw(st.integers(0, 6))
    lengths = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    cols: dict[str, Any] = {}
    group_ids = draw(st.lists(IDS, min_size=n, max_size=n))
    if draw(st.booleans()):  # one type of id per column, as files have
        group_ids = [str(g) for g in group_ids]
    else:
        group_ids = [g if isinstance(g, int) else len(g) for g in group_ids]
    if draw(st.booleans()):
        cols["group"] = group_ids
    if draw(st.booleans()):
        cols["reward"] = _nulls(
            draw(st.lists(VALUES, min_size=n, max_size=n)),
            draw(st.lists(st.booleans(), min_size=n, max_size=n)) if draw(st.booleans())
            else [False] * n,
        )  # fmt: skip
    for field in ("logp", "old_logp", "ref_logp", "rollout_logp", "entropy"):
        if not draw(st.booleans()):
            continue
        ragged = draw(st.booleans()) and draw(st.booleans())
        lists = []
        for k in range(n):
            m = lengths[k] + (draw(st.integers(-1, 1)) if ragged else 0)
            lists.append(draw(st.lists(VALUES, min_size=max(m, 0), max_size=max(m, 0))))
        cols[field] = lists
    if draw(st.booleans()) and "logp" in cols:
        cols["mask"] = [
            draw(st.lists(st.booleans(), min_size=len(x), max_size=len(x))) for x in cols["logp"]
        ]
    if draw(st.booleans()) and n:
        cols["advantage"] = draw(st.lists(VALUES, min_size=n, max_size=n))
    if not cols:
        cols["x"] = list(range(n))
    return pa.table(cols)


def _run(cli: Cli, args: list[str]) -> None:
    r = cli(*args)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    check = args[0] == "check"
    assert r.exit_code in ((0, 1, 2) if check else (0, 2)), (r.exit_code, r.stderr)
    if r.exit_code == 2:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: "), r.stderr
        assert r.stdout == ""
        return
    if "--json" in args or "json" in args:
        doc = json.loads(r.stdout)
        _nulls_have_warnings(doc, args)


def _nulls_have_warnings(doc: dict[str, Any], args: list[str]) -> None:
    """A null where a number stands comes with a warning; numbers are finite."""
    if doc.get("command") == "check":
        if doc["objective"] is None:
            assert doc["warnings"], args  # why it was not evaluated
        else:
            _nulls_have_warnings(doc["objective"], args)
        return
    for key in ("objective", "loss", "policy_term", "kl_term"):
        v = doc.get(key, 0.0)
        if v is None:
            assert doc.get("warnings"), (args, key)
        else:
            assert isinstance(v, float | int) and math.isfinite(v), (key, v)


@st.composite
def valid_tables(draw: st.DrawFn) -> pa.Table:
    """Rollouts every command computes on: 1-8 answers of 1-9 tokens in 1-3 groups,
    moderate log-probs, each optional field present or not, a mask or not."""
    n = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    cols: dict[str, Any] = {
        "group": draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n)),
        "reward": draw(st.lists(st.floats(-2.0, 2.0), min_size=n, max_size=n)),
    }
    for field in ("logp", "old_logp", "ref_logp", "rollout_logp", "entropy"):
        if field == "logp" or draw(st.booleans()):
            cols[field] = [draw(st.lists(MODERATE, min_size=k, max_size=k)) for k in lengths]
    if draw(st.booleans()):
        cols["mask"] = [
            [True, *draw(st.lists(st.booleans(), min_size=k - 1, max_size=k - 1))] for k in lengths
        ]
    return pa.table(cols)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a if k != "engine")
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(table=valid_tables(), cmd=st.sampled_from(["objective", "kl", "check", "answers"]),
       preset=st.sampled_from([None, "verl", "trl", "openrlhf", "gspo"]))  # fmt: skip
def test_random_answers_folded_in_slices_give_the_same(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, table: pa.Table, cmd: str,
    preset: str | None,
) -> None:  # fmt: skip
    # every answer cut into slices of 2 tokens (and the scans and counts likewise): the
    # same exit code, the same error line or the same document as whole answers
    path = tmp_path_factory.mktemp("fuzz") / "f.parquet"
    pq.write_table(table, path)
    args = [cmd, str(path), *(["--format", "json"] if cmd == "check" else ["--json"])]
    if preset and cmd != "kl":
        args += ["--preset", preset]
    if cmd == "objective" and "ref_logp" not in table.column_names:
        args += ["--beta", "0"]
    whole = cli(*args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("grpo_cli.batch.SLICE_TOKENS", 2)
        mp.setattr("grpo_cli.core.COUNT_CHUNK", 2)
        sliced = cli(*args)
    assert sliced.exit_code == whole.exit_code, (whole.stderr, sliced.stderr)
    if whole.exit_code == 2:
        assert sliced.stderr == whole.stderr
    else:
        assert _same(json.loads(whole.stdout), json.loads(sliced.stdout))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(table=parquet_tables(), cmd=st.sampled_from(["objective", "kl", "advantages", "check"]),
       preset=st.sampled_from([None, "verl", "trl", "openrlhf", "gspo"]))  # fmt: skip
def test_random_parquet_never_crashes(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, table: pa.Table, cmd: str,
    preset: str | None,
) -> None:  # fmt: skip
    path = tmp_path_factory.mktemp("fuzz") / "f.parquet"
    pq.write_table(table, path)
    args = [cmd, str(path)]
    if cmd == "check":
        args += ["--format", "json"]
    else:
        args += ["--json"]
    if preset and cmd != "kl":
        args += ["--preset", preset]
    if cmd == "objective" and "ref_logp" not in table.column_names:
        args += ["--beta", "0"]
    _run(cli, args)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(0, 5),
    width=st.integers(0, 4),
    dtype=st.sampled_from(["f4", "f8", "i8", ">f8", "c16", "U3", "?"]),
    shape_2d=st.booleans(),
    with_group=st.booleans(),
    mask_kind=st.sampled_from([None, "bool", "int", "float", "bad"]),
    fill=VALUES,
    cmd=st.sampled_from(["objective", "kl", "advantages", "check"]),
)
def test_random_npz_never_crashes(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, n: int, width: int, dtype: str,
    shape_2d: bool, with_group: bool, mask_kind: str | None, fill: float, cmd: str,
) -> None:  # fmt: skip
    path = tmp_path_factory.mktemp("fuzz") / "f.npz"
    rng = np.random.default_rng(n * 7 + width)
    arrays: dict[str, Any] = {}
    base = -rng.exponential(1.0, size=(n, width))
    if base.size:
        base.flat[0] = fill
    for field in ("logp", "old_logp", "ref_logp"):
        try:
            with np.errstate(all="ignore"):
                arrays[field] = base.astype(dtype)
        except (ValueError, TypeError, OverflowError):
            arrays[field] = base
    if shape_2d and n % 2 == 0 and n:
        arrays["rewards"] = rng.random((2, n // 2))
    else:
        arrays["rewards"] = rng.random(n)
    if with_group:
        arrays["group"] = np.arange(n) // 2
    if mask_kind == "bool":
        arrays["mask"] = rng.random((n, width)) < 0.7
    elif mask_kind == "int":
        arrays["mask"] = (rng.random((n, width)) < 0.7).astype(int)
    elif mask_kind == "float":
        arrays["mask"] = rng.random((n, width))
    elif mask_kind == "bad":
        arrays["mask"] = np.ones((n + 1, width), bool)
    np.savez(path, **arrays)
    args = [cmd, str(path)] + (["--format", "json"] if cmd == "check" else ["--json"])
    _run(cli, args)


def test_object_arrays_in_npz_are_refused_without_unpickling(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "o.npz"
    np.savez(path, logp=np.array([[{"x": 1}]], dtype=object), rewards=np.ones(1))
    r = cli("objective", path, "--json")
    assert r.exit_code == 2 and "Traceback" not in r.stderr
