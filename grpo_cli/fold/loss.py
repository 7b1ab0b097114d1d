"""The settings' policy loss, sampler–trainer correction and policy-term masks over one
batch, and their logged metrics as a mergeable part of
:class:`grpo_cli.fold.tokens.TokenPartial`.

Everything here goes through the loss registry (:mod:`grpo_cli.losses`): the settings name
a row, the row says how its function is called, how the correction applies, what its
metrics count. :class:`LossMetrics` folds what the trainers log for them from sums, counts
and extremes, so batches folded anywhere merge. :func:`loss_policy` gives the policy term
the fold sums in place of the clipped surrogate (or the weight it multiplies it by), for the
numpy path and for the compiled kernel alike. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from ..core import aggregation_rule, answer_clip_counts, answer_runs, dot, token_terms
from ..errors import InputError
from ..losses import CORRECTIONS, NONE
from ..losses.registry import (
    VERL_MEAN_EPS,
    Correction,
    CorrectionRow,
    LossCall,
    Metric,
    OwnCorrection,
    Params,
    PolicyTerms,
    _mul,
    apply_correction,
    drop_tokens,
    kept_stretch,
    metric_sums,
)
from ..settings import Settings
from .parts import _times

__all__ = [
    "WEIGHT_FIELD",
    "AnswerView",
    "LossMetrics",
    "answer_view",
    "bonus_mask_of",
    "correction_of",
    "kept_stretch",
    "loss_call",
    "loss_clip_share",
    "loss_policy",
    "mask_of",
    "own_correction_of",
    "policy_terms",
    "rejects",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

_EPS = VERL_MEAN_EPS


def loss_clip_share(
    s: Settings, metrics: Mapping[str, float]
) -> tuple[float, tuple[str, ...]] | None:
    """The share the settings' loss (other than the clipped surrogate) clips, from its
    logged metrics (its row's ``clip``), and the metrics summed; None when it clips
    nothing."""
    names = s.loss_row.clip_for(s.loss_params)
    if names is None or names == "core":
        return None
    return sum(metrics.get(n, 0.0) for n in names), names


def clip_unit(s: Settings) -> str:
    """What the loss's clip metric counts: answers when it is a sequence-level metric
    (a ``level`` unit at ``ratio_level`` sequence, or ``answers``), else tokens."""
    names = s.loss_row.clip_for(s.loss_params)
    if names is None or names == "core":
        return "tokens"
    units = {m.unit for m in s.loss_row.metrics_for(s.loss_params) if m.name in names}
    seq = s.ratio_level == "sequence" and "level" in units
    return "answers" if seq or "answers" in units else "tokens"


# A batch whose rejected tokens were removed (:meth:`TokenPartial.update` with
# :func:`rejects`) carries the correction's weights of its kept tokens as this field: the
# weights and the rejection are the whole batch's, computed before the tokens left
WEIGHT_FIELD = "_correction_weight"


def rejects(s: Settings) -> bool:
    """Whether the settings' correction removes tokens from the loss (its row's
    ``rejects``: verl's rejection sampling, which replaces the batch's ``response_mask``
    before the advantages and the update)."""
    row = s.correction_row
    return row is not None and row.rejects(s.correction_params)


def correction_of(
    s: Settings, fields: Mapping[str, NDArray[np.floating]], offsets: I64
) -> Correction | None:
    """The settings' correction of one batch (None: correction none): its row's function
    of ``old_logp`` (``logp`` itself when not given: on-policy) against ``rollout_logp``. A
    batch that carries :data:`WEIGHT_FIELD` (its rejected tokens already removed) gets
    those weights, every token kept and no metrics (they were folded with the whole batch).

    Raises:
        InputError: a correction is set and the batch has no ``rollout_logp``.
    """
    row = s.correction_row
    if row is None:
        return None
    given = fields.get(WEIGHT_FIELD)
    if given is not None:
        w = np.asarray(given, dtype=np.float64)
        return Correction(weight=w, keep=np.ones(w.shape, dtype=bool), metrics={})
    rollout = fields.get("rollout_logp")
    if rollout is None:
        where = "set by " + s.origin if s.origin else "--correction"
        raise InputError(
            f"the correction {s.correction} ({where}) "
            "needs the sampler's log-probs: the input has no rollout_logp column "
            "(--column rollout_logp=NAME)"
        )
    old = fields.get("old_logp", fields["logp"])
    f64 = np.float64
    return row.compute(
        np.asarray(old, dtype=f64), np.asarray(rollout, dtype=f64), offsets, s.correction_params
    )


class _Float64Fields(Mapping[str, F64]):
    """A batch's token fields as float64, each converted when a loss first reads it (a
    loss reads two or three of the five a batch may carry)."""

    def __init__(self, fields: Mapping[str, NDArray[np.floating]]) -> None:
        self._src = fields
        self._done: dict[str, F64] = {}

    def __getitem__(self, key: str) -> F64:
        if key not in self._done:
            self._done[key] = np.asarray(self._src[key], dtype=np.float64)
        return self._done[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)


def loss_call(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    correction: Correction | None = None,
    params: Params | None = None,
) -> LossCall:
    """What a registry row's function is called with over one batch of whole answers."""
    return LossCall(
        fields=_Float64Fields(fields),
        adv=adv, offsets=offsets, params=s.loss_params if params is None else params,
        clip_low=s.clip_eps, clip_high=s.eps_high, dual_clip=s.dual_clip,
        log_ratio_clamp=s.log_ratio_clamp, ratio_level=s.ratio_level, correction=correction,
        correction_name=s.correction,
        answer_mean=aggregation_rule(s.agg).answer_mean,
    )  # fmt: skip


