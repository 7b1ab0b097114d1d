"""An answer longer than a slice (millions of tokens in a real log) folds a slice of its
tokens at a time, its per-answer sums carried from slice to slice: every number is the one
the whole answer gives. Here slices of a few tokens cut every answer many times."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cli, sample_steps

PRESETS = ("deepseekmath", "trl", "verl", "openrlhf", "dr-grpo", "dapo", "gspo")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = sample_steps(
        tmp_path_factory.mktemp("long"), 1, "--groups", "6", "--group-size", "4",
        "--mean-len", "40", "--extras",
    )  # fmt: skip
    return d / "step_0.parquet"


def close(a: Any, b: Any, path: str = "") -> None:
    """Equal, floats to 1e-12 relative (the sums of slices add in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            if k != "engine":
                close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-14), (path, a, b)
    else:
        assert a == b, (path, a, b)


def both(cli: Cli, monkeypatch: pytest.MonkeyPatch, *args: str | Path) -> tuple[Any, Any]:
    whole = cli.json(*args)
    monkeypatch.setattr("grpo_cli.batch.SLICE_TOKENS", 7)
    sliced = cli.json(*args)
    monkeypatch.undo()
    return whole, sliced


@pytest.mark.parametrize("kernel", ["c", "numpy"])
@pytest.mark.parametrize("preset", PRESETS)
def test_objective_of_sliced_answers_is_the_whole_answers(
    cli: Cli, data: Path, monkeypatch: pytest.MonkeyPatch, preset: str, kernel: str
) -> None:
    if kernel == "numpy":
        monkeypatch.setenv("GRPO_CLI_KERNEL", "numpy")
    whole, sliced = both(cli, monkeypatch, "objective", data, "--preset", preset)
    close(whole, sliced)
    assert whole["counts"]["answers"] == 24  # each answer counted once, not once a slice


@pytest.mark.parametrize("preset", PRESETS)
def test_gradient_of_sliced_answers(
    cli: Cli, data: Path, monkeypatch: pytest.MonkeyPatch, preset: str
) -> None:
    # at sequence level every token's gradient takes answer means: a first pass over the
    # slices gives them; TRL's bias-corrected KL takes the answer's mean KL too
    args = ("objective", data, "--preset", preset, "--gradient", "--beta", "0.04")
    close(*both(cli, monkeypatch, *args))
    close(*both(cli, monkeypatch, *args, "--kl-bias-correction"))
    if preset == "gspo":  # the clamp of the sequence ratio binds on some answers
        close(*both(cli, monkeypatch, *args, "--seq-ratio-clamp", "0.001"))
    if preset == "openrlhf":  # per-token advantages (KL in the reward) at sequence level:
        # the active ρA varies within an answer
        seq = ("--ratio-level", "sequence", "--kl-mode", "reward")
        close(*both(cli, monkeypatch, *args, *seq))
    close(*both(cli, monkeypatch, *args, "--dual-clip", "1.5"))


@pytest.mark.parametrize("trainer", ["openrlhf", "verl"])
def test_kl_in_the_reward(
    cli: Cli, data: Path, monkeypatch: pytest.MonkeyPatch, trainer: str
) -> None:
    # verl sums the KL into the score before the groups (a sum per answer, by slices);
    # OpenRLHF adds it per token and sums it to the end of the answer (suffix sums carried
    # from the last slice back): advantages per token, sliced with the answer
    args = ("objective", data, "--preset", trainer, "--kl-mode", "reward", "--trainer", trainer)
    close(*both(cli, monkeypatch, *args))
    close(*both(cli, monkeypatch, "answers", data, "--top", "30", "--preset", trainer,
                "--kl-mode", "reward", "--sort", "advantage"))  # fmt: skip


SORTS = ("kl", "kl-max", "ratio", "clip", "length", "advantage", "gradient", "rollout")


@pytest.mark.parametrize(
    "cmd",
    [
        ["kl"],
        *(["answers", "--top", "30", "--sort", k] for k in SORTS),
        ["answers", "--top", "30", "--preset", "gspo"],
        ["answers", "--top", "30", "--preset", "gspo", "--sort", "gradient"],
        ["answers", "--top", "30", "--preset", "gspo", "--beta", "0.04", "--sort", "gradient"],
        [
            "answers",
            "--top",
            "30",
            "--preset",
            "openrlhf",
            "--kl-mode",
            "reward",
            "--sort",
            "advantage",
        ],
    ],
)
def test_other_commands_of_sliced_answers(
    cli: Cli, data: Path, monkeypatch: pytest.MonkeyPatch, cmd: list[str]
) -> None:
    close(*both(cli, monkeypatch, cmd[0], data, *cmd[1:]))


def _long_file(path: Path, n: int) -> Path:
    """Two answers of ``n`` tokens each (float32, as trainers log them)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    old = (-rng.exponential(0.5, n)).astype(np.float32)
    cols = {"old_logp": old}
    cols["logp"] = (old + rng.normal(0, 0.05, n)).astype(np.float32)
    cols["ref_logp"] = (old + rng.normal(0, 0.05, n)).astype(np.float32)
    offsets = pa.array([0, n], pa.int32())
    table = {"group": ["g0", "g1"], "reward": [1.0, 0.0]}
    table |= {
        k: pa.ListArray.from_arrays(offsets, pa.array(v)).take([0, 0]) for k, v in cols.items()
    }
    pq.write_table(pa.table(table), path)
    return path


@pytest.fixture(scope="module")
def long_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("longer")
    return [_long_file(d / f"long_{n}.parquet", n) for n in (1_000_000, 3_000_000)]


@pytest.mark.parametrize(
    "cmd",
    [
        ["objective"],
        ["objective", "--preset", "gspo", "--gradient"],
        ["objective", "--preset", "openrlhf", "--kl-mode", "reward", "--trainer", "openrlhf"],
        ["kl"],
        ["check", "--format", "json"],
        ["answers", "--json"],
        ["answers", "--json", "--preset", "gspo"],
    ],
)
def test_memory_of_an_answer_does_not_grow_with_its_length(
    cli: Cli, long_files: list[Path], monkeypatch: pytest.MonkeyPatch, cmd: list[str]
) -> None:
    # the numpy memory a command takes (tracemalloc sees numpy's buffers) on two answers
    # of 1M, then of 3M tokens: the same to within 4 MiB once an answer is folded in slices
    # of 16k tokens (whole answers took tens of MiB more). OpenRLHF's KL in the reward keeps
    # its per-token advantages (8 bytes a token, both answers in flight), allowed for. One
    # worker: with two, which partials coexist at the peak varies by ±4 MiB from run to run.
    import tracemalloc

    monkeypatch.setattr("grpo_cli.batch.SLICE_TOKENS", 1 << 14)
    monkeypatch.setattr("grpo_cli.core.COUNT_CHUNK", 1 << 14)
    # the fold's memory, not the read's: the page decoder holds a long answer's values in
    # numpy (tracemalloc sees them, pyarrow's it does not); tests/test_pages.py bounds it
    monkeypatch.setattr("grpo_cli.io.pages.ENABLED", False)
    peaks = []
    for path in long_files:
        tracemalloc.start()
        try:
            r = cli(cmd[0], path, *cmd[1:], "--workers", "1")
            peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        finally:
            tracemalloc.stop()
        assert r.exit_code in (0, 1), r.stderr
    per_token = 8 * 2 * 2_000_000 / 2**20 if "reward" in cmd else 0.0  # two answers
    assert peaks[1] - peaks[0] < 4 + per_token, peaks
