"""Each preset reproduces a number computed independently, the way the trainer computes it.

The references below are written from the trainers' published formulas (REFERENCE.md),
in their style: padded (B, L) arrays, a mask, the loss to minimise. grpo-cli must give
objective = −loss on the same fixed batch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .conftest import Cli

G = 4
LENGTHS = np.array([3, 7, 5, 2, 6, 6, 1, 4, 8, 3, 5, 2])  # 3 groups of 4, ragged
REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 2.0, 0.0, 1.0, 0.0])
B, L = LENGTHS.size, int(LENGTHS.max())


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    rng = np.random.default_rng(2025)
    mask = np.arange(L)[None, :] < LENGTHS[:, None]
    old = np.where(mask, -rng.exponential(0.8, size=(B, L)), 0.0)
    logp = np.where(mask, old + rng.normal(0, 0.25, size=(B, L)), 0.0)
    logp[0, 1] = old[0, 1] + 1.5  # a token far outside the clip range, A > 0
    logp[1, 2] = old[1, 2] + 2.0  # A < 0 and ratio e² > 3: dual clip bites
    ref = np.where(mask, old + rng.normal(0, 0.3, size=(B, L)), 0.0)
    ref[2, 0] = logp[2, 0] + 12.0  # k3 = e¹² − 13: the KL clamp at 10 bites
    path: Path = tmp_path_factory.mktemp("presets") / "batch.npz"
    np.savez(path, logp=logp, old_logp=old, ref_logp=ref, mask=mask, rewards=REWARDS.reshape(-1, G))
    return {"path": path, "logp": logp, "old": old, "ref": ref, "mask": mask}


def group_norm(r: np.ndarray, *, ddof: int, eps: float, scale: bool = True) -> np.ndarray:
    """(r − mean) / (std + eps) per contiguous block of G, as TRL/verl/OpenRLHF write it."""
    g = r.reshape(-1, G)
    mean = g.mean(axis=1, keepdims=True)
    if not scale:
        return (g - mean).reshape(-1)
    std = g.std(axis=1, ddof=ddof, keepdims=True)
    out = (g - mean) / (std + eps)
    out[np.ptp(g, axis=1) == 0] = 0.0  # equal rewards: exactly zero (REFERENCE.md)
    return out.reshape(-1)


def masked_token_mean(x: np.ndarray, mask: np.ndarray) -> float:
    return float((x * mask).sum() / mask.sum())


def ppo_clip_loss(ratio: np.ndarray, adv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    a = adv[:, None]
    return -np.minimum(ratio * a, np.clip(ratio, 1 - lo, 1 + hi) * a)


def k3(logp: np.ndarray, ref: np.ndarray) -> np.ndarray:
    d = ref - logp
    return np.exp(d) - d - 1


def run(cli: Cli, batch: dict[str, Any], *args: str) -> dict[str, Any]:
    return cli.json("objective", batch["path"], *args)


def test_deepseekmath(cli: Cli, batch: dict[str, Any]) -> None:
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=0, eps=1e-8)
    per_token = -ppo_clip_loss(np.exp(lp - old), adv, 0.2, 0.2) - 0.04 * k3(lp, ref)
    expected = float(np.mean((per_token * m).sum(1) / m.sum(1)))
    doc = run(cli, batch, "--preset", "deepseekmath")
    assert math.isclose(doc["objective"], expected, rel_tol=1e-12)


def test_trl(cli: Cli, batch: dict[str, Any]) -> None:
    """TRL GRPOTrainer: std over the group (unbiased), + 1e-4; loss_type "dapo"; beta 0."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-4)
    loss = masked_token_mean(ppo_clip_loss(np.exp(lp - old), adv, 0.2, 0.2), m)
    doc = run(cli, batch, "--preset", "trl")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    assert doc["kl_term"] == 0.0


def test_trl_with_beta_and_grpo_loss_type(cli: Cli, batch: dict[str, Any]) -> None:
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-4)
    per_token = ppo_clip_loss(np.exp(lp - old), adv, 0.2, 0.2) + 0.1 * k3(lp, ref)
    loss = float(np.mean((per_token * m).sum(-1) / m.sum(-1)))  # loss_type="grpo"
    doc = run(cli, batch, "--preset", "trl", "--beta", "0.1", "--agg", "seq-mean-token-mean")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)


