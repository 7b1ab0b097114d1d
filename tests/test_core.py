"""Kernels: hand-worked cases, "reduces to" identities, and properties (hypothesis)."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from grpo_cli import (
    AGGREGATIONS,
    InputError,
    UsageError,
    advantages_by_group,
    aggregate,
    check_offsets,
    clipped_surrogate,
    flatten_padded,
    group_advantages,
    grpo_objective,
    kl_estimate,
    kl_k3,
    segment_mean,
    segment_sum,
    token_terms,
)
from grpo_cli.core import aggregation_weights, clip_counts, ratio_moments

from .conftest import reference_objective

# ------------------------------------------------------------------------ advantages


def test_zero_variance_group_is_exactly_zero_even_for_inexact_floats() -> None:
    # 0.1 * 3 / 3 != 0.1 in float64: a naive std leaves a residual that eps turns into noise.
    r = np.array([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]], dtype=np.float32).astype(np.float64)
    out = group_advantages(r, eps=1e-12)
    assert (out == 0.0).all()


def test_group_advantages_sum_to_zero_and_unit_population_std() -> None:
    rng = np.random.default_rng(0)
    r = rng.normal(size=(5, 7))
    a = group_advantages(r, eps=0.0)
    np.testing.assert_allclose(a.sum(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(a.std(axis=1), 1.0, rtol=1e-12)


def test_advantages_labels_need_not_be_adjacent() -> None:
    r = np.array([1.0, 10.0, 3.0, 30.0])
    codes = np.array([0, 1, 0, 1])
    a = advantages_by_group(r, codes)
    # group 0 = {1, 3}: mean 2, std 1; group 1 = {10, 30}: mean 20, std 10.
    np.testing.assert_allclose(
        a, [-1 / (1 + 1e-8), -10 / (10 + 1e-8), 1 / (1 + 1e-8), 10 / (10 + 1e-8)], rtol=1e-15
    )


def test_sample_std_ddof1() -> None:
    a = advantages_by_group([0.0, 1.0, 2.0], [0, 0, 0], ddof=1, eps=0.0)
    np.testing.assert_allclose(a, [-1.0, 0.0, 1.0])  # sample std of {0,1,2} is 1


def test_batch_scale_uses_std_of_all_rewards_mean_per_group() -> None:
    r = np.array([0.0, 2.0, 10.0, 14.0])
    codes = np.array([0, 0, 1, 1])
    a = advantages_by_group(r, codes, scale="batch", eps=0.0)
    s = np.std(r)  # population std of all four
    np.testing.assert_allclose(a, [-1 / s, 1 / s, -2 / s, 2 / s], rtol=1e-15)


def test_scale_none_is_dr_grpo_centring_only() -> None:
    a = advantages_by_group([1.0, 3.0, 8.0], [0, 0, 0], scale="none")
    np.testing.assert_allclose(a, [-3.0, -1.0, 4.0])


def test_rloo_is_g_over_g_minus_1_times_centred() -> None:
    rng = np.random.default_rng(1)
    r = rng.normal(size=20)
    codes = np.repeat(np.arange(4), 5)
    a = advantages_by_group(r, codes, estimator="rloo", scale="none")
    centred = r - np.repeat(r.reshape(4, 5).mean(axis=1), 5)
    np.testing.assert_allclose(a, 5 / 4 * centred, rtol=1e-12, atol=1e-14)
    # and by its definition: r_i minus the mean of the other four
    i = 7
    others = np.delete(r[5:10], 2)
    assert math.isclose(a[i], r[i] - others.mean(), rel_tol=1e-12)


def test_singletons_zero_or_verl_raw() -> None:
    r, codes = np.array([5.0, 1.0, 2.0]), np.array([0, 1, 1])
    assert advantages_by_group(r, codes)[0] == 0.0
    raw = advantages_by_group(r, codes, singleton="raw", ddof=1, eps=1e-6)
    assert raw[0] == 5.0 / (1 + 1e-6)  # verl: mean 0, std 1


@given(
    hnp.arrays(
        np.float64, st.tuples(st.integers(1, 4), st.integers(2, 6)), elements=st.floats(-100, 100)
    ),
    st.floats(-50, 50),
    st.floats(0.1, 10),
)
def test_advantages_shift_and_scale_invariant(r: np.ndarray, shift: float, scale: float) -> None:
    a = group_advantages(r, eps=0.0)
    b = group_advantages(r * scale + shift, eps=0.0)
    # rows whose rewards are all equal stay 0 in both; elsewhere invariance holds up to rounding
    spread = r.max(axis=1) - r.min(axis=1)
    ok = spread > 1e-6 * (1 + np.abs(r).max(axis=1))
    np.testing.assert_allclose(a[ok], b[ok], atol=1e-6)


# ------------------------------------------------------------------------------- KL
def test_kl_estimators_by_hand() -> None:
    lp, ref = np.array([-1.0, -2.0]), np.array([-1.5, -1.0])  # x = 0.5, -1
    np.testing.assert_array_equal(kl_estimate(lp, ref, estimator="k1"), [0.5, -1.0])
    np.testing.assert_array_equal(kl_estimate(lp, ref, estimator="k2"), [0.125, 0.5])
    np.testing.assert_allclose(
        kl_estimate(lp, ref, estimator="k3"),
        [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1],
        rtol=1e-15,
    )


def test_kl_clamps() -> None:
    lp, ref = np.array([-40.0]), np.array([-1.0])  # d = ref - logp = 39
    assert kl_estimate(lp, ref, clamp=10.0)[0] == 10.0
    clamped = kl_estimate(lp, ref, log_ratio_clamp=20.0)[0]
    assert clamped == math.exp(20.0) - 20.0 - 1.0


def test_k3_zero_when_policies_agree_and_nonnegative() -> None:
    x = np.linspace(-5, 0, 11)
    assert (kl_k3(x, x) == 0).all()
    assert (kl_k3(x, x[::-1]) >= 0).all()


def test_k3_overflow_is_inf_not_nan() -> None:
    k = kl_k3(np.array([-800.0]), np.array([-1.0]))
    assert k[0] == np.inf


# ---------------------------------------------------------------------- surrogate
def test_clip_higher_and_dual_clip_by_hand() -> None:
    r = np.array([1.25, 1.25, 5.0, 5.0, 0.5])
    a = np.array([1.0, -1.0, -1.0, 1.0, -1.0])
    # eps_low 0.2, eps_high 0.28: 1.25 < 1.28 is not clipped for A > 0.
    out = clipped_surrogate(r, a, clip_eps=0.2, clip_eps_high=0.28)
    np.testing.assert_allclose(out, [1.25, -1.25, -5.0, 1.28, -0.8])
    dual = clipped_surrogate(r, a, clip_eps=0.2, clip_eps_high=0.28, dual_clip=3.0)
    np.testing.assert_allclose(dual, [1.25, -1.25, -3.0, 1.28, -0.8])


@given(
    hnp.arrays(np.float64, 20, elements=st.floats(0, 50)),
    hnp.arrays(np.float64, 20, elements=st.floats(-5, 5)),
)
def test_dual_clip_never_changes_nonnegative_advantages(r: np.ndarray, a: np.ndarray) -> None:
    plain = clipped_surrogate(r, a)
    dual = clipped_surrogate(r, a, dual_clip=3.0)
    keep = a >= 0
    np.testing.assert_array_equal(plain[keep], dual[keep])
    assert (dual[~keep] >= 3.0 * a[~keep]).all()


@given(
    hnp.arrays(np.float64, 20, elements=st.floats(0, 50)),
    hnp.arrays(np.float64, 20, elements=st.floats(-5, 5)),
)
def test_huge_clip_eps_is_unclipped_surrogate(r: np.ndarray, a: np.ndarray) -> None:
    np.testing.assert_array_equal(clipped_surrogate(r, a, clip_eps=1e9), r * a)


def test_overflowing_ratio_with_zero_advantage_is_zero_not_nan() -> None:
    out = clipped_surrogate(np.array([np.inf, np.inf, np.inf]), np.array([0.0, 1.0, -1.0]))
    assert out[0] == 0.0 and out[1] == 1.2 and out[2] == -np.inf


def test_sequence_ratio_equals_token_ratio_for_one_token_answers() -> None:
    rng = np.random.default_rng(3)
    lp, olp = rng.normal(size=6), rng.normal(size=6)
    off = np.arange(7)
    adv = rng.normal(size=6)
    a = token_terms(lp, olp, None, adv, off, beta=0.0)
    b = token_terms(lp, olp, None, adv, off, beta=0.0, ratio_level="sequence")
    np.testing.assert_array_equal(a.term, b.term)


def test_sequence_ratio_is_geometric_mean_by_hand() -> None:
    lp = np.array([-1.0, -1.0])
    olp = np.array([-1.2, -0.9])  # Δ = 0.2, -0.1 → mean 0.05
    t = token_terms(
        lp, olp, None, np.array([1.0]), np.array([0, 2]), beta=0.0, ratio_level="sequence"
    )
    np.testing.assert_allclose(t.ratio, [math.exp(0.05)] * 2, rtol=1e-15)


# ---------------------------------------------------------------------- aggregation
def test_aggregations_by_hand() -> None:
    v = np.array([1.0, 2.0, 3.0, 4.0, 6.0])
    off = np.array([0, 2, 5])  # answers: [1, 2] and [3, 4, 6]
    assert aggregate(v, off, agg="seq-mean-token-mean") == (1.5 + 13 / 3) / 2
    assert aggregate(v, off, agg="token-mean") == 16 / 5
    assert aggregate(v, off, agg="seq-mean-token-sum") == 16 / 2
    assert aggregate(v, off, agg="seq-mean-token-sum-norm") == 16 / (2 * 3)
    assert aggregate(v, off, agg="seq-mean-token-sum-norm", max_len=8) == 16 / 16


def test_token_mean_equals_seq_mean_when_lengths_equal() -> None:
    rng = np.random.default_rng(4)
    v = rng.normal(size=24)
    off = np.arange(0, 25, 6)
    assert math.isclose(
        aggregate(v, off, agg="token-mean"),
        aggregate(v, off, agg="seq-mean-token-mean"),
        rel_tol=1e-12,
    )


def test_segment_sum_handles_empty_segments() -> None:
    np.testing.assert_array_equal(
        segment_sum(np.array([1.0, 2.0]), np.array([0, 0, 2, 2])), [0.0, 3.0, 0.0]
    )


# ------------------------------------------------------------------------ properties
@st.composite
def padded_batches(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
    n = draw(st.integers(1, 6))
    L = draw(st.integers(1, 8))
    lengths = draw(hnp.arrays(np.int64, n, elements=st.integers(1, L)))
    mask = np.arange(L)[None, :] < lengths[:, None]
    floats = st.floats(-6, 0)
    lp = draw(hnp.arrays(np.float64, (n, L), elements=floats))
    olp = draw(hnp.arrays(np.float64, (n, L), elements=floats))
    rlp = draw(hnp.arrays(np.float64, (n, L), elements=floats))
    adv = draw(hnp.arrays(np.float64, n, elements=st.floats(-3, 3)))
    return lp, olp, rlp, adv, mask


@settings(max_examples=150, deadline=None)
@given(padded_batches(), st.floats(-1e6, 1e6), st.floats(0, 0.5), st.floats(0, 0.2))
def test_objective_matches_reference_and_ignores_padding(
    b: tuple[np.ndarray, ...], fill: float, clip_eps: float, beta: float
) -> None:
    lp, olp, rlp, adv, mask = b
    copies = [x.copy() for x in b]
    j = grpo_objective(lp, olp, rlp, adv, mask, clip_eps=clip_eps, beta=beta)
    # inputs never mutated
    for x, c in zip(b, copies, strict=True):
        np.testing.assert_array_equal(x, c)
    ref = reference_objective(lp, olp, rlp, adv, mask, clip_eps, beta)
    assert math.isclose(j, ref, rel_tol=1e-12, abs_tol=1e-12)
    # padding may hold any finite value
    p_lp, p_olp, p_rlp = (np.where(mask, x, fill) for x in (lp, olp, rlp))
    assert grpo_objective(p_lp, p_olp, p_rlp, adv, mask, clip_eps=clip_eps, beta=beta) == j


@given(padded_batches())
def test_ragged_equals_padded(b: tuple[np.ndarray, ...]) -> None:
    lp, olp, rlp, adv, mask = b
    off, (flp, folp, frlp) = flatten_padded(mask, lp, olp, rlp)
    t = token_terms(flp, folp, frlp, adv, off)
    assert aggregate(t.term, off) == grpo_objective(lp, olp, rlp, adv, mask)


def test_float32_inputs_accumulate_in_float64() -> None:
    rng = np.random.default_rng(5)
    lp = -rng.exponential(size=(4, 5)).astype(np.float32)
    olp = (lp + rng.normal(0, 0.1, size=(4, 5))).astype(np.float32)
    mask = np.ones((4, 5), bool)
    adv = np.array([1.0, -1.0, 0.5, 0.0], dtype=np.float32)
    j32 = grpo_objective(lp, olp, lp, adv, mask)
    j64 = grpo_objective(
        lp.astype(np.float64),
        olp.astype(np.float64),
        lp.astype(np.float64),
        adv.astype(np.float64),
        mask,
    )
    assert j32 == j64


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"mask": np.array([[True, False], [False, False]])}, "answer 1 has no valid token"),
        ({"advantages": np.array([1.0])}, "advantages: expected shape (2,)"),
        ({"logp": np.zeros((2, 3))}, "same shape"),
        ({"mask": np.array([[1, 2], [1, 1]])}, "0/1"),
        ({"logp": np.array([["a", "b"], ["c", "d"]])}, "real-valued"),
    ],
)
def test_library_contract_errors(kwargs: dict[str, np.ndarray], msg: str) -> None:
    args = {
        "logp": np.zeros((2, 2)),
        "old_logp": np.zeros((2, 2)),
        "ref_logp": np.zeros((2, 2)),
        "advantages": np.ones(2),
        "mask": np.ones((2, 2), bool),
    }
    args.update(kwargs)
    with pytest.raises(InputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        grpo_objective(**args)  # type: ignore[arg-type]


def test_every_aggregation_is_listed() -> None:
    assert AGGREGATIONS == (
        "seq-mean-token-mean",
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-sum",
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: aggregate(np.ones(3), np.array([0, 1, 5])), "offsets: must start at 0 and end"),
        (lambda: aggregate(np.ones(2), np.array([0, 0, 2])), "offsets: answer 0 has no token"),
        (lambda: aggregate(np.ones(0), np.array([0])), "offsets: no answer to aggregate"),
        (lambda: segment_sum(np.ones(3), np.array([0.0, 3.0])), "offsets: expected integers"),
        (lambda: segment_sum(np.ones(3), np.array([0, 2, 1, 3])), "offsets: must not decrease"),
        (lambda: segment_mean(np.ones(2), np.array([0, 2, 2])), "offsets: answer 1 has no token"),
        (
            lambda: clipped_surrogate(np.ones(3), np.ones((3, 1))),
            "ratio, adv: expected equal shapes",
        ),
        (
            lambda: token_terms(
                np.zeros(4), np.zeros(3), None, np.ones(2), np.array([0, 2, 4]), beta=0.0
            ),
            "old_logp: expected shape (4,)",
        ),
        (
            lambda: token_terms(np.zeros(4), None, None, np.ones(3), np.array([0, 2, 4]), beta=0.0),
            "adv: expected shape (2,)",
        ),
    ],
)
def test_ragged_kernels_check_their_contract_first(call: Any, message: str) -> None:
    """The review's probes: each was a silent wrong number or a raw numpy error."""
    with pytest.raises(InputError, match=re.escape(message)):
        call()


