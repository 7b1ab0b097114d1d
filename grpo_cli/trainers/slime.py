"""slime (THUDM) at commit 624b824a (its ``setup.py`` says 0.3.1): the preset, its options
(``vars(args)``, an ``args.json`` beside a ``--dump-details`` directory) as settings, and
its logged ``train/*`` metrics.

Read from ``slime/utils/arguments.py`` (the options and defaults, lines in
``conformance/frontier/LAYOUTS.md`` "(d)"), ``slime/backends/megatron_utils/loss.py``
(``policy_loss_function`` 934-1173, ``loss_function`` 1283-1383) and
``slime/backends/megatron_utils/train_metric_utils.py`` (``reduce_train_step_metrics``
18-59): every metric is the reducer ``S(x) = Σ_i Σ_t x_it / max(D_i, 1)`` summed over the
step's micro-batches and DP ranks and divided by ``global_batch_size`` — with one sample a
rollout (``D_i`` its own loss tokens) grpo-cli's ``seq-mean-token-mean`` over the step's
samples; with ``--calculate-per-token-loss`` ``Σ x / Σ max(Σ_t m, 1)``, its token-mean.
``train/loss = pg_loss − entropy_coef·entropy_loss + kl_loss_coef·kl_loss``.

Metric names are slime's log keys without the ``train/`` prefix slime logs them under
(``train/pg_loss`` is ``pg_loss``): ``--logged`` drops that prefix, as a logger's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import MetricInputs, Release, Trainer, with_loss_metrics
from .config import Key, boolean, check_config, choice, number, text

COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
METRICS = (
    "loss",
    "pg_loss",
    "pg_clipfrac",
    "ppo_kl",
    "kl_loss",
    "entropy_loss",
    "train_rollout_logprob_abs_diff",
    "tis",
    "tis_clipfrac",
    "tis_abs",
    "ois",
)

MISSING = {
    "entropy_loss": (
        "slime's reducer of the training forward's entropy: the dump holds an entropy only "
        "with --use-rollout-entropy, and slime's per-sample mean of it (seq-mean) is not one "
        "of the fold's sums: given with --calculate-per-token-loss only"
    ),
}


def metrics(m: MetricInputs) -> dict[str, float | None]:
    """slime 624b824a's ``train/*`` of one optimizer step (module docstring): the loss
    row's ``pg_clipfrac`` and ``ppo_kl``, the KL loss with ``--use-kl-loss`` (β ≠ 0), the
    ``slime-tis`` correction's mismatch and TIS metrics, ``ois`` =
    the reducer of ρ (1 on-policy: a dump's first step)."""
    s, acc = m.settings, m.acc
    per_token = s.agg == "token-mean"
    pg = -m.policy_term
    out: dict[str, float | None] = {"pg_loss": pg}
    kl = acc.aggregate("kl", s.kl_aggregation) if s.beta != 0.0 else None
    if kl is not None:
        out["kl_loss"] = kl
    ent = acc.entropy
    has_entropy = getattr(ent, "n", 0) > 0
    out["entropy_loss"] = ent.mean if (per_token and has_entropy) else None
    out = with_loss_metrics(out, m, ())
    lr = acc.log_ratios
    if "tis" in out and lr.delta == 0.0 and acc.tokens:  # every ρ = 1: on-policy
        out["ois"] = 1.0
    out["loss"] = pg + (s.beta * kl if kl is not None else 0.0)
    return {k: out[k] for k in (*METRICS, *out) if k in out}


PRESET: dict[str, Any] = {
    # the GRPO advantages slime writes: torch's unbiased std + 1e-6 (ray/rollout.py:608-633)
    "ddof": 1,
    "eps": 1e-6,
    # loss.py: the PPO clip 0.2 both sides, no dual clip, no Δ clamp, one sample a rollout
    "loss": "slime/ppo_eps_clip",
    "agg": "seq-mean-token-mean",
    "clip_eps": 0.2,
    "clip_eps_high": None,
    "dual_clip": None,
    "log_ratio_clamp": None,
    # --use-kl-loss off, --kl-loss-type k1, --kl-loss-coef 0
    "beta": 0.0,
    "kl_estimator": "k1",
    "kl_clamp": None,
}

RELEASES = (
    Release(
        first="0.3.1",
        last="0.3.1",
        checked="0.3.1",
        preset=PRESET,
        metrics=metrics,
        metric_names=METRICS,
        missing=MISSING,
        changes=(
            f"commit {COMMIT[:8]}: slime/backends/megatron_utils/loss.py policy_loss_function, "
            "slime/utils/ppo_utils.py compute_policy_loss / compute_cispo_loss / "
            "compute_approx_kl, cp_utils.py get_sum_of_sample_mean",
        ),
        notes=(
            "one rollout = one step: the dump's first optimizer step of each rollout (the "
            "old log-probs are the only ones dumped)",
        ),
    ),
)

_KL = {"k1": ("k1", None), "k2": ("k2", None), "k3": ("k3", None), "low_var_kl": ("k3", 10.0)}
# set by grpo-cli's slime reader (io/readers/slime.py), not a slime option
HAS_ROLLOUT = "_dump_has_rollout_log_probs"
_ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"


def _policy(c: Mapping[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    est = c.get("advantage_estimator", "grpo")
    if est == "cispo":
        out["loss"] = "slime/cispo"
    elif est == "gspo":
        out["ratio_level"] = "sequence"
    elif est not in ("grpo", None):
        notes.append(f"args.json: advantage_estimator {est!r}: its advantages are the dump's")
    if isinstance(c.get("eps_clip"), int | float):
        out["clip_eps"] = float(c["eps_clip"])
    if "eps_clip_high" in c:
        out["clip_eps_high"] = None if c["eps_clip_high"] is None else float(c["eps_clip_high"])
    if "eps_clip_c" in c:
        out["dual_clip"] = None if c["eps_clip_c"] is None else float(c["eps_clip_c"])
    if c.get("calculate_per_token_loss"):
        out["agg"] = "token-mean"
        out["calculate_per_token_loss"] = True
    if c.get("use_opsm"):
        out["use_opsm"] = True
        if isinstance(c.get("opsm_delta"), int | float):
            out["opsm_delta"] = float(c["opsm_delta"])
    if c.get("loss_type", "policy_loss") != "policy_loss":
        notes.append(f"args.json: loss_type {c['loss_type']!r}: grpo-cli computes policy_loss")


def _kl(c: Mapping[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    if c.get("use_kl_loss"):
        out["beta"] = float(c.get("kl_loss_coef", 0.0))
        est, clamp = _KL[str(c.get("kl_loss_type", "k1"))]
        out["kl_estimator"], out["kl_clamp"] = est, clamp
        if c.get("use_unbiased_kl"):
            out["kl_bias_correction"] = True
    if c.get("kl_coef"):
        notes.append(
            f"args.json: kl_coef {c['kl_coef']}: slime's KL in the reward does not enter its "
            "GRPO advantages (get_grpo_returns): the dump's advantages are used"
        )
    if c.get("entropy_coef"):
        notes.append(
            f"args.json: entropy_coef {c['entropy_coef']}: train/loss here leaves out "
            "−entropy_coef·entropy_loss (the training forward's entropy is not dumped)"
        )


def _correction(c: Mapping[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    if c.get("use_rollout_logprobs"):  # the reader reads the sampler's as old_logp
        notes.append(
            "args.json: use_rollout_logprobs: train/train_rollout_logprob_abs_diff is then "
            "slime's reducer of |logp − rollout_logp| over the training forward, not "
            "recomputed"
        )
        return
    if not (c.get("use_tis") or c.get("get_mismatch_metrics")):
        if c.get(HAS_ROLLOUT):  # slime logs |old − rollout| whenever it has the log-probs
            out["correction"], out["tis_kind"] = "slime-tis", "off"
            if c.get("calculate_per_token_loss"):
                out["tis_per_token"] = True
        return
    path = c.get("custom_tis_function_path")
    kind = "vanilla" if path is None else "icepop" if path == _ICEPOP else None
    if kind is None:
        notes.append(f"args.json: custom_tis_function_path {path!r}: not applied")
        return
    out["correction"] = "slime-tis"
    out["tis_kind"] = kind if c.get("use_tis") else "off"
    for key in ("tis_clip", "tis_clip_low"):
        if isinstance(c.get(key), int | float):
            out[key] = float(c[key])
    if c.get("calculate_per_token_loss"):
        out["tis_per_token"] = True


def from_config(c: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """slime's options (``vars(args)``, its dest names) as Settings: the estimator (gspo: a
    sequence ratio; cispo: the ``slime/cispo`` loss), ``eps_clip``, ``eps_clip_high``,
    ``eps_clip_c``, ``calculate_per_token_loss`` (token-mean), ``use_kl_loss`` with
    ``kl_loss_coef`` / ``kl_loss_type`` (low_var_kl: k3 clamped to ±10) /
    ``use_unbiased_kl``, ``use_tis`` / ``tis_clip`` / ``tis_clip_low`` /
    ``custom_tis_function_path`` (icepop), ``use_opsm`` / ``opsm_delta``; what is not
    computed is named in a note."""
    check_config(CONFIG_KEYS, c, WHERE)
    out: dict[str, Any] = {}
    notes: list[str] = []
    _policy(c, out, notes)
    _kl(c, out, notes)
    _correction(c, out, notes)
    if c.get("normalize_advantages"):
        notes.append("args.json: normalize_advantages: the dump's (whitened) advantages are used")
    return out, notes


WHERE = "args.json"  # the file beside a dump holding vars(args) (docs/trainers/slime.md)
# Every slime option this module reads (argparse dest names), with its type and range
CONFIG_KEYS: dict[str, Key] = {
    "advantage_estimator": text(null=True),
    "loss_type": text(null=True),
    "eps_clip": number(low=0),
    "eps_clip_high": number(low=0, null=True),
    "eps_clip_c": number(low=1, low_open=True, null=True),
    "calculate_per_token_loss": boolean(),
    "use_kl_loss": boolean(),
    "kl_loss_coef": number(low=0),
    "kl_loss_type": choice("k1", "k2", "k3", "low_var_kl"),
    "use_unbiased_kl": boolean(),
    "kl_coef": number(low=0),
    "entropy_coef": number(low=0),
    "use_tis": boolean(),
    "get_mismatch_metrics": boolean(),
    "tis_clip": number(low=0),
    "tis_clip_low": number(low=0),
    "custom_tis_function_path": text(null=True),
    "use_opsm": boolean(),
    "opsm_delta": number(),
    "use_rollout_logprobs": boolean(),
    "normalize_advantages": boolean(),
    HAS_ROLLOUT: boolean(),
}

from_config.keys = CONFIG_KEYS  # type: ignore[attr-defined]

TRAINER = Trainer(
    name="slime",
    releases=RELEASES,
    presets={"slime": PRESET},
    from_config=from_config,
)
