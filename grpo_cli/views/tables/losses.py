"""``grpo-cli losses``' table: one row per registry row, its parameters and metrics."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ...records import RegistryEntry

__all__ = ["render_losses"]

TITLES = {"loss": "losses (--loss)", "correction": "corrections (--correction)",
          "mask": "policy-term masks (--loss-param)"}  # fmt: skip


def _param(name: str, default: object) -> str:
    if isinstance(default, bool):
        return f"{name}={str(default).lower()}"
    return f"{name}={'off' if default is None else default}"


def _details(e: RegistryEntry) -> Text:
    """What the row is, then one line each: its parameters with their defaults, what it
    forces, the metrics its trainer logs (a line breaks between items, never in one)."""
    out = Text(e.words)
    lines = [("parameters", [_param(n, d) for n, d, _, _ in e.params])]
    forced = [f"aggregation {e.agg}"] if e.agg else []
    forced += ["a token ratio"] if e.token_ratio else []
    forced += ["one batch (it selects over the batch its loss saw)"] if e.whole_batch else []
    lines += [("forces", forced), ("logs", [m for m, _, _ in e.metrics])]
    for label, items in lines:
        if items:
            out.append(f"\n{label}: ", style="dim")
            out.append(", ".join(items))
    return out


def render_losses(entries: list[RegistryEntry]) -> RenderableType:
    """The registry, by kind: each row's name, and what it is, takes, forces and logs."""
    parts: list[RenderableType] = []
    for kind in ("loss", "correction", "mask"):
        rows = [e for e in entries if e.kind == kind]
        if not rows:
            continue
        t = Table(title=TITLES[kind], title_justify="left", show_header=False,
                  show_lines=True)  # fmt: skip
        t.add_column("name", no_wrap=True, style="bold")
        t.add_column("details", overflow="fold")
        for e in rows:
            t.add_row(e.name, _details(e))
        parts.append(t)
    parts.append(Text("--json: every parameter's kind and help, every metric's unit and "
                      "definition", style="dim"))  # fmt: skip
    return Group(*parts)
