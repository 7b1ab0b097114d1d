"""Conformance suite: each preset against the trainer's own code, on the same rollouts.

Runs in its own environment (``conformance/run``), where verl 0.9.1, TRL 1.16.0 and
OpenRLHF 0.11.2 are installed beside torch (CPU) and grpo-cli. For every configuration a
preset claims, it calls the trainer's functions on padded tensors (float64, so that what
is compared is the formula, not float32 rounding) and runs ``grpo-cli ... --json`` on the
same rollouts written as parquet, then compares:

- verl: ``compute_grpo_outcome_advantage``, ``compute_policy_loss_vanilla`` and
  ``compute_policy_loss_gspo`` (their metrics too), ``kl_penalty``, ``agg_loss`` — called
  as imported;
- TRL: ``GRPOTrainer._compute_loss`` on given log-probs (the model call replaced by the
  log-probs, the trainer object holding only the attributes the method reads), its logged
  ``clip_ratio/*`` metrics; advantages with TRL's ``nanstd`` and the two lines of
  ``_generate_and_score_completions`` that use it (that method needs a model and reward
  functions);
- OpenRLHF: ``PolicyLoss``, ``compute_approx_kl``, ``aggregate_loss`` and
  ``RemoteExperienceMaker.compute_advantages_and_returns``. OpenRLHF's package
  ``__init__``s import DeepSpeed and the Ray actors, so its modules are loaded without
  them (:func:`load_openrlhf`); the code that runs is OpenRLHF's.

Usage: ``python conformance/oracle.py [--markdown FILE] [--page FILE | --check-page FILE]``
(the summary table lives in docs/conformance.md). Prints one row per comparison
and ``N passed, M failed``; exit 1 when anything differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import subprocess
import sys
import tempfile
import types
import warnings
from collections import defaultdict
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

# verl's trainer module announces the engines this machine lacks (GPU stacks): not ours
warnings.filterwarnings("ignore", message=r".*engine is not available")
logging.getLogger().setLevel(logging.ERROR)

REL = 1e-9  # float64 on both sides: what differs is only the order of additions
ABS = 1e-12
# The trainers take fractions as means of float32 masks (``.float()``), so a clip metric
# carries float32 rounding: 6e-8 relative.
METRIC = 1e-6
# verl's and OpenRLHF's per-answer token mean divides by |o_i| + 1e-8: a relative effect of
# at most 1e-8 that grpo-cli, dividing by |o_i|, does not copy.
SEQ_MEAN = 1e-7
VERL_METRICS = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")
TRL_METRICS = (
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
)


# ----------------------------------------------------------------------- the data
@dataclass
class Rollouts:
    """Ragged rollouts, padded for the trainers: (B, L) tensors, mask, per-answer fields."""

    group: list[str]
    reward: np.ndarray  # (B,)
    logp: np.ndarray  # (B, L), padding 0
    old: np.ndarray
    ref: np.ndarray
    mask: np.ndarray  # (B, L) bool

    def t(self, name: str) -> torch.Tensor:
        return torch.tensor(getattr(self, name), dtype=torch.float64)

    @property
    def m(self) -> torch.Tensor:
        return torch.tensor(self.mask)

    def write(self, path: Path) -> Path:
        rows = [self.mask[i].nonzero()[0] for i in range(len(self.group))]
        table = pa.table(
            {
                "group": self.group,
                "reward": self.reward,
                "logp": [self.logp[i, r].tolist() for i, r in enumerate(rows)],
                "old_logp": [self.old[i, r].tolist() for i, r in enumerate(rows)],
                "ref_logp": [self.ref[i, r].tolist() for i, r in enumerate(rows)],
            }
        )
        pq.write_table(table, path)
        return path


def make_rollouts(seed: int, group_sizes: list[int], *, shuffle: bool) -> Rollouts:
    """Ragged lengths 1–60, binary and graded rewards, a zero-variance group, a token
    beyond the ±20 clamp, ratios beyond the dual clip, an answer with mean log-ratio > 10."""
    rng = np.random.default_rng(seed)
    group = [f"p{g}" for g, size in enumerate(group_sizes) for _ in range(size)]
    B = len(group)
    reward = rng.choice([0.0, 0.25, 1.0], size=B)
    first = 0
    for size in group_sizes:  # the second group of two or more: all rewards equal
        if size > 1 and first > 0:
            reward[first : first + size] = 0.7
            break
        first += size
    lengths = rng.integers(1, 61, size=B)
    lengths[0], lengths[1] = 1, 60
    L = int(lengths.max())
    mask = np.arange(L)[None, :] < lengths[:, None]
    old = -rng.exponential(1.0, size=(B, L))
    logp = old + rng.normal(0.0, 0.3, size=(B, L))
    ref = old + rng.normal(0.0, 0.3, size=(B, L))
    logp[2, 0] = old[2, 0] + 25.0  # beyond verl's and OpenRLHF's ±20 clamp
    logp[3, : lengths[3]] = old[3, : lengths[3]] + 1.5  # ratio e^1.5 > 3 on every token
    logp[4, : lengths[4]] = old[4, : lengths[4]] + 11.0  # mean log-ratio 11 > 10
    ref[5, 0] = logp[5, 0] + 12.0  # k3 = e^12 − 13: the ±10 KL clamps bite
    for a in (logp, old, ref):
        a[~mask] = 0.0
    if shuffle:  # groups need not be adjacent
        order = rng.permutation(B)
        group = [group[i] for i in order]
        reward, logp, old, ref, mask = (x[order] for x in (reward, logp, old, ref, mask))
    return Rollouts(group, reward, logp, old, ref, mask)


# ---------------------------------------------------------------------- comparing
@dataclass
class Row:
    trainer: str
    config: str
    flags: str
    quantity: str
    theirs: float
    ours: float
    rel: float

    @property
    def ok(self) -> bool:
        return abs(self.theirs - self.ours) <= self.rel * abs(self.theirs) + ABS


class Suite:
    def __init__(self, workdir: Path) -> None:
        self.rows: list[Row] = []
        self.workdir = workdir
        # by id, holding the data too: an id is only unique while its object lives, and a
        # freed Rollouts' id reused by a new one made grpo-cli read the older file (a flaky
        # openrlhf mismatch in CI)
        self.files: dict[int, tuple[Rollouts, Path]] = {}

    def grpo_cli(self, command: str, data: Rollouts, flags: str) -> dict[str, Any]:
        known = self.files.get(id(data))
        if known is not None and known[0] is data:
            path = known[1]
        else:
            path = data.write(self.workdir / f"rollouts{len(self.files)}.parquet")
            self.files[id(data)] = (data, path)
        cmd = [sys.executable, "-m", "grpo_cli", command, str(path), *flags.split(), "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"grpo-cli failed: {' '.join(cmd)}\n{out.stderr}")
        doc: dict[str, Any] = json.loads(out.stdout)
        return doc

    def compare(
        self,
        trainer: str,
        config: str,
        flags: str,
        pairs: dict[str, tuple[float, float]],
        rel: float = REL,
    ) -> None:
        for quantity, (theirs, ours) in pairs.items():
            self.rows.append(Row(trainer, config, flags, quantity, float(theirs), ours, rel))


def max_rel_diff(theirs: np.ndarray, ours: np.ndarray) -> float:
    """0 when equal to REL; reported as (theirs, ours) = (0, diff/scale)."""
    scale = max(float(np.abs(theirs).max()), 1e-300)
    return float(np.abs(theirs - ours).max()) / scale


# ------------------------------------------------------------------------- verl
def check_verl(s: Suite) -> None:
    import verl.trainer.ppo.core_algos as ca
    from verl.workers.config import ActorConfig

    data = make_rollouts(11, [4, 4, 3, 1, 5, 4, 2, 4], shuffle=True)
    B, L = data.mask.shape
    m = data.m
    token_rewards = torch.zeros(B, L, dtype=torch.float64)
    last = data.mask.sum(1) - 1
    token_rewards[torch.arange(B), torch.tensor(last)] = torch.tensor(data.reward)
    index = np.array(data.group, dtype=object)

    def advantages(norm: bool) -> torch.Tensor:
        adv, _ = ca.compute_grpo_outcome_advantage(
            token_rewards, m, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm
        )
        return adv

    for norm, flags in ((True, "--preset verl"), (False, "--preset verl --scale none")):
        theirs = advantages(norm)[torch.arange(B), 0].numpy()
        ours = np.array(s.grpo_cli("advantages", data, flags)["advantages"])
        s.compare(
            "verl",
            f"compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo={norm})",
            flags,
            {"advantages: max relative difference": (0.0, max_rel_diff(theirs, ours))},
        )
    adv = advantages(True)
    logp, old, ref = data.t("logp"), data.t("old"), data.t("ref")

    def actor(low: float, high: float, agg: str) -> ActorConfig:
        return ActorConfig(
            strategy="fsdp",
            ppo_mini_batch_size=B,
            ppo_micro_batch_size_per_gpu=B,
            clip_ratio=low,
            clip_ratio_low=low,
            clip_ratio_high=high,
            loss_agg_mode=agg,
            use_dynamic_bsz=False,
            rollout_n=1,
        )

    def kl_loss(kind: str, agg: str) -> float:
        kld = ca.kl_penalty(logp, ref, kl_penalty=kind)
        return float(ca.agg_loss(loss_mat=kld, loss_mask=m, loss_agg_mode=agg))

    aggs = [
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-sum",
    ]
    for agg in aggs:
        pg_loss, metrics = ca.compute_policy_loss_vanilla(
            old, logp, adv, m, loss_agg_mode=agg, config=actor(0.2, 0.2, agg)
        )
        loss = float(pg_loss) + 0.001 * kl_loss("low_var_kl", agg)
        flags = f"--preset verl --agg {agg}"
        doc = s.grpo_cli("objective", data, flags)
        s.compare(
            "verl",
            f"vanilla + low_var_kl, loss_agg_mode={agg}",
            flags,
            {"loss": (loss, doc["loss"])},
            rel=SEQ_MEAN if agg == "seq-mean-token-mean" else REL,
        )
        tm = doc["trainer_metrics"]["metrics"]
        s.compare(
            "verl",
            f"vanilla + low_var_kl, loss_agg_mode={agg}",
            flags,
            {
                "actor/pg_loss": (float(pg_loss), tm["actor/pg_loss"]),
                "actor/kl_loss": (kl_loss("low_var_kl", agg), tm["actor/kl_loss"]),
            },
            rel=SEQ_MEAN if agg == "seq-mean-token-mean" else REL,
        )
        s.compare(
            "verl",
            f"vanilla + low_var_kl, loss_agg_mode={agg}",
            flags,
            {k: (metrics[k], tm[k]) for k in VERL_METRICS},
            rel=METRIC,
        )
    for kind, est in (("kl", "k1"), ("mse", "k2")):
        pg_loss, _ = ca.compute_policy_loss_vanilla(
            old, logp, adv, m, loss_agg_mode="token-mean", config=actor(0.2, 0.2, "token-mean")
        )
        loss = float(pg_loss) + 0.001 * kl_loss(kind, "token-mean")
        flags = f"--preset verl --kl-estimator {est}"
        doc = s.grpo_cli("objective", data, flags)
        s.compare("verl", f"vanilla + kl_loss_type={kind}", flags, {"loss": (loss, doc["loss"])})
    for agg in ("token-mean", "seq-mean-token-mean"):
        pg_loss, metrics = ca.compute_policy_loss_gspo(
            old, logp, adv, m, loss_agg_mode=agg, config=actor(3e-4, 4e-4, agg)
        )
        loss = float(pg_loss) + 0.001 * kl_loss("low_var_kl", agg)
        flags = (
            f"--preset verl --ratio-level sequence --clip-eps 3e-4 --clip-eps-high 4e-4 --agg {agg}"
        )
        doc = s.grpo_cli("objective", data, flags)
        config = f"gspo + low_var_kl, loss_agg_mode={agg}"
        rel = SEQ_MEAN if agg == "seq-mean-token-mean" else REL
        s.compare("verl", config, flags, {"loss": (loss, doc["loss"])}, rel=rel)
        tm = doc["trainer_metrics"]["metrics"]
        s.compare("verl", config, flags, {k: (metrics[k], tm[k]) for k in VERL_METRICS}, METRIC)
    # use_kl_in_reward: apply_kl_penalty (ray_trainer) on the token rewards, then the
    # grpo advantages of the summed scores, then the vanilla loss (no KL loss)
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": token_rewards,
            "old_log_probs": old,
            "ref_log_prob": ref,
            "response_mask": m.double(),
        }
    )
    batch, kl_metrics = apply_kl_penalty(batch, ca.FixedKLController(0.05), kl_penalty="kl")
    adv_r, _ = ca.compute_grpo_outcome_advantage(
        batch.batch["token_level_rewards"], m, index, epsilon=1e-6
    )
    pg_loss, metrics = ca.compute_policy_loss_vanilla(
        old, logp, adv_r, m, loss_agg_mode="token-mean", config=actor(0.2, 0.2, "token-mean")
    )
    flags = "--preset verl --kl-mode reward --beta 0.05"
    doc = s.grpo_cli("objective", data, flags)
    tm = doc["trainer_metrics"]["metrics"]
    config = "use_kl_in_reward: apply_kl_penalty(kl), compute_grpo_outcome_advantage, vanilla"
    s.compare("verl", config, flags, {"loss": (float(pg_loss), doc["loss"])})
    s.compare(
        "verl",
        config,
        flags,
        {
            **{k: (metrics[k], tm[k]) for k in VERL_METRICS},
            "actor/reward_kl_penalty": (
                kl_metrics["actor/reward_kl_penalty"],
                tm["actor/reward_kl_penalty"],
            ),
        },
        METRIC,
    )
    pg_loss, metrics = ca.compute_policy_loss_vanilla(
        old, logp, adv, m, loss_agg_mode="token-mean", config=actor(0.2, 0.28, "token-mean")
    )
    doc = s.grpo_cli("objective", data, "--preset dapo")
    config = "DAPO recipe: vanilla, clip_ratio_low 0.2, clip_ratio_high 0.28, no KL loss"
    s.compare("verl", config, "--preset dapo", {"loss": (float(pg_loss), doc["loss"])})
    tm = doc["trainer_metrics"]["metrics"]
    s.compare(
        "verl", config, "--preset dapo", {k: (metrics[k], tm[k]) for k in VERL_METRICS}, METRIC
    )


# -------------------------------------------------------------------------- TRL
def trl_loss(
    data: Rollouts,
    adv: torch.Tensor,
    *,
    loss_type: str,
    beta: float = 0.0,
    eps: tuple[float, float] = (0.2, 0.2),
    level: str = "token",
    bias_correction: bool = True,
    delta: float | None = None,
    max_completion_length: int = 512,
) -> tuple[float, dict[str, float]]:
    """TRL's ``GRPOTrainer._compute_loss`` (eval mode: no gradient-accumulation scaling)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    B, L = data.mask.shape
    logp = data.t("logp")

    class Accelerator:
        num_processes = 1

        def gather(self, x: torch.Tensor) -> torch.Tensor:
            return x

        def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
            return x

        def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
            return x

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    attrs: dict[str, Any] = {
        "model": types.SimpleNamespace(training=False),
        "accelerator": Accelerator(),
        "args": types.SimpleNamespace(use_bias_correction_kl=bias_correction, delta=delta),
        "beta": beta,
        "loss_type": loss_type,
        "epsilon_low": eps[0],
        "epsilon_high": eps[1],
        "importance_sampling_level": level,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "use_vllm": False,
        "_entropy_bonus_enabled": False,
        "aux_loss_enabled": False,
        "current_gradient_accumulation_steps": 1,
        "max_completion_length": max_completion_length,
        "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)},
        "_get_per_token_logps_and_entropies": lambda *a, **k: (logp, torch.zeros_like(logp), None),
    }
    for k, v in attrs.items():
        object.__setattr__(trainer, k, v)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, L, dtype=torch.long),
        "completion_mask": data.m.long(),
        "advantages": adv,
        "old_per_token_logps": data.t("old"),
        "ref_per_token_logps": data.t("ref"),
        "num_items_in_batch": data.m.sum().double(),
    }
    loss = trainer._compute_loss(None, inputs)
    metrics = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    return float(loss), metrics