def policy_terms(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    correction: Correction | None,
) -> PolicyTerms:
    """The per-token policy terms of the settings' loss (a registry row with a function:
    not "clip", not one that computes its own correction) over one batch of whole answers,
    the correction applied the way its row says: multiplying term and gradient
    (:func:`grpo_cli.losses.registry.apply_correction`), or inside the loss's function."""
    row = s.loss_row
    assert row.terms is not None and row.correction != "own"
    t = row.terms(loss_call(s, fields, adv, offsets, correction))
    assert isinstance(t, PolicyTerms)
    if correction is None or row.correction == "inside":
        return t
    return apply_correction(t, correction)


def own_correction_of(
    s: Settings, fields: Mapping[str, NDArray[np.floating]], adv: F64, offsets: I64
) -> OwnCorrection:
    """The terms and the correction of a loss that computes its own (its row's
    ``correction`` is "own": verl's bypass mode)."""
    row = s.loss_row
    assert row.terms is not None and row.correction == "own"
    out = row.terms(loss_call(s, fields, adv, offsets))
    assert isinstance(out, OwnCorrection)
    return out


def mask_of(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    *,
    bonus: bool = False,
) -> F64 | None:
    """The product of the settings' policy-term masks over one batch of whole answers (0/1
    ``(T,)``; None: no mask applies); ``bonus``: only those the trainer's entropy bonus takes
    (:attr:`grpo_cli.losses.registry.Mask.entropy_bonus`)."""
    out: F64 | None = None
    for m, p in s.mask_rows:
        if bonus and not m.entropy_bonus:
            continue
        w = m.weight(loss_call(s, fields, adv, offsets, params=p))
        out = w if out is None else out * w
    return out


def bonus_mask_of(s: Settings, fields: Mapping[str, NDArray[np.floating]], offsets: I64) -> F64:
    """The tokens the trainer's entropy bonus takes: the masks it shares (none: every token)."""
    n = int(offsets[-1])
    got = mask_of(s, fields, np.zeros(n), offsets, bonus=True)
    return np.ones(n) if got is None else got


# ------------------------------------------------------- the policy term of a batch
# A loss's function is called on runs of whole answers of at most this many tokens (one
# answer at least), unless it needs the whole batch: its temporaries (some twenty arrays
# of the run's length) stay a few MiB instead of twenty batches' worth per worker, and the
# run is cache-sized. Every value is the same: such a loss's terms are its answers'.
LOSS_RUN_TOKENS = 1 << 16