def test_verl(cli: Cli, batch: dict[str, Any]) -> None:
    """verl: dual clip c = 3, Δ clamped to ±20, low_var_kl (±20 exponent, ±10 value)."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)[:, None]
    ratio = np.exp(np.clip(lp - old, -20, 20))
    pg1 = -adv * ratio
    pg2 = -adv * np.clip(ratio, 0.8, 1.2)
    clip1 = np.maximum(pg1, pg2)
    clip2 = np.minimum(-adv * 3.0, clip1)
    pg_losses = np.where(adv < 0, clip2, clip1)
    kl = np.clip(ref - lp, -20, 20)
    kld = np.clip(np.exp(kl) - kl - 1, -10, 10)
    loss = masked_token_mean(pg_losses, m) + 0.001 * masked_token_mean(kld, m)
    doc = run(cli, batch, "--preset", "verl")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    # verl's pg_clipfrac_lower: A < 0 and ratio > c
    lower = ((adv < 0) & (ratio > 3.0) & m).sum() / m.sum()
    assert doc["clip_fraction"]["dual_clip_lower"] == lower > 0
    assert doc["kl"]["max"] == 10.0


def test_verl_seq_mean_token_sum_norm_divides_by_l_only(cli: Cli, batch: dict[str, Any]) -> None:
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    doc_trl = run(
        cli, batch, "--preset", "verl", "--agg", "seq-mean-token-sum-norm", "--norm-scale", "trl"
    )
    doc_verl = run(cli, batch, "--preset", "verl", "--agg", "seq-mean-token-sum-norm")
    assert math.isclose(doc_verl["objective"], B * doc_trl["objective"], rel_tol=1e-12)
    del lp, old, ref, m


def test_openrlhf(cli: Cli, batch: dict[str, Any]) -> None:
    """OpenRLHF group_norm: (r − mean) / (std + 1e-9); k3 clamped to ±10; kl coef 0.01."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-9)
    ratio = np.exp(np.clip(lp - old, -20, 20))
    log_ratio = -(lp - ref)
    kl = np.clip(np.exp(log_ratio) - 1 - log_ratio, -10, 10)
    loss = masked_token_mean(ppo_clip_loss(ratio, adv, 0.2, 0.2), m) + 0.01 * masked_token_mean(
        kl, m
    )
    doc = run(cli, batch, "--preset", "openrlhf")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)


@pytest.mark.parametrize("max_len", [None, 64])
def test_dr_grpo(cli: Cli, batch: dict[str, Any], max_len: int | None) -> None:
    """Dr. GRPO / TRL loss_type="dr_grpo": no std; Σ loss / (B · max_completion_length)."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=0, eps=0.0, scale=False)
    lmax = L if max_len is None else max_len
    loss = float((ppo_clip_loss(np.exp(lp - old), adv, 0.2, 0.2) * m).sum() / (B * lmax))
    extra = [] if max_len is None else ["--max-len", str(max_len)]
    doc = run(cli, batch, "--preset", "dr-grpo", *extra)
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    assert doc["max_len"] == lmax


def test_dapo(cli: Cli, batch: dict[str, Any]) -> None:
    """DAPO: clip-higher (0.2, 0.28), token-level mean, no KL."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)
    loss = masked_token_mean(ppo_clip_loss(np.exp(lp - old), adv, 0.2, 0.28), m)
    doc = run(cli, batch, "--preset", "dapo")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)


def test_gspo(cli: Cli, batch: dict[str, Any]) -> None:
    """GSPO as TRL runs it: s_i = exp(mean_t Δ), clip (3e-4, 4e-4), per-sequence mean."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-4)
    log_w = ((lp - old) * m).sum(-1) / m.sum(-1)
    coef = np.exp(log_w)[:, None] * np.ones((1, L))
    per_token = ppo_clip_loss(coef, adv, 3e-4, 4e-4)
    loss = float(np.mean((per_token * m).sum(-1) / m.sum(-1)))
    doc = run(cli, batch, "--preset", "gspo")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    assert doc["settings"]["ratio_level"] == "sequence"


def test_explicit_flags_override_a_preset(cli: Cli, batch: dict[str, Any]) -> None:
    doc = run(
        cli, batch, "--preset", "verl", "--clip-eps", "0.1", "--kl-clamp", "off", "--beta", "0"
    )
    s = doc["settings"]
    assert (s["preset"], s["clip_eps"], s["kl_clamp"], s["beta"], s["dual_clip"]) == (
        "verl",
        0.1,
        None,
        0.0,
        3.0,
    )


def test_log_ratio_clamp_by_hand(cli: Cli, tmp_path: Path) -> None:
    # one token, Δ = 30 clamped to 5; A comes from the file
    np.savez(
        tmp_path / "c.npz",
        logp=np.array([[-1.0]]),
        old_logp=np.array([[-31.0]]),
        advantages=np.array([-1.0]),
    )
    doc = cli.json("objective", tmp_path / "c.npz", "--beta", "0", "--log-ratio-clamp", "5")
    assert doc["objective"] == -math.exp(5.0)
    assert doc["ratio"]["max"] == math.exp(30.0)  # diagnostics report the raw ratio
    assert doc["ratio"]["extreme_tokens"] == 1
