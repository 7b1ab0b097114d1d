"""The optional compiled kernel (``_kernel.c``), loaded with ctypes.

``setup.py`` builds it when a C compiler is at hand; without it, or with the engine's
backend ``numpy`` (:class:`grpo_cli.engine.options.EngineOptions`), grpo-cli computes the same
statistics with numpy (:meth:`grpo_cli._partials.TokenPartial.update`): ~40 ns per token
where the kernel needs ~7, about 1.9x slower end to end. Nothing here reads the
environment: the CLI maps ``GRPO_CLI_KERNEL`` to the backend (CI sets ``c``, so a missing
kernel fails there instead of silently testing numpy).

The kernel folds one record batch in one pass over its token columns; see
:func:`fold`. A ctypes call releases the GIL, so worker threads run it in parallel.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._core import require_reference
from .errors import GrpoCliError

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


class Params(ctypes.Structure):
    _fields_ = [
        ("lo", ctypes.c_double),
        ("hi", ctypes.c_double),
        ("dual", ctypes.c_double),
        ("lrc", ctypes.c_double),
        ("beta", ctypes.c_double),
        ("kl_clamp", ctypes.c_double),
        ("kl_est", ctypes.c_int64),
        ("h_lo", ctypes.c_double),
        ("h_inv_w", ctypes.c_double),
        ("h_nb", ctypes.c_int64),
    ]


class Totals(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_double)
        for name in (
            "r_sum",
            "r2_sum",
            "d_min",
            "d_max",
            "kf_sum",
            "kf_sq",
            "k_min",
            "k_max",
            "x_min",
            "x_max",
            "d_sum",
            "d20_sum",
            "x_sum",
        )
    ] + [
        (name, ctypes.c_int64)
        for name in ("r_inf", "k_inf", "n_low", "n_high", "n_outside", "n_dual")
    ]


_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
# grpo_fold(params, n, offsets, adv, logp, old, ref, f32, term, policy, kl, low_n, high_n,
#           d_hist, x_hist, totals, vector)
_ARGS: list[Any] = [ctypes.POINTER(Params), _i64, *[_ptr] * 5, _i64, *[_ptr] * 7]
_ARGS += [ctypes.POINTER(Totals), _i64]


ABI_VERSION = 3  # grpo_abi() in _kernel.c: bump both when Params, Totals or grpo_fold change


def check_abi(lib: ctypes.CDLL, origin: str) -> None:
    """Refuse a kernel built from another version of ``_kernel.c``: its struct layouts
    would be read as garbage (a :class:`GrpoCliError` saying to rebuild)."""
    out = (ctypes.c_int64 * 3)()
    abi = getattr(lib, "grpo_abi", None)
    got = (0, 0, 0)
    if abi is not None:
        abi.restype = ctypes.c_int64
        abi(out)
        got = (out[0], out[1], out[2])
    want = (ABI_VERSION, ctypes.sizeof(Params), ctypes.sizeof(Totals))
    if got != want:
        raise GrpoCliError(
            f"{origin}: the compiled kernel does not match this grpo-cli (interface "
            f"{got[0]}, struct sizes {got[1]}/{got[2]}; expected {want[0]}, "
            f"{want[1]}/{want[2]}): rebuild it with pip install -e ."
        )


@cache
def _library() -> ctypes.CDLL | None:
    try:
        spec = importlib.util.find_spec("grpo_cli._kernel")
    except ImportError:
        return None
    if spec is None or spec.origin is None:
        return None
    lib = ctypes.CDLL(spec.origin)
    check_abi(lib, spec.origin)
    lib.grpo_fold.argtypes = _ARGS
    lib.grpo_fold.restype = _i64
    lib.grpo_vector_exp.restype = _i64
    return lib


def built() -> bool:
    """Whether the compiled kernel is installed (``setup.py`` builds it when a C compiler
    is at hand)."""
    return _library() is not None


def kernel_name(backend: str) -> str:
    """What computes token statistics for a resolved ``backend``: 'c+avx2', 'c' or 'numpy'."""
    lib = _library()
    if backend != "c" or lib is None:
        return "numpy"
    return "c+avx2" if lib.grpo_vector_exp() else "c"


def supports(ratio_level: str, beta: float, kl_bias_correction: bool) -> bool:
    """Whether the kernel computes these settings: token-level ratios, and no KL bias
    correction in the loss (GSPO's sequence ratio and TRL's corrected KL stay in numpy)."""
    return ratio_level == "token" and not (kl_bias_correction and beta != 0.0)


@dataclass(frozen=True)
class Folded:
    """What :func:`fold` returns for a batch of ``n`` answers."""

    term: F64  # (n,) Σ_t of the per-token term policy − β·KL
    policy: F64  # (n,) Σ_t of the clipped surrogate
    kl: F64 | None  # (n,) Σ_t of the KL estimate, when ref_logp is given
    low: I64  # (n,) tokens with ρ < 1 − ε_low and A < 0, per answer
    high: I64  # (n,) tokens with ρ > 1 + ε_high and A > 0, per answer
    totals: Totals


def _same_dtype(*arrays: np.ndarray | None) -> tuple[bool, list[np.ndarray | None]]:
    """All float32 (as logged) or all float64, C-contiguous; float32 widens exactly."""
    f32 = all(a.dtype == np.float32 for a in arrays if a is not None)
    dt = np.float32 if f32 else np.float64
    return f32, [None if a is None else np.ascontiguousarray(a, dtype=dt) for a in arrays]


def fold(
    logp: np.ndarray,
    old_logp: np.ndarray | None,
    ref_logp: np.ndarray | None,
    adv: F64,
    offsets: I64,
    *,
    d_hist: I64,
    x_hist: I64,
    bins: tuple[float, float, int],
    vector: bool = True,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    log_ratio_clamp: float | None = None,
    seq_ratio_clamp: float | None = None,
    ratio_level: str = "token",
    beta: float = 0.04,
    kl_estimator: str = "k3",
    kl_clamp: float | None = None,
    kl_bias_correction: bool = False,
) -> Folded:
    """One pass over a batch: per-answer sums, clip counts, ratio and KL moments.

    Arguments and settings as :func:`grpo_cli._core.token_terms` takes them (the ratio per
    token only, no KL bias correction: :func:`supports` says). ``d_hist`` and ``x_hist``
    (``nbins + 2`` int64 counts of the log-ratio ``Δ`` and of
    ``d = ref_logp − logp`` on ``bins``) are incremented in place, binned exactly as
    :class:`grpo_cli._stats.Histogram` bins. ``vector=False`` takes the scalar path even
    on an AVX2 machine (the tests compare both with numpy).
    """
    lib = _library()
    if lib is None:
        raise ValueError("the compiled kernel is not built")
    if not supports(ratio_level, beta, kl_bias_correction):
        raise ValueError("the compiled kernel folds token-level ratios without KL bias correction")
    del seq_ratio_clamp  # sequence level only
    require_reference(beta, ref_logp)
    f32, (lp, old, ref) = _same_dtype(logp, old_logp, ref_logp)
    if lp is None:
        raise ValueError("logp: required")
    lo, hi, nb = bins
    params = Params(
        lo=1.0 - clip_eps,
        hi=1.0 + (clip_eps if clip_eps_high is None else clip_eps_high),
        dual=math.nan if dual_clip is None else dual_clip,
        lrc=math.inf if log_ratio_clamp is None else log_ratio_clamp,
        beta=beta,
        kl_clamp=math.inf if kl_clamp is None else kl_clamp,
        kl_est={"k1": 1, "k2": 2, "k3": 3}[kl_estimator],
        h_lo=lo,
        h_inv_w=nb / (hi - lo),
        h_nb=nb,
    )
    n = int(offsets.shape[0] - 1)
    term, policy = np.empty(n), np.empty(n)
    kl = np.empty(n) if ref is not None else None
    low, high = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    tot = Totals(
        d_min=math.inf, d_max=-math.inf, k_min=math.inf, k_max=-math.inf,
        x_min=math.inf, x_max=-math.inf,
    )  # fmt: skip
    offs = np.ascontiguousarray(offsets, dtype=np.int64)
    a = np.ascontiguousarray(adv, dtype=np.float64)
    for h in (d_hist, x_hist):
        if not (h.dtype == np.int64 and h.flags.c_contiguous and h.shape[0] == nb + 2):
            raise ValueError(f"histogram counts: expected {nb + 2} contiguous int64 counts")

    def p(x: np.ndarray | None) -> int | None:
        return None if x is None else x.ctypes.data

    lib.grpo_fold(
        ctypes.byref(params),
        n,
        p(offs),
        p(a),
        p(lp),
        p(old),
        p(ref),
        int(f32),
        p(term),
        p(policy),
        p(kl),
        p(low),
        p(high),
        p(d_hist),
        p(x_hist),
        ctypes.byref(tot),
        int(vector),
    )
    return Folded(term=term, policy=policy, kl=kl, low=low, high=high, totals=tot)
