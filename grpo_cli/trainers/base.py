"""What a trainer module provides: its presets, the settings its code makes depend on
others, its way of putting the KL into the reward, and the metrics it logs.

A trainer is data plus two small functions, registered in :mod:`grpo_cli.trainers`:
adding one is a module of its own and its conformance rows, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .._partials import TokenPartial
    from .._settings import Settings
    from ..records import ClipFractions, GroupSummary

__all__ = ["Default", "MetricInputs", "RewardKL", "Trainer"]

# How a trainer puts β·KL into the reward (``kl_mode="reward"``):
# - "score": each answer's summed KL is subtracted from its score before the group
#   statistics (verl ``apply_kl_penalty``);
# - "returns": −β·KL joins every token's reward after the group normalisation and is
#   summed from each token to the end (OpenRLHF ``get_cumulative_returns``).
RewardKL = Literal["score", "returns"]


@dataclass(frozen=True)
class MetricInputs:
    """What a trainer's logged metrics are computed from: the folded partial, the
    aggregated policy term, the clip fractions and the group summary (None without
    rewards and group ids)."""

    settings: Settings
    acc: TokenPartial
    policy_term: float
    clip: ClipFractions
    groups: GroupSummary | None


Default = Callable[[str, Any], Any]


def _no_dependent(values: Mapping[str, Any], default: Default) -> None:
    del values, default


@dataclass(frozen=True)
class Trainer:
    """One trainer: ``name`` (the value of ``Settings.trainer``), ``version`` (the release
    its presets mirror, checked by the conformance suite), ``presets`` (name → the
    Settings fields that differ from the defaults), ``reward_kl`` (how it puts the KL into
    the reward, or None: it cannot), ``metric_names`` (what it logs, in order) and
    ``metrics`` (each computed as its code computes it; None: the input does not give it).

    ``dependent(values, default)`` calls ``default(field, value)`` for each field that, in
    the trainer's code, follows another choice (only fields the user did not give change);
    ``default`` returns the field's value after the call.
    """

    name: str
    version: str
    presets: Mapping[str, Mapping[str, Any]]
    metric_names: tuple[str, ...]
    metrics: Callable[[MetricInputs], dict[str, float | None]]
    reward_kl: RewardKL | None = None
    dependent: Callable[[Mapping[str, Any], Default], None] = field(default=_no_dependent)
