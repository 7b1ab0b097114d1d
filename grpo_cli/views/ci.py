"""CI views of ``check``'s report: GitHub Actions annotations with the step summary, and
JUnit XML."""

from __future__ import annotations

import re

from ..records import CheckReport
from .format import example_text, num, threshold_text

__all__ = ["check_github", "check_junit"]


def _gh_escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def check_github(r: CheckReport) -> tuple[list[str], str]:
    """GitHub Actions workflow commands (one per failing or warning rule) and a markdown
    summary for ``$GITHUB_STEP_SUMMARY``."""
    lines = []
    for res in r.results:
        if res.status not in ("fail", "warn"):
            continue
        kind = "error" if res.status == "fail" else "warning"
        where = f" (at {example_text(res.examples[0])})" if res.examples else ""
        lines.append(f"::{kind} title=grpo-cli check {res.rule}::{_gh_escape(res.message + where)}")
    if not lines:  # every rule passed or was skipped: say so, once (a run's log is not empty)
        counts = {k: sum(x.status == k for x in r.results) for k in ("pass", "skip")}
        lines.append(
            f"::notice title=grpo-cli check::passed ({counts['pass']} pass, "
            f"{counts['skip']} skip): {_gh_escape(r.source)}"
        )
    icon = {"pass": "✅", "warn": "⚠️", "fail": "❌", "skip": "⏭️"}
    md = [
        f"### grpo-cli check: {'passed' if r.passed else 'FAILED'}",
        "",
        f"`{r.source}`",
        "",
        "| rule | status | value | threshold | message |",
        "|---|---|---|---|---|",
    ]
    for res in r.results:
        msg = res.message.replace("|", "\\|")
        md.append(
            f"| `{res.rule}` | {icon[res.status]} {res.status} | {num(res.value)} | "
            f"{threshold_text(res.threshold)} | {msg} |"
        )
    return lines, "\n".join(md) + "\n"


_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """Text XML 1.0 can hold: characters it forbids (control characters in a group id)
    written as \\xNN."""
    return _XML_INVALID.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def check_junit(r: CheckReport) -> str:
    """A JUnit XML report: one test case per rule (fail: failure; skip: skipped)."""
    import xml.etree.ElementTree as ET

    suite = ET.Element(
        "testsuite",
        {
            "name": "grpo-cli check",
            "tests": str(len(r.results)),
            "failures": str(sum(x.status == "fail" for x in r.results)),
            "skipped": str(sum(x.status == "skip" for x in r.results)),
            "errors": "0",
        },
    )
    for res in r.results:
        case = ET.SubElement(suite, "testcase", {"classname": "grpo-cli.check", "name": res.rule})
        detail = _xml_text(res.message + "".join(f"\nat {example_text(e)}" for e in res.examples))
        message = _xml_text(res.message)
        if res.status == "fail":
            ET.SubElement(case, "failure", {"message": message}).text = detail
        elif res.status == "skip":
            ET.SubElement(case, "skipped", {"message": message})
        elif res.status == "warn":
            ET.SubElement(case, "system-out").text = "warning: " + detail
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
    )
