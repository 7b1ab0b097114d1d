"""The recorders' argument checks, run when a recorder is set up (``install``, ``record``,
``recording``) or, for the per-step writers (``write_batch``, ``write_experiences``),
inside their guard: a wrong argument is a ``TypeError`` or ``ValueError`` naming the
parameter, what was expected and what was given, before training starts; inside a training
step it is the guard's one ``RuntimeWarning`` with the same words, and training goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["count", "directory", "flag", "function", "index", "token_type"]


def _given(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def count(name: str, value: Any, *, least: int = 1) -> int:
    """An integer ``>= least`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an integer >= {least}, got {_given(value)}")
    if value < least:
        raise ValueError(f"{name}: expected an integer >= {least}, got {value}")
    return value


def index(name: str, value: Any, size: int, size_name: str) -> int:
    """An integer from 0 to ``size - 1`` (a rank below the world size, a call below the
    calls)."""
    count(name, value, least=0)
    if value >= size:
        raise ValueError(f"{name}: {value} is not below {size_name} ({size})")
    return int(value)


def directory(name: str, value: Any) -> str | os.PathLike[str]:
    """A path (a string or ``os.PathLike``), not empty."""
    if not isinstance(value, str | os.PathLike) or not str(os.fspath(value)).strip():
        raise TypeError(
            f"{name}: expected a directory path (str or os.PathLike), got {_given(value)}"
        )
    return value


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {_given(value)}")
    return value


def function(name: str, value: Any) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise TypeError(f"{name}: expected a function or None, got {_given(value)}")
    return value


def check_option(value: Any) -> None:
    """``check``: True, False, or a check config file's path."""
    if not isinstance(value, bool | str | os.PathLike):
        raise TypeError(
            f"check: expected True, False or a check config file's path, got {_given(value)}"
        )


def token_type(name: str, value: Any) -> Any:
    """``token_dtype``: None (each token field keeps its float width: float64 stays
    float64, float32, float16 and bfloat16 are float32) or ``pyarrow.float32()`` /
    ``pyarrow.float64()``."""
    if value is None:
        return None
    import pyarrow as pa

    if not isinstance(value, pa.DataType) or value not in (pa.float32(), pa.float64()):
        raise TypeError(
            f"{name}: expected None, pyarrow.float32() or pyarrow.float64(), got {_given(value)}"
        )
    return value
