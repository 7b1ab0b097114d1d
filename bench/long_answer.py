"""Benchmark: one answer of tens of millions of tokens, against reading it.

Writes (cached under ``--data``) a parquet file of ONE answer of ``--tokens`` tokens with
``logp``, ``old_logp`` and ``ref_logp`` as float32 lists, and measures peak RSS and wall
time, as ratios to the baseline in the same run:

- ``read``: pyarrow alone reading the three token columns record batch by record batch
  (``ParquetFile.iter_batches``, as grpo-cli reads): what decoding the answer costs, since
  pyarrow decodes one list value at once;
- ``read-logp``: the same for ``logp`` alone (the baseline of ``objective --beta 0``);
- every command that folds tokens: ``objective``, ``objective --preset gspo --gradient``,
  ``kl``, ``check``, ``answers``, ``explain`` (against ``read``), and ``objective --beta 0
  --column old_logp=none ...`` on the ``logp``-only file (against ``read-logp``).

The answer is folded a slice of its tokens at a time, so what a command adds to the read
does not grow with the answer; the criteria printed are peak RSS <= 1.25x the read's and,
absolute (issue 27), every command's peak RSS <= 1e9 bytes. A row group whose answers hold
more than a batch of tokens is decoded page by page (grpo_cli/io/pages.py), so the
commands peak below pyarrow's read.

Usage: python bench/long_answer.py [--tokens 60000000] [--repeat 1] [--data DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from run import measure

HERE = Path(__file__).resolve().parent

READ = """
import sys, pyarrow.parquet as pq
pf = pq.ParquetFile(sys.argv[1])
for rb in pf.iter_batches(batch_size=1, columns=sys.argv[2].split(","), use_threads=False):
    pass
"""


def long_file(data: Path, tokens: int, fields: tuple[str, ...]) -> Path:
    """One answer of ``tokens`` float32 tokens in each of ``fields`` (cached), written by a
    child process: a child's peak RSS starts at its parent's RSS when it forks, so this
    process stays small."""
    path = data / f"long_{tokens}_{len(fields)}.parquet"
    if not path.exists():
        data.mkdir(parents=True, exist_ok=True)
        print(f"generating {path} ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-c", WRITE, str(path), str(tokens), ",".join(fields)], check=True
        )
    return path


WRITE = """
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
path, tokens, fields = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
rng = np.random.default_rng(0)
old = (-rng.exponential(0.5, tokens)).astype(np.float32)
values = {
    "old_logp": old,
    "logp": (old + rng.normal(0, 0.05, tokens)).astype(np.float32),
    "ref_logp": (old + rng.normal(0, 0.05, tokens)).astype(np.float32),
}
offsets = pa.array([0, tokens], pa.int32())
cols = {"group": ["g0"], "reward": [1.0]}
for f in fields:
    cols[f] = pa.ListArray.from_arrays(offsets, pa.array(values[f]))
pq.write_table(pa.table(cols), path)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=60_000_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--data", type=Path, default=HERE / "data")
    args = ap.parse_args()
    py, cli = [sys.executable, "-c"], [sys.executable, "-m", "grpo_cli"]
    three = long_file(args.data, args.tokens, ("logp", "old_logp", "ref_logp"))
    one = long_file(args.data, args.tokens, ("logp",))
    print(f"one answer of {args.tokens:,} float32 tokens; peak RSS and best wall of {args.repeat}")
    print(f"\n{'contender':34} {'wall s':>7} {'peak RSS MiB':>13} {'RSS / read':>11}")
    rows = []
    for name, cmd, base in (
        ("read", [*py, READ, str(three), "logp,old_logp,ref_logp"], None),
        ("read-logp", [*py, READ, str(one), "logp"], None),
        ("objective", [*cli, "objective", str(three), "--json"], "read"),
        ("objective --preset gspo --gradient",
         [*cli, "objective", str(three), "--json", "--preset", "gspo", "--gradient"], "read"),
        ("kl", [*cli, "kl", str(three), "--json"], "read"),
        ("check", [*cli, "check", str(three), "--format", "json"], "read"),
        ("answers", [*cli, "answers", str(three), "--json"], "read"),
        ("explain", [*cli, "explain", str(three), "--json"], "read"),
        ("objective --beta 0 (logp only)",
         [*cli, "objective", str(one), "--json", "--beta", "0"], "read-logp"),
    ):  # fmt: skip
        r = measure(cmd, args.repeat, ok=(0, 1))
        rows.append((name, r, base))
    rss = {name: float(r["rss_mib"]) for name, r, _ in rows}
    worst, most = 0.0, 0.0
    for name, r, base in rows:
        ratio = float(r["rss_mib"]) / rss[base or name]
        if base:
            worst = max(worst, ratio)
            most = max(most, float(r["rss_mib"]) * 2**20)
        print(f"{name:34} {float(r['wall_s']):7.2f} {float(r['rss_mib']):13.0f} {ratio:11.2f}")
    verdict = "PASS" if worst <= 1.25 else "FAIL"
    print(f"\ncriterion: peak RSS <= 1.25x the read's: {verdict} (worst {worst:.2f}x)")
    verdict = "PASS" if most <= 1e9 else "FAIL"
    print(f"criterion: every command's peak RSS <= 1e9 bytes: {verdict} (most {most:.3g} bytes)")


if __name__ == "__main__":
    main()
