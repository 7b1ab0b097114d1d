"""Record an OpenRLHF run for grpo-cli: each step's experiences, in the recorded-run layout.

Two ways in (OpenRLHF 0.11.2):

- :func:`write_experiences` writes a list of ``Experience`` objects (one step's) as
  ``DIR/step_{N:06d}/rank{r:03d}-mb{k:03d}.parquet`` (plus ``meta.json`` once, and the
  step's ``_DONE``);
- :func:`install` makes a ``PPOTrainer`` (any ``BasePPOTrainer``) write every recorded
  step by itself; :func:`recording` does it for the Ray actor class that
  ``openrlhf.cli.train_ppo_ray`` starts (``PPOTrainer`` is ``@ray.remote``).

Fields read from each ``Experience`` (``openrlhf/trainer/ppo_utils/experience.py``)::

    action_mask            (B, A)  the loss mask                        -> mask
    index                  [B]     rollout position i: prompt i // n    -> group
    rewards                (B,)    the reward the advantages come from  -> reward
    advantages             (B, A)  per answer if constant, else per token -> advantage
    action_log_probs       (B, A)  the actor's, at experience time      -> old_logp
    base_action_log_probs  (B, A)  the reference (--algo.kl.use_loss)   -> ref_logp
    rollout_log_probs      (B, A)  vLLM's                               -> rollout_logp
    sequences              (B, T)  prompt + response ids (decoded with a tokenizer) -> completion

``action_log_probs`` is what ``PPOActor.training_step`` (``trainer/ray/ppo_actor.py``)
passes to ``PolicyLoss`` as ``old_log_probs``: the actor's log-probs computed in
``RemoteExperienceMaker.make_experience``, before the update. The current policy's are
computed inside that training step (pass them as ``log_probs`` when you have them).
Groups: ``compute_advantages_and_returns`` puts the sample at rollout position ``i``
(``Experience.index``) into prompt ``i // n_samples_per_prompt``. ``rewards`` is the
per-sample reward after the length penalties, which the group normalisation starts from;
with the KL in the reward (OpenRLHF's default) the advantages vary over an answer's
tokens and are written per token.

Where the current log-probs are (OpenRLHF 0.11.2): ``PPOTrainer`` (the driver, a Ray actor)
hands the experiences to the policy actors (``PolicyModelActor``, ``trainer/ray/
ppo_actor.py``), whose ``ActorPPOTrainer.ppo_train`` runs ``training_step`` once per
micro-batch; the current policy's log-probs exist only there (``Actor.forward``, then
``PolicyLoss``). So a step recorded on ``PPOTrainer`` has no ``logp`` (``grpo-cli objective``
refuses it without ``-c logp=old_logp``), and :func:`install` also takes the
``ActorPPOTrainer`` (``PolicyModelActor.trainer``; :func:`recording` of ``PolicyModelActor``
installs on it after ``init_model_from_pretrained``): then each ``training_step`` writes its
micro-batch experience with the log-probs ``PolicyLoss`` was given, as
``rank{r:03d}-mb{k:03d}.parquet`` with the loss normalisers (``loss_batch_info``) in its
metadata, one step per ``ppo_train`` call; after ``ppo_train`` returns, its status (what
``PPOTrainer`` logs of the actor) is one line of ``metrics.jsonl`` and the rank's ``_DONE``.

The gate (``install(..., check=True)``): after the step's ``_DONE``, the step is checked
as ``grpo-cli check DIR -c logp=old_logp`` checks it (the actor before the update stands
for the current policy: ratio 1, the clip and ratio rules trivially met; KL to the
reference, zero-variance groups, advantages, sampler mismatch and integrity are the
experiences'), ``logged-metrics`` skipped (the logged update metrics come from the current
log-probs, not recorded). The numbers of :data:`grpo_cli.integrations._gate.KEYS` go
into the step's status, which ``fit`` logs (``logger.info``, W&B, TensorBoard) with the
rest. ``stop_on_fail``: ``PPOTrainer.fit`` ends an episode when
``samples_generator.generate_samples`` reports its prompts exhausted (an empty list and
``is_exhausted``); after a failing step, the wrapped ``generate_samples`` reports just
that, without generating, to every later call: ``fit`` leaves its remaining episodes at
once and closes its trackers, after the failing step's own logging, checkpoint and
evaluation.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _args
from ._gate import CheckFailedWarning, Gate, check_config
from ._writer import Guard, RunWriter, rollout_table
from .verl import NO_LOGP, NO_LOGP_COLUMNS, _array, per_answer

if TYPE_CHECKING:
    from ..records import CheckReport

__all__ = ["CONFIG_KEYS", "CheckFailedWarning", "config_items", "experiences_table",
           "install", "recording", "write_experiences"]  # fmt: skip

TRAINER = "openrlhf"

# Every convention the loss, the advantages and the logged metrics depend on: OpenRLHF
# 0.11.2's own argument names (openrlhf/cli/train_ppo_ray.py; dotted, as argparse holds
# them and ``hierarchize`` nests them into ``args.algo.kl.use_loss`` etc.).
CONFIG_KEYS: tuple[str, ...] = (
    "algo.advantage.estimator",
    "algo.advantage.gamma",
    "algo.advantage.lambd",
    "algo.advantage.no_std_norm",
    "algo.advantage.is_correction_level",
    "algo.advantage.is_correction_mode",
    "algo.advantage.is_correction_gating",
    "algo.advantage.is_correction_threshold",
    "algo.kl.use_loss",
    "algo.kl.estimator",
    "algo.kl.init_coef",
    "algo.kl.target",
    "algo.kl.horizon",
    "algo.kl.unbiased_gradient",
    "algo.dynamic_filtering_enable",
    "algo.dynamic_filtering_range",
    "actor.eps_clip",
    "actor.eps_clip_low_high",
    "actor.dual_clip",
    "actor.policy_loss_type",
    "actor.loss_agg_mode",
    "actor.entropy_coef",
    "actor.aux_loss_coef",
    "actor.num_nodes",
    "actor.num_gpus_per_node",
    "reward.clip_range",
    "reward.normalize_enable",
    "reward.overlong_buffer_len",
    "reward.overlong_penalty_factor",
    "reward.stop_properly_penalty_coef",
    "rollout.n_samples_per_prompt",
    "rollout.batch_size",
    "rollout.micro_batch_size",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.max_new_tokens",
    "train.batch_size",
    "train.micro_batch_size",
    "train.max_epochs",
    "train.dynamic_batch_enable",
    "train.max_tokens_per_gpu",
    "data.max_len",
    "ds.ring_attn_size",
    "ds.tensor_parallel_size",
    "ds.packing_samples",
)

_MISSING = object()


def _select(args: Any, key: str) -> Any:
    """``key`` of an argparse ``Namespace`` (flat, dotted dests), its ``hierarchize``d
    ``SimpleNamespace`` or a dict (either form)."""
    flat = vars(args) if hasattr(args, "__dict__") and not isinstance(args, dict) else args
    if isinstance(flat, dict) and key in flat:
        return flat[key]
    node = args
    for part in key.split("."):
        if isinstance(node, dict):
            node = node.get(part, _MISSING)
        else:
            node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def config_items(args: Any) -> dict[str, Any]:
    """The :data:`CONFIG_KEYS` present in ``args``, by OpenRLHF's dotted name; tuples as
    lists, absent keys left out."""
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        value = _select(args, key)
        if value is not _MISSING:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _version() -> str | None:
    try:
        return _pkg_version("openrlhf")
    except PackageNotFoundError:
        return None


# ------------------------------------------------------------------- experiences
def _padded(rows: Sequence[np.ndarray], width: int) -> np.ndarray:
    """Experiences' ``(B_k, A_k)`` arrays stacked to ``(ΣB, width)``, right-padded with 0
    (OpenRLHF pads responses on the right: ``zero_pad_sequences(..., side="right")``)."""
    out = np.zeros((sum(r.shape[0] for r in rows), width), dtype=rows[0].dtype)
    i = 0
    for r in rows:
        out[i : i + r.shape[0], : r.shape[1]] = r
        i += r.shape[0]
    return out


def _completions(
    experiences: Sequence[Any], masks: Sequence[np.ndarray], tokenizer: Any
) -> list[str]:
    """Each answer's response tokens (the last ``A`` of ``sequences``, where the action
    mask is set), decoded with ``skip_special_tokens``."""
    out: list[str] = []
    for e, m in zip(experiences, masks, strict=True):
        seq = _array(e.sequences, "sequences")[:, -m.shape[1] :]
        rows = [seq[i][m[i]].tolist() for i in range(seq.shape[0])]
        out.extend(str(t) for t in tokenizer.batch_decode(rows, skip_special_tokens=True))
    return out


def _ids(experiences: Sequence[Any], masks: Sequence[np.ndarray], width: int) -> np.ndarray | None:
    """Each answer's response token ids (the last ``A`` of ``sequences``) as ``(ΣB,
    width)``, or None when absent or unreadable: optional, so never a reason to fail
    inside training."""
    try:
        rows = [
            _array(e.sequences, "sequences")[:, -m.shape[1] :]
            for e, m in zip(experiences, masks, strict=True)
        ]
        return _padded(rows, width)
    except Exception:  # the ids are optional: the recording goes on
        return None


def experiences_table(
    experiences: Sequence[Any],
    step: int,
    *,
    n_samples_per_prompt: int,
    log_probs: Sequence[Any] | None = None,
    tokenizer: Any = None,
    token_dtype: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """OpenRLHF experiences as grpo-cli's table (one row per sample) and file metadata."""
    if n_samples_per_prompt < 1:
        raise ValueError(f"n_samples_per_prompt: expected >= 1, got {n_samples_per_prompt}")
    experiences = list(experiences)
    masks, index = _masks_and_index(experiences)
    width = max(m.shape[1] for m in masks)
    mask = _padded(masks, width)

    def stacked(name: str, given: Sequence[Any] | None = None) -> np.ndarray | None:
        values = given if given is not None else [getattr(e, name) for e in experiences]
        if all(v is None for v in values):
            return None
        rows = []
        for k, (v, m) in enumerate(zip(values, masks, strict=True)):
            if v is None:
                raise ValueError(f"experiences[{k}].{name}: absent, but other experiences have it")
            a = _array(v, f"experiences[{k}].{name}")
            if a.shape != m.shape:
                raise ValueError(f"experiences[{k}].{name}: shape {a.shape}, mask {m.shape}")
            rows.append(np.where(m, a, 0.0))
        return _padded(rows, width)

    info: dict[str, Any] = {
        "answers": int(mask.shape[0]),
        "tokens": int(mask.sum()),
        "experiences": len(experiences),
        "n_samples_per_prompt": n_samples_per_prompt,
    }
    reward = None
    if all(e.rewards is not None for e in experiences):
        reward = np.concatenate(
            [_array(e.rewards, "rewards").astype(np.float64).reshape(-1) for e in experiences]
        )
    advantage = stacked("advantages")
    if advantage is not None:
        constant = per_answer(advantage, mask)
        info["advantage_source"] = "per answer" if constant is not None else "per token"
        if constant is not None:
            advantage = constant
    if log_probs is not None and len(log_probs) != len(experiences):
        raise ValueError(f"log_probs: {len(log_probs)} for {len(experiences)} experiences")
    tokens = {
        "logp": stacked("log_probs", log_probs) if log_probs is not None else None,
        "old_logp": stacked("action_log_probs"),
        "ref_logp": stacked("base_action_log_probs"),
        "rollout_logp": stacked("rollout_log_probs"),
    }
    table = rollout_table(
        group=[f"g{step:06d}-p{i // n_samples_per_prompt:05d}" for i in index],
        reward=reward,
        advantage=advantage,
        mask=mask,
        tokens=tokens,
        completion=None if tokenizer is None else _completions(experiences, masks, tokenizer),
        token_dtype=token_dtype,
        token_ids=_ids(experiences, masks, width),
    )
    return table, info


