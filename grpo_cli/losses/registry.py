"""The row types of the loss registry and what every trainer's loss module shares.

A trainer's policy losses, sampler–trainer corrections and policy-term masks are functions
over ragged arrays (:mod:`grpo_cli.losses.trl`, ``.verl``, ``.openrlhf``), each with one
row beside it: a :class:`Loss`, a :class:`CorrectionRow` or a :class:`Mask`. A row says
everything the rest of grpo-cli needs of its function — its parameter record
(:class:`Params`), the aggregation it forces, whether its ratio is per token, whether it
needs the whole batch, its logged metrics and what they count, its clip metric, its words
for ``explain``, and how the fold applies it — so the fold, the settings, the CLI and the
views look a loss up instead of branching on its name (as verl's ``POLICY_LOSS_REGISTRY``
registers a loss beside its function, and pyarrow.compute a function with its options
class).

Layout and shape letters are the core's (:mod:`grpo_cli.core`): token fields are flat
``(T,)`` arrays, ``offsets`` is ``(N+1,)``, answer ``i`` owns ``[offsets[i], offsets[i+1])``;
an advantage is ``(N,)`` (one per answer) or ``(T,)`` (one per token, as verl passes them).

Conventions shared by every loss function:

- ``term``: the per-token *objective* (maximised), i.e. minus the trainer's per-token loss,
  before aggregation. ``agg`` names the aggregation the trainer forces for this loss
  (None: the one the trainer's configuration names, ``loss_agg_mode`` / ``loss_type``).
- ``grad[t] = ∂(Σ_{t'∈i} term[t'])/∂logp[t]`` for ``t`` in answer ``i``, the trainer's
  detached factors held constant (for a token-local term, ``∂term[t]/∂logp[t]``). Every
  aggregation weights an answer's tokens equally, so ``∂J/∂logp[t] = w_i · grad[t]``
  (:func:`grpo_cli.core.aggregation_weights`), as the core's ``token_gradients``.
- ``flags`` and ``values``: per-token quantities the trainer's logged metrics read;
  :func:`loss_metrics` turns them into the metrics by their logged names.
- Arithmetic in float64 whatever the input dtype; ratios in log space; a product with an
  exact zero factor is 0 even where the other factor overflowed to ±inf (no NaN); inputs
  are never written to.

Folding: a loss whose terms depend only on their token, or on their answer's tokens, folds
batch by batch from mergeable sums like the clipped surrogate (answer-level ones need the
whole answer, or its sums). A loss that chooses tokens over the batch its trainer's loss
function received (:attr:`Loss.whole_batch`) does not fold beyond it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..core import (
    Aggregation,
    RatioLevel,
    check_offsets,
    segment_count,
    segment_mean,
    segment_sum,
)
from ..core import kernel as _kernel
from ..errors import InputError, SettingError, UsageError

__all__ = [
    "VERL_MEAN_EPS",
    "Correction",
    "CorrectionRow",
    "Loss",
    "LossCall",
    "Mask",
    "Metric",
    "NoParams",
    "Params",
    "PolicyTerms",
    "Spec",
    "apply_correction",
    "drop_tokens",
    "kept_stretch",
    "loss_metrics",
    "metric_sums",
    "param",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
Bools = NDArray[np.bool_]

# verl_F.masked_mean divides by (count + 1e-8)
VERL_MEAN_EPS = 1e-8


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class PolicyTerms:
    """Per-token terms of one policy loss (see the module's conventions).

    ``term``, ``ratio`` and every ``flags``/``values`` entry are ``(T,)``; ``grad`` is
    ``(T,)`` or None (no closed form); ``weight`` is the detached coefficient the loss
    multiplies ``A`` (or ``A·logp``) by, where it has one (CISPO's clipped ratio, SAPO's
    gate, VESPO's φ, DPPO's truncated ratio); ``answer_values`` are ``(N,)``; ``level`` is
    the level of ``ratio`` (TRL logs sequence-level metrics over answers); ``agg`` the
    aggregation the trainer forces, or None.
    """

    term: F64
    grad: F64 | None
    ratio: F64
    weight: F64 | None = None
    flags: Mapping[str, Bools] = field(default_factory=dict)
    values: Mapping[str, F64] = field(default_factory=dict)
    answer_values: Mapping[str, F64] = field(default_factory=dict)
    level: RatioLevel = "token"
    agg: Aggregation | None = None


@dataclass(frozen=True)
class Correction:
    """A sampler–trainer correction: ``weight`` ``(T,)`` multiplies the policy term (0 on
    a masked token or answer), ``keep`` ``(T,)`` is False on tokens a rejection removes
    from the trainer's mask (they leave the aggregation's counts too: :func:`drop_tokens`),
    ``metrics`` the trainer's logged metrics by name; ``before``: those of its metrics that
    are statistics of the capped weights, of the raw ratio before the cap instead (issue
    29: a logged value may be the one before the truncation; empty when nothing is
    capped)."""

    weight: F64
    keep: Bools
    metrics: dict[str, float]
    before: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------ parameter records
SpecKind = Literal["number", "int", "bool", "choice", "band", "text"]


@dataclass(frozen=True)
class Spec:
    """One parameter of a loss, correction or mask, under its trainer's config name.

    ``kind``: ``number`` (a float), ``int``, ``bool``, ``choice`` (one of ``choices``),
    ``band`` (a number, or verl's ``"lower_upper"`` text), ``text`` (a string its row
    reads); ``optional``: None is allowed (``off`` on the command line); ``low``: the
    number must be above it (at or above with ``closed``); ``check`` a further check that
    returns the problem or None."""

    kind: SpecKind = "number"
    help: str = ""
    choices: tuple[str, ...] = ()
    optional: bool = False
    low: float | None = None
    closed: bool = False
    check: Callable[[Any], str | None] | None = None

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` for this parameter, or None."""
        if value is None:
            return None if self.optional else "must be given"
        if self.kind == "bool":
            return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
        if self.kind == "choice":
            if value not in self.choices:
                return f"{value!r} is not one of {', '.join(self.choices)}"
            return None
        if self.kind == "text" or (self.kind == "band" and isinstance(value, str)):
            if not isinstance(value, str):
                return f"expected a string, got {value!r}"
            return None if self.check is None else self.check(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {value!r}"
        if self.kind == "int" and not float(value).is_integer():
            return f"expected an integer, got {value!r}"
        if not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if self.low is not None and (value < self.low if self.closed else value <= self.low):
            return (
                f"must be a finite number {'>=' if self.closed else '>'} {self.low:g}, got {value}"
            )
        return None if self.check is None else self.check(value)

    def parse(self, text: str) -> object:
        """``value`` as the command line gives it (``--loss-param NAME=TEXT``).

        Raises:
            ValueError: the text does not read as this parameter's kind.
        """
        t = text.strip()
        if self.optional and t.lower() in ("off", "none", "null"):
            return None
        if self.kind == "bool":
            low = t.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if self.kind in ("choice", "text"):
            return t
        if self.kind == "band" and "_" in t:  # verl's "lower_upper": never float("1_2")
            return t
        if "_" in t:
            raise ValueError("expected a number")
        try:
            value = float(t)
        except ValueError:
            if self.kind == "band":  # a text its row reads ("0.5,0.1": one per option)
                return t
            raise ValueError("expected a number") from None
        return int(value) if self.kind == "int" and value.is_integer() else value


def param(default: Any, spec: Spec | None = None, **kw: Any) -> Any:
    """A field of a :class:`Params` record: its default and its :class:`Spec`."""
    return field(default=default, metadata={"spec": spec if spec is not None else Spec(**kw)})


@dataclass(frozen=True)
class Params:
    """The parameter record of one loss, correction or mask (a frozen dataclass whose
    fields are :func:`param` s, named as the trainer's config names them). Each field is
    checked by its :class:`Spec` when the record is made; :meth:`check` adds the checks
    across fields. A problem is a :class:`~grpo_cli.errors.SettingError` naming the
    parameter."""

    # the parameters another record of the same row shares (verl's bypass mode: the
    # rollout correction's), for help text
    shared: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            spec: Spec = f.metadata["spec"]
            if spec.kind == "number" and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))
            problem = spec.problem(value)
            if problem is not None:
                raise SettingError(f.name, problem)
        self.check()

    def check(self) -> None:
        """Checks across the record's fields (a record overrides it)."""

    @classmethod
    def specs(cls) -> dict[str, Spec]:
        """Each parameter's spec by name, in the record's order."""
        return {f.name: f.metadata["spec"] for f in dataclasses.fields(cls)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **values: Any) -> Params:
        return dataclasses.replace(self, **values)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class NoParams(Params):
    """The record of a loss without parameters of its own."""


