"""verl's rollout correction (IS weights and rejection sampling between the sampler's
log-probs and the trainer's) and its bypass mode (the sampler's log-probs as the old
policy, the correction computed in the loss), with their registry rows.

Mirrors verl 0.9.1 ``verl/trainer/ppo/rollout_corr_helper.py`` and
``core_algos.compute_policy_loss_bypass_mode`` / ``compute_policy_loss_reinforce``. numpy
only, no I/O, no globals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..core import segment_count, segment_sum, token_gradients, token_terms
from ..errors import InputError, SettingError, UsageError
from .registry import (
    F64,
    I64,
    Bools,
    Correction,
    CorrectionRow,
    Loss,
    LossCall,
    Mask,
    Metric,
    OwnCorrection,
    Params,
    PolicyTerms,
    Spec,
    _choice,
    _exp,
    _inputs,
    _mul,
    _repeat,
    _verl_mean,
    _verl_seq_mean,
    drop_tokens,
    kept_stretch,
    param,
)
from .verl import _PPO_KL, _cap, _lower, _pg

__all__ = [
    "CORRECTIONS",
    "LOSSES",
    "RS_OPTIONS",
    "SAFETY_BOUND",
    "BypassParams",
    "RolloutParams",
    "rejection_options",
    "verl_bypass_mode",
    "verl_rollout_correction",
]

VerlISLevel = Literal["token", "sequence"]


BypassLoss = Literal["ppo_clip", "reinforce"]


# verl 0.9.1 rollout_corr_helper.SAFETY_BOUND: log-ratios are clamped to ±20 before exp
SAFETY_BOUND = 20.0


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
                if "_" not in s and not float(s) > 0:  # a single bound u means 1/u_u
                    raise ValueError
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
    with np.errstate(over="ignore", invalid="ignore"):
        lr = old - roll
    safe = np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
    # e^ℓ and e^ℓ' once for every use (the same array while the ±20 clamp never binds)
    e_lr = _exp(lr)
    e_safe = e_lr if np.array_equal(lr, safe) else _exp(safe)
    lr_sum = segment_sum(lr, off)
    metrics: dict[str, float] = {}
    before: dict[str, float] = {}
    weight = np.ones(T)
    if rollout_is is not None:
        weight = _is_weights(
            e_safe, lr_sum, off, rollout_is, rollout_is_threshold, rollout_is_batch_normalize,
            metrics, before,
        )  # fmt: skip
    keep = np.ones(T, dtype=bool)
    if rollout_rs is not None:
        keep, rs = _rejection(safe, e_safe, off, rollout_rs, rollout_rs_threshold)
        metrics.update(rs)
    metrics.update(_offpolicy_metrics(old, roll, lr, e_lr, e_safe, lr_sum, off))
    return Correction(
        weight=weight, keep=keep, metrics={f"rollout_corr/{k}": v for k, v in metrics.items()},
        before={f"rollout_corr/{k}": v for k, v in before.items()},
    )  # fmt: skip


def _is_weights(
    e_safe: F64,
    lr_sum: F64,
    off: I64,
    level: str,
    threshold: float | str,
    batch_normalize: bool,
    metrics: dict[str, float],
    before: dict[str, float],
) -> F64:
    """verl's IS weights of :func:`verl_rollout_correction` (its docstring's IS bullet),
    their ``rollout_is_*`` metrics added to ``metrics``, and to ``before`` the mean, the
    answers' mean and (per token) the extremes of the raw ratio before its truncation or
    mask (at sequence level verl's ``rollout_is_max`` and ``_min`` are the raw ratio's);
    ``e_safe`` is ``exp(clamp(ℓ_t, ±20))`` per token."""
    T = e_safe.shape[0]
    upper, lower = _is_threshold(threshold)
    if level == "token":
        raw = e_safe
    else:
        raw = _repeat(_exp(np.clip(lr_sum, -SAFETY_BOUND, SAFETY_BOUND)), off)
    if lower is None:
        w = np.minimum(raw, upper)
    else:
        w = np.where((raw >= lower) & (raw <= upper), raw, 0.0)
    metrics.update(_is_metrics(w, raw, lr_sum, off, level, upper, lower))
    before["rollout_is_mean"] = _verl_mean(raw, T)
    before["rollout_is_seq_mean"] = float(_verl_seq_mean(raw, off).mean())
    if level == "token" and T:
        before["rollout_is_max"], before["rollout_is_min"] = float(raw.max()), float(raw.min())
    if batch_normalize:
        if level == "token":
            mean = _verl_mean(w, T)
        else:
            n = float(off.shape[0] - 1)
            mean = float(np.sum(_verl_seq_mean(w, off)) / max(n, 1e-8))
        if mean > 1e-8:
            w = w / mean
            metrics["rollout_is_batch_norm_factor"] = mean
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    out: F64 = w
    return out


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
    safe: F64, e_safe: F64, off: I64, rollout_rs: str, spec: float | str | None
) -> tuple[Bools, dict[str, float]]:
    options, bounds = zip(*rejection_options(rollout_rs, spec), strict=True)
    T = safe.shape[0]
    per_token = {"k1": -safe, "k2": 0.5 * safe * safe, "k3": e_safe - 1.0 - safe}
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
    old: F64, roll: F64, lr: F64, e_lr: F64, e_safe: F64, lr_sum: F64, off: I64
) -> dict[str, float]:
    T = old.shape[0]
    mean_old = _verl_seq_mean(old, off)
    mean_roll = _verl_seq_mean(roll, off)
    diff = mean_roll - mean_old
    with np.errstate(over="ignore", invalid="ignore"):
        k3 = e_lr - lr - 1.0
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
            "chi2_token": _verl_mean(e_safe * e_safe, T) - 1.0,
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
            "the loss verl/bypass_mode (--loss, or a recorded verl config's "
            "algorithm.rollout_correction.bypass_mode) needs the sampler's log-probs: the "
            "input has no rollout_logp column (--column rollout_logp=NAME)"
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
    if keep.all():  # no token rejected: every factor is 1, the kept terms are the terms
        grad = None if t.grad is None else _signed_zero(t.grad)
        terms = dataclasses.replace(t, term=_signed_zero(t.term), grad=grad)
        return OwnCorrection(terms=terms, correction=corr, kept=t, kept_offsets=c.offsets)
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


def _signed_zero(x: F64) -> F64:
    """``_mul(x, 1.0)`` without the multiplication: ``x`` with ``-0.0`` as ``0.0``."""
    zero = x == 0
    return np.where(zero, 0.0, x) if zero.any() else x


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

LOSSES = (
    Loss("verl/bypass_mode", _bypass,
         "verl's bypass mode (rollout_logp as the old policy, its own IS weights and "
         "rejection)",
         params=BypassParams, token_ratio=True, metrics=_bypass_metrics,
         clip=lambda p: ("actor/pg_clipfrac",)
         if getattr(p, "bypass_loss_type", "") == "ppo_clip" else None,
         correction="own", own_correction="verl-rollout", needs=("rollout_logp",),
         describe=_bypass_words, fold_note=_bypass_note),
)  # fmt: skip
MASKS: tuple[Mask, ...] = ()
