"""The seed spec's padded ``grpo_objective`` (``(N, L)`` arrays and a mask), a thin front
over the ragged kernels."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InputError, UsageError
from .aggregate import aggregate
from .ragged import flatten_padded
from .terms import token_terms
from .types import _bool_array, _check_rank, _real_array, _same_shape


def grpo_objective(
    logp: ArrayLike,
    old_logp: ArrayLike,
    ref_logp: ArrayLike,
    advantages: ArrayLike,
    mask: ArrayLike,
    clip_eps: float = 0.2,
    beta: float = 0.04,
) -> float:
    """GRPO objective J (maximised; the loss is −J), DeepSeekMath (Shao et al. 2024) eq. 3.

    ``J = (1/N) Σ_i (1/|o_i|) Σ_{t∈o_i} [min(ρ A_i, clip(ρ, 1−ε, 1+ε) A_i) − β k3]``
    with ``ρ = exp(logp − old_logp)`` and k3 as in :func:`kl_k3`. Padding (mask False)
    may hold any finite value and never changes the result; inputs are not modified.

    Args:
        logp, old_logp, ref_logp: ``(N, L)`` real log-probs.
        advantages: ``(N,)`` one advantage per answer.
        mask: ``(N, L)`` bool (or 0/1); every row has at least one True.
        clip_eps: ε, ``>= 0``.
        beta: KL weight β, ``>= 0``.

    Returns:
        J as a Python float.

    Example:
        >>> logp = np.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
        >>> old = np.array([[-1.1, -0.5, -1.0], [-0.6, -1.0, 0.0]])
        >>> ref = np.array([[-1.2, -0.4, -1.5], [-0.4, -1.1, 0.0]])
        >>> m = np.array([[True, True, True], [True, True, False]])
        >>> grpo_objective(logp, old, ref, np.array([1.0, -1.0]), m)
        -0.13122323326245566
    """
    m = _bool_array("mask", mask)
    a = _real_array("logp", logp)
    o = _real_array("old_logp", old_logp)
    r = _real_array("ref_logp", ref_logp)
    adv = _real_array("advantages", advantages)
    _check_rank("logp", a, 2, "(N, L)")
    _same_shape(logp=a, old_logp=o, ref_logp=r, mask=m)
    _check_rank("advantages", adv, 1, "(N,)")
    if adv.shape[0] != a.shape[0]:
        raise InputError(f"advantages: expected shape ({a.shape[0]},), got {adv.shape}")
    if not (np.isfinite(clip_eps) and clip_eps >= 0):
        raise UsageError(f"clip_eps must be a finite number >= 0, got {clip_eps}")
    if not (np.isfinite(beta) and beta >= 0):
        raise UsageError(f"beta must be a finite number >= 0, got {beta}")
    empty = np.flatnonzero(~m.any(axis=1))
    if empty.size:
        raise InputError(f"mask: answer {int(empty[0])} has no valid token")
    offsets, (lp, olp, rlp) = flatten_padded(m, a, o, r)
    for name, v in (("logp", lp), ("old_logp", olp), ("ref_logp", rlp)):
        if not np.isfinite(v).all():
            raise InputError(f"{name}: non-finite value inside the mask")
    terms = token_terms(lp, olp, rlp, adv, offsets, clip_eps=clip_eps, beta=beta)
    return aggregate(terms.term, offsets, agg="seq-mean-token-mean")
