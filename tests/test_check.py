"""grpo-cli check: the CI gate. Exit codes, every rule, formats, configuration, baseline."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.check.rules import RULES
from grpo_cli.check.scan import Scan
from grpo_cli.views.json import CHECK_NULLS

from .conftest import SAMPLE, Cli

BROKEN_DIR = SAMPLE / "broken"


def _broken_map() -> dict[str, list[str]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_broken", SAMPLE / "make_broken.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(mod.BROKEN)


BROKEN = _broken_map()


def check_json(cli: Cli, *args: str | Path, code: int | None = None) -> dict[str, Any]:
    r = cli("check", *args, "--format", "json")
    if code is not None:
        assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def statuses(doc: dict[str, Any]) -> dict[str, str]:
    return {r["rule"]: r["status"] for r in doc["results"]}


@pytest.mark.parametrize("name", ["batch.parquet", "batch.npz", "seed_example.npz"])
def test_sample_data_passes(cli: Cli, name: str) -> None:
    doc = check_json(cli, SAMPLE / name, code=0)
    assert doc["passed"] is True
    assert "fail" not in statuses(doc).values()


def test_healthy_broken_baseline_passes_every_rule(cli: Cli) -> None:
    doc = check_json(cli, BROKEN_DIR / "healthy.parquet", code=0)
    s = statuses(doc)
    assert s.pop("on-policy-exact") == "skip"  # opt-in
    assert s.pop("rollout-mismatch") == "skip"  # no rollout_logp logged
    assert s.pop("sampler-support") == "skip"  # (the same)
    assert s.pop("logp-alignment") == "skip"  # nothing to align with
    assert s.pop("zero-variance-advantage") == "skip"  # no logged advantages
    assert s.pop("logged-metrics") == "skip"  # no --logged
    assert set(s.values()) == {"pass"}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_file_fails_exactly_its_rules(cli: Cli, name: str) -> None:
    extra = ["--on-policy"] if "on-policy-exact" in BROKEN[name] else []
    doc = check_json(cli, BROKEN_DIR / name, *extra, code=1)
    assert doc["passed"] is False
    failed = sorted(r for r, s in statuses(doc).items() if s == "fail")
    assert failed == sorted(BROKEN[name])
    for r in doc["results"]:
        assert set(r) == {"rule", "status", "value", "threshold", "message", "examples"}


def test_failure_points_to_the_place(cli: Cli) -> None:
    doc = check_json(cli, BROKEN_DIR / "nan_logp.parquet", code=1)
    finite = next(r for r in doc["results"] if r["rule"] == "finite")
    assert finite["value"] == 1
    ex = finite["examples"][0]
    assert (ex["answer"], ex["token"], ex["group"], ex["field"]) == (5, 3, "q1", "logp")
    assert ex["file"].endswith("nan_logp.parquet")
    # health rules are not evaluated on broken data: skipped, with the reason
    kl = next(r for r in doc["results"] if r["rule"] == "kl-mean")
    assert kl["status"] == "skip" and "integrity failed (finite)" in kl["message"]


def test_integrity_examples_for_lengths_and_empty(cli: Cli) -> None:
    doc = check_json(cli, BROKEN_DIR / "ragged_lengths.parquet", code=1)
    r = next(x for x in doc["results"] if x["rule"] == "lengths-match")
    assert r["examples"][0]["answer"] == 4 and r["examples"][0]["field"] == "old_logp"
    assert r["examples"][0]["length"] == r["examples"][0]["expected"] - 1
    doc = check_json(cli, BROKEN_DIR / "empty_answer.parquet", code=1)
    r = next(x for x in doc["results"] if x["rule"] == "mask-nonempty")
    assert r["value"] == 1 and r["examples"][0]["answer"] == 6


def test_on_policy_rule_is_opt_in(cli: Cli) -> None:
    doc = check_json(cli, BROKEN_DIR / "recomputed.parquet", code=0)
    assert statuses(doc)["on-policy-exact"] == "skip"
    doc = check_json(cli, BROKEN_DIR / "recomputed.parquet", "--on-policy", code=1)
    r = next(x for x in doc["results"] if x["rule"] == "on-policy-exact")
    assert r["value"] > 0 and "logp" in r["examples"][0] and "old_logp" in r["examples"][0]


def test_table_output_readable_without_colour(cli: Cli) -> None:
    r = cli("check", BROKEN_DIR / "clipped.parquet")
    assert r.exit_code == 1
    assert "FAIL  clip-region" in r.stdout and "FAILED" in r.stdout
    assert "\x1b[" not in r.stdout


def test_github_format(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = cli("check", BROKEN_DIR / "kl_mean.parquet", "--format", "github")
    assert r.exit_code == 1
    lines = r.stdout.strip().splitlines()
    assert lines == [line for line in lines if line.startswith(("::error ", "::warning "))]
    assert any(line.startswith("::error title=grpo-cli check kl-mean::") for line in lines)
    text = summary.read_text()
    assert "grpo-cli check: FAILED" in text and "| `kl-mean` | ❌ fail |" in text


def test_junit_format(cli: Cli) -> None:
    r = cli("check", BROKEN_DIR / "kl_spike.parquet", "--format", "junit")
    assert r.exit_code == 1
    suite = ET.fromstring(r.stdout.split("\n", 1)[1])
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.get("tests", "0")) == len(RULES)
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["kl-max"] and suite.get("failures") == "1"
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert skipped == [
        "on-policy-exact", "rollout-mismatch", "sampler-support", "logp-alignment",
        "zero-variance-advantage", "logged-metrics",
    ]  # fmt: skip


def test_config_file_flags_and_severity(cli: Cli, tmp_path: Path) -> None:
    cfg = tmp_path / "check.toml"
    cfg.write_text("[rules.kl-mean]\nfail = 5.0\nwarn = 1.0\n")
    doc = check_json(cli, BROKEN_DIR / "kl_mean.parquet", "--config", cfg, code=0)
    assert statuses(doc)["kl-mean"] == "warn"
    # a flag beats the file
    doc = check_json(
        cli, BROKEN_DIR / "kl_mean.parquet", "--config", cfg, "--rule", "kl-mean.fail=1.5", code=1
    )
    assert statuses(doc)["kl-mean"] == "fail"
    doc = check_json(cli, BROKEN_DIR / "kl_mean.parquet", "-r", "kl-mean.severity=warn", code=0)
    assert statuses(doc)["kl-mean"] == "warn"
    doc = check_json(cli, BROKEN_DIR / "kl_mean.parquet", "-r", "kl-mean.enabled=false", code=0)
    assert statuses(doc)["kl-mean"] == "skip"


def test_pyproject_section_is_found_in_working_directory(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.grpo-cli.check]\non-policy = true\n[tool.grpo-cli.check.rules.clip-region]\n"
        'severity = "warn"\n'
    )
    monkeypatch.chdir(tmp_path)
    doc = check_json(cli, BROKEN_DIR / "clipped.parquet", code=1)  # on-policy now fails
    s = statuses(doc)
    assert s["clip-region"] == "warn" and s["on-policy-exact"] == "fail"


@pytest.mark.parametrize(
    ("toml", "text"),
    [
        ("colour = true\n", "unknown key(s) colour"),
        ("[rules.kl-mean]\nlimit = 1\n", "unknown key rules.kl-mean.limit"),
        ("[rules.no-such-rule]\nfail = 1\n", "unknown rule 'no-such-rule'"),
        ("[rules.kl-mean]\nfail = 'high'\n", "rules.kl-mean.fail must be a finite number"),
        ("[rules\n", "invalid TOML"),
    ],
)
def test_bad_config_is_exit_2(cli: Cli, tmp_path: Path, toml: str, text: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    r = cli("check", SAMPLE / "batch.parquet", "--config", cfg)
    assert r.exit_code == 2 and text in r.stderr and r.stderr.count("\n") == 1


def test_bad_flags_and_unreadable_input_are_exit_2(cli: Cli, tmp_path: Path) -> None:
    assert cli("check", tmp_path / "missing.parquet").exit_code == 2
    r = cli("check", SAMPLE / "batch.parquet", "--format", "xml")
    assert r.exit_code == 2 and "--format" in r.stderr
    r = cli("check", SAMPLE / "batch.parquet", "-r", "kl-mean=1")
    assert r.exit_code == 2 and "RULE.KEY=VALUE" in r.stderr


def test_baseline_drift(cli: Cli, tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    r = cli("check", BROKEN_DIR / "healthy.parquet", "--report", base)
    assert r.exit_code == 0 and json.loads(base.read_text())["passed"] is True
    same = check_json(cli, BROKEN_DIR / "healthy.parquet", "--baseline", base, code=0)
    assert statuses(same)["baseline-drift"] == "pass"
    worse = check_json(
        cli,
        BROKEN_DIR / "kl_spike.parquet",
        "--baseline",
        base,
        "-r",
        "kl-max.severity=warn",
        code=1,
    )
    drift = next(x for x in worse["results"] if x["rule"] == "baseline-drift")
    assert drift["status"] == "fail"
    assert {e["rule"] for e in drift["examples"]} >= {"kl-max", "kl-mean"}
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = cli("check", SAMPLE / "batch.parquet", "--baseline", bad)
    assert r.exit_code == 2 and "not a grpo-cli check JSON report" in r.stderr


def test_unreadable_token_array_is_exit_2_not_a_traceback(cli: Cli, tmp_path: Path) -> None:
    import numpy as np

    np.savez(tmp_path / "s.npz", logp=np.full((2, 3), "x"), rewards=np.ones((1, 2)))
    r = cli("check", tmp_path / "s.npz")
    assert r.exit_code == 2 and "'logp' has dtype <U1" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("rows_per_group", [None, 40, 7])
@pytest.mark.parametrize("workers", ["1", "2", "3"])
def test_check_reports_the_objectives_numbers_to_the_last_digit(
    cli: Cli, tmp_path: Path, rows_per_group: int | None, workers: str
) -> None:
    """check folds the same batches as objective, in the same order, on the same workers:
    its objective section is objective --json itself (it differed in the last digit of the
    KL mean on a file of 6 row groups before)."""
    table = pq.read_table(SAMPLE / "batch.parquet")
    path = tmp_path / "b.parquet"
    pq.write_table(table, path, row_group_size=rows_per_group or table.num_rows)
    objective = cli.json("objective", path, "--workers", workers)
    r = cli("check", path, "--format", "json", "--workers", workers)
    doc = json.loads(r.stdout)
    assert doc["objective"] == objective
    assert doc["engine"] == objective["engine"] and doc["warnings"] == [CHECK_NULLS]
    kl_mean = next(x for x in doc["results"] if x["rule"] == "kl-mean")["value"]
    assert kl_mean == objective["kl"]["mean"]


def test_objective_is_null_with_its_reason_when_integrity_fails(cli: Cli) -> None:
    r = cli("check", SAMPLE / "broken" / "nan_logp.parquet", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["objective"] is None
    assert doc["warnings"] == ["objective: not evaluated: integrity failed (finite)", CHECK_NULLS]


def test_scans_merge_keeping_the_first_examples_by_row() -> None:
    a, b = Scan(nonfinite=3), Scan(nonfinite=4)
    a.nonfinite_ex = [{"answer": r, "token": 0} for r in (20, 21, 22)]
    b.nonfinite_ex = [{"answer": r, "token": t} for r, t in ((3, 1), (3, 0), (40, 0), (41, 0))]
    a.merge(b)
    assert a.nonfinite == 7
    assert [(e["answer"], e["token"]) for e in a.nonfinite_ex] == [
        (3, 0), (3, 1), (20, 0), (21, 0), (22, 0)
    ]  # fmt: skip


def test_residual_advantages_are_named_and_noted(cli: Cli) -> None:
    """Logged advantages of 6e-4 in a group of equal rewards (TRL's float32 residual):
    check fails zero-variance-advantage with the cause; objective notes it and, like the
    trainer, uses them (the clip metrics count those tokens); recomputing gives zeros."""
    path = BROKEN_DIR / "residual_advantages.parquet"
    r = cli("check", path, "--format", "json")
    res = {x["rule"]: x for x in json.loads(r.stdout)["results"]}
    z = res["zero-variance-advantage"]
    assert r.exit_code == 1 and z["status"] == "fail"
    groups = {e["group"] for e in z["examples"]}
    table = pq.read_table(path).to_pydict()
    constant = {
        g for g in set(table["group"])
        if len({r for r, gg in zip(table["reward"], table["group"], strict=True) if gg == g}) == 1
    }  # fmt: skip
    assert groups and groups <= constant
    assert z["value"] == 4 * len(constant)
    assert "float32 group statistics" in z["message"]
    assert all(e["advantage"] == 6e-4 for e in z["examples"])
    healthy = {
        x["rule"]: x
        for x in json.loads(
            cli("check", BROKEN_DIR / "healthy.parquet", "--format", "json").stdout
        )["results"]
    }
    assert healthy["zero-variance-advantage"]["status"] == "skip"  # no logged advantages
    out = cli("objective", path, "--json")
    doc = json.loads(out.stdout)
    assert doc["advantages_source"] == "file"
    assert any("zero-variance groups have nonzero logged advantages" in w for w in doc["warnings"])
    clean = cli.json("objective", path, "--recompute-advantages")
    assert not any("zero-variance" in w for w in clean["warnings"])


def test_a_check_that_can_evaluate_nothing_is_an_input_error(cli: Cli, tmp_path: Path) -> None:
    """It printed PASSED (4 pass, 10 skip) on a parquet of one unrelated column."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), path)
    r = cli("check", path)
    assert r.exit_code == 2 and r.stdout == ""
    assert "check needs logp and reward (with group) or advantage" in r.stderr
    assert "--column FIELD=NAME" in r.stderr
    only_logp = tmp_path / "l.parquet"
    pq.write_table(pa.table({"logp": [[-1.0], [-2.0]]}), only_logp)
    r = cli("check", only_logp)
    assert r.exit_code == 2 and "reward (with group) or advantage" in r.stderr


@pytest.mark.parametrize(
    ("args", "toml", "message"),
    [
        (["--rule", "kl-mean.fail=nan"], None, "kl-mean.fail must be a finite number"),
        (["--rule", "kl-mean.warn=inf"], None, "kl-mean.warn must be a finite number"),
        (["--rule", "ratio-extreme.band=1"], None, "band must be > 1"),
        (["--require", "nope"], None, "--require: unknown rule(s) nope"),
        ([], "[rules.kl-mean]\nfail = nan\n", "kl-mean.fail must be a finite number"),
        ([], "baseline-tolerance = nan\n", "baseline-tolerance must be a finite number"),
        ([], 'rules = "abc"\n', "rules must be a table"),
        ([], "rules = 5\n", "rules must be a table"),
        ([], 'require = "kl-mean"\n', "require must be a list of rule names"),
        ([], "require = ['x']\n", "require: unknown rule(s) x"),
    ],
)
def test_configuration_that_would_disable_a_rule_is_refused(
    cli: Cli, tmp_path: Path, args: list[str], toml: str | None, message: str
) -> None:
    """A NaN threshold silently disabled its rule (`value > nan` is never true)."""
    extra = list(args)
    if toml is not None:
        cfg = tmp_path / "c.toml"
        cfg.write_text(toml)
        extra += ["--config", str(cfg)]
    r = cli("check", SAMPLE / "batch.parquet", *extra)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.splitlines()) == 1


