"""``grpo-cli check``: rules over a rollout log, one verdict each, for a CI gate.

Each rule is one small function from the computed :class:`Facts` (integrity scan of the
raw token arrays, answer fields, the objective report) and its :class:`RuleConfig` to a
:class:`Result`. Adding a rule is adding one function to :data:`RULES` and one README row.

Statuses: ``pass``, ``warn``, ``fail``, ``skip`` (the rule could not be evaluated, e.g.
health rules when the data failed an integrity rule, or a rule turned off).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import batch as _batch
from ._core import advantages_by_group
from ._logged import compare_logged
from ._mistakes import shifted
from ._partials import TokenPartial
from ._report import (
    Pass1,
    columns_reader,
    logs_per_call,
    objective_pass1,
    ran_by,
    recorded_calls,
)
from ._settings import Settings
from .batch import RawBatch, length_mismatches, nonfinite_flags, token_ranges, valid_lengths
from .engine.options import EngineOptions
from .errors import InputError, UsageError
from .finalize import SINGLETONS, LoggedInput, objective_record
from .io import Answers, Source, load_answers
from .io.fields import LOGP_FIELDS
from .plan import plan, run
from .records import EXTREME, CheckReport, ObjectiveReport, Result

__all__ = [
    "RULES",
    "CheckConfig",
    "RuleConfig",
    "load_config",
    "read_baseline",
    "run_check",
    "write_outputs",
]

MAX_EXAMPLES = 5
STATUSES = ("pass", "warn", "fail", "skip")


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class RuleConfig:
    """How one rule judges: ``value > fail`` fails, ``value > warn`` warns.

    ``severity = "warn"`` caps the rule at a warning; ``enabled = False`` skips it.
    ``params`` holds rule-specific knobs (e.g. the ratio band of ``ratio-extreme``).
    """

    enabled: bool = True
    severity: str = "fail"
    warn: float | None = None
    fail: float | None = None
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckConfig:
    rules: dict[str, RuleConfig]
    on_policy: bool = False
    baseline_tolerance: float = 0.25
    require: tuple[str, ...] = ()  # rules whose skip is a failure (never pass unevaluated)


# ----------------------------------------------------------------------------- facts
@dataclass
class Scan:
    """What the integrity scan of the raw token arrays found."""

    tokens: int = 0
    rows: int = 0
    nonfinite: int = 0
    nonfinite_ex: list[dict[str, Any]] = field(default_factory=list)
    positive: int = 0
    positive_ex: list[dict[str, Any]] = field(default_factory=list)
    zero: int = 0
    mismatch: int = 0
    mismatch_ex: list[dict[str, Any]] = field(default_factory=list)
    empty: int = 0
    empty_ex: list[dict[str, Any]] = field(default_factory=list)
    offpolicy: int = 0
    offpolicy_max: float = 0.0
    offpolicy_ex: list[dict[str, Any]] = field(default_factory=list)
    # answers of a recorded step without a valid token: the trainer masks them whole (TRL's
    # truncated completions), so they are left out, not an integrity problem
    masked_whole: int = 0

    def problems(self) -> tuple[int, int, int]:
        """The counts that make a batch unusable for the objective."""
        return (self.nonfinite, self.mismatch, self.empty)

    def merge(self, o: Scan) -> Scan:
        """Counts add up; the examples kept are the first by row (then token), as if one
        scan had read every batch in row order."""
        for name in (
            "tokens",
            "rows",
            "nonfinite",
            "positive",
            "zero",
            "mismatch",
            "empty",
            "masked_whole",
        ):
            setattr(self, name, getattr(self, name) + getattr(o, name))
        self.offpolicy += o.offpolicy
        self.offpolicy_max = max(self.offpolicy_max, o.offpolicy_max)
        for name in ("nonfinite_ex", "positive_ex", "mismatch_ex", "empty_ex", "offpolicy_ex"):
            both = getattr(self, name) + getattr(o, name)
            both.sort(key=lambda e: (e["answer"], e.get("token", -1)))
            setattr(self, name, both[:MAX_EXAMPLES])
        return self


@dataclass
class CheckPartial:
    """What ``check`` folds from each raw batch: the integrity scan and, while every batch
    so far was clean, the objective's token partial."""

    scan: Scan
    objective: TokenPartial | None
    invalid: bool = False  # a batch failed integrity: the objective will not be reported

    def merge(self, o: CheckPartial) -> CheckPartial:
        self.scan.merge(o.scan)
        if self.objective is not None and o.objective is not None:
            self.objective.merge(o.objective)
        self.invalid = self.invalid or o.invalid
        return self


@dataclass
class Facts:
    src: Source
    answers: Answers
    scan: Scan
    report: ObjectiveReport | None
    why_no_report: str
    advantages: NDArray[np.float64] | None
    config: CheckConfig
    logged: LoggedInput | None = None

    def where(self, row: int, **extra: Any) -> dict[str, Any]:
        return _location(self.answers, self._file_of(row), row, **extra)

    def _file_of(self, row: int) -> str:
        return str(self.src.paths[self.src.file_of(row)[0]])


# ---------------------------------------------------------------------------- verdicts
def _judge(
    rule: str,
    cfg: RuleConfig,
    value: float | int | None,
    message: str,
    examples: list[dict[str, Any]] | None = None,
) -> Result:
    """Status from thresholds (strictly greater fails/warns) and the severity cap."""
    status = "pass"
    if value is None:
        status = "skip"
    elif cfg.fail is not None and value > cfg.fail:
        status = "fail"
    elif cfg.warn is not None and value > cfg.warn:
        status = "warn"
    if status == "fail" and cfg.severity == "warn":
        status = "warn"
    return Result(
        rule,
        status,
        value,
        {"warn": cfg.warn, "fail": cfg.fail},
        message,
        (examples or [])[:MAX_EXAMPLES],
    )


def _skip(rule: str, why: str) -> Result:
    return Result(rule, "skip", None, None, why)


Rule = Callable[[Facts, RuleConfig], Result]


# ---------------------------------------------------------------------- integrity
def _counted(
    rule: str, c: RuleConfig, n: int, examples: list[dict[str, Any]], found: str, clean: str
) -> Result:
    """An integrity verdict on a count of offending items: ``found`` when there are any."""
    return _judge(rule, c, n, f"{n} {found}" if n else clean, examples)


