"""verl's own policy losses and its rollout correction (IS weights and rejection
sampling), each with its registry row (:mod:`grpo_cli.losses.registry`).

Mirrors verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` (the ``register_policy_loss``
registry: ``compute_policy_loss_*``) and ``verl/trainer/ppo/rollout_corr_helper.py``.
verl's ``vanilla`` and ``gspo`` are the core's clipped surrogate (the row ``clip``). numpy
only, no I/O, no globals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..core import clipped_surrogate, segment_count, segment_sum, token_gradients, token_terms
from ..errors import InputError, SettingError, UsageError
from .registry import (
    F64,
    I64,
    Bools,
    Correction,
    CorrectionRow,
    Loss,
    LossCall,
    Metric,
    OwnCorrection,
    Params,
    PolicyTerms,
    Spec,
    _choice,
    _exp,
    _inputs,
    _log_ratio,
    _mul,
    _positive,
    _repeat,
    _verl_mean,
    _verl_seq_mean,
    drop_tokens,
    kept_stretch,
    param,
)
from .trl import SapoParams, cispo_terms, sapo_terms

__all__ = [
    "CORRECTIONS",
    "LOSSES",
    "RS_OPTIONS",
    "clip_cov_terms",
    "dppo_terms",
    "dro_terms",
    "geo_mean_terms",
    "gpg_terms",
    "kl_cov_terms",
    "rejection_options",
    "verl_bypass_mode",
    "verl_rollout_correction",
]

Divergence = Literal["tv", "kl"]
Selection = Literal["expected", "order"]
VerlISLevel = Literal["token", "sequence"]
BypassLoss = Literal["ppo_clip", "reinforce"]

# verl 0.9.1 rollout_corr_helper.SAFETY_BOUND: log-ratios are clamped to ±20 before exp
SAFETY_BOUND = 20.0
# the verl cispo, sapo and dppo log-ratio clamp (rollout_corr_helper.SAFETY_BOUND, and the
# losses' own ±20)
VERL_CLAMP = 20.0


# ================================================================== policy losses
def dppo_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    divergence: Divergence = "tv",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_cap: float = 3.0,
    log_ratio_clamp: float = 20.0,
) -> PolicyTerms:
    """DPPO-Binary: a truncated, detached IS weight on ``A·logp``, masked where the
    probability moved beyond a divergence threshold in the advantage's direction.

    ``term = A·sg(min(ρ, c))·logp·valid``, ``ρ = exp(clamp(Δ, ±20))``; ``grad = A·min(ρ,
    c)·valid``. With ``p = e^logp``, ``q = e^old_logp``:

    - ``"tv"``: valid ⇔ ``p − q ≤ δ_high`` (A > 0), ``p − q ≥ −δ_low`` (A ≤ 0);
    - ``"kl"``: ``D = q·(log q − log p) + (1−q)·log((1−q+1e-8)/(1−p+1e-8))``; valid ⇔
      ``D ≤ δ_high or p ≤ q`` (A > 0), ``D ≤ δ_low or p ≥ q`` (A ≤ 0).

    See DPPO (arXiv:2602.04879) and its §5.4 (truncation). Mirrors verl 0.9.1
    ``compute_policy_loss_dppo_tv`` / ``_dppo_kl`` (``policy_loss.loss_mode`` ``dppo_tv``
    / ``dppo_kl`` → ``divergence``; ``clip_ratio_low``/``_high`` (the divergence
    thresholds) → ``clip_low``/``clip_high``; ``clip_ratio_c`` → ``ratio_cap``: the code's
    fallback is 20 but ``ActorConfig.clip_ratio_c`` defaults to 3.0, so 3.0 applies unless
    set). ``loss_agg_mode``. Logs ``actor/pg_clipfrac`` = share of tokens not valid
    (``flags["invalid"]``), ``actor/pg_clipfrac_lower`` = share valid with ``ρ > c``
    (``flags["truncated"]``), ``actor/ppo_kl`` = mean ``−Δ'``.

    Folds: per token.

    Example:
        >>> t = dppo_terms(np.log([0.5, 0.9]), np.log([0.5, 0.5]), [1.0], [0, 2])
        >>> t.flags["invalid"].tolist(), t.grad.tolist()
        ([False, True], [1.0, 0.0])
    """
    _off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    _choice("divergence", divergence, ("tv", "kl"))
    _positive("ratio_cap", ratio_cap)
    lp, old = x["logp"], x["old_logp"]
    _delta, used = _log_ratio(lp, old, log_ratio_clamp)
    rho = np.exp(used)
    w = np.minimum(rho, ratio_cap)
    p, q = _exp(lp), _exp(old)
    pos = a > 0
    if divergence == "tv":
        with np.errstate(invalid="ignore"):
            diff = p - q
        valid = np.where(pos, diff <= clip_high, diff >= -clip_low)
    else:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            bkl = _mul(q, old - lp) + _mul(1.0 - q, np.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8)))
            valid = np.where(pos, (bkl <= clip_high) | (p <= q), (bkl <= clip_low) | (p >= q))
    g = np.where(valid, _mul(a, w), 0.0)
    return PolicyTerms(
        term=_mul(g, lp),
        grad=g,
        ratio=rho,
        weight=np.where(valid, w, 0.0),
        flags={"invalid": ~valid, "truncated": (rho > ratio_cap) & valid},
        values={"ppo_kl": -used},
    )


def gpg_terms(logp: ArrayLike, adv: ArrayLike, offsets: ArrayLike) -> PolicyTerms:
    """GPG: the plain policy gradient, no ratio and no clip.

    ``term = A·logp``; ``grad = A``.

    See GPG (Chu et al. 2025, arXiv:2504.02546). Mirrors verl 0.9.1
    ``compute_policy_loss_gpg`` (``policy_loss.loss_mode=gpg``; ``loss_agg_mode``). Logs no
    policy metric (its metrics dict is empty).

    Folds: per token.

    Example:
        >>> gpg_terms([-1.0, -2.0], [0.5, -1.0], [0, 1, 2]).term.tolist()
        [-0.5, 2.0]
    """
    _off, a, x = _inputs(offsets, adv, logp=logp)
    assert a is not None
    return PolicyTerms(term=_mul(a, x["logp"]), grad=a.copy(), ratio=np.ones(a.shape))


def clip_cov_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    selection: Selection = "expected",
    order: ArrayLike | None = None,
) -> PolicyTerms:
    """Clip-Cov: the clipped surrogate, with the gradient of a few high-covariance tokens
    removed.

    ``term = min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)·c_t``, ``ρ = exp(Δ)`` (no clamp), with
    ``c_t = 0`` on the selected tokens, 1 elsewhere. Candidates: tokens the clip does not
    already bind (``not (A>0, ρ>1+ε_high) and not (A<0, ρ<1−ε_low)``) with ``lb < cov_t <
    ub``, ``cov_t = (A_t − Ā)(logp_t − l̄)``, ``Ā``, ``l̄`` means over the micro-batch's
    tokens (divided by ``T + 1e-8``, as verl). ``k = max(⌊ratio·T⌋, 1)``; the trainer takes
    ``min(k, n_cand)`` of them uniformly at random (``torch.randperm``, unseeded).

    - ``selection="expected"``: ``c_t = 1 − min(k, n)/n`` on every candidate: the
      expectation over the trainer's draw (exact for the loss and its gradient in
      expectation; the draw itself is not reproducible from logged data);
    - ``selection="order"``: ``order`` is the trainer's permutation of the candidates
      (indices into them, in token order); its first ``min(k, n)`` are selected.

    ``grad = c_t·ρA`` where the unclipped branch is taken, else 0. The number selected is
    exact either way: ``actor/pg_clipfrac = min(k, n)/T`` (``values["selected"]``).

    See "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
    (Cui et al. 2025, arXiv:2505.22617), Clip-Cov. Mirrors verl 0.9.1
    ``compute_policy_loss_clip_cov`` (``policy_loss.loss_mode=clip_cov``;
    ``clip_ratio_low``/``_high`` → ``clip_low``/``clip_high``; ``policy_loss.clip_cov_ratio``,
    ``clip_cov_lb``, ``clip_cov_ub`` → same names). ``loss_agg_mode``. Logs
    ``actor/pg_clipfrac`` and ``actor/ppo_kl`` = mean ``−Δ`` (unclamped).

    Scope: the micro-batch the loss function received (one rank's micro-batch). The means,
    ``T`` and ``k`` are the micro-batch's: a streaming reader sums ``A``, ``logp`` and the
    token count over the micro-batch (pass 1), counts the candidates (pass 2), then folds
    the terms token by token (pass 3); batches of another size give other ``k`` and means.

    Example:
        >>> t = clip_cov_terms([-3.0, -1.0, -1.0, -3.0], [-3.0, -1.0, -1.0, -3.0],
        ...                    [2.0, -2.0], [0, 2, 4], clip_cov_ratio=0.25)
        >>> t.values["selected"].tolist()  # cov = −2, 2, −2, 2: candidates 1 and 3, k = 1
        [0.0, 0.5, 0.0, 0.5]
    """
    _off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    _choice("selection", selection, ("expected", "order"))
    _positive("clip_cov_ratio", clip_cov_ratio)
    lp = x["logp"]
    T = lp.shape[0]
    delta, _ = _log_ratio(lp, x["old_logp"], None)
    rho = _exp(delta)
    origin = ((a > 0) & (rho > 1.0 + clip_high)) | ((a < 0) & (rho < 1.0 - clip_low))
    with np.errstate(over="ignore", invalid="ignore"):
        cov = (a - _verl_mean(a, T)) * (lp - _verl_mean(lp, T))
    cand = (cov > clip_cov_lb) & (cov < clip_cov_ub) & ~origin
    idx = np.flatnonzero(cand)
    n = idx.shape[0]
    k = max(int(clip_cov_ratio * T), 1)
    chosen = min(k, n)
    corr = np.ones(T)
    if selection == "order":
        if order is None:
            raise UsageError('selection="order" needs order (the trainer\'s permutation)')
        perm = np.asarray(order)
        if perm.shape != (n,) or not np.issubdtype(perm.dtype, np.integer):
            raise InputError(f"order: expected a permutation of {n} candidates, got {perm.shape}")
        if not np.array_equal(np.sort(perm), np.arange(n)):
            raise InputError(f"order: not a permutation of range({n})")
        corr[idx[perm[:chosen]]] = 0.0
    elif n:
        corr[idx] = 1.0 - chosen / n
    surr = clipped_surrogate(rho, a, clip_eps=clip_low, clip_eps_high=clip_high)
    active = ((a > 0) & (rho <= 1.0 + clip_high)) | ((a < 0) & (rho >= 1.0 - clip_low))
    return PolicyTerms(
        term=_mul(surr, corr),
        grad=np.where(active, _mul(_mul(rho, a), corr), 0.0),
        ratio=rho,
        weight=corr,
        flags={"candidate": cand, "clipped": origin},
        values={"selected": 1.0 - corr, "ppo_kl": -delta, "cov": cov},
    )


def kl_cov_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
) -> PolicyTerms:
    """KL-Cov: the unclipped surrogate, with a ``|Δ|`` penalty on the highest-covariance
    tokens.

    ``term = ρA − κ·|Δ|·s_t``, ``ρ = exp(Δ)`` (no clip, no clamp), ``s_t = 1`` on the ``k =
    max(1, ⌊T·ratio⌋)`` tokens of largest ``cov_t = (A_t − Ā)(logp_t − l̄)`` (plain means
    over the micro-batch's tokens), else 0; ``grad = ρA − κ·sign(Δ)·s_t``. Ties at the
    ``k``-th covariance are broken by token order (``torch.topk`` leaves them unspecified).

    See "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
    (Cui et al. 2025, arXiv:2505.22617), KL-Cov. Mirrors verl 0.9.1
    ``compute_policy_loss_kl_cov`` (``policy_loss.loss_mode=kl_cov``;
    ``policy_loss.kl_cov_ratio``, ``policy_loss.ppo_kl_coef`` (config default 0.1; the
    code's fallback and docstring say 1) → same names). ``loss_agg_mode``. Logs only
    ``actor/ppo_kl``, here the mean of ``|Δ|`` (``values["abs_delta"]``), not of ``−Δ``.

    Scope: the micro-batch the loss function received. A streaming reader sums ``A``,
    ``logp`` and the count over the micro-batch (pass 1), keeps the ``k`` largest
    covariances in a bounded heap (pass 2: ``k`` is 0.02 % of the tokens), then folds the
    terms (pass 3).

    Example:
        >>> t = kl_cov_terms([-3.0, -1.0], [-3.5, -1.0], [1.0, -1.0], [0, 1, 2],
        ...                  kl_cov_ratio=0.5, ppo_kl_coef=1.0)
        >>> t.flags["selected"].tolist(), t.term.round(6).tolist()
        ([True, False], [1.148721, -1.0])
    """
    _off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    _positive("kl_cov_ratio", kl_cov_ratio)
    _positive("ppo_kl_coef", ppo_kl_coef, zero=True)
    lp = x["logp"]
    T = lp.shape[0]
    delta, _ = _log_ratio(lp, x["old_logp"], None)
    rho = _exp(delta)
    with np.errstate(over="ignore", invalid="ignore"):
        cov = (a - a.mean()) * (lp - lp.mean())
    k = max(1, int(T * kl_cov_ratio))
    top = np.argsort(-cov, kind="stable")[:k]
    sel = np.zeros(T, dtype=bool)
    sel[top] = True
    surr = _mul(rho, a)
    absd = np.abs(delta)
    with np.errstate(invalid="ignore"):
        term = np.where(sel, surr - ppo_kl_coef * absd, surr)
        grad = np.where(sel, surr - ppo_kl_coef * np.sign(delta), surr)
    return PolicyTerms(
        term=term,
        grad=grad,
        ratio=rho,
        flags={"selected": sel},
        values={"abs_delta": absd, "cov": cov},
    )


def geo_mean_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    length_eps: float = 1e-8,
    is_weight: ArrayLike | None = None,
) -> PolicyTerms:
    """GMPO: the geometric mean of the token ratios, clipped in log space, per answer.

    ``J_i = Ā_i·r_i`` with ``r_i = exp(Σ_t Δ̃_t / (|o_i| + η))``, ``Ā_i = Σ_t A_t /
    (|o_i| + η)``, ``Δ̃_t = min(Δ_t, ε_high)`` if ``A_t > 0``, ``max(Δ_t, −ε_low)`` if
    ``A_t < 0``, 0 if ``A_t = 0`` (``η = length_eps``); the trainer's loss is
    ``−mean_i J_i``: ``term`` holds ``J_i`` on each token of answer ``i`` and ``agg`` is
    ``seq-mean-token-mean``. With ``is_weight`` (verl's rollout IS weights, ``(T,)``) ``J_i``
    is multiplied by their geometric mean ``exp(Σ_t log(w_t + 1e-10) / (|o_i| + η))``.
    ``grad_t = |o_i|·J_i·[Δ̃_t = Δ_t, A_t ≠ 0] / (|o_i| + η)``.

    See Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673). Mirrors
    verl 0.9.1 ``compute_policy_loss_geo_mean`` (``policy_loss.loss_mode=geo_mean``;
    ``clip_ratio_low``/``_high`` (bounds on Δ, not on ρ) → ``clip_low``/``clip_high``;
    ``loss_agg_mode`` is ignored: a mean over the micro-batch's rows). Logs
    ``actor/pg_clipfrac`` = share of tokens with ``A > 0`` whose Δ the clamp changes
    (``flags["clipped_high"]``), ``actor/pg_clipfrac_lower`` the same with ``A < 0``, and
    ``actor/ppo_kl`` = mean ``−Δ``.

    Folds: per answer (sums over the answer's tokens); the trainer averages over the
    micro-batch's rows, so micro-batches of unequal row counts weight answers unequally.
    Unlike ``agg_loss``, that mean counts a row verl's rejection sampling emptied (as 0):
    after :func:`drop_tokens`, multiply the mean by ``N_kept / N``.

    Example:
        >>> t = geo_mean_terms([-1.0, -1.0], [-1.5, -0.5], [1.0], [0, 2], length_eps=0.0)
        >>> t.term.round(6).tolist()  # Δ̃ = (0.2, −0.5): r = exp(−0.15)
        [0.860708, 0.860708]
    """
    off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp, is_weight=is_weight)
    assert a is not None
    _positive("length_eps", length_eps, zero=True)
    delta, _ = _log_ratio(x["logp"], x["old_logp"], None)
    dc = np.clip(delta, -clip_low, clip_high)
    dt = np.where(a > 0, np.minimum(delta, dc), np.where(a < 0, np.maximum(delta, dc), 0.0))
    n = np.diff(off) + length_eps
    r = _exp(segment_sum(dt, off) / n)
    a_bar = segment_sum(a, off) / n
    j = _mul(a_bar, r)
    if "is_weight" in x:
        w = x["is_weight"]
        if (w < 0).any():
            raise InputError("is_weight: importance weights must be >= 0")
        j = _mul(j, np.exp(segment_sum(np.log(w + 1e-10), off) / n))
    free = (dt == delta) & (a != 0)
    scale = np.diff(off) / n
    grad = np.where(free, _repeat(_mul(j, scale), off), 0.0)
    changed = delta != dc
    return PolicyTerms(
        term=_repeat(j, off),
        grad=grad,
        ratio=_repeat(r, off),
        flags={"clipped_high": changed & (a > 0), "clipped_low": changed & (a < 0)},
        values={"ppo_kl": -delta},
        answer_values={"ratio": r, "adv": a_bar},
        level="sequence",
        agg="seq-mean-token-mean",
    )


def dro_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    beta: float,
) -> PolicyTerms:
    """DRO: the policy gradient with a quadratic log-ratio penalty.

    ``term = A·logp − ½β·Δ²``; ``grad = A − β·Δ``.

    See Direct Reward Optimization (Richemond et al. 2024, arXiv:2405.19107). Mirrors verl
    0.9.1 ``compute_policy_loss_dro`` (``policy_loss.loss_mode=dro``;
    ``policy_loss.dro_beta`` → ``beta``, required > 0). ``loss_agg_mode``. Logs
    ``actor/ppo_kl`` = mean ``−Δ``.

    Folds: per token.

    Example:
        >>> dro_terms([-1.0], [-2.0], [1.0], [0, 1], beta=0.5).term.tolist()
        [-1.25]
    """
    _off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    _positive("beta", beta)
    lp = x["logp"]
    delta, _ = _log_ratio(lp, x["old_logp"], None)
    with np.errstate(over="ignore", invalid="ignore"):
        pen = 0.5 * beta * np.square(delta)
        term = _mul(a, lp) - pen
        grad = a - beta * delta
    return PolicyTerms(term=term, grad=grad, ratio=_exp(delta), values={"ppo_kl": -delta})


def _vanilla(
    logp: F64, old: F64, a: F64, off: I64, low: float, high: float, c: float
) -> PolicyTerms:
    """verl's ``compute_policy_loss_vanilla`` (Δ clamped ±20, dual clip ``c``) via the core."""
    tt = token_terms(
        logp, old, None, a, off, clip_eps=low, clip_eps_high=high, dual_clip=c,
        log_ratio_clamp=20.0, beta=0.0,
    )  # fmt: skip
    gp, _ = token_gradients(
        tt, offsets=off, clip_eps=low, clip_eps_high=high, dual_clip=c, log_ratio_clamp=20.0,
        beta=0.0,
    )  # fmt: skip
    rho = tt.ratio
    region = ((a > 0) & (rho > 1.0 + high)) | ((a < 0) & (rho < 1.0 - low))
    dual = (a < 0) & (np.maximum(rho, np.clip(rho, 1.0 - low, 1.0 + high)) > c)
    used = np.clip(tt.delta, -20.0, 20.0)
    return PolicyTerms(
        term=tt.term,
        grad=gp,
        ratio=rho,
        flags={"region": region, "dual": dual},
        values={"ppo_kl": -used},
    )


def verl_bypass_mode(
    logp: ArrayLike,
    rollout_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    loss_type: BypassLoss = "ppo_clip",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is: VerlISLevel | None = "sequence",
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> tuple[PolicyTerms, Correction]:
    """verl's bypass mode: the sampler's log-probs stand in for ``old_logp``.

    The correction is :func:`verl_rollout_correction` of ``logp`` (the current policy,
    detached) against ``rollout_logp``; its rejection (``keep``) removes tokens from the
    loss's mask. Then:

    - ``"ppo_clip"``: verl's clipped surrogate with ``old_logp = rollout_logp`` (Δ clamped
      ±20, dual clip ``clip_ratio_c``), the IS weights *not* applied (the ratio is the
      correction); logs ``actor/pg_clipfrac`` (``flags["region"]``),
      ``actor/pg_clipfrac_lower`` (``flags["dual"]``), ``actor/ppo_kl`` (mean ``−Δ'``);
    - ``"reinforce"``: ``term = w·A·logp`` (REINFORCE with the detached IS weight; ``w = 1``
      without ``rollout_is``), ``grad = w·A``; logs ``actor/ppo_kl`` = mean of ``rollout_logp −
      logp``;

    both over the kept tokens, with the correction's ``rollout_corr/*`` metrics.

    Mirrors verl 0.9.1 ``core_algos.compute_policy_loss_bypass_mode`` and
    ``compute_policy_loss_reinforce`` (``policy_loss.loss_mode=bypass_mode``, set by
    ``algorithm.rollout_correction.bypass_mode=True``; ``rollout_correction.loss_type`` →
    ``loss_type``; ``rollout_is``, ``rollout_is_threshold``, ``rollout_is_batch_normalize``,
    ``rollout_rs``, ``rollout_rs_threshold`` → same names; ``clip_ratio_low``/``_high``/``_c``
    → ``clip_low``/``clip_high``/``clip_ratio_c``). See "When Speed Kills Stability" (Liu et
    al. 2025, https://richardli.xyz/rl-collapse). Drop the rejected tokens before
    aggregating (:func:`drop_tokens`): the trainer's ``loss_agg_mode`` counts kept tokens.

    Scope: the correction's metrics and batch normalisation are the micro-batch's.

    Example:
        >>> t, c = verl_bypass_mode([-1.0, -1.0], [-1.0, -1.0], [1.0], [0, 2],
        ...                         loss_type="reinforce")
        >>> t.term.tolist(), c.weight.tolist()
        ([-1.0, -1.0], [1.0, 1.0])
    """
    off, a, x = _inputs(offsets, adv, logp=logp, rollout_logp=rollout_logp)
    assert a is not None
    _choice("loss_type", loss_type, ("ppo_clip", "reinforce"))
    lp, roll = x["logp"], x["rollout_logp"]
    corr = verl_rollout_correction(
        lp, roll, off, rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold,
        rollout_is_batch_normalize=rollout_is_batch_normalize, rollout_rs=rollout_rs,
        rollout_rs_threshold=rollout_rs_threshold,
    )  # fmt: skip
    if loss_type == "ppo_clip":
        if not clip_ratio_c > 1.0:
            raise UsageError(f"clip_ratio_c: must be > 1, got {clip_ratio_c}")
        return _vanilla(lp, roll, a, off, clip_low, clip_high, clip_ratio_c), corr
    w = corr.weight if rollout_is is not None else np.ones(lp.shape)
    wa = _mul(w, a)
    with np.errstate(over="ignore", invalid="ignore"):
        kl = roll - lp
    terms = PolicyTerms(
        term=_mul(wa, lp), grad=wa, ratio=_exp(-kl), weight=w, values={"ppo_kl": kl}
    )
    return terms, corr


# ===================================================================== correction
def _is_threshold(spec: float | str) -> tuple[float, float | None]:
    """verl's ``rollout_is_threshold``: a float (TIS upper bound) or ``"lower_upper"``
    (IcePop band)."""
    if isinstance(spec, bool):
        raise UsageError("rollout_is_threshold: a number or 'lower_upper', not a boolean")
    lower: float | None = None
    try:
        if isinstance(spec, str) and "_" in spec.strip():
            lo_s, hi_s = spec.strip().split("_", 1)
            lower, upper = float(lo_s), float(hi_s)
        else:
            upper = float(spec)
    except ValueError:
        raise UsageError(f"rollout_is_threshold: cannot read {spec!r}") from None
    if not upper > 0 or (lower is not None and not 0 < lower <= upper):
        raise UsageError(f"rollout_is_threshold: need 0 < lower <= upper, got {spec!r}")
    return upper, lower


RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3",
)  # fmt: skip


def _rs_thresholds(
    options: list[str], spec: float | str | None
) -> list[tuple[float | None, float]]:
    """verl's ``rollout_rs_threshold``: one spec shared, or one per option; a k1 option
    takes ``"lower_upper"`` ratio bounds (a single value ``u`` means ``1/u_u``), the others an
    upper bound."""
    if spec is None:
        raise UsageError("rollout_rs_threshold: required with rollout_rs")
    raw = [str(spec)] if not isinstance(spec, str) else [s.strip() for s in spec.split(",")]
    raw = [s for s in raw if s]
    if len(raw) not in (1, len(options)):
        raise UsageError(
            f"rollout_rs_threshold: one value or {len(options)} (one per option), got {len(raw)}"
        )
    raw = raw * len(options) if len(raw) == 1 else raw
    out: list[tuple[float | None, float]] = []
    for opt, s in zip(options, raw, strict=True):
        try:
            if opt.endswith("k1"):
                lo_s, hi_s = s.split("_", 1) if "_" in s else (str(1.0 / float(s)), s)
                lo, hi = float(lo_s), float(hi_s)
                if not (0 < lo <= hi):
                    raise ValueError
                out.append((lo, hi))
            else:
                if "_" in s:
                    raise ValueError
                hi = float(s)
                if not hi > 0:
                    raise ValueError
                out.append((None, hi))
        except ValueError:
            raise UsageError(f"rollout_rs_threshold: cannot read {s!r} for {opt}") from None
    return out


def _sample_std(x: F64) -> float:
    return float(np.std(x, ddof=1)) if x.shape[0] > 1 else 0.0


def _clamped_std(stat: F64, lo: float, hi: float, T: int) -> float:
    """verl's std of a statistic clamped to ``[lo, hi]``: ``sqrt(max(E[s²] − E[s]², 0))``."""
    if T <= 1:
        return 0.0
    s = np.clip(stat, lo, hi)
    m = _verl_mean(s, T)
    return math.sqrt(max(_verl_mean(s * s, T) - m * m, 0.0))


def verl_rollout_correction(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    offsets: ArrayLike,
    *,
    rollout_is: VerlISLevel | None = "sequence",
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> Correction:
    """verl's rollout correction: IS weights and rejection sampling between the sampler's
    log-probs and the trainer's.

    With ``ℓ_t = old_logp − rollout_logp``:

    - IS (``rollout_is``): ``ρ_t = exp(clamp(ℓ_t, ±20))`` (``"token"``) or ``exp(clamp(Σ_t
      ℓ_t, ±20))`` per answer (``"sequence"``); a float threshold ``u`` truncates
      (``w = min(ρ, u)``, TIS), ``"l_u"`` zeroes ``ρ`` outside ``[l, u]`` (IcePop); with
      ``rollout_is_batch_normalize`` ``w`` is divided by its mean (over tokens, or over
      answers at sequence level) when that exceeds 1e-8. ``rollout_is=None``: weights 1.
    - RS (``rollout_rs``, comma-separated, all must pass): per token ``k1 = −ℓ'``,
      ``k2 = ℓ'²/2``, ``k3 = e^ℓ' − 1 − ℓ'`` (``ℓ' = clamp(ℓ, ±20)``); ``token_*`` tests the
      token, ``seq_sum_*``/``seq_mean_*``/``seq_max_*`` the answer's sum, mean, max; k1 keeps
      ``log l ≤ stat ≤ log u``, k2/k3 ``stat ≤ u``. A rejected token leaves the loss's
      mask (``keep`` False).

    Mirrors verl 0.9.1 ``rollout_corr_helper.compute_rollout_correction_and_rejection_mask``
    with ``compute_rollout_correction_weights``, ``compute_rollout_rejection_mask``,
    ``compute_is_metrics``, ``compute_rs_metrics`` and ``compute_offpolicy_metrics``
    (``algorithm.rollout_correction.rollout_is``, ``rollout_is_threshold``,
    ``rollout_is_batch_normalize``, ``rollout_rs``, ``rollout_rs_threshold`` → same names;
    the section is off unless set; when set ``rollout_is`` defaults to ``"sequence"``).
    Applied by multiplying each loss's per-token loss by ``w`` (:func:`apply_correction`).
    See "When Speed Kills Stability" (Liu et al. 2025, https://richardli.xyz/rl-collapse);
    IcePop (Ling team 2025). ``metrics`` holds every ``rollout_corr/*`` the function logs
    (``rollout_is_*`` statistics of the weights before batch normalisation,
    ``rollout_rs_<option>_*``, ``rollout_rs_masked_fraction``, and the off-policy
    diagnostics ``kl``, ``k3_kl``, ``training_ppl``, ``rollout_ppl``, ``log_ppl_*``,
    ``ppl_ratio``, ``chi2_token``, ``chi2_seq``), with verl's means over ``count + 1e-8``.

    Scope: decoupled mode computes it once on the whole training batch in the driver
    (``ray_trainer``, before the mini-batches; batch normalisation over that batch); bypass
    mode per micro-batch (:func:`verl_bypass_mode`). Per token or per answer otherwise.

    Example:
        >>> c = verl_rollout_correction([-1.0, -1.0], [-1.5, -2.0], [0, 2])
        >>> c.weight.tolist(), c.metrics["rollout_corr/rollout_is_ratio_fraction_high"]
        ([2.0, 2.0], 1.0)
    """
    off, _, x = _inputs(offsets, None, old_logp=old_logp, rollout_logp=rollout_logp)
    if rollout_is is not None:
        _choice("rollout_is", rollout_is, ("token", "sequence"))
    old, roll = x["old_logp"], x["rollout_logp"]
    T = old.shape[0]
    lens = np.diff(off)
    with np.errstate(over="ignore", invalid="ignore"):
        lr = old - roll
    safe = np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
    lr_sum = segment_sum(lr, off)
    metrics: dict[str, float] = {}
    weight = np.ones(T)
    if rollout_is is not None:
        upper, lower = _is_threshold(rollout_is_threshold)
        if rollout_is == "token":
            raw = np.exp(safe)
        else:
            raw = _repeat(np.exp(np.clip(lr_sum, -SAFETY_BOUND, SAFETY_BOUND)), off)
        if lower is None:
            w = np.minimum(raw, upper)
        else:
            w = np.where((raw >= lower) & (raw <= upper), raw, 0.0)
        metrics.update(_is_metrics(w, raw, lr_sum, off, rollout_is, upper, lower))
        if rollout_is_batch_normalize:
            if rollout_is == "token":
                mean = _verl_mean(w, T)
            else:
                mean = float(np.sum(_verl_seq_mean(w, off)) / max(float(len(lens)), 1e-8))
            if mean > 1e-8:
                w = w / mean
                metrics["rollout_is_batch_norm_factor"] = mean
            else:
                metrics["rollout_is_batch_norm_factor"] = 1.0
        weight = w
    keep = np.ones(T, dtype=bool)
    if rollout_rs is not None:
        keep, rs = _rejection(safe, off, rollout_rs, rollout_rs_threshold)
        metrics.update(rs)
    metrics.update(_offpolicy_metrics(old, roll, lr, safe, lr_sum, off))
    return Correction(
        weight=weight, keep=keep, metrics={f"rollout_corr/{k}": v for k, v in metrics.items()}
    )


def _is_metrics(
    w: F64, raw: F64, lr_sum: F64, off: I64, level: str, upper: float, lower: float | None
) -> dict[str, float]:
    T = w.shape[0]
    lo = 1.0 / upper if lower is None else lower
    m: dict[str, float] = {}
    if level == "sequence":
        m["rollout_is_max"] = math.exp(min(float(lr_sum.max()), SAFETY_BOUND))
        with np.errstate(over="ignore"):
            m["rollout_is_min"] = float(np.exp(lr_sum.min()))
        m["rollout_is_mean"] = _verl_mean(w, T)
        m["rollout_is_ratio_fraction_high"] = float(np.mean(lr_sum > math.log(upper)))
        m["rollout_is_ratio_fraction_low"] = float(np.mean(lr_sum < math.log(lo)))
    else:
        m["rollout_is_mean"] = _verl_mean(w, T)
        m["rollout_is_ratio_fraction_high"] = _verl_mean(raw > upper, T)
        m["rollout_is_ratio_fraction_low"] = _verl_mean(raw < lo, T)
        m["rollout_is_max"] = float(w.max())
        m["rollout_is_min"] = float(w.min())
    m["rollout_is_std"] = _clamped_std(w, 0.0, upper, T)
    wc = np.clip(w, 0.0, upper)
    normed = wc / (_verl_mean(wc, T) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / _verl_mean(normed * normed, T)
    seq_w = _verl_seq_mean(w, off)
    m["rollout_is_seq_mean"] = float(seq_w.mean())
    m["rollout_is_seq_std"] = _sample_std(seq_w)
    m["rollout_is_seq_max"] = float(seq_w.max())
    m["rollout_is_seq_min"] = float(seq_w.min())
    m["rollout_is_seq_max_deviation"] = float(np.abs(seq_w - 1.0).max())
    raw_seq = _verl_seq_mean(raw, off)
    m["rollout_is_seq_fraction_high"] = float(np.mean(raw_seq > upper))
    m["rollout_is_seq_fraction_low"] = float(np.mean(raw_seq < lo))
    if lower is not None:
        m["rollout_is_oob_ratio"] = _verl_mean((raw < lower) | (raw > upper), T)
    return m


def rejection_options(
    rollout_rs: str, spec: float | str | None
) -> list[tuple[str, tuple[float | None, float]]]:
    """verl's ``rollout_rs`` options (comma-separated, duplicates once) with their bounds
    from ``rollout_rs_threshold`` (:func:`verl_rollout_correction`).

    Raises:
        UsageError: an unknown option, none, or a threshold that does not read.

    Example:
        >>> rejection_options("token_k1,seq_max_k2", "0.5_2.0,0.1")
        [('token_k1', (0.5, 2.0)), ('seq_max_k2', (None, 0.1))]
    """
    if not isinstance(rollout_rs, str):
        raise UsageError("rollout_rs: expected a comma-separated string of options")
    options: list[str] = []
    for o in (s.strip() for s in rollout_rs.split(",")):
        if o and o not in options:
            _choice("rollout_rs", o, RS_OPTIONS)
            options.append(o)
    if not options:
        raise UsageError("rollout_rs: no option given")
    return list(zip(options, _rs_thresholds(options, spec), strict=True))


def _rejection(
    safe: F64, off: I64, rollout_rs: str, spec: float | str | None
) -> tuple[Bools, dict[str, float]]:
    options, bounds = zip(*rejection_options(rollout_rs, spec), strict=True)
    T = safe.shape[0]
    per_token = {"k1": -safe, "k2": 0.5 * safe * safe, "k3": np.exp(safe) - 1.0 - safe}
    keep = np.ones(T, dtype=bool)
    m: dict[str, float] = {}
    for opt, (lo, hi) in zip(options, bounds, strict=True):
        k = per_token[opt[-2:]]
        is_k1 = opt.endswith("k1")
        hi_t = math.log(hi) if is_k1 else hi
        lo_t = math.log(lo) if is_k1 and lo is not None else 0.0
        seq_vals: F64 | None = None
        if opt.startswith("token"):
            stat = k
        else:
            if opt.startswith("seq_sum"):
                seq_vals = segment_sum(k, off)
            elif opt.startswith("seq_mean"):
                seq_vals = _verl_seq_mean(k, off)
            else:
                seq_vals = np.maximum.reduceat(k, off[:-1])
            stat = _repeat(seq_vals, off)
        passed = (stat <= hi_t) & (stat >= lo_t) if is_k1 else stat <= hi_t
        keep &= passed
        p = f"rollout_rs_{opt}"
        sv = seq_vals if seq_vals is not None else _verl_seq_mean(stat, off)
        m[f"{p}_mean"] = _verl_mean(stat, T)
        src = sv if seq_vals is not None else stat
        m[f"{p}_max"] = float(src.max())
        m[f"{p}_min"] = float(src.min())
        if seq_vals is not None:
            m[f"{p}_fraction_high"] = float(np.mean(sv > hi_t))
            m[f"{p}_fraction_low"] = float(np.mean(sv < lo_t)) if is_k1 else 0.0
        else:
            m[f"{p}_fraction_high"] = _verl_mean(stat > hi_t, T)
            m[f"{p}_fraction_low"] = _verl_mean(stat < lo_t, T) if is_k1 else 0.0
        m[f"{p}_std"] = _clamped_std(stat, lo_t, hi_t, T)
        m[f"{p}_seq_mean"] = float(sv.mean())
        m[f"{p}_seq_std"] = _sample_std(sv)
        m[f"{p}_seq_max"] = float(sv.max())
        m[f"{p}_seq_min"] = float(sv.min())
        m[f"{p}_seq_max_deviation"] = float(np.abs(sv).max())
        m[f"{p}_seq_fraction_high"] = float(np.mean(sv > hi_t))
        if is_k1:
            m[f"{p}_seq_fraction_low"] = float(np.mean(sv < lo_t))
        m[f"{p}_masked_fraction"] = _verl_mean(~passed, T)
        m[f"{p}_seq_masked_fraction"] = float(np.mean(segment_count(~passed, off) > 0))
    m["rollout_rs_masked_fraction"] = _verl_mean(~keep, T)
    m["rollout_rs_seq_masked_fraction"] = float(np.mean(segment_count(~keep, off) > 0))
    return keep, m


def _offpolicy_metrics(
    old: F64, roll: F64, lr: F64, safe: F64, lr_sum: F64, off: I64
) -> dict[str, float]:
    T = old.shape[0]
    mean_old = _verl_seq_mean(old, off)
    mean_roll = _verl_seq_mean(roll, off)
    diff = mean_roll - mean_old
    with np.errstate(over="ignore", invalid="ignore"):
        k3 = np.exp(lr) - lr - 1.0
        m = {
            "training_ppl": float(np.exp(-mean_old).mean()),
            "training_log_ppl": float((-mean_old).mean()),
            "kl": _verl_mean(roll - old, T),
            "k3_kl": _verl_mean(k3, T),
            "rollout_ppl": float(np.exp(-mean_roll).mean()),
            "rollout_log_ppl": float((-mean_roll).mean()),
            "log_ppl_diff": float(diff.mean()),
            "log_ppl_abs_diff": float(np.abs(diff).mean()),
            "log_ppl_diff_max": float(diff.max()),
            "log_ppl_diff_min": float(diff.min()),
            "ppl_ratio": float(np.exp(diff).mean()),
            "chi2_token": _verl_mean(np.exp(safe) ** 2, T) - 1.0,
            "chi2_seq": float(
                np.exp(2.0 * np.clip(lr_sum, -SAFETY_BOUND, SAFETY_BOUND)).mean() - 1.0
            ),
        }
    return m


# ======================================================== parameters and their rows
def _threshold_problem(value: object) -> str | None:
    try:
        _is_threshold(value)  # type: ignore[arg-type]
    except UsageError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


@dataclass(frozen=True)
class RolloutParams(Params):
    rollout_is: str | None = param(
        "sequence",
        Spec("choice", "the IS weights' level (off: no weights)", choices=("token", "sequence"),
             optional=True),
    )  # fmt: skip
    rollout_is_threshold: float | str = param(
        2.0,
        Spec("band", "the TIS upper bound, or 'lower_upper' (IcePop's band)",
             check=_threshold_problem),
    )  # fmt: skip
    rollout_is_batch_normalize: bool = param(
        False, Spec("bool", "divide the weights by their batch mean")
    )
    rollout_rs: str | None = param(
        None,
        Spec("text", "rejection sampling: comma-separated options (" + ", ".join(
            ("token_k1", "token_k2", "token_k3", "seq_sum_k*", "seq_mean_k*", "seq_max_k2|k3")
        ) + ")", optional=True),
    )  # fmt: skip
    rollout_rs_threshold: float | str | None = param(
        None, Spec("band", "the rejection's bounds, one or one per option", optional=True)
    )

    def check(self) -> None:
        if self.rollout_rs is not None:
            try:
                rejection_options(self.rollout_rs, self.rollout_rs_threshold)
            except UsageError as exc:
                name, _, why = str(exc).partition(": ")
                raise SettingError(name, why) from None
        elif self.rollout_rs_threshold is not None:
            raise SettingError("rollout_rs_threshold", "needs rollout_rs (the options it bounds)")


@dataclass(frozen=True)
class BypassParams(RolloutParams):
    bypass_loss_type: str = param(
        "ppo_clip",
        Spec("choice", "rollout_correction.loss_type", choices=("ppo_clip", "reinforce")),
    )


@dataclass(frozen=True)
class ClipCovParams(Params):
    clip_cov_ratio: float = param(0.0002, Spec(low=0.0, help="share of tokens Clip-Cov selects"))
    clip_cov_lb: float = param(1.0, Spec(help="lower bound of the covariance window"))
    clip_cov_ub: float = param(5.0, Spec(low=0.0, closed=True, help="its upper bound"))

    def check(self) -> None:
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise SettingError(
                "clip_cov_lb",
                f"must be below clip_cov_ub ({self.clip_cov_ub}), got {self.clip_cov_lb}",
            )


@dataclass(frozen=True)
class KlCovParams(Params):
    kl_cov_ratio: float = param(0.0002, Spec(low=0.0, help="share of tokens KL-Cov penalises"))
    ppo_kl_coef: float = param(0.1, Spec(low=0.0, closed=True, help="its |Δ| coefficient"))


@dataclass(frozen=True)
class DroParams(Params):
    dro_beta: float | None = param(
        None, Spec(low=0.0, optional=True, help="β of DRO's quadratic log-ratio penalty")
    )

    def check(self) -> None:
        if self.dro_beta is None:
            raise SettingError("dro_beta", "verl/dro needs it (policy_loss.dro_beta > 0)")


def _cap(c: LossCall) -> float:
    """verl's ``clip_ratio_c`` (3.0 when the settings' dual clip is off)."""
    return 3.0 if c.dual_clip is None else c.dual_clip


def _dppo(divergence: Divergence) -> Callable[[LossCall], PolicyTerms]:
    def terms(c: LossCall) -> PolicyTerms:
        return dppo_terms(
            c.logp, c.old, c.adv, c.offsets, divergence=divergence, clip_low=c.clip_low,
            clip_high=c.clip_high, ratio_cap=_cap(c),
        )  # fmt: skip

    return terms


def _sapo(c: LossCall) -> PolicyTerms:
    p = c.params
    assert isinstance(p, SapoParams)
    return sapo_terms(
        c.logp, c.old, c.adv, c.offsets, tau_pos=p.sapo_temperature_pos,
        tau_neg=p.sapo_temperature_neg, log_ratio_clamp=VERL_CLAMP, ratio_level="token",
    )  # fmt: skip


def _clip_cov(c: LossCall) -> PolicyTerms:
    p = c.params
    assert isinstance(p, ClipCovParams)
    return clip_cov_terms(
        c.logp, c.old, c.adv, c.offsets, clip_low=c.clip_low, clip_high=c.clip_high,
        clip_cov_ratio=p.clip_cov_ratio, clip_cov_lb=p.clip_cov_lb, clip_cov_ub=p.clip_cov_ub,
    )  # fmt: skip


def _kl_cov(c: LossCall) -> PolicyTerms:
    p = c.params
    assert isinstance(p, KlCovParams)
    return kl_cov_terms(
        c.logp, c.old, c.adv, c.offsets, kl_cov_ratio=p.kl_cov_ratio, ppo_kl_coef=p.ppo_kl_coef
    )


def _geo_mean(c: LossCall) -> PolicyTerms:
    w = None if c.correction is None else c.correction.weight
    return geo_mean_terms(
        c.logp, c.old, c.adv, c.offsets, clip_low=c.clip_low, clip_high=c.clip_high, is_weight=w
    )


def _dro(c: LossCall) -> PolicyTerms:
    p = c.params
    assert isinstance(p, DroParams) and p.dro_beta is not None
    return dro_terms(c.logp, c.old, c.adv, c.offsets, beta=p.dro_beta)


def _cispo(c: LossCall) -> PolicyTerms:
    return cispo_terms(
        c.logp, c.old, c.adv, c.offsets, lower=1.0 - c.clip_low, upper=1.0 + c.clip_high,
        log_ratio_clamp=VERL_CLAMP,
    )  # fmt: skip


def _bypass(c: LossCall) -> OwnCorrection:
    """verl 0.9.1's bypass mode on one batch, as the actor's ``ppo_loss`` aggregates it:
    the policy loss over the tokens its rejection keeps, divided by the batch's tokens
    (``batch_num_tokens`` counts the unrejected mask) or rows, a seq-mean-token-mean by
    each answer's kept tokens; the KL loss over every token (its mask is not the
    rejection's). The fold's per-token term carries that: ``keep`` times, for an
    answer-mean aggregation, ``|o_i| / kept_i``.

    Raises:
        InputError: the batch has no ``rollout_logp``.
    """
    p = c.params
    assert isinstance(p, BypassParams)
    rollout = c.fields.get("rollout_logp")
    if rollout is None:
        raise InputError(
            "--loss verl/bypass_mode needs the sampler's log-probs: the input has no "
            "rollout_logp column (--column rollout_logp=NAME)"
        )
    t, corr = verl_bypass_mode(
        c.logp, rollout, c.adv, c.offsets, loss_type=p.bypass_loss_type,  # type: ignore[arg-type]
        clip_low=c.clip_low, clip_high=c.clip_high, clip_ratio_c=_cap(c),
        rollout_is=p.rollout_is,  # type: ignore[arg-type]
        rollout_is_threshold=p.rollout_is_threshold,
        rollout_is_batch_normalize=p.rollout_is_batch_normalize, rollout_rs=p.rollout_rs,
        rollout_rs_threshold=p.rollout_rs_threshold,
    )  # fmt: skip
    keep = corr.keep
    factor = kept_stretch(keep, c.offsets) if c.answer_mean else keep.astype(np.float64)
    grad = None if t.grad is None else _mul(t.grad, factor)
    terms = dataclasses.replace(t, term=_mul(t.term, factor), grad=grad)
    off, _, _ = drop_tokens(keep, c.offsets)
    kept = PolicyTerms(
        term=t.term[keep], grad=None if t.grad is None else t.grad[keep], ratio=t.ratio[keep],
        flags={k: v[keep] for k, v in t.flags.items()},
        values={k: v[keep] for k, v in t.values.items()},
    )  # fmt: skip
    return OwnCorrection(terms=terms, correction=corr, kept=kept, kept_offsets=off)


_PPO_KL = Metric("actor/ppo_kl", "ppo_kl", "tokens", "mean of old_logp − logp")


def _pg(key: str, doc: str) -> Metric:
    return Metric("actor/pg_clipfrac", key, "tokens", doc)


def _lower(key: str, doc: str) -> Metric:
    return Metric("actor/pg_clipfrac_lower", key, "tokens", doc)


_ZERO_PG, _ZERO_LOWER = _pg("", "0"), _lower("", "0")
_ZERO_PG, _ZERO_LOWER = _ZERO_PG._replace(unit="zero"), _ZERO_LOWER._replace(unit="zero")
_DPPO_METRICS = (
    _pg("invalid", "tokens masked by the divergence threshold"),
    _PPO_KL,
    _lower("truncated", "tokens whose IS weight the cap truncates"),
)


def _bypass_metrics(p: Params) -> tuple[Metric, ...]:
    if getattr(p, "bypass_loss_type", "ppo_clip") == "ppo_clip":
        return (
            _pg("region", "the clip region against the sampler"),
            _PPO_KL,
            _lower("dual", "the dual clip against the sampler"),
        )
    return (_PPO_KL._replace(doc="mean of rollout_logp − logp"),)


def _bypass_words(p: Params) -> str:
    assert isinstance(p, BypassParams)
    rs = "" if p.rollout_rs is None else f", rejection sampling ({p.rollout_rs})"
    return f", {p.bypass_loss_type}{rs}"


def _bypass_note(p: Params, values: Mapping[str, float]) -> str:
    share = values.get("rollout_corr/rollout_rs_masked_fraction")
    removed = "" if share is None else (
        f"; its rejection (rollout_rs) removed {share:.2%} of the tokens from the policy "
        "loss, which divides by every token (or row) all the same"
    )  # fmt: skip
    return (
        "verl's bypass mode: the sampler's log-probs are the old policy, the IS weights and "
        f"rejection its own (of logp against rollout_logp){removed}; the KL loss, the ratio "
        "and clip statistics and the counts are every token's; the other aggregations' J "
        "take the rejection as the settings' one does"
    )


_COVARIANCE = "selects tokens by a covariance over the batch its loss saw"

LOSSES = (
    Loss("verl/dppo_tv", _dppo("tv"),
         "DPPO-TV (a truncated IS weight, masked beyond a probability change)",
         token_ratio=True, metrics=_DPPO_METRICS, clip=("actor/pg_clipfrac",)),
    Loss("verl/dppo_kl", _dppo("kl"),
         "DPPO-KL (a truncated IS weight, masked beyond a binary KL)",
         token_ratio=True, metrics=_DPPO_METRICS, clip=("actor/pg_clipfrac",)),
    Loss("verl/sapo", _sapo, "SAPO (a soft temperature gate in place of the clip)",
         params=SapoParams, agg="seq-mean-token-mean", token_ratio=True,
         metrics=(_ZERO_PG, _PPO_KL, _ZERO_LOWER)),
    Loss("verl/gpg", lambda c: gpg_terms(c.logp, c.adv, c.offsets),
         "GPG (the plain policy gradient A·logp)", token_ratio=True),
    Loss("verl/clip_cov", _clip_cov,
         "Clip-Cov (the gradient of a few high-covariance tokens removed)",
         params=ClipCovParams, token_ratio=True, whole_batch=_COVARIANCE,
         metrics=(_pg("selected", "the tokens whose gradient is removed"), _PPO_KL),
         clip=("actor/pg_clipfrac",)),
    Loss("verl/kl_cov", _kl_cov, "KL-Cov (a |Δ| penalty on the highest-covariance tokens)",
         params=KlCovParams, token_ratio=True, whole_batch=_COVARIANCE,
         metrics=(_PPO_KL._replace(key="abs_delta", doc="mean of |Δ| (verl logs it as ppo_kl)"),)),
    Loss("verl/geo_mean", _geo_mean,
         "GMPO (the geometric mean of the token ratios, clipped in log space)",
         agg="seq-mean-token-mean", token_ratio=True, correction="inside",
         metrics=(_pg("clipped_high", "A > 0 tokens clipped"), _PPO_KL,
                  _lower("clipped_low", "A < 0 tokens clipped")),
         clip=("actor/pg_clipfrac", "actor/pg_clipfrac_lower")),
    Loss("verl/dro", _dro, "DRO (the policy gradient with a quadratic log-ratio penalty)",
         params=DroParams, token_ratio=True, metrics=(_PPO_KL,)),
    Loss("verl/cispo", _cispo,
         "CISPO (the ratio clipped to [1−ε, 1+ε], detached, times A·logp)",
         token_ratio=True,
         metrics=(_pg("clipped", "tokens whose weight differs from ρ"), _PPO_KL, _ZERO_LOWER),
         clip=("actor/pg_clipfrac",)),
    Loss("verl/bypass_mode", _bypass,
         "verl's bypass mode (rollout_logp as the old policy, its own IS weights and "
         "rejection)",
         params=BypassParams, token_ratio=True, metrics=_bypass_metrics,
         clip=lambda p: ("actor/pg_clipfrac",)
         if getattr(p, "bypass_loss_type", "") == "ppo_clip" else None,
         correction="own", own_correction="verl-rollout", needs=("rollout_logp",),
         describe=_bypass_words, fold_note=_bypass_note),
)  # fmt: skip


# ---------------------------------------------------------------- the correction
def _rollout(old: F64, rollout: F64, offsets: I64, p: Params) -> Correction:
    assert isinstance(p, RolloutParams)
    return verl_rollout_correction(
        old, rollout, offsets, rollout_is=p.rollout_is,  # type: ignore[arg-type]
        rollout_is_threshold=p.rollout_is_threshold,
        rollout_is_batch_normalize=p.rollout_is_batch_normalize, rollout_rs=p.rollout_rs,
        rollout_rs_threshold=p.rollout_rs_threshold,
    )  # fmt: skip


def _rollout_kind(name: str, seq: bool) -> tuple[str, str]:
    """How a ``rollout_corr/*`` metric of verl 0.9.1 folds: ("mean" | "min" | "max" |
    "single", "tokens" | "answers"); a "single" statistic of one batch does not merge."""
    bare = name.removeprefix("rollout_corr/")
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
    option = next((o for o in RS_OPTIONS if rest.startswith(o + "_")), None)
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


def _rollout_words(p: Params) -> str:
    rs = getattr(p, "rollout_rs", None)
    return "" if rs is None else f" and its rejection sampling ({rs})"


def _all_rejected(p: Params) -> str:
    assert isinstance(p, RolloutParams)
    return (
        f"verl's rejection sampling (rollout_rs {p.rollout_rs}, threshold "
        f"{p.rollout_rs_threshold}) rejected every token: no loss is left to compute (verl's "
        "would divide by 0); loosen rollout_rs_threshold"
    )


CORRECTIONS = (
    CorrectionRow(
        "verl-rollout", "verl", _rollout, "verl's rollout IS weights",
        params=RolloutParams,
        per_answer=lambda p: getattr(p, "rollout_is", None) == "sequence",
        rejects=lambda p: getattr(p, "rollout_rs", None) is not None,
        is_bound=lambda p: None if getattr(p, "rollout_is", None) is None
        else _is_threshold(p.rollout_is_threshold)[0],  # type: ignore[attr-defined]
        batch_normalized=lambda p: bool(getattr(p, "rollout_is_batch_normalize", False)),
        metric_kind=_rollout_kind, describe=_rollout_words, all_rejected=_all_rejected,
        scope="verl's rollout correction is computed over its whole training batch",
        rejection="verl's rejection sampling (rollout_rs)",
    ),
)  # fmt: skip
