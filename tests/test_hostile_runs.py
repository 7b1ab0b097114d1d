"""Hostile recorded runs, JSON files and JSON lines (issue 27): every input ends in a
result or one ``grpo-cli: error:`` line naming the file (and the line, the key or the
field), at once, within bounded memory; never a crash, a traceback, a hang or a silently
dropped value. The inputs are the measured failures, or ones of the same kind."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.integrations._writer import RunWriter, rollout_table
from grpo_cli.io.bounded import MAX_DEPTH

from .conftest import Cli


def make_run(
    root: Path,
    *,
    steps: tuple[int, ...] = (1, 2),
    config: dict[str, Any] | None = None,
    trainer: str = "trl",
    metrics: bool = True,
    info: dict[str, Any] | None = None,
) -> Path:
    """A recorded run of TRL 1.16.0 (bnpo, β 0) written by the recorders' writer: one call a
    step, 8 answers of 6 tokens, and a metrics line a step."""
    rng = np.random.default_rng(5)
    config = {"loss_type": "bnpo", "beta": 0.0} if config is None else config
    w = RunWriter(root, trainer=trainer, trainer_version="1.16.0", config=config)
    for step in steps:
        n, width = 8, 6
        old = -rng.exponential(1.0, (n, width))
        t = rollout_table(
            group=[f"g{step}-{i // 4}" for i in range(n)],
            reward=rng.integers(0, 2, n).astype(float),
            advantage=rng.normal(0, 1, n),
            mask=np.ones((n, width), bool),
            tokens={
                "logp": np.minimum(old + rng.normal(0, 0.1, (n, width)), -1e-3),
                "old_logp": old,
            },
        )
        meta = {"micro_batches": 1, "num_items_in_batch": n * width, **(info or {})}
        w.write_micro_batch(step, 0, t, meta)
        w.finish_step(step)
        if metrics:
            w.append_metrics({"step": step, "loss": 0.1, "entropy": 1.0})
    return root


def one_line(r: Any, *words: str) -> str:
    """The run failed with exit 2 and one error line holding every word."""
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return str(lines[0])


def run_cli(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """grpo-cli in a child process: a crash (SIGSEGV) or a hang is the child's, reported
    here as a failed assertion instead of killing or stalling the test session."""
    return subprocess.run(
        [sys.executable, "-m", "grpo_cli", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def child_line(r: subprocess.CompletedProcess[str], *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: "), r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


NEMO_LINE = {
    "token_loss_mask": [[0, 1, 1]], "sample_loss_mask": [1], "prev_logprobs": [[0, -1, -1]],
    "rewards": [1.0], "token_ids": [[1, 2, 3]], "advantages": [[0.5, 0.5, 0.5]],
}  # fmt: skip


def jsonl_line(n: int = 3) -> dict[str, Any]:
    return {"group": "p0", "reward": 1.0, "logp": [-0.5] * n, "old_logp": [-0.4] * n}


# ------------------------------------------------------------------ nesting and line limits
def test_a_deeply_nested_jsonl_line_is_refused_not_a_crash(tmp_path: Path) -> None:
    """20,000 levels in a 40 KB line: pyarrow's parser recursed into SIGSEGV (exit -11);
    the byte scan refuses the line, naming it, before any parser sees it."""
    p = tmp_path / "deep.jsonl"
    good = json.dumps(jsonl_line())
    p.write_text(f"{good}\n{good}\n" + '{"logp": ' + "[" * 20000 + "]" * 20000 + "}\n")
    for cmd in ("objective", "check"):
        child_line(run_cli(cmd, p, "--beta", "0"), str(p), "line 3", "nested deeper")


def test_a_deep_first_line_is_refused_before_its_types_are_read(tmp_path: Path) -> None:
    p = tmp_path / "deep.jsonl"
    p.write_text('{"logp": ' + "[" * 20000 + "]" * 20000 + "}\n")
    child_line(run_cli("objective", p, "--beta", "0"), "line 1", f"{MAX_DEPTH} levels")


def test_a_deep_nemo_rl_line_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "train_data_step3.jsonl"
    line = NEMO_LINE
    deep = dict(line, content="[" * 30000)  # brackets in a string do not count
    p.write_text(json.dumps(line) + "\n" + json.dumps(deep) + "\n"
                 + '{"x": ' + "[" * 30000 + "]" * 30000 + "}\n")  # fmt: skip
    for cmd in ("objective", "check", "trend"):
        child_line(run_cli(cmd, p, "--beta", "0"), str(p), "line 3", "nested deeper")


def test_a_deeply_nested_object_chain_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "deep.jsonl.gz"
    text = json.dumps(jsonl_line()) + "\n" + '{"a": ' * 5000 + "1" + "}" * 5000 + "\n"
    p.write_bytes(gzip.compress(text.encode()))
    child_line(run_cli("objective", p, "--beta", "0"), "line 2", "nested deeper")


def test_a_line_longer_than_the_limit_is_refused_naming_it(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is checked while the line is gathered: its text is never held whole (here
    the limit is made 4 KiB; MAX_LINE is 256 MiB)."""
    monkeypatch.setattr("grpo_cli.io.readers._jsonlines.MAX_LINE", 4096)
    monkeypatch.setattr("grpo_cli.io.readers._jsonlines.CHUNK_MIN", 1024)
    monkeypatch.setattr("grpo_cli.io.readers._jsonlines.CHUNK_MAX", 1024)
    monkeypatch.setattr("grpo_cli.io.readers.jsonl.PASS1_BYTES", 1024)
    p = tmp_path / "long.jsonl"
    short = json.dumps(jsonl_line())
    p.write_text(f"{short}\n\n{short}\n" + json.dumps(jsonl_line(2000)) + f"\n{short}\n")
    one_line(cli("objective", p, "--beta", "0"), str(p), "line 4", "longer than 0.00390625 MiB")
    p.write_text(json.dumps(jsonl_line(2000)) + "\n")
    one_line(cli("objective", p, "--beta", "0"), "first answer's line is longer")