def rule_finite(f: Facts, c: RuleConfig) -> Result:
    s = f.scan
    return _counted(
        "finite",
        c,
        s.nonfinite,
        s.nonfinite_ex,
        "NaN/inf value(s) inside the mask",
        "every valid token's log-probs are finite",
    )


def rule_logp_range(f: Facts, c: RuleConfig) -> Result:
    s = f.scan
    share = s.zero / s.tokens if s.tokens else 0.0
    msg = (
        f"{s.positive} log-prob(s) > 0 inside the mask (a probability above 1); "
        f"{s.zero} exactly 0.0 ({100 * share:.2f}%: padding sentinels leak as p = 1)"
    )
    r = _judge("logp-range", c, s.positive, msg, s.positive_ex)
    limit = c.params.get("zero_share_warn")
    if r.status == "pass" and limit is not None and share > limit:
        r = replace(r, status="warn", message=msg + f"; above the {limit:g} share allowed")
    return r


def rule_lengths_match(f: Facts, c: RuleConfig) -> Result:
    s = f.scan
    return _counted(
        "lengths-match",
        c,
        s.mismatch,
        s.mismatch_ex,
        "answer(s) whose token fields differ in length",
        "every answer's token fields have equal lengths",
    )


def rule_mask_nonempty(f: Facts, c: RuleConfig) -> Result:
    s = f.scan
    clean = "every answer has a valid token"
    if s.masked_whole:
        clean = (
            f"{s.masked_whole} answer(s) of the recorded step have no valid token: the trainer "
            "masks them whole (e.g. truncated completions), so they are left out as it does"
        )
    return _counted("mask-nonempty", c, s.empty, s.empty_ex, "answer(s) with no valid token", clean)


def rule_group_size(f: Facts, c: RuleConfig) -> Result:
    a = f.answers
    if a.codes is None or a.labels is None:
        return _skip("group-size", "no group ids in the input")
    sizes = np.bincount(a.codes, minlength=len(a.labels))
    values, counts = np.unique(sizes, return_counts=True)
    usual = int(values[np.argmax(counts)])
    odd = np.flatnonzero((sizes != usual) | (sizes == 1))
    ex = [{"group": a.labels[int(g)], "size": int(sizes[g]), "usual_size": usual} for g in odd]
    singles = int((sizes == 1).sum())
    msg = (
        f"{odd.size} group(s) of unusual size (most have {usual}; {singles} singleton(s))"
        if odd.size
        else f"all {len(a.labels)} groups have {usual} answers"
    )
    if singles == len(a.labels) > 1:
        msg = SINGLETONS.format(n=singles)
    result = _judge("group-size", c, int(odd.size), msg, ex)
    shared = [n for n in a.notes if "more than one file" in n]
    if a.shared_ids and shared and result.status in ("pass", "fail"):  # ids shared by files
        return replace(result, status="warn", message=f"{msg}; {shared[0]}")
    return result


def rule_rewards_finite(f: Facts, c: RuleConfig) -> Result:
    a = f.answers
    if a.reward is None and a.advantage is None:
        return _skip("rewards-finite", "no rewards or advantages in the input")
    bad_r = np.flatnonzero(~np.isfinite(a.reward)) if a.reward is not None else np.zeros(0, int)
    bad_a = (
        np.flatnonzero(~np.isfinite(a.advantage)) if a.advantage is not None else np.zeros(0, int)
    )
    ex = []
    for name, arr, bad in (("reward", a.reward, bad_r), ("advantage", a.advantage, bad_a)):
        if arr is not None:
            ex += [f.where(int(i), field=name, value=str(arr[i])) for i in bad[:MAX_EXAMPLES]]
    n = int(bad_r.size + bad_a.size)
    msg = (
        f"{bad_r.size} non-finite reward(s), {bad_a.size} non-finite advantage(s)"
        if n
        else "every reward (and advantage) is finite"
    )
    return _judge("rewards-finite", c, n, msg, ex)


# ------------------------------------------------------------------------- health
def _need_report(rule: str, f: Facts) -> Result | None:
    if f.report is None:
        return _skip(rule, f.why_no_report)
    return None


def rule_zero_std_groups(f: Facts, c: RuleConfig) -> Result:
    if (skip := _need_report("zero-std-groups", f)) is not None:
        return skip
    assert f.report is not None
    g = f.report.group_summary
    if g is None:
        return _skip("zero-std-groups", "no rewards and group ids in the input")
    msg = (
        f"{g.zero_variance_groups} of {g.groups} groups have equal rewards: no learning "
        f"signal from {100 * g.frac_zero_std_answers:.1f}% of answers"
    )
    return _judge("zero-std-groups", c, g.frac_zero_variance_groups, msg)


def rule_kl_mean(f: Facts, c: RuleConfig) -> Result:
    if (skip := _need_report("kl-mean", f)) is not None:
        return skip
    assert f.report is not None
    kl = f.report.kl
    if kl is None or kl.mean is None:
        return _skip("kl-mean", "no ref_logp: no KL to the reference policy")
    return _judge(
        "kl-mean",
        c,
        kl.mean,
        f"mean per-token {f.report.settings.kl_estimator} KL to the reference: {kl.mean:.6g}",
    )


def rule_kl_max(f: Facts, c: RuleConfig) -> Result:
    if (skip := _need_report("kl-max", f)) is not None:
        return skip
    assert f.report is not None
    kl = f.report.kl
    if kl is None or kl.max is None:
        return _skip("kl-max", "no ref_logp: no KL to the reference policy")
    return _judge(
        "kl-max", c, kl.max, f"largest per-token {f.report.settings.kl_estimator} KL: {kl.max:.6g}"
    )


