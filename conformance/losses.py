"""Conformance of grpo_cli's policy losses and sampler–trainer corrections (``_losses``)
against the trainers' own functions, on the same tensors.

Runs in the conformance environment (``conformance/run`` builds it): TRL 1.16.0, verl
0.9.1 and OpenRLHF 0.11.2 beside torch (CPU). For every loss and correction, and a few
settings each (clipping that binds, negative, zero and positive advantages, ragged lengths
1–60, ratios beyond the clamps), it calls the trainer's function on float64 padded tensors
and grpo-cli's numpy function on the ragged tokens, aggregates grpo-cli's terms as the
trainer does, and compares:

- the loss, and the gradient ``∂loss/∂logp`` (torch autograd through the trainer's
  function against grpo-cli's closed form times the aggregation weights);
- every metric the trainer's function returns or logs for it.

Called as the trainers call them: TRL ``GRPOTrainer._compute_loss`` on given log-probs
(the trainer object holding only the attributes the method reads, as conformance/oracle.py
does); verl's registry ``core_algos.get_policy_loss_fn(name)`` with an ``ActorConfig``, and
``rollout_corr_helper.compute_rollout_correction_and_add_to_batch`` (what ``ray_trainer``
calls); OpenRLHF ``PolicyLoss`` (loaded without DeepSpeed: ``oracle.load_openrlhf``).

Tolerances: 1e-9 relative where both sides work in float64; 1e-6 where the trainer takes a
fraction as the mean of a float32 mask (``.float()``); 1e-7 where verl's or OpenRLHF's
per-answer token mean divides by ``|o_i| + 1e-8`` (grpo-cli's core divides by ``|o_i|``).

Usage: ``python conformance/losses.py``. One row per comparison, then ``N passed, M
failed``; exit 1 on any failure.
"""

from __future__ import annotations

import sys
import types
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle import METRIC, REL, SEQ_MEAN, Row, load_openrlhf, make_rollouts

from grpo_cli.core import (
    Aggregation,
    aggregate,
    aggregation_weights,
    flatten_padded,
    token_gradients,
    token_terms,
)
from grpo_cli.losses import LOSSES as ROWS
from grpo_cli.losses import logged_metrics
from grpo_cli.losses import openrlhf as LO
from grpo_cli.losses import registry as LR
from grpo_cli.losses import trl as LT
from grpo_cli.losses import verl as LV
from grpo_cli.losses import verl_rollout as LVR


def metrics_of(key: str) -> tuple[LR.Metric, ...]:
    """A loss's logged metrics by its name, or ``verl/bypass_mode/<loss_type>``."""
    _, _, kind = key.partition("/bypass_mode/")
    if kind:
        return logged_metrics("verl/bypass_mode", bypass_loss_type=kind)
    return logged_metrics(key)


# Cannot run against the trainer's own code, and why (printed with the results).
NOT_RUN = [
    (
        "trl",
        "vLLM importance-sampling ratio and its sampling/* metrics",
        "computed inside GRPOTrainer._generate_and_score_completions, which needs a model, "
        "vLLM and reward functions: the ratio's lines are re-expressed in torch here "
        "(trl_is_ratio); how _compute_loss applies it (and vespo's use of it) is TRL's own code",
    ),
    (
        "verl",
        "clip_cov's random choice among candidates",
        "an unseeded torch.randperm: compared with the permutation replayed from the same torch "
        "seed, and the expectation against the mean of verl's losses over every choice",
    ),
]


# ------------------------------------------------------------------------ the data
@dataclass
class Batch:
    """Padded tensors for the trainers and the same tokens ragged for grpo-cli."""

    mask: np.ndarray  # (B, L) bool
    logp: np.ndarray  # (B, L), padding 0
    old: np.ndarray
    ref: np.ndarray
    roll: np.ndarray
    adv: np.ndarray  # (B,)

    def __post_init__(self) -> None:
        self.off, (self.lp_f, self.old_f, self.ref_f, self.roll_f) = flatten_padded(
            self.mask, self.logp, self.old, self.ref, self.roll
        )
        self.lengths = np.diff(self.off)

    def t(self, name: str, grad: bool = False) -> torch.Tensor:
        return torch.tensor(getattr(self, name), dtype=torch.float64, requires_grad=grad)

    @property
    def m(self) -> torch.Tensor:
        return torch.tensor(self.mask)

    @property
    def adv_tok(self) -> torch.Tensor:  # verl and OpenRLHF take (B, L) advantages
        a = torch.tensor(self.adv, dtype=torch.float64)[:, None].expand(self.mask.shape)
        return a.clone()

    def flat(self, x: torch.Tensor) -> np.ndarray:
        out: np.ndarray = x.detach().numpy()[self.mask]
        return out


def make_batch(seed: int, sizes: list[int], *, probabilities: bool = False) -> Batch:
    """oracle.make_rollouts' rollouts (lengths 1–60, Δ = 25 on a token, ρ = e^1.5 on every
    token of an answer, mean Δ = 11 on another) with the sampler's log-probs beside them
    (``old + N(0, 0.2)``, two answers off by ∓1 a token) and advantages of both
    signs and zeros. ``probabilities``: log-probs kept ≤ 0 (DPPO reads ``e^logp``)."""
    r = make_rollouts(seed, sizes, shuffle=True)
    rng = np.random.default_rng(seed + 1000)
    B, Lw = r.mask.shape
    logp, old, ref = r.logp.copy(), r.old.copy(), r.ref.copy()
    if probabilities:
        logp = np.minimum(logp, -1e-4)
        old = np.minimum(old, -1e-4)
        logp[6, : r.mask[6].sum()] = np.log(0.9)  # a probability moving by 0.5 or more
        old[6, : r.mask[6].sum()] = np.log(0.3)
    roll = old + rng.normal(0.0, 0.2, size=(B, Lw))
    roll[7] = old[7] - 1.0  # sampler far off: ratio e^1 per token
    roll[8] = old[8] + 1.0
    adv = np.asarray(rng.normal(0.0, 1.0, size=B), dtype=np.float64)
    adv[::5] = 0.0
    adv[1], adv[2], adv[3], adv[4] = 1.3, 0.8, -0.9, -1.1  # the extreme answers, both signs
    for a in (logp, old, ref, roll):
        a[~r.mask] = 0.0
    return Batch(r.mask, logp, old, ref, roll, adv)


# ---------------------------------------------------------------------- comparing
class Spread(Row):
    """An array comparison: ``ours`` is max |theirs − ours| / max |theirs| (``theirs`` 0),
    within ``rel``."""

    @property
    def ok(self) -> bool:
        return self.ours <= self.rel


class Suite:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(
        self,
        trainer: str,
        config: str,
        ours: str,
        pairs: dict[str, tuple[float, float]],
        rel: float = REL,
    ) -> None:
        for q, (theirs, mine) in pairs.items():
            self.rows.append(Row(trainer, config, ours, q, float(theirs), float(mine), rel))

    def close(
        self,
        trainer: str,
        config: str,
        ours: str,
        name: str,
        theirs: np.ndarray,
        mine: np.ndarray,
        rel: float = REL,
    ) -> None:
        """Arrays: the max difference relative to the largest |theirs|, as one row."""
        scale = max(float(np.abs(theirs).max()), 1e-300) if theirs.size else 1.0
        finite = np.isfinite(theirs) & np.isfinite(mine)
        same_nonfinite = np.array_equal(theirs[~finite], mine[~finite], equal_nan=True)
        diff = float(np.abs(theirs[finite] - mine[finite]).max()) if finite.any() else 0.0
        bad = 0.0 if same_nonfinite else 1.0
        self.rows.append(
            Spread(
                trainer, config, ours, f"{name}: max rel. difference", 0.0, diff / scale + bad, rel
            )
        )

    def triggers(self, trainer: str, config: str, ours: str, name: str, value: float) -> None:
        """The setting exercises what it claims to (a clip metric > 0)."""
        self.rows.append(
            Row(trainer, config, ours, f"{name} > 0 (binds)", 1.0, float(value > 0), 0.0)
        )


def our_loss(terms: LR.PolicyTerms, off: np.ndarray, agg: Aggregation, **kw: Any) -> float:
    return -aggregate(terms.term, off, agg=agg, **kw)


