"""AReaL's own policy losses where they differ from rows already here, with their registry
rows (:mod:`grpo_cli.losses.registry`).

Read from the areal 1.0.4 wheel, ``areal/utils/functional/functional.py``:
``ppo_actor_loss_fn`` is the core's clipped surrogate (decoupled bounds, the dual clip as
``min(loss, c·|A|)``, no Δ clamp; GSPO's sequence ratio at ``importance_sampling_level=
"sequence"``), so it needs no row. ``sapo_loss_fn`` is SAPO's gate (TRL's
:func:`~grpo_cli.losses.trl.sapo_terms`, no clamp), but aggregated as every AReaL loss
is: summed over the micro-batch's loss tokens and divided by their count (token-mean),
where TRL's and verl's SAPO force ``seq-mean-token-mean``. AReaL names its temperatures
``sapo_tau_pos`` / ``sapo_tau_neg`` (``PPOActorConfig``, defaults 1.0 / 1.05).
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import Loss, LossCall, Params, PolicyTerms, Spec, param
from .trl import sapo_terms

__all__ = ["CORRECTIONS", "LOSSES", "MASKS", "ArealSapoParams"]


def _tau(help: str) -> Spec:
    return Spec(low=0.0, help=help)


@dataclass(frozen=True)
class ArealSapoParams(Params):
    sapo_tau_pos: float = param(1.0, _tau("τ of SAPO's gate where A > 0"))
    sapo_tau_neg: float = param(1.05, _tau("τ of SAPO's gate where A < 0"))


def _sapo(c: LossCall) -> PolicyTerms:
    p = c.params
    assert isinstance(p, ArealSapoParams)
    return sapo_terms(
        c.logp, c.old, c.adv, c.offsets, tau_pos=p.sapo_tau_pos, tau_neg=p.sapo_tau_neg,
        log_ratio_clamp=c.log_ratio_clamp, ratio_level=c.ratio_level, trainer_agg=False,
    )  # fmt: skip


LOSSES = (
    Loss(
        "areal/sapo", _sapo,
        "SAPO (a soft temperature gate in place of the clip), aggregated as the config says",
        params=ArealSapoParams,
    ),
)  # fmt: skip
CORRECTIONS = ()
MASKS = ()
