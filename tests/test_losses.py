"""The trainers' other policy losses and the sampler–trainer corrections (``_losses``):
hand-computed cases, "reduces to" identities, ragged = padded, folding, finite-difference
gradients, overflow, untouched inputs, contract errors. No torch: the trainers' own code
is conformance/losses.py's."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from grpo_cli import InputError, UsageError
from grpo_cli.core import aggregate, token_terms
from grpo_cli.losses import LOSSES as ROWS
from grpo_cli.losses import logged_metrics
from grpo_cli.losses import openrlhf as LO
from grpo_cli.losses import registry as LR
from grpo_cli.losses import slime as LS
from grpo_cli.losses import trl as LT
from grpo_cli.losses import verl as LV
from grpo_cli.losses import verl_rollout as LVR


def metrics_of(key: str) -> tuple[LR.Metric, ...]:
    """A loss's logged metrics by its name, or ``verl/bypass_mode/<loss_type>``."""
    _, _, kind = key.partition("/bypass_mode/")
    if kind:
        return logged_metrics("verl/bypass_mode", bypass_loss_type=kind)
    return logged_metrics(key)


# ---------------------------------------------------------------------------- data


def batch(seed: int = 0, lengths: tuple[int, ...] = (1, 5, 3, 7, 2, 4)) -> dict[str, Any]:
    """Ragged tokens with both signs of advantage, a zero one, ratios inside and outside
    the usual bounds; log-probs < 0 (DPPO reads them as probabilities)."""
    rng = np.random.default_rng(seed)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(off[-1])
    old = -rng.uniform(0.05, 3.0, size=T)
    lp = np.minimum(old + rng.normal(0.0, 0.4, size=T), -1e-3)
    roll = old + rng.normal(0.0, 0.3, size=T)
    adv = np.array([1.0, -0.7, 0.0, 1.5, -1.2, 0.4])[: len(lengths)]
    return {"lp": lp, "old": old, "roll": roll, "adv": adv, "off": off}


def all_losses(b: dict[str, Any]) -> dict[str, LR.PolicyTerms]:
    lp, old, adv, off = b["lp"], b["old"], b["adv"], b["off"]
    return {
        "cispo": LT.cispo_terms(lp, old, adv, off, upper=1.3),
        "cispo_seq": LT.cispo_terms(lp, old, adv, off, upper=1.3, ratio_level="sequence"),
        "sapo": LT.sapo_terms(lp, old, adv, off, log_ratio_clamp=20.0),
        "sapo_seq": LT.sapo_terms(lp, old, adv, off, ratio_level="sequence"),
        "luspo": LT.luspo_terms(lp, old, adv, off, clip_eps=0.05),
        "vespo": LT.vespo_terms(lp, old, adv, off),
        "dppo_tv": LV.dppo_terms(lp, old, adv, off, clip_low=0.05, clip_high=0.05),
        "dppo_kl": LV.dppo_terms(lp, old, adv, off, divergence="kl", clip_low=0.01, clip_high=0.01),
        "gpg": LV.gpg_terms(lp, adv, off),
        "clip_cov": LV.clip_cov_terms(lp, old, adv, off, clip_cov_ratio=0.1, clip_cov_lb=0.01),
        "kl_cov": LV.kl_cov_terms(lp, old, adv, off, kl_cov_ratio=0.1),
        "geo_mean": LV.geo_mean_terms(lp, old, adv, off),
        "dro": LV.dro_terms(lp, old, adv, off, beta=0.3),
    }


# ----------------------------------------------------------------- hand-computed


def test_cispo_trl_caps_the_weight_at_epsilon_high_and_counts_positive_advantages() -> None:
    # ρ = 1, e^1.5 = 4.48, e^1.5: capped at 2; TRL counts ρ > 2 only where A > 0
    t = LT.cispo_terms([-1.0, -0.5, -0.5], [-1.0, -2.0, -2.0], [1.0, -1.0], [0, 2, 3], upper=2.0)
    assert t.weight is not None and t.grad is not None
    np.testing.assert_allclose(t.weight, [1.0, 2.0, 2.0])
    np.testing.assert_allclose(t.term, [-1.0, -1.0, 1.0])  # w·A·logp
    np.testing.assert_allclose(t.grad, [1.0, 2.0, -2.0])  # w·A
    assert t.flags["trl_clipped"].tolist() == [False, True, False]
    m = LR.loss_metrics(t, [0, 2, 3], metrics_of("trl/cispo"))
    assert m == {"cispo_clip_ratio": pytest.approx(1 / 3)}


