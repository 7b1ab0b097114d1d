"""grpo-cli: exact GRPO advantages, KL, clipped objective and training diagnostics.

The public library surface; everything else lives in private modules.

Example:
    >>> import numpy as np
    >>> from grpo_cli import group_advantages
    >>> group_advantages(np.array([[1.0, 0.0]])).round(6).tolist()
    [[1.0, -1.0]]
"""

from ._core import (
    AGGREGATIONS,
    TokenTerms,
    advantages_by_group,
    aggregate,
    check_offsets,
    clipped_surrogate,
    flatten_padded,
    group_advantages,
    group_stats,
    grpo_objective,
    kl_estimate,
    kl_k3,
    log_ratio,
    segment_mean,
    segment_sum,
    sequence_log_ratio,
    token_terms,
    used_log_ratio,
)
from ._engine import EngineOptions
from ._io import open_source
from ._report import advantages_report, kl_report, objective_report
from ._settings import PRESETS, SettingError, Settings, resolve_settings
from .errors import GrpoCliError, InputError, UsageError

__version__ = "0.1.0"

__all__ = [
    "AGGREGATIONS",
    "PRESETS",
    "EngineOptions",
    "GrpoCliError",
    "InputError",
    "SettingError",
    "Settings",
    "TokenTerms",
    "UsageError",
    "__version__",
    "advantages_by_group",
    "advantages_report",
    "aggregate",
    "check_offsets",
    "clipped_surrogate",
    "flatten_padded",
    "group_advantages",
    "group_stats",
    "grpo_objective",
    "kl_estimate",
    "kl_k3",
    "kl_report",
    "log_ratio",
    "objective_report",
    "open_source",
    "resolve_settings",
    "segment_mean",
    "segment_sum",
    "sequence_log_ratio",
    "token_terms",
    "used_log_ratio",
]