@dataclass(frozen=True)
class LossPolicy:
    """What the fold sums as the policy term of one batch: ``policy`` ``(T,)`` the loss's
    per-token terms, the correction and the masks applied (None: the clipped surrogate),
    ``grad`` their gradient (None: no closed form, or not asked), ``weight`` ``(T,)`` what
    the clipped surrogate and its gradient are multiplied by (the correction's weights times
    the masks; None: 1)."""

    policy: F64 | None
    grad: F64 | None = None
    weight: F64 | None = None


def _cut(c: Correction | None, t0: int, t1: int) -> Correction | None:
    if c is None:
        return None
    return Correction(weight=c.weight[t0:t1], keep=c.keep[t0:t1], metrics={})


class _Run(NamedTuple):
    """One run of whole answers of a batch: its tokens ``t0 .. t1-1``, its offsets from 0,
    its token fields and its advantages (per answer or per token, as the batch's)."""

    t0: int
    t1: int
    offsets: I64
    fields: dict[str, NDArray[np.floating]]
    adv: F64


def _each_run(
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    runs: list[tuple[int, int]] | None = None,
) -> Iterator[_Run]:
    """The batch's runs (``runs``: answers ``[i, j)``; default :data:`LOSS_RUN_TOKENS`
    tokens at most), each as views of its fields and advantages."""
    n = offsets.shape[0] - 1
    for i, j in answer_runs(offsets, LOSS_RUN_TOKENS) if runs is None else runs:
        t0, t1 = int(offsets[i]), int(offsets[j])
        sub = {k: v[t0:t1] for k, v in fields.items()}
        a = adv[i:j] if adv.shape == (n,) else adv[t0:t1]
        yield _Run(t0, t1, offsets[i : j + 1] - t0, sub, a)


def _loss_runs(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    corr: Correction | None,
    metrics: LossMetrics,
    gradient: bool,
) -> tuple[F64, F64 | None]:
    """The loss's policy term and gradient (``gradient``: else None) over a batch (its
    row's function with the correction, times the masks), run by run
    (:data:`LOSS_RUN_TOKENS`); the loss's metrics of each run folded (not the batch's
    count: the caller's)."""
    n, T = offsets.shape[0] - 1, int(offsets[-1])
    whole = s.loss_row.whole_batch is not None
    policy = np.empty(T)
    grad = np.empty(T) if gradient else None
    for r in _each_run(fields, adv, offsets, [(0, n)] if whole else None):
        pt = policy_terms(s, r.fields, r.adv, r.offsets, _cut(corr, r.t0, r.t1))
        metrics.add(pt, None, r.offsets, batch=False)
        mask = mask_of(s, r.fields, r.adv, r.offsets)
        policy[r.t0 : r.t1] = pt.term if mask is None else _times(pt.term, mask)
        g = pt.grad
        if g is None:
            grad = None
        elif grad is not None:
            grad[r.t0 : r.t1] = g if mask is None else _times(g, mask)
    return policy, grad


def _mask_runs(
    s: Settings, fields: Mapping[str, NDArray[np.floating]], adv: F64, offsets: I64
) -> F64 | None:
    """:func:`mask_of` over a batch, run by run (:data:`LOSS_RUN_TOKENS`: a mask is its
    answers'); None when no mask applies."""
    if not s.mask_rows:
        return None
    out = np.empty(int(offsets[-1]))
    for r in _each_run(fields, adv, offsets):
        m = mask_of(s, r.fields, r.adv, r.offsets)
        assert m is not None
        out[r.t0 : r.t1] = m
    return out


def _own_whole(s: Settings) -> bool:
    """Whether a loss that computes its own correction needs it over the whole batch: its
    correction rejects tokens or normalises its weights over the batch (metrics of one
    batch that do not merge, weights that depend on every answer); else the correction,
    its metrics and the loss's are its answers' and fold run by run."""
    own = s.loss_row.own_correction
    crow = None if own is None else CORRECTIONS[own]
    p = s.loss_params
    return crow is None or crow.rejects(p) or crow.batch_normalized(p)