# ------------------------------------------------------------------------ metrics
# How a logged metric of a loss counts over the batch its trainer's loss saw: "tokens":
# Σ_t x / T (verl divides by T + 1e-8); "answers": mean over answers of x (answer_values)
# or of the answer's token mean; "level": tokens for a token-level ratio, answers for a
# sequence-level one (TRL); "answer_min"/"answer_max": extremes over answers of the
# answer's token mean; "zero": 0.
Unit = Literal["tokens", "answers", "level", "answer_min", "answer_max", "zero"]


class Metric(NamedTuple):
    """One metric a trainer logs for a loss: its logged ``name``, the ``key`` of the
    terms' ``flags``/``values``/``answer_values`` it reads, its :data:`Unit`, and what it
    counts in words."""

    name: str
    key: str
    unit: Unit
    doc: str = ""


# one metric of one batch as a mergeable sum: ("mean", Σ, count) | ("min" | "max", value, 0)
MetricSum = tuple[str, float, float]


def metric_sums(
    terms: PolicyTerms, offsets: ArrayLike, metrics: Sequence[Metric]
) -> dict[str, MetricSum]:
    """The ``metrics`` a trainer logs for a loss (its row's :meth:`Loss.metrics_for`) over
    one batch, each as a sum that merges with other batches' (a mean as its sum and count,
    an extreme as itself): what :func:`loss_metrics` divides out, and what the fold adds up.
    """
    off = check_offsets(offsets, terms.term.shape[0], nonempty=True)
    n, T = float(off.shape[0] - 1), float(off[-1])
    out: dict[str, MetricSum] = {}
    shares: dict[str, F64] = {}  # a key's answer means, computed once for its metrics
    for name, key, unit, _doc in metrics:
        if unit == "zero":
            out[name] = ("mean", 0.0, 1.0)
            continue
        if key in terms.answer_values:  # one value an answer: no token mean to take
            v = np.asarray(terms.answer_values[key], dtype=np.float64)
            if unit == "answer_min":
                out[name] = ("min", float(v.min()), 0.0)
            elif unit == "answer_max":
                out[name] = ("max", float(v.max()), 0.0)
            else:
                out[name] = ("mean", float(np.sum(v)), n)
            continue
        x = terms.flags[key] if key in terms.flags else terms.values[key]
        if unit == "level":
            unit = "answers" if terms.level == "sequence" else "tokens"
        if unit == "tokens":
            out[name] = ("mean", float(np.sum(np.asarray(x, dtype=np.float64))), T)
            continue
        if key not in shares:
            shares[key] = segment_mean(np.asarray(x, dtype=np.float64), off)
        share = shares[key]
        if unit == "answers":
            out[name] = ("mean", float(np.sum(share)), n)
        elif unit == "answer_min":
            out[name] = ("min", float(share.min()), 0.0)
        else:
            out[name] = ("max", float(share.max()), 0.0)
    return out


