"""A check's configuration records and its verdicts: a rule's thresholds and severity
(:class:`RuleConfig`), the whole gate's (:class:`CheckConfig`), and how a value becomes
pass, warn, fail or skip."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..records import Result

MAX_EXAMPLES = 5


STATUSES = ("pass", "warn", "fail", "skip")


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class RuleConfig:
    """How one rule judges: ``value > fail`` fails, ``value > warn`` warns.

    ``severity = "warn"`` caps the rule at a warning; ``enabled = False`` skips it.
    ``params`` holds rule-specific knobs (e.g. the ratio band of ``ratio-extreme``).
    """

    enabled: bool = True
    severity: str = "fail"
    warn: float | None = None
    fail: float | None = None
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckConfig:
    rules: dict[str, RuleConfig]
    on_policy: bool = False
    baseline_tolerance: float = 0.25
    require: tuple[str, ...] = ()  # rules whose skip is a failure (never pass unevaluated)


# ---------------------------------------------------------------------------- verdicts
def _judge(
    rule: str,
    cfg: RuleConfig,
    value: float | int | None,
    message: str,
    examples: list[dict[str, Any]] | None = None,
) -> Result:
    """Status from thresholds (strictly greater fails/warns) and the severity cap."""
    status = "pass"
    if value is None:
        status = "skip"
    elif cfg.fail is not None and value > cfg.fail:
        status = "fail"
    elif cfg.warn is not None and value > cfg.warn:
        status = "warn"
    if status == "fail" and cfg.severity == "warn":
        status = "warn"
    return Result(
        rule,
        status,
        value,
        {"warn": cfg.warn, "fail": cfg.fail},
        message,
        (examples or [])[:MAX_EXAMPLES],
    )


def _skip(rule: str, why: str) -> Result:
    return Result(rule, "skip", None, None, why)
