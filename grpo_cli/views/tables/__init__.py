"""The table view of every record: rich renderables (JSON: :mod:`grpo_cli.views.json`).

Render functions return renderables and never print; nothing is computed here beyond
formatting and picking which rows to show. Every command's default view is one screen
(24 lines at 80 columns: the numbers that matter, the top findings one line each, a
verdict line, as ``ruff`` and ``uv`` report); ``--full`` adds every table. Tables fit
the console: a number is never cut (at least 3 significant digits), text wraps by
column, and a table too wide for the console leaves out its optional columns, saying so.

One module a job: :mod:`.layout` (tables that fit), :mod:`.screen` (the one screen the
batch views share), then one module per record's view (:mod:`.objective`,
:mod:`.check`, :mod:`.trend`, :mod:`.answers` with advantages and KL, :mod:`.explain`).
"""

from __future__ import annotations

from .answers import render_advantages, render_answers, render_kl
from .check import render_check
from .explain import render_explain
from .layout import SCREEN
from .losses import render_losses
from .objective import render_objective
from .screen import verdict
from .trend import render_trend, sparkline

__all__ = [
    "SCREEN",
    "render_advantages",
    "render_answers",
    "render_check",
    "render_explain",
    "render_kl",
    "render_losses",
    "render_objective",
    "render_trend",
    "sparkline",
    "verdict",
]
