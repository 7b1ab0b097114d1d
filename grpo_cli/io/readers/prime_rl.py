"""prime-rl's output directory, read as it writes it: its token exports, joined to its
rollout traces for the groups and rewards.

The writer (PrimeIntellect-ai/prime-rl, commit 559b4477, version 0.8.0), under the
trainer's ``output_dir`` (``outputs`` by default, configs/trainer.py:628); the layout is
described with file:line in ``conformance/frontier/LAYOUTS.md`` ("prime-rl (a)")::

    configs/trainer.json                   the resolved trainer config: its "loss" section
    metrics.jsonl                          {"step", "time", **metrics} per logged step
    token_exports/step_N/rank_R.jsonl      trainer.enable_token_export: one JSON line per
                                           trained sequence (schema_version 1)
    token_exports/step_N/STABLE            touched after every rank flushed step N
    rollouts/step_N/train/effective/traces.jsonl
                                           one episode per line: the cohort step N trained on

What is read of a token record, and as what (its loss-mask tokens only: prime-rl's loss
reads no other)::

    trainer_logprobs    the training forward's log-probs        -> logp
    inference_logprobs  the sampler's (prime-rl's ratio is
                        exp(trainer − inference))               -> old_logp
    advantages          per token                               -> advantage
    entropy             per token                               -> entropy
    loss_mask           which tokens count                      -> the tokens kept
    rank, micro_step    the batch plan (micro-batches counted for loss/mean)

A record carries no episode, trace or group id: it is joined to the step's traces by
content. A trace's branches (one per leaf node: the path from the root to it) are indexed
by a hash of their tokens up to their first sampled one; a record's candidates are the
branches of its own key, and a branch matches when the record's ``token_ids`` and
``loss_mask`` equal the branch's concatenated nodes' ``token_ids`` and sampled mask (a
prefix of them when the record was truncated) and its ``inference_logprobs`` (float32)
the branch's log-probs on the sampled tokens. A match gives the group (the episode's
``group.id``) and the reward (``Σ score·weight`` of the trace's ``rewards``). Records that
match no branch, or branches of different groups or rewards, are counted and named,
never guessed: then the step is read without groups and rewards (the loss and its metrics
do not need them; the group statistics are null), with a note.

Only a step whose ``STABLE`` marker is present is read (a step without it is refused,
naming it; ``trend`` skips it and names it). Memory: one step at a time (its loss tokens
and its traces' index).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ..bounded import MAX_LINE, loads, mib, read_document, regular
from ..lists import list_array
from ..paths import InputPath
from ..run import FORMAT, RecordedRun, RecordedStep, step_of_dir
from ._tables import TableReader

__all__ = ["LAYOUT", "PrimeRLReader", "PrimeRLRun", "PrimeRLStep", "read_step"]

SCHEMA_VERSION = 1
STABLE = "STABLE"
EXPORTS = "token_exports"
VERSION = "0.8.0"  # prime-rl's pyproject version at commit 559b4477
_RANK = re.compile(r"rank_(\d{1,9})\.jsonl$")
# the record fields read, each a list of the record's length
_LISTS = ("token_ids", "loss_mask", "advantages", "inference_logprobs", "trainer_logprobs",
          "entropy")  # fmt: skip
# the table's columns: the field each holds and the record field it comes from
COLUMNS = {
    "logp": "trainer_logprobs",
    "old_logp": "inference_logprobs",
    "advantages": "advantages",
    "entropy": "entropy",
}
MICRO_BATCHES = "token_export.micro_batches"  # grpo-cli's count, in the run's config
LOSS_KEYS = "trainer_config.loss_keys"  # the loss section's key names (trainers/prime_rl.py)
_SHOWN = 5  # records named in a note
# a rank, micro-step or sequence index beyond this is no count prime-rl makes (its int32
# tensors): refused, so the micro-batch count for loss/mean stays bounded
_MAX_INDEX = 2**31


def traces_path(root: Path, step: int) -> Path:
    """The traces of the cohort trainer step ``step`` trained on (monitors/file.py:43-59)."""
    return root / "rollouts" / f"step_{step}" / "train" / "effective" / "traces.jsonl"


# ------------------------------------------------------------------------ the layout
@dataclasses.dataclass(frozen=True)
class PrimeRLRun(RecordedRun):
    """A prime-rl output directory as a recorded run: its steps are
    ``token_exports/step_N``, its settings its ``configs/trainer.json``'s loss section,
    its logged metrics its ``metrics.jsonl``."""

    @property
    def config_file(self) -> str:
        return "configs/trainer.json"

    def steps(self) -> list[RecordedStep]:
        exports = self.root / EXPORTS
        found = [(step_of_dir(d), d) for d in exports.iterdir() if d.is_dir()]
        return sorted((_step(self, d, n) for n, d in found if n is not None), key=lambda s: s.step)

    def latest(self) -> RecordedStep | None:
        """The last ``STABLE`` step (a command given the output directory reads it, said
        in a note); every step when none is (each then refused, naming it)."""
        steps = self.steps()
        done = [s for s in steps if s.done]
        if not steps:
            raise InputError(f"{self.root / EXPORTS}: no step_N directory (no token export yet)")
        return recorded_step(done[-1].directory) if done else steps[-1]


@dataclasses.dataclass(frozen=True)
class PrimeRLStep(RecordedStep):
    """One ``token_exports/step_N``: its rank files, and whether ``STABLE`` is there."""

    marker: ClassVar[str] = STABLE

    def calls(self) -> dict[int, list[int]]:
        return {0: list(range(len(self.files)))}

    def require_done(self) -> None:
        if not self.done:
            raise InputError(
                f"{self.directory}: no {STABLE} marker: prime-rl touches it once every rank "
                "flushed the step's export, so the step was not completely written (the run "
                "stopped, or is still writing it); trend skips such steps"
            )

    def require_readable(self) -> None:
        """A ``STABLE`` step with rank files whose every record reads (a line cut while
        written, a wrong field): else one line naming the file and the line, and ``trend``
        skips the step. The step read is kept (:func:`read_step`): it is read once."""
        self.require_done()
        if not self.files:
            raise InputError(f"{self.directory}: a STABLE step without a rank_R.jsonl file")
        read_step(self.files)


def _read_config(root: Path) -> dict[str, Any]:
    """The loss section of ``configs/trainer.json`` as dotted keys (``loss.type``, ...)
    and the section's key names (:data:`LOSS_KEYS`); empty without the file (the trainer
    module names prime-rl's defaults in a note)."""
    path = root / "configs" / "trainer.json"
    if not path.exists():
        return {}
    doc = loads(read_document(path, "prime-rl trainer config"), str(path))
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a JSON object (prime-rl writes its trainer config)")
    loss = doc.get("loss", {})
    if not isinstance(loss, dict):
        raise InputError(f"{path}: 'loss' is a {type(loss).__name__}: expected an object")
    return {**{f"loss.{k}": v for k, v in loss.items()}, LOSS_KEYS: sorted(map(str, loss))}


