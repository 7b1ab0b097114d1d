"""The rules of ``grpo-cli check``, one function each, and their table (:data:`RULES`):
integrity rules on the scan, health rules on the objective's report."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..causes import config_causes, sampler_in_effect, sampler_settings
from ..fold.loss import clip_unit
from ..fold.mistakes import shifted
from ..fold.summaries import SINGLETONS
from ..logged import compare_logged
from ..records import EXTREME, LoggedComparison, Result, SamplerSupport
from .base import MAX_EXAMPLES, RuleConfig, _judge, _skip
from .scan import Facts

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
        unit = clip_unit(f.report.settings)
        return _judge(
            "clip-region",
            c,
            share,
            f"{100 * share:.3f}% of {unit} clipped by {loss} ({' + '.join(names)})",
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


def support_words(sp: SamplerSupport, config: Mapping[str, object], named: bool) -> str:
    """What the sampler's support says (check's message and explain's finding): the
    evidence, the signature when ``named`` (above the rule's warn threshold), ρ raw and
    corrected, and the recorded sampling settings."""
    kind, _ = sp.signature
    nz = sp.below + sp.above
    share = sp.below / nz if nz else 0.0
    corr = "n/a" if sp.corr_rollout is None else f"{sp.corr_rollout:+.3f}"
    ent = "" if sp.corr_entropy is None else f", with entropy {sp.corr_entropy:+.3f}"
    evidence = (
        f"δ = trainer − sampler log-prob < 0 at {100 * share:.1f}% of {nz} tokens "
        f"(one-sided {sp.one_sided:.3f}, mean δ {sp.mean_delta:.4g}; correlation with "
        f"rollout_logp {corr}{ent})"
    )
    if not named:
        out = f"no sign of a truncated or tempered sampler: {evidence}"
    elif kind == "truncated":
        out = (
            "a truncated sampler (top-p/top-k/min-p: its log-probs renormalised over the "
            f"tokens it kept): {evidence}"
        )
    else:
        low = sp.corr_rollout is not None and sp.corr_rollout < 0
        out = (
            f"a tempered sampler (temperature {'below' if low else 'above'} 1: δ linear in "
            f"the token's log-prob): {evidence}"
        )
    out += f"; IS weight mean {sp.is_weight_mean:.4f}"
    if named and sp.kept_mass is not None and sp.is_weight_mean_corrected is not None:
        by = "by entropy bin" if sp.corrected_by == "entropy" else "over the batch"
        out += (
            f", {sp.is_weight_mean_corrected:.4f} with the kept mass ({sp.kept_mass:.4f}, "
            f"{by}) divided out"
        )
    s = sampler_settings(config)
    said = sampler_in_effect(s)
    if said:
        out += f"; the run's config: {', '.join(said)}"
    if "logprobs_mode" in s:
        out += f", logprobs_mode {s['logprobs_mode']}"
    return out


def rule_sampler_support(f: Facts, c: RuleConfig) -> Result:
    """A truncated or tempered sampler, from the log-probs alone
    (:mod:`grpo_cli.fold.sampler`): the larger of the one-sidedness of δ and its
    correlation with ``rollout_logp``; skipped below ``min_tokens`` tokens with δ ≠ 0."""
    rid = "sampler-support"
    if (skip := _need_report(rid, f)) is not None:
        return skip
    assert f.report is not None
    ro = f.report.rollout
    sp = None if ro is None else ro.support
    if sp is None:
        return _skip(rid, "no rollout_logp: the sampler's log-probs are not logged")
    nz, least = sp.below + sp.above, int(c.params.get("min_tokens", 100))
    if nz < least:
        return _skip(rid, f"{nz} token(s) with δ ≠ 0: too few to tell ({least} needed)")
    rec = f.src.recorded
    config = rec.run.config if rec is not None else {}
    size = sp.signature[1]
    named = c.warn is None or size > c.warn
    return _judge(rid, c, size, support_words(sp, config, named))


def rule_config_causes(f: Facts, c: RuleConfig) -> Result:
    """Causes from the configuration (:func:`grpo_cli.causes.config_causes`): settings
    that contradict each other or the data (unequal rollout and actor micro-batch sizes
    in an on-policy run with ρ ≠ 1, the KL in the reward and the loss at once, a reference
    that is the policy); the value is how many apply."""
    rid = "config-causes"
    if (skip := _need_report(rid, f)) is not None:
        return skip
    assert f.report is not None
    found = config_causes(f.report)
    if not found:
        return _judge(rid, c, 0, "no known conflict between the run's settings and its data")
    ex = [{"id": x.id, **x.evidence} for x in found]
    more = f" (+{len(found) - 1} more: {', '.join(x.id for x in found[1:])})" if found[1:] else ""
    return _judge(rid, c, len(found), f"{found[0].id}: {found[0].message}{more}", ex)


def rule_unmasked_padding(f: Facts, c: RuleConfig) -> Result:
    """The share of answers (of 2+ valid tokens) closing with a run of exact 0.0 in every
    log-prob field: padding counted as tokens (:class:`grpo_cli.fold.mistakes.ClosingZeros`)."""
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
        lg.file, lg.metrics, lg.step, f.report.trainer_metrics, tolerance=c.fail or 0.0,
        causes=f.report.causes,
    )  # fmt: skip
    if not cmp.compared:
        names = ", ".join(sorted(lg.metrics)) or "none"
        return _skip(rid, f"none of the logged metrics ({names}) is one grpo-cli recomputes")
    # a metric the comparison matched beyond the tolerance (two near-zero values, a loss
    # logged rounded to 4 decimals) is judged as its verdict says, not by its relative
    # difference: an on-policy loss of ~1e-8 differs by 75% in float32 noise alone
    tol = c.fail or 0.0

    def judged(m: LoggedComparison) -> float:
        return 0.0 if _matched_beyond(m, tol) else m.relative or 0.0

    value = max(judged(m) for m in cmp.compared)
    ex: list[dict[str, Any]] = [
        {"metric": m.metric, "logged": m.logged, "recomputed": m.recomputed, "relative": m.relative}
        for m in sorted(cmp.compared, key=lambda m: (-judged(m), -(m.relative or 0.0)))
    ]
    at = f" (step {lg.step})" if lg.step is not None else ""
    why = ""
    cause = next((m.cause for m in cmp.compared if m.metric == ex[0]["metric"]), None)
    if cause is not None:
        ex[0]["cause"] = cause.to_json()
        why = f"; why: {cause.words}"
    return _judge(
        rid,
        c,
        value,
        f"{len(cmp.compared)} logged metric(s){at} against grpo-cli's: largest relative "
        f"difference {value:.3g} ({ex[0]['metric']}){why}{_excused(cmp.compared, tol)}",
        ex,
    )


def _matched_beyond(m: LoggedComparison, tolerance: float) -> bool:
    """A metric the comparison matched although its relative difference exceeds the
    tolerance (two near-zero values, a loss logged rounded)."""
    return m.verdict == "match" and (m.relative or 0.0) > tolerance


def _excused(compared: list[LoggedComparison], tolerance: float) -> str:
    """The metrics matched beyond the tolerance, said after the rule's message."""
    names = [m.metric for m in compared if _matched_beyond(m, tolerance)]
    if not names:
        return ""
    return f"; {', '.join(names)} match as near-zero values or a loss logged rounded"


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
    "sampler-support": (
        rule_sampler_support,
        RuleConfig(warn=0.6, fail=0.9, params={"min_tokens": 100}),
    ),
    "config-causes": (rule_config_causes, RuleConfig(warn=0)),
    "unmasked-padding": (rule_unmasked_padding, RuleConfig(warn=0.2, fail=0.5)),
    "logp-alignment": (rule_logp_alignment, RuleConfig(fail=0)),
    "advantage-mean": (rule_advantage_mean, RuleConfig(warn=1e-6, fail=1e-3)),
    "zero-variance-advantage": (rule_zero_variance_advantage, RuleConfig(fail=0)),
    "logged-metrics": (rule_logged_metrics, RuleConfig(fail=1e-3)),
}


INTEGRITY = ("finite", "logp-range", "lengths-match", "mask-nonempty", "rewards-finite")
