"""Pass 1 of every pass over the tokens: each answer's advantage (the file's, or from
rewards and the group table), the KL a trainer puts into the reward, and the notes so far
(:class:`Pass1`, :func:`objective_pass1`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..batch import Batch
from ..core import (
    GroupStats,
    advantages_by_group,
    advantages_from_stats,
    difference,
    group_stats,
    kl_from_log_ratio,
)
from ..engine.options import EngineOptions, Ran
from ..engine.plan import plan
from ..engine.run import columns_reader, ran_by, run
from ..errors import InputError
from ..io import Answers, Source, load_answers, numpy_of
from ..io.lists import batch_token_advantages
from ..records import Distribution
from ..settings import Settings
from ..trainers import RewardKL, trainer_of
from .groups import GroupTable, group_table
from .parts import answer_sums, suffix_sums
from .summaries import values_distribution
from .tokens import TokenPartial

F64 = NDArray[np.float64]


I64 = NDArray[np.int64]


# ------------------------------------------------------------------------ advantages
def _advantages(answers: Answers, settings: Settings, label: str) -> tuple[F64, GroupStats]:
    if answers.reward is None or answers.codes is None or answers.labels is None:
        raise InputError(f"{label}: rewards and group ids are needed to compute advantages")
    P = len(answers.labels)
    stats = group_stats(answers.reward, answers.codes, n_groups=P, ddof=settings.ddof)
    adv = advantages_by_group(
        answers.reward, answers.codes, n_groups=P, **settings.advantage_kwargs()
    )
    return adv, stats


@dataclass(frozen=True)
class Pass1:
    """What the objective needs before the token pass: each answer's advantage, where it
    came from (``file`` or ``rewards``), the group table, and the notes so far.

    A batch gets its advantages from its own answer columns (:meth:`advantages`): the
    file's advantage column, or its rewards and group ids joined to the group table; not
    from its position in the input.
    """

    adv: F64
    source: str
    table: GroupTable | None
    settings: Settings
    on_policy: bool
    warnings: list[str]
    reward: Distribution | None = None  # the rewards (the task's, before any KL)
    # logged advantages nonzero in zero-variance groups: (how many, largest |A|), or None
    residual: tuple[int, float] | None = None
    ran: Ran = field(default_factory=Ran)  # what pass 1 did on the engine (Ray: its tasks)
    # the file's advantages vary within answers: each batch's come per token
    per_token: bool = False

    @property
    def stats(self) -> GroupStats | None:
        return None if self.table is None else self.table.stats

    def advantages(self, b: Batch, label: str) -> F64:
        """The advantages of a batch's answers, from the columns it carries: ``(b.n,)``, or
        ``(T_b,)`` per token with OpenRLHF's KL in the reward or the file's own varying."""
        where = f"{label} (rows {b.start}-{b.start + b.n - 1})"
        if self.source == "file":
            if self.per_token:
                return batch_token_advantages(b, where)
            return _answer_floats(b, "advantage", where)
        if self.table is None or "group" not in b.answer:
            raise InputError(f"{where}: the batch carries no group ids")
        s = self.settings
        reward = _answer_floats(b, "reward", where)
        way = _reward_kl_way(s)
        if way == "score":  # the KL joins the score before the groups
            reward = reward - s.beta * answer_sums(b, lambda p: reward_kl(p, s))
        adv = advantages_from_stats(
            reward,
            self.table.codes(b.answer["group"], where),
            self.table.stats,
            scale=s.scale,
            eps=s.eps,
            estimator=s.estimator,
            singleton=s.singleton,
            batch_std=self.table.batch_std,
            clip=s.adv_clip,
        )
        if way == "returns":  # the KL per token, summed to the end
            adv_tok = np.repeat(adv, b.lengths)
            suffix_sums(b, lambda p: reward_kl(p, s), adv_tok, s.beta)
            return adv_tok
        return adv

    def fold(self, label: str) -> Callable[[TokenPartial, Batch], None]:
        """Fold a batch with its answers' advantages."""

        def fold(acc: TokenPartial, b: Batch) -> None:
            acc.update(b, self.advantages(b, label))

        return fold


def _reward_kl_way(s: Settings) -> RewardKL | None:
    """How the settings' trainer puts the KL into the reward, when it is there (β ≠ 0)."""
    t = trainer_of(s.trainer)
    if s.kl_mode != "reward" or s.beta == 0.0 or t is None:
        return None
    return t.reward_kl


def reward_kl(b: Batch, s: Settings) -> F64:
    """The per-token KL a trainer puts into the reward: the settings' estimator (k1 by
    default, both trainers) of the sampling policy against the reference, ``old_logp`` vs
    ``ref_logp`` (``logp`` when on-policy), clamped as the settings say (OpenRLHF: ±10).

    - verl 0.9.1 ``apply_kl_penalty``: ``kl_penalty(old_log_probs, ref_log_prob)``,
      subtracted from the token rewards, which ``compute_grpo_outcome_advantage`` sums into
      the answer's score *before* the group mean and std.
    - OpenRLHF 0.11.2 ``compute_approx_kl(action_log_probs, base_action_log_probs)``
      clamped to ±10, −β times it added to every token's reward after the group
      normalisation, then summed from each token to the end (``get_cumulative_returns``).
    """
    old = b.fields.get("old_logp", b.fields["logp"])
    return kl_from_log_ratio(
        difference(b.fields["ref_logp"], old),
        estimator=s.kl_estimator,
        clamp=s.kl_clamp,
        log_ratio_clamp=s.log_ratio_clamp,
    )


