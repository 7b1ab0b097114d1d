"""Benchmark: the numpy part of each loss, correction and mask on the kernel's path, in
process, in CPU nanoseconds per token.

On the compiled path (:func:`grpo_cli.fold.loss.loss_policy`) a row's own work is its
registry function over one batch (runs of whole answers, or the whole batch for a loss
that selects over it), its metrics and its masks; the kernel then sums its terms in the
pass it makes anyway. This times that part alone, on one synthetic batch of ~1.1M tokens
(800 answers, log-normal lengths of mean ~1,400, float32 columns as logged), against one
call of the kernel on the same batch: what `bench/losses.py` measures end to end, without
the reading, start-up and threads around it (a whole ``objective`` run costs ~200-250 ns a
token of CPU on the CI machine kind, so 1.2x leaves ~40-50 ns a token to a row). glibc's
allocator is tuned as the CLI tunes it (``grpo_cli.cli.app._tune_allocator``: freed
temporaries stay in the heap), so a fresh temporary costs what it costs in ``objective``.

Usage: python bench/loss_terms.py [--repeat 3] [ROW ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo_cli.cli.app import _tune_allocator
from grpo_cli.core import kernel as _fast
from grpo_cli.fold.loss import LossMetrics, loss_policy
from grpo_cli.fold.parts import LOG_RATIO_BINS
from grpo_cli.losses import CORRECTIONS, LOSSES, MASKS
from grpo_cli.trainers.presets import resolve_settings

# the settings that turn a row on where its defaults leave it off
ON: dict[str, dict[str, Any]] = {
    "verl/dro": {"dro_beta": 0.3},
    "verl-rollout": {"rollout_is": "token"},
    "trl/top_entropy_mask": {"entropy_mask": True},
    "trl/off_policy_mask": {"off_policy_mask_threshold": 0.5},
    "slime/opsm": {"use_opsm": True},
}


def batch(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.8, 1.0, 800).astype(np.int64), 1, 8192)
    off = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    t = int(off[-1])
    lp = -rng.exponential(1.0, t)
    old = lp + rng.normal(0, 0.1, t)
    fields = {
        "logp": lp.astype(np.float32),
        "old_logp": old.astype(np.float32),
        "ref_logp": (lp + rng.normal(0, 0.1, t)).astype(np.float32),
        "rollout_logp": (old + rng.normal(0, 0.1, t)).astype(np.float32),
        "entropy_mask": (rng.random(t) < 0.7).astype(np.float64),
    }
    return fields, off, rng.normal(0, 1, lengths.shape[0])


def cases() -> dict[str, dict[str, Any]]:
    out = {n: {"loss": n, **ON.get(n, {})} for n in LOSSES if n != "clip"}
    out |= {n: {"correction": n, **ON.get(n, {})} for n in CORRECTIONS}
    out |= {n: dict(ON[n]) for n in MASKS}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("rows", nargs="*")
    args = ap.parse_args()
    _tune_allocator()
    f, off, adv = batch()
    t = int(off[-1])
    o = resolve_settings().term_options()
    t0 = time.process_time()
    for _ in range(args.repeat):
        _fast.fold(f["logp"], f["old_logp"], f["ref_logp"], adv, off, options=o,
                   bins=LOG_RATIO_BINS)  # fmt: skip
    per = (time.process_time() - t0) / args.repeat / t * 1e9
    print(f"{t:,} tokens; the kernel's pass: {per:.1f} ns a token")
    for name, kw in cases().items():
        if args.rows and name not in args.rows:
            continue
        s = resolve_settings(**kw)
        m = LossMetrics.of(s)
        t0 = time.process_time()
        for _ in range(args.repeat):
            loss_policy(s, f, adv, off, m, gradient=False)
        per = (time.process_time() - t0) / args.repeat / t * 1e9
        print(f"{name:<24} {per:6.1f} ns a token", flush=True)


if __name__ == "__main__":
    main()
