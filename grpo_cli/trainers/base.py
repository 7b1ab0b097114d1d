"""What a trainer module provides: its releases (each with its preset and the way it
logs its metrics), the settings its code makes depend on others, its way of putting the
KL into the reward, and the metrics it logs.

A trainer is data plus small functions, registered in :mod:`grpo_cli.trainers`: adding
one is a module of its own and its conformance rows, nothing else. Adding a release of a
known trainer is one :class:`Release` in its module's ``RELEASES`` (and its environment in
``conformance/releases``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from ..records import ClipFractions, Distribution, GroupSummary
    from ..settings import Settings

__all__ = [
    "CallInputs",
    "CallRules",
    "Default",
    "FileInputs",
    "Folded",
    "FromConfig",
    "MetricInputs",
    "Release",
    "RewardKL",
    "Trainer",
    "parse_version",
    "with_loss_metrics",
]

# How a trainer puts β·KL into the reward (``kl_mode="reward"``):
# - "score": each answer's summed KL is subtracted from its score before the group
#   statistics (verl ``apply_kl_penalty``);
# - "returns": −β·KL joins every token's reward after the group normalisation and is
#   summed from each token to the end (OpenRLHF ``get_cumulative_returns``).
RewardKL = Literal["score", "returns"]


class Folded(Protocol):
    """What a trainer's metrics read of a folded pass (the fold's
    :class:`~grpo_cli.fold.tokens.TokenPartial` is one): its settings and counts, its
    parts' sums by name, the aggregations of its terms, the loss's own metrics. A trainer
    module knows these quantities, not the fold's classes (the fold sits above it)."""

    settings: Settings
    entropy: Any
    bonus_entropy: Any
    kl: Any
    kl_values: Any
    term: Any
    reward_kl: Any
    old_ref: Any
    clip: Any
    clip_shares: Any
    ratio: Any
    log_ratios: Any
    unclipped_min: Any
    loss_metrics: Any

    @property
    def answers(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def rows(self) -> int: ...
    @property
    def max_width(self) -> int: ...
    def aggregate(self, key: str, agg: str) -> float: ...
    def objective(self, agg: str) -> float: ...


@dataclass(frozen=True)
class MetricInputs:
    """What a trainer's logged metrics are computed from: the folded partial, the
    aggregated policy term, the clip fractions, the group summary (None without
    rewards and group ids) and the rewards' distribution."""

    settings: Settings
    acc: Folded
    policy_term: float
    clip: ClipFractions
    groups: GroupSummary | None
    reward: Distribution | None = None  # the answers' rewards (their min and max)


def with_loss_metrics(
    out: dict[str, float | None], m: MetricInputs, replaced: tuple[str, ...]
) -> dict[str, float | None]:
    """``out`` with the settings' loss's own logged metrics in place of the clipped
    surrogate's ``replaced`` ones (a loss other than "clip": its registry row's metrics,
    folded by the partials), and the correction's metrics when one is set."""
    s = m.settings
    loss = m.acc.loss_metrics.values()
    if s.loss == "clip" and s.correction == "none":
        return out
    if s.loss != "clip":
        out = {k: v for k, v in out.items() if k not in replaced}
    out.update(loss)
    return out


Default = Callable[[str, Any], Any]
Metrics = Callable[[MetricInputs], dict[str, float | None]]
Dependent = Callable[[Mapping[str, Any], Default], None]


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
    entropy_sum: float  # over the tokens the entropy bonus takes
    entropy_tokens: int
    info: Mapping[str, Any]
    acc: Folded | None = None  # the file's whole partial (a trainer's own sums)

    @classmethod
    def of(cls, acc: Folded, empty: int, info: Mapping[str, Any]) -> FileInputs:
        """The sums of a file's partial; the entropy over the tokens of the masks the
        trainer's entropy bonus takes when the settings apply one (TRL's high-entropy mask)."""
        e = acc.entropy
        total, n = e.total, e.n
        if any(m.entropy_bonus for m, _ in acc.settings.mask_rows):
            total, n = acc.bonus_entropy.total, acc.bonus_entropy.n
        return cls(
            acc.answers, empty, acc.tokens, acc.term.token, acc.term.answer_means, total, n,
            info, acc,
        )  # fmt: skip


@dataclass(frozen=True)
class CallInputs:
    """One loss call of a recorded step: its files' partial merged over ranks (``acc``)
    and the answers without a valid token (left out of it, counted by the trainer)."""

    acc: Folded
    empty: int


@dataclass(frozen=True)
class CallRules:
    """How a trainer logs a step of several loss calls: ``call_metrics`` (what one call,
    over every rank, appends to the trainer's metric lists), ``file_loss`` (one rank's
    loss of one call, as the trainer returns it), ``generation_metrics`` (what it logs
    once per generation batch, from the batch's ``reward`` and ``group``), and
    ``combine`` (the logged record: calls' metrics, files' losses by call, the optimizer
    steps of the logging window, the generations' metrics), and ``file_metrics`` (what
    each rank logs of its own share of a call, gathered and averaged over the ranks into
    the call's metrics)."""

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
    file_metrics: Callable[[Settings, FileInputs, Mapping[str, Any]], dict[str, float]] = (
        lambda s, f, config: {}
    )


def _no_dependent(values: Mapping[str, Any], default: Default) -> None:
    del values, default


# A trainer's config (its own keys, as a recorded run's meta.json holds them) as Settings
# field values on top of its preset, and notes on what the config asks that grpo-cli does
# not compute (named, never silently ignored).
FromConfig = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[str]]]


