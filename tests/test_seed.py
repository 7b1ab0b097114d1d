"""The seed spec (001): three functions, their signatures and example outputs, exactly."""

from __future__ import annotations

import inspect
import math

import numpy as np

from grpo_cli import group_advantages, grpo_objective, kl_k3

LOGP = np.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
OLD = np.array([[-1.1, -0.5, -1.0], [-0.6, -1.0, 0.0]])
REF = np.array([[-1.2, -0.4, -1.5], [-0.4, -1.1, 0.0]])
ADV = np.array([1.0, -1.0])
MASK = np.array([[True, True, True], [True, True, False]])


def test_signatures_match_the_spec() -> None:
    assert str(inspect.signature(group_advantages)).startswith(
        "(rewards: 'ArrayLike', eps: 'float' = 1e-08)"
    )
    assert list(inspect.signature(kl_k3).parameters) == ["logp", "ref_logp"]
    params = inspect.signature(grpo_objective).parameters
    assert list(params) == [
        "logp",
        "old_logp",
        "ref_logp",
        "advantages",
        "mask",
        "clip_eps",
        "beta",
    ]
    assert params["clip_eps"].default == 0.2 and params["beta"].default == 0.04


def test_group_advantages_example() -> None:
    out = group_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]))
    # Row 1: mean 1/2, population std 1/2. Row 2: mean 1/4, std sqrt(3)/4.
    a = 0.5 / (0.5 + 1e-8)
    s2 = math.sqrt(0.1875)
    expected = np.array(
        [
            [a, -a, -a, a],
            [-0.25 / (s2 + 1e-8), -0.25 / (s2 + 1e-8), 0.75 / (s2 + 1e-8), -0.25 / (s2 + 1e-8)],
        ]
    )
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(
        out.round(8),
        [
            [0.99999998, -0.99999998, -0.99999998, 0.99999998],
            [-0.57735026, -0.57735026, 1.73205077, -0.57735026],
        ],
    )
    assert out.dtype == np.float64 and out.shape == (2, 4)


def test_kl_k3_example() -> None:
    out = kl_k3(np.array([-1.0, -2.0, -0.5]), np.array([-1.0, -1.5, -1.0]))
    np.testing.assert_array_equal(out, [0.0, math.exp(0.5) - 1.5, math.exp(-0.5) - 0.5])
    np.testing.assert_array_equal(out.round(8), [0.0, 0.14872127, 0.10653066])


def test_grpo_objective_examples_to_full_precision() -> None:
    j = grpo_objective(LOGP, OLD, REF, ADV, MASK)
    assert type(j) is float
    assert j == -0.13122323326245566
    assert grpo_objective(LOGP, OLD, REF, ADV, MASK, clip_eps=0.2, beta=0.0) == -0.1299723302889813


def test_grpo_objective_example_by_hand() -> None:
    # Answer 0 (A = +1): ratios e^0.1, 1, e^-1; the first is inside [0.8, 1.2], the last
    # (0.368) is below 0.8 but with A > 0 min picks the unclipped 0.368.
    # Answer 1 (A = -1): ratios e^0.3 = 1.35 (clipped to 1.2, min(-1.35, -1.2) = -1.35),
    # e^-0.2 = 0.819 (inside).
    pol0 = (math.exp(0.1) + 1.0 + math.exp(-1.0)) / 3
    pol1 = (-math.exp(0.3) - math.exp(-0.2)) / 2
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    kl0 = (k3(-0.2) + k3(0.1) + k3(0.5)) / 3
    kl1 = (k3(-0.1) + k3(0.1)) / 2
    expected = ((pol0 - 0.04 * kl0) + (pol1 - 0.04 * kl1)) / 2
    assert math.isclose(grpo_objective(LOGP, OLD, REF, ADV, MASK), expected, rel_tol=1e-14)
    assert math.isclose(
        grpo_objective(LOGP, OLD, REF, ADV, MASK, beta=0.0), (pol0 + pol1) / 2, rel_tol=1e-14
    )
