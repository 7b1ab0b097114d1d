"""Recorded runs: what :mod:`grpo_cli.integrations` writes, read back.

::

    runs/exp1/meta.json           the trainer, its version, its own config keys
    runs/exp1/metrics.jsonl       what the trainer logged, one line per logged step
    runs/exp1/step_000004/        one parquet file per loss call and rank, then _DONE

A step directory given as input is read as one dataset of its files (every micro-batch of
the step), with the run's ``meta.json`` at hand for the settings
(:func:`grpo_cli.trainers.base.Trainer.settings_from_config`) and its ``metrics.jsonl``
for ``--logged``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from .arrow import why

__all__ = [
    "FORMAT",
    "RecordedRun",
    "RecordedStep",
    "find_run",
    "recorded_step",
    "step_of_dir",
]

FORMAT = "grpo-cli-run"  # meta.json's "format" (grpo_cli.integrations._writer)
DONE = "_DONE"
_STEP_DIR = re.compile(r"step_(\d+)$")
_CALL_FILE = re.compile(r"rank(\d+)-mb(\d+)\.parquet$")


@dataclass(frozen=True)
class RecordedRun:
    """A run directory with its ``meta.json`` (read once)."""

    root: Path
    meta: dict[str, Any] = field(compare=False, repr=False)

    @property
    def trainer(self) -> str | None:
        t = self.meta.get("trainer")
        return t if isinstance(t, str) else None

    @property
    def trainer_version(self) -> str | None:
        v = self.meta.get("trainer_version")
        return str(v) if v is not None else None

    @property
    def config(self) -> dict[str, Any]:
        c = self.meta.get("config")
        return c if isinstance(c, dict) else {}

    @property
    def world_size(self) -> int:
        w = self.meta.get("world_size", 1)
        return w if isinstance(w, int) and w >= 1 else 1

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    def steps(self) -> list[RecordedStep]:
        """Every step directory of the run, in step order (complete or not)."""
        out = []
        for d in self.root.iterdir():
            step = step_of_dir(d)
            if step is not None and d.is_dir():
                out.append(_step(self, d, step))
        return sorted(out, key=lambda s: s.step)


@dataclass(frozen=True)
class RecordedStep:
    """One recorded optimizer step: its loss calls' files (``rank{r}-mb{k}.parquet``, by
    rank then call), and whether every rank finished writing it (``done``)."""

    run: RecordedRun
    step: int
    directory: Path
    files: tuple[Path, ...]
    done: bool

    def calls(self) -> dict[int, list[int]]:
        """The loss calls of the step: call index (micro-batch) → the indices in ``files``
        of its ranks' files (TRL reduces a call's metrics over ranks)."""
        out: dict[int, list[int]] = {}
        for i, p in enumerate(self.files):
            m = _CALL_FILE.search(p.name)
            k = int(m.group(2)) if m else i
            out.setdefault(k, []).append(i)
        return dict(sorted(out.items()))

    def require_done(self) -> None:
        """A step whose writing did not finish is refused, naming it."""
        if not self.done:
            raise InputError(
                f"{self.directory}: no {DONE} marker: the step was not completely written "
                "(the run stopped while recording it, or a rank has not finished); trend "
                "skips such steps"
            )


def step_of_dir(d: Path) -> int | None:
    m = _STEP_DIR.search(d.name)
    return int(m.group(1)) if m else None


def _read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({why(exc)})") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not JSON ({why(exc)})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None  # someone else's meta.json: not a recorded run
    version = meta.get("format_version")
    if version != 1:
        raise InputError(
            f"{path}: a recorded run of format version {version!r}; this grpo-cli reads "
            "version 1 (upgrade grpo-cli)"
        )
    return meta


def find_run(d: Path) -> RecordedRun | None:
    """The recorded run rooted at directory ``d`` (its ``meta.json``), or None."""
    meta_path = d / "meta.json"
    if not meta_path.is_file():
        return None
    meta = _read_meta(meta_path)
    return None if meta is None else RecordedRun(d, meta)


def _step(run: RecordedRun, d: Path, step: int) -> RecordedStep:
    files = sorted(
        (p for p in d.iterdir() if p.is_file() and _CALL_FILE.search(p.name)),
        key=lambda p: tuple(int(x) for x in _CALL_FILE.search(p.name).groups()),  # type: ignore[union-attr]
    )
    markers = {p.name for p in d.iterdir() if p.name.startswith(DONE)}
    ws = run.world_size
    done = DONE in markers if ws <= 1 else all(f"{DONE}.rank{r:03d}" in markers for r in range(ws))
    return RecordedStep(run, step, d, tuple(files), done)


def recorded_step(d: Path) -> RecordedStep | None:
    """The recorded step directory ``d`` (``step_N`` inside a run with ``meta.json``), or
    None when ``d`` is not one."""
    step = step_of_dir(d)
    if step is None or not d.is_dir():
        return None
    run = find_run(d.parent)
    return None if run is None else _step(run, d, step)
