"""The per-token terms: KL estimators, log-ratios, the clipped surrogate, the options
record of every convention, and the terms' gradients."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict, Unpack

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import InputError, UsageError
from .ragged import segment_mean, segment_sum
from .types import (
    F64,
    I64,
    FloatArray,
    KLEstimator,
    RatioLevel,
    _real_array,
    _same_shape,
    check_offsets,
)


# ------------------------------------------------------------------------------- KL
def kl_estimate(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    *,
    estimator: KLEstimator = "k3",
    clamp: float | None = None,
    log_ratio_clamp: float | None = None,
) -> F64:
    """Per-token estimate of KL(π_θ ‖ π_ref) from log-probs of sampled tokens.

    With ``x = logp − ref_logp`` and ``d = −x = ref_logp − logp`` (Schulman 2020,
    "Approximating KL divergence"):

    - ``k1 = x`` (unbiased, can be negative);
    - ``k2 = x² / 2``;
    - ``k3 = exp(d) − d − 1`` (unbiased, ``>= 0``; DeepSeekMath eq. 4, the seed's form).

    ``log_ratio_clamp`` clamps ``d`` to ``[−c, c]`` before the exponential of k3 (verl
    ``low_var_kl`` uses 20); ``clamp`` clamps the estimate to ``[−c, c]`` (verl, OpenRLHF: 10).

    Args:
        logp, ref_logp: real arrays of equal shape.

    Returns:
        float64 array of the inputs' shape.

    Example:
        >>> kl_estimate([-1.0, -2.0], [-1.5, -1.0], estimator="k1").tolist()
        [0.5, -1.0]
    """
    a = _real_array("logp", logp, keep_float=True)
    b = _real_array("ref_logp", ref_logp, keep_float=True)
    _same_shape(logp=a, ref_logp=b)
    d = difference(b, a)
    return kl_from_log_ratio(d, estimator=estimator, clamp=clamp, log_ratio_clamp=log_ratio_clamp)


def kl_from_log_ratio(
    d: F64,
    *,
    estimator: KLEstimator = "k3",
    clamp: float | None = None,
    log_ratio_clamp: float | None = None,
) -> F64:
    """The KL estimate as a function of ``d = ref_logp − logp`` (see :func:`kl_estimate`).

    ``k1 = −d``, ``k2 = d²/2``, ``k3 = exp(d) − d − 1``, evaluated in that order of
    operations. ``d`` is not modified.

    Example:
        >>> kl_from_log_ratio(np.array([0.0, -1.0]), estimator="k2").tolist()
        [0.0, 0.5]
    """
    if estimator == "k3":
        if log_ratio_clamp is not None:
            d = np.clip(d, -log_ratio_clamp, log_ratio_clamp)
        with np.errstate(over="ignore", invalid="ignore"):
            k = np.exp(d)
            k -= d
            k -= 1.0
        k[d == np.inf] = np.inf  # e^d − d at d = +inf: inf − inf, whose limit is +inf
    elif estimator == "k2":
        k = 0.5 * d
        k *= d
    elif estimator == "k1":
        k = np.negative(d)
    else:
        raise UsageError(f"KL estimator must be k1, k2 or k3, got {estimator!r}")
    if clamp is not None:
        np.clip(k, -clamp, clamp, out=k)
    return k


def kl_k3(logp: ArrayLike, ref_logp: ArrayLike) -> F64:
    """k3 estimate of KL(π_θ ‖ π_ref) per token: ``π_ref/π_θ − log(π_ref/π_θ) − 1``.

    Computed in log space as ``exp(d) − d − 1`` with ``d = ref_logp − logp``, so it never
    divides probabilities. Always ``>= 0``, and 0 exactly where the log-probs agree.
    See DeepSeekMath (Shao et al. 2024) eq. 4; Schulman (2020).

    Args:
        logp: log π_θ of the sampled tokens, any shape.
        ref_logp: log π_ref, the same shape.

    Returns:
        float64 array of the inputs' shape.

    Example:
        >>> kl_k3(np.array([-1.0, -2.0, -0.5]), np.array([-1.0, -1.5, -1.0]))
        array([0.        , 0.14872127, 0.10653066])
    """
    return kl_estimate(logp, ref_logp, estimator="k3")


# ------------------------------------------------------------------- ratio and clip
def difference(a: FloatArray, b: FloatArray) -> F64:
    """``a − b`` in float64 (float32 inputs widen inside the subtraction). Finite log-probs
    of ±1e308 can differ by more than float64 holds: the result is then ±inf, which the
    statistics count and report, never a warning on stderr.

    Example:
        >>> difference(np.array([-1e308]), np.array([1e308])).tolist()
        [-inf]
    """
    with np.errstate(over="ignore"):
        return np.subtract(a, b, dtype=np.float64)


def log_ratio(logp: FloatArray, old_logp: FloatArray, *, clamp: float | None = None) -> F64:
    """Per-token log importance ratio ``Δ = logp − old_logp`` in float64 (float32 inputs are
    widened inside the subtraction), optionally clamped to ``[−c, c]``.

    verl and OpenRLHF clamp at 20 before ``exp``; TRL does not clamp.
    """
    d = difference(logp, old_logp)
    if clamp is not None:
        np.clip(d, -clamp, clamp, out=d)
    return d


def sequence_log_ratio(
    delta: F64, offsets: I64, *, upper: float | None = None, mean: F64 | None = None
) -> F64:
    """GSPO sequence-level log-ratio, broadcast to tokens: ``log s_i = mean_t Δ_{i,t}``.

    See Zheng et al. 2025, "Group Sequence Policy Optimization", eq. 7: the ratio of an
    answer is the geometric mean of its token ratios, applied to each of its tokens.
    ``upper`` bounds ``log s_i`` from above, after the mean (verl 0.9.1 clamps at 10).
    ``mean``: the answers' mean ``Δ`` when known beyond ``delta`` (an answer folded a slice
    of its tokens at a time).

    Returns:
        ``(T,)``: answer ``i``'s mean log-ratio repeated over its tokens.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets` (without
            ``mean``, an answer without a token too), or ``mean`` is not ``(N,)``.
    """
    offsets = check_offsets(offsets, delta.shape[0], nonempty=mean is None)
    if mean is not None and np.shape(mean) != (offsets.shape[0] - 1,):
        raise InputError(f"mean: expected shape ({offsets.shape[0] - 1},), got {np.shape(mean)}")
    seq = segment_mean(delta, offsets) if mean is None else np.array(mean, dtype=np.float64)
    if upper is not None:
        np.minimum(seq, upper, out=seq)
    return np.repeat(seq, np.diff(offsets))


def clipped_surrogate(
    ratio: F64,
    adv: F64,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
) -> F64:
    """PPO clipped surrogate per token (maximised): ``min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)``.

    See Schulman et al. 2017 (PPO) eq. 7; decoupled ``ε_high`` is DAPO's clip-higher
    (Yu et al. 2025); with ``dual_clip = c`` the term of a token with ``A < 0`` is bounded
    below by ``c·A`` (Ye et al. 2020, dual-clip PPO; verl ``clip_ratio_c``).

    A token with ``A = 0`` contributes exactly 0, even where ``ρ`` overflowed to inf.

    Args:
        ratio: ``(T,)`` importance ratios ``ρ >= 0`` (may hold inf).
        adv: ``(T,)`` advantages.
        clip_eps: ε_low (and ε_high unless given), ``>= 0``.
        clip_eps_high: ε_high.
        dual_clip: ``c > 1`` or None.

    Returns:
        ``(T,)`` float64 per-token policy term.

    Example:
        >>> clipped_surrogate(np.array([1.5, 0.5, 1.5]), np.array([1.0, -1.0, -1.0])).tolist()
        [1.2, -0.8, -1.5]
    """
    if ratio.ndim != 1 or ratio.shape != adv.shape:
        raise InputError(f"ratio, adv: expected equal shapes (T,), got {ratio.shape}, {adv.shape}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    for name, e in (("clip_eps", clip_eps), ("clip_eps_high", high)):
        if not (np.isfinite(e) and e >= 0):
            raise UsageError(f"{name}: must be a finite number >= 0, got {e}")
    if dual_clip is not None and not dual_clip > 1:
        raise UsageError(f"dual_clip: must be > 1, got {dual_clip}")
    lo = 1.0 - clip_eps
    hi = 1.0 + high
    # inf·0 (a ratio that overflowed, on a token with A = 0) is the only invalid operation
    # possible; catching the floating-point flag costs nothing when it does not happen.
    with np.errstate(over="ignore", invalid="raise"):
        try:
            return _surrogate(ratio, adv, lo, hi, dual_clip)
        except FloatingPointError:
            pass
    with np.errstate(over="ignore", invalid="ignore"):
        term = _surrogate(ratio, adv, lo, hi, dual_clip)
    term[np.isnan(term) & (adv == 0)] = 0.0
    return term


def _surrogate(ratio: F64, adv: F64, lo: float, hi: float, dual_clip: float | None) -> F64:
    term = ratio * adv
    clipped = np.clip(ratio, lo, hi)
    clipped *= adv
    np.minimum(term, clipped, out=term)
    if dual_clip is not None:  # max(term, c·A) where A < 0; untouched where A >= 0
        floor = adv * dual_clip
        floor[adv >= 0] = -np.inf
        np.maximum(term, floor, out=term)
    return term


# ------------------------------------------------------------------- per-token terms
@dataclass(frozen=True)
class TokenTerms:
    """Every per-token quantity of the GRPO objective, ragged ``(T,)`` arrays.

    ``term = policy − β·kl_loss`` is the per-token objective; ``delta`` is the raw token
    log-ratio ``logp − old_logp`` (before any clamp), ``ratio`` the ratio the surrogate used
    (after the clamps, at token or sequence level).
    ``kl`` is the KL estimate of ``logp`` against ``ref_logp`` (None without a reference
    policy), ``kl_loss`` the KL as it enters the loss (``kl · ratio`` with the bias
    correction, else ``kl`` itself); ``ref_delta`` is ``ref_logp − logp``, the KL's argument.
    """

    delta: F64
    ratio: F64
    adv: F64
    policy: F64
    kl: F64 | None
    term: F64
    ref_delta: F64 | None = None
    kl_loss: F64 | None = None


@dataclass(frozen=True)
class TermOptions:
    """The conventions of the per-token terms, in one record: what :func:`token_terms`,
    :func:`token_gradients` and the compiled kernel (:func:`grpo_cli.core.kernel.fold`) take.

    ``clip_eps`` ε_low (and ε_high unless ``clip_eps_high``), ``dual_clip`` c (None: off),
    ``log_ratio_clamp`` (None: off; clamps Δ before ``exp`` at token level, and k3's
    exponent), ``seq_ratio_clamp`` (the sequence log-ratio's upper bound),
    ``ratio_level`` token|sequence, ``beta`` β, ``kl_estimator`` k1|k2|k3, ``kl_clamp``,
    ``kl_bias_correction`` (TRL: the loss's KL times the ratio). The functions also take
    these as keywords (:class:`TermConventions`), which override ``options``.

    Example:
        >>> TermOptions(beta=0.0).eps_high
        0.2
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    log_ratio_clamp: float | None = None
    seq_ratio_clamp: float | None = None
    ratio_level: RatioLevel = "token"
    beta: float = 0.04
    kl_estimator: KLEstimator = "k3"
    kl_clamp: float | None = None
    kl_bias_correction: bool = False

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @classmethod
    def of(cls, source: object, **overrides: Any) -> TermOptions:
        """The options named like attributes of ``source`` (e.g. a
        :class:`~grpo_cli.settings.Settings`), then ``overrides``."""
        values = {f.name: getattr(source, f.name) for f in fields(cls)}
        return cls(**{**values, **overrides})


class TermConventions(TypedDict, total=False):
    """:class:`TermOptions` as keywords (the same names and types; tests/test_core.py
    checks that the two agree)."""

    clip_eps: float
    clip_eps_high: float | None
    dual_clip: float | None
    log_ratio_clamp: float | None
    seq_ratio_clamp: float | None
    ratio_level: RatioLevel
    beta: float
    kl_estimator: KLEstimator
    kl_clamp: float | None
    kl_bias_correction: bool


def term_options(options: TermOptions | None, conventions: TermConventions) -> TermOptions:
    """``options`` (default: :class:`TermOptions`'s defaults) with the keyword
    ``conventions`` applied."""
    base = TermOptions() if options is None else options
    return replace(base, **conventions) if conventions else base


def used_log_ratio(
    delta: F64,
    offsets: I64,
    *,
    ratio_level: RatioLevel = "token",
    log_ratio_clamp: float | None = None,
    seq_ratio_clamp: float | None = None,
    seq_mean: F64 | None = None,
) -> F64:
    """The log of the ratio the surrogate uses, per token, from the raw ``Δ = logp − old_logp``.

    - ``"token"``: ``Δ`` clamped to ``[−c, c]`` with ``c = log_ratio_clamp`` (verl and
      OpenRLHF clamp at 20 before ``exp``; TRL does not clamp).
    - ``"sequence"`` (GSPO, Zheng et al. 2025, eq. 7): the answer's mean of the *raw* ``Δ``
      (no trainer clamps before the mean: verl 0.9.1 ``compute_policy_loss_gspo``,
      OpenRLHF 0.11.2 ``PolicyLoss``, TRL 1.16.0), then bounded from above by
      ``seq_ratio_clamp`` (verl: 10), repeated over the answer's tokens.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets` (at sequence
            level an answer without a token too, when ``seq_mean`` is not given).

    Example:
        >>> used_log_ratio(np.array([30.0, -1.0]), np.array([0, 1, 2]), log_ratio_clamp=20.0)
        array([20., -1.])
        >>> used_log_ratio(np.array([30.0, -2.0]), np.array([0, 2]), ratio_level="sequence",
        ...                seq_ratio_clamp=10.0)
        array([10., 10.])
    """
    sequence = ratio_level == "sequence"
    offsets = check_offsets(offsets, delta.shape[0], nonempty=sequence and seq_mean is None)
    if sequence:
        return sequence_log_ratio(delta, offsets, upper=seq_ratio_clamp, mean=seq_mean)
    if log_ratio_clamp is None:
        return delta
    return np.clip(delta, -log_ratio_clamp, log_ratio_clamp)


def token_terms(
    logp: FloatArray,
    old_logp: FloatArray | None,
    ref_logp: FloatArray | None,
    adv: F64,
    offsets: I64,
    *,
    options: TermOptions | None = None,
    seq_mean: F64 | None = None,
    **conventions: Unpack[TermConventions],
) -> TokenTerms:
    """Per-token GRPO terms of ragged data: ``policy − β · KL`` (DeepSeekMath eq. 3).

    The ratio is :func:`used_log_ratio`'s, exponentiated. With ``kl_bias_correction`` the
    per-token KL entering the loss is multiplied by that ratio (TRL 1.16.0
    ``use_bias_correction_kl``: an importance weight, since the tokens were sampled from
    π_θold); the KL statistics keep describing ``logp`` against ``ref_logp``.

    Args:
        logp: ``(T,)`` log π_θ, float32 or float64 (every result is float64).
        old_logp: ``(T,)`` log π_θold, or None for an on-policy batch (ρ = 1).
        ref_logp: ``(T,)`` log π_ref, or None (then ``beta`` must be 0).
        adv: ``(N,)`` one advantage per answer, or ``(T,)`` one per token.
        offsets: ``(N+1,)``.
        options: the conventions (:class:`TermOptions`; default its defaults), each of
            which a keyword of the same name (``clip_eps=``, ``beta=``, ...) overrides.
        seq_mean: ``(N,)`` the answers' mean ``Δ`` for the sequence-level ratio, when the
            batch holds a slice of an answer's tokens (else computed from ``offsets``).

    Returns:
        :class:`TokenTerms`.

    Raises:
        InputError: ``offsets`` breaks its contract (no empty answer), or the arrays'
            shapes disagree with it.
    """
    T = logp.shape[0]
    offsets = check_offsets(offsets, T, nonempty=True)
    o = term_options(options, conventions)
    per_token = _per_token_advantages(logp, old_logp, ref_logp, adv, offsets)
    lengths = np.diff(offsets)
    if old_logp is None:
        delta = np.zeros(logp.shape[0], dtype=np.float64)
    else:
        delta = log_ratio(logp, old_logp)
    used = used_log_ratio(
        delta,
        offsets,
        ratio_level=o.ratio_level,
        log_ratio_clamp=o.log_ratio_clamp,
        seq_ratio_clamp=o.seq_ratio_clamp,
        seq_mean=seq_mean,
    )
    with np.errstate(over="ignore"):
        ratio = np.exp(used)
    adv_tok = adv if per_token else np.repeat(adv, lengths)
    policy = clipped_surrogate(
        ratio, adv_tok, clip_eps=o.clip_eps, clip_eps_high=o.clip_eps_high, dual_clip=o.dual_clip
    )
    d, kl, kl_loss = _kl_terms(logp, ref_logp, ratio, o)
    require_reference(o.beta, ref_logp)
    if o.beta != 0.0:
        assert kl_loss is not None
        term = np.multiply(kl_loss, o.beta)
        np.subtract(policy, term, out=term)
    else:
        term = policy
    return TokenTerms(
        delta=delta,
        ratio=ratio,
        adv=adv_tok,
        policy=policy,
        kl=kl,
        term=term,
        ref_delta=d,
        kl_loss=kl_loss,
    )


def _per_token_advantages(
    logp: FloatArray, old_logp: FloatArray | None, ref_logp: FloatArray | None, adv: F64,
    offsets: I64,
) -> bool:  # fmt: skip
    """The log-probs' shapes agree, and whether ``adv`` is one per token (else one per
    answer)."""
    T = logp.shape[0]
    for name, a in (("old_logp", old_logp), ("ref_logp", ref_logp)):
        if a is not None and a.shape != logp.shape:
            raise InputError(f"{name}: expected shape {logp.shape} like logp, got {a.shape}")
    per_token = adv.shape == (T,) and adv.shape != (offsets.shape[0] - 1,)
    if not per_token and adv.shape != (offsets.shape[0] - 1,):
        raise InputError(
            f"adv: expected shape ({offsets.shape[0] - 1},) or ({T},), got {adv.shape}"
        )
    return per_token


def _kl_terms(
    logp: FloatArray, ref_logp: FloatArray | None, ratio: F64, o: TermOptions
) -> tuple[F64 | None, F64 | None, F64 | None]:
    """``(d, kl, kl_loss)``: ``d = ref_logp − logp``, the per-token KL estimate, and the KL
    the loss takes (times the ratio with ``kl_bias_correction``); Nones without a
    reference."""
    if ref_logp is None:
        return None, None, None
    d = difference(ref_logp, logp)
    kl = kl_loss = kl_from_log_ratio(
        d, estimator=o.kl_estimator, clamp=o.kl_clamp, log_ratio_clamp=o.log_ratio_clamp
    )
    if o.kl_bias_correction:
        with np.errstate(over="ignore", invalid="ignore"):
            kl_loss = kl * ratio
        kl_loss[kl == 0.0] = 0.0  # an overflowed ratio times a zero KL is no NaN
    return d, kl, kl_loss


@dataclass(frozen=True)
class SequenceMeans:
    """Per answer, the means over its tokens that every token's sequence-level gradient
    takes (:func:`token_gradients`): ``Δ``, the active ``ρA``, and the KL (or None)."""

    delta: F64
    policy: F64
    kl: F64 | None


def _unclipped(terms: TokenTerms, o: TermOptions) -> NDArray[np.bool_]:
    """Tokens where ``min`` takes the unclipped branch and no dual clip binds."""
    rho, a = terms.ratio, terms.adv
    active = ((a > 0) & (rho <= 1.0 + o.eps_high)) | ((a < 0) & (rho >= 1.0 - o.clip_eps))
    if o.dual_clip is not None:
        active &= ~((a < 0) & (rho > o.dual_clip))
    return active


def sequence_sums(
    terms: TokenTerms,
    offsets: I64,
    *,
    options: TermOptions | None = None,
    **conventions: Unpack[TermConventions],
) -> tuple[F64, F64 | None]:
    """Per answer, the sums behind :class:`SequenceMeans` (active ``ρA``, KL; the mean
    ``Δ`` is the ratio's own, known before) over the tokens of ``terms``: sums of an
    answer's slices add up to the answer's.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets`.
    """
    offsets = check_offsets(offsets, terms.ratio.shape[0])
    active = _unclipped(terms, term_options(options, conventions))
    with np.errstate(over="ignore", invalid="ignore"):
        per = np.where(active, terms.ratio * terms.adv, 0.0)
    kl = None if terms.kl is None else segment_sum(terms.kl, offsets)
    return segment_sum(per, offsets), kl


def token_gradients(
    terms: TokenTerms,
    *,
    offsets: I64 | None = None,
    options: TermOptions | None = None,
    answer_means: SequenceMeans | None = None,
    **conventions: Unpack[TermConventions],
) -> tuple[F64, F64 | None]:
    """Each token's ``∂policy/∂logp_t`` and ``∂kl_loss/∂logp_t`` for the terms of
    :func:`token_terms`, before the aggregation weights (which are constant within an
    answer under every aggregation, so ``∂J/∂logp_t = c·u_i·(g_p − β·g_k)``).

    Token-level ratio (PPO's clipped surrogate, Schulman et al. 2017): with ``ρ = exp(Δ')``
    and ``Δ'`` the clamped ``Δ = logp − old_logp``, ``g_p = ρA`` where the unclipped branch
    is the one ``min`` takes (``A > 0, ρ ≤ 1+ε_high``, or ``A < 0, ρ ≥ 1−ε_low``) and no
    bound binds: 0 where the clip, the dual clip (``A < 0, ρ > c``) or ``log_ratio_clamp``
    (``|Δ| > c``) binds, and 0 for ``A = 0``.

    Sequence-level ratio (GSPO, Zheng et al. 2025): every token of answer ``i`` shares
    ``s_i = exp(min(mean_t Δ, c))`` and ``∂s_i/∂logp_t = s_i/|o_i|``, so the answer's terms
    all move together: ``g_p = mean_{t'∈i}(s_i·A_{t'}·[t' active])`` on each of its tokens
    (``s_i·A`` when the advantage is the answer's), 0 where ``seq_ratio_clamp`` binds.

    KL with ``d = ref_logp − logp`` (``∂d/∂logp = −1``): k1 ``= −d`` gives 1; k2 ``= d²/2``
    gives ``−d``; k3 ``= e^d − d − 1`` gives ``1 − e^d`` (0 where ``log_ratio_clamp`` binds
    on ``d``); 0 where ``kl_clamp`` binds. With ``kl_bias_correction`` the loss takes
    ``kl·ρ`` (TRL 1.16.0 multiplies by the undetached ratio): ``g_k = kl'·ρ + kl·ρ`` per
    token (token level, where ``Δ`` is free), ``kl'·s_i + s_i·mean_i(kl)`` (sequence level).
    The KL in the reward enters through the advantages, which the trainers detach: no term.
    ``answer_means`` gives the answer means of the sequence level when ``terms`` hold a
    slice of an answer (:func:`sequence_sums` over its slices, divided by its length).
    ``options`` and the keywords as :func:`token_terms` takes them (β plays no part).

    Raises:
        InputError: ``offsets`` (needed at sequence level) breaks the contract of
            :func:`check_offsets`.
    """
    o = term_options(options, conventions)
    rho, a = terms.ratio, terms.adv
    if offsets is not None:
        offsets = check_offsets(offsets, rho.shape[0], nonempty=answer_means is None)
    active = _unclipped(terms, o)
    if o.ratio_level == "sequence":
        if offsets is None:
            raise UsageError("the sequence-level gradient needs the answers' offsets")
        lengths = np.diff(offsets)
        m = answer_means
        free: NDArray[np.bool_] = np.ones(rho.shape, dtype=bool)
        if o.seq_ratio_clamp is not None:
            mean_delta = segment_mean(terms.delta, offsets) if m is None else m.delta
            free = np.repeat(mean_delta <= o.seq_ratio_clamp, lengths)
        with np.errstate(over="ignore", invalid="ignore"):
            per = np.where(active, rho * a, 0.0)
            mean_per = segment_mean(per, offsets) if m is None else m.policy
            gp = np.where(free, np.repeat(mean_per, lengths), 0.0)
    else:
        free = np.ones(rho.shape, dtype=bool)  # ∂Δ'/∂logp = 1: no log-ratio clamp binds
        if o.log_ratio_clamp is not None:
            free = np.abs(terms.delta) <= o.log_ratio_clamp
        with np.errstate(over="ignore", invalid="ignore"):
            gp = np.where(active & free, rho * a, 0.0)
    if terms.ref_delta is None or terms.kl is None:
        return gp, None
    return gp, _kl_gradient(terms, o, offsets, answer_means, free)


def _kl_gradient(
    terms: TokenTerms,
    o: TermOptions,
    offsets: I64 | None,
    answer_means: SequenceMeans | None,
    free: NDArray[np.bool_],
) -> F64:
    """``∂kl_loss/∂logp_t`` (:func:`token_gradients`' KL paragraph): the estimator's
    derivative, 0 where a clamp binds, and the ratio's part with ``kl_bias_correction``."""
    assert terms.ref_delta is not None and terms.kl is not None
    d, rho = terms.ref_delta, terms.ratio
    lrc = o.log_ratio_clamp
    if o.kl_estimator == "k1":
        gk = np.ones(d.shape)
    elif o.kl_estimator == "k2":
        gk = -d
    else:
        dc = d if lrc is None else np.clip(d, -lrc, lrc)
        with np.errstate(over="ignore"):
            gk = 1.0 - np.exp(dc)
        if lrc is not None:
            gk[np.abs(d) > lrc] = 0.0
    if o.kl_clamp is not None:
        gk[np.abs(terms.kl) >= o.kl_clamp] = 0.0  # the clamp binds (kl is clamped already)
    if o.kl_bias_correction:
        with np.errstate(over="ignore", invalid="ignore"):
            if o.ratio_level == "sequence":
                assert offsets is not None
                kl_means = answer_means.kl if answer_means is not None else None
                if kl_means is None:
                    kl_means = segment_mean(terms.kl, offsets)
                mean_kl = np.repeat(kl_means, np.diff(offsets))
                gk = gk * rho + np.where(free, rho * mean_kl, 0.0)
            else:
                gk = gk * rho + np.where(free, terms.kl * rho, 0.0)
    out: F64 = gk
    return out


def require_reference(beta: float, ref_logp: object) -> None:
    """A KL term (``beta != 0``) needs the reference log-probs."""
    if beta != 0.0 and ref_logp is None:
        raise UsageError("beta > 0 needs ref_logp (the reference policy's log-probs)")
