"""``explain``'s view: the batch's numbers, then each finding with what to do, as many
paragraphs as one screen holds."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ...records import Finding, ObjectiveReport
from ..format import evidence_text
from .layout import Indented, OneScreen
from .screen import SEVERITY_STYLE, SEVERITY_WORD, finding_lines, summary, verdict


def render_explain(
    r: ObjectiveReport, findings: list[Finding], *, full: bool = False
) -> RenderableType:
    """The batch's numbers, then each finding with what to do, most severe first: as
    many paragraphs as one screen holds, the others one line each (``full``: every
    paragraph and its evidence)."""
    head: list[RenderableType] = [*summary(r, title="explain"), Text("")]
    if not findings:
        return Group(*head, Text("No findings: nothing in this batch needs attention."))
    paragraphs: list[RenderableType] = []
    for f in findings:
        title = Text()
        title.append(f"{SEVERITY_WORD[f.severity]:<5}", style=SEVERITY_STYLE[f.severity])
        title.append(f"  {f.id}", style="bold")
        items: list[RenderableType] = [title, Indented(Text(f.message))]
        if full:
            ev = evidence_text(f.evidence)
            items.append(Indented(Text(f"evidence: {ev}", style="dim")))
        paragraphs.append(Group(*items))
    line = verdict(findings)
    if full:
        return Group(*head, *paragraphs, Text(""), line)
    line.append("   --full: with the evidence", style="dim")
    width = max(len(f.id) for f in findings)
    short = [finding_lines([f], 1, width)[0] for f in findings]
    return OneScreen(head, paragraphs, short, [Text(""), line])
