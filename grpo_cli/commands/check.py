"""``grpo-cli check``: rules over a rollout log, one verdict each, for a CI gate: the scan,
the objective, the rules, the places to look."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from .. import batch as _batch
from ..batch import RawBatch
from ..check.base import MAX_EXAMPLES, CheckConfig, _skip
from ..check.baseline import _baseline
from ..check.rules import INTEGRITY, RULES
from ..check.scan import CheckPartial, Facts, Scan, _scan_batch, _token_fields
from ..core import advantages_by_group
from ..engine.options import EngineOptions, Ran
from ..engine.plan import plan
from ..engine.run import columns_reader, ran_by, run
from ..errors import InputError
from ..finalize.objective import objective_record
from ..fold.pass1 import Pass1, objective_pass1
from ..fold.tokens import TokenPartial
from ..io import Source, load_answers
from ..logged import LoggedInput
from ..records import CheckReport, ObjectiveReport, Result
from ..settings import Settings
from .objective import logs_per_call, recorded_calls


# -------------------------------------------------------------------------------- run
def run_check(
    src: Source,
    settings: Settings,
    cfg: CheckConfig,
    baseline: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    engine: EngineOptions | None = None,
    logged: LoggedInput | None = None,
    per_call: bool = True,
) -> CheckReport:
    """Evaluate every rule of ``cfg`` on ``src``; optionally compare with a baseline report.

    One pass over the raw token batches folds the integrity scan and the objective
    together (:class:`CheckPartial`), over the same streams and batches as ``objective``,
    so the two commands report the same numbers to the last digit. ``per_call`` False:
    a recorded step of a trainer that logs per loss call keeps the whole step's trainer
    metrics, its calls not folded again (``check RUN`` at a step with no logged record:
    only ``logged-metrics`` reads them, and it is skipped there).
    """
    engine = (engine or EngineOptions()).resolved()
    _needs(src)
    read = columns_reader(engine)
    answers = load_answers(src, need_rewards=False, allow_nonfinite=True, read=read)
    finite_answers = all(
        x is None or bool(np.isfinite(x).all()) for x in (answers.reward, answers.advantage)
    )
    why = "" if finite_answers else "not evaluated: integrity failed (rewards-finite)"
    s = settings if src.has("ref_logp") else replace(settings, beta=0.0)
    p1 = None if why else objective_pass1(src, s, answers=answers, engine=engine)
    total, ran = _fold(src, s, cfg, p1, engine, progress)
    ran = (p1.ran if p1 is not None else ran_by(read)).then(ran)
    report = None
    if p1 is not None and total.objective is not None and not total.invalid:
        report, ran = _objective(src, s, cfg, p1, total, engine, ran, per_call)
    facts = Facts(
        src=src, answers=answers, scan=total.scan, report=report, why_no_report=why,
        advantages=answers.advantage, config=cfg, logged=logged,
    )  # fmt: skip
    results = _results(facts, settings, s, cfg, p1, engine)
    if baseline is not None:
        results.append(_baseline(results, baseline, cfg.baseline_tolerance))
    return CheckReport(
        source=src.label, results=results, settings=settings, engine=engine,
        objective=facts.report, why_no_objective=facts.why_no_report, ran=ran,
    )  # fmt: skip


def _needs(src: Source) -> None:
    """A gate that evaluates nothing must not pass: the fields check needs, or one line."""
    missing = [] if src.has("logp") else [src.name("logp")]
    if not (src.has("advantage") or src.has("reward")):
        reward, group, adv = src.name("reward"), src.name("group"), src.name("advantage")
        missing.append(f"{reward} (with {group}) or {adv}")
    if missing:
        raise InputError(
            f"{src.label}: check needs {' and '.join(missing)}; the input has: "
            f"{', '.join(src.present) or 'no known field'} (map other names with "
            "--column FIELD=NAME)"
        )


def _fold(
    src: Source,
    s: Settings,
    cfg: CheckConfig,
    p1: Pass1 | None,
    engine: EngineOptions,
    progress: Callable[[int], None] | None,
) -> tuple[CheckPartial, Ran]:
    """The one pass over the raw batches: the integrity scan of every batch, and the
    objective of each batch the scan found clean (none once one was not)."""
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

    fields = _token_fields(src)
    return run(plan(src, fields, engine), new, fold, validated=False, progress=progress)


def _objective(
    src: Source,
    s: Settings,
    cfg: CheckConfig,
    p1: Pass1,
    total: CheckPartial,
    engine: EngineOptions,
    ran: Ran,
    per_call: bool = True,
) -> tuple[ObjectiveReport, Ran]:
    """The objective's record of the folded pass (a recorded step of a trainer that logs
    per loss call, with ``per_call``: its calls folded too, so their metrics are what is
    compared)."""
    assert total.objective is not None
    band = cfg.rules["ratio-extreme"].params.get("band", 10.0)
    calls = None
    if per_call and logs_per_call(src, s):
        calls, _, more = recorded_calls(
            src, s, p1, lambda: TokenPartial(s, backend=engine.backend), engine=engine
        )
        ran = ran.then(more)
    report = objective_record(
        src, s, total.objective, p1, engine=engine, ran=ran, ratio_band=band, calls=calls,
        empty=total.scan.masked_whole,
    )  # fmt: skip
    return report, ran


def _results(
    facts: Facts,
    settings: Settings,
    s: Settings,
    cfg: CheckConfig,
    p1: Pass1 | None,
    engine: EngineOptions,
) -> list[Result]:
    """Every rule's verdict: the integrity rules first (a failed one leaves the health
    rules no report), then every rule in the table's order, with their places to look."""
    integrity = {rid: RULES[rid][0](facts, cfg.rules[rid]) for rid in INTEGRITY}
    broken = [rid for rid, r in integrity.items() if r.status == "fail"]
    if broken:
        facts.report = None
        facts.why_no_report = f"not evaluated: integrity failed ({', '.join(broken)})"
    answers = facts.answers
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
            answers.reward, answers.codes, n_groups=len(answers.labels),
            **settings.advantage_kwargs(),
        )  # fmt: skip
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
    return [_required(r) if r.rule in cfg.require else r for r in results]


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
    from .answers import worst_answers

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
