"""The settings' policy loss and sampler–trainer correction over one batch, and their logged
metrics as a mergeable part of :class:`grpo_cli._partials.TokenPartial`.

:func:`policy_terms` maps :class:`~grpo_cli._settings.Settings` onto the functions of
:mod:`grpo_cli._losses` (each proved against its trainer's own function by
conformance/losses.py), :func:`correction_of` onto the corrections; :class:`LossMetrics`
folds what the trainers log for them (``_losses.LOSS_METRICS`` and the corrections'
metrics) from sums, counts and extremes, so batches folded anywhere merge. numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from . import _losses as L
from ._core import aggregation_rule, answer_clip_counts, token_terms
from ._settings import Settings
from .errors import InputError

__all__ = [
    "CLIP_METRICS",
    "WEIGHT_FIELD",
    "AnswerView",
    "Bypass",
    "LossMetrics",
    "answer_view",
    "bypass_of",
    "correction_of",
    "entropy_mask_of",
    "kept_stretch",
    "loss_clip_share",
    "metrics_key_of",
    "needs_numpy",
    "policy_terms",
    "rejects",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

# verl's rollout correction means divide by (count + 1e-8)
_VERL_EPS = L.VERL_MEAN_EPS
# the verl cispo, sapo and dppo log-ratio clamp (rollout_corr_helper.SAFETY_BOUND, and the
# losses' own ±20)
_VERL_CLAMP = 20.0


# Each loss's own clip share (``check``'s clip-region rule): the logged metrics whose sum is
# the share of tokens (answers at sequence level) the loss clips; absent: the loss clips
# nothing (SAPO's soft gate, VESPO's weight, GPG, DRO, KL-Cov's penalty)
CLIP_METRICS: dict[str, tuple[str, ...]] = {
    "trl/cispo": ("cispo_clip_ratio",),  # ρ above the cap with A > 0
    "trl/luspo": ("clip_ratio/region_mean",),
    "verl/cispo": ("actor/pg_clipfrac",),  # the weight differs from ρ
    "verl/dppo_tv": ("actor/pg_clipfrac",),  # masked by the divergence threshold
    "verl/dppo_kl": ("actor/pg_clipfrac",),
    "verl/clip_cov": ("actor/pg_clipfrac",),  # the tokens whose gradient is removed
    "verl/geo_mean": ("actor/pg_clipfrac", "actor/pg_clipfrac_lower"),  # A > 0 and A < 0
    "verl/bypass_mode/ppo_clip": ("actor/pg_clipfrac",),  # the clip region against the sampler
}


def loss_clip_share(
    s: Settings, metrics: Mapping[str, float]
) -> tuple[float, tuple[str, ...]] | None:
    """The share the settings' loss (other than the clipped surrogate) clips, from its
    logged metrics (:data:`CLIP_METRICS`), and the metrics summed; None when it clips
    nothing."""
    names = CLIP_METRICS.get(metrics_key_of(s))
    if names is None:
        return None
    return sum(metrics.get(n, 0.0) for n in names), names


def metrics_key_of(s: Settings) -> str:
    """The key of ``_losses.LOSS_METRICS`` the settings' loss logs by: the loss, or for
    verl's bypass mode its ``loss_type``'s."""
    if s.loss == "verl/bypass_mode":
        return f"{s.loss}/{s.bypass_loss_type}"
    return s.loss


def needs_numpy(s: Settings) -> bool:
    """Whether the settings' loss or correction is folded in numpy (the compiled kernel
    computes the clipped surrogate only)."""
    return s.loss != "clip" or s.correction != "none" or s.entropy_mask


# A batch whose rejected tokens were removed (:meth:`TokenPartial.update` with
# :func:`rejects`) carries the correction's weights of its kept tokens as this field: the
# weights and the rejection are the whole batch's, computed before the tokens left
WEIGHT_FIELD = "_correction_weight"


def rejects(s: Settings) -> bool:
    """Whether the settings' correction removes tokens from the loss: verl's rejection
    sampling (``rollout_rs``), which replaces the batch's ``response_mask`` before the
    advantages and the update (verl 0.9.1 ``ray_trainer.fit`` →
    ``compute_rollout_correction_and_add_to_batch``)."""
    return s.correction == "verl-rollout" and s.rollout_rs is not None


def correction_of(
    s: Settings, fields: Mapping[str, NDArray[np.floating]], offsets: I64
) -> L.Correction | None:
    """The settings' correction of one batch (None: ``correction`` none).

    ``old_logp`` (``logp`` itself when not given: on-policy) against ``rollout_logp``:
    TRL 1.16.0's vLLM IS correction (:func:`grpo_cli._losses.trl_vllm_is_correction`),
    verl 0.9.1's rollout IS weights and rejection sampling
    (:func:`~grpo_cli._losses.verl_rollout_correction`), OpenRLHF 0.11.2's
    (:func:`~grpo_cli._losses.openrlhf_is_correction`). A batch that carries
    :data:`WEIGHT_FIELD` (its rejected tokens already removed) gets those weights, every
    token kept and no metrics (they were folded with the whole batch).

    Raises:
        InputError: a correction is set and the batch has no ``rollout_logp``.
    """
    if s.correction == "none":
        return None
    given = fields.get(WEIGHT_FIELD)
    if given is not None:
        w = np.asarray(given, dtype=np.float64)
        return L.Correction(weight=w, keep=np.ones(w.shape, dtype=bool), metrics={})
    rollout = fields.get("rollout_logp")
    if rollout is None:
        raise InputError(
            f"--correction {s.correction} needs the sampler's log-probs: the input has no "
            "rollout_logp column (--column rollout_logp=NAME)"
        )
    old = fields.get("old_logp", fields["logp"])
    if s.correction == "trl-vllm":
        return L.trl_vllm_is_correction(
            old, rollout, offsets, mode=s.vllm_is_mode, clip_max=s.vllm_is_clip_max,
            clip_min=s.vllm_is_clip_min,
        )  # fmt: skip
    if s.correction == "verl-rollout":
        return L.verl_rollout_correction(
            old, rollout, offsets, rollout_is=s.rollout_is,
            rollout_is_threshold=s.rollout_is_threshold,
            rollout_is_batch_normalize=s.rollout_is_batch_normalize, rollout_rs=s.rollout_rs,
            rollout_rs_threshold=s.rollout_rs_threshold,
        )  # fmt: skip
    return L.openrlhf_is_correction(
        old, rollout, offsets, level=s.is_correction_level, mode=s.is_correction_mode,
        gating=s.is_correction_gating, threshold=(s.is_correction_low, s.is_correction_high),
    )  # fmt: skip


def kept_stretch(keep: NDArray[np.bool_], offsets: I64) -> F64:
    """Per token, ``|o_i| / kept_i`` on the tokens a rejection keeps (``keep``), 0 on the
    others: what turns an answer's mean over all its tokens into its mean over its kept
    ones (verl takes a per-answer mean over the mask the rejection left)."""
    lengths = np.diff(offsets)
    kept = np.add.reduceat(keep.astype(np.float64), offsets[:-1]) if keep.size else keep
    per_answer = np.divide(lengths, kept, out=np.zeros(lengths.shape), where=kept > 0)
    out: F64 = np.repeat(per_answer, lengths) * keep
    return out


@dataclass(frozen=True)
class Bypass:
    """verl's bypass mode on one batch (:func:`bypass_of`): ``terms`` with the policy term
    and gradient as the fold aggregates them, ``kept``/``kept_offsets`` the terms of the
    tokens the rejection kept (the loss's metrics are theirs), and the correction."""

    terms: L.PolicyTerms
    kept: L.PolicyTerms
    kept_offsets: I64
    correction: L.Correction


def bypass_of(
    s: Settings, fields: Mapping[str, NDArray[np.floating]], adv: F64, offsets: I64
) -> Bypass:
    """verl 0.9.1's bypass mode (``algorithm.rollout_correction.bypass_mode``:
    ``apply_bypass_mode`` sets ``old_log_probs = rollout_log_probs`` and the loss to
    ``compute_policy_loss_bypass_mode``; :func:`grpo_cli._losses.verl_bypass_mode`) on one
    batch, as the actor's ``ppo_loss`` aggregates it: the policy loss over the tokens its
    rejection keeps, divided by the batch's tokens (``batch_num_tokens`` counts the
    unrejected mask) or rows, a seq-mean-token-mean by each answer's kept tokens; the KL
    loss over every token (its mask is not the rejection's). The fold's per-token term
    carries that: ``keep`` times, for an answer-mean ``s.agg``, ``|o_i| / kept_i``.

    Raises:
        InputError: the batch has no ``rollout_logp``.
    """
    rollout = fields.get("rollout_logp")
    if rollout is None:
        raise InputError(
            "--loss verl/bypass_mode needs the sampler's log-probs: the input has no "
            "rollout_logp column (--column rollout_logp=NAME)"
        )
    t, corr = L.verl_bypass_mode(
        fields["logp"], rollout, adv, offsets, loss_type=s.bypass_loss_type,
        clip_low=s.clip_eps, clip_high=s.eps_high,
        clip_ratio_c=3.0 if s.dual_clip is None else s.dual_clip, rollout_is=s.rollout_is,
        rollout_is_threshold=s.rollout_is_threshold,
        rollout_is_batch_normalize=s.rollout_is_batch_normalize, rollout_rs=s.rollout_rs,
        rollout_rs_threshold=s.rollout_rs_threshold,
    )  # fmt: skip
    keep = corr.keep
    if aggregation_rule(s.agg).answer_mean:
        factor = kept_stretch(keep, offsets)
    else:
        factor = keep.astype(np.float64)
    grad = None if t.grad is None else L._mul(t.grad, factor)
    terms = dataclasses.replace(t, term=L._mul(t.term, factor), grad=grad)
    off, _, _ = L.drop_tokens(keep, offsets)
    kept_terms = L.PolicyTerms(
        term=t.term[keep], grad=None if t.grad is None else t.grad[keep], ratio=t.ratio[keep],
        flags={k: v[keep] for k, v in t.flags.items()},
        values={k: v[keep] for k, v in t.values.items()},
    )  # fmt: skip
    return Bypass(terms=terms, kept=kept_terms, kept_offsets=off, correction=corr)


def entropy_mask_of(fields: Mapping[str, NDArray[np.floating]]) -> F64:
    """The batch's ``entropy_mask`` field as 0/1 weights of the policy term (TRL 1.16.0
    ``_compute_loss``: ``per_token_loss * entropy_mask`` before the IS ratio and the KL
    term; ``get_high_entropy_mask`` keeps the tokens at or above the entropy quantile).

    Raises:
        InputError: no ``entropy_mask`` field, or a value other than 0 and 1.
    """
    em = fields.get("entropy_mask")
    if em is None:
        raise InputError(
            "entropy_mask (TRL's top_entropy_quantile < 1) needs the recorded high-entropy "
            "mask: the input has no entropy_mask column (--column entropy_mask=NAME, or "
            "--loss-param entropy_mask=false to leave it out)"
        )
    w = np.asarray(em, dtype=np.float64)
    if not np.all((w == 0.0) | (w == 1.0)):
        bad = float(w[~((w == 0.0) | (w == 1.0))][0])
        raise InputError(f"entropy_mask holds {bad}: expected booleans or 0/1")
    return w


def policy_terms(
    s: Settings,
    fields: Mapping[str, NDArray[np.floating]],
    adv: F64,
    offsets: I64,
    correction: L.Correction | None,
) -> L.PolicyTerms:
    """The per-token policy terms of ``s.loss`` (not "clip") over one batch of whole
    answers, the correction applied the trainer's way: multiplying term and gradient
    (:func:`grpo_cli._losses.apply_correction`), except verl's geo_mean (the weights'
    geometric mean per answer, ``is_weight``) and TRL's vespo (the token ratio inside its
    weight, ``is_ratio``; the loss not multiplied). ``old_logp`` is ``logp`` when not given.

    The parameters (:class:`~grpo_cli._settings.Settings`): TRL's cispo caps ρ at
    ``clip_eps_high`` (``epsilon_high``), verl's clips it to ``[1 − clip_eps, 1 +
    clip_eps_high]`` with Δ clamped ±20; verl's dppo takes ``clip_eps``/``clip_eps_high``
    as its divergence thresholds and ``dual_clip`` (``clip_ratio_c``, 3.0 when off) as the
    ratio cap; clip_cov's random draw is taken in expectation (``selection="expected"``).
    """
    lp = fields["logp"]
    old = fields.get("old_logp", lp)
    loss = s.loss
    hi = s.eps_high
    if loss == "trl/cispo":
        t = L.cispo_terms(
            lp, old, adv, offsets, lower=None, upper=hi, log_ratio_clamp=s.log_ratio_clamp,
            ratio_level=s.ratio_level,
        )  # fmt: skip
    elif loss == "verl/cispo":
        t = L.cispo_terms(
            lp, old, adv, offsets, lower=1.0 - s.clip_eps, upper=1.0 + hi,
            log_ratio_clamp=_VERL_CLAMP,
        )  # fmt: skip
    elif loss in ("trl/sapo", "verl/sapo"):
        trl = loss == "trl/sapo"
        t = L.sapo_terms(
            lp, old, adv, offsets, tau_pos=s.sapo_temperature_pos,
            tau_neg=s.sapo_temperature_neg,
            log_ratio_clamp=s.log_ratio_clamp if trl else _VERL_CLAMP,
            ratio_level=s.ratio_level if trl else "token",
        )  # fmt: skip
    elif loss == "trl/luspo":
        t = L.luspo_terms(
            lp, old, adv, offsets, clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high,
            dual_clip=s.dual_clip, ratio_level=s.ratio_level, beta=0.0,
        )  # fmt: skip
    elif loss == "trl/vespo":
        is_ratio = None
        if correction is not None and s.correction == "trl-vllm":
            is_ratio = correction.weight
        t = L.vespo_terms(
            lp, old, adv, offsets, k_pos=s.vespo_k_pos, lambda_pos=s.vespo_lambda_pos,
            k_neg=s.vespo_k_neg, lambda_neg=s.vespo_lambda_neg, is_ratio=is_ratio,
        )  # fmt: skip
        return t
    elif loss in ("verl/dppo_tv", "verl/dppo_kl"):
        t = L.dppo_terms(
            lp, old, adv, offsets, divergence="tv" if loss.endswith("tv") else "kl",
            clip_low=s.clip_eps, clip_high=hi,
            ratio_cap=3.0 if s.dual_clip is None else s.dual_clip,
        )  # fmt: skip
    elif loss == "verl/gpg":
        t = L.gpg_terms(lp, adv, offsets)
    elif loss == "verl/clip_cov":
        t = L.clip_cov_terms(
            lp, old, adv, offsets, clip_low=s.clip_eps, clip_high=hi,
            clip_cov_ratio=s.clip_cov_ratio, clip_cov_lb=s.clip_cov_lb,
            clip_cov_ub=s.clip_cov_ub,
        )  # fmt: skip
    elif loss == "verl/kl_cov":
        t = L.kl_cov_terms(
            lp, old, adv, offsets, kl_cov_ratio=s.kl_cov_ratio, ppo_kl_coef=s.ppo_kl_coef
        )
    elif loss == "verl/geo_mean":
        w = None if correction is None else correction.weight
        return L.geo_mean_terms(
            lp, old, adv, offsets, clip_low=s.clip_eps, clip_high=hi, is_weight=w
        )
    elif loss == "verl/dro":
        assert s.dro_beta is not None  # Settings checks it
        t = L.dro_terms(lp, old, adv, offsets, beta=s.dro_beta)
    else:  # pragma: no cover - Settings admits only the losses above
        raise AssertionError(loss)
    return t if correction is None else L.apply_correction(t, correction)


# ------------------------------------------------------- per answer (``answers``)
@dataclass(frozen=True)
class AnswerView:
    """What ``answers`` ranks an answer by under the settings' loss (:func:`answer_view`):
    ``clipped`` ``(N,)`` the tokens the loss clips (its own clip metric's flags:
    :data:`CLIP_METRICS`; 0 for a loss that clips nothing), ``grad`` ``(T,)`` the policy
    term's derivative as the loss takes it (None: no closed form)."""

    clipped: NDArray[np.int64]
    grad: F64 | None
    kl_weight: F64 | None = None  # what the KL term's gradient is multiplied by (rejection)


def _flag_sums(s: Settings, t: L.PolicyTerms, offsets: I64) -> NDArray[np.int64]:
    """Per answer, the tokens its loss's clip metrics flag (:data:`CLIP_METRICS`)."""
    key = metrics_key_of(s)
    names = CLIP_METRICS.get(key, ())
    flags = [k for name, k, _ in L.LOSS_METRICS.get(key, ()) if name in names]
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
    answers under the settings' loss, correction and entropy mask, as the fold takes them
    (:class:`grpo_cli._partials.TokenPartial`): ``clip`` is the clipped surrogate's own
    (its per-answer clipped tokens and per-token gradient), used when the loss is "clip".
    A token verl's rejection sampling removes is neither clipped nor has a gradient; under
    an answer-mean aggregation an answer's gradient is scaled by its length over its kept
    tokens, as its mean is taken over them."""
    if s.loss == "verl/bypass_mode":
        bp = bypass_of(s, fields, adv, offsets)
        keep = bp.correction.keep
        t = dataclasses.replace(bp.terms, flags={k: v & keep for k, v in bp.terms.flags.items()})
        return AnswerView(_flag_sums(s, t, offsets), bp.terms.grad)
    corr = correction_of(s, fields, offsets)
    if corr is None or not rejects(s):
        return _view(s, fields, adv, offsets, clip, corr)
    n, keep = offsets.shape[0] - 1, corr.keep
    off, kept_fields, kept = L.drop_tokens(keep, offsets, *fields.values())
    sub = dict(zip(fields, kept_fields, strict=True))
    w = corr.weight[keep]
    a = adv[kept] if adv.shape == (n,) else adv[keep]
    clipped = np.zeros(n, dtype=np.int64)
    grad = None if clip[1] is None and s.loss == "clip" else np.zeros(keep.shape[0])
    if not kept.size:
        return AnswerView(clipped, grad)
    inner_clip = (_clip_kept(s, sub, a, off), None if clip[1] is None else clip[1][keep])
    kept_corr = L.Correction(weight=w, keep=np.ones(w.shape, dtype=bool), metrics={})
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
    corr: L.Correction | None,
) -> AnswerView:
    """:func:`answer_view` of tokens none of which a rejection removes."""
    if s.loss == "clip":
        clipped, g = clip
        if g is not None and corr is not None:
            g = L._mul(g, corr.weight)
    else:
        pt = policy_terms(s, fields, adv, offsets, corr)
        clipped, g = _flag_sums(s, pt, offsets), pt.grad
    if g is not None and s.entropy_mask:
        g = L._mul(g, entropy_mask_of(fields))
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


def _correction_kind(name: str, seq: bool) -> tuple[str, str]:
    """How a correction metric folds: its kind and its unit (tokens or answers)."""
    bare = name.removeprefix("rollout_corr/")
    if name.startswith("sampling/"):
        if name.endswith("/max"):
            return "max", ""
        if name.endswith("/min"):
            return "min", ""
        if "importance_sampling_ratio" in name and seq:
            return "mean", "answers"
        return "mean", "tokens"
    if name in ("vllm_kl", "is_filter_ratio"):
        return "mean", "answers" if (seq and name == "is_filter_ratio") else "tokens"
    if bare.startswith("rollout_rs_"):
        return _rejection_kind(bare.removeprefix("rollout_rs_"))
    if bare.endswith(("_max", "_max_deviation")):
        return "max", ""
    if bare.endswith("_min"):
        return "min", ""
    if bare.endswith(("_std", "eff_sample_size", "batch_norm_factor")):
        return "single", ""
    answers = ("seq_" in bare or "ppl" in bare or bare == "chi2_seq"
               or (seq and bare.startswith("rollout_is_ratio_fraction")))  # fmt: skip
    return "mean", "answers" if answers else "tokens"


def _rejection_kind(rest: str) -> tuple[str, str]:
    """How a ``rollout_rs_*`` metric of verl 0.9.1 ``compute_rs_metrics`` folds: per option
    ``<option>_mean`` and ``_masked_fraction`` are token means (a sequence option's value
    repeated on its tokens), ``_fraction_high``/``_low`` token means for a token option and
    answer means for a sequence one, ``_seq_*`` answer means, the spreads one batch's."""
    option = next((o for o in L.RS_OPTIONS if rest.startswith(o + "_")), None)
    if option is None:  # rollout_rs_masked_fraction, rollout_rs_seq_masked_fraction
        return "mean", "answers" if rest.startswith("seq_") else "tokens"
    stat = rest.removeprefix(option + "_")
    if stat.endswith("std"):
        return "single", ""
    if stat.endswith(("max", "max_deviation")):
        return "max", ""
    if stat.endswith("min"):
        return "min", ""
    if stat.startswith("seq_"):
        return "mean", "answers"
    if stat.startswith("fraction_"):
        return "mean", "tokens" if option.startswith("token") else "answers"
    return "mean", "tokens"


@dataclass
class LossMetrics:
    """The loss's and the correction's logged metrics as mergeable sums: a mean as (Σ,
    count), an extreme as itself, verl's IS spreads from sums of the weights and their
    squares; a statistic that does not merge (a batch-normalisation factor, the spreads
    of batch-normalised weights) is kept when one batch was folded, else left out with a
    note. ``batches`` counts the batches folded, ``gradient_missing`` whether a
    loss without a closed-form gradient was folded."""

    loss: str = "clip"
    correction: str = "none"
    entries: dict[str, Entry] = field(default_factory=dict)
    batches: int = 0
    answers: int = 0
    gradient_missing: bool = False
    seq_correction: bool = False  # the correction's unit is the answer
    # verl's IS weights: their upper bound (the std and ESS clamp to it), and whether they
    # are batch-normalised (then their spread is one batch's)
    is_upper: float | None = None
    batch_normalize: bool = False
    # Σ wc, Σ wc², T of the clamped weights, Σ s, Σ s², N of their answer means (verl's
    # rollout_is_std, _eff_sample_size, _seq_std from mergeable sums)
    spread: list[float] = field(default_factory=lambda: [0.0] * 6)
    # verl's rejection sampling (:func:`rejects`): the answers it removed whole, the tokens
    # it rejected, and the tokens and widest row of the batches it saw
    rejected_answers: int = 0
    rejected_tokens: int = 0
    seen_tokens: int = 0
    seen_width: int = 0

    @classmethod
    def of(cls, s: Settings) -> LossMetrics:
        seq = (
            (s.correction == "trl-vllm" and s.vllm_is_mode.startswith("sequence"))
            or (s.correction == "verl-rollout" and s.rollout_is == "sequence")
            or (s.correction == "openrlhf-is" and s.is_correction_level == "seq")
        )
        bypass = s.loss == "verl/bypass_mode"  # the loss's own correction, verl's rollout one
        if bypass:
            seq = s.rollout_is == "sequence"
        upper = None
        if (s.correction == "verl-rollout" or bypass) and s.rollout_is is not None:
            upper = L._is_threshold(s.rollout_is_threshold)[0]
        return cls(
            loss=metrics_key_of(s), correction="verl-rollout" if bypass else s.correction,
            seq_correction=seq, is_upper=upper, batch_normalize=s.rollout_is_batch_normalize,
        )  # fmt: skip

    def _add_spread(self, w: F64, offsets: I64) -> None:
        """verl 0.9.1 ``compute_is_metrics``' spreads as sums: ``rollout_is_std`` =
        ``sqrt(max(E[wc²] − E[wc]², 0))`` and ``_eff_sample_size`` = ``1 / E[(wc / (E[wc] +
        1e-8))²]`` with ``wc = clamp(w, 0, upper)`` and ``E`` = Σ / (T + 1e-8); ``_seq_std``
        the sample std of the answers' ``Σ_t w / (|o_i| + 1e-8)``."""
        assert self.is_upper is not None
        wc = np.clip(w, 0.0, self.is_upper)
        seq = np.add.reduceat(w, offsets[:-1]) / (np.diff(offsets) + _VERL_EPS)
        sums = (np.sum(wc), np.dot(wc, wc), w.shape[0], np.sum(seq), np.dot(seq, seq), seq.shape[0])
        for i, v in enumerate(sums):
            self.spread[i] += float(v)

    def _spread_values(self) -> dict[str, float]:
        s1, s2, t, q1, q2, n = self.spread
        out: dict[str, float] = {}
        m, m2 = s1 / (t + _VERL_EPS), s2 / (t + _VERL_EPS)
        p = "rollout_corr/rollout_is_"
        out[p + "std"] = math.sqrt(max(m2 - m * m, 0.0)) if t > 1 else 0.0
        out[p + "eff_sample_size"] = 1.0 / (m2 / (m + 1e-8) ** 2)
        var = (q2 - q1 * q1 / n) / (n - 1) if n > 1 else 0.0
        out[p + "seq_std"] = math.sqrt(max(var, 0.0))
        return out

    def _add(self, name: str, kind: str, value: float, count: float = 0.0) -> None:
        e = self.entries.get(name)
        if e is None:
            self.entries[name] = [kind, value, count]
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
        terms: L.PolicyTerms | None,
        correction: L.Correction | None,
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
            for name, (kind, value, count) in L.metric_sums(terms, offsets, self.loss).items():
                self._add(name, kind, value, count)
        if correction is not None:
            if self.is_upper is not None and not self.batch_normalize:
                self._add_spread(correction.weight, offsets)
            seq = self.seq_correction
            for name, value in correction.metrics.items():
                kind, per = _correction_kind(name, seq)
                if kind == "mean":
                    count = float(T if per == "tokens" else n)
                    if name.startswith("rollout_corr/") and per == "tokens":
                        # verl's Σx / (T + 1e-8): the sum back, the 1e-8 added once at the end
                        v = value + _SHIFT.get(name, 0.0)
                        self._add(name, "vmean", v * (count + _VERL_EPS), count)
                    else:
                        self._add(name, kind, value * count, count)
                else:
                    self._add(name, kind, value)

    def add_rejection(self, keep: NDArray[np.bool_], kept: I64, width: I64) -> None:
        """Count what a rejection removed from one batch: ``keep`` ``(T,)`` its tokens kept,
        ``kept`` the answers that keep one (:func:`grpo_cli._losses.drop_tokens`), ``width``
        every answer's row width."""
        self.rejected_answers += int(width.shape[0] - kept.shape[0])
        self.rejected_tokens += int(keep.shape[0] - np.count_nonzero(keep))
        self.seen_tokens += int(keep.shape[0])
        self.seen_width = max(self.seen_width, int(width.max()) if width.size else 0)

    def merge(self, o: LossMetrics) -> LossMetrics:
        for name, (kind, value, count) in o.entries.items():
            self._add(name, str(kind), float(value), float(count))  # type: ignore[arg-type]
        self.batches += o.batches
        self.answers += o.answers
        self.spread = [a + b for a, b in zip(self.spread, o.spread, strict=True)]
        self.gradient_missing = self.gradient_missing or o.gradient_missing
        self.rejected_answers += o.rejected_answers
        self.rejected_tokens += o.rejected_tokens
        self.seen_tokens += o.seen_tokens
        self.seen_width = max(self.seen_width, o.seen_width)
        return self

    def values(self) -> dict[str, float]:
        """Every metric by its logged name (a statistic of one batch only when one was)."""
        out: dict[str, float] = {}
        for name, (kind, value, count) in self.entries.items():
            if kind in ("mean", "vmean"):
                c = float(count) + (_VERL_EPS if kind == "vmean" else 0.0)  # type: ignore[arg-type]
                # no token (a rejection kept none): the trainers' masked means give 0
                out[name] = float(value) / c if c else 0.0  # type: ignore[arg-type]
                out[name] -= _SHIFT.get(name, 0.0)
            elif kind == "single":
                if self.batches == 1:
                    out[name] = float(value)  # type: ignore[arg-type]
            else:
                out[name] = float(value)  # type: ignore[arg-type]
        if self.spread[2]:  # verl's spreads, from sums: whatever the batches
            out.update({k: v for k, v in self._spread_values().items() if k in self.entries})
        return out

    def notes(self) -> list[str]:
        """What the reader should know of how these were folded."""
        out: list[str] = []
        k = self.batches
        if self.loss in L.BATCH_LOSSES and k > 1:
            out.append(
                f"{self.loss} selects tokens by a covariance over the batch its loss saw: "
                f"folded over each of grpo-cli's {k} batches; the numbers equal verl's when "
                "each batch is one of its micro-batches (one file or row group per "
                "micro-batch), else they differ"
            )
        kept = self._spread_values() if self.spread[2] else {}
        left = [n for n, e in self.entries.items() if e[0] == "single" and n not in kept]
        if left and k > 1:
            out.append(
                f"{', '.join(left)}: statistics of one batch that do not merge, left out "
                f"over {k} batches"
            )
        if self.correction == "verl-rollout" and self.batch_normalize and k > 1:
            out.append(
                "verl's rollout correction is computed over its whole training batch: the "
                f"weights' batch normalisation (if on) is each of grpo-cli's {k} batches'"
            )
        if self.gradient_missing:
            out.append(f"{self.loss} has no closed-form gradient here: the gradient is null")
        if self.loss.startswith("verl/bypass_mode"):
            share = self.values().get("rollout_corr/rollout_rs_masked_fraction")
            removed = "" if share is None else (
                f"; its rejection (rollout_rs) removed {share:.2%} of the tokens from the "
                "policy loss, which divides by every token (or row) all the same"
            )  # fmt: skip
            out.append(
                "verl's bypass mode: the sampler's log-probs are the old policy, the IS "
                f"weights and rejection its own (of logp against rollout_logp){removed}; the "
                "KL loss, the ratio and clip statistics and the counts are every token's; the "
                "other aggregations' J take the rejection as the settings' one does"
            )
        if self.seen_tokens:
            share = self.rejected_tokens / self.seen_tokens
            out.append(
                f"verl's rejection sampling (rollout_rs) removed {self.rejected_tokens:,} of "
                f"{self.seen_tokens:,} tokens ({share:.2%}) and {self.rejected_answers:,} "
                "answer(s) whole from the loss, as its modified response_mask: the loss, its "
                "metrics, the KL loss, the ratio and clip statistics and the token and answer "
                "counts are the kept tokens'; entropy, the sampler-vs-trainer statistics and "
                "the KL in the reward are every token's; a seq-mean divides by every row"
            )
        return out
