"""Each preset reproduces a number computed independently, the way the trainer computes it.

The references below are written from the trainers' published formulas (REFERENCE.md),
in their style: padded (B, L) arrays, a mask, the loss to minimise. grpo-cli must give
objective = −loss on the same fixed batch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli import Settings, resolve_settings
from grpo_cli.errors import SettingError

from .conftest import SAMPLE, Cli

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


@pytest.mark.parametrize("bias_correction", [True, False])
def test_trl_with_beta_and_grpo_loss_type(
    cli: Cli, batch: dict[str, Any], bias_correction: bool
) -> None:
    """TRL 1.16 use_bias_correction_kl (default True): per_token_kl *= coef_1 = exp(Δ)."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-4)
    coef_1 = np.exp(lp - old)
    kl = k3(lp, ref) * (coef_1 if bias_correction else 1.0)
    per_token = ppo_clip_loss(coef_1, adv, 0.2, 0.2) + 0.1 * kl
    loss = float(np.mean((per_token * m).sum(-1) / m.sum(-1)))  # loss_type="grpo"
    flag = "--kl-bias-correction" if bias_correction else "--no-kl-bias-correction"
    doc = run(cli, batch, "--preset", "trl", "--beta", "0.1", "--agg", "seq-mean-token-mean", flag)
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    # the KL statistics describe logp against ref_logp, uncorrected
    assert math.isclose(doc["kl"]["mean"], float(k3(lp, ref)[m].mean()), rel_tol=1e-12)
    assert doc["settings"]["kl_bias_correction"] is bias_correction


def verl_vanilla(
    lp: np.ndarray, old: np.ndarray, adv: np.ndarray, lo: float, hi: float
) -> np.ndarray:
    """verl compute_policy_loss_vanilla's per-token loss: Δ clamped to ±20, dual clip 3."""
    a = adv[:, None]
    ratio = np.exp(np.clip(lp - old, -20, 20))
    pg1 = -a * ratio
    pg2 = -a * np.clip(ratio, 1 - lo, 1 + hi)
    clip1 = np.maximum(pg1, pg2)
    clip2 = np.minimum(-a * 3.0, clip1)
    out: np.ndarray = np.where(a < 0, clip2, clip1)
    return out


def test_verl(cli: Cli, batch: dict[str, Any]) -> None:
    """verl: dual clip c = 3, Δ clamped to ±20, low_var_kl (±20 exponent, ±10 value)."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)
    pg_losses = verl_vanilla(lp, old, adv, 0.2, 0.2)
    kl = np.clip(ref - lp, -20, 20)
    kld = np.clip(np.exp(kl) - kl - 1, -10, 10)
    loss = masked_token_mean(pg_losses, m) + 0.001 * masked_token_mean(kld, m)
    doc = run(cli, batch, "--preset", "verl")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    # verl's pg_clipfrac_lower: A < 0 and ratio > c
    ratio = np.exp(np.clip(lp - old, -20, 20))
    lower = ((adv[:, None] < 0) & (ratio > 3.0) & m).sum() / m.sum()
    assert doc["clip_fraction"]["dual_clip_lower"] == lower > 0
    assert doc["kl"]["max"] == 10.0
    assert doc["settings"]["mirrors"] == "verl 0.9.1"


@pytest.mark.parametrize(("estimator", "flag"), [("k1", "kl"), ("k2", "mse")])
def test_verl_clamps_only_low_var_kl(
    cli: Cli, batch: dict[str, Any], estimator: str, flag: str
) -> None:
    """verl kl_penalty_forward: "kl" is logp − ref, "mse" is ½(logp − ref)², neither clamped."""
    lp, ref, m = batch["logp"], batch["ref"], batch["mask"]
    x = lp - ref
    kld = x if flag == "kl" else 0.5 * x**2
    doc = run(cli, batch, "--preset", "verl", "--kl-estimator", estimator)
    assert math.isclose(doc["kl_term"], 0.001 * masked_token_mean(kld, m), rel_tol=1e-12)
    # the token at ref − logp = 12: k1 = −12, k2 = 72, both beyond the ±10 of low_var_kl
    assert (doc["kl"]["min"], doc["kl"]["max"]) == (float(kld[m].min()), float(kld[m].max()))
    assert float(np.abs(kld[m]).max()) > 10
    assert doc["settings"]["kl_clamp"] is None


def test_verl_seq_mean_token_sum_norm(cli: Cli, batch: dict[str, Any]) -> None:
    """verl >= 0.7.1 agg_loss: Σ_i Σ_t loss / B / L, L = the padded width (no
    loss_scale_factor); --norm-scale lmax keeps verl <= 0.7.0's Σ / L."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)
    kl = np.clip(ref - lp, -20, 20)
    kld = np.clip(np.exp(kl) - kl - 1, -10, 10)
    per_token = verl_vanilla(lp, old, adv, 0.2, 0.2) + 0.001 * kld
    seq_losses = (per_token * m).sum(-1)
    loss = float(seq_losses.sum() / B / L)
    doc = run(cli, batch, "--preset", "verl", "--agg", "seq-mean-token-sum-norm")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    old_doc = run(
        cli, batch, "--preset", "verl", "--agg", "seq-mean-token-sum-norm", "--norm-scale", "lmax"
    )
    assert math.isclose(old_doc["objective"], -loss * B, rel_tol=1e-12)


