"""The records the reports return: frozen, plain data; tables and JSON are two views of
them (:mod:`grpo_cli._render`, :mod:`grpo_cli._json`), and nothing is computed in a view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ._core import (
    GroupStats,
)
from ._settings import Settings
from ._stats import IntCounts, Moments, Sketch, quantiles_linear
from .engine.options import EngineOptions, Ran

if TYPE_CHECKING:  # a field's type only: --logged loads it when asked
    from ._logged import LoggedReport

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

QUANTILES: dict[str, float] = {
    "p01": 0.01,
    "p05": 0.05,
    "p25": 0.25,
    "p50": 0.5,
    "p75": 0.75,
    "p95": 0.95,
    "p99": 0.99,
}
QUANTILE_LEVELS = np.array(list(QUANTILES.values()))


# ------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Distribution:
    """Summary of a distribution; ``exact`` says whether quantiles are exact or binned."""

    count: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    quantiles: dict[str, float]
    exact: bool = True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "count": self.count,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
        }
        out.update(self.quantiles)
        out["quantiles_exact"] = self.exact
        return out


def distribution(
    m: Moments, s: Sketch | None, f: Callable[[F64], F64] | None = None
) -> Distribution:
    qs: dict[str, float] = {}
    if s is not None and s.n:
        vals = s.quantiles(QUANTILE_LEVELS, f)
        assert vals is not None
        qs = {k: float(v) for k, v in zip(QUANTILES, vals, strict=True)}
    return Distribution(
        count=m.n,
        mean=m.mean,
        std=m.std,
        min=m.min,
        max=m.max,
        quantiles=qs,
        exact=True if s is None else s.is_exact,
    )


def int_distribution(c: IntCounts) -> Distribution:
    if c.n == 0:
        return Distribution(0, None, None, None, None, {})
    mean, std, lo, hi = c.moments()
    vals = c.quantiles(QUANTILE_LEVELS)
    assert vals is not None
    return Distribution(
        count=c.n,
        mean=mean,
        std=std,
        min=float(lo),
        max=float(hi),
        quantiles={k: float(v) for k, v in zip(QUANTILES, vals, strict=True)},
    )


def values_distribution(x: F64) -> Distribution:
    m = Moments().update(x)
    qs: dict[str, float] = {}
    if x.size:
        levels = quantiles_linear(x, QUANTILE_LEVELS)
        qs = {k: float(v) for k, v in zip(QUANTILES, levels, strict=True)}
    return Distribution(count=m.n, mean=m.mean, std=m.std, min=m.min, max=m.max, quantiles=qs)


@dataclass(frozen=True)
class GroupSummary:
    """Group counts: how many groups carry no learning signal (zero reward variance)."""

    groups: int
    answers: int
    zero_variance_groups: int
    zero_variance_answers: int
    singleton_groups: int
    min_size: int
    max_size: int

    @property
    def frac_zero_variance_groups(self) -> float:
        return self.zero_variance_groups / self.groups if self.groups else 0.0

    @property
    def frac_zero_std_answers(self) -> float:
        """TRL ``frac_reward_zero_std``: share of answers whose group std is zero."""
        return self.zero_variance_answers / self.answers if self.answers else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "answers": self.answers,
            "zero_variance_groups": self.zero_variance_groups,
            "frac_zero_variance_groups": self.frac_zero_variance_groups,
            "frac_zero_std_answers": self.frac_zero_std_answers,
            "singleton_groups": self.singleton_groups,
            "min_group_size": self.min_size,
            "max_group_size": self.max_size,
        }


def group_summary_of(stats: GroupStats) -> GroupSummary:
    zero = stats.min == stats.max
    return GroupSummary(
        groups=int(stats.count.shape[0]),
        answers=int(stats.count.sum()),
        zero_variance_groups=int(zero.sum()),
        zero_variance_answers=int(stats.count[zero].sum()),
        singleton_groups=int((stats.count == 1).sum()),
        min_size=int(stats.count.min()) if stats.count.size else 0,
        max_size=int(stats.count.max()) if stats.count.size else 0,
    )


@dataclass(frozen=True)
class AdvantagesReport:
    """Advantages of every answer, with per-group statistics of the rewards."""

    source: str
    settings: Settings
    summary: GroupSummary
    labels: list[Any]
    codes: I64
    stats: GroupStats
    advantages: F64
    shape: tuple[int, int] | None
    reward: Distribution
    advantage: Distribution
    logged_max_abs_diff: float | None  # vs the file's own advantages, when it has them
    engine: EngineOptions = field(default_factory=EngineOptions)
    warnings: list[str] = field(default_factory=list)
    ran: Ran = field(default_factory=Ran)


@dataclass(frozen=True)
class KLReport:
    """Per-token KL estimate statistics and the distribution of per-answer mean KL."""

    source: str
    settings: Settings
    engine: EngineOptions
    answers: int
    tokens: int
    token: Distribution
    per_answer: Distribution
    lengths: Distribution
    warnings: list[str] = field(default_factory=list)
    ran: Ran = field(default_factory=Ran)


@dataclass(frozen=True)
class ClipFractions:
    """Clip fractions (TRL / verl definitions): shares of valid tokens, or of answers with
    ``unit == "sequences"`` (TRL's GSPO metrics count a clipped answer once)."""

    low: float
    high: float
    region: float
    outside_range: float
    dual_clip_lower: float | None
    unit: str = "tokens"

    def to_json(self) -> dict[str, Any]:
        return {
            "low": self.low,
            "high": self.high,
            "region": self.region,
            "outside_range": self.outside_range,
            "dual_clip_lower": self.dual_clip_lower,
            "unit": self.unit,
        }


@dataclass(frozen=True)
class ObjectiveReport:
    """Objective J, loss −J, its parts, and the training-health diagnostics of one batch."""

    source: str
    settings: Settings
    objective: float
    policy_term: float
    kl_term: float
    aggregations: dict[str, float]
    groups: int | None
    answers: int
    tokens: int
    max_len: int
    on_policy: bool
    advantages_source: str
    clip: ClipFractions
    ratio: Distribution
    ratio_histogram: list[tuple[float, float, int]]
    overflow_tokens: int
    extreme_tokens: int
    kl: Distribution | None
    lengths: Distribution
    advantage: Distribution
    group_summary: GroupSummary | None
    length_weights: list[dict[str, float]]
    ratio_band: float = 10.0
    ratio_outside_band: float = 0.0  # share of tokens with ρ outside [1/band, band]
    # the metrics the settings' trainer logs, under its names and as it computes them
    trainer_metrics: dict[str, float] = field(default_factory=dict)
    rollout: RolloutReport | None = None  # sampler vs trainer, when rollout_logp is logged
    entropy: Distribution | None = None  # per-token policy entropy, when logged
    warnings: list[str] = field(default_factory=list)
    engine: EngineOptions = field(default_factory=EngineOptions)
    ran: Ran = field(default_factory=Ran)  # what the engine did (Ray: blocks, CPUs)
    logged: LoggedReport | None = None  # what the trainer logged, compared (--logged)
    reward: Distribution | None = None  # the answers' rewards, when the input has them
    # logged advantages nonzero in zero-variance groups: (how many, largest |A|), or None
    residual_advantages: tuple[int, float] | None = None
    # ‖∂J/∂logp‖ and its parts (objective --gradient): None when not asked for
    gradient: dict[str, float] | None = None
    gradient_asked: bool = False
    # exact counts of answer lengths (for views that need the tail: explain); not in JSON
    length_counts: IntCounts | None = field(default=None, compare=False, repr=False)
    # answers by (length bin, advantage bin) (_partials.LENGTH_EDGES × ADV_EDGES); not in JSON
    length_adv: NDArray[np.int64] | None = field(default=None, compare=False, repr=False)

    @property
    def loss(self) -> float:
        return -self.objective


# ------------------------------------------------------------------- token partials
@dataclass(frozen=True)
class RolloutReport:
    """Sampler vs trainer: the inference engine's log-probs ``rollout_logp`` against the
    trainer's recomputation ``old_logp`` (``logp`` when there is none), over valid tokens.

    With ``δ = old_logp − rollout_logp`` and the importance weight ``ρ = exp(δ)`` (verl
    ``rollout_corr``, TRL ``sampling/*``; REFERENCE.md "Sampler vs trainer"):
    ``kl_k1 = mean(−δ)``, ``kl_k3 = mean(ρ − δ − 1)``, ``chi2_token = mean(ρ²) − 1``,
    ``ess_token = mean(ρ)² / mean(ρ²)``, ``ess_sequence`` the same for answer weights
    ``exp(Σ_t δ)`` (in (0, 1]: 1 means no mismatch), ``prob_abs_diff_mean = mean|p_old −
    p_rollout|`` (verl ``training/rollout_probs_diff_mean``).
    """

    tokens: int
    answers: int
    abs_diff_mean: float
    abs_diff_max: float
    kl_k1: float
    kl_k3: float
    chi2_token: float
    is_weight_mean: float
    is_weight_min: float
    is_weight_max: float
    ess_token: float
    ess_sequence: float
    prob_abs_diff_mean: float

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
