"""``grpo-cli answers``: the answers to blame, ranked by one per-answer statistic.

Each batch gives every answer's statistics (:func:`answer_rows`); :class:`TopAnswers` keeps
the ``k`` highest in bounded memory and merges across batches and workers by (value,
then row in the input), so the ranking is the same however the input was cut.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from . import _partials
from ._core import (
    answer_clip_counts,
    difference,
    kl_from_log_ratio,
    segment_mean,
    segment_sum,
    token_gradients,
    token_terms,
)
from ._partials import agg_factor
from ._report import TOKEN_FIELDS, Pass1, objective_pass1, objective_report
from ._settings import Settings
from .batch import Batch, Part, parts
from .engine.local import Mergeable
from .engine.options import EngineOptions, Ran
from .errors import UsageError
from .io import Source
from .plan import plan, run

M = TypeVar("M", bound=Mergeable)

__all__ = ["SORT_KEYS", "AnswersReport", "TopAnswers", "answer_rows", "answers_report"]

# --sort KEY -> the field ranked (descending; advantage by |A|, reported signed)
SORT_KEYS = {
    "kl": "kl_mean",
    "kl-max": "kl_max",
    "ratio": "log_ratio_max_abs",
    "clip": "clip_share",
    "length": "length",
    "advantage": "advantage",
    "gradient": "gradient_share",
    "rollout": "rollout_kl_mean",
}
# the per-answer statistics (floats; null where the input does not give them)
STATS = (
    "advantage",
    "kl_mean",
    "kl_max",
    "log_ratio_max_abs",
    "clip_share",
    "gradient_share",
    "rollout_kl_mean",
)
# an answer's row in the JSON, in this order
FIELDS = (
    "source",
    "row",
    "group",
    "reward",
    STATS[0],
    "length",
    *STATS[1:],
    "kl_max_token",
    "log_ratio_max_token",
)


@dataclass
class TopAnswers:
    """The ``k`` answers with the largest ``key`` (ties: the earlier input row first).

    Mergeable: ``add`` and ``merge`` keep the ``k`` best of the union, so any cut of the
    input into batches and any assignment of batches to workers gives the same rows.
    """

    key: str
    k: int
    rows: list[dict[str, Any]] = field(default_factory=list)

    def _rank(self, r: dict[str, Any]) -> tuple[float, int]:
        return (-_score(self.key, r[self.key]), int(r["_index"]))

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.rows = heapq.nsmallest(self.k, [*self.rows, *rows], key=self._rank)

    def merge(self, o: TopAnswers) -> TopAnswers:
        self.add(o.rows)
        return self


def _score(key: str, v: float | None) -> float:
    """The ranked value: larger is worse; |A| for the advantage; null or NaN ranks last."""
    if v is None or v != v:
        return -np.inf
    return abs(float(v)) if key == "advantage" else float(v)


@dataclass(frozen=True)
class GradientScale:
    """What turns per-token derivatives into each answer's share of ``‖∂J/∂logp‖²``: the
    aggregations' constants and kinds (:func:`grpo_cli._partials.agg_factor`), β, and the
    whole input's squared norm (a first pass: ``objective --gradient``)."""

    cp: float
    up: int
    ck: float
    uk: int
    beta: float
    norm2: float


def answer_rows(
    b: Batch,
    adv: np.ndarray,
    settings: Settings,
    src: Source,
    *,
    keys: Sequence[str],
    k: int,
    grad: GradientScale | None = None,
) -> list[dict[str, Any]]:
    """The ``k`` answers of a batch ranking highest by each of ``keys`` (or more:
    :class:`TopAnswers` keeps the ``k`` best of its key), with their statistics (the core's
    definitions: :func:`token_terms`, :func:`answer_clip_counts`), computed once for all
    keys. An answer longer than a slice is computed a slice of its tokens at a time
    (:func:`_long_row`)."""
    rows: list[dict[str, Any]] = []
    for part in parts(b, adv):
        assert part.adv is not None
        if part.long:
            rows.append(_long_row(part, settings, src, grad))
        elif part.batch.n:
            rows += _run_rows(part.batch, part.adv, settings, src, keys=keys, k=k, grad=grad)
    return rows


