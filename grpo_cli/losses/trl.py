"""TRL's own policy losses, its vLLM importance-sampling correction and its policy-term
masks, each with its registry row (:mod:`grpo_cli.losses.registry`).

Mirrors TRL 1.16.0 ``GRPOTrainer._compute_loss`` (the ``loss_type`` branches,
``get_gamma_weights``, ``get_high_entropy_mask``, ``get_off_policy_mask``) and the vLLM
importance-sampling lines of ``_generate_and_score_completions``. TRL's ``grpo``, ``bnpo``,
``dr_grpo`` and ``dapo`` are the core's clipped surrogate (the row ``clip``). numpy only,
no I/O, no globals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..core import (
    RatioLevel,
    segment_mean,
    segment_sum,
    sequence_log_ratio,
    token_gradients,
    token_terms,
)
from ..errors import InputError, SettingError, UsageError
from .registry import (
    F64,
    I64,
    Correction,
    CorrectionRow,
    Loss,
    LossCall,
    Mask,
    Metric,
    Params,
    PolicyTerms,
    Spec,
    _answer_mean_repeated,
    _choice,
    _exp,
    _inputs,
    _log_ratio,
    _mul,
    _positive,
    _repeat,
    param,
)

__all__ = [
    "CORRECTIONS",
    "LOSSES",
    "MASKS",
    "cispo_terms",
    "luspo_terms",
    "off_policy_mask",
    "sapo_terms",
    "trl_vllm_is_correction",
    "vespo_terms",
]

TrlISMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def _ratio(used: F64, off: I64, level: RatioLevel) -> F64:
    """Token ratio ``exp(Δ')``, or the answer's ``exp(mean_t Δ)`` on each of its tokens."""
    _choice("ratio_level", level, ("token", "sequence"))
    return _exp(used if level == "token" else sequence_log_ratio(used, off))


# ================================================================== policy losses
def cispo_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    lower: float | None = None,
    upper: float | None = 5.0,
    log_ratio_clamp: float | None = None,
    ratio_level: RatioLevel = "token",
) -> PolicyTerms:
    """CISPO: the clipped importance weight, detached, times ``A·logp``.

    ``term = sg(w)·A·logp``, ``w = clip(ρ, lower, upper)``, ``ρ = exp(Δ')``; ``grad = w·A``.

    See MiniMax-M1 (MiniMax 2025, arXiv:2506.13585) eq. 4; ScaleRL (arXiv:2510.13786).
    Mirrors TRL 1.16.0 ``GRPOTrainer._compute_loss`` (``loss_type="cispo"``) and verl
    0.9.1 ``core_algos.compute_policy_loss_cispo``, which bound the weight differently:

    - TRL: ``lower=None, upper=epsilon_high`` (an absolute cap on ρ, not ``1+ε``; its default
      ``epsilon_high = epsilon = 0.2`` caps ρ at 0.2: set it, ScaleRL uses 5.0), no clamp,
      ``ratio_level=importance_sampling_level``; aggregated as ``dapo`` (token sum over
      ``num_items_in_batch``: ``token-mean`` of the generation batch). Logs
      ``cispo_clip_ratio`` = share of tokens (answers at sequence level) with ``ρ > upper``
      and ``A > 0`` (``flags["trl_clipped"]``).
    - verl: ``lower=1−clip_ratio_low, upper=1+clip_ratio_high, log_ratio_clamp=20``;
      ``loss_agg_mode``. Logs ``actor/pg_clipfrac`` = share of tokens with ``ρ ≠ w``
      (``flags["clipped"]``), ``actor/ppo_kl`` = mean of ``−Δ'`` (``values["ppo_kl"]``),
      ``actor/pg_clipfrac_lower`` = 0.

    Folds: per token (per answer at sequence level).

    Args:
        logp, old_logp: ``(T,)`` log-probs (any float dtype; float64 results).
        adv: ``(N,)`` or ``(T,)`` advantages.
        offsets: ``(N+1,)``.

    Example:
        >>> t = cispo_terms([-1.0, -0.5], [-1.0, -2.0], [1.0], [0, 2], upper=2.0)
        >>> t.term.tolist(), t.weight.tolist()
        ([-1.0, -1.0], [1.0, 2.0])
    """
    off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    lp = x["logp"]
    if lower is not None and upper is not None and lower > upper:
        raise UsageError(f"lower ({lower}) must not exceed upper ({upper})")
    _delta, used = _log_ratio(lp, x["old_logp"], log_ratio_clamp)
    rho = _ratio(used, off, ratio_level)
    w = np.clip(rho, lower, upper) if (lower is not None or upper is not None) else rho
    below = rho < lower if lower is not None else np.zeros(rho.shape, bool)
    above = rho > upper if upper is not None else np.zeros(rho.shape, bool)
    wa = _mul(w, a)
    return PolicyTerms(
        term=_mul(wa, lp),
        grad=wa,
        ratio=rho,
        weight=w,
        flags={"below": below, "above": above, "clipped": below | above,
               "trl_clipped": above & (a > 0)},
        values={"ppo_kl": -used},
        level=ratio_level,
    )  # fmt: skip


def sapo_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clamp: float | None = None,
    ratio_level: RatioLevel = "token",
    trainer_agg: bool = True,
) -> PolicyTerms:
    """SAPO: a soft, temperature-controlled gate in place of the clip.

    ``term = f(ρ)·A``, ``f(ρ) = σ(τ(ρ − 1))·4/τ``, ``τ = tau_pos`` if ``A > 0`` else
    ``tau_neg``; ``grad = 4A·σ(x)(1−σ(x))·ρ`` with ``x = τ(ρ−1)`` (0 where the clamp binds;
    at sequence level the answer's mean of it, every token sharing ``s_i``).

    See Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347) eq. 5.
    Mirrors TRL 1.16.0 ``GRPOTrainer._compute_loss`` (``loss_type="sapo"``:
    ``sapo_temperature_pos``/``_neg`` → ``tau_pos``/``tau_neg``, no clamp,
    ``ratio_level=importance_sampling_level``, aggregated as ``grpo``:
    seq-mean-token-mean; logs no clip metric) and verl 0.9.1
    ``compute_policy_loss_sapo`` (``actor.tau_pos``/``tau_neg``, ``log_ratio_clamp=20``,
    always ``seq-mean-token-mean`` whatever ``loss_agg_mode``; logs ``actor/pg_clipfrac`` =
    ``actor/pg_clipfrac_lower`` = 0 and ``actor/ppo_kl`` = mean ``−Δ'``). ``agg`` is
    ``seq-mean-token-mean`` (``trainer_agg=False``: None). The gate is ``weight``.

    Folds: per token (per answer at sequence level).

    Example:
        >>> t = sapo_terms([-1.0], [-1.0], [2.0], [0, 1])
        >>> t.term.tolist(), t.grad.tolist()  # at ρ = 1: f = 2/τ, f' = 1
        ([4.0], [2.0])
    """
    off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    _positive("tau_pos", tau_pos)
    _positive("tau_neg", tau_neg)
    delta, used = _log_ratio(x["logp"], x["old_logp"], log_ratio_clamp)
    if ratio_level == "sequence":
        log_rho = sequence_log_ratio(used, off)
    else:
        _choice("ratio_level", ratio_level, ("token", "sequence"))
        log_rho = used
    rho = _exp(log_rho)
    tau = np.array([tau_neg, tau_pos])[(a > 0).view(np.int8)]
    with np.errstate(over="ignore", invalid="ignore"):
        xs = tau * (rho - 1.0)
        # one exponential for both: z = e^{-|x|}, p = 1/(1+z); σ(|x|) = p, σ(−|x|) = z·p,
        # so σ(x) is p or z·p by the sign of x, and σ(x)(1−σ(x)) = z·p² whatever the sign
        z = _exp(-np.abs(xs))
        p = 1.0 / (1.0 + z)
        zp = z * p
        gate = np.where(xs >= 0, p, zp) * (4.0 / tau)
        # σ'·ρ: z underflows to 0 before ρ overflows (x = τ(ρ−1)); ρ = inf gives NaN: 0
        dgate = 4.0 * (zp * p) * rho
    dgate[np.isnan(dgate)] = 0.0
    d = _mul(dgate, a)
    if ratio_level == "sequence":
        grad = _answer_mean_repeated(d, off)
        if log_ratio_clamp is not None:  # ∂s/∂logp_t = s/|o|·[|Δ_t| ≤ c]: per token
            grad = np.where(np.abs(delta) <= log_ratio_clamp, grad, 0.0)
    else:
        grad = d if log_ratio_clamp is None else np.where(np.abs(delta) <= log_ratio_clamp, d, 0.0)
    return PolicyTerms(
        term=_mul(gate, a),
        grad=grad,
        ratio=rho,
        weight=gate,
        values={"ppo_kl": -used},
        level=ratio_level,
        agg="seq-mean-token-mean" if trainer_agg else None,
    )


def luspo_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    ref_logp: ArrayLike | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: RatioLevel = "sequence",
    beta: float = 0.0,
    kl_bias_correction: bool = True,
) -> PolicyTerms:
    """LUSPO: GSPO's clipped sequence-ratio surrogate, each answer scaled by its length.

    ``J = (1/N) Σ_i Σ_{t∈i} term_t`` (``agg = "seq-mean-token-sum"``) with ``term`` the
    core's clipped surrogate (and ``−β·KL``): GSPO's ``seq-mean-token-mean`` times
    ``|o_i|`` per answer. ``grad`` is the core's (:func:`grpo_cli.core.token_gradients`).

    See LUSPO (arXiv:2602.05261); GSPO (Zheng et al. 2025, arXiv:2507.18071). Mirrors TRL
    1.16.0 ``GRPOTrainer._compute_loss`` (``loss_type="luspo"``: ``(per_token_loss ·
    mask).sum(-1).mean()``; ``epsilon``/``epsilon_high`` → ``clip_eps``/``clip_eps_high``,
    ``delta`` → ``dual_clip``, ``importance_sampling_level`` → ``ratio_level`` (TRL warns
    unless ``"sequence"``), ``beta``, ``use_bias_correction_kl`` → ``kl_bias_correction``).
    Logs TRL's ``clip_ratio/*`` as for ``grpo`` (flags ``low``, ``high``; at sequence level
    shares of answers).

    Folds: per answer (the sequence ratio needs the answer's mean Δ), like GSPO.

    Example:
        >>> t = luspo_terms([-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [1.0, -1.0], [0, 1, 3])
        >>> t.term.tolist(), t.agg
        ([1.0, -1.0, -1.0], 'seq-mean-token-sum')
    """
    off, a_tok, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp, ref_logp=ref_logp)
    assert a_tok is not None
    lp, old = x["logp"], x["old_logp"]
    ref = x.get("ref_logp")
    tt = token_terms(
        lp, old, ref, a_tok, off, clip_eps=clip_eps, clip_eps_high=clip_eps_high,
        dual_clip=dual_clip, ratio_level=ratio_level, beta=beta,
        kl_bias_correction=kl_bias_correction,
    )  # fmt: skip
    gp, gk = token_gradients(
        tt, offsets=off, clip_eps=clip_eps, clip_eps_high=clip_eps_high, dual_clip=dual_clip,
        ratio_level=ratio_level, beta=beta, kl_bias_correction=kl_bias_correction,
    )  # fmt: skip
    grad = gp if gk is None or beta == 0.0 else gp - beta * gk
    high = clip_eps if clip_eps_high is None else clip_eps_high
    low_f = (tt.ratio < 1.0 - clip_eps) & (a_tok < 0)
    high_f = (tt.ratio > 1.0 + high) & (a_tok > 0)
    return PolicyTerms(
        term=tt.term,
        grad=grad,
        ratio=tt.ratio,
        flags={"low": low_f, "high": high_f, "region": low_f | high_f},
        level=ratio_level,
        agg="seq-mean-token-sum",
    )


def vespo_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    is_ratio: ArrayLike | None = None,
) -> PolicyTerms:
    """VESPO: a detached Gamma-shaped weight of the sequence ratio times ``A·logp``.

    ``term = sg(φ_i)·A·logp``, ``φ(w) = exp(λ + k·log w − λ·w)`` (so ``φ(1) = 1``),
    ``log w_i = clamp(Σ_t clamp(Δ_t, ±20) + Σ_t clamp(log is_t, log 1e-8, 20), log 1e-8,
    20)`` (a *sum*, not GSPO's mean), ``(k, λ) = (k_pos, λ_pos)`` if ``A ≥ 0`` else
    ``(k_neg, λ_neg)``, λ at least 1e-4; a φ that is not finite is 0; ``grad = φ·A``.

    See VESPO (arXiv:2602.10693). Mirrors TRL 1.16.0 ``GRPOTrainer.get_gamma_weights`` and
    ``_compute_loss`` (``loss_type="vespo"``; ``vespo_k_pos``, ``vespo_lambda_pos``,
    ``vespo_k_neg``, ``vespo_lambda_neg`` → the same names without the prefix). With vLLM
    and ``vllm_importance_sampling_correction`` TRL passes its token-level IS ratio
    (``token_truncate``/``token_mask`` only) as ``is_ratio`` and does *not* multiply the
    loss by it. Aggregated as ``dapo`` (token sum over ``num_items_in_batch``). Logs
    ``vespo/phi_seq_mean`` = mean of φ over answers (``answer_values["phi"]``). TRL sums
    ``log is`` over padding too (ratio 1 there, so 0, unless a mask bound excludes 1).

    Folds: per answer (``w_i`` needs the answer's sum of Δ).

    Example:
        >>> t = vespo_terms([-1.0, -2.0], [-1.0, -2.0], [0.5], [0, 2])
        >>> t.answer_values["phi"].tolist(), t.term.tolist()
        ([1.0], [-0.5, -1.0])
    """
    off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp, is_ratio=is_ratio)
    assert a is not None
    lp = x["logp"]
    low = math.log(1e-8)
    delta, _ = _log_ratio(lp, x["old_logp"], None)
    s = segment_sum(np.clip(delta, -20.0, 20.0), off)
    if "is_ratio" in x:
        if (x["is_ratio"] < 0).any():
            raise InputError("is_ratio: importance ratios must be >= 0")
        with np.errstate(divide="ignore"):
            s = s + segment_sum(np.clip(np.log(x["is_ratio"]), low, 20.0), off)
    log_w = _repeat(np.clip(s, low, 20.0), off)
    nonneg = a >= 0
    k = np.where(nonneg, k_pos, k_neg)
    lam = np.maximum(np.where(nonneg, lambda_pos, lambda_neg), 1e-4)
    with np.errstate(over="ignore", invalid="ignore"):
        phi = _exp(lam + k * log_w - lam * _exp(log_w))
    phi = np.where(np.isfinite(phi), phi, 0.0)
    pa = _mul(phi, a)
    return PolicyTerms(
        term=_mul(pa, lp),
        grad=pa,
        ratio=_exp(log_w),
        weight=phi,
        answer_values={"phi": phi[off[:-1]]},
        level="sequence",
    )


# ===================================================================== correction
def trl_vllm_is_correction(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    offsets: ArrayLike,
    *,
    mode: TrlISMode = "sequence_mask",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> Correction:
    """TRL's vLLM importance-sampling correction of the sampler–trainer mismatch.

    ``d_t = old_logp − rollout_logp`` (0 where the sampler gave NaN); ``ρ = exp(d_t)``
    (``token_*``) or ``exp(Σ_t d_t)`` on each token of the answer (``sequence_*``);
    ``*_truncate``: ``w = clip(ρ, C_min, C_max)``; ``*_mask``: ``w = ρ`` inside
    ``[C_min, C_max]`` (a missing bound is open), else 0. ``keep`` is all True (a masked
    weight is 0, the token stays in the counts).

    Mirrors TRL 1.16.0 ``GRPOTrainer._generate_and_score_completions`` (the ratio) and
    ``_compute_loss`` (``per_token_loss * importance_sampling_ratio`` before the KL term is
    added; not for ``vespo``, which takes the token-level ratio as ``is_ratio``). Config:
    ``use_vllm=True`` and ``vllm_importance_sampling_correction=True`` (default) select it;
    ``vllm_importance_sampling_mode`` → ``mode``, ``vllm_importance_sampling_clip_max``
    (deprecated alias ``vllm_importance_sampling_cap``) → ``clip_max``,
    ``vllm_importance_sampling_clip_min`` → ``clip_min``. See "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training" (Yao et al. 2025,
    https://fengyao.notion.site/off-policy-rl). Metrics (one process):

    - ``sampling/sampling_logp_difference/mean``, ``/max``: mean and max of ``|old_logp −
      rollout_logp|`` over tokens whose rollout log-prob is not NaN;
    - ``sampling/importance_sampling_ratio/min``, ``/mean``, ``/max``: of ``w`` over tokens
      (``token_*``) or over answers (``sequence_*``).

    Scope: the generation batch of one process; per token or per answer (folds).

    Example:
        >>> c = trl_vllm_is_correction([-1.0, -1.0], [-1.5, -2.0], [0, 2], clip_max=3.0)
        >>> c.weight.tolist()  # exp(1.5) = 4.48 > 3: the answer is masked
        [0.0, 0.0]
    """
    off, _, x = _inputs(offsets, None, old_logp=old_logp, rollout_logp=rollout_logp)
    _choice("mode", mode, ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"))
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise UsageError(f"clip_min ({clip_min}) must be less than clip_max ({clip_max})")
    if mode.endswith("truncate") and clip_min is None and clip_max is None:
        raise UsageError(f"mode {mode}: set clip_min or clip_max")
    old, roll = x["old_logp"], x["rollout_logp"]
    with np.errstate(over="ignore", invalid="ignore"):
        d = old - roll
    absd = np.abs(d)
    d = np.where(np.isnan(d), 0.0, d)
    seq = mode.startswith("sequence")
    log_rho = segment_sum(d, off) if seq else d
    rho = _exp(log_rho)
    if mode.endswith("truncate"):
        w = np.clip(rho, clip_min, clip_max)
    else:
        lo = -math.inf if clip_min is None else clip_min
        hi = math.inf if clip_max is None else clip_max
        w = np.where((rho < lo) | (rho > hi), 0.0, rho)
    seen = absd[~np.isnan(absd)]
    metrics = {
        "sampling/sampling_logp_difference/mean": float(seen.mean()) if seen.size else 0.0,
        "sampling/sampling_logp_difference/max": float(seen.max()) if seen.size else 0.0,
        "sampling/importance_sampling_ratio/min": float(w.min()) if w.size else 0.0,
        "sampling/importance_sampling_ratio/mean": float(w.mean()) if w.size else 0.0,
        "sampling/importance_sampling_ratio/max": float(w.max()) if w.size else 0.0,
    }
    weight = _repeat(w, off) if seq else w
    before = {  # the same statistics of ρ before its truncation or mask
        "sampling/importance_sampling_ratio/min": float(rho.min()),
        "sampling/importance_sampling_ratio/mean": float(rho.mean()),
        "sampling/importance_sampling_ratio/max": float(rho.max()),
    } if rho.size else {}  # fmt: skip
    return Correction(
        weight=weight, keep=np.ones(weight.shape, dtype=bool), metrics=metrics, before=before
    )


# ===================================================================== policy masks
def off_policy_mask(
    logp: ArrayLike,
    sampling_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    threshold: float,
) -> F64:
    """DeepSeek-V3.2's off-policy sequence mask: an answer with a negative advantage whose
    policy drifted from the sampler is left out of the policy loss.

    ``keep_t = (A_t ≥ 0) ∨ (mean_{t'∈i} (sampling_logp − logp) ≤ δ)`` for ``t`` in answer
    ``i`` (a NaN sampler log-prob counts 0), as 0/1 ``(T,)`` weights of the policy term;
    the mask is detached (its gradient is 0).

    See DeepSeek-V3.2 (DeepSeek-AI 2025, arXiv:2512.02556) eq. 9. Mirrors TRL 1.16.0
    ``GRPOTrainer.get_off_policy_mask`` (``off_policy_mask_threshold`` → ``threshold``;
    ``sampling_per_token_logps`` with vLLM, else ``old_per_token_logps``, → ``sampling_logp``),
    multiplied into the per-token loss of every ``loss_type`` before the entropy mask, the
    vLLM IS ratio and the KL term; TRL logs no metric for it.

    Folds: per answer.

    Example:
        >>> off_policy_mask([-1.0, -3.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0],
        ...                 [0, 2, 3], threshold=0.5).tolist()  # answer 0 drifted by 1.0
        [0.0, 0.0, 1.0]
    """
    off, a, x = _inputs(offsets, adv, logp=logp, sampling_logp=sampling_logp)
    assert a is not None
    if not math.isfinite(threshold):
        raise UsageError(f"threshold: must be a finite number, got {threshold}")
    with np.errstate(over="ignore", invalid="ignore"):
        kl = x["sampling_logp"] - x["logp"]
    kl = np.nan_to_num(kl, nan=0.0)
    with np.errstate(invalid="ignore"):
        low_kl = np.repeat(segment_mean(kl, off) <= threshold, np.diff(off))
    out: F64 = ((a >= 0) | low_kl).astype(np.float64)
    return out


def entropy_mask_of(c: LossCall) -> F64:
    """The batch's recorded ``entropy_mask`` field as 0/1 weights of the policy term (TRL
    1.16.0 ``_compute_loss``: ``per_token_loss * entropy_mask`` before the IS ratio and the
    KL term; ``get_high_entropy_mask`` keeps the tokens at or above the entropy quantile).

    Raises:
        InputError: no ``entropy_mask`` field, or a value other than 0 and 1.
    """
    em = c.fields.get("entropy_mask")
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


# ======================================================== parameters and their rows
def _positive_spec(help: str) -> Spec:
    return Spec(low=0.0, help=help)


def _bound_spec(help: str) -> Spec:
    return Spec(low=0.0, optional=True, help=help)


@dataclass(frozen=True)
class SapoParams(Params):
    sapo_temperature_pos: float = param(1.0, _positive_spec("τ of SAPO's gate where A > 0"))
    sapo_temperature_neg: float = param(1.05, _positive_spec("τ of SAPO's gate where A < 0"))


@dataclass(frozen=True)
class VespoParams(Params):
    vespo_k_pos: float = param(2.0, _positive_spec("k of VESPO's Gamma weight where A > 0"))
    vespo_lambda_pos: float = param(3.0, _positive_spec("λ of VESPO's weight where A > 0"))
    vespo_k_neg: float = param(3.0, _positive_spec("k of VESPO's weight where A < 0"))
    vespo_lambda_neg: float = param(2.0, _positive_spec("λ of VESPO's weight where A < 0"))


@dataclass(frozen=True)
class VllmISParams(Params):
    vllm_is_mode: str = param(
        "sequence_mask",
        Spec(
            "choice",
            "TRL's vllm_importance_sampling_mode",
            choices=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
        ),
    )
    vllm_is_clip_max: float | None = param(3.0, _bound_spec("C_max (off: no upper bound)"))
    vllm_is_clip_min: float | None = param(None, _bound_spec("C_min (off: no lower bound)"))

    def check(self) -> None:
        lo, hi = self.vllm_is_clip_min, self.vllm_is_clip_max
        if lo is not None and hi is not None and lo >= hi:
            raise SettingError(
                "vllm_is_clip_min", f"must be below vllm_is_clip_max ({hi}), got {lo}"
            )
        if self.vllm_is_mode.endswith("truncate") and lo is None and hi is None:
            raise SettingError(
                "vllm_is_mode", f"{self.vllm_is_mode} needs vllm_is_clip_max or _min"
            )


@dataclass(frozen=True)
class EntropyMaskParams(Params):
    entropy_mask: bool = param(
        False,
        Spec(
            "bool",
            "the policy term only where the recorded entropy_mask field is 1 (TRL's "
            "top_entropy_quantile < 1)",
        ),
    )


@dataclass(frozen=True)
class OffPolicyMaskParams(Params):
    off_policy_mask_threshold: float | None = param(
        None,
        Spec(
            "number",
            "δ of DeepSeek-V3.2's off-policy sequence mask (TRL 1.16 "
            "off_policy_mask_threshold; off: no mask)",
            optional=True,
        ),
    )


def _cispo(c: LossCall) -> PolicyTerms:
    return cispo_terms(
        c.logp, c.old, c.adv, c.offsets, lower=None, upper=c.clip_high,
        log_ratio_clamp=c.log_ratio_clamp, ratio_level=c.ratio_level,
    )  # fmt: skip


def _sapo(c: LossCall) -> PolicyTerms:
    p = c.params
    assert isinstance(p, SapoParams)
    return sapo_terms(
        c.logp, c.old, c.adv, c.offsets, tau_pos=p.sapo_temperature_pos,
        tau_neg=p.sapo_temperature_neg, log_ratio_clamp=c.log_ratio_clamp,
        ratio_level=c.ratio_level,
    )  # fmt: skip


def _luspo(c: LossCall) -> PolicyTerms:
    return luspo_terms(
        c.logp, c.old, c.adv, c.offsets, clip_eps=c.clip_low, clip_eps_high=c.clip_high,
        dual_clip=c.dual_clip, ratio_level=c.ratio_level, beta=0.0,
    )  # fmt: skip


def _vespo(c: LossCall) -> PolicyTerms:
    p = c.params
    assert isinstance(p, VespoParams)
    is_ratio = None
    if c.correction is not None and c.correction_name == "trl-vllm":
        is_ratio = c.correction.weight
    return vespo_terms(
        c.logp, c.old, c.adv, c.offsets, k_pos=p.vespo_k_pos, lambda_pos=p.vespo_lambda_pos,
        k_neg=p.vespo_k_neg, lambda_neg=p.vespo_lambda_neg, is_ratio=is_ratio,
    )  # fmt: skip


LOSSES = (
    Loss(
        "trl/cispo", _cispo,
        "CISPO (the capped ratio, detached, times A·logp)",
        metrics=(Metric("cispo_clip_ratio", "trl_clipped", "level",
                        "tokens (answers at sequence level) with ρ above the cap and A > 0"),),
        clip=("cispo_clip_ratio",),
    ),
    Loss(
        "trl/sapo", _sapo,
        "SAPO (a soft temperature gate in place of the clip)",
        params=SapoParams, agg="seq-mean-token-mean",
    ),
    Loss(
        "trl/luspo", _luspo,
        "LUSPO (GSPO's clipped surrogate scaled by each answer's length)",
        agg="seq-mean-token-sum",
        metrics=(
            Metric("clip_ratio/low_mean", "low", "level", "ρ < 1−ε_low with A < 0"),
            Metric("clip_ratio/low_min", "low", "answer_min", "smallest answer share of low"),
            Metric("clip_ratio/high_mean", "high", "level", "ρ > 1+ε_high with A > 0"),
            Metric("clip_ratio/high_max", "high", "answer_max", "largest answer share of high"),
            Metric("clip_ratio/region_mean", "region", "level", "low or high"),
        ),
        clip="core",
    ),
    Loss(
        "trl/vespo", _vespo,
        "VESPO (a detached Gamma weight of the sequence ratio times A·logp)",
        params=VespoParams, correction="inside",
        metrics=(Metric("vespo/phi_seq_mean", "phi", "answers", "mean over answers of φ"),),
    ),
)  # fmt: skip


def _vllm_is(old: F64, rollout: F64, offsets: I64, p: Params) -> Correction:
    assert isinstance(p, VllmISParams)
    return trl_vllm_is_correction(
        old, rollout, offsets, mode=p.vllm_is_mode,  # type: ignore[arg-type]
        clip_max=p.vllm_is_clip_max, clip_min=p.vllm_is_clip_min,
    )  # fmt: skip


def _sampling_kind(name: str, seq: bool) -> tuple[str, str]:
    """How a ``sampling/*`` metric folds: extremes as themselves, the IS ratio's mean over
    answers with a sequence mode, every other mean over tokens."""
    if name.endswith("/max"):
        return "max", ""
    if name.endswith("/min"):
        return "min", ""
    if "importance_sampling_ratio" in name and seq:
        return "mean", "answers"
    return "mean", "tokens"


def _vllm_excludes(p: Params, level: RatioLevel, loss: str) -> tuple[str, str] | None:
    assert isinstance(p, VllmISParams)
    if loss == "trl/vespo" and p.vllm_is_mode.startswith("seq"):
        return (
            "vllm_is_mode",
            "trl/vespo takes TRL's token-level ratio only (token_truncate, token_mask)",
        )
    return None


CORRECTIONS = (
    CorrectionRow(
        "trl-vllm", "trl", _vllm_is,
        "TRL's vLLM importance-sampling correction",
        params=VllmISParams,
        per_answer=lambda p: str(getattr(p, "vllm_is_mode", "")).startswith("sequence"),
        metric_kind=_sampling_kind,
        excludes=_vllm_excludes,
    ),
)  # fmt: skip


def _off_policy_weight(c: LossCall) -> F64:
    p = c.params
    assert isinstance(p, OffPolicyMaskParams) and p.off_policy_mask_threshold is not None
    sampling = c.fields.get("rollout_logp", c.old)
    return off_policy_mask(
        c.logp, sampling, c.adv, c.offsets, threshold=p.off_policy_mask_threshold
    )


MASKS = (
    Mask(
        "trl/top_entropy_mask", EntropyMaskParams,
        on=lambda p: bool(getattr(p, "entropy_mask", False)),
        weight=entropy_mask_of,
        words="TRL's high-entropy mask (the policy term only on the recorded entropy_mask tokens)",
        needs=("entropy_mask",), entropy_bonus=True,
    ),
    Mask(
        "trl/off_policy_mask", OffPolicyMaskParams,
        on=lambda p: getattr(p, "off_policy_mask_threshold", None) is not None,
        weight=_off_policy_weight,
        words="DeepSeek-V3.2's off-policy sequence mask (answers with A < 0 whose mean "
        "sampler-minus-policy log-prob exceeds δ leave the policy term)",
    ),
)  # fmt: skip
