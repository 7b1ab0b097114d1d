"""``grpo-cli report RUN --html``: what the page of a run shows, as one JSON-able record
(:func:`run_page`, :func:`step_page`), which :mod:`grpo_cli.views.run_html` embeds.

Per step, one pass over its token batches (:func:`grpo_cli.engine.run.iter_batches`, in
input order, memory bounded by a batch): every answer's summary (reward, advantage,
length, group, the largest |log ρ|, KL and sampler gap, its part of ``‖∂J/∂logp‖²`` as
``answers`` computes it), and, for the answers of the few groups the page shows (the
worst by their largest |log ρ|, KL or sampler gap, and one zero-variance group), each
token's layers from the fold's own per-token terms: ``token_terms`` (log ρ, KL),
``token_gradients`` and, under a trainer's own loss, correction or mask,
:func:`grpo_cli.fold.loss.answer_view` (the gradient the loss takes), the clip classes of
:func:`grpo_cli.core.answer_clip_tokens` token by token, the correction's weights and
rejection (:func:`grpo_cli.fold.loss.correction_of`) and the masks
(:func:`grpo_cli.fold.loss.mask_of`'s rows).

A token's share of the gradient is ``d_t² / Σ_step d²`` with ``d_t = ∂J/∂logp_t / c_p``
(:class:`grpo_cli.commands.answers.GradientWeights`): an answer's shares add up to its
``gradient_share`` in ``answers --sort gradient``.

Size: the page keeps at most :data:`TOKEN_BUDGET` tokens over all its steps (at least
:data:`STEP_FLOOR` a step), an answer at most :data:`ANSWER_TOKENS`; ~60 bytes a token,
so a 100-step run's page stays under 5 MB (tests/test_run_html.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ..batch import Batch
from ..core import answer_clip_tokens, difference, token_gradients, token_terms
from ..engine.options import EngineOptions
from ..errors import InputError
from ..fold.loss import answer_view, correction_of, loss_call, policy_terms, rejects
from ..io import open_source
from ..settings import Settings
from .answers import GradientWeights, answer_stats, gradient_weights
from .share import PROMPT_COLUMNS, TEXT_COLUMNS, TOKEN_COLUMNS

if TYPE_CHECKING:
    from ..io import Source
    from ..records import CheckReport

__all__ = ["ANSWER_TOKENS", "STATES", "TOKEN_BUDGET", "run_page", "step_page", "token_layers"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

TOKEN_BUDGET = 60_000  # tokens carried by the whole page (~60 bytes each)
STEP_FLOOR = 240  # tokens a step keeps however many steps the run has
ANSWER_TOKENS = 512  # tokens of one answer carried
MAX_GROUPS = 6  # groups shown per step at most
PROMPTS_FOLLOWED = 24  # prompts followed across the steps at most
ID_COLUMNS = ("prompt_id", "prompt_idx", "uid", "question_id")

# a token's states, one bit each (the order is the page's legend)
STATES = (
    ("clip-low", "PPO clip: ρ < 1−ε_low with A < 0 (the min takes the clipped branch)"),
    ("clip-high", "PPO clip: ρ > 1+ε_high with A > 0"),
    ("dual-clip", "dual clip: A < 0 and ρ > c"),
    ("loss-clip", "clipped by the loss's own rule (its clip metric's flags)"),
    ("loss-mask", "masked by the loss's own rule (e.g. DPPO's trust-region mask)"),
    ("tis-cap", "IS weight capped (TIS): exp(old − sampler) above the cap"),
    ("is-masked", "IS weight 0 (IcePop / masked IS): outside the band"),
    ("rejected", "rejected by rejection sampling: out of the loss"),
    ("entropy-masked", "outside the high-entropy mask"),
    ("masked", "masked by another policy-term mask (e.g. an off-policy mask)"),
    ("truncated", "the answer hit the length limit"),
)
_BIT = {name: 1 << k for k, (name, _) in enumerate(STATES)}


def _r(x: float | None, digits: int = 4) -> float | None:
    """A number as the page keeps it: ``digits`` significant digits, None when not finite."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def _rl(a: F64 | None, digits: int = 4) -> list[float | None] | None:
    """:func:`_r` of each value, vectorised: ``x`` rounded at its own ``digits``-th
    significant digit (an integer over an exact power of ten, so the shortest repr is
    the rounded decimal)."""
    if a is None:
        return None
    x = np.asarray(a, dtype=np.float64)
    fin = np.isfinite(x) & (x != 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mag = np.where(fin, np.floor(np.log10(np.abs(np.where(fin, x, 1.0)))), 0).astype(int)
        k = digits - 1 - mag
        up = np.clip(k, 0, 300)
        down = np.clip(-k, 0, 300)
        y = np.where(
            k >= 0, np.round(x * 10.0**up) / 10.0**up, np.round(x / 10.0**down) * 10.0**down
        )
    y = np.where(fin, y, x)
    out: list[float | None] = y.tolist()
    if not np.isfinite(x).all():
        out = [v if math.isfinite(v) else None for v in out]  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------ token layers
def _clip_bits(s: Settings, ratio: F64, adv_t: F64) -> I64:
    """The core surrogate's clip class of each token: :func:`answer_clip_tokens` with
    each token its own run (its counts are 0 or 1)."""
    n = ratio.shape[0]
    one = np.arange(n + 1, dtype=np.int64)
    low, high, _, dual = answer_clip_tokens(
        ratio, adv_t, one, clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high,
        dual_clip=s.dual_clip,
    )  # fmt: skip
    bits = np.zeros(n, dtype=np.int64)
    bits |= np.where(low > 0, _BIT["clip-low"], 0)
    bits |= np.where(high > 0, _BIT["clip-high"], 0)
    bits |= np.where((dual > 0) & (low == 0), _BIT["dual-clip"], 0)
    return bits


def _loss_bits(s: Settings, fields: dict[str, F64], adv: F64, offsets: I64, corr: Any) -> I64:
    """A trainer's own loss: its flags, a clip metric's as ``loss-clip`` (``dual`` in
    the name: ``dual-clip``), a mask's (``mask`` in the name) as ``loss-mask``."""
    n = int(offsets[-1])
    bits = np.zeros(n, dtype=np.int64)
    if s.loss_row.terms is None or s.loss_row.correction == "own":
        return bits
    t = policy_terms(s, fields, adv, offsets, corr)
    for key, flag in t.flags.items():
        f = np.asarray(flag, dtype=bool)
        if "dual" in key:
            bits |= np.where(f, _BIT["dual-clip"], 0)
        elif "mask" in key or key in ("invalid", "selected"):
            bits |= np.where(f if key != "selected" else ~f, _BIT["loss-mask"], 0)
        else:
            bits |= np.where(f, _BIT["loss-clip"], 0)
    return bits


def _correction_bits(s: Settings, fields: dict[str, F64], offsets: I64) -> tuple[I64, Any]:
    """The correction's states: rejected (``keep`` False), IS weight 0 on a kept token
    (masked IS), capped (the weight below the raw ``exp(old − sampler)``, of the token or
    of the answer for a per-answer correction)."""
    n = int(offsets[-1])
    bits = np.zeros(n, dtype=np.int64)
    if s.correction_row is None or "rollout_logp" not in fields:
        return bits, None
    corr = correction_of(s, fields, offsets)
    if corr is None:
        return bits, None
    keep, w = np.asarray(corr.keep, dtype=bool), np.asarray(corr.weight, dtype=np.float64)
    d = difference(fields.get("old_logp", fields["logp"]), fields["rollout_logp"])
    row = s.correction_row
    if row.per_answer(s.correction_params):
        d = np.repeat(np.add.reduceat(d, offsets[:-1]), np.diff(offsets)) if n else d
    with np.errstate(over="ignore"):
        raw = np.exp(d)
    bits |= np.where(~keep, _BIT["rejected"], 0)
    bits |= np.where(keep & (w == 0), _BIT["is-masked"], 0)
    if not row.batch_normalized(s.correction_params):
        capped = keep & (w > 0) & (w < raw * (1 - 1e-9))
        bits |= np.where(capped, _BIT["tis-cap"], 0)
    return bits, corr


def _mask_bits(s: Settings, fields: dict[str, F64], adv: F64, offsets: I64) -> I64:
    """The policy-term masks of the settings (TRL's high-entropy mask, off-policy masks):
    0 under a mask row's weight."""
    bits = np.zeros(int(offsets[-1]), dtype=np.int64)
    for m, p in s.mask_rows:
        w = np.asarray(m.weight(loss_call(s, fields, adv, offsets, params=p)))
        name = "entropy-masked" if "entropy" in m.name else "masked"
        bits |= np.where(w == 0, _BIT[name], 0)
    return bits


def token_layers(b: Batch, adv: F64, s: Settings, gw: GradientWeights | None) -> dict[str, Any]:
    """Each token's layers for the answers of ``b`` (whole answers): ``lr`` log ρ
    (``logp − old_logp``), ``gap`` the sampler gap δ = ``old_logp − rollout_logp``, ``kl``
    the KL estimate to the reference, ``ent`` the recorded entropy, ``d`` the token's
    ``∂J/∂logp / c_p`` under the settings' loss (square it and divide by the step's sum
    for its share), ``adv`` its advantage, ``state`` the bits of :data:`STATES`. Arrays
    ``(T_b,)`` (None where the input does not give the layer)."""
    o = s.term_options()
    f = {k: np.asarray(v, dtype=np.float64) for k, v in b.fields.items()}
    off, n = b.offsets, b.n
    terms = token_terms(f["logp"], f.get("old_logp"), f.get("ref_logp"), adv, off, options=o)
    adv_t = adv if adv.shape != (n,) else np.repeat(adv, b.lengths)
    g0, gk = token_gradients(terms, offsets=off, options=o)
    gp: F64 | None = g0
    if s.numpy_only:  # a loss, correction or mask of the trainer's own
        low, high, _, _ = answer_clip_tokens(
            terms.ratio, adv, off, clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high
        )
        view = answer_view(s, f, adv, off, (low + high, g0))
        gp = view.grad
        if gk is not None and view.kl_weight is not None:
            gk = gk * view.kl_weight
    d = None
    if gw is not None and gp is not None:
        inv = np.repeat(1.0 / np.maximum(b.lengths, 1), b.lengths)
        a = inv if gw.up else 1.0
        d = a * gp
        if gw.beta and gk is not None:
            d = d - (inv if gw.uk else 1.0) * gw.beta * gw.ratio * gk
    bits = _clip_bits(s, terms.ratio, adv_t) if s.loss_row.terms is None else None
    cbits, corr = _correction_bits(s, f, off)
    if bits is None:
        bits = _loss_bits(s, f, adv, off, corr)
    bits = bits | cbits | _mask_bits(s, f, adv, off)
    gap = None
    if "rollout_logp" in f:
        gap = difference(f.get("old_logp", f["logp"]), f["rollout_logp"])
    return {
        "lr": terms.delta, "gap": gap, "kl": terms.kl, "ent": f.get("entropy"), "d": d,
        "adv": adv_t, "state": bits,
    }  # fmt: skip


# ------------------------------------------------------------------ one step
@dataclass
class _Answer:
    """One answer's summary (every answer of the step)."""

    row: int  # in the step's input
    group: Any
    key: str  # the group id as text ('' without one)
    reward: float | None
    adv: float
    length: int
    width: int
    lr_max: float
    kl_max: float | None
    gap_mean: float | None
    g2: float | None
    tokens: dict[str, Any] | None = None
    code: int = -1  # its group's row in pass 1's group table


@dataclass
class _Step:
    """What the pass over a step keeps: every answer's summary, the sum of their parts of
    ``‖∂J/∂logp‖²``, the groups whose tokens are held (key → score) and those dropped."""

    answers: list[_Answer] = field(default_factory=list)
    norm2: float = 0.0
    held: dict[str, float] = field(default_factory=dict)
    with_tokens: dict[str, list[_Answer]] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    zero_key: str | None = None  # one zero-variance group, always held


def _score(a: _Answer) -> float:
    """How bad an answer looks: the largest of its |log ρ|, KL and |sampler gap|."""
    vals = [a.lr_max, a.kl_max or 0.0, abs(a.gap_mean or 0.0)]
    fin = [v for v in vals if math.isfinite(v)]
    return max(fin) if fin else 0.0


def _summaries(
    b: Batch, adv: F64, s: Settings, gw: GradientWeights | None, compiled: bool
) -> list[_Answer]:
    """Every answer's summary, from ``answers``' own statistics (:func:`answer_stats`)."""
    st = answer_stats(b, adv, s, grad=gw, compiled=compiled)
    groups, rewards = b.answer.get("group"), b.answer.get("reward")
    gv = [None] * b.n if groups is None else groups.to_pylist()
    rw: list[Any] = [None] * b.n if rewards is None else rewards.to_pylist()
    gap_mean = None
    if "rollout_logp" in b.fields:
        dd = difference(b.fields.get("old_logp", b.fields["logp"]), b.fields["rollout_logp"])
        gap_mean = np.add.reduceat(dd, b.offsets[:-1]) / np.maximum(b.lengths, 1)
    return [
        _Answer(
            row=b.row(i), group=gv[i], key="" if gv[i] is None else str(gv[i]),
            reward=None if rw[i] is None else float(rw[i]), adv=float(st.adv[i]),
            length=int(b.lengths[i]), width=int(b.width[i]), lr_max=float(st.lr_max[i]),
            kl_max=None if st.kl_max is None else float(st.kl_max[i]),
            gap_mean=None if gap_mean is None else float(gap_mean[i]),
            g2=None if st.g2 is None else float(st.g2[i]),
        )
        for i in range(b.n)
    ]  # fmt: skip


def _take(b: Batch, idx: list[int]) -> Batch:
    """The answers ``idx`` of ``b`` as one batch (copies)."""
    lo, hi = b.offsets[idx], b.offsets[np.asarray(idx) + 1]
    tok = np.concatenate([np.arange(a, c) for a, c in zip(lo, hi, strict=True)])
    off = np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int64)
    return Batch(start=b.start, offsets=off, fields={k: v[tok] for k, v in b.fields.items()},
                 width=b.width[idx], answer={}, rows=np.array([b.row(i) for i in idx]))  # fmt: skip


