"""‖∂J/∂logp‖ (objective --gradient) equals a central finite-difference gradient of J:
of the seed's own objective, and of J = agg(policy) − β·kl_agg(kl_loss) under each
setting the gradient is derived for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grpo_cli.batch import Batch
from grpo_cli.core import aggregate, grpo_objective, token_terms
from grpo_cli.fold.tokens import TokenPartial
from grpo_cli.settings import Settings

from .conftest import Cli

H = 1e-6


def _fd(f: Any, x: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Central differences of ``f`` at every ``where`` position of ``x``."""
    g = np.zeros(x.shape)
    for idx in zip(*np.nonzero(where), strict=True):
        up, down = x.copy(), x.copy()
        up[idx] += H
        down[idx] -= H
        g[idx] = (f(up) - f(down)) / (2 * H)
    return g


def test_seed_objective(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n, width = 6, 9
    mask = np.arange(width)[None, :] < rng.integers(2, width + 1, n)[:, None]
    logp = -rng.exponential(1.0, (n, width))
    old = logp + rng.normal(0, 0.25, (n, width))
    ref = logp + rng.normal(0, 0.4, (n, width))
    adv = rng.normal(0, 1, n)
    f = tmp_path / "seed.npz"
    np.savez(f, logp=logp, old_logp=old, ref_logp=ref, advantages=adv, mask=mask)

    def J(x: np.ndarray) -> float:
        return grpo_objective(x, old, ref, adv, mask)

    g = _fd(J, logp, mask)
    doc = cli.json("objective", f, "--gradient")
    assert doc["gradient"]["norm"] == pytest.approx(float(np.linalg.norm(g)), rel=1e-6)
    assert doc["objective"] == pytest.approx(J(logp), rel=1e-12)
    # the policy part alone: β = 0
    gp = _fd(lambda x: grpo_objective(x, old, ref, adv, mask, beta=0.0), logp, mask)
    assert doc["gradient"]["policy_norm"] == pytest.approx(float(np.linalg.norm(gp)), rel=1e-6)
    assert doc["gradient"]["kl_norm"] == pytest.approx(float(np.linalg.norm(g - gp)), rel=1e-5)


def _ragged(seed: int) -> tuple[Batch, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, 10)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    t = int(offsets[-1])
    logp = -rng.exponential(1.0, t)
    # log-ratios up to ±0.6 so the clips, the dual clip and the clamps all bind somewhere,
    # away from their bounds by more than H
    old = logp - rng.uniform(-0.6, 0.6, t)
    ref = logp + rng.normal(0, 1.5, t)
    b = Batch(start=0, offsets=offsets, fields={"logp": logp, "old_logp": old, "ref_logp": ref},
              width=lengths)  # fmt: skip
    return b, rng.normal(0, 1, 10)


CASES = [
    {},
    {"agg": "token-mean"},
    {"agg": "seq-mean-token-sum", "kl_agg": "token-mean"},
    {"agg": "seq-mean-token-sum-norm", "max_len": 16},
    {"agg": "token-sum", "kl_estimator": "k1"},
    {"kl_estimator": "k2", "clip_eps_high": 0.28},
    {"dual_clip": 1.3, "agg": "token-mean"},
    {"log_ratio_clamp": 0.5, "kl_estimator": "k3"},
    {"kl_clamp": 0.8},
    {"kl_bias_correction": True, "beta": 0.1},
    {"beta": 0.0},
    {"ratio_level": "sequence"},
    {"ratio_level": "sequence", "seq_ratio_clamp": 0.05, "agg": "token-mean"},
    {"ratio_level": "sequence", "kl_bias_correction": True, "beta": 0.1, "clip_eps": 0.05},
    {"ratio_level": "sequence", "dual_clip": 1.05, "clip_eps": 0.02, "agg": "seq-mean-token-sum"},
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_finite_differences(kw: dict[str, Any]) -> None:
    s = Settings(**kw)
    b, adv = _ragged(7)
    old, ref, offs = b.fields["old_logp"], b.fields["ref_logp"], b.offsets

    def J(x: np.ndarray) -> float:
        t = token_terms(x, old, ref, adv, offs, **s.term_kwargs())

        def agg(v: np.ndarray, how: Any) -> float:
            return aggregate(v, offs, agg=how, max_len=s.max_len, norm_scale=s.norm_scale)

        kl = 0.0 if t.kl_loss is None else agg(t.kl_loss, s.kl_aggregation)
        return agg(t.policy, s.agg) - s.beta * kl

    logp = b.fields["logp"]
    g = _fd(J, logp, np.ones(logp.shape, dtype=bool))
    p = TokenPartial(s, gradient=True)
    p.update(b, adv)
    got = p.gradient()
    assert got is not None
    assert got["norm"] == pytest.approx(float(np.linalg.norm(g)), rel=1e-6)
    # the split into two folded halves merges to the same numbers
    first, second = TokenPartial(s, gradient=True), TokenPartial(s, gradient=True)
    k = 4
    cut = int(offs[k])
    first.update(Batch(0, offs[: k + 1], {f: v[:cut] for f, v in b.fields.items()}, b.width[:k]),
                 adv[:k])  # fmt: skip
    second.update(Batch(k, offs[k:] - cut, {f: v[cut:] for f, v in b.fields.items()},
                        b.width[k:]), adv[k:])  # fmt: skip
    merged = first.merge(second).gradient()
    assert merged is not None
    for key, v in got.items():
        assert merged[key] == pytest.approx(v, rel=1e-12), key


def test_clipped_tokens_have_no_policy_gradient() -> None:
    # A > 0 and ρ = e^0.5 > 1.2: clipped, no gradient; A > 0 and ρ = 1: gradient A
    offsets = np.array([0, 1, 2], dtype=np.int64)
    logp = np.array([-1.0, -1.0])
    b = Batch(0, offsets, {"logp": logp, "old_logp": np.array([-1.5, -1.0])},
              np.array([1, 1]))  # fmt: skip
    p = TokenPartial(Settings(beta=0.0), gradient=True)
    p.update(b, np.array([1.0, 2.0]))
    g = p.gradient()
    assert g is not None
    assert g["norm"] == pytest.approx(2.0 / 2)  # (1/N)·A·ρ for the free token, N = 2
    assert g["tokens_with_policy_gradient"] == 0.5 and g["answers_with_policy_gradient"] == 0.5


def test_gspo_preset(cli: Cli) -> None:
    doc = cli.json("objective", "sample_data/batch.parquet", "--preset", "gspo", "--gradient")
    assert doc["gradient"]["norm"] > 0 and not any("gradient" in w for w in doc["warnings"])
    assert "gradient" not in cli.json("objective", "sample_data/batch.parquet")


def test_length_advantage_histogram_is_histogram2d() -> None:
    """The plot's (length, advantage) counts: numpy's histogram2d on the same edges, merged
    over two batches."""
    from grpo_cli.fold.parts import ADV_EDGES, LENGTH_EDGES

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 3000, 300)
    adv = np.concatenate((rng.normal(0, 2, 299), [7.5]))  # one beyond +5: the open end
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    t = int(offsets[-1])
    logp = -np.ones(t)
    p = TokenPartial(Settings(beta=0.0))
    for lo, hi in ((0, 120), (120, 300)):
        a, b = int(offsets[lo]), int(offsets[hi])
        part = TokenPartial(Settings(beta=0.0))
        part.update(Batch(lo, offsets[lo : hi + 1] - a, {"logp": logp[a:b]}, lengths[lo:hi]),
                    adv[lo:hi])  # fmt: skip
        p.merge(part)
    y = np.concatenate((LENGTH_EDGES, [np.inf]))
    want, _, _ = np.histogram2d(lengths, adv, bins=[y, ADV_EDGES])
    assert np.array_equal(p.length_adv.counts, want.astype(np.int64))
    assert p.length_adv.counts[:, -1].sum() == np.count_nonzero(adv >= 5.0) >= 1


def test_sequence_ratio_with_per_token_advantages() -> None:
    """KL in the reward gives per-token advantages: under the sequence ratio each token's
    gradient is the answer's mean of s·A over its active tokens."""
    s = Settings(ratio_level="sequence", beta=0.0, clip_eps=0.05)
    b, _ = _ragged(11)
    rng = np.random.default_rng(2)
    adv = np.asarray(rng.normal(0, 1, int(b.offsets[-1])), dtype=np.float64)
    old, offs = b.fields["old_logp"], b.offsets

    def J(x: np.ndarray) -> float:
        t = token_terms(x, old, None, adv, offs, **s.term_kwargs())
        return aggregate(t.policy, offs, agg=s.agg)

    g = _fd(J, b.fields["logp"], np.ones(adv.shape, dtype=bool))
    p = TokenPartial(s, gradient=True)
    p.update(Batch(0, offs, {"logp": b.fields["logp"], "old_logp": old}, b.width), adv)
    got = p.gradient()
    assert got is not None and got["norm"] == pytest.approx(float(np.linalg.norm(g)), rel=1e-6)
