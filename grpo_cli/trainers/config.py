"""A trainer's config keys as data: the type and range of every key a trainer module reads
from a recorded run's ``meta.json``, checked where the config enters (before the module's
``from_config`` maps it to settings).

Each trainer module declares ``CONFIG_KEYS`` (key → :class:`Key`), built with the small
constructors below, and registers ``from_config=checked(CONFIG_KEYS, from_config)``. A key
absent from the config is not checked (the trainer's default holds); a value of another
type, a non-finite number, a number out of range, or a string the module does not know
where it only knows some is one line naming ``meta.json``, the key, the value and what is
expected: never a flag the user did not pass, and never dropped silently (a string
``"0.04"`` for ``beta`` would otherwise leave the KL term out).

Example:
    >>> keys = {"beta": number(low=0)}
    >>> check_config(keys, {"beta": 0.04})
    >>> check_config(keys, {"beta": "0.04"}, "run/meta.json")
    Traceback (most recent call last):
    ...
    grpo_cli.errors.InputError: run/meta.json: config key 'beta' is '0.04': expected a finite ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = [
    "Key",
    "boolean",
    "check_config",
    "checked",
    "choice",
    "either",
    "integer",
    "number",
    "numbers",
    "text",
]

FromConfig = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[str]]]


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Key:
    """What one config key may hold: ``accepts(value)`` and the words of ``expected``;
    ``null`` whether JSON null is allowed (the trainer's "off" or "unset")."""

    accepts: Callable[[Any], bool]
    expected: str
    null: bool = False

    def ok(self, value: Any) -> bool:
        return (value is None and self.null) or (value is not None and self.accepts(value))


def _range(
    low: float | None, high: float | None, low_open: bool
) -> tuple[Callable[[float], bool], str]:
    words = []
    if low is not None:
        words.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        words.append(f"<= {high:g}")

    def inside(v: float) -> bool:
        if low is not None and (v <= low if low_open else v < low):
            return False
        return high is None or v <= high

    return inside, (" " + " and ".join(words)) if words else ""


def number(
    *, low: float | None = None, high: float | None = None, low_open: bool = False,
    null: bool = False,
) -> Key:  # fmt: skip
    """A finite JSON number (an integer or not) within ``low`` (excluded when
    ``low_open``) and ``high``."""
    inside, words = _range(low, high, low_open)
    return Key(lambda v: _finite(v) and inside(v), f"a finite number{words}", null)


def integer(*, low: float | None = None, high: float | None = None, null: bool = False) -> Key:
    """A JSON integer (``4.0`` too: what a YAML or argparse float holds) within bounds."""
    inside, words = _range(low, high, False)

    def accepts(v: Any) -> bool:
        return _finite(v) and float(v).is_integer() and inside(v)

    return Key(accepts, f"an integer{words}", null)


def boolean(*, null: bool = False) -> Key:
    return Key(lambda v: isinstance(v, bool), "true or false", null)


def text(*, null: bool = False) -> Key:
    """A string (its value is the module's to judge: an unknown one is named in a note)."""
    return Key(lambda v: isinstance(v, str), "a string", null)


def choice(*values: Any, null: bool = False) -> Key:
    """One of ``values`` (the only ones the module maps: any other would be ignored)."""
    listed = ", ".join(repr(v) if isinstance(v, str) else str(v).lower() for v in values)

    def accepts(v: Any) -> bool:
        return any(v == x and type(v) is type(x) for x in values)

    return Key(accepts, f"one of {listed}", null)


def numbers(
    *counts: int, low: float | None = None, null: bool = False, one: bool = False
) -> Key:  # fmt: skip
    """A list of ``counts`` finite numbers (each ``>= low``); ``one``: a single number
    too."""
    inside, words = _range(low, None, False)

    def accepts(v: Any) -> bool:
        if one and _finite(v):
            return inside(v)
        return (
            isinstance(v, list | tuple)
            and len(v) in counts
            and all(_finite(x) and inside(x) for x in v)
        )

    n = " or ".join(map(str, counts))
    also = "a finite number or " if one else ""
    return Key(accepts, f"{also}a list of {n} finite numbers{words}", null)


def either(a: Key, b: Key, *, null: bool = False) -> Key:
    """A value ``a`` or ``b`` accepts."""
    return Key(lambda v: a.ok(v) or b.ok(v), f"{a.expected}, or {b.expected}", null)


def check_config(
    keys: Mapping[str, Key], config: Mapping[str, Any], where: str = "meta.json"
) -> None:
    """Every key of ``keys`` present in ``config`` against its :class:`Key`, in the order
    of ``keys``; the first wrong one raises.

    Raises:
        InputError: ``{where}: config key 'K' is V: expected ...``.
    """
    for key, spec in keys.items():
        if key in config and not spec.ok(config[key]):
            v = config[key]
            shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
            raise InputError(f"{where}: config key {key!r} is {shown}: expected {spec.expected}")


Together = Callable[[Mapping[str, Any]], str | None]


def checked(
    keys: Mapping[str, Key], from_config: FromConfig, together: tuple[Together, ...] = ()
) -> FromConfig:
    """``from_config`` run on a config :func:`check_config` has accepted, and whose keys
    that are read together pass each of ``together`` (a function of the config giving what
    is wrong, naming the keys, or None)."""

    def run(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        check_config(keys, config)
        for rule in together:
            wrong = rule(config)
            if wrong is not None:
                raise InputError(f"meta.json: {wrong}")
        return from_config(config)

    run.__doc__ = from_config.__doc__
    run.keys = keys  # type: ignore[attr-defined]
    return run
