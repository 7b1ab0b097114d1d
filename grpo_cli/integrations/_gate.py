"""The gate inside training: ``grpo-cli check``'s rules on each recorded step, in-process.

A recorder given ``check=`` evaluates, right after a step's ``_DONE`` marker is written,
what ``grpo-cli check runs/x/step_N`` computes with no flags (:func:`check_recorded_step`:
the same source, the settings of the run's ``meta.json``, the step's record of
``metrics.jsonl``, the same rule configuration, the same engine options), and hands the
trainer a few of its numbers to log under ``grpo_cli/…`` (:data:`KEYS`). With
``stop_on_fail`` a failing rule asks the trainer to stop (each recorder says how its
trainer is stopped), with one :class:`CheckFailedWarning` naming the step and the rule.

The gate never harms the run: an exception inside it is one ``RuntimeWarning`` and the
gate turns off (recording and training go on). A failing rule is a verdict, not an
exception.

Nothing here imports torch or a trainer; grpo-cli's check machinery is imported when the
first step is checked.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..check.base import CheckConfig
    from ..logged import LoggedInput
    from ..records import CheckReport, Result

__all__ = [
    "KEYS",
    "CheckFailedWarning",
    "Gate",
    "Verdict",
    "check_config",
    "check_recorded_step",
]

PREFIX = "grpo_cli/"
LOGGED_RULE = "logged-metrics"

# What the gate logs into the trainer's metrics, per checked step (the names of
# ``grpo-cli trend``'s columns where it has them). The numbers of the objective are absent
# when it was not evaluated (an integrity rule failed), ``kl_mean`` without ``ref_logp``.
KEYS: dict[str, str] = {
    "grpo_cli/check_passed": "1 when no rule failed, else 0 (a mean over a logging window: "
    "the share of checked steps that passed)",
    "grpo_cli/failed_rules": "how many rules failed",
    "grpo_cli/warned_rules": "how many rules warned",
    "grpo_cli/objective": "J over the whole step, as `grpo-cli objective` computes it",
    "grpo_cli/kl_mean": "mean per-token KL to the reference (β ≠ 0)",
    "grpo_cli/clip_fraction_region": "share of valid tokens whose ratio is clipped",
    "grpo_cli/ratio_p99": "99th percentile of the importance ratio over valid tokens",
    "grpo_cli/frac_zero_variance_groups": "share of groups whose rewards are all equal",
    "grpo_cli/check_seconds": "wall time of the gate on the step",
}

T = TypeVar("T")


class CheckFailedWarning(UserWarning):
    """A rule of the gate failed on a recorded step (the message names step and rule)."""


# ------------------------------------------------------------------ the computation
def check_config(check: bool | str | os.PathLike[str] | None) -> CheckConfig | None:
    """``check=`` of a recorder as the rules' configuration, read once (before training,
    so a bad file is an error then, not at the first step).

    ``True``: what ``grpo-cli check`` uses with no flags (the defaults, or
    ``[tool.grpo-cli.check]`` of ``./pyproject.toml``); a path: a check config file, as
    ``grpo-cli check --config FILE`` reads it; ``False`` or ``None``: no gate.

    Raises:
        grpo_cli.errors.UsageError: the file cannot be read or holds an unknown rule or key.
        TypeError: ``check`` is none of these.
    """
    if check is None or check is False:
        return None
    from ..check.config import load_config

    if check is True:
        return load_config(None)
    if isinstance(check, str | os.PathLike):
        return load_config(Path(check))
    raise TypeError(
        f"check: expected True, False or a check config file, got {type(check).__name__}"
    )


def check_recorded_step(
    directory: str | os.PathLike[str],
    config: CheckConfig,
    *,
    logged: bool = True,
    column_map: Mapping[str, str] | None = None,
) -> CheckReport:
    """What ``grpo-cli check DIRECTORY`` computes with no flags, for a recorded step.

    The step's files as one source, the settings its run's ``meta.json`` gives (the
    trainer's preset and config; its notes among the report's warnings), the step's record
    in ``metrics.jsonl`` for the ``logged-metrics`` rule (``logged=False``: none, as when
    the trainer has not logged the step yet), the engine options of the environment, as
    the command line takes them. ``column_map`` is ``--column``.

    Raises:
        grpo_cli.errors.InputError: ``directory`` is not a recorded step, or check refuses it.
    """
    from ..commands.check import run_check
    from ..env import engine_options
    from ..errors import InputError
    from ..io import open_source
    from ..logged import recorded_metrics
    from ..trainers.presets import resolve_run_settings

    src = open_source([str(directory)], dict(column_map or {}))
    step = src.recorded
    if step is None:
        raise InputError(f"{directory}: not a recorded step (step_N/ of a run with meta.json)")
    run = step.run
    settings, notes = resolve_run_settings(run.trainer, run.trainer_version, run.config)
    if notes:
        src = replace(src, notes=(*src.notes, *notes))
    metrics = recorded_metrics(step, 0.0) if logged else None
    return run_check(src, settings, config, engine=engine_options(), logged=metrics)


def logged_result(report: CheckReport, config: CheckConfig, logged: LoggedInput) -> Result:
    """The ``logged-metrics`` verdict of ``report``'s step on what the trainer logged,
    judged after the rest of the check (the trainer logs a step after the gate ran): the
    rule's own function on the report's objective, as :func:`run_check` calls it."""
    from typing import cast

    from ..check.base import _skip
    from ..check.rules import RULES
    from ..check.scan import Facts
    from ..commands.check import _required

    facts = Facts(
        src=cast(Any, None),
        answers=cast(Any, None),
        scan=cast(Any, None),
        report=report.objective,
        why_no_report=report.why_no_objective,
        advantages=None,
        config=config,
        logged=logged,
    )
    rc = config.rules[LOGGED_RULE]
    if not rc.enabled:
        result = _skip(LOGGED_RULE, "turned off by the configuration")
    else:
        rule, _ = RULES[LOGGED_RULE]
        result = rule(facts, rc)
    return _required(result) if LOGGED_RULE in config.require else result


def logged_input(path: Path, record: Mapping[str, Any]) -> LoggedInput:
    """A step's logged record (what the recorder writes to ``metrics.jsonl``) as
    ``recorded_metrics`` reads it back: through JSON, numbers only, prefixes dropped."""
    from ..logged import LoggedInput, record_metrics
    from ._writer import _plain

    rec = json.loads(json.dumps(_plain(dict(record))))
    metrics, notes = record_metrics(rec, str(path))
    step = rec.get("step")
    return LoggedInput(
        str(path), metrics, step if isinstance(step, int) else None, 0.0, tuple(notes)
    )


def numbers(report: CheckReport, *, pending: bool = False) -> dict[str, float]:
    """The :data:`KEYS` of ``report`` (``pending``: its ``logged-metrics`` verdict is still
    to come and not counted)."""
    counted = [r for r in report.results if not (pending and r.rule == LOGGED_RULE)]
    failed = sum(r.status == "fail" for r in counted)
    out = {
        "grpo_cli/check_passed": 0.0 if failed else 1.0,
        "grpo_cli/failed_rules": float(failed),
        "grpo_cli/warned_rules": float(sum(r.status == "warn" for r in counted)),
    }
    o = report.objective
    if o is not None:
        g = o.group_summary
        values = {
            "grpo_cli/objective": o.objective,
            "grpo_cli/kl_mean": None if o.kl is None else o.kl.mean,
            "grpo_cli/clip_fraction_region": o.clip.region,
            "grpo_cli/ratio_p99": o.ratio.quantiles.get("p99"),
            "grpo_cli/frac_zero_variance_groups": (
                None if g is None else g.frac_zero_variance_groups
            ),
        }
        out.update({k: float(v) for k, v in values.items() if v is not None})
    return out


# ------------------------------------------------------------------------- the gate
@dataclass(frozen=True)
class Verdict:
    """The gate on one step: the check's report, the numbers to log, the rules that
    failed, and whether the trainer is to stop."""

    step: int
    report: CheckReport
    numbers: dict[str, float]
    failed: tuple[Result, ...]
    stop: bool


class Gate:
    """``check``'s rules on each recorded step, for one recorder.

    ``trainer`` names the trainer in messages; ``stop_on_fail`` makes a failing rule ask
    for a stop (:attr:`Verdict.stop`; the recorder stops its trainer, ``how_stopped``
    says how in the warning); ``on_check(step, report)`` is called once per checked step
    with its final report; ``column_map`` is ``--column`` (e.g. ``logp=old_logp`` for a
    step without the current log-probs).
    """

    def __init__(
        self,
        config: CheckConfig,
        *,
        trainer: str,
        stop_on_fail: bool = False,
        on_check: Callable[[int, CheckReport], object] | None = None,
        how_stopped: str = "training stops",
        column_map: Mapping[str, str] | None = None,
        no_logged: str | None = None,
    ) -> None:
        self.config = config
        self.trainer = trainer
        self.stop_on_fail = stop_on_fail
        self.on_check = on_check
        self.how_stopped = how_stopped
        self.column_map = dict(column_map or {})
        self.no_logged = no_logged  # why logged-metrics is not judged (None: it is)
        self.active = True
        self.error: str | None = None
        self.stopped: int | None = None  # the step that asked for the stop
        self.warned: set[str] = set()  # rules whose failure was warned already
        self.pending: dict[int, CheckReport] = {}  # steps waiting for their log

    # -- never harming the run ----------------------------------------------------
    def run(self, fn: Callable[[], T], step: int | None = None) -> T | None:
        """``fn()``, or None; its exception is one RuntimeWarning and the gate turns off."""
        if not self.active:
            return None
        try:
            return fn()
        except Exception as exc:  # a gate bug, a refused step: never the run's problem
            at = f" at step {step}" if step is not None else ""
            self.turn_off(f"failed{at} ({type(exc).__name__}: {exc})")
            return None

    def turn_off(self, why: str) -> None:
        self.active = False
        self.error = why
        self.pending.clear()
        warnings.warn(
            f"grpo-cli: the check gate of the {self.trainer} run {why}; it is turned off for "
            "the rest of the run, recording and training go on",
            RuntimeWarning,
            stacklevel=3,
        )

    # -- phases ---------------------------------------------------------------------
    def step_written(
        self, directory: Path, step: int, *, logged: bool = True, will_log: bool = False
    ) -> Verdict | None:
        """Check the step just written. ``logged``: the trainer's log of the step is in
        ``metrics.jsonl`` already (verl, OpenRLHF); else ``will_log`` says whether it
        comes (TRL logs after the step's end: ``logged-metrics`` is then judged by
        :meth:`step_logged`, and not counted before)."""
        return self.run(lambda: self._written(directory, step, logged, will_log), step)

    def step_logged(self, step: int, path: Path, record: Mapping[str, Any]) -> Verdict | None:
        """The trainer logged ``record`` for ``step`` (a step :meth:`step_written` left
        pending): its ``logged-metrics`` verdict; a failure warns and may stop."""
        if step not in self.pending:
            return None
        return self.run(lambda: self._logged(step, path, record), step)

    def finish(self) -> None:
        """Training ended: steps still waiting for a log are final as they are."""
        while self.active and self.pending:
            step = min(self.pending)
            report = self.pending.pop(step)
            self.run(lambda: self._final(step, report), step)  # noqa: B023 (called at once)

    def _written(self, directory: Path, step: int, logged: bool, will_log: bool) -> Verdict:
        self.finish()  # an earlier step whose log never came
        start = time.perf_counter()
        report = check_recorded_step(
            directory, self.config, logged=logged and self.no_logged is None,
            column_map=self.column_map,
        )  # fmt: skip
        if self.no_logged is not None and self.config.rules[LOGGED_RULE].enabled:
            report = _with(report, _skip_result(self.no_logged, self.config))
        failed = self._failed(report, pending=not logged)
        stop = self.stop_on_fail and bool(failed) and self.stopped is None
        pending = not logged and (will_log or stop)
        if not pending:
            failed = self._failed(report, pending=False)
            stop = self.stop_on_fail and bool(failed) and self.stopped is None
        values = numbers(report, pending=pending)
        values["grpo_cli/check_seconds"] = time.perf_counter() - start
        self._tell(step, failed, stop)
        if pending:
            self.pending[step] = report
        else:
            self._final(step, report)
        return Verdict(step, report, values, failed, stop)

    def _logged(self, step: int, path: Path, record: Mapping[str, Any]) -> Verdict:
        report = self.pending.pop(step)
        result = logged_result(report, self.config, logged_input(path, record))
        report = _with(report, result)
        failed = (result,) if result.status == "fail" else ()
        stop = self.stop_on_fail and bool(failed) and self.stopped is None
        self._tell(step, failed, stop)
        self._final(step, report)
        return Verdict(step, report, {}, failed, stop)

    def _final(self, step: int, report: CheckReport) -> None:
        if self.on_check is not None:
            self.on_check(step, report)

    def _failed(self, report: CheckReport, *, pending: bool) -> tuple[Result, ...]:
        return tuple(
            r
            for r in report.results
            if r.status == "fail" and not (pending and r.rule == LOGGED_RULE)
        )

    def _tell(self, step: int, failed: tuple[Result, ...], stop: bool) -> None:
        """One warning line for the step's failures: every one when training stops; else
        the rules that had not failed before (later failures: in the numbers only)."""
        shown = failed if stop else tuple(r for r in failed if r.rule not in self.warned)
        if not shown:
            return
        self.warned.update(r.rule for r in shown)
        what = "; ".join(f"rule {r.rule} failed: {r.message}" for r in shown)
        if stop:
            self.stopped = step
            tail = f"; stop_on_fail: {self.how_stopped}"
        elif self.stopped is not None:
            tail = f"; training is stopping (stop_on_fail, from step {self.stopped})"
        else:
            tail = "; training goes on (stop_on_fail=False; later failures of this rule are "
            tail += "counted in grpo_cli/failed_rules only)"
        warnings.warn(
            f"grpo-cli check, {self.trainer} step {step}: {what}{tail}",
            CheckFailedWarning,
            stacklevel=4,
        )


def _with(report: CheckReport, result: Result) -> CheckReport:
    """``report`` with the verdict of ``result``'s rule replaced."""
    results = [result if r.rule == result.rule else r for r in report.results]
    return replace(report, results=results)


def _skip_result(why: str, config: CheckConfig) -> Result:
    """``logged-metrics`` not judged, and why (failing when the configuration requires it)."""
    from ..check.base import _skip
    from ..commands.check import _required

    result = _skip(LOGGED_RULE, why)
    return _required(result) if LOGGED_RULE in config.require else result