def check_trl(s: Suite) -> None:
    from trl.trainer.utils import nanstd

    G = 4
    data = make_rollouts(12, [G] * 6, shuffle=False)  # TRL: contiguous groups of G
    r = torch.tensor(data.reward)
    mean = torch.nanmean(r.view(-1, G), dim=1).repeat_interleave(G)
    std = nanstd(r.view(-1, G), dim=1).repeat_interleave(G)
    adv_group = (r - mean) / (std + 1e-4)  # scale_rewards="group"
    adv_none = r - mean  # scale_rewards="none"
    ours = np.array(s.grpo_cli("advantages", data, "--preset trl")["advantages"])
    s.compare(
        "trl",
        'advantages, scale_rewards="group" (nanstd + 1e-4)',
        "--preset trl",
        {"advantages: max relative difference": (0.0, max_rel_diff(adv_group.numpy(), ours))},
    )
    zero_std = torch.isclose(std, torch.zeros_like(std)).double().mean()  # TRL's logging line
    doc = s.grpo_cli("objective", data, "--preset trl")
    s.compare(
        "trl",
        "frac_reward_zero_std (isclose(nanstd, 0))",
        "--preset trl",
        {
            "frac_reward_zero_std": (
                float(zero_std),
                doc["trainer_metrics"]["metrics"]["frac_reward_zero_std"],
            )
        },
    )

    def clip_pairs(metrics: dict[str, float], doc: dict[str, Any]) -> dict[str, Any]:
        tm = doc["trainer_metrics"]["metrics"]
        pairs = {k: (metrics[k], tm[k]) for k in TRL_METRICS}
        if "kl" in metrics:  # logged only when beta != 0, by both
            pairs["kl"] = (metrics["kl"], tm["kl"])
        assert ("kl" in metrics) == ("kl" in tm)
        return pairs

    cases: list[tuple[str, str, dict[str, Any], torch.Tensor]] = [
        ('loss_type="dapo", beta=0', "--preset trl", {"loss_type": "dapo"}, adv_group),
        (
            'loss_type="bnpo", beta=0.04',
            "--preset trl --beta 0.04",
            {"loss_type": "bnpo", "beta": 0.04},
            adv_group,
        ),
        (
            'loss_type="grpo", beta=0.04, use_bias_correction_kl=True',
            "--preset trl --beta 0.04 --agg seq-mean-token-mean",
            {"loss_type": "grpo", "beta": 0.04},
            adv_group,
        ),
        (
            'loss_type="grpo", beta=0.04, use_bias_correction_kl=False',
            "--preset trl --beta 0.04 --agg seq-mean-token-mean --no-kl-bias-correction",
            {"loss_type": "grpo", "beta": 0.04, "bias_correction": False},
            adv_group,
        ),
        (
            'loss_type="dapo", delta=3 (two-sided clipping)',
            "--preset trl --dual-clip 3",
            {"loss_type": "dapo", "delta": 3.0},
            adv_group,
        ),
        (
            'loss_type="dr_grpo", scale_rewards="none", max_completion_length=512',
            "--preset dr-grpo",
            {"loss_type": "dr_grpo"},
            adv_none,
        ),
        (
            'loss_type="dr_grpo", scale_rewards="none", max_completion_length=64',
            "--preset dr-grpo --max-len 64",
            {"loss_type": "dr_grpo", "max_completion_length": 64},
            adv_none,
        ),
        (
            'GSPO: importance_sampling_level="sequence", epsilon 3e-4/4e-4, loss_type="grpo"',
            "--preset gspo",
            {"loss_type": "grpo", "level": "sequence", "eps": (3e-4, 4e-4)},
            adv_group,
        ),
        (
            "GSPO with beta=0.04 (KL times the sequence ratio)",
            "--preset gspo --beta 0.04",
            {"loss_type": "grpo", "level": "sequence", "eps": (3e-4, 4e-4), "beta": 0.04},
            adv_group,
        ),
    ]
    for config, flags, kw, adv in cases:
        loss, metrics = trl_loss(data, adv, **kw)
        doc = s.grpo_cli("objective", data, flags)
        s.compare(
            "trl", f"GRPOTrainer._compute_loss, {config}", flags, {"loss": (loss, doc["loss"])}
        )
        s.compare(
            "trl", f"GRPOTrainer._compute_loss, {config}", flags, clip_pairs(metrics, doc), METRIC
        )


