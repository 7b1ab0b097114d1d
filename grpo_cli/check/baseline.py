"""A check against a previous report (``--baseline``): drift of each number beyond a
tolerance."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError
from ..records import Result
from .base import MAX_EXAMPLES

DRIFT_FLOOR = 1e-6  # |baseline| below this counts as this, so 0 → tiny is not infinite drift


def _baseline(results: list[Result], base: dict[str, Any], tol: float) -> Result:
    try:
        before = {r["rule"]: r.get("value") for r in base["results"]}
    except (KeyError, TypeError):
        raise InputError("--baseline: not a grpo-cli check JSON report (no 'results')") from None
    drifts = []
    worst = 0.0
    for r in results:
        b = before.get(r.rule)
        if not isinstance(r.value, int | float) or not isinstance(b, int | float):
            continue
        d = abs(r.value - b) / max(abs(b), DRIFT_FLOOR)
        worst = max(worst, d)
        if d > tol:
            drifts.append({"rule": r.rule, "value": r.value, "baseline": b, "drift": d})
    drifts.sort(key=lambda x: -float(x["drift"]))
    msg = (
        f"{len(drifts)} rule value(s) drifted more than {100 * tol:g}% from the baseline"
        if drifts
        else f"every rule value within {100 * tol:g}% of the baseline"
    )
    status = "fail" if drifts else "pass"
    return Result(
        "baseline-drift",
        status,
        worst if math.isfinite(worst) else None,
        {"warn": None, "fail": tol},
        msg,
        drifts[:MAX_EXAMPLES],
    )


# --------------------------------------------------------------------- outputs
def read_baseline(path: Path) -> dict[str, Any]:
    """A previous ``check --format json`` report (``--baseline``)."""
    try:
        base = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"--baseline {path}: cannot read a JSON report ({exc})") from None
    if not isinstance(base, dict):
        raise UsageError(f"--baseline {path}: not a grpo-cli check JSON report (not an object)")
    return base