def _hold(acc: _Step, rows: list[_Answer], zero: set[str], keep: int) -> None:
    """Update the groups whose tokens are held: the ``keep`` worst so far (a group
    dropped once is not taken up again) and the first zero-variance group met."""
    held = dict(acc.held)
    for r in rows:
        if r.key not in acc.dropped:
            held[r.key] = max(held.get(r.key, 0.0), _score(r))
    if acc.zero_key is None and zero:
        acc.zero_key = min(zero)
    order = sorted((k for k in held if k != acc.zero_key), key=lambda k: -held[k])
    for k in order[keep:]:
        acc.dropped.add(k)
        for a in acc.with_tokens.pop(k, []):
            a.tokens = None  # memory: the held groups' tokens only
    acc.held = {k: held[k] for k in order[:keep]}
    if acc.zero_key is not None and acc.zero_key in held:
        acc.held[acc.zero_key] = held[acc.zero_key]


def _fold_batch(
    acc: _Step,
    b: Batch,
    adv: F64,
    s: Settings,
    gw: GradientWeights | None,
    p1: Any,
    keep: int,
    compiled: bool = False,
) -> None:
    """Summaries of every answer of the batch; token layers of those whose group is
    held (:func:`_hold`)."""
    rows = _summaries(b, adv, s, gw, compiled)
    acc.norm2 += sum(r.g2 for r in rows if r.g2 is not None and math.isfinite(r.g2))
    zero: set[str] = set()
    if p1.table is not None and "group" in b.answer:
        codes = p1.table.codes(b.answer["group"], "")
        st = p1.table.stats
        for r, c in zip(rows, codes.tolist(), strict=True):
            r.code = int(c)
            if st.min[c] == st.max[c] and st.count[c] > 1:
                zero.add(r.key)
    _hold(acc, rows, zero, keep)
    want = [i for i, r in enumerate(rows) if r.key in acc.held]
    if want:
        sub = _take(b, want)
        per_token = adv.shape != (b.n,)
        a = adv[want] if not per_token else np.concatenate(
            [adv[b.offsets[i] : b.offsets[i + 1]] for i in want])  # fmt: skip
        lay = token_layers(sub, a, s, gw)
        for j, i in enumerate(want):
            t0, t1 = int(sub.offsets[j]), int(sub.offsets[j + 1])
            rows[i].tokens = {k: (None if v is None else v[t0:t1]) for k, v in lay.items()}
            acc.with_tokens.setdefault(rows[i].key, []).append(rows[i])
    acc.answers += rows


