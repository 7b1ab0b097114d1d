"""Partials to records: every record a fold gives is built here, once, by one
constructor (no record is patched afterwards)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ._core import AGGREGATIONS, EXP_MAX, GroupStats
from ._logged import compare_logged
from ._mistakes import CLOSING_RUN, LOGP_FIELDS, shifted
from ._partials import ADV_EDGES, LENGTH_EDGES, TokenPartial, length_weights
from ._settings import Settings
from ._stats import Histogram, IntCounts, Moments, Sketch, quantiles_linear
from .engine.options import EngineOptions, Ran
from .errors import InputError, UsageError
from .io import Source
from .records import (
    QUANTILE_LEVELS,
    QUANTILES,
    Calls,
    ClipFractions,
    Distribution,
    GroupSummary,
    InputChecks,
    KLReport,
    LossClip,
    ObjectiveReport,
)
from .trainers import MetricInputs, trainer_of

if TYPE_CHECKING:
    from ._report import Pass1

__all__ = [
    "LoggedInput",
    "distribution",
    "group_summary_of",
    "int_distribution",
    "kl_record",
    "nonfinite_kl_warnings",
    "objective_record",
    "trainer_metrics",
    "values_distribution",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


# ------------------------------------------------------------------- distributions
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


# ------------------------------------------------------------------------- the KL
def nonfinite_kl_warnings(acc: TokenPartial) -> list[str]:
    """Why the KL's mean, std or extremes are null in JSON, when they are: non-finite
    estimates, or finite ones whose sum is beyond float64."""
    m = acc.kl_values
    if m.n == 0:
        return []
    stats = (m.mean, m.std, m.min, m.max)
    if m.n_inf == 0 and all(v is not None and math.isfinite(v) for v in stats):
        return []
    what = (
        f"{m.n_inf} token(s) have a non-finite KL estimate"
        if m.n_inf
        else "the KL estimates sum beyond float64"
    )
    return [
        f"{what} (log-probs too far apart, or an unclamped k3 of a huge log-ratio): the KL's "
        "non-finite statistics are null; --kl-clamp bounds the estimate"
    ]


def kl_record(
    src: Source, settings: Settings, acc: TokenPartial, *, engine: EngineOptions, ran: Ran
) -> KLReport:
    """``grpo-cli kl``'s record from its folded partial."""
    if acc.answers == 0:
        raise InputError(f"{src.label}: no answers (0 rows): nothing to compute")
    return KLReport(
        source=src.label,
        settings=settings,
        engine=engine,
        ran=ran,
        answers=acc.answers,
        tokens=acc.tokens,
        token=distribution(acc.kl_values, acc.kl_d, acc.kl_function()),
        per_answer=distribution(acc.kl_answer, acc.kl_answer_q),
        lengths=int_distribution(acc.lengths),
        warnings=[*src.notes, *nonfinite_kl_warnings(acc)],
    )


# ---------------------------------------------------------------- the objective
def trainer_metrics(
    settings: Settings,
    acc: TokenPartial,
    policy_term: float,
    clip: ClipFractions,
    groups: GroupSummary | None,
    warnings: list[str],
    reward: Distribution | None = None,
) -> dict[str, float]:
    """The metrics ``settings.trainer`` logs, each computed the way that trainer computes
    it (its module in :mod:`grpo_cli.trainers`); a metric the input cannot give is left
    out, with a warning."""
    trainer = trainer_of(settings.trainer)
    if trainer is None:
        return {}
    out = trainer.metrics(MetricInputs(settings, acc, policy_term, clip, groups, reward))
    missing = [k for k, v in out.items() if v is None]
    for k in missing:
        warnings.append(f"trainer metric {k!r} left out: the input does not give it")
    return {k: v for k, v in out.items() if v is not None}


SINGLETONS = (
    "every group has one answer ({n} groups of one): the group ids look like answer ids. "
    "A group of one has advantage 0 (GRPO), so the policy term is 0: give the prompt's id "
    "as the group (--column group=NAME)"
)


