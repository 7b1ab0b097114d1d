"""Benchmark: every token-reading command against ``objective`` on the same file.

The speed targets of the commands that do more than ``objective`` (issue 18, "Speed the
single plan makes possible"), each a paired ratio against ``grpo-cli objective FILE
--json`` in the same run: the two alternate N times, each in a fresh process, and the
criterion is the median of the N ratios (alternating gives both the same machine state;
see :func:`run.paired`).

| target | criterion |
|---|---|
| ``answers FILE --json --sort K``, every K | <= 1.25x |
| ``objective FILE --json --gradient`` | <= 1.25x |
| ``explain FILE --json`` | <= 1.3x |
| ``check FILE --format json`` | <= 1.1x |

Each line also gives the median ratio of the pairs' CPU times (user + system), which a
busy machine disturbs less than wall times (not a criterion).

The file is ``grpo-cli sample`` output of about ``--tokens`` tokens (default 10M: answers
of 1 to 8,192 tokens, mean 1,367, groups of 8, row groups of 1,024 answers), cached under
``--data``. The machine's load average is printed before and after: on a shared machine a
load above the core count makes every ratio noise.

Usage: python bench/commands.py [--tokens 10000000] [--paired 7] [--only answers-kl,check]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from run import measure

HERE = Path(__file__).resolve().parent
SORT_KEYS = ("kl", "kl-max", "ratio", "clip", "length", "advantage", "gradient", "rollout")
MEAN_LEN, GROUP_SIZE = 1367, 8
# grpo-cli sample's lengths are log-normal, clipped to [1, 8192]: ~10,670 tokens a group
TOKENS_PER_GROUP = 10_670


def targets(path: Path) -> list[tuple[str, list[str], float]]:
    """(name, grpo-cli arguments, criterion) of every target."""
    f = str(path)
    out = [(f"answers-{k}", ["answers", f, "--json", "--sort", k], 1.25) for k in SORT_KEYS]
    out.append(("objective-gradient", ["objective", f, "--json", "--gradient"], 1.25))
    out.append(("explain", ["explain", f, "--json"], 1.3))
    out.append(("check", ["check", f, "--format", "json"], 1.1))
    return out


def sample(data: Path, tokens: int) -> Path:
    groups = max(1, round(tokens / TOKENS_PER_GROUP))
    path = data / f"commands_{groups}g.parquet"
    if not path.exists():
        data.mkdir(parents=True, exist_ok=True)
        print(f"generating {path} ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "grpo_cli", "sample", str(path), "--groups", str(groups),
             "--group-size", str(GROUP_SIZE), "--mean-len", str(MEAN_LEN), "--max-len", "8192",
             "--seed", "1", "--row-group-rows", "1024"],
            check=True,
        )  # fmt: skip
    return path


def paired(base: list[str], cmd: list[str], n: int) -> tuple[list[float], list[float]]:
    """``n`` alternations of ``base`` then ``cmd``: the ratio of each pair's wall times, and
    of their CPU times (user + system: less sensitive to a busy machine than wall time)."""
    walls, cpus = [], []
    for _ in range(n):
        a, b = measure(base, 1), measure(cmd, 1, ok=(0, 1))
        walls.append(float(b["wall_s"]) / float(a["wall_s"]))
        cpus.append(float(b["cpu_s"]) / float(a["cpu_s"]))
    return walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--paired", type=int, default=7, metavar="N")
    ap.add_argument("--data", type=Path, default=HERE / "data")
    ap.add_argument("--only", default="", help="comma-separated target names")
    args = ap.parse_args()
    path = sample(args.data, args.tokens)
    cli = [sys.executable, "-m", "grpo_cli"]
    base = [*cli, "objective", str(path), "--json"]
    only = {s for s in args.only.split(",") if s}
    load0 = os.getloadavg()
    print(f"file {path.name}: {path.stat().st_size / 2**20:,.0f} MiB; {args.paired} pairs each")
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    obj = measure(base, 1)
    print(f"objective alone: {float(obj['wall_s']):.2f} s")
    print(f"{'target':<20} {'median':>7} {'range':>13} {'criterion':>10}  verdict   CPU ratio")
    for name, argv, limit in targets(path):
        if only and name not in only:
            continue
        ratios, cpus = paired(base, [*cli, *argv], args.paired)
        med = statistics.median(ratios)
        verdict = "PASS" if med <= limit else "FAIL"
        print(
            f"{name:<20} {med:>7.2f} {min(ratios):>6.2f}-{max(ratios):<6.2f} "
            f"{'<= ' + str(limit) + 'x':>10}  {verdict}      {statistics.median(cpus):.2f}"
        )
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
