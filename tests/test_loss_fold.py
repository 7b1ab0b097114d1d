"""Every policy loss and correction through the tool: the CLI's objective on a file of many
tiny batches (ragged parquet row groups, padded npz with a mask) equals the loss's function
of grpo_cli.losses (proved against each trainer's own by conformance/losses.py) applied to
the whole batch at once and aggregated here by hand; a real TRL GRPOTrainer run with
loss_type cispo and sapo is reproduced with no flags."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.errors import SettingError
from grpo_cli.losses import LOSSES as ROWS
from grpo_cli.losses import logged_metrics
from grpo_cli.losses import openrlhf as LO
from grpo_cli.losses import prime_rl as LP
from grpo_cli.losses import registry as LR
from grpo_cli.losses import slime as LS
from grpo_cli.losses import trl as LT
from grpo_cli.losses import verl as LV
from grpo_cli.losses import verl_rollout as LVR
from grpo_cli.settings import CORRECTION_NAMES, Settings
from grpo_cli.settings import LOSS_NAMES as LOSSES
from grpo_cli.trainers import openrlhf, trl, verl
from grpo_cli.trainers.presets import resolve_settings

from .conftest import Cli, pad
from .trl_runs import step_records


def metrics_of(key: str) -> tuple[LR.Metric, ...]:
    """A loss's logged metrics by its name, or ``verl/bypass_mode/<loss_type>``."""
    _, _, kind = key.partition("/bypass_mode/")
    if kind:
        return logged_metrics("verl/bypass_mode", bypass_loss_type=kind)
    return logged_metrics(key)


BETA = 0.04


def _data(seed: int = 7, n: int = 36) -> dict[str, Any]:
    """Ragged answers in groups of 4, rewards 0..2, a sampler's log-probs near old_logp."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 10, size=n)
    old = [-rng.exponential(0.6, size=k) for k in lengths]
    return {
        "lengths": lengths,
        "old_logp": old,
        "logp": [np.minimum(o + rng.normal(0, 0.25, size=o.shape[0]), -1e-3) for o in old],
        "ref_logp": [np.minimum(o + rng.normal(0, 0.2, size=o.shape[0]), -1e-3) for o in old],
        "rollout_logp": [np.minimum(o + rng.normal(0, 0.15, size=o.shape[0]), -1e-3) for o in old],
        "group": np.repeat(np.arange(n // 4), 4),
        "reward": rng.integers(0, 3, size=n).astype(float),
    }


FIELDS = ("logp", "old_logp", "ref_logp", "rollout_logp")


def _parquet(path: Path, d: dict[str, Any], rows: int) -> Path:
    cols: dict[str, Any] = {"group": pa.array(d["group"]), "reward": pa.array(d["reward"])}
    for f in (*FIELDS, "entropy") if "entropy" in d else FIELDS:
        cols[f] = pa.array([r.tolist() for r in d[f]], type=pa.list_(pa.float64()))
    pq.write_table(pa.table(cols), path, row_group_size=rows)
    return path


def _npz(path: Path, d: dict[str, Any]) -> Path:
    """Padded, the padding filled with values that would change any result they entered."""
    width = int(max(d["lengths"]))
    mask = np.arange(width)[None, :] < np.asarray(d["lengths"])[:, None]
    arrays = {f: pad(d[f], width, fill=-7.5) for f in FIELDS if f in d}
    if "entropy" in d:
        arrays["entropy"] = pad(d["entropy"], width, fill=7.5)
    np.savez(path, mask=mask, rewards=d["reward"], group=d["group"], **arrays)  # type: ignore[arg-type]
    return path


def _advantages(d: dict[str, Any]) -> np.ndarray:
    """DeepSeekMath's, by hand: (r − group mean) / (population std + 1e-8)."""
    r, g = d["reward"], d["group"]
    out = np.zeros_like(r)
    for k in np.unique(g):
        m = g == k
        out[m] = (r[m] - r[m].mean()) / (r[m].std() + 1e-8)
    return out


def _agg(x: np.ndarray, off: np.ndarray, how: str) -> float:
    """The aggregation by hand, answer by answer."""
    rows = [x[off[i] : off[i + 1]] for i in range(off.shape[0] - 1)]
    if how == "seq-mean-token-mean":
        return float(np.mean([r.mean() for r in rows]))
    if how == "token-mean":
        return float(np.concatenate(rows).mean())
    assert how == "seq-mean-token-sum"
    return float(np.mean([r.sum() for r in rows]))


