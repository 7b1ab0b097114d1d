"""The benchmark script keeps working: a tiny run of every contender (not a timing test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--scale",
            "0.001",
            "--repeat",
            "1",
            "--data",
            str(tmp_path),
            "--paired",
            "2",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    names: tuple[str, ...] = ("read_table", "read_stream", "grpo-cli", "cli-kl", "cli-check")
    names += ("cli-serial", "cli-numpy", "flat-numpy")
    for name in (*names, "padded"):
        assert f"\n{name} " in out
    for name in ("objective", "kl", "check"):
        assert f"paired (2 alternations): {name} / read_table median " in out
    assert "criterion: objective median <= 1.1x read_table (issue 18): " in out
    for name in ("objective", "advantages"):
        assert f"start-up, {name} on a 20-row file: " in out
    # the streamed objective equals the in-memory float64 one
    rel = float(out.split("relative difference ")[1].split(";")[0])
    assert rel < 1e-12


@pytest.mark.slow
def test_ray_bench_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ray_engine.py"), "--scale", "0.002",
         "--files", "2", "--paired", "1", "--data", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    for name in ("local", "ray", "ray-private"):
        assert f"\n{name} " in out
    assert "paired (1 alternations): ray / local median " in out
    assert "per block (2 blocks): " in out
    # the projection: one row per (S, nodes), the time falling as nodes are added
    rows = [line.split() for line in out.splitlines() if line.startswith("  1000 ")]
    assert [int(r[1]) for r in rows] == [1, 4, 16, 64]
    times = [float(r[4]) for r in rows]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


@pytest.mark.slow
def test_long_answer_bench_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "long_answer.py"), "--tokens", "50000",
         "--data", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    names = ("read", "read-logp", "objective", "kl", "check", "answers", "explain")
    for name in names:
        assert f"\n{name} " in out
    assert "criterion: peak RSS <= 1.25x the read's: " in out
    assert len(list(tmp_path.glob("long_50000_*.parquet"))) == 2


@pytest.mark.slow
def test_commands_bench_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    """bench/commands.py: every speed target against objective, each with its criterion."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "commands.py"), "--tokens", "30000",
         "--paired", "1", "--data", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=300, cwd=ROOT / "bench",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    keys = ("kl", "kl-max", "ratio", "clip", "length", "advantage", "gradient", "rollout")
    limits = {f"answers-{k}": "1.25" for k in keys}
    limits |= {"objective-gradient": "1.25", "explain": "1.3", "check": "1.1"}
    for name, limit in limits.items():
        line = next(x for x in out.splitlines() if x.startswith(f"{name} "))
        assert f"<= {limit}x" in line and (" PASS " in line or " FAIL " in line), line
    assert "load average before: " in out and "load average after: " in out
