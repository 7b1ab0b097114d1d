"""prime-rl's RL trainer (PrimeIntellect-ai/prime-rl, commit 559b4477, version 0.8.0):
its preset, its config keys, its logged metrics.

Read from its code at that commit (``conformance/frontier/LAYOUTS.md``, "prime-rl"):
``trainer/rl/loss.py`` (the losses, :mod:`grpo_cli.losses.prime_rl`), ``trainer/rl/
train.py`` 301-323 (``rl_scale``: a step's loss is the sum over every rank's micro-batches
of their samples' summed per-token losses over the step's loss-token count, a token mean
over the whole step; one optimizer step per trainer step), 483-539 and 622-676 (what is
logged), ``trainer/utils.py`` 238-321 (``Tensors.compute_stats`` and the filter of what
reaches the monitors).

prime-rl's ratio is against the sampler: ρ = exp(trainer − inference), its old policy the
inference engine's. grpo-cli reads the trainer's log-probs as ``logp`` and the sampler's
as ``old_logp`` (the token-export reader, :mod:`grpo_cli.io.readers.prime_rl`); the
advantages are the ones prime-rl trained on (per token); there is no reference policy
(β = 0: prime-rl's KL is the τ·(log ρ)² term inside its loss).

Logged metrics (``metrics.jsonl``, the trainer's lines):

- ``loss/mean``: the mean over the step's micro-batches (every rank) of each micro-batch's
  share of the loss: the step's loss over the micro-batch count (the reader counts the
  (rank, micro_step) pairs of the export: a micro-batch with no exported sequence is not
  seen);
- ``entropy/all/{mean,std,max}``, ``mismatch_kl/all/{mean,std,max}``: over the step's loss
  tokens (std unbiased, as torch's); ``kl_ent_ratio/mean`` their means' ratio;
- ``is_masked*``, ``masked_advantage_*``, ``masked_mismatch_kl``, ``unmasked_mismatch_kl``
  ``/mean`` and ``/max``: over the step's samples of each sample's value. prime-rl runs its
  loss on every packed sequence of a micro-batch, so a sequence without a loss token (not
  exported) adds a 0 to these means: over the exported samples they are exact when every
  packed sequence had a loss token (``pad_micro_batch``, trainer/batch.py:692-736, pads
  the last sample, not a sequence of its own).

Not reproduced: the per-environment statistics (``entropy/{env}/*``,
``mismatch_kl/{env}/*``: the reader does not split by ``env_name``), ``loss/median``,
``/std``, ``/min``, ``/max`` (per micro-batch), ``perf/*``, ``optim/*``, ``time/*``; the
``custom`` loss; ``rl_weights`` streams (named in a note); the ``ce`` and ``ref_kl``
components.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import InputError
from .base import MetricInputs, Release, Trainer
from .config import Key, check_config, choice, integer, number

METRICS = (
    "loss/mean",
    "entropy/all/mean",
    "entropy/all/std",
    "entropy/all/max",
    "mismatch_kl/all/mean",
    "mismatch_kl/all/std",
    "mismatch_kl/all/max",
    "kl_ent_ratio/mean",
    "is_masked/mean",
    "is_masked/max",
    "is_masked_low/mean",
    "is_masked_low/max",
    "is_masked_high/mean",
    "is_masked_high/max",
    "masked_advantage_positive/mean",
    "masked_advantage_positive/max",
    "masked_advantage_negative/mean",
    "masked_advantage_negative/max",
    "masked_mismatch_kl/mean",
    "masked_mismatch_kl/max",
    "unmasked_mismatch_kl/mean",
    "unmasked_mismatch_kl/max",
)

_NEEDS = {
    "entropy/all/mean": "the per-token entropy (the token export's entropy field)",
    "loss/mean": "the step's micro-batch count (the token-export reader counts it)",
}


def _unbiased_std(n: int, m2: float) -> float | None:
    return math.sqrt(max(m2, 0.0) / (n - 1)) if n > 1 else None


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """What prime-rl logs of a step, from the folded step (every rank's records of it):
    see the module's docstring for each metric's reduction."""
    s, acc = m.settings, m.acc
    lm = acc.loss_metrics.values()
    out: dict[str, float | None] = {k: None for k in METRICS}
    mb = getattr(s.loss_params, "micro_batches", None)
    out["loss/mean"] = -m.policy_term / mb if mb else None
    e = acc.entropy
    if e.n:
        out["entropy/all/mean"] = e.total / e.n
        out["entropy/all/std"] = _unbiased_std(e.n, e.m2)
        out["entropy/all/max"] = e.hi
    t = acc.tokens
    if "mismatch_kl/all/mean" in lm and t:
        mean, sq = lm["mismatch_kl/all/mean"], lm["_mismatch_kl_sq"]
        out["mismatch_kl/all/std"] = _unbiased_std(t, (sq - mean * mean) * t)
        ent = out["entropy/all/mean"]
        out["kl_ent_ratio/mean"] = mean / ent if ent else None
    out.update({k: v for k, v in lm.items() if not k.startswith("_") and k in out})
    if s.loss == "prime_rl/ipo":  # IPO logs no low/high masks nor masked advantages
        for k in METRICS[10:18]:
            out.pop(k, None)
    return out


# prime-rl's defaults (DefaultLossConfig, configs/trainer.py:494-507): the DPPO-Binary-TV
# loss and its KL term, a token mean over the whole step, the advantages it trained on
# (per token, as exported), no reference policy.
PRESET: dict[str, Any] = {
    "loss": "prime_rl/dppo_tv",
    "agg": "token-mean",
    "beta": 0.0,
}

RELEASES = (
    Release(
        first="0.8.0",
        last="0.8.0",
        checked="0.8.0",
        preset=PRESET,
        metrics=metrics,
        metric_names=METRICS,
        changes=(
            "src/prime_rl/trainer/rl/loss.py:109-196: default_loss_fn (DPPO-Binary-TV + "
            "kl_tau·(log ρ)²), ipo_loss_fn; ρ against inference_logprobs (commit 559b4477)",
            "src/prime_rl/trainer/rl/train.py:301-323: rl_scale, the step's loss-token count",
        ),
        notes=("per-environment statistics and loss/median, /std, /min, /max are not recomputed",),
        missing=_NEEDS,
    ),
)

PRESETS = {"prime_rl": dict(PRESET), "prime-rl": dict(PRESET)}

WHERE = "configs/trainer.json"
# set by grpo-cli's prime-rl reader (io/readers/prime_rl.py), not a prime-rl key: the
# names of the config's loss section, so that a key no loss here reads is named
LOSS_KEYS = "trainer_config.loss_keys"
# Every key this module reads: the trainer config's loss section (dotted), and the
# micro-batch count the token-export reader adds
CONFIG_KEYS: dict[str, Key] = {
    "loss.type": choice("default", "ipo", "custom"),
    "loss.dppo_mask_low": number(low=0),
    "loss.dppo_mask_high": number(low=0),
    "loss.ipo_threshold": number(low=0),
    "loss.adv_tau": number(low=0),
    "loss.kl_tau": number(low=0),
    "token_export.micro_batches": integer(low=1),
    LOSS_KEYS: Key(lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v), "names"),
}
_PARAMS = {
    "default": ("dppo_mask_low", "dppo_mask_high", "adv_tau", "kl_tau"),
    "ipo": ("ipo_threshold", "adv_tau", "kl_tau"),
}
VERSION = "0.8.0"
_DEFAULTS = "dppo_mask_low 0.2, dppo_mask_high 0.2, adv_tau 1.0, kl_tau 0.001"


def from_config(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """prime-rl's trainer config (its ``loss`` section, dotted: ``loss.type``,
    ``loss.dppo_mask_low``, ...) as Settings: ``default`` is ``prime_rl/dppo_tv``, ``ipo``
    ``prime_rl/ipo``, each with its parameters; without a loss section prime-rl's
    defaults, said in a note; ``custom`` is not computed (refused: its loss is the user's
    code)."""
    check_config(CONFIG_KEYS, c, WHERE)
    out: dict[str, Any] = {}
    notes: list[str] = []
    section = any(k in c for k in CONFIG_KEYS if k.startswith("loss."))
    kind = c.get("loss.type", "default" if section else None)
    if kind is None:
        notes.append(f"no {WHERE} loss section: prime-rl's defaults (DefaultLossConfig: "
                     f"{_DEFAULTS})")  # fmt: skip
        kind = "default"
    if kind == "custom":
        raise InputError(
            f"{WHERE}: loss.type 'custom' runs the user's own loss function, which grpo-cli "
            "cannot reproduce; name the conventions with --preset and flags"
        )
    out["loss"] = "prime_rl/dppo_tv" if kind == "default" else "prime_rl/ipo"
    for key in _PARAMS[kind]:
        if f"loss.{key}" in c:
            out[key] = float(c[f"loss.{key}"])
    known = {"type", *_PARAMS[kind]}
    unread = [f"loss.{k}" for k in c.get(LOSS_KEYS, []) if k not in known]
    if unread:  # never dropped silently: a key of another release's loss would change it
        shown = ", ".join(f"{k} = {c.get(k)!r}"[:60] for k in unread[:5])
        notes.append(f"{WHERE}: {shown}: not a parameter of prime-rl {VERSION}'s {kind!r} loss, "
                     "not applied (the loss recomputed here leaves it out)")  # fmt: skip
    if "token_export.micro_batches" in c:
        out["micro_batches"] = int(c["token_export.micro_batches"])
    return out, notes


from_config.keys = CONFIG_KEYS  # type: ignore[attr-defined]

TRAINER = Trainer(
    name="prime_rl",
    releases=RELEASES,
    presets=PRESETS,
    from_config=from_config,
)