def loss_metrics(
    terms: PolicyTerms, offsets: ArrayLike, metrics: Sequence[Metric]
) -> dict[str, float]:
    """The ``metrics`` a trainer logs for a loss (its row's :meth:`Loss.metrics_for`),
    computed from ``terms`` over the tokens ``offsets`` describe (the batch the trainer's
    loss function saw: verl's micro-batch, TRL's per-device batch).

    Example:
        >>> t = PolicyTerms(np.zeros(3), None, np.ones(3), values={"d": np.array([1., 2., 6.])})
        >>> loss_metrics(t, [0, 2, 3], (Metric("mean_d", "d", "tokens"),
        ...                            Metric("answer_mean_d", "d", "answers")))
        {'mean_d': 3.0, 'answer_mean_d': 3.75}
    """
    return {
        name: (value / count if kind == "mean" else value)
        for name, (kind, value, count) in metric_sums(terms, offsets, metrics).items()
    }


# ------------------------------------------------------------------------ the rows
@dataclass(frozen=True)
class LossCall:
    """What a loss's function is called with over one batch of whole answers: the batch's
    token ``fields`` (``logp``; ``old_logp`` is ``logp`` when not given: on-policy), the
    advantages, the settings' clip conventions (``clip_low`` ε_low, ``clip_high`` ε_high,
    ``dual_clip`` c or None, ``log_ratio_clamp``, ``ratio_level``), the loss's parameter
    record, the correction of the batch (None: none) and whether the aggregation is a mean
    over answers (verl's bypass mode scales an answer's kept tokens by it)."""

    fields: Mapping[str, F64]
    adv: F64
    offsets: I64
    params: Params
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    log_ratio_clamp: float | None = None
    ratio_level: RatioLevel = "token"
    correction: Correction | None = None
    correction_name: str = "none"
    answer_mean: bool = False

    @property
    def logp(self) -> F64:
        return self.fields["logp"]

    @property
    def old(self) -> F64:
        return self.fields.get("old_logp", self.fields["logp"])


