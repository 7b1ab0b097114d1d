"""Partials' edge cases found by the fuzz tests."""

from __future__ import annotations

import math

import numpy as np

from grpo_cli.fold.parts import RolloutPartial


def test_rollout_weights_that_underflow_give_no_division_by_zero() -> None:
    """δ = old_logp − rollout_logp = −373: ρ = e^δ ≈ 1e-162, whose square underflows to 0
    (tests/test_fuzz.py met it). The token ESS mean(ρ)²/mean(ρ²) is then not representable
    (NaN: null in JSON, with a warning); the sequence ESS is computed in log space."""
    old, rollout = np.array([-373.0]), np.array([0.0])
    p = RolloutPartial()
    p.update(old - rollout, old, rollout, np.array([0, 1]))
    r = p.report()
    assert r is not None
    assert math.isnan(r.ess_token) and r.ess_sequence == 1.0
    assert r.is_weight_mean == math.exp(-373.0) and r.chi2_token == -1.0
    # a square beyond float64: one weight dominates, ESS 0
    big = RolloutPartial()
    big.update(np.array([400.0, 0.0]), np.zeros(2), -np.array([400.0, 0.0]), np.array([0, 2]))
    rb = big.report()
    assert rb is not None and rb.ess_token == 0.0


def test_ratio_distribution_of_ratios_that_all_overflow() -> None:
    """Every Δ above log(float64 max) = 709.78: ρ's min and max are inf, not an
    OverflowError (tests/test_fuzz.py met Δ = 710 on a one-token answer)."""
    from grpo_cli.batch import Batch
    from grpo_cli.fold.tokens import TokenPartial
    from grpo_cli.settings import Settings

    b = Batch(0, np.array([0, 1]), {"logp": np.array([0.0]), "old_logp": np.array([-710.0])},
              np.array([1]))  # fmt: skip
    p = TokenPartial(Settings(beta=0.0))
    with np.errstate(over="ignore"):
        p.update(b, np.array([1.0]))
    d = p.ratio_distribution()
    assert d.min == d.max == math.inf and p.overflow == 1
