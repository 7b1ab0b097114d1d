"""A check's configuration from TOML (``--config``) and ``--rule`` flags, validated against
the rule table."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .base import CheckConfig, RuleConfig
from .rules import RULES

# --------------------------------------------------------------------------- config io
_RULE_KEYS = {"enabled", "severity", "warn", "fail"}


_TOP_KEYS = {"rules", "on-policy", "baseline-tolerance", "require"}


# rule parameters and their domains: (lowest allowed, whether the lowest is excluded)
_PARAM_DOMAIN = {"band": (1.0, True), "zero_share_warn": (0.0, False)}


def _apply(cfg: CheckConfig, table: dict[str, Any], where: str) -> CheckConfig:
    unknown = set(table) - _TOP_KEYS
    if unknown:
        raise UsageError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(_TOP_KEYS))}"
        )
    rules = dict(cfg.rules)
    body_of = table.get("rules") or {}
    if not isinstance(body_of, dict):
        raise UsageError(f"{where}: rules must be a table of rule tables")
    for rid, body in body_of.items():
        if not isinstance(body, dict):
            raise UsageError(f"{where}: rules.{rid} must be a table")
        for key, value in body.items():
            rules = _set_rule(rules, rid, key, value, where)
    on_policy = table.get("on-policy", cfg.on_policy)
    tol = table.get("baseline-tolerance", cfg.baseline_tolerance)
    if not isinstance(on_policy, bool):
        raise UsageError(f"{where}: on-policy must be true or false")
    if (
        isinstance(tol, bool)
        or not isinstance(tol, int | float)
        or not (math.isfinite(tol) and tol >= 0)
    ):
        raise UsageError(f"{where}: baseline-tolerance must be a finite number >= 0, got {tol!r}")
    require = table.get("require", list(cfg.require))
    if not isinstance(require, list) or not all(isinstance(r, str) for r in require):
        raise UsageError(f"{where}: require must be a list of rule names")
    return CheckConfig(
        rules=rules,
        on_policy=on_policy,
        baseline_tolerance=float(tol),
        require=_known_rules(require, f"{where}: require"),
    )


def _known_rules(names: list[str], where: str) -> tuple[str, ...]:
    unknown = [n for n in names if n not in RULES]
    if unknown:
        raise UsageError(
            f"{where}: unknown rule(s) {', '.join(unknown)}; rules: {', '.join(RULES)}"
        )
    return tuple(dict.fromkeys(names))


def _set_rule(
    rules: dict[str, RuleConfig],
    rid: str,
    key: str,
    value: Any,
    where: str,
    registry: dict[str, tuple[Any, RuleConfig]] | None = None,
) -> dict[str, RuleConfig]:
    known = RULES if registry is None else registry
    if rid not in known:
        raise UsageError(f"{where}: unknown rule {rid!r}; rules: {', '.join(known)}")
    rc = rules[rid]
    if key == "enabled":
        if not isinstance(value, bool):
            raise UsageError(f"{where}: rules.{rid}.enabled must be true or false")
        rc = replace(rc, enabled=value)
    elif key == "severity":
        if value not in ("fail", "warn"):
            raise UsageError(f"{where}: rules.{rid}.severity must be 'fail' or 'warn'")
        rc = replace(rc, severity=value)
    elif key in ("warn", "fail"):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise UsageError(f"{where}: rules.{rid}.{key} must be a finite number, got {value!r}")
        number = None if value is None else float(value)
        rc = replace(rc, warn=number) if key == "warn" else replace(rc, fail=number)
    elif key in set(known[rid][1].params):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise UsageError(f"{where}: rules.{rid}.{key} must be a finite number, got {value!r}")
        low, open_ = _PARAM_DOMAIN.get(key, (-math.inf, False))
        if value < low or (open_ and value == low):
            sign = ">" if open_ else ">="
            raise UsageError(f"{where}: rules.{rid}.{key} must be {sign} {low:g}, got {value!r}")
        rc = replace(rc, params={**rc.params, key: float(value)})
    else:
        allowed = sorted(_RULE_KEYS | set(known[rid][1].params))
        raise UsageError(f"{where}: unknown key rules.{rid}.{key}; allowed: {', '.join(allowed)}")
    return {**rules, rid: rc}


def rule_flags(
    flags: list[str] | None,
    registry: dict[str, tuple[Any, RuleConfig]],
) -> dict[str, RuleConfig]:
    """The default configs of ``registry`` with ``--rule RULE.KEY=VALUE`` flags applied."""
    rules = {k: v[1] for k, v in registry.items()}
    for item in flags or ():
        target, sep, value = item.partition("=")
        rid, dot, key = target.rpartition(".")
        if not sep or not dot:
            raise UsageError(f"--rule {item!r}: expected RULE.KEY=VALUE")
        parsed = _parse_flag_value(value)
        rules = _set_rule(rules, rid.strip(), key.strip(), parsed, "--rule", registry)
    return rules


def _parse_flag_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    if low in ("fail", "warn"):
        return low
    if low == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--rule: cannot read value {text!r}") from None


def load_config(
    config: Path | None,
    rule_flags: list[str] | None = None,
    on_policy: bool | None = None,
    cwd: Path | None = None,
    require: list[str] | None = None,
) -> CheckConfig:
    """Defaults, then ``--config`` or ``[tool.grpo-cli.check]`` of ./pyproject.toml, then flags."""
    cfg = CheckConfig(rules={k: v[1] for k, v in RULES.items()})
    if config is not None:
        try:
            with open(config, "rb") as fh:
                table = tomllib.load(fh)
        except OSError as exc:
            raise UsageError(f"--config {config}: cannot read ({exc.strerror or exc})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"--config {config}: invalid TOML ({exc})") from None
        cfg = _apply(cfg, table, str(config))
    else:
        pyproject = (cwd or Path.cwd()) / "pyproject.toml"
        if pyproject.is_file():
            try:
                with open(pyproject, "rb") as fh:
                    doc = tomllib.load(fh)
            except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(f"{pyproject}: cannot read ({exc})") from None
            tool: Any = doc.get("tool", {})
            mine: Any = tool.get("grpo-cli", {}) if isinstance(tool, dict) else None
            section: Any = mine.get("check") if isinstance(mine, dict) else None
            if not isinstance(mine, dict) or not isinstance(section, dict | None):
                raise UsageError(f"{pyproject}: [tool.grpo-cli.check] must be a table")
            if section is not None:
                cfg = _apply(cfg, section, f"{pyproject} [tool.grpo-cli.check]")
    rules = dict(cfg.rules)
    for item in rule_flags or ():
        target, sep, value = item.partition("=")
        rid, dot, key = target.rpartition(".")
        if not sep or not dot:
            raise UsageError(f"--rule {item!r}: expected RULE.KEY=VALUE, e.g. kl-mean.fail=0.5")
        rules = _set_rule(rules, rid.strip(), key.strip(), _parse_flag_value(value), "--rule")
    cfg = replace(cfg, rules=rules)
    if on_policy:
        cfg = replace(cfg, on_policy=True)
    if require:
        cfg = replace(cfg, require=_known_rules([*cfg.require, *require], "--require"))
    return cfg
