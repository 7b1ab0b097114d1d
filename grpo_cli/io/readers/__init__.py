"""The input formats grpo-cli reads, one reader module each, registered here.

Adding a format: a module with a reader class (the :class:`~grpo_cli.io.readers.base.Reader`
protocol: its names, rows, answer columns, units and raw batches), one line below, and its
tests. Nothing outside the readers tests a format's name. Formats sharing a file name
ending are told apart by their ``claims``; the first reader that takes a file reads it, so
a reader that claims files by their content comes before the one that takes the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..paths import InputPath
from ..run import RecordedRun, register_layout
from .base import AnswerColumns, ReadColumns, Reader, Unit, claims
from .jsonl import JsonlReader
from .nemo_rl import NemoRLReader
from .npz import NpzReader
from .parquet import ParquetReader
from .prime_rl import LAYOUT as PRIME_RL_LAYOUT
from .prime_rl import PrimeRLReader
from .slime import LAYOUT as SLIME_LAYOUT
from .slime import SlimeReader

__all__ = [
    "READERS",
    "AnswerColumns",
    "ReadColumns",
    "Reader",
    "Unit",
    "directory_files",
    "reader_for",
    "run_of",
    "suffix_list",
]

READERS: tuple[type[Reader], ...] = (
    ParquetReader,
    NpzReader,
    PrimeRLReader,  # prime-rl's token_exports/step_N/rank_R.jsonl, told apart by its path
    SlimeReader,  # slime's --dump-details train_data/{rollout_id}.pt
    NemoRLReader,  # NeMo-RL's train_data_step{N}.jsonl, told apart by its fields
    JsonlReader,  # every other .jsonl: grpo-cli's own fields
)

register_layout(PRIME_RL_LAYOUT)  # prime-rl's output directory (token_exports/step_N)
register_layout(SLIME_LAYOUT)  # slime's --dump-details directory (train_data/{id}.pt)


def reader_for(p: InputPath) -> type[Reader] | None:
    """The reader of a file by its name's ending, in any case, and (for endings several
    formats share) by its claims (None: no reader takes it)."""
    return next((r for r in READERS if claims(r, p)), None)


def directory_files(p: Path) -> list[Path] | None:
    """The files of a directory a reader recognises by its layout (a slime dump's
    ``train_data/*.pt``), in step order; None when no reader does."""
    for r in READERS:
        find: Callable[[Path], list[Path] | None] | None = getattr(r, "directory_files", None)
        found = None if find is None else find(p)
        if found is not None:
            return found
    return None


def run_of(p: Path) -> RecordedRun | None:
    """The trainer and config an input's own files name (a slime dump's ``args.json``), as a
    recorded run's ``meta.json`` would; None when no reader knows ``p``."""
    for r in READERS:
        find: Callable[[Path], RecordedRun | None] | None = getattr(r, "run_of", None)
        found = None if find is None else find(p)
        if found is not None:
            return found
    return None


def suffix_list(conjunction: str = "or") -> str:
    """Every suffix a reader takes, once, for messages: ``.parquet, .pq, .npz, .jsonl or
    .jsonl.gz``."""
    every = list(dict.fromkeys(s for r in READERS for s in r.suffixes))
    return ", ".join(every[:-1]) + f" {conjunction} " + every[-1]
