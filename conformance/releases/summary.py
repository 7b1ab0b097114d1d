"""The release suite's table: per fixture, how many quantities were compared and the largest
relative difference between the release's numbers and grpo-cli's (loss, metrics).

Runs in grpo-cli's environment on the fixtures (default: conformance/releases/fixtures):
``python conformance/releases/summary.py [DIR]``; prints a markdown table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent / "fixtures"


def grpo_cli(path: Path, flags: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "grpo_cli", "objective", str(path), *flags.split(), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def rel(theirs: float, ours: float) -> float:
    scale = max(abs(theirs), abs(ours))
    return abs(theirs - ours) / scale if scale > 1e-12 else 0.0


def write(data: dict[str, Any], path: Path) -> Path:
    cols = {k: data[k] for k in ("group", "reward", "logp", "old_logp", "ref_logp")}
    pq.write_table(pa.table(cols), path)
    return path


def main() -> int:
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    print("| release | preset | fixture | compared | max rel. diff: loss | metrics |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for fixture in sorted(where.glob("*.json")):
            doc = json.loads(fixture.read_text())
            kind = "training run" if "steps" in doc else "loss function"
            runs = (
                [(s["rollouts"], doc["flags"], s["logged"]) for s in doc["steps"]]
                if "steps" in doc
                else [(doc["rollouts"], c["flags"], {**c["metrics"], "loss": c["loss"]})
                      for c in doc["cases"]]
            )  # fmt: skip
            n, worst_loss, worst_metric = 0, 0.0, 0.0
            for i, (data, flags, theirs) in enumerate(runs):
                out = grpo_cli(write(data, Path(tmp) / f"r{i}.parquet"), flags)
                ours = {**out["trainer_metrics"]["metrics"], "loss": out["loss"]}
                for name, value in theirs.items():
                    if name in ours and isinstance(value, int | float):
                        d = rel(float(value), float(ours[name]))
                        if name == "loss":
                            worst_loss = max(worst_loss, d)
                        else:
                            worst_metric = max(worst_metric, d)
                        n += 1
            print(
                f"| {doc['trainer']} {doc['version']} | `{doc['preset']}` | {kind} | {n} | "
                f"{worst_loss:.1e} | {worst_metric:.1e} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
