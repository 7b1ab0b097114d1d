"""The one exception family of grpo-cli.

Every problem a user can fix (a missing array, a NaN inside the mask, a bad flag value)
is raised as a :class:`GrpoCliError`. The CLI prints ``str(error)`` as one line on stderr
and exits with ``error.exit_code``; nothing else is caught.
"""

from __future__ import annotations

__all__ = ["GrpoCliError", "InputError", "MergeError", "SettingError", "UsageError"]


class GrpoCliError(Exception):
    """Base class: a problem the user can fix, shown verbatim as one line."""

    exit_code: int = 2

    def __init__(self, message: str) -> None:
        # One line, always: a multi-line message would break CI log parsers.
        super().__init__(" ".join(message.split("\n")))


class InputError(GrpoCliError, ValueError):
    """The input (a file, or arrays passed to the library) is invalid (exit code 2).

    Also a ``ValueError``, so library callers can catch it the conventional way.
    """


class UsageError(GrpoCliError, ValueError):
    """An option value or a combination of options is invalid (exit code 2)."""


class SettingError(UsageError):
    """A setting is invalid; ``field`` names it (the CLI shows the flag that set it, or the
    config that did)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


class MergeError(GrpoCliError, ValueError):
    """Two partial statistics cannot be merged: computed with other settings, bins or
    versions (on a cluster, workers running another grpo-cli)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"cannot merge partial statistics: {what}")
