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

__all__ = [
    "CallInputs",
    "CallRules",
    "Default",
    "FileInputs",
    "FromConfig",
    "MetricInputs",
    "RewardKL",
    "Trainer",
]

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


@dataclass(frozen=True)
class FileInputs:
    """One file of a recorded loss call (one rank's share): the sums its loss takes, the
    answers without a valid token (left out of the sums, counted by the loss) and the
    file's ``grpo_cli`` metadata (its normalisers)."""

    answers: int
    empty: int
    tokens: int
    term_sum: float  # Σ_t of the per-token term over the file's valid tokens
    term_answer_means: float  # Σ_i of each answer's token mean of the term
    entropy_sum: float
    entropy_tokens: int
    info: Mapping[str, Any]

    @classmethod
    def of(cls, acc: TokenPartial, empty: int, info: Mapping[str, Any]) -> FileInputs:
        e = acc.entropy
        return cls(
            acc.answers, empty, acc.tokens, acc.term.token, acc.term.answer_means,
            e.total, e.n, info,
        )  # fmt: skip


@dataclass(frozen=True)
class CallInputs:
    """One loss call of a recorded step: its files' partial merged over ranks (``acc``)
    and the answers without a valid token (left out of it, counted by the trainer)."""

    acc: TokenPartial
    empty: int


@dataclass(frozen=True)
class CallRules:
    """How a trainer logs a step of several loss calls: ``call_metrics`` (what one call,
    over every rank, appends to the trainer's metric lists), ``file_loss`` (one rank's
    loss of one call, as the trainer returns it), ``generation_metrics`` (what it logs
    once per generation batch, from the batch's ``reward`` and ``group``), and
    ``combine`` (the logged record: calls' metrics, files' losses by call, the optimizer
    steps of the logging window, the generations' metrics)."""

    call_metrics: Callable[[Settings, CallInputs, Mapping[str, Any]], dict[str, float | None]]
    file_loss: Callable[[Settings, FileInputs, Mapping[str, Any]], float | None]
    generation_metrics: Callable[[Settings, Mapping[str, Any]], dict[str, float | None]]
    combine: Callable[
        [
            list[dict[str, float | None]],
            list[list[float | None]],
            int,
            list[dict[str, float | None]],
        ],
        dict[str, float | None],
    ]


def _no_dependent(values: Mapping[str, Any], default: Default) -> None:
    del values, default


# A trainer's config (its own keys, as a recorded run's meta.json holds them) as Settings
# field values on top of its preset, and notes on what the config asks that grpo-cli does
# not compute (named, never silently ignored).
FromConfig = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[str]]]


def _no_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    del config
    return {}, []


@dataclass(frozen=True)
class Trainer:
    """One trainer: ``name`` (the value of ``Settings.trainer``), ``version`` (the release
    its presets mirror, checked by the conformance suite), ``presets`` (name → the
    Settings fields that differ from the defaults), ``reward_kl`` (how it puts the KL into
    the reward, or None: it cannot), ``metric_names`` (what it logs, in order) and
    ``metrics`` (each computed as its code computes it; None: the input does not give it).

    ``dependent(values, default)`` calls ``default(field, value)`` for each field that, in
    the trainer's code, follows another choice (only fields the user did not give change);
    ``default`` returns the field's value after the call. ``from_config`` reads the
    trainer's own config (a recorded run's ``meta.json``) into Settings fields on top of
    ``preset`` (the name of its main preset).
    """

    name: str
    version: str
    presets: Mapping[str, Mapping[str, Any]]
    metric_names: tuple[str, ...]
    metrics: Callable[[MetricInputs], dict[str, float | None]]
    reward_kl: RewardKL | None = None
    dependent: Callable[[Mapping[str, Any], Default], None] = field(default=_no_dependent)
    from_config: FromConfig = field(default=_no_config)
    # how it logs a step of several loss calls (None: as one batch)
    calls: CallRules | None = None

    @property
    def preset(self) -> str:
        """The preset of the trainer's defaults (the one named after it, else its first)."""
        return self.name if self.name in self.presets else next(iter(self.presets))