# --------------------------------------------------------------------- OpenRLHF
def load_openrlhf() -> dict[str, Any]:
    """OpenRLHF's loss, KL and advantage code, without its package ``__init__``s (which
    import DeepSpeed and the Ray actor classes, none of which these functions call)."""
    spec = importlib.util.find_spec("openrlhf")
    assert spec is not None and spec.submodule_search_locations
    root = spec.submodule_search_locations[0]
    for name in ("", ".models", ".trainer", ".trainer.ppo_utils", ".trainer.ray", ".utils"):
        pkg = types.ModuleType("openrlhf" + name)
        pkg.__path__ = [root + name.replace(".", "/")]
        sys.modules[pkg.__name__] = pkg
    sys.modules["deepspeed"] = types.ModuleType("deepspeed")  # imported, not called
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = object  # type: ignore[attr-defined]
    sys.modules[launcher.__name__] = launcher
    import openrlhf.models.loss as loss
    import openrlhf.models.utils as utils
    import openrlhf.trainer.ppo_utils.experience_maker as maker

    return {"loss": loss, "utils": utils, "maker": maker}


def openrlhf_advantages(
    orl: dict[str, Any],
    data: Rollouts,
    G: int,
    *,
    kl: torch.Tensor | None = None,
    per_token: bool = False,
) -> np.ndarray:
    """``compute_advantages_and_returns`` with group_norm over one experience of all
    answers: with ``kl`` (make_experience's per-token KL) the KL in the reward, per token;
    without, the KL as a loss (no KL in the reward: the advantage of every token is the
    answer's)."""
    B = len(data.group)
    args = types.SimpleNamespace(
        algo=types.SimpleNamespace(
            advantage=types.SimpleNamespace(estimator="group_norm", gamma=1.0, lambd=1.0),
        ),
        rollout=types.SimpleNamespace(n_samples_per_prompt=G),
        reward=types.SimpleNamespace(clip_range=(-10, 10)),  # OpenRLHF's default
    )
    exp = types.SimpleNamespace(
        rewards=torch.tensor(data.reward),
        index=list(range(B)),
        kl=torch.zeros(data.mask.shape, dtype=torch.float64) if kl is None else kl,
        action_mask=data.m,
        info={},
        advantages=None,
        returns=None,
    )
    cls = orl["maker"].RemoteExperienceMaker
    maker = cls.__new__(cls)  # the attributes the method reads, no Ray actors
    maker.strategy = types.SimpleNamespace(args=args)
    maker.kl_ctl = types.SimpleNamespace(value=0.01)
    maker.advantage_estimator = "group_norm"
    (out,) = maker.compute_advantages_and_returns([exp])
    adv: np.ndarray = out.advantages.numpy() if per_token else out.advantages[:, 0].numpy()
    return adv


