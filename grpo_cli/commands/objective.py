"""The objective's, the KL's and the advantages' commands: pass 1, the fold of the token
batches on the plan, and the record (:mod:`grpo_cli.finalize.objective`).

The seam: :func:`grpo_cli.fold.pass1.objective_pass1`, :func:`fold_batch` (one batch to
one partial, pure), ``TokenPartial.merge``, :func:`grpo_cli.finalize.objective_record`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..batch import Batch
from ..core import difference
from ..engine.options import EngineOptions, Ran
from ..engine.plan import plan
from ..engine.run import Pipeline, columns_reader, ran_by, run
from ..finalize.objective import kl_record, objective_record
from ..fold.calls import Counted, Folded, fold_calls, logged_calls, logging_window
from ..fold.pass1 import F64, Pass1, _advantages, objective_pass1
from ..fold.summaries import group_summary_of, singleton_warning, values_distribution
from ..fold.tokens import TokenPartial
from ..io import TOKEN_IDS, TOKEN_VALUES, Source, load_answers
from ..logged import LoggedInput
from ..records import AdvantagesReport, Calls, KLReport, ObjectiveReport
from ..settings import Settings
from ..trainers import trainer_of

Progress = Callable[[int], None]


TOKEN_FIELDS = TOKEN_VALUES
# explain's fields: the token ids too (by token id, :mod:`grpo_cli.fold.where`)
WHERE_FIELDS = (*TOKEN_VALUES, *TOKEN_IDS)


def advantages_report(
    src: Source, settings: Settings, *, engine: EngineOptions | None = None
) -> AdvantagesReport:
    """Group-relative advantages of every answer of ``src`` (rewards and groups only)."""
    read = columns_reader(engine)
    answers = load_answers(src, need_rewards=True, read=read)
    adv, stats = _advantages(answers, settings, src.label)
    assert answers.codes is not None and answers.labels is not None and answers.reward is not None
    diff = None
    notes = [*src.notes, *answers.notes, *singleton_warning(group_summary_of(stats))]
    if answers.advantage is not None:
        gap = np.abs(difference(answers.advantage, adv))
        diff = float(np.max(gap)) if adv.size else 0.0
        if not math.isfinite(diff):
            notes.append(
                "the logged advantages differ from the recomputed ones by more than float64 "
                "holds: logged_advantages_max_abs_diff is null"
            )
    return AdvantagesReport(
        source=src.label,
        settings=settings,
        summary=group_summary_of(stats),
        labels=answers.labels,
        codes=answers.codes,
        stats=stats,
        advantages=adv,
        shape=answers.shape,
        reward=values_distribution(answers.reward),
        advantage=values_distribution(adv),
        logged_max_abs_diff=diff,
        engine=(engine or EngineOptions()).resolved(),
        ran=ran_by(read),
        warnings=notes,
    )


# ----------------------------------------------------------------------- KL command
def kl_report(
    src: Source,
    settings: Settings,
    *,
    engine: EngineOptions | None = None,
    progress: Progress | None = None,
    exact_cap: int | None = None,
) -> KLReport:
    """Per-token KL estimate statistics of ``src`` (needs ``logp`` and ``ref_logp``)."""
    engine = (engine or EngineOptions()).resolved()
    for f in ("logp", "ref_logp"):
        if not src.has(f):
            raise src.missing(f, " (the KL needs logp and ref_logp)")
    acc, ran = run(
        plan(src, ["logp", "ref_logp"], engine),
        lambda: TokenPartial(settings, backend=engine.backend, exact_cap=exact_cap),
        TokenPartial.update_kl,
        progress=progress,
    )
    return kl_record(src, settings, acc, engine=engine, ran=ran)


def fold_batch(
    batch: Batch,
    advantages: F64 | Pass1,
    settings: Settings,
    *,
    backend: str = "numpy",
    exact_cap: int | None = None,
    label: str = "batch",
) -> TokenPartial:
    """The per-batch step, the library's extension point: one batch of answers to one
    mergeable partial of the objective's statistics. Pure given its inputs: no files,
    threads or environment. ``advantages`` is ``(batch.n,)``, or pass 1 (:class:`Pass1`),
    from which the batch computes its own from the group ids and rewards it carries.

    ``fold_batch(a).merge(fold_batch(b))`` equals folding ``a`` and ``b`` together (to
    the order of float additions), wherever and in whatever order they are folded;
    :func:`objective_record` turns the merged partial into the report.
    """
    p = TokenPartial(settings, backend=backend, exact_cap=exact_cap)
    adv = advantages.advantages(batch, label) if isinstance(advantages, Pass1) else advantages
    p.update(batch, adv)
    return p


def objective_report(
    src: Source,
    settings: Settings,
    *,
    engine: EngineOptions | None = None,
    progress: Progress | None = None,
    exact_cap: int | None = None,
    recompute_advantages: bool = False,
    gradient: bool = False,
    logged: LoggedInput | None = None,
    where: bool = False,
) -> ObjectiveReport:
    """The GRPO objective of ``src`` and its diagnostics, streamed batch by batch:
    :func:`objective_pass1`, one fold of :class:`TokenPartial` s over the token batches,
    :func:`objective_record`; ``where``: the entropy, KL and mismatch by position along the
    answer too (:mod:`grpo_cli.fold.where`, for explain)."""
    engine = (engine or EngineOptions()).resolved()
    fields = WHERE_FIELDS if where else TOKEN_FIELDS

    def new() -> TokenPartial:
        return TokenPartial(
            settings, backend=engine.backend, exact_cap=exact_cap, gradient=gradient,
            where=where,
        )  # fmt: skip

    if logs_per_call(src, settings):
        return _recorded_calls(
            src, settings, new, engine=engine, progress=progress, logged=logged,
            recompute_advantages=recompute_advantages, fields=fields,
        )  # fmt: skip
    if src.recorded is not None:  # answers the trainer masked whole: left out, counted
        p1 = objective_pass1(
            src, settings, recompute_advantages=recompute_advantages, engine=engine
        )
        counted, ran = run(
            plan(src, fields, engine), lambda: Counted(new()),
            Counted.folding(p1.fold(src.label)), validated=False,
            progress=progress,
        )  # fmt: skip
        return objective_record(
            src, settings, counted.tokens, p1, engine=engine, ran=p1.ran.then(ran),
            logged=logged, empty=counted.empty,
        )  # fmt: skip
    # row-group streams start decoding now, while pass 1 reads the answer columns
    with Pipeline(plan(src, fields, engine)) as pipe:
        p1 = objective_pass1(
            src, settings, recompute_advantages=recompute_advantages, engine=engine
        )
        acc, ran = pipe.run(new, p1.fold(src.label), progress)
    return objective_record(
        src, settings, acc, p1, engine=engine, ran=p1.ran.then(ran), logged=logged
    )


def recorded_calls(
    src: Source,
    settings: Settings,
    p1: Pass1,
    new: Callable[[], TokenPartial],
    *,
    engine: EngineOptions,
    whole: TokenPartial | None = None,
    progress: Progress | None = None,
    fields: Sequence[str] = TOKEN_FIELDS,
) -> tuple[Calls, int, Ran]:
    """A recorded step of a trainer that logs per loss call (TRL): each call of the
    logging window's steps folded on its own and combined as the trainer logs the step;
    this step's files merged into ``whole`` when given. Returns the logged record, this
    step's answers without a valid token, and what the engine did."""
    from ..io import open_source

    assert src.recorded is not None
    config = src.recorded.run.config
    folded = Folded()
    steps = logging_window(src, config)
    for step in steps[:-1]:  # the window's earlier steps: their calls only
        other = open_source([str(src.recorded.run.root / f"step_{step:06d}")])
        p1o = objective_pass1(other, settings, engine=engine)
        fold_calls(
            other, settings, p1o, new, fields=fields, engine=engine, config=config,
            out=folded,
        )  # fmt: skip
    empty, ran = fold_calls(
        src, settings, p1, new, fields=fields, engine=engine, config=config,
        out=folded, whole=whole, progress=progress,
    )  # fmt: skip
    return logged_calls(src, settings, folded, steps), empty, ran


def logs_per_call(src: Source, settings: Settings) -> bool:
    """Whether the input is a recorded step of a trainer that logs per loss call."""
    t = trainer_of(settings.trainer)
    return src.recorded is not None and t is not None and t.calls is not None


def _recorded_calls(
    src: Source,
    settings: Settings,
    new: Callable[[], TokenPartial],
    *,
    engine: EngineOptions,
    progress: Progress | None,
    logged: LoggedInput | None,
    recompute_advantages: bool,
    fields: Sequence[str] = TOKEN_FIELDS,
) -> ObjectiveReport:
    """The objective of a recorded step logged per loss call: the trainer's metrics from
    the calls, every other number from the step's tokens as one batch."""
    p1 = objective_pass1(src, settings, recompute_advantages=recompute_advantages, engine=engine)
    whole = new()
    calls, empty, ran = recorded_calls(
        src, settings, p1, new, engine=engine, whole=whole, progress=progress, fields=fields
    )
    return objective_record(
        src, settings, whole, p1, engine=engine, ran=p1.ran.then(ran), logged=logged,
        calls=calls, empty=empty,
    )  # fmt: skip