def _run(root: Path, micro_batches: int | None = None) -> PrimeRLRun:
    config = _read_config(root)
    if micro_batches is not None:
        config[MICRO_BATCHES] = micro_batches
    meta = {"format": FORMAT, "format_version": 1, "trainer": "prime_rl",
            "trainer_version": VERSION, "config": config}  # fmt: skip
    return PrimeRLRun(root, meta)


def _step(run: RecordedRun, d: Path, n: int) -> PrimeRLStep:
    files = [(int(m.group(1)), p) for p in d.iterdir() if (m := _RANK.search(p.name))]
    # every rank file: one that is a FIFO, a device or a directory is named when it is
    # read, never left out (the step would be read without that rank's records)
    ranked = tuple(p for _, p in sorted(files))
    return PrimeRLStep(run, n, d, ranked, (d / STABLE).exists())


def _is_output_dir(d: Path) -> bool:
    return d.is_dir() and (d / EXPORTS).is_dir()


def recorded_step(d: Path) -> PrimeRLStep | None:
    """``d`` as a prime-rl step (``token_exports/step_N``), or None; a ``STABLE`` step is
    read (once, :func:`read_step` keeps it) to count its micro-batches for ``loss/mean``."""
    n = step_of_dir(d)
    if n is None or not d.is_dir() or d.parent.name != EXPORTS:
        return None
    root = d.parent.parent
    step = _step(_run(root), d, n)
    if not step.done or not step.files:
        return step
    got = read_step(step.files)
    return _step(_run(root, got.micro_batches), d, n)