def _own_runs(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    metrics: LossMetrics,
) -> LossPolicy:
    """:func:`loss_policy` of a loss that computes its own correction (verl's bypass
    mode): over the whole batch when :func:`_own_whole`, else run by run
    (:data:`LOSS_RUN_TOKENS`), the correction's and the loss's metrics of each run folded
    and the batch counted once."""
    n, T = offsets.shape[0] - 1, int(offsets[-1])
    runs = answer_runs(offsets, LOSS_RUN_TOKENS) if not _own_whole(s) else [(0, n)]
    if len(runs) == 1:
        own = own_correction_of(s, fields, adv, offsets)
        metrics.add(None, own.correction, offsets)
        metrics.add(own.kept, None, own.kept_offsets, batch=False)
        return LossPolicy(own.terms.term, own.terms.grad)
    policy = np.empty(T)
    grad: F64 | None = np.empty(T)
    for r in _each_run(fields, adv, offsets, runs):
        own = own_correction_of(s, r.fields, r.adv, r.offsets)
        metrics.add(None, own.correction, r.offsets, batch=False)
        metrics.add(own.kept, None, own.kept_offsets, batch=False)
        policy[r.t0 : r.t1] = own.terms.term
        g = own.terms.grad
        if g is None:
            grad = None
        elif grad is not None:
            grad[r.t0 : r.t1] = g
    metrics.add(None, None, offsets)  # the batch and its answers, once
    return LossPolicy(policy, grad)


def loss_policy(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    metrics: LossMetrics,
    *,
    gradient: bool = True,
) -> LossPolicy:
    """The settings' loss, correction and masks over one batch of whole answers, as the
    policy term the fold sums (:class:`LossPolicy`), the loss's and the correction's
    metrics folded into ``metrics``; ``gradient`` False leaves the loss's gradient out
    (None). A loss that computes its own correction takes no mask
    (verl's bypass mode); a batch that carries :data:`WEIGHT_FIELD` had its correction's
    metrics folded with the whole batch."""
    row = s.loss_row
    if row.correction == "own":
        return _own_runs(s, fields, adv, offsets, metrics)
    corr = correction_of(s, fields, offsets)
    folded = WEIGHT_FIELD in fields  # the whole batch's correction was folded
    if row.terms is not None:
        policy, grad = _loss_runs(s, fields, adv, offsets, corr, metrics, gradient)
        metrics.add(None, None if folded else corr, offsets, batch=not folded)
        return LossPolicy(policy, grad)
    weight = None if corr is None else corr.weight
    mask = _mask_runs(s, fields, adv, offsets)
    if mask is not None:
        weight = mask if weight is None else _times(weight, mask)
    if corr is not None:
        metrics.add(None, None if folded else corr, offsets, batch=not folded)
    return LossPolicy(None, None, weight)


# ------------------------------------------------------- per answer (``answers``)
@dataclass(frozen=True)
class AnswerView:
    """What ``answers`` ranks an answer by under the settings' loss (:func:`answer_view`):
    ``clipped`` ``(N,)`` the tokens the loss clips (its own clip metric's flags, its row's
    ``clip``; 0 for a loss that clips nothing), ``grad`` ``(T,)`` the policy term's
    derivative as the loss takes it (None: no closed form)."""

    clipped: NDArray[np.int64]
    grad: F64 | None
    kl_weight: F64 | None = None  # what the KL term's gradient is multiplied by (rejection)


def _flag_sums(s: Settings, t: PolicyTerms, offsets: I64) -> NDArray[np.int64]:
    """Per answer, the tokens its loss's clip metrics flag (its row's ``clip``)."""
    names = s.loss_row.clip_for(s.loss_params)
    names = () if names is None or names == "core" else names
    flags = [m.key for m in s.loss_row.metrics_for(s.loss_params) if m.name in names]
    total = np.zeros(t.term.shape[0])
    for k in flags:
        x = t.flags[k] if k in t.flags else t.values[k]
        total += np.asarray(x, dtype=np.float64)
    out: NDArray[np.int64] = np.rint(np.add.reduceat(total, offsets[:-1])).astype(np.int64)
    return out if total.size else np.zeros(offsets.shape[0] - 1, dtype=np.int64)


