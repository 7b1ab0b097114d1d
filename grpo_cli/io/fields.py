"""The fields of grpo-cli's data model and the names trainers give them.

An answer has ``group``, ``reward`` and ``advantage``; its tokens carry ``logp``,
``old_logp``, ``ref_logp``, ``rollout_logp``, ``entropy``, ``entropy_mask`` (TRL's
high-entropy tokens under ``top_entropy_quantile``: 1 where the policy term counts, read
as a 0/1 value), ``mask`` and, optionally, ``token_id`` (the sampled token's vocabulary id:
read only by ``explain``, :data:`TOKEN_IDS`). Every reader maps
its columns or arrays onto these through :data:`ALIASES` and ``--column FIELD=NAME``.
``reward`` and ``advantage`` may also be stored one value per token (:data:`PER_TOKEN`):
the readers recognise them by their layout (a list column, an ``(N, L)`` array) and reduce
them to one value per answer (:mod:`grpo_cli.io.lists`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputError, UsageError

__all__ = [
    "ALIASES",
    "ANSWER_FIELDS",
    "FIELDS",
    "FLAG_FIELDS",
    "LOGP_FIELDS",
    "PER_TOKEN",
    "TOKEN_FIELDS",
    "TOKEN_IDS",
    "TOKEN_VALUES",
    "map_columns",
    "parse_column_map",
]

ANSWER_FIELDS = ("group", "reward", "advantage")
# per-token values, and with the mask every per-token field (the one list of them)
TOKEN_VALUES = ("logp", "old_logp", "ref_logp", "rollout_logp", "entropy", "entropy_mask")
# the log-probabilities among them, and the 0/1 flags (read from booleans too)
LOGP_FIELDS = ("logp", "old_logp", "ref_logp", "rollout_logp")
FLAG_FIELDS = ("entropy_mask",)
TOKEN_FIELDS = (*TOKEN_VALUES, "mask")
# the sampled token's id: a per-token field only explain reads (by token id, issue 29), so
# objective and check never pay for its column
TOKEN_IDS = ("token_id",)
FIELDS = ANSWER_FIELDS + TOKEN_FIELDS + TOKEN_IDS
# answer fields a file may hold one value per token of (verl keeps both (N, L))
PER_TOKEN = ("reward", "advantage")

# Canonical name first; then the names trainers use for the same thing (DESIGN.md).
# verl's per-token rewards: ``token_level_scores`` (the task's score, before any KL) before
# ``token_level_rewards`` (the scores minus β·KL with ``use_kl_in_reward``, which grpo-cli's
# ``--kl-mode reward`` computes itself). NeMo-RL (``train_data_step{N}.jsonl``): the rewards
# its advantages used are ``filtered_rewards`` with dynamic sampling (its ``rewards`` are
# then the unfiltered batch's), ``prev_logprobs`` the trainer's before the step's update
# (what its loss's ``curr_logprobs`` equal at the first update: logp, the file holding no
# other), ``generation_logprobs`` the sampler's.
ALIASES: dict[str, tuple[str, ...]] = {
    "group": ("group", "groups", "group_id", "prompt_id", "uid", "group_index"),
    "reward": (
        "reward",
        "filtered_rewards",
        "rewards",
        "score",
        "scores",
        "token_level_scores",
        "token_level_rewards",
    ),
    "advantage": ("advantage", "advantages"),
    "logp": ("logp", "log_prob", "log_probs", "per_token_logps", "prev_logprobs"),
    "old_logp": ("old_logp", "old_log_probs", "old_per_token_logps", "action_log_probs"),
    "ref_logp": (
        "ref_logp",
        "ref_log_prob",
        "ref_per_token_logps",
        "base_action_log_probs",
        "reference_policy_logprobs",
        "ref_log_probs",
    ),
    "rollout_logp": (
        "rollout_logp",
        "rollout_log_probs",
        "sampling_per_token_logps",
        "rollout_logprobs",
        "generation_logprobs",
    ),
    "entropy": ("entropy", "entropys", "entropies", "token_entropy"),
    "entropy_mask": ("entropy_mask", "high_entropy_mask"),
    "token_id": ("token_id", "token_ids", "completion_ids"),
    "mask": (
        "mask",
        "response_mask",
        "completion_mask",
        "action_mask",
        "loss_mask",
        "token_loss_mask",
        "loss_masks",
    ),
}


def parse_column_map(items: Sequence[str] | None) -> dict[str, str]:
    """``["logp=lp", ...]`` from ``--column`` into ``{"logp": "lp"}``, validated."""
    out: dict[str, str] = {}
    for item in items or ():
        field, sep, name = item.partition("=")
        field, name = field.strip(), name.strip()
        if not sep or not field or not name:
            raise UsageError(f"--column {item!r}: expected FIELD=NAME, e.g. logp=log_probs")
        if field not in FIELDS:
            raise UsageError(
                f"--column {item!r}: unknown field {field!r}; fields: {', '.join(FIELDS)}"
            )
        out[field] = name
    return out


def map_columns(
    names: Sequence[str], explicit: dict[str, str], label: str, what: str
) -> dict[str, str | None]:
    """Each field's column (``what``: "column" or "array") among ``names``: the one given
    with ``--column``, else the first alias present, else None."""
    present = set(names)
    out: dict[str, str | None] = {}
    for field in FIELDS:
        if field in explicit:
            if explicit[field] not in present:
                raise InputError(
                    f"{label}: {what} {explicit[field]!r} (given for {field} with --column) "
                    f"not found; the file has: {', '.join(names)}"
                )
            out[field] = explicit[field]
            continue
        out[field] = next((a for a in ALIASES[field] if a in present), None)
    return out