def test_token_sum(cli: Cli, batch: dict[str, Any]) -> None:
    """verl token-sum: Σ over every valid token, no division."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)
    loss = float((verl_vanilla(lp, old, adv, 0.2, 0.2) * m).sum())
    doc = run(cli, batch, "--preset", "verl", "--beta", "0", "--agg", "token-sum")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    assert math.isclose(doc["aggregations"]["token-sum"], -loss, rel_tol=1e-12)


def test_verl_gspo(cli: Cli, batch: dict[str, Any]) -> None:
    """verl compute_policy_loss_gspo: raw Δ averaged per answer, clamped above at 10,
    no dual clip, no ±20 token clamp; clip fraction per token."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)[:, None]
    old2 = old.copy()
    old2[3, 0] = lp[3, 0] - 40.0  # answer 3 (2 tokens): mean Δ > 10, the seq clamp bites
    seq = ((lp - old2) * m).sum(-1) / m.sum(-1)
    log_r = np.minimum(seq, 10.0)[:, None] * np.ones((1, L))
    r = np.exp(log_r)
    pg1, pg2 = -adv * r, -adv * np.clip(r, 1 - 3e-4, 1 + 4e-4)
    pg = np.maximum(pg1, pg2)
    kl = np.clip(ref - lp, -20, 20)
    kld = np.clip(np.exp(kl) - kl - 1, -10, 10)
    loss = masked_token_mean(pg, m) + 0.001 * masked_token_mean(kld, m)
    path = batch["path"].parent / "verl_gspo.npz"
    np.savez(path, logp=lp, old_logp=old2, ref_logp=ref, mask=m, rewards=REWARDS.reshape(-1, G))
    doc = cli.json(
        "objective", path, "--preset", "verl", "--ratio-level", "sequence",
        "--clip-eps", "3e-4", "--clip-eps-high", "4e-4",
    )  # fmt: skip
    assert seq[3] > 10
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    clipfrac = float(((pg2 > pg1) & m).sum() / m.sum())
    assert doc["clip_fraction"]["region"] == clipfrac
    assert doc["clip_fraction"]["unit"] == "tokens"
    s = doc["settings"]
    assert (s["dual_clip"], s["seq_ratio_clamp"]) == (None, 10.0)


def test_openrlhf_kl_in_the_loss(cli: Cli, batch: dict[str, Any]) -> None:
    """OpenRLHF group_norm with --algo.kl.use_loss: (r − mean) / (std + 1e-9); KL loss: k1
    (its default estimator) clamped to ±10, aggregated per token; kl coef 0.01."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-9)
    ratio = np.exp(np.clip(lp - old, -20, 20))
    kl = np.clip(lp - ref, -10, 10)
    loss = masked_token_mean(ppo_clip_loss(ratio, adv, 0.2, 0.2), m) + 0.01 * masked_token_mean(
        kl, m
    )
    doc = run(cli, batch, "--preset", "openrlhf", "--kl-mode", "loss")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)


def suffix(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Σ_{t' >= t} x (masked), each row on its own: OpenRLHF's get_cumulative_returns."""
    out = np.zeros_like(x)
    running = np.zeros(x.shape[0])
    for t in reversed(range(x.shape[1])):
        running = x[:, t] * m[:, t] + running
        out[:, t] = running
    return out


