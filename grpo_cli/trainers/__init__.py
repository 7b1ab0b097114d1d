"""The trainers grpo-cli reproduces, one module each, registered here.

Adding a trainer: a module defining ``TRAINER`` (:class:`~grpo_cli.trainers.base.Trainer`:
its releases, presets, dependent settings, KL-in-the-reward way, logged metrics), one line
below, and its rows in the conformance suite (conformance/oracle.py). Adding a release of
one: a :class:`~grpo_cli.trainers.base.Release` in its module's ``RELEASES`` and its
environment in conformance/releases (its README).
"""

from __future__ import annotations

from . import areal, openrlhf, prime_rl, slime, trl, verl
from .base import MetricInputs, Release, RewardKL, Trainer, parse_version

__all__ = [
    "TRAINERS",
    "MetricInputs",
    "Release",
    "RewardKL",
    "Trainer",
    "parse_version",
    "trainer_of",
]

TRAINERS: dict[str, Trainer] = {
    t.name: t
    for t in (
        trl.TRAINER,
        verl.TRAINER,
        openrlhf.TRAINER,
        prime_rl.TRAINER,
        slime.TRAINER,
        areal.TRAINER,
    )
}


def trainer_of(name: str | None) -> Trainer | None:
    """The registered trainer called ``name`` (None for None)."""
    return None if name is None else TRAINERS[name]
