"""MkDocs hook (mkdocs.yml ``hooks``): the reference tables of ``docs/reference.py``,
generated from the code each time the site is built, in place of their
``<!-- generated: NAME -->`` lines; and the griffe extension of the API page
(:class:`DoctestExamples`)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import griffe

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:  # the checkout's grpo_cli, installed or not
    sys.path.insert(0, str(_HERE.parent))
_spec = importlib.util.spec_from_file_location("grpo_cli_docs_reference", _HERE / "reference.py")
assert _spec is not None and _spec.loader is not None
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return reference.expand(markdown, f"docs/{page.file.src_path}")


class DoctestExamples(griffe.Extension):
    """grpo-cli's docstrings head their doctests ``Example:``, which griffe's Google parser
    reads as an admonition of Markdown (``[1.0, 2.0]`` there is a link); ``Examples:`` is
    its examples section, rendered as code."""

    def on_instance(self, *, obj: Any, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = re.sub(r"(?m)^Example:$", "Examples:", obj.docstring.value)
