"""The policy losses the pinned trainers ship beyond the clipped surrogate, and the
sampler–trainer corrections, as pure numpy over ragged arrays.

Mirrors TRL 1.16.0 (``GRPOTrainer._compute_loss``, ``get_gamma_weights`` and the vLLM
importance-sampling lines of ``_generate_and_score_completions``), verl 0.9.1
(``verl/trainer/ppo/core_algos.py``: the ``register_policy_loss`` registry;
``verl/trainer/ppo/rollout_corr_helper.py``) and OpenRLHF 0.11.2
(``openrlhf/models/loss.py``: ``PolicyLoss``). numpy only, no I/O, no globals.

Layout and shape letters are the core's (:mod:`grpo_cli._core`): token fields are flat
``(T,)`` arrays, ``offsets`` is ``(N+1,)``, answer ``i`` owns ``[offsets[i], offsets[i+1])``;
an advantage is ``(N,)`` (one per answer) or ``(T,)`` (one per token, as verl passes them).

Conventions shared by every loss function here:

- ``term``: the per-token *objective* (maximised), i.e. minus the trainer's per-token loss,
  before aggregation. ``agg`` names the aggregation the trainer forces for this loss
  (None: the one the trainer's configuration names, ``loss_agg_mode`` / ``loss_type``).
- ``grad[t] = ∂(Σ_{t'∈i} term[t'])/∂logp[t]`` for ``t`` in answer ``i``, the trainer's
  detached factors held constant (for a token-local term, ``∂term[t]/∂logp[t]``). Every
  aggregation weights an answer's tokens equally, so ``∂J/∂logp[t] = w_i · grad[t]``
  (:func:`grpo_cli._core.aggregation_weights`), as the core's ``token_gradients``.
- ``flags`` and ``values``: per-token quantities the trainer's logged metrics read;
  :func:`loss_metrics` turns them into the metrics by their logged names.
- Arithmetic in float64 whatever the input dtype; ratios in log space; a product with an
  exact zero factor is 0 even where the other factor overflowed to ±inf (no NaN); inputs
  are never written to.

Folding: a loss whose terms depend only on their token, or on their answer's tokens, folds
batch by batch from mergeable sums like the clipped surrogate (answer-level ones need the
whole answer, or its sums). ``clip_cov`` and ``kl_cov`` choose tokens by a covariance over
the *micro-batch* the trainer's loss function received (one rank's micro-batch,
``ppo_micro_batch_size_per_gpu`` answers or a dynamic-batch bin): they do not fold beyond
it, see their docstrings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._core import (
    Aggregation,
    RatioLevel,
    check_offsets,
    clipped_surrogate,
    segment_count,
    segment_mean,
    segment_sum,
    sequence_log_ratio,
    token_gradients,
    token_terms,
)
from .errors import InputError, UsageError

__all__ = [
    "BATCH_LOSSES",
    "FORCED_AGGREGATION",
    "LOSS_METRICS",
    "TOKEN_RATIO_LOSSES",
    "Correction",
    "CorrectionName",
    "LossName",
    "PolicyTerms",
    "apply_correction",
    "cispo_terms",
    "clip_cov_terms",
    "dppo_terms",
    "dro_terms",
    "drop_tokens",
    "geo_mean_terms",
    "gpg_terms",
    "kl_cov_terms",
    "loss_metrics",
    "luspo_terms",
    "metric_sums",
    "openrlhf_is_correction",
    "rejection_options",
    "sapo_terms",
    "trl_vllm_is_correction",
    "verl_bypass_mode",
    "verl_rollout_correction",
    "vespo_terms",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
Bools = NDArray[np.bool_]

Divergence = Literal["tv", "kl"]
Selection = Literal["expected", "order"]
TrlISMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
VerlISLevel = Literal["token", "sequence"]
BypassLoss = Literal["ppo_clip", "reinforce"]
OrlLevel = Literal["off", "token", "seq"]
OrlMode = Literal["mask", "clip"]
OrlGating = Literal["ratio", "binary_kl", "tv"]

# The policy losses a computation can follow (``Settings.loss``): the core's clipped
# surrogate ("clip": TRL grpo/bnpo/dr_grpo/dapo, verl vanilla/gspo, OpenRLHF ppo/gspo), or
# one of these, named ``trainer/config value`` (the keys of LOSS_METRICS; verl's
# ``bypass_mode`` logs by its ``loss_type``: ``verl/bypass_mode/ppo_clip`` | ``/reinforce``).
LossName = Literal[
    "clip",
    "trl/cispo", "trl/sapo", "trl/luspo", "trl/vespo",
    "verl/dppo_tv", "verl/dppo_kl", "verl/sapo", "verl/gpg", "verl/clip_cov", "verl/kl_cov",
    "verl/geo_mean", "verl/dro", "verl/cispo", "verl/bypass_mode",
]  # fmt: skip
# The sampler–trainer corrections (``Settings.correction``), applied with rollout_logp
CorrectionName = Literal["none", "trl-vllm", "verl-rollout", "openrlhf-is"]

# The aggregation a loss forces whatever the trainer's configuration names (PolicyTerms.agg
# of its function): TRL 1.16.0 ``_compute_loss`` aggregates sapo as grpo and luspo as a mean
# over answers of their token sums; verl 0.9.1's sapo and geo_mean take a mean over rows of
# their token means whatever ``loss_agg_mode``.
FORCED_AGGREGATION: dict[str, Aggregation] = {
    "trl/sapo": "seq-mean-token-mean",
    "trl/luspo": "seq-mean-token-sum",
    "verl/sapo": "seq-mean-token-mean",
    "verl/geo_mean": "seq-mean-token-mean",
}
# Losses whose ratio is per token whatever ``ratio_level`` (verl's read none; TRL's vespo
# is a sequence weight of its own)
TOKEN_RATIO_LOSSES = (
    "verl/dppo_tv", "verl/dppo_kl", "verl/sapo", "verl/gpg", "verl/clip_cov", "verl/kl_cov",
    "verl/geo_mean", "verl/dro", "verl/cispo", "verl/bypass_mode",
)  # fmt: skip
# Losses that select tokens by a covariance over the whole batch the loss saw (the
# trainer's micro-batch): they do not fold across batches
BATCH_LOSSES = ("verl/clip_cov", "verl/kl_cov")

# verl 0.9.1 rollout_corr_helper.SAFETY_BOUND: log-ratios are clamped to ±20 before exp
SAFETY_BOUND = 20.0
# verl_F.masked_mean divides by (count + 1e-8)
VERL_MEAN_EPS = 1e-8


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class PolicyTerms:
    """Per-token terms of one policy loss (see the module's conventions).

    ``term``, ``ratio`` and every ``flags``/``values`` entry are ``(T,)``; ``grad`` is
    ``(T,)`` or None (no closed form); ``weight`` is the detached coefficient the loss
    multiplies ``A`` (or ``A·logp``) by, where it has one (CISPO's clipped ratio, SAPO's
    gate, VESPO's φ, DPPO's truncated ratio); ``answer_values`` are ``(N,)``; ``level`` is
    the level of ``ratio`` (TRL logs sequence-level metrics over answers); ``agg`` the
    aggregation the trainer forces, or None.
    """

    term: F64
    grad: F64 | None
    ratio: F64
    weight: F64 | None = None
    flags: Mapping[str, Bools] = field(default_factory=dict)
    values: Mapping[str, F64] = field(default_factory=dict)
    answer_values: Mapping[str, F64] = field(default_factory=dict)
    level: RatioLevel = "token"
    agg: Aggregation | None = None


@dataclass(frozen=True)
class Correction:
    """A sampler–trainer correction: ``weight`` ``(T,)`` multiplies the policy term (0 on
    a masked token or answer), ``keep`` ``(T,)`` is False on tokens a rejection removes
    from the trainer's mask (they leave the aggregation's counts too: :func:`drop_tokens`),
    ``metrics`` the trainer's logged metrics by name."""

    weight: F64
    keep: Bools
    metrics: dict[str, float]