def _masks_and_index(experiences: Sequence[Any]) -> tuple[list[np.ndarray], list[int]]:
    """Each experience's action mask (as booleans) and every sample's prompt index
    (``Experience.index``), checked: a ``ValueError`` naming the experience and field."""
    if not experiences:
        raise ValueError("experiences: empty")
    masks: list[np.ndarray] = []
    index: list[int] = []
    for k, e in enumerate(experiences):
        if e.action_mask is None:
            raise ValueError(f"experiences[{k}].action_mask: absent")
        m = _array(e.action_mask, f"experiences[{k}].action_mask").astype(bool)
        if e.index is None:
            raise ValueError(
                f"experiences[{k}].index: None (balance_experiences drops it); record the "
                "output of make_experience_batch"
            )
        if len(e.index) != m.shape[0]:
            raise ValueError(f"experiences[{k}].index: {len(e.index)} for {m.shape[0]} samples")
        masks.append(m)
        index.extend(int(i) for i in e.index)
    return masks, index


_runs: dict[tuple[str, int], tuple[RunWriter, Guard]] = {}


def _run(
    directory: str | os.PathLike[str], args: Any, rank: int, world_size: int
) -> tuple[RunWriter, Guard]:
    key = (os.path.abspath(directory), rank)
    if key not in _runs:
        writer = RunWriter(
            directory,
            trainer=TRAINER,
            trainer_version=_version(),
            config=config_items(args) if args is not None else {},
            rank=rank,
            world_size=world_size,
        )
        _runs[key] = (writer, Guard(TRAINER))
    return _runs[key]


