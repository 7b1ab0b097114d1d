"""verl's own policy losses, each with its registry row (:mod:`grpo_cli.losses.registry`).

Mirrors verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` (the ``register_policy_loss``
registry: ``compute_policy_loss_*``). verl's ``vanilla`` and ``gspo`` are the core's
clipped surrogate (the row ``clip``); its rollout correction and the bypass mode that
computes one in the loss are in :mod:`grpo_cli.losses.verl_rollout`. numpy only, no I/O,
no globals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..core import clipped_surrogate, segment_sum
from ..errors import InputError, SettingError, UsageError
from .registry import (
    F64,
    I64,
    Bools,
    CorrectionRow,
    Loss,
    LossCall,
    Mask,
    Metric,
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
    param,
)
from .trl import SapoParams, cispo_terms, sapo_terms

__all__ = [
    "LOSSES",
    "VERL_CLAMP",
    "ClipCovParams",
    "DroParams",
    "KlCovParams",
    "clip_cov_terms",
    "dppo_terms",
    "dro_terms",
    "geo_mean_terms",
    "gpg_terms",
    "kl_cov_terms",
]

Divergence = Literal["tv", "kl"]


Selection = Literal["expected", "order"]


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
    rho = _exp(used)
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
    corr = _kept(T, idx, min(k, n), selection, order)
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


def _kept(T: int, idx: I64, chosen: int, selection: Selection, order: ArrayLike | None) -> F64:
    """Each token's factor of Clip-Cov's term: 0 on the candidates chosen (``order``: the
    trainer's permutation of the candidates ``idx``, its first ``chosen``), else in
    expectation ``1 − chosen/n`` on every candidate; 1 elsewhere."""
    corr = np.ones(T)
    n = idx.shape[0]
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
    return corr


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
    sel = _top_first(cov, k)
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


def _top_first(x: F64, k: int) -> Bools:
    """The ``k`` largest of ``x``, ties taken in token order: the first ``k`` of
    ``np.argsort(-x, kind="stable")`` (NaN last), found by one partition instead of a sort
    of the batch."""
    T = x.shape[0]
    if k >= T:
        return np.ones(T, dtype=bool)
    if np.isnan(x).any():  # a partition ranks NaN first, the sort last: sort
        sel = np.zeros(T, dtype=bool)
        sel[np.argsort(-x, kind="stable")[:k]] = True
        return sel
    v = np.partition(x, T - k)[T - k]  # the k-th largest
    sel = x > v
    ties = np.flatnonzero(x == v)[: k - int(np.count_nonzero(sel))]
    sel[ties] = True
    return sel


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
        j = _mul(j, _exp(segment_sum(np.log(w + 1e-10), off) / n))
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
)  # fmt: skip
CORRECTIONS: tuple[CorrectionRow, ...] = ()
MASKS: tuple[Mask, ...] = ()
