"""The records the commands return: frozen, plain data. Tables, JSON, CI formats and
plots are views of them (:mod:`grpo_cli.views`): a view imports records only, and
nothing is computed in a view. Records are built once, by :mod:`grpo_cli.finalize.objective` (and
each command's module for its own), never patched afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .core import GroupStats
from .core.stats import IntCounts
from .engine.options import EngineOptions, Ran
from .settings import Settings

__all__ = [
    "EXTREME",
    "QUANTILES",
    "QUANTILE_LEVELS",
    "STEP_KEYS",
    "AdvantagesReport",
    "AnswerText",
    "AnswersReport",
    "Calls",
    "Cause",
    "CheckReport",
    "ClipFractions",
    "Distribution",
    "Finding",
    "GroupSummary",
    "InputChecks",
    "KLReport",
    "LoggedComparison",
    "LoggedReport",
    "LossClip",
    "ObjectiveReport",
    "PositionBucket",
    "Result",
    "RolloutReport",
    "SamplerSupport",
    "ShareReport",
    "StepRow",
    "TokenIdRow",
    "TokenIds",
    "TrendReport",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

# What ``ObjectiveReport.extreme_tokens`` counts, in words (the open end bins of the
# log-ratio histogram: Δ < −20 or Δ ≥ 20, where verl and OpenRLHF clamp)
EXTREME = "log-ratio outside [−20, 20)"

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
class LossClip:
    """What a loss other than the clipped surrogate clips: ``share`` of the tokens (of the
    answers at sequence level), the sum of its logged metrics ``names``; ``share`` None
    when the loss clips nothing (a soft weight or a penalty)."""

    share: float | None
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputChecks:
    """What the data-mistake checks saw (:mod:`grpo_cli.fold.mistakes`): the answers of at least
    two valid tokens, those closing in a run of exact 0.0 in every log-prob field and the
    tokens of those runs, whether the input has a mask; and the correlations of the
    trainer's log-probs with ``rollout_logp`` at the same and the neighbouring positions
    (None without ``rollout_logp``; a correlation is None over fewer than 3 pairs or a
    constant side)."""

    answers: int
    closing_zeros: int
    closing_zero_tokens: int
    masked: bool
    alignment: dict[str, float | int | None] | None = None

    @property
    def closing_share(self) -> float:
        return self.closing_zeros / self.answers if self.answers else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "answers": self.answers,
            "closing_zeros": self.closing_zeros,
            "closing_zero_tokens": self.closing_zero_tokens,
            "alignment": self.alignment,
        }


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
    # the metrics the settings' trainer logs, under its names and as it computes them (for
    # a recorded step of several loss calls: from its calls, as the trainer logs the step)
    trainer_metrics: dict[str, float] = field(default_factory=dict)
    # the same metrics of the step's tokens as one batch, when computed from calls
    trainer_metrics_whole: dict[str, float] | None = None
    calls: int | None = None  # the loss calls they were computed from
    rollout: RolloutReport | None = None  # sampler vs trainer, when rollout_logp is logged
    # what the trainer logs for the settings' loss and correction (grpo_cli.fold.loss), by
    # its logged names; empty for the clipped surrogate without a correction
    loss_metrics: dict[str, float] = field(default_factory=dict)
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
    inputs: InputChecks | None = None  # the data-mistake checks' evidence
    # a loss with its own clip metric (or none): None for the clipped surrogate's counts
    loss_clip: LossClip | None = None
    # exact counts of answer lengths (for views that need the tail: explain); not in JSON
    length_counts: IntCounts | None = field(default=None, compare=False, repr=False)
    # answers by (length bin, advantage bin), and the bins' edges (lengths, advantages;
    # left-closed); not in JSON
    length_adv: NDArray[np.int64] | None = field(default=None, compare=False, repr=False)
    length_adv_edges: tuple[F64, F64] | None = field(default=None, compare=False, repr=False)
    # for the figures, not in JSON: the occupied bins of the log-ratio histogram (the
    # partials' sketch of Δ = logp − old_logp: bin width, left edges, counts; the open end
    # bins are ``extreme_tokens``), and the per-token KL at the occupied bins of
    # d = ref_logp − logp (values ascending, counts)
    log_ratio_bins: tuple[float, F64, I64] | None = field(default=None, compare=False, repr=False)
    kl_bins: tuple[F64, I64] | None = field(default=None, compare=False, repr=False)
    # what a logged difference may come from, built when asked (grpo_cli.causes: only a
    # differing metric asks); not in JSON
    causes: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    # the entropy, KL and mismatch by position along the answer (explain only); not in JSON
    positions: list[PositionBucket] | None = field(default=None, compare=False, repr=False)
    # the same by token id, when the input has token ids (explain only); not in JSON
    token_ids: TokenIds | None = field(default=None, compare=False, repr=False)
    # the same by turn of a multi-turn mask (``lo``: the turn's index); not in JSON
    turns: list[PositionBucket] | None = field(default=None, compare=False, repr=False)
    # a recorded run's meta.json config (the causes from the configuration); not in JSON
    run_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # a recorded run's step number (its first step is taken before any update); not in JSON
    recorded_step: int | None = field(default=None, compare=False, repr=False)

    @property
    def loss(self) -> float:
        return -self.objective


# ------------------------------------------------------------------- token partials
@dataclass(frozen=True)
class PositionBucket:
    """Tokens at positions ``lo`` .. ``hi − 1`` of their answers (``hi`` None: the last,
    open bucket; :mod:`grpo_cli.fold.where`): how many, the mean entropy, KL to the
    reference and sampler–trainer ``|δ|`` where logged, and the KL's and ``|δ|``'s sums."""

    lo: int
    hi: int | None
    tokens: int
    entropy: float | None
    kl: float | None
    mismatch: float | None
    kl_tokens: int = 0
    kl_sum: float = 0.0
    mismatch_sum: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class TokenIdRow:
    """One sampled token id (:class:`grpo_cli.fold.where.TokenIdSums`): its tokens and the
    sums of the entropy, the KL and ``|δ|`` over them."""

    token_id: int
    tokens: int
    entropy_sum: float
    kl_sum: float
    mismatch_sum: float

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class TokenIds:
    """The entropy, KL and ``|δ|`` by token id: the tokens, the distinct ids, the tokens
    whose id is outside the exact range, each logged value's total and its top ids."""

    tokens: int
    ids: int
    outside: int
    totals: Mapping[str, float]
    top: Mapping[str, list[TokenIdRow]]


