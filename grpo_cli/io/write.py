"""Writing what a command computed: the advantages (``advantages --out``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import UsageError

__all__ = ["write_advantages"]


def write_advantages(out: Path, advantages: np.ndarray, groups: list[Any]) -> None:
    """Write advantages: .npz ``advantages`` (shaped like the rewards), or .parquet with
    ``group`` and ``advantage`` per answer in row order."""
    try:
        if out.suffix.lower() == ".npz":
            np.savez(out, advantages=advantages)
        else:
            table = pa.table({"group": groups, "advantage": advantages.reshape(-1)})
            pq.write_table(table, out)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