def rule_clip_region(f: Facts, c: RuleConfig) -> Result:
    if (skip := _need_report("clip-region", f)) is not None:
        return skip
    assert f.report is not None
    loss, own = f.report.settings.loss, f.report.loss_clip
    if own is not None:  # the loss's own clip metric, or none
        if own.share is None:
            return _skip(
                "clip-region",
                f"{loss} has no clip region (its trainer logs no clip share): the rule does "
                "not apply",
            )
        share, names = own.share, own.names
        seq = loss == "trl/cispo" and f.report.settings.ratio_level == "sequence"
        return _judge(
            "clip-region",
            c,
            share,
            f"{100 * share:.3f}% of {'answers' if seq else 'tokens'} clipped by {loss} "
            f"({' + '.join(names)})",
        )
    cl = f.report.clip
    return _judge(
        "clip-region",
        c,
        cl.region,
        f"{100 * cl.region:.3f}% of tokens clipped (low {100 * cl.low:.3f}%, "
        f"high {100 * cl.high:.3f}%)",
    )


def rule_ratio_extreme(f: Facts, c: RuleConfig) -> Result:
    if (skip := _need_report("ratio-extreme", f)) is not None:
        return skip
    assert f.report is not None
    r = f.report
    band = r.ratio_band
    share = r.ratio_outside_band
    msg = (
        f"{100 * share:.4f}% of tokens have a ratio outside [1/{band:g}, {band:g}]; "
        f"{r.extreme_tokens} with {EXTREME}, {r.overflow_tokens} overflow to inf; "
        f"ratio min {r.ratio.min:.4g}, max {r.ratio.max:.4g}"
    )
    return _judge("ratio-extreme", c, share, msg)


def rule_on_policy_exact(f: Facts, c: RuleConfig) -> Result:
    if not f.config.on_policy:
        return _skip("on-policy-exact", "not declared on-policy (--on-policy or on-policy = true)")
    if not f.src.has("old_logp"):
        return _skip("on-policy-exact", "no old_logp: nothing to compare")
    s = f.scan
    msg = (
        f"declared on-policy, but {s.offpolicy} token(s) have logp != old_logp "
        f"(max |difference| {s.offpolicy_max:.3g}): the trainer recomputed log-probs "
        f"differently"
        if s.offpolicy
        else "logp and old_logp are identical"
    )
    if f.report is not None and f.report.clip.region > 0:
        msg += f"; clip fraction {100 * f.report.clip.region:.3f}% (must be 0 on-policy)"
    return _judge("on-policy-exact", c, s.offpolicy, msg, s.offpolicy_ex)


def rule_rollout_mismatch(f: Facts, c: RuleConfig) -> Result:
    if (skip := _need_report("rollout-mismatch", f)) is not None:
        return skip
    assert f.report is not None
    ro = f.report.rollout
    if ro is None:
        return _skip("rollout-mismatch", "no rollout_logp: the sampler's log-probs are not logged")
    return _judge(
        "rollout-mismatch",
        c,
        ro.kl_k3,
        f"sampler vs trainer: mismatch KL (k3) {ro.kl_k3:.4g}, mean |δ| {ro.abs_diff_mean:.3g} "
        f"(max {ro.abs_diff_max:.3g}), IS weight mean {ro.is_weight_mean:.4g}, ESS "
        f"{ro.ess_token:.3g} (tokens) / {ro.ess_sequence:.3g} (answers), mean |Δp| "
        f"{ro.prob_abs_diff_mean:.3g}",
    )


def rule_unmasked_padding(f: Facts, c: RuleConfig) -> Result:
    """The share of answers (of 2+ valid tokens) closing with a run of exact 0.0 in every
    log-prob field: padding counted as tokens (:class:`grpo_cli._mistakes.ClosingZeros`)."""
    if (skip := _need_report("unmasked-padding", f)) is not None:
        return skip
    assert f.report is not None
    ic = f.report.inputs
    if ic is None or not ic.answers:
        return _skip("unmasked-padding", "no answer of 2 or more valid tokens")
    where = "inside the mask" if ic.masked else "with no mask"
    return _judge(
        "unmasked-padding",
        c,
        ic.closing_share,
        f"{ic.closing_zeros} of {ic.answers} answers ({100 * ic.closing_share:.1f}%) close "
        f"with 2+ exact 0.0 in every log-prob field {where} ({ic.closing_zero_tokens} tokens)",
    )


def rule_logp_alignment(f: Facts, c: RuleConfig) -> Result:
    """Fails when the trainer's log-probs correlate with ``rollout_logp`` better at a
    neighbouring position than at the same one (arrays shifted by one token)."""
    if (skip := _need_report("logp-alignment", f)) is not None:
        return skip
    assert f.report is not None
    ic = f.report.inputs
    corr = None if ic is None else ic.alignment
    if corr is None:
        return _skip("logp-alignment", "no rollout_logp: nothing to align the log-probs with")
    pairs = int(corr["pairs"] or 0)
    if pairs < 100:
        return _skip("logp-alignment", f"{pairs} token pairs: too few to tell (100 needed)")

    def r(side: str) -> str:
        v = corr[side]
        return "n/a" if v is None else f"{v:.3f}"

    side = shifted(corr)
    msg = (
        f"correlation with rollout_logp: same position {r('same')}, next {r('next')}, "
        f"previous {r('previous')} ({pairs} pairs)"
    )
    if side is not None:
        msg += f": the {side} position wins, the log-probs look shifted by one token"
    return _judge("logp-alignment", c, int(side is not None), msg)


def rule_advantage_mean(f: Facts, c: RuleConfig) -> Result:
    a = f.answers
    if f.advantages is None or a.codes is None or a.labels is None:
        return _skip("advantage-mean", "needs advantages (or rewards) and group ids")
    adv = f.advantages
    if not np.isfinite(adv).all():
        return _skip("advantage-mean", "non-finite advantages (see rewards-finite)")
    P = len(a.labels)
    count = np.bincount(a.codes, minlength=P)
    mean = np.bincount(a.codes, weights=adv, minlength=P) / np.maximum(count, 1)
    worst = np.argsort(-np.abs(mean), kind="stable")
    ex = [
        {"group": a.labels[int(g)], "mean_advantage": float(mean[g])}
        for g in worst
        if abs(mean[g]) > (c.warn or 0.0)
    ]
    value = float(np.max(np.abs(mean))) if P else 0.0
    src = "the file's" if a.advantage is not None else "recomputed"
    return _judge(
        "advantage-mean",
        c,
        value,
        f"largest |mean advantage| of a group ({src} advantages): {value:.3g}",
        ex,
    )


