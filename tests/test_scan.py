"""check's integrity scan (``_scan_batch``): its counts and first places of non-finite,
positive and zero log-probs inside the mask are those of a plain loop over the valid
tokens, whatever the padding holds, on the fast path (a clean batch: two reductions) and
the slow one (token by token)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_cli.check.base import MAX_EXAMPLES, CheckConfig
from grpo_cli.check.rules import RULES
from grpo_cli.check.scan import Scan, _scan_batch
from grpo_cli.io import raw_from_arrow


class _Src:
    """The one thing the scan asks of a source: a field's name in the input."""

    def name(self, field: str) -> str:
        return field


SPECIAL = [math.nan, math.inf, -math.inf, 0.5, 0.0]


def _rows(seed: int, n: int, masked: bool, p_bad: float, p_pad: float) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, list[Any]] = {"logp": [], "old_logp": [], "entropy": [], "mask": []}
    for _ in range(n):
        w = int(rng.integers(1, 9))
        mask = rng.random(w) < 0.8 if masked else np.ones(w, bool)
        for f in ("logp", "old_logp", "entropy"):
            v = -rng.exponential(1.0, w) if f != "entropy" else rng.exponential(1.0, w)
            for t in range(w):
                p = p_bad if mask[t] else p_pad  # padding may hold anything
                if rng.random() < p:
                    v[t] = SPECIAL[int(rng.integers(len(SPECIAL)))]
            out[f].append(v.tolist())
        out["mask"].append(mask.tolist())
    return out


def _expected(rows: dict[str, Any]) -> dict[str, Any]:
    """Counts and the first places (answer, token) by a loop over valid tokens."""
    want: dict[str, Any] = {"nonfinite": [], "positive": [], "zero": 0, "tokens": 0}
    for i, mask in enumerate(rows["mask"]):
        want["tokens"] += sum(mask)
        for f in ("logp", "old_logp", "entropy"):
            for t, (x, ok) in enumerate(zip(rows[f][i], mask, strict=True)):
                if not ok:
                    continue
                if not math.isfinite(x):
                    want["nonfinite"].append((i, t, f))
                if x > 0 and f != "entropy":  # +inf is both
                    want["positive"].append((i, t, f))
                if f == "logp" and x == 0:
                    want["zero"] += 1
    return want


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 12),
    masked=st.booleans(),
    dtype=st.sampled_from([pa.float32(), pa.float64()]),
    p_bad=st.sampled_from([0.0, 0.02, 0.3]),
    p_pad=st.sampled_from([0.0, 0.5]),
)
def test_scan_counts_what_a_loop_counts(
    seed: int, n: int, masked: bool, dtype: pa.DataType, p_bad: float, p_pad: float
) -> None:
    rows = _rows(seed, n, masked, p_bad, p_pad)
    cols = {f: pa.array(rows[f], pa.list_(dtype)) for f in ("logp", "old_logp", "entropy")}
    cols["mask"] = pa.array(rows["mask"], pa.list_(pa.bool_()))
    rb = pa.RecordBatch.from_pydict(cols)
    raw = raw_from_arrow(rb, {f: f for f in cols}, label="t")
    s = Scan()
    cfg = CheckConfig(rules={rid: rc for rid, (_, rc) in RULES.items()})
    _scan_batch(s, raw, _Src(), cfg)  # type: ignore[arg-type]
    want = _expected(rows)
    assert s.tokens == want["tokens"]
    assert s.zero == want["zero"]
    for what in ("nonfinite", "positive"):
        assert getattr(s, what) == len(want[what]), what
        # the first places, field by field in the scan's order (logp, old_logp, entropy)
        order = {"logp": 0, "old_logp": 1, "entropy": 2}
        places = sorted(want[what], key=lambda p: (order[p[2]], p[0], p[1]))
        got = [(e["answer"], e["token"], e["field"]) for e in getattr(s, f"{what}_ex")]
        assert len(got) == min(MAX_EXAMPLES, len(places))
        assert set(got) <= set(places)
    assert s.empty == sum(1 for m in rows["mask"] if not any(m))