def test_bad_config_files_are_one_line_errors(cli: Cli, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b"\xff\xfe not utf-8")
    r = cli("check", SAMPLE / "batch.parquet", "--config", str(cfg))
    assert r.exit_code == 2 and "invalid TOML" in r.stderr


def test_required_rules_fail_when_skipped(cli: Cli, tmp_path: Path) -> None:
    r = cli("check", SAMPLE / "batch.parquet", "--require", "zero-variance-advantage",
            "--format", "json")  # fmt: skip
    doc = json.loads(r.stdout)
    z = next(x for x in doc["results"] if x["rule"] == "zero-variance-advantage")
    assert r.exit_code == 1 and z["status"] == "fail"
    assert z["message"].startswith("required but not evaluated: ")
    cfg = tmp_path / "c.toml"
    cfg.write_text('require = ["kl-mean"]\n')  # evaluated: no change
    r = cli("check", SAMPLE / "batch.parquet", "--config", str(cfg), "--format", "json")
    assert r.exit_code == 0


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_scan_in_token_slices_finds_the_same(
    cli: Cli, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an answer of millions of tokens is scanned a slice at a time: slices of 3 tokens
    # (cutting answers anywhere) count and place every problem as one pass does; the
    # objective behind the health rules then folds slices too, so its values agree to
    # the order of float additions
    extra = ["--on-policy"] if "on-policy-exact" in BROKEN[name] else []
    whole = check_json(cli, BROKEN_DIR / name, *extra)
    monkeypatch.setattr("grpo_cli.batch.SLICE_TOKENS", 3)
    sliced = check_json(cli, BROKEN_DIR / name, *extra)
    assert _close(sliced["results"], whole["results"])


def _close(a: Any, b: Any) -> bool:
    """Equal documents, floats to 1e-12 relative (the order of float additions)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
