"""The files ``grpo-cli check`` writes besides stdout (``--report``, ``--summary``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..records import CheckReport


def _write(path: Path, text: str, what: str, mode: str = "w") -> None:
    try:
        with open(path, mode, encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write ({exc.strerror or exc})") from None


def write_outputs(
    report: CheckReport,
    output_format: str,
    report_path: Path | None = None,
    step_summary: str | None = None,
) -> str | None:
    """Write the report where it was asked for (``--report``: the JSON document; with
    ``github``, the markdown summary appended to ``step_summary``, the file
    ``$GITHUB_STEP_SUMMARY`` names, before any annotation: a failure there leaves stdout
    empty) and return what stdout gets in ``output_format`` (None: the table)."""
    from ..views.json import check_json, dumps

    doc = check_json(report)
    if report_path is not None:
        _write(report_path, dumps(doc) + "\n", "--report")
    if output_format == "json":
        return dumps(doc) + "\n"
    if output_format == "github":
        from ..views.ci import check_github

        lines, summary = check_github(report)
        if step_summary:
            _write(Path(step_summary), summary, "$GITHUB_STEP_SUMMARY", "a")
        return "".join(line + "\n" for line in lines)
    if output_format == "junit":
        from ..views.ci import check_junit

        return check_junit(report)
    return None
