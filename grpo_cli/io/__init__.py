"""Reading rollout logs: the forgiving boundary.

Whatever a file holds (float32, int rewards, int or float 0/1 masks, list columns, a
framework's own names) becomes canonical arrays here, and anything that cannot is an
:class:`~grpo_cli.errors.InputError` naming the file, the array or column and what is
wrong. Padding is dropped when a batch is validated, so it never reaches a result.

:func:`open_source` resolves the input and its reader (:mod:`grpo_cli.io.readers`, one
per format); :func:`load_answers` is pass 1 (group, reward, advantage: small columns);
the plan (:mod:`grpo_cli.engine.run`) streams the token columns.
"""

from .answers import Answers, load_answers
from .arrow import arrow_of, numpy_of
from .fields import (
    ALIASES,
    ANSWER_FIELDS,
    FIELDS,
    TOKEN_FIELDS,
    TOKEN_IDS,
    TOKEN_VALUES,
    parse_column_map,
)
from .lists import raw_from_arrow
from .paths import InputPath, RemoteFile
from .source import Source, open_source
from .write import write_advantages

__all__ = [
    "ALIASES",
    "ANSWER_FIELDS",
    "FIELDS",
    "TOKEN_FIELDS",
    "TOKEN_IDS",
    "TOKEN_VALUES",
    "Answers",
    "InputPath",
    "RemoteFile",
    "Source",
    "arrow_of",
    "load_answers",
    "numpy_of",
    "open_source",
    "parse_column_map",
    "raw_from_arrow",
    "write_advantages",
]
