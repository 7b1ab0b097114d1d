"""Record a TRL ``GRPOTrainer`` run in grpo-cli's recorded-run layout, with one line.

::

    from grpo_cli.integrations.trl import record

    trainer = record(GRPOTrainer(...), "runs/exp1")
    trainer.train()

For every recorded optimizer step N, ``runs/exp1/step_{N:06d}/`` gets one parquet file per
``_compute_loss`` call (micro-batch) and rank, then its ``_DONE`` marker; ``meta.json``
holds TRL's settings and ``metrics.jsonl`` what the trainer logged (see
:mod:`grpo_cli.integrations._writer`). N is ``trainer.state.global_step`` of the step,
the ``step`` of its record in ``trainer.state.log_history``.

How (TRL 1.16.0, ``trl/trainer/grpo_trainer.py``; every hook is an attribute of the
trainer INSTANCE, never of its class, and calls TRL's own method unchanged):

- ``GRPOTrainer._calculate_rewards``: its return value (the rewards of every reward
  function, gathered over processes, ``(N_global, F)``) and its ``completions`` argument
  (the decoded texts the reward functions saw) are kept for the generation under way.
- ``GRPOTrainer._generate_and_score_completions``: after TRL's own call, the weighted
  total reward is formed as TRL forms it (``nansum`` over functions of rewards times
  ``reward_weights``, NaN where every function returned None), sliced to this process's
  rows, and each row gets a group label: row i of process p is row ``p·n + i`` of the
  generation batch, in group ``(p·n + i) // num_generations`` (TRL's ``view(-1, G)``).
  One int64 column, ``_grpo_cli_row`` (generation index << 32 | row), is added to the
  returned dict: ``_prepare_inputs`` shuffles (``shuffle_sequence_dict``) and splits
  (``split_tensor_dict``) every tensor of the dict in unison, so each micro-batch still
  knows its rows. Nothing in TRL reads the key; the shuffle draws the same permutation.
- ``GRPOTrainer._compute_loss``: around TRL's own call, the first
  ``_get_per_token_logps_and_entropies`` result inside it (the current policy's
  log-probs and entropies the loss used, and the MoE aux loss) and the
  ``get_high_entropy_mask`` result (when ``top_entropy_quantile < 1``) are captured;
  after it, the micro-batch is written from those and from the call's ``inputs``
  (``advantages``, ``completion_mask``, ``tool_mask``, ``old_per_token_logps``,
  ``ref_per_token_logps``, ``sampling_per_token_logps``, ``num_items_in_batch``).
- A ``transformers.TrainerCallback``: ``on_step_end`` writes the step's ``_DONE`` (then
  runs the gate, and calls ``on_step_written``: after the optimizer step, before the
  trainer logs that step, so its ``metrics.jsonl`` line is not there yet), ``on_log``
  appends the logged record to ``metrics.jsonl`` (the run-summary record of ``train()``'s
  end, with ``train_runtime``, and evaluation records, ``eval_*``, are not written, nor
  the gate's own ``grpo_cli/…`` numbers) and gives the gate the step's log.

The gate (``record(..., check=True)``, :mod:`grpo_cli.integrations._gate`): the step's
check runs in ``on_step_end``, its numbers are appended to ``GRPOTrainer._metrics["train"]``
(which ``GRPOTrainer.log`` averages into the next log), a stop is
``control.should_training_stop`` with ``control.should_log`` (our callback runs after
``DefaultFlowCallback``, whose ``should_log`` tells whether the step will be logged);
``logged-metrics`` is judged in ``on_log`` on the record just logged, the same record
``metrics.jsonl`` gets (transformers 5.24.0 ``Trainer._inner_training_loop``: ``on_step_end``,
then ``_maybe_log_save_evaluate``, then the ``should_training_stop`` test).

Columns: ``logp`` is exactly TRL's ``per_token_logps`` of the call; ``old_logp`` is
``old_per_token_logps`` when TRL computed it (``gradient_accumulation_steps`` not a
multiple of ``steps_per_generation · num_iterations``, or vLLM importance sampling) —
otherwise TRL uses ``logp`` itself (ratio 1) and the file's metadata says
``"old_logp_is_logp": true``; ``ref_logp``
is ``ref_per_token_logps`` (β ≠ 0); ``rollout_logp`` is ``sampling_per_token_logps``
(vLLM); ``entropy`` is TRL's per-token entropy (always computed in ``_compute_loss``);
``mask`` is the loss's ``mask``: ``completion_mask`` (already zero over truncated
completions when ``mask_truncated_completions``) times ``tool_mask`` when tools are used.
It is the mask of the loss's normaliser and of every logged metric. TRL's
``top_entropy_quantile`` mask multiplies the policy term only (not the KL term, not the
normaliser, not the metrics): it is its own column, ``entropy_mask``, when used.
``advantage`` is the call's ``advantages`` (float32 in TRL, written as float64).
``reward`` is the weighted total TRL logs as ``reward``; with
``multi_objective_aggregation="normalize_then_sum"`` the advantages come from rewards
normalised per function first, not from this column. Not written, as they follow from
the columns and ``meta.json``: vLLM's ``importance_sampling_ratio`` (``old_logp``,
``rollout_logp``, ``vllm_importance_sampling_*``) and the off-policy sequence mask
(``off_policy_mask_threshold``).

Each file's ``grpo_cli`` metadata (besides step, rank, micro_batch, world_size):
``micro_batches`` (loss calls in this optimizer step: TRL's
``current_gradient_accumulation_steps``, the divisor of ``grpo``/``bnpo``/``dr_grpo``
losses), ``num_items_in_batch`` (the ``dapo``/``cispo``/``vespo`` normaliser: loss mask
tokens of the whole generation batch over all processes; TRL divides the call's masked
sum by ``num_items_in_batch / world_size · micro_batches / steps_per_generation``),
``generation`` (index of the generation batch the rows come from), ``generated_at_step``
(the optimizer step whose log carries that generation's ``reward``,
``frac_reward_zero_std``...), ``chunk`` (which of the ``steps_per_generation`` slices of
the generation batch) and ``iteration`` (which of the ``num_iterations`` passes over it),
``old_logp_is_logp``, and when they apply ``entropy_coef`` (the entropy-bonus coefficient
the call applied) and ``aux_loss`` (the MoE load-balancing loss of the call).

Never harms the run: any failure while recording is one ``RuntimeWarning`` naming
grpo-cli and recording stops; TRL's own exceptions pass through untouched. Importing this
module imports neither torch nor TRL nor transformers; :func:`record` imports
transformers (for ``TrainerCallback``) and torch.

Multi-process (accelerate, DeepSpeed, FSDP): each rank writes ``rank{r:03d}-mb{k:03d}``
files and ``_DONE.rank{r:03d}``; ``on_step_written`` is called on every rank after its own
marker. No collective operation is added. Untested here (CPU, one process).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from . import _args
from ._gate import PREFIX, CheckFailedWarning, Gate, check_config
from ._writer import Guard, RunWriter, _padded_list, rollout_table

if TYPE_CHECKING:
    from ..records import CheckReport

__all__ = ["CONFIG_KEYS", "CheckFailedWarning", "record"]

ROW_KEY = "_grpo_cli_row"
_ROW_BITS = 32

# GRPOConfig fields written to meta.json: every convention of the loss, the advantages and
# the logged metrics (TRL 1.16.0 names).
CONFIG_KEYS = (
    "loss_type",
    "beta",
    "epsilon",
    "epsilon_high",
    "delta",
    "importance_sampling_level",
    "scale_rewards",
    "multi_objective_aggregation",
    "reward_weights",
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
    "max_completion_length",
    "use_bias_correction_kl",
    "mask_truncated_completions",
    "top_entropy_quantile",
    "off_policy_mask_threshold",
    "use_vllm",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "entropy_coef",
    "use_adaptive_entropy",
    "entropy_coef_min",
    "entropy_coef_max",
    "entropy_coef_delta",
    "entropy_target",
    "router_aux_loss_coef",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "logging_steps",
    "logging_first_step",
    "logging_nan_inf_filter",
    "max_grad_norm",
    "learning_rate",
    "seed",
)

# Keys of the record Trainer.train() logs at its end (a run summary, not a step).
_SUMMARY_KEYS = frozenset({"train_runtime", "train_loss", "total_flos"})

_HOOKED = (
    "_compute_loss",
    "_generate_and_score_completions",
    "_calculate_rewards",
    "_get_per_token_logps_and_entropies",
)


def record(
    trainer: Any,
    directory: str | os.PathLike[str],
    *,
    every_steps: int = 1,
    completions: bool = True,
    on_step_written: Callable[[Path], object] | None = None,
    check: bool | str | os.PathLike[str] = False,
    stop_on_fail: bool = False,
    on_check: Callable[[int, CheckReport], object] | None = None,
) -> Any:
    """Record ``trainer`` (a TRL ``GRPOTrainer`` or subclass, before ``train()``) under
    ``directory`` and return the same trainer; with ``check``, gate every recorded step.

    Args:
      trainer: a ``trl.GRPOTrainer`` instance (TRL 1.16.0's private methods are hooked on
        the instance; other versions are recorded as far as they share them).
      directory: the run directory (created at the first recorded step).
      every_steps: record optimizer step N when ``N % every_steps == 0`` (1: every step);
        ``metrics.jsonl`` gets every logged step whatever this is.
      completions: write the decoded completion texts (``completion`` column).
      on_step_written: called with the step directory after its ``_DONE`` marker is
        written (on every rank, after that rank's marker; after the gate); an exception in
        it is a recording failure (one warning, recording stops).
      check: ``True`` or a check config file (``grpo-cli check --config``'s TOML): each
        recorded step is checked in-process right after it is written, as ``grpo-cli
        check runs/x/step_N`` checks it with no flags (``True``: check's defaults, or
        ``[tool.grpo-cli.check]`` of ``./pyproject.toml``, read now), and the numbers of
        :data:`grpo_cli.integrations._gate.KEYS` go into TRL's metrics (``_metrics``): the
        trainer's next log carries them, averaged over its window as TRL averages its
        own, to every ``report_to`` backend and ``state.log_history``. The rule
        ``logged-metrics`` compares the step's log, which TRL writes after the step:
        it is judged when that log arrives (``on_log``). A failing rule is one
        :class:`~grpo_cli.integrations._gate.CheckFailedWarning` naming the step and
        the rule (a rule's later failures: in ``grpo_cli/failed_rules`` only). An
        exception in the gate is one ``RuntimeWarning`` and turns the gate off; recording
        goes on. One process only (with several, the gate is off: ranks would have to
        agree on a stop).
      stop_on_fail: a failing rule stops training after the step it failed on: the
        gate sets ``control.should_training_stop`` (and ``should_log``, so the step's log,
        with its ``grpo_cli/…`` numbers, is written); the warning says so.
      on_check: called with ``(step, report)``, the step's final
        :class:`~grpo_cli.records.CheckReport`, once per checked step.

    Returns:
      ``trainer`` itself.

    Raises:
      TypeError: ``trainer`` lacks the GRPOTrainer methods that are hooked, or an argument
        is of another type (named: ``directory`` not a path, ``every_steps`` not an
        integer, ``completions`` or ``stop_on_fail`` not a bool, ``on_step_written`` or
        ``on_check`` not callable, ``check`` not a bool or a path).
      ValueError: ``every_steps`` is below 1, ``trainer`` is already recorded, or
        ``stop_on_fail`` is given without ``check``.
      grpo_cli.errors.UsageError: the check config cannot be read.
    """
    _record_args(directory, every_steps, completions, on_step_written, check, stop_on_fail,
                 on_check)  # fmt: skip
    config = check_config(check)
    _recordable(trainer)
    gate = None
    if config is not None:
        how = "training stops after this step (control.should_training_stop)"
        gate = Gate(config, trainer="TRL", stop_on_fail=stop_on_fail, on_check=on_check,
                    how_stopped=how)  # fmt: skip
    recorder = _Recorder(trainer, Path(directory), every_steps, completions, on_step_written)
    recorder.gate = gate
    recorder.guard.run(recorder.install)
    if gate is not None and recorder.guard.active:
        gate.run(recorder.install_gate)
    return trainer


def _record_args(
    directory: Any, every_steps: Any, completions: Any, on_step_written: Any, check: Any,
    stop_on_fail: Any, on_check: Any,
) -> None:  # fmt: skip
    """:func:`record`'s arguments, checked as its docstring's Raises says."""
    _args.directory("directory", directory)
    _args.count("every_steps", every_steps)
    _args.flag("completions", completions)
    _args.function("on_step_written", on_step_written)
    _args.check_option(check)
    _args.flag("stop_on_fail", stop_on_fail)
    _args.function("on_check", on_check)
    if stop_on_fail and not check:
        raise ValueError("stop_on_fail: needs check=True or a check config file")


def _recordable(trainer: Any) -> None:
    """A GRPOTrainer with the methods :func:`record` hooks, not yet recorded."""
    missing = [m for m in (*_HOOKED, "add_callback") if not callable(getattr(trainer, m, None))]
    if missing or not hasattr(trainer, "state") or not hasattr(trainer, "args"):
        raise TypeError(
            f"record: expected a trl GRPOTrainer, got {type(trainer).__name__} "
            f"(missing {', '.join(missing) or 'state/args'})"
        )
    if getattr(trainer, "_grpo_cli_recorder", None) is not None:
        raise ValueError("record: this trainer is already recorded")


def _trl_version() -> str | None:
    try:
        return importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return None


def _config(trainer: Any) -> dict[str, Any]:
    """GRPOConfig values under their own names, with the values TRL resolved in
    ``__init__`` where it resolves them (``epsilon_high`` None → ``epsilon``;
    ``reward_weights`` None → ones; ``beta``, ``num_generations`` as the trainer holds
    them)."""
    args = trainer.args
    config = {k: getattr(args, k) for k in CONFIG_KEYS if hasattr(args, k)}
    resolved = {
        "epsilon": getattr(trainer, "epsilon_low", None),
        "epsilon_high": getattr(trainer, "epsilon_high", None),
        "beta": getattr(trainer, "beta", None),
        "num_generations": getattr(trainer, "num_generations", None),
        "num_iterations": getattr(trainer, "num_iterations", None),
        "loss_type": getattr(trainer, "loss_type", None),
        "scale_rewards": getattr(trainer, "scale_rewards", None),
        "importance_sampling_level": getattr(trainer, "importance_sampling_level", None),
        "max_completion_length": getattr(trainer, "max_completion_length", None),
        "top_entropy_quantile": getattr(trainer, "top_entropy_quantile", None),
        "mask_truncated_completions": getattr(trainer, "mask_truncated_completions", None),
    }
    config.update({k: v for k, v in resolved.items() if v is not None})
    weights = getattr(trainer, "reward_weights", None)
    if weights is not None and hasattr(weights, "tolist"):
        config["reward_weights"] = [float(w) for w in weights.tolist()]
    return config


class _Recorder:
    def __init__(
        self,
        trainer: Any,
        directory: Path,
        every_steps: int,
        completions: bool,
        on_step_written: Callable[[Path], object] | None,
    ) -> None:
        self.trainer = trainer
        self.directory = directory
        self.every_steps = every_steps
        self.completions = completions
        self.on_step_written = on_step_written
        self.guard = Guard("TRL")
        self.gate: Gate | None = None
        self.writer: RunWriter | None = None
        self.generation = -1
        self.gen: dict[str, Any] | None = None  # the latest generation batch's rows
        self.pending: dict[str, Any] = {}  # from _calculate_rewards, for the generation under way
        self.capture: dict[str, Any] | None = None  # inside a recorded _compute_loss call
        self.step = 0  # the optimizer step whose micro-batches are being written
        self.micro_batch = 0

    # -- installation --------------------------------------------------------------
    def install(self) -> None:
        import torch  # noqa: F401  (the trainer has it; fail here, not mid-run, if not)
        from transformers import TrainerCallback

        t = self.trainer
        accelerator = t.accelerator
        self.writer = RunWriter(
            self.directory,
            trainer="trl",
            trainer_version=_trl_version(),
            config=_config(t),
            rank=int(accelerator.process_index),
            world_size=int(accelerator.num_processes),
            extra={"reward_func_names": list(getattr(t, "reward_func_names", []) or [])},
        )
        recorder = self

        class GrpoCliRecorder(TrainerCallback):
            """grpo-cli's step markers and metrics.jsonl (see grpo_cli.integrations.trl)."""

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                recorder.guard.run(lambda: recorder.step_end(int(state.global_step)))

            def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                logs = kw.get("logs")
                recorder.guard.run(lambda: recorder.log(int(state.global_step), logs))

            def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if recorder.gate is not None:
                    recorder.gate.finish()

        self._wrap("_calculate_rewards", self._calculate_rewards)
        self._wrap("_generate_and_score_completions", self._generate_and_score)
        self._wrap("_get_per_token_logps_and_entropies", self._per_token_logps)
        self._wrap("_compute_loss", self._compute_loss)
        if callable(getattr(t, "get_high_entropy_mask", None)):
            self._wrap("get_high_entropy_mask", self._high_entropy_mask)
        t.add_callback(GrpoCliRecorder())
        t._grpo_cli_recorder = self

    def install_gate(self) -> None:
        """The gate's conditions: one process, and TRL's metrics to log into."""
        assert self.gate is not None and self.writer is not None
        if self.writer.world_size > 1:
            self.gate.turn_off(
                f"cannot run with {self.writer.world_size} processes (each rank sees only "
                "its own files, and a stop must be agreed by every rank): check the steps "
                "afterwards with grpo-cli check"
            )
            return
        metrics = getattr(self.trainer, "_metrics", None)
        if not isinstance(metrics, dict) or not isinstance(metrics.get("train"), dict):
            raise TypeError("the trainer has no _metrics['train'] (TRL 1.16.0) to log into")

    def _wrap(self, name: str, hook: Callable[..., Any]) -> None:
        original = getattr(self.trainer, name)  # the bound method (or a user's own patch)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

        wrapper.__name__ = name
        wrapper.__doc__ = f"{name}, recorded by grpo-cli (grpo_cli.integrations.trl)."
        setattr(self.trainer, name, wrapper)

    # -- hooks (each calls TRL's own method once, unchanged) ----------------------
    def _training(self) -> bool:
        return bool(self.guard.active and self.trainer.model.training)

    def _calculate_rewards(self, original: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        rewards_per_func = original(*args, **kw)
        if self._training():
            completions = args[2] if len(args) > 2 else kw.get("completions")
            self.pending = {"rewards_per_func": rewards_per_func, "completions": completions}
        return rewards_per_func

    def _generate_and_score(self, original: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        self.pending = {}
        output = original(*args, **kw)
        if self._training():
            self.guard.run(lambda: self._new_generation(output))
        self.pending = {}
        return output

    def _per_token_logps(self, original: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        result = original(*args, **kw)
        capture = self.capture
        if capture is not None and "logps" not in capture and isinstance(result, tuple):
            capture["logps"] = result[0]
            capture["entropies"] = result[1] if len(result) > 1 else None
            capture["aux_loss"] = result[2] if len(result) > 2 else None
        return result

    def _high_entropy_mask(self, original: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        result = original(*args, **kw)
        if self.capture is not None and "entropy_mask" not in self.capture:
            self.capture["entropy_mask"] = result
        return result

    def _compute_loss(self, original: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        plan = self.guard.run(lambda: self._plan(args, kw)) if self._training() else None
        if plan is None:
            return original(*args, **kw)
        self.capture = {}
        try:
            loss = original(*args, **kw)
        finally:
            capture, self.capture = self.capture, None
        self.guard.run(lambda: self._write_micro_batch(*plan, capture))
        return loss

    def _plan(
        self, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, inputs, what the call reads from the trainer) when this call is recorded:
        ``global_step`` counts finished optimizer steps, so the call belongs to the next."""
        step = int(self.trainer.state.global_step) + 1
        inputs = args[1] if len(args) > 1 else kw.get("inputs")
        if step % self.every_steps != 0 or not isinstance(inputs, dict) or ROW_KEY not in inputs:
            return None
        return step, inputs, self._before_loss()

    # -- recording -----------------------------------------------------------------
    def _new_generation(self, output: dict[str, Any]) -> None:
        import torch

        t = self.trainer
        rewards_per_func = self.pending.get("rewards_per_func")
        if rewards_per_func is None:
            raise RuntimeError("TRL's _calculate_rewards was not called during the generation")
        advantages = output["advantages"]
        n = int(advantages.shape[0])
        rank = int(t.accelerator.process_index)
        with torch.no_grad():
            weights = t.reward_weights.to(rewards_per_func.device).unsqueeze(0)
            total = (rewards_per_func * weights).nansum(dim=1)
            total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
            local = total[rank * n : (rank + 1) * n]
        reward = local.detach().to(torch.float64).cpu().numpy()
        if reward.shape[0] != n:
            raise RuntimeError(f"rewards of {reward.shape[0]} rows for {n} local rows")
        self.generation += 1
        g = self.generation
        size = int(t.num_generations)
        group = [f"g{g:06d}-p{(rank * n + i) // size:04d}" for i in range(n)]
        texts = None
        if self.completions:
            texts = [_text(c) for c in self.pending.get("completions") or []]
            if len(texts) != n:
                texts = None
        self.gen = {
            "generation": g,
            "generated_at_step": int(t.state.global_step) + 1,
            "group": group,
            "reward": reward,
            "completion": texts,
        }
        rows = torch.arange(n, dtype=torch.int64, device=advantages.device)
        output[ROW_KEY] = rows + (g << _ROW_BITS)

    def _before_loss(self) -> dict[str, Any]:
        """What the call reads from the trainer's state and may change (the entropy-bonus
        coefficient of TRL's adaptive control) and where the call sits in the schedule."""
        t = self.trainer
        args = t.args
        spg = int(getattr(args, "steps_per_generation", 1) or 1)
        every = spg * int(getattr(t, "num_iterations", 1) or 1)
        done = int(getattr(t, "_step", 0))  # training_step calls so far (TRL's counter)
        info: dict[str, Any] = {"chunk": done % spg, "iteration": (done % every) // spg}
        if getattr(t, "_entropy_bonus_enabled", False):
            coef = float(t.entropy_coef)
            if getattr(t, "use_adaptive_entropy", False):
                coef = coef if t._last_world_entropy <= args.entropy_target else 0.0
            info["entropy_coef"] = coef
        return info

    def _write_micro_batch(
        self, step: int, inputs: dict[str, Any], before: dict[str, Any], capture: dict[str, Any]
    ) -> None:
        import torch

        if "logps" not in capture:
            raise RuntimeError("_compute_loss did not call _get_per_token_logps_and_entropies")
        gen = self.gen
        tags = _numpy(inputs[ROW_KEY]).astype(np.int64)
        generation = int(tags[0] >> _ROW_BITS) if tags.size else -1
        if gen is None or np.any((tags >> _ROW_BITS) != gen["generation"]):
            raise RuntimeError("a micro-batch of rows from an unknown generation batch")
        rows = tags & ((1 << _ROW_BITS) - 1)
        mask_t = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask_t = mask_t * inputs["tool_mask"]
        mask = _numpy(mask_t).astype(bool)
        t = self.trainer
        old = inputs.get("old_per_token_logps")
        ref = inputs.get("ref_per_token_logps") if float(t.beta) != 0.0 else None
        tokens = {
            "logp": _numpy(capture["logps"]),
            "old_logp": None if old is None else _numpy(old),
            "ref_logp": None if ref is None else _numpy(ref),
            "rollout_logp": _optional(inputs.get("sampling_per_token_logps")),
            "entropy": _optional(capture.get("entropies")),
        }
        texts = gen["completion"]
        table = rollout_table(
            group=[gen["group"][r] for r in rows],
            reward=gen["reward"][rows],
            advantage=_numpy(inputs["advantages"]).astype(np.float64),
            mask=mask,
            tokens=tokens,
            completion=None if texts is None else [texts[r] for r in rows],
            token_ids=_ids(inputs.get("completion_ids")),
        )
        if capture.get("entropy_mask") is not None:
            entropy_mask = _numpy(capture["entropy_mask"]).astype(bool)
            table = table.append_column("entropy_mask", _padded_list(entropy_mask, pa.bool_()))
        info: dict[str, Any] = {
            "micro_batches": int(getattr(t, "current_gradient_accumulation_steps", 1)),
            "num_items_in_batch": int(_numpy(inputs["num_items_in_batch"]).reshape(-1).sum()),
            "generation": generation,
            "generated_at_step": gen["generated_at_step"],
            "old_logp_is_logp": old is None,
            **before,
        }
        aux = capture.get("aux_loss")
        if isinstance(aux, torch.Tensor):
            info["aux_loss"] = float(aux.detach().float().cpu())
        if step != self.step:
            self.step, self.micro_batch = step, 0
        assert self.writer is not None
        self.writer.write_micro_batch(step, self.micro_batch, table, info)
        self.micro_batch += 1

    def step_end(self, step: int) -> None:
        if step != self.step or self.micro_batch == 0 or self.writer is None:
            return  # not a recorded step (every_steps) or nothing written
        self.writer.finish_step(step)
        self.micro_batch = 0
        directory = self.writer.step_dir(step)
        if self.gate is not None and self.gate.active:
            gate = self.gate
            gate.run(lambda: self._gate_step(gate, directory, step), step)
        if self.on_step_written is not None:
            self.on_step_written(directory)

    def _gate_step(self, gate: Gate, directory: Path, step: int) -> None:
        """Check the step; its numbers into TRL's metrics (logged at the next log); a stop
        through the trainer's control flags (TrainerControl: the loop ends after this step's
        log, which the flags ask for)."""
        control = self.trainer.control
        verdict = gate.step_written(
            directory, step, logged=False, will_log=bool(getattr(control, "should_log", False))
        )
        if verdict is None:
            return
        metrics = self.trainer._metrics["train"]
        for key, value in verdict.numbers.items():
            metrics[key].append(value)
        if verdict.stop:
            control.should_training_stop = True
            control.should_log = True

    def log(self, step: int, logs: Any) -> None:
        if not isinstance(logs, dict) or self.writer is None:
            return
        if _SUMMARY_KEYS & logs.keys() or any(str(k).startswith("eval_") for k in logs):
            return  # train()'s closing summary or an evaluation: not a training step's log
        record = {"step": step, **{k: v for k, v in logs.items() if not str(k).startswith(PREFIX)}}
        self.writer.append_metrics(record)
        gate = self.gate
        if gate is not None and gate.active:
            path = self.writer.root / "metrics.jsonl"
            verdict = gate.step_logged(step, path, record)
            if verdict is not None and verdict.stop:
                self.trainer.control.should_training_stop = True


def _numpy(x: Any) -> np.ndarray:
    """A tensor (any dtype, any device) as a numpy array; float types as float32 or
    wider (bfloat16 has no numpy type), never a copy the graph keeps."""
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.is_floating_point() and x.dtype not in (torch.float32, torch.float64):
            x = x.to(torch.float32)
        return x.cpu().numpy()
    return np.asarray(x)


def _optional(x: Any) -> np.ndarray | None:
    return None if x is None else _numpy(x)


def _ids(x: Any) -> np.ndarray | None:
    """The sampled tokens' ids (``completion_ids``), or None when absent or unreadable:
    optional, so never a reason to fail inside training."""
    try:
        return None if x is None else _numpy(x)
    except Exception:  # the ids are optional: the recording goes on
        return None


def _text(completion: Any) -> str:
    """TRL's decoded completion: a string, or (conversational) a list of messages whose
    text contents are joined."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        parts = []
        for message in completion:
            content = message.get("content") if isinstance(message, dict) else message
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    b.get("text", "") for b in content if isinstance(b, dict) and "text" in b
                )
        return "".join(parts)
    return str(completion)
