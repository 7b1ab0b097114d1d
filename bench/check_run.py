"""Benchmark: ``check RUN`` against the same steps checked one by one, in one process.

``--repeat`` alternations of (a) every complete step of the run checked as
``grpo-cli check runs/x/step_N`` checks it alone (its record in ``metrics.jsonl`` read,
its loss calls folded for the logged-metrics comparison), one after the other, and (b)
``check RUN`` over the same run (:func:`grpo_cli.commands.check_run.check_run`: the same
rules, plus the trend rules); the median time of each and the median of the pairs'
ratios b / a (the machine's load drifts less within a pair). The run is
:mod:`bench.run_report`'s (``--steps`` × ``--answers`` × ``--width``), written once.

Usage: python bench/check_run.py [--steps 100] [--answers 256] [--width 400] [--repeat 3]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def single_steps(root: Path) -> float:
    """Every complete step checked alone, as the CLI checks one step (seconds)."""
    from grpo_cli.check.config import load_config
    from grpo_cli.commands.check import run_check
    from grpo_cli.commands.trend import run_steps
    from grpo_cli.io import open_source
    from grpo_cli.io.run import find_run
    from grpo_cli.logged import recorded_metrics
    from grpo_cli.trainers.presets import resolve_run_settings

    t0 = time.perf_counter()
    run = find_run(root)
    assert run is not None
    cfg = load_config(None)
    settings, _ = resolve_run_settings(run.trainer, run.trainer_version, run.config)
    for st in run_steps(run, str(root))[0]:
        src = open_source([str(st.directory)])
        logged = None if src.recorded is None else recorded_metrics(src.recorded, 0.0)
        run_check(src, settings, cfg, logged=logged)
    return time.perf_counter() - t0


def whole_run(root: Path) -> float:
    """``check RUN`` (seconds)."""
    from grpo_cli.check.config import load_config
    from grpo_cli.commands.check_run import check_run
    from grpo_cli.io.run import find_run
    from grpo_cli.trainers.presets import resolve_run_settings

    t0 = time.perf_counter()
    run = find_run(root)
    assert run is not None
    settings, _ = resolve_run_settings(run.trainer, run.trainer_version, run.config)
    check_run(run, settings, load_config(None))
    return time.perf_counter() - t0


def main() -> None:
    sys.path.insert(0, str(HERE))
    from run_report import bench_run

    a, root = bench_run()
    one, whole = [], []
    for _ in range(a.repeat):
        one.append(single_steps(root))
        whole.append(whole_run(root))
    ratio = statistics.median(w / o for o, w in zip(one, whole, strict=True))
    print(
        f"run {root.name}: {a.steps} single-step checks {statistics.median(one):.2f} s, "
        f"check RUN {statistics.median(whole):.2f} s (median paired ratio {ratio:.2f}x, "
        f"{a.repeat} pairs)"
    )


if __name__ == "__main__":
    main()
