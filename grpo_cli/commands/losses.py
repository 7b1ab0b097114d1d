"""``grpo-cli losses``: the loss registry as it stands, every loss, correction and
policy-term mask with its parameters, the aggregation it forces and its logged metrics
(:mod:`grpo_cli.losses`). Read from the rows themselves, so it cannot drift from them."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UsageError
from ..losses import CORRECTIONS, LOSSES, MASKS
from ..losses.registry import Params
from ..records import RegistryEntry

__all__ = ["registry_entries"]


def _params(cls: type[Params]) -> tuple[tuple[str, Any, str, str], ...]:
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return tuple((n, defaults[n], s.kind, s.help) for n, s in cls.specs().items())


def registry_entries(trainer: str | None = None) -> list[RegistryEntry]:
    """Every row of the registry (``trainer``: that trainer's only), losses first, then
    corrections, then masks.

    Raises:
        UsageError: ``trainer`` has no row.
    """
    out: list[RegistryEntry] = []
    for row in LOSSES.values():
        # a row whose metrics or clip depend on its parameters: at their defaults
        p = row.params() if callable(row.metrics) or callable(row.clip) else None
        metrics = row.metrics_for(p)
        clip = row.clip_for(p) if p is not None else row.clip
        assert not callable(clip)
        out.append(RegistryEntry(
            "loss", row.name, row.trainer, row.words, _params(row.params), row.agg,
            row.token_ratio, row.whole_batch, tuple((m.name, m.unit, m.doc) for m in metrics),
            clip,
        ))  # fmt: skip
    for c in CORRECTIONS.values():
        out.append(RegistryEntry("correction", c.name, c.trainer, c.words, _params(c.params)))
    for m in MASKS.values():
        out.append(RegistryEntry("mask", m.name, m.trainer, m.words, _params(m.params)))
    if trainer is None:
        return out
    trainer = trainer.replace("-", "_")  # prime-rl's own spelling of its name
    mine = [e for e in out if e.trainer == trainer or (e.trainer is None and e.name == "clip")]
    if len(mine) <= 1:
        known = sorted({e.trainer for e in out if e.trainer is not None})
        raise UsageError(
            f"--trainer: {trainer!r} has no row (trainers with rows: {', '.join(known)})"
        )
    return mine