def our_grad(grad: np.ndarray, lengths: np.ndarray, agg: Aggregation, **kw: Any) -> np.ndarray:
    """∂loss/∂logp per token: −w_i · grad (aggregation_weights, equal within an answer)."""
    w = aggregation_weights(lengths, agg=agg, **kw)
    out: np.ndarray = -np.repeat(w, lengths) * grad
    return out


# -------------------------------------------------------------------------- TRL
def trl_is_ratio(
    b: Batch, mode: str, cmax: float | None, cmin: float | None, sampling: np.ndarray | None = None
) -> torch.Tensor:
    """TRL 1.16.0's vLLM IS ratio (``_generate_and_score_completions``), re-expressed in
    torch on the padded tensors (that method needs a model and vLLM)."""
    s = torch.tensor(b.roll if sampling is None else sampling, dtype=torch.float64)
    d = torch.nan_to_num((b.t("old") - s) * b.m, nan=0.0)
    if mode.startswith("sequence"):
        d = d.sum(dim=-1, keepdim=True)
    r = torch.exp(d)
    if mode.endswith("truncate"):
        return torch.clamp(r, min=cmin, max=cmax)
    lo = -float("inf") if cmin is None else cmin
    hi = float("inf") if cmax is None else cmax
    return r.masked_fill((r < lo) | (r > hi), 0.0)


def trl_is_metrics(b: Batch, ratio: torch.Tensor, mode: str, sampling: np.ndarray) -> dict:
    """The sampling/* metrics of the same method (one process), re-expressed likewise."""
    s = torch.tensor(sampling, dtype=torch.float64)
    delta = torch.abs(b.t("old") - s)
    delta = delta[b.m & ~torch.isnan(delta)]
    flat = ratio.flatten() if mode.startswith("sequence") else ratio[b.m]
    return {
        "sampling/sampling_logp_difference/mean": float(delta.mean()),
        "sampling/sampling_logp_difference/max": float(delta.max()),
        "sampling/importance_sampling_ratio/min": float(flat.min()),
        "sampling/importance_sampling_ratio/mean": float(flat.mean()),
        "sampling/importance_sampling_ratio/max": float(flat.max()),
    }


def trl_compute_loss(
    b: Batch,
    logp: torch.Tensor,
    *,
    loss_type: str,
    level: str = "token",
    eps: tuple[float, float] = (0.2, 0.2),
    beta: float = 0.0,
    sapo: tuple[float, float] = (1.0, 1.05),
    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0),
    is_ratio: torch.Tensor | None = None,
    opsm: float | None = None,
    sampling: np.ndarray | None = None,
) -> tuple[torch.Tensor, dict]:
    """TRL's ``GRPOTrainer._compute_loss`` (eval mode: no accumulation scaling); ``opsm``
    its ``off_policy_mask_threshold`` with ``sampling`` as ``sampling_per_token_logps``."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    B, Lw = b.mask.shape

    class Accelerator:
        num_processes = 1

        def gather(self, x: torch.Tensor) -> torch.Tensor:
            return x

        def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
            return x

        def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
            return x

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    args = types.SimpleNamespace(
        use_bias_correction_kl=True,
        delta=None,
        sapo_temperature_pos=sapo[0],
        sapo_temperature_neg=sapo[1],
        vespo_k_pos=vespo[0],
        vespo_lambda_pos=vespo[1],
        vespo_k_neg=vespo[2],
        vespo_lambda_neg=vespo[3],
    )
    attrs: dict[str, Any] = {
        "model": types.SimpleNamespace(training=False),
        "accelerator": Accelerator(),
        "args": args,
        "beta": beta,
        "loss_type": loss_type,
        "epsilon_low": eps[0],
        "epsilon_high": eps[1],
        "importance_sampling_level": level,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": opsm,
        "use_vllm": is_ratio is not None,
        "vllm_importance_sampling_correction": is_ratio is not None,
        "_entropy_bonus_enabled": False,
        "aux_loss_enabled": False,
        "current_gradient_accumulation_steps": 1,
        "max_completion_length": 512,
        "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)},
        "_get_per_token_logps_and_entropies": lambda *a, **k: (logp, torch.zeros_like(logp), None),
    }
    for k, v in attrs.items():
        object.__setattr__(trainer, k, v)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, Lw, dtype=torch.long),
        "completion_mask": b.m.long(),
        "advantages": torch.tensor(b.adv, dtype=torch.float64),
        "old_per_token_logps": b.t("old"),
        "ref_per_token_logps": b.t("ref"),
        "num_items_in_batch": b.m.sum().double(),
    }
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    if sampling is not None:
        inputs["sampling_per_token_logps"] = torch.tensor(sampling, dtype=torch.float64)
    loss = trainer._compute_loss(None, inputs)
    metrics = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    return loss, metrics


TRL_AGG: dict[str, Aggregation] = {
    "grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "bnpo": "token-mean",
    "dapo": "token-mean", "cispo": "token-mean", "vespo": "token-mean",
    "luspo": "seq-mean-token-sum",
}  # fmt: skip  # dapo/cispo/vespo: Σ / num_items_in_batch, the batch's tokens here


def trl_case(
    s: Suite,
    b: Batch,
    config: str,
    ours: str,
    *,
    loss_type: str,
    make: Callable[..., LR.PolicyTerms],
    metric_key: str | None,
    trl_kw: dict[str, Any],
    beta: float = 0.0,
    level: Any = "token",
    is_corr: LR.Correction | None = None,
    is_ratio: torch.Tensor | None = None,
    binds: tuple[str, ...] = (),
    opsm: tuple[float, np.ndarray] | None = None,
) -> None:
    """One TRL configuration: its ``_compute_loss`` (loss, ∂loss/∂logp, metrics) against
    ``make()``'s terms, the correction and (``opsm``: the threshold and the sampler's
    padded log-probs) the off-policy sequence mask applied the fold's way."""
    lp = b.t("logp", grad=True)
    threshold, sampling = (None, None) if opsm is None else opsm
    loss, metrics = trl_compute_loss(
        b, lp, loss_type=loss_type, beta=beta, level=level, is_ratio=is_ratio,
        opsm=threshold, sampling=sampling, **trl_kw,
    )  # fmt: skip
    loss.backward()
    assert lp.grad is not None
    terms = make()
    agg = TRL_AGG[loss_type]
    corrected = terms if is_corr is None else LR.apply_correction(terms, is_corr)
    policy, g = corrected.term, corrected.grad
    assert g is not None
    if opsm is not None:
        assert threshold is not None and sampling is not None
        keep = LT.off_policy_mask(b.lp_f, sampling[b.mask], b.adv, b.off, threshold=threshold)
        policy, g = LR._mul(policy, keep), LR._mul(g, keep)
    term, grad = policy, g
    if beta:  # the KL term (TRL: k3 × the ratio, use_bias_correction_kl), not IS-weighted
        kl = token_terms(
            b.lp_f,
            b.old_f,
            b.ref_f,
            b.adv,
            b.off,
            ratio_level=level,
            beta=beta,
            kl_bias_correction=True,
        )
        _, gk = token_gradients(
            kl, offsets=b.off, ratio_level=level, beta=beta, kl_bias_correction=True
        )
        assert kl.kl_loss is not None and gk is not None
        term, grad = policy - beta * kl.kl_loss, g - beta * gk
    s.add("trl", config, ours, {"loss": (float(loss.detach()), -aggregate(term, b.off, agg=agg))})
    s.close("trl", config, ours, "∂loss/∂logp", b.flat(lp.grad), our_grad(grad, b.lengths, agg))
    if metric_key is not None:
        mine = LR.loss_metrics(terms, b.off, metrics_of(metric_key))
        s.add("trl", config, ours, {k: (metrics[k], v) for k, v in mine.items()}, METRIC)
        for k in binds:
            s.triggers("trl", config, ours, k, metrics[k])
    if beta:
        assert kl.kl_loss is not None
        s.add("trl", config, ours, {"kl": (metrics["kl"], float(np.mean(kl.kl_loss)))}, METRIC)