def _limit(settings: Settings, config: dict[str, Any]) -> int | None:
    """The length limit an answer is cut at, where known (the run's config, the
    settings' ``max_len``)."""
    for k in ("max_completion_length", "response_length", "max_new_tokens", "generate_max_len"):
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return settings.max_len


def _gradient_weights(src: Source, s: Settings, n: int, engine: EngineOptions) -> Any:
    """``answers``' :class:`GradientWeights` (a counts pass first when they need T or L)."""
    gw = gradient_weights(s, n, None, None)
    if gw is None:
        from ..engine.plan import plan
        from ..engine.run import run
        from ..fold.parts import AnswerCounts

        counts, _ = run(plan(src, ["logp"], engine), AnswerCounts, AnswerCounts.update)
        gw = gradient_weights(s, n, counts.tokens, counts.max_width)
    return gw


def _fold_step(src: Source, s: Settings, engine: EngineOptions, keep: int) -> tuple[_Step, Any]:
    """The pass over one step's tokens (:func:`_fold_batch`), after pass 1."""
    from ..engine.run import iter_batches
    from ..fold.pass1 import objective_pass1

    p1 = objective_pass1(src, s, engine=engine)
    gw = _gradient_weights(src, s, int(p1.adv.shape[0]), engine)
    acc = _Step()
    compiled = engine.backend == "c"
    fields = src.token_fields()
    for b in iter_batches(src, fields, threaded=engine.prefetch):
        _fold_batch(acc, b, p1.advantages(b, src.label), s, gw, p1, keep, compiled)
    return acc, p1