def test_openrlhf_kl_in_the_reward(cli: Cli, batch: dict[str, Any]) -> None:
    """OpenRLHF's default: A_t = clip(z, ±10) − 0.01 Σ_{t' >= t} clamp(old − ref, ±10),
    per token; the loss has no KL term; its kl metric is the mean over answers of each
    answer's mean clamped k1."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    z = np.clip(group_norm(REWARDS, ddof=1, eps=1e-9), -10, 10)
    kl = np.clip(old - ref, -10, 10)
    adv_t = z[:, None] - 0.01 * suffix(kl, m)
    ratio = np.exp(np.clip(lp - old, -20, 20))
    surr = np.minimum(ratio * adv_t, np.clip(ratio, 0.8, 1.2) * adv_t)
    expected = masked_token_mean(surr, m)
    doc = run(cli, batch, "--preset", "openrlhf")
    assert doc["settings"]["kl_mode"] == "reward" and doc["kl_term"] == 0.0
    assert math.isclose(doc["objective"], expected, rel_tol=1e-12)
    low = ((ratio < 0.8) & (adv_t < 0) & m).sum() / m.sum()
    high = ((ratio > 1.2) & (adv_t > 0) & m).sum() / m.sum()
    assert (doc["clip_fraction"]["low"], doc["clip_fraction"]["high"]) == (low, high)
    tm = doc["trainer_metrics"]["metrics"]
    per_answer = (kl * m).sum(1) / m.sum(1)
    assert math.isclose(tm["kl"], float(per_answer.mean()), rel_tol=1e-12)
    raw = ((old - ref) * m).sum(1) / m.sum(1)
    assert math.isclose(tm["logprobs_diff"], float(raw.mean()), rel_tol=1e-12)


def test_verl_kl_in_the_reward(cli: Cli, batch: dict[str, Any]) -> None:
    """verl use_kl_in_reward: the score is r − β Σ_t (old − ref) (k1, unclamped) before the
    group mean and std: equal task rewards get nonzero advantages from the KL alone."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    beta = 0.05
    score = REWARDS - beta * ((old - ref) * m).sum(1)
    adv = group_norm(score, ddof=1, eps=1e-6)
    expected = -masked_token_mean(verl_vanilla(lp, old, adv, 0.2, 0.2), m)
    doc = run(cli, batch, "--preset", "verl", "--kl-mode", "reward", "--beta", str(beta))
    assert doc["kl_term"] == 0.0 and doc["settings"]["kl_estimator"] == "k1"
    assert math.isclose(doc["objective"], expected, rel_tol=1e-12)
    assert doc["advantage"]["max"] == pytest.approx(float(adv.max()), rel=1e-12)
    # the group of equal rewards (0.5) now has nonzero advantages
    group_of_equal = adv.reshape(-1, G)[1]
    assert np.all(group_of_equal != 0)
    tm = doc["trainer_metrics"]["metrics"]
    assert tm["actor/reward_kl_penalty_coeff"] == beta and "actor/kl_loss" not in tm
    per_answer = ((old - ref) * m).sum(1) / m.sum(1)
    assert math.isclose(tm["actor/reward_kl_penalty"], float(per_answer.mean()), rel_tol=1e-12)


def test_kl_in_the_reward_needs_a_trainer(cli: Cli, batch: dict[str, Any]) -> None:
    cli.error(["objective", str(batch["path"]), "--kl-mode", "reward"],
              "--kl-mode: reward needs trainer verl or openrlhf")  # fmt: skip