class _Layout:
    """prime-rl's output layout, for :func:`grpo_cli.io.run.find_run` and
    :func:`~grpo_cli.io.run.recorded_step`."""

    def find_run(self, d: Path) -> RecordedRun | None:
        if _is_output_dir(d):
            return _run(d)
        if (d / "rollouts").is_dir() and (d / "configs" / "trainer.json").exists():
            raise InputError(
                f"{d}: a prime-rl output directory without token_exports/: its traces hold no "
                "trainer log-probs, so no loss can be recomputed; run prime-rl with "
                "trainer.enable_token_export = true (it then writes token_exports/step_N)"
            )
        return None

    def recorded_step(self, d: Path) -> RecordedStep | None:
        return recorded_step(d)


LAYOUT = _Layout()


# ------------------------------------------------------------------- reading a step
@dataclasses.dataclass(frozen=True)
class Step:
    """One step read: its table (one row per record, loss tokens only), the micro-batches
    seen (rank, micro_step), and the notes of the join."""

    table: pa.Table
    micro_batches: int
    notes: tuple[str, ...]
    grouped: bool
    per_file: tuple[int, ...]  # each rank file's records


@dataclasses.dataclass
class _Record:
    where: str
    tokens: np.ndarray  # int64, every position
    mask: np.ndarray  # bool, every position
    inference: np.ndarray  # float32, every position (0 off the sampled tokens)
    values: dict[str, np.ndarray]  # the columns' loss-token values, float64
    weighted: bool  # a non-null rl_weights stream


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Each non-empty line of ``path`` with its number, at most :data:`MAX_LINE` bytes."""
    regular(path, "prime-rl file")
    try:
        with open(path, "rb") as fh:
            n = 0
            while line := fh.readline(MAX_LINE + 1):
                n += 1
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    raise InputError(f"{path}: line {n}: longer than {mib(MAX_LINE)}: not read")
                if line.strip():
                    yield n, line
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _numbers(rec: dict[str, Any], key: str, where: str, n: int, mask: np.ndarray) -> np.ndarray:
    """Field ``key`` as float64 ``(n,)``: a null off the loss tokens is 0 (prime-rl writes
    a non-finite value as null), on one it is refused, naming the position."""
    v = rec.get(key)
    if not isinstance(v, list) or len(v) != n:
        got = f"{len(v)} values" if isinstance(v, list) else repr(type(v).__name__)
        raise InputError(f"{where}: field {key!r} has {got}: expected a list of {n} numbers "
                         "(one per token_ids)")  # fmt: skip
    wrong = next((i for i, x in enumerate(v) if x is not None and not _number(x)), None)
    if wrong is not None:  # a string "1.5" or true would otherwise be read as a number
        raise InputError(f"{where}: field {key!r} holds {_shown(v[wrong])} at position "
                         f"{wrong}: expected a number (or null)")  # fmt: skip
    nulls = np.array([x is None for x in v], dtype=np.bool_)
    out = np.array([0.0 if x is None else x for x in v], dtype=np.float64)
    bad = np.flatnonzero((nulls | ~np.isfinite(out)) & mask)
    if bad.size:  # prime-rl writes a non-finite value as null; NaN is not JSON
        raise InputError(f"{where}: field {key!r} is null or non-finite at loss token "
                         f"position {int(bad[0])}: the loss cannot be recomputed")  # fmt: skip
    return out


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _token_ids(ids: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**63 for t in ids)


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _record(rec: Any, where: str, step: int) -> _Record:
    """One token-export line, checked (one line naming file:line and the field)."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: not a JSON object (a token-export record)")
    version = rec.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(f"{where}: schema_version {version!r}: this grpo-cli reads prime-rl's "
                         f"token exports of schema version {SCHEMA_VERSION}")  # fmt: skip
    if rec.get("step") != step:
        raise InputError(f"{where}: 'step' is {rec.get('step')!r} in the directory of step {step}")
    ids, lm = rec.get("token_ids"), rec.get("loss_mask")
    if not isinstance(ids, list) or not _token_ids(ids):
        raise InputError(f"{where}: field 'token_ids' is not a list of token ids (integers "
                         "from 0 to 2**63 - 1)")  # fmt: skip
    if not isinstance(lm, list) or len(lm) != len(ids) or not all(isinstance(b, bool) for b in lm):
        raise InputError(f"{where}: field 'loss_mask' is not a list of {len(ids)} booleans "
                         "(one per token_ids)")  # fmt: skip
    for key in ("rank", "micro_step", "micro_sequence_idx"):
        v = rec.get(key)
        if key == "micro_sequence_idx" and v is None:
            continue  # optional: a sequence of unknown index
        if not _number(v) or not isinstance(v, int) or not 0 <= v < _MAX_INDEX:
            raise InputError(f"{where}: field {key!r} is {_shown(v)}: expected an integer "
                             f"from 0 to {_MAX_INDEX - 1}")  # fmt: skip
    mask = np.array(lm, dtype=np.bool_)
    if not mask.any():
        raise InputError(f"{where}: no loss_mask token (prime-rl exports only sequences that "
                         "have one)")  # fmt: skip
    n = len(ids)
    full = {f: _numbers(rec, f, where, n, mask) for f in _LISTS[2:]}
    values = {col: full[f][mask] for col, f in COLUMNS.items()}
    weights = rec.get("rl_weights")
    weighted = isinstance(weights, list) and any(w is not None for w in weights)
    return _Record(where, np.array(ids, dtype=np.int64), mask,
                   full["inference_logprobs"].astype(np.float32), values, weighted)  # fmt: skip