def _texts(src: Source, rows: list[_Answer]) -> dict[int, dict[str, Any]]:
    """The completion, prompt and token strings of ``rows`` where the step's parquet
    files have them (:data:`TEXT_COLUMNS`, :data:`PROMPT_COLUMNS`, :data:`TOKEN_COLUMNS`,
    :data:`ID_COLUMNS`), by row."""
    names = {k: next((c for c in cols if c in src.present), None)
             for k, cols in (("text", TEXT_COLUMNS), ("prompt", PROMPT_COLUMNS),
                             ("toks", TOKEN_COLUMNS), ("pid", ID_COLUMNS))}  # fmt: skip
    cols = sorted({c for c in names.values() if c is not None})
    import pyarrow.parquet as pq

    mask = src.name("mask") if src.has("mask") else None
    out: dict[int, dict[str, Any]] = {}
    if not cols:
        return out
    by_file: dict[int, list[_Answer]] = {}
    for r in rows:
        by_file.setdefault(src.file_of(r.row)[0], []).append(r)
    want = [*cols, *([mask] if mask and names["toks"] else [])]
    for k, members in by_file.items():
        path = src.paths[k]
        if not isinstance(path, Path) or path.suffix.lower() not in (".parquet", ".pq"):
            continue
        first = src.file_of(members[0].row)[1]
        table = pq.ParquetFile(path).read(columns=want)
        picked = table.take([r.row - first for r in members]).to_pylist()
        for r, v in zip(members, picked, strict=True):
            got = {key: v.get(c) for key, c in names.items() if c is not None}
            toks = got.get("toks")
            if toks is not None and mask is not None and v.get(mask) is not None:
                toks = [t for t, m in zip(toks, v[mask], strict=False) if m]
            ok = toks is not None and len(toks) == r.length
            got["toks"] = [str(t) for t in toks] if ok and toks is not None else None
            out[r.row] = got
    return out


