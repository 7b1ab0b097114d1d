"""A recorded step's loss calls, each folded on its own and combined the way the trainer
logs them (TRL: the mean over ``_compute_loss`` calls of each call's metrics, the loss
summed over the calls).

A step of TRL with gradient accumulation is several loss calls (micro-batches), each
written as one file per rank (:mod:`grpo_cli.integrations.trl`). What TRL logs for the
step is not what the step's tokens give as one batch: a token mean of each call, then a
mean over calls, is not the token mean of the whole step. :func:`fold_calls` folds every
file into its own partial (the whole step's partial is their merge: the step's other
numbers are unchanged), and the trainer's :class:`~grpo_cli.trainers.base.CallRules` turn
each call's partial (merged over ranks) and each file's into what the trainer logs.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq

from ..batch import Batch, RawBatch, drop_empty, validate
from ..engine.options import DEFAULT_BATCH_TOKENS, EngineOptions, Ran
from ..engine.plan import plan
from ..engine.run import run
from ..io import Source
from ..records import Calls
from ..settings import Settings
from ..trainers import trainer_of
from ..trainers.base import CallInputs, FileInputs
from ..trainers.config import check_config
from .loss import LossMetrics, correction_of
from .tokens import TokenPartial

if TYPE_CHECKING:
    from .pass1 import Pass1

__all__ = [
    "Calls",
    "Counted",
    "Folded",
    "fold_calls",
    "generation_rows",
    "logged_calls",
    "logging_window",
    "step_info",
]

Progress = Callable[[int], None]


@dataclass
class Counted:
    """A token partial and the answers left out of it for having no valid token."""

    tokens: TokenPartial
    empty: int = 0

    def merge(self, o: Counted) -> Counted:
        self.tokens.merge(o.tokens)
        self.empty += o.empty
        return self

    @staticmethod
    def folding(
        fold_tokens: Callable[[TokenPartial, Batch], None],
    ) -> Callable[[Counted, RawBatch], None]:
        """The engine's fold of a recorded step's raw batches: the answers the trainer
        masked whole (no valid token) left out and counted, the rest validated and folded
        by ``fold_tokens``."""

        def fold(part: Counted, raw: RawBatch) -> None:
            kept, empty = drop_empty(raw)
            part.empty += empty
            if kept.n:
                fold_tokens(part.tokens, validate(kept))

        return fold


def step_info(path: Any) -> dict[str, Any]:
    """A recorded file's ``grpo_cli`` metadata (its step, rank, call, normalisers),
    checked (:func:`grpo_cli.io.run.file_info`)."""
    from ..io.run import file_info

    return file_info(path)


@dataclass
class Folded:
    """What the trainer logs of each loss call of some recorded steps, as soon as the call
    is folded (no call's partial is kept): the calls' metrics, each call's losses by rank,
    and the generation batches the steps hold iteration 0 of, with the step each was
    logged at; with a sampler–trainer correction, each such iteration-0 file's correction
    metrics by path (what the generation's metrics take, without reading it again)."""

    calls: list[dict[str, float | None]] = field(default_factory=list)
    losses: list[list[float | None]] = field(default_factory=list)
    # the same metrics as the mean of each rank's own (per-process, then averaged: what
    # grpo_cli.causes tries when a logged metric differs), for calls of several ranks
    rank_means: list[dict[str, float | None]] = field(default_factory=list)
    windows: list[int] = field(default_factory=list)  # each folded step's calls
    generations: dict[int, int] = field(default_factory=dict)
    corrections: dict[str, LossMetrics] = field(default_factory=dict)


def fold_calls(
    src: Source,
    settings: Settings,
    p1: Pass1,
    new: Callable[[], TokenPartial],
    *,
    fields: Sequence[str],
    engine: EngineOptions,
    config: dict[str, Any],
    out: Folded,
    whole: TokenPartial | None = None,
    progress: Progress | None = None,
) -> tuple[int, Ran]:
    """Fold each file of a recorded step on its own (answers without a valid token left
    out and counted, as the trainer's loss counts them); each call's metrics and its files'
    losses go to ``out`` at once (the trainer's :class:`CallRules`), and the files' partials
    are merged into ``whole`` (the step's tokens as one batch) when given. Returns the
    answers left out and what the engine did."""
    assert src.recorded is not None
    t = trainer_of(settings.trainer)
    assert t is not None and t.calls is not None
    rules = t.calls
    keys = getattr(t.from_config, "keys", None)
    if keys is not None:  # the call rules read the config too (settings from --preset)
        check_config(keys, config)
    fold = Counted.folding(p1.fold(src.label))

    empty_total = 0
    ran = Ran()
    before = len(out.calls)
    for index in src.recorded.calls().values():
        merged: Counted | None = None
        losses: list[float | None] = []
        per_rank: dict[str, list[float]] = {}
        own: list[dict[str, float | None]] = []  # each rank's call metrics on its own
        for i in index:
            part, r = run(
                plan(src.subset([i]), fields, engine), lambda: Counted(new()), fold,
                validated=False, progress=progress,
            )  # fmt: skip
            ran = ran.then(r)
            info = step_info(src.paths[i])
            inputs = FileInputs.of(part.tokens, part.empty, info)
            losses.append(rules.file_loss(settings, inputs, config))
            for name, v in rules.file_metrics(settings, inputs, config).items():
                per_rank.setdefault(name, []).append(v)
            if "generation" in info and info.get("iteration", 0) == 0:
                out.generations[int(info["generation"])] = int(info.get("generated_at_step", -1))
                if settings.correction != "none":  # a copy: the merge below adds to it
                    out.corrections[str(src.paths[i])] = copy.deepcopy(part.tokens.loss_metrics)
            if len(index) > 1:  # before the merge adds the next rank to it
                own.append(
                    rules.call_metrics(settings, CallInputs(part.tokens, part.empty), config)
                )
            merged = part if merged is None else merged.merge(part)
        assert merged is not None
        metrics = rules.call_metrics(settings, CallInputs(merged.tokens, merged.empty), config)
        ranks: dict[str, float | None] = {k: sum(v) / len(v) for k, v in per_rank.items()}
        metrics.update(ranks)  # (the per-file metrics: the ranks' mean)
        out.calls.append(metrics)
        if own:
            out.rank_means.append(_mean_of(own) | ranks)
        out.losses.append(losses)
        empty_total += merged.empty
        if whole is not None:
            whole.merge(merged.tokens)
    out.windows.append(len(out.calls) - before)
    return empty_total, ran


def _mean_of(rows: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each key's mean over the rows that have a finite value of it (None: none has)."""
    out: dict[str, float | None] = {}
    for k in dict.fromkeys(k for r in rows for k in r):
        v = [x for r in rows if (x := r.get(k)) is not None and math.isfinite(x)]
        out[k] = sum(v) / len(v) if v else None
    return out


def generation_rows(
    src: Source,
    generations: set[int],
    settings: Settings | None = None,
    known: dict[str, LossMetrics] | None = None,
    notes: list[str] | None = None,
) -> dict[int, dict[str, Any]]:
    """Each generation batch's rewards and group ids (from the files of its first pass,
    iteration 0, over every step of the run that holds one of its chunks), for the
    metrics a trainer logs once per generation; with a sampler–trainer correction in
    ``settings``, ``corrections``: each rank's correction metrics over its share of the
    generation (:func:`grpo_cli.fold.loss.correction_of` of every file, merged by rank;
    a file's metrics in ``known``, by path, are taken as they are). A file of another
    step that cannot be read (cut after its step's ``_DONE``) is left out, said in
    ``notes``: its generation cannot be told."""
    from ..errors import InputError
    from ..io import open_source

    assert src.recorded is not None
    out: dict[int, dict[str, Any]] = {}
    by_rank: dict[int, dict[int, LossMetrics]] = {}
    for st in src.recorded.run.steps():
        if not st.done:
            continue
        for p in st.files:
            try:
                info = step_info(p)
            except InputError as exc:
                if notes is not None:
                    notes.append(f"left out of the generation metrics: {exc}")
                continue
            g = info.get("generation")
            if g not in generations or info.get("iteration", 0) != 0:
                continue
            one = open_source([p])
            if settings is not None and settings.correction != "none":
                ranks = by_rank.setdefault(g, {})
                rank = int(info.get("rank", 0))
                got = known.get(str(p)) if known else None
                mine = _file_correction(one, settings) if got is None else copy.deepcopy(got)
                ranks[rank] = mine if rank not in ranks else ranks[rank].merge(mine)
            cols = [one.name(f) for f in ("group", "reward") if one.has(f)]
            if len(cols) < 2:
                continue
            t = pq.read_table(p, columns=cols)
            rows = out.setdefault(g, {"group": [], "reward": []})
            rows["group"] += t.column(cols[0]).to_pylist()
            rows["reward"].append(np.asarray(t.column(cols[1]).to_pylist(), dtype=np.float64))
    for rows in out.values():
        rows["reward"] = np.concatenate(rows["reward"]) if rows["reward"] else np.zeros(0)
    for g, ranks in by_rank.items():
        rows = out.setdefault(g, {"group": [], "reward": np.zeros(0)})
        rows["corrections"] = [ranks[r].values() for r in sorted(ranks)]
    return out


def _file_correction(one: Source, settings: Settings) -> LossMetrics:
    """A file's correction metrics (answers without a valid token left out, as the
    trainer masks them)."""
    acc = LossMetrics.of(settings)
    fields = one.token_fields()
    for raw in one.raw_batches(None, fields, DEFAULT_BATCH_TOKENS):
        kept, _ = drop_empty(raw)
        if kept.n:
            b = validate(kept)
            acc.add(None, correction_of(settings, b.fields, b.offsets), b.offsets)
    return acc


def logging_window(src: Source, config: dict[str, Any]) -> list[int]:
    """The optimizer steps the trainer's record at this step covers: ``logging_steps`` of
    them ending here when this step is logged, else this one alone."""
    from ..errors import InputError

    assert src.recorded is not None
    every = config.get("logging_steps")
    n = src.recorded.step
    if not isinstance(every, int) or every <= 1 or n % every or n < every:
        return [n]
    run = src.recorded.run
    have = {st.step: st for st in run.steps() if n - every < st.step < n}
    if len(have) < every - 1:  # counted before any list of the window is made
        missing = next(k for k in range(n - every + 1, n) if k not in have)
        raise InputError(
            f"{run.root / 'meta.json'}: logging_steps {every}: the trainer's record at step "
            f"{n} covers steps {n - every + 1}-{n}, and step {missing} of them is not "
            f"recorded ({len(have) + 1} of {every} are): record every step (every_steps=1) "
            "to compare the logged record"
        )
    for st in have.values():
        st.require_readable()
    return list(range(n - every + 1, n + 1))


def logged_calls(src: Source, settings: Settings, folded: Folded, steps: list[int]) -> Calls:
    """The record the trainer logs at the step, from the calls of the window's steps."""
    assert src.recorded is not None
    t = trainer_of(settings.trainer)
    assert t is not None and t.calls is not None
    rules = t.calls
    generated = {g for g, at in folded.generations.items() if at in steps}
    unread: list[str] = []
    rows = generation_rows(src, generated, settings, folded.corrections, unread)
    gen_metrics = [rules.generation_metrics(settings, r) for r in rows.values()]
    metrics = rules.combine(folded.calls, folded.losses, len(steps), gen_metrics)
    clean = {k: v for k, v in metrics.items() if v is not None and not math.isnan(v)}
    alts = _alternatives(rules, folded, len(steps), clean)
    notes = unread[:3] if generated else []
    if len(steps) > 1:
        notes.append(
            f"the trainer logs every {len(steps)} steps: its record at step {steps[-1]} "
            f"covers steps {steps[0]}-{steps[-1]}, recomputed from their calls"
        )
    return Calls(clean, len(folded.calls), sum(len(x) for x in folded.losses), notes, alts)


def _alternatives(
    rules: Any, folded: Folded, steps: int, metrics: dict[str, float]
) -> dict[str, dict[str, float]]:
    """The loss-call metrics combined the other ways a trainer has combined them (for
    :mod:`grpo_cli.causes`; the loss itself is transformers', not one of them): the mean
    of each rank's own value (``rank-mean``: TRL before PR #6380), for calls of several
    ranks; one value per optimizer window, then their mean (``window-mean``: TRL PR #7053
    for #7047), for a logging window of steps with unequal numbers of calls."""
    keys = {k for c in folded.calls for k in c} - {"loss"}
    out: dict[str, dict[str, float]] = {}
    if len(folded.rank_means) == len(folded.calls) and folded.calls:
        got = rules.combine(folded.rank_means, folded.losses, steps, [])
        out["rank-mean"] = _finite({k: got.get(k) for k in keys})
    if len(set(folded.windows)) > 1:
        windows, at = [], 0
        for n in folded.windows:
            windows.append(_mean_of(folded.calls[at : at + n]))
            at += n
        out["window-mean"] = _finite({k: _mean_of(windows).get(k) for k in keys})
    return {
        name: {k: v for k, v in alt.items() if k in metrics and v != metrics[k]}
        for name, alt in out.items()
    }


def _finite(d: dict[str, float | None]) -> dict[str, float]:
    return {k: v for k, v in d.items() if v is not None and math.isfinite(v)}
