"""grpo-cli: exact GRPO advantages, KL, clipped objective and training diagnostics.

The public library surface; everything else lives in private modules.

Example:
    >>> import numpy as np
    >>> from grpo_cli import group_advantages
    >>> group_advantages(np.array([[1.0, 0.0]])).round(6).tolist()
    [[1.0, -1.0]]
"""

from ._version import __version__
from .batch import Batch, RawBatch, validate
from .commands.objective import advantages_report, fold_batch, kl_report, objective_report
from .core import (
    AGGREGATIONS,
    ClipCounts,
    GroupStats,
    TermConventions,
    TermOptions,
    TokenTerms,
    advantages_by_group,
    advantages_from_stats,
    aggregate,
    aggregation_weights,
    check_offsets,
    clip_counts,
    clipped_surrogate,
    flatten_padded,
    group_advantages,
    group_stats,
    grpo_objective,
    kl_estimate,
    kl_k3,
    log_ratio,
    ratio_moments,
    segment_mean,
    segment_sum,
    sequence_log_ratio,
    token_terms,
    used_log_ratio,
)
from .engine.options import EngineOptions, Ran
from .engine.run import iter_batches
from .errors import GrpoCliError, InputError, MergeError, SettingError, UsageError
from .finalize.objective import objective_record
from .fold.groups import GroupPartial, GroupTable, group_table
from .fold.pass1 import Pass1, objective_pass1
from .fold.tokens import TokenPartial
from .io import Answers, Source, load_answers, open_source, raw_from_arrow
from .logged import LoggedInput
from .records import (
    AdvantagesReport,
    Calls,
    CheckReport,
    ClipFractions,
    Distribution,
    GroupSummary,
    KLReport,
    ObjectiveReport,
    Result,
    RolloutReport,
)
from .settings import Settings
from .trainers.presets import PRESETS, resolve_settings
from .views.json import advantages_json, check_json, kl_json, objective_json

# check's names: its rules are imported when used, so a --json run never loads them
_LAZY = {
    "CheckConfig": "check.base",
    "RuleConfig": "check.base",
    "load_config": "check.config",
    "run_check": "commands.check",
}


def validate_raw(raw: RawBatch, columns: object = None) -> Batch:
    """:func:`validate` (kept for callers of the earlier name; ``columns`` is not needed:
    a raw batch carries its columns' names)."""
    del columns
    return validate(raw)


def __getattr__(name: str) -> object:
    """``check``'s names, imported on first use (a ``--json`` run never loads them)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'grpo_cli' has no attribute {name!r}")


__all__ = [
    "AGGREGATIONS",
    "PRESETS",
    "AdvantagesReport",
    "Answers",
    "Batch",
    "Calls",
    "CheckConfig",
    "CheckReport",
    "ClipCounts",
    "ClipFractions",
    "Distribution",
    "EngineOptions",
    "GroupPartial",
    "GroupStats",
    "GroupSummary",
    "GroupTable",
    "GrpoCliError",
    "InputError",
    "KLReport",
    "LoggedInput",
    "MergeError",
    "ObjectiveReport",
    "Pass1",
    "Ran",
    "RawBatch",
    "Result",
    "RolloutReport",
    "RuleConfig",
    "SettingError",
    "Settings",
    "Source",
    "TermConventions",
    "TermOptions",
    "TokenPartial",
    "TokenTerms",
    "UsageError",
    "__version__",
    "advantages_by_group",
    "advantages_from_stats",
    "advantages_json",
    "advantages_report",
    "aggregate",
    "aggregation_weights",
    "check_json",
    "check_offsets",
    "clip_counts",
    "clipped_surrogate",
    "flatten_padded",
    "fold_batch",
    "group_advantages",
    "group_stats",
    "group_table",
    "grpo_objective",
    "iter_batches",
    "kl_estimate",
    "kl_json",
    "kl_k3",
    "kl_report",
    "load_answers",
    "load_config",
    "log_ratio",
    "objective_json",
    "objective_pass1",
    "objective_record",
    "objective_report",
    "open_source",
    "ratio_moments",
    "raw_from_arrow",
    "resolve_settings",
    "run_check",
    "segment_mean",
    "segment_sum",
    "sequence_log_ratio",
    "token_terms",
    "used_log_ratio",
    "validate",
    "validate_raw",
]