def test_cispo_verl_clips_both_ways_and_counts_every_clipped_token() -> None:
    t = LT.cispo_terms(np.log([0.5, 1.0, 3.0]), np.zeros(3), [2.0], [0, 3], lower=0.8, upper=1.2)
    assert t.weight is not None
    np.testing.assert_allclose(t.weight, [0.8, 1.0, 1.2])
    m = LR.loss_metrics(t, [0, 3], metrics_of("verl/cispo"))
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert m["actor/pg_clipfrac_lower"] == 0.0
    assert m["actor/ppo_kl"] == pytest.approx(-np.log([0.5, 1.0, 3.0]).mean())


def test_sapo_gate_by_hand() -> None:
    # ρ = 1: σ(0) = ½, gate 2/τ; f'(1)·ρ = 4·¼ = 1, so grad = A
    t = LT.sapo_terms([-1.0, -1.0], [-1.0, -1.0], [2.0, -3.0], [0, 1, 2], tau_neg=1.05)
    np.testing.assert_allclose(t.term, [2.0 * 2.0, -3.0 * 2.0 / 1.05])
    assert t.grad is not None
    np.testing.assert_allclose(t.grad, [2.0, -3.0])
    # ρ = 2, τ = 1: σ(1)·4 and 4σ(1)(1 − σ(1))·2
    t = LT.sapo_terms([math.log(2.0)], [0.0], [1.0], [0, 1])
    s = 1.0 / (1.0 + math.exp(-1.0))
    assert t.term[0] == pytest.approx(4.0 * s)
    assert t.grad is not None and t.grad[0] == pytest.approx(4.0 * s * (1.0 - s) * 2.0)
    assert t.agg == "seq-mean-token-mean"


def test_vespo_weight_by_hand() -> None:
    # Σ Δ = log 2: w = 2; A > 0: φ = e^λ w^k e^{−λw} = e³·4·e⁻⁶
    t = LT.vespo_terms([-1.0, -1.0], [-1.0 - math.log(2.0), -1.0], [0.5], [0, 2])
    phi = math.exp(3.0) * 4.0 * math.exp(-6.0)
    assert t.answer_values["phi"][0] == pytest.approx(phi)
    np.testing.assert_allclose(t.term, [phi * 0.5 * -1.0] * 2)
    # A < 0 takes (k_neg, λ_neg) = (3, 2); A = 0 takes the positive pair (A >= 0)
    t = LT.vespo_terms([0.0, 0.0], [-math.log(2.0), -math.log(2.0)], [-1.0, 0.0], [0, 1, 2])
    np.testing.assert_allclose(t.answer_values["phi"], [math.exp(2.0) * 8.0 * math.exp(-4.0), phi])
    assert LR.loss_metrics(t, [0, 1, 2], metrics_of("trl/vespo"))[
        "vespo/phi_seq_mean"
    ] == pytest.approx(float(np.mean(t.answer_values["phi"])))


def test_vespo_is_ratio_enters_the_sequence_weight() -> None:
    # log w = Σ Δ + Σ log is = 0 + log 2
    t = LT.vespo_terms([-1.0, -1.0], [-1.0, -1.0], [1.0], [0, 2], is_ratio=[2.0, 1.0])
    assert t.answer_values["phi"][0] == pytest.approx(4.0 * math.exp(-3.0))


def test_dppo_tv_and_kl_by_hand() -> None:
    p, q = np.array([0.5, 0.9, 0.2]), np.array([0.5, 0.5, 0.5])
    adv = [1.0, 1.0, -1.0]
    t = LV.dppo_terms(np.log(p), np.log(q), adv, [0, 1, 2, 3], clip_low=0.2, clip_high=0.2)
    # p − q = 0, 0.4 (> 0.2, A > 0: invalid), −0.3 (< −0.2, A < 0: invalid)
    assert t.flags["invalid"].tolist() == [False, True, True]
    kl = q * np.log(q / p) + (1 - q) * np.log((1 - q + 1e-8) / (1 - p + 1e-8))
    t = LV.dppo_terms(
        np.log(p), np.log(q), adv, [0, 1, 2, 3], divergence="kl", clip_low=0.2, clip_high=0.2
    )
    valid = [True, kl[1] <= 0.2, kl[2] <= 0.2]
    assert (~t.flags["invalid"]).tolist() == valid
    # a probability moving against the advantage is always valid under the KL gate
    t = LV.dppo_terms(np.log([0.1]), np.log([0.9]), [1.0], [0, 1], divergence="kl")
    assert not t.flags["invalid"][0]


def test_dppo_truncates_the_ratio_at_the_cap() -> None:
    t = LV.dppo_terms(np.log([0.9]), np.log([0.1]), [-1.0], [0, 1], clip_low=1.0, ratio_cap=3.0)
    assert t.grad is not None and t.grad[0] == pytest.approx(-3.0)  # A·min(9, 3)
    assert t.flags["truncated"][0]


