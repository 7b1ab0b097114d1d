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

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .causes import CauseContext, explain
from .errors import InputError
from .io.bounded import MAX_DOCUMENT, BeyondFloat, loads, read_document, regular
from .records import LoggedComparison, LoggedReport

if TYPE_CHECKING:
    from .io.run import RecordedStep

__all__ = [
    "ABS_FLOOR",
    "LoggedRecords",
    "compare_logged",
    "load_logged",
    "read_records",
    "record_metrics",
    "recorded_metrics",
]

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


@dataclass(frozen=True)
class LoggedRecords:
    """What a logged-metrics file holds: its step records (line number, record), what
    was left out (run summaries, evaluations) and the lines that could not be read, each
    with why (line number, reason, the step it names when that can be told)."""

    path: Path
    records: list[tuple[int | None, dict[str, Any]]]
    left_out: int = 0
    damaged: list[tuple[int, str, int | None]] = field(default_factory=list)

    def notes(self) -> list[str]:
        out = []
        if self.left_out:
            out.append(
                f"--logged {self.path}: {self.left_out} run-summary or evaluation record(s) "
                "(train_runtime, train_loss, eval_*) left out: they are not a step's "
                "training metrics"
            )
        if self.damaged:
            shown = "; ".join(f"line {n}: {why}" for n, why, _ in self.damaged[:3])
            more = f" (and {len(self.damaged) - 3} more)" if len(self.damaged) > 3 else ""
            out.append(
                f"{self.path}: {len(self.damaged)} line(s) could not be read and are left "
                f"out: {shown}{more}"
            )
        return out

    def damaged_for(self, step: int | None) -> tuple[int, str] | None:
        """The first damaged line that may hold ``step``'s record (it names that step, or
        no step can be told from it); for ``step`` None, a damaged last line."""
        for n, why, named in self.damaged:
            if step is None:
                last = self.records[-1][0] if self.records else None
                if last is None or n > last:
                    return n, why
            elif named is None or named == step:
                return n, why
        return None


_STEP_KEY = re.compile(rb'"step"\s*:\s*(\d{1,18})\b')


def read_records(path: Path) -> LoggedRecords:
    """The records of a logged-metrics file (see :func:`load_logged`), within the limits
    of :mod:`grpo_cli.io.bounded`: a regular file; a JSON document of at most
    ``MAX_DOCUMENT`` bytes read whole, else JSON lines of at most that each; nesting at
    most ``MAX_DEPTH`` deep. A line that cannot be read (cut mid-write, not UTF-8, not an
    object, nested too deep) is left out and named.

    Raises:
        InputError: not a regular file, or it holds no record at all.
    """
    st = regular(path, "logged metrics")
    whole: Any = None
    if st.st_size <= MAX_DOCUMENT:
        data = read_document(path, "logged metrics")
        try:
            whole = loads(data, str(path))
        except InputError:
            whole = None  # JSON lines (or damaged): read line by line
        if isinstance(whole, dict) and isinstance(whole.get("log_history"), list):
            whole = whole["log_history"]  # trainer_state.json
        if isinstance(whole, dict):
            whole = [whole]
    Row = tuple[int | None, dict[str, Any]]
    Damaged = tuple[int, str, int | None]
    if isinstance(whole, list):
        listed: list[Row] = [(None, r) for r in whole if isinstance(r, dict)]
        none: list[Damaged] = []
        if whole and not listed:
            none.append((1, "no JSON object of metric: value", None))
        return _kept(path, listed, none)
    rows: list[Row] = []
    damaged: list[Damaged] = []
    for n, line in _lines(path):
        if not line.strip():
            continue
        try:
            rec = loads(line, str(path), n)
            why = None if isinstance(rec, dict) else "not a JSON object of metric: value"
        except InputError as exc:
            rec, why = None, str(exc).split(f"line {n}: ", 1)[-1]
        if why is not None:
            m = _STEP_KEY.search(line[:4096])
            damaged.append((n, why, int(m.group(1)) if m else None))
            continue
        rows.append((n, rec))
    return _kept(path, rows, damaged)


def _lines(path: Path) -> Any:
    """Each line of ``path`` with its number, at most ``MAX_DOCUMENT`` bytes of it (a
    longer line: its start, which then fails to parse, and the rest skipped)."""
    try:
        with open(path, "rb") as fh:
            n = 0
            while True:
                line = fh.readline(MAX_DOCUMENT + 1)
                if not line:
                    return
                n += 1
                if len(line) > MAX_DOCUMENT and not line.endswith(b"\n"):
                    while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass
                    yield n, b'"a line longer than the limit"['
                    continue
                yield n, line
    except OSError as exc:
        raise InputError(f"{path}: cannot read the logged metrics ({exc.strerror})") from None


def _kept(
    path: Path, rows: list[tuple[int | None, Any]], damaged: list[tuple[int, str, int | None]]
) -> LoggedRecords:
    steps = [(n, r) for n, r in rows if not (SUMMARY_KEYS & r.keys()) and not _eval(r)]
    return LoggedRecords(path, steps, len(rows) - len(steps), damaged)