# How a loss takes the settings' correction: "multiply" its term and gradient by the weight
# (:func:`apply_correction`), "inside" its function reads ``LossCall.correction`` itself
# (a weight inside its function), "own" it computes a correction of its own (then
# ``Loss.terms`` returns an :class:`OwnCorrection`)
CorrectionWay = Literal["multiply", "inside", "own"]


@dataclass(frozen=True)
class OwnCorrection:
    """What a loss that computes its own correction (:attr:`Loss.correction`
    ``"own"``) returns: the terms over every token (its rejection's tokens 0), the
    correction, the terms of the kept tokens and their offsets (the loss's metrics are
    theirs)."""

    terms: PolicyTerms
    correction: Correction
    kept: PolicyTerms
    kept_offsets: I64


@dataclass(frozen=True)
class Loss:
    """One policy loss of one trainer: the registry row beside its function.

    ``name`` is ``trainer/config value``; ``terms`` maps a :class:`LossCall` to its
    :class:`PolicyTerms` (or :class:`OwnCorrection`); ``params`` its parameter record;
    ``agg`` the aggregation it forces whatever the trainer's config (None: the config's);
    ``token_ratio`` its ratio is per token whatever ``ratio_level``; ``whole_batch`` why it
    needs the whole batch the trainer's loss saw (it does not fold beyond it; None: it
    folds); ``metrics`` what the trainer logs for it (or a function of its parameters);
    ``clip`` the logged metrics whose sum is the share it clips (None: it clips nothing;
    ``"core"``: the clipped surrogate's own clip counts); ``correction`` how it takes the
    settings' correction; ``own_correction`` the correction row whose metrics its own
    correction logs; ``needs`` the token fields it reads beyond the policies' log-probs;
    ``words`` what ``explain`` says of it; ``describe`` words that depend on its parameters;
    ``fold_note`` a note on how it was folded, from its parameters and its folded metrics."""

    name: str
    terms: Callable[[LossCall], PolicyTerms | OwnCorrection] | None
    words: str
    params: type[Params] = NoParams
    agg: Aggregation | None = None
    token_ratio: bool = False
    whole_batch: str | None = None
    metrics: tuple[Metric, ...] | Callable[[Params], tuple[Metric, ...]] = ()
    clip: tuple[str, ...] | Literal["core"] | Callable[[Params], tuple[str, ...] | None] | None = (
        None
    )
    correction: CorrectionWay = "multiply"
    own_correction: str | None = None
    needs: tuple[str, ...] = ()
    describe: Callable[[Params], str] | None = None
    fold_note: Callable[[Params, Mapping[str, float]], str] | None = None

    @property
    def trainer(self) -> str | None:
        return None if "/" not in self.name else self.name.split("/", 1)[0]

    def metrics_for(self, params: Params | None) -> tuple[Metric, ...]:
        """The metrics the trainer logs for this loss with these parameters."""
        if callable(self.metrics):
            return self.metrics(params if params is not None else self.params())
        return self.metrics

    def clip_for(self, params: Params) -> tuple[str, ...] | Literal["core"] | None:
        """The metrics whose sum is the share this loss clips (see ``clip``)."""
        return self.clip(params) if callable(self.clip) else self.clip