def test_clip_cov_selects_candidates_by_covariance() -> None:
    lp = np.array([-3.0, -1.0, -1.0, -3.0])
    args = (lp, lp, [2.0, -2.0], [0, 2, 4])
    # Ā = 0, l̄ = −2: cov = −2, 2, −2, 2; tokens 1 and 3 are candidates; k = 1
    t = LV.clip_cov_terms(*args, clip_cov_ratio=0.25)
    assert t.flags["candidate"].tolist() == [False, True, False, True]
    np.testing.assert_allclose(t.term, [2.0, 1.0, -2.0, -1.0])  # ρ = 1: A · (1 − ½)
    assert LR.loss_metrics(t, [0, 2, 4], metrics_of("verl/clip_cov"))["actor/pg_clipfrac"] == 0.25
    t = LV.clip_cov_terms(*args, clip_cov_ratio=0.25, selection="order", order=[1, 0])
    np.testing.assert_allclose(t.term, [2.0, 2.0, -2.0, 0.0])  # candidate 1 = token 3
    t = LV.clip_cov_terms(*args, clip_cov_ratio=1.0)  # k = 4 ≥ 2: both removed
    np.testing.assert_allclose(t.term, [2.0, 0.0, -2.0, 0.0])


def test_kl_cov_penalises_the_top_covariance_tokens() -> None:
    t = LV.kl_cov_terms(
        [-3.0, -1.0], [-3.5, -1.0], [1.0, -1.0], [0, 1, 2], kl_cov_ratio=0.5, ppo_kl_coef=1.0
    )
    assert t.flags["selected"].tolist() == [True, False]
    np.testing.assert_allclose(t.term, [math.exp(0.5) - 0.5, -1.0])
    assert t.grad is not None
    np.testing.assert_allclose(t.grad, [math.exp(0.5) - 1.0, -1.0])


def test_geo_mean_by_hand() -> None:
    # Δ = (0.5, −0.5), A > 0: Δ̃ = (min(0.5, 0.2), −0.5); r = exp(−0.15)
    t = LV.geo_mean_terms([-1.0, -1.0], [-1.5, -0.5], [1.0], [0, 2], length_eps=0.0)
    np.testing.assert_allclose(t.term, [math.exp(-0.15)] * 2)
    assert t.grad is not None
    np.testing.assert_allclose(t.grad, [0.0, math.exp(-0.15)])  # |o|·J/|o| where free
    m = LR.loss_metrics(t, [0, 2], metrics_of("verl/geo_mean"))
    # verl counts every token whose Δ the clamp changes, even the one the min leaves free
    assert m["actor/pg_clipfrac"] == 1.0 and m["actor/pg_clipfrac_lower"] == 0.0
    # A < 0: Δ̃ = max(Δ, −0.2)
    t = LV.geo_mean_terms([-1.0, -1.0], [-1.5, -0.5], [-2.0], [0, 2], length_eps=0.0)
    np.testing.assert_allclose(t.term, [-2.0 * math.exp(0.15)] * 2)


def test_dro_by_hand() -> None:
    t = LV.dro_terms([-1.0, -0.5], [-2.0, -0.5], [1.0, -1.0], [0, 1, 2], beta=0.5)
    np.testing.assert_allclose(t.term, [-1.0 - 0.25, 0.5])
    assert t.grad is not None
    np.testing.assert_allclose(t.grad, [1.0 - 0.5, -1.0])


def test_bypass_reinforce_is_the_is_weighted_policy_gradient() -> None:
    lp, roll = np.array([-1.0, -1.0, -2.0]), np.array([-1.5, -1.0, -2.2])
    t, c = LVR.verl_bypass_mode(
        lp,
        roll,
        [1.0, -1.0],
        [0, 2, 3],
        loss_type="reinforce",
        rollout_is="token",
        rollout_is_threshold=1.5,
    )
    w = np.minimum(np.exp(lp - roll), 1.5)
    np.testing.assert_allclose(c.weight, w)
    np.testing.assert_allclose(t.term, w * np.array([1.0, 1.0, -1.0]) * lp)
    m = LR.loss_metrics(t, [0, 2, 3], metrics_of("verl/bypass_mode/reinforce"))
    assert m["actor/ppo_kl"] == pytest.approx(float(np.mean(roll - lp)))


# ------------------------------------------------------------------- reduces to


def test_luspo_is_gspo_times_length() -> None:
    b = batch(1)
    lp, old, adv, off = b["lp"], b["old"], b["adv"], b["off"]
    lengths = np.diff(off)
    t = LT.luspo_terms(lp, old, adv, off, clip_eps=0.05)
    gspo = token_terms(lp, old, None, adv, off, clip_eps=0.05, ratio_level="sequence", beta=0.0)
    per_answer = np.add.reduceat(gspo.term, off[:-1]) / lengths  # each GSPO answer's objective
    assert t.agg is not None
    assert aggregate(t.term, off, agg=t.agg) == pytest.approx(float(np.mean(lengths * per_answer)))