def record_metrics(record: dict[str, Any], where: str) -> tuple[dict[str, float], list[str]]:
    """A record's numbers as metrics under the trainer's names (prefixes dropped); an
    integer beyond float is left out (null) with a note naming it (``where``: its file
    and line)."""
    metrics, notes = {}, []
    for k, v in record.items():
        if k == "step" or isinstance(v, bool):
            continue
        if isinstance(v, int) and not isinstance(v, BeyondFloat):
            try:
                v = float(v)
            except OverflowError:  # a Python int handed over as it is (the gate)
                v = BeyondFloat(len(str(abs(v))) if v.bit_length() < 14000 else 4300)
        if isinstance(v, BeyondFloat):
            notes.append(f"{where}: metric {k!r} is {v!r}: null, not compared")
        elif isinstance(v, float):
            metrics[_name(k)] = v
    return metrics, notes


def load_logged(
    path: Path, step: int | None = None, *, strict: bool = True
) -> tuple[dict[str, float], int | None, list[str]]:
    """The metrics of one logged step: the record whose ``step`` is ``step``, else the last;
    and notes on what was left out. The file is a JSON object of metrics, a list of them
    (``trainer.state.log_history``), ``trainer_state.json`` (its ``log_history``), or JSON
    lines; run-summary records (``train_runtime``, ``train_loss``) and evaluation records
    (``eval_*``) are not steps' metrics and are left out, with a note; lines that cannot be
    read are left out and named in a note.

    Raises:
        InputError: the file is unreadable, holds no object, has no record of the step
            asked for, or (``strict``) the step's record may be a line that cannot be read.
    """
    got = read_records(path)
    notes = got.notes()
    records = got.records
    damaged = got.damaged_for(step)
    if damaged is not None and strict:
        n, why = damaged
        which = f"step {step}'s record" if step is not None else "the last record"
        raise InputError(f"{path}: line {n} is {why}; it may be {which}")
    if not records:
        raise InputError(f"{path}: no JSON object of metric: value")
    if step is not None:
        chosen = [(n, r) for n, r in records if r.get("step") == step]
        if not chosen:
            steps = sorted({r["step"] for _, r in records if isinstance(r.get("step"), int)})
            shown = steps if len(steps) <= 20 else [*steps[:10], "...", *steps[-10:]]
            raise InputError(f"{path}: no record of step {step} (steps logged: {shown or 'none'})")
        line, record = chosen[-1]
    else:
        line, record = records[-1]
    where = f"{path}" + (f": line {line}" if line is not None else "")
    metrics, more = record_metrics(record, where)
    at = record.get("step")
    return metrics, at if isinstance(at, int) else None, [*notes, *more]


def _eval(record: dict[str, Any]) -> bool:
    return any(k.startswith(("eval_", "eval/")) for k in record)


def recorded_metrics(step: RecordedStep, tolerance: float) -> LoggedInput | None:
    """What the trainer logged at a recorded step (its run's ``metrics.jsonl``): None, with
    no comparison, when the run logged nothing at that step (``logging_steps`` > 1); a
    ``metrics.jsonl`` whose line for the step cannot be read (cut mid-write, not JSON) is
    ``unreadable``, naming the line, with no metrics."""

    path = step.run.metrics_path
    if not path.exists() and not path.is_symlink():
        return None
    try:
        got = read_records(path)
    except InputError as exc:
        return LoggedInput(str(path), {}, step.step, tolerance, (str(exc),), unreadable=str(exc))
    damaged = got.damaged_for(step.step)
    chosen = [(n, r) for n, r in got.records if r.get("step") == step.step]
    if not chosen:
        if damaged is None:
            return None
        n, why = damaged
        text = f"{path}: line {n} is {why}; it may be step {step.step}'s record"
        return LoggedInput(
            str(path), {}, step.step, tolerance, (*got.notes(), text), unreadable=text
        )
    line, record = chosen[-1]
    metrics, more = record_metrics(record, f"{path}: line {line}")
    return LoggedInput(str(path), metrics, step.step, tolerance, (*got.notes(), *more))


def compare_logged(
    file: str,
    logged: dict[str, float],
    step: int | None,
    recomputed: dict[str, float],
    *,
    tolerance: float = 1e-3,
    causes: Callable[[], CauseContext] | None = None,
) -> LoggedReport:
    """Compare each logged metric with grpo-cli's value of the same name.

    ``relative`` is ``|logged − recomputed| / max(|logged|, |recomputed|)`` (0 when both
    are 0); ``match`` when it is at most ``tolerance``, or when the two differ by at most
    :data:`ABS_FLOOR` (an on-policy loss is ~0, where float32 noise is all the relative
    difference there is), or for a ``loss`` logged with at most 4 decimals when they
    differ by at most half its last decimal (transformers 4.x's ``Trainer`` logs
    ``round(loss, 4)``).

    ``causes``: what a difference may come from (built only when a metric differs); each
    differing metric then gets its :class:`~grpo_cli.records.Cause`
    (:func:`grpo_cli.causes.explain`).
    """
    out = []
    ctx: CauseContext | None = None
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
        cause = None
        if verdict == "differs" and causes is not None:
            ctx = causes() if ctx is None else ctx
            cause = explain(name, value, mine, ctx)
        out.append(LoggedComparison(name, value, mine, diff, rel, verdict, cause))
    out.sort(key=lambda c: (c.recomputed is None, c.metric))
    return LoggedReport(file, step, tolerance, out)


@dataclass(frozen=True)
class LoggedInput:
    """What the trainer logged for the step (``--logged``): the file, its metrics under
    the trainer's names, the step they are of, and the relative tolerance; ``unreadable``
    says why the step's record could not be read (then ``metrics`` is empty)."""

    file: str
    metrics: dict[str, float]
    step: int | None
    tolerance: float
    notes: tuple[str, ...] = ()
    unreadable: str | None = None
