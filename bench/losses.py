"""Benchmark: every policy loss, sampler–trainer correction and policy-term mask against the
clipped surrogate on the same file.

The target of issue 26 item 6 ("Every loss on the fast path"): ``grpo-cli objective FILE
--json`` with each loss (``--loss``), each correction (``--correction``) and each mask
(``--loss-param``) at most 1.2x the time of the clipped surrogate (``objective FILE
--json``, the compiled kernel's own loss), with a peak RSS at most 1.2x its peak. Each line
is a paired ratio: the clipped surrogate and the target alternate N times, each in a fresh
process, and the criterion is the median of the N ratios (alternating gives both the same
machine state; see :func:`commands.paired`).

Each line gives the median ratio of the pairs' wall times, of their CPU times (user +
system, which a busy machine disturbs less than wall times) and of their peak RSS. On a
machine whose load average is above its core count, the wall ratio is noise and the CPU
ratio is the one to read.

The files are ``grpo-cli sample`` output of about ``--tokens`` tokens (default 10M:
answers of 1 to 8,192 tokens, mean 1,367, groups of 8, row groups of 1,024 answers), cached
under ``--data``: the corrections, and the rows whose registry row ``needs`` the sampler's
``rollout_logp``, run on ``sample --extras`` output, whose sampler statistics every run
computes too; the other losses and masks on the same rollouts without the extras, where
the clipped surrogate's run is cheaper and the ratio stricter. TRL's high-entropy mask
reads a recorded ``entropy_mask`` column, which ``sample`` does not write: it is not
measured.

Usage: python bench/losses.py [--tokens 10000000] [--paired 5] [--only trl/cispo,slime-tis]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from commands import GROUP_SIZE, MEAN_LEN, TOKENS_PER_GROUP
from run import measure

HERE = Path(__file__).resolve().parent
TIME_LIMIT, MEMORY_LIMIT = 1.2, 1.2
# the masks, on: their parameter (a loss parameter, on any loss)
MASK_ON = {
    "trl/off_policy_mask": "off_policy_mask_threshold=0.5",
    "slime/opsm": "use_opsm=true",
}
# a parameter a row needs to do anything (its default turns it off)
NEEDS = {
    "verl/dro": ["--loss-param", "dro_beta=0.1"],
    "verl-rollout": ["--correction-param", "rollout_is=token"],
}


NEEDS_OF: dict[str, tuple[str, ...]] = {}  # a loss's or mask's row's extra token fields


def targets() -> list[tuple[str, list[str]]]:
    """(name, arguments after ``objective FILE --json``) of every loss, correction and mask
    of the registry (the clipped surrogate itself is the base)."""
    sys.path.insert(0, str(HERE.parent))
    from grpo_cli.losses import CORRECTIONS, LOSSES, MASKS

    for rows in (LOSSES, MASKS):
        NEEDS_OF.update({name: tuple(row.needs) for name, row in rows.items()})
    out = [(name, ["--loss", name, *NEEDS.get(name, [])]) for name in LOSSES if name != "clip"]
    out += [(name, ["--correction", name, *NEEDS.get(name, [])]) for name in CORRECTIONS]
    out += [(name, ["--loss-param", MASK_ON[name]]) for name in MASKS if name in MASK_ON]
    return out


def sample(data: Path, tokens: int, extras: bool) -> Path:
    """The benchmark's file (cached): with ``extras`` the sampler's log-probs and the
    entropies too, which the corrections read and which add the sampler statistics to every
    run (about 150 ns a token of the base's time); without, for the losses and masks: a
    cheaper base, so the stricter ratio."""
    groups = max(1, round(tokens / TOKENS_PER_GROUP))
    path = data / f"losses_{groups}g{'' if extras else '_plain'}.parquet"
    if not path.exists():
        data.mkdir(parents=True, exist_ok=True)
        print(f"generating {path} ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "grpo_cli", "sample", str(path), "--groups", str(groups),
             "--group-size", str(GROUP_SIZE), "--mean-len", str(MEAN_LEN), "--max-len", "8192",
             "--seed", "1", "--row-group-rows", "1024", *(["--extras"] if extras else [])],
            check=True,
        )  # fmt: skip
    return path


def paired(base: list[str], cmd: list[str], n: int) -> dict[str, list[float]]:
    """``n`` alternations of ``base`` then ``cmd``: the ratios of each pair's wall times, CPU
    times and peak RSS."""
    out: dict[str, list[float]] = {"wall": [], "cpu": [], "rss": []}
    for _ in range(n):
        a, b = measure(base, 1), measure(cmd, 1)
        out["wall"].append(float(b["wall_s"]) / float(a["wall_s"]))
        out["cpu"].append(float(b["cpu_s"]) / float(a["cpu_s"]))
        out["rss"].append(float(b["rss_mib"]) / float(a["rss_mib"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--paired", type=int, default=5, metavar="N")
    ap.add_argument("--data", type=Path, default=HERE / "data")
    ap.add_argument("--only", default="", help="comma-separated target names")
    args = ap.parse_args()
    files = {kind: sample(args.data, args.tokens, kind == "extras") for kind in ("plain", "extras")}
    cli = [sys.executable, "-m", "grpo_cli"]
    bases = {kind: [*cli, "objective", str(p), "--json"] for kind, p in files.items()}
    only = {s for s in args.only.split(",") if s}
    load0 = os.getloadavg()
    for kind, p in files.items():
        print(f"file {kind}: {p.name}, {p.stat().st_size / 2**20:,.0f} MiB")
    print(f"{args.paired} pairs each; load average before: {' '.join(f'{x:.2f}' for x in load0)}")
    for kind, base in bases.items():
        clip = measure(base, 1)
        wall, rss = float(clip["wall_s"]), float(clip["rss_mib"])
        print(f"clip alone, {kind}: {wall:.2f} s, {rss:.0f} MiB")
    print(f"{'target':<22} {'file':<6} {'wall':>5} {'range':>11} {'CPU':>5} {'RSS':>5}  verdict")
    for name, extra in targets():
        if only and name not in only:
            continue
        # a correction, and a loss or mask that reads the sampler's log-probs (its row's
        # ``needs``), runs on the extras' file; every other row on the plain one
        sampler = extra[0] == "--correction" or "rollout_logp" in NEEDS_OF[name]
        kind = "extras" if sampler else "plain"
        base = bases[kind]
        r = paired(base, [*base, *extra], args.paired)
        wall, cpu, rss = (statistics.median(r[k]) for k in ("wall", "cpu", "rss"))
        ok = cpu <= TIME_LIMIT and rss <= MEMORY_LIMIT
        print(
            f"{name:<22} {kind:<6} {wall:>5.2f} {min(r['wall']):>5.2f}-{max(r['wall']):<5.2f} "
            f"{cpu:>5.2f} {rss:>5.2f}  {'PASS' if ok else 'FAIL'}",
            flush=True,
        )
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