def check_trl(s: Suite) -> None:
    b = make_batch(31, [4, 4, 3, 1, 5, 4, 2, 4, 4, 3])
    lp, old, adv, off = b.lp_f, b.old_f, b.adv, b.off
    for cap, level in ((5.0, "token"), (2.0, "token"), (2.0, "sequence")):
        trl_case(
            s,
            b,
            f'loss_type="cispo", epsilon_high={cap}, importance_sampling_level="{level}"',
            f"cispo_terms(upper={cap}, ratio_level={level})",
            loss_type="cispo",
            level=level,
            make=lambda cap=cap, level=level: LT.cispo_terms(
                lp, old, adv, off, upper=cap, ratio_level=level
            ),
            metric_key="trl/cispo",
            trl_kw={"eps": (0.2, cap)},
            binds=("cispo_clip_ratio",),
        )
    trl_case(
        s,
        b,
        'loss_type="cispo", epsilon_high=2, beta=0.04',
        "cispo_terms(upper=2) − β·kl",
        loss_type="cispo",
        beta=0.04,
        make=lambda: LT.cispo_terms(lp, old, adv, off, upper=2.0),
        metric_key="trl/cispo",
        trl_kw={"eps": (0.2, 2.0)},
    )
    for taus, level, beta in (
        ((1.0, 1.05), "token", 0.0),
        ((0.5, 2.0), "token", 0.0),
        ((1.0, 1.05), "sequence", 0.0),
        ((1.0, 1.05), "token", 0.04),
    ):
        trl_case(
            s,
            b,
            f'loss_type="sapo", sapo_temperature_pos/neg={taus}, level="{level}", beta={beta}',
            f"sapo_terms(tau_pos={taus[0]}, tau_neg={taus[1]}, ratio_level={level})",
            loss_type="sapo",
            level=level,
            beta=beta,
            make=lambda taus=taus, level=level: LT.sapo_terms(
                lp, old, adv, off, tau_pos=taus[0], tau_neg=taus[1], ratio_level=level
            ),
            metric_key="trl/sapo",
            trl_kw={"sapo": taus},
        )
    for eps, level in (((3e-4, 4e-4), "sequence"), ((0.2, 0.28), "token")):
        trl_case(
            s,
            b,
            f'loss_type="luspo", epsilon={eps}, level="{level}"',
            f"luspo_terms(clip_eps={eps[0]}, clip_eps_high={eps[1]}, ratio_level={level})",
            loss_type="luspo",
            level=level,
            make=lambda eps=eps, level=level: LT.luspo_terms(
                lp, old, adv, off, clip_eps=eps[0], clip_eps_high=eps[1], ratio_level=level
            ),
            metric_key="trl/luspo",
            trl_kw={"eps": eps},
            binds=("clip_ratio/low_mean", "clip_ratio/high_mean"),
        )
    trl_luspo_kl(s, b, (3e-4, 4e-4))
    for kl in ((2.0, 3.0, 3.0, 2.0), (1.0, 0.5, 4.0, 1.5)):
        trl_case(
            s,
            b,
            f'loss_type="vespo", vespo_k_pos/lambda_pos/k_neg/lambda_neg={kl}',
            f"vespo_terms(k_pos={kl[0]}, lambda_pos={kl[1]}, k_neg={kl[2]}, lambda_neg={kl[3]})",
            loss_type="vespo",
            make=lambda kl=kl: LT.vespo_terms(
                lp, old, adv, off, k_pos=kl[0], lambda_pos=kl[1], k_neg=kl[2], lambda_neg=kl[3]
            ),
            metric_key="trl/vespo",
            trl_kw={"vespo": kl},
            binds=("vespo/phi_seq_mean",),
        )
    # the vLLM importance-sampling correction, every mode, on the clipped surrogate (dapo),
    # on CISPO, and inside VESPO's weight; one token without a sampler log-prob (NaN)
    sampling = b.roll.copy()
    sampling[9, 0] = np.nan
    roll_f = sampling[b.mask]
    modes: list[tuple[Any, float | None, float | None]] = [
        ("sequence_mask", 3.0, None),
        ("sequence_truncate", 3.0, None),
        ("token_truncate", 2.0, None),
        ("token_mask", 2.0, 0.5),
        ("sequence_mask", 3.0, 0.5),
    ]
    for mode, cmax, cmin in modes:
        ratio = trl_is_ratio(b, mode, cmax, cmin, sampling)
        corr = LT.trl_vllm_is_correction(old, roll_f, off, mode=mode, clip_max=cmax, clip_min=cmin)
        cfg = f"vllm_importance_sampling_mode={mode}, clip_max={cmax}, clip_min={cmin}"
        ours = f"trl_vllm_is_correction(mode={mode}, clip_max={cmax}, clip_min={cmin})"
        theirs = trl_is_metrics(b, ratio, mode, sampling)
        s.add(
            "trl",
            f"{cfg}: sampling/* metrics (re-expressed lines)",
            ours,
            {k: (v, corr.metrics[k]) for k, v in theirs.items()},
        )
        w_pad = ratio.expand(b.mask.shape) if ratio.shape[1] == 1 else ratio
        s.close("trl", f"{cfg}: ratio", ours, "weight", b.flat(w_pad), corr.weight)
        bound = (ratio == 0) if mode.endswith("mask") else (ratio == cmax)
        s.triggers(
            "trl", f"{cfg}: ratio", ours, "share masked or truncated", float(bound.double().mean())
        )
        trl_dapo_is(s, b, f'loss_type="dapo", {cfg}', f"core token_terms × {ours}", ratio, corr)
    ratio = trl_is_ratio(b, "sequence_truncate", 3.0, None, sampling)
    corr = LT.trl_vllm_is_correction(old, roll_f, off, mode="sequence_truncate", clip_max=3.0)
    trl_case(
        s,
        b,
        'loss_type="cispo", epsilon_high=5, vllm_importance_sampling_mode=sequence_truncate',
        "cispo_terms(upper=5) × trl_vllm_is_correction(sequence_truncate)",
        loss_type="cispo",
        make=lambda: LT.cispo_terms(lp, old, adv, off, upper=5.0),
        metric_key="trl/cispo",
        trl_kw={"eps": (0.2, 5.0)},
        is_corr=corr,
        is_ratio=ratio,
    )
    vespo_modes: list[tuple[Any, float | None]] = [("token_truncate", None), ("token_mask", 0.5)]
    for mode, cmin in vespo_modes:
        ratio = trl_is_ratio(b, mode, 2.0, cmin, sampling)
        corr = LT.trl_vllm_is_correction(old, roll_f, off, mode=mode, clip_max=2.0, clip_min=cmin)
        trl_case(
            s,
            b,
            f'loss_type="vespo", vllm_importance_sampling_mode={mode} (ratio inside φ)',
            f"vespo_terms(is_ratio=trl_vllm_is_correction({mode}).weight)",
            loss_type="vespo",
            make=lambda corr=corr: LT.vespo_terms(lp, old, adv, off, is_ratio=corr.weight),
            metric_key="trl/vespo",
            trl_kw={},
            is_ratio=ratio,
        )


def trl_luspo_kl(s: Suite, b: Batch, eps: tuple[float, float]) -> None:
    """LUSPO with β: the KL is inside luspo_terms (the core's token_terms), not added."""
    lp_t = b.t("logp", grad=True)
    loss, metrics = trl_compute_loss(
        b, lp_t, loss_type="luspo", level="sequence", beta=0.04, eps=eps
    )
    loss.backward()
    assert lp_t.grad is not None
    t = LT.luspo_terms(
        b.lp_f,
        b.old_f,
        b.adv,
        b.off,
        ref_logp=b.ref_f,
        clip_eps=eps[0],
        clip_eps_high=eps[1],
        beta=0.04,
    )
    assert t.grad is not None and t.agg is not None
    cfg = f'loss_type="luspo", epsilon={eps}, level="sequence", beta=0.04'
    ours = "luspo_terms(beta=0.04, ref_logp=...)"
    s.add("trl", cfg, ours, {"loss": (float(loss.detach()), our_loss(t, b.off, t.agg))})
    s.close("trl", cfg, ours, "∂loss/∂logp", b.flat(lp_t.grad), our_grad(t.grad, b.lengths, t.agg))
    mine = LR.loss_metrics(t, b.off, ROWS["trl/luspo"].metrics_for(None))
    s.add("trl", cfg, ours, {k: (metrics[k], v) for k, v in mine.items()}, METRIC)