def test_surrogate_options_are_checked() -> None:
    with pytest.raises(UsageError, match="clip_eps: must be a finite number >= 0"):
        clipped_surrogate(np.ones(3), np.ones(3), clip_eps=-5)
    with pytest.raises(UsageError, match="dual_clip: must be > 1"):
        clipped_surrogate(np.ones(3), np.ones(3), dual_clip=0.5)


def test_offsets_are_converted_not_mutated() -> None:
    off = np.array([0, 2, 3], dtype=np.int32)
    assert check_offsets(off, 3).dtype == np.int64 and off.dtype == np.int32


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    seed=st.integers(0, 2**31),
    dual=st.sampled_from([None, 1.3]),
    unit=st.sampled_from(["tokens", "sequences"]),
)
def test_clip_counts_are_the_per_token_definitions(
    lengths: list[int], seed: int, dual: float | None, unit: str
) -> None:
    rng = np.random.default_rng(seed)
    off = np.concatenate(([0], np.cumsum(lengths)))
    ratio = np.exp(rng.normal(0, 0.4, off[-1]))
    adv = rng.choice([-1.0, 0.0, 1.0], len(lengths))
    a = np.repeat(adv, lengths)
    flags = {
        "low": (ratio < 0.8) & (a < 0),
        "high": (ratio > 1.28) & (a > 0),
        "outside": (ratio < 0.8) | (ratio > 1.28),
        "dual": (ratio > dual) & (a < 0) if dual else np.zeros(ratio.shape, bool),
    }
    flags["region"] = flags["low"] | flags["high"]
    if unit == "tokens":
        want = {k: int(v.sum()) for k, v in flags.items()}
    else:  # an answer counts once
        want = {k: int(np.add.reduceat(v, off[:-1]).astype(bool).sum()) for k, v in flags.items()}
    got = clip_counts(ratio, adv, off, clip_eps_high=0.28, dual_clip=dual, unit=unit)  # type: ignore[arg-type]
    assert vars(got) == want


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_aggregate_is_the_weighted_sum_of_answer_sums(agg: str) -> None:
    rng = np.random.default_rng(5)
    lengths = np.array([1, 4, 7, 2])
    off = np.concatenate(([0], np.cumsum(lengths)))
    v = rng.normal(size=off[-1])
    w = aggregation_weights(lengths, agg=agg, max_len=9)  # type: ignore[arg-type]
    expected = float(np.sum(w * np.add.reduceat(v, off[:-1])))
    assert math.isclose(aggregate(v, off, agg=agg, max_len=9), expected, rel_tol=1e-13)  # type: ignore[arg-type]