def _parquet_files(src: Source) -> bool:
    """Whether every file of the input is a parquet file on this machine."""
    return all(isinstance(p, Path) and p.suffix.lower() in (".parquet", ".pq") for p in src.paths)


def _kept_rows(src: Source, answers: int) -> list[int] | None:
    """A recorded step's answers with a valid token, by their row in its files (the
    batches leave out the answers a trainer masked whole and count the kept ones:
    :func:`grpo_cli.engine.plan.batches`); None when none is left out (``answers``, the
    batches' count, is the files' rows)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if src.recorded is None or not _parquet_files(src):
        return None
    if sum(pq.ParquetFile(p).metadata.num_rows for p in src.paths) == answers:
        return None
    col = src.name("mask") if src.has("mask") else src.name("logp")
    out: list[int] = []
    start = 0
    for p in src.paths:
        c = pq.ParquetFile(p).read(columns=[col]).column(col).combine_chunks()
        if col == src.name("mask"):
            flat = c.flatten().cast("int64").to_numpy(zero_copy_only=False)
            off = c.offsets.to_numpy()
            n = np.add.reduceat(flat, off[:-1]) if flat.size else np.zeros(len(c))
            n = np.where(np.diff(off) > 0, n, 0)
        else:
            n = pc.list_value_length(c).fill_null(0).to_numpy(zero_copy_only=False)
        out += (np.flatnonzero(n > 0) + start).tolist()
        start += len(c)
    return None if len(out) == start else out


def _add_masked_whole(src: Source, kept: set[int], groups: list[dict[str, Any]]) -> None:
    """The answers of the shown groups a trainer masked whole (no valid token: out of the
    batches and the loss), added to their group's view, marked."""
    import pyarrow.parquet as pq

    want = {g["key"]: g for g in groups}
    names = [src.name(f) for f in ("group", "reward", "advantage") if src.has(f)]
    if src.name("group") not in names:
        return
    start = 0
    for p in src.paths:
        t = pq.ParquetFile(p).read(columns=names).to_pylist()
        for i, r in enumerate(t):
            g = want.get(str(r[src.name("group")]))
            if start + i in kept or g is None:
                continue
            adv = r.get(src.name("advantage"))
            g["answers"].append({
                "row": start + i, "reward": _r(r.get(src.name("reward"))),
                "adv": _r(adv) if isinstance(adv, int | float) else None, "length": 0,
                "finished": None, "share": 0.0, "carries": False, "masked_whole": True,
                "why": "masked whole: no valid token, out of the loss (e.g. a truncated "
                "completion under TRL's mask_truncated_completions)",
                "lr_max": None, "kl_max": None, "gap_mean": None, "shown": 0, "text": None,
                "toks": None, "layers": None,
            })  # fmt: skip
        start += len(t)
    for g in groups:
        g["answers"].sort(key=lambda a: a["row"])
        g["size"] = len(g["answers"])


def _prompt_keys(src: Source) -> list[Any] | None:
    """Each answer's prompt (its id column, else its text), read from the step's parquet
    files; None when they carry neither."""
    import pyarrow.parquet as pq

    col = next((c for c in (*ID_COLUMNS, *PROMPT_COLUMNS) if c in src.present), None)
    if col is None or not _parquet_files(src):
        return None
    out: list[Any] = []
    for p in src.paths:
        out += pq.ParquetFile(p).read(columns=[col]).column(col).to_pylist()
    return out