def test_gpg_is_the_plain_policy_gradient_and_cispo_dppo_reduce_to_it_on_policy() -> None:
    b = batch(2)
    lp, adv, off = b["lp"], b["adv"], b["off"]
    a_tok = np.repeat(adv, np.diff(off))
    g = LV.gpg_terms(lp, adv, off)
    np.testing.assert_array_equal(g.term, a_tok * lp)
    for t in (
        LT.cispo_terms(lp, lp, adv, off, lower=0.8, upper=1.2),  # ρ = 1: no bound binds
        LV.dppo_terms(lp, lp, adv, off),  # p = q: every token valid, min(1, c) = 1
        LVR.verl_bypass_mode(lp, lp, adv, off, loss_type="reinforce")[0],  # w = 1
    ):
        np.testing.assert_allclose(t.term, g.term, rtol=1e-15)
        assert t.grad is not None and g.grad is not None
        np.testing.assert_allclose(t.grad, g.grad, rtol=1e-15)


def test_dro_is_gpg_minus_the_quadratic_penalty_and_kl_cov_without_penalty_is_rho_a() -> None:
    b = batch(3)
    lp, old, adv, off = b["lp"], b["old"], b["adv"], b["off"]
    a_tok = np.repeat(adv, np.diff(off))
    d = LV.dro_terms(lp, old, adv, off, beta=0.8)
    g = LV.gpg_terms(lp, adv, off)
    np.testing.assert_allclose(g.term - d.term, 0.4 * (lp - old) ** 2, rtol=1e-12, atol=1e-16)
    k = LV.kl_cov_terms(lp, old, adv, off, ppo_kl_coef=0.0, kl_cov_ratio=0.5)
    np.testing.assert_allclose(k.term, np.exp(lp - old) * a_tok, rtol=1e-15)


def test_clip_cov_without_candidates_is_the_clipped_surrogate() -> None:
    b = batch(4)
    lp, old, adv, off = b["lp"], b["old"], b["adv"], b["off"]
    t = LV.clip_cov_terms(lp, old, adv, off, clip_cov_lb=1e9, clip_cov_ub=2e9)
    tt = token_terms(lp, old, None, adv, off, beta=0.0)
    np.testing.assert_array_equal(t.term, tt.policy)
    assert (
        LR.loss_metrics(t, off, ROWS["verl/clip_cov"].metrics_for(None))["actor/pg_clipfrac"] == 0.0
    )


def test_geo_mean_without_clipping_on_one_token_answers_is_the_ratio_times_a() -> None:
    lp, old, adv = np.array([-1.0, -0.2, -3.0]), np.array([-1.4, -0.5, -2.0]), [1.0, -2.0, 0.5]
    t = LV.geo_mean_terms(lp, old, adv, [0, 1, 2, 3], clip_low=1e9, clip_high=1e9, length_eps=0.0)
    np.testing.assert_allclose(t.term, np.exp(lp - old) * adv, rtol=1e-15)


def test_sapo_gate_approaches_the_unclipped_ratio_near_one() -> None:
    # f(ρ) = σ(τ(ρ−1))·4/τ = 2/τ + (ρ − 1) + O((ρ−1)³): with τ = 1, f(ρ) − 1 ≈ ρ
    rho = 1.0 + np.array([1e-4, -1e-4])
    t = LT.sapo_terms(np.log(rho), np.zeros(2), [1.0], [0, 2])
    np.testing.assert_allclose(t.term - 1.0, rho, rtol=1e-10)


def test_corrections_change_nothing_when_the_sampler_agrees() -> None:
    b = batch(5)
    old, off = b["old"], b["off"]
    T = old.shape[0]
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        c = LT.trl_vllm_is_correction(old, old, off, mode=mode)
        np.testing.assert_array_equal(c.weight, np.ones(T))
    for rc in (
        {"rollout_is": "token"},
        {"rollout_is": "sequence", "rollout_is_threshold": "0.5_2"},
        {"rollout_is": "token", "rollout_is_batch_normalize": True},
        {"rollout_rs": ",".join(LVR.RS_OPTIONS), "rollout_rs_threshold": 1.5},
    ):
        c = LVR.verl_rollout_correction(old, old, off, **rc)
        # batch normalisation divides by verl's mean over T + 1e-8: 1 + 1e-8/T
        np.testing.assert_allclose(c.weight, np.ones(T), rtol=1e-9)
        assert c.keep.all()
        assert c.metrics["rollout_corr/kl"] == 0.0
        assert c.metrics["rollout_corr/chi2_token"] == pytest.approx(0.0, abs=1e-9)  # T + 1e-8
    orl: list[tuple[Any, Any, Any, tuple[float, float]]] = [
        ("token", "mask", "ratio", (0.5, 5.0)),
        ("token", "clip", "ratio", (0.5, 5.0)),
        ("seq", "mask", "ratio", (0.5, 5.0)),
        ("token", "mask", "binary_kl", (0.0, 0.01)),
        ("seq", "mask", "tv", (0.0, 0.01)),
    ]
    for level, mode, gating, thr in orl:
        c = LO.openrlhf_is_correction(
            old, old, off, level=level, mode=mode, gating=gating, threshold=thr
        )
        np.testing.assert_array_equal(c.weight, np.ones(T))
        assert c.metrics == {"vllm_kl": 0.0, "is_filter_ratio": 0.0}