def _key(tokens: np.ndarray, mask: np.ndarray) -> bytes:
    """The join key: a hash of the tokens up to the first sampled (loss) one."""
    first = int(np.argmax(mask))
    return hashlib.blake2b(tokens[: first + 1].tobytes(), digest_size=16).digest()


# ---------------------------------------------------------------- the traces' branches
@dataclasses.dataclass
class _Branches:
    """The step's branches, indexed by :func:`_key`; what could not be read, by line."""

    tokens: list[np.ndarray] = dataclasses.field(default_factory=list)
    mask: list[np.ndarray] = dataclasses.field(default_factory=list)
    logprobs: list[np.ndarray] = dataclasses.field(default_factory=list)
    group: list[str] = dataclasses.field(default_factory=list)
    reward: list[float] = dataclasses.field(default_factory=list)
    index: dict[bytes, list[int]] = dataclasses.field(default_factory=dict)
    damaged: list[str] = dataclasses.field(default_factory=list)

    def add(self, tokens: np.ndarray, mask: np.ndarray, lp: np.ndarray, group: str,
            reward: float) -> None:  # fmt: skip
        if not mask.any():
            return  # nothing sampled: never a training sample
        self.index.setdefault(_key(tokens, mask), []).append(len(self.tokens))
        self.tokens.append(tokens)
        self.mask.append(mask)
        self.logprobs.append(lp)
        self.group.append(group)
        self.reward.append(reward)

    def matches(self, r: _Record) -> list[int]:
        """The branches whose tokens, sampled mask and log-probs ``r`` equals (a prefix)."""
        n = r.tokens.shape[0]
        out = []
        for b in self.index.get(_key(r.tokens, r.mask), ()):
            t = self.tokens[b]
            if t.shape[0] < n or not np.array_equal(t[:n], r.tokens):
                continue
            if not np.array_equal(self.mask[b][:n], r.mask):
                continue
            if np.array_equal(self.logprobs[b][:n][r.mask], r.inference[r.mask]):
                out.append(b)
        return out