def write_experiences(
    experiences: Sequence[Any],
    directory: str | os.PathLike[str],
    step: int,
    *,
    n_samples_per_prompt: int,
    args: Any = None,
    micro_batch: int = 0,
    micro_batches: int = 1,
    rank: int = 0,
    world_size: int = 1,
    log_probs: Sequence[Any] | None = None,
    tokenizer: Any = None,
    token_dtype: Any = None,
) -> Path | None:
    """Write one step's OpenRLHF ``Experience`` list as one file,
    ``directory/step_{step:06d}/rank{rank:03d}-mb{micro_batch:03d}.parquet``.

    The experiences' ``(B_k, A_k)`` fields are stacked and right-padded to the widest
    ``A_k`` (the mask keeps the padding out). Groups come from ``Experience.index`` and
    ``n_samples_per_prompt`` (module docstring); ``log_probs`` (one ``(B_k, A_k)`` tensor
    per experience) gives the current policy's when you have them. ``args`` (OpenRLHF's
    argparse ``Namespace``, its nested form, or a dict) goes into ``meta.json`` as
    :func:`config_items` (written once per directory, by rank 0). After micro-batch
    ``micro_batches - 1`` the step's ``_DONE`` is written. ``token_dtype``: None (each
    token field keeps its width: float64 as float64, the rest as float32) or a pyarrow
    float type for every token list. Without ``log_probs`` the step is read as its first
    update, on-policy (logp = old_logp, ratio 1: what OpenRLHF's first update computes).

    Required: ``experiences``, ``directory``, ``step`` (an integer >= 0) and
    ``n_samples_per_prompt`` (an integer >= 1: the answers of a prompt); ``micro_batch``
    is below ``micro_batches`` and ``rank`` below ``world_size``.

    Never raises: a failure, a wrong argument too, is one ``RuntimeWarning`` naming
    grpo-cli and the reason, and later calls for the same directory and rank write
    nothing. Returns the file written, or ``None``.
    """
    try:
        _args.directory("directory", directory)
        _args.count("step", step, least=0)
        _args.count("n_samples_per_prompt", n_samples_per_prompt)
        _args.index("micro_batch", micro_batch, _args.count("micro_batches", micro_batches),
                    "micro_batches")  # fmt: skip
        _args.index("rank", rank, _args.count("world_size", world_size), "world_size")
        _args.token_type("token_dtype", token_dtype)
    except (TypeError, ValueError) as exc:
        warnings.warn(f"grpo-cli: write_experiences: {exc}; nothing written", RuntimeWarning, 2)
        return None
    writer, guard = _run(directory, args, rank, world_size)

    def write() -> Path:
        table, info = experiences_table(
            experiences,
            step,
            n_samples_per_prompt=n_samples_per_prompt,
            log_probs=log_probs,
            tokenizer=tokenizer,
            token_dtype=token_dtype,
        )
        return writer.write_call(step, micro_batch, micro_batches, table, info)

    return guard.run(write)