def _long_row(
    part: Part, settings: Settings, src: Source, grad: GradientScale | None
) -> dict[str, Any]:
    """The row of a long answer, a slice of its tokens at a time: sums, maxima and where
    they are carried from slice to slice."""
    b, adv, per_token = part.batch, part.adv, part.per_token
    assert adv is not None
    f, n = b.fields, int(b.offsets[-1])
    seq = means = None
    if settings.ratio_level == "sequence":
        seq = _partials.seq_mean(part)
        if grad is not None:  # the gradient takes answer means: a first pass
            means = _partials.sequence_means(part, settings, seq)
    kl_sum = rollout_sum = g2 = adv_best = 0.0
    kl_at = lr_at = clipped = 0
    kl_max = lr_max = adv_abs = -np.inf
    has_kl = "ref_logp" in f
    rollout = f.get("rollout_logp")
    for lo, _, p, a in part.slices():
        assert a is not None
        pf = p.fields
        terms = token_terms(
            pf["logp"], pf.get("old_logp"), pf.get("ref_logp"), a, p.offsets,
            seq_mean=seq, **settings.term_kwargs(),
        )  # fmt: skip
        if terms.kl is not None:
            kl_sum += float(np.sum(terms.kl))
            t = int(np.argmax(terms.kl))
            if terms.kl[t] > kl_max or lo == 0:  # the first largest, as np.argmax
                kl_max, kl_at = float(terms.kl[t]), lo + t
        absd = np.abs(terms.delta)
        t = int(np.argmax(absd))
        if absd[t] > lr_max or lo == 0:
            lr_max, lr_at = float(absd[t]), lo + t
        low, high = answer_clip_counts(
            terms.ratio, a, p.offsets, clip_eps=settings.clip_eps,
            clip_eps_high=settings.clip_eps_high,
        )  # fmt: skip
        clipped += int(low[0] + high[0])
        if rollout is not None:
            dr = difference(pf.get("old_logp", pf["logp"]), pf["rollout_logp"])
            rollout_sum += float(np.sum(kl_from_log_ratio(dr, estimator="k3")))
        if grad is not None:
            gp, gk = token_gradients(
                terms, offsets=p.offsets, answer_means=means, **settings.term_kwargs()
            )
            with np.errstate(over="ignore", invalid="ignore"):
                g = grad.cp * (gp / n if grad.up else gp)
                if gk is not None and grad.beta:
                    g = g - grad.beta * grad.ck * (gk / n if grad.uk else gk)
                g2 += float(np.dot(g, g))
        if per_token:
            t = int(np.argmax(np.abs(a)))
            if abs(a[t]) > adv_abs or lo == 0:
                adv_abs, adv_best = abs(float(a[t])), float(a[t])
    return {
        **_identity(b, 0, src),
        "kl_max_token": kl_at if has_kl else None,
        "log_ratio_max_token": lr_at,
        "advantage": adv_best if per_token else float(adv[0]),
        "kl_mean": kl_sum / n if has_kl else None,
        "kl_max": kl_max if has_kl else None,
        "log_ratio_max_abs": lr_max,
        "clip_share": clipped / n,
        "gradient_share": None if grad is None else g2 / grad.norm2,
        "rollout_kl_mean": None if rollout is None else rollout_sum / n,
    }