def test_lines_within_the_limits_read_as_before(cli: Cli, tmp_path: Path) -> None:
    """Brackets and escaped quotes inside strings, nesting up to the limit in a key the
    reader skips, CRLF and blank lines: read, the objective the same as without them."""
    p, q = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows = [dict(jsonl_line(), group=f"p{i // 2}", reward=float(i % 2)) for i in range(4)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    odd = [dict(r, note='a "[[[" \\" {', extra=json.loads("[" * 60 + "]" * 60)) for r in rows]
    q.write_text("\r\n\n".join(json.dumps(r) for r in odd) + "\r\n")
    a = cli.json("objective", p, "--beta", "0")
    b = cli.json("objective", q, "--beta", "0")
    assert a["objective"] == b["objective"] and a["counts"] == b["counts"]
    assert a["counts"]["answers"] == 4


# ------------------------------------------------------------------- files that are not files
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_logged_on_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    fifo = tmp_path / "metrics.fifo"
    os.mkfifo(fifo)
    r = run_cli("objective", run / "step_000001", "--logged", fifo, timeout=30)
    child_line(r, str(fifo), "a FIFO (named pipe), not a regular file")


def test_logged_on_a_device_is_refused_at_once(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    r = run_cli("objective", run / "step_000001", "--logged", "/dev/zero", timeout=30)
    child_line(r, "/dev/zero", "a device, not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_for_meta_json_or_metrics_is_named(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    r = run_cli("check", run / "step_000001", "--format", "json", timeout=30)
    doc = json.loads(r.stdout)
    rule = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert rule["message"].startswith("unreadable:") and "FIFO" in rule["message"]
    (run / "meta.json").rename(run / "meta.json.real")
    os.mkfifo(run / "meta.json")
    child_line(run_cli("objective", run / "step_000001", timeout=30), "meta.json", "FIFO")


# --------------------------------------------------------------------------- metrics.jsonl
DAMAGED = {
    "cut mid-write": b'{"step": 2, "loss": 0.1, "entr',
    "not an object": b"[1, 2, 3]",
    "invalid UTF-8": b'{"step": 2, "loss": 0.1, "x": "\xff\xfe"}',
    "a million levels": b'{"step": 2, "x": ' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}",
}


@pytest.mark.parametrize("kind", DAMAGED)
def test_a_damaged_metrics_line_is_named_not_read_as_not_logged(
    cli: Cli, tmp_path: Path, kind: str
) -> None:
    run = make_run(tmp_path / "run")
    lines = (run / "metrics.jsonl").read_bytes().splitlines()
    (run / "metrics.jsonl").write_bytes(lines[0] + b"\n" + DAMAGED[kind] + b"\n")
    r = cli("check", run / "step_000002", "--format", "json")
    doc = json.loads(r.stdout)
    rule = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert rule["status"] == "skip" and rule["message"].startswith("unreadable:"), rule
    assert "metrics.jsonl: line 2" in rule["message"]
    said = cli.json("objective", run / "step_000002")["warnings"]
    assert any("metrics.jsonl: 1 line(s) could not be read" in w for w in said), said
    assert any("line 2 is " in w and "it may be step 2's record" in w for w in said), said
    # step 1's line is whole: compared, with the damaged line named in the warnings
    doc1 = cli.json("objective", run / "step_000001")
    assert doc1["logged"]["metrics"] and any("line 2" in w for w in doc1["warnings"])
    # --logged FILE --logged-step 2 names the line; step 1 is read with the note
    one_line(
        cli("objective", run / "step_000001", "--logged", run / "metrics.jsonl",
            "--logged-step", "2"),
        "metrics.jsonl: line 2 is ",
    )  # fmt: skip


def test_a_step_not_logged_is_still_not_logged(cli: Cli, tmp_path: Path) -> None:
    """A damaged line of another step does not make this one unreadable."""
    run = make_run(tmp_path / "run", steps=(1, 2, 3))
    lines = (run / "metrics.jsonl").read_bytes().splitlines()
    (run / "metrics.jsonl").write_bytes(lines[0] + b"\n" + lines[2][:-5] + b"\n")
    doc = json.loads(cli("check", run / "step_000002", "--format", "json").stdout)
    rule = next(x for x in doc["results"] if x["rule"] == "logged-metrics")
    assert rule["message"] == "no --logged metrics given", rule


@pytest.mark.parametrize("big", ["1" + "0" * 400, "-" + "9" * 5000])
def test_integers_beyond_float_are_null_with_a_warning(cli: Cli, tmp_path: Path, big: str) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    (run / "metrics.jsonl").write_text(f'{{"step": 1, "loss": 0.1, "kl": {big}}}\n')
    doc = cli.json("objective", run / "step_000001")
    names = [m["metric"] for m in doc["logged"]["metrics"]]
    assert "loss" in names and "kl" not in names
    assert any("'kl'" in w and "beyond float" in w for w in doc["warnings"]), doc["warnings"]
    logged = tmp_path / "logged.json"
    logged.write_text(f'{{"loss": 0.1, "entropy": {big}}}')
    doc = cli.json("objective", run / "step_000001", "--logged", logged)
    assert any("'entropy'" in w and "beyond float" in w for w in doc["warnings"])


def test_a_trainer_state_json_is_read_whole(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    state = {"log_history": [{"step": 1, "loss": 0.25}, {"train_runtime": 3.0}]}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state, indent=2))
    doc = cli.json("objective", run / "step_000001", "--logged", path)
    assert [m["logged"] for m in doc["logged"]["metrics"] if m["metric"] == "loss"] == [0.25]


# -------------------------------------------------------------------------------- meta.json
@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("trainer", 7, "'trainer' is 7: expected the trainer's name as a string"),
        ("trainer", None, "'trainer' is None"),
        ("trainer_version", 1.16, "'trainer_version' is 1.16"),
        ("world_size", "2", "'world_size' is '2'"),
        ("world_size", 10**12, "'world_size' is 1000000000000: expected an integer from 1"),
        ("config", [1], "'config' is a list"),
    ],
)
def test_meta_json_fields_of_the_wrong_type(
    cli: Cli, tmp_path: Path, field: str, value: Any, words: str
) -> None:
    run = make_run(tmp_path / "run")
    meta = json.loads((run / "meta.json").read_text())
    meta[field] = value
    (run / "meta.json").write_text(json.dumps(meta))
    for cmd in ("objective", "check", "trend"):
        target = run if cmd == "trend" else run / "step_000001"
        one_line(cli(cmd, target), "meta.json", words)


