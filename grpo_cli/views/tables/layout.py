"""The layout of the table views: tables that fit the console (:class:`FitTable`, whose
optional columns give way), a choice of layouts by width (:class:`ByWidth`), indented
wrapped text (:class:`Indented`) and a screen filled by budget (:class:`OneScreen`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ...records import QUANTILES, Distribution
from ..format import num

SCREEN = 24  # lines of the one-screen views at 80 columns


# ------------------------------------------------------------------ table helpers
def table(title: str, **kw: Any) -> Table:
    """A table whose title never wraps: at least as wide as its title."""
    kw.setdefault("box", box.SIMPLE_HEAVY)
    kw.setdefault("pad_edge", False)
    kw.setdefault("collapse_padding", True)
    return Table(title=title, title_justify="left", min_width=len(title) + 1, **kw)


def kv_table(title: str, rows: list[tuple[str, str]], note: str | None = None) -> Table:
    t = table(title, show_header=False, caption=note, caption_justify="left")
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True)
    for k, v in rows:
        t.add_row(k, v)
    return t


def dist_table(title: str, dists: dict[str, Distribution], digits: int = 6) -> Table:
    """One column per distribution, one row per statistic: narrow enough for 80 columns."""
    t = table(title)
    t.add_column("", no_wrap=True)
    for name in dists:
        t.add_column(name, justify="right", no_wrap=True)
    rows = ["mean", "std", "min", *QUANTILES, "max"]
    for stat in rows:
        cells = []
        for d in dists.values():
            vals = {"mean": d.mean, "std": d.std, "min": d.min, "max": d.max, **d.quantiles}
            cells.append(num(vals.get(stat), digits))
        t.add_row(stat, *cells)
    binned = [name for name, d in dists.items() if not d.exact]
    if binned:
        t.caption = f"quantiles of {', '.join(binned)}: from a fine histogram (see README)"
        t.caption_justify = "left"
    return t


@dataclass
class Col:
    """A column of a :class:`FitTable`: ``drop`` > 0 may be left out when the table is
    too wide (the highest first); ``wrap`` text may wrap (numbers never do)."""

    title: str
    justify: str = "right"
    drop: int = 0
    wrap: bool = False
    min_width: int | None = None


@dataclass
class FitTable:
    """A table that fits the console: when its columns' narrowest widths add up to more
    than the console has, the optional columns (:attr:`Col.drop`) are left out, highest
    first, and the caption names them. Numbers are never wrapped nor cut."""

    title: str
    cols: list[Col]
    rows: list[list[str]]
    caption: str | None = None
    box: Any = box.SIMPLE_HEAVY
    left_out_note: str = "--json has them"

    def _build(self, keep: list[int]) -> Table:
        t = table(self.title, box=self.box)
        for i in keep:
            c = self.cols[i]
            widest = max([len(x) for x in c.title.split("\n")] + [len(r[i]) for r in self.rows])
            t.add_column(
                c.title,
                justify=c.justify,  # type: ignore[arg-type]
                no_wrap=not c.wrap,
                overflow="fold" if c.wrap else "ellipsis",
                min_width=c.min_width if c.wrap else widest,
            )
        for row in self.rows:
            t.add_row(*(row[i] for i in keep))
        dropped = [self.cols[i].title for i in range(len(self.cols)) if i not in keep]
        notes = [self.caption] if self.caption else []
        if dropped:
            notes.append(f"left out at this width: {', '.join(dropped)} ({self.left_out_note})")
        if notes:
            t.caption = "\n".join(notes)
            t.caption_justify = "left"
        return t

    def fitted(self, width: int, console: Console, options: ConsoleOptions) -> Table:
        keep = list(range(len(self.cols)))
        while True:
            t = self._build(keep)
            need = Measurement.get(console, options.update(width=10_000), t).minimum
            optional = [i for i in keep if self.cols[i].drop > 0]
            if need <= width or not optional:
                return t
            worst = max(optional, key=lambda i: (self.cols[i].drop, i))
            keep.remove(worst)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width, console, options)


class ByWidth:
    """One of several renderables, by the console's width: the first whose minimum width
    fits (side-by-side layouts first, stacked last)."""

    def __init__(self, *choices: RenderableType) -> None:
        self.choices = choices

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for c in self.choices[:-1]:
            need = Measurement.get(console, options.update(width=10_000), c).maximum
            if need <= options.max_width:
                yield c
                return
        yield self.choices[-1]


def grid(*blocks: RenderableType, gap: int = 3) -> Table:
    g = Table.grid(padding=(0, gap, 0, 0))
    for _ in blocks:
        g.add_column(no_wrap=True, vertical="top")
    g.add_row(*blocks)
    return g


# ------------------------------------------------------------------- text and screens
@dataclass
class Indented:
    """``text`` wrapped at the console's width less ``indent``, each line indented (no
    trailing padding, unlike a rich Padding)."""

    text: Text
    indent: int = 7

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width - self.indent, 20)
        for line in self.text.wrap(console, width):
            line.rstrip()
            yield Text(" " * self.indent) + line


@dataclass
class OneScreen:
    """``head``, then as many of ``full`` as fill the screen (``budget`` lines in all at
    the console's width), the others as their ``short`` forms, then ``tail``."""

    head: list[RenderableType]
    full: list[RenderableType]
    short: list[RenderableType]
    tail: list[RenderableType] = field(default_factory=list)
    budget: int = SCREEN

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        def lines(items: Sequence[RenderableType]) -> int:
            return sum(len(console.render_lines(x, options, pad=False)) for x in items)

        left = self.budget - lines(self.head) - lines(self.tail)
        out: list[RenderableType] = []
        for i, item in enumerate(self.full):
            rest = lines(self.short[i + 1 :])
            n = lines([item])
            if n + rest > left:
                out += self.short[i:]
                break
            out.append(item)
            left -= n
        yield from self.head
        yield from out
        yield from self.tail