def test_openrlhf_kl_is_token_mean_whatever_the_policy_aggregation(
    cli: Cli, batch: dict[str, Any]
) -> None:
    """OpenRLHF GSPO: per-sample policy loss over mean(raw Δ), the KL loss per token."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-9)
    seq = ((lp - old) * m).sum(-1) / m.sum(-1)
    ratio = np.exp(seq)[:, None] * np.ones((1, L))
    pg = ppo_clip_loss(ratio, adv, 0.2, 0.2)
    kl = np.clip(k3(lp, ref), -10, 10)
    loss = float(np.mean((pg * m).sum(-1) / m.sum(-1))) + 0.01 * masked_token_mean(kl, m)
    doc = run(
        cli, batch, "--preset", "openrlhf", "--ratio-level", "sequence", "--kl-estimator", "k3",
        "--kl-mode", "loss",
    )  # fmt: skip
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    s = doc["settings"]
    assert (s["agg"], s["kl_agg"]) == ("seq-mean-token-mean", "token-mean")


@pytest.mark.parametrize("max_len", [None, 64])
def test_dr_grpo(cli: Cli, batch: dict[str, Any], max_len: int | None) -> None:
    """TRL loss_type="dr_grpo": no std; Σ loss / (B · max_completion_length), 512 by default."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=0, eps=0.0, scale=False)
    lmax = 512 if max_len is None else max_len
    loss = float((ppo_clip_loss(np.exp(lp - old), adv, 0.2, 0.2) * m).sum() / (B * lmax))
    extra = [] if max_len is None else ["--max-len", str(max_len)]
    doc = run(cli, batch, "--preset", "dr-grpo", *extra)
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    assert doc["max_len"] == lmax


def test_dapo(cli: Cli, batch: dict[str, Any]) -> None:
    """DAPO on verl: clip-higher (0.2, 0.28), token-level mean, no KL, verl's vanilla loss
    (dual clip 3 and the ±20 clamp are always on there)."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)
    loss = masked_token_mean(verl_vanilla(lp, old, adv, 0.2, 0.28), m)
    doc = run(cli, batch, "--preset", "dapo")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)


def test_dapo_singleton_gets_verls_raw_advantage(cli: Cli, tmp_path: Path) -> None:
    """verl compute_grpo_outcome_advantage: a one-answer group has mean 0, std 1."""
    path = tmp_path / "single.parquet"
    pq.write_table(
        pa.table({"group": ["a", "a", "b"], "reward": [1.0, 0.0, 0.7], "logp": [[-1.0]] * 3}),
        path,
    )
    doc = cli.json("advantages", path, "--preset", "dapo")
    assert doc["advantages"][2] == 0.7 / (1 + 1e-6)


def test_gspo(cli: Cli, batch: dict[str, Any]) -> None:
    """GSPO as TRL runs it: s_i = exp(mean_t Δ), clip (3e-4, 4e-4), per-sequence mean;
    clip metrics count sequences (TRL's coef_1 is (B, 1))."""
    lp, old, m = batch["logp"], batch["old"], batch["mask"]
    adv = group_norm(REWARDS, ddof=1, eps=1e-4)
    log_w = ((lp - old) * m).sum(-1) / m.sum(-1)
    coef = np.exp(log_w)[:, None] * np.ones((1, L))
    per_token = ppo_clip_loss(coef, adv, 3e-4, 4e-4)
    loss = float(np.mean((per_token * m).sum(-1) / m.sum(-1)))
    doc = run(cli, batch, "--preset", "gspo")
    assert math.isclose(doc["objective"], -loss, rel_tol=1e-12)
    assert doc["settings"]["ratio_level"] == "sequence"
    w = np.exp(log_w)
    low = (w < 1 - 3e-4) & (adv < 0)
    high = (w > 1 + 4e-4) & (adv > 0)
    cf = doc["clip_fraction"]
    assert cf["unit"] == "sequences"
    assert (cf["low"], cf["high"], cf["region"]) == (low.mean(), high.mean(), (low | high).mean())
    assert 0 < cf["region"] < 1
    tokens = run(cli, batch, "--preset", "gspo", "--clip-unit", "tokens")["clip_fraction"]
    assert tokens["region"] == ((low | high)[:, None] & m).sum() / m.sum()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--clip-unit", "sequences"], "--clip-unit: sequences needs --ratio-level sequence"),
        (["--seq-ratio-clamp", "10"], "--seq-ratio-clamp: needs --ratio-level sequence"),
        (["--norm-scale", "verl"], "--norm-scale: 'verl' was renamed"),
        (["--kl-agg", "bogus"], "--kl-agg: 'bogus' is not one of"),
        (["--preset", "gspo", "--clip-unit", "sequences", "--ratio-level", "token"], "--clip-unit"),
    ],
)
def test_convention_usage_errors(
    cli: Cli, batch: dict[str, Any], args: list[str], message: str
) -> None:
    cli.error(["objective", str(batch["path"]), *args], message)