def test_a_meta_json_nested_too_deep_or_not_json(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    (run / "meta.json").write_text('{"format": "grpo-cli-run", "x": ' + "[" * 100000)
    one_line(cli("objective", run / "step_000001"), "meta.json: line 1: JSON nested deeper")
    (run / "meta.json").write_bytes(b'{"format": "grpo-cli-run", "trainer": "trl\xff"}')
    one_line(cli("objective", run / "step_000001"), "meta.json", "not UTF-8")


# --------------------------------------------------------------------------- recorded steps
def cut(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_file_cut_after_done_is_named(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(1, 2, 3))
    cut(run / "step_000002" / "rank000-mb000.parquet")
    for cmd in ("objective", "check", "answers"):
        one_line(cli(cmd, run / "step_000002"), "step_000002/rank000-mb000.parquet",
                 "cannot read the file's parquet footer")  # fmt: skip
    doc = cli.json("trend", run)
    assert [s["step"] for s in doc["steps"]] == [1, 3]
    said = [w for w in doc["warnings"] if "skipped" in w and "step_000002" in w]
    assert said and "parquet footer" in said[0], doc["warnings"]


def test_a_run_of_only_empty_step_folders_says_so(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=())
    run.mkdir(parents=True, exist_ok=True)
    RunWriter(run, trainer="trl", trainer_version="1.16.0", config={}).write_meta()
    for i in range(10_000):
        (run / f"step_{i:06d}").mkdir()
    one_line(cli("trend", run), "no step of the run can be read: 10000 step folder(s)",
             "10000 not completely written")  # fmt: skip


def test_a_step_number_beyond_int64_is_no_step(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    (run / ("step_" + "9" * 240)).mkdir()  # a name's most (5,000 digits: no file system)
    (run / ("step_" + "9" * 240) / "_DONE").touch()
    doc = cli.json("trend", run)
    assert [s["step"] for s in doc["steps"]] == [1]


def test_logging_steps_of_a_billion_is_bounded_work(cli: Cli, tmp_path: Path) -> None:
    """logging_steps 10⁹ at step 10⁹: the window's steps are counted from the run's
    folders, never listed (a list of 10⁹ steps was a MemoryError)."""
    run = make_run(tmp_path / "run", steps=(10**9,),
                   config={"loss_type": "bnpo", "beta": 0.0, "logging_steps": 10**9})  # fmt: skip
    one_line(cli("objective", run / "step_1000000000"), "logging_steps 1000000000",
             "step 1 of them is not recorded (1 of 1000000000 are)")  # fmt: skip


@pytest.mark.parametrize(
    ("info", "words"),
    [
        ({"micro_batches": "x"}, "'micro_batches' = 'x': expected an integer from 1"),
        ({"micro_batches": 0}, "'micro_batches' = 0"),
        ({"generation": -3}, "'generation' = -3"),
        ({"num_items_in_batch": "48"}, "'num_items_in_batch' = '48': expected a number"),
        ({"world_size": True}, "'world_size' = True"),
    ],
)
def test_a_file_s_recorder_metadata_of_the_wrong_type(
    cli: Cli, tmp_path: Path, info: dict[str, Any], words: str
) -> None:
    run = make_run(tmp_path / "run", info=info)
    for cmd in ("objective", "check"):
        one_line(cli(cmd, run / "step_000001"), "rank000-mb000.parquet", "grpo_cli metadata",
                 words)  # fmt: skip
    doc = cli("trend", run, "--json")
    assert doc.exit_code == 2 or json.loads(doc.stdout)["steps"] == []


RAW = [b'{"generation": Infinity}', b'{"step": 1e400}',
       b'{"micro_batches": 1' + b"0" * 5000 + b"}", b"[" * 10000]  # fmt: skip


@pytest.mark.parametrize("raw", RAW)
def test_raw_recorder_metadata_beyond_numbers(cli: Cli, tmp_path: Path, raw: bytes) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    p = run / "step_000001" / "rank000-mb000.parquet"
    t = pq.read_table(p)
    pq.write_table(t.replace_schema_metadata({b"grpo_cli": raw}), p)
    one_line(cli("objective", run / "step_000001"), str(p), "grpo_cli metadata")


def test_a_schema_the_recorder_never_writes_is_named(cli: Cli, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=(1,))
    p = run / "step_000001" / "rank000-mb000.parquet"
    t = pq.read_table(p)
    bad = t.set_column(t.column_names.index("logp"), "logp", pa.array(["x"] * t.num_rows))
    pq.write_table(bad.replace_schema_metadata(t.schema.metadata), p)
    r = cli("objective", run / "step_000001")
    one_line(r, "logp")


# ---------------------------------------------------------------- NeMo-RL per-token fields
def nemo_lines(**over: Any) -> str:
    rows = []
    for i in range(4):
        d = {
            "token_loss_mask": [[0, 0, 1, 1, 1]], "sample_loss_mask": [1],
            "prev_logprobs": [[0, -1, -1, -2, -1]], "generation_logprobs": [[0, -1.1, -1, -2, -1]],
            "rewards": [float(i % 2)], "token_ids": [[7, 8, 3, 4, 5]], "advantages": [[0.5] * 5],
            "idx": i,
        }  # fmt: skip
        if i == 2:
            d.update(over)
        rows.append(json.dumps(d))
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize(
    ("field", "value", "n"),
    [
        ("prev_logprobs", [[0, -1, -1]], 3),
        ("generation_logprobs", [[0, -1, -1, -2, -1, -3, -3]], 7),
        ("advantages", [[0.5, 0.5]], 2),
        ("token_ids", [[7, 8]], 2),
    ],
)
def test_nemo_rl_fields_of_another_length_are_named(
    cli: Cli, tmp_path: Path, field: str, value: Any, n: int
) -> None:
    """Measured: an IndexError traceback (prev_logprobs), and exit 0 (token_ids shorter than
    the masks: the prompt groups read past the sample)."""
    p = tmp_path / "train_data_step7.jsonl"
    p.write_text(nemo_lines(**{field: value}))
    for cmd in ("objective", "check", "trend"):
        one_line(cli(cmd, p, "--beta", "0"), str(p), "row 2",
                 f"field {field!r} has {n} positions but 'token_loss_mask' has 5")  # fmt: skip


def test_nemo_rl_fields_of_one_length_read(cli: Cli, tmp_path: Path) -> None:
    p = tmp_path / "train_data_step7.jsonl"
    p.write_text(nemo_lines())
    doc = cli.json("objective", p, "--beta", "0")
    assert doc["counts"]["answers"] == 4 and doc["counts"]["tokens"] == 12  # 3 loss tokens each


def test_a_nemo_rl_field_of_nulls_alone_reads(cli: Cli, tmp_path: Path) -> None:
    """Found by test_fuzz_surfaces: a list holding only nulls has Arrow's null type, and
    filling its nulls with 0 raised ArrowInvalid, a traceback, where a list of numbers
    with nulls reads. It reads the same way now."""
    line = {"token_loss_mask": [[0, 1]], "sample_loss_mask": [1], "prev_logprobs": [[0.0, 0.0]],
            "rewards": [0.0], "token_ids": [[0, 0]], "idx": [[None]]}  # fmt: skip
    p = tmp_path / "train_data_step3.jsonl"
    p.write_text(json.dumps(line) + "\n")
    doc = cli.json("objective", p, "--beta", "0")
    assert doc["counts"]["answers"] == 1 and doc["counts"]["tokens"] == 1


# ------------------------------------------------------------------------------- memory
def gz_line(path: Path, size: int) -> Path:
    """One JSONL answer of ``size`` bytes of text (``-0.5`` log-probs), gzipped."""
    chunk = b"-0.5," * 200_000
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"group": "a", "reward": 1.0, "logp": [')
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.write(b"-0.5]}\n")
    return path


def peak_mib(*args: str | Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """A child grpo-cli and its peak RSS (MiB), measured on its own (ru_maxrss of a child
    started by a fresh, small Python)."""
    probe = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(r.stderr); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "grpo_cli", *map(str, args)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return r, int(r.stdout.strip().splitlines()[-1]) / 1024


@pytest.mark.slow
def test_a_1_gib_jsonl_line_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """Measured: one 1 GiB line (gzipped) peaked at 2.1 GB. It is refused, naming the
    limit, once 64 MiB of it are read (peak 0.22 GB here); a line within the limit is
    read under 1 GB."""
    from grpo_cli.io.bounded import MAX_LINE

    big = gz_line(tmp_path / "big.jsonl.gz", 1 << 30)
    r, mib = peak_mib("objective", big, "--beta", "0", "--json")
    child_line(r, str(big), f"longer than {MAX_LINE >> 20} MiB")
    assert mib < 1024, mib
    ok = gz_line(tmp_path / "ok.jsonl.gz", MAX_LINE - (1 << 20))
    r, mib = peak_mib("objective", ok, "--beta", "0", "--json")
    assert r.returncode == 0, r.stderr[-500:]
    assert mib < 1024, mib