def _no_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    del config
    return {}, []


_NUMBER = re.compile(r"\d+")


def parse_version(version: str) -> tuple[int, ...]:
    """``"0.19.1"`` → ``(0, 19, 1, 0)``: release, minor, patch, post (``0.3.0.post1`` →
    ``(0, 3, 0, 1)``); missing parts are 0 (``"0.19"`` is ``0.19.0``); a local or dev
    suffix (``1.16.0.dev0``, ``+cu121``) is ignored.

    Raises:
        ValueError: no leading ``X.Y`` numbers.

    Example:
        >>> parse_version("0.3.0.post1"), parse_version("trl 1.16")
        ((0, 3, 0, 1), (1, 16, 0, 0))
    """
    text = version.strip().split("+", 1)[0]
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post(\d+))?", text)
    if m is None:
        raise ValueError(f"{version!r} is not a release number (X.Y or X.Y.Z)")
    return tuple(int(g) if g else 0 for g in m.groups())


@dataclass(frozen=True)
class Release:
    """One change point of a trainer: from release ``first`` to ``last`` (inclusive) its
    code computes the same numbers grpo-cli computes with ``preset``, and logs its metrics
    as ``metrics`` computes them (``metric_names`` in order; a metric the partials cannot
    give is None, with the quantity it needs in ``missing``).

    ``checked`` is the release whose own code the conformance suite runs
    (``conformance/releases``); ``Settings.mirrors`` names it. ``changes`` says what
    changed at ``first``, each as "file:function: what" read from that release's code;
    ``notes`` what the preset does not model (a sampler correction, a trainer-level
    normaliser, ...). ``dependent`` replaces the trainer's dependent-settings rules for
    this release (None: the trainer's). ``folds`` names the optional parts of the fold its
    metrics need (e.g. TRL 0.16's count of unclipped minima).
    """

    first: str
    last: str
    checked: str
    preset: Mapping[str, Any]
    metrics: Metrics
    metric_names: tuple[str, ...]
    changes: tuple[str, ...]
    notes: tuple[str, ...] = ()
    missing: Mapping[str, str] = field(default_factory=dict)
    dependent: Dependent | None = None
    # optional parts of the fold its metrics read (``TokenPartial.OPTIONAL``), folded only
    # for this release's preset
    folds: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[int, ...]:
        return parse_version(self.first)


