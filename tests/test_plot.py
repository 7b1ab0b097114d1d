"""--plot draws the report's figures (matplotlib's Agg backend), at least 800 px wide;
without matplotlib, or with a file name it cannot write, one line and exit 2."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from .conftest import Cli

pytest.importorskip("matplotlib")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", head[16:24])
    return int(w), int(h)


def test_objective_plot(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "objective.png"
    r = cli("objective", "sample_data/batch.parquet", "--plot", out)
    assert r.exit_code == 0, r.stderr
    w, h = _png_size(out)
    assert w >= 800 and h >= 300


def test_trend_plot(cli: Cli, tmp_path: Path) -> None:
    for step in (1, 2):
        assert cli("sample", tmp_path / f"step_{step}.parquet", "--groups", "4",
                   "--seed", str(step), "--extras").exit_code == 0  # fmt: skip
    out = tmp_path / "trend.png"
    r = cli("trend", tmp_path / "step_1.parquet", tmp_path / "step_2.parquet", "--plot", out)
    assert r.exit_code == 0, r.stderr
    assert _png_size(out)[0] >= 800


def test_plot_errors(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli.error(["objective", "sample_data/batch.parquet", "--plot", str(tmp_path / "x.txt")],
              "expected a .png")  # fmt: skip
    cli.error(["objective", "sample_data/batch.parquet", "--plot", str(tmp_path / "no/x.png")],
              "cannot write")  # fmt: skip
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    cli.error(["objective", "sample_data/batch.parquet", "--plot", str(tmp_path / "x.png")],
              "pip install 'grpo-cli[plot]'")  # fmt: skip