# --------------------------------------------------------------------------- install
def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str | np.generic)


class _Recorder:
    def __init__(
        self,
        trainer: Any,
        directory: str | os.PathLike[str],
        every_steps: int,
        tokenizer: Any,
        token_dtype: Any,
        originals: tuple[Callable[..., Any], Callable[..., Any]],
    ) -> None:
        self.trainer, self.directory = trainer, directory
        self.every_steps, self.tokenizer, self.token_dtype = every_steps, tokenizer, token_dtype
        self.train_step, self.make_experience_batch = originals
        self.guard = Guard(TRAINER)
        self.writer: RunWriter | None = None
        self.step: int | None = None  # the step being recorded, set by train_step
        self.gate: Gate | None = None
        self.generate_samples: Callable[..., Any] | None = None  # wrapped for stop_on_fail
        self.stopped = False

    def _writer(self) -> RunWriter:
        if self.writer is None:
            self.writer = RunWriter(
                self.directory,
                trainer=TRAINER,
                trainer_version=_version(),
                config=config_items(self.trainer.args),
            )
        return self.writer

    def record(self, experiences: Sequence[Any], step: int) -> None:
        args = self.trainer.args
        table, info = experiences_table(
            experiences,
            step,
            n_samples_per_prompt=args.rollout.n_samples_per_prompt,
            tokenizer=self.tokenizer,
            token_dtype=self.token_dtype,
        )
        info["micro_batches"] = 1
        info["scope"] = (
            "the experiences make_experience_batch returned: the whole step, before "
            "the actors' training steps; the current log-probs are computed inside "
            "PPOActor.training_step and are not recorded"
        )
        self._writer().write_micro_batch(step, 0, table, info)

    def finish(self, status: Any, step: int) -> None:
        if isinstance(status, dict):
            logged = {k: v for k, v in status.items() if _jsonable(v)}
            self._writer().append_metrics({"step": step, **logged})
        self._writer().finish_step(step)

    def gate_step(self, gate: Gate, status: Any, step: int) -> None:
        """Check the step; its numbers into the status ``fit`` logs; a stop as the prompts
        being exhausted (module docstring)."""
        verdict = gate.step_written(self._writer().step_dir(step), step, logged=True)
        if verdict is None:
            return
        if isinstance(status, dict):
            status.update(verdict.numbers)
        if verdict.stop:
            self.stopped = True