def trl_dapo_is(
    s: Suite, b: Batch, cfg: str, ours: str, ratio: torch.Tensor, corr: LR.Correction
) -> None:
    lp_t = b.t("logp", grad=True)
    loss, _ = trl_compute_loss(b, lp_t, loss_type="dapo", is_ratio=ratio)
    loss.backward()
    assert lp_t.grad is not None
    tt = token_terms(b.lp_f, b.old_f, None, b.adv, b.off, beta=0.0)
    gp, _ = token_gradients(tt, offsets=b.off, beta=0.0)
    term = LR._mul(tt.policy, corr.weight)
    s.add(
        "trl",
        cfg,
        ours,
        {"loss": (float(loss.detach()), -aggregate(term, b.off, agg="token-mean"))},
    )
    s.close(
        "trl",
        cfg,
        ours,
        "∂loss/∂logp",
        b.flat(lp_t.grad),
        our_grad(LR._mul(gp, corr.weight), b.lengths, "token-mean"),
    )


def _clipped(b: Batch, eps: tuple[float, float] = (0.2, 0.2)) -> LR.PolicyTerms:
    """The core's clipped surrogate of the batch (TRL's grpo/bnpo/dr_grpo/dapo policy term)."""
    kw = {"clip_eps": eps[0], "clip_eps_high": eps[1], "beta": 0.0}
    tt = token_terms(b.lp_f, b.old_f, None, b.adv, b.off, **kw)  # type: ignore[arg-type]
    gp, _ = token_gradients(tt, offsets=b.off, **kw)  # type: ignore[arg-type]
    return LR.PolicyTerms(term=tt.policy, grad=gp, ratio=tt.ratio)


def check_trl_off_policy_mask(s: Suite) -> None:
    """TRL 1.16.0's off-policy sequence mask (``off_policy_mask_threshold``, DeepSeek-V3.2
    eq. 9): ``GRPOTrainer.get_off_policy_mask`` against ``off_policy_mask`` per answer (the
    sampler's log-probs with one NaN token, and without a sampler: the old log-probs), then
    ``_compute_loss`` with the mask on the clipped surrogate (dapo, grpo), cispo, sapo and
    vespo (loss, ∂loss/∂logp), and through the tool (``grpo-cli objective`` of the same
    tokens in 64-token batches)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    b = make_batch(41, [4, 4, 3, 1, 5, 4, 2, 4, 4, 3])
    lp, old, adv, off = b.lp_f, b.old_f, b.adv, b.off
    sampling = b.roll.copy()
    sampling[9, 0] = np.nan  # a token the sampler could not score: no KL evidence
    sampling[4, b.mask[4]] += 0.6  # an answer with A < 0 that drifted by 0.6 a token
    starts = off[:-1]
    for delta in (0.05, 0.3, 2.0):
        for name, samp in (("sampling_per_token_logps", sampling), ("old_per_token_logps", b.old)):
            theirs = GRPOTrainer.get_off_policy_mask(
                advantages=torch.tensor(b.adv)[:, None],
                per_token_logps=b.t("logp"),
                sampling_per_token_logps=torch.tensor(samp),
                mask=b.m.double(),
                off_policy_threshold=delta,
            )
            ours = LT.off_policy_mask(lp, samp[b.mask], adv, off, threshold=delta)
            cfg = f"get_off_policy_mask(off_policy_threshold={delta}) of {name}"
            ours_name = f"off_policy_mask(threshold={delta})"
            s.close("trl", cfg, ours_name, "keep per answer", theirs.numpy()[:, 0], ours[starts])
            if name.startswith("sampling") and delta < 2.0:
                s.triggers("trl", cfg, ours_name, "answers dropped", float(1 - theirs.mean()))
    for delta in (0.05, 0.3):
        opsm = (delta, sampling)
        cfg = f"off_policy_mask_threshold={delta}, sampling_per_token_logps"
        ours = f"× off_policy_mask(threshold={delta})"
        for loss_type in ("dapo", "grpo"):
            trl_case(s, b, f'loss_type="{loss_type}", {cfg}', f"core clipped surrogate {ours}",
                     loss_type=loss_type, make=lambda: _clipped(b), metric_key=None,
                     trl_kw={}, opsm=opsm)  # fmt: skip
        trl_case(s, b, f'loss_type="cispo", epsilon_high=2, {cfg}', f"cispo_terms(upper=2) {ours}",
                 loss_type="cispo", make=lambda: LT.cispo_terms(lp, old, adv, off, upper=2.0),
                 metric_key="trl/cispo", trl_kw={"eps": (0.2, 2.0)}, opsm=opsm)  # fmt: skip
        trl_case(s, b, f'loss_type="sapo", beta=0.04, {cfg}', f"sapo_terms() − β·kl {ours}",
                 loss_type="sapo", beta=0.04, make=lambda: LT.sapo_terms(lp, old, adv, off),
                 metric_key="trl/sapo", trl_kw={}, opsm=opsm)  # fmt: skip
        trl_case(s, b, f'loss_type="vespo", {cfg}', f"vespo_terms() {ours}",
                 loss_type="vespo", make=lambda: LT.vespo_terms(lp, old, adv, off),
                 metric_key="trl/vespo", trl_kw={}, opsm=opsm)  # fmt: skip
    _off_policy_mask_in_the_tool(s, b)


def _off_policy_mask_in_the_tool(s: Suite, b: Batch) -> None:
    """The fold's loss with the mask (``--preset trl``: dapo, β 0; and grpo's aggregation)
    against TRL's ``_compute_loss`` on the same tokens, written ragged with their advantages
    and the sampler's log-probs."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [b.mask[i].nonzero()[0] for i in range(b.mask.shape[0])]
    table: dict[str, Any] = {"group": list(range(len(rows))), "advantage": b.adv.tolist()}
    roll = b.roll.copy()
    roll[4, b.mask[4]] += 0.6  # as above: dropped at both thresholds
    for col, arr in (("logp", b.logp), ("old_logp", b.old), ("ref_logp", b.ref),
                     ("rollout_logp", roll)):  # fmt: skip
        table[col] = [arr[i, k].tolist() for i, k in enumerate(rows)]
    path = Path(tempfile.mkdtemp()) / "opsm.parquet"
    pq.write_table(pa.table(table), path, row_group_size=3)
    for delta in (0.05, 0.3):
        for loss_type, agg in (("dapo", "token-mean"), ("grpo", "seq-mean-token-mean")):
            loss, _ = trl_compute_loss(b, b.t("logp"), loss_type=loss_type, opsm=delta,
                                       sampling=roll)  # fmt: skip
            flags = ["--preset", "trl", "--agg", agg, "--loss-param",
                     f"off_policy_mask_threshold={delta}"]  # fmt: skip
            doc = _tool(path, flags)
            s.add("trl", f'loss_type="{loss_type}", off_policy_mask_threshold={delta}',
                  f"grpo-cli objective {' '.join(flags)}",
                  {"loss": (float(loss), doc["loss"])})  # fmt: skip


# ------------------------------------------------------------------------- verl
def verl_config(
    b: Batch,
    loss_mode: str,
    *,
    low: float = 0.2,
    high: float = 0.2,
    agg: str = "token-mean",
    c: float = 3.0,
    taus: tuple[float, float] = (1.0, 1.05),
    **policy: Any,
) -> Any:
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    B = b.mask.shape[0]
    return ActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=B,
        ppo_micro_batch_size_per_gpu=B,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        loss_agg_mode=agg,
        use_dynamic_bsz=False,
        rollout_n=1,
        tau_pos=taus[0],
        tau_neg=taus[1],
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy),
    )