def check_openrlhf(s: Suite) -> None:
    orl = load_openrlhf()
    G = 4
    data = make_rollouts(13, [G] * 6, shuffle=False)
    adv = torch.tensor(openrlhf_advantages(orl, data, G))
    ours = np.array(s.grpo_cli("advantages", data, "--preset openrlhf")["advantages"])
    s.compare(
        "openrlhf",
        "compute_advantages_and_returns, group_norm (the per-answer part, clipped to ±10)",
        "--preset openrlhf",
        {"advantages: max relative difference": (0.0, max_rel_diff(adv.numpy(), ours))},
    )
    logp, old, ref, m = data.t("logp"), data.t("old"), data.t("ref"), data.m
    a = adv[:, None].expand_as(logp)
    loss_mode = "--preset openrlhf --kl-mode loss"
    for est, kind, dual, flags in (
        ("k1", "ppo", None, loss_mode),
        ("k2", "ppo", None, f"{loss_mode} --kl-estimator k2"),
        ("k3", "ppo", None, f"{loss_mode} --kl-estimator k3"),
        ("k1", "ppo", 3.0, f"{loss_mode} --dual-clip 3"),
        ("k1", "gspo", None, f"{loss_mode} --ratio-level sequence"),
    ):
        policy = orl["loss"].PolicyLoss(
            clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=dual, policy_loss_type=kind
        )
        pg_loss, clip_ratio, ppo_kl, *_ = policy(logp, old, a, action_mask=m)
        kl = orl["utils"].compute_approx_kl(logp, ref, kl_estimator=est)
        kl_loss = orl["loss"].aggregate_loss(kl, m)  # token-level, whatever the policy's
        # ppo_actor.py: logprobs_diff = masked_mean(logp.float() − base.float(), mask)
        diff = orl["utils"].masked_mean(logp.float() - ref.float(), m)
        loss = float(pg_loss) + 0.01 * float(kl_loss)
        doc = s.grpo_cli("objective", data, flags)
        config = (
            f"--algo.kl.use_loss: PolicyLoss({kind}, dual_clip={dual}) + "
            f"compute_approx_kl({est}) · 0.01"
        )
        # compute_approx_kl works in float32 (log_probs.float()): compared to 1e-6
        s.compare("openrlhf", config, flags, {"loss": (loss, doc["loss"])}, rel=1e-6)
        tm = doc["trainer_metrics"]["metrics"]
        s.compare(
            "openrlhf",
            config,
            flags,
            {
                "policy_loss": (float(pg_loss), tm["policy_loss"]),
                "ppo_clip_ratio": (float(clip_ratio), tm["ppo_clip_ratio"]),
                "ppo_kl": (float(ppo_kl), tm["ppo_kl"]),
                "kl": (float(kl_loss), tm["kl"]),
                "logprobs_diff": (float(diff), tm["logprobs_diff"]),
            },
            rel=1e-6,  # float32 casts (.float()) in the KL and logprobs_diff
        )
    # its default: the KL in the reward, per token (make_experience's compute_approx_kl,
    # then compute_advantages_and_returns), the policy loss on per-token advantages
    kl_tok = orl["utils"].compute_approx_kl(old, ref, kl_estimator="k1")
    adv_t = torch.tensor(openrlhf_advantages(orl, data, G, kl=kl_tok, per_token=True))
    for kind, flags in (("ppo", "--preset openrlhf"),
                        ("gspo", "--preset openrlhf --ratio-level sequence")):  # fmt: skip
        policy = orl["loss"].PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, policy_loss_type=kind)
        pg_loss, clip_ratio, ppo_kl, *_ = policy(logp, old, adv_t, action_mask=m)
        doc = s.grpo_cli("objective", data, flags)
        tm = doc["trainer_metrics"]["metrics"]
        per_answer_kl = orl["utils"].masked_mean(kl_tok, m, dim=-1)  # experience.info["kl"]
        diff = orl["utils"].masked_mean(old.float() - ref.float(), m, dim=-1)
        s.compare(
            "openrlhf",
            f"KL in the reward (default): compute_approx_kl(k1) · 0.01 per token, "
            f"get_cumulative_returns, PolicyLoss({kind})",
            flags,
            {
                "loss": (float(pg_loss), doc["loss"]),
                "ppo_clip_ratio": (float(clip_ratio), tm["ppo_clip_ratio"]),
                "ppo_kl": (float(ppo_kl), tm["ppo_kl"]),
                "kl": (float(per_answer_kl.mean()), tm["kl"]),
                "logprobs_diff": (float(diff.mean()), tm["logprobs_diff"]),
            },
            rel=1e-6,
        )