def test_a_cap_that_never_binds_gives_the_plain_importance_weight() -> None:
    b = batch(6)
    old, roll, off = b["old"], b["roll"], b["off"]
    rho = np.exp(old - roll)
    c = LT.trl_vllm_is_correction(old, roll, off, mode="token_truncate", clip_max=1e300)
    np.testing.assert_array_equal(c.weight, rho)
    c = LVR.verl_rollout_correction(old, roll, off, rollout_is="token", rollout_is_threshold=1e300)
    np.testing.assert_array_equal(c.weight, rho)
    c = LO.openrlhf_is_correction(old, roll, off, level="token", threshold=(0.0, 1e300))
    np.testing.assert_array_equal(c.weight, rho)
    # the sequence weight is the product of the token ratios, on each of the answer's tokens
    c = LT.trl_vllm_is_correction(old, roll, off, mode="sequence_truncate", clip_max=1e300)
    prod = np.exp(np.add.reduceat(old - roll, off[:-1]))
    np.testing.assert_allclose(c.weight, np.repeat(prod, np.diff(off)), rtol=1e-13)
    # applied: the IS-weighted term
    t = LV.gpg_terms(b["lp"], b["adv"], off)
    np.testing.assert_array_equal(LR.apply_correction(t, c).term, t.term * c.weight)


def test_verl_batch_normalisation_makes_the_mean_weight_one() -> None:
    b = batch(7)
    c = LVR.verl_rollout_correction(
        b["old"], b["roll"], b["off"], rollout_is="token", rollout_is_batch_normalize=True
    )
    assert c.weight.mean() == pytest.approx(1.0, rel=1e-7)  # verl divides by T + 1e-8
    assert "rollout_corr/rollout_is_batch_norm_factor" in c.metrics


def test_verl_icepop_zeroes_outside_the_band_and_k1_reads_one_value_as_its_reciprocal() -> None:
    old, roll = np.array([-1.0, -1.0, -1.0]), np.array([-1.0, -2.0, 0.5])
    c = LVR.verl_rollout_correction(
        old, roll, [0, 1, 2, 3], rollout_is="token", rollout_is_threshold="0.5_2.0"
    )
    np.testing.assert_allclose(c.weight, [1.0, 0.0, 0.0])  # e^1 > 2, e^−1.5 < 0.5
    assert c.metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    # token_k1 with "2": keep −log ρ in [log ½, log 2]: ρ = e^1 > 2 rejected, e^−1.5 < ½ too
    c = LVR.verl_rollout_correction(
        old, roll, [0, 1, 2, 3], rollout_is=None, rollout_rs="token_k1", rollout_rs_threshold=2.0
    )
    assert c.keep.tolist() == [True, False, False]
    assert c.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)


def test_drop_tokens_removes_rejected_tokens_and_empty_answers() -> None:
    off, (x,), kept = LR.drop_tokens(
        np.array([True, False, False, True, True]), [0, 2, 3, 5], [1.0, 2.0, 3.0, 4.0, 5.0]
    )
    assert off.tolist() == [0, 1, 3] and x.tolist() == [1.0, 4.0, 5.0] and kept.tolist() == [0, 2]


# ------------------------------------------------------------ ragged and folding


def padded_sapo(lp: np.ndarray, old: np.ndarray, adv: np.ndarray, mask: np.ndarray) -> float:
    """SAPO written the plain way on (N, L) arrays, row by row (seq-mean-token-mean)."""
    rows = []
    for i in range(lp.shape[0]):
        m = mask[i]
        rho = np.exp(np.clip(lp[i][m] - old[i][m], -20, 20))
        tau = 1.0 if adv[i] > 0 else 1.05
        gate = 4.0 / tau / (1.0 + np.exp(-tau * (rho - 1.0)))
        rows.append(np.mean(gate * adv[i]))
    return float(np.mean(rows))


