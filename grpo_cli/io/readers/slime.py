"""slime's ``--dump-details DIR``: ``DIR/train_data/{rollout_id}.pt`` joined to
``DIR/rollout_data/{rollout_id}.pt``, read with no flag, without torch and without running
pickle code (:mod:`grpo_cli.io.torch_pickle`).

The writers (slime, THUDM, commit 624b824a): ``save_debug_rollout_data``
(``slime/observability/rollout_data_utils.py:140-153``) writes ``{"rollout_id", "samples":
[Sample.to_dict(), ...]}``; ``save_debug_train_data`` (``train_data_utils.py:112-242``)
writes ``{"format_version": 2, "rollout_id", "rank", "samples": [one dict per training
sample], "dp_shards": [one per DP rank], "raw_reward"}``. A train sample holds
``rollout_position`` (its index in the rollout dump's ``samples``), ``sample_index``
(``Sample.index``, may be None), ``loss_masks``, ``log_probs`` (the *old* policy's),
``advantages``, ``rollout_mask_sums`` and, when the run had them, ``rollout_log_probs``,
``ref_log_probs``, ``entropy``. A rollout sample holds ``group_index`` and the raw
``reward``. ``conformance/frontier/LAYOUTS.md`` ("slime") has every field with its line.

Read as (one row per training sample of the rollout's first optimizer step)::

    group_index   rollout sample's group_index                      -> group
    reward        rollout sample's reward (raw; the train row's
                  ``rewards`` is the group-normalised one)          -> reward
    advantages    per token, what the loss used                     -> advantage
    log_probs     per token: the old policy's, which step 0's
                  forward equals (same weights)                     -> logp
    ref_log_probs, rollout_log_probs, entropy (when dumped)         -> ref_logp,
                                                                       rollout_logp, entropy
    loss_masks    per token                                         -> mask

One rollout file is one step of ``trend`` (its step 0): the dump holds the old log-probs
only, so steps ≥ 1 of a rollout (``global_batch_size`` < the rollout) have no current
log-probs; they are left out, with a note. The step's samples come from the dumped
schedule (``dp_shards``: each rank's first ``num_microbatches[0]`` micro-batches). The
reducer's per-sample denominators (``rollout_mask_sums``) must be each sample's own loss
tokens (one sample a rollout: slime's default), which makes slime's loss grpo-cli's
seq-mean-token-mean; samples sharing a rollout id are refused, naming it.

Conventions: ``args.json`` beside ``train_data/`` (``vars(args)`` under slime's option
names), else slime's argparse defaults, said in a note (:func:`dump_run`); with its
``use_rollout_logprobs`` the old policy is the sampler's: ``rollout_log_probs`` is also
read as ``old_logp`` (ρ = exp(log_probs − rollout_log_probs), slime's first step). The
dump directory is a recorded run (:class:`SlimeRun`, registered as a layout): ``objective``
reads its last rollout, ``check`` and ``trend`` every rollout. Memory: one rollout's two
files at a time.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ..bounded import loads, read_document, regular
from ..paths import InputPath
from ..run import RecordedRun, RecordedStep
from ..torch_pickle import load
from ._tables import TableReader

__all__ = ["LAYOUT", "SlimeReader", "SlimeRun", "SlimeStep", "dump_files", "dump_run"]

TRAIN, ROLLOUT, ARGS = "train_data", "rollout_data", "args.json"
_ID = re.compile(r"^(\d{1,18})\.pt$")
FORMAT_VERSION = 2
COMMIT = "624b824a"
VERSION = "0.3.1"
# written into the config by the reader (not a slime option): whether the dump holds the
# sampler's log-probs, so that slime's mismatch metric is computed when it can be
HAS_ROLLOUT = "_dump_has_rollout_log_probs"
# the table's columns: slime's own names (``reward``, ``group_index``: the rollout side's)
TOKEN_KEYS = ("log_probs", "ref_log_probs", "rollout_log_probs", "entropy", "advantages")
NAMES = {
    "group": "group_index",
    "reward": "reward",
    "advantage": "advantages",
    "logp": "log_probs",
    "ref_logp": "ref_log_probs",
    "rollout_logp": "rollout_log_probs",
    "entropy": "entropy",
    "mask": "loss_masks",
}


def _is_train_file(p: Path) -> bool:
    return _ID.match(p.name) is not None and p.parent.name == TRAIN


def dump_files(p: Path) -> list[Path] | None:
    """The ``train_data/{id}.pt`` files of a dump directory ``p`` (one holding
    ``train_data/``), in rollout id order; None when ``p`` is not one."""
    d = p / TRAIN
    if not p.is_dir() or not d.is_dir():
        return None
    # every {id}.pt: one that is a FIFO, a device or a directory is its step's to name
    files = [q for q in d.iterdir() if _ID.match(q.name)]
    if not files:
        raise InputError(f"{d}: no {{rollout_id}}.pt file: not a slime --dump-details directory")
    return sorted(files, key=lambda q: int(q.stem))


def _root(p: Path) -> Path | None:
    """The dump directory of a dump directory, its ``train_data/`` or one of its files."""
    if p.is_dir():
        if (p / TRAIN).is_dir():
            return p
        return p.parent if p.name == TRAIN else None
    return p.parent.parent if _is_train_file(p) else None


@dataclasses.dataclass(frozen=True)
class SlimeRun(RecordedRun):
    """A ``--dump-details`` directory as a recorded run: one step a rollout
    (``train_data/{id}.pt``, in id order: each its first optimizer step), its settings
    from ``args.json`` (slime's argparse defaults without one, said in a note)."""

    @property
    def config_file(self) -> str:
        return ARGS if (self.root / ARGS).exists() else f"slime's defaults (no {ARGS})"

    def steps(self) -> list[RecordedStep]:
        files = dump_files(self.root) or []
        return [SlimeStep(self, int(f.stem), f, (f,), True) for f in files]

    def latest(self) -> RecordedStep | None:
        """The last rollout (a command given the directory reads it, said in a note)."""
        steps = self.steps()
        return steps[-1] if steps else None


@dataclasses.dataclass(frozen=True)
class SlimeStep(RecordedStep):
    """One rollout of a dump: its ``train_data/{id}.pt`` (``directory`` is the file:
    torch.save writes one file, no marker)."""

    marker: ClassVar[str] = f"{TRAIN}/{{id}}.pt"

    def calls(self) -> dict[int, list[int]]:
        return {0: [0]}

    def require_done(self) -> None:
        return None

    def require_readable(self) -> None:
        """The train file and its rollout dump beside it are regular files and zip
        archives (torch.save's; a file cut while written is not): checked before anything
        is read, ``trend`` and ``check`` skip such a rollout, naming why."""
        f = self.directory
        regular(f, "train dump")
        r = f.parent.parent / ROLLOUT / f.name
        if r.exists() or r.is_symlink():
            regular(r, "rollout dump")
        else:
            raise InputError(
                f"{f}: no {ROLLOUT}/{f.name} beside it: the groups and rewards are in "
                "slime's rollout dump (--dump-details writes both)"
            )
        for p in (f, r):
            if not zipfile.is_zipfile(p):
                raise InputError(
                    f"{p}: not a zip archive as torch.save writes (cut while written, or "
                    "another file)"
                )


def _has_rollout(files: Sequence[Path]) -> bool:
    """Whether the first readable train dump of ``files`` holds the sampler's log-probs
    (slime's mismatch metric is logged whenever they do; a damaged file is its step's to
    name, not the run's)."""
    for f in files:
        try:
            got = load(f)
        except InputError:
            continue
        rows = got.get("samples") if isinstance(got, dict) else None
        return isinstance(rows, list) and any(
            isinstance(r, dict) and r.get("rollout_log_probs") is not None for r in rows
        )
    return False


def dump_run(p: Path, has_rollout: bool | None = None) -> SlimeRun | None:
    """slime's conventions for a dump (``p``: its directory, ``train_data/`` or a file):
    the trainer ``slime`` and the options of ``args.json`` beside ``train_data/`` (slime's
    argparse defaults when there is none), with whether the dump holds rollout log-probs
    (``has_rollout``; None: read from ``p``'s first train file); None when ``p`` is no
    slime dump."""
    root = _root(p)
    if root is None:
        return None
    args = root / ARGS
    config: dict[str, Any] = {}
    if args.exists() or args.is_symlink():  # a dangling link is named, not the defaults
        got = loads(read_document(args, ARGS), str(args))
        if not isinstance(got, dict):
            raise InputError(
                f"{args}: expected a JSON object of slime's options (vars(args)), found "
                f"{type(got).__name__}"
            )
        config = got
    if has_rollout is None:
        files = [p] if p.is_file() else dump_files(root) or []
        has_rollout = _has_rollout(files)
    config = {**config, HAS_ROLLOUT: has_rollout}
    # the dump names no slime version: the one whose code was read (setup.py at COMMIT)
    meta = {"trainer": "slime", "trainer_version": VERSION, "config": config}
    return SlimeRun(root, meta)


class _Layout:
    """slime's dump layout, for :func:`grpo_cli.io.run.find_run` (a step is a file, never
    a directory: :func:`~grpo_cli.io.run.recorded_step` has none)."""

    def find_run(self, d: Path) -> RecordedRun | None:
        return dump_run(d) if d.is_dir() and (d / TRAIN).is_dir() else None

    def recorded_step(self, d: Path) -> RecordedStep | None:
        del d
        return None


LAYOUT = _Layout()


def _field(d: Any, key: str, where: str, kinds: tuple[type, ...] | type) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise InputError(
            f"{where}: no field {key!r} (not a slime dump of format {FORMAT_VERSION}?)"
        )
    v = d[key]
    if not isinstance(v, kinds) or (isinstance(v, bool) and kinds is int):
        raise InputError(f"{where}: field {key!r} is {type(v).__name__}, not what slime writes")
    return v


def _step0(train: Mapping[str, Any], label: str) -> tuple[list[int], int, int]:
    """The rollout positions of the first optimizer step (each rank's first
    ``num_microbatches[0]`` micro-batches of its ``partition``), its rollout count
    (``global_batch_sizes[0]``) and the number of steps."""
    shards = _field(train, "dp_shards", label, list)
    positions: list[int] = []
    steps, gbs = 0, 0
    for r, sh in enumerate(shards):
        at = f"{label}: dp_shards[{r}]"
        part = _field(sh, "partition", at, list)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in part):
            raise InputError(f"{at}: partition holds a value that is not a rollout position")
        mbs = _field(sh, "micro_batch_indices", at, list)
        nmb = _field(sh, "num_microbatches", at, list)
        sizes = _field(sh, "global_batch_sizes", at, list)
        if not nmb or not sizes or not all(isinstance(x, int) for x in [*nmb, *sizes]):
            raise InputError(f"{at}: num_microbatches / global_batch_sizes: no steps")
        steps, gbs = len(nmb), int(sizes[0])
        for mb in mbs[: int(nmb[0])]:
            if not isinstance(mb, list) or not all(
                isinstance(i, int) and 0 <= i < len(part) for i in mb
            ):
                raise InputError(
                    f"{at}: micro_batch_indices holds {mb!r}: not indices into partition"
                )
            positions += [part[i] for i in mb]
    return positions, gbs, steps


