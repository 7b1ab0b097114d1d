"""The token pass's partial: every per-token statistic of a run of answers, folded batch by
batch and merged part by part (:class:`TokenPartial`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ..batch import Batch, parts
from ..core import (
    AGGREGATIONS,
    ClipCounts,
    TokenTerms,
    aggregation_rule,
    aggregation_weights,
    answer_clip_tokens,
    clip_counts_of,
    difference,
    kl_from_log_ratio,
    log_ratio,
    ratio_moments,
    segment_sum,
    token_gradients,
    token_terms,
)
from ..core import kernel as _fast
from ..core.stats import IntCounts, Moments, Sketch
from ..errors import MergeError
from ..losses.registry import drop_tokens
from ..records import QUANTILE_LEVELS, QUANTILES, Distribution
from ..settings import Settings
from .loss import (
    WEIGHT_FIELD,
    LossMetrics,
    LossPolicy,
    bonus_mask_of,
    correction_of,
    loss_policy,
    rejects,
)
from .mistakes import AlignmentSums, ClosingZeros
from .parts import (
    ANSWER_BINS,
    ENTROPY_BINS,
    F64,
    I64,
    LOG_RATIO_BINS,
    AnswerCounts,
    AnswerSums,
    ClipShares,
    GradientSums,
    LengthAdvantage,
    LogRatioSums,
    MaskedSums,
    PositiveLogp,
    RatioMoments,
    RolloutPartial,
    TermSums,
    UnclippedMinimum,
    Whole,
    _times,
    agg_factor,
    divisor_of,
    seq_mean,
    sequence_means,
)
from .sampler import SupportSums
from .where import PositionSums


class TokenPartial:
    """Mergeable partial statistics of the per-token GRPO terms over a run of answers.

    Made of parts (:data:`PARTS`), each with its own ``merge``: a new statistic is a new
    part, its update in the fold, and its view. Two ways to fold a batch, with the same
    results (tests/test_kernel.py): the compiled kernel of :mod:`grpo_cli.core.kernel` (backend
    ``c``: one pass over the token columns, when the ratio is per token and the KL has no
    bias correction, the gradient's sums included), else numpy, composed of the core's
    definitions (:func:`token_terms`, :func:`clip_counts`, :func:`ratio_moments`,
    :func:`token_gradients`).

    A loss other than the clipped surrogate (``Settings.loss``), a sampler–trainer
    correction (``Settings.correction``) or a policy-term mask folds whole answers at a
    time: the loss's terms (:func:`grpo_cli.fold.loss.loss_policy`, the rows of
    :mod:`grpo_cli.losses`, computed by numpy) replace the policy term, or the correction's
    weights and the masks multiply the clipped surrogate; the kernel, when it folds the
    batch, sums them with every other statistic in its one pass. The KL term stays the
    settings' (β, estimator, ``kl_agg``), the gradient is the loss's (numpy's, for a loss
    with terms of its own), and its logged metrics fold in ``loss_metrics``
    (:class:`~grpo_cli.fold.loss.LossMetrics`). A loss whose row needs the whole batch
    (``Loss.whole_batch``) chooses tokens over each batch folded (the trainer's micro-batch
    when a batch is one: ``loss_metrics.notes()`` says so).
    """

    PARTS = (
        "counts",
        "term",
        "policy",
        "kl",
        "clip",
        "clip_shares",
        "ratio",
        "log_ratios",
        "delta",
        "kl_values",
        "kl_d",
        "kl_answer",
        "kl_answer_q",
        "rollout",
        "support",
        "entropy",
        "entropy_q",
        "bonus_entropy",
        "reward_kl",
        "old_ref",
        "grad",
        "positive",
        "length_adv",
        "closing_zeros",
        "alignment",
        "loss_metrics",
        "unclipped_min",
        "positions",
    )
    OPTIONAL = ("unclipped_min", "positions")  # folded only for a release whose metrics read them

    def __init__(
        self,
        settings: Settings,
        *,
        backend: str = "numpy",
        exact_cap: int | None = None,
        gradient: bool = False,
        where: bool = False,
    ) -> None:
        self.settings = settings
        self.positions = PositionSums(wanted=where)  # by position along the answer
        self.options = settings.term_options()
        self.gradient_wanted = gradient  # ‖∂J/∂logp‖
        self.grad = GradientSums()
        self.positive = PositiveLogp()  # log-probs > 0 inside the mask, by field
        self.length_adv = LengthAdvantage()  # answers by (length, advantage): the plot
        self.closing_zeros = ClosingZeros()  # answers closing in exact zeros (padding?)
        self.alignment = AlignmentSums()  # logp against rollout_logp, position by position
        self.exact_cap = exact_cap
        cap = {} if exact_cap is None else {"exact_cap": exact_cap}
        self.counts = AnswerCounts()
        self.term, self.policy = TermSums(), TermSums()  # policy − β·KL, and the policy part
        self.kl = TermSums()  # the KL as the loss takes it (bias-corrected when asked)
        self.clip = ClipCounts()
        self.clip_shares = ClipShares()
        self.ratio = RatioMoments()
        self.log_ratios = LogRatioSums()
        self.delta = Sketch(*LOG_RATIO_BINS, **cap)  # Δ = logp − old_logp; ρ = exp(Δ)
        self.kl_values = Moments(fast=True)  # the per-token KL estimate of logp vs ref_logp
        self.kl_d = Sketch(*LOG_RATIO_BINS, **cap)  # d = ref_logp − logp; KL is f(d)
        self.kl_answer = Moments()
        self.kl_answer_q = Sketch(*ANSWER_BINS, **cap)
        self.rollout = RolloutPartial()
        self.support = SupportSums()  # a truncated or tempered sampler, from δ alone
        self.entropy = Moments()
        self.entropy_q = Sketch(*ENTROPY_BINS, **cap)
        self.bonus_entropy = MaskedSums()  # the entropy over the masks the trainer's bonus takes
        # with the KL in the reward: the KL the reward took (old_logp vs ref_logp) and the
        # raw old_logp − ref_logp, for the trainers' logged kl and logprobs_diff
        self.reward_kl = TermSums()
        self.old_ref = TermSums()
        # the compiled kernel folds token-level ratios; GSPO's sequence ratio and TRL's
        # bias-corrected KL stay in numpy, and so does the gradient of a loss with terms of
        # its own (its terms are numpy's either way, summed by the kernel)
        own_terms = settings.loss_row.terms is not None
        self.compiled = (
            backend == "c" and _fast.supports_options(self.options) and not (gradient and own_terms)
        )
        self.loss_metrics = LossMetrics.of(settings)  # the loss's and correction's metrics
        self.unclipped_min = UnclippedMinimum(wanted="unclipped_min" in settings.folds)
        self.vector = True  # the kernel's AVX2 path where the CPU has it (tests turn it off)

    # the counts, by name
    @property
    def answers(self) -> int:
        return self.counts.answers

    @property
    def tokens(self) -> int:
        return self.counts.tokens

    @property
    def max_width(self) -> int:
        """The widest row folded (a row verl's rejection sampling removed whole included)."""
        return max(self.counts.max_width, self.loss_metrics.seen_width)

    @property
    def rows(self) -> int:
        """The answers folded and those a rejection removed whole (:meth:`_rejected`): the
        rows a trainer's seq-mean divides by."""
        return self.counts.answers + self.loss_metrics.rejected_answers

    @property
    def lengths(self) -> IntCounts:
        return self.counts.lengths

    def _kl_answers(self, per_answer: F64) -> None:
        """Fold in the per-answer mean KL."""
        self.kl_answer.update(per_answer)
        self.kl_answer_q.update(per_answer)

    # ---- the fold: token parts from the tokens, answer parts from per-answer sums
    #
    # Every batch folds in two steps: ``_tokens`` folds the parts that count tokens and
    # returns per-answer sums (:class:`AnswerSums`); ``_answers`` folds the parts that count
    # answers from those sums. An answer longer than SLICE_TOKENS goes through ``_tokens`` a
    # slice at a time and its sums add up, so that no per-token array is ever longer than a
    # slice: the answer-level results are those of the whole answer.

    def _runs(
        self,
        b: Batch,
        adv: F64 | None,
        step: Callable[[Batch, F64 | None, Whole], AnswerSums],
        *,
        extras: bool = True,
    ) -> Iterator[tuple[Batch, F64 | None, AnswerSums]]:
        for part in parts(b, adv):
            sub, a, per_token = part.batch, part.adv, part.per_token
            if not part.long or self.settings.numpy_only:  # a loss takes whole answers
                sums = step(sub, a, Whole(sub.lengths, per_token, extras=extras))
                if per_token:
                    assert a is not None
                    sums.adv = segment_sum(a, sub.offsets)
                yield sub, a, sums
                continue
            seq = grad = None
            if self.settings.ratio_level == "sequence":
                seq = seq_mean(part)
                if self.gradient_wanted and a is not None:
                    grad = sequence_means(part, self.settings, seq)
            whole = Whole(sub.lengths, per_token, seq, grad)
            total = AnswerSums()
            for k, (_, _, piece, pad) in enumerate(part.slices()):
                got = step(piece, pad, whole)
                if per_token:
                    assert pad is not None
                    got.adv = np.array([np.sum(pad)])
                total = got if k == 0 else total + got
            yield sub, a, total

    def update_kl(self, b: Batch) -> None:
        """Statistics of the KL estimate alone (``grpo-cli kl``)."""
        with np.errstate(over="ignore"):  # sums beyond float64 are inf, reported as such
            for sub, _, sums in self._runs(b, None, self._kl_tokens):
                self.counts.update(sub)
                assert sums.kl is not None
                self._kl_answers(self.kl.add(sums.kl, sub.lengths))

    def _kl_tokens(self, b: Batch, adv: F64 | None, whole: Whole) -> AnswerSums:
        d = difference(b.fields["ref_logp"], b.fields["logp"])
        k = self.kl_function()(d)
        self.kl_values.update(k)
        self.kl_d.update(d)
        return AnswerSums(kl=segment_sum(k, b.offsets))

    def update(self, b: Batch, adv: F64) -> None:
        """Fold in a batch of answers with their advantages: ``(b.n,)``, or one per token
        (the kernel takes one per answer: per-token advantages fold in numpy)."""
        self.closing_zeros.update(b)
        self.alignment.update(b)
        if self.positions.wanted:
            self.positions.update(b, self.kl_function())
        extras = True
        with np.errstate(over="ignore"):  # sums beyond float64 are inf, reported as such
            if rejects(self.settings):
                b, adv = self._rejected(b, adv)
                extras = False
            for sub, a, sums in self._runs(b, adv, self._tokens, extras=extras):
                assert a is not None
                self._answers(sub, a, sums)

    def _rejected(self, b: Batch, adv: F64) -> tuple[Batch, F64]:
        """verl's rejection sampling on a batch: the correction of the whole batch (its
        weights, rejection and metrics: over every token, as verl computes them before the
        update), the statistics verl takes over every token (entropy, the sampler's, the KL
        in the reward: ``_extras``) and the batch without its rejected tokens, their weights
        as :data:`WEIGHT_FIELD`, and its advantages (computed over every answer: verl's
        GRPO scores do not read the mask). An answer rejected whole leaves the batch; the
        seq-mean aggregations still count it (verl's ``global_batch_size`` is the
        mini-batch's rows)."""
        corr = correction_of(self.settings, b.fields, b.offsets)
        assert corr is not None
        self.loss_metrics.add(None, corr, b.offsets)
        self._extras(b)
        keep = corr.keep
        offsets, _, kept = drop_tokens(keep, b.offsets)
        self.loss_metrics.add_rejection(keep, kept, b.width)
        fields = {k: v[keep] for k, v in b.fields.items()}
        fields[WEIGHT_FIELD] = corr.weight[keep]
        rows = np.arange(b.start, b.start + b.n, dtype=np.int64) if b.rows is None else b.rows
        reduced = Batch(
            start=b.start, offsets=offsets, fields=fields, width=b.width[kept],
            answer={k: v.take(pa.array(kept)) for k, v in b.answer.items()}, rows=rows[kept],
        )  # fmt: skip
        return reduced, (adv[kept] if adv.shape == (b.n,) else adv[keep])

    def _extras(self, b: Batch) -> None:
        """The entropy, sampler-vs-trainer, reward-KL and positive-log-prob parts of a
        whole batch, alone (:meth:`_rejected`)."""
        for part in parts(b):
            sub = part.batch
            sums = AnswerSums()
            self._extras_tokens(sub, sums)
            self.positive.update(sub)
            self._extras_answers(sums, sub.lengths)

    def _tokens(self, b: Batch, adv: F64 | None, whole: Whole) -> AnswerSums:
        assert adv is not None
        if self.compiled and not whole.per_token:
            sums = self._tokens_compiled(b, adv, whole)
        else:
            sums = self._tokens_numpy(b, adv, whole)
        if whole.extras:
            self._extras_tokens(b, sums)
            self.positive.update(b)
        return sums

    def _answers(self, b: Batch, adv: F64, sums: AnswerSums) -> None:
        """The answer-level parts, from the per-answer sums of :meth:`_tokens`."""
        s, lengths = self.settings, b.lengths
        if self.unclipped_min.wanted:
            self.unclipped_min.update(b, adv, s)
        assert sums.term is not None and sums.policy is not None
        assert sums.low is not None and sums.high is not None
        self.counts.update(b)
        self.term.add(sums.term, lengths)
        self.policy.add(sums.policy, lengths)
        if sums.kl is not None:
            means = self.kl.add(sums.kl, lengths)
            self._kl_answers(means if sums.kl_raw is None else sums.kl_raw / lengths)
        if sums.outside is not None and sums.dual is not None:  # numpy: counted per answer
            self.clip = self.clip.merge(
                clip_counts_of(sums.low, sums.high, sums.outside, sums.dual, s.clip_unit)
            )
        self.clip_shares.add(sums.low, sums.high, lengths, s.clip_unit)
        if sums.grad_nz is not None:
            self.grad.count_answers(sums.grad_nz)
        self._extras_answers(sums, lengths)
        self.length_adv.update(lengths, adv if sums.adv is None else sums.adv / lengths)

    def _extras_answers(self, sums: AnswerSums, lengths: I64) -> None:
        """The answer-level parts of :meth:`_extras_tokens`' sums (reward KL, sampler)."""
        if sums.reward_kl is not None and sums.old_ref is not None:
            self.reward_kl.add(sums.reward_kl, lengths)
            self.old_ref.add(sums.old_ref, lengths)
        if sums.rollout is not None:
            self.rollout.update_answers(sums.rollout, lengths, sums.rollout_rho, sums.rollout_pdiff)

    def _tokens_compiled(self, b: Batch, adv: F64, whole: Whole) -> AnswerSums:
        """The same statistics as :meth:`_tokens_numpy`, from one pass of the kernel: its
        histogram counts merge into the two sketches, its per-answer gradient sums into
        :class:`GradientSums`."""
        f = b.fields
        logp, old, ref = f["logp"], f.get("old_logp"), f.get("ref_logp")
        lp = LossPolicy(None)
        if self.settings.numpy_only:  # the loss's terms (numpy) summed by the kernel
            lp = loss_policy(self.settings, f, adv, b.offsets, self.loss_metrics, gradient=False)
        out = _fast.fold(
            logp,
            old,
            ref,
            adv,
            b.offsets,
            options=self.options,
            bins=LOG_RATIO_BINS,
            gradient=self.gradient_wanted,
            vector=self.vector,
            policy=lp.policy,
            weight=lp.weight,
        )
        t, n = out.totals, int(b.offsets[-1])
        if out.kl is not None:
            assert ref is not None and out.x_counts is not None
            self.kl_values.merge(
                Moments.from_sums(
                    n, t.k_inf, float(np.sum(out.kl)), t.kf_sum, t.kf_sq, t.k_min, t.k_max
                )
            )
            self.kl_d.counted(n, out.x_counts, t.x_min, t.x_max, lambda: difference(ref, logp))
        # the kernel counts clipped tokens (its ratio is per token)
        self.clip = self.clip.merge(
            ClipCounts(t.n_low, t.n_high, t.n_low + t.n_high, t.n_outside, t.n_dual)
        )
        self.ratio.add(t.r_sum, t.r2_sum, t.r_inf)
        self.log_ratios.add(t.d_sum, t.d20_sum, t.x_sum)

        def delta() -> F64:
            return np.zeros(n) if old is None else log_ratio(logp, old)

        assert out.d_counts is not None
        self.delta.counted(n, out.d_counts, t.d_min, t.d_max, delta)
        sums = AnswerSums(term=out.term, policy=out.policy, kl=out.kl, low=out.low, high=out.high)
        if out.gradient is not None:
            sums.grad_nz = self.grad.add_answers(out.gradient, whole.lengths)
        return sums

    def _tokens_numpy(self, b: Batch, adv: F64, whole: Whole) -> AnswerSums:
        s = self.settings
        terms = token_terms(
            b.fields["logp"],
            b.fields.get("old_logp"),
            b.fields.get("ref_logp"),
            adv,
            b.offsets,
            options=self.options,
            seq_mean=whole.seq_mean,
        )
        loss_grad: F64 | None = None
        if s.numpy_only:  # the settings' loss in place of the clipped surrogate
            terms, loss_grad = self._loss_terms(b, adv, terms)
        sums = AnswerSums(
            term=segment_sum(terms.term, b.offsets), policy=segment_sum(terms.policy, b.offsets)
        )
        if terms.kl is not None and terms.ref_delta is not None:
            self.kl_values.update(terms.kl)
            self.kl_d.update(terms.ref_delta)
            sums.kl = segment_sum(terms.kl, b.offsets)
            if terms.kl_loss is not terms.kl:  # the loss's KL (bias-corrected) is summed; the
                assert terms.kl_loss is not None  # statistics describe the KL itself
                sums.kl_raw, sums.kl = sums.kl, segment_sum(terms.kl_loss, b.offsets)
        # clip counts on the ratio the surrogate used; the ratio's moments from the raw Δ
        sums.low, sums.high, sums.outside, sums.dual = answer_clip_tokens(
            terms.ratio,
            adv,
            b.offsets,
            clip_eps=s.clip_eps,
            clip_eps_high=s.clip_eps_high,
            dual_clip=s.dual_clip,
        )
        self.ratio.add(*ratio_moments(terms.delta))
        d = terms.delta
        ref = 0.0 if terms.ref_delta is None else float(np.sum(terms.ref_delta))
        self.log_ratios.add(float(np.sum(d)), float(np.sum(np.clip(d, -20.0, 20.0))), ref)
        self.delta.update(terms.delta)
        if self.gradient_wanted:
            gp, gk = token_gradients(
                terms, offsets=b.offsets, options=self.options, answer_means=whole.grad_means
            )
            gk = gk if self.options.beta else None  # with the KL in the reward: no KL term
            if s.numpy_only:
                gp = loss_grad if loss_grad is not None else np.zeros_like(gp)
            sums.grad_nz = self.grad.add(gp, gk, b.offsets, whole.lengths)
        return sums

    def _loss_terms(self, b: Batch, adv: F64, terms: TokenTerms) -> tuple[TokenTerms, F64 | None]:
        """``terms`` with the settings' loss (its registry row's function:
        :func:`grpo_cli.fold.loss.loss_policy`) as the policy term, the correction and the
        policy-term masks applied, the KL term unchanged; and the policy term's gradient
        (None: no closed form, the fold's gradient is then null). Folds the loss's and the
        correction's metrics."""
        s = self.settings
        lp = loss_policy(
            s, b.fields, adv, b.offsets, self.loss_metrics, gradient=self.gradient_wanted
        )
        if lp.policy is not None:
            return self._with_kl(terms, lp.policy), lp.grad
        w = lp.weight  # the clipped surrogate's, times the correction's weights and the masks
        policy = terms.policy if w is None else _times(terms.policy, w)
        grad = None
        if self.gradient_wanted:
            gp, _ = token_gradients(terms, offsets=b.offsets, options=self.options)
            grad = gp if w is None else _times(gp, w)
        return self._with_kl(terms, policy), grad

    def _with_kl(self, terms: TokenTerms, policy: F64) -> TokenTerms:
        """``terms`` with ``policy`` as the policy term, the KL term the settings'."""
        term = policy
        if terms.kl_loss is not None and self.options.beta:
            with np.errstate(over="ignore", invalid="ignore"):
                term = policy - self.options.beta * terms.kl_loss
        return dataclasses.replace(terms, policy=policy, term=term)

    def _extras_tokens(self, b: Batch, sums: AnswerSums) -> None:
        """Entropy, sampler-vs-trainer and reward-KL statistics, when they apply."""
        s = self.settings
        if s.kl_mode == "reward" and "ref_logp" in b.fields:
            old = b.fields.get("old_logp", b.fields["logp"])
            raw = difference(old, b.fields["ref_logp"])
            k = kl_from_log_ratio(
                -raw,
                estimator=s.kl_estimator,
                clamp=s.kl_clamp,
                log_ratio_clamp=s.log_ratio_clamp,
            )
            sums.reward_kl = segment_sum(k, b.offsets)
            sums.old_ref = segment_sum(raw, b.offsets)
        entropy = b.fields.get("entropy")
        if entropy is not None:
            e = np.asarray(entropy, dtype=np.float64)
            self.entropy.update(e)
            self.entropy_q.update(e)
            bonus = [m for m, _ in s.mask_rows if m.entropy_bonus]
            if bonus and all(f in b.fields for m in bonus for f in m.needs):
                self.bonus_entropy.add(e, bonus_mask_of(s, b.fields, b.offsets))
        rollout = b.fields.get("rollout_logp")
        if rollout is not None:  # the trainer's old policy is logp itself when on-policy
            old = b.fields.get("old_logp", b.fields["logp"])
            delta_r = difference(old, rollout)
            got = self.rollout.update_tokens(delta_r, old, rollout, b.offsets)
            sums.rollout, sums.rollout_rho, sums.rollout_pdiff = got
            self.support.update(delta_r, rollout, entropy)

    def merge(self, o: TokenPartial) -> TokenPartial:
        """Every part merges with its own; partials of other settings are refused."""
        if o.settings != self.settings:
            raise MergeError("partials of different settings")
        for name in self.PARTS:
            setattr(self, name, getattr(self, name).merge(getattr(o, name)))
        return self

    # ---- results
    @property
    def overflow(self) -> int:
        """Tokens whose ratio exp(Δ) overflowed to inf."""
        return self.ratio.n_inf

    def ratio_distribution(self) -> Distribution:
        """ρ = exp(Δ): mean from Σρ, extremes and quantiles from Δ's (exp is monotone)."""
        n = self.delta.n
        if n == 0:
            return Distribution(0, None, None, None, None, {})
        with np.errstate(over="ignore"):  # every Δ may be above 709.78: ρ = inf
            lo, hi = np.exp(self.delta.hist.vmin), np.exp(self.delta.hist.vmax)
        vals = self.delta.quantiles(QUANTILE_LEVELS, np.exp)
        assert vals is not None
        mean = self.ratio.total / n
        std = math.sqrt(max(self.ratio.sq / n - mean * mean, 0.0)) if not self.ratio.n_inf else None
        return Distribution(
            count=n,
            mean=mean,
            std=std,
            min=float(lo),
            max=float(hi),
            quantiles={k: float(v) for k, v in zip(QUANTILES, vals, strict=True)},
            exact=self.delta.is_exact,
        )

    @property
    def extreme(self) -> int:
        """Tokens with Δ outside [−20, 20), where verl and OpenRLHF clamp: the open end bins
        of the log-ratio histogram (LOG_RATIO_BINS)."""
        return int(self.delta.hist.counts[0] + self.delta.hist.counts[-1])

    def aggregate(self, key: str, agg: str) -> float:
        """:func:`grpo_cli.core.aggregate` of a per-token value, from the partial's sums
        (the rule of :data:`grpo_cli.core.AGGREGATION_RULES`)."""
        sums: TermSums = getattr(self, key)
        total = sums.answer_means if aggregation_rule(agg).answer_mean else sums.token
        return total / self.divisor(agg)

    def divisor(self, agg: str) -> float:
        """The constant ``D`` of ``agg`` for this partial's answers, tokens and width (L:
        ``max_len``, else the widest row: its padded width, masked tokens included, as
        verl's ``loss_mask.shape[-1]``)."""
        return divisor_of(self.settings, agg, self.rows, self.tokens, self.max_width)

    def objective(self, agg: str) -> float:
        """J under the policy aggregation ``agg``; the KL term keeps the settings' own
        (``kl_agg``): one sum of per-token terms when the two agree."""
        s = self.settings
        if s.kl_agg is None or s.kl_agg == agg or not s.beta or s.kl_mode == "reward":
            return self.aggregate("term", agg)  # (with the KL in the reward: the policy term)
        return self.aggregate("policy", agg) - s.beta * self.aggregate("kl", s.kl_agg)

    def gradient(self) -> dict[str, float] | None:
        """``‖∂J/∂logp‖`` over the valid tokens and its policy and KL parts, and the shares
        of tokens and answers whose policy part is nonzero; None when not folded."""
        g, s = self.grad, self.settings
        if not self.gradient_wanted or not self.answers or self.loss_metrics.gradient_missing:
            return None
        cp, i = agg_factor(s, s.agg, self.rows, self.tokens, self.max_width)
        kl_on = self.options.beta != 0.0
        ck, j = (
            agg_factor(s, s.kl_aggregation, self.rows, self.tokens, self.max_width)
            if kl_on
            else (0.0, 0)
        )
        beta = s.beta if kl_on else 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            pp = cp * cp * g.pp[i]
            kk = (beta * ck) ** 2 * g.kk[j]
            total = pp + kk - 2.0 * beta * cp * ck * g.pk[i][j]
        return {
            "norm": math.sqrt(max(total, 0.0)),
            "policy_norm": math.sqrt(pp),
            "kl_norm": math.sqrt(kk),
            "tokens_with_policy_gradient": g.tokens_policy / self.tokens,
            "answers_with_policy_gradient": g.answers_policy / self.answers,
        }

    def kl_function(self) -> Callable[[F64], F64]:
        """The KL estimate as a function of d = ref_logp − logp (also for its quantiles)."""
        s = self.settings

        def f(d: F64) -> F64:
            return kl_from_log_ratio(
                d,
                estimator=s.kl_estimator,
                clamp=s.kl_clamp,
                log_ratio_clamp=s.log_ratio_clamp,
            )

        return f

    def ratio_histogram(self) -> list[tuple[float, float, int]]:
        lo, hi = self.settings.clip_eps, self.settings.eps_high
        edges = [0.0, 1 - 2 * lo, 1 - lo, 1 - lo / 2, 1.0, 1 + hi / 2, 1 + hi, 1 + 2 * hi, math.inf]
        edges = sorted({e for e in edges if e >= 0})
        inner = np.log(np.array(edges[1:-1]))
        if self.delta.is_exact:
            x = np.concatenate(self.delta.exact) if self.delta.exact else np.zeros(0)
            counts = np.bincount(np.searchsorted(inner, x, side="right"), minlength=len(edges) - 1)
        else:
            rep = self.delta.hist.representatives()
            counts = np.bincount(
                np.searchsorted(inner, rep, side="right"),
                weights=self.delta.hist.counts,
                minlength=len(edges) - 1,
            )
        return [(edges[i], edges[i + 1], int(counts[i])) for i in range(len(edges) - 1)]


def length_weights(p: TokenPartial) -> list[dict[str, float]]:
    """Weight of one token, and of a whole answer, under each aggregation, by length."""
    q = p.lengths.quantiles(np.array([0.0, 0.25, 0.5, 0.75, 1.0]))
    assert q is not None
    lmax = p.settings.max_len if p.settings.max_len is not None else p.max_width
    per_token = {
        agg: aggregation_weights(
            q,
            agg=agg,
            answers=p.answers,
            tokens=p.tokens,
            max_len=lmax,
            norm_scale=p.settings.norm_scale,
        )
        for agg in AGGREGATIONS
    }
    rows = []
    for j, (label, length) in enumerate(zip(("min", "p25", "p50", "p75", "max"), q, strict=True)):
        row: dict[str, Any] = {"length": label, "tokens": float(length)}
        for agg in AGGREGATIONS:
            row[f"{agg}/token"] = float(per_token[agg][j])
            row[f"{agg}/answer"] = float(per_token[agg][j]) * length
        rows.append(row)
    return rows