class _ActorRecorder:
    """What :func:`install` puts on an ``ActorPPOTrainer`` (module docstring)."""

    def __init__(
        self,
        trainer: Any,
        directory: str | os.PathLike[str],
        every_steps: int,
        first_step: int,
        tokenizer: Any,
        token_dtype: Any,
        originals: tuple[Callable[..., Any], Callable[..., Any]],
    ) -> None:
        self.trainer, self.directory = trainer, directory
        self.every_steps, self.tokenizer, self.token_dtype = every_steps, tokenizer, token_dtype
        self.ppo_train, self.training_step = originals
        self.next_step = first_step
        self.guard = Guard(TRAINER)
        self.writer: RunWriter | None = None
        self.step: int | None = None  # the step being recorded, set by ppo_train
        self.calls = 0
        self.answers = 0  # answers recorded in the step on this rank: the epoch
        # each appended sample's rollout position (Experience.index), by its tokens: the
        # replay buffer's split drops index (experience.py split_experience_batch)
        self.positions: dict[tuple[int, ...], int] = {}
        self.ambiguous = 0  # samples whose tokens two prompts' groups share
        self.append: Callable[..., Any] | None = None  # the replay buffer's own append

    def appended(self, experience: Any) -> None:
        """Remember the positions of an experience the replay buffer is given."""
        if experience.index is None:
            return
        n = self.trainer.args.rollout.n_samples_per_prompt
        for i, key in zip(experience.index, _sample_keys(experience), strict=True):
            # the same answer twice in one group is one group either way
            if self.positions.setdefault(key, int(i)) // n != int(i) // n:
                self.ambiguous += 1

    def _writer(self) -> RunWriter:
        if self.writer is None:
            import torch.distributed as dist

            rank, world = 0, 1
            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
            self.writer = RunWriter(
                self.directory,
                trainer=TRAINER,
                trainer_version=_version(),
                config=config_items(self.trainer.args),
                rank=rank,
                world_size=world,
            )
        return self.writer

    def record(self, experience: Any, log_probs: Any, batch_info: Any, step: int) -> None:
        import copy

        args = self.trainer.args
        if self.ambiguous:
            raise ValueError(
                f"{self.ambiguous} sample(s) of the step have the tokens of a sample of "
                "another prompt's group: their groups cannot be told apart"
            )
        keys = _sample_keys(experience)
        missing = sum(k not in self.positions for k in keys)
        if missing:
            raise ValueError(
                f"{missing} sample(s) of a training micro-batch were not seen by the replay "
                "buffer's append (install before the experiences are appended)"
            )
        experience = copy.copy(experience)  # the trainer's own is not changed
        experience.index = [self.positions[k] for k in keys]
        epochs = int(getattr(args.train, "max_epochs", 1) or 1)
        epoch = None
        if epochs > 1:  # each epoch's pass over a group is its own group (verl's the same)
            per_epoch = len(self.trainer.replay_buffer)
            epoch = self.answers // per_epoch if per_epoch else 0
            offset = epoch * args.rollout.batch_size * args.rollout.n_samples_per_prompt
            experience.index = [i + offset for i in experience.index]
        self.answers += len(keys)
        table, info = experiences_table(
            [experience],
            step,
            n_samples_per_prompt=args.rollout.n_samples_per_prompt,
            log_probs=[log_probs],
            tokenizer=self.tokenizer,
            token_dtype=self.token_dtype,
        )
        for key in ("batch_num_tokens", "global_batch_size", "dp_size"):
            value = (batch_info or {}).get(key)
            info[key] = None if value is None else float(value)
        if epoch is not None:
            info["epoch"] = epoch
        info["scope"] = (
            "one ActorPPOTrainer.training_step: one micro-batch on one rank, with the "
            "current log-probs PolicyLoss was given"
        )
        self._writer().write_micro_batch(step, self.calls, table, info)
        self.calls += 1

    def finish(self, status: Any, step: int) -> None:
        if isinstance(status, dict):
            logged = {k: v for k, v in status.items() if _jsonable(v)}
            self._writer().append_metrics({"step": step, **logged})
        self._writer().finish_step(step)


def _sample_keys(experience: Any) -> list[tuple[int, ...]]:
    """Each sample's tokens (its sequence under its attention mask): the same in the batch
    appended and in the training micro-batch collated from it."""
    seq, att = experience.sequences, experience.attention_mask
    return [tuple(s[a.bool()].tolist()) for s, a in zip(seq, att, strict=True)]


