"""``grpo-cli explain``: the objective's record read as findings, most severe first.

A view: every finding is computed from an :class:`ObjectiveReport` (with its gradient),
using ``check``'s default thresholds where a rule exists (:data:`grpo_cli.check.rules.RULES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..causes import config_causes
from ..check.rules import RULES, support_words
from ..core import dot
from ..records import EXTREME, Finding, ObjectiveReport, PositionBucket

__all__ = ["SEVERITIES", "explain_findings"]

SEVERITIES = ("alarm", "warn", "info")


def _level(rule: str, value: float) -> str | None:
    """``check``'s verdict on ``value`` for ``rule`` as a severity (None: passes)."""
    c = RULES[rule][1]
    if c.fail is not None and value > c.fail:
        return "alarm"
    if c.warn is not None and value > c.warn:
        return "warn"
    return None


def _thresholds(rule: str) -> dict[str, float | None]:
    c = RULES[rule][1]
    return {"warn": c.warn, "alarm": c.fail}


def explain_findings(r: ObjectiveReport) -> list[Finding]:
    """Findings about one objective report, alarms first, then warnings, then notes
    (truncation is judged against ``--max-len`` when the settings have one)."""
    out: list[Finding] = []
    for finder in FINDERS:
        out += finder(r)
    s = r.settings
    if s.loss != "clip" or s.correction != "none" or s.mirrors is not None:
        out.append(_loss_finding(r))  # (the seed's clipped surrogate goes without saying)
    out.sort(key=lambda f: SEVERITIES.index(f.severity))
    return out


