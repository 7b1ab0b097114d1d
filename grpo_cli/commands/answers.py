"""``grpo-cli answers``: the answers to blame, ranked by one per-answer statistic.

Each batch gives every answer's statistics (:func:`answer_rows`); :class:`TopAnswers` keeps
the ``k`` highest in bounded memory and merges across batches and workers by (value,
then row in the input), so the ranking is the same however the input was cut.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..batch import Batch, Part, parts
from ..core import (
    SequenceMeans,
    aggregation_rule,
    answer_clip_counts,
    difference,
    kl_from_log_ratio,
    segment_sum,
    token_gradients,
    token_terms,
)
from ..core import kernel as _fast
from ..engine.options import EngineOptions
from ..engine.plan import plan
from ..engine.run import Pipeline, run
from ..errors import UsageError
from ..finalize.objective import check_folded
from ..fold import tokens as _partials
from ..fold.loss import answer_view, rejects
from ..fold.parts import AnswerCounts, divisor_of
from ..fold.pass1 import Pass1, objective_pass1
from ..io import Source
from ..records import AnswersReport
from ..settings import Settings
from .objective import TOKEN_FIELDS

__all__ = [
    "SORT_KEYS",
    "AnswerStats",
    "AnswersReport",
    "GradientWeights",
    "TopAnswers",
    "answer_rows",
    "answer_stats",
    "answers_report",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

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
class GradientWeights:
    """What turns an answer's derivative sums (``Σ g_p²``, ``Σ g_k²``, ``Σ g_p·g_k`` of
    :func:`token_gradients`) into its part of ``‖∂J/∂logp‖²``, up to the constant ``c_p²``
    that every answer shares (and that cancels in its share of the whole).

    ``∂J/∂logp_t = c_p·(u_p·g_p − β·r·u_k·g_k)`` with ``u = 1/|o_i|`` for an aggregation
    that averages within answers (``up``, ``uk``), else 1, and ``r = c_k/c_p = D_p/D_k``
    the ratio of the two aggregations' divisors (:data:`grpo_cli.core.AGGREGATION_RULES`):
    1 when they are of one kind, else a ratio of the counts N, T, L. So an answer's part is
    ``u_p² Σg_p² − 2βr·u_p·u_k Σg_p·g_k + β²r²·u_k² Σg_k²``: sums over its tokens, which
    add over the slices of a long answer. ``beta`` is 0 when the loss has no KL term."""

    up: bool
    uk: bool
    beta: float
    ratio: float

    def norm2(self, pp: F64, kk: F64 | None, pk: F64 | None, lengths: I64) -> F64:
        """Each answer's part of ``‖g‖² / c_p²`` from its sums (``lengths``: the whole
        answers' valid tokens)."""
        inv = 1.0 / lengths
        a = inv if self.up else 1.0
        with np.errstate(over="ignore", invalid="ignore"):
            out = a * a * pp
            if self.beta and kk is not None and pk is not None:
                b = (inv if self.uk else 1.0) * (self.beta * self.ratio)
                out = out - 2.0 * a * b * pk + b * b * kk
        return np.asarray(out, dtype=np.float64)


def gradient_weights(
    settings: Settings, answers: int, tokens: int | None, longest: int | None
) -> GradientWeights | None:
    """The :class:`GradientWeights` of ``settings`` for an input of ``answers`` answers;
    None when ``r`` needs the tokens (T) or the widest row (L) and they are not given
    (None): a counts pass first (:func:`answers_report`)."""
    o = settings.term_options()
    rp, rk = aggregation_rule(settings.agg), aggregation_rule(settings.kl_aggregation)
    beta = o.beta
    if not beta or rp.divisor == rk.divisor:
        return GradientWeights(rp.answer_mean, rk.answer_mean, beta, 1.0)
    need = {rp.divisor, rk.divisor}
    if ("tokens" in need and tokens is None) or (
        "norm" in need and settings.max_len is None and longest is None
    ):
        return None
    t, w = tokens or 0, longest or 0
    d_p = divisor_of(settings, settings.agg, answers, t, w)
    d_k = divisor_of(settings, settings.kl_aggregation, answers, t, w)
    return GradientWeights(rp.answer_mean, rk.answer_mean, beta, d_p / d_k)