@dataclass(frozen=True)
class Trainer:
    """One trainer: ``name`` (the value of ``Settings.trainer``), ``releases`` (its change
    points, oldest first: :class:`Release`), ``presets`` (name → the Settings fields that
    differ from the defaults; the trainer's own name is its newest release's preset),
    ``reward_kl`` (how it puts the KL into the reward, or None: it cannot),
    ``kl_agg_follows_config`` (a loss that forces its aggregation leaves the KL's to the
    config).

    ``dependent(values, default)`` calls ``default(field, value)`` for each field that, in
    the trainer's code, follows another choice (only fields the user did not give change);
    ``default`` returns the field's value after the call. A release's own ``dependent``
    replaces it for that release's preset. ``from_config`` reads the trainer's own config
    (a recorded run's ``meta.json``) into Settings fields on top of its preset; ``calls``
    says how it logs a step of several loss calls (None: as one batch).
    """

    name: str
    releases: tuple[Release, ...]
    presets: Mapping[str, Mapping[str, Any]]
    reward_kl: RewardKL | None = None
    # a loss of its own that forces the policy aggregation leaves the KL loss's to the
    # config's (verl: ``loss_agg_mode`` still aggregates the KL loss)
    kl_agg_follows_config: bool = False
    dependent: Dependent = field(default=_no_dependent)
    from_config: FromConfig = field(default=_no_config)
    calls: CallRules | None = None

    @property
    def preset(self) -> str:
        """The preset of the trainer's defaults (the one named after it, else its first)."""
        return self.name if self.name in self.presets else next(iter(self.presets))

    def __post_init__(self) -> None:
        keys = [r.key for r in self.releases]
        if not keys or keys != sorted(keys) or len(set(keys)) != len(keys):
            raise ValueError(f"{self.name}: releases must be given oldest first, once each")
        for r in self.releases:
            if parse_version(r.last) < r.key or not (
                r.key <= parse_version(r.checked) <= parse_version(r.last)
            ):
                raise ValueError(f"{self.name} {r.first}: needs first <= checked <= last")

    @property
    def newest(self) -> Release:
        return self.releases[-1]

    @property
    def version(self) -> str:
        """The release the trainer's own preset mirrors (its newest release checked)."""
        return f"{self.name} {self.newest.checked}"

    @property
    def metric_names(self) -> tuple[str, ...]:
        return self.newest.metric_names

    def mirrors(self, release: Release) -> str:
        """``Settings.mirrors`` of ``release``'s preset: the trainer and the release its
        code was checked on."""
        return f"{self.name} {release.checked}"

    def release_of(self, mirrors: str | None) -> Release:
        """The release a preset mirrors (``Settings.mirrors``); the newest when None or
        not one of this trainer's (settings made without a release preset)."""
        for r in self.releases:
            if mirrors == self.mirrors(r):
                return r
        return self.newest

    def release_for(self, version: str) -> tuple[Release, str | None]:
        """The release whose preset reproduces trainer ``version``: the newest change point
        at or before it. A version newer than the newest release checked gets the newest
        preset, older than the first known the oldest, each with a warning naming it."""
        v = parse_version(version)
        newest = self.newest
        if v > parse_version(newest.last):
            return newest, (
                f"{self.name} {version} is newer than the newest release grpo-cli knows "
                f"({newest.last}): using the {self.name}@{newest.first} preset "
                f"(mirrors {self.mirrors(newest)})"
            )
        if v < self.releases[0].key:
            first = self.releases[0]
            return first, (
                f"{self.name} {version} is older than the oldest release grpo-cli knows "
                f"({first.first}): using the {self.name}@{first.first} preset"
            )
        chosen = [r for r in self.releases if r.key <= v][-1]
        return chosen, None

    def metrics(self, m: MetricInputs) -> dict[str, float | None]:
        """The metrics the release of ``m.settings.mirrors`` logs, each as its code
        computes it (None: the input or the partials do not give it)."""
        return self.release_of(m.settings.mirrors).metrics(m)

    def dependent_for(self, mirrors: str | None) -> Dependent:
        r = self.release_of(mirrors)
        return r.dependent if r.dependent is not None else self.dependent