def _asarray(v: Any, key: str, where: str) -> np.ndarray:
    """``v`` as one array; ragged or mixed lists are named."""
    try:
        return np.asarray(v)
    except (ValueError, TypeError, OverflowError):
        raise InputError(
            f"{where}: field {key!r} is not one list of numbers (ragged or mixed values)"
        ) from None


def _tokens(row: Mapping[str, Any], key: str, n: int, where: str) -> np.ndarray | None:
    """A per-token field: ``n`` real numbers (as many as the sample's loss mask)."""
    v = row.get(key)
    if v is None:
        return None
    a = _asarray(v, key, where)
    if a.ndim != 1 or a.shape[0] != n or a.dtype.kind not in "iuf":
        raise InputError(
            f"{where}: field {key!r} has shape {a.shape} ({a.dtype}), expected {n} real "
            "numbers (one per loss_masks token)"
        )
    return a


def _mask(row: Mapping[str, Any], where: str) -> np.ndarray:
    """``loss_masks``: one list of 0/1 (slime writes int32), as int64."""
    v = row.get("loss_masks")
    mask = None if v is None else _asarray(v, "loss_masks", where)
    if mask is None or mask.ndim != 1 or mask.dtype.kind not in "biuf":
        raise InputError(f"{where}: field 'loss_masks' is missing or not one list of 0/1")
    bad = np.flatnonzero((mask != 0) & (mask != 1))
    if bad.size:
        raise InputError(
            f"{where}: field 'loss_masks' holds {mask[bad[0]]!r} at token {int(bad[0])}: "
            "expected 0 or 1 per token"
        )
    return mask.astype(np.int64)