def test_a_preset_at_token_level_counts_tokens(cli: Cli, batch: dict[str, Any]) -> None:
    s = run(cli, batch, "--preset", "gspo", "--ratio-level", "token")["settings"]
    assert (s["clip_unit"], s["seq_ratio_clamp"]) == ("tokens", None)


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


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"agg": "bogus"}, "agg"),
        ({"kl_agg": "mean"}, "kl_agg"),
        ({"ddof": 2}, "ddof"),
        ({"eps": float("nan")}, "eps"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"kl_clamp": 0.0}, "kl_clamp"),
        ({"max_len": 0}, "max_len"),
        ({"clip_unit": "sequences"}, "clip_unit"),
        ({"norm_scale": "verl"}, "norm_scale"),
    ],
)
def test_settings_check_their_fields_when_made(kwargs: dict[str, Any], field: str) -> None:
    """A library caller gets the error at construction, naming the field (not a flag)."""
    with pytest.raises(SettingError) as info:
        Settings(**kwargs)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


def test_preset_rules_follow_the_trainer() -> None:
    s = resolve_settings("verl", kl_estimator="k1")
    assert s.kl_clamp is None and s.dual_clip == 3.0 and s.seq_ratio_clamp is None
    s = resolve_settings("verl", kl_estimator="k1", kl_clamp=5.0)  # given: kept
    assert s.kl_clamp == 5.0
    s = resolve_settings("verl", ratio_level="sequence")
    assert (s.dual_clip, s.seq_ratio_clamp, s.kl_clamp) == (None, 10.0, 10.0)
    s = resolve_settings("gspo", ratio_level="token")
    assert (s.clip_unit, s.trainer, s.mirrors) == ("tokens", "trl", "trl 1.16.0")
    assert resolve_settings("openrlhf", ratio_level="sequence").agg == "seq-mean-token-mean"
    assert resolve_settings(None, kl_estimator="k1").kl_clamp is None  # no preset: no rules


def test_trainer_metrics_under_the_trainers_names(cli: Cli, batch: dict[str, Any]) -> None:
    """Each preset's trainer metrics, from the trainers' formulas on the padded batch."""
    lp, old, ref, m = batch["logp"], batch["old"], batch["ref"], batch["mask"]
    delta = lp - old
    verl = run(cli, batch, "--preset", "verl")["trainer_metrics"]
    assert (verl["trainer"], verl["version"]) == ("verl", "verl 0.9.1")
    vm = verl["metrics"]
    assert set(vm) == {
        "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl",
        "actor/kl_loss",
    }  # fmt: skip
    assert math.isclose(vm["actor/ppo_kl"], masked_token_mean(-np.clip(delta, -20, 20), m))
    adv = group_norm(REWARDS, ddof=1, eps=1e-6)
    pg = masked_token_mean(verl_vanilla(lp, old, adv, 0.2, 0.2), m)
    assert math.isclose(vm["actor/pg_loss"], pg)
    kl = np.clip(ref - lp, -20, 20)
    low_var_kl = np.clip(np.exp(kl) - kl - 1, -10, 10)
    assert math.isclose(vm["actor/kl_loss"], masked_token_mean(low_var_kl, m))
    orl = run(cli, batch, "--preset", "openrlhf", "--kl-mode", "loss")["trainer_metrics"]["metrics"]
    assert math.isclose(orl["ppo_kl"], masked_token_mean(-delta, m))
    assert math.isclose(orl["logprobs_diff"], masked_token_mean(lp - ref, m))
    assert math.isclose(orl["kl"], masked_token_mean(np.clip(lp - ref, -10, 10), m))
    trl = run(cli, batch, "--preset", "trl", "--beta", "0.1")["trainer_metrics"]["metrics"]
    ratio = np.exp(delta)
    a = group_norm(REWARDS, ddof=1, eps=1e-4)[:, None]
    high = (ratio > 1.2) & (a > 0) & m
    low = (ratio < 0.8) & (a < 0) & m
    assert trl["clip_ratio/high_max"] == float(np.max(high.sum(1) / m.sum(1))) > 0
    assert trl["clip_ratio/low_min"] == float(np.min(low.sum(1) / m.sum(1)))
    assert math.isclose(trl["kl"], masked_token_mean(k3(lp, ref) * ratio, m))  # bias-corrected
    assert trl["frac_reward_zero_std"] == 4 / 12  # the group of 0.5s: 4 answers of 12
    assert "kl" not in run(cli, batch, "--preset", "trl")["trainer_metrics"]["metrics"]  # β = 0
    assert run(cli, batch)["trainer_metrics"] == {"trainer": None, "version": None, "metrics": {}}


