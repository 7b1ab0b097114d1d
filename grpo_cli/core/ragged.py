"""Ragged helpers over flat ``(T,)`` token arrays and ``(N+1,)`` offsets: segment sums,
means, counts and suffix sums; padded ``(N, L)`` to ragged."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .types import F64, I64, check_offsets

COUNT_CHUNK = 1 << 20


# ------------------------------------------------------------------- ragged helpers
def dot(x: F64, y: F64) -> float:
    """``Σ x·y`` of two flat float64 arrays, without BLAS: numpy's ``dot`` (and ``@``) hands
    1-D arrays to OpenBLAS, whose threads spin for each call — on a 2-core machine ~2.5 s
    of CPU in ``objective`` over 10M tokens with a sampler's log-probs, more than the rest
    of the fold. ``einsum`` sums the products in numpy's own loop, on the calling thread.

    Example:
        >>> dot(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
        11.0
    """
    return float(np.einsum("i,i->", x, y))


def answer_runs(offsets: I64, tokens: int) -> list[tuple[int, int]]:
    """Consecutive answers ``[i, j)`` in runs of at most ``tokens`` tokens each (an answer
    longer than that a run of its own).

    Example:
        >>> answer_runs(np.array([0, 3, 5, 12, 13]), 5)
        [(0, 2), (2, 3), (3, 4)]
    """
    n, out, i = offsets.shape[0] - 1, [], 0
    while i < n:
        j = int(np.searchsorted(offsets, offsets[i] + tokens, side="right")) - 1
        j = min(max(j, i + 1), n)
        out.append((i, j))
        i = j
    return out


def segment_sum(values: F64, offsets: I64) -> F64:
    """Per-answer sums of a ragged token field: ``out[i] = Σ values[offsets[i]:offsets[i+1]]``.

    Args:
        values: ``(T,)`` float64.
        offsets: ``(N+1,)`` int64, non-decreasing, ``offsets[-1] == T``.

    Returns:
        ``(N,)`` float64; an empty answer sums to 0.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets`.

    Example:
        >>> segment_sum(np.array([1.0, 2.0, 3.0]), np.array([0, 2, 2, 3]))
        array([3., 0., 3.])
    """
    offsets = check_offsets(offsets, values.shape[0])
    lengths = np.diff(offsets)
    out = np.zeros(lengths.shape[0], dtype=np.float64)
    nonempty = lengths > 0
    if values.shape[0]:
        with np.errstate(over="ignore"):  # a sum beyond float64 is ±inf
            out[nonempty] = np.add.reduceat(values, offsets[:-1][nonempty])
    return out


def segment_mean(values: F64, offsets: I64) -> F64:
    """Per-answer means ``Σ_t values / |o_i|``; every answer must have a token.

    Raises:
        InputError: ``offsets`` breaks the contract, or an answer has no token.

    Example:
        >>> segment_mean(np.array([1.0, 2.0, 3.0]), np.array([0, 2, 3]))
        array([1.5, 3. ])
    """
    offsets = check_offsets(offsets, values.shape[0], nonempty=True)
    return segment_sum(values, offsets) / np.diff(offsets)


def flatten_padded(mask: NDArray[np.bool_], *fields: F64) -> tuple[I64, list[F64]]:
    """Drop padding: ``(N, L)`` fields plus mask to ragged ``(T,)`` fields and offsets.

    Row-major selection keeps answer ``i``'s tokens in order, in its own run. The
    inputs are not modified; padding values are never read into the result.

    Example:
        >>> off, (x,) = flatten_padded(np.array([[1, 1, 0], [1, 0, 0]], bool),
        ...                            np.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]))
        >>> off.tolist(), x.tolist()
        ([0, 2, 3], [1.0, 2.0, 3.0])
    """
    lengths = mask.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, [f[mask] for f in fields]


def suffix_sum(values: F64, offsets: I64) -> F64:
    """Within each answer, the sum of this token's value and every later one's:
    ``out[t] = Σ_{t' ≥ t} values[t']`` (a return with γ = 1, as OpenRLHF's
    ``get_cumulative_returns``).

    Example:
        >>> suffix_sum(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 3, 4])).tolist()
        [6.0, 5.0, 3.0, 4.0]
    """
    offsets = check_offsets(offsets, values.shape[0])
    out = np.empty_like(values, dtype=np.float64)
    for i in range(offsets.shape[0] - 1):  # answers: N small loops of reversed cumsums
        a, b = int(offsets[i]), int(offsets[i + 1])
        out[a:b] = np.cumsum(values[a:b][::-1])[::-1]
    return out


def segment_count(flags: NDArray[np.bool_], offsets: I64) -> I64:
    """How many flags are set in each answer's run (0 for an empty answer, wherever it is).

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`check_offsets`.

    Example:
        >>> segment_count(np.array([True, False, True]), np.array([0, 2, 3, 3])).tolist()
        [1, 1, 0]
    """
    offsets = check_offsets(offsets, flags.shape[0])
    counts = np.zeros(offsets.shape[0] - 1, dtype=np.int64)
    T = flags.shape[0]
    # reduceat casts its whole input to int64 first: 8 bytes a flag, so long runs of flags
    # are counted a chunk at a time
    for lo in range(0, T, COUNT_CHUNK):
        hi = min(T, lo + COUNT_CHUNK)
        a0 = int(np.searchsorted(offsets, lo, side="right")) - 1  # the answer holding lo
        a1 = int(np.searchsorted(offsets, hi, side="left"))  # the first starting at hi or after
        local = np.clip(offsets[a0 : a1 + 1], lo, hi) - lo
        nonempty = local[1:] > local[:-1]
        counts[a0:a1][nonempty] += np.add.reduceat(
            flags[lo:hi], local[:-1][nonempty], dtype=np.int64
        )
    return counts