def _install_actor(
    trainer: Any,
    directory: str | os.PathLike[str],
    *,
    every_steps: int,
    first_step: int,
    tokenizer: Any,
    token_dtype: Any,
) -> Any:
    """:func:`install` on an ``ActorPPOTrainer``: ``ppo_train`` counts the steps (one call a
    step, the first ``first_step``) and ``training_step`` records its micro-batch."""
    previous = getattr(trainer, "_grpo_cli_recorder", None)
    if isinstance(previous, _ActorRecorder):
        originals = (previous.ppo_train, previous.training_step)
    else:
        originals = (trainer.ppo_train, trainer.training_step)
    if tokenizer is None:
        tokenizer = getattr(trainer, "tokenizer", None)
    rec = _ActorRecorder(
        trainer, directory, every_steps, first_step, tokenizer, token_dtype, originals
    )

    def ppo_train(*args: Any, **kwargs: Any) -> Any:
        step = rec.next_step
        rec.next_step += 1
        rec.step = step if rec.guard.active and step % rec.every_steps == 0 else None
        rec.calls = rec.answers = 0
        try:
            status = rec.ppo_train(*args, **kwargs)
        finally:
            recorded, rec.step = rec.step, None
            rec.positions, rec.ambiguous = {}, 0  # the buffer is cleared after ppo_train
        if recorded is not None and rec.guard.active:
            rec.guard.run(lambda: rec.finish(status, recorded))
        return status

    def training_step(experience: Any, *args: Any, **kwargs: Any) -> Any:
        step = rec.step
        if step is None or not rec.guard.active:
            return rec.training_step(experience, *args, **kwargs)
        loss_fn = trainer.actor_loss_fn
        seen: dict[str, Any] = {}

        def policy_loss(log_probs: Any, *a: Any, **k: Any) -> Any:
            seen["log_probs"] = log_probs.detach()  # what PolicyLoss is given
            seen["batch_info"] = {x: k.get(x) for x in ("batch_num_tokens",
                                  "global_batch_size", "dp_size")}  # fmt: skip
            return loss_fn(log_probs, *a, **k)

        trainer.actor_loss_fn = policy_loss
        try:
            result = rec.training_step(experience, *args, **kwargs)
        finally:
            trainer.actor_loss_fn = loss_fn
        if "log_probs" in seen:
            rec.guard.run(
                lambda: rec.record(experience, seen["log_probs"], seen["batch_info"], step)
            )
        return result

    buffer = trainer.replay_buffer
    append = getattr(previous, "append", None) or buffer.append
    rec.append = append

    def appended(experience: Any, *args: Any, **kwargs: Any) -> Any:
        if rec.guard.active:
            rec.guard.run(lambda: rec.appended(experience))
        return append(experience, *args, **kwargs)

    appended.__wrapped__ = append  # type: ignore[attr-defined]
    buffer.append = appended
    ppo_train.__wrapped__ = originals[0]  # type: ignore[attr-defined]
    training_step.__wrapped__ = originals[1]  # type: ignore[attr-defined]
    trainer.ppo_train = ppo_train
    trainer.training_step = training_step
    trainer._grpo_cli_recorder = rec
    return trainer


def _is_actor_trainer(trainer: Any) -> bool:
    return all(
        callable(getattr(trainer, name, None)) for name in ("ppo_train", "training_step")
    ) and hasattr(trainer, "actor_loss_fn")