def rule_zero_variance_advantage(f: Facts, c: RuleConfig) -> Result:
    """Logged advantages that are not 0 in a group whose rewards are all equal.

    Every trainer computes group statistics in float32 (its reward manager's dtype): equal
    rewards then give a mean off by an ulp and a std of ~1e-8, and the normalisation turns
    that into one nonzero advantage shared by the whole group (up to 0.056 in verl with
    ε 1e-6, 6e-4 in TRL with ε 1e-4, ±10 after OpenRLHF's reward clip with ε 1e-9), which
    sign-based clip metrics then count. grpo-cli decides zero variance exactly (max == min).
    """
    rid = "zero-variance-advantage"
    a = f.answers
    if a.advantage is None:
        return _skip(rid, "needs logged advantages")
    if a.reward is None or a.codes is None or a.labels is None:
        return _skip(rid, "needs rewards and group ids to find the zero-variance groups")
    if not (np.isfinite(a.reward).all() and np.isfinite(a.advantage).all()):
        return _skip(rid, "non-finite rewards or advantages (see rewards-finite)")
    P = len(a.labels)
    lo, hi = np.full(P, np.inf), np.full(P, -np.inf)
    np.minimum.at(lo, a.codes, a.reward)
    np.maximum.at(hi, a.codes, a.reward)
    constant = (lo == hi)[a.codes]
    bad = constant & (a.advantage != 0.0)
    rows = np.flatnonzero(bad)
    ex = [
        {"answer": int(i), "group": a.labels[int(a.codes[i])], "advantage": float(a.advantage[i])}
        for i in rows[:MAX_EXAMPLES]
    ]
    worst = float(np.max(np.abs(a.advantage[bad]))) if rows.size else 0.0
    groups = len({int(a.codes[i]) for i in rows})
    message = (
        f"{rows.size} answer(s) in {groups} zero-variance group(s) have nonzero logged "
        f"advantages (largest |A| {worst:.3g}): the trainer's float32 group statistics "
        "(a residual std of ~1e-8 divided by std + ε); its clip metrics count these tokens"
        if rows.size
        else "every zero-variance group has zero logged advantages"
    )
    return _judge(rid, c, int(rows.size), message, ex)


def rule_logged_metrics(f: Facts, c: RuleConfig) -> Result:
    """What the trainer logged (``--logged``) against the same metrics recomputed: the
    largest relative difference, failing above ``fail`` (1e-3: float32 logging is far
    tighter; a difference this size is another formula, preset or batch)."""
    rid = "logged-metrics"
    if f.logged is None:
        return _skip(rid, "no --logged metrics given")
    if f.logged.unreadable is not None:
        return _skip(rid, f"unreadable: {f.logged.unreadable}")
    if f.report is None:
        return _skip(rid, f.why_no_report)
    if not f.report.trainer_metrics:
        return _skip(rid, "no trainer named (--preset or --trainer): nothing to compare")
    lg = f.logged
    cmp = compare_logged(
        lg.file, lg.metrics, lg.step, f.report.trainer_metrics, tolerance=c.fail or 0.0
    )
    if not cmp.compared:
        names = ", ".join(sorted(lg.metrics)) or "none"
        return _skip(rid, f"none of the logged metrics ({names}) is one grpo-cli recomputes")
    value = cmp.max_relative
    assert value is not None
    ex = [
        {"metric": m.metric, "logged": m.logged, "recomputed": m.recomputed, "relative": m.relative}
        for m in sorted(cmp.compared, key=lambda m: -(m.relative or 0.0))
    ]
    at = f" (step {lg.step})" if lg.step is not None else ""
    return _judge(
        rid,
        c,
        value,
        f"{len(cmp.compared)} logged metric(s){at} against grpo-cli's: largest relative "
        f"difference {value:.3g} ({ex[0]['metric']})",
        ex,
    )


# Rule id -> (function, default config). Integrity rules fail on any count above 0.
RULES: dict[str, tuple[Rule, RuleConfig]] = {
    "finite": (rule_finite, RuleConfig(fail=0)),
    "logp-range": (rule_logp_range, RuleConfig(fail=0, params={"zero_share_warn": 0.25})),
    "lengths-match": (rule_lengths_match, RuleConfig(fail=0)),
    "mask-nonempty": (rule_mask_nonempty, RuleConfig(fail=0)),
    "group-size": (rule_group_size, RuleConfig(fail=0)),
    "rewards-finite": (rule_rewards_finite, RuleConfig(fail=0)),
    "zero-std-groups": (rule_zero_std_groups, RuleConfig(warn=0.5, fail=0.9)),
    "kl-mean": (rule_kl_mean, RuleConfig(warn=0.1, fail=1.0)),
    "kl-max": (rule_kl_max, RuleConfig(warn=10.0, fail=50.0)),
    "clip-region": (rule_clip_region, RuleConfig(warn=0.1, fail=0.3)),
    "ratio-extreme": (rule_ratio_extreme, RuleConfig(warn=1e-4, fail=1e-3, params={"band": 10.0})),
    "on-policy-exact": (rule_on_policy_exact, RuleConfig(fail=0)),
    "rollout-mismatch": (rule_rollout_mismatch, RuleConfig(warn=0.01, fail=0.1)),
    "unmasked-padding": (rule_unmasked_padding, RuleConfig(warn=0.2, fail=0.5)),
    "logp-alignment": (rule_logp_alignment, RuleConfig(fail=0)),
    "advantage-mean": (rule_advantage_mean, RuleConfig(warn=1e-6, fail=1e-3)),
    "zero-variance-advantage": (rule_zero_variance_advantage, RuleConfig(fail=0)),
    "logged-metrics": (rule_logged_metrics, RuleConfig(fail=1e-3)),
}
INTEGRITY = ("finite", "logp-range", "lengths-match", "mask-nonempty", "rewards-finite")


# --------------------------------------------------------------------------- config io
_RULE_KEYS = {"enabled", "severity", "warn", "fail"}
_TOP_KEYS = {"rules", "on-policy", "baseline-tolerance", "require"}
# rule parameters and their domains: (lowest allowed, whether the lowest is excluded)
_PARAM_DOMAIN = {"band": (1.0, True), "zero_share_warn": (0.0, False)}


