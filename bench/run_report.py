"""Benchmark: ``grpo-cli report RUN --html`` against ``grpo-cli trend RUN`` on the same
synthetic recorded run (the recorder's own writer, :class:`grpo_cli.integrations._writer.
RunWriter`), each in a fresh process: ``--repeat`` alternations of the two (their medians
and the median of the pairs' ratios, as the machine's load drifts less within a pair);
``check RUN`` once; the page's size.

The run: ``--steps`` steps of ``--answers`` answers in groups of 8, lengths uniform in
[width/4, width], log-probs drawn as a sampler, trainer and reference a little apart,
a ``prompt`` column (a prompt comes back every few steps) and the tokens' strings; from
the last third of the steps the reference drifts 2 nats away (kl-mean fails there).

Usage: python bench/run_report.py [--steps 100] [--answers 256] [--width 400] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
WORDS = ["the", " answer", " is", " 4", ".", " so", " x", " =", " 2", "\n", " we", " get"]


def write_run(root: Path, *, steps: int, answers: int, width: int, bad: int | None = None,
              seed: int = 0) -> Path:  # fmt: skip
    """A recorded run of ``steps`` steps (see the module's docstring)."""
    from grpo_cli.integrations._writer import RunWriter, rollout_table

    rng = np.random.default_rng(seed)
    w = RunWriter(root, trainer="trl", trainer_version="1.16.0",
                  config={"loss_type": "bnpo", "beta": 0.04, "max_completion_length": width,
                          "num_iterations": 2})  # fmt: skip
    g = 8
    for step in range(1, steps + 1):
        lengths = rng.integers(width // 4, width + 1, answers)
        lengths[rng.random(answers) < 0.1] = width  # some hit the limit
        mask = np.arange(width)[None, :] < lengths[:, None]
        rollout = -rng.exponential(0.8, (answers, width))
        gap = rng.normal(0, 0.02, (answers, width))
        gap[rng.random((answers, width)) < 0.02] += 1.0  # the sampler far below the trainer
        old = np.minimum(rollout + gap, -1e-4)
        jump = rng.normal(0, 0.08, (answers, width))
        jump[rng.random((answers, width)) < 0.03] *= 5  # a few tokens far from old: clipped
        logp = np.minimum(old + jump, -1e-4)
        drift = 2.0 if bad is not None and step >= bad else 0.0
        ref = np.minimum(logp - drift + rng.normal(0, 0.05, (answers, width)), -1e-4)
        reward = rng.integers(0, 2, answers).astype(np.float64)
        reward[:g] = 1.0  # one zero-variance group a step
        prompts = [f"prompt {(step * 3 + i // g) % 40}: what is 2 + 2?" for i in range(answers)]
        t = rollout_table(
            group=[f"s{step}-p{i // g}" for i in range(answers)], reward=reward,
            advantage=None, mask=mask,
            tokens={"logp": logp, "old_logp": old, "ref_logp": ref, "rollout_logp": rollout},
        )  # fmt: skip
        toks = [[WORDS[k] for k in rng.integers(0, len(WORDS), width)] for _ in range(answers)]
        t = t.append_column("prompt", pa.array(prompts))
        t = t.append_column("tokens", pa.array(toks, pa.list_(pa.string())))
        w.write_micro_batch(step, 0, t, {"micro_batches": 1, "num_items_in_batch": answers})
        w.finish_step(step)
    return root


def best(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return min(times)


def paired(a: list[str], b: list[str], n: int) -> tuple[float, float, float]:
    """``n`` alternations of ``a`` and ``b`` (fresh processes): the median time of each
    and the median of the pairs' ratios b / a (a machine's load drifts less within a
    pair than over a whole series)."""
    import statistics

    ta, tb = [], []
    for _ in range(n):
        ta.append(best(a, 1))
        tb.append(best(b, 1))
    ratios = [y / x for x, y in zip(ta, tb, strict=True)]
    return statistics.median(ta), statistics.median(tb), statistics.median(ratios)


def bench_run() -> tuple[argparse.Namespace, Path]:
    """The arguments of a benchmark on a recorded run (``--steps`` × ``--answers`` ×
    ``--width``, ``--repeat``) and the run, written under ``data/`` the first time."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--answers", type=int, default=256)
    ap.add_argument("--width", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    root = HERE / "data" / f"run-{a.steps}x{a.answers}x{a.width}"
    if not root.exists():
        write_run(root, steps=a.steps, answers=a.answers, width=a.width, bad=a.steps * 2 // 3)
    return a, root


def main() -> None:
    a, root = bench_run()
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    cli = [sys.executable, "-m", "grpo_cli"]
    page = out / "run.html"
    trend = [*cli, "trend", str(root), "--json", "--no-progress"]
    report = [*cli, "report", str(root), "--html", str(page), "--no-progress"]
    t_check = best([*cli, "check", str(root), "--format", "json", "--no-progress"], 1)
    t_trend, t_report, ratio = paired(trend, report, a.repeat)
    size = page.stat().st_size if page.exists() else 0
    print(
        f"run {root.name}: trend {t_trend:.2f} s, check {t_check:.2f} s, report --html "
        f"{t_report:.2f} s (median paired ratio {ratio:.2f}x trend, {a.repeat} pairs), "
        f"page {size / 2**20:.2f} MiB"
    )
    shutil.rmtree(out / "profile", ignore_errors=True)


if __name__ == "__main__":
    main()
