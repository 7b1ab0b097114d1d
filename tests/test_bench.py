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
    assert "criterion: objective median <= 1.3x read_table: " in out
    for name in ("objective", "advantages"):
        assert f"start-up, {name} on a 20-row file: " in out
    # the streamed objective equals the in-memory float64 one
    rel = float(out.split("relative difference ")[1].split(";")[0])
    assert rel < 1e-12