def answer_view(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    clip: tuple[NDArray[np.int64], F64 | None],
) -> AnswerView:
    """The clipped tokens and the policy gradient of each answer of a batch of whole
    answers under the settings' loss, correction and masks, as the fold takes them
    (:class:`grpo_cli.fold.tokens.TokenPartial`): ``clip`` is the clipped surrogate's own
    (its per-answer clipped tokens and per-token gradient), used when the loss is "clip".
    A token a rejection removes is neither clipped nor has a gradient; under an
    answer-mean aggregation an answer's gradient is scaled by its length over its kept
    tokens, as its mean is taken over them."""
    if s.loss_row.correction == "own":
        own = own_correction_of(s, fields, adv, offsets)
        keep = own.correction.keep
        flags = {k: v & keep for k, v in own.terms.flags.items()}
        t = PolicyTerms(own.terms.term, own.terms.grad, own.terms.ratio, flags=flags,
                        values=own.terms.values)  # fmt: skip
        return AnswerView(_flag_sums(s, t, offsets), own.terms.grad)
    corr = correction_of(s, fields, offsets)
    if corr is None or not rejects(s):
        return _view(s, fields, adv, offsets, clip, corr)
    n, keep = offsets.shape[0] - 1, corr.keep
    off, kept_fields, kept = drop_tokens(keep, offsets, *fields.values())
    sub = dict(zip(fields, kept_fields, strict=True))
    w = corr.weight[keep]
    a = adv[kept] if adv.shape == (n,) else adv[keep]
    clipped = np.zeros(n, dtype=np.int64)
    grad = None if clip[1] is None and s.loss_row.terms is None else np.zeros(keep.shape[0])
    if not kept.size:
        return AnswerView(clipped, grad)
    inner_clip = (_clip_kept(s, sub, a, off), None if clip[1] is None else clip[1][keep])
    kept_corr = Correction(weight=w, keep=np.ones(w.shape, dtype=bool), metrics={})
    view = _view(s, sub, a, off, inner_clip, kept_corr)
    clipped[kept] = view.clipped
    # the answer's mean (policy, and the KL loss's) is over its kept tokens
    stretch = kept_stretch(keep, offsets)[keep]
    kl_weight = np.zeros(keep.shape[0])
    kl_weight[keep] = stretch if aggregation_rule(s.kl_aggregation).answer_mean else 1.0
    if view.grad is None:
        return AnswerView(clipped, None, kl_weight)
    g = view.grad * stretch if aggregation_rule(s.agg).answer_mean else view.grad
    assert grad is not None
    grad[keep] = g
    return AnswerView(clipped, grad, kl_weight)


def _view(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    clip: tuple[NDArray[np.int64], F64 | None],
    corr: Correction | None,
) -> AnswerView:
    """:func:`answer_view` of tokens none of which a rejection removes."""
    if s.loss_row.terms is None:
        clipped, g = clip
        if g is not None and corr is not None:
            g = _mul(g, corr.weight)
    else:
        pt = policy_terms(s, fields, adv, offsets, corr)
        clipped, g = _flag_sums(s, pt, offsets), pt.grad
    mask = mask_of(s, fields, adv, offsets) if g is not None else None
    if mask is not None:
        assert g is not None
        g = _mul(g, mask)
    return AnswerView(clipped, g)


def _clip_kept(
    s: Settings, fields: Mapping[str, NDArray[np.floating]], adv: F64, offsets: I64
) -> NDArray[np.int64]:
    """The clipped surrogate's clipped tokens per answer over the given tokens."""
    terms = token_terms(
        fields["logp"], fields.get("old_logp"), fields.get("ref_logp"), adv, offsets,
        options=s.term_options(),
    )  # fmt: skip
    low, high = answer_clip_counts(
        terms.ratio, adv, offsets, clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high
    )
    out: NDArray[np.int64] = low + high
    return out


