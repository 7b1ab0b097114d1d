"""``grpo-cli report``: the record of a report to share (:class:`ShareReport`), built from
the other commands' records: the objective (with its gradient, as ``explain`` computes
it), ``explain``'s findings, ``check``'s verdict, the worst answers and, when the input
holds them, their text (a ``completion`` column) and their tokens' strings (a ``tokens``
column of lists, as long as the answer's log-probs) with each token's KL and log-ratio;
the trend when the input is several steps. :mod:`grpo_cli.views.html` renders it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine.options import EngineOptions
from ..records import AnswerText, CheckReport, ShareReport
from ..settings import Settings

if TYPE_CHECKING:
    from ..io import Source

__all__ = [
    "PROMPT_COLUMNS",
    "TEXT_COLUMNS",
    "TOKEN_COLUMNS",
    "AnswerText",
    "ShareReport",
    "answer_texts",
    "share_report",
]

# the columns an answer's text is read from (the first present), its prompt's, and its
# tokens' strings (a list as long as the answer's token lists)
TEXT_COLUMNS = ("completion", "completions", "response_text", "text")
PROMPT_COLUMNS = ("prompt", "prompts", "query")
TOKEN_COLUMNS = ("tokens", "completion_tokens", "token_strings")
TEXT_LIMIT = 4000  # characters of an answer's text kept in the report
TOKEN_LIMIT = 2000  # tokens of an answer coloured in the report
COLOURED = 3  # the worst answers whose tokens are coloured


def _present(src: Source, names: Sequence[str]) -> str | None:
    return next((n for n in names if n in src.present), None)


def _row_values(path: Path, row: int, columns: list[str]) -> dict[str, Any]:
    """The values of ``columns`` at ``row`` of a parquet file, reading one row group."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    start = 0
    for g in range(f.num_row_groups):
        n = f.metadata.row_group(g).num_rows
        if row < start + n:
            t = f.read_row_group(g, columns=columns)
            return {c: t.column(c)[row - start].as_py() for c in columns}
        start += n
    raise IndexError(f"{path}: no row {row}")


def answer_texts(
    src: Source, settings: Settings, rows: list[dict[str, Any]], notes: list[str]
) -> list[AnswerText]:
    """The text and token strings of ``rows`` (``answers``' rows) where the input has
    them: parquet files on this machine, the columns :data:`TEXT_COLUMNS`,
    :data:`PROMPT_COLUMNS` and :data:`TOKEN_COLUMNS`."""
    from ..core import kl_from_log_ratio

    text_col, prompt_col = _present(src, TEXT_COLUMNS), _present(src, PROMPT_COLUMNS)
    token_col = _present(src, TOKEN_COLUMNS)
    if text_col is None and token_col is None:
        return [AnswerText(r) for r in rows]
    by_name = {p.name: p for p in src.paths if isinstance(p, Path)}
    out = []
    for i, r in enumerate(rows):
        path = by_name.get(str(r["source"]))
        if path is None or path.suffix.lower() not in (".parquet", ".pq"):
            out.append(AnswerText(r))
            continue
        cols = [c for c in (text_col, prompt_col) if c is not None]
        fields = {f: src.name(f) for f in ("logp", "old_logp", "ref_logp", "mask") if src.has(f)}
        want_tokens = token_col is not None and i < COLOURED
        if want_tokens:
            cols += [token_col, *fields.values()]  # type: ignore[list-item]
        values = _row_values(path, int(r["row"]), sorted(set(cols)))
        text = values.get(text_col) if text_col else None
        cut = isinstance(text, str) and len(text) > TEXT_LIMIT
        kw: dict[str, Any] = {
            "completion": text[:TEXT_LIMIT] if isinstance(text, str) else None,
            "prompt": values.get(prompt_col) if prompt_col else None,
            "truncated": cut,
        }
        toks = values.get(token_col) if want_tokens and token_col else None
        logp = values.get(fields.get("logp", ""))
        if toks is not None and logp is not None and len(toks) == len(logp):
            valid = np.ones(len(logp), dtype=bool)
            if "mask" in fields and values.get(fields["mask"]) is not None:
                valid = np.asarray(values[fields["mask"]], dtype=bool)
            lp = np.asarray(logp, dtype=np.float64)[valid]
            old = values.get(fields.get("old_logp", ""))
            ref = values.get(fields.get("ref_logp", ""))
            lr = lp - np.asarray(old, dtype=np.float64)[valid] if old is not None else lp * 0
            kl = None
            if ref is not None:
                d = np.asarray(ref, dtype=np.float64)[valid] - lp
                kl = kl_from_log_ratio(
                    d,
                    estimator=settings.kl_estimator,
                    clamp=settings.kl_clamp,
                    log_ratio_clamp=settings.log_ratio_clamp,
                ).tolist()[:TOKEN_LIMIT]
            strings = [str(t) for t, v in zip(toks, valid.tolist(), strict=True) if v]
            kw.update(tokens=strings[:TOKEN_LIMIT], token_kl=kl,
                      token_log_ratio=lr.tolist()[:TOKEN_LIMIT])  # fmt: skip
        elif toks is not None:
            notes.append(
                f"{path.name} row {r['row']}: {token_col!r} has {len(toks)} tokens but "
                f"{src.name('logp')!r} {0 if logp is None else len(logp)}: not coloured"
            )
        out.append(AnswerText(r, **kw))
    return out


def _several_steps(specs: Sequence[str], src: Source) -> bool:
    """Whether the input is several training steps: files named by their step, or a
    recorded run's directory."""
    from ..io.run import find_run

    if any("://" not in s and Path(s).is_dir() and find_run(Path(s)) for s in specs):
        return True
    names = [p.name for p in src.paths]
    return len(names) > 1 and all(re.search(r"step[_\-]?\d+", n, re.I) for n in names)


def share_report(
    specs: Sequence[str],
    src: Source,
    settings: Settings,
    *,
    engine: EngineOptions | None = None,
    top: int = 10,
    progress: Callable[[int], None] | None = None,
    check: CheckReport | None = None,
) -> ShareReport:
    """Every record the report shows, for ``src``.

    Args:
      specs: the inputs as they were named (a run's steps give the report its trend).
      src: the opened input (:func:`grpo_cli.io.open_source` of ``specs``).
      settings: the conventions (:func:`grpo_cli.resolve_settings`).
      engine: how to read and fold (None: the local engine's defaults).
      top: the answers the report lists.
      progress: called with the answers done, for a progress bar.
      check: a check report already made (``check --report-html``); None: checked here."""
    engine = (engine or EngineOptions()).resolved()
    from ..check.config import load_config
    from .answers import answers_report
    from .check import run_check
    from .explain import explain_findings
    from .objective import objective_report
    from .trend import trend_report

    notes: list[str] = []
    if check is None:
        check = run_check(src, settings, load_config(None), engine=engine)
    r = objective_report(src, settings, engine=engine, gradient=True, progress=progress)
    findings = explain_findings(r)
    answers = None
    texts: list[AnswerText] = []
    if src.has("logp"):
        sort = "kl" if src.has("ref_logp") else "ratio"
        answers = answers_report(src, settings, sort=sort, top=top, engine=engine)
        texts = answer_texts(src, settings, answers.rows, notes)
    trend = None
    if _several_steps(specs, src) and engine.name == "local":
        trend = trend_report(specs, settings, engine=engine)
    return ShareReport(src.label, r, findings, check, answers, texts, trend, notes)