def verl_call(
    b: Batch,
    name: str,
    cfg: Any,
    *,
    mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[float, dict, np.ndarray]:
    """The registered loss ``name``: loss, metrics, ∂loss/∂logp on the valid tokens."""
    import verl.trainer.ppo.core_algos as ca

    lp = b.t("logp", grad=True)
    loss, metrics = ca.get_policy_loss_fn(name)(
        old_log_prob=b.t("old"),
        log_prob=lp,
        advantages=b.adv_tok,
        response_mask=b.m if mask is None else mask,
        loss_agg_mode=cfg.loss_agg_mode,
        config=cfg,
        rollout_is_weights=is_weights,
    )
    loss.backward()
    assert lp.grad is not None
    return float(loss.detach()), metrics, b.flat(lp.grad)


def verl_case(
    s: Suite,
    b: Batch,
    name: str,
    cfg: Any,
    config: str,
    ours: str,
    terms: LR.PolicyTerms,
    *,
    key: str | None = None,
    binds: tuple[str, ...] = (),
    rel: float = REL,
) -> None:
    loss, metrics, grad = verl_call(b, name, cfg)
    agg = terms.agg or cfg.loss_agg_mode
    rel = SEQ_MEAN if agg == "seq-mean-token-mean" and name != "geo_mean" else rel
    s.add("verl", config, ours, {"loss": (loss, our_loss(terms, b.off, agg))}, rel)
    if terms.grad is not None:
        s.close(
            "verl", config, ours, "∂loss/∂logp", grad, our_grad(terms.grad, b.lengths, agg), rel
        )
    mine = LR.loss_metrics(terms, b.off, metrics_of(key or f"verl/{name}"))
    assert set(mine) == set(metrics), (name, set(mine) ^ set(metrics))
    s.add("verl", config, ours, {k: (metrics[k], v) for k, v in mine.items()}, METRIC)
    for k in binds:
        s.triggers("verl", config, ours, k, metrics[k])


def check_verl(s: Suite) -> None:
    b = make_batch(41, [4, 4, 3, 1, 5, 4, 2, 4, 4, 3, 4])
    p = make_batch(42, [4, 4, 3, 1, 5, 4, 2, 4, 4, 3, 4], probabilities=True)
    for div in ("tv", "kl"):
        for low, high, c in ((0.2, 0.2, 3.0), (0.05, 0.1, 20.0), (0.02, 0.01, 1.5)):
            t = LV.dppo_terms(
                p.lp_f,
                p.old_f,
                p.adv,
                p.off,
                divergence=div,
                clip_low=low,
                clip_high=high,
                ratio_cap=c,
            )
            verl_case(
                s,
                p,
                f"dppo_{div}",
                verl_config(p, f"dppo_{div}", low=low, high=high, c=c),
                f"loss_mode=dppo_{div}, clip_ratio_low/high={low}/{high}, clip_ratio_c={c}",
                f"dppo_terms(divergence={div}, clip_low={low}, clip_high={high}, ratio_cap={c})",
                t,
                binds=("actor/pg_clipfrac", "actor/pg_clipfrac_lower") if c < 20 else (),
            )
    for taus in ((1.0, 1.05), (0.5, 2.0)):
        t = LT.sapo_terms(
            b.lp_f, b.old_f, b.adv, b.off, tau_pos=taus[0], tau_neg=taus[1], log_ratio_clamp=20.0
        )
        verl_case(
            s,
            b,
            "sapo",
            verl_config(b, "sapo", taus=taus),
            f"loss_mode=sapo, tau_pos/neg={taus} (always seq-mean-token-mean)",
            f"sapo_terms(tau_pos={taus[0]}, tau_neg={taus[1]}, log_ratio_clamp=20)",
            t,
        )
    for agg in ("token-mean", "seq-mean-token-sum"):
        verl_case(
            s,
            b,
            "gpg",
            verl_config(b, "gpg", agg=agg),
            f"loss_mode=gpg, {agg}",
            "gpg_terms",
            LV.gpg_terms(b.lp_f, b.adv, b.off),
        )
    check_clip_cov(s, b)
    for ratio, coef in ((0.0002, 0.1), (0.05, 1.0)):
        t = LV.kl_cov_terms(b.lp_f, b.old_f, b.adv, b.off, kl_cov_ratio=ratio, ppo_kl_coef=coef)
        verl_case(
            s,
            b,
            "kl_cov",
            verl_config(b, "kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=coef),
            f"loss_mode=kl_cov, kl_cov_ratio={ratio}, ppo_kl_coef={coef}",
            f"kl_cov_terms(kl_cov_ratio={ratio}, ppo_kl_coef={coef})",
            t,
        )
    for low, high in ((0.2, 0.2), (0.4, 0.1)):
        t = LV.geo_mean_terms(b.lp_f, b.old_f, b.adv, b.off, clip_low=low, clip_high=high)
        verl_case(
            s,
            b,
            "geo_mean",
            verl_config(b, "geo_mean", low=low, high=high),
            f"loss_mode=geo_mean, clip_ratio_low/high={low}/{high}",
            f"geo_mean_terms(clip_low={low}, clip_high={high})",
            t,
            binds=("actor/pg_clipfrac", "actor/pg_clipfrac_lower"),
        )
    for beta in (0.1, 1.0):
        verl_case(
            s,
            b,
            "dro",
            verl_config(b, "dro", dro_beta=beta),
            f"loss_mode=dro, dro_beta={beta}",
            f"dro_terms(beta={beta})",
            LV.dro_terms(b.lp_f, b.old_f, b.adv, b.off, beta=beta),
        )
    for low, high, agg in ((0.2, 0.2, "token-mean"), (0.2, 0.28, "seq-mean-token-sum")):
        t = LT.cispo_terms(
            b.lp_f, b.old_f, b.adv, b.off, lower=1 - low, upper=1 + high, log_ratio_clamp=20.0
        )
        verl_case(
            s,
            b,
            "cispo",
            verl_config(b, "cispo", low=low, high=high, agg=agg),
            f"loss_mode=cispo, clip_ratio_low/high={low}/{high}, {agg}",
            f"cispo_terms(lower={1 - low:g}, upper={1 + high:g}, log_ratio_clamp=20)",
            t,
            binds=("actor/pg_clipfrac",),
        )
    check_rollout_correction(s, b)
    check_bypass(s, b)
    check_rejection_in_the_tool(s)
    check_bypass_in_the_tool(s)


def check_clip_cov(s: Suite, b: Batch) -> None:
    import verl.trainer.ppo.core_algos as ca

    T = int(b.mask.sum())
    for ratio, lb, ub in (
        (0.0002, 1.0, 5.0),
        (0.0002, 2.5, 5.0),
        (0.01, 0.1, 5.0),
        (0.5, 0.5, 5.0),
    ):
        cfg = verl_config(b, "clip_cov", clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub)
        config = f"loss_mode=clip_cov, clip_cov_ratio={ratio}, lb={lb}, ub={ub}"
        exp = LV.clip_cov_terms(
            b.lp_f, b.old_f, b.adv, b.off, clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub
        )
        n = int(exp.flags["candidate"].sum())
        k_all = max(int(ratio * T), 1)
        k = min(k_all, n)
        for seed in (0, 1):
            torch.manual_seed(seed)
            loss, metrics, grad = verl_call(b, "clip_cov", cfg)
            torch.manual_seed(seed)
            order = torch.randperm(n).numpy()
            t = LV.clip_cov_terms(
                b.lp_f,
                b.old_f,
                b.adv,
                b.off,
                clip_cov_ratio=ratio,
                clip_cov_lb=lb,
                clip_cov_ub=ub,
                selection="order",
                order=order,
            )
            ours = f"clip_cov_terms(..., selection=order, order=torch seed {seed})"
            c = f"{config} ({n} candidates, {k} chosen)"
            s.add("verl", c, ours, {"loss": (loss, our_loss(t, b.off, "token-mean"))})
            assert t.grad is not None
            s.close("verl", c, ours, "∂loss/∂logp", grad, our_grad(t.grad, b.lengths, "token-mean"))
            mine = LR.loss_metrics(t, b.off, ROWS["verl/clip_cov"].metrics_for(None))
            s.add("verl", c, ours, {q: (metrics[q], v) for q, v in mine.items()}, METRIC)
            s.triggers("verl", c, ours, "actor/pg_clipfrac", metrics["actor/pg_clipfrac"])
        # the expectation over verl's draw: with one token chosen of n, the mean of verl's
        # losses over the n choices (each reached by some seed)
        if k == 1 and 1 < n <= 12:
            by_choice: dict[int, float] = {}
            for seed in range(400):
                torch.manual_seed(seed)
                loss, _, _ = verl_call(b, "clip_cov", cfg)
                torch.manual_seed(seed)
                by_choice.setdefault(int(torch.randperm(n)[0]), loss)
                if len(by_choice) == n:
                    break
            assert len(by_choice) == n
            s.add(
                "verl",
                f"{config}: mean of verl's loss over its {n} possible choices",
                "clip_cov_terms(selection=expected)",
                {
                    "expected loss": (
                        float(np.mean(list(by_choice.values()))),
                        our_loss(exp, b.off, "token-mean"),
                    )
                },
            )
        elif n <= k:
            loss, metrics, _ = verl_call(b, "clip_cov", cfg)
            s.add(
                "verl",
                f"{config}: every candidate chosen ({n} candidates ≤ k = {k_all})",
                "clip_cov_terms(selection=expected)",
                {"loss": (loss, our_loss(exp, b.off, "token-mean"))},
            )
    del ca


ROLLOUT_CONFIGS: list[dict[str, Any]] = [
    {"rollout_is": "token", "rollout_is_threshold": 2.0},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.5_5.0"},
    {"rollout_is": "token", "rollout_is_threshold": "0.5_2.0", "rollout_is_batch_normalize": True},
    {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True},
    {"rollout_is": None, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.6_1.5"},
    {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "token_k2,token_k3",
        "rollout_rs_threshold": "0.02,0.01",
    },
    {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_sum_k1,seq_sum_k2,seq_sum_k3",
        "rollout_rs_threshold": "0.3_3.0,1.0,1.0",
    },
    {
        "rollout_is": None,
        "rollout_rs": "seq_mean_k1,seq_mean_k2,seq_mean_k3",
        "rollout_rs_threshold": "1.15",
    },
    {
        "rollout_is": "token",
        "rollout_is_threshold": 5.0,
        "rollout_rs": "seq_max_k2,seq_max_k3",
        "rollout_rs_threshold": "0.1,0.08",
    },
]


def check_rollout_correction(s: Suite, b: Batch) -> None:
    """Decoupled mode: ray_trainer's compute_rollout_correction_and_add_to_batch on the
    batch, then a registered loss with its weights and its modified mask."""
    from verl.protocol import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    for rc in ROLLOUT_CONFIGS:
        batch = DataProto.from_dict(
            tensors={
                "old_log_probs": b.t("old"),
                "rollout_log_probs": b.t("roll"),
                "response_mask": b.m.long(),
            }
        )
        batch, metrics = compute_rollout_correction_and_add_to_batch(
            batch, RolloutCorrectionConfig(**rc)
        )
        corr = LVR.verl_rollout_correction(b.old_f, b.roll_f, b.off, **rc)
        label = ", ".join(f"{k}={v}" for k, v in rc.items())
        ours = f"verl_rollout_correction({label})"
        config = f"rollout_correction: {label}"
        assert set(metrics) == set(corr.metrics), set(metrics) ^ set(corr.metrics)
        exact = {
            k: (v, corr.metrics[k])
            for k, v in metrics.items()
            if "fraction" not in k and "oob" not in k
        }
        fractions = {k: (v, corr.metrics[k]) for k, v in metrics.items() if k not in exact}
        s.add("verl", config, ours, exact)
        s.add("verl", config, ours, fractions, METRIC)
        new_mask = batch.batch["response_mask"].bool()
        keep_theirs = new_mask.numpy()[b.mask]
        s.add(
            "verl",
            config,
            ours,
            {"rejected tokens differing": (0.0, float((keep_theirs != corr.keep).sum()))},
        )
        if "rollout_rs" in rc:
            s.triggers(
                "verl",
                config,
                ours,
                "rollout_rs_masked_fraction",
                metrics["rollout_corr/rollout_rs_masked_fraction"],
            )
        w_t = batch.batch["rollout_is_weights"] if rc.get("rollout_is") else None
        if w_t is not None:
            s.close("verl", config, ours, "rollout_is_weights", b.flat(w_t), corr.weight)
        # the weights and the rejection inside the losses (vanilla through the core, cispo,
        # geo_mean's geometric mean of the weights)
        off, (lp, old, w), kept = LR.drop_tokens(corr.keep, b.off, b.lp_f, b.old_f, corr.weight)
        adv, lengths = b.adv[kept], np.diff(off)
        for name in ("vanilla", "cispo", "geo_mean"):
            cfg = verl_config(
                b, name, agg="seq-mean-token-sum" if name == "cispo" else "token-mean"
            )
            import verl.trainer.ppo.core_algos as ca

            lp_t = b.t("logp", grad=True)
            loss, met = ca.get_policy_loss_fn(name)(
                old_log_prob=b.t("old"),
                log_prob=lp_t,
                advantages=b.adv_tok,
                response_mask=new_mask,
                loss_agg_mode=cfg.loss_agg_mode,
                config=cfg,
                rollout_is_weights=w_t,
            )
            loss.backward()
            assert lp_t.grad is not None
            grad_theirs = lp_t.grad.numpy()[new_mask.numpy()]
            if name == "vanilla":
                t = LVR._vanilla(lp, old, np.repeat(adv, lengths), off, 0.2, 0.2, 3.0)
                t = LR.apply_correction(t, w)
                key, fn = "verl/bypass_mode/ppo_clip", "core clipped surrogate"
            elif name == "cispo":
                t = LR.apply_correction(
                    LT.cispo_terms(lp, old, adv, off, lower=0.8, upper=1.2, log_ratio_clamp=20.0), w
                )
                key, fn = "verl/cispo", "cispo_terms"
            else:
                t = LV.geo_mean_terms(lp, old, adv, off, is_weight=w if w_t is not None else None)
                key, fn = "verl/geo_mean", "geo_mean_terms(is_weight=...)"
            agg = t.agg or cfg.loss_agg_mode
            c = f"{config}; loss_mode={name}, {cfg.loss_agg_mode}"
            o = f"{fn} × weight, drop_tokens(keep)"
            # geo_mean averages over all the micro-batch's rows, a fully rejected one as 0
            rows = len(kept) / len(b.adv) if name == "geo_mean" else 1.0
            s.add("verl", c, o, {"loss": (float(loss.detach()), rows * our_loss(t, off, agg))})
            assert t.grad is not None
            s.close("verl", c, o, "∂loss/∂logp", grad_theirs, rows * our_grad(t.grad, lengths, agg))
            mine = LR.loss_metrics(t, off, metrics_of(key))
            s.add("verl", c, o, {q: (met[q], v) for q, v in mine.items()}, METRIC)


TOOL_REJECTIONS: list[dict[str, Any]] = [
    {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1",
     "rollout_rs_threshold": "0.6_1.5"},
    {"rollout_is": None, "rollout_rs": "seq_max_k2,token_k3", "rollout_rs_threshold": "0.2,0.05"},
    {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k1",
     "rollout_rs_threshold": "0.9_1.1"},
]  # fmt: skip


def _tool_rollouts() -> tuple[Any, np.ndarray, Path, torch.Tensor]:
    """oracle.make_rollouts' rollouts with a sampler's log-probs (two answers off by ∓1 a
    token), written as one parquet file of 5-row row groups; and their token rewards."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    r = make_rollouts(23, [4, 4, 3, 1, 5, 4, 2, 4, 4], shuffle=True)
    rng = np.random.default_rng(24)
    B, Lw = r.mask.shape
    roll = r.old + rng.normal(0.0, 0.2, size=(B, Lw))
    roll[5], roll[9] = r.old[5] - 1.0, r.old[9] + 1.0  # two answers the sampler got wrong
    roll[~r.mask] = 0.0
    rows = [r.mask[i].nonzero()[0] for i in range(B)]
    table = {"group": r.group, "reward": r.reward}
    for col, arr in (("logp", r.logp), ("old_logp", r.old), ("ref_logp", r.ref),
                     ("rollout_logp", roll)):  # fmt: skip
        table[col] = [arr[i, k].tolist() for i, k in enumerate(rows)]
    path = Path(tempfile.mkdtemp()) / "rollouts.parquet"
    pq.write_table(pa.table(table), path, row_group_size=5)
    token_rewards = torch.zeros(B, Lw, dtype=torch.float64)
    token_rewards[torch.arange(B), torch.tensor(r.mask.sum(1) - 1)] = torch.tensor(r.reward)
    return r, roll, path, token_rewards


def _tool(path: Path, flags: list[str]) -> dict[str, Any]:
    """``grpo-cli objective PATH FLAGS --json`` in batches of 64 tokens."""
    import json
    import os
    import subprocess

    cmd = [sys.executable, "-m", "grpo_cli", "objective", str(path), *flags, "--json"]
    env = {**os.environ, "GRPO_CLI_BATCH_TOKENS": "64"}
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"grpo-cli failed: {' '.join(cmd)}\n{out.stderr}")
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _params(flag: str, rc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in rc.items():
        out += [flag, f"{k}={'off' if v is None else v}"]
    return out


def _compare_step(
    s: Suite,
    config: str,
    ours: str,
    step: tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, Any],
    path: Path,
    flags: list[str],
    agg: str,
) -> dict[str, Any]:
    """The actor's ``ppo_loss`` total (the policy loss plus ``low_var_kl`` at 0.001 over
    ``mask`` with the config's ``global_batch_info``) against the tool's ``loss``,
    ``actor/pg_loss`` and ``actor/kl_loss``; returns the tool's trainer metrics."""
    import verl.trainer.ppo.core_algos as ca

    pg_loss, logp, ref, mask, cfg = step
    kld = ca.kl_penalty(logp, ref, kl_penalty="low_var_kl")
    kl_loss = ca.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=agg, **cfg.global_batch_info)
    doc = _tool(path, [*flags, "--agg", agg])
    tm: dict[str, Any] = doc["trainer_metrics"]["metrics"]
    rel = SEQ_MEAN if agg == "seq-mean-token-mean" else REL
    loss = float(pg_loss) + 0.001 * float(kl_loss)
    s.add("verl", config, ours, {"loss": (loss, doc["loss"])}, rel)
    s.add(
        "verl", config, ours,
        {"actor/pg_loss": (float(pg_loss), tm["actor/pg_loss"]),
         "actor/kl_loss": (float(kl_loss), tm["actor/kl_loss"])}, rel,
    )  # fmt: skip
    return tm


def _add_metrics(
    s: Suite, config: str, ours: str, theirs: dict[str, float], tm: dict[str, Any]
) -> None:
    """The correction's and the loss's logged metrics (the spreads of one batch left out:
    the tool folds several); fractions at the float32-mask tolerance."""
    mergeable = {k: v for k, v in theirs.items() if not k.endswith("std")}
    exact = {k: (v, tm[k]) for k, v in mergeable.items() if "fraction" not in k}
    s.add("verl", config, ours, exact)
    fractions = {k: (v, tm[k]) for k, v in mergeable.items() if "fraction" in k}
    s.add("verl", config, ours, fractions, METRIC)


def check_rejection_in_the_tool(s: Suite) -> None:
    """The CLI's fold with rejection sampling (``objective --preset verl --correction
    verl-rollout``, batches of 64 tokens) against verl as its trainer runs a step in
    decoupled mode: ``compute_rollout_correction_and_add_to_batch`` replaces the mask, then
    ``compute_grpo_outcome_advantage`` and the actor's ``ppo_loss`` (vanilla with the IS
    weights and ``low_var_kl`` at 0.001, both aggregated with ``global_batch_info`` as it
    sets it: the kept tokens, the mini-batch's rows)."""
    import verl.trainer.ppo.core_algos as ca
    from verl.protocol import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    r, roll, path, token_rewards = _tool_rollouts()
    B = r.mask.shape[0]
    logp, old, ref = (torch.tensor(x, dtype=torch.float64) for x in (r.logp, r.old, r.ref))
    for rc in TOOL_REJECTIONS:
        batch = DataProto.from_dict(
            tensors={
                "old_log_probs": old,
                "rollout_log_probs": torch.tensor(roll, dtype=torch.float64),
                "response_mask": torch.tensor(r.mask).long(),
            }
        )
        batch, corr_metrics = compute_rollout_correction_and_add_to_batch(
            batch, RolloutCorrectionConfig(**rc)
        )
        mask = batch.batch["response_mask"].bool()
        w = batch.batch["rollout_is_weights"] if rc.get("rollout_is") else None
        adv, _ = ca.compute_grpo_outcome_advantage(
            token_rewards, mask, np.array(r.group, dtype=object), epsilon=1e-6
        )
        label = ", ".join(f"{k}={v}" for k, v in rc.items())
        flags = ["--preset", "verl", "--correction", "verl-rollout",
                 *_params("--correction-param", rc)]  # fmt: skip
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
            cfg = verl_config_rows(B, agg)
            cfg.global_batch_info.update(
                dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=B,
                loss_scale_factor=None,
            )  # fmt: skip
            pg_loss, pg_metrics = ca.compute_policy_loss_vanilla(
                old, logp, adv, mask, loss_agg_mode=agg, config=cfg, rollout_is_weights=w
            )
            config = f"ray_trainer rollout_correction {label} + ppo_loss, {agg}"
            ours = "objective " + " ".join(flags[2:])
            tm = _compare_step(s, config, ours, (pg_loss, logp, ref, mask, cfg), path, flags, agg)
            s.add("verl", config, ours, {k: (pg_metrics[k], tm[k]) for k in VERL_PG}, METRIC)
            _add_metrics(s, config, ours, corr_metrics, tm)
            if agg == "token-mean":
                s.triggers(
                    "verl", config, ours, "answers rejected whole",
                    float(int((~mask.any(1)).sum()) - int((~torch.tensor(r.mask).any(1)).sum())),
                )  # fmt: skip


def check_bypass_in_the_tool(s: Suite) -> None:
    """The CLI's fold of ``--loss verl/bypass_mode`` against verl's step in bypass mode:
    ``apply_bypass_mode`` (old_log_probs = rollout_log_probs), GRPO advantages, the
    actor's ``ppo_loss`` calling ``compute_policy_loss_bypass_mode`` on the unrejected
    mask with ``global_batch_info`` as it sets it (every token, the rows) and
    ``low_var_kl`` at 0.001 over the same mask."""
    import verl.trainer.ppo.core_algos as ca
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    r, roll, path, token_rewards = _tool_rollouts()
    B = r.mask.shape[0]
    m = torch.tensor(r.mask)
    logp, ref = (torch.tensor(x, dtype=torch.float64) for x in (r.logp, r.ref))
    rollout = torch.tensor(roll, dtype=torch.float64)
    adv, _ = ca.compute_grpo_outcome_advantage(
        token_rewards, m, np.array(r.group, dtype=object), epsilon=1e-6
    )
    for rc in BYPASS:
        label = ", ".join(f"{k}={v}" for k, v in rc.items())
        params = {("bypass_loss_type" if k == "loss_type" else k): v for k, v in rc.items()}
        flags = ["--preset", "verl", "--loss", "verl/bypass_mode",
                 *_params("--loss-param", params)]  # fmt: skip
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
            cfg = verl_config_rows(
                B, agg, "bypass_mode",
                rollout_correction=RolloutCorrectionConfig(bypass_mode=True, **rc),
            )  # fmt: skip
            cfg.global_batch_info.update(
                dp_size=1, batch_num_tokens=int(m.sum()), global_batch_size=B,
                loss_scale_factor=None,
            )  # fmt: skip
            pg_loss, pg_metrics = ca.get_policy_loss_fn("bypass_mode")(
                old_log_prob=rollout, log_prob=logp, advantages=adv, response_mask=m,
                loss_agg_mode=agg, config=cfg,
            )  # fmt: skip
            config = f"apply_bypass_mode {label} + ppo_loss, {agg}"
            ours = "objective " + " ".join(flags[2:])
            tm = _compare_step(s, config, ours, (pg_loss, logp, ref, m, cfg), path, flags, agg)
            _add_metrics(s, config, ours, pg_metrics, tm)
            if agg == "token-mean" and rc.get("rollout_rs"):
                s.triggers(
                    "verl", config, ours, "rollout_rs_masked_fraction",
                    pg_metrics["rollout_corr/rollout_rs_masked_fraction"],
                )  # fmt: skip


VERL_PG = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")


def verl_config_rows(rows: int, agg: str, loss_mode: str = "vanilla", **policy: Any) -> Any:
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    return ActorConfig(
        strategy="fsdp", ppo_mini_batch_size=rows, ppo_micro_batch_size_per_gpu=rows,
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
        loss_agg_mode=agg, use_dynamic_bsz=False, rollout_n=1,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy),
    )  # fmt: skip


BYPASS: list[dict[str, Any]] = [
    {
        "loss_type": "ppo_clip",
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": "0.6_1.5",
    },
    {"loss_type": "reinforce", "rollout_is": "sequence", "rollout_is_threshold": 2.0},
    {
        "loss_type": "reinforce",
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.05,
    },
    {
        "loss_type": "reinforce",
        "rollout_is": None,
        "rollout_rs": "seq_max_k2",
        "rollout_rs_threshold": 0.5,
    },
]


def check_bypass(s: Suite, b: Batch) -> None:
    """bypass_mode: old_log_prob = rollout_log_prob (apply_bypass_mode), the correction
    computed inside the loss from the current log-probs."""
    import verl.trainer.ppo.core_algos as ca
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    for rc in BYPASS:
        for agg in ("token-mean", "seq-mean-token-sum"):
            cfg = verl_config(
                b,
                "bypass_mode",
                agg=agg,
                rollout_correction=RolloutCorrectionConfig(bypass_mode=True, **rc),
            )
            lp_t = b.t("logp", grad=True)
            loss, met = ca.get_policy_loss_fn("bypass_mode")(
                old_log_prob=b.t("roll"),
                log_prob=lp_t,
                advantages=b.adv_tok,
                response_mask=b.m,
                loss_agg_mode=agg,
                config=cfg,
            )
            loss.backward()
            assert lp_t.grad is not None
            t, corr = LVR.verl_bypass_mode(b.lp_f, b.roll_f, b.adv, b.off, **rc)
            assert t.grad is not None
            off, (term, grad), kept = LR.drop_tokens(corr.keep, b.off, t.term, t.grad)
            keep_pad = np.zeros(b.mask.shape, bool)
            keep_pad[b.mask] = corr.keep
            label = ", ".join(f"{k}={v}" for k, v in rc.items())
            c, o = f"loss_mode=bypass_mode, {label}, {agg}", f"verl_bypass_mode({label})"
            lengths = np.diff(off)
            s.add("verl", c, o, {"loss": (float(loss.detach()), -aggregate(term, off, agg=agg))})
            s.close(
                "verl",
                c,
                o,
                "∂loss/∂logp",
                lp_t.grad.numpy()[keep_pad],
                our_grad(grad, lengths, agg),
            )
            kept_t = LR.PolicyTerms(
                term=term,
                grad=grad,
                ratio=t.ratio[corr.keep],
                flags={k: v[corr.keep] for k, v in t.flags.items()},
                values={k: v[corr.keep] for k, v in t.values.items()},
            )
            mine = LR.loss_metrics(
                kept_t, off, logged_metrics("verl/bypass_mode", bypass_loss_type=rc["loss_type"])
            )
            mine.update(corr.metrics)
            assert set(mine) == set(met), set(mine) ^ set(met)
            s.add(
                "verl",
                c,
                o,
                {
                    q: (met[q], v)
                    for q, v in mine.items()
                    if "fraction" not in q and "clipfrac" not in q
                },
            )
            s.add(
                "verl",
                c,
                o,
                {q: (met[q], v) for q, v in mine.items() if "fraction" in q or "clipfrac" in q},
                METRIC,
            )
            del kept


# --------------------------------------------------------------------- OpenRLHF
ORL: list[dict[str, Any]] = [
    {"level": "token", "mode": "mask", "gating": "ratio", "threshold": (0.5, 5.0)},
    {"level": "token", "mode": "mask", "gating": "ratio", "threshold": (0.8, 1.25)},
    {"level": "token", "mode": "clip", "gating": "ratio", "threshold": (0.5, 2.0)},
    {"level": "token", "mode": "clip", "gating": "ratio", "threshold": (0.0, 1.5)},
    {"level": "seq", "mode": "mask", "gating": "ratio", "threshold": (0.9, 1.1)},
    {"level": "token", "mode": "mask", "gating": "binary_kl", "threshold": (0.0, 0.005)},
    {"level": "seq", "mode": "mask", "gating": "binary_kl", "threshold": (0.0, 0.01)},
    {"level": "token", "mode": "mask", "gating": "tv", "threshold": (0.0, 0.05)},
    {"level": "seq", "mode": "mask", "gating": "tv", "threshold": (0.0, 0.04)},
]


def check_openrlhf(s: Suite) -> None:
    orl = load_openrlhf()
    b = make_batch(51, [4] * 8)
    for rc in ORL:
        aggs: list[tuple[float | None, Aggregation]] = [
            (None, "token-mean"),
            (3.0, "seq-mean-token-mean"),
        ]
        for dual, agg in aggs:
            policy = orl["loss"].PolicyLoss(
                clip_eps_low=0.2,
                clip_eps_high=0.2,
                dual_clip=dual,
                token_level_loss=agg == "token-mean",
                policy_loss_type="ppo",
                is_correction_level=rc["level"],
                is_correction_mode=rc["mode"],
                is_correction_gating=rc["gating"],
                is_correction_threshold=list(rc["threshold"]),
            )
            lp_t = b.t("logp", grad=True)
            loss, _clip_ratio, _ppo_kl, vllm_kl, filt = policy(
                lp_t, b.t("old"), b.adv_tok, action_mask=b.m, rollout_log_probs=b.t("roll")
            )
            loss.backward()
            assert lp_t.grad is not None
            corr = LO.openrlhf_is_correction(b.old_f, b.roll_f, b.off, **rc)
            tt = token_terms(
                b.lp_f,
                b.old_f,
                None,
                b.adv,
                b.off,
                clip_eps=0.2,
                dual_clip=dual,
                log_ratio_clamp=20.0,
                beta=0.0,
            )
            gp, _ = token_gradients(
                tt, offsets=b.off, clip_eps=0.2, dual_clip=dual, log_ratio_clamp=20.0, beta=0.0
            )
            term, grad = LR._mul(tt.policy, corr.weight), LR._mul(gp, corr.weight)
            label = ", ".join(f"{k}={v}" for k, v in rc.items())
            c = f"PolicyLoss(ppo, dual_clip={dual}, {agg}), is_correction {label}"
            o = f"core clipped surrogate × openrlhf_is_correction({label})"
            rel = SEQ_MEAN if agg != "token-mean" else REL
            s.add(
                "openrlhf",
                c,
                o,
                {"loss": (float(loss.detach()), -aggregate(term, b.off, agg=agg))},
                rel,
            )
            s.close(
                "openrlhf",
                c,
                o,
                "∂loss/∂logp",
                b.flat(lp_t.grad),
                our_grad(grad, b.lengths, agg),
                rel,
            )
            s.add(
                "openrlhf",
                c,
                o,
                {
                    "vllm_kl": (float(vllm_kl), corr.metrics["vllm_kl"]),
                    "is_filter_ratio": (float(filt), corr.metrics["is_filter_ratio"]),
                },
                METRIC,
            )
            s.triggers("openrlhf", c, o, "is_filter_ratio", float(filt))
    # GSPO with a correction level: the sequence ratio against the sampler's log-probs
    policy = orl["loss"].PolicyLoss(
        clip_eps_low=3e-4, clip_eps_high=4e-4, policy_loss_type="gspo", is_correction_level="token"
    )
    lp_t = b.t("logp", grad=True)
    loss, *_ = policy(lp_t, b.t("old"), b.adv_tok, action_mask=b.m, rollout_log_probs=b.t("roll"))
    loss.backward()
    assert lp_t.grad is not None
    tt = token_terms(
        b.lp_f,
        b.roll_f,
        None,
        b.adv,
        b.off,
        clip_eps=3e-4,
        clip_eps_high=4e-4,
        ratio_level="sequence",
        beta=0.0,
    )
    gp, _ = token_gradients(
        tt, offsets=b.off, clip_eps=3e-4, clip_eps_high=4e-4, ratio_level="sequence", beta=0.0
    )
    c = "PolicyLoss(gspo, is_correction_level=token): ratio against rollout_log_probs"
    o = "core token_terms(old_logp=rollout_logp, ratio_level=sequence)"
    gagg: Aggregation = "seq-mean-token-mean"
    s.add(
        "openrlhf",
        c,
        o,
        {"loss": (float(loss.detach()), -aggregate(tt.term, b.off, agg=gagg))},
        SEQ_MEAN,
    )
    s.close(
        "openrlhf", c, o, "∂loss/∂logp", b.flat(lp_t.grad), our_grad(gp, b.lengths, gagg), SEQ_MEAN
    )


# -------------------------------------------------------------------------- main
def main() -> int:
    torch.set_default_dtype(torch.float64)
    s = Suite()
    check_trl(s)
    check_trl_off_policy_mask(s)
    check_verl(s)
    check_openrlhf(s)
    versions = {p: version(p) for p in ("trl", "verl", "openrlhf", "torch")}
    for r in s.rows:
        status = "ok  " if r.ok else "FAIL"
        name = f"{r.trainer} {versions[r.trainer]}"
        print(
            f"{status} {name:15} {r.quantity:42.42} {r.theirs:>20.12g} {r.ours:>20.12g}  "
            f"{r.config} | {r.flags}"
        )
    for trainer, what, why in NOT_RUN:
        print(f"not run against the trainer's own function: {trainer}: {what}: {why}")
    failed = sum(not r.ok for r in s.rows)
    print(f"losses conformance: {len(s.rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