def _reward(trace: dict[str, Any]) -> float:
    """``Σ score·weight`` over a trace's rewards (verifiers' trace.py:135-141)."""
    rewards = trace.get("rewards")
    if not isinstance(rewards, dict) or not rewards:
        raise ValueError("no 'rewards'")
    total = 0.0
    for name, r in rewards.items():
        if not isinstance(r, dict):
            raise ValueError(f"reward {name!r} is not an object of score and weight")
        score, weight = r.get("score"), r.get("weight", 1.0)
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (score, weight)):
            raise ValueError(f"reward {name!r} has no numeric score and weight")
        total += float(score) * float(weight)  # type: ignore[arg-type]
    return total


def _node_arrays(node: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A node's token ids, sampled mask and log-probs spread onto its sampled tokens."""
    if not isinstance(node, dict):
        raise ValueError("a node is not an object")
    ids, mask, lp = node.get("token_ids") or [], node.get("mask") or [], node.get("logprobs") or []
    if not all(isinstance(x, list) for x in (ids, mask, lp)):
        raise ValueError("a node's token_ids, mask or logprobs is not a list")
    if not _token_ids(ids):
        raise ValueError("a node's token_ids are not token ids")
    if not all(isinstance(b, bool | int) for b in mask) or not all(_number(x) for x in lp):
        raise ValueError("a node's mask is not booleans, or its logprobs not numbers")
    if len(mask) != len(ids):
        raise ValueError("a node's token_ids and mask differ in length")
    m = np.array(mask, dtype=np.bool_)
    if len(lp) != int(m.sum()):
        raise ValueError("a node's logprobs are not one per sampled token")
    spread = np.zeros(len(ids), dtype=np.float32)
    spread[m] = np.array(lp, dtype=np.float64).astype(np.float32)
    return np.array(ids, dtype=np.int64), m, spread


def _trace_branches(trace: Any, group: str, out: _Branches) -> None:
    """A trace's branches (one per leaf: its path from the root, trace.py:451-469)."""
    if not isinstance(trace, dict) or not isinstance(trace.get("nodes"), list):
        raise ValueError("a trace without a list of nodes")
    nodes = [_node_arrays(n) for n in trace["nodes"]]
    parents = [n.get("parent") for n in trace["nodes"]]
    if not all(p is None or (isinstance(p, int) and 0 <= p < len(nodes)) for p in parents):
        raise ValueError("a node's parent is not the index of a node")
    reward = _reward(trace)
    named = {p for p in parents if p is not None}
    for leaf in (i for i in range(len(nodes)) if i not in named):
        path, at, seen = [], leaf, set()
        while at is not None and at not in seen:
            seen.add(at)
            path.append(at)
            at = parents[at]
        path.reverse()
        tok, msk, lp = (np.concatenate([nodes[i][k] for i in path]) for k in range(3))
        out.add(tok, msk, lp, group, reward)


def _branches(path: Path) -> _Branches | None:
    """Every branch of the step's ``traces.jsonl`` (None: no such file); a line that
    cannot be read is named in ``damaged`` and left out."""
    if not path.exists():
        return None
    out = _Branches()
    for n, line in _lines(path):
        where = f"{path}:{n}"
        try:
            ep = loads(line, str(path), n)
            if not isinstance(ep, dict) or not isinstance(ep.get("traces"), list):
                raise ValueError("not an episode (an object with its traces)")
            g = ep.get("group")
            gid = g.get("id") if isinstance(g, dict) else None
            if not isinstance(gid, str | int) or isinstance(gid, bool):
                raise ValueError("no group.id")
            for trace in ep["traces"]:
                _trace_branches(trace, str(gid), out)
        except (InputError, ValueError) as exc:
            out.damaged.append(f"{where} ({str(exc).split(': ')[-1]})")
    return out


# ------------------------------------------------------------------------- the join
def _join(records: list[_Record], root: Path, step: int) -> tuple[list[str], list[float],
                                                                  list[str]]:  # fmt: skip
    """Each record's group and reward from the step's traces (empty lists: not read, the
    notes say why)."""
    path = traces_path(root, step)
    rel = path.relative_to(root)
    branches = _branches(path)
    if branches is None:
        return (
            [],
            [],
            [
                f"no {rel}: the records' groups and rewards are unknown (the group "
                "statistics are null; the loss and its metrics do not need them)"
            ],
        )
    notes = []
    if branches.damaged:
        notes.append(f"{len(branches.damaged)} line(s) of {rel} could not be read and are "
                     f"left out of the join: {_some(branches.damaged)}")  # fmt: skip
    groups, rewards, none, several, truncated = [], [], [], [], 0
    for r in records:
        hits = branches.matches(r)
        found = {(branches.group[b], branches.reward[b]) for b in hits}
        if not hits:
            none.append(r.where)
        elif len(found) > 1:
            several.append(r.where)
        else:
            g, rw = found.pop()
            groups.append(g)
            rewards.append(rw)
            truncated += int(all(branches.tokens[b].shape[0] > r.tokens.shape[0] for b in hits))
    if truncated:
        notes.append(f"{truncated} record(s) are a prefix of their branch (truncated)")
    if none or several:
        why = []
        if none:
            why.append(f"{len(none)} match no branch ({_some(none)})")
        if several:
            why.append(f"{len(several)} match branches of different groups or rewards "
                       f"({_some(several)})")  # fmt: skip
        notes.append(f"of {len(records)} token record(s), {'; '.join(why)}, in {rel}: the "
                     "step is read without groups and rewards (not guessed; the group "
                     "statistics are null, the loss and its metrics do not need them)")  # fmt: skip
        return [], [], notes
    return groups, rewards, notes


def _some(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (" ..." if len(items) > _SHOWN else "")


def _table(records: list[_Record], groups: list[str], rewards: list[float]) -> pa.Table:
    lengths = np.array([r.values["logp"].shape[0] for r in records], dtype=np.int64)
    off = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    cols: dict[str, pa.Array] = {}
    if groups:
        cols["group"] = pa.array(groups, type=pa.string())
        cols["reward"] = pa.array(rewards, type=pa.float64())
    for col in COLUMNS:
        cols[col] = list_array(np.concatenate([r.values[col] for r in records]), off)
    return pa.table(cols)


def read_step(files: Sequence[Path]) -> Step:
    """The records of one step's rank files, joined to its traces (the last step read is
    kept: opening a step reads it once)."""
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _read_step(stamp)


@functools.lru_cache(maxsize=1)
def _read_step(stamp: tuple[tuple[str, int, int], ...]) -> Step:
    files = [Path(p) for p, _, _ in stamp]
    d = files[0].parent
    step = step_of_dir(d)
    assert step is not None
    records: list[_Record] = []
    batches: dict[tuple[int, int], set[int]] = {}  # (rank, micro_step) -> its sequences
    weighted = 0
    per_file = []
    for p in files:
        per_file.append(len(records))
        for n, line in _lines(p):
            where = f"{p}:{n}"
            rec = loads(line, str(p), n)
            r = _record(rec, where, step)
            records.append(r)
            seq = rec.get("micro_sequence_idx")
            got = batches.setdefault((rec["rank"], rec["micro_step"]), set())
            got.add(seq if seq is not None else -1 - len(got))
            weighted += r.weighted
    if not records:
        raise InputError(f"{d}: no token record in its rank files (a STABLE step exports every "
                         "sequence with a loss token)")  # fmt: skip
    groups, rewards, notes = _join(records, d.parent.parent, step)
    if weighted:
        notes.append(f"{weighted} record(s) carry rl_weights: prime-rl multiplies their loss "
                     "tokens by them, which grpo-cli does not (their loss differs)")  # fmt: skip
    counts = tuple(np.diff([*per_file, len(records)]).tolist())
    empty = [p.name for p, k in zip(files, counts, strict=True) if not k]
    if empty:
        notes.append(f"{', '.join(empty)} of {d} hold no record: their ranks' micro-batches "
                     "are not seen, so loss/mean counts none of them")  # fmt: skip
    ranks: dict[int, int] = {}
    for rank, micro in batches:  # a micro-batch below a rank's last one exported nothing
        ranks[rank] = max(ranks.get(rank, -1), micro)
    micro_batches = sum(k + 1 for k in ranks.values())
    if micro_batches > len(batches):
        notes.append(f"{micro_batches - len(batches)} micro-batch(es) exported no sequence "
                     "(prime-rl's dummy micro-batches); counted for loss/mean; their "
                     "sequences also add 0s to prime-rl's per-sample /mean metrics, in a "
                     "number the export does not show")  # fmt: skip
    hidden = sum(max(seqs) + 1 - len(seqs) for seqs in batches.values() if min(seqs) >= 0)
    if hidden:  # a gap in micro_sequence_idx: a packed sequence without a loss token
        notes.append(f"{hidden} packed sequence(s) without a loss token were not exported "
                     "(gaps in micro_sequence_idx): prime-rl's per-sample /mean metrics "
                     "(is_masked*, masked_*, *_mismatch_kl) count each as a 0, so its logged "
                     "means are below these, which are over the exported samples")  # fmt: skip
    table = _table(records, groups, rewards)
    return Step(table, micro_batches, tuple(notes), bool(groups), counts)


# ------------------------------------------------------------------------- the reader
@dataclasses.dataclass(frozen=True)
class PrimeRLReader(TableReader):
    """The rank files of one prime-rl ``token_exports/step_N`` (one step), its joined
    table held in memory (:class:`~grpo_cli.io.readers._tables.TableReader`)."""

    format: ClassVar[str] = "prime-rl"
    suffixes: ClassVar[tuple[str, ...]] = (".jsonl",)
    token_column: ClassVar[str] = "logp"
    unit: ClassVar[str] = "record"
    datasets: ClassVar[bool] = False
    remote: ClassVar[bool] = False

    paths: tuple[InputPath, ...]
    step: Step = dataclasses.field(compare=False, repr=False)

    @classmethod
    def claims(cls, p: InputPath) -> bool:
        """A rank file of a token export: ``token_exports/step_N/rank_R.jsonl``."""
        if not isinstance(p, Path) or not _RANK.search(p.name):
            return False
        return step_of_dir(p.parent) is not None and p.parent.parent.name == EXPORTS

    @classmethod
    def open(cls, paths: Sequence[InputPath]) -> PrimeRLReader:
        dirs = {Path(str(p)).parent for p in paths}
        if len(dirs) > 1:
            raise InputError(
                f"rank files of {len(dirs)} token-export steps given: one step at a time "
                "(grpo-cli trend OUTPUT_DIR reads every STABLE step in turn)"
            )
        local = [Path(str(p)) for p in paths]
        return cls(tuple(paths), read_step(local))

    def held(self) -> pa.Table:
        return self.step.table

    def label(self) -> str:
        return str(Path(str(self.paths[0])).parent)

    def held_notes(self) -> tuple[str, ...]:
        return self.step.notes

    def default_name(self, field: str) -> str:
        return field

    def rows_per_file(self) -> list[int] | None:
        """Each rank file's records (read when the step was opened)."""
        return list(self.step.per_file)
