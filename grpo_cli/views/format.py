"""How every view writes a number for people (the tables, the HTML report, the CI views,
the figures): one rule for an absent value, one for a share, one for significant digits.
Plain strings, no rich; JSON keeps the numbers themselves (:mod:`.json`).

>>> num(-0.0002311050556), num(163.456), num(25438), num(None)
('-2.311e-4', '163.5', '25,438', '—')
>>> pct(0.001022), pct(0.40625), pct(0)
('0.102%', '40.6%', '0%')
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "NONE",
    "evidence_text",
    "example_text",
    "num",
    "pct",
    "settings_text",
    "span",
    "threshold_text",
]

NONE = "—"  # a value that is absent (None, null in JSON), in every view


def num(x: float | np.integer[Any] | np.floating[Any] | None, sig: int = 4) -> str:
    """``x`` in the fewest characters that keep ``sig`` significant digits: plain when
    that is short (``-0.0002311``, ``1.119``, ``163.5``), else with a compact exponent
    (``5.84e-6``, ``1.262e3``); integers exactly, with thousands separators; :data:`NONE`
    for None."""
    if x is None:
        return NONE
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    plain = f"{x:.{sig}g}"
    mant, _, exp = f"{x:.{sig - 1}e}".partition("e")
    if "." in mant:
        mant = mant.rstrip("0").rstrip(".")
    short = f"{mant}e{int(exp)}"
    if "e" in plain or len(short) < len(plain):
        return short
    return plain


def pct(x: float | None, sig: int = 3) -> str:
    """A share (0 to 1) as a percentage with ``sig`` significant digits (``0.102%``);
    :data:`NONE` for None."""
    if x is None:
        return NONE
    if x == 0:
        return "0%"
    return num(100 * x, sig) + "%"


def span(lo: int, hi: int) -> str:
    """A range of sizes or lengths, ``6–785`` (``8`` when both ends are one)."""
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def settings_text(r: Any) -> str:
    """Where a record's settings come from, in a few words."""
    s = r.settings
    if s.origin:
        return f"settings from {s.origin} ({s.preset}: {s.mirrors or s.trainer})"
    if s.preset:
        return f"preset {s.preset}"
    return "defaults (DeepSeekMath)"


def evidence_text(evidence: dict[str, Any]) -> str:
    """A finding's evidence as one line: ``key value, ...`` (nested dicts in braces)."""
    return ", ".join(f"{k} {_evidence(v)}" for k, v in evidence.items())


def _evidence(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + evidence_text(v) + "}"
    if isinstance(v, float | int) and not isinstance(v, bool):
        return num(v)
    return str(v)


def threshold_text(t: dict[str, float | None] | None) -> str:
    """A rule's thresholds, ``warn > 0.1, fail > 1``; :data:`NONE` when it has none."""
    if not t:
        return NONE
    return ", ".join(f"{k} > {num(v)}" for k, v in t.items() if v is not None) or NONE


def example_text(ex: dict[str, Any]) -> str:
    """A place a rule points at, ``file x.parquet, row 17, kl_max 3.619``: its numbers to
    6 significant digits, its integers (rows, lengths) as they are."""
    return ", ".join(f"{k} {num(v, 6) if isinstance(v, float) else v}" for k, v in ex.items())