def test_ratio_moments_by_hand() -> None:
    assert ratio_moments(np.log(np.array([0.5, 1.0, 4.0]))) == (5.5, 17.25, 0)
    total, _, n_inf = ratio_moments(np.array([0.0, 800.0, 900.0]))
    assert total == math.inf and n_inf == 2


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
def test_segment_count_in_chunks(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # counted a chunk of flags at a time (reduceat casts its input to int64 whole): every
    # chunking, empty answers anywhere included, gives each answer's own count
    from grpo_cli import core as _core

    monkeypatch.setattr(_core, "COUNT_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    for _ in range(20):
        lengths = rng.integers(0, 6, size=rng.integers(1, 9))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flags = rng.random(int(offsets[-1])) < 0.5
        want = [int(flags[a:b].sum()) for a, b in itertools.pairwise(offsets)]
        assert _core.segment_count(flags, offsets).tolist() == want


# Every public function that takes ``offsets`` checks them first (issue 18 §7): offsets that
# do not start at 0, decrease, fall short of the values or overrun them are an InputError
# naming ``offsets``, never numbers. ``T`` values in each call below; ``off`` replaces the
# good ``[0, 2, 4]`` offsets.
BAD_OFFSETS = {
    "not from 0": (np.array([1, 2, 4]), "offsets: must start at 0"),
    "decreasing": (np.array([0, 3, 2, 4]), "offsets: must not decrease"),
    "short": (np.array([0, 2, 3]), "offsets: must start at 0 and end at the number of values (4)"),
    "overrun": (np.array([0, 2, 6]), "offsets: must start at 0 and end at the number of values"),
    "2-D": (np.array([[0, 2, 4]]), "offsets: expected shape (N+1,)"),
    "floats": (np.array([0.0, 2.0, 4.0]), "offsets: expected integers"),
}


def _terms() -> Any:
    x = np.array([-1.0, -0.5, -2.0, -0.1])
    return token_terms(x, x - 0.1, x + 0.2, np.array([1.0, -1.0]), np.array([0, 2, 4]))


def _offset_calls() -> dict[str, Any]:
    from grpo_cli.core import (
        answer_clip_counts,
        answer_clip_tokens,
        segment_count,
        sequence_log_ratio,
        sequence_sums,
        suffix_sum,
        token_gradients,
        used_log_ratio,
    )

    v = np.array([-1.0, -0.5, -2.0, -0.1])
    a2 = np.array([1.0, -1.0])
    t = _terms()
    return {
        "segment_sum": lambda off: segment_sum(v, off),
        "segment_mean": lambda off: segment_mean(v, off),
        "segment_count": lambda off: segment_count(v < -0.7, off),
        "suffix_sum": lambda off: suffix_sum(v, off),
        "aggregate": lambda off: aggregate(v, off),
        "used_log_ratio": lambda off: used_log_ratio(v, off),
        "used_log_ratio sequence": lambda off: used_log_ratio(v, off, ratio_level="sequence"),
        "sequence_log_ratio": lambda off: sequence_log_ratio(v, off),
        "sequence_log_ratio mean": lambda off: sequence_log_ratio(v, off, mean=a2),
        "token_terms": lambda off: token_terms(v, v, v, a2, off),
        "token_gradients": lambda off: token_gradients(t, offsets=off),
        "token_gradients sequence": lambda off: token_gradients(
            t, offsets=off, ratio_level="sequence"
        ),
        "sequence_sums": lambda off: sequence_sums(t, off),
        "clip_counts": lambda off: clip_counts(np.exp(v), a2, off),
        "answer_clip_tokens": lambda off: answer_clip_tokens(np.exp(v), a2, off),
        "answer_clip_counts": lambda off: answer_clip_counts(np.exp(v), a2, off),
    }


@pytest.mark.parametrize("bad", list(BAD_OFFSETS))
@pytest.mark.parametrize("fn", list(_offset_calls()))
def test_every_function_taking_offsets_checks_them_first(fn: str, bad: str) -> None:
    off, message = BAD_OFFSETS[bad]
    call = _offset_calls()[fn]
    call(np.array([0, 2, 4]))  # the good offsets give numbers
    with pytest.raises(InputError, match=re.escape(message)):
        call(off)


def test_used_log_ratio_probes_of_the_review() -> None:
    """The review's probes (issue 18): used_log_ratio returned numbers for offsets that do
    not start at 0, decrease, or fall short of the values."""
    from grpo_cli.core import used_log_ratio

    d = np.array([0.5, -0.5, 1.0])
    for off in ([1, 3], [0, 2, 1, 3], [0, 2]):
        with pytest.raises(InputError, match="offsets: "):
            used_log_ratio(d, np.array(off))


def test_term_options_and_keywords_agree() -> None:
    """TermConventions (the keywords) lists TermOptions' fields, with their types; the
    keywords override options; Settings.term_options takes β = 0 with the KL in the
    reward."""
    import dataclasses
    import typing

    from grpo_cli.core import TermConventions, TermOptions
    from grpo_cli.trainers.presets import resolve_settings

    hints = typing.get_type_hints(TermOptions)
    fields = [f.name for f in dataclasses.fields(TermOptions)]
    assert list(typing.get_type_hints(TermConventions)) == fields
    assert typing.get_type_hints(TermConventions) == {k: hints[k] for k in fields}
    x = np.array([-1.0, -0.5, -2.0, -0.1])
    off, adv = np.array([0, 2, 4]), np.array([1.0, -1.0])
    by_kw = token_terms(x, x - 0.3, x + 0.2, adv, off, clip_eps=0.1, beta=0.5, kl_estimator="k2")
    o = TermOptions(clip_eps=0.1, beta=0.5, kl_estimator="k2")
    by_opt = token_terms(x, x - 0.3, x + 0.2, adv, off, options=o)
    over = token_terms(x, x - 0.3, x + 0.2, adv, off, options=TermOptions(beta=9.0), beta=0.5,
                       clip_eps=0.1, kl_estimator="k2")  # fmt: skip
    for t in (by_opt, over):
        assert np.array_equal(t.term, by_kw.term) and np.array_equal(t.policy, by_kw.policy)
    s = resolve_settings("verl", kl_mode="reward")
    assert s.beta != 0 and s.term_options().beta == 0.0
    assert s.term_options() == TermOptions(**s.term_kwargs())


def test_one_rule_table_for_every_aggregation() -> None:
    """AGGREGATION_RULES covers AGGREGATIONS; each rule's weights (u_i / D) give
    aggregate exactly, by hand: D = N, T, N·L (L alone with lmax), 1."""
    from grpo_cli.core import AGGREGATION_RULES, aggregation_divisor

    assert set(AGGREGATION_RULES) == set(AGGREGATIONS)
    lengths = np.array([1, 3])
    off = np.array([0, 1, 4])
    v = np.array([2.0, 1.0, 1.0, 4.0])  # answer sums 2 and 6, means 2 and 2
    want = {
        "seq-mean-token-mean": (2.0 + 2.0) / 2,
        "token-mean": 8.0 / 4,
        "seq-mean-token-sum": 8.0 / 2,
        "seq-mean-token-sum-norm": 8.0 / (2 * 5),
        "token-sum": 8.0,
    }
    for agg, value in want.items():
        assert aggregate(v, off, agg=agg, max_len=5) == value, agg  # type: ignore[arg-type]
        w = aggregation_weights(lengths, agg=agg, max_len=5)  # type: ignore[arg-type]
        assert float(np.sum(w * np.array([2.0, 6.0]))) == pytest.approx(value, rel=1e-15)
    d = aggregation_divisor("seq-mean-token-sum-norm", answers=2, tokens=4, max_len=5,
                            norm_scale="lmax")  # fmt: skip
    assert d == 5.0
    with pytest.raises(UsageError, match="unknown aggregation 'mean'"):
        aggregation_divisor("mean", answers=1, tokens=1, max_len=1)
