"""Record an AReaL run for grpo-cli: each PPO update's micro-batches, in the recorded-run
layout.

One line, after the actor is made (AReaL 1.0.4, ``areal/engine/fsdp_engine.py``
``FSDPPPOActor``; any of its train engines' actors that has ``ppo_update``,
``train_batch`` and ``export_stats``)::

    from grpo_cli.integrations import areal as grpo_cli_areal
    grpo_cli_areal.install(actor, "runs/exp1")

What it wraps, on the instance (nothing AReaL computes changes):

- ``ppo_update(data)`` (``areal/trainer/ppo/actor.py`` ``PPOActor._ppo_update``): one call
  is one step; the trajectories it is given (after ``compute_advantages``) tell each
  answer's rollout position, reward and group, by its tokens;
- ``train_batch(input_, loss_fn, loss_weight_fn)``: each call of its ``loss_fn``
  (``grpo_loss_fn``: one micro-batch, packed, with ``cu_seqlens``) is written as
  ``step_N/rank{r:03d}-mb{k:03d}.parquet`` with the current log-probs and the entropy the
  loss was given, and of its ``input_data`` the proximal log-probs (``prox_logp``, the
  ratio's denominator: ``old_logp``), the advantages, the loss mask, the reference's
  (``ref_logp``) and, with ``use_decoupled_loss``, the behaviour policy's (``logprobs``:
  ``rollout_logp``); after ``ppo_update`` the step's ``_DONE``;
- ``export_stats()``: what it returns (what AReaL's trainer commits to its loggers) is one
  line of ``metrics.jsonl``, under the last step recorded since the previous export.

Groups: AReaL carries no group id; answers of a group are adjacent (``gconfig.n_samples``
of them, ``NormConfig.group_size``). ``group_size`` (else the ``adv_norm`` /
``reward_norm`` group size of the actor's config when one normalises by group, else one
group per trajectory dict of several rows) puts rollout position ``i`` into group
``i // group_size``. ``meta.json`` holds the ``PPOActorConfig`` fields of
:data:`CONFIG_KEYS` (NormConfigs flattened: ``adv_norm.mean_level``, ...).

Never stops training: a recording failure is one ``RuntimeWarning``, and recording is
off for the rest of the run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from typing import Any

import numpy as np

from . import _args
from ._writer import Guard, RunWriter, rollout_table
from .verl import _array, per_answer

__all__ = ["CONFIG_KEYS", "config_items", "install"]

TRAINER = "areal"

# The PPOActorConfig fields the loss, the advantages and the logged statistics depend on
# (areal/api/cli_args.py), by AReaL's own names
CONFIG_KEYS: tuple[str, ...] = (
    "ppo_n_minibatches",
    "eps_clip",
    "eps_clip_higher",
    "c_clip",
    "importance_sampling_level",
    "use_sapo_loss",
    "sapo_tau_pos",
    "sapo_tau_neg",
    "use_decoupled_loss",
    "recompute_logprob",
    "prox_logp_method",
    "m2_threshold",
    "kl_ctl",
    "kl_estimator",
    "discount",
    "gae_lambda",
    "reward_scaling",
    "reward_bias",
    "reward_clip",
    "mask_no_eos_with_zero",
    "overlong_reward_penalty",
    "temperature",
)
_NESTED = ("adv_norm", "reward_norm", "rejection_sampling")


def _token_fields(
    config: Any, logp: Any, entropy: Any, data: Mapping[str, Any]
) -> dict[str, np.ndarray | None]:
    """A packed micro-batch's per-token log-probs under the names grpo-cli reads: the ratio's
    denominator as ``old_logp`` (the proximal policy's, else the behaviour's; SAPO's
    ``sapo_loss_fn`` takes its ratio against the behaviour's ``logprobs``), the behaviour's
    as ``rollout_logp`` under decoupled PPO."""
    fields: dict[str, np.ndarray | None] = {
        "logp": _array(logp, "logprobs").reshape(-1),
        "entropy": None if entropy is None else _array(entropy, "entropy").reshape(-1),
    }
    prox = data.get("prox_logp")
    behave = _array(data["logprobs"], "logprobs").reshape(-1)
    fields["old_logp"] = behave if prox is None else _array(prox, "prox_logp").reshape(-1)
    if getattr(config, "use_sapo_loss", False):
        fields["old_logp"], prox = behave, None
    decoupled = bool(getattr(config, "use_decoupled_loss", False))
    fields["rollout_logp"] = behave if decoupled and prox is not None else None
    ref = data.get("ref_logp")
    fields["ref_logp"] = None if ref is None else _array(ref, "ref_logp").reshape(-1)
    return fields


def _config(actor: Any) -> Any:
    return getattr(actor, "config", None) or getattr(getattr(actor, "actor", None), "config", None)


def _section(sub: Any, name: str) -> dict[str, Any]:
    """The fields of a nested config (a NormConfig: a dataclass, a dict or a namespace)."""
    if isinstance(sub, Mapping):
        return dict(sub)
    if dataclasses.is_dataclass(sub) and not isinstance(sub, type):
        return dataclasses.asdict(sub)
    if hasattr(sub, "__dict__") and not callable(sub):
        return dict(vars(sub))
    raise TypeError(
        f"config.{name}: expected a NormConfig (a dataclass), a dict or None, got "
        f"{sub!r} ({type(sub).__name__})"
    )


def config_items(config: Any) -> dict[str, Any]:
    """The :data:`CONFIG_KEYS` of a ``PPOActorConfig`` (or a dict; None: none), and the
    fields of its ``adv_norm``, ``reward_norm`` and ``rejection_sampling`` as
    ``adv_norm.mean_level`` ... (left out when those are None).

    Raises:
      TypeError: ``config`` is a number, a string or a sequence, or one of its nested
        configs is not a dataclass, a dict or None (naming it).
    """
    if isinstance(config, str | bytes | int | float | list | tuple):
        raise TypeError(
            f"config: expected a PPOActorConfig, a dict or None, got {config!r} "
            f"({type(config).__name__})"
        )

    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)

    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        value = get(config, key)
        if value is not None or (isinstance(config, Mapping) and key in config):
            out[key] = value
    for name in _NESTED:
        sub = get(config, name)
        if sub is None:
            continue
        for key, value in _section(sub, name).items():
            out[f"{name}.{key}"] = value
    return out


def _version() -> str | None:
    try:
        return _pkg_version("areal")
    except PackageNotFoundError:
        return None


def _config_group_size(config: Any) -> int | None:
    """The group size of the config's ``adv_norm`` or ``reward_norm`` when it normalises
    by group (None: it does not); a size that is not an integer >= 1 is named."""
    items = config_items(config)
    for name in ("adv_norm", "reward_norm"):
        levels = (items.get(f"{name}.mean_level"), items.get(f"{name}.std_level"))
        if "group" in levels:
            return _args.count(f"config.{name}.group_size", items.get(f"{name}.group_size"))
    return None


def _rank() -> tuple[int, int]:
    """This process's rank and the world size (0 and 1 without torch.distributed)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _Recorder:
    """What :func:`install` keeps on the actor (module docstring)."""

    def __init__(self, actor: Any, directory: str | os.PathLike[str], every_steps: int,
                 group_size: int | None, tokenizer: Any, token_dtype: Any,
                 next_step: int) -> None:  # fmt: skip
        self.actor, self.directory = actor, directory
        self.every_steps, self.group_size = every_steps, group_size
        self.tokenizer, self.token_dtype = tokenizer, token_dtype
        self.next_step = next_step
        self.guard = Guard(TRAINER)
        self.writer: RunWriter | None = None
        self.step: int | None = None  # the step being recorded, set by ppo_update
        self.unlogged: int | None = None  # the last step written since export_stats
        self.calls = 0
        self.answers: dict[tuple[int, ...], tuple[int, float, str]] = {}

    def _writer(self) -> RunWriter:
        if self.writer is None:
            rank, world = _rank()
            self.writer = RunWriter(
                self.directory, trainer=TRAINER, trainer_version=_version(),
                config=config_items(_config(self.actor)), rank=rank, world_size=world,
            )  # fmt: skip
        return self.writer

    def start(self, data: Any, step: int) -> None:
        """Each answer of the update's trajectories by its tokens: (position, reward, group)."""
        trajectories = [data] if isinstance(data, Mapping) else list(data)
        size = self.group_size or _config_group_size(_config(self.actor))
        self.answers, position = {}, 0
        for k, traj in enumerate(trajectories):
            ids = _array(traj["input_ids"], "input_ids")
            att = _array(traj["attention_mask"], "attention_mask").astype(bool)
            reward = _array(traj["rewards"], "rewards").astype(np.float64).reshape(-1)
            ids, att = ids.reshape(-1, ids.shape[-1]), att.reshape(-1, att.shape[-1])
            for r in range(ids.shape[0]):
                if size is not None:
                    g = position // size
                else:
                    g = k if ids.shape[0] > 1 else position
                key = tuple(int(x) for x in ids[r][att[r]])
                if key in self.answers and self.answers[key][2] != f"g{step:06d}-p{g:05d}":
                    raise ValueError(
                        "two answers of different groups have the same tokens: their "
                        "groups cannot be told apart"
                    )
                self.answers[key] = (position, float(reward[r]), f"g{step:06d}-p{g:05d}")
                position += 1

    def record(self, logp: Any, entropy: Any, data: Mapping[str, Any], step: int) -> None:
        """One ``grpo_loss_fn`` call (a packed micro-batch) as one file."""
        cu = _array(data["cu_seqlens"], "cu_seqlens").astype(np.int64)
        ids = _array(data["input_ids"], "input_ids").reshape(-1)
        mask = _array(data["loss_mask"], "loss_mask").reshape(-1).astype(bool)
        config = _config(self.actor)
        fields = _token_fields(config, logp, entropy, data)
        adv = _array(data["advantages"], "advantages").reshape(-1)
        rows: list[tuple[int, int, tuple[int, float, str]]] = []
        for j in range(cu.shape[0] - 1):
            s, e = int(cu[j]), int(cu[j + 1])
            found = self.answers.get(tuple(int(x) for x in ids[s:e]))
            if found is None:
                if mask[s:e].any():
                    raise ValueError(
                        f"sequence {j} of a micro-batch was not among the trajectories "
                        "ppo_update was given"
                    )
                continue  # a padding sequence
            rows.append((s, e, found))
        width = max((e - s for s, e, _ in rows), default=0)
        padded_mask = np.zeros((len(rows), width), dtype=bool)
        for i, (s, e, _) in enumerate(rows):
            padded_mask[i, : e - s] = mask[s:e]

        def padded(values: np.ndarray | None) -> np.ndarray | None:
            if values is None:
                return None
            out = np.zeros((len(rows), width), dtype=values.dtype)
            for i, (s, e, _) in enumerate(rows):
                out[i, : e - s] = np.where(mask[s:e], values[s:e], 0)
            return out

        advantage = padded(adv)
        assert advantage is not None
        constant = per_answer(advantage, padded_mask)
        sequence = getattr(config, "importance_sampling_level", "token")
        if constant is None and sequence == "sequence":
            # GSPO: the loss takes each sequence's mean advantage for every token
            # (functional.py _compute_sequence_level_ratio_and_advantages)
            n = np.maximum(padded_mask.sum(axis=1), 1)
            constant = np.where(padded_mask, advantage, 0.0).sum(axis=1, dtype=np.float64) / n
        table = rollout_table(
            group=[f[2] for _, _, f in rows],
            reward=np.array([f[1] for _, _, f in rows], dtype=np.float64),
            advantage=advantage if constant is None else constant,
            mask=padded_mask,
            tokens={name: padded(v) for name, v in fields.items()},
            completion=self._completions(ids, padded_mask, rows),
            token_dtype=self.token_dtype,
        )
        info = {
            "answers": len(rows),
            "tokens": int(padded_mask.sum()),
            "positions": [f[0] for _, _, f in rows],
            "advantage_source": (
                "per token"
                if constant is None
                else "the sequence mean (GSPO)"
                if sequence == "sequence"
                else "per answer"
            ),
            "scope": (
                "one grpo_loss_fn call of FSDPPPOActor.train_batch: one packed micro-batch "
                "on one rank, with the current log-probs and entropy the loss was given"
            ),
        }
        self._writer().write_micro_batch(step, self.calls, table, info)
        self.calls += 1

    def _completions(self, ids: np.ndarray, mask: np.ndarray, rows: Sequence[Any]) -> Any:
        if self.tokenizer is None:
            return None
        # the loss mask at t marks the prediction of token t + 1 (compute_advantages rolls it)
        answers = [ids[s + 1 : e][mask[i, : e - s - 1]].tolist() for i, (s, e, _) in
                   enumerate(rows)]  # fmt: skip
        return [str(t) for t in self.tokenizer.batch_decode(answers, skip_special_tokens=True)]

    def logged(self, stats: Any) -> None:
        if self.unlogged is None or not isinstance(stats, Mapping):
            return
        keep = {k: v for k, v in stats.items() if isinstance(v, int | float | bool)}
        self._writer().append_metrics({"step": self.unlogged, **keep})
        self.unlogged = None


def _hook(actor: Any, rec: _Recorder, originals: tuple[Callable[..., Any], ...]) -> None:
    ppo_update_0, train_batch_0, export_stats_0 = originals

    def ppo_update(data: Any, *args: Any, **kwargs: Any) -> Any:
        step = rec.next_step
        rec.next_step += 1
        recording = rec.guard.active and step % rec.every_steps == 0
        rec.step, rec.calls = None, 0
        if recording:
            rec.guard.run(lambda: rec.start(data, step))
            if rec.guard.active:
                rec.step = step
        try:
            result = ppo_update_0(data, *args, **kwargs)
        finally:
            recorded, rec.step = rec.step, None
        if recorded is not None and rec.guard.active:
            rec.guard.run(lambda: rec._writer().finish_step(recorded))
            rec.unlogged = recorded
        return result

    def train_batch(input_: Any, loss_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        step = rec.step
        if step is None or not rec.guard.active:
            return train_batch_0(input_, loss_fn, *args, **kwargs)

        def recorded_loss(logprobs: Any, entropy: Any, input_data: Any, **kw: Any) -> Any:
            loss = loss_fn(logprobs, entropy, input_data, **kw)
            if rec.guard.active:  # _array detaches; nothing here can raise into the loss
                rec.guard.run(lambda: rec.record(logprobs, entropy, input_data, step))
            return loss

        return train_batch_0(input_, recorded_loss, *args, **kwargs)

    def export_stats(*args: Any, **kwargs: Any) -> Any:
        stats = export_stats_0(*args, **kwargs)
        if rec.guard.active:
            rec.guard.run(lambda: rec.logged(stats))
        return stats

    for name, fn, original in (("ppo_update", ppo_update, ppo_update_0),
                               ("train_batch", train_batch, train_batch_0),
                               ("export_stats", export_stats, export_stats_0)):  # fmt: skip
        vars(fn)["__wrapped__"] = original
        setattr(actor, name, fn)


def install(
    actor: Any,
    directory: str | os.PathLike[str],
    *,
    every_steps: int = 1,
    group_size: int | None = None,
    tokenizer: Any = None,
    token_dtype: Any = None,
    first_step: int = 1,
) -> Any:
    """Make an AReaL actor (``FSDPPPOActor``) record every ``every_steps``-th PPO update
    under ``directory`` (module docstring); returns ``actor``.

    The ``first_step``-th ``ppo_update`` call is step ``first_step``. ``group_size``: the
    answers of a group (module docstring, "Groups"). ``tokenizer`` (default: the actor's)
    decodes each answer into ``completion``. ``token_dtype``: None (each token field keeps
    its width) or a pyarrow float type. Installing twice replaces the first recorder.

    Raises ``TypeError`` or ``ValueError`` naming the argument before training starts
    (an actor without ``ppo_update``, ``train_batch`` and ``export_stats``,
    ``every_steps``, ``first_step`` or ``group_size`` not an integer >= 1, ``token_dtype``
    not None or a pyarrow float type, ``tokenizer`` without ``batch_decode``, the actor's
    config with a nested config that is not one or a group size that is not an integer
    >= 1); afterwards a recording failure (a directory that cannot be made, a full disk)
    is one ``RuntimeWarning``, recording stops, and training goes on.
    """
    _args.directory("directory", directory)
    _args.count("every_steps", every_steps)
    _args.count("first_step", first_step)
    if group_size is not None:
        _args.count("group_size", group_size)
    _args.token_type("token_dtype", token_dtype)
    missing = [n for n in ("ppo_update", "train_batch", "export_stats")
               if not callable(getattr(actor, n, None))]  # fmt: skip
    if missing:
        raise TypeError(
            f"install: {type(actor).__name__} has no {', '.join(missing)} (expected AReaL "
            "1.0.4's FSDPPPOActor)"
        )
    previous = getattr(actor, "_grpo_cli_recorder", None)
    if isinstance(previous, _Recorder):
        originals = tuple(
            getattr(actor, n).__wrapped__ for n in ("ppo_update", "train_batch", "export_stats")
        )
    else:
        originals = (actor.ppo_update, actor.train_batch, actor.export_stats)
    if tokenizer is None:  # the actor's, when it can decode
        tokenizer = getattr(actor, "tokenizer", None)
        tokenizer = tokenizer if callable(getattr(tokenizer, "batch_decode", None)) else None
    elif not callable(getattr(tokenizer, "batch_decode", None)):
        raise TypeError(
            f"tokenizer: expected None or a tokenizer with batch_decode, got "
            f"{type(tokenizer).__name__}"
        )
    if group_size is None:  # the config's groups, checked now rather than in a step
        _config_group_size(_config(actor))
    else:
        config_items(_config(actor))
    rec = _Recorder(actor, directory, every_steps, group_size, tokenizer, token_dtype, first_step)
    _hook(actor, rec, originals)
    actor._grpo_cli_recorder = rec
    return actor