def _flat(d: dict[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    off = np.concatenate(([0], np.cumsum(d["lengths"])))
    return {f: np.concatenate(d[f]) for f in FIELDS}, off


# loss -> (CLI flags, the function of grpo_cli.losses with the trainer's parameters, as
# the trainer's config names them: TRL epsilon_high is CISPO's cap, verl clip_ratio_* its
# bounds and ±20 clamp, ...)
def _by_hand(name: str, f: dict[str, np.ndarray], a: np.ndarray, off: np.ndarray) -> LR.PolicyTerms:
    lp, old = f["logp"], f["old_logp"]
    return {
        "trl/cispo": lambda: LT.cispo_terms(lp, old, a, off, upper=1.1),
        "trl/sapo": lambda: LT.sapo_terms(lp, old, a, off, tau_pos=0.9, tau_neg=1.3),
        "trl/luspo": lambda: LT.luspo_terms(lp, old, a, off, clip_eps=0.2, ratio_level="token"),
        "trl/vespo": lambda: LT.vespo_terms(lp, old, a, off, k_pos=1.5),
        "verl/dppo_tv": lambda: LV.dppo_terms(lp, old, a, off, clip_low=0.1, clip_high=0.15),
        "verl/dppo_kl": lambda: LV.dppo_terms(lp, old, a, off, divergence="kl", clip_low=0.05,
                                             clip_high=0.05, ratio_cap=1.2),
        "verl/sapo": lambda: LT.sapo_terms(lp, old, a, off, log_ratio_clamp=20.0),
        "verl/gpg": lambda: LV.gpg_terms(lp, a, off),
        "verl/clip_cov": lambda: LV.clip_cov_terms(lp, old, a, off, clip_cov_ratio=0.05,
                                                  clip_cov_lb=0.0, clip_cov_ub=5.0),
        "verl/kl_cov": lambda: LV.kl_cov_terms(lp, old, a, off, kl_cov_ratio=0.05, ppo_kl_coef=1.0),
        "verl/geo_mean": lambda: LV.geo_mean_terms(lp, old, a, off, clip_low=0.1, clip_high=0.25),
        "verl/dro": lambda: LV.dro_terms(lp, old, a, off, beta=0.3),
        "verl/cispo": lambda: LT.cispo_terms(lp, old, a, off, lower=0.8, upper=1.2,
                                            log_ratio_clamp=20.0),
        # slime's eps_clip / eps_clip_high / eps_clip_c; its CISPO is [1 − eps_clip,
        # 1 + eps_clip_high] with no log-ratio clamp (slime 624b824a ppo_utils.py:124-171)
        "slime/ppo_eps_clip": lambda: LS.slime_policy_terms(lp, old, a, off, eps_clip=0.1,
                                                            eps_clip_high=0.25, eps_clip_c=3.0),
        "slime/cispo": lambda: LT.cispo_terms(lp, old, a, off, lower=0.8, upper=1.28),
        # prime-rl's DefaultLossConfig / IPOLossConfig names (559b4477 configs/trainer.py)
        "prime_rl/dppo_tv": lambda: LP.dppo_binary_terms(lp, old, a, off, mask_low=0.1,
                                                         mask_high=0.3, kl_tau=0.01),
        "prime_rl/ipo": lambda: LP.dppo_binary_terms(lp, old, a, off, rule="ipo",
                                                     ipo_threshold=0.05, adv_tau=0.5),
        "areal/sapo": lambda: LT.sapo_terms(lp, old, a, off, tau_pos=0.9, tau_neg=1.3,
                                            trainer_agg=False),
    }[name]()  # fmt: skip


FLAGS: dict[str, list[str]] = {
    "trl/cispo": ["--clip-eps-high", "1.1"],
    "trl/sapo": ["--loss-param", "sapo_temperature_pos=0.9",
                 "--loss-param", "sapo_temperature_neg=1.3"],
    "trl/luspo": [],
    "trl/vespo": ["--loss-param", "vespo_k_pos=1.5"],
    "verl/dppo_tv": ["--clip-eps", "0.1", "--clip-eps-high", "0.15"],
    "verl/dppo_kl": ["--clip-eps", "0.05", "--dual-clip", "1.2"],
    "verl/sapo": [],
    "verl/gpg": [],
    "verl/clip_cov": ["--loss-param", "clip_cov_ratio=0.05", "--loss-param", "clip_cov_lb=0"],
    "verl/kl_cov": ["--loss-param", "kl_cov_ratio=0.05", "--loss-param", "ppo_kl_coef=1"],
    "verl/geo_mean": ["--clip-eps", "0.1", "--clip-eps-high", "0.25"],
    "verl/dro": ["--loss-param", "dro_beta=0.3"],
    "verl/cispo": [],
    "slime/ppo_eps_clip": ["--clip-eps", "0.1", "--clip-eps-high", "0.25", "--dual-clip", "3"],
    "slime/cispo": ["--clip-eps-high", "0.28"],
    "prime_rl/dppo_tv": ["--loss-param", "dppo_mask_low=0.1", "--loss-param",
                         "dppo_mask_high=0.3", "--loss-param", "kl_tau=0.01"],
    "prime_rl/ipo": ["--loss-param", "ipo_threshold=0.05", "--loss-param", "adv_tau=0.5"],
    "areal/sapo": ["--loss-param", "sapo_tau_pos=0.9", "--loss-param", "sapo_tau_neg=1.3"],
}  # fmt: skip
# verl's bypass mode takes its correction's settings too: test_bypass_mode_*
NON_CLIP = [x for x in LOSSES if x not in ("clip", "verl/bypass_mode")]
# the losses that select tokens over the batch their loss saw (they do not fold beyond it)
BATCH_LOSSES = ("verl/clip_cov", "verl/kl_cov")


def test_every_loss_has_its_flags_and_metrics() -> None:
    """The registry is the one list: every loss but clip is tested here, and verl's bypass
    mode logs by its loss_type (each of them has its metrics)."""
    assert set(NON_CLIP) == set(FLAGS) == set(ROWS) - {"clip", "verl/bypass_mode"}
    for kind in get_args(LVR.BypassLoss):
        assert metrics_of(f"verl/bypass_mode/{kind}")


def _expected(name: str, d: dict[str, Any]) -> tuple[float, dict[str, float], LR.PolicyTerms]:
    f, off = _flat(d)
    a = _advantages(d)
    t = _by_hand(name, f, a, off)
    agg = ROWS[name].agg or "seq-mean-token-mean"
    dk = f["ref_logp"] - f["logp"]
    kl = np.exp(dk) - dk - 1.0
    # verl aggregates its KL loss by loss_agg_mode whatever the policy loss forces; TRL
    # aggregates the whole per-token loss the forced way
    kl_agg = "seq-mean-token-mean" if name.startswith("verl/") else agg
    j = _agg(t.term, off, agg) - BETA * _agg(kl, off, kl_agg)
    return j, LR.loss_metrics(t, off, metrics_of(name)), t


def close(a: float, b: float, rel: float = 1e-10) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-13)


@pytest.mark.parametrize("name", NON_CLIP)
def test_each_loss_over_many_batches_is_the_function_of_the_whole_batch(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    d = _data()
    batch = name not in BATCH_LOSSES  # clip_cov, kl_cov: one batch (below: many)
    if batch:
        monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")  # a few answers per batch
    paths = [
        _parquet(tmp_path / "b.parquet", d, rows=3 if batch else 1000),
        _npz(tmp_path / "b.npz", d),
    ]
    want, metrics, _ = _expected(name, d)
    for path in paths:
        doc = cli.json("objective", path, "--loss", name, *FLAGS[name], "--workers", "2")
        assert doc["settings"]["loss"] == name
        assert close(doc["objective"], want), (path.suffix, doc["objective"], want)
        got = doc["loss_metrics"]
        assert list(got) == list(metrics)
        for k, v in metrics.items():
            assert close(got[k], v), (k, got[k], v)


@pytest.mark.parametrize("name", BATCH_LOSSES)
def test_a_batch_loss_over_many_batches_says_so(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """clip_cov and kl_cov select over the batch their loss saw: over several of
    grpo-cli's batches each is one micro-batch, and the warning says it."""
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    d = _data()
    doc = cli.json("objective", _parquet(tmp_path / "b.parquet", d, rows=3), "--loss", name,
                   *FLAGS[name])  # fmt: skip
    assert any("micro-batch" in w for w in doc["warnings"]), doc["warnings"]


def test_the_gradient_is_the_loss_s(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """‖∂J/∂logp‖'s policy part: the loss's per-token gradient times the aggregation's
    token weight 1/(N·|o_i|), by hand."""
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    d = _data()
    f, off = _flat(d)
    lens = np.diff(off)
    for name in ("trl/cispo", "verl/dro", "verl/geo_mean"):
        t = _by_hand(name, f, _advantages(d), off)
        assert t.grad is not None
        w = np.repeat(1.0 / (lens.shape[0] * lens), lens)
        want = float(np.sqrt(np.sum((w * t.grad) ** 2)))
        doc = cli.json("objective", _parquet(tmp_path / "g.parquet", d, rows=3), "--loss", name,
                       *FLAGS[name], "--gradient")  # fmt: skip
        assert close(doc["gradient"]["policy_norm"], want, 1e-9), name


# ------------------------------------------------------------------ corrections
def _clip_policy(f: dict[str, np.ndarray], a: np.ndarray, off: np.ndarray) -> np.ndarray:
    rho = np.exp(f["logp"] - f["old_logp"])
    at = np.repeat(a, np.diff(off))
    return np.minimum(rho * at, np.clip(rho, 0.8, 1.2) * at)


CORRECTIONS = {
    "trl-vllm": (["--correction-param", "vllm_is_clip_max=1.5"],
                 lambda o, r, off: LT.trl_vllm_is_correction(o, r, off, clip_max=1.5)),
    "verl-rollout": (["--correction-param", "rollout_is=token",
                      "--correction-param", "rollout_is_threshold=1.2"],
                     lambda o, r, off: LVR.verl_rollout_correction(
                         o, r, off, rollout_is="token", rollout_is_threshold=1.2)),
    "verl-rollout/sequence": ([], lambda o, r, off: LVR.verl_rollout_correction(o, r, off)),
    "openrlhf-is/seq": (["--correction-param", "is_correction_level=seq",
                         "--correction-param", "is_correction_high=1.04",
                         "--correction-param", "is_correction_low=0.96"],
                        lambda o, r, off: LO.openrlhf_is_correction(
                            o, r, off, level="seq", threshold=(0.96, 1.04))),
    "openrlhf-is": (["--correction-param", "is_correction_high=1.3",
                     "--correction-param", "is_correction_low=0.8"],
                    lambda o, r, off: LO.openrlhf_is_correction(
                        o, r, off, level="token", threshold=(0.8, 1.3))),
    "slime-tis": (["--correction-param", "tis_clip=1.5", "--correction-param", "tis_clip_low=0.5"],
                  lambda o, r, off: LS.slime_tis(o, r, off, tis_clip=1.5, tis_clip_low=0.5)),
    "slime-tis/icepop": (["--correction-param", "tis_kind=icepop",
                          "--correction-param", "tis_clip=1.2"],
                         lambda o, r, off: LS.slime_tis(o, r, off, kind="icepop", tis_clip=1.2)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_each_correction_over_many_batches(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    d = _data(seed=11)
    f, off = _flat(d)
    flags, fn = CORRECTIONS[name]
    corr = fn(f["old_logp"], f["rollout_logp"], off)
    # a mask binds on some tokens, not all
    masks = name.startswith(("trl", "openrlhf")) or name == "slime-tis/icepop"
    assert 0 < np.count_nonzero(corr.weight == 0) < corr.weight.shape[0] or not masks
    dk = f["ref_logp"] - f["logp"]
    kl = np.exp(dk) - dk - 1.0
    policy = _clip_policy(f, _advantages(d), off) * corr.weight
    want = _agg(policy, off, "seq-mean-token-mean") - BETA * _agg(kl, off, "seq-mean-token-mean")
    for path in (_parquet(tmp_path / "c.parquet", d, rows=3), _npz(tmp_path / "c.npz", d)):
        doc = cli.json("objective", path, "--correction", name.split("/")[0], *flags)
        assert close(doc["objective"], want), (path.suffix, doc["objective"], want)
        got = doc["loss_metrics"]
        for k, v in corr.metrics.items():
            assert close(got[k], v, 1e-9), (k, got[k], v)
        assert set(got) == set(corr.metrics)  # every one, over many batches too
        assert len(got) >= min(5, len(corr.metrics))


# verl's rejection sampling (decoupled mode): configs that reject some tokens, and some
# answers whole (a sequence option, or a one-token answer whose token fails)
REJECTIONS: dict[str, dict[str, Any]] = {
    "token_k1+is": {"rollout_is": "token", "rollout_is_threshold": 1.5,
                    "rollout_rs": "token_k1", "rollout_rs_threshold": "0.85_1.15"},
    "seq_mean_k3": {"rollout_is": None, "rollout_rs": "seq_mean_k3",
                    "rollout_rs_threshold": 0.01},
    "token_k2,seq_max_k3+seq_is": {"rollout_rs": "token_k2,seq_max_k3",
                                   "rollout_rs_threshold": "0.02,0.05"},
}  # fmt: skip


def _rejection_flags(rc: dict[str, Any]) -> list[str]:
    out = ["--correction", "verl-rollout"]
    for k, v in rc.items():
        out += ["--correction-param", f"{k}={'off' if v is None else v}"]
    return out


def _by_rows(x: np.ndarray, off: np.ndarray, how: str, rows: int) -> float:
    """The aggregation by hand over the kept tokens, a seq-mean over every row (verl
    0.9.1's ``agg_loss`` divides by ``global_batch_size``, the mini-batch's rows, so an
    answer rejected whole counts as a 0)."""
    kept = [x[off[i] : off[i + 1]] for i in range(off.shape[0] - 1)]
    if how == "token-mean":
        return float(np.concatenate(kept).sum() / off[-1])
    if how == "seq-mean-token-mean":
        return float(sum(r.mean() for r in kept) / rows)
    assert how == "seq-mean-token-sum"
    return float(sum(r.sum() for r in kept) / rows)


def _spread(name: str) -> bool:
    """verl's std of a rejection statistic: one batch's (left out over many)."""
    return name.startswith("rollout_corr/rollout_rs_") and name.endswith("std")


@pytest.mark.parametrize("name", list(REJECTIONS))
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_rejection_sampling_removes_the_rejected_tokens_from_every_part(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, agg: str
) -> None:
    """The fold equals verl_rollout_correction on the whole batch, drop_tokens(keep), the
    clipped surrogate times the weights and the KL on the kept tokens, aggregated by hand;
    the advantages are every answer's (verl's GRPO scores ignore the mask), the entropy
    and sampler statistics every token's, the correction's metrics the whole batch's."""
    d = _data(seed=11)
    d["entropy"] = [np.abs(o) for o in d["old_logp"]]
    f, off = _flat(d)
    rc = REJECTIONS[name]
    corr = LVR.verl_rollout_correction(f["old_logp"], f["rollout_logp"], off, **rc)
    off2, (lp, old, ref, w), kept = LR.drop_tokens(
        corr.keep, off, f["logp"], f["old_logp"], f["ref_logp"], corr.weight
    )
    n = len(d["reward"])
    assert 0 < off2[-1] < off[-1] and 0 < len(kept) < n  # tokens and answers rejected
    a = _advantages(d)[kept]
    policy = _clip_policy({"logp": lp, "old_logp": old}, a, off2) * w
    dk = ref - lp
    kl = np.exp(dk) - dk - 1.0
    want = _by_rows(policy, off2, agg, n) - BETA * _by_rows(kl, off2, agg, n)
    rho = np.exp(lp - old)
    at = np.repeat(a, np.diff(off2))
    region = float(np.mean(((at > 0) & (rho > 1.2)) | ((at < 0) & (rho < 0.8))))
    flags = [*_rejection_flags(rc), "--agg", agg]
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    for path in (_parquet(tmp_path / "r.parquet", d, rows=3), _npz(tmp_path / "r.npz", d)):
        doc = cli.json("objective", path, *flags)
        assert close(doc["objective"], want), (path.suffix, doc["objective"], want)
        assert doc["counts"]["answers"] == len(kept) and doc["counts"]["tokens"] == off2[-1]
        assert close(doc["clip_fraction"]["region"], region)
        assert doc["rollout"]["tokens"] == off[-1]  # the sampler's statistics: every token
        assert doc["entropy"]["count"] == off[-1]
        got = doc["loss_metrics"]
        for k, v in corr.metrics.items():
            if not _spread(k):
                assert close(got[k], v, 1e-9), (k, got[k], v)
        assert {k for k in corr.metrics if not _spread(k)} <= set(got)
        assert any("removed" in x and "rollout_rs" in x for x in doc["warnings"])
    monkeypatch.delenv("GRPO_CLI_BATCH_TOKENS")  # one batch: every metric, spreads too
    doc = cli.json("objective", _parquet(tmp_path / "one.parquet", d, rows=100), *flags)
    assert close(doc["objective"], want)
    assert {k: doc["loss_metrics"][k] for k in corr.metrics} == pytest.approx(
        corr.metrics, rel=1e-9, abs=1e-15
    )


def test_rejection_sampling_with_verl_s_own_loss_and_its_gradient(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl/cispo under rejection: its terms on the kept tokens times the weights, its
    logged metrics over the kept tokens, and ‖∂J/∂logp‖ over them (a rejected token has
    none)."""
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    d = _data(seed=11)
    f, off = _flat(d)
    rc = REJECTIONS["token_k1+is"]
    corr = LVR.verl_rollout_correction(f["old_logp"], f["rollout_logp"], off, **rc)
    off2, (lp, old, ref, w), kept = LR.drop_tokens(
        corr.keep, off, f["logp"], f["old_logp"], f["ref_logp"], corr.weight
    )
    n = len(d["reward"])
    a = _advantages(d)[kept]
    t = LR.apply_correction(
        LT.cispo_terms(lp, old, a, off2, lower=0.8, upper=1.2, log_ratio_clamp=20.0), w
    )
    dk = ref - lp
    kl = np.exp(dk) - dk - 1.0
    want = _by_rows(t.term, off2, "token-mean", n) - BETA * _by_rows(kl, off2, "token-mean", n)
    assert t.grad is not None
    gk = 1.0 - np.exp(dk)  # k3 = e^d − d − 1 with d = ref − logp: ∂/∂logp = 1 − e^d
    grad = (t.grad - BETA * gk) / off2[-1]
    doc = cli.json(
        "objective", _parquet(tmp_path / "c.parquet", d, rows=3), "--loss", "verl/cispo",
        "--agg", "token-mean", "--gradient", *_rejection_flags(rc),
    )  # fmt: skip
    assert close(doc["objective"], want), (doc["objective"], want)
    mine = LR.loss_metrics(t, off2, ROWS["verl/cispo"].metrics_for(None))
    for k, v in mine.items():
        assert close(doc["loss_metrics"][k], v, 1e-9), (k, doc["loss_metrics"][k], v)
    assert close(doc["gradient"]["norm"], float(np.linalg.norm(grad)), 1e-9)


BYPASS: dict[str, dict[str, Any]] = {
    "ppo_clip+token_k1": {"bypass_loss_type": "ppo_clip", "rollout_is": "sequence",
                          "rollout_rs": "token_k1", "rollout_rs_threshold": "0.85_1.15"},
    "reinforce+token_is+seq_mean_k3": {"bypass_loss_type": "reinforce", "rollout_is": "token",
                                       "rollout_is_threshold": 1.5, "rollout_rs": "seq_mean_k3",
                                       "rollout_rs_threshold": 0.01},
    "reinforce": {"bypass_loss_type": "reinforce", "rollout_is": None},
}  # fmt: skip


@pytest.mark.parametrize("name", list(BYPASS))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_bypass_mode_as_verl_s_actor_aggregates_it(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, agg: str
) -> None:
    """verl/bypass_mode: verl_bypass_mode (logp against rollout_logp) on the whole batch;
    the policy loss over the kept tokens divided by every token (batch_num_tokens counts
    the unrejected mask) or every row, a seq-mean-token-mean by each answer's kept tokens;
    the KL loss over every token; the loss's metrics over the kept tokens, the
    correction's over all; ‖∂J/∂logp‖ from the same token weights."""
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    d = _data(seed=11)
    f, off = _flat(d)
    a = _advantages(d)
    rc = dict(BYPASS[name])
    kind = rc.pop("bypass_loss_type")
    t, corr = LVR.verl_bypass_mode(f["logp"], f["rollout_logp"], a, off, loss_type=kind, **rc)
    keep, lengths, n = corr.keep, np.diff(off), len(a)
    kept = np.add.reduceat(keep.astype(float), off[:-1])
    if "rollout_rs" in rc:
        assert 0 < np.count_nonzero(~keep) and np.any(kept == 0)  # answers rejected whole
    if agg == "token-mean":
        w_p = keep / off[-1]
        w_k = np.full(off[-1], 1.0 / off[-1])
    elif agg == "seq-mean-token-mean":
        per = np.divide(1.0, kept, out=np.zeros(n), where=kept > 0)
        w_p = keep * np.repeat(per, lengths) / n
        w_k = np.repeat(1.0 / lengths, lengths) / n
    else:
        w_p, w_k = keep / n, np.full(off[-1], 1.0 / n)
    dk = f["ref_logp"] - f["logp"]
    kl = np.exp(dk) - dk - 1.0
    want = float(np.sum(w_p * t.term) - BETA * np.sum(w_k * kl))
    assert t.grad is not None
    grad = float(np.linalg.norm(w_p * t.grad - BETA * w_k * (1.0 - np.exp(dk))))
    off2, _, _ = LR.drop_tokens(keep, off)
    kept_t = LR.PolicyTerms(
        term=t.term[keep], grad=None, ratio=t.ratio[keep],
        flags={k: v[keep] for k, v in t.flags.items()},
        values={k: v[keep] for k, v in t.values.items()},
    )  # fmt: skip
    metrics = {
        **LR.loss_metrics(kept_t, off2, logged_metrics("verl/bypass_mode", bypass_loss_type=kind)),
        **corr.metrics,
    }
    flags = ["--loss", "verl/bypass_mode", "--agg", agg, "--loss-param",
             f"bypass_loss_type={kind}", "--gradient"]  # fmt: skip
    for k, v in rc.items():
        flags += ["--loss-param", f"{k}={'off' if v is None else v}"]
    for path in (_parquet(tmp_path / "b.parquet", d, rows=3), _npz(tmp_path / "b.npz", d)):
        doc = cli.json("objective", path, *flags)
        assert close(doc["objective"], want), (path.suffix, doc["objective"], want)
        assert close(doc["gradient"]["norm"], grad, 1e-9), (doc["gradient"], grad)
        assert doc["counts"]["tokens"] == off[-1] and doc["counts"]["answers"] == n
        got = doc["loss_metrics"]
        for k, v in metrics.items():
            if not _spread(k):
                assert close(got[k], v, 1e-9), (k, got[k], v)
        assert any("bypass mode" in w for w in doc["warnings"])


def test_bypass_mode_settings_and_config() -> None:
    with pytest.raises(SettingError, match=r"^correction: verl-rollout: verl/bypass_mode"):
        Settings(trainer="verl", loss="verl/bypass_mode", correction="verl-rollout")
    with pytest.raises(SettingError, match=r"^bypass_loss_type: "):
        Settings(loss="verl/bypass_mode", loss_params=LVR.BypassParams(bypass_loss_type="nope"))
    rc = "algorithm.rollout_correction."
    out, notes = verl.from_config({
        rc + "bypass_mode": True, rc + "loss_type": "reinforce", rc + "rollout_is": "token",
        rc + "rollout_rs": "seq_max_k2", rc + "rollout_rs_threshold": 0.5,
    })  # fmt: skip
    assert out == {
        "loss": "verl/bypass_mode", "bypass_loss_type": "reinforce", "rollout_is": "token",
        "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.5,
    } and not notes  # fmt: skip
    resolve_settings(None, trainer="verl", **out)
    # the threshold of a rejection that is off is not read (verl ignores it too)
    out, _ = verl.from_config({rc + "rollout_rs_threshold": 2.0, rc + "rollout_is": "token"})
    assert "rollout_rs_threshold" not in out
    resolve_settings(None, trainer="verl", **out)


def test_a_rejection_of_every_token(cli: Cli, tmp_path: Path) -> None:
    """Decoupled: nothing is left for the loss (verl's would divide by 0): one line, exit
    2. Bypass: the policy loss is 0 over every token and its metrics are verl's masked
    means over no token, 0 (not null)."""
    p = str(_parquet(tmp_path / "all.parquet", _data(), rows=5))
    rs = ["rollout_rs=seq_max_k2", "rollout_rs_threshold=1e-9"]
    cli.error(["objective", p, "--correction", "verl-rollout", "--correction-param", rs[0],
               "--correction-param", rs[1]], "rejected every token")  # fmt: skip
    doc = cli.json("objective", p, "--loss", "verl/bypass_mode", "--loss-param", rs[0],
                   "--loss-param", rs[1], "--beta", "0")  # fmt: skip
    assert doc["objective"] == 0.0 and doc["loss_metrics"]["actor/pg_clipfrac"] == 0.0
    assert doc["loss_metrics"]["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1.0)


def test_explain_names_the_rejection_and_bypass_mode(cli: Cli, tmp_path: Path) -> None:
    p = str(_parquet(tmp_path / "e.parquet", _data(), rows=100))
    rs = ["rollout_rs=token_k1", "rollout_rs_threshold=0.5_2.0"]

    def followed(*flags: str) -> str:
        doc = cli.json("explain", p, *flags)
        found = [f for f in doc["findings"] if f["id"] == "loss-followed"]
        return str(found[0]["message"])

    msg = followed("--correction", "verl-rollout", "--correction-param", rs[0],
                   "--correction-param", rs[1])  # fmt: skip
    assert "rollout IS weights" in msg and "rejection sampling (token_k1)" in msg
    msg = followed("--loss", "verl/bypass_mode", "--loss-param", rs[0], "--loss-param", rs[1])
    assert "bypass mode" in msg and "ppo_clip" in msg and "(token_k1)" in msg


@pytest.mark.parametrize("fmt", ["parquet-bool", "parquet-int", "npz-bool", "jsonl"])
def test_the_entropy_mask_weighs_the_policy_term(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """TRL's top_entropy_quantile: the policy term times the recorded entropy_mask (0/1,
    booleans or integers), the KL term and every count over all tokens; read from each
    format; a value other than 0/1 and a missing column are one line each."""
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    d = _data(seed=5)
    rng = np.random.default_rng(6)
    em = [rng.random(k) < 0.6 for k in d["lengths"]]
    f, off = _flat(d)
    w = np.concatenate(em).astype(float)
    dk = f["ref_logp"] - f["logp"]
    kl = np.exp(dk) - dk - 1.0
    policy = _clip_policy(f, _advantages(d), off) * w
    want = _agg(policy, off, "token-mean") - BETA * _agg(kl, off, "token-mean")
    if fmt.startswith("parquet"):
        path = _parquet(tmp_path / "m.parquet", d, rows=3)
        t = pq.read_table(path)
        typ = pa.bool_() if fmt == "parquet-bool" else pa.int8()
        vals = [e.tolist() if typ == pa.bool_() else e.astype(int).tolist() for e in em]
        pq.write_table(t.append_column("entropy_mask", pa.array(vals, type=pa.list_(typ))), path,
                       row_group_size=3)  # fmt: skip
    elif fmt == "npz-bool":
        path = _npz(tmp_path / "m.npz", d)
        arrays = dict(np.load(path))
        arrays["entropy_mask"] = pad([e.astype(float) for e in em], arrays["mask"].shape[1],
                                     fill=0.0).astype(bool)  # fmt: skip
        np.savez(path, **arrays)
    else:
        path = tmp_path / "m.jsonl"
        with path.open("w") as fh:
            for i in range(len(d["reward"])):
                row = {k: d[k][i].tolist() for k in FIELDS}
                row |= {"group": int(d["group"][i]), "reward": float(d["reward"][i]),
                        "entropy_mask": em[i].tolist()}  # fmt: skip
                fh.write(json.dumps(row) + "\n")
    flags = ["--agg", "token-mean", "--loss-param", "entropy_mask=true"]
    doc = cli.json("objective", path, *flags)
    assert close(doc["objective"], want), (doc["objective"], want)
    assert doc["counts"]["tokens"] == off[-1]
    if fmt == "parquet-int":
        t = pq.read_table(path)
        bad = [[2, *e.astype(int).tolist()[1:]] for e in em]
        t = t.set_column(t.column_names.index("entropy_mask"), "entropy_mask",
                         pa.array(bad, type=pa.list_(pa.int8())))  # fmt: skip
        pq.write_table(t, tmp_path / "bad.parquet")
        cli.error(["objective", str(tmp_path / "bad.parquet"), *flags],
                  "column 'entropy_mask' holds 2")  # fmt: skip
        plain = _parquet(tmp_path / "plain.parquet", d, rows=3)
        cli.error(["objective", str(plain), *flags], "no entropy_mask column")


def _answers(cli: Cli, path: Path, sort: str, n: int, *flags: str) -> dict[int, dict[str, Any]]:
    doc = cli.json("answers", path, "--sort", sort, "--top", str(n), "--beta", "0", *flags)
    return {int(r["row"]): r for r in doc["answers"]}


def _shares(g: np.ndarray, off: np.ndarray, per_answer_mean: bool) -> np.ndarray:
    """Each answer's part of ‖∂J/∂logp‖² (β = 0) as a share of the whole: the token
    weight 1/|o_i| under an answer mean, else one constant (it cancels)."""
    lens = np.diff(off)
    w = np.repeat(1.0 / lens, lens) if per_answer_mean else np.ones(off[-1])
    parts = np.add.reduceat((w * g) ** 2, off[:-1])
    return np.asarray(parts / parts.sum())


@pytest.mark.parametrize("case", ["verl/cispo", "rejection", "bypass"])
def test_answers_rank_by_the_loss_s_own_clip_and_gradient(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """``answers`` under another loss: clip_share is the loss's own clipped tokens (verl
    cispo's clipped weights; the surrogate's over the tokens a rejection kept; bypass's
    clip region against rollout_logp over its kept tokens) and gradient_share the loss's
    policy gradient, by hand from the loss's function on the whole batch."""
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    d = _data(seed=11)
    f, off = _flat(d)
    a = _advantages(d)
    n, lens = len(a), np.diff(off)
    path = _parquet(tmp_path / "a.parquet", d, rows=3)
    if case == "verl/cispo":
        t = LT.cispo_terms(f["logp"], f["old_logp"], a, off, lower=0.8, upper=1.2,
                          log_ratio_clamp=20.0)  # fmt: skip
        assert t.grad is not None
        clip = np.add.reduceat(t.flags["clipped"].astype(float), off[:-1]) / lens
        share = _shares(t.grad, off, True)
        flags = ["--loss", "verl/cispo"]
    elif case == "rejection":
        rc = REJECTIONS["token_k1+is"]
        corr = LVR.verl_rollout_correction(f["old_logp"], f["rollout_logp"], off, **rc)
        keep = corr.keep
        rho = np.exp(f["logp"] - f["old_logp"])
        at = np.repeat(a, lens)
        clipped = (((at > 0) & (rho > 1.2)) | ((at < 0) & (rho < 0.8))) & keep
        clip = np.add.reduceat(clipped.astype(float), off[:-1]) / lens
        inside = np.where((rho * at) <= (np.clip(rho, 0.8, 1.2) * at), rho * at, 0.0)
        g = np.where(inside != 0.0, rho * at, 0.0) * corr.weight * keep  # ∂min/∂logp
        share = _shares(g, off, False)
        flags = [*_rejection_flags(rc), "--agg", "token-mean"]
    else:
        rc = dict(BYPASS["ppo_clip+token_k1"])
        del rc["bypass_loss_type"]
        rc["rollout_rs_threshold"] = "0.7_1.4"  # wider than the clip: kept tokens clip
        t, corr = LVR.verl_bypass_mode(f["logp"], f["rollout_logp"], a, off, **rc)
        assert t.grad is not None
        keep = corr.keep
        clip = np.add.reduceat((t.flags["region"] & keep).astype(float), off[:-1]) / lens
        kept = np.add.reduceat(keep.astype(float), off[:-1])
        stretch = np.repeat(np.divide(lens, kept, out=np.zeros(n), where=kept > 0), lens)
        share = _shares(t.grad * keep * stretch, off, True)
        flags = ["--loss", "verl/bypass_mode"]
        for k, v in rc.items():
            flags += ["--loss-param", f"{k}={v}"]
    assert clip.max() > 0 and share.max() < 1
    for sort, want in (("clip", clip), ("gradient", share)):
        rows = _answers(cli, path, sort, 5, *flags)
        top = np.lexsort((np.arange(n), -want))[:5]
        assert sorted(rows) == sorted(top.tolist()), (sort, sorted(rows), top)
        key = "clip_share" if sort == "clip" else "gradient_share"
        for i, r in rows.items():
            assert close(r[key], float(want[i]), 1e-9), (sort, i, r[key], want[i])


def test_answers_under_rejection_say_what_is_approximate(cli: Cli, tmp_path: Path) -> None:
    """Policy and KL aggregations of two kinds under rejection: the ratio of their constants
    is the unrejected input's, and answers says so (of one kind: nothing to say)."""
    p = _parquet(tmp_path / "w.parquet", _data(seed=11), rows=100)
    flags = [*_rejection_flags(REJECTIONS["token_k1+is"]), "--sort", "gradient"]
    doc = cli.json("answers", p, *flags, "--kl-agg", "token-mean")
    assert any("unrejected input" in w for w in doc["warnings"])
    doc = cli.json("answers", p, *flags)
    assert not any("unrejected input" in w for w in doc["warnings"])


def test_rejection_settings_are_checked(cli: Cli, tmp_path: Path) -> None:
    with pytest.raises(SettingError, match=r"^rollout_rs: .*verl-rollout"):
        resolve_settings(None, rollout_rs="token_k1", rollout_rs_threshold=2.0)
    with pytest.raises(SettingError, match=r"^rollout_rs: expected one of .*got 'token_k4'"):
        resolve_settings(
            None, correction="verl-rollout", rollout_rs="token_k4", rollout_rs_threshold=2.0
        )
    with pytest.raises(SettingError, match=r"^rollout_rs_threshold: required"):
        Settings(
            correction="verl-rollout", correction_params=LVR.RolloutParams(rollout_rs="token_k1")
        )
    with pytest.raises(SettingError, match=r"^rollout_rs_threshold: needs rollout_rs"):
        LVR.RolloutParams(rollout_rs_threshold=2.0)
    p = str(_parquet(tmp_path / "b.parquet", _data(), rows=100))
    cli.error(["objective", p, "--correction", "verl-rollout", "--correction-param",
               "rollout_rs=seq_sum_k2", "--correction-param", "rollout_rs_threshold=1_2"],
              "cannot read '1_2' for seq_sum_k2")  # fmt: skip
    # a band is a band, not the number Python reads in it (float('1_2') == 12)
    cli.error(["objective", p, "--correction", "verl-rollout", "--correction-param",
               "rollout_is_threshold=3_2"], "rollout_is_threshold")  # fmt: skip


def test_a_correction_without_rollout_logp_names_the_column(cli: Cli, tmp_path: Path) -> None:
    d = _data()
    cols = {"group": pa.array(d["group"]), "reward": pa.array(d["reward"])}
    for f in ("logp", "old_logp"):
        cols[f] = pa.array([r.tolist() for r in d[f]], type=pa.list_(pa.float64()))
    pq.write_table(pa.table(cols), tmp_path / "n.parquet")
    cli.error(["objective", str(tmp_path / "n.parquet"), "--beta", "0", "--correction",
               "trl-vllm"], "no rollout_logp column")  # fmt: skip


# --------------------------------------------------------------------- settings
def test_names_map_one_to_one_and_the_trainer_disambiguates() -> None:
    assert resolve_settings("trl", loss="cispo").loss == "trl/cispo"
    assert resolve_settings("verl", loss="cispo").loss == "verl/cispo"
    assert resolve_settings(loss="verl/cispo").loss == "verl/cispo"
    assert resolve_settings(loss="gpg").loss == "verl/gpg"  # one trainer has it
    assert resolve_settings("slime", loss="cispo").loss == "slime/cispo"
    assert resolve_settings("prime-rl", loss="dppo_tv").loss == "prime_rl/dppo_tv"
    assert resolve_settings(loss="ipo").loss == "prime_rl/ipo"
    assert resolve_settings(loss="ppo_eps_clip").loss == "slime/ppo_eps_clip"
    with pytest.raises(SettingError, match="verl/dppo_tv or prime_rl/dppo_tv"):
        resolve_settings(loss="dppo_tv")
    with pytest.raises(SettingError, match="trl/sapo or verl/sapo"):
        resolve_settings(loss="sapo")
    with pytest.raises(SettingError, match=r"^loss: trl/cispo is trl's"):
        resolve_settings("verl", loss="trl/cispo")
    # a loss forcing its aggregation sets it; verl's KL keeps loss_agg_mode
    s = resolve_settings("verl", loss="sapo")
    assert s.agg == "seq-mean-token-mean" and s.kl_agg == "token-mean"
    with pytest.raises(SettingError, match=r"^agg: "):
        resolve_settings("trl", loss="sapo", agg="token-mean")
    with pytest.raises(SettingError, match=r"^ratio_level: "):
        Settings(loss="verl/dppo_tv", ratio_level="sequence")
    with pytest.raises(SettingError, match=r"^dro_beta: "):
        Settings(loss="verl/dro")
    with pytest.raises(SettingError, match=r"^correction: "):
        Settings(trainer="verl", correction="trl-vllm")
    assert CORRECTION_NAMES == ("none", "trl-vllm", "verl-rollout", "openrlhf-is", "slime-tis")
    assert [r.name for r in ROWS.values() if r.whole_batch] == list(BATCH_LOSSES)
    # the JSON settings gain keys after the existing ones, "from" still last
    keys = list(Settings().to_json())
    assert keys.index("norm_scale") < keys.index("loss") < keys.index("correction")
    assert keys[-1] == "from" and Settings().to_json()["loss"] == "clip"


def test_bad_values_are_one_line(cli: Cli, tmp_path: Path) -> None:
    p = str(_parquet(tmp_path / "b.parquet", _data(), rows=100))
    cli.error(["objective", p, "--loss", "nope"], "--loss: 'nope' is not one of clip")
    cli.error(["objective", p, "--loss", "cispo"], "--loss: 'cispo' is trl/cispo or verl/cispo")
    cli.error(["objective", p, "--loss-param", "tau=1"], "--loss-param: 'tau' is not one of")
    cli.error(["objective", p, "--loss", "trl/sapo", "--loss-param", "sapo_temperature_pos=x"],
              "--loss-param sapo_temperature_pos: expected a number")  # fmt: skip
    cli.error(["objective", p, "--loss", "trl/sapo", "--loss-param", "sapo_temperature_pos=0"],
              "--loss-param sapo_temperature_pos: must be a finite number > 0")  # fmt: skip
    cli.error(["objective", p, "--correction", "x"], "--correction: 'x' is not one of")


def test_from_config_maps_each_trainer_s_keys() -> None:
    out, notes = trl.from_config({
        "loss_type": "sapo", "sapo_temperature_pos": 0.7, "use_vllm": True,
        "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode":
        "token_truncate", "vllm_importance_sampling_cap": 2.0,
    })  # fmt: skip
    assert out["loss"] == "trl/sapo" and out["sapo_temperature_pos"] == 0.7 and not notes
    assert out["correction"] == "trl-vllm" and out["vllm_is_clip_max"] == 2.0
    a = "actor_rollout_ref.actor."
    out, notes = verl.from_config({
        a + "policy_loss.loss_mode": "kl_cov", a + "policy_loss.kl_cov_ratio": 0.01,
        "algorithm.rollout_correction.rollout_is": "token",
        "algorithm.rollout_correction.rollout_is_threshold": 3.0,
    })  # fmt: skip
    assert out["loss"] == "verl/kl_cov" and out["kl_cov_ratio"] == 0.01 and not notes
    assert out["correction"] == "verl-rollout" and out["rollout_is"] == "token"
    rc = "algorithm.rollout_correction."
    out, notes = verl.from_config(
        {rc + "rollout_rs": "token_k1,seq_max_k2", rc + "rollout_rs_threshold": "0.5_2.0,0.3"}
    )
    assert (out["correction"], out["rollout_is"], out["rollout_rs"]) == (
        "verl-rollout", None, "token_k1,seq_max_k2"
    ) and out["rollout_rs_threshold"] == "0.5_2.0,0.3" and not notes  # fmt: skip
    resolve_settings(None, **out)  # they make settings
    out, notes = openrlhf.from_config({
        "algo.advantage.is_correction_level": "seq", "algo.advantage.is_correction_threshold": [4.0]
    })  # fmt: skip
    assert out["correction"] == "openrlhf-is" and (out["is_correction_low"], out[
        "is_correction_high"]) == (0.0, 4.0) and not notes  # fmt: skip
    # what TRL's loss adds that grpo-cli does not compute is said, never silently left out:
    # the adaptive entropy coefficient (a static one is applied: tests/test_recorded.py)
    _, notes = trl.from_config({"entropy_coef": 0.01, "use_adaptive_entropy": True})
    assert any("use_adaptive_entropy" in n and "not applied" in n for n in notes)
    assert trl.from_config({"entropy_coef": 0.01}) == ({}, [])
    assert trl.entropy_coef({"entropy_coef": 0.01}) == 0.01
    assert trl.entropy_coef({"entropy_coef": 0.01, "use_adaptive_entropy": True}) is None


# ------------------------------------------------------------ the real oracle: TRL
def _close(ours: float, logged: float) -> bool:  # tests/test_recorded.py's tolerance
    return abs(ours - logged) <= 1e-6 or abs(ours - logged) <= 1e-5 * max(abs(logged), abs(ours))


@pytest.mark.parametrize("name", ["cispo", "sapo"])
def test_a_trl_run_with_its_own_loss_is_reproduced_with_no_flags(
    cli: Cli, trl_run: Any, name: str
) -> None:
    run = trl_run(name)
    compared: set[str] = set()
    for step, record in step_records(run.log_history).items():
        doc = cli.json("objective", run.directory / f"step_{step:06d}")
        assert doc["settings"]["loss"] == f"trl/{name}", doc["warnings"]
        assert not any("not computed" in w for w in doc["warnings"]), doc["warnings"]
        ours = doc["trainer_metrics"]["metrics"]
        bad = [f"step {step} {k}: ours {ours[k]!r}, logged {v!r}" for k, v in record.items()
               if k in ours and not _close(ours[k], v)]  # fmt: skip
        assert not bad, "\n".join(bad)
        assert not any(k.startswith("clip_ratio/") for k in ours)
        compared |= {k for k in record if k in ours}
    assert "loss" in compared
    if name == "cispo":
        assert "cispo_clip_ratio" in compared
        ratios = [r["cispo_clip_ratio"] for r in step_records(run.log_history).values()]
        assert any(0 < x < 1 for x in ratios), ratios  # the cap binds on some tokens only
    else:
        assert "kl" in compared


# ------------------------------------------------------------- explain and check
def test_explain_names_the_loss_and_the_release(cli: Cli, tmp_path: Path) -> None:
    p = str(_parquet(tmp_path / "b.parquet", _data(), rows=100))
    doc = cli.json("explain", p, "--preset", "verl", "--loss", "dppo_tv")
    f = next(x for x in doc["findings"] if x["id"] == "loss-followed")
    assert "DPPO-TV" in f["message"] and "verl 0.9.1" in f["message"]
    assert f["evidence"]["loss"] == "verl/dppo_tv" and f["evidence"]["preset"] == "verl"
    plain = cli.json("explain", p)  # the seed's surrogate, no trainer: nothing to say
    assert not any(x["id"] == "loss-followed" for x in plain["findings"])


def test_the_clip_rule_reads_the_loss_s_own_clip_metric(cli: Cli, tmp_path: Path) -> None:
    p = str(_parquet(tmp_path / "b.parquet", _data(), rows=100))

    def clip_rule(*flags: str) -> dict[str, Any]:
        r = cli("check", p, "--format", "json", *flags)
        return next(x for x in json.loads(r.stdout)["results"] if x["rule"] == "clip-region")

    obj = cli.json("objective", p, "--loss", "trl/cispo", "--clip-eps-high", "1.1")
    rule = clip_rule("--loss", "trl/cispo", "--clip-eps-high", "1.1")
    assert rule["value"] == obj["loss_metrics"]["cispo_clip_ratio"] > 0
    assert "cispo_clip_ratio" in rule["message"]
    sapo = clip_rule("--loss", "trl/sapo")
    assert sapo["status"] == "skip" and "does not apply" in sapo["message"]
    geo = clip_rule("--loss", "verl/geo_mean")
    m = cli.json("objective", p, "--loss", "verl/geo_mean")["loss_metrics"]
    assert geo["value"] == m["actor/pg_clipfrac"] + m["actor/pg_clipfrac_lower"]


def test_the_one_screen_shows_the_loss_s_own_clip_share(cli: Cli) -> None:
    """With a loss other than the clipped surrogate the screen's clip line is the loss's
    own share (CISPO: its logged cispo_clip_ratio), or says it clips nothing (SAPO)."""
    sample = Path(__file__).resolve().parents[1] / "sample_data" / "batch.parquet"
    doc = cli.json("objective", sample, "--preset", "trl", "--loss", "cispo")
    share = doc["trainer_metrics"]["metrics"]["cispo_clip_ratio"]
    screen = cli("objective", sample, "--preset", "trl", "--loss", "cispo").stdout
    assert "clipped by the loss" in screen and f"{100 * share:.3g}%" in screen
    assert "clip region" not in screen
    screen = cli("objective", sample, "--preset", "trl", "--loss", "sapo").stdout
    assert "clipped by the loss" in screen and "none (no clip)" in screen
