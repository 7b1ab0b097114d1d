"""The ``grpo-cli`` command line (:mod:`.app`: the commands; :mod:`.options`: every
option, the conventions as one group)."""

from .app import _asked_for, app, main

__all__ = ["_asked_for", "app", "main"]