def _real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool | np.bool_)


def _join(
    train: Mapping[str, Any], rollout: list[Any], label: str, rlabel: str
) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    """Each train row with its rollout sample, by ``rollout_position`` (or ``sample_index``
    ↔ ``index``); a row that joins nothing or twice is named."""
    rows = _field(train, "samples", label, list)
    by_index = {
        s["index"]: i
        for i, s in enumerate(rollout)
        if isinstance(s, dict) and isinstance(s.get("index"), int)
    }
    out: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for j, row in enumerate(rows):
        at = f"{label}: samples[{j}]"
        if not isinstance(row, dict):
            raise InputError(f"{at}: is {type(row).__name__}, not a sample dict")
        pos = row.get("rollout_position")
        if pos is None and isinstance(row.get("sample_index"), int):
            pos = by_index.get(row["sample_index"])
        if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos < len(rollout):
            raise InputError(
                f"{at}: joins no sample of {rlabel} (rollout_position "
                f"{row.get('rollout_position')!r}, sample_index {row.get('sample_index')!r}; "
                f"it holds {len(rollout)} samples)"
            )
        if pos in out:
            raise InputError(f"{at}: rollout position {pos} again: two train rows join one sample")
        out[pos] = (row, rollout[pos])
    return out


def _answer(
    row: Mapping[str, Any], sample: Any, pos: int, label: str, rlabel: str
) -> dict[str, Any]:
    """One training sample's columns (see the module's table)."""
    at = f"{label}: sample at rollout position {pos}"
    mask = _mask(row, at)
    n = int(mask.shape[0])
    out: dict[str, Any] = {"loss_masks": mask}
    for key in TOKEN_KEYS:
        v = _tokens(row, key, n, at)
        if v is None and key in ("log_probs", "advantages"):
            raise InputError(f"{at}: field {key!r} is missing: slime writes it for every sample")
        out[key] = None if v is None else v.astype(np.float64)
    sums = row.get("rollout_mask_sums")
    got = None if sums is None else _asarray(sums, "rollout_mask_sums", at)
    if got is None or got.size != 1 or got.dtype.kind not in "iuf":
        raise InputError(f"{at}: field 'rollout_mask_sums' is missing or not one number")
    if float(got.reshape(-1)[0]) != float(mask.sum()):
        raise InputError(
            f"{at}: rollout_mask_sums is {float(got.reshape(-1)[0])} but the sample has "
            f"{int(mask.sum())} loss tokens: samples share a rollout id (slime's reducer then "
            "divides by the rollout's tokens), which no grpo-cli aggregation computes"
        )
    rat = f"{rlabel}: samples[{pos}]"
    if not isinstance(sample, dict):
        raise InputError(f"{rat}: is {type(sample).__name__}, not a Sample dict")
    reward, group = sample.get("reward"), sample.get("group_index")
    if isinstance(reward, dict):
        raise InputError(
            f"{rat}: reward is a dict ({', '.join(map(str, reward))}): the run used --reward-key; "
            "grpo-cli reads one number a sample"
        )
    if not _real(reward):
        raise InputError(f"{rat}: reward is {_shown(reward)}, not a number")
    integral = isinstance(group, numbers.Integral) and not isinstance(group, bool | np.bool_)
    if not integral or not -(2**63) <= int(cast(int, group)) < 2**63:
        raise InputError(
            f"{rat}: group_index is {_shown(group)}: slime's dump names each sample's group "
            "by an integer (int64)"
        )
    out["reward"], out["group_index"] = float(cast(float, reward)), int(cast(int, group))
    return out


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _table(path: Path, rollout_old: bool = False) -> tuple[pa.Table, tuple[str, ...]]:
    """The first optimizer step's training samples of one rollout, joined, as a table of
    the module's columns, and the notes on what was left out; with ``rollout_old``
    (``use_rollout_logprobs``) an ``old_logp`` column of the sampler's log-probs."""
    label = str(path)
    train = load(path)
    if not isinstance(train, dict):
        raise InputError(f"{label}: holds {type(train).__name__}, not slime's train dump dict")
    version = train.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # an array compares by element
        raise InputError(
            f"{label}: format_version is {_shown(version)}; grpo-cli reads slime's train dump "
            f"format {FORMAT_VERSION} (slime {COMMIT})"
        )
    rid = _field(train, "rollout_id", label, int)
    if rid != int(path.stem):
        raise InputError(
            f"{label}: rollout_id is {rid}, the file's name says {path.stem}: slime names each "
            "train dump by its rollout id (renamed or copied from another dump?)"
        )
    rpath = path.parent.parent / ROLLOUT / f"{rid}.pt"
    if not rpath.exists():
        raise InputError(
            f"{label}: no {ROLLOUT}/{rid}.pt beside it: the groups and rewards are in slime's "
            "rollout dump (--dump-details writes both)"
        )
    rollout = _field(load(rpath), "samples", str(rpath), list)
    joined = _join(train, rollout, label, str(rpath))
    positions, gbs, steps = _step0(train, label)
    if len(positions) != gbs or len(set(positions)) != gbs:
        raise InputError(
            f"{label}: dp_shards' first step holds {len(positions)} samples but "
            f"global_batch_sizes[0] is {gbs}: not slime's schedule of one sample a rollout"
        )
    cols: dict[str, list[Any]] = {
        k: [] for k in ("group_index", "reward", "loss_masks", *TOKEN_KEYS)
    }
    for pos in sorted(positions):
        if pos not in joined:
            raise InputError(
                f"{label}: the schedule names rollout position {pos}, no train row has it"
            )
        one = _answer(*joined[pos], pos, label, str(rpath))
        for k, v in one.items():
            cols[k].append(v)
    present = {k: v for k, v in cols.items() if not all(x is None for x in v)}
    for k, v in present.items():
        if any(x is None for x in v):
            raise InputError(f"{label}: field {k!r} is dumped for some samples only")
    if rollout_old:
        if "rollout_log_probs" not in present:
            raise InputError(
                f"{label}: {ARGS} sets use_rollout_logprobs (slime's old policy is the "
                "sampler's) but the dump holds no rollout_log_probs: fix args.json, or give "
                "the dump of the run that had them"
            )
        present["old_logp"] = present["rollout_log_probs"]
    table = pa.table({k: pa.array(v) for k, v in present.items()})
    notes = [
        f"{label}: rollout {rid}, its first optimizer step ({gbs} of {len(rollout)} samples, "
        f"the schedule's dp_shards): logp is the dump's log_probs (the old policy's, which "
        "step 0's forward equals)"
        + (f"; {_later(steps)} left out: the current log-probs are not dumped" if steps > 1 else "")
    ]
    if "entropy" not in present:
        notes.append(
            f"{label}: no entropy dumped (slime dumps it with --use-rollout-entropy only): "
            "train/entropy_loss, slime's reducer of the training forward's entropy, cannot "
            "be recomputed"
        )
    if rollout_old:
        notes.append(
            f"{ARGS}: use_rollout_logprobs: old_logp is the dump's rollout_log_probs (slime's "
            "old policy is the sampler's), logp its log_probs: ρ = exp(log_probs − "
            "rollout_log_probs), as slime's first step computes it"
        )
    return table, tuple(notes)