# -------------------------------------------------------------------------- main
README_START = "<!-- conformance table: written by conformance/oracle.py --page -->"
README_END = "<!-- end of conformance table -->"


def summary(rows: list[Row], versions: dict[str, str]) -> list[str]:
    """One markdown row per configuration: what was compared, and whether all matched."""
    lines = [
        "| trainer | configuration (the trainer's own function) | grpo-cli flags | compared "
        "| matched |",
        "|---|---|---|---|---|",
    ]
    seen: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        seen.setdefault((r.trainer, r.config, r.flags), []).append(r)
    for (trainer, config, flags), rs in seen.items():
        quantities = ", ".join(f"`{r.quantity.split(':')[0]}`" for r in rs)
        matched = sum(r.ok for r in rs)
        mark = "yes" if matched == len(rs) else f"**{matched} of {len(rs)}**"
        lines.append(
            f"| {trainer} {versions[trainer]} | {config} | `{flags}` | {quantities} | {mark} |"
        )
    return lines


def readme_block(readme: Path, table: list[str], *, write: bool) -> bool:
    """Whether the page's conformance table (docs/conformance.md) is this run's
    (``write``: make it so)."""
    text = readme.read_text()
    try:
        head, rest = text.split(README_START, 1)
        _, tail = rest.split(README_END, 1)
    except ValueError:
        raise SystemExit(f"{readme}: the conformance table markers are missing") from None
    new = head + README_START + "\n" + "\n".join(table) + "\n" + README_END + tail
    if write:
        readme.write_text(new)
    return new == text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, help="write every comparison as markdown here")
    # the table's home is docs/conformance.md (it was README.md: --readme, --check-readme)
    parser.add_argument(
        "--page", "--readme", dest="page", type=Path,
        help="write the summary table into this page (between markers): docs/conformance.md",
    )  # fmt: skip
    parser.add_argument(
        "--check-page", "--check-readme", dest="check_page", type=Path,
        help="fail when this page's summary table is not this run's",
    )  # fmt: skip
    opts = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    with tempfile.TemporaryDirectory() as tmp:
        s = Suite(Path(tmp))
        check_verl(s)
        check_trl(s)
        check_openrlhf(s)
    versions = {p: version(p) for p in ("verl", "trl", "openrlhf", "torch")}
    lines = [
        "| trainer | configuration | grpo-cli flags | quantity | trainer | grpo-cli | rel. tol. "
        "| matched |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in s.rows:
        name = f"{r.trainer} {versions[r.trainer]}"
        mark = "yes" if r.ok else "**NO**"
        lines.append(
            f"| {name} | {r.config} | `{r.flags}` | {r.quantity} | {r.theirs:.12g} | "
            f"{r.ours:.12g} | {r.rel:g} | {mark} |"
        )
        status = "ok  " if r.ok else "FAIL"
        print(f"{status} {name:16} {r.quantity:38} {r.theirs:>20.12g} {r.ours:>20.12g}  {r.flags}")
    if opts.markdown:
        opts.markdown.write_text("\n".join(lines) + "\n")
    table = summary(s.rows, versions)
    if opts.page:
        readme_block(opts.page, table, write=True)
    failed = sum(not r.ok for r in s.rows)
    passed = len(s.rows) - failed
    if opts.check_page and not readme_block(opts.check_page, table, write=False):
        print(
            f"FAIL {opts.check_page}: its conformance table is not this run's "
            f"(update it: conformance/run --page {opts.check_page})"
        )
        failed += 1
    print(f"conformance: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