def singleton_warning(groups: GroupSummary | None) -> list[str]:
    """When every group is a singleton (answer ids given as group ids)."""
    if groups is None or groups.groups < 2 or groups.singleton_groups != groups.groups:
        return []
    return [SINGLETONS.format(n=groups.groups)]


def data_mistakes(src: Source, acc: TokenPartial, groups: GroupSummary | None) -> list[str]:
    """Warnings on inputs that are valid but almost surely not what was meant: answer ids
    as group ids, every answer as long as the longest (truncated, or padding counted for
    want of a mask), log-probs that are probabilities."""
    out = singleton_warning(groups)
    lengths = acc.lengths
    if acc.answers > 1 and lengths.n:
        _, _, lo, hi = lengths.moments()
        if lo == hi:
            where = "" if src.has("mask") else "; without a mask every token counts: give it"
            out.append(
                f"every answer has exactly {int(hi)} valid tokens: all truncated at a maximum "
                f"length, or padding counted as tokens{where} (--column mask=NAME)"
            )
    out += padding_warning(src, acc)
    out += alignment_warning(src, acc)
    positive = acc.positive.counts.get("logp", 0)
    if acc.tokens and positive > acc.tokens / 2:
        out.append(
            f"{positive} of {acc.tokens} valid log-probs of {src.name('logp')!r} are above 0: "
            "these look like probabilities; grpo-cli takes log-probs (np.log of them)"
        )
    return out


def loss_clip(settings: Settings, metrics: dict[str, float]) -> LossClip | None:
    """What the settings' loss clips by its own metrics (None: the clipped surrogate's
    clip counts, which TRL's luspo logs too)."""
    from ._loss_fold import loss_clip_share

    if settings.loss in ("clip", "trl/luspo"):
        return None
    got = loss_clip_share(settings, metrics)
    return LossClip(None) if got is None else LossClip(*got)


PADDED_SHARE = 0.5  # answers closing in exact zeros from which padding is the likely reading


def input_checks(src: Source, acc: TokenPartial) -> InputChecks | None:
    """The data-mistake checks' evidence, None when no answer was folded."""
    z = acc.closing_zeros
    if not acc.answers:
        return None
    return InputChecks(z.answers, z.closing, z.tokens, src.has("mask"), acc.alignment.report())


def padding_warning(src: Source, acc: TokenPartial) -> list[str]:
    """When most answers close with exact zeros in every log-prob field (padding counted
    as tokens): above the share :data:`PADDED_SHARE`."""
    z = acc.closing_zeros
    if not z.answers or z.share <= PADDED_SHARE:
        return []
    fields = [src.name(f) for f in LOGP_FIELDS if src.has(f)]
    why = (
        "the mask does not cover the padding: is it the prompt's and answer's attention mask?"
        if src.has("mask")
        else "padding counted as tokens for want of a mask: give it (--column mask=NAME)"
    )
    return [
        f"{z.closing} of {z.answers} answers close with {CLOSING_RUN} or more exact 0.0 in "
        f"{', '.join(repr(f) for f in fields)} ({z.tokens} tokens, "
        f"{100 * z.tokens / max(acc.tokens, 1):.1f}% of the tokens counted): {why}; "
        "check fails on it (unmasked-padding)"
    ]


def alignment_warning(src: Source, acc: TokenPartial) -> list[str]:
    """When the trainer's log-probs correlate with ``rollout_logp`` better one position
    off than at the same position."""
    corr = acc.alignment.report()
    side = shifted(corr)
    if side is None or corr is None:
        return []
    x = src.name("old_logp" if src.has("old_logp") else "logp")
    same = corr["same"]
    return [
        f"{x!r} correlates with {src.name('rollout_logp')!r} at the {side} position "
        f"(r = {corr[side]:.3f}) better than at the same one "
        f"(r = {'n/a' if same is None else format(same, '.3f')}): the trainer's tokens look "
        "shifted by one against the sampler's (log-probs of logits[:, :-1] not aligned with "
        "input_ids[:, 1:]?); the rollout numbers compare the wrong tokens; check fails on "
        "it (logp-alignment)"
    ]