@dataclass
class AnswerStats:
    """Per answer of a run (``(n,)`` arrays), every statistic ``answers`` reports, from
    one pass over its tokens; the statistics of consecutive slices of the same answers
    combine (:meth:`then`), so a long answer is computed a slice at a time.

    ``length`` its valid tokens; ``kl_sum``, ``kl_max`` and where (``kl_at``, counted among
    its valid tokens) of the KL estimate (None without ``ref_logp``); ``lr_max``/``lr_at``
    of ``|Δ|``; ``clipped`` its low- and high-clipped tokens (:func:`answer_clip_counts`);
    ``rollout_sum`` ``Σ k3(old_logp − rollout_logp)`` (None without ``rollout_logp``);
    ``adv`` its advantage (per-token advantages: the largest in magnitude, signed);
    ``g2`` its part of ``‖∂J/∂logp‖²`` (:class:`GradientWeights`; None: not asked)."""

    length: I64
    kl_sum: F64 | None
    kl_max: F64 | None
    kl_at: I64 | None
    lr_max: F64
    lr_at: I64
    clipped: I64
    rollout_sum: F64 | None
    adv: F64
    g2: F64 | None

    def then(self, o: AnswerStats) -> AnswerStats:
        """These tokens followed by ``o``'s, of the same answers: sums add; of each
        extreme the first largest is kept (as ``np.argmax``), its place shifted by these
        tokens."""
        shift = self.length

        def first_max(a: F64, at: I64, b: F64, bt: I64) -> tuple[F64, I64]:
            later = b > a
            return np.where(later, b, a), np.where(later, bt + shift, at)

        kl_max, kl_at = self.kl_max, self.kl_at
        if kl_max is not None and kl_at is not None:
            assert o.kl_max is not None and o.kl_at is not None
            kl_max, kl_at = first_max(kl_max, kl_at, o.kl_max, o.kl_at)
        lr_max, lr_at = first_max(self.lr_max, self.lr_at, o.lr_max, o.lr_at)
        return AnswerStats(
            length=self.length + o.length,
            kl_sum=_plus(self.kl_sum, o.kl_sum),
            kl_max=kl_max,
            kl_at=kl_at,
            lr_max=lr_max,
            lr_at=lr_at,
            clipped=self.clipped + o.clipped,
            rollout_sum=_plus(self.rollout_sum, o.rollout_sum),
            adv=np.where(np.abs(o.adv) > np.abs(self.adv), o.adv, self.adv),
            g2=_plus(self.g2, o.g2),
        )

    def columns(self) -> dict[str, np.ndarray | None]:
        """The ranked statistics (:data:`STATS` and ``length``) by name, ``(n,)`` each."""
        n = self.length
        with np.errstate(over="ignore", invalid="ignore"):
            return {
                "advantage": self.adv,
                "kl_mean": None if self.kl_sum is None else self.kl_sum / n,
                "kl_max": self.kl_max,
                "log_ratio_max_abs": self.lr_max,
                "clip_share": self.clipped / n,
                "gradient_share": self.g2,
                "rollout_kl_mean": None if self.rollout_sum is None else self.rollout_sum / n,
                "length": n.astype(np.float64),
            }