def install(
    trainer: Any,
    directory: str | os.PathLike[str],
    *,
    every_steps: int = 1,
    tokenizer: Any = None,
    token_dtype: Any = None,
    check: bool | str | os.PathLike[str] = False,
    stop_on_fail: bool = False,
    on_check: Callable[[int, CheckReport], object] | None = None,
    first_step: int = 1,
) -> Any:
    """Make an OpenRLHF ``PPOTrainer`` (a ``BasePPOTrainer``), or the policy actors'
    ``ActorPPOTrainer``, record every
    ``every_steps``-th step under ``directory``; returns ``trainer``.

    Wraps two attributes of the instance (OpenRLHF 0.11.2, ``trainer/ppo_trainer.py``):
    ``train_step(rollout_samples, global_step)``, which returns the step it logs under
    (``global_step + 1``), and its ``experience_maker.make_experience_batch``, whose
    output (experiences with rewards, advantages and log-probs, before the actors
    train on them) is written as ``step_{N:06d}/rank000-mb000.parquet``. When
    ``train_step`` returns, its status (what ``fit`` logs; the ``generated_samples``
    text left out) is one line of ``metrics.jsonl`` and the step's ``_DONE`` is written.
    ``meta.json`` comes from ``trainer.args``. Nothing the trainer computes changes. A
    recording failure is one ``RuntimeWarning`` and recording stops; training goes on.

    ``check`` (``True`` or a check config file) checks every recorded step after its
    ``_DONE`` and adds the gate's numbers to the status ``fit`` logs; ``stop_on_fail``
    ends ``fit`` after a failing step (module docstring: "The gate"; it needs
    ``PPOTrainer``'s ``samples_generator``); ``on_check(step, report)`` gets each step's
    check report. A failing rule is one ``CheckFailedWarning``; an exception in the gate
    is one ``RuntimeWarning`` and turns the gate off (recording goes on).

    ``PPOTrainer`` runs as a Ray actor; :func:`recording` gives the actor class that
    calls this at the end of its ``__init__``.

    On an ``ActorPPOTrainer`` (``PolicyModelActor.trainer``, where the current log-probs
    are: module docstring) it wraps ``ppo_train`` (one call per step, the first one step
    ``first_step``) and ``training_step``: each micro-batch is written with the log-probs
    its ``PolicyLoss`` was given, the status ``ppo_train`` returns is one line of
    ``metrics.jsonl`` (rank 0), and each rank writes its ``_DONE``. ``check`` is not taken
    there (the driver's ``PPOTrainer`` gates).

    Required: ``trainer`` and ``directory`` (a path). Raises ``TypeError`` or
    ``ValueError`` naming the argument (``every_steps`` not an integer >= 1,
    ``token_dtype`` not None or a pyarrow float type, ``check`` not a bool or a path,
    ``on_check`` not callable, a trainer without ``train_step``), before training starts.
    """
    _install_args(directory, every_steps=every_steps, token_dtype=token_dtype, check=check,
                  stop_on_fail=stop_on_fail, on_check=on_check, first_step=first_step)  # fmt: skip
    if _is_actor_trainer(trainer):
        if check:  # the driver's PPOTrainer gates; an ActorPPOTrainer records micro-batches
            raise ValueError("check: install it on the driver's PPOTrainer, not its actors'")
        return _install_actor(
            trainer, directory, every_steps=every_steps, first_step=first_step,
            tokenizer=tokenizer, token_dtype=token_dtype,
        )  # fmt: skip
    config = check_config(check)
    maker, generator = _driver_parts(trainer, stop_on_fail)
    previous = getattr(trainer, "_grpo_cli_recorder", None)
    if isinstance(previous, _Recorder):
        originals = (previous.train_step, previous.make_experience_batch)
        if previous.generate_samples is not None:
            generator.generate_samples = previous.generate_samples
    else:
        originals = (trainer.train_step, maker.make_experience_batch)
    if tokenizer is None:
        tokenizer = getattr(trainer, "tokenizer", None)
    rec = _Recorder(trainer, directory, every_steps, tokenizer, token_dtype, originals)
    if config is not None:
        rec.gate = Gate(
            config, trainer=TRAINER, stop_on_fail=stop_on_fail, on_check=on_check,
            how_stopped="fit() ends now (samples_generator.generate_samples reports the "
            "prompts exhausted from here on)", column_map=NO_LOGP_COLUMNS, no_logged=NO_LOGP,
        )  # fmt: skip
    _hook(trainer, maker, generator, rec, originals, stop_on_fail)
    trainer._grpo_cli_recorder = rec
    return trainer


def _driver_parts(trainer: Any, stop_on_fail: bool) -> tuple[Any, Any]:
    """The driver's ``experience_maker`` and ``samples_generator`` :func:`install` hooks
    (a ``TypeError`` naming what a trainer lacks)."""
    maker: Any = getattr(trainer, "experience_maker", None)
    if not callable(getattr(trainer, "train_step", None)) or not callable(
        getattr(maker, "make_experience_batch", None)
    ):
        raise TypeError(
            f"install: {type(trainer).__name__} has no train_step and "
            "experience_maker.make_experience_batch (expected OpenRLHF 0.11.2's PPOTrainer)"
        )
    generator: Any = getattr(trainer, "samples_generator", None)
    if stop_on_fail and not callable(getattr(generator, "generate_samples", None)):
        raise TypeError(
            f"install: stop_on_fail needs {type(trainer).__name__}.samples_generator."
            "generate_samples (OpenRLHF 0.11.2's PPOTrainer: fit() stops when it reports "
            "the prompts exhausted)"
        )
    return maker, generator