def _run_rows(
    b: Batch,
    adv: np.ndarray,
    settings: Settings,
    src: Source,
    *,
    keys: Sequence[str],
    k: int,
    grad: GradientScale | None = None,
) -> list[dict[str, Any]]:
    """The ``k`` answers of a run of whole answers ranking highest by each of ``keys``."""
    f = b.fields
    terms = token_terms(
        f["logp"], f.get("old_logp"), f.get("ref_logp"), adv, b.offsets, **settings.term_kwargs()
    )
    starts = b.offsets[:-1]
    lengths = b.lengths
    stats: dict[str, np.ndarray | None] = {"kl_mean": None, "kl_max": None}
    if terms.kl is not None:
        stats["kl_mean"] = segment_mean(terms.kl, b.offsets)
        stats["kl_max"] = np.maximum.reduceat(terms.kl, starts)
    stats["log_ratio_max_abs"] = np.maximum.reduceat(np.abs(terms.delta), starts)
    low, high = answer_clip_counts(
        terms.ratio,
        adv,
        b.offsets,
        clip_eps=settings.clip_eps,
        clip_eps_high=settings.clip_eps_high,
    )
    stats["clip_share"] = (low + high) / lengths
    stats["length"] = lengths.astype(np.float64)
    stats["rollout_kl_mean"] = None
    rollout = f.get("rollout_logp")
    if rollout is not None:  # sampler vs trainer, δ = old_logp − rollout_logp: mean k3(δ)
        dr = difference(f.get("old_logp", f["logp"]), rollout)
        k3 = kl_from_log_ratio(dr, estimator="k3")  # e^δ − δ − 1
        stats["rollout_kl_mean"] = segment_mean(k3, b.offsets)
    stats["gradient_share"] = None
    if grad is not None:
        gp, gk = token_gradients(terms, offsets=b.offsets, **settings.term_kwargs())
        inv = np.repeat(1.0 / lengths, lengths)
        with np.errstate(over="ignore", invalid="ignore"):
            g = grad.cp * (gp * inv if grad.up else gp)
            if gk is not None and grad.beta:
                g = g - grad.beta * grad.ck * (gk * inv if grad.uk else gk)
            stats["gradient_share"] = segment_sum(g * g, b.offsets) / grad.norm2
    if adv.shape == (b.n,):
        stats["advantage"] = adv
    else:  # per-token advantages (KL in the reward): the answer's largest in magnitude
        idx = starts + np.array(
            [np.argmax(np.abs(adv[s:e])) for s, e in zip(starts, b.offsets[1:], strict=True)],
            dtype=np.int64,
        )
        stats["advantage"] = adv[idx] if b.n else adv[:0]
    chosen: set[int] = set()
    for key in keys:
        ranked = stats[key]
        if ranked is None:
            chosen.update(range(min(k, b.n)))
            continue
        score = np.abs(ranked) if key == "advantage" else ranked
        score = np.where(np.isnan(score), -np.inf, score)
        # descending by score, ties by row: lexsort's last key is the primary one
        chosen.update(np.lexsort((np.arange(b.n), -score))[:k].tolist())
    out = []
    for i in sorted(chosen):
        rec = _identity(b, i, src)
        s0, s1 = int(b.offsets[i]), int(b.offsets[i + 1])  # the worst token, in the answer
        rec["kl_max_token"] = None if terms.kl is None else int(np.argmax(terms.kl[s0:s1]))
        rec["log_ratio_max_token"] = int(np.argmax(np.abs(terms.delta[s0:s1])))
        for name in STATS:
            col = stats[name]
            rec[name] = None if col is None else float(col[i])
        out.append(rec)
    return out


def _gradient_scale(
    src: Source, settings: Settings, engine: EngineOptions, notes: list[str]
) -> GradientScale | None:
    """Pass 0: the whole input's ``‖∂J/∂logp‖`` and the aggregation constants."""
    r = objective_report(src, settings, engine=engine, gradient=True)
    g = r.gradient
    norm2 = None if g is None else g["norm"] ** 2
    if norm2 is None or not (np.isfinite(norm2) and norm2 > 0):
        notes.append("gradient_share: the gradient's norm is 0 or not finite; null")
        return None
    cp, up = agg_factor(settings, settings.agg, r.answers, r.tokens, r.max_len)
    kl_on = settings.beta != 0.0 and settings.kl_mode == "loss"
    ck, uk = agg_factor(settings, settings.kl_aggregation, r.answers, r.tokens, r.max_len)
    return GradientScale(cp, up, ck, uk, settings.beta if kl_on else 0.0, norm2)


def _identity(b: Batch, i: int, src: Source) -> dict[str, Any]:
    """Where answer ``i`` of the batch is and what it is: file, row within the file, group,
    reward, length and its row in the whole input (``_index``, the ranking's tie-break)."""
    groups, rewards = b.answer.get("group"), b.answer.get("reward")
    k_file, first = src.file_of(b.start)
    row = b.start + i
    return {
        "source": src.paths[k_file].name,
        "row": row - first,
        "group": None if groups is None else _plain(groups[i].as_py()),
        "reward": None if rewards is None else float(rewards[i].as_py()),
        "length": int(b.offsets[i + 1] - b.offsets[i]),
        "_index": row,
    }


