"""The optional compiled kernel (``_kernel.c``), loaded with ctypes.

``setup.py`` builds it when a C compiler is at hand; without it, or with the engine's
backend ``numpy`` (:class:`grpo_cli.engine.options.EngineOptions`), grpo-cli computes the same
statistics with numpy (:meth:`grpo_cli.fold.tokens.TokenPartial.update`): ~40 ns per token
where the kernel needs ~7, about 1.9x slower end to end. Nothing here reads the
environment: the CLI maps ``GRPO_CLI_KERNEL`` to the backend (CI sets ``c``, so a missing
kernel fails there instead of silently testing numpy).

The kernel folds one record batch in one pass over its token columns; see
:func:`fold`: the objective's sums, counts and histograms, and on request each answer's
gradient sums (``objective --gradient``, ``explain``) and extremes (``answers``). A ctypes
call releases the GIL, so worker threads run it in parallel. What it returns is fresh
arrays; the caller merges them (histogram counts: :meth:`grpo_cli.core.stats.Histogram.add_counts`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple, Unpack

import numpy as np
from numpy.typing import NDArray

from ..errors import GrpoCliError, InputError
from . import TermConventions, TermOptions, check_offsets, require_reference, term_options
from .stats import BinCounts, bin_index

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


class Out(ctypes.Structure):
    """Where ``grpo_fold`` writes its per-answer results and histogram counts (NULL:
    not asked), and the two per-token inputs that change its policy term (``pol_in``,
    ``w_in``; NULL: the clipped surrogate); the order of ``grpo_out`` in _kernel.c."""

    _fields_ = [
        (name, ctypes.c_void_p)
        for name in (
            "term",
            "policy",
            "kl",
            "low",
            "high",
            "d_hist",
            "x_hist",
            "g_pp",
            "g_kk",
            "g_pk",
            "g_nz",
            "kl_max",
            "lr_max",
            "kl_at",
            "lr_at",
            "pol_in",
            "w_in",
        )
    ]


_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
# grpo_fold(params, n, offsets, adv, logp, old, ref, f32, out, totals, vector)
_ARGS: list[Any] = [ctypes.POINTER(Params), _i64, *[_ptr] * 5, _i64, ctypes.POINTER(Out)]
_ARGS += [ctypes.POINTER(Totals), _i64]


ABI_VERSION = 6  # grpo_abi() in _kernel.c: bump both when Params, Totals, Out or grpo_fold change


def check_abi(lib: ctypes.CDLL, origin: str) -> None:
    """Refuse a kernel built from another version of ``_kernel.c``: its struct layouts
    would be read as garbage (a :class:`GrpoCliError` saying to rebuild)."""
    out = (ctypes.c_int64 * 4)()
    abi = getattr(lib, "grpo_abi", None)
    got = (0, 0, 0, 0)
    if abi is not None:
        abi.restype = ctypes.c_int64
        n = min(int(abi(out)), 4)
        got = tuple(out[k] if k < n else 0 for k in range(4))  # type: ignore[assignment]
    want = (ABI_VERSION, ctypes.sizeof(Params), ctypes.sizeof(Totals), ctypes.sizeof(Out))
    if got != want:
        raise GrpoCliError(
            f"{origin}: the compiled kernel does not match this grpo-cli (interface "
            f"{got[0]}, struct sizes {'/'.join(map(str, got[1:]))}; expected {want[0]}, "
            f"{'/'.join(map(str, want[1:]))}): rebuild it with pip install -e ."
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
    lib.grpo_exp.argtypes = [_ptr, _ptr, _i64]
    lib.grpo_exp.restype = _i64
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


def supports_options(o: TermOptions) -> bool:
    """:func:`supports` of a :class:`~grpo_cli.core.TermOptions`."""
    return supports(o.ratio_level, o.beta, o.kl_bias_correction)


class GradientParts(NamedTuple):
    """Per answer, the sums of :func:`grpo_cli.core.token_gradients`' derivatives over its
    tokens: ``Σ g_p²``, ``Σ g_k²`` and ``Σ g_p·g_k`` (the KL's None when not asked), and
    its tokens of nonzero ``g_p``."""

    pp: F64
    kk: F64 | None
    pk: F64 | None
    nonzero: I64


class Extremes(NamedTuple):
    """Per answer, the largest |Δ| and KL estimate (None without ``ref_logp``), and the
    first of its tokens holding each (as ``np.argmax``)."""

    log_ratio_max: F64
    log_ratio_at: I64
    kl_max: F64 | None
    kl_at: I64 | None


@dataclass(frozen=True)
class Folded:
    """What :func:`fold` returns for a batch of ``n`` answers."""

    term: F64  # (n,) Σ_t of the per-token term policy − β·KL
    policy: F64  # (n,) Σ_t of the clipped surrogate
    kl: F64 | None  # (n,) Σ_t of the KL estimate, when ref_logp is given
    low: I64  # (n,) tokens with ρ < 1 − ε_low and A < 0, per answer
    high: I64  # (n,) tokens with ρ > 1 + ε_high and A > 0, per answer
    totals: Totals
    # the occupied bins' counts of Δ and of d = ref_logp − logp on ``bins`` (None: not
    # asked), binned as :class:`grpo_cli.core.stats.Histogram` bins: merged with add_counts
    d_counts: BinCounts | None = None
    x_counts: BinCounts | None = None
    gradient: GradientParts | None = None
    extremes: Extremes | None = None


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
    options: TermOptions | None = None,
    bins: tuple[float, float, int] | None = None,
    gradient: bool = False,
    extremes: bool = False,
    vector: bool = True,
    policy: F64 | None = None,
    weight: F64 | None = None,
    **conventions: Unpack[TermConventions],
) -> Folded:
    """One pass over a batch: per-answer sums, clip counts, ratio and KL moments.

    Arguments and conventions as :func:`grpo_cli.core.token_terms` takes them (the ratio
    per token only, no KL bias correction: :func:`supports` says). ``bins``: the layout
    ``(lo, hi, nbins)`` of the two histograms to count Δ and ``d = ref_logp − logp`` into
    (None: no histogram); ``gradient``: each answer's gradient sums (:class:`GradientParts`;
    the KL's when β ≠ 0); ``extremes``: each answer's :class:`Extremes`. ``vector=False``
    takes the scalar path even on an AVX2 machine (the tests compare both with numpy).

    The policy term is the clipped surrogate unless ``policy`` gives it per token (another
    loss's terms, ``(T,)`` float64: summed in place of the surrogate, the term being
    ``policy − β·KL``; not with ``gradient``), or ``weight`` multiplies it and its
    gradient per token (a correction's weights times the masks: 0 where the weight is 0,
    as :func:`grpo_cli.fold.parts._times`). The clip counts and the ratio statistics are
    the token ratio's either way.

    Raises:
        InputError: ``offsets`` breaks the contract of :func:`grpo_cli.core.check_offsets`,
            or the arrays' shapes disagree with it.
    """
    lib = _library()
    if lib is None:
        raise ValueError("the compiled kernel is not built")
    offs = check_offsets(offsets, logp.shape[0])
    n = int(offs.shape[0] - 1)
    for name, x in (("old_logp", old_logp), ("ref_logp", ref_logp)):
        if x is not None and x.shape != logp.shape:
            raise InputError(f"{name}: expected shape {logp.shape} like logp, got {x.shape}")
    if adv.shape != (n,):
        raise InputError(f"adv: expected shape ({n},) (one advantage per answer), got {adv.shape}")
    pol_in, w_in = _token_input("policy", policy, logp), _token_input("weight", weight, logp)
    if policy is not None and (weight is not None or gradient):
        raise ValueError("a given policy term takes no weight and no gradient")
    o = term_options(options, conventions)
    if not supports_options(o):
        raise ValueError("the compiled kernel folds token-level ratios without KL bias correction")
    require_reference(o.beta, ref_logp)
    f32, (lp, old, ref) = _same_dtype(logp, old_logp, ref_logp)
    if lp is None:
        raise ValueError("logp: required")
    lo, hi, nb = bins if bins is not None else (0.0, 1.0, 1)
    params = _params(o, lo, hi, nb)
    res = _Results.empty(n, ref is not None, gradient and ref is not None and o.beta != 0.0)
    d_buf = x_buf = None
    if bins is not None:
        d_buf, x_buf = _scratch(nb)
        x_buf = x_buf if ref is not None else None
    tot = Totals(
        d_min=math.inf, d_max=-math.inf, k_min=math.inf, k_max=-math.inf,
        x_min=math.inf, x_max=-math.inf,
    )  # fmt: skip
    a = np.ascontiguousarray(adv, dtype=np.float64)
    out = res.out(d_buf, x_buf, gradient, extremes, pol_in, w_in)
    args = (ctypes.byref(params), n, _p(offs), _p(a), _p(lp), _p(old), _p(ref), int(f32))
    lib.grpo_fold(*args, ctypes.byref(out), ctypes.byref(tot), int(vector))
    d_counts = x_counts = None
    if d_buf is not None:
        d_counts = _take(d_buf, tot.d_min, tot.d_max, lo, params.h_inv_w, nb)
    if x_buf is not None:
        x_counts = _take(x_buf, tot.x_min, tot.x_max, lo, params.h_inv_w, nb)
    grad = res.gradient if gradient else None
    ext = res.extremes if extremes else None
    return Folded(res.term, res.policy, res.kl, res.low, res.high, tot, d_counts, x_counts, grad,
                  ext)  # fmt: skip


def _p(x: np.ndarray | None) -> int | None:
    """The address of an array's data (None: NULL)."""
    return None if x is None else x.ctypes.data


def _token_input(name: str, x: F64 | None, logp: np.ndarray) -> F64 | None:
    """A per-token float64 input of the kernel, contiguous, shaped as ``logp``."""
    if x is None:
        return None
    if x.shape != logp.shape:
        raise InputError(f"{name}: expected shape {logp.shape} like logp, got {x.shape}")
    out: F64 = np.ascontiguousarray(x, dtype=np.float64)
    return out


def _params(o: TermOptions, lo: float, hi: float, nb: int) -> Params:
    """The kernel's settings of a run (infinity turns a clamp off, NaN the dual clip)."""
    return Params(
        lo=1.0 - o.clip_eps,
        hi=1.0 + o.eps_high,
        dual=math.nan if o.dual_clip is None else o.dual_clip,
        lrc=math.inf if o.log_ratio_clamp is None else o.log_ratio_clamp,
        beta=o.beta,
        kl_clamp=math.inf if o.kl_clamp is None else o.kl_clamp,
        kl_est={"k1": 1, "k2": 2, "k3": 3}[o.kl_estimator],
        h_lo=lo,
        h_inv_w=nb / (hi - lo),
        h_nb=nb,
    )


@dataclass(frozen=True)
class _Results:
    """The fresh arrays one call of the kernel writes its per-answer results into."""

    term: F64
    policy: F64
    kl: F64 | None
    low: I64
    high: I64
    gradient: GradientParts
    extremes: Extremes

    @classmethod
    def empty(cls, n: int, with_ref: bool, grad_kl: bool) -> _Results:
        def f() -> F64:
            return np.empty(n)

        def i() -> I64:
            return np.empty(n, dtype=np.int64)

        return cls(
            f(), f(), f() if with_ref else None, i(), i(),
            GradientParts(f(), f() if grad_kl else None, f() if grad_kl else None, i()),
            Extremes(f(), i(), f() if with_ref else None, i() if with_ref else None),
        )  # fmt: skip

    def out(
        self,
        d_hist: I64 | None,
        x_hist: I64 | None,
        gradient: bool,
        extremes: bool,
        pol_in: F64 | None,
        w_in: F64 | None,
    ) -> Out:
        """The kernel's ``grpo_out``: NULL for what is not asked."""
        g = self.gradient if gradient else GradientParts(None, None, None, None)  # type: ignore[arg-type]
        e = self.extremes if extremes else Extremes(None, None, None, None)  # type: ignore[arg-type]
        return Out(
            term=_p(self.term), policy=_p(self.policy), kl=_p(self.kl), low=_p(self.low),
            high=_p(self.high), d_hist=_p(d_hist), x_hist=_p(x_hist),
            g_pp=_p(g.pp), g_kk=_p(g.kk), g_pk=_p(g.pk), g_nz=_p(g.nonzero),
            kl_max=_p(e.kl_max), lr_max=_p(e.log_ratio_max), kl_at=_p(e.kl_at),
            lr_at=_p(e.log_ratio_at), pol_in=_p(pol_in), w_in=_p(w_in),
        )  # fmt: skip


_local = threading.local()


def _scratch(nb: int) -> tuple[I64, I64]:
    """This thread's two zeroed count buffers of ``nb + 2`` bins the kernel bins into,
    reused call after call (fresh ones would cost a page fault every 512 bins touched)."""
    bufs: dict[int, tuple[I64, I64]] = _local.__dict__.setdefault("bufs", {})
    if nb not in bufs:
        bufs[nb] = (np.zeros(nb + 2, dtype=np.int64), np.zeros(nb + 2, dtype=np.int64))
    return bufs[nb]


def _take(buf: I64, vmin: float, vmax: float, lo: float, inv_w: float, nb: int) -> BinCounts:
    """The occupied bins of ``buf`` and their counts, taken out: ``buf`` is left all zeros
    for the next call. Only the bins between those of the values' min and max can be
    occupied (binning is monotone), and only those are read."""
    if vmin > vmax:  # no value binned
        return BinCounts(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    a, b = bin_index(vmin, lo, inv_w, nb), bin_index(vmax, lo, inv_w, nb) + 1
    index = np.flatnonzero(buf[a:b])
    index += a
    out = BinCounts(index, buf[index])
    buf[index] = 0
    return out


@cache
def _vector_exp() -> ctypes.CDLL | None:
    """The kernel when it has the AVX2 exponential on this CPU, else None."""
    lib = _library()
    return lib if lib is not None and lib.grpo_vector_exp() else None


# below this many values numpy's exp costs less than the ctypes call
_VECTOR_EXP_MIN = 256


def exp(x: F64 | float) -> F64:
    """``exp(x)`` of float64 values, as a fresh array: libmvec's AVX2 exp through the
    kernel where it is built and the CPU has AVX2 (within 4 ulp of numpy's, ~1 ns a value
    against ~7), else numpy's. Overflow is ``inf`` without a warning, as the loss
    functions' ``np.exp`` under ``errstate(over="ignore")``; NaN stays NaN.

    Example:
        >>> exp(np.array([0.0, 1.0, -np.inf])).tolist()[::2]
        [1.0, 0.0]
    """
    a = np.asarray(x, dtype=np.float64)
    lib = _vector_exp() if a.size >= _VECTOR_EXP_MIN else None
    if lib is None:
        with np.errstate(over="ignore"):
            return np.exp(a)
    a = np.ascontiguousarray(a)
    out = np.empty_like(a)
    lib.grpo_exp(_p(a), _p(out), a.size)
    return out
