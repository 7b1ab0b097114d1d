"""What the trainer logged, against what grpo-cli recomputes (``--logged FILE``).

A training run exports its metrics as JSON: one object ``{metric: value, ...}``, or JSON
lines of them (one per step, with an optional ``step``). Names are the trainer's own
(each trainer module's ``metric_names``, :mod:`grpo_cli.trainers`), with or without the
prefixes loggers add (``train/``, ``eval_``). Each logged metric that grpo-cli
recomputes gets its difference and a verdict; a relative difference above the tolerance
is a difference to explain (a wrong preset, another batch, the trainer's float32
residual advantages, ...).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError
from .records import LoggedComparison, LoggedReport

if TYPE_CHECKING:
    from .io.run import RecordedStep
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

__all__ = ["ABS_FLOOR", "compare_logged", "load_logged", "recorded_metrics"]

PREFIXES = ("train/",)
ABS_FLOOR = 1e-6
ROUNDED_LOSS = 0.5e-4 + 1e-12


def _name(key: str) -> str:
    for p in PREFIXES:
        if key.startswith(p):
            return key[len(p) :]
    return key


# Keys of the record transformers' Trainer.train() logs at its end: a run summary, not a step
SUMMARY_KEYS = frozenset({"train_runtime", "train_loss", "total_flos"})


def load_logged(
    path: Path, step: int | None = None
) -> tuple[dict[str, float], int | None, list[str]]:
    """The metrics of one logged step: the record whose ``step`` is ``step``, else the last;
    and notes on what was left out. The file is a JSON object of metrics, a list of them
    (``trainer.state.log_history``), ``trainer_state.json`` (its ``log_history``), or JSON
    lines; run-summary records (``train_runtime``, ``train_loss``) and evaluation records
    (``eval_*``) are not steps' metrics and are left out, with a note.

    Raises:
        InputError: the file is unreadable, not JSON (the line is named), holds no object,
            or has no record of the step asked for.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the logged metrics ({exc})") from None
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply") from None
    if isinstance(whole, dict) and isinstance(whole.get("log_history"), list):
        records = [r for r in whole["log_history"] if isinstance(r, dict)]  # trainer_state.json
    elif isinstance(whole, dict):
        records = [whole]
    elif isinstance(whole, list):
        records = [r for r in whole if isinstance(r, dict)]
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                raise InputError(f"{path}: line {i} is not JSON ({exc})") from None
            if not isinstance(rec, dict):
                raise InputError(f"{path}: line {i} is not a JSON object of metric: value")
            records.append(rec)
    steps_of = [r for r in records if not (SUMMARY_KEYS & r.keys()) and not _eval(r)]
    if len(steps_of) < len(records):
        left = len(records) - len(steps_of)
        notes.append(
            f"--logged {path}: {left} run-summary or evaluation record(s) (train_runtime, "
            "train_loss, eval_*) left out: they are not a step's training metrics"
        )
    records = steps_of
    if not records:
        raise InputError(f"{path}: no JSON object of metric: value")
    if step is not None:
        chosen = [r for r in records if r.get("step") == step]
        if not chosen:
            steps = sorted({r["step"] for r in records if isinstance(r.get("step"), int)})
            raise InputError(f"{path}: no record of step {step} (steps logged: {steps or 'none'})")
        record = chosen[-1]
    else:
        record = records[-1]
    got = record.get("step")
    metrics = {
        _name(k): float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }
    return metrics, got if isinstance(got, int) else None, notes


def _eval(record: dict[str, Any]) -> bool:
    return any(k.startswith(("eval_", "eval/")) for k in record)


def recorded_metrics(step: RecordedStep, tolerance: float) -> LoggedInput | None:
    """What the trainer logged at a recorded step (its run's ``metrics.jsonl``): None, with
    no comparison, when the run logged nothing at that step (``logging_steps`` > 1)."""

    path = step.run.metrics_path
    if not path.is_file():
        return None
    try:
        metrics, got, notes = load_logged(path, step.step)
    except InputError:
        return None
    return LoggedInput(str(path), metrics, got, tolerance, tuple(notes))


def compare_logged(
    file: str,
    logged: dict[str, float],
    step: int | None,
    recomputed: dict[str, float],
    *,
    tolerance: float = 1e-3,
) -> LoggedReport:
    """Compare each logged metric with grpo-cli's value of the same name.

    ``relative`` is ``|logged − recomputed| / max(|logged|, |recomputed|)`` (0 when both
    are 0); ``match`` when it is at most ``tolerance``, or when the two differ by at most
    :data:`ABS_FLOOR` (an on-policy loss is ~0, where float32 noise is all the relative
    difference there is), or for a ``loss`` logged with at most 4 decimals when they
    differ by at most half its last decimal (transformers 4.x's ``Trainer`` logs
    ``round(loss, 4)``).
    """
    out = []
    for name, value in logged.items():
        mine = recomputed.get(name)
        if mine is None:
            out.append(LoggedComparison(name, value, None, None, None, "not recomputed"))
            continue
        diff = mine - value
        scale = max(abs(value), abs(mine))
        rel = abs(diff) / scale if scale > 0 else 0.0
        if not math.isfinite(rel):
            rel = math.inf
        near = abs(diff) <= ABS_FLOOR  # two near-zero values (an on-policy loss) agree
        # transformers 4.x logs round(loss, 4) (TRL before 1.x ran on it): a logged loss of
        # at most 4 decimals carries no more than half a unit of its last decimal
        rounded = name == "loss" and round(value, 4) == value and abs(diff) <= ROUNDED_LOSS
        verdict = "match" if rel <= tolerance or near or rounded else "differs"
        out.append(LoggedComparison(name, value, mine, diff, rel, verdict))
    out.sort(key=lambda c: (c.recomputed is None, c.metric))
    return LoggedReport(file, step, tolerance, out)


@dataclass(frozen=True)
class LoggedInput:
    """What the trainer logged for the step (``--logged``): the file, its metrics under
    the trainer's names, the step they are of, and the relative tolerance."""

    file: str
    metrics: dict[str, float]
    step: int | None
    tolerance: float
    notes: tuple[str, ...] = ()
