"""One verl release's own loss code on fixed rollouts: writes a fixture for tests/test_releases.py.

Runs inside that release's environment (``conformance/releases/run``: torch CPU, verl
installed without its GPU dependencies). Calls, as imported from the installed release's
``verl/trainer/ppo/core_algos.py``: ``compute_grpo_outcome_advantage`` (the advantages),
the policy loss of the release (``compute_policy_loss`` up to 0.5.0,
``compute_policy_loss_vanilla`` and ``compute_policy_loss_gspo`` from 0.6.0, each with the
signature of its release), ``kl_penalty`` and ``agg_loss`` (masked_mean in 0.3.0), the
KL loss combined as ``dp_actor.py`` of the release combines it (``pg_loss + kl_loss ·
kl_loss_coef``), and records the loss and the metrics the actor logs.

Usage: ``python verl_release.py OUT.json --preset verl@X``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import types
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import StandIns, mask_of, padded, rollouts, write

COEF = 0.001  # kl_loss_coef


def v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.replace(".post", ".").split(".")[:4])


def load() -> Any:
    """``verl/trainer/ppo/core_algos.py`` of the installed release. verl's top-level
    ``__init__`` (its DataProto, Ray's single controller) is skipped, and a module that is
    not installed (Ray, flash-attn, vLLM, ...: imported, never called here) is a stand-in
    (:class:`StandIns`): the code that runs is verl's."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    pkg = types.ModuleType("verl")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["verl"] = pkg
    sys.meta_path.append(StandIns("verl", absent=("torch_npu",)))
    import verl.trainer.ppo.core_algos as ca

    return ca


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", required=True)
    opts = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    ca = load()

    ver = pkg_version("verl")
    vv = v(ver)
    data = rollouts(11, [4, 4, 4, 3, 1, 5, 4, 2, 4], shuffle=True, extremes=True)
    logp, old, ref, m = (
        padded(data, "logp"),
        padded(data, "old_logp"),
        padded(data, "ref_logp"),
        mask_of(data),
    )
    mf = m.double()
    B, L = logp.shape
    token_rewards = torch.zeros(B, L)
    last = m.sum(1) - 1
    token_rewards[torch.arange(B), last] = torch.tensor(data["reward"])
    index = np.array(data["group"], dtype=object)

    def advantages(norm: bool) -> torch.Tensor:
        params = inspect.signature(ca.compute_grpo_outcome_advantage).parameters
        kw: dict[str, Any] = {"epsilon": 1e-6}
        if "norm_adv_by_std_in_grpo" in params:
            kw["norm_adv_by_std_in_grpo"] = norm
        elif not norm:
            raise RuntimeError("no norm_adv_by_std_in_grpo")
        adv, _ = ca.compute_grpo_outcome_advantage(token_rewards, mf, index, **kw)
        return adv

    def agg(loss_mat: torch.Tensor, mode: str) -> torch.Tensor:
        if not hasattr(ca, "agg_loss"):  # 0.3.0: masked_mean only
            import verl.utils.torch_functional as verl_F

            assert mode == "token-mean"
            return verl_F.masked_mean(loss_mat, mf)
        return ca.agg_loss(loss_mat=loss_mat, loss_mask=mf, loss_agg_mode=mode)

    def kl_loss(mode: str, kind: str = "low_var_kl") -> float:
        return float(agg(ca.kl_penalty(logp, ref, kl_penalty=kind), mode))

    def actor(low: float, high: float, mode: str) -> Any:
        if vv < (0, 6, 0):
            return None
        from verl.workers.config import ActorConfig

        kw = {
            "strategy": "fsdp",
            "ppo_mini_batch_size": B,
            "ppo_micro_batch_size_per_gpu": B,
            "clip_ratio": low,
            "clip_ratio_low": low,
            "clip_ratio_high": high,
            "loss_agg_mode": mode,
            "use_dynamic_bsz": False,
        }
        if "rollout_n" in inspect.signature(ActorConfig).parameters:
            kw["rollout_n"] = 1
        return ActorConfig(**kw)

    def policy(
        adv: torch.Tensor, *, mode: str, eps: tuple[float, float], gspo: bool = False
    ) -> tuple[float, dict[str, float]]:
        """The release's policy loss and the metrics dp_actor logs from it."""
        if vv < (0, 4, 0):
            pg, clipfrac, ppo_kl = ca.compute_policy_loss(old, logp, adv, mf, cliprange=eps[0])
            return float(pg), {"actor/pg_clipfrac": float(clipfrac), "actor/ppo_kl": float(ppo_kl)}
        if vv < (0, 6, 0):
            pg, clipfrac, ppo_kl, lower = ca.compute_policy_loss(
                old, logp, adv, mf, cliprange=eps[0], cliprange_low=eps[0],
                cliprange_high=eps[1], clip_ratio_c=3.0, loss_agg_mode=mode,
            )  # fmt: skip
            return float(pg), {
                "actor/pg_clipfrac": float(clipfrac),
                "actor/ppo_kl": float(ppo_kl),
                "actor/pg_clipfrac_lower": float(lower),
            }
        fn = ca.compute_policy_loss_gspo if gspo else ca.compute_policy_loss_vanilla
        out = fn(old, logp, adv, mf, loss_agg_mode=mode, config=actor(eps[0], eps[1], mode))
        if len(out) == 4:  # 0.6.0: (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)
            pg, clipfrac, ppo_kl, lower = out
            metrics = {
                "actor/pg_clipfrac": float(clipfrac),
                "actor/ppo_kl": float(ppo_kl),
                "actor/pg_clipfrac_lower": float(lower),
            }
        else:
            pg, metrics = out
        return float(pg), {k: float(x) for k, x in metrics.items()}

    adv = advantages(True)
    modes = ["token-mean"]
    if hasattr(ca, "agg_loss"):
        modes += ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    cases = []
    for mode in modes:
        pg, metrics = policy(adv, mode=mode, eps=(0.2, 0.2))
        kl = kl_loss(mode)
        cases.append(
            {
                "flags": f"--preset {opts.preset} --agg {mode}",
                "loss": pg + COEF * kl,
                "metrics": {"actor/pg_loss": pg, "actor/kl_loss": kl, **metrics},
                "advantages": adv[:, 0].tolist(),
                # verl divides a per-answer token sum by |o_i| + 1e-8 from 0.6.1
                "loss_rel": 1e-7 if mode == "seq-mean-token-mean" else 1e-9,
            }
        )
    for kind, est in (("kl", "k1"), ("mse", "k2")):
        pg, metrics = policy(adv, mode="token-mean", eps=(0.2, 0.2))
        kl = kl_loss("token-mean", kind)
        cases.append(
            {
                "flags": f"--preset {opts.preset} --kl-estimator {est}",
                "loss": pg + COEF * kl,
                "metrics": {"actor/pg_loss": pg, "actor/kl_loss": kl, **metrics},
            }
        )
    if vv >= (0, 4, 0):
        pg, metrics = policy(adv, mode="token-mean", eps=(0.2, 0.28))
        kl = kl_loss("token-mean")
        cases.append(
            {
                "flags": f"--preset {opts.preset} --clip-eps-high 0.28",
                "loss": pg + COEF * kl,
                "metrics": {"actor/pg_loss": pg, "actor/kl_loss": kl, **metrics},
            }
        )
        adv_none = advantages(False)
        pg, metrics = policy(adv_none, mode="token-mean", eps=(0.2, 0.2))
        kl = kl_loss("token-mean")
        cases.append(
            {
                "flags": f"--preset {opts.preset} --scale none",
                "loss": pg + COEF * kl,
                "metrics": {"actor/pg_loss": pg, "actor/kl_loss": kl, **metrics},
                "advantages": adv_none[:, 0].tolist(),
            }
        )
    if vv >= (0, 6, 0):
        for mode in ("token-mean", "seq-mean-token-mean"):
            pg, metrics = policy(adv, mode=mode, eps=(3e-4, 4e-4), gspo=True)
            kl = kl_loss(mode)
            # 0.6.0-0.9.0: the GSPO policy loss is always seq-mean-token-mean and
            # loss_agg_mode aggregates the KL loss only: the preset's rule, without --agg
            forced = vv < (0, 9, 1) and mode == "token-mean"
            agg_flag = "" if forced else f" --agg {mode}"
            cases.append(
                {
                    "flags": f"--preset {opts.preset} --ratio-level sequence --clip-eps 3e-4 "
                    f"--clip-eps-high 4e-4{agg_flag}",
                    "loss": pg + COEF * kl,
                    "metrics": {"actor/pg_loss": pg, "actor/kl_loss": kl, **metrics},
                    "loss_rel": 1e-7,
                }
            )
    # use_kl_in_reward (algorithm.kl_penalty "kl", a fixed controller): ray_trainer's
    # apply_kl_penalty on the token rewards, the advantages of the summed scores, the policy
    # loss without a KL loss. Its module imports the release's whole trainer: where that
    # does not load without the GPU stacks, the case is left out and the reason recorded.
    reward_mode: dict[str, Any] = {}
    try:
        from verl.protocol import DataProto
        from verl.trainer.ppo.ray_trainer import apply_kl_penalty
    except Exception as exc:  # any failure to load is recorded, not raised
        reward_mode["not_run"] = f"verl.trainer.ppo.ray_trainer does not load: {exc!r}"[:300]
    else:
        tensors = {
            "token_level_scores": token_rewards,
            "old_log_probs": old,
            "ref_log_prob": ref,
            "response_mask": mf,
            "responses": torch.zeros(B, L, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, 1), mf], dim=1),
        }
        batch, kl_metrics = apply_kl_penalty(
            DataProto.from_dict(tensors=tensors), ca.FixedKLController(0.05), kl_penalty="kl"
        )
        kw: dict[str, Any] = {"epsilon": 1e-6}
        adv_r, _ = ca.compute_grpo_outcome_advantage(
            batch.batch["token_level_rewards"], mf, index, **kw
        )
        pg, metrics = policy(adv_r, mode="token-mean", eps=(0.2, 0.2))
        cases.append(
            {
                "flags": f"--preset {opts.preset} --kl-mode reward --beta 0.05",
                "loss": pg,
                "metrics": {
                    "actor/pg_loss": pg,
                    **metrics,
                    **{k: float(x) for k, x in kl_metrics.items()},
                },
            }
        )
    write(
        opts.out,
        {
            "trainer": "verl",
            "version": ver,
            "versions": {"torch": pkg_version("torch")},
            "preset": opts.preset,
            "rollouts": data,
            "cases": cases,
            **reward_mode,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
