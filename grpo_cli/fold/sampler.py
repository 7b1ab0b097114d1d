"""The sampler's support, read from the log-probs alone: the mergeable sums behind
:class:`~grpo_cli.records.SamplerSupport`.

A sampler that truncates (top-p, top-k, min-p) reports the log-prob of the sampled token
renormalised over the tokens it kept: ``rollout_logp = logp − log K`` with ``K`` the kept
mass at that position, so ``δ = old_logp − rollout_logp = log K ≤ 0`` at every token — all
on one side, larger where the distribution is flat (high entropy: less mass in the kept
set). A tempered sampler (``softmax(z / T)``) reports ``log p_T = log p / T + c``: within a
position ``δ`` is linear in the sampled token's log-prob, slope ``1 − 1/T``, so ``δ``
correlates with ``rollout_logp`` (negatively for T < 1). A sampler and a trainer that differ
only in precision give a ``δ`` of either sign, uncorrelated with either (TRL #6789, #7269;
verl #6240 ``logprobs_mode``; DeepSeek-V3.2's "keep sampling mask").

The sums: every token's ``δ`` by sign, ``Σδ``, ``Σ|δ|``, the moments of ``(rollout_logp, δ)``
for their correlation, and, by bin of the trainer's logged entropy where there is one,
``Σδ`` and ``Σ exp(δ)`` (the kept mass's estimate by entropy, and ρ with it divided out).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from ..core import FloatArray, dot, kernel
from ..records import SamplerSupport

__all__ = ["ENTROPY_WIDTH", "CoMoments", "SupportSums"]

F64 = NDArray[np.float64]

# bins of the trainer's entropy (nats) for the kept mass: 0.25 wide, the last open
ENTROPY_WIDTH, ENTROPY_BINS = 0.25, 40


def _exp(x: float) -> float:
    """``exp`` that overflows to inf (NaN stays NaN) instead of raising."""
    return math.exp(x) if x < 709.0 else (math.inf if x == x else x)


class CoMoments:
    """Mergeable count, means and centred sums of squares and products of a pair (x, y)
    (Chan, Golub & LeVeque 1979, the pairwise update): their Pearson correlation, exact to
    the order of float additions however the tokens are split."""

    def __init__(self) -> None:
        self.n = 0
        self.mx = self.my = 0.0
        self.cxx = self.cyy = self.cxy = 0.0

    def add(self, x: F64, y: F64) -> None:
        o = CoMoments()
        o.n = int(x.shape[0])
        if o.n == 0:
            return
        with np.errstate(over="ignore", invalid="ignore"):  # beyond float64: inf, no r
            o.mx, o.my = float(np.mean(x)), float(np.mean(y))
            dx, dy = x - o.mx, y - o.my
            o.cxx, o.cyy, o.cxy = dot(dx, dx), dot(dy, dy), dot(dx, dy)
            self.merge(o)

    def merge(self, o: CoMoments) -> CoMoments:
        if o.n == 0:
            return self
        n = self.n + o.n
        fx, fy = o.mx - self.mx, o.my - self.my
        w = self.n * o.n / n
        self.cxx += o.cxx + fx * fx * w
        self.cyy += o.cyy + fy * fy * w
        self.cxy += o.cxy + fx * fy * w
        self.mx += fx * o.n / n
        self.my += fy * o.n / n
        self.n = n
        return self

    def correlation(self) -> float | None:
        """Pearson's r; None for fewer than 2 pairs or a side constant to rounding (its
        spread below 1e-5 of its mean: a constant shift, up to float32 rounding, has no
        correlation to tell)."""
        if self.n < 2:
            return None
        sx, sy = math.sqrt(self.cxx / self.n), math.sqrt(self.cyy / self.n)
        if sx <= 1e-5 * abs(self.mx) or sy <= 1e-5 * abs(self.my) or sx == 0 or sy == 0:
            return None
        r = self.cxy / self.n / (sx * sy)
        return max(-1.0, min(1.0, r)) if math.isfinite(r) else None


class SupportSums:
    """Mergeable sums of ``δ = old_logp − rollout_logp`` that tell a truncated or tempered
    sampler from a precision mismatch (module docstring)."""

    def __init__(self) -> None:
        self.n = 0
        self.below = 0  # δ < 0
        self.above = 0  # δ > 0
        self.d = 0.0  # Σδ
        self.abs = 0.0  # Σ|δ|
        self.rho = 0.0  # Σ exp(δ)
        self.rd = CoMoments()  # (rollout_logp, δ)
        self.ed = CoMoments()  # (entropy, δ), over the tokens with a logged entropy
        self.bin_n = np.zeros(ENTROPY_BINS, dtype=np.int64)
        self.bin_d = np.zeros(ENTROPY_BINS)
        self.bin_rho = np.zeros(ENTROPY_BINS)

    def update(self, delta: F64, rollout: FloatArray, entropy: FloatArray | None) -> None:
        """Fold in the tokens' ``δ``, the sampler's log-probs, and the trainer's entropies
        (None when not logged)."""
        if delta.shape[0] == 0:
            return
        r = np.asarray(rollout, dtype=np.float64)
        ok = np.isfinite(delta) & np.isfinite(r)
        if not ok.all():  # non-finite log-probs are the finite rule's; left out here
            delta, r = delta[ok], r[ok]
            entropy = None if entropy is None else np.asarray(entropy)[ok]
        self.n += int(delta.shape[0])
        self.below += int(np.count_nonzero(delta < 0))
        self.above += int(np.count_nonzero(delta > 0))
        with np.errstate(over="ignore", invalid="ignore"):
            self.d += float(np.sum(delta))
            self.abs += float(np.sum(np.abs(delta)))
        self.rd.add(r, delta)
        rho = kernel.exp(delta)
        self.rho += float(np.sum(rho))
        if entropy is not None:
            e = np.asarray(entropy, dtype=np.float64)
            good = np.isfinite(e)
            self.ed.add(e[good], delta[good])
            idx = np.clip((e[good] / ENTROPY_WIDTH).astype(np.int64), 0, ENTROPY_BINS - 1)
            self.bin_n += np.bincount(idx, minlength=ENTROPY_BINS)
            self.bin_d += np.bincount(idx, weights=delta[good], minlength=ENTROPY_BINS)
            self.bin_rho += np.bincount(idx, weights=rho[good], minlength=ENTROPY_BINS)

    def merge(self, o: SupportSums) -> SupportSums:
        for k in ("n", "below", "above", "d", "abs", "rho"):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        self.rd.merge(o.rd)
        self.ed.merge(o.ed)
        self.bin_n = self.bin_n + o.bin_n
        self.bin_d = self.bin_d + o.bin_d
        self.bin_rho = self.bin_rho + o.bin_rho
        return self

    def report(self) -> SamplerSupport | None:
        """The record, None without a token; the kept mass and the corrected ρ only when
        every token's δ is on one side or nearly (one-sidedness ≥ 0.5: a truncation's
        signature; a tempered sampler's bias is not a kept mass)."""
        n = self.n
        if n == 0:
            return None
        one_sided = -self.d / self.abs if self.abs > 0 else 0.0
        corr, corr_e = self.rd.correlation(), self.ed.correlation()
        kept = corrected = None
        by = None
        if one_sided >= 0.5:
            if self.ed.n == n:  # ρ / K, K the geometric mean of exp(δ) in its bin
                has = self.bin_n > 0
                log_k = self.bin_d[has] / self.bin_n[has]
                with np.errstate(over="ignore", invalid="ignore"):
                    corrected = float(np.sum(self.bin_rho[has] * np.exp(-log_k))) / n
                by = "entropy"
            else:
                corrected = self.rho / n * _exp(-self.d / n)
                by = "batch"
            kept = _exp(self.d / n)
            if not (math.isfinite(corrected) and math.isfinite(kept)):  # a δ beyond float64
                kept = corrected = by = None
        return SamplerSupport(
            tokens=n,
            below=self.below,
            above=self.above,
            one_sided=one_sided,
            corr_rollout=corr,
            corr_entropy=corr_e,
            mean_delta=self.d / n,
            is_weight_mean=self.rho / n,
            kept_mass=kept,
            is_weight_mean_corrected=corrected,
            corrected_by=by,
        )
