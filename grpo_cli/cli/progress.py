"""The progress bars on stderr, drawn only on a terminal: a pass's answers (or a trend's
steps) done of the total, their rate and the time left, as rich's ``Progress`` draws
them (rich is imported when a bar is drawn)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

__all__ = ["progress_bar", "steps_bar"]


@contextmanager
def progress_bar(
    enabled: bool,
    total: int | None,
    what: str,
    *,
    unit: str = "answers",
    minimum: int = 10_000,
) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr for a long pass (``minimum`` units or more, a terminal to
    draw on): the ``unit``s done of ``total``, their rate and the time left (the time
    elapsed until the first is done), moving from the first second."""
    if not enabled or not sys.stderr.isatty() or not total or total < minimum:
        yield None  # a bar only where it helps: big inputs, a terminal to draw on
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            if not speed:
                return Text("")
            return Text(f"{speed:,.0f}/s" if speed >= 10 else f"{speed:.2g}/s", style="cyan")

    class Count(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{task.completed:,.0f}/{task.total:,.0f} {unit}", style="green")

    class Time(ProgressColumn):
        """Time elapsed until the first unit is done, then the time left."""

        def render(self, task: Any) -> Text:
            if not task.completed:
                seconds = task.elapsed or 0.0
                return Text(f"{int(seconds) // 60}:{int(seconds) % 60:02d}", style="yellow")
            left = task.time_remaining
            if left is None:
                return Text("ETA -:--", style="cyan")
            return Text(f"ETA {int(left) // 60}:{int(left) % 60:02d}", style="cyan")

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),
        Count(),
        Rate(),
        Time(),
        console=console,
        transient=True,
        refresh_per_second=8,
    ) as prog:
        task = prog.add_task(what, total=total)

        def tick(n: int) -> None:
            prog.advance(task, n)

        yield tick


@contextmanager
def steps_bar(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """``trend``'s bar: the steps done of the steps found, their rate and the time left
    (three steps or more); ``on_step(done, total)`` is called before the first step and
    after each."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    with ExitStack() as stack:
        ticks: list[Callable[[int], None] | None] = []

        def on_step(done: int, total: int) -> None:
            if not ticks:
                ticks.append(
                    stack.enter_context(progress_bar(True, total, "trend", unit="steps", minimum=3))
                )
            if ticks[0] is not None and done:
                ticks[0](1)

        yield on_step