@dataclass(frozen=True)
class CorrectionRow:
    """One sampler–trainer correction of one trainer, applied where ``rollout_logp`` is
    given: ``name`` (``trainer-kind``), its ``trainer``, ``params`` its record, ``compute``
    ``(old_logp, rollout_logp, offsets, params) → Correction``; ``per_answer`` whether its
    unit is the answer (its metrics fold over answers); ``rejects`` whether it removes
    tokens from the loss (verl's rejection sampling: they leave the batch before the fold);
    ``is_bound`` the upper bound of its IS weights when their spreads fold from sums
    (verl's), ``batch_normalized`` whether its weights are normalised over the batch;
    ``metric_kind`` how each of its metrics folds (``(kind, unit)``); ``excludes`` a
    problem with the other settings (ratio level, loss): ``(field, problem)`` or None; ``words`` and
    ``describe`` what ``explain`` says of it."""

    name: str
    trainer: str
    compute: Callable[[F64, F64, I64, Params], Correction]
    words: str
    params: type[Params] = NoParams
    per_answer: Callable[[Params], bool] = lambda p: False
    rejects: Callable[[Params], bool] = lambda p: False
    is_bound: Callable[[Params], float | None] = lambda p: None
    batch_normalized: Callable[[Params], bool] = lambda p: False
    metric_kind: Callable[[str, bool], tuple[str, str]] = lambda name, seq: ("mean", "tokens")
    excludes: Callable[[Params, RatioLevel, str], tuple[str, str] | None] = lambda p, level, loss: (
        None
    )
    describe: Callable[[Params], str] | None = None
    # what a rejection that removed every token means, for the one error line
    all_rejected: Callable[[Params], str] | None = None
    # where the trainer computes it, said when its batch normalisation is each of
    # grpo-cli's batches'; what its rejection is called in the note on what it removed
    scope: str | None = None
    rejection: str = "the correction's rejection"


@dataclass(frozen=True)
class Mask:
    """A 0/1 per-token weight of the policy term that a trainer applies whatever its loss
    (TRL's high-entropy mask, its off-policy sequence mask): ``name`` (``trainer/mask``),
    ``params`` its record (``on(params)`` says whether it is applied), ``weight`` ``(call) →
    (T,)`` 0/1, ``needs`` the token fields it reads, ``entropy_bonus`` whether the trainer's
    entropy bonus takes its tokens too, ``words`` what ``explain`` says of it. The KL term
    and the aggregation's counts keep every token."""

    name: str
    params: type[Params]
    on: Callable[[Params], bool]
    weight: Callable[[LossCall], F64]
    words: str
    needs: tuple[str, ...] = ()
    entropy_bonus: bool = False

    @property
    def trainer(self) -> str:
        return self.name.split("/", 1)[0]


# --------------------------------------------------------------------------- checks
def _tokens(name: str, x: ArrayLike, T: int | None = None) -> F64:
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise InputError(f"{name}: expected a real-valued array, got dtype {arr.dtype}")
    if arr.ndim != 1 or (T is not None and arr.shape[0] != T):
        want = "(T,)" if T is None else f"({T},) like logp"
        raise InputError(f"{name}: expected shape {want}, got {arr.shape}")
    return arr.astype(np.float64, copy=False)


def _inputs(
    offsets: ArrayLike, adv: ArrayLike | None, **arrays: ArrayLike | None
) -> tuple[I64, F64 | None, dict[str, F64]]:
    """Token arrays as float64 ``(T,)``, ``offsets`` checked (no empty answer), ``adv``
    repeated to tokens; every mismatch named."""
    first = next(iter(arrays))
    lead = _tokens(first, arrays[first])  # type: ignore[arg-type]
    T = lead.shape[0]
    out = {first: lead}
    for name, a in arrays.items():
        if name != first and a is not None:
            out[name] = _tokens(name, a, T)
    off = check_offsets(offsets, T, nonempty=True)
    if adv is None:
        return off, None, out
    a = _tokens("adv", adv)
    n = off.shape[0] - 1
    if a.shape[0] == n:
        a_tok = np.repeat(a, np.diff(off))
    elif a.shape[0] == T:
        a_tok = a
    else:
        raise InputError(f"adv: expected shape ({n},) or ({T},), got {a.shape}")
    return off, a_tok, out