def _apply(cfg: CheckConfig, table: dict[str, Any], where: str) -> CheckConfig:
    unknown = set(table) - _TOP_KEYS
    if unknown:
        raise UsageError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(_TOP_KEYS))}"
        )
    rules = dict(cfg.rules)
    body_of = table.get("rules") or {}
    if not isinstance(body_of, dict):
        raise UsageError(f"{where}: rules must be a table of rule tables")
    for rid, body in body_of.items():
        if not isinstance(body, dict):
            raise UsageError(f"{where}: rules.{rid} must be a table")
        for key, value in body.items():
            rules = _set_rule(rules, rid, key, value, where)
    on_policy = table.get("on-policy", cfg.on_policy)
    tol = table.get("baseline-tolerance", cfg.baseline_tolerance)
    if not isinstance(on_policy, bool):
        raise UsageError(f"{where}: on-policy must be true or false")
    if (
        isinstance(tol, bool)
        or not isinstance(tol, int | float)
        or not (math.isfinite(tol) and tol >= 0)
    ):
        raise UsageError(f"{where}: baseline-tolerance must be a finite number >= 0, got {tol!r}")
    require = table.get("require", list(cfg.require))
    if not isinstance(require, list) or not all(isinstance(r, str) for r in require):
        raise UsageError(f"{where}: require must be a list of rule names")
    return CheckConfig(
        rules=rules,
        on_policy=on_policy,
        baseline_tolerance=float(tol),
        require=_known_rules(require, f"{where}: require"),
    )


def _known_rules(names: list[str], where: str) -> tuple[str, ...]:
    unknown = [n for n in names if n not in RULES]
    if unknown:
        raise UsageError(
            f"{where}: unknown rule(s) {', '.join(unknown)}; rules: {', '.join(RULES)}"
        )
    return tuple(dict.fromkeys(names))


def _set_rule(
    rules: dict[str, RuleConfig],
    rid: str,
    key: str,
    value: Any,
    where: str,
    registry: dict[str, tuple[Any, RuleConfig]] | None = None,
) -> dict[str, RuleConfig]:
    known = RULES if registry is None else registry
    if rid not in known:
        raise UsageError(f"{where}: unknown rule {rid!r}; rules: {', '.join(known)}")
    rc = rules[rid]
    if key == "enabled":
        if not isinstance(value, bool):
            raise UsageError(f"{where}: rules.{rid}.enabled must be true or false")
        rc = replace(rc, enabled=value)
    elif key == "severity":
        if value not in ("fail", "warn"):
            raise UsageError(f"{where}: rules.{rid}.severity must be 'fail' or 'warn'")
        rc = replace(rc, severity=value)
    elif key in ("warn", "fail"):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise UsageError(f"{where}: rules.{rid}.{key} must be a finite number, got {value!r}")
        number = None if value is None else float(value)
        rc = replace(rc, warn=number) if key == "warn" else replace(rc, fail=number)
    elif key in set(known[rid][1].params):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise UsageError(f"{where}: rules.{rid}.{key} must be a finite number, got {value!r}")
        low, open_ = _PARAM_DOMAIN.get(key, (-math.inf, False))
        if value < low or (open_ and value == low):
            sign = ">" if open_ else ">="
            raise UsageError(f"{where}: rules.{rid}.{key} must be {sign} {low:g}, got {value!r}")
        rc = replace(rc, params={**rc.params, key: float(value)})
    else:
        allowed = sorted(_RULE_KEYS | set(known[rid][1].params))
        raise UsageError(f"{where}: unknown key rules.{rid}.{key}; allowed: {', '.join(allowed)}")
    return {**rules, rid: rc}


def rule_flags(
    flags: list[str] | None,
    registry: dict[str, tuple[Any, RuleConfig]],
) -> dict[str, RuleConfig]:
    """The default configs of ``registry`` with ``--rule RULE.KEY=VALUE`` flags applied."""
    rules = {k: v[1] for k, v in registry.items()}
    for item in flags or ():
        target, sep, value = item.partition("=")
        rid, dot, key = target.rpartition(".")
        if not sep or not dot:
            raise UsageError(f"--rule {item!r}: expected RULE.KEY=VALUE")
        parsed = _parse_flag_value(value)
        rules = _set_rule(rules, rid.strip(), key.strip(), parsed, "--rule", registry)
    return rules


def _parse_flag_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    if low in ("fail", "warn"):
        return low
    if low == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--rule: cannot read value {text!r}") from None