def test_trainer_option(cli: Cli, batch: dict[str, Any]) -> None:
    doc = run(cli, batch, "--trainer", "openrlhf")
    assert set(doc["trainer_metrics"]["metrics"]) == {
        "policy_loss", "ppo_clip_ratio", "ppo_kl", "kl", "logprobs_diff"
    }  # fmt: skip
    assert doc["settings"]["agg"] == "seq-mean-token-mean"  # only names; no preset conventions
    cli.error(
        ["objective", str(batch["path"]), "--preset", "verl", "--trainer", "trl"],
        "--trainer trl: the verl preset mirrors verl",
    )
    cli.error(["objective", str(batch["path"]), "--trainer", "x"], "--trainer: 'x' is not one of")


def test_logged_metrics_are_compared(cli: Cli, batch: dict[str, Any], tmp_path: Path) -> None:
    """--logged: what the trainer logged, with the loggers' prefixes, against the recomputed
    values; a wrong one differs; check --logged fails the logged-metrics rule on it."""
    mine = run(cli, batch, "--preset", "verl")["trainer_metrics"]["metrics"]
    lines = [
        {"step": 1, "train/actor/pg_loss": 0.0, "actor/ppo_kl": 1.0},
        {"step": 2, "train/actor/pg_loss": mine["actor/pg_loss"] * (1 + 1e-6),
         "actor/ppo_kl": mine["actor/ppo_kl"] * 1.5, "actor/lr": 1e-6, "note": "x"},
    ]  # fmt: skip
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    doc = run(cli, batch, "--preset", "verl", "--logged", str(path))
    got = {m["metric"]: m for m in doc["logged"]["metrics"]}
    assert doc["logged"]["step"] == 2 and doc["logged"]["tolerance"] == 1e-3
    assert got["actor/pg_loss"]["verdict"] == "match"
    assert got["actor/ppo_kl"]["verdict"] == "differs"
    assert math.isclose(got["actor/ppo_kl"]["relative"], 0.5 / 1.5)
    assert got["actor/lr"]["verdict"] == "not recomputed" and "note" not in got
    assert any("1 metric(s) differ" in w for w in doc["warnings"])
    step1 = run(cli, batch, "--preset", "verl", "--logged", str(path), "--logged-step", "1")
    assert step1["logged"]["step"] == 1
    cli.error(
        ["objective", str(batch["path"]), "--preset", "verl", "--logged", str(path),
         "--logged-step", "7"],
        "no record of step 7 (steps logged: [1, 2])",
    )  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    cli.error(["objective", str(batch["path"]), "--logged", str(bad)], "line 2 is not JSON")
    assert "logged" not in run(cli, batch, "--preset", "verl")  # only when asked
    # check: on a file whose integrity holds (this batch has log-probs above 0 on purpose)
    sample = str(SAMPLE / "batch.parquet")
    theirs = cli.json("objective", sample, "--preset", "verl")["trainer_metrics"]["metrics"]
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"actor/pg_loss": theirs["actor/pg_loss"],
                                 "actor/ppo_kl": theirs["actor/ppo_kl"] * 2}))  # fmt: skip
    r = cli("check", sample, "--preset", "verl", "--logged", str(wrong), "--format", "json")
    res = {x["rule"]: x for x in json.loads(r.stdout)["results"]}
    assert r.exit_code == 1 and res["logged-metrics"]["status"] == "fail"
    assert res["logged-metrics"]["examples"][0]["metric"] == "actor/ppo_kl"
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"actor/pg_loss": theirs["actor/pg_loss"]}))
    r = cli("check", sample, "--preset", "verl", "--logged", str(good), "--format", "json")
    res = {x["rule"]: x for x in json.loads(r.stdout)["results"]}
    assert res["logged-metrics"]["status"] == "pass"
    r = cli("check", sample, "--logged", str(good), "--format", "json")
    res = {x["rule"]: x for x in json.loads(r.stdout)["results"]}
    assert res["logged-metrics"]["status"] == "skip"  # no trainer named: never a vacuous pass