def padded_geo_mean(lp: np.ndarray, old: np.ndarray, adv: np.ndarray, mask: np.ndarray) -> float:
    rows = []
    for i in range(lp.shape[0]):
        m = mask[i]
        d = lp[i][m] - old[i][m]
        dt = np.minimum(d, 0.2) if adv[i] > 0 else np.maximum(d, -0.2) if adv[i] < 0 else 0 * d
        n = m.sum() + 1e-8
        rows.append(adv[i] * m.sum() / n * np.exp(dt.sum() / n))
    return float(np.mean(rows))


def test_ragged_equals_padded_and_padding_never_matters() -> None:
    b = batch(8)
    off, adv = b["off"], b["adv"]
    lengths = np.diff(off)
    N, W = len(lengths), int(lengths.max()) + 2
    mask = np.arange(W)[None, :] < lengths[:, None]
    for fill in (0.0, 7.0, -1e6):
        lp_p, old_p = np.full((N, W), fill), np.full((N, W), -fill)
        lp_p[mask], old_p[mask] = b["lp"], b["old"]
        s = LT.sapo_terms(b["lp"], b["old"], adv, off, log_ratio_clamp=20.0)
        assert s.agg is not None
        assert aggregate(s.term, off, agg=s.agg) == pytest.approx(
            padded_sapo(lp_p, old_p, adv, mask), rel=1e-13
        )
        g = LV.geo_mean_terms(b["lp"], b["old"], adv, off)
        assert g.agg is not None
        assert aggregate(g.term, off, agg=g.agg) == pytest.approx(
            padded_geo_mean(lp_p, old_p, adv, mask), rel=1e-13
        )


def test_answer_local_losses_fold_over_answers_and_covariance_ones_do_not() -> None:
    """Terms of the first 3 answers computed alone equal those of the whole batch (they
    fold); clip_cov and kl_cov select by a covariance over the batch they are given."""
    b = batch(9)
    whole = all_losses(b)
    cut = int(b["off"][3])
    part = all_losses(
        {**b, "lp": b["lp"][:cut], "old": b["old"][:cut], "adv": b["adv"][:3], "off": b["off"][:4]}
    )
    for name in whole:
        same = np.array_equal(part[name].term, whole[name].term[:cut])
        assert same == (name not in ("clip_cov", "kl_cov")), name


def test_float32_inputs_give_the_float64_results_of_the_same_values() -> None:
    b = batch(10)
    b32 = {**b, "lp": b["lp"].astype(np.float32), "old": b["old"].astype(np.float32)}
    b64 = {**b, "lp": b32["lp"].astype(np.float64), "old": b32["old"].astype(np.float64)}
    for name, t in all_losses(b32).items():
        assert t.term.dtype == np.float64, name
        np.testing.assert_array_equal(t.term, all_losses(b64)[name].term)


def test_inputs_are_never_written() -> None:
    b = batch(11)
    frozen = {k: np.array(v) for k, v in b.items()}
    for v in frozen.values():
        v.setflags(write=False)
    all_losses(frozen)  # a write into a read-only array raises
    LVR.verl_rollout_correction(
        frozen["old"],
        frozen["roll"],
        frozen["off"],
        rollout_rs="token_k2,seq_max_k3",
        rollout_rs_threshold="1,1",
    )
    LT.trl_vllm_is_correction(frozen["old"], frozen["roll"], frozen["off"])
    LO.openrlhf_is_correction(frozen["old"], frozen["roll"], frozen["off"], level="seq")
    LVR.verl_bypass_mode(frozen["lp"], frozen["roll"], frozen["adv"], frozen["off"])
    for k, v in b.items():
        np.testing.assert_array_equal(frozen[k], v)


# ------------------------------------------------------------------- gradients


def answer_sums(
    fn: Callable[[np.ndarray], LR.PolicyTerms], lp: np.ndarray, off: np.ndarray, t: int
) -> float:
    """Σ over token t's answer of the terms."""
    i = int(np.searchsorted(off, t, side="right")) - 1
    return float(fn(lp).term[off[i] : off[i + 1]].sum())


@pytest.mark.parametrize("name", ["sapo", "sapo_seq", "luspo", "geo_mean", "dro", "kl_cov", "gpg"])
def test_closed_form_gradients_match_finite_differences(name: str) -> None:
    b = batch(12)
    old, adv, off = b["old"], b["adv"], b["off"]

    def fn(lp: np.ndarray) -> LR.PolicyTerms:
        return all_losses({**b, "lp": lp})[name]

    g = fn(b["lp"]).grad
    assert g is not None
    h = 1e-6
    for t in range(b["lp"].shape[0]):
        up, down = b["lp"].copy(), b["lp"].copy()
        up[t] += h
        down[t] -= h
        fd = (answer_sums(fn, up, off, t) - answer_sums(fn, down, off, t)) / (2 * h)
        assert g[t] == pytest.approx(fd, rel=1e-5, abs=1e-7), (name, t)
    del old, adv


