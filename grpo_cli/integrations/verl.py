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

What :func:`install` hooks (verl 0.9.1): ``RayPPOTrainer._update_actor(batch)``
(``ray_trainer.py`` line 1327, called by ``fit`` at line 1690), wrapped on the instance, and
the actor's loss function inside the actor workers. The batch ``_update_actor`` is given
holds every field above except the current ``log_probs`` and ``entropys``: verl computes
those inside the workers' loss (``workers/utils/losses.py``, ``ppo_loss``, called once per
micro-batch by the FSDP engine, ``workers/engine/fsdp/transformer_impl.py``), so a step
recorded from the batch alone has no ``logp`` and ``grpo-cli objective`` refuses it. Before
each update, :func:`install` gives the workers their loss again, wrapped
(``actor_rollout_wg.set_loss_fn``, a registered ONE_TO_ALL call, as ``init_model`` sets
it): :class:`LossRecorder` calls verl's ``ppo_loss`` unchanged, then writes its micro-batch
— the answers' fields above and the current log-probs and entropies the loss was given —
as ``rank{dp_rank:03d}-mb{k:03d}.parquet``, the k-th loss call of the step on that rank,
with the micro-batch's mini-batch and verl's loss normalisers (``batch_num_tokens``,
``global_batch_size``, ``dp_size``) in its metadata. After the update returns the step's
``_DONE`` markers (one per data-parallel rank) and the actor's metrics are written by the
driver. A trainer whose workers cannot take a loss function (no ``set_loss_fn``, or
distillation on) is recorded from the batch, as one file without ``logp``.
"""

from __future__ import annotations

import json
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
    # the rollout's and the reference's log-prob forward passes' micro-batches (against the
    # actor's: verl #6280, #2088, grpo_cli.causes)
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
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
        token_ids=_ids(get, shape),
    )
    return table, info


def _ids(get: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """``responses`` (the sampled tokens' ids) as ``(N, L)``, or None when absent or
    unreadable: optional, so never a reason to fail inside training."""
    try:
        r = get("responses")
        return None if r is None else _array(r, "responses").reshape(shape)
    except Exception:  # the ids are optional: the recording goes on
        return None


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


# ------------------------------------------------------- inside the actor workers
# the fields of a micro-batch the recorded file takes (besides the current log-probs)
_LOSS_FIELDS = (
    "response_mask",
    "old_log_probs",
    "advantages",
    "ref_log_prob",
    "rollout_log_probs",
    "token_level_scores",
    "token_level_rewards",
)


class LossRecorder:
    """verl's actor loss with each call's micro-batch recorded (module docstring).

    ``loss_fn`` is the loss the workers had (``partial(ppo_loss, config=ActorConfig)``);
    a call returns exactly what it returns. Then, unless ``step`` is None, the
    micro-batch the engine gave it (a no-padding ``TensorDict``) and the current
    ``log_probs`` / ``entropy`` of ``model_output`` are written, padded to the response
    width as ``ppo_loss`` pads them (``no_padding_2_padding``), as the ``k``-th file of
    the step on this data-parallel rank. Picklable: it travels to Ray workers.
    Recording never raises into the loss: a failure is one ``RuntimeWarning`` in the
    worker and this recorder writes nothing more.
    """

    def __init__(
        self,
        loss_fn: Callable[..., Any],
        directory: str | os.PathLike[str],
        step: int | None,
        *,
        config: Mapping[str, Any],
        tokenizer: Any = None,
        token_dtype: Any = None,
        epoch_answers: int | None = None,
    ) -> None:
        self.loss_fn = loss_fn
        # a rank's answers per epoch, given with several epochs: each epoch's pass over a
        # group is its own group in the files (epoch k's uid "e{k}-uid"), so that a step
        # of E epochs holds E copies of a group of n, not one group of E·n
        self.epoch_answers = epoch_answers
        self.directory = os.fspath(directory)
        self.step = step
        self.config = dict(config)
        self.tokenizer = tokenizer
        self.token_dtype = token_dtype
        self.calls = 0
        self.answers = 0  # answers seen on this rank: which mini-batch a call is in
        self.guard = Guard(TRAINER)

    def __call__(self, model_output: Any, data: Any, dp_group: Any = None) -> Any:
        out = self.loss_fn(model_output=model_output, data=data, dp_group=dp_group)
        if self.step is not None and self.guard.active:
            self.guard.run(lambda: self._record(model_output, data))
        return out

    def _record(self, model_output: Any, data: Any) -> None:
        import torch.distributed as dist
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        assert self.step is not None
        rank, world = 0, 1
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        dp = int(tu.get_non_tensor_data(data=data, key="dp_size", default=world) or 1)
        global_batch = tu.get_non_tensor_data(data=data, key="global_batch_size", default=None)
        tokens = tu.get_non_tensor_data(data=data, key="batch_num_tokens", default=None)
        keys = [k for k in _LOSS_FIELDS if k in data.keys()]
        padded = data.select(*keys).to_padded_tensor()
        fields: dict[str, Any] = {k: padded[k] for k in keys}
        fields["uid"] = _unwrap(data.get("uid")) if "uid" in data.keys() else None
        epoch = None
        if self.epoch_answers and fields["uid"] is not None:
            epoch = self.answers // self.epoch_answers
            fields["uid"] = [f"e{epoch}-{u}" for u in fields["uid"]]
        logp = no_padding_2_padding(model_output["log_probs"], data).detach()
        entropy = model_output.get("entropy", None)
        if entropy is not None:
            entropy = no_padding_2_padding(entropy, data).detach()
        if self.tokenizer is not None and "responses" in data.keys():
            responses = data["responses"]
            rows = responses.unbind() if responses.is_nested else list(responses)
            mask = fields["response_mask"].bool()
            fields["completion"] = self.tokenizer.batch_decode(
                [r[: int(m.sum())].tolist() for r, m in zip(rows, mask, strict=True)],
                skip_special_tokens=True,
            )
        table, info = batch_table(
            fields, self.step, log_probs=logp, entropys=entropy, token_dtype=self.token_dtype
        )
        n = int(info["answers"])
        per_rank = int(global_batch) // dp if isinstance(global_batch, int) and dp else 0
        info["mini_batch"] = self.answers // per_rank if per_rank > 0 else 0
        info["batch_num_tokens"] = None if tokens is None else int(tokens)
        info["global_batch_size"] = global_batch
        info["dp_size"] = dp
        if epoch is not None:
            info["epoch"] = epoch
        info["scope"] = (
            "one call of verl's actor loss (ppo_loss): one micro-batch of one mini-batch on "
            "one data-parallel rank, with the current log-probs the loss was given"
        )
        writer = RunWriter(
            self.directory,
            trainer=TRAINER,
            trainer_version=_trainer_version(),
            config=self.config,
            rank=rank,
            world_size=world,
        )
        writer._meta_written = True  # the driver writes meta.json (install)
        writer.write_micro_batch(self.step, self.calls, table, info)
        self.calls += 1
        self.answers += n


def actor_loss(config: Any) -> Callable[..., Any] | None:
    """The loss verl 0.9.1's actor workers build in ``ActorRolloutRefWorker.init_model``
    (``workers/engine_workers.py``): ``partial(ppo_loss, config=ActorConfig)`` from
    ``actor_rollout_ref.actor``; None with distillation on (its loss is another)."""
    from functools import partial

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    distillation = config.get("distillation") if hasattr(config, "get") else None
    if distillation is not None and distillation.get("enabled", False):
        return None
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    return partial(ppo_loss, config=actor_config)


# --------------------------------------------------------------------------- install
class _Recorder:
    """What :func:`install` puts on a trainer: the writer, its guard and the options;
    ``loss_fn`` the workers' loss to wrap (None: the step is recorded from the batch)."""

    def __init__(
        self,
        trainer: Any,
        directory: str | os.PathLike[str],
        every_steps: int,
        tokenizer: Any,
        token_dtype: Any,
        original: Callable[[Any], Any],
        loss_fn: Callable[..., Any] | None = None,
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
        self.loss_fn = loss_fn
        self.wrapped = False  # the workers hold a LossRecorder
        group = getattr(trainer, "actor_rollout_wg", None)
        size = getattr(group, "world_size", 1) if loss_fn is not None else 1
        self.world_size = size if isinstance(size, int) and size >= 1 else 1

    def _writer(self) -> RunWriter:
        if self.writer is None:
            self.writer = RunWriter(
                self.directory,
                trainer=TRAINER,
                trainer_version=_trainer_version(),
                config=config_items(getattr(self.trainer, "config", None) or {}),
                world_size=self.world_size,
            )
        return self.writer

    def set_loss(self, step: int | None, epoch_answers: int | None = None) -> None:
        """The workers' loss for the coming update: recording ``step`` (a
        :class:`LossRecorder`), or verl's own when ``step`` is None and a recorder is on."""
        assert self.loss_fn is not None
        group = self.trainer.actor_rollout_wg
        if step is None:
            if self.wrapped:
                group.set_loss_fn(self.loss_fn)
                self.wrapped = False
            return
        writer = self._writer()
        writer.write_meta()
        recorder = LossRecorder(
            self.loss_fn,
            self.directory,
            step,
            config=writer.meta["config"],
            tokenizer=self.tokenizer,
            token_dtype=self.token_dtype,
            epoch_answers=epoch_answers,
        )
        group.set_loss_fn(recorder)
        self.wrapped = True

    def before(self, batch: Any, step: int) -> None:
        if self.loss_fn is not None:
            self.expected = len(batch)  # answers per epoch: the files must hold them all
            per_rank = len(batch) // self.world_size
            self.set_loss(step, per_rank if self._epochs() > 1 else None)
            return
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

    def _epochs(self) -> int:
        epochs = _select(getattr(self.trainer, "config", {}), f"{_ACTOR}.ppo_epochs")
        return epochs if isinstance(epochs, int) and epochs >= 1 else 1

    def _check_files(self, step: int) -> None:
        """Every answer of every epoch is in the workers' files (a worker whose recording
        failed wrote fewer): else no ``_DONE``, and recording stops."""
        import pyarrow.parquet as pq

        epochs = self._epochs()
        got = 0
        for path in sorted(self._writer().step_dir(step).glob("rank*-mb*.parquet")):
            md = pq.read_schema(path).metadata or {}
            got += int(json.loads(md[b"grpo_cli"])["answers"])
        if got != self.expected * epochs:
            raise RuntimeError(
                f"step {step}: the actor workers' files hold {got} answers, the update had "
                f"{self.expected} × {epochs} epoch(s) (a worker's recording failed: its "
                "warning is in that worker's log)"
            )

    def after(self, output: Any, step: int) -> None:
        if self.loss_fn is not None:
            self._check_files(step)
        metrics = getattr(output, "meta_info", {}).get("metrics")
        if metrics:
            from verl.utils.metric import reduce_metrics  # what fit() logs them through

            reduced = reduce_metrics(dict(metrics))  # a copy: reduce_metrics writes into it
            self._writer().append_metrics({"step": step, **reduced})
        for rank in range(self.world_size):  # the update has returned: every rank is done
            marker = RunWriter(
                self.directory, trainer=TRAINER, trainer_version=None, config={},
                rank=rank, world_size=self.world_size,
            )  # fmt: skip
            marker.finish_step(step)

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


def _loss_of(trainer: Any) -> Callable[..., Any] | None:
    """The workers' loss :func:`install` wraps, or None (module docstring)."""
    group = getattr(trainer, "actor_rollout_wg", None)
    config = getattr(trainer, "config", None)
    if group is None or not callable(getattr(group, "set_loss_fn", None)) or config is None:
        return None
    try:
        return actor_loss(config)
    except Exception:  # not verl 0.9.1's config or worker: record the batch
        return None


def _restore(recorder: _Recorder) -> None:
    """The workers' loss back to verl's own; a failure is a warning, never the run's."""
    try:
        recorder.set_loss(None)
    except Exception as exc:
        import warnings

        warnings.warn(
            f"grpo-cli: giving the verl actor workers their own loss back failed "
            f"({type(exc).__name__}: {exc})",
            RuntimeWarning,
            stacklevel=3,
        )
        recorder.wrapped = False


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
    step by ``fit``) and, through ``actor_rollout_wg.set_loss_fn``, the actor workers' loss
    (module docstring): each loss call of a recorded step writes its micro-batch with the
    current log-probs as ``step_{global_steps:06d}/rank{r:03d}-mb{k:03d}.parquet``
    (``meta.json`` from ``trainer.config`` at the first step); after the update returns,
    the actor's metrics, reduced with verl's ``reduce_metrics`` as ``fit`` reduces them,
    are one line of ``metrics.jsonl`` and the step's ``_DONE`` markers are written, once
    the files are checked to hold every answer of every epoch. Without a loss to wrap, the
    batch ``_update_actor`` is given is written instead, as ``rank000-mb000.parquet``
    (no ``logp``). Answers are decoded with ``tokenizer`` (default: ``trainer.tokenizer``).
    The update itself is untouched: its batch is read, never changed, verl's own loss
    computes the step, and its output is returned as it is. A recording failure is one
    ``RuntimeWarning`` and recording stops (the workers get verl's loss back); training
    goes on. Returns ``trainer``. Installing again replaces the previous recorder.

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
    _install_args(directory, every_steps, token_dtype, check, stop_on_fail, on_check)
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
        if previous.wrapped:
            _restore(previous)
    if tokenizer is None:
        tokenizer = getattr(trainer, "tokenizer", None)
    loss_fn = _loss_of(trainer)
    recorder = _Recorder(trainer, directory, every_steps, tokenizer, token_dtype, update, loss_fn)
    if config is not None:
        no_logp = loss_fn is None  # recorded from the batch: no current log-probs
        recorder.gate = Gate(
            config, trainer=TRAINER, stop_on_fail=stop_on_fail, on_check=on_check,
            how_stopped="verl's fit() ends after the next step (trainer.total_training_steps "
            "lowered: verl decides is_last_step before a step generates)",
            column_map=NO_LOGP_COLUMNS if no_logp else None,
            no_logged=NO_LOGP if no_logp else None,
        )  # fmt: skip

    trainer._update_actor = _hooked(trainer, recorder, update)
    trainer._grpo_cli_recorder = recorder
    return trainer


def _install_args(
    directory: Any, every_steps: Any, token_dtype: Any, check: Any, stop_on_fail: Any,
    on_check: Any,
) -> None:  # fmt: skip
    """:func:`install`'s arguments, checked (``TypeError``/``ValueError`` naming one)."""
    _args.directory("directory", directory)
    _args.count("every_steps", every_steps)
    _args.token_type("token_dtype", token_dtype)
    _args.check_option(check)
    _args.flag("stop_on_fail", stop_on_fail)
    _args.function("on_check", on_check)
    if stop_on_fail and not check:
        raise ValueError("stop_on_fail: needs check=True or a check config file")


def _hooked(trainer: Any, recorder: _Recorder, update: Any) -> Any:
    """The trainer's ``_update_actor`` wrapped: each recorded step's loss calls written
    (:meth:`_Recorder.before` / ``after``), the gate run after it."""

    def _update_actor(batch: Any) -> Any:
        step = getattr(trainer, "global_steps", None)
        if not isinstance(step, int):
            return recorder.original(batch)
        record = recorder.guard.active and step % recorder.every_steps == 0
        if record:
            recorder.guard.run(lambda: recorder.before(batch, step))
        elif recorder.wrapped:
            _restore(recorder)
        output = recorder.original(batch)
        if recorder.wrapped and not recorder.guard.active:
            _restore(recorder)  # recording failed: verl's own loss again
        if record and recorder.guard.active:
            recorder.guard.run(lambda: recorder.after(output, step))
            gate = recorder.gate
            if gate is not None and gate.active and recorder.guard.active:
                gate.run(lambda: recorder.gate_step(gate, output, step), step)
        return output

    _update_actor.__wrapped__ = update  # type: ignore[attr-defined]
    return _update_actor