def check_folded(src: Source, settings: Settings, rows: int, answers: int, width: int) -> None:
    """What every fold checks before its record: each of the ``answers`` was folded once
    (``rows`` token rows), and ``max_len`` is no shorter than the widest row (``width``)."""
    if rows != answers:
        raise InputError(
            f"{src.label}: {rows} token rows but {answers} answers (rewards/advantages)"
        )
    if (
        settings.agg == "seq-mean-token-sum-norm"
        and settings.max_len is not None
        and settings.max_len < width
    ):
        hint = ""
        if settings.preset == "dr-grpo":
            hint = (
                " (the dr-grpo preset sets TRL's default max_completion_length, 512: "
                "pass --max-len with your run's value)"
            )
        raise UsageError(
            f"--max-len {settings.max_len} is shorter than the widest row "
            f"({width} tokens, masked ones included){hint}"
        )


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


def objective_record(
    src: Source,
    settings: Settings,
    acc: TokenPartial,
    p1: Pass1,
    *,
    engine: EngineOptions,
    ran: Ran | None = None,
    ratio_band: float = 10.0,
    logged: LoggedInput | None = None,
    calls: Calls | None = None,
    empty: int = 0,
) -> ObjectiveReport:
    """The record of a folded objective: checks that every answer was folded, then the
    aggregations, distributions, the trainer's metrics (compared with ``logged`` when
    given) and notes; ``ratio_band`` sets ``ratio_outside_band``."""
    adv = p1.adv
    check_folded(src, settings, acc.rows + empty, adv.shape[0], acc.max_width)
    if not acc.answers and acc.loss_metrics.seen_tokens:
        raise InputError(
            f"{src.label}: verl's rejection sampling (rollout_rs {settings.rollout_rs}, "
            f"threshold {settings.rollout_rs_threshold}) rejected every token: no loss is left "
            "to compute (verl's would divide by 0); loosen rollout_rs_threshold"
        )
    warnings = list(p1.warnings)
    stats = p1.stats
    agg = settings.agg
    objective = acc.objective(agg)
    policy = acc.aggregate("policy", agg)
    kl_term = 0.0  # with the KL in the reward, the loss has no KL term
    if settings.beta and settings.kl_mode == "loss":
        kl_term = settings.beta * acc.aggregate("kl", settings.kl_aggregation)
    units = acc.answers if settings.clip_unit == "sequences" else acc.tokens
    t = max(units, 1)
    clip = ClipFractions(
        low=acc.clip.low / t,
        high=acc.clip.high / t,
        region=acc.clip.region / t,
        outside_range=acc.clip.outside / t,
        dual_clip_lower=acc.clip.dual / t if settings.dual_clip is not None else None,
        unit=settings.clip_unit,
    )
    if acc.overflow:
        warnings.append(
            f"{acc.overflow} token(s) have a log-ratio above {EXP_MAX:.1f}: "
            f"their ratio overflows to inf"
        )
    if not math.isfinite(objective):
        warnings.append(
            "the objective is not finite (overflowing ratio or KL); see ratio.max and kl.max"
        )
    has_kl = acc.kl_values.n > 0
    warnings += nonfinite_kl_warnings(acc)
    rollout = acc.rollout.report()
    if rollout is not None:
        nulls = [
            k for k, v in rollout.to_json().items() if isinstance(v, float) and not math.isfinite(v)
        ]
        if nulls:
            warnings.append(
                "the sampler's log-probs differ from the trainer's so much that exp(δ) "
                f"overflows: rollout.{', rollout.'.join(nulls)} are null (see abs_diff_max)"
            )
    group_summary = group_summary_of(stats) if stats is not None else None
    metrics = trainer_metrics(settings, acc, policy, clip, group_summary, warnings, p1.reward)
    whole_step = None
    if calls is not None:  # what the trainer logs: from the step's calls, as it combines them
        whole_step, metrics = metrics, calls.metrics
        warnings += calls.notes
    if empty:
        warnings.append(
            f"{empty} answer(s) have no valid token (their mask is all False: truncated "
            "completions the trainer masks): left out of the step's numbers; the trainer's "
            "loss and metrics, computed per call, count them as it does"
        )
    warnings += [
        f"{n} valid token(s) of {src.name(f)!r} have a log-prob > 0 (a probability above 1): "
        "computed on as given; grpo-cli check fails on them (logp-range)"
        for f, n in acc.positive.counts.items()
    ]
    warnings += data_mistakes(src, acc, group_summary)
    warnings += acc.loss_metrics.notes()
    compared = None
    if logged is not None:
        warnings += logged.notes
        compared = compare_logged(
            logged.file, logged.metrics, logged.step, metrics, tolerance=logged.tolerance
        )
        if not metrics:
            warnings.append(
                "--logged: no trainer metrics to compare (name the trainer: --preset or --trainer)"
            )
        differ = [c.metric for c in compared.metrics if c.verdict == "differs"]
        if differ:
            warnings.append(
                f"--logged: {len(differ)} metric(s) differ from the trainer's by more than "
                f"{logged.tolerance:g} (relative): {', '.join(differ)}"
            )
    b = math.log(ratio_band)
    return ObjectiveReport(
        source=src.label,
        settings=settings,
        objective=objective,
        policy_term=policy,
        kl_term=kl_term,
        aggregations={a: acc.objective(a) for a in AGGREGATIONS},
        groups=int(stats.count.shape[0]) if stats is not None else None,
        answers=acc.answers,
        tokens=acc.tokens,
        max_len=settings.max_len if settings.max_len is not None else acc.max_width,
        on_policy=p1.on_policy,
        advantages_source=p1.source,
        clip=clip,
        ratio=acc.ratio_distribution(),
        ratio_histogram=acc.ratio_histogram(),
        overflow_tokens=acc.overflow,
        extreme_tokens=acc.extreme,
        kl=distribution(acc.kl_values, acc.kl_d, acc.kl_function()) if has_kl else None,
        lengths=int_distribution(acc.lengths),
        advantage=values_distribution(adv),
        group_summary=group_summary,
        trainer_metrics=metrics,
        trainer_metrics_whole=whole_step,
        calls=None if calls is None else calls.calls,
        length_weights=length_weights(acc),
        rollout=rollout,
        loss_metrics=acc.loss_metrics.values(),
        entropy=distribution(acc.entropy, acc.entropy_q) if acc.entropy.n else None,
        warnings=warnings,
        engine=engine,
        ran=ran or p1.ran,
        logged=compared,
        ratio_band=ratio_band,
        ratio_outside_band=acc.delta.count_outside(-b, b) / max(acc.tokens, 1),
        reward=p1.reward,
        residual_advantages=p1.residual,
        gradient=acc.gradient(),
        gradient_asked=acc.gradient_wanted,
        inputs=input_checks(src, acc),
        loss_clip=loss_clip(settings, acc.loss_metrics.values()),
        length_counts=acc.lengths,
        length_adv=acc.length_adv.counts,
        length_adv_edges=(LENGTH_EDGES, ADV_EDGES),
        log_ratio_bins=_occupied_bins(acc.delta.hist) if acc.tokens else None,
        kl_bins=_kl_bins(acc) if has_kl else None,
    )


def _occupied_bins(h: Histogram) -> tuple[float, F64, I64]:
    """A histogram's occupied inner bins: (width, left edges, counts)."""
    inner = h.counts[1:-1]
    idx = np.flatnonzero(inner)
    edges: F64 = h.lo + idx.astype(np.float64) * h.width
    return h.width, edges, inner[idx]


def _kl_bins(acc: TokenPartial) -> tuple[F64, I64]:
    """The per-token KL at each occupied bin of d = ref_logp − logp (the end bins at the
    extreme d), ascending, with the bins' counts."""
    h = acc.kl_d.hist
    idx = np.flatnonzero(h.counts)
    with np.errstate(over="ignore", invalid="ignore"):
        kl = acc.kl_function()(h.representatives()[idx])
    order = np.argsort(kl, kind="stable")
    return kl[order], h.counts[idx][order]
