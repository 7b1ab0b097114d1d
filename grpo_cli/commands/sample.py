"""Synthetic GRPO rollouts of any size (``grpo-cli sample``), written in bounded memory.

The data look like a real log: binary correctness rewards with per-prompt difficulty
(so some groups are all right or all wrong: zero variance), log-normal answer lengths
(ragged, 10-100x spread), log-probs near 0 for most tokens with a heavy tail, a current
policy a small step away from the sampler (a few clipped tokens), a reference policy
nearby. Token fields are stored as float32, as trainers log them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import UsageError
from ..io import TOKEN_VALUES

__all__ = ["SampleSpec", "generate_chunks", "write_sample"]

TOKEN_FIELDS = TOKEN_VALUES


@dataclass(frozen=True)
class SampleSpec:
    groups: int = 64
    group_size: int = 8
    mean_len: int = 200
    max_len: int | None = None  # default 8 x mean_len
    seed: int = 0
    drift: float = 0.05  # std of logp − old_logp per token
    shuffle: bool = True  # parquet: answers of a group are not adjacent
    rewards_only: bool = False  # npz: only rewards (P, G)
    extras: bool = False  # also rollout_logp (the sampler's own log-probs) and entropy
    row_group_rows: int = 1 << 14  # parquet: answers per row group


def _check(spec: SampleSpec) -> None:
    if spec.groups < 1 or spec.group_size < 1 or spec.mean_len < 1:
        raise UsageError("--groups, --group-size and --mean-len must be >= 1")
    if spec.seed < 0:
        raise UsageError(f"--seed: must be >= 0, got {spec.seed}")
    if spec.mean_len > 1 << 24 or (spec.max_len is not None and spec.max_len > 1 << 24):
        raise UsageError("--mean-len and --max-len: at most 16,777,216 tokens an answer")
    if spec.groups * spec.group_size > 1 << 28:
        raise UsageError("--groups × --group-size: at most 268,435,456 answers")
    if spec.row_group_rows < 1:
        raise UsageError(f"--row-group-rows: must be >= 1, got {spec.row_group_rows}")
    if spec.max_len is not None and spec.max_len < 1:
        raise UsageError("--max-len must be >= 1")


CHUNK_TOKENS = 1 << 22  # tokens a chunk holds on average: memory is bounded by it


def generate_chunks(
    spec: SampleSpec, groups_per_chunk: int | None = None
) -> Iterator[dict[str, object]]:
    """Yield chunks of whole groups: ``group`` (str), ``reward``, ragged ``logp`` etc.
    By default up to 2,048 groups, fewer when that would hold more than about
    :data:`CHUNK_TOKENS` tokens (the data of a seed depends on the chunking: files of
    fewer tokens are the same as they always were)."""
    _check(spec)
    if groups_per_chunk is None:
        per_group = spec.group_size * spec.mean_len
        groups_per_chunk = max(1, min(2048, CHUNK_TOKENS // max(per_group, 1)))
    rng = np.random.default_rng(spec.seed)
    max_len = spec.max_len or 8 * spec.mean_len
    G = spec.group_size
    for g0 in range(0, spec.groups, groups_per_chunk):
        ng = min(groups_per_chunk, spec.groups - g0)
        n = ng * G
        difficulty = rng.beta(0.6, 0.6, size=ng)  # many easy / impossible prompts
        reward = (rng.random((ng, G)) < difficulty[:, None]).astype(np.float64).reshape(-1)
        sigma = 0.9
        mu = np.log(spec.mean_len) - sigma**2 / 2
        lengths = np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), 1, max_len).astype(np.int64)
        T = int(lengths.sum())
        # Sampler log-probs: most tokens confident, a heavy tail of unlikely ones.
        old = -rng.exponential(0.35, size=T) - np.where(
            rng.random(T) < 0.03, rng.exponential(3.0, size=T), 0.0
        )
        step = rng.normal(0.0, spec.drift, size=T)
        wild = rng.random(T) < 0.004  # a few tokens moved a lot: clipped
        step[wild] = rng.normal(0.0, 0.6, size=int(wild.sum()))
        logp = np.minimum(old + step, -1e-6)
        ref = np.minimum(old + rng.normal(0.0, 0.04, size=T), -1e-6)
        ids = np.repeat(np.arange(g0, g0 + ng), G)
        chunk: dict[str, object] = {
            "group": np.array([f"prompt-{i:06d}" for i in ids]),
            "reward": reward,
            "lengths": lengths,
            "logp": logp.astype(np.float32),
            "old_logp": old.astype(np.float32),
            "ref_logp": ref.astype(np.float32),
        }
        if spec.extras:  # drawn last: the fields above are the same with or without them
            # the engine's log-probs differ from the trainer's by kernel/precision noise
            rollout = np.minimum(old + rng.normal(0.0, 0.01, size=T), -1e-6)
            chunk["rollout_logp"] = rollout.astype(np.float32)
            entropy = np.minimum(-old + rng.exponential(0.3, size=T), np.log(150_000))  # ≤ log V
            chunk["entropy"] = entropy.astype(np.float32)
        yield chunk


def _to_table(chunk: dict[str, object], rng: np.random.Generator, shuffle: bool) -> pa.Table:
    lengths = np.asarray(chunk["lengths"])
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    cols = {
        "group": pa.array(chunk["group"]),
        "reward": pa.array(chunk["reward"]),
    }
    for f in TOKEN_FIELDS:
        if f in chunk:
            cols[f] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(chunk[f]))
    table = pa.table(cols)
    if shuffle:
        table = table.take(pa.array(rng.permutation(table.num_rows)))
    return table


def write_sample(out: Path, spec: SampleSpec) -> tuple[int, int]:
    """Write synthetic rollouts to ``out`` (.parquet streamed, or .npz padded).

    Returns:
        (answers, valid tokens) written.
    """
    suffix = out.suffix.lower()
    if suffix not in (".parquet", ".npz"):
        raise UsageError(f"{out}: the output must end in .parquet or .npz")
    rng = np.random.default_rng(spec.seed + 1)
    n = t = 0
    if suffix == ".parquet":
        writer = None
        try:
            for chunk in generate_chunks(spec):
                table = _to_table(chunk, rng, spec.shuffle)
                if writer is None:
                    writer = pq.ParquetWriter(out, table.schema)
                writer.write_table(table, row_group_size=spec.row_group_rows)
                n += table.num_rows
                t += int(np.asarray(chunk["lengths"]).sum())
        finally:
            if writer is not None:
                writer.close()
        return n, t
    # npz: padded (N, L) arrays, rewards (P, G); the whole thing in memory.
    chunks = list(generate_chunks(spec))
    rewards = np.concatenate([np.asarray(c["reward"]) for c in chunks]).reshape(
        spec.groups, spec.group_size
    )
    if spec.rewards_only:
        np.savez_compressed(out, rewards=rewards)
        return rewards.size, 0
    lengths = np.concatenate([np.asarray(c["lengths"]) for c in chunks])
    N, L = lengths.shape[0], int(lengths.max())
    mask = np.arange(L)[None, :] < lengths[:, None]
    arrays: dict[str, np.ndarray] = {"mask": mask}
    for f in (f for f in TOKEN_FIELDS if f in chunks[0]):
        padded = np.zeros((N, L), dtype=np.float32)  # padding value: any finite number
        padded[mask] = np.concatenate([np.asarray(c[f]) for c in chunks])
        arrays[f] = padded
    arrays["rewards"] = rewards
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
    return N, int(lengths.sum())