def _plain(v: Any) -> Any:
    """A group id as JSON holds it: a string or an integer as it is, anything else (a
    duckdb DECIMAL, a date) as its text."""
    return v if isinstance(v, str | int) else str(v)


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


def answers_report(
    src: Source,
    settings: Settings,
    *,
    sort: str = "kl",
    top: int = 20,
    engine: EngineOptions | None = None,
    progress: Callable[[int], None] | None = None,
) -> AnswersReport:
    """The ``top`` answers by ``sort`` (a key of :data:`SORT_KEYS`), descending."""
    engine = (engine or EngineOptions()).resolved()
    if sort not in SORT_KEYS:
        raise UsageError(f"--sort: expected one of {', '.join(SORT_KEYS)}, got {sort!r}")
    if top < 1:
        raise UsageError(f"--top: expected a positive number of answers, got {top}")
    key = SORT_KEYS[sort]
    notes: list[str] = []
    grad = _gradient_scale(src, settings, engine, notes)
    p1: Pass1 = objective_pass1(src, settings, engine=engine)

    def fold(acc: TopAnswers, b: Batch) -> None:
        adv = p1.advantages(b, src.label)
        acc.add(answer_rows(b, adv, settings, src, keys=[key], k=top, grad=grad))

    best, ran = fold_answers(src, lambda: TopAnswers(key, top), fold, engine, progress)
    notes = list(p1.warnings) + notes
    if key in ("kl_mean", "kl_max") and not src.has("ref_logp"):
        notes.append("no ref_logp: kl_mean and kl_max are null, the ranking is by row")
    elif not src.has("ref_logp"):
        notes.append("no ref_logp: kl_mean and kl_max are null")
    for name in ("reward", "group"):
        if not src.has(name):
            notes.append(f"no {name} column: each answer's {name} is null")
    if not src.has("rollout_logp"):
        notes.append("no rollout_logp: rollout_kl_mean is null")
    if not src.has("ref_logp"):
        notes.append("no ref_logp: kl_max_token is null")
    rows = []
    for r in best.rows:
        out = {}
        for name in FIELDS:
            v = r[name]
            if isinstance(v, float) and not np.isfinite(v):
                notes.append(f"row {r['row']} of {r['source']}: {name} is {v} (null in JSON)")
                v = None
            out[name] = v
        rows.append(out)
    return AnswersReport(src.label, settings, engine, sort, top, rows, notes, p1.ran.then(ran))


def fold_answers(
    src: Source,
    new: Callable[[], M],
    fold: Callable[[M, Batch], None],
    engine: EngineOptions,
    progress: Callable[[int], None] | None,
) -> tuple[M, Ran]:
    """Fold the token batches of ``src`` on ``engine``'s plan."""
    return run(plan(src, TOKEN_FIELDS, engine), new, fold, progress=progress)


@dataclass
class TopByKey:
    """:class:`TopAnswers` for several keys at once (one pass over the tokens)."""

    tops: dict[str, TopAnswers]

    def merge(self, o: TopByKey) -> TopByKey:
        for key, t in self.tops.items():
            t.merge(o.tops[key])
        return self


def worst_answers(
    src: Source,
    settings: Settings,
    keys: list[str],
    *,
    top: int,
    engine: EngineOptions,
    p1: Pass1 | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """For each field of ``keys`` (values of :data:`SORT_KEYS`, not the gradient's), its
    ``top`` answers, worst first; each row keeps ``_index``, its row in the whole input.
    ``check`` names them as the places to look when a health rule fails (passing the pass 1
    it already has)."""
    if p1 is None:
        p1 = objective_pass1(src, settings, engine=engine)

    def fold(acc: TopByKey, b: Batch) -> None:
        assert p1 is not None
        adv = p1.advantages(b, src.label)
        rows = answer_rows(b, adv, settings, src, keys=list(acc.tops), k=top)
        for t in acc.tops.values():
            t.add(rows)

    best, _ = fold_answers(
        src, lambda: TopByKey({k: TopAnswers(k, top) for k in keys}), fold, engine, None
    )
    return {k: t.rows for k, t in best.tops.items()}