def _hook(
    trainer: Any, maker: Any, generator: Any, rec: _Recorder, originals: tuple[Any, Any],
    stop_on_fail: bool,
) -> None:  # fmt: skip
    """Wrap the driver's ``train_step``, ``make_experience_batch`` and (``stop_on_fail``)
    ``generate_samples`` on the instance (:func:`install`'s docstring)."""

    def train_step(rollout_samples: Any, global_step: int) -> Any:
        step = global_step + 1
        rec.step = step if rec.guard.active and step % rec.every_steps == 0 else None
        try:
            result = rec.train_step(rollout_samples, global_step)
        finally:
            recorded, rec.step = rec.step, None
        if recorded is not None and rec.guard.active:
            status = result[0] if isinstance(result, tuple) and result else None
            rec.guard.run(lambda: rec.finish(status, recorded))
            gate = rec.gate
            if gate is not None and gate.active and rec.guard.active:
                gate.run(lambda: rec.gate_step(gate, status, recorded), recorded)
        return result

    def make_experience_batch(rollout_samples: Any) -> Any:
        experiences = rec.make_experience_batch(rollout_samples)
        step = rec.step
        if step is not None and rec.guard.active:
            rec.guard.run(lambda: rec.record(experiences, step))
        return experiences

    train_step.__wrapped__ = originals[0]  # type: ignore[attr-defined]
    make_experience_batch.__wrapped__ = originals[1]  # type: ignore[attr-defined]
    trainer.train_step = train_step
    maker.make_experience_batch = make_experience_batch
    if stop_on_fail:
        generate = generator.generate_samples
        rec.generate_samples = generate

        def generate_samples(**generate_kwargs: Any) -> Any:
            if rec.stopped:  # fit(): "if not rollout_samples: if is_exhausted: break"
                return [], None, 0, True
            return generate(**generate_kwargs)

        generate_samples.__wrapped__ = generate  # type: ignore[attr-defined]
        generator.generate_samples = generate_samples


def _install_args(
    directory: Any, *, every_steps: Any = 1, tokenizer: Any = None, token_dtype: Any = None,
    check: Any = False, stop_on_fail: Any = False, on_check: Any = None, first_step: Any = 1,
) -> None:  # fmt: skip
    """:func:`install`'s arguments, checked (``TypeError``/``ValueError`` naming one)."""
    del tokenizer  # anything with batch_decode, or None
    _args.directory("directory", directory)
    _args.count("every_steps", every_steps)
    _args.count("first_step", first_step)
    _args.token_type("token_dtype", token_dtype)
    _args.check_option(check)
    _args.flag("stop_on_fail", stop_on_fail)
    _args.function("on_check", on_check)
    if stop_on_fail and not check:
        raise ValueError("stop_on_fail: needs check=True or a check config file")


def recording(trainer_class: Any, directory: str | os.PathLike[str], **options: Any) -> Any:
    """``trainer_class`` (OpenRLHF's ``PPOTrainer``, a Ray actor class, or a plain
    ``BasePPOTrainer`` subclass) as a class whose instances :func:`install` themselves
    at the end of ``__init__``; ``PolicyModelActor`` as one that installs on its
    ``ActorPPOTrainer`` at the end of ``init_model_from_pretrained``; a Ray actor class
    again when given one. ``options`` go to :func:`install`, checked here, before any
    actor starts (``TypeError`` or ``ValueError`` naming the option; an option
    :func:`install` does not take is a ``TypeError`` naming it).

    In ``openrlhf/cli/train_ppo_ray.py``::

        ppo_trainer = recording(PPOTrainer, "runs/exp1").remote(...)   # was PPOTrainer.remote
    """
    unknown = set(options) - set(inspect.signature(_install_args).parameters)
    if unknown or "directory" in options:
        raise TypeError(f"recording: not an option of install: {', '.join(sorted(unknown))}")
    _install_args(directory, **options)
    base = getattr(trainer_class, "__ray_actor_class__", trainer_class)

    def __init__(self: Any, *a: Any, **k: Any) -> None:
        base.__init__(self, *a, **k)
        install(self, directory, **options)

    def init_model_from_pretrained(self: Any, *a: Any, **k: Any) -> Any:
        out = base.init_model_from_pretrained(self, *a, **k)
        install(self.trainer, directory, **options)
        return out

    body: dict[str, Any] = {"__module__": base.__module__}
    if callable(getattr(base, "init_model_from_pretrained", None)) and not callable(
        getattr(base, "train_step", None)
    ):  # PolicyModelActor: its ActorPPOTrainer is made in init_model_from_pretrained
        body["init_model_from_pretrained"] = init_model_from_pretrained
    else:
        body["__init__"] = __init__
    cls = type(base.__name__, (base,), body)
    if base is trainer_class:
        return cls
    import ray

    return ray.remote(cls)
