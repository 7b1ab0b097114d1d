"""Partials to records: every record of the objective and the KL is built here, once, from
the merged partial and pass 1, with its warnings."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..causes import ALTERNATIVES, Alternative, CauseContext, factors_of
from ..core import AGGREGATIONS, EXP_MAX
from ..core.stats import Histogram
from ..engine.options import EngineOptions, Ran
from ..errors import InputError, UsageError
from ..fold.mistakes import CLOSING_RUN, LOGP_FIELDS, shifted
from ..fold.parts import ADV_EDGES, LENGTH_EDGES
from ..fold.tokens import TokenPartial, length_weights
from ..io import Source
from ..logged import compare_logged
from ..records import (
    Calls,
    ClipFractions,
    Distribution,
    GroupSummary,
    InputChecks,
    KLReport,
    LoggedReport,
    LossClip,
    ObjectiveReport,
    RolloutReport,
)
from ..settings import Settings
from ..trainers import MetricInputs, trainer_of
from .mismatch import by_trainer

if TYPE_CHECKING:
    from ..fold.pass1 import Pass1
from ..fold.summaries import (
    F64,
    I64,
    distribution,
    group_summary_of,
    int_distribution,
    singleton_warning,
    values_distribution,
)
from ..logged import LoggedInput


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
    clip counts, which some trainers' own losses log too: their row's ``clip`` "core")."""
    from ..fold.loss import loss_clip_share

    if settings.loss_row.clip_for(settings.loss_params) == "core":
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


def _rejected_everything(src: Source, settings: Settings, acc: TokenPartial) -> None:
    """A correction's rejection that left no token: one line, its row's words."""
    crow = settings.correction_row
    if not acc.answers and acc.loss_metrics.seen_tokens and crow is not None:
        why = "its rejection rejected every token: no loss is left to compute"
        if crow.all_rejected is not None:
            why = crow.all_rejected(settings.correction_params)
        raise InputError(f"{src.label}: {why}")


def clip_fractions(settings: Settings, acc: TokenPartial) -> ClipFractions:
    """The clipped surrogate's clip fractions over tokens (answers at ``clip_unit``
    sequences)."""
    units = acc.answers if settings.clip_unit == "sequences" else acc.tokens
    t = max(units, 1)
    return ClipFractions(
        low=acc.clip.low / t,
        high=acc.clip.high / t,
        region=acc.clip.region / t,
        outside_range=acc.clip.outside / t,
        dual_clip_lower=acc.clip.dual / t if settings.dual_clip is not None else None,
        unit=settings.clip_unit,
    )


def fold_warnings(acc: TokenPartial, objective: float) -> list[str]:
    """What the reader should know of the folded numbers: overflows, non-finite values."""
    out: list[str] = []
    if acc.overflow:
        out.append(
            f"{acc.overflow} token(s) have a log-ratio above {EXP_MAX:.1f}: "
            f"their ratio overflows to inf"
        )
    if not math.isfinite(objective):
        out.append(
            "the objective is not finite (overflowing ratio or KL); see ratio.max and kl.max"
        )
    out += nonfinite_kl_warnings(acc)
    rollout = acc.rollout.report()
    if rollout is not None:
        nulls = [
            k for k, v in rollout.to_json().items() if isinstance(v, float) and not math.isfinite(v)
        ]
        if nulls:
            out.append(
                "the sampler's log-probs differ from the trainer's so much that exp(δ) "
                f"overflows: rollout.{', rollout.'.join(nulls)} are null (see abs_diff_max)"
            )
    return out


def input_warnings(src: Source, acc: TokenPartial, empty: int) -> list[str]:
    """What the reader should know of the input: answers without a valid token, log-probs
    above 0."""
    out: list[str] = []
    if empty:
        out.append(
            f"{empty} answer(s) have no valid token (their mask is all False: truncated "
            "completions the trainer masks): left out of the step's numbers; the trainer's "
            "loss and metrics, computed per call, count them as it does"
        )
    out += [
        f"{n} valid token(s) of {src.name(f)!r} have a log-prob > 0 (a probability above 1): "
        "computed on as given; grpo-cli check fails on them (logp-range)"
        for f, n in acc.positive.counts.items()
    ]
    return out


def cause_context(
    src: Source,
    settings: Settings,
    acc: TokenPartial,
    metrics: dict[str, float],
    whole_step: dict[str, float] | None,
    calls: int | None,
    combined: dict[str, dict[str, float]] | None = None,
) -> CauseContext:
    """What a logged difference may come from (:mod:`grpo_cli.causes`): the counts of the
    recorded step and its config, the step's tokens as one batch (``whole_step``, when the
    metrics come from several loss calls), and, for a step of one call, the loss and the
    policy term under every other aggregation (the metrics equal to this aggregation's);
    ``combined``: the calls' metrics combined the other ways trainers have (by id of
    :data:`~grpo_cli.causes.ALTERNATIVES`: per-process means, one value per window); a
    capped correction's weight statistics before the cap (``before-cap``)."""
    rec = src.recorded
    config = rec.run.config if rec is not None else {}
    world = rec.run.world_size if rec is not None else None
    alts: list[Alternative] = []
    if whole_step:
        words, cite = ALTERNATIVES["whole-step"]
        alts.append(Alternative("whole-step", words, cite, whole_step))
    for cid, values in (combined or {}).items():
        if values:
            words, cite = ALTERNATIVES[cid]
            alts.append(Alternative(cid, words, cite, values))
    before = acc.loss_metrics.before_values()
    if before:  # a capped correction: its weights' statistics before the cap
        words, cite = ALTERNATIVES["before-cap"]
        alts.append(Alternative("before-cap", words, cite, before))
    if not calls or calls == 1:
        words, cite = ALTERNATIVES["aggregation"]
        loss, policy = -acc.objective(settings.agg), -acc.aggregate("policy", settings.agg)
        for a in AGGREGATIONS:
            if a == settings.agg:
                continue
            other = {k: -acc.objective(a) for k, v in metrics.items() if v == loss}
            other |= {k: -acc.aggregate("policy", a) for k, v in metrics.items() if v == policy}
            if other:
                alts.append(Alternative(f"aggregation:{a}", words.format(agg=a), cite, other))
    return CauseContext(factors_of(config, calls=calls, world_size=world), tuple(alts))