def _why(a: _Answer, share: float | None, zero: bool, bits: I64 | None) -> tuple[bool, str]:
    """Whether an answer carries gradient, and why (not)."""
    if a.adv == 0:
        return False, ("A = 0: its group's rewards are all equal (zero variance)" if zero
                       else "A = 0")  # fmt: skip
    if share is None:
        return True, "A ≠ 0 (no closed-form gradient: share unknown)"
    if share > 0:
        return True, f"A = {a.adv:.3g}: {share:.2%} of the step's gradient (‖∂J/∂logp‖²)"
    if bits is not None and bits.size:
        stop = bits != 0
        if stop.all():
            names = sorted({n for n, bit in _BIT.items() if np.any(bits & bit)})
            return False, "every token is out of the gradient: " + ", ".join(names)
    return False, "its tokens' gradient is 0"


def _answer_doc(a: _Answer, norm2: float, zero: bool, limit: int | None, text: dict[str, Any],
                cap: int) -> dict[str, Any]:  # fmt: skip
    """One answer as the page carries it: its summary and its first ``cap`` tokens."""
    ok = norm2 > 0 and math.isfinite(norm2)
    share = a.g2 / norm2 if ok and a.g2 is not None else None
    t = a.tokens or {}
    bits = t.get("state")
    if limit is not None and a.length >= limit and bits is not None:
        bits = bits | _BIT["truncated"]
    carries, why = _why(a, share, zero, None if bits is None else bits & ~_BIT["truncated"])
    layers: dict[str, Any] = {}
    if t:
        n = min(a.length, cap)
        for k in ("lr", "gap", "kl", "ent", "adv"):
            v = t.get(k)
            layers[k] = None if v is None else _rl(v[:n])
        if t.get("adv") is not None and np.all(t["adv"] == a.adv):
            layers["adv"] = None  # the answer's own advantage on every token
        d = t.get("d")
        layers["share"] = None if d is None or not ok else _rl((d[:n] ** 2) / norm2, 3)
        layers["state"] = None if bits is None else bits[:n].tolist()
    toks = text.get("toks")
    return {
        "row": a.row, "reward": _r(a.reward), "adv": _r(a.adv), "length": a.length,
        "finished": None if limit is None else a.length < limit, "share": _r(share),
        "carries": carries, "why": why, "lr_max": _r(a.lr_max), "kl_max": _r(a.kl_max),
        "gap_mean": _r(a.gap_mean), "shown": min(a.length, cap) if t else 0,
        "text": (text.get("text") or "")[:2000] or None,
        "toks": None if toks is None else toks[: min(a.length, cap)], "layers": layers or None,
    }  # fmt: skip


def _chosen(acc: _Step, budget: int) -> list[str]:
    """The groups the page shows: the worst held first, the zero-variance one too, while
    their tokens fit ``budget`` (the worst always)."""
    order = sorted((k for k in acc.held if k != acc.zero_key), key=lambda k: -acc.held[k])
    if acc.zero_key is not None and acc.zero_key in acc.with_tokens:
        order.insert(min(1, len(order)), acc.zero_key)
    out: list[str] = []
    used = 0
    for k in order[:MAX_GROUPS]:
        n = sum(min(a.length, ANSWER_TOKENS) for a in acc.with_tokens.get(k, []))
        if out and used + n > budget:
            continue
        out.append(k)
        used += n
    return out