# --------------------------------------------------------------------------- checks
def _tokens(name: str, x: ArrayLike, T: int | None = None) -> F64:
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise InputError(f"{name}: expected a real-valued array, got dtype {arr.dtype}")
    if arr.ndim != 1 or (T is not None and arr.shape[0] != T):
        want = "(T,)" if T is None else f"({T},) like logp"
        raise InputError(f"{name}: expected shape {want}, got {arr.shape}")
    return arr.astype(np.float64, copy=False)


def _inputs(
    offsets: ArrayLike, adv: ArrayLike | None, **arrays: ArrayLike | None
) -> tuple[I64, F64 | None, dict[str, F64]]:
    """Token arrays as float64 ``(T,)``, ``offsets`` checked (no empty answer), ``adv``
    repeated to tokens; every mismatch named."""
    first = next(iter(arrays))
    lead = _tokens(first, arrays[first])  # type: ignore[arg-type]
    T = lead.shape[0]
    out = {first: lead}
    for name, a in arrays.items():
        if name != first and a is not None:
            out[name] = _tokens(name, a, T)
    off = check_offsets(offsets, T, nonempty=True)
    if adv is None:
        return off, None, out
    a = _tokens("adv", adv)
    n = off.shape[0] - 1
    if a.shape[0] == n:
        a_tok = np.repeat(a, np.diff(off))
    elif a.shape[0] == T:
        a_tok = a
    else:
        raise InputError(f"adv: expected shape ({n},) or ({T},), got {a.shape}")
    return off, a_tok, out