def test_detached_weights_give_weight_times_advantage() -> None:
    """CISPO, DPPO and VESPO hold their weight constant (the trainers detach it)."""
    b = batch(13)
    a_tok = np.repeat(b["adv"], np.diff(b["off"]))
    for name in ("cispo", "cispo_seq", "dppo_tv", "dppo_kl", "vespo"):
        t = all_losses(b)[name]
        assert t.weight is not None and t.grad is not None
        np.testing.assert_allclose(t.grad, t.weight * a_tok, rtol=1e-15, err_msg=name)


# --------------------------------------------------------------------- numerics


def test_overflowing_ratios_give_finite_or_infinite_terms_never_nan() -> None:
    lp = np.array([-1.0, -1.0, -1.0, -1.0])
    old = np.array([-801.0, -801.0, -1.0, -801.0])  # Δ = 800: e^800 overflows
    adv, off = np.array([1.0, -1.0, 0.0]), np.array([0, 1, 2, 4])
    b = {"lp": lp, "old": old, "adv": adv, "off": off}
    for name, t in all_losses(b).items():
        assert not np.isnan(t.term).any(), name
        assert t.grad is None or not np.isnan(t.grad).any(), name
    finite = ("cispo", "cispo_seq", "sapo", "vespo", "dppo_tv", "dppo_kl", "gpg", "dro")
    for name in finite:
        assert np.isfinite(all_losses(b)[name].term).all(), name
    roll = np.array([-900.0, -1.0, -1.0, -1.0])  # the sampler 899 nats below
    for mode in ("sequence_mask", "token_truncate"):
        c = LT.trl_vllm_is_correction(np.full(4, -1.0), roll, off, mode=mode)
        assert np.isfinite(c.weight).all() and not np.isnan(list(c.metrics.values())).any()
    c = LVR.verl_rollout_correction(lp, roll, off, rollout_is="sequence")
    assert np.isfinite(c.weight).all()
    t = LR.apply_correction(LT.cispo_terms(lp, old, adv, off, upper=None), np.zeros(4))
    np.testing.assert_array_equal(t.term, np.zeros(4))  # inf · 0 is 0, not NaN


# ------------------------------------------------------------------- contracts