def _later(steps: int) -> str:
    return "step 1" if steps == 2 else f"steps 1-{steps - 1}"


@dataclasses.dataclass(frozen=True)
class SlimeReader(TableReader):
    """One slime ``train_data/{rollout_id}.pt`` (one rollout: one step), its joined table
    held in memory (:class:`~grpo_cli.io.readers._tables.TableReader`)."""

    format: ClassVar[str] = "slime"
    suffixes: ClassVar[tuple[str, ...]] = (".pt",)
    token_column: ClassVar[str] = "loss_masks"
    unit: ClassVar[str] = "sample"
    datasets: ClassVar[bool] = False
    remote: ClassVar[bool] = False

    paths: tuple[InputPath, ...]
    table: pa.Table = dataclasses.field(compare=False, repr=False)
    notes: tuple[str, ...] = ()
    run: RecordedRun | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def claims(cls, p: InputPath) -> bool:
        """A slime train dump: ``{rollout_id}.pt`` in a ``train_data`` directory."""
        return isinstance(p, Path) and _is_train_file(p)

    @classmethod
    def directory_files(cls, p: Path) -> list[Path] | None:
        return dump_files(p)

    @classmethod
    def run_of(cls, p: Path) -> RecordedRun | None:
        return dump_run(p)

    @classmethod
    def open(cls, paths: Sequence[InputPath]) -> SlimeReader:
        if len(paths) > 1:
            root = Path(str(paths[0])).parent.parent
            ids = ", ".join(Path(str(p)).stem for p in paths[:5]) + (
                " ..." if len(paths) > 5 else ""
            )
            raise InputError(
                f"{root}: a slime dump of {len(paths)} rollouts ({ids}): each rollout is one "
                f"step; give one {TRAIN}/{{id}}.pt, or grpo-cli trend {root}"
            )
        p = Path(str(paths[0]))
        args = dump_run(p, has_rollout=False)
        rollout_old = args is not None and args.config.get("use_rollout_logprobs") is True
        table, notes = _table(p, rollout_old)
        run = dump_run(p, "rollout_log_probs" in table.column_names)
        if run is not None and not (run.root / ARGS).exists():
            notes = (
                *notes,
                f"no {ARGS} in {run.root}: slime's argparse defaults ({COMMIT}) hold; write "
                "one with the run's options (docs/trainers/slime.md)",
            )
        return cls(tuple(paths), table, notes, run)

    def held(self) -> pa.Table:
        return self.table

    def label(self) -> str:
        return str(self.paths[0])

    def held_notes(self) -> tuple[str, ...]:
        return self.notes

    def default_name(self, field: str) -> str:
        return NAMES.get(field, field)

    def rows_per_file(self) -> list[int] | None:
        return [self.table.num_rows]
