"""``grpo-cli losses``: the registry listed from its rows, never from a copy of them."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from typer.testing import CliRunner

from grpo_cli.cli import app
from grpo_cli.losses import CORRECTIONS, LOSSES, MASKS


def _run(*args: str, columns: int = 100) -> Any:
    return CliRunner().invoke(app, ["losses", *args], env={"COLUMNS": str(columns)})


def _listed(*args: str) -> dict[str, Any]:
    res = _run("--json", *args)
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_json_lists_every_row_of_the_registry_with_its_parameters() -> None:
    out = _listed()
    assert out["command"] == "losses" and out["warnings"] == []
    rows = {(r["kind"], r["name"]): r for r in out["rows"]}
    expected = (
        [("loss", n) for n in LOSSES]
        + [("correction", n) for n in CORRECTIONS]
        + [("mask", n) for n in MASKS]
    )
    assert sorted(rows) == sorted(expected)
    for kind, table in (("loss", LOSSES), ("correction", CORRECTIONS), ("mask", MASKS)):
        for name, row in table.items():
            listed = rows[(kind, name)]
            assert listed["trainer"] == row.trainer
            fields = {f.name: f.default for f in dataclasses.fields(row.params)}
            assert [p["name"] for p in listed["params"]] == list(fields)
            for p in listed["params"]:
                assert p["default"] == fields[p["name"]]
                assert p["kind"] == row.params.specs()[p["name"]].kind


def test_loss_rows_say_what_they_force_and_log() -> None:
    rows = {r["name"]: r for r in _listed()["rows"] if r["kind"] == "loss"}
    for name, row in LOSSES.items():
        assert rows[name]["agg"] == row.agg
        assert rows[name]["token_ratio"] == row.token_ratio
        p = row.params() if callable(row.metrics) else None
        assert [m["name"] for m in rows[name]["metrics"]] == [m.name for m in row.metrics_for(p)]


def test_trainer_filter_keeps_that_trainers_rows_and_the_shared_clip() -> None:
    verl = _listed("--trainer", "verl")["rows"]
    assert verl and all(r["trainer"] in ("verl", None) for r in verl)
    assert {r["name"] for r in verl if r["trainer"] is None} <= {"clip"}
    every = {(r["kind"], r["name"]) for r in _listed()["rows"] if r["trainer"] == "verl"}
    assert every <= {(r["kind"], r["name"]) for r in verl}


def test_unknown_trainer_is_one_line_exit_2() -> None:
    res = _run("--trainer", "nope")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: --trainer: 'nope'")


def test_table_names_every_row_at_80_columns() -> None:
    res = _run(columns=80)
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    for name in [*LOSSES, *CORRECTIONS, *MASKS]:
        assert name in res.stdout


def test_slime_and_prime_rl_list_their_own_rows() -> None:
    """``losses --trainer slime`` / ``prime_rl``: exactly the rows whose trainer it is
    (their losses, slime's TIS correction and OPSM mask), and the shared clip."""
    for trainer in ("slime", "prime_rl"):
        want = {
            (kind, name)
            for kind, table in (("loss", LOSSES), ("correction", CORRECTIONS), ("mask", MASKS))
            for name, row in table.items()
            if row.trainer == trainer
        }
        rows = _listed("--trainer", trainer)["rows"]
        assert {(r["kind"], r["name"]) for r in rows if r["trainer"] == trainer} == want
        assert {r["name"] for r in rows if r["trainer"] is None} == {"clip"}
    slime = {r["name"] for r in _listed("--trainer", "slime")["rows"]}
    assert {"slime/ppo_eps_clip", "slime/cispo", "slime-tis", "slime/opsm"} <= slime
    # prime-rl's own spelling of its name lists the same rows
    assert _listed("--trainer", "prime-rl") == _listed("--trainer", "prime_rl")
