"""The registry of the trainers' own policy losses, sampler–trainer corrections and
policy-term masks: one row each, beside its function in its trainer's loss module
(:mod:`.trl`, :mod:`.verl` and :mod:`.verl_rollout`, :mod:`.openrlhf`, :mod:`.areal`; the
row types in :mod:`.registry`). A loss module defines ``LOSSES``, ``CORRECTIONS`` and
``MASKS`` (each a tuple of rows, maybe empty).

A trainer's loss module is one entry of :data:`MODULES`. ``clip`` is the core's clipped
surrogate (:func:`grpo_cli.core.token_terms`), the policy term of every trainer's default
loss.
"""

from __future__ import annotations

from ..errors import UsageError
from . import areal, openrlhf, prime_rl, slime, trl, verl, verl_rollout
from .registry import CorrectionRow, Loss, Mask, Metric

__all__ = ["CLIP", "CORRECTIONS", "LOSSES", "MASKS", "MODULES", "NONE", "logged_metrics"]

CLIP = Loss("clip", None, "the clipped surrogate min(ρA, clip(ρ)A)", clip="core")
NONE = "none"  # no correction

MODULES = (trl, verl, verl_rollout, openrlhf, prime_rl, slime, areal)

LOSSES: dict[str, Loss] = {r.name: r for r in (CLIP, *(x for m in MODULES for x in m.LOSSES))}
CORRECTIONS: dict[str, CorrectionRow] = {r.name: r for m in MODULES for r in m.CORRECTIONS}
MASKS: dict[str, Mask] = {r.name: r for m in MODULES for r in m.MASKS}


def logged_metrics(name: str, **params: object) -> tuple[Metric, ...]:
    """The metrics a trainer logs for the loss ``name`` with these parameters (the others
    its defaults): what :func:`grpo_cli.losses.registry.loss_metrics` computes.

    Example:
        >>> logged_metrics("clip")
        ()
    """
    row = LOSSES.get(name)
    if row is None:
        raise UsageError(f"loss: {name!r} is not one of {', '.join(LOSSES)}")
    return row.metrics_for(row.params(**params) if params or callable(row.metrics) else None)
