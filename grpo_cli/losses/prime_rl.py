"""prime-rl's own policy losses, each with its registry row (:mod:`grpo_cli.losses.registry`).

Mirrors prime-rl commit 559b4477 (PrimeIntellect-ai/prime-rl, 2026-08-21),
``src/prime_rl/trainer/rl/loss.py``: ``default_loss_fn`` (109-161, DPPO-Binary-TV masking
plus a τ·(log ρ)² KL), ``ipo_loss_fn`` (164-196), ``compute_mismatch_kl`` (100-106) and the
per-sample metrics ``compute_loss`` appends (358-392); their configs
``DefaultLossConfig`` / ``IPOLossConfig`` (``configs/trainer.py`` 494-507). Read, not
copied: the formulas below are written from that code's arithmetic
(``conformance/frontier/LAYOUTS.md``, "prime-rl (b)").

prime-rl's ratio is the trainer's against the *sampler's* log-probs: ρ = exp(trainer −
inference). grpo-cli takes the trainer's as ``logp`` and the sampler's as ``old_logp``
(the reader of its token exports maps them so), so ``ρ = exp(logp − old_logp)`` here.
numpy only, no I/O, no globals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..core import segment_count, segment_sum
from .registry import (
    F64,
    Bools,
    CorrectionRow,
    Loss,
    LossCall,
    Mask,
    Metric,
    Params,
    PolicyTerms,
    Spec,
    _exp,
    _inputs,
    _mul,
    _positive,
    param,
)

__all__ = ["LOSSES", "DppoParams", "IpoParams", "dppo_binary_terms", "mismatch_kl"]

Rule = Literal["tv", "ipo"]


def mismatch_kl(log_ratio: ArrayLike) -> F64:
    """prime-rl's mismatch KL per token: ``ρ − log ρ − 1`` with ``log ρ = trainer −
    inference`` (k3 of the sampler against the trainer; ≥ 0, 0 where they agree).

    Example:
        >>> mismatch_kl([0.0, np.log(2.0)]).round(6).tolist()
        [0.0, 0.306853]
    """
    x = np.asarray(log_ratio, dtype=np.float64)
    with np.errstate(over="ignore"):
        out: F64 = _exp(x) - x - 1.0
    return out


def _share(flags: Bools, where: Bools, off: np.ndarray) -> F64:
    """Per answer, the share of its ``where`` tokens that are ``flags`` (0 with none)."""
    n = segment_count(where, off).astype(np.float64)
    k = segment_count(flags & where, off).astype(np.float64)
    return np.divide(k, n, out=np.zeros(n.shape), where=n > 0)


def _mean_over(x: F64, where: Bools, off: np.ndarray) -> F64:
    """Per answer, the mean of ``x`` over its ``where`` tokens (0 with none)."""
    n = segment_count(where, off).astype(np.float64)
    s = segment_sum(np.where(where, x, 0.0), off)
    return np.divide(s, n, out=np.zeros(n.shape), where=n > 0)


def dppo_binary_terms(
    logp: ArrayLike,
    old_logp: ArrayLike,
    adv: ArrayLike,
    offsets: ArrayLike,
    *,
    rule: Rule = "tv",
    mask_low: float = 0.2,
    mask_high: float = 0.2,
    ipo_threshold: float = 0.1,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
) -> PolicyTerms:
    """DPPO-Binary masking of ``A·ρ`` with a ``τ·(log ρ)²`` KL, prime-rl's default loss.

    With ``log ρ = logp − old_logp`` (trainer − sampler), ``ρ = e^{log ρ}`` and ``δ =
    e^logp − e^old_logp`` (the change in probability):

    - ``"tv"`` (``default_loss_fn``): masked ⇔ ``δ > mask_high`` where ``A > 0``, ``δ <
      −mask_low`` where ``A ≤ 0`` (``torch.where(A > 0, …)``: A = 0 takes the low test,
      but ``is_masked_low`` counts only A < 0);
    - ``"ipo"`` (``ipo_loss_fn``): masked ⇔ ``|δ| > ipo_threshold``;

    ``term = keep·adv_tau·A·ρ − kl_tau·(log ρ)²`` (the objective: minus prime-rl's
    per-token loss; ρ is not detached), ``keep = ¬masked``; ``grad = keep·adv_tau·A·ρ −
    2·kl_tau·log ρ``. prime-rl sums the terms over a step's loss tokens and divides by
    their count over every rank (``rl_scale``): the token mean.

    Metrics (``compute_loss``'s per-sample values, as shares over the sample's loss
    tokens, one value an answer in ``answer_values``):
    ``is_masked`` (``is_masked_low``/``_high`` for ``"tv"``), ``masked_mismatch_kl`` /
    ``unmasked_mismatch_kl`` (the mean mismatch KL over its masked / kept tokens, 0 with
    none), ``masked_advantage_positive`` / ``_negative`` (the share of its masked tokens
    with A > 0 / A < 0, 0 with none); per token ``mismatch_kl`` (:func:`mismatch_kl`), its
    square, and per sample its largest mismatch KL (``mismatch_kl_max``).

    See DPPO (arXiv:2602.04879); prime-rl 559b4477 ``trainer/rl/loss.py``.

    Folds: per token (the per-sample values need the whole sample, as every loss here).

    Example:
        >>> t = dppo_binary_terms(np.log([0.5, 0.9]), np.log([0.5, 0.5]), [1.0], [0, 2])
        >>> t.flags["is_masked"].tolist(), t.term.round(4).tolist()
        ([False, True], [1.0, -0.0003])
    """
    off, a, x = _inputs(offsets, adv, logp=logp, old_logp=old_logp)
    assert a is not None
    for name, v in (("adv_tau", adv_tau), ("kl_tau", kl_tau)):
        _positive(name, v, zero=True)
    lp, old = x["logp"], x["old_logp"]
    with np.errstate(invalid="ignore"):
        lr, delta = lp - old, _exp(lp) - _exp(old)
    rho = _exp(lr)
    with np.errstate(invalid="ignore"):
        mkl = rho - lr - 1.0  # mismatch_kl(lr), its exponential shared with ρ
    pos, neg = a > 0, a < 0
    up, down = delta > mask_high, delta < -mask_low
    masked = np.where(pos, up, down) if rule == "tv" else (np.abs(delta) > ipo_threshold)
    keep = ~masked
    policy = np.where(keep, _mul(a, rho) * adv_tau, 0.0)
    kl = _mul(lr, lr) * kl_tau
    grad = policy - 2.0 * kl_tau * lr
    flags = {"is_masked": masked}
    values = {"mismatch_kl": mkl, "mismatch_kl_sq": _mul(mkl, mkl)}
    # the per-sample values, one an answer (each answer holds a token: offsets checked)
    per_answer = {
        "mismatch_kl_max": np.maximum.reduceat(mkl, off[:-1]) if mkl.size else mkl,
        "masked_mismatch_kl": _mean_over(mkl, masked, off),
        "unmasked_mismatch_kl": _mean_over(mkl, keep, off),
    }
    if rule == "tv":
        flags |= {"is_masked_low": neg & down, "is_masked_high": pos & up}
        per_answer |= {
            "masked_advantage_positive": _share(pos, masked, off),
            "masked_advantage_negative": _share(neg, masked, off),
        }
    return PolicyTerms(
        term=policy - kl, grad=grad, ratio=rho, weight=keep.astype(np.float64),
        flags=flags, values=values, answer_values=per_answer,
    )  # fmt: skip


def _micro_batches(v: object) -> str | None:
    return None if v is None or float(v) >= 1 else "expected a count >= 1"  # type: ignore[arg-type]


_MB = Spec(
    "int", optional=True, check=_micro_batches,
    help="the step's micro-batches over every rank (loss/mean is the step's loss over "
    "them); the token-export reader counts them",
)  # fmt: skip
_ADV = Spec(low=0.0, closed=True, help="adv_tau: the advantage term's coefficient")
_KL = Spec(low=0.0, closed=True, help="kl_tau: the (log ρ)² term's coefficient")


@dataclass(frozen=True)
class DppoParams(Params):
    """``DefaultLossConfig`` (prime-rl 559b4477 configs/trainer.py:494-507)."""

    dppo_mask_low: float = param(
        0.2, Spec(low=0.0, closed=True, help="δ below −low: masked (A ≤ 0)")
    )
    dppo_mask_high: float = param(
        0.2, Spec(low=0.0, closed=True, help="δ above high: masked (A > 0)")
    )
    adv_tau: float = param(1.0, _ADV)
    kl_tau: float = param(1e-3, _KL)
    micro_batches: int | None = param(None, _MB)


@dataclass(frozen=True)
class IpoParams(Params):
    """``IPOLossConfig`` (prime-rl 559b4477 configs/trainer.py)."""

    ipo_threshold: float = param(0.1, Spec(low=0.0, closed=True, help="|δ| above it: masked"))
    adv_tau: float = param(1.0, _ADV)
    kl_tau: float = param(1e-3, _KL)
    micro_batches: int | None = param(None, _MB)


def _terms(rule: Rule) -> Callable[[LossCall], PolicyTerms]:
    def terms(c: LossCall) -> PolicyTerms:
        p = c.params
        if isinstance(p, DppoParams):
            return dppo_binary_terms(
                c.logp, c.old, c.adv, c.offsets, rule="tv", mask_low=p.dppo_mask_low,
                mask_high=p.dppo_mask_high, adv_tau=p.adv_tau, kl_tau=p.kl_tau,
            )  # fmt: skip
        assert isinstance(p, IpoParams)
        return dppo_binary_terms(
            c.logp, c.old, c.adv, c.offsets, rule="ipo", ipo_threshold=p.ipo_threshold,
            adv_tau=p.adv_tau, kl_tau=p.kl_tau,
        )  # fmt: skip

    return terms


def _per_sample(name: str, doc: str, key: str | None = None) -> tuple[Metric, Metric]:
    """A per-sample metric as prime-rl logs it: its mean and its max over the step's
    samples (``Tensors.compute_stats`` filtered to mean and max)."""
    k = key or name
    return (Metric(f"{name}/mean", k, "answers", doc), Metric(f"{name}/max", k, "answer_max", doc))


_TOKEN = (
    Metric("mismatch_kl/all/mean", "mismatch_kl", "tokens", "ρ − log ρ − 1 over loss tokens"),
    Metric("_mismatch_kl_sq", "mismatch_kl_sq", "tokens", "its square (for its std)"),
    Metric("mismatch_kl/all/max", "mismatch_kl_max", "answer_max", "its largest value"),
)
_KL_SPLIT = (
    *_per_sample("masked_mismatch_kl", "mean mismatch KL over a sample's masked tokens"),
    *_per_sample("unmasked_mismatch_kl", "mean mismatch KL over a sample's kept tokens"),
)
_TV_METRICS = (
    *_per_sample("is_masked", "share of a sample's loss tokens masked"),
    *_per_sample("is_masked_low", "share masked by the low test (A ≤ 0)"),
    *_per_sample("is_masked_high", "share masked by the high test (A > 0)"),
    *_per_sample("masked_advantage_positive", "share of a sample's masked tokens with A > 0"),
    *_per_sample("masked_advantage_negative", "share of a sample's masked tokens with A < 0"),
    *_KL_SPLIT,
    *_TOKEN,
)
_IPO_METRICS = (*_per_sample("is_masked", "share of a sample's loss tokens masked"),
                *_KL_SPLIT, *_TOKEN)  # fmt: skip

LOSSES = (
    Loss("prime_rl/dppo_tv", _terms("tv"),
         "DPPO-Binary-TV (A·ρ masked where the probability moved past a bound in A's "
         "direction) plus kl_tau·(log ρ)², ρ against the sampler",
         params=DppoParams, agg="token-mean", token_ratio=True, metrics=_TV_METRICS,
         clip=("is_masked/mean",)),
    Loss("prime_rl/ipo", _terms("ipo"),
         "IPO (A·ρ masked where |Δp| passed a threshold) plus kl_tau·(log ρ)², ρ against "
         "the sampler",
         params=IpoParams, agg="token-mean", token_ratio=True, metrics=_IPO_METRICS,
         clip=("is_masked/mean",)),
)  # fmt: skip
CORRECTIONS: tuple[CorrectionRow, ...] = ()
MASKS: tuple[Mask, ...] = ()