@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (lambda: LT.cispo_terms([-1.0, -1.0], [-1.0], [1.0], [0, 2]), InputError, "old_logp"),
        (
            lambda: LT.sapo_terms([-1.0, -1.0], [-1.0, -1.0], [1.0, 2.0, 3.0], [0, 2]),
            InputError,
            "adv",
        ),
        (lambda: LV.gpg_terms([-1.0, -1.0], [1.0], [0, 3]), InputError, "offsets"),
        (lambda: LV.dro_terms([-1.0], [-1.0], [1.0], [0, 0, 1], beta=1.0), InputError, "offsets"),
        (lambda: LV.gpg_terms([[-1.0]], [1.0], [0, 1]), InputError, "logp"),
        (lambda: LV.gpg_terms(np.array(["a"]), [1.0], [0, 1]), InputError, "logp"),
        (
            lambda: LT.cispo_terms([-1.0], [-1.0], [1.0], [0, 1], ratio_level="seq"),  # type: ignore[arg-type]
            UsageError,
            "ratio_level",
        ),
        (
            lambda: LV.dppo_terms([-1.0], [-1.0], [1.0], [0, 1], divergence="js"),  # type: ignore[arg-type]
            UsageError,
            "divergence",
        ),
        (lambda: LV.dro_terms([-1.0], [-1.0], [1.0], [0, 1], beta=0.0), UsageError, "beta"),
        (lambda: LT.sapo_terms([-1.0], [-1.0], [1.0], [0, 1], tau_neg=-1.0), UsageError, "tau_neg"),
        (
            lambda: LV.clip_cov_terms([-1.0], [-1.0], [1.0], [0, 1], selection="order"),
            UsageError,
            "order",
        ),
        (
            lambda: LV.clip_cov_terms([-1.0], [-1.0], [1.0], [0, 1], selection="order", order=[3]),
            InputError,
            "order",
        ),
        (
            lambda: LT.vespo_terms([-1.0], [-1.0], [1.0], [0, 1], is_ratio=[-1.0]),
            InputError,
            "is_ratio",
        ),
        (
            lambda: LT.trl_vllm_is_correction([-1.0], [-1.0], [0, 1], mode="token"),  # type: ignore[arg-type]
            UsageError,
            "mode",
        ),
        (
            lambda: LT.trl_vllm_is_correction([-1.0], [-1.0], [0, 1], clip_min=3.0),
            UsageError,
            "clip_min",
        ),
        (
            lambda: LVR.verl_rollout_correction([-1.0], [-1.0], [0, 1], rollout_is="seq"),  # type: ignore[arg-type]
            UsageError,
            "rollout_is",
        ),
        (
            lambda: LVR.verl_rollout_correction([-1.0], [-1.0], [0, 1], rollout_is_threshold="a_b"),
            UsageError,
            "rollout_is_threshold",
        ),
        (
            lambda: LVR.verl_rollout_correction(
                [-1.0], [-1.0], [0, 1], rollout_rs="token_k4", rollout_rs_threshold=1.0
            ),
            UsageError,
            "rollout_rs",
        ),
        (
            lambda: LVR.verl_rollout_correction([-1.0], [-1.0], [0, 1], rollout_rs="token_k2"),
            UsageError,
            "rollout_rs_threshold",
        ),
        (
            lambda: LVR.verl_rollout_correction(
                [-1.0], [-1.0], [0, 1], rollout_rs="token_k2", rollout_rs_threshold="0.1_2"
            ),
            UsageError,
            "rollout_rs_threshold",
        ),
        (
            lambda: LO.openrlhf_is_correction([-1.0], [-1.0], [0, 1], level="seq", mode="clip"),
            UsageError,
            "mode",
        ),
        (
            lambda: LO.openrlhf_is_correction([-1.0], [-1.0], [0, 1], level="token", gating="tv"),
            UsageError,
            "gating",
        ),
        (
            lambda: LVR.verl_bypass_mode([-1.0], [-1.0], [1.0], [0, 1], loss_type="ppo"),  # type: ignore[arg-type]
            UsageError,
            "loss_type",
        ),
        (
            lambda: LR.loss_metrics(
                LV.gpg_terms([-1.0], [1.0], [0, 1]), [0, 1], metrics_of("verl/ppo")
            ),
            UsageError,
            "loss",
        ),
        (
            lambda: LR.apply_correction(LV.gpg_terms([-1.0], [1.0], [0, 1]), [1.0, 1.0]),
            InputError,
            "weight",
        ),
        (lambda: LR.drop_tokens([1, 0], [0, 2]), InputError, "keep"),
    ],
)
def test_contract_errors_name_the_argument(
    call: Callable[[], object], exc: type, name: str
) -> None:
    with pytest.raises(exc, match=name):
        call()


def _row_terms(name: str, b: dict[str, Any]) -> LR.PolicyTerms:
    """A registry row's terms on the batch, with its default parameters."""
    row = ROWS[name]
    assert row.terms is not None
    call = LR.LossCall({"logp": b["lp"], "old_logp": b["old"]}, b["adv"], b["off"], row.params())
    t = row.terms(call)
    assert isinstance(t, LR.PolicyTerms)
    return t


def test_every_metric_table_entry_reads_a_quantity_its_loss_returns() -> None:
    b = batch(14)
    terms = all_losses(b)
    lp, roll, adv, off = b["lp"], b["roll"], b["adv"], b["off"]
    by_key = {
        "trl/cispo": terms["cispo"],
        "trl/sapo": terms["sapo"],
        "trl/luspo": terms["luspo"],
        "trl/vespo": terms["vespo"],
        "verl/dppo_tv": terms["dppo_tv"],
        "verl/dppo_kl": terms["dppo_kl"],
        "verl/sapo": terms["sapo"],
        "verl/gpg": terms["gpg"],
        "verl/clip_cov": terms["clip_cov"],
        "verl/kl_cov": terms["kl_cov"],
        "verl/geo_mean": terms["geo_mean"],
        "verl/dro": terms["dro"],
        "verl/cispo": terms["cispo"],
        "slime/ppo_eps_clip": LS.slime_policy_terms(lp, b["old"], adv, off),
        "slime/cispo": terms["cispo"],
        **{
            name: _row_terms(name, b) for name in ("areal/sapo", "prime_rl/ipo", "prime_rl/dppo_tv")
        },
        "verl/bypass_mode/ppo_clip": LVR.verl_bypass_mode(lp, roll, adv, off)[0],
        "verl/bypass_mode/reinforce": LVR.verl_bypass_mode(
            lp, roll, adv, off, loss_type="reinforce"
        )[0],
    }
    assert {k.split("/ppo_clip")[0].split("/reinforce")[0] for k in by_key} == set(ROWS) - {"clip"}
    for key, t in by_key.items():
        m = LR.loss_metrics(t, off, metrics_of(key))
        assert list(m) == [metric.name for metric in metrics_of(key)]
        assert all(math.isfinite(v) for v in m.values()), key
