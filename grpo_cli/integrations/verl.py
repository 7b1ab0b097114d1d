"""Record a verl run for grpo-cli: each step's actor-update batch, in the recorded-run layout.

Two ways in (verl 0.9.1):

- :func:`write_batch` writes one batch — a ``DataProto``, the padded ``TensorDict`` of
  ``DataProto.to_tensordict()``, or a plain dict of tensors — as
  ``DIR/step_{N:06d}/rank{r:03d}-mb{k:03d}.parquet`` (plus ``meta.json`` once, and the
  step's ``_DONE`` after its last micro-batch);
- :func:`install` makes a ``RayPPOTrainer`` (or subclass) write every recorded step by
  itself: ``install(trainer, "runs/exp1")`` before ``trainer.fit()``.

Fields read, under verl's names (``verl/trainer/ppo/ray_trainer.py``, ``fit``)::

    response_mask                  (N, L)  the loss mask            -> mask
    uid                            (N,)    the prompt's group       -> group ("g{step}-{uid}")
    token_level_scores | _rewards  (N, L)  Σ over the row           -> reward
    advantages                     (N, L)  per answer if constant   -> advantage
    old_log_probs                  (N, L)                           -> old_logp
    ref_log_prob                   (N, L)                           -> ref_logp
    rollout_log_probs              (N, L)                           -> rollout_logp
    entropys                       (N, L)                           -> entropy
    log_probs                      (N, L)  the current policy       -> logp
    responses                      (N, L)  token ids, decoded with a tokenizer -> completion

The reward is ``token_level_scores`` (the task reward) when present, else
``token_level_rewards``, summed over the whole row as ``compute_grpo_outcome_advantage``
sums the token rewards it is given (``core_algos.py``: ``sum(dim=-1)``, masked positions
included; verl's reward managers put the score on the last valid token), as grpo-cli's
readers sum per-token rewards. With ``algorithm.use_kl_in_reward`` the two differ by
β·KL(old, ref) per token, which grpo-cli's ``--kl-mode reward`` computes from
``old_logp`` and ``ref_logp`` as ``apply_kl_penalty`` does; which one was written is the
file's ``reward_source``. verl's advantages are ``(N, L)``: they are written per answer
when constant over each answer's valid tokens (GRPO, RLOO, ...: the score times the
mask), else as per-token lists.

What :func:`install` hooks: ``RayPPOTrainer._update_actor(batch)`` (verl 0.9.1,
``ray_trainer.py`` line 1327, called by ``fit`` at line 1690), wrapped on the instance.
There the batch holds every field above except the current ``log_probs`` and
``entropys``: verl computes those inside the actor workers' loss
(``workers/utils/losses.py``, ``ppo_loss``) and ``fit`` drops the old-policy entropy
before the update. So a recorded step is the whole batch the update was given (all
data-parallel ranks, every mini-batch and epoch), one file, and ``logp`` is absent.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _args
from ._gate import CheckFailedWarning, Gate, check_config
from ._writer import Guard, RunWriter, rollout_table

if TYPE_CHECKING:
    from ..records import CheckReport

__all__ = [
    "CONFIG_KEYS",
    "TOKEN_FIELDS",
    "CheckFailedWarning",
    "config_items",
    "install",
    "write_batch",
]

TRAINER = "verl"

# Every convention the loss, the advantages and the logged metrics depend on, as dotted
# paths of verl 0.9.1's trainer config (trainer/config/_generated_ppo_trainer.yaml and the
# dataclasses AlgoConfig, RolloutCorrectionConfig, ActorConfig, PolicyLossConfig).
_ACTOR = "actor_rollout_ref.actor"
CONFIG_KEYS: tuple[str, ...] = (
    "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.gamma",
    "algorithm.lam",
    "algorithm.use_kl_in_reward",
    "algorithm.kl_penalty",
    "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.kl_coef",
    "algorithm.kl_ctrl.horizon",
    "algorithm.kl_ctrl.target_kl",
    "algorithm.filter_groups.enable",
    "algorithm.filter_groups.metric",
    "algorithm.rollout_correction.rollout_is",
    "algorithm.rollout_correction.rollout_is_threshold",
    "algorithm.rollout_correction.rollout_is_batch_normalize",
    "algorithm.rollout_correction.rollout_rs",
    "algorithm.rollout_correction.rollout_rs_threshold",
    "algorithm.rollout_correction.bypass_mode",
    "algorithm.rollout_correction.loss_type",
    f"{_ACTOR}.strategy",
    f"{_ACTOR}.clip_ratio",
    f"{_ACTOR}.clip_ratio_low",
    f"{_ACTOR}.clip_ratio_high",
    f"{_ACTOR}.clip_ratio_c",
    f"{_ACTOR}.tau_pos",
    f"{_ACTOR}.tau_neg",
    f"{_ACTOR}.loss_agg_mode",
    f"{_ACTOR}.loss_scale_factor",
    f"{_ACTOR}.policy_loss.loss_mode",
    f"{_ACTOR}.policy_loss.clip_cov_ratio",
    f"{_ACTOR}.policy_loss.clip_cov_lb",
    f"{_ACTOR}.policy_loss.clip_cov_ub",
    f"{_ACTOR}.policy_loss.kl_cov_ratio",
    f"{_ACTOR}.policy_loss.ppo_kl_coef",
    f"{_ACTOR}.policy_loss.dro_beta",
    f"{_ACTOR}.entropy_coeff",
    f"{_ACTOR}.calculate_entropy",
    f"{_ACTOR}.use_kl_loss",
    f"{_ACTOR}.kl_loss_coef",
    f"{_ACTOR}.kl_loss_type",
    f"{_ACTOR}.ppo_epochs",
    f"{_ACTOR}.ppo_mini_batch_size",
    f"{_ACTOR}.ppo_micro_batch_size",
    f"{_ACTOR}.ppo_micro_batch_size_per_gpu",
    f"{_ACTOR}.use_dynamic_bsz",
    f"{_ACTOR}.ppo_max_token_len_per_gpu",
    f"{_ACTOR}.shuffle",
    f"{_ACTOR}.data_loader_seed",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.rollout.top_k",
    "actor_rollout_ref.rollout.calculate_log_probs",
    "actor_rollout_ref.rollout.logprobs_mode",
    "actor_rollout_ref.rollout.name",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.balance_batch",
    "trainer.critic_warmup",
)

# verl's batch key -> grpo-cli's token column
TOKEN_FIELDS: tuple[tuple[str, str], ...] = (
    ("log_probs", "logp"),
    ("old_log_probs", "old_logp"),
    ("ref_log_prob", "ref_logp"),
    ("rollout_log_probs", "rollout_logp"),
    ("entropys", "entropy"),
)

_MISSING = object()

# The gate on a step recorded by install (no current log-probs): the policy at the start
# of the update stands for the current one, and the update's logged metrics are not judged.
NO_LOGP_COLUMNS = {"logp": "old_logp"}
NO_LOGP = (
    "not judged: the recorded step has no current log-probs (the trainer computes them "
    "inside its update), logp is read as old_logp, and the update's logged metrics come "
    "from the current ones"
)


# ------------------------------------------------------------------ reading a batch
def _unwrap(value: Any) -> Any:
    """A TensorDict's non-tensor entry as plain Python: ``NonTensorStack`` -> list,
    ``NonTensorData`` -> its value; anything else unchanged."""
    kind = type(value).__name__
    if kind == "NonTensorStack":
        return value.tolist()
    if kind == "NonTensorData":
        return value.data
    return value


def _getter(batch: Any) -> Callable[[str], Any]:
    """``get(key)`` over a DataProto (tensors, then non-tensors), a TensorDict or a
    mapping; ``None`` for an absent key."""
    if hasattr(batch, "non_tensor_batch") and hasattr(batch, "batch"):  # DataProto
        tensors, others = batch.batch, batch.non_tensor_batch

        def get(key: str) -> Any:
            if tensors is not None and key in tensors.keys():
                return tensors[key]
            return others.get(key)

        return get
    if hasattr(batch, "keys") and hasattr(batch, "get"):  # TensorDict, dict

        def get(key: str) -> Any:
            return _unwrap(batch.get(key)) if key in batch.keys() else None

        return get
    raise TypeError(
        f"batch: expected a verl DataProto, a TensorDict or a dict of tensors, got "
        f"{type(batch).__name__}"
    )


def _array(value: Any, name: str) -> np.ndarray:
    """A tensor or array as numpy on the CPU, without a copy when it is one already
    (callers only read it). float16 and bfloat16 (which numpy lacks) become float32;
    float32 stays float32 (what the trainers hold; sums are taken in float64 later)."""
    if hasattr(value, "detach"):  # torch.Tensor
        if getattr(value, "is_nested", False):
            raise ValueError(
                f"{name}: a nested (no-padding) tensor; record the padded batch "
                "(verl's DataProto, or no_padding_2_padding first)"
            )
        t = value.detach().cpu()
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()
        return np.asarray(t.numpy())
    return np.asarray(value)


def _token_array(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    a = _array(value, name)
    if a.shape != shape:
        raise ValueError(f"{name}: shape {a.shape}, but response_mask is {shape}")
    return a


def _mask(get: Callable[[str], Any]) -> np.ndarray:
    """The loss mask: ``response_mask``, else the response part of ``attention_mask`` (as
    verl's ``compute_response_mask``)."""
    m = get("response_mask")
    if m is not None:
        mask = _array(m, "response_mask")
    else:
        attention, responses = get("attention_mask"), get("responses")
        if attention is None or responses is None:
            raise ValueError(
                "response_mask: absent, and attention_mask/responses to derive it are too"
            )
        width = _array(responses, "responses").shape[-1]
        mask = _array(attention, "attention_mask")[:, -width:]
    if mask.ndim != 2:
        raise ValueError(f"response_mask: expected (N, L), got shape {mask.shape}")
    return mask.astype(bool)


def per_answer(values: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
    """The answers' values when each answer's ``(N, L)`` values are one number over its
    valid tokens (exactly: max == min), else ``None``. An answer without valid tokens
    gets 0.

    >>> m = np.array([[1, 1, 0], [0, 1, 1]], bool)
    >>> per_answer(np.array([[2.0, 2.0, 0.0], [-1.0, 5.0, 5.0]]), m)
    array([2., 5.])
    >>> per_answer(np.array([[1.0, 2.0]]), np.ones((1, 2), bool)) is None
    True
    """
    lo = np.where(mask, values, np.inf).min(axis=1)
    hi = np.where(mask, values, -np.inf).max(axis=1)
    empty = ~mask.any(axis=1)
    if not np.all((lo == hi) | empty):
        return None
    return np.where(empty, 0.0, lo)


def _completions(
    get: Callable[[str], Any], mask: np.ndarray, tokenizer: Any | None
) -> list[str] | None:
    """Decoded answers: a ``completion`` entry of the batch, else ``responses`` decoded
    with ``tokenizer`` over the response part of ``attention_mask`` (the mask when
    absent), ``skip_special_tokens`` as verl's ``_log_rollout_data`` decodes."""
    given = get("completion")
    if given is not None:
        return [str(x) for x in list(given)]
    responses = get("responses")
    if tokenizer is None or responses is None:
        return None
    ids = _array(responses, "responses")
    attention = get("attention_mask")
    valid = mask if attention is None else _array(attention, "attention_mask")[:, -ids.shape[1] :]
    rows = [ids[i][valid[i].astype(bool)].tolist() for i in range(ids.shape[0])]
    return [str(t) for t in tokenizer.batch_decode(rows, skip_special_tokens=True)]


def batch_table(
    batch: Any,
    step: int,
    *,
    log_probs: Any = None,
    entropys: Any = None,
    tokenizer: Any = None,
    token_dtype: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """A verl batch as grpo-cli's table (one row per answer) and the file's metadata."""
    get = _getter(batch)
    mask = _mask(get)
    shape = mask.shape
    uid = get("uid")
    if uid is None:
        raise ValueError("uid: absent; verl's fit() adds one per prompt (the GRPO group)")
    uids = [str(u) for u in list(uid)]
    if len(uids) != shape[0]:
        raise ValueError(f"uid: {len(uids)} ids for {shape[0]} answers")
    info: dict[str, Any] = {"answers": shape[0], "tokens": int(mask.sum()), "width": shape[1]}

    reward = None
    for key in ("token_level_scores", "token_level_rewards"):
        r = get(key)
        if r is not None:
            r = _token_array(r, key, shape).astype(np.float64)
            reward = r.sum(axis=1)  # verl: token_level_rewards.sum(dim=-1), no mask
            info["reward_source"] = key
            break
    advantage = None
    a = get("advantages")
    if a is not None:
        a = _token_array(a, "advantages", shape)
        advantage = per_answer(a, mask)
        info["advantage_source"] = "per answer" if advantage is not None else "per token"
        if advantage is None:
            advantage = np.where(mask, a, 0.0)
    tokens: dict[str, np.ndarray | None] = {}
    given = {"log_probs": log_probs, "entropys": entropys}
    for key, column in TOKEN_FIELDS:
        value = given.get(key)
        value = get(key) if value is None else value
        if value is not None:
            tokens[column] = np.where(mask, _token_array(value, key, shape), 0.0)
    table = rollout_table(
        group=[f"g{step:06d}-{u}" for u in uids],
        reward=reward,
        advantage=advantage,
        mask=mask,
        tokens=tokens,
        completion=_completions(get, mask, tokenizer),
        token_dtype=token_dtype,
    )
    return table, info


# ------------------------------------------------------------------------- config
def _plain_config(value: Any) -> Any:
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _select(config: Any, key: str) -> Any:
    if isinstance(config, Mapping) and key in config:  # already flat
        return _plain_config(config[key])
    node = config
    for part in key.split("."):
        if hasattr(node, "keys") and part in node.keys():
            node = node[part]
        elif not hasattr(node, "keys") and hasattr(node, part):  # a dataclass
            node = getattr(node, part)
        else:
            return _MISSING
    return _plain_config(node)


def config_items(config: Any) -> dict[str, Any]:
    """The :data:`CONFIG_KEYS` present in ``config`` (an OmegaConf ``DictConfig``, a
    nested dict, dataclasses, or a dict already keyed by dotted paths), by dotted path;
    absent keys are left out (``null`` is a value: e.g. ``loss_scale_factor``)."""
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        try:
            value = _select(config, key)
        except Exception:  # an interpolation that does not resolve: not a value to record
            continue
        if value is not _MISSING:
            out[key] = value
    return out


def _trainer_version() -> str | None:
    try:
        return _pkg_version("verl")
    except PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- writing
_runs: dict[tuple[str, int], tuple[RunWriter, Guard]] = {}


def _run(
    directory: str | os.PathLike[str], config: Any, rank: int, world_size: int
) -> tuple[RunWriter, Guard]:
    key = (os.path.abspath(directory), rank)
    if key not in _runs:
        writer = RunWriter(
            directory,
            trainer=TRAINER,
            trainer_version=_trainer_version(),
            config=config_items(config) if config is not None else {},
            rank=rank,
            world_size=world_size,
        )
        _runs[key] = (writer, Guard(TRAINER))
    return _runs[key]


def write_batch(
    batch: Any,
    directory: str | os.PathLike[str],
    step: int,
    *,
    config: Any = None,
    micro_batch: int = 0,
    micro_batches: int = 1,
    rank: int = 0,
    world_size: int = 1,
    log_probs: Any = None,
    entropys: Any = None,
    tokenizer: Any = None,
    token_dtype: Any = None,
) -> Path | None:
    """Write one verl batch as ``DIR/step_{step:06d}/rank{rank:03d}-mb{micro_batch:03d}.parquet``.

    ``batch`` is a ``DataProto``, the padded ``TensorDict`` of ``DataProto.to_tensordict()``
    or a dict of ``(N, L)`` tensors and an ``(N,)`` ``uid`` (fields: module docstring);
    ``log_probs`` / ``entropys`` give the current policy's values when the batch has none.
    ``config`` (the run's OmegaConf config or a dict) goes into ``meta.json`` (written once
    per directory, by rank 0) as :func:`config_items`. After micro-batch
    ``micro_batches - 1`` the step's ``_DONE`` marker (``_DONE.rank{r:03d}`` when
    ``world_size`` > 1) is written. ``token_dtype`` is None (each token field keeps the
    width the batch holds it in: float64 as float64, float32 as float32, bfloat16 and
    float16 widened to float32) or a pyarrow type for every token list
    (``pyarrow.float32()``, ``pyarrow.float64()``). Without ``log_probs`` and without
    the batch's own current log-probs the step is read as its first update, on-policy
    (logp = old_logp), as verl's first update computes it.

    Required: ``batch``, ``directory``, ``step`` (an integer >= 0); ``micro_batch`` is
    below ``micro_batches`` and ``rank`` below ``world_size``.

    Never raises: a failure, a wrong argument too, is one ``RuntimeWarning`` naming
    grpo-cli and the reason, and later calls for the same directory and rank write
    nothing. Returns the file written, or ``None``.
    """
    try:
        _args.directory("directory", directory)
        _args.count("step", step, least=0)
        _args.index("micro_batch", micro_batch, _args.count("micro_batches", micro_batches),
                    "micro_batches")  # fmt: skip
        _args.index("rank", rank, _args.count("world_size", world_size), "world_size")
        _args.token_type("token_dtype", token_dtype)
    except (TypeError, ValueError) as exc:
        warnings.warn(f"grpo-cli: write_batch: {exc}; nothing written", RuntimeWarning, 2)
        return None
    writer, guard = _run(directory, config, rank, world_size)

    def write() -> Path:
        table, info = batch_table(
            batch,
            step,
            log_probs=log_probs,
            entropys=entropys,
            tokenizer=tokenizer,
            token_dtype=token_dtype,
        )
        return writer.write_call(step, micro_batch, micro_batches, table, info)

    return guard.run(write)


# --------------------------------------------------------------------------- install
class _Recorder:
    """What :func:`install` puts on a trainer: the writer, its guard and the options."""

    def __init__(
        self,
        trainer: Any,
        directory: str | os.PathLike[str],
        every_steps: int,
        tokenizer: Any,
        token_dtype: Any,
        original: Callable[[Any], Any],
    ) -> None:
        self.every_steps = every_steps
        self.tokenizer = tokenizer
        self.token_dtype = token_dtype
        self.original = original
        self.guard = Guard(TRAINER)
        self.writer: RunWriter | None = None
        self.trainer = trainer
        self.directory = directory
        self.gate: Gate | None = None

    def _writer(self) -> RunWriter:
        if self.writer is None:
            self.writer = RunWriter(
                self.directory,
                trainer=TRAINER,
                trainer_version=_trainer_version(),
                config=config_items(getattr(self.trainer, "config", None) or {}),
            )
        return self.writer

    def before(self, batch: Any, step: int) -> None:
        table, info = batch_table(
            batch, step, tokenizer=self.tokenizer, token_dtype=self.token_dtype
        )
        info["micro_batches"] = 1
        info["scope"] = (
            "the batch RayPPOTrainer._update_actor was given: the whole step (every "
            "data-parallel rank, mini-batch and epoch); the current log-probs are computed "
            "inside the actor workers and are not recorded"
        )
        self._writer().write_micro_batch(step, 0, table, info)

    def after(self, output: Any, step: int) -> None:
        metrics = getattr(output, "meta_info", {}).get("metrics")
        if metrics:
            from verl.utils.metric import reduce_metrics  # what fit() logs them through

            reduced = reduce_metrics(dict(metrics))  # a copy: reduce_metrics writes into it
            self._writer().append_metrics({"step": step, **reduced})
        self._writer().finish_step(step)

    def gate_step(self, gate: Gate, output: Any, step: int) -> None:
        """Check the step; its numbers into the update's metrics; a stop as verl's last step
        being the next one (module docstring)."""
        verdict = gate.step_written(self._writer().step_dir(step), step, logged=True)
        if verdict is None:
            return
        output.meta_info["metrics"].update(verdict.numbers)
        if verdict.stop:
            total = getattr(self.trainer, "total_training_steps", None)
            last = step + 1 if not isinstance(total, int) else min(total, step + 1)
            self.trainer.total_training_steps = last


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
) -> Any:
    """Make a verl ``RayPPOTrainer`` record every ``every_steps``-th step under ``directory``.

    Wraps the instance's ``_update_actor`` (verl 0.9.1 ``ray_trainer.py``, called once per
    step by ``fit``): before it runs, the batch it is given is written as
    ``step_{global_steps:06d}/rank000-mb000.parquet`` (``meta.json`` from
    ``trainer.config`` at the first one); after it returns, the actor's metrics, reduced
    with verl's ``reduce_metrics`` as ``fit`` reduces them, are one line of
    ``metrics.jsonl`` and the step's ``_DONE`` is written. Answers are decoded with
    ``tokenizer`` (default: ``trainer.tokenizer``). The update itself is untouched: its
    batch is read, never changed, and its output is returned as it is. A recording
    failure is one ``RuntimeWarning`` and recording stops; training goes on. Returns
    ``trainer``. Installing again replaces the previous recorder.

    ``check`` (``True`` or a check config file) checks every recorded step after its
    ``_DONE``, logs the gate's numbers with the actor's metrics, and with
    ``stop_on_fail`` makes the next step verl's last (module docstring: "The gate");
    ``on_check(step, report)`` gets each step's check report. A failing rule is one
    ``CheckFailedWarning``; an exception in the gate is one ``RuntimeWarning`` and turns
    the gate off (recording goes on).

    Required: ``trainer`` (a ``RayPPOTrainer`` after ``init_workers()``) and
    ``directory`` (a path). Raises ``TypeError`` or ``ValueError`` naming the argument
    (``every_steps`` not an integer >= 1, ``token_dtype`` not None or a pyarrow float
    type, ``check`` not a bool or a path, ``on_check`` not callable, a trainer without
    ``_update_actor``), before training starts.

    Example::

        trainer = RayPPOTrainer(config=config, ...)
        trainer.init_workers()
        grpo_cli.integrations.verl.install(trainer, "runs/exp1")
        trainer.fit()
    """
    _args.directory("directory", directory)
    _args.count("every_steps", every_steps)
    _args.token_type("token_dtype", token_dtype)
    _args.check_option(check)
    _args.flag("stop_on_fail", stop_on_fail)
    _args.function("on_check", on_check)
    if stop_on_fail and not check:
        raise ValueError("stop_on_fail: needs check=True or a check config file")
    config = check_config(check)
    update = getattr(trainer, "_update_actor", None)
    if not callable(update):
        raise TypeError(
            f"install: {type(trainer).__name__} has no _update_actor method "
            "(expected verl's RayPPOTrainer, verl 0.9.1)"
        )
    previous = getattr(trainer, "_grpo_cli_recorder", None)
    if isinstance(previous, _Recorder):
        update = previous.original
    if tokenizer is None:
        tokenizer = getattr(trainer, "tokenizer", None)
    recorder = _Recorder(trainer, directory, every_steps, tokenizer, token_dtype, update)
    if config is not None:
        recorder.gate = Gate(
            config,
            trainer=TRAINER,
            stop_on_fail=stop_on_fail,
            on_check=on_check,
            how_stopped="verl's fit() ends after the next step (trainer.total_training_steps "
            "lowered: verl decides is_last_step before a step generates)",
            column_map=NO_LOGP_COLUMNS,
            no_logged=NO_LOGP,
        )

    def _update_actor(batch: Any) -> Any:
        step = getattr(trainer, "global_steps", None)
        if not isinstance(step, int):
            return recorder.original(batch)
        record = recorder.guard.active and step % recorder.every_steps == 0
        if record:
            recorder.guard.run(lambda: recorder.before(batch, step))
        output = recorder.original(batch)
        if record and recorder.guard.active:
            recorder.guard.run(lambda: recorder.after(output, step))
            gate = recorder.gate
            if gate is not None and gate.active and recorder.guard.active:
                gate.run(lambda: recorder.gate_step(gate, output, step), step)
        return output

    _update_actor.__wrapped__ = update  # type: ignore[attr-defined]
    trainer._update_actor = _update_actor
    trainer._grpo_cli_recorder = recorder
    return trainer