@dataclass(frozen=True)
class SamplerSupport:
    """The sampler's support read from the log-probs alone (:mod:`grpo_cli.fold.sampler`):
    with ``δ = old_logp − rollout_logp`` over valid tokens, how many are below and above 0,
    ``one_sided = −mean δ / mean |δ|`` (1: every δ < 0, a truncated sampler's log-probs
    renormalised over the kept tokens; near 0: a precision mismatch), ``corr_rollout`` the
    correlation of δ with ``rollout_logp`` (a tempered sampler: δ linear in the token's
    log-prob within a position), ``corr_entropy`` with the trainer's entropy (when logged;
    a truncation's δ grows with it), ``mean_delta`` (log of the geometric-mean kept mass
    under truncation), the raw IS weight mean ``mean exp(δ)`` and, where the kept mass can
    be estimated (``one_sided`` ≥ 0.5), ``kept_mass`` and the weight with it divided out,
    by entropy bin or over the batch (``corrected_by``)."""

    tokens: int
    below: int
    above: int
    one_sided: float
    corr_rollout: float | None
    mean_delta: float
    is_weight_mean: float
    corr_entropy: float | None = None
    kept_mass: float | None = None
    is_weight_mean_corrected: float | None = None
    corrected_by: str | None = None

    @property
    def signature(self) -> tuple[str, float]:
        """Which signature is the stronger, and its size: ``truncated`` (``one_sided``) or
        ``tempered`` (``|corr_rollout|``)."""
        corr = abs(self.corr_rollout) if self.corr_rollout is not None else 0.0
        return ("truncated", self.one_sided) if self.one_sided >= corr else ("tempered", corr)

    def to_json(self) -> dict[str, Any]:
        """Every field; those that do not apply (no entropy logged, no kept mass) left out."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {k: v for k, v in out.items() if v is not None}


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
    support: SamplerSupport | None = None  # truncated or tempered? (grpo_cli.fold.sampler)
    # every trainer's mismatch metric by its own name and sign (grpo_cli.finalize.mismatch)
    by_trainer: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "support"}
        if self.support is not None:
            out["support"] = self.support.to_json()
        return out


# ---------------------------------------------------------------------- logged
@dataclass(frozen=True)
class Calls:
    """What the trainer logs for a recorded step of several loss calls (TRL), computed
    per call and combined as it combines them (``metrics``), the calls and files folded,
    and notes."""

    metrics: dict[str, float]
    calls: int
    files: int
    notes: list[str] = field(default_factory=list)
    # the same metrics combined the other ways trainers have (grpo_cli.causes), by id
    alternatives: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Cause:
    """Why a logged metric differs (:func:`grpo_cli.causes.explain`): ``found`` when one
    known explanation reproduces the logged value within float32 rounding (its ``id``,
    words, the trainer line behind it, the value it predicts and how close); else the
    ratio logged / recomputed (None when the recomputed value is 0)."""

    metric: str
    found: bool
    id: str
    words: str
    cite: str | None
    predicted: float | None
    relative: float | None
    ratio: float | None

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "metric"}
        return {k: v for k, v in out.items() if v is not None}  # absent, never null


@dataclass(frozen=True)
class LoggedComparison:
    """One logged metric: its value, grpo-cli's, their difference and the verdict
    (``match``, ``differs``, or ``not recomputed`` when grpo-cli has no such metric)."""

    metric: str
    logged: float
    recomputed: float | None
    difference: float | None
    relative: float | None
    verdict: str
    cause: Cause | None = None  # why it differs (only when it does): grpo_cli.causes

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "cause"}
        if self.cause is not None:
            out["cause"] = self.cause.to_json()
        return out


@dataclass(frozen=True)
class LoggedReport:
    file: str
    step: int | None
    tolerance: float
    metrics: list[LoggedComparison]

    @property
    def compared(self) -> list[LoggedComparison]:
        return [m for m in self.metrics if m.recomputed is not None]

    @property
    def max_relative(self) -> float | None:
        rel = [m.relative for m in self.compared if m.relative is not None]
        return max(rel) if rel else None

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "step": self.step,
            "tolerance": self.tolerance,
            "metrics": [m.to_json() for m in self.metrics],
        }


# ---------------------------------------------------------------------- check
@dataclass(frozen=True)
class Result:
    rule: str
    status: str
    value: float | int | None
    threshold: dict[str, float | None] | None
    message: str
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
            "examples": self.examples,
        }


@dataclass(frozen=True)
class CheckReport:
    source: str
    results: list[Result]
    settings: Settings | None = None
    engine: EngineOptions | None = None
    objective: ObjectiveReport | None = None  # the same record ``objective`` makes
    why_no_objective: str = ""
    ran: Ran = field(default_factory=Ran)
    run: RunVerdict | None = None  # a recorded run checked step by step (check RUN)

    @property
    def passed(self) -> bool:
        return not any(r.status == "fail" for r in self.results)


@dataclass(frozen=True)
class StepVerdict:
    """One step of a run as ``check`` judged it alone: the rules that fail, those that
    warn or fail (``bad``), and why it has no objective ('' when it has one)."""

    step: int
    name: str
    passed: bool
    failing: list[str]
    bad: list[str]
    why_no_objective: str = ""

    @classmethod
    def of(cls, step: int, name: str, results: list[Result], why: str) -> StepVerdict:
        failing = [r.rule for r in results if r.status == "fail"]
        bad = [r.rule for r in results if r.status in ("warn", "fail")]
        return cls(step, name, not failing, failing, bad, why)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "name": self.name,
            "passed": self.passed,
            "failing": self.failing,
            "warning_or_failing": self.bad,
        }


@dataclass(frozen=True)
class RunVerdict:
    """``check RUN``: each step's verdict in step order, the first step at which each rule
    warns (or fails) and fails (None: never), and each step's trend row (its metrics)."""

    root: str
    steps: list[StepVerdict]
    first_bad: dict[str, dict[str, int | None]]
    rows: list[dict[str, Any]]
    first_failing_step: int | None  # the first step of a rule that fails the run


