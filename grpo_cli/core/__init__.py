"""Pure numpy kernels of GRPO: advantages, KL estimators, clipped surrogate, aggregation.

No I/O, no globals, numpy only. Every convention on which trainers disagree is a
keyword with a documented default (the defaults follow the seed spec and DeepSeekMath).

Shape legend, used in every docstring of the package:

- ``P`` groups (prompts) of a ``(P, G)`` reward array, ``G`` answers per group;
- ``N`` answers, ``L`` padded length of an ``(N, L)`` token array;
- ``T`` valid tokens in all (``T = Σ mask``).

Ragged layout: a token field is a flat ``(T,)`` array holding the valid tokens of answer
0, then answer 1, ...; ``offsets`` is ``(N+1,)`` int64 with ``offsets[0] == 0`` and
``offsets[-1] == T``, and answer ``i`` owns ``flat[offsets[i]:offsets[i+1]]``. This is how
Arrow list columns store the data already, and padding never exists in it.
"""

from __future__ import annotations

from .advantages import (
    GroupStats,
    advantages_by_group,
    advantages_from_stats,
    group_advantages,
    group_stats,
    overall_std,
)
from .aggregate import (
    ClipCounts,
    aggregate,
    aggregation_weights,
    answer_clip_counts,
    answer_clip_tokens,
    clip_counts,
    clip_counts_of,
    ratio_moments,
)
from .objective import grpo_objective
from .ragged import (
    COUNT_CHUNK,
    answer_runs,
    dot,
    flatten_padded,
    segment_count,
    segment_mean,
    segment_sum,
    suffix_sum,
)
from .terms import (
    SequenceMeans,
    TermConventions,
    TermOptions,
    TokenTerms,
    clipped_surrogate,
    difference,
    kl_estimate,
    kl_from_log_ratio,
    kl_k3,
    log_ratio,
    require_reference,
    sequence_log_ratio,
    sequence_sums,
    term_options,
    token_gradients,
    token_terms,
    used_log_ratio,
)
from .types import (
    AGGREGATION_RULES,
    AGGREGATIONS,
    EXP_MAX,
    F64,
    I64,
    AdvantageEstimator,
    Aggregation,
    AggregationRule,
    ClipUnit,
    Divisor,
    FloatArray,
    KLEstimator,
    NormScale,
    RatioLevel,
    Scale,
    Singleton,
    aggregation_divisor,
    aggregation_rule,
    check_offsets,
)

__all__ = [
    "AGGREGATIONS",
    "AGGREGATION_RULES",
    "COUNT_CHUNK",
    "EXP_MAX",
    "F64",
    "I64",
    "AdvantageEstimator",
    "Aggregation",
    "AggregationRule",
    "ClipCounts",
    "ClipUnit",
    "Divisor",
    "FloatArray",
    "GroupStats",
    "KLEstimator",
    "NormScale",
    "RatioLevel",
    "Scale",
    "SequenceMeans",
    "Singleton",
    "TermConventions",
    "TermOptions",
    "TokenTerms",
    "advantages_by_group",
    "advantages_from_stats",
    "aggregate",
    "aggregation_divisor",
    "aggregation_rule",
    "aggregation_weights",
    "annotations",
    "answer_clip_counts",
    "answer_clip_tokens",
    "answer_runs",
    "check_offsets",
    "clip_counts",
    "clip_counts_of",
    "clipped_surrogate",
    "difference",
    "dot",
    "flatten_padded",
    "group_advantages",
    "group_stats",
    "grpo_objective",
    "kl_estimate",
    "kl_from_log_ratio",
    "kl_k3",
    "log_ratio",
    "overall_std",
    "ratio_moments",
    "require_reference",
    "segment_count",
    "segment_mean",
    "segment_sum",
    "sequence_log_ratio",
    "sequence_sums",
    "suffix_sum",
    "term_options",
    "token_gradients",
    "token_terms",
    "used_log_ratio",
]