def load_config(
    config: Path | None,
    rule_flags: list[str] | None = None,
    on_policy: bool | None = None,
    cwd: Path | None = None,
    require: list[str] | None = None,
) -> CheckConfig:
    """Defaults, then ``--config`` or ``[tool.grpo-cli.check]`` of ./pyproject.toml, then flags."""
    cfg = CheckConfig(rules={k: v[1] for k, v in RULES.items()})
    if config is not None:
        try:
            with open(config, "rb") as fh:
                table = tomllib.load(fh)
        except OSError as exc:
            raise UsageError(f"--config {config}: cannot read ({exc.strerror or exc})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"--config {config}: invalid TOML ({exc})") from None
        cfg = _apply(cfg, table, str(config))
    else:
        pyproject = (cwd or Path.cwd()) / "pyproject.toml"
        if pyproject.is_file():
            try:
                with open(pyproject, "rb") as fh:
                    doc = tomllib.load(fh)
            except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(f"{pyproject}: cannot read ({exc})") from None
            tool: Any = doc.get("tool", {})
            mine: Any = tool.get("grpo-cli", {}) if isinstance(tool, dict) else None
            section: Any = mine.get("check") if isinstance(mine, dict) else None
            if not isinstance(mine, dict) or not isinstance(section, dict | None):
                raise UsageError(f"{pyproject}: [tool.grpo-cli.check] must be a table")
            if section is not None:
                cfg = _apply(cfg, section, f"{pyproject} [tool.grpo-cli.check]")
    rules = dict(cfg.rules)
    for item in rule_flags or ():
        target, sep, value = item.partition("=")
        rid, dot, key = target.rpartition(".")
        if not sep or not dot:
            raise UsageError(f"--rule {item!r}: expected RULE.KEY=VALUE, e.g. kl-mean.fail=0.5")
        rules = _set_rule(rules, rid.strip(), key.strip(), _parse_flag_value(value), "--rule")
    cfg = replace(cfg, rules=rules)
    if on_policy:
        cfg = replace(cfg, on_policy=True)
    if require:
        cfg = replace(cfg, require=_known_rules([*cfg.require, *require], "--require"))
    return cfg


# ------------------------------------------------------------------------------- scan
def _location(answers: Answers, file: str, row: int, **extra: Any) -> dict[str, Any]:
    """An example location: file, answer index, group id, and whatever else is given."""
    out: dict[str, Any] = {"file": file, "answer": int(row)}
    if answers.codes is not None and answers.labels is not None and row < answers.codes.shape[0]:
        out["group"] = answers.labels[int(answers.codes[row])]
    out.update(extra)
    return out


def _flagged(
    flags: NDArray[np.bool_], offsets: NDArray[np.int64], room: int, base: int = 0
) -> tuple[int, list[tuple[int, int, int]]]:
    """How many flags are set, and (flat index, answer in batch, token) of the first
    ``room``; ``flags`` cover the batch's tokens from ``base`` on."""
    idx = np.flatnonzero(flags)
    places = []
    for k in idx[: max(0, room)] + base:
        i = int(np.searchsorted(offsets, k, side="right") - 1)
        places.append((int(k), i, int(k - offsets[i])))
    return int(idx.size), places


def _scan_batch(s: Scan, rb: RawBatch, src: Source, cfg: CheckConfig) -> None:
    """Fold one raw batch into the integrity scan: count every problem (the predicates of
    :mod:`grpo_cli.batch`, which validation raises on), keep a few places. Token values are
    scanned a slice of :data:`grpo_cli.batch.SLICE_TOKENS` at a time, so that one answer
    of millions of tokens costs a few temporaries of that size, not of its length."""
    fields = rb.fields
    groups = rb.answer.get("group")

    def where(file: str, row: int, **extra: Any) -> dict[str, Any]:
        """A place in this batch: its group id from the batch's own column, so the scan
        needs no table of the whole input (any block of rows scans anywhere)."""
        out: dict[str, Any] = {"file": file, "answer": int(row)}
        if rb.unit == "row":  # parquet: the row within its file too
            out["row"] = int(row - rb.file_start)
        if groups is not None:
            out["group"] = groups[row - rb.start].as_py()
        out.update(extra)
        return out

    first = fields[0]
    off0 = rb.offsets[first]
    lengths0 = np.diff(off0)
    s.rows += rb.n
    m = rb.mask  # None: every token valid

    def where_token(k: int, i: int, t: int, **extra: Any) -> dict[str, Any]:
        return where(rb.label, rb.start + i, token=t, **extra)

    misaligned = set()
    for f, bad in sorted(length_mismatches(rb), key=lambda fb: fb[0] != "mask"):
        misaligned.add(f)
        s.mismatch += int(bad.size)
        lengths = np.diff(rb.offsets[f])
        for i in bad[: max(0, MAX_EXAMPLES - len(s.mismatch_ex))]:
            s.mismatch_ex.append(
                where(
                    rb.label,
                    rb.start + int(i),
                    field="mask" if f == "mask" else src.name(f),
                    length=int(lengths[i]),
                    expected=int(lengths0[i]),
                )
            )
    valid_per_row = valid_lengths(rb)  # an empty last answer included
    valid_per_row[lengths0 == 0] = 0
    s.tokens += int(valid_per_row.sum())
    empty = np.flatnonzero(valid_per_row == 0)
    s.empty += int(empty.size)
    for i in empty[: max(0, MAX_EXAMPLES - len(s.empty_ex))]:
        s.empty_ex.append(where(rb.label, rb.start + int(i), tokens=int(lengths0[i])))
    for f in fields:
        if f in misaligned:
            continue  # values of a misaligned field cannot be matched to the mask
        v = rb.values[f]
        for lo, hi in token_ranges(v.shape[0], _batch.SLICE_TOKENS):
            ms = None if m is None else m[lo:hi]
            _scan_values(s, f, src.name(f), v[lo:hi], ms, lo, off0, where_token)
    if cfg.on_policy and "old_logp" in fields and "old_logp" not in misaligned:
        for lo, hi in token_ranges(int(off0[-1]), _batch.SLICE_TOKENS):
            ms = None if m is None else m[lo:hi]
            a = rb.values["logp"][lo:hi].astype(np.float64, copy=False)
            b = rb.values["old_logp"][lo:hi].astype(np.float64, copy=False)
            with np.errstate(invalid="ignore"):
                diff = (a != b) & np.isfinite(a) & np.isfinite(b)
            if ms is not None:
                diff &= ms
            n, places = _flagged(diff, off0, MAX_EXAMPLES - len(s.offpolicy_ex), lo)
            if n:
                s.offpolicy += n
                s.offpolicy_max = max(s.offpolicy_max, float(np.max(np.abs(a[diff] - b[diff]))))
                s.offpolicy_ex += [
                    where_token(k, i, t, logp=float(a[k - lo]), old_logp=float(b[k - lo]))
                    for k, i, t in places
                ]


def _scan_values(
    s: Scan,
    f: str,
    name: str,
    v: np.ndarray,
    m: NDArray[np.bool_] | None,
    lo: int,
    offsets: NDArray[np.int64],
    where_token: Callable[..., dict[str, Any]],
) -> None:
    """The token checks of field ``f`` (named ``name`` in the file) over the tokens
    ``lo ..`` of a batch of answers at ``offsets`` (``m``: their mask, None when every token
    is valid); ``where_token(k, i, t, **extra)`` places token ``k`` (answer ``i``, token
    ``t``).

    A clean slice (the common case) costs two reductions over its valid values as stored
    (gathered under the mask first: numpy's masked reductions are slower than the gather):
    a finite sum means every valid value is finite, and the maximum says that none is
    positive (below 0 for ``logp``: none is 0 either). Anything else is counted, and
    placed, token by token."""
    if v.dtype.kind == "f" and v.shape[0]:
        valid = v if m is None else v[m]
        with np.errstate(over="ignore", invalid="ignore"):  # ±1e308s may sum to inf
            finite = math.isfinite(np.add.reduce(valid))
            if finite and f == "entropy":
                return
            top = np.maximum.reduce(valid, initial=-np.inf)
        if finite and (top < 0 or (top == 0 and f != "logp")):
            return
    vf = v.astype(np.float64, copy=False)

    def count(attr: str, flags: NDArray[np.bool_], value: Callable[[int], Any]) -> None:
        """Count the flagged valid tokens into ``s.<attr>``, a few places into ``<attr>_ex``."""
        if m is not None:
            flags &= m
        ex: list[dict[str, Any]] = getattr(s, f"{attr}_ex")
        n, places = _flagged(flags, offsets, MAX_EXAMPLES - len(ex), lo)
        setattr(s, attr, getattr(s, attr) + n)
        ex += [where_token(k, i, t, field=name, value=value(k - lo)) for k, i, t in places]

    count("nonfinite", nonfinite_flags(vf, None), lambda j: str(vf[j]))
    if f == "entropy":  # an entropy is >= 0 by nature: only its finiteness is checked
        return
    with np.errstate(invalid="ignore"):
        count("positive", vf > 0, lambda j: float(vf[j]))
    if f == "logp":
        zero = vf == 0
        if m is not None:
            zero &= m
        s.zero += int(np.count_nonzero(zero))


def _fields(src: Source) -> list[str]:
    """The log-prob fields present."""
    return [f for f in LOGP_FIELDS if src.has(f)]


def _token_fields(src: Source) -> list[str]:
    """The fields the objective reads: the log-probs, plus the entropy when logged."""
    return _fields(src) + (["entropy"] if src.has("entropy") else [])


# -------------------------------------------------------------------------------- run
def run_check(
    src: Source,
    settings: Settings,
    cfg: CheckConfig,
    baseline: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    engine: EngineOptions | None = None,
    logged: LoggedInput | None = None,
) -> CheckReport:
    """Evaluate every rule of ``cfg`` on ``src``; optionally compare with a baseline report.

    One pass over the raw token batches folds the integrity scan and the objective
    together (:class:`CheckPartial`), over the same streams and batches as ``objective``,
    so the two commands report the same numbers to the last digit.
    """
    engine = (engine or EngineOptions()).resolved()
    missing = [] if src.has("logp") else [src.name("logp")]
    if not (src.has("advantage") or src.has("reward")):
        reward, group, adv = src.name("reward"), src.name("group"), src.name("advantage")
        missing.append(f"{reward} (with {group}) or {adv}")
    if missing:  # a gate that evaluates nothing must not pass
        raise InputError(
            f"{src.label}: check needs {' and '.join(missing)}; the input has: "
            f"{', '.join(src.present) or 'no known field'} (map other names with "
            "--column FIELD=NAME)"
        )
    read = columns_reader(engine)
    answers = load_answers(src, need_rewards=False, allow_nonfinite=True, read=read)
    fields = _token_fields(src)
    why = ""
    finite_answers = all(
        x is None or bool(np.isfinite(x).all()) for x in (answers.reward, answers.advantage)
    )
    if not finite_answers:
        why = "not evaluated: integrity failed (rewards-finite)"
    s = settings if src.has("ref_logp") else replace(settings, beta=0.0)
    p1 = None if why else objective_pass1(src, s, answers=answers, engine=engine)
    fold_objective = None if p1 is None else p1.fold(src.label)

    def new() -> CheckPartial:
        tokens = None if p1 is None else TokenPartial(s, backend=engine.backend)
        return CheckPartial(Scan(), tokens)

    def fold(part: CheckPartial, raw: RawBatch) -> None:
        if src.recorded is not None:  # the trainer's own masked answers: left out, counted
            raw, dropped = _batch.drop_empty(raw)
            part.scan.masked_whole += dropped
            if not raw.n:
                return
        before = part.scan.problems()
        _scan_batch(part.scan, raw, src, cfg)
        if fold_objective is None or part.objective is None or part.invalid:
            return
        if part.scan.problems() != before:  # counted, not raised: the objective stops here
            part.invalid = True
            return
        # the scan evaluated every predicate validation raises on: only gather the tokens
        fold_objective(part.objective, _batch.validate(raw, checked=True))

    total, ran = run(plan(src, fields, engine), new, fold, validated=False, progress=progress)
    ran = (p1.ran if p1 is not None else ran_by(read)).then(ran)
    report = None
    if p1 is not None and total.objective is not None and not total.invalid:
        band = cfg.rules["ratio-extreme"].params.get("band", 10.0)
        calls = None
        if logs_per_call(src, s):  # the trainer logs its calls' metrics: so are they compared
            calls, _, more = recorded_calls(
                src, s, p1, lambda: TokenPartial(s, backend=engine.backend), engine=engine
            )
            ran = ran.then(more)
        report = objective_record(
            src, s, total.objective, p1, engine=engine, ran=ran, ratio_band=band, calls=calls,
            empty=total.scan.masked_whole,
        )  # fmt: skip
    facts = Facts(
        src=src,
        answers=answers,
        scan=total.scan,
        report=report,
        why_no_report=why,
        advantages=answers.advantage,
        config=cfg,
        logged=logged,
    )
    integrity = {rid: RULES[rid][0](facts, cfg.rules[rid]) for rid in INTEGRITY}
    broken = [rid for rid, r in integrity.items() if r.status == "fail"]
    if broken:
        facts.report = None
        facts.why_no_report = f"not evaluated: integrity failed ({', '.join(broken)})"
    if facts.advantages is None and p1 is not None:
        facts.advantages = p1.adv
    elif (
        facts.advantages is None
        and answers.reward is not None
        and answers.codes is not None
        and answers.labels is not None
        and np.isfinite(answers.reward).all()
    ):
        facts.advantages = advantages_by_group(
            answers.reward,
            answers.codes,
            n_groups=len(answers.labels),
            **settings.advantage_kwargs(),
        )
    results = []
    for rid, (fn, _) in RULES.items():
        rc = cfg.rules[rid]
        if not rc.enabled:
            results.append(_skip(rid, "turned off by the configuration"))
        elif rid in integrity:
            results.append(integrity[rid])
        else:
            results.append(fn(facts, rc))
    results = _with_worst_answers(results, facts, s, engine, p1, cfg)
    results = [_required(r) if r.rule in cfg.require else r for r in results]
    if baseline is not None:
        results.append(_baseline(results, baseline, cfg.baseline_tolerance))
    return CheckReport(
        source=src.label,
        results=results,
        settings=settings,
        engine=engine,
        objective=facts.report,
        why_no_objective=facts.why_no_report,
        ran=ran,
    )


# health rule -> the per-answer statistic whose worst answers are its places to look
WORST_BY = {
    "kl-mean": "kl_mean",
    "kl-max": "kl_max",
    "clip-region": "clip_share",
    "ratio-extreme": "log_ratio_max_abs",
    "rollout-mismatch": "rollout_kl_mean",
}
# where the worst token of an answer is, for the statistics that have one
WORST_TOKEN = {"kl_max": "kl_max_token", "log_ratio_max_abs": "log_ratio_max_token"}


def _with_worst_answers(
    results: list[Result],
    facts: Facts,
    settings: Settings,
    engine: EngineOptions,
    p1: Pass1 | None,
    cfg: CheckConfig | None = None,
) -> list[Result]:
    """Health rules that warn or fail list their places to look (one more pass over the
    tokens, only then): the answers whose statistic is beyond the threshold the rule
    crossed (:func:`_place_limit`), worst first; when no answer alone is beyond it, the
    answers that contribute most, and the message says so."""
    flagged = [
        r for r in results if r.rule in WORST_BY and r.status in ("warn", "fail") and not r.examples
    ]
    if not flagged or facts.report is None:
        return results
    from ._answers import worst_answers

    keys = sorted({WORST_BY[r.rule] for r in flagged})
    worst = worst_answers(facts.src, settings, keys, top=MAX_EXAMPLES, engine=engine, p1=p1)
    out = []
    for r in results:
        if r in flagged:
            key = WORST_BY[r.rule]
            limit = _place_limit(r, cfg)
            rows = worst[key]
            beyond = [row for row in rows if limit is None or row[key] > limit]
            if not beyond and rows and limit is not None:
                beyond = rows
                r = replace(
                    r,
                    message=f"{r.message}; no answer alone is beyond {limit:.3g}: the "
                    f"{len(rows)} that contribute most",
                )
            examples = []
            for row in beyond:
                extra = {key: row[key], "length": row["length"]}
                if key in WORST_TOKEN:
                    extra["valid_token"] = row[WORST_TOKEN[key]]  # among the valid ones
                examples.append(facts.where(row["_index"], **extra))
            r = replace(r, examples=examples)
        out.append(r)
    return out


def _place_limit(r: Result, cfg: CheckConfig | None) -> float | None:
    """The per-answer value beyond which an answer is a place to look for rule ``r``: the
    threshold it crossed (an answer's mean KL, max KL, clip share, mismatch KL are on the
    rule's own scale); for ``ratio-extreme`` (a share of tokens), an answer with a token
    outside the band, ``|log ρ| > log band``."""
    if r.rule == "ratio-extreme":
        rc = (cfg.rules.get(r.rule) if cfg is not None else None) or RULES[r.rule][1]
        band = float(rc.params.get("band", 10.0))
        return math.log(band)
    if r.threshold is None:
        return None
    return r.threshold.get("fail" if r.status == "fail" else "warn")


def _required(r: Result) -> Result:
    """A required rule that could not be evaluated fails: the gate never passes on what it
    did not check."""
    if r.status != "skip":
        return r
    return replace(r, status="fail", message=f"required but not evaluated: {r.message}")


DRIFT_FLOOR = 1e-6  # |baseline| below this counts as this, so 0 → tiny is not infinite drift


def _baseline(results: list[Result], base: dict[str, Any], tol: float) -> Result:
    try:
        before = {r["rule"]: r.get("value") for r in base["results"]}
    except (KeyError, TypeError):
        raise InputError("--baseline: not a grpo-cli check JSON report (no 'results')") from None
    drifts = []
    worst = 0.0
    for r in results:
        b = before.get(r.rule)
        if not isinstance(r.value, int | float) or not isinstance(b, int | float):
            continue
        d = abs(r.value - b) / max(abs(b), DRIFT_FLOOR)
        worst = max(worst, d)
        if d > tol:
            drifts.append({"rule": r.rule, "value": r.value, "baseline": b, "drift": d})
    drifts.sort(key=lambda x: -float(x["drift"]))
    msg = (
        f"{len(drifts)} rule value(s) drifted more than {100 * tol:g}% from the baseline"
        if drifts
        else f"every rule value within {100 * tol:g}% of the baseline"
    )
    status = "fail" if drifts else "pass"
    return Result(
        "baseline-drift",
        status,
        worst if math.isfinite(worst) else None,
        {"warn": None, "fail": tol},
        msg,
        drifts[:MAX_EXAMPLES],
    )


# --------------------------------------------------------------------- outputs
def read_baseline(path: Path) -> dict[str, Any]:
    """A previous ``check --format json`` report (``--baseline``)."""
    try:
        base = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"--baseline {path}: cannot read a JSON report ({exc})") from None
    if not isinstance(base, dict):
        raise UsageError(f"--baseline {path}: not a grpo-cli check JSON report (not an object)")
    return base


def _write(path: Path, text: str, what: str, mode: str = "w") -> None:
    try:
        with open(path, mode, encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write ({exc.strerror or exc})") from None


def write_outputs(
    report: CheckReport,
    output_format: str,
    report_path: Path | None = None,
    step_summary: str | None = None,
) -> str | None:
    """Write the report where it was asked for (``--report``: the JSON document; with
    ``github``, the markdown summary appended to ``step_summary``, the file
    ``$GITHUB_STEP_SUMMARY`` names, before any annotation: a failure there leaves stdout
    empty) and return what stdout gets in ``output_format`` (None: the table)."""
    from .views.json import check_json, dumps

    doc = check_json(report)
    if report_path is not None:
        _write(report_path, dumps(doc) + "\n", "--report")
    if output_format == "json":
        return dumps(doc) + "\n"
    if output_format == "github":
        from .views.ci import check_github

        lines, summary = check_github(report)
        if step_summary:
            _write(Path(step_summary), summary, "$GITHUB_STEP_SUMMARY", "a")
        return "".join(line + "\n" for line in lines)
    if output_format == "junit":
        from .views.ci import check_junit

        return check_junit(report)
    return None