@dataclass
class AnswerValues:
    """Per-answer values of batches folded anywhere, kept by their first row: merged,
    then read in input order (:meth:`values`). One float an answer."""

    parts: dict[int, F64] = dataclasses.field(default_factory=dict)

    def merge(self, o: AnswerValues) -> AnswerValues:
        self.parts.update(o.parts)
        return self

    def values(self) -> F64:
        if not self.parts:
            return np.zeros(0)
        return np.concatenate([self.parts[k] for k in sorted(self.parts)])


def reward_kl_sums(src: Source, settings: Settings, engine: EngineOptions) -> tuple[F64, Ran]:
    """Each answer's sum of :func:`reward_kl` over its valid tokens: the pass over the
    token columns verl's KL in the reward needs before the group statistics, on the
    engine's plan like every other pass."""
    fields = [f for f in ("logp", "old_logp", "ref_logp") if src.has(f)]

    def fold(acc: AnswerValues, b: Batch) -> None:
        acc.parts[b.start] = answer_sums(b, lambda p: reward_kl(p, settings))

    acc, ran = run(plan(src, fields, engine), AnswerValues, fold)
    return acc.values(), ran


def _answer_floats(b: Batch, field: str, where: str) -> F64:
    col = b.answer.get(field)
    if col is None:
        raise InputError(f"{where}: the batch carries no {field} column")
    return np.asarray(numpy_of(col), dtype=np.float64)


def objective_pass1(
    src: Source,
    settings: Settings,
    *,
    answers: Answers | None = None,
    recompute_advantages: bool = False,
    engine: EngineOptions | None = None,
) -> Pass1:
    """Pass 1 of the objective: the fields it needs are there, and every answer's
    advantage (the file's own unless ``recompute_advantages``, else from rewards)."""
    if not src.has("logp"):
        raise src.missing("logp", " (the current policy's log-probs)")
    if settings.beta > 0 and not src.has("ref_logp"):
        whose = "meta.json's config sets" if settings.origin == "meta.json" else "with"
        raise src.missing(
            "ref_logp",
            f", but {whose} beta = {settings.beta} > 0 the KL term needs the reference "
            "log-probs (give them, or pass --beta 0)",
        )
    warnings: list[str] = list(src.notes)
    on_policy = not src.has("old_logp")
    if on_policy:
        warnings.append(f"no {src.name('old_logp')!r}: treating the batch as on-policy (ratio = 1)")
    ran = Ran()
    if answers is None:
        read = columns_reader(engine)
        answers = load_answers(src, need_rewards=False, read=read)
        ran = ran_by(read)
    warnings += answers.notes
    task_reward = answers.reward
    if (
        _reward_kl_way(settings) == "score"
        and answers.reward is not None
        and (answers.advantage is None or recompute_advantages)
    ):  # verl: the score is the reward minus β × the answer's summed KL, then the groups
        kl_sums, pre = reward_kl_sums(src, settings, (engine or EngineOptions()).resolved())
        ran = ran.then(pre)
        if kl_sums.shape != answers.reward.shape:
            raise InputError(
                f"{src.label}: {kl_sums.shape[0]} token rows but {answers.reward.shape[0]} answers"
            )
        answers = dataclasses.replace(answers, reward=answers.reward - settings.beta * kl_sums)
    if answers.advantage is not None and not recompute_advantages:
        adv, adv_source = answers.advantage, "file"
    elif answers.reward is not None:
        adv, _ = _advantages(answers, settings, src.label)
        adv_source = "rewards"
    else:
        raise InputError(
            f"{src.label}: neither {src.name('advantage')!r} nor {src.name('reward')!r} is present "
            f"(the file has: {', '.join(src.present)})"
        )
    table = group_table(answers, settings)
    residual = None
    if adv_source == "file" and table is not None and answers.codes is not None:
        residual = _residual(answers, answers.codes, table)
    if residual is not None:
        n, worst = residual
        warnings.append(
            f"{n} answer(s) of zero-variance groups have nonzero logged advantages (up to "
            f"{worst:.3g}): the trainer's float32 group statistics; the objective and clip "
            "fractions use the logged advantages, as the trainer did (--recompute-advantages "
            "gives exact zeros)"
        )
    reward = None if task_reward is None else values_distribution(task_reward)
    per_token = adv_source == "file" and answers.per_token_advantage
    return Pass1(
        adv, adv_source, table, settings, on_policy, warnings, reward, residual, ran, per_token
    )


def _residual(answers: Answers, codes: I64, table: GroupTable) -> tuple[int, float] | None:
    """How many logged advantages are nonzero in groups of equal rewards, and the largest
    in magnitude: the residual of a trainer's float32 group statistics (see the check rule
    zero-variance-advantage); None when there is none."""
    assert answers.advantage is not None
    constant = (table.stats.min == table.stats.max)[codes]
    with np.errstate(invalid="ignore"):
        bad = constant & (answers.advantage != 0.0)
    n = int(np.count_nonzero(bad))
    if not n:
        return None
    return n, float(np.max(np.abs(answers.advantage[bad])))
