"""The core's types, its one table of the aggregations, and the contract checks every
kernel runs first (rank, dtype, equal shapes; offsets). See :mod:`grpo_cli.core`."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import InputError, UsageError

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
# Log-probs as logged: float32 or float64; arithmetic on them asks numpy for float64 results.
FloatArray = NDArray[np.floating[Any]]

Scale = Literal["group", "batch", "none"]
AdvantageEstimator = Literal["grpo", "rloo"]
Singleton = Literal["zero", "raw"]
KLEstimator = Literal["k1", "k2", "k3"]
RatioLevel = Literal["token", "sequence"]
Aggregation = Literal[
    "seq-mean-token-mean",
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-sum",
]
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)
NormScale = Literal["n-lmax", "lmax"]
ClipUnit = Literal["tokens", "sequences"]
# What an aggregation divides by: N answers, T tokens, N·L or L (seq-mean-token-sum-norm,
# by ``norm_scale``), or nothing.
Divisor = Literal["answers", "tokens", "norm", "one"]


class AggregationRule(NamedTuple):
    """An aggregation as ``(1/D) Σ_i u_i Σ_t v_{i,t}``: the divisor ``D``'s kind (one
    constant of the whole input: :func:`aggregation_divisor`) and whether the per-answer
    factor is ``u_i = 1/|o_i|`` (``answer_mean``) or 1. The weight of one token is
    ``u_i / D`` (:func:`aggregation_weights`); ``∂J/∂logp_t`` carries the same factor."""

    divisor: Divisor
    answer_mean: bool


# The one table of the aggregations (see :func:`aggregate` for the papers and trainers).
AGGREGATION_RULES: dict[str, AggregationRule] = {
    "seq-mean-token-mean": AggregationRule("answers", answer_mean=True),
    "token-mean": AggregationRule("tokens", answer_mean=False),
    "seq-mean-token-sum": AggregationRule("answers", answer_mean=False),
    "seq-mean-token-sum-norm": AggregationRule("norm", answer_mean=False),
    "token-sum": AggregationRule("one", answer_mean=False),
}


def aggregation_rule(agg: str) -> AggregationRule:
    """The rule of ``agg`` (a :class:`UsageError` listing the aggregations otherwise)."""
    rule = AGGREGATION_RULES.get(agg)
    if rule is None:
        raise UsageError(f"unknown aggregation {agg!r}; choose one of {', '.join(AGGREGATIONS)}")
    return rule


def aggregation_divisor(
    agg: str, *, answers: int, tokens: float, max_len: float, norm_scale: NormScale = "n-lmax"
) -> float:
    """The constant ``D`` of ``agg`` (:data:`AGGREGATION_RULES`) for ``answers`` (N),
    ``tokens`` (T) and ``max_len`` (L): N, T, N·L (``norm_scale="lmax"``: L) or 1.

    Example:
        >>> aggregation_divisor("seq-mean-token-sum-norm", answers=4, tokens=10, max_len=8)
        32.0
    """
    kind = aggregation_rule(agg).divisor
    if kind == "answers":
        return float(answers)
    if kind == "tokens":
        return float(tokens)
    if kind == "norm":
        return float(max_len if norm_scale == "lmax" else answers * max_len)
    return 1.0


# exp(x) overflows float64 above this.
EXP_MAX = float(np.log(np.finfo(np.float64).max))


# --------------------------------------------------------------------------- checks
def _real_array(name: str, x: ArrayLike, *, keep_float: bool = False) -> F64:
    """``x`` as a float64 array (a copy when the dtype changes; never written to).

    With ``keep_float``, float16/float32 arrays are returned as they are: the arithmetic
    that reads them asks numpy for float64 results (``np.subtract(a, b, dtype=float64)``),
    which converts on the fly without a float64 copy of the input.
    """
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise InputError(f"{name}: expected a real-valued array, got dtype {arr.dtype}")
    if keep_float and np.issubdtype(arr.dtype, np.floating):
        return arr
    return arr.astype(np.float64, copy=False)


def _bool_array(name: str, x: ArrayLike) -> NDArray[np.bool_]:
    arr = np.asarray(x)
    if arr.dtype == np.bool_:
        return arr
    if np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        if not np.isin(arr, (0, 1)).all():
            raise InputError(f"{name}: expected booleans or 0/1 values, found other values")
        return arr.astype(np.bool_)
    raise InputError(f"{name}: expected a boolean array, got dtype {arr.dtype}")


def _same_shape(**arrays: np.ndarray) -> None:
    shapes = {name: a.shape for name, a in arrays.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{n} {s}" for n, s in shapes.items())
        raise InputError(f"arrays must have the same shape, got {listed}")


def _check_rank(name: str, arr: np.ndarray, rank: int, legend: str) -> None:
    if arr.ndim != rank:
        raise InputError(f"{name}: expected shape {legend}, got {arr.shape}")


def check_offsets(offsets: ArrayLike, n_values: int, *, nonempty: bool = False) -> I64:
    """``offsets`` as int64 after checking the ragged-layout contract: 1-D integers,
    ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == n_values`` (the token count);
    with ``nonempty`` no answer may be empty (a mean over its tokens is taken).

    Raises:
        InputError: naming ``offsets`` and what is wrong.

    Example:
        >>> check_offsets([0, 2, 5], 5).dtype
        dtype('int64')
    """
    o = np.asarray(offsets)
    if o.ndim != 1 or o.shape[0] < 1:
        raise InputError(f"offsets: expected shape (N+1,), got {o.shape}")
    if not np.issubdtype(o.dtype, np.integer):
        raise InputError(f"offsets: expected integers, got dtype {o.dtype}")
    o = o.astype(np.int64, copy=False)
    if o[0] != 0 or o[-1] != n_values:
        raise InputError(
            f"offsets: must start at 0 and end at the number of values ({n_values}), "
            f"got {int(o[0])} and {int(o[-1])}"
        )
    steps = np.diff(o)
    if steps.shape[0] and steps.min() < 0:
        i = int(np.flatnonzero(steps < 0)[0])
        raise InputError(f"offsets: must not decrease, but offsets[{i + 1}] < offsets[{i}]")
    if nonempty and steps.shape[0] and steps.min() == 0:
        i = int(np.flatnonzero(steps == 0)[0])
        raise InputError(f"offsets: answer {i} has no token, and a mean over its tokens is taken")
    return o


def _check_eps(eps: float) -> None:
    if not (np.isfinite(eps) and eps >= 0):
        raise UsageError(f"eps must be a finite number >= 0, got {eps}")