def _group_doc(acc: _Step, key: str, p1: Any, cap: int, limit: int | None,
               texts: dict[int, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """One group: its answers side by side with its mean and std (pass 1's group table,
    else the rewards shown, population std)."""
    members = sorted(acc.with_tokens.get(key, []), key=lambda a: a.row)
    rewards = [a.reward for a in members if a.reward is not None]
    mean = std = None
    where = ""
    code = members[0].code if members else -1
    zero = len(rewards) > 1 and min(rewards) == max(rewards)
    if p1.table is not None and code >= 0:  # every answer of the group, masked ones too
        st = p1.table.stats
        mean, std, where = float(st.mean[code]), float(st.std[code]), "pass 1's group table"
        zero = bool(st.min[code] == st.max[code] and st.count[code] > 1)
    elif rewards:
        mean, std = float(np.mean(rewards)), float(np.std(rewards))
        where = "the rewards shown, population std"
    first = next((texts.get(a.row) for a in members if texts.get(a.row)), {}) or {}
    return {
        "key": key, "score": _r(acc.held.get(key)), "mean": _r(mean), "std": _r(std),
        "stats": where, "zero_variance": zero, "size": len(members),
        "prompt": (first.get("prompt") or None) if isinstance(first.get("prompt"), str)
        else None,
        "answers": [_answer_doc(a, acc.norm2, zero, limit, texts.get(a.row, {}), cap)
                    for a in members],
    }  # fmt: skip


def step_page(
    spec: str, settings: Settings, engine: EngineOptions, *, budget: int = TOKEN_BUDGET,
    step: int | None = None, limit: int | None = None,
) -> tuple[dict[str, Any], dict[Any, dict[str, Any]], list[str]]:  # fmt: skip
    """One step's part of the page: its groups (:func:`_chosen`) with their answers and
    tokens; each prompt's rewards, advantages and mean sampler gap at this step (for
    :func:`run_page` to follow prompts); the notes."""
    src = open_source([spec])
    acc, p1 = _fold_step(src, settings, engine, keep=MAX_GROUPS * 2)
    kept = _kept_rows(src, len(acc.answers))
    if kept is not None:  # rows as the files number them
        for a in acc.answers:
            a.row = kept[a.row]
    keys = _chosen(acc, budget)
    members = [a for k in keys for a in acc.with_tokens.get(k, [])]
    texts = _texts(src, members)
    cap = ANSWER_TOKENS
    total = sum(min(a.length, ANSWER_TOKENS) for a in members)
    if total > budget:  # the worst group alone is over the budget: fewer tokens an answer
        cap = max(16, budget // max(len(members), 1))
    groups = [_group_doc(acc, k, p1, cap, limit, texts) for k in keys]
    if kept is not None:
        _add_masked_whole(src, set(kept), groups)
    notes = list(p1.warnings)
    if settings.loss_row.whole_batch or (settings.correction_row is not None and
                                         settings.correction_row.batch_normalized(
                                             settings.correction_params)):  # fmt: skip
        notes.append("the page's token states are computed over the shown groups' answers; "
                     "the loss or correction normalises over the whole batch")  # fmt: skip
    prompts: dict[Any, dict[str, Any]] = {}
    pk = _prompt_keys(src)
    if pk is not None:
        for a in acc.answers:
            if a.row < len(pk) and pk[a.row] is not None:
                d = prompts.setdefault(pk[a.row], {"rewards": [], "advs": [], "gaps": []})
                d["rewards"].append(_r(a.reward))
                d["advs"].append(_r(a.adv))
                if a.gap_mean is not None:
                    d["gaps"].append(a.gap_mean)
        for g in groups:
            for x in g["answers"]:
                k = pk[x["row"]] if x["row"] < len(pk) else None
                x["prompt_key"] = None if k is None else str(k)
    doc = {
        "step": step, "name": Path(spec).name, "answers": len(acc.answers),
        "tokens": int(sum(a.length for a in acc.answers)), "groups": groups,
        "zero_variance_groups": None if p1.table is None else int(np.sum(
            (p1.table.stats.min == p1.table.stats.max) & (p1.table.stats.count > 1))),
        "groups_total": None if p1.table is None else int(p1.table.stats.count.shape[0]),
    }  # fmt: skip
    return doc, prompts, notes


def _no_step(num: int | None, spec: str, why: str) -> dict[str, Any]:
    """A step the page cannot read, and why."""
    return {"step": num, "name": Path(spec).name, "answers": 0, "tokens": 0, "groups": [],
            "zero_variance_groups": None, "groups_total": None, "error": why}  # fmt: skip


# ------------------------------------------------------------------ the page
# the trend panels: the step row's metric, its title, the check rule whose threshold it
# shows, the trend rule judged on it
PANELS = (
    ("objective", "J", None, None),
    ("clip_fraction_region", "clip region", "clip-region", "clip-growth"),
    ("ratio_p99", "ratio ρ p99", None, None),
    ("kl_mean", "KL mean", "kl-mean", "kl-growth"),
    ("entropy_mean", "entropy mean", None, "entropy-drop"),
    ("frac_zero_variance_groups", "zero-variance groups", "zero-std-groups",
     "zero-variance-growth"),
    ("reward_mean", "reward mean", None, None),
    ("length_mean", "length mean", None, None),
    ("rollout_kl_k3", "sampler KL (k3)", "rollout-mismatch", None),
)  # fmt: skip


def _settings_doc(s: Settings) -> dict[str, Any]:
    """The conventions the page's counterfactuals start from."""
    p = s.correction_params
    # the IS cap a slider starts from: verl's TIS bound, TRL's C_max of a truncating mode
    cap = None if p is None else getattr(p, "rollout_is_threshold", None)
    if p is not None and str(getattr(p, "vllm_is_mode", "")).endswith("truncate"):
        cap = getattr(p, "vllm_is_clip_max", None)
    rs = None if p is None else getattr(p, "rollout_rs_threshold", None)
    return {
        "loss": s.loss, "agg": s.agg, "clip_eps": s.clip_eps, "eps_high": s.eps_high,
        "dual_clip": s.dual_clip, "beta": s.beta, "kl_estimator": s.kl_estimator,
        "correction": s.correction, "rejects": rejects(s),
        "is_cap": cap if isinstance(cap, int | float) else None,
        "rs_threshold": rs if isinstance(rs, int | float) else None,
        "core_loss": s.loss_row.terms is None,
    }  # fmt: skip


def trend_doc(check: CheckReport) -> dict[str, Any] | None:
    """The run's trend panels: each step's row, each panel's check thresholds (the
    rule's as the check ran it) and the first step each rule warns and fails at."""
    run = check.run
    if run is None:
        return None
    by_rule = {r.rule: r for r in check.results}
    panels = []
    for key, title, rule, trend_rule in PANELS:
        th = by_rule[rule].threshold if rule in by_rule else None
        marks = {}
        for rid in (rule, trend_rule):
            if rid is not None and rid in run.first_bad:
                marks[rid] = run.first_bad[rid]
        panels.append({"key": key, "title": title, "rule": rule, "trend_rule": trend_rule,
                       "warn": None if th is None else th.get("warn"),
                       "fail": None if th is None else th.get("fail"), "first": marks})  # fmt: skip
    rows = [{k: (_r(v, 6) if isinstance(v, float) else v) for k, v in row.items()}
            for row in run.rows]  # fmt: skip
    return {
        "rows": rows, "panels": panels, "passed": check.passed,
        "first_failing_step": run.first_failing_step,
        "steps": [{"step": v.step, "name": v.name, "passed": v.passed, "failing": v.failing,
                   "bad": v.bad} for v in run.steps],
        "rules": [{"rule": r.rule, "status": r.status, "message": r.message,
                   "first": run.first_bad.get(r.rule)} for r in check.results],
    }  # fmt: skip


def _followed(steps: list[dict[str, Any]], prompts: list[dict[Any, dict[str, Any]]]
              ) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """The prompts of the shown groups, each step's rewards, advantages and mean sampler
    gap for them (at most :data:`PROMPTS_FOLLOWED`)."""
    keys: list[str] = []
    for st in steps:
        for g in st["groups"]:
            for a in g["answers"]:
                k = a.get("prompt_key")
                if k is not None and k not in keys:
                    keys.append(k)
    out: dict[str, list[dict[str, Any]]] = {}
    for k in keys[:PROMPTS_FOLLOWED]:
        hist = []
        for st, pm in zip(steps, prompts, strict=True):
            d = next((v for pk, v in pm.items() if str(pk) == k), None)
            if d is not None:
                gap = _r(float(np.mean(d["gaps"]))) if d["gaps"] else None
                hist.append({"step": st["step"], "rewards": d["rewards"], "advs": d["advs"],
                             "gap": gap})  # fmt: skip
        if len(hist) > 1:
            out[k] = hist
    return out


def run_page(
    specs: Sequence[tuple[int | None, str]],
    settings: Settings,
    *,
    engine: EngineOptions | None = None,
    check: CheckReport | None = None,
    title: str = "",
    config: dict[str, Any] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    budget: int = TOKEN_BUDGET,
) -> dict[str, Any]:
    """The page of a run (or of one step): ``specs`` its steps (step number, input), the
    trend of ``check`` (``check RUN``'s report), every step's groups and tokens within
    ``budget`` tokens over the page (at least :data:`STEP_FLOOR` a step), the prompts
    followed across steps, the settings the counterfactuals start from, the notes."""
    from .._version import __version__

    engine = (engine or EngineOptions()).resolved()
    per_step = max(STEP_FLOOR, budget // max(len(specs), 1))
    limit = _limit(settings, config or {})
    steps, prompts, said = [], [], []
    for k, (num, spec) in enumerate(specs):
        try:
            doc, pm, notes = step_page(spec, settings, engine, budget=per_step, step=num,
                                       limit=limit)  # fmt: skip
        except InputError as exc:  # the step's verdict says more (check RUN): the page goes on
            doc, pm = _no_step(num, spec, str(exc)), {}
            notes = [f"{Path(spec).name}: no groups shown: {exc}"]
        steps.append(doc)
        prompts.append(pm)
        said += [n for n in notes if n not in said]
        if on_step is not None:
            on_step(k + 1, len(specs))
    if limit is None:
        said.append("the length limit is not known (no max_completion_length in the run's "
                    "config, no --max-len): finished or truncated is null")  # fmt: skip
    return {
        "title": title, "version": __version__, "settings": _settings_doc(settings),
        "states": [{"name": n, "bit": _BIT[n], "words": w} for n, w in STATES],
        "budget": {"tokens": budget, "per_step": per_step, "answer": ANSWER_TOKENS},
        "trend": None if check is None else trend_doc(check), "steps": steps,
        "prompts": _followed(steps, prompts), "notes": said,
    }  # fmt: skip