def _choice(name: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        listed = ", ".join(repr(a) for a in allowed)
        raise UsageError(f"{name}: expected one of {listed}, got {value!r}")


def _positive(name: str, value: float, *, zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise UsageError(f"{name}: must be a finite number {'>=' if zero else '>'} 0, got {value}")


# ---------------------------------------------------------------------- arithmetic
def _mul(a: F64, b: F64 | float) -> F64:
    """``a·b``, 0 wherever a factor is exactly 0 (``0·inf`` is 0, not NaN)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.multiply(a, b)
    zero = (a == 0) | (np.asarray(b) == 0)
    if zero.any():
        out = np.where(zero, 0.0, out)
    return out


def _exp(x: F64) -> F64:
    """``exp(x)`` without an overflow warning: the kernel's vector exp where it is built
    (:func:`grpo_cli.core.kernel.exp`), the loss functions' most costly operation."""
    return _kernel.exp(x)


def _log_ratio(logp: F64, old: F64, clamp: float | None) -> tuple[F64, F64]:
    """Raw ``Δ = logp − old`` and the loss's ``Δ'`` (clamped to ±clamp when given)."""
    with np.errstate(over="ignore", invalid="ignore"):
        delta = logp - old
    used = delta if clamp is None else np.clip(delta, -clamp, clamp)
    return delta, used


def _repeat(per_answer: F64, off: I64) -> F64:
    return np.repeat(per_answer, np.diff(off))


def _answer_mean_repeated(x: F64, off: I64) -> F64:
    return _repeat(segment_mean(x, off), off)


def _verl_mean(x: F64 | Bools, count: float) -> float:
    """verl's ``masked_mean`` over all tokens: ``Σ x / (count + 1e-8)``."""
    return float(np.sum(x, dtype=np.float64) / (count + VERL_MEAN_EPS))


def _verl_seq_mean(x: F64, off: I64) -> F64:
    """verl's per-row ``masked_mean(axis=-1)``: ``Σ_t x / (|o_i| + 1e-8)``."""
    return segment_sum(x, off) / (np.diff(off) + VERL_MEAN_EPS)


# ------------------------------------------------------------- shared operations
def apply_correction(terms: PolicyTerms, correction: Correction | ArrayLike) -> PolicyTerms:
    """``terms`` with ``term`` and ``grad`` multiplied by a correction's detached ``weight``
    (0 on a masked token, even where the term is ±inf). How verl 0.9.1 applies
    ``rollout_is_weights`` in every registered loss but the two that take them inside,
    TRL 1.16.0 its vLLM ratio (the policy part only: add the KL term after), OpenRLHF 0.11.2
    its ``coef``.

    Example:
        >>> t = PolicyTerms(np.array([-1.0, -1.0]), np.ones(2), np.ones(2))
        >>> apply_correction(t, np.array([0.5, 0.0])).term.tolist()
        [-0.5, 0.0]
    """
    w = correction.weight if isinstance(correction, Correction) else _tokens("weight", correction)
    if w.shape != terms.term.shape:
        raise InputError(f"weight: expected shape {terms.term.shape} like the terms, got {w.shape}")
    grad = None if terms.grad is None else _mul(terms.grad, w)
    return dataclasses.replace(terms, term=_mul(terms.term, w), grad=grad)


def drop_tokens(
    keep: ArrayLike, offsets: ArrayLike, *fields: ArrayLike
) -> tuple[I64, list[F64], I64]:
    """Remove the tokens a rejection dropped (``keep`` False) from ragged fields.

    Returns the new ``offsets`` over the answers that keep a token, the fields' kept tokens,
    and those answers' indices (to select their ``(N,)`` fields): verl's ``agg_loss``
    leaves a fully masked answer out of every count, as an answer that is not there.

    Example:
        >>> off, (v,), kept = drop_tokens([True, False, False, True], [0, 2, 3, 4],
        ...                               [1.0, 2.0, 3.0, 4.0])
        >>> off.tolist(), v.tolist(), kept.tolist()
        ([0, 1, 2], [1.0, 4.0], [0, 2])
    """
    k = np.asarray(keep)
    if k.dtype != np.bool_ or k.ndim != 1:
        raise InputError(f"keep: expected a (T,) boolean array, got {k.dtype} {k.shape}")
    off = check_offsets(offsets, k.shape[0])
    counts = segment_count(k, off)
    answers = np.flatnonzero(counts > 0).astype(np.int64)
    new = np.zeros(answers.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts[answers], out=new[1:])
    return new, [_tokens(f"fields[{i}]", f, k.shape[0])[k] for i, f in enumerate(fields)], answers


def kept_stretch(keep: Bools, offsets: I64) -> F64:
    """Per token, ``|o_i| / kept_i`` on the tokens a rejection keeps (``keep``), 0 on the
    others: what turns an answer's mean over all its tokens into its mean over its kept
    ones (verl takes a per-answer mean over the mask the rejection left)."""
    lengths = np.diff(offsets)
    kept = np.add.reduceat(keep.astype(np.float64), offsets[:-1]) if keep.size else keep
    per_answer = np.divide(lengths, kept, out=np.zeros(lengths.shape), where=kept > 0)
    out: F64 = np.repeat(per_answer, lengths) * keep
    return out