def _choice(name: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        listed = ", ".join(repr(a) for a in allowed)
        raise UsageError(f"{name}: expected one of {listed}, got {value!r}")


def _positive(name: str, value: float, *, zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise UsageError(f"{name}: must be a finite number {'>=' if zero else '>'} 0, got {value}")


# ---------------------------------------------------------------------- arithmetic
def _mul(a: F64, b: F64 | float) -> F64:
    """``a·b``, 0 wherever a factor is exactly 0 (``0·inf`` is 0, not NaN)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.multiply(a, b)
    zero = (a == 0) | (np.asarray(b) == 0)
    if zero.any():
        out = np.where(zero, 0.0, out)
    return out


def _exp(x: F64) -> F64:
    with np.errstate(over="ignore"):
        return np.exp(x)


def _log_ratio(logp: F64, old: F64, clamp: float | None) -> tuple[F64, F64]:
    """Raw ``Δ = logp − old`` and the loss's ``Δ'`` (clamped to ±clamp when given)."""
    with np.errstate(over="ignore", invalid="ignore"):
        delta = logp - old
    used = delta if clamp is None else np.clip(delta, -clamp, clamp)
    return delta, used


def _ratio(used: F64, off: I64, level: RatioLevel) -> F64:
    """Token ratio ``exp(Δ')``, or the answer's ``exp(mean_t Δ)`` on each of its tokens."""
    _choice("ratio_level", level, ("token", "sequence"))
    return _exp(used if level == "token" else sequence_log_ratio(used, off))


def _sigmoid(x: F64) -> F64:
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


def _repeat(per_answer: F64, off: I64) -> F64:
    return np.repeat(per_answer, np.diff(off))


def _answer_mean_repeated(x: F64, off: I64) -> F64:
    return _repeat(segment_mean(x, off), off)


def _verl_mean(x: F64 | Bools, count: float) -> float:
    """verl's ``masked_mean`` over all tokens: ``Σ x / (count + 1e-8)``."""
    return float(np.sum(x, dtype=np.float64) / (count + VERL_MEAN_EPS))


def _verl_seq_mean(x: F64, off: I64) -> F64:
    """verl's per-row ``masked_mean(axis=-1)``: ``Σ_t x / (|o_i| + 1e-8)``."""
    return segment_sum(x, off) / (np.diff(off) + VERL_MEAN_EPS)


# ============================================================== policy losses: TRL
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
    tau = np.where(a > 0, tau_pos, tau_neg)
    with np.errstate(over="ignore", invalid="ignore"):
        xs = tau * (rho - 1.0)
        gate = _sigmoid(xs) * (4.0 / tau)
        # σ(x)(1−σ(x))·ρ in log space: ρ may be inf where σ' is 0
        ax = np.abs(xs)
        dlog = log_rho - ax - 2.0 * np.log1p(np.exp(-ax))
        dgate = 4.0 * np.exp(dlog)
    dgate = np.where(np.isnan(dgate), 0.0, dgate)
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
    ``|o_i|`` per answer. ``grad`` is the core's (:func:`grpo_cli._core.token_gradients`).

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
        phi = np.exp(lam + k * log_w - lam * np.exp(log_w))
    phi = np.where(np.isfinite(phi), phi, 0.0)
    pa = _mul(phi, a)
    return PolicyTerms(
        term=_mul(pa, lp),
        grad=pa,
        ratio=np.exp(log_w),
        weight=phi,
        answer_values={"phi": phi[off[:-1]]},
        level="sequence",
    )


# ============================================================= policy losses: verl
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


# ------------------------------------------------------------------------ metrics
Unit = Literal["tokens", "answers", "level", "answer_min", "answer_max", "zero"]

# (trainer/loss) → the metrics it logs: (logged name, key in flags/values/answer_values,
# unit). "tokens": Σ_t x / T over the batch the loss saw (verl divides by T + 1e-8);
# "answers": mean over answers of x (answer_values) or of the answer's token mean;
# "level": tokens for a token-level ratio, answers for a sequence-level one (TRL);
# "answer_min"/"answer_max": extremes over answers of the answer's token mean; "zero": 0.
LOSS_METRICS: dict[str, tuple[tuple[str, str, Unit], ...]] = {
    "trl/cispo": (("cispo_clip_ratio", "trl_clipped", "level"),),
    "trl/sapo": (),
    "trl/luspo": (
        ("clip_ratio/low_mean", "low", "level"),
        ("clip_ratio/low_min", "low", "answer_min"),
        ("clip_ratio/high_mean", "high", "level"),
        ("clip_ratio/high_max", "high", "answer_max"),
        ("clip_ratio/region_mean", "region", "level"),
    ),
    "trl/vespo": (("vespo/phi_seq_mean", "phi", "answers"),),
    "verl/dppo_tv": (
        ("actor/pg_clipfrac", "invalid", "tokens"),
        ("actor/ppo_kl", "ppo_kl", "tokens"),
        ("actor/pg_clipfrac_lower", "truncated", "tokens"),
    ),
    "verl/sapo": (
        ("actor/pg_clipfrac", "", "zero"),
        ("actor/ppo_kl", "ppo_kl", "tokens"),
        ("actor/pg_clipfrac_lower", "", "zero"),
    ),
    "verl/gpg": (),
    "verl/clip_cov": (
        ("actor/pg_clipfrac", "selected", "tokens"),
        ("actor/ppo_kl", "ppo_kl", "tokens"),
    ),
    "verl/kl_cov": (("actor/ppo_kl", "abs_delta", "tokens"),),
    "verl/geo_mean": (
        ("actor/pg_clipfrac", "clipped_high", "tokens"),
        ("actor/ppo_kl", "ppo_kl", "tokens"),
        ("actor/pg_clipfrac_lower", "clipped_low", "tokens"),
    ),
    "verl/dro": (("actor/ppo_kl", "ppo_kl", "tokens"),),
    "verl/cispo": (
        ("actor/pg_clipfrac", "clipped", "tokens"),
        ("actor/ppo_kl", "ppo_kl", "tokens"),
        ("actor/pg_clipfrac_lower", "", "zero"),
    ),
    "verl/bypass_mode/ppo_clip": (
        ("actor/pg_clipfrac", "region", "tokens"),
        ("actor/ppo_kl", "ppo_kl", "tokens"),
        ("actor/pg_clipfrac_lower", "dual", "tokens"),
    ),
    "verl/bypass_mode/reinforce": (("actor/ppo_kl", "ppo_kl", "tokens"),),
}
LOSS_METRICS["verl/dppo_kl"] = LOSS_METRICS["verl/dppo_tv"]


# one metric of one batch as a mergeable sum: ("mean", Σ, count) | ("min" | "max", value, 0)
MetricSum = tuple[str, float, float]


def metric_sums(terms: PolicyTerms, offsets: ArrayLike, loss: str) -> dict[str, MetricSum]:
    """The metrics a trainer logs for ``loss`` (a key of :data:`LOSS_METRICS`) over one
    batch, each as a sum that merges with other batches' (a mean as its sum and count, an
    extreme as itself): what :func:`loss_metrics` divides out, and what the fold adds up
    (:class:`grpo_cli._loss_fold.LossMetrics`).

    Raises:
        UsageError: ``loss`` is not a key of :data:`LOSS_METRICS`.
    """
    if loss not in LOSS_METRICS:
        raise UsageError(f"loss: expected one of {', '.join(LOSS_METRICS)}, got {loss!r}")
    off = check_offsets(offsets, terms.term.shape[0], nonempty=True)
    n, T = float(off.shape[0] - 1), float(off[-1])
    out: dict[str, MetricSum] = {}
    for name, key, unit in LOSS_METRICS[loss]:
        if unit == "zero":
            out[name] = ("mean", 0.0, 1.0)
            continue
        if key in terms.answer_values:
            v = np.asarray(terms.answer_values[key], dtype=np.float64)
            out[name] = ("mean", float(np.sum(v)), n)
            continue
        x = terms.flags[key] if key in terms.flags else terms.values[key]
        x64 = np.asarray(x, dtype=np.float64)
        if unit == "level":
            unit = "answers" if terms.level == "sequence" else "tokens"
        if unit == "tokens":
            out[name] = ("mean", float(np.sum(x64)), T)
            continue
        share = segment_mean(x64, off)
        if unit == "answers":
            out[name] = ("mean", float(np.sum(share)), n)
        elif unit == "answer_min":
            out[name] = ("min", float(share.min()), 0.0)
        else:
            out[name] = ("max", float(share.max()), 0.0)
    return out


def loss_metrics(terms: PolicyTerms, offsets: ArrayLike, loss: str) -> dict[str, float]:
    """The metrics a trainer logs for ``loss`` (a key of :data:`LOSS_METRICS`, e.g.
    ``"verl/dppo_tv"``), computed from ``terms`` over the tokens ``offsets`` describe (the
    batch the trainer's loss function saw: verl's micro-batch, TRL's per-device batch).

    Raises:
        UsageError: ``loss`` is not a key of :data:`LOSS_METRICS`.

    Example:
        >>> t = dro_terms([-1.0, -1.0], [-2.0, -1.0], [1.0], [0, 2], beta=0.5)
        >>> loss_metrics(t, [0, 2], "verl/dro")
        {'actor/ppo_kl': -0.5}
    """
    return {
        name: (value / count if kind == "mean" else value)
        for name, (kind, value, count) in metric_sums(terms, offsets, loss).items()
    }


def apply_correction(terms: PolicyTerms, correction: Correction | ArrayLike) -> PolicyTerms:
    """``terms`` with ``term`` and ``grad`` multiplied by a correction's detached ``weight``
    (0 on a masked token, even where the term is ±inf). How verl 0.9.1 applies
    ``rollout_is_weights`` in every registered loss but ``geo_mean`` (which takes
    :func:`geo_mean_terms`' ``is_weight``) and ``bypass_mode``, TRL 1.16.0 its vLLM ratio
    (the policy part only: add the KL term after), OpenRLHF 0.11.2 its ``coef``.

    Example:
        >>> t = apply_correction(gpg_terms([-1.0, -1.0], [1.0], [0, 2]), np.array([0.5, 0.0]))
        >>> t.term.tolist()
        [-0.5, 0.0]
    """
    w = correction.weight if isinstance(correction, Correction) else _tokens("weight", correction)
    if w.shape != terms.term.shape:
        raise InputError(f"weight: expected shape {terms.term.shape} like the terms, got {w.shape}")
    grad = None if terms.grad is None else _mul(terms.grad, w)
    return PolicyTerms(
        term=_mul(terms.term, w), grad=grad, ratio=terms.ratio, weight=terms.weight,
        flags=terms.flags, values=terms.values, answer_values=terms.answer_values,
        level=terms.level, agg=terms.agg,
    )  # fmt: skip


def drop_tokens(
    keep: ArrayLike, offsets: ArrayLike, *fields: ArrayLike
) -> tuple[I64, list[F64], I64]:
    """Remove the tokens a rejection dropped (``keep`` False) from ragged fields.

    Returns the new ``offsets`` over the answers that keep a token, the fields' kept tokens,
    and those answers' indices (to select their ``(N,)`` fields): verl's ``agg_loss``
    leaves a fully masked answer out of every count, as an answer that is not there
    (``geo_mean``'s row mean does not: see :func:`geo_mean_terms`).

    Example:
        >>> off, (v,), kept = drop_tokens([True, False, False, True], [0, 2, 3, 4],
        ...                               [1.0, 2.0, 3.0, 4.0])
        >>> off.tolist(), v.tolist(), kept.tolist()
        ([0, 1, 2], [1.0, 4.0], [0, 2])
    """
    k = np.asarray(keep)
    if k.dtype != np.bool_ or k.ndim != 1:
        raise InputError(f"keep: expected a (T,) boolean array, got {k.dtype} {k.shape}")
    off = check_offsets(offsets, k.shape[0])
    counts = segment_count(k, off)
    answers = np.flatnonzero(counts > 0).astype(np.int64)
    new = np.zeros(answers.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts[answers], out=new[1:])
    return new, [_tokens(f"fields[{i}]", f, k.shape[0])[k] for i, f in enumerate(fields)], answers


# =================================================================== corrections
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
    with np.errstate(over="ignore"):
        rho = np.exp(log_rho)
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
    return Correction(weight=weight, keep=np.ones(weight.shape, dtype=bool), metrics=metrics)


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


def openrlhf_is_correction(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    offsets: ArrayLike,
    *,
    level: OrlLevel = "off",
    mode: OrlMode = "mask",
    gating: OrlGating = "ratio",
    threshold: tuple[float, float] = (0.5, 5.0),
) -> Correction:
    """OpenRLHF's train/rollout importance-sampling correction of the PPO loss.

    ``ρ_t = exp(old_logp − rollout_logp)``; a gate reads a statistic per unit (the token,
    or the answer's mean at ``level="seq"``): ``"ratio"`` the ratio (its geometric mean
    per answer), ``"binary_kl"`` ``p·log(p/q) + (1−p)·log((1−p)/(1−q))`` or ``"tv"`` ``|p −
    q|`` with ``p = e^rollout``, ``q = e^old`` clamped to ``[1e-6, 1 − 1e-6]`` (their
    plain mean per answer). ``mode="mask"``: ``w = ρ_t`` where the unit's statistic is
    within ``[low, high]``, else 0; ``"clip"`` (token ratio only): ``w = clip(ρ_t, low,
    high)``. Only for ``policy_loss_type="ppo"``, multiplying the per-token loss (after the
    dual clip). (With ``"gspo"`` and a level other than off, OpenRLHF instead takes the
    sequence ratio against ``rollout_logp``: pass it as ``old_logp`` to the core's sequence
    level; no weight.)

    Mirrors OpenRLHF 0.11.2 ``openrlhf/models/loss.py`` ``PolicyLoss.forward``
    (``--algo.advantage.is_correction_level`` → ``level``, ``_mode`` → ``mode``,
    ``_gating`` → ``gating``, ``_threshold`` → ``threshold``: ``LOW HIGH``, a single value
    meaning ``(0, HIGH)``; TIS = token clip, ICEPOP = token mask, seq-mask-tis = seq mask).
    See "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (Yao et al.
    2025). Metrics (``experience.info``): ``vllm_kl`` = mean over tokens of ``rollout_logp −
    old_logp``; ``is_filter_ratio`` = share of units outside the band (tokens, or answers
    at ``"seq"``). ``level="off"``: weights 1, no metric.

    Folds: per token, or per answer at ``"seq"``.

    Example:
        >>> c = openrlhf_is_correction([-1.0, -1.0], [-1.0, -3.0], [0, 1, 2], level="token")
        >>> c.weight.tolist(), c.metrics["is_filter_ratio"]  # e² = 7.4 > 5: masked
        ([1.0, 0.0], 0.5)
    """
    off, _, x = _inputs(offsets, None, old_logp=old_logp, rollout_logp=rollout_logp)
    _choice("level", level, ("off", "token", "seq"))
    _choice("mode", mode, ("mask", "clip"))
    _choice("gating", gating, ("ratio", "binary_kl", "tv"))
    low, high = threshold
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        raise UsageError('mode="clip" needs level="token" and gating="ratio"')
    if gating != "ratio" and level != "off" and low > 0:
        raise UsageError(f"gating={gating} takes an upper bound only: threshold (0, HIGH)")
    old, roll = x["old_logp"], x["rollout_logp"]
    T = old.shape[0]
    if level == "off":
        return Correction(weight=np.ones(T), keep=np.ones(T, dtype=bool), metrics={})
    with np.errstate(over="ignore", invalid="ignore"):
        lr = old - roll
    rho = _exp(lr)
    seq = level == "seq"
    if gating == "ratio":
        stat = _exp(segment_mean(lr, off)) if seq else rho
    else:
        p = np.clip(_exp(roll), 1e-6, 1 - 1e-6)
        q = np.clip(_exp(old), 1e-6, 1 - 1e-6)
        if gating == "binary_kl":
            s = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))
        else:
            s = np.abs(p - q)
        stat = segment_mean(s, off) if seq else s
    if mode == "clip":
        w = np.clip(stat, low, high)
        filtered = (stat < low) | (stat > high)
    else:
        inside = (stat >= low) & (stat <= high)
        filtered = ~inside
        w = np.where(np.repeat(inside, np.diff(off)) if seq else inside, rho, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        vllm_kl = float(np.sum(roll - old) / T)
    metrics = {"vllm_kl": vllm_kl, "is_filter_ratio": float(np.mean(filtered))}
    return Correction(weight=w, keep=np.ones(T, dtype=bool), metrics=metrics)