def logged_comparison(
    logged: LoggedInput,
    metrics: dict[str, float],
    warnings: list[str],
    causes: Callable[[], CauseContext] | None = None,
) -> LoggedReport:
    """The trainer's metrics against what it logged (``--logged``), its notes added to
    ``warnings``; a differing metric gets its cause from ``causes`` (called only then)."""
    warnings += logged.notes
    compared = compare_logged(
        logged.file, logged.metrics, logged.step, metrics, tolerance=logged.tolerance,
        causes=causes,
    )  # fmt: skip
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
    return compared


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
    adv, stats, agg = p1.adv, p1.stats, settings.agg
    check_folded(src, settings, acc.rows + empty, adv.shape[0], acc.max_width)
    _rejected_everything(src, settings, acc)
    objective, policy = acc.objective(agg), acc.aggregate("policy", agg)
    kl_term = 0.0  # with the KL in the reward, the loss has no KL term
    if settings.beta and settings.kl_mode == "loss":
        kl_term = settings.beta * acc.aggregate("kl", settings.kl_aggregation)
    clip = clip_fractions(settings, acc)
    warnings = [*p1.warnings, *fold_warnings(acc, objective)]
    group_summary = group_summary_of(stats) if stats is not None else None
    metrics = trainer_metrics(settings, acc, policy, clip, group_summary, warnings, p1.reward)
    whole_step = None
    if calls is not None:  # what the trainer logs: from the step's calls, as it combines them
        whole_step, metrics = metrics, calls.metrics
        warnings += calls.notes
    warnings += input_warnings(src, acc, empty)
    warnings += data_mistakes(src, acc, group_summary)
    warnings += acc.loss_metrics.notes()
    n_calls = None if calls is None else calls.calls

    def causes() -> CauseContext:
        combined = None if calls is None else calls.alternatives
        return cause_context(src, settings, acc, metrics, whole_step, n_calls, combined)

    compared = None if logged is None else logged_comparison(logged, metrics, warnings, causes)
    has_kl = acc.kl_values.n > 0
    b = math.log(ratio_band)
    return ObjectiveReport(
        source=src.label, settings=settings, objective=objective, policy_term=policy,
        kl_term=kl_term, aggregations={a: acc.objective(a) for a in AGGREGATIONS},
        groups=int(stats.count.shape[0]) if stats is not None else None, answers=acc.answers,
        tokens=acc.tokens,
        max_len=settings.max_len if settings.max_len is not None else acc.max_width,
        on_policy=p1.on_policy, advantages_source=p1.source, clip=clip,
        ratio=acc.ratio_distribution(), ratio_histogram=acc.ratio_histogram(),
        overflow_tokens=acc.overflow, extreme_tokens=acc.extreme,
        kl=distribution(acc.kl_values, acc.kl_d, acc.kl_function()) if has_kl else None,
        lengths=int_distribution(acc.lengths), advantage=values_distribution(adv),
        group_summary=group_summary, trainer_metrics=metrics, trainer_metrics_whole=whole_step,
        calls=None if calls is None else calls.calls, length_weights=length_weights(acc),
        rollout=rollout_report(acc), loss_metrics=acc.loss_metrics.values(),
        entropy=distribution(acc.entropy, acc.entropy_q) if acc.entropy.n else None,
        warnings=warnings, engine=engine, ran=ran or p1.ran, logged=compared,
        ratio_band=ratio_band,
        ratio_outside_band=acc.delta.count_outside(-b, b) / max(acc.tokens, 1),
        reward=p1.reward, residual_advantages=p1.residual, gradient=acc.gradient(),
        gradient_asked=acc.gradient_wanted, inputs=input_checks(src, acc),
        loss_clip=loss_clip(settings, acc.loss_metrics.values()), length_counts=acc.lengths,
        length_adv=acc.length_adv.counts, length_adv_edges=(LENGTH_EDGES, ADV_EDGES),
        log_ratio_bins=_occupied_bins(acc.delta.hist) if acc.tokens else None,
        kl_bins=_kl_bins(acc) if has_kl else None, causes=causes,
        run_config=src.recorded.run.config if src.recorded is not None else {},
        recorded_step=src.recorded.step if src.recorded is not None else None,
        positions=acc.positions.report(), token_ids=acc.positions.token_ids(),
        turns=acc.positions.by_turn(),
    )  # fmt: skip


def rollout_report(acc: TokenPartial) -> RolloutReport | None:
    """Sampler vs trainer, with the sampler's support read from δ alone."""
    ro = acc.rollout.report()
    if ro is None:
        return None
    return dataclasses.replace(ro, support=acc.support.report(), by_trainer=by_trainer(acc.rollout))


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