def _plus(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a + b


def _first_max(values: F64, offsets: I64) -> tuple[F64, I64]:
    """Each answer's largest value and the first of its tokens holding it (``np.argmax``
    of each answer's run, all answers at once)."""
    starts = offsets[:-1]
    top = np.maximum.reduceat(values, starts)
    at_max = values == np.repeat(top, np.diff(offsets))
    idx = np.where(at_max, np.arange(values.shape[0]), values.shape[0])
    first = np.minimum.reduceat(idx, starts)
    return top, np.where(first < values.shape[0], first - starts, 0)


def answer_stats(
    b: Batch,
    adv: F64,
    settings: Settings,
    *,
    grad: GradientWeights | None = None,
    compiled: bool = False,
    lengths: I64 | None = None,
    seq_mean: F64 | None = None,
    means: SequenceMeans | None = None,
) -> AnswerStats:
    """:class:`AnswerStats` of the answers of ``b`` (whole answers, or a slice of one:
    ``lengths`` its whole length, ``seq_mean`` and ``means`` the answer's means the
    sequence-level ratio and gradient take). ``compiled``: from one pass of the kernel
    (:func:`grpo_cli.core.kernel.fold`) when the settings and a per-answer advantage allow it,
    else numpy, composed of the core's definitions (:func:`token_terms`,
    :func:`answer_clip_counts`, :func:`token_gradients`)."""
    o = settings.term_options()
    f = b.fields
    whole = b.lengths if lengths is None else lengths
    per_token = adv.shape != (b.n,)
    args = (f["logp"], f.get("old_logp"), f.get("ref_logp"), adv, b.offsets)
    g2 = None
    loss = settings.numpy_only  # a loss, correction or mask of the trainer's own
    if compiled and not per_token and _fast.supports_options(o) and not loss:
        out = _fast.fold(*args, options=o, gradient=grad is not None, extremes=True)
        ext = out.extremes
        assert ext is not None
        if grad is not None:
            g = out.gradient
            assert g is not None
            g2 = grad.norm2(g.pp, g.kk, g.pk, whole)
        kl_sum, kl_max, kl_at, lr_max, lr_at = (
            out.kl,
            ext.kl_max,
            ext.kl_at,
            *(ext.log_ratio_max, ext.log_ratio_at),
        )
        clipped = out.low + out.high
    else:
        terms = token_terms(*args, options=o, seq_mean=seq_mean)
        kl_sum = kl_max = kl_at = None
        if terms.kl is not None:
            kl_sum = segment_sum(terms.kl, b.offsets)
            kl_max, kl_at = _first_max(terms.kl, b.offsets)
        lr_max, lr_at = _first_max(np.abs(terms.delta), b.offsets)
        low, high = answer_clip_counts(
            terms.ratio, adv, b.offsets, clip_eps=o.clip_eps, clip_eps_high=o.clip_eps_high
        )
        clipped = low + high
        gp = gk = None
        if grad is not None:
            gp, gk = token_gradients(terms, offsets=b.offsets, options=o, answer_means=means)
        if loss:  # the loss's own clipped tokens and policy gradient (whole answers)
            view = answer_view(settings, f, adv, b.offsets, (clipped, gp))
            clipped, gp = view.clipped, view.grad
            if gk is not None and view.kl_weight is not None:
                gk = gk * view.kl_weight
        if grad is not None and gp is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                pp = segment_sum(gp * gp, b.offsets)
                kk = pk = None
                if gk is not None and grad.beta:
                    kk, pk = segment_sum(gk * gk, b.offsets), segment_sum(gp * gk, b.offsets)
            g2 = grad.norm2(pp, kk, pk, whole)
    rollout_sum = None
    rollout = f.get("rollout_logp")
    if rollout is not None:  # sampler vs trainer, δ = old_logp − rollout_logp: Σ k3(δ)
        dr = difference(f.get("old_logp", f["logp"]), rollout)
        rollout_sum = segment_sum(kl_from_log_ratio(dr, estimator="k3"), b.offsets)  # e^δ − δ − 1
    if per_token:  # (KL in the reward) the answer's largest in magnitude, signed
        _, at = _first_max(np.abs(adv), b.offsets)
        adv = adv[b.offsets[:-1] + at]
    return AnswerStats(
        b.lengths, kl_sum, kl_max, kl_at, lr_max, lr_at, clipped, rollout_sum, adv, g2
    )


def part_stats(
    part: Part, settings: Settings, grad: GradientWeights | None, compiled: bool
) -> AnswerStats:
    """:func:`answer_stats` of a run of whole answers, or of a long answer a slice of its
    tokens at a time (the sequence-level ratio's means from a first pass over them)."""
    assert part.adv is not None
    if not part.long or settings.numpy_only:  # a trainer's own loss takes whole answers
        return answer_stats(part.batch, part.adv, settings, grad=grad, compiled=compiled)
    seq = means = None
    if settings.ratio_level == "sequence":
        seq = _partials.seq_mean(part)
        if grad is not None:  # the gradient takes answer means: a first pass
            means = _partials.sequence_means(part, settings, seq)
    total: AnswerStats | None = None
    for _, _, piece, a in part.slices():
        assert a is not None
        got = answer_stats(
            piece, a, settings, grad=grad, compiled=compiled, lengths=part.batch.lengths,
            seq_mean=seq, means=means,
        )  # fmt: skip
        total = got if total is None else total.then(got)
    assert total is not None
    return total


def answer_rows(
    b: Batch,
    adv: np.ndarray,
    settings: Settings,
    src: Source,
    *,
    keys: Sequence[str],
    k: int,
    grad: GradientWeights | None = None,
    compiled: bool = False,
) -> list[dict[str, Any]]:
    """The ``k`` answers of a batch ranking highest by each of ``keys`` (or more:
    :class:`TopAnswers` keeps the ``k`` best of its key), with their statistics
    (:class:`AnswerStats`, computed once for all keys, over the batch's :func:`parts`).
    ``gradient_share`` holds the answer's part of ``‖g‖²`` (:class:`GradientWeights`),
    divided by the whole input's once it is known (:func:`answers_report`)."""
    rows: list[dict[str, Any]] = []
    for part in parts(b, adv):
        if part.batch.n:
            st = part_stats(part, settings, grad, compiled)
            rows += _rows(part.batch, st, keys=keys, k=k, src=src)
    return rows


def _rows(
    b: Batch, st: AnswerStats, *, keys: Sequence[str], k: int, src: Source
) -> list[dict[str, Any]]:
    """The rows of the ``k`` answers of ``b`` ranking highest by each of ``keys``."""
    cols = st.columns()
    chosen: set[int] = set()
    for key in keys:
        ranked = cols[key]
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
        rec["kl_max_token"] = None if st.kl_at is None else int(st.kl_at[i])
        rec["log_ratio_max_token"] = int(st.lr_at[i])
        for name in STATS:
            col = cols[name]
            rec[name] = None if col is None else float(col[i])
        out.append(rec)
    return out


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


def answers_report(
    src: Source,
    settings: Settings,
    *,
    sort: str = "kl",
    top: int = 20,
    engine: EngineOptions | None = None,
    progress: Callable[[int], None] | None = None,
) -> AnswersReport:
    """The ``top`` answers by ``sort`` (a key of :data:`SORT_KEYS`), descending.

    One pass over the tokens: each answer's part of ``‖∂J/∂logp‖²`` is known up to a
    constant every answer shares (:class:`GradientWeights`), so the answers rank by it as
    they come, and the whole input's norm (their sum) divides the kept rows at the end.
    Only when the policy and KL aggregations divide by constants of different kinds and
    one of them needs the token count or the widest row (e.g. seq-mean-token-mean with a
    token-mean KL) does a counts pass over ``logp`` come first."""
    engine = (engine or EngineOptions()).resolved()
    if sort not in SORT_KEYS:
        raise UsageError(f"--sort: expected one of {', '.join(SORT_KEYS)}, got {sort!r}")
    if top < 1:
        raise UsageError(f"--top: expected a positive number of answers, got {top}")
    key = SORT_KEYS[sort]
    # the token streams start decoding now, while pass 1 reads the answer columns
    with Pipeline(plan(src, TOKEN_FIELDS, engine)) as pipe:
        p1: Pass1 = objective_pass1(src, settings, engine=engine)
        n = int(p1.adv.shape[0])
        ran = p1.ran
        grad = gradient_weights(settings, n, None, None)
        if grad is None:  # the ratio of the two aggregations' constants needs T or L
            counts, pre = run(plan(src, ["logp"], engine), AnswerCounts, AnswerCounts.update)
            ran = ran.then(pre)
            grad = gradient_weights(settings, n, counts.tokens, counts.max_width)
        new, fold = answers_fold(src, settings, p1, [key], top=top, engine=engine, grad=grad)
        best, fold_ran = pipe.run(new, fold, progress)
    check_folded(src, settings, best.answers, n, best.max_width)
    notes = list(p1.warnings)
    norm2 = best.gradient
    if not (np.isfinite(norm2) and norm2 > 0):
        notes.append("gradient_share: the gradient's norm is 0 or not finite; null")
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
    if rejects(settings) and key == "gradient_share" and grad and grad.beta and grad.ratio != 1:
        notes.append(
            "gradient_share under verl's rejection sampling: each answer's mean is over its "
            "kept tokens, but the ratio of the policy and KL aggregations' constants is the "
            "unrejected input's (the shares are exact when the two are of one kind)"
        )
    rows = []
    for r in best.tops[key].rows:
        out = {}
        for name in FIELDS:
            v = r[name]
            if name == "gradient_share":
                v = v / norm2 if np.isfinite(norm2) and norm2 > 0 else None
            if isinstance(v, float) and not np.isfinite(v):
                notes.append(f"row {r['row']} of {r['source']}: {name} is {v} (null in JSON)")
                v = None
            out[name] = v
        rows.append(out)
    return AnswersReport(src.label, settings, engine, sort, top, rows, notes, ran.then(fold_ran))


@dataclass
class AnswersPartial:
    """What ``answers`` folds: the top answers by each key (:class:`TopAnswers`), and, of
    every answer, their count, the widest row and the sum of their parts of
    ``‖∂J/∂logp‖²`` (``gradient``: the whole input's, up to :class:`GradientWeights`'
    constant)."""

    tops: dict[str, TopAnswers]
    gradient: float = 0.0
    answers: int = 0
    max_width: int = 0

    def merge(self, o: AnswersPartial) -> AnswersPartial:
        for key, t in self.tops.items():
            t.merge(o.tops[key])
        self.gradient += o.gradient
        self.answers += o.answers
        self.max_width = max(self.max_width, o.max_width)
        return self


def answers_fold(
    src: Source,
    settings: Settings,
    p1: Pass1,
    keys: Sequence[str],
    *,
    top: int,
    engine: EngineOptions,
    grad: GradientWeights | None = None,
) -> tuple[Callable[[], AnswersPartial], Callable[[AnswersPartial, Batch], None]]:
    """``new`` and ``fold`` of one pass over the token batches (:func:`grpo_cli.engine.run.run`):
    the ``top`` answers by each of ``keys`` (values of :data:`SORT_KEYS`), with their
    gradient parts when ``grad`` is given."""
    compiled = engine.backend == "c"

    def fold(acc: AnswersPartial, b: Batch) -> None:
        adv = p1.advantages(b, src.label)
        acc.answers += b.n
        acc.max_width = max(acc.max_width, int(b.width.max()) if b.n else 0)
        rows: list[dict[str, Any]] = []
        for part in parts(b, adv):
            if not part.batch.n:
                continue
            st = part_stats(part, settings, grad, compiled)
            if st.g2 is not None:
                with np.errstate(over="ignore", invalid="ignore"):
                    acc.gradient += float(np.sum(st.g2))
            rows += _rows(part.batch, st, keys=list(acc.tops), k=top, src=src)
        for t in acc.tops.values():
            t.add(rows)

    def new() -> AnswersPartial:
        return AnswersPartial({k: TopAnswers(k, top) for k in keys})

    return new, fold


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
    new, fold = answers_fold(src, settings, p1, keys, top=top, engine=engine)
    best, _ = run(plan(src, TOKEN_FIELDS, engine), new, fold)
    return {k: t.rows for k, t in best.tops.items()}