# ---------------------------------------------------------------------- trend
# a step's row in trend's JSON, in this order
STEP_KEYS = (
    "step",
    "source",
    "answers",
    "tokens",
    "objective",
    "loss",
    "clip_fraction_region",
    "ratio_p99",
    "kl_mean",
    "entropy_mean",
    "frac_zero_variance_groups",
    "reward_mean",
    "length_mean",
    "rollout_kl_k3",
)


@dataclass(frozen=True)
class StepRow:
    """One step's metrics (None: the step's input does not give it)."""

    values: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


@dataclass(frozen=True)
class TrendReport:
    settings: Settings
    engine: EngineOptions
    steps: list[StepRow]
    results: list[Result] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ran: Ran = field(default_factory=Ran)
    # trend rule -> the first step at which it warns (or fails) and fails (None: never)
    first_bad: dict[str, dict[str, int | None]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not any(r.status == "fail" for r in self.results)


# ---------------------------------------------------------------------- explain
@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # alarm | warn | info
    message: str
    evidence: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class AnswersReport:
    """``grpo-cli answers``: the ``top`` answers ranked by ``sort``, worst first."""

    source: str
    settings: Settings
    engine: EngineOptions
    sort: str
    top: int
    rows: list[dict[str, Any]]
    warnings: list[str]
    ran: Ran = field(default_factory=Ran)


@dataclass(frozen=True)
class AnswerText:
    """One of the worst answers: its row of ``answers`` and what the input says of it
    (None: the input has no such column). ``token_kl`` and ``token_log_ratio`` are the
    valid tokens' KL estimate (the settings') and log ρ = logp − old_logp."""

    row: dict[str, Any]
    completion: str | None = None
    prompt: str | None = None
    truncated: bool = False
    tokens: list[str] | None = None
    token_kl: list[float] | None = None
    token_log_ratio: list[float] | None = None


@dataclass(frozen=True)
class ShareReport:
    """Everything ``grpo-cli report`` shows, in one record."""

    source: str
    objective: ObjectiveReport
    findings: list[Finding]
    check: CheckReport
    answers: AnswersReport | None = None
    texts: list[AnswerText] = field(default_factory=list)
    trend: TrendReport | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RegistryEntry:
    """One row of the loss registry as ``grpo-cli losses`` lists it: its ``kind`` (loss,
    correction, mask), ``name``, ``trainer``, what it is in words, its parameters
    ``(name, default, kind, help)``, the aggregation it forces, whether its ratio is per
    token, why it needs the whole batch (or None), the metrics its trainer logs for it
    ``(name, unit, definition)`` at its default parameters, and its clip metric."""

    kind: str
    name: str
    trainer: str | None
    words: str
    params: tuple[tuple[str, Any, str, str], ...]
    agg: str | None = None
    token_ratio: bool = False
    whole_batch: str | None = None
    metrics: tuple[tuple[str, str, str], ...] = ()
    clip: tuple[str, ...] | str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "trainer": self.trainer,
            "words": self.words,
            "params": [
                {"name": n, "default": d, "kind": k, "help": h} for n, d, k, h in self.params
            ],
            "agg": self.agg,
            "token_ratio": self.token_ratio,
            "whole_batch": self.whole_batch,
            "metrics": [{"name": n, "unit": u, "definition": d} for n, u, d in self.metrics],
            "clip": list(self.clip) if isinstance(self.clip, tuple) else self.clip,
        }