def _negative_loss(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    if r.loss < 0:
        out.append(Finding(
            "negative-loss", "info",
            f"loss = −J = {r.loss:.4g} < 0: the policy term ({r.policy_term:.4g}) exceeds the KL "
            "term. J is a surrogate whose value is not a goodness score; a negative loss is "
            "expected whenever the batch's ratio-weighted advantages are positive. Nothing to do.",
            {"loss": r.loss, "policy_term": r.policy_term, "kl_term": r.kl_term},
        ))  # fmt: skip
    return out


def _near_zero_loss(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    g = r.gradient
    gnorm = None if g is None else g["norm"]
    if abs(r.objective) < 1e-3 or (gnorm is not None and abs(r.objective) < 0.1 * gnorm):
        teaches = (
            f"‖∂J/∂logp‖ = {gnorm:.3g}, so the batch still teaches"
            if gnorm
            else "the gradient is not computed here (sequence-level ratio)"
            if gnorm is None
            else "and ‖∂J/∂logp‖ = 0: no token moves the policy"
        )
        why = (
            "on-policy the ratio is 1 and the advantages of a group sum to 0, so J cancels"
            if r.on_policy or r.clip.outside_range == 0
            else f"the advantages of a group sum to 0 and the ratio stays near 1 (p01 "
            f"{r.ratio.quantiles.get('p01', math.nan):.3g}, p99 "
            f"{r.ratio.quantiles.get('p99', math.nan):.3g}; {100 * r.clip.region:.2g}% of "
            "tokens clipped), so J nearly cancels"
        )
        out.append(Finding(
            "near-zero-loss", "warn" if gnorm == 0 else "info",
            f"J = {r.objective:.3g} is near 0: {why}; its gradient does not — {teaches}.",
            {"objective": r.objective, "gradient_norm": gnorm, "on_policy": r.on_policy},
        ))  # fmt: skip
    return out


def _groups(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    gs = r.group_summary
    if gs is not None and gs.groups > 1 and gs.singleton_groups == gs.groups:
        out.append(Finding(
            "singleton-groups", "alarm",
            f"Every one of the {gs.groups} groups has one answer: the group ids look like "
            "answer ids, so every advantage is 0 and nothing is learned. Give the prompt's id "
            "as the group (--column group=NAME).",
            {"groups": gs.groups, "singleton_groups": gs.singleton_groups},
        ))  # fmt: skip
    elif gs is not None and gs.zero_variance_groups:
        frac = gs.frac_zero_variance_groups
        out.append(Finding(
            "zero-variance-groups", _level("zero-std-groups", frac) or "info",
            f"{gs.zero_variance_groups} of {gs.groups} groups ({100 * frac:.1f}%) have equal "
            "rewards: their advantages are 0 and they teach nothing. Many of them means the "
            "prompts are too easy or too hard for the policy: filter them (DAPO's dynamic "
            "sampling) or resample.",
            {"zero_variance_groups": gs.zero_variance_groups, "groups": gs.groups,
             "frac_zero_variance_groups": frac, "thresholds": _thresholds("zero-std-groups")},
        ))  # fmt: skip
    return out


def _clipping(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    region = r.clip.region
    if (lvl := _level("clip-region", region)) is not None:
        out.append(Finding(
            "clipping", lvl,
            f"{100 * region:.2f}% of tokens are clipped (low {100 * r.clip.low:.2f}%, high "
            f"{100 * r.clip.high:.2f}%): they get no gradient. The policy moved far from the "
            "sampler: lower the learning rate, take fewer steps per batch, or sample fresher.",
            {"clip_region": region, "low": r.clip.low, "high": r.clip.high,
             "thresholds": _thresholds("clip-region")},
        ))  # fmt: skip
    return out


def _kl_drift(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    if r.kl is not None and r.kl.mean is not None:
        lvl_mean = _level("kl-mean", r.kl.mean)
        lvl_max = None if r.kl.max is None else _level("kl-max", r.kl.max)
        lvl = min((x for x in (lvl_mean, lvl_max) if x), key=SEVERITIES.index, default=None)
        if lvl is not None:
            out.append(Finding(
                "kl-drift", lvl,
                f"KL to the reference: mean {r.kl.mean:.4g}, max {r.kl.max:.4g} per token. The "
                "policy is drifting from the reference: raise β, or look at the answers with "
                "the largest KL (grpo-cli answers --sort kl) for reward hacking.",
                {"kl_mean": r.kl.mean, "kl_max": r.kl.max,
                 "thresholds": {"kl-mean": _thresholds("kl-mean"),
                                "kl-max": _thresholds("kl-max")}},
            ))  # fmt: skip
    return out


def _ratio_outliers(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    share = r.ratio_outside_band
    lvl = "alarm" if r.overflow_tokens else _level("ratio-extreme", share)
    if lvl is not None:
        out.append(Finding(
            "ratio-outliers", lvl,
            f"{100 * share:.4f}% of tokens have a ratio outside [1/{r.ratio_band:g}, "
            f"{r.ratio_band:g}] ({r.extreme_tokens} with {EXTREME}, {r.overflow_tokens} "
            "overflowing): stale or mismatched log-probs. grpo-cli answers --sort ratio "
            "names them.",
            {"outside_band_share": share, "band": r.ratio_band,
             "extreme_tokens": r.extreme_tokens, "overflow_tokens": r.overflow_tokens,
             "ratio_max": r.ratio.max, "thresholds": _thresholds("ratio-extreme")},
        ))  # fmt: skip
    return out


def _sampler_mismatch(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    ro = r.rollout
    if ro is not None and (lvl := _level("rollout-mismatch", ro.kl_k3)) is not None:
        out.append(Finding(
            "sampler-mismatch", lvl,
            f"the sampler's log-probs differ from the trainer's: mismatch KL (k3) "
            f"{ro.kl_k3:.4g}, token ESS {ro.ess_token:.3g}. Check the inference engine's "
            "precision and weights sync; correct with truncated importance sampling.",
            {"kl_k3": ro.kl_k3, "ess_token": ro.ess_token, "ess_sequence": ro.ess_sequence,
             "thresholds": _thresholds("rollout-mismatch"), "by_trainer": ro.by_trainer},
        ))  # fmt: skip
    return out


def _sampler_support(r: ObjectiveReport) -> list[Finding]:
    """A truncated or tempered sampler (check's ``sampler-support``), with ρ raw and, where
    the kept mass can be estimated, corrected; and what to change."""
    ro = r.rollout
    sp = None if ro is None else ro.support
    if sp is None or sp.below + sp.above < RULES["sampler-support"][1].params["min_tokens"]:
        return []
    kind, size = sp.signature
    if (lvl := _level("sampler-support", size)) is None:
        return []
    fix = (
        "compute ρ against the trainer's log-prob renormalised over the same kept set (a "
        "keep-sampling mask), take the sampler's raw log-probs (vLLM logprobs_mode "
        "raw_logprobs) and divide the kept mass out, or sample untruncated"
        if kind == "truncated"
        else "score the trainer's log-probs at the sampler's temperature (logits / T, as "
        "TRL and verl do with their temperature setting) or sample at temperature 1"
    )
    return [Finding(
        "sampler-support", lvl, f"{support_words(sp, r.run_config, True)}. To fix: {fix}.",
        {**sp.to_json(), "signature": kind, "size": size,
         "thresholds": _thresholds("sampler-support")},
    )]  # fmt: skip


def _span(b: PositionBucket) -> str:
    return f"{b.lo}–{b.hi - 1}" if b.hi is not None else f"{b.lo}+"


def _collapse_at(buckets: list[PositionBucket]) -> tuple[int, float, float] | None:
    """Where the entropy falls along the answer and stays down: the first bucket from
    which every later one is below ``COLLAPSE`` × the token-weighted mean before it (itself
    ≥ 0.1 nats), or the bucket before that one when its own mean is already below 0.9 ×
    the mean before it (the fall starts inside it); with the means before the named bucket
    and from the first collapsed one on."""
    e = [b for b in buckets if b.entropy is not None]
    w = np.array([b.tokens for b in e], dtype=np.float64)
    v = np.array([b.entropy or 0.0 for b in e])

    def mean(a: int, z: int) -> float:
        return dot(w[a:z], v[a:z]) / float(w[a:z].sum())

    for j in range(1, len(e)):
        pre = mean(0, j)
        if pre < 0.1 or not bool(np.all(v[j:] < COLLAPSE * pre)):
            continue
        k = j - 1 if j >= 2 and v[j - 1] < 0.9 * mean(0, j - 1) else j
        return buckets.index(e[k]), mean(0, k), mean(j, len(e))
    return None


COLLAPSE = 0.25  # the entropy after a collapse, at most this share of the entropy before


def _positions(r: ObjectiveReport) -> list[Finding]:
    """Where along the answers the entropy collapses (position buckets of
    :mod:`grpo_cli.fold.where`), and where the KL or the sampler mismatch sits when its
    rule warns."""
    b = r.positions
    out: list[Finding] = []
    if not b or len(b) < 2:
        return out
    got = _collapse_at(b)
    if got is not None:
        i, pre, post = got
        out.append(Finding(
            "entropy-collapse-position", "warn",
            f"the entropy collapses along the answers at positions {_span(b[i])}: mean "
            f"{pre:.3g} nats before, {post:.3g} after (every later position below "
            f"{COLLAPSE:g}× the entropy before). The policy turns deterministic partway "
            "through its answers: look at what they say there (grpo-cli answers), a "
            "repeated or degenerate tail (e.g. '!!!!').",
            {"positions": [b[i].lo, b[i].hi], "entropy_before": pre, "entropy_after": post,
             "buckets": [x.to_json() for x in b]},
        ))  # fmt: skip
    for key, rule, words in (("kl", "kl-mean", "KL to the reference"),
                             ("mismatch", "rollout-mismatch", "sampler–trainer |δ|")):  # fmt: skip
        total = sum(getattr(x, key + "_sum") for x in b)
        n = sum(x.tokens for x in b if getattr(x, key) is not None)
        value = (r.kl.mean if key == "kl" and r.kl else
                 r.rollout.kl_k3 if key == "mismatch" and r.rollout else None)  # fmt: skip
        if not total or not n or value is None or _level(rule, value) is None:
            continue
        top = max(b, key=lambda x: getattr(x, key + "_sum"))
        share, tokens = getattr(top, key + "_sum") / total, top.tokens / n
        out.append(Finding(
            f"{key}-position", "info",
            f"the {words} by position: positions {_span(top)} hold {100 * share:.3g}% of it "
            f"with {100 * tokens:.3g}% of the tokens (mean {getattr(top, key):.4g} there, "
            f"{total / n:.4g} over all)",
            {"positions": [top.lo, top.hi], "share": share, "token_share": tokens,
             "buckets": [x.to_json() for x in b]},
        ))  # fmt: skip
    return out


def _rule_warns(r: ObjectiveReport, key: str) -> bool:
    """Whether the rule of ``key`` (``kl``: kl-mean; ``mismatch``: rollout-mismatch) warns."""
    if key == "kl":
        return (
            r.kl is not None and r.kl.mean is not None and _level("kl-mean", r.kl.mean) is not None
        )
    v = r.rollout.kl_k3 if r.rollout is not None else None
    return v is not None and _level("rollout-mismatch", v) is not None


ID_SHARE, ID_OVER = 0.1, 3.0  # an id named: ≥ 10% of the sum, ≥ 3× its share of tokens


def _token_ids(r: ObjectiveReport) -> list[Finding]:
    """Which sampled token ids carry the KL or the sampler mismatch when its rule warns
    (:class:`grpo_cli.fold.where.TokenIdSums`, from a ``token_id`` column): named when the
    top id holds at least :data:`ID_SHARE` of it and :data:`ID_OVER` × its share of the
    tokens."""
    t = r.token_ids
    out: list[Finding] = []
    for key, words in (("kl", "KL to the reference"), ("mismatch", "sampler–trainer |δ|")):
        total, top = (t.totals.get(key), t.top.get(key)) if t is not None else (None, None)
        if t is None or not total or not top or not _rule_warns(r, key):
            continue
        rows = top[:5]
        share = [getattr(x, key + "_sum") / total for x in rows]
        if share[0] < ID_SHARE or share[0] < ID_OVER * rows[0].tokens / t.tokens:
            continue  # spread over the ids as the tokens are: no id to name
        said = ", ".join(
            f"id {x.token_id} {100 * s:.3g}% ({x.tokens} token(s))"
            for x, s in zip(rows, share, strict=True)
        )
        out.append(Finding(
            f"{key}-token", "info",
            f"the {words} by token id: {said}, of {t.tokens:,} tokens with {t.ids:,} distinct "
            "ids. A few ids holding most of it: look at those tokens (decode the ids with the "
            "run's tokenizer; grpo-cli answers shows the texts).",
            {"top": [x.to_json() for x in top], "shares": share, "total": total,
             "tokens": t.tokens, "ids": t.ids, "outside_id_range": t.outside},
        ))  # fmt: skip
    return out


TURN_OVER = 1.5  # a turn named: its share of the sum ≥ 1.5× its share of the tokens


def _turns(r: ObjectiveReport) -> list[Finding]:
    """Which turn of multi-turn answers (runs of mask = 1) carries the KL or the sampler
    mismatch when its rule warns: the one holding the largest share of it, named when that
    is at least :data:`TURN_OVER` × its share of the tokens."""
    b = r.turns
    out: list[Finding] = []
    if not b or len(b) < 2:
        return out
    n = sum(x.tokens for x in b)
    for key, words in (("kl", "KL to the reference"), ("mismatch", "sampler–trainer |δ|")):
        total = sum(getattr(x, key + "_sum") for x in b)
        if not total or getattr(b[0], key) is None or not _rule_warns(r, key):
            continue
        top = max(b, key=lambda x: getattr(x, key + "_sum"))
        share, tokens = getattr(top, key + "_sum") / total, top.tokens / n
        if share < TURN_OVER * tokens:
            continue
        which = f"turn {top.lo + 1}" + ("" if top.hi is not None else " and later")
        out.append(Finding(
            f"{key}-turn", "info",
            f"the {words} by turn of the multi-turn answers: {which} holds "
            f"{100 * share:.3g}% of it with {100 * tokens:.3g}% of the tokens (mean "
            f"{getattr(top, key):.4g} there, {total / n:.4g} over all; a turn: a run of "
            "mask = 1). Look at what the model says in that turn.",
            {"turn": top.lo + 1, "share": share, "token_share": tokens,
             "turns": [x.to_json() for x in b]},
        ))  # fmt: skip
    return out


def _entropy_collapse(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    e = r.entropy
    if e is not None and e.mean is not None and e.mean < 0.05:
        out.append(Finding(
            "entropy-collapse", "alarm",
            f"mean token entropy {e.mean:.3g} nats (< 0.05): the policy is nearly "
            "deterministic and no longer explores. Raise the clip's upper bound (clip-higher), "
            "the temperature, or add an entropy bonus.",
            {"entropy_mean": e.mean, "threshold": 0.05},
        ))  # fmt: skip
    return out


def _residual_advantages(r: ObjectiveReport) -> list[Finding]:
    out: list[Finding] = []
    if r.residual_advantages is not None:
        n, worst = r.residual_advantages
        out.append(Finding(
            "residual-advantages", "warn",
            f"{n} answers of zero-variance groups carry nonzero logged advantages "
            f"(up to {worst:.3g}): the trainer's float32 group statistics. Sign-based "
            "clip metrics count them; --recompute-advantages gives exact zeros.",
            {"answers": n, "max_abs": worst},
        ))  # fmt: skip
    return out


def _lengths(r: ObjectiveReport) -> list[Finding]:
    return _length_findings(r, r.settings.max_len)


# every finding's test, in the order explain lists findings of one severity
def _logged_causes(r: ObjectiveReport) -> list[Finding]:
    """A logged metric that differs from the recomputed one, and why
    (:mod:`grpo_cli.causes`): the explanation that reproduces it, or its ratio."""
    out: list[Finding] = []
    for m in r.logged.metrics if r.logged is not None else []:
        c = m.cause
        if c is None:
            continue
        said = (
            f"{c.words}; {c.cite}" if c.found
            else f"{c.words}: a wrong preset or config key, another batch, or a formula "
            "grpo-cli does not know"
        )  # fmt: skip
        out.append(Finding(
            "logged-factor" if c.found else "logged-differs", "warn",
            f"logged {m.metric} {m.logged:.7g} ≠ recomputed {m.recomputed:.7g}: {said}",
            {"metric": m.metric, "logged": m.logged, "recomputed": m.recomputed,
             "relative": m.relative, "cause": c.to_json()},
        ))  # fmt: skip
    return out


FINDERS: tuple[Callable[[ObjectiveReport], list[Finding]], ...] = (
    _negative_loss, _near_zero_loss, _groups, _clipping, _kl_drift, _ratio_outliers,
    _sampler_mismatch, _sampler_support, _lengths, _entropy_collapse, _residual_advantages,
    _logged_causes, config_causes, _positions, _token_ids, _turns,
)  # fmt: skip


def _loss_finding(r: ObjectiveReport) -> Finding:
    """Which loss, correction and trainer release the numbers follow (said when a loss,
    a correction or a trainer's release preset is in use)."""
    s = r.settings
    whose = (
        f"as {s.mirrors} computes it (preset {s.preset})"
        if s.mirrors is not None
        else f"as {s.trainer} computes it"
        if s.trainer is not None
        else "under grpo-cli's own conventions (no trainer named)"
    )
    row, crow = s.loss_row, s.correction_row
    corr = ""
    if crow is not None:
        corr = f", with {crow.words} applied from rollout_logp"
        if crow.describe is not None:
            corr += crow.describe(s.correction_params)
    if row.describe is not None:
        corr = row.describe(s.loss_params)
    for mask, _ in s.mask_rows:
        corr += f", with {mask.words}"
    return Finding(
        "loss-followed", "info",
        f"The numbers follow {row.words} ({s.loss}), aggregated {s.agg}, {whose}{corr}.",
        {"loss": s.loss, "correction": s.correction, "preset": s.preset, "mirrors": s.mirrors,
         "trainer": s.trainer},
    )  # fmt: skip


def _length_findings(r: ObjectiveReport, max_len: int | None) -> list[Finding]:
    out: list[Finding] = []
    counts = r.length_counts
    if counts is None or counts.n == 0:
        return out
    q = counts.quantiles(np.array([0.1, 0.9]))
    assert q is not None
    short, long_ = float(q[0]), float(q[1])
    if r.settings.agg == "seq-mean-token-mean" and short > 0:
        ratio = long_ / short
        out.append(Finding(
            "length-bias", "warn" if ratio >= 4 else "info",
            f"under seq-mean-token-mean a token of a short answer weighs more: the 10% "
            f"shortest (≤ {short:g} tokens) weigh {ratio:.3g}× a token of the 10% longest "
            f"(≥ {long_:g}). Long wrong answers are penalised less per token (Dr. GRPO); "
            "token-mean or seq-mean-token-sum-norm removes the bias.",
            {"p10_length": short, "p90_length": long_, "weight_ratio": ratio},
        ))  # fmt: skip
    n = counts.n
    longest = counts.largest()
    assert longest is not None  # counts.n > 0
    if max_len is not None:
        at = counts.count_of(max_len)
        if at / n >= 0.01:
            out.append(Finding(
                "truncation", "warn",
                f"{at} answers ({100 * at / n:.1f}%) are exactly --max-len {max_len} tokens "
                "long: truncated, so their rewards judge unfinished answers. Raise the "
                "generation limit or filter truncated answers (DAPO's overlong filtering).",
                {"at_max_len": at, "answers": n, "max_len": max_len},
            ))  # fmt: skip
    else:
        at = counts.count_of(longest)
        if at >= 3 and at / n >= 0.02 and at < n:  # all one length: nothing piles up
            out.append(Finding(
                "truncation", "warn",
                f"{at} answers ({100 * at / n:.1f}%) share the longest length, {longest} "
                "tokens: a pile-up at the generation limit, so they were probably cut off. "
                "Pass --max-len to check against the limit.",
                {"at_longest": at, "answers": n, "longest": longest},
            ))  # fmt: skip
    return out
