"""One OpenRLHF release's own loss code on fixed rollouts: a fixture for tests/test_releases.py.

Runs inside that release's environment (``conformance/releases/run``: torch CPU, OpenRLHF
installed without its dependencies). OpenRLHF's package ``__init__``s and the modules its
experience maker imports pull DeepSpeed, Ray, vLLM and transformers, none of which the
functions called here use: the package ``__init__``s are skipped and any module that is
not installed is a stand-in (:class:`StandIns`); the code that runs is the release's.

Called, as imported from the installed release: ``models/loss.py`` ``PolicyLoss`` (with
its release's constructor and outputs), ``models/utils.py`` ``compute_approx_kl``,
``compute_reward`` and ``masked_mean``, the experience maker's ``get_cumulative_returns``.
The group normalisation (``(r − mean) / (std + 1e-9)`` over ``n_samples_per_prompt``, the
same lines from 0.6.0 to 0.11.2) and the KL loss's aggregation in the actor
(``masked_mean(kl, mask, dim=-1).mean()`` up to 0.7.1, ``masked_mean(kl, mask)`` after)
are written here from the release's lines.

Usage: ``python openrlhf_release.py OUT.json --preset openrlhf@X``.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import types
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import StandIns, mask_of, padded, rollouts, write

G = 4
COEF = 0.01  # init_kl_coef


def v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(".")[:3])


def load() -> dict[str, Any]:
    spec = importlib.util.find_spec("openrlhf")
    assert spec is not None and spec.submodule_search_locations
    root = spec.submodule_search_locations[0]
    for name in ("", ".models", ".trainer", ".trainer.ppo_utils", ".trainer.ray", ".utils"):
        pkg = types.ModuleType("openrlhf" + name)
        pkg.__path__ = [root + name.replace(".", "/")]
        sys.modules[pkg.__name__] = pkg
    sys.meta_path.append(StandIns("openrlhf"))
    import openrlhf.models.loss as loss
    import openrlhf.models.utils as utils
    import openrlhf.trainer.ppo_utils.experience_maker as maker

    holder = next(
        c
        for c in vars(maker).values()
        if inspect.isclass(c) and "get_cumulative_returns" in vars(c)
    )
    return {"loss": loss, "utils": utils, "cumulative": vars(holder)["get_cumulative_returns"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", required=True)
    opts = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    ver = pkg_version("openrlhf")
    vv = v(ver)
    orl = load()
    utils, loss_mod = orl["utils"], orl["loss"]
    data = rollouts(13, [G] * 6, extremes=True)
    logp, old, ref, m = (
        padded(data, "logp"),
        padded(data, "old_logp"),
        padded(data, "ref_logp"),
        mask_of(data),
    )
    mb = m.bool()
    r = torch.tensor(data["reward"]).reshape(-1, G)
    # experience maker, group_norm (0.6.0–0.11.2): the group-normalised reward
    r_norm = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-9)).reshape(-1)

    def approx_kl(a: torch.Tensor, b: torch.Tensor, est: str) -> torch.Tensor:
        params = inspect.signature(utils.compute_approx_kl).parameters
        if "kl_estimator" in params:
            kw: dict[str, Any] = {"kl_estimator": est}
        else:  # 0.6.0: use_kl_estimator_k3
            assert est in ("k1", "k3")
            kw = {"use_kl_estimator_k3": est == "k3"}
        if "action_mask" in params:
            kw["action_mask"] = mb
        return utils.compute_approx_kl(a, b, **kw)

    def advantages(kl: torch.Tensor, coef: float) -> torch.Tensor:
        """compute_reward (the clip to ±10, −β·KL per token, the reward on the last token)
        and get_cumulative_returns (γ = 1): the per-token advantages."""
        reward = utils.compute_reward(r_norm, coef, kl, action_mask=mb, reward_clip_range=(-10, 10))
        return orl["cumulative"](None, reward, mb, 1.0)

    def policy(adv: torch.Tensor, *, dual: float | None = None, kind: str = "ppo") -> Any:
        params = inspect.signature(loss_mod.PolicyLoss).parameters
        kw: dict[str, Any] = {}
        if "clip_eps_low" in params:
            kw.update(clip_eps_low=0.2, clip_eps_high=0.2)
        else:
            kw["clip_eps"] = 0.2
        if dual is not None:
            kw["dual_clip"] = dual
        if kind != "ppo":
            kw["policy_loss_type"] = kind
        out = loss_mod.PolicyLoss(**kw)(logp, old, adv, action_mask=mb)
        out = out if isinstance(out, tuple) else (out,)
        metrics = {"policy_loss": float(out[0])}
        if len(out) > 1:
            metrics["ppo_clip_ratio"] = float(out[1])
        if len(out) > 2:
            metrics["ppo_kl"] = float(out[2])
        return float(out[0]), metrics

    def kl_loss(kl: torch.Tensor) -> float:
        """The actor's KL loss: per answer then over answers up to 0.7.1, token mean after."""
        if vv < (0, 7, 2):
            return float(utils.masked_mean(kl, mb, dim=-1).mean())
        return float(utils.masked_mean(kl, mb))

    answer_mean = lambda x: float(utils.masked_mean(x, mb, dim=-1).mean())  # noqa: E731
    cases = []
    # the default: the KL in the reward (k1 of old vs ref), PolicyLoss on per-token returns
    kinds = ["ppo"] + (["gspo"] if vv >= (0, 8, 8) else [])
    for kind in kinds:
        kl_tok = approx_kl(old, ref, "k1")
        pg, metrics = policy(advantages(kl_tok, COEF), kind=kind)
        if not ((0, 7, 0) <= vv < (0, 7, 2)):  # those log a mean over the padded width
            metrics["kl"] = answer_mean(kl_tok)
        if vv >= (0, 9, 2):
            metrics["logprobs_diff"] = answer_mean(old.float() - ref.float())
        flags = f"--preset {opts.preset}" + (" --ratio-level sequence" if kind == "gspo" else "")
        cases.append({"flags": flags, "loss": pg, "metrics": metrics, "loss_rel": 1e-6})
    # --use_kl_loss / --algo.kl.use_loss: no KL in the reward, the KL loss per estimator
    ests = ["k1", "k3"] + (["k2"] if vv >= (0, 6, 1) else [])
    zero = torch.zeros_like(logp)
    adv_loss = advantages(zero, COEF)
    for est in ests:
        pg, metrics = policy(adv_loss)
        kl = kl_loss(approx_kl(logp, ref, est))
        metrics["kl"] = kl
        if vv >= (0, 9, 2):
            metrics["logprobs_diff"] = float(utils.masked_mean(logp.float() - ref.float(), mb))
        cases.append(
            {
                "flags": f"--preset {opts.preset} --kl-mode loss --kl-estimator {est}",
                "loss": pg + COEF * kl,
                "metrics": metrics,
                "loss_rel": 1e-6,  # compute_approx_kl works in float32 (.float())
            }
        )
    if vv >= (0, 8, 6):
        pg, metrics = policy(adv_loss, dual=3.0)
        kl = kl_loss(approx_kl(logp, ref, "k1"))
        metrics["kl"] = kl
        if vv >= (0, 9, 2):
            metrics["logprobs_diff"] = float(utils.masked_mean(logp.float() - ref.float(), mb))
        cases.append(
            {
                "flags": f"--preset {opts.preset} --kl-mode loss --dual-clip 3",
                "loss": pg + COEF * kl,
                "metrics": metrics,
                "loss_rel": 1e-6,
            }
        )
    write(
        opts.out,
        {
            "trainer": "openrlhf",
            "version": ver,
            "versions": {"torch": pkg_version("torch")},
            "preset": opts.preset,
            "rollouts": data,
            "cases": cases,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