# ------------------------------------------------------------ the metrics part
# a metric's fold: ("mean", Σ, count) | ("vmean", Σ, count: verl's Σ/(count + 1e-8)) |
# ("min", v, 0) | ("max", v, 0) | ("single", v, 0)
# verl metrics that are a token mean minus a constant (chi2_token = E[ρ²] − 1): folded as
# the mean itself
_SHIFT = {"rollout_corr/chi2_token": 1.0}
# (a statistic of one batch that does not merge: kept only when one batch was folded)
Entry = list[object]


@dataclass
class LossMetrics:
    """The loss's and the correction's logged metrics as mergeable sums: a mean as (Σ,
    count), an extreme as itself, IS spreads from sums of the weights and their squares
    (a correction row with ``is_bound``); a statistic that does not merge (a
    batch-normalisation factor, the spreads of batch-normalised weights) is kept when one
    batch was folded, else left out with a note. ``batches`` counts the batches folded,
    ``gradient_missing`` whether a loss without a closed-form gradient was folded."""

    loss: str = "clip"
    correction: str = NONE
    metrics: tuple[Metric, ...] = ()
    params: Params | None = None  # the loss's record (its notes read it)
    entries: dict[str, Entry] = field(default_factory=dict)
    # the correction's capped-weight statistics of the raw ratio before the cap
    # (:attr:`grpo_cli.losses.registry.Correction.before`), folded the same way
    before: dict[str, Entry] = field(default_factory=dict)
    batches: int = 0
    answers: int = 0
    gradient_missing: bool = False
    seq_correction: bool = False  # the correction's unit is the answer
    # the IS weights' upper bound (the std and ESS clamp to it), and whether they are
    # batch-normalised (then their spread is one batch's)
    is_upper: float | None = None
    batch_normalize: bool = False
    # Σ wc, Σ wc², T of the clamped weights, Σ s, Σ s², N of their answer means (verl's
    # rollout_is_std, _eff_sample_size, _seq_std from mergeable sums)
    spread: list[float] = field(default_factory=lambda: [0.0] * 6)
    # a rejecting correction (:func:`rejects`): the answers it removed whole, the tokens it
    # rejected, and the tokens and widest row of the batches it saw
    rejected_answers: int = 0
    rejected_tokens: int = 0
    seen_tokens: int = 0
    seen_width: int = 0

    @classmethod
    def of(cls, s: Settings) -> LossMetrics:
        row = s.loss_row
        crow: CorrectionRow | None = s.correction_row
        cparams: Params = s.correction_params
        if row.correction == "own" and row.own_correction is not None:
            crow, cparams = CORRECTIONS[row.own_correction], s.loss_params
        seq = upper = None
        normalize = False
        if crow is not None:
            seq = crow.per_answer(cparams)
            upper = crow.is_bound(cparams)
            normalize = crow.batch_normalized(cparams)
        return cls(
            loss=s.loss, correction=NONE if crow is None else crow.name,
            metrics=row.metrics_for(s.loss_params), params=s.loss_params,
            seq_correction=bool(seq), is_upper=upper, batch_normalize=normalize,
        )  # fmt: skip

    @property
    def correction_row(self) -> CorrectionRow | None:
        return CORRECTIONS.get(self.correction)

    def _add_spread(self, w: F64, offsets: I64) -> None:
        """verl 0.9.1 ``compute_is_metrics``' spreads as sums: ``rollout_is_std`` =
        ``sqrt(max(E[wc²] − E[wc]², 0))`` and ``_eff_sample_size`` = ``1 / E[(wc / (E[wc] +
        1e-8))²]`` with ``wc = clamp(w, 0, upper)`` and ``E`` = Σ / (T + 1e-8); ``_seq_std``
        the sample std of the answers' ``Σ_t w / (|o_i| + 1e-8)``."""
        assert self.is_upper is not None
        wc = np.clip(w, 0.0, self.is_upper)
        seq = np.add.reduceat(w, offsets[:-1]) / (np.diff(offsets) + _EPS)
        sums = (np.sum(wc), dot(wc, wc), w.shape[0], np.sum(seq), dot(seq, seq), seq.shape[0])
        for i, v in enumerate(sums):
            self.spread[i] += float(v)

    def _spread_values(self) -> dict[str, float]:
        s1, s2, t, q1, q2, n = self.spread
        out: dict[str, float] = {}
        m, m2 = s1 / (t + _EPS), s2 / (t + _EPS)
        p = "rollout_corr/rollout_is_"
        out[p + "std"] = math.sqrt(max(m2 - m * m, 0.0)) if t > 1 else 0.0
        out[p + "eff_sample_size"] = 1.0 / (m2 / (m + 1e-8) ** 2)
        var = (q2 - q1 * q1 / n) / (n - 1) if n > 1 else 0.0
        out[p + "seq_std"] = math.sqrt(max(var, 0.0))
        return out

    def _add(
        self,
        name: str,
        kind: str,
        value: float,
        count: float = 0.0,
        into: dict[str, Entry] | None = None,
    ) -> None:
        entries = self.entries if into is None else into
        e = entries.get(name)
        if e is None:
            entries[name] = [kind, value, count]
            return
        e[2] = float(e[2]) + count  # type: ignore[arg-type]
        if kind in ("mean", "vmean"):
            e[1] = float(e[1]) + value  # type: ignore[arg-type]
        elif kind == "min":
            e[1] = min(float(e[1]), value)  # type: ignore[arg-type]
        elif kind == "max":
            e[1] = max(float(e[1]), value)  # type: ignore[arg-type]

    def add(
        self,
        terms: PolicyTerms | None,
        correction: Correction | None,
        offsets: I64,
        *,
        batch: bool = True,
    ) -> None:
        """Fold in one batch's loss terms (None: the clipped surrogate, whose metrics the
        core's parts give) and correction; ``batch`` False: the terms of a part of a batch
        whose correction was folded already (it was counted then)."""
        n = int(offsets.shape[0] - 1)
        T = int(offsets[-1])
        if batch:
            self.batches += 1
            self.answers += n
        if terms is not None:
            if terms.grad is None:
                self.gradient_missing = True
            for name, (kind, value, count) in metric_sums(terms, offsets, self.metrics).items():
                self._add(name, kind, value, count)
        row = self.correction_row
        if correction is not None and row is not None:
            if self.is_upper is not None and not self.batch_normalize:
                self._add_spread(correction.weight, offsets)
            self._add_correction(row, correction.metrics, T, n, self.entries)
            self._add_correction(row, correction.before, T, n, self.before)

    def _add_correction(
        self, row: CorrectionRow, metrics: dict[str, float], T: int, n: int,
        into: dict[str, Entry],
    ) -> None:  # fmt: skip
        """Fold one batch's correction ``metrics`` (of ``T`` tokens, ``n`` answers)."""
        for name, value in metrics.items():
            kind, per = row.metric_kind(name, self.seq_correction)
            if kind == "mean":
                count = float(T if per == "tokens" else n)
                if name.startswith("rollout_corr/") and per == "tokens":
                    # verl's Σx / (T + 1e-8): the sum back, the 1e-8 added once at the end
                    v = value + _SHIFT.get(name, 0.0)
                    self._add(name, "vmean", v * (count + _EPS), count, into)
                else:
                    self._add(name, kind, value * count, count, into)
            else:
                self._add(name, kind, value, into=into)

    def add_rejection(self, keep: NDArray[np.bool_], kept: I64, width: I64) -> None:
        """Count what a rejection removed from one batch: ``keep`` ``(T,)`` its tokens kept,
        ``kept`` the answers that keep one (:func:`grpo_cli.losses.registry.drop_tokens`),
        ``width`` every answer's row width."""
        self.rejected_answers += int(width.shape[0] - kept.shape[0])
        self.rejected_tokens += int(keep.shape[0] - np.count_nonzero(keep))
        self.seen_tokens += int(keep.shape[0])
        self.seen_width = max(self.seen_width, int(width.max()) if width.size else 0)

    def merge(self, o: LossMetrics) -> LossMetrics:
        for name, (kind, value, count) in o.entries.items():
            self._add(name, str(kind), float(value), float(count))  # type: ignore[arg-type]
        for name, (kind, value, count) in o.before.items():
            self._add(name, str(kind), float(value), float(count), self.before)  # type: ignore[arg-type]
        self.batches += o.batches
        self.answers += o.answers
        self.spread = [a + b for a, b in zip(self.spread, o.spread, strict=True)]
        self.gradient_missing = self.gradient_missing or o.gradient_missing
        self.rejected_answers += o.rejected_answers
        self.rejected_tokens += o.rejected_tokens
        self.seen_tokens += o.seen_tokens
        self.seen_width = max(self.seen_width, o.seen_width)
        return self

    def before_values(self) -> dict[str, float]:
        """The correction's capped-weight statistics of the raw ratio before the cap, by
        their logged names (empty without a capped correction)."""
        return self._finished(self.before)

    def values(self) -> dict[str, float]:
        """Every metric by its logged name (a statistic of one batch only when one was)."""
        out = self._finished(self.entries)
        if self.spread[2]:  # verl's spreads, from sums: whatever the batches
            out.update({k: v for k, v in self._spread_values().items() if k in self.entries})
        return out

    def _finished(self, entries: dict[str, Entry]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, (kind, value, count) in entries.items():
            if kind in ("mean", "vmean"):
                c = float(count) + (_EPS if kind == "vmean" else 0.0)  # type: ignore[arg-type]
                # no token (a rejection kept none): the trainers' masked means give 0
                out[name] = float(value) / c if c else 0.0  # type: ignore[arg-type]
                out[name] -= _SHIFT.get(name, 0.0)
            elif kind == "single":
                if self.batches == 1:
                    out[name] = float(value)  # type: ignore[arg-type]
            else:
                out[name] = float(value)  # type: ignore[arg-type]
        return out

    def notes(self) -> list[str]:
        """What the reader should know of how these were folded."""
        from ..losses import LOSSES

        out: list[str] = []
        k = self.batches
        row = LOSSES[self.loss]
        crow = self.correction_row
        if row.whole_batch is not None and k > 1:
            out.append(
                f"{self.loss} {row.whole_batch}: folded over each of grpo-cli's {k} batches; "
                "the numbers equal the trainer's when each batch is one of its micro-batches "
                "(one file or row group per micro-batch), else they differ"
            )
        kept = self._spread_values() if self.spread[2] else {}
        left = [n for n, e in self.entries.items() if e[0] == "single" and n not in kept]
        if left and k > 1:
            out.append(
                f"{', '.join(left)}: statistics of one batch that do not merge, left out "
                f"over {k} batches"
            )
        if crow is not None and crow.scope is not None and self.batch_normalize and k > 1:
            out.append(
                f"{crow.scope}: the weights' batch normalisation (if on) is each of "
                f"grpo-cli's {k} batches'"
            )
        if self.gradient_missing:
            out.append(f"{self.loss} has no closed-form gradient here: the gradient is null")
        if row.fold_note is not None:
            out.append(row.fold_note(self.params or row.params(), self.values()))
        if self.seen_tokens and crow is not None:
            share = self.rejected_tokens / self.seen_tokens
            out.append(
                f"{crow.rejection} removed {self.rejected_tokens:,} of "
                f"{self.seen_tokens:,} tokens ({share:.2%}) and {self.rejected_answers:,} "
                "answer(s) whole from the loss, as its modified response_mask: the loss, its "
                "metrics, the KL loss, the ratio and clip statistics and the token and answer "
                "counts are the kept tokens'; entropy, the sampler-vs-trainer statistics and "
                "the KL in the reward are every token's; a seq-mean divides by every row"
            )
        return out
