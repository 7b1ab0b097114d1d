"""NeMo-RL's ``train_data_step{N}.jsonl``: the batch its GRPO loss was given at step N,
read as it is written.

The writer (NeMo-RL v0.6.0, commit 7ea279a): ``nemo_rl/algorithms/grpo.py``,
``grpo_train`` (and ``async_grpo_train``), builds ``log_data`` from the step's
``train_data`` after the advantages are computed and clipped, and
``Logger.log_batched_dict_as_jsonl`` (``nemo_rl/utils/logger.py``) writes one line per
sample (``make_microbatch_iterator(1)``: every value is a batch of one, so a list of one,
tensors by ``tolist()``) plus ``"idx": i``, by ``json.dumps(..., default=str)`` (so
``NaN`` and ``Infinity`` for non-finite floats). The keys::

    rewards              [r]        the reward (``filtered_rewards`` with dynamic sampling:
                                    the one the advantages used) -> reward
    advantages           [[A × S]]  what the loss used (GRPO: one value an answer, expanded
                                    over all S positions)                    -> advantage
    prev_logprobs        [[S]]      the trainer's log-probs before the step's update
                                    (zeros under loss_fn.force_on_policy_ratio) -> logp
    generation_logprobs  [[S]]      the sampler's                           -> rollout_logp
    token_loss_mask      [[0/1 × S]] 1 on the generated assistant tokens    -> mask
    sample_loss_mask     [m]        0 for a sample the loss leaves out (overlong filtering)
    token_ids            [[S]]      prompt and response, padded: the groups (below)
    input_lengths, content, idx, agent_ref: not read

Token alignment: position ``i`` holds ``log p(token_i | tokens < i)`` (position 0 is 0), and
``ClippedPGLossFn.__call__`` (``nemo_rl/algorithms/loss/loss_functions.py``) takes
``[:, 1:]`` of every per-token field with the mask ``token_mask[:, 1:] *
sample_mask``: this reader drops position 0 of every per-token list and masks as the loss
does. A sample without a loss token (``sample_loss_mask`` 0) is left out, with a note, as
the loss leaves it out.

Groups: NeMo-RL's advantages (``GRPOAdvantageEstimator`` through
``calculate_baseline_and_std_per_prompt``, ``nemo_rl/algorithms/utils.py``) group the
samples whose prompt token rows are identical (``torch.unique(prompts, dim=0)``), not by
position; here a sample's prompt is its tokens before its first ``token_loss_mask`` 1, and
the group id a hash of them. The repeated prompts are contiguous blocks of
``grpo.num_generations_per_prompt`` (``batch.repeat_interleave``); a prompt drawn twice in
one step is one group, as in NeMo-RL. ``--column group=KEY`` takes the ids from a key
instead.

Policies: the file holds no reference log-probs (NeMo-RL computes them but does not write
them) and no current ones; its loss's ``curr_logprobs`` equal ``prev_logprobs`` at the
step's first update (same weights), so ``prev_logprobs`` is logp and the objective is that
update's, on-policy (ratio 1, said as for any input without old_logp); with β > 0 the
missing reference is refused with what to do, and the KL blocks are null.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from ...batch import BatchError, RawBatch, mask_values
from ...core import segment_count
from ...errors import InputError
from ..arrow import arrow_of, numpy_of
from ..fields import ANSWER_FIELDS, PER_TOKEN, TOKEN_VALUES
from ..lists import answer_table, flag_array, is_list, list_array, raw_record_batch
from ..paths import InputPath
from ._jsonlines import (
    PASS1_BYTES,
    SUFFIXES,
    chunk_bytes,
    chunks,
    file_size,
    head,
    json_type,
    line_types,
    parse,
)
from .base import AnswerColumns, ReadColumns, Unit

if TYPE_CHECKING:
    from .base import Source

__all__ = ["NemoRLReader"]

I64 = NDArray[np.int64]

# A NeMo-RL line: the loss masks, as its writer nests them (a list of one list a token).
_CLAIM = (
    re.compile(rb'"token_loss_mask"\s*:\s*\[\s*\['),
    re.compile(rb'"sample_loss_mask"\s*:\s*\['),
)
SNIFF_BYTES = 1 << 24
SAMPLE_MASK = "sample_loss_mask"
TOKEN_IDS = "token_ids"
# the group column when no key gives the ids: the prompt tokens' hash
PROMPT = "(prompt tokens)"
NAMES = {
    "reward": "rewards",
    "advantage": "advantages",
    "logp": "prev_logprobs",
    "ref_logp": "reference_policy_logprobs",
    "rollout_logp": "generation_logprobs",
    "mask": "token_loss_mask",
    "group": PROMPT,
}


def _depth(t: pa.DataType | None) -> tuple[int, pa.DataType | None]:
    """How many list levels wrap ``t``, and what they hold."""
    d = 0
    while t is not None and is_list(t):
        t, d = t.value_type, d + 1
    return d, t


def nemo_type(field: str, seen: pa.DataType | None) -> pa.DataType:
    """The parse type of a NeMo-RL key holding ``field`` (``seen``: its first line's type):
    the JSONL type of the value inside NeMo-RL's one-sample list."""
    depth, _ = _depth(seen)
    if field == "tokens":  # token ids: integers, to hash the prompts
        inner: pa.DataType = pa.list_(pa.int64())
    elif field == "sample":  # one number a sample
        inner = pa.float64()
    elif field == "idx":  # the writer's sample index, as it is
        return seen if seen is not None and not pa.types.is_null(seen) else pa.int64()
    else:
        inner = json_type(field, seen.value_type if depth and seen is not None else seen)
    return inner if depth == 0 else pa.list_(inner)


@dataclasses.dataclass
class _Seen:
    """What pass 1 found while reading, for its notes."""

    dropped: int = 0
    dropped_idx: list[Any] = dataclasses.field(default_factory=list)
    logp_nonzero: bool = False
    logp_tokens: int = 0
    groups: pa.ChunkedArray | None = None  # every line's group id, left out ones too


@dataclasses.dataclass(frozen=True)
class NemoRLReader:
    """One NeMo-RL ``train_data_step{N}.jsonl`` file (one step)."""

    format: ClassVar[str] = "nemo-rl"
    suffixes: ClassVar[tuple[str, ...]] = SUFFIXES
    what: ClassVar[str] = "field"
    unit: ClassVar[str] = "row"
    datasets: ClassVar[bool] = False
    remote: ClassVar[bool] = True

    paths: tuple[InputPath, ...]
    types: tuple[tuple[str, pa.DataType], ...] = dataclasses.field(compare=False, repr=False)

    @classmethod
    def claims(cls, p: InputPath) -> bool:
        """A NeMo-RL file: its first line has the loss masks nested as NeMo-RL writes them
        (read up to :data:`SNIFF_BYTES` of it)."""
        try:
            line = head(p, SNIFF_BYTES)
        except InputError:
            return False
        return all(r.search(line) for r in _CLAIM)

    @classmethod
    def open(cls, paths: Sequence[InputPath]) -> NemoRLReader:
        if len(paths) > 1:
            raise InputError(
                f"{len(paths)} NeMo-RL files given: each train_data_step file is one step; "
                "give one (grpo-cli trend DIR reads every step in turn)"
            )
        return cls(tuple(paths), tuple(line_types(paths[0]).items()))

    @property
    def path(self) -> InputPath:
        return self.paths[0]

    def names(self) -> list[str]:
        return [n for n, _ in self.types]

    def default_name(self, field: str) -> str:
        return NAMES.get(field, field)

    def rows_per_file(self) -> list[int] | None:
        return None

    def _schema(self, keys: Mapping[str, str]) -> pa.Schema:
        seen = dict(self.types)
        return pa.schema([(k, nemo_type(f, seen.get(k))) for k, f in keys.items()])

    def _keys(self, src: Source, fields: Sequence[str]) -> dict[str, str]:
        """The keys to parse for ``fields`` (key: field), with what every sample needs: its
        masks and, without a group key, its token ids."""
        keys: dict[str, str] = {}
        for f in fields:
            if src.has(f):
                keys.setdefault(src.name(f), f)
        if src.has("mask"):
            keys.setdefault(src.name("mask"), "mask")
        if SAMPLE_MASK in src.present:
            keys.setdefault(SAMPLE_MASK, "sample")
        if src.has("group"):
            keys.setdefault(src.name("group"), "group")
        elif TOKEN_IDS in src.present:
            keys.setdefault(TOKEN_IDS, "tokens")
        return keys

    # ---- one chunk of lines to grpo-cli's layout
    def _samples(
        self, src: Source, rb: pa.RecordBatch, keys: Mapping[str, str], row0: int
    ) -> tuple[pa.RecordBatch, NDArray[np.bool_], str | None, str | None, pa.Array | None]:
        """The parsed lines ``rb`` as one row per answer: each value out of its list of
        one, position 0 dropped from every per-token list, the mask ``token_loss_mask[1:]
        × sample_loss_mask``, the group ids; then only the samples with a loss token.
        Returns the rows, which lines were kept, the mask's and groups' columns, and every
        line's group id (those left out too: NeMo-RL's baseline counts them)."""
        label = str(self.path)
        cols: dict[str, pa.Array] = {}
        unwrapped = {k: _unwrap(rb.column(k), label, k, row0) for k in keys}
        for k, f in keys.items():
            if f in ("mask", "sample", "group", "tokens"):
                continue
            v = unwrapped[k]
            if is_list(v.type) and (f in TOKEN_VALUES or f in PER_TOKEN):
                v = _drop_first(v)
            cols[k] = v
        n = rb.num_rows
        mname: str | None = None
        tokens = next((k for k, v in cols.items() if is_list(v.type)), None)
        lengths: I64 | None = None
        if tokens is not None:
            lengths = np.diff(_flat(cols[tokens])[0])
        token_mask = None
        if src.has("mask"):
            mname = src.name("mask")
            raw = _drop_first(unwrapped[mname])
            moff, mvals = _flat(raw)
            token_mask = mask_values(mvals, label, f"field {mname!r}")
            lengths = np.diff(moff)  # the mask's: what every per-token field must match
        if lengths is None:
            raise InputError(f"{label}: no per-token field to read (the file has: "
                             f"{', '.join(src.present)})")  # fmt: skip
        assert tokens is not None or mname is not None
        ref = mname if mname is not None else tokens
        for k, v in cols.items():  # every per-token field of a sample: one length
            if is_list(v.type):
                _same_length(label, row0, k, np.diff(_flat(v)[0]), ref, lengths)
        if TOKEN_IDS in keys:  # the prompt and response, position 0 included
            ids = np.diff(_flat(unwrapped[TOKEN_IDS])[0])
            _same_length(label, row0, TOKEN_IDS, np.maximum(ids - 1, 0), ref, lengths)
        if SAMPLE_MASK in keys:
            sample = np.asarray(numpy_of(unwrapped[SAMPLE_MASK]), dtype=np.float64)
            bad = np.flatnonzero((sample != 0.0) & (sample != 1.0))
            if bad.size:
                i = int(bad[0])
                raise InputError(
                    f"{label}: field {SAMPLE_MASK!r} is {sample[i]} at row {row0 + i}: "
                    "grpo-cli reads a 0/1 sample mask (a fractional loss_multiplier, a "
                    "weight, is not modelled)"
                )
            keep_tokens = np.repeat(sample == 1.0, lengths)
            token_mask = keep_tokens if token_mask is None else token_mask & keep_tokens
            mname = mname or SAMPLE_MASK
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        valid = np.diff(off) if token_mask is None else segment_count(token_mask, off)
        keep = valid > 0
        if token_mask is not None:
            assert mname is not None
            cols[mname] = list_array(token_mask.astype(np.float64), off)
        gname = None
        if src.has("group"):
            gname = src.name("group")
            cols[gname] = unwrapped[gname]
        elif TOKEN_IDS in keys:
            gname = PROMPT
            cols[gname] = _prompt_ids(unwrapped[TOKEN_IDS], unwrapped.get(src.name("mask")), n)
        out = pa.RecordBatch.from_pydict(cols)
        every = out.column(gname) if gname is not None else None
        if not keep.all():
            out = out.filter(flag_array(keep))
        return out, keep, mname, gname, every

    # ---- pass 1
    def _pass1(self, src: Source) -> tuple[pa.Table, dict[str, str], _Seen]:
        fields = [f for f in ANSWER_FIELDS if src.has(f)]
        keys = self._keys(src, [*fields, "logp"])
        if "idx" in src.present:
            keys.setdefault("idx", "idx")
        schema = self._schema(keys)
        label, row, seen = str(self.path), 0, _Seen()
        pieces, groups = [], []
        names: dict[str, str] = {}
        for buf in chunks(self.path, PASS1_BYTES):
            rb = parse(buf, schema, label, row, self.what)
            if not rb.num_rows:
                continue
            out, keep, mname, gname, every = self._samples(src, rb, keys, row)
            if every is not None:
                groups.append(every)
            names = {f: src.name(f) for f in fields}
            if gname is not None:
                names["group"] = gname
            pieces.append(answer_table(out, names, mname, label, row, what=self.what))
            self._see(src, rb, out, keep, mname, row, seen)
            row += rb.num_rows
        if not pieces:
            raise InputError(f"{label}: no answers (the file is empty)")
        seen.groups = pa.chunked_array(groups) if groups else None
        return pa.concat_tables(pieces), names, seen

    def _see(
        self,
        src: Source,
        rb: pa.RecordBatch,
        out: pa.RecordBatch,
        keep: NDArray[np.bool_],
        mname: str | None,
        row0: int,
        seen: _Seen,
    ) -> None:
        """Count the samples left out and whether logp is ever nonzero on a loss token."""
        dropped = np.flatnonzero(~keep)
        seen.dropped += int(dropped.size)
        if dropped.size and len(seen.dropped_idx) < 5:
            idx = rb.column("idx") if "idx" in rb.schema.names else None
            for i in dropped[: 5 - len(seen.dropped_idx)].tolist():
                seen.dropped_idx.append(idx[i].as_py() if idx is not None else row0 + i)
        if not src.has("logp") or src.name("logp") not in out.schema.names:
            return
        _, lp = _flat(out.column(src.name("logp")))
        lpv = np.asarray(lp, dtype=np.float64)
        if mname is not None:
            _, m = _flat(out.column(mname))
            lpv = lpv[np.asarray(m) != 0]
        seen.logp_tokens += int(lpv.shape[0])
        seen.logp_nonzero = seen.logp_nonzero or bool(np.any(lpv != 0.0))

    def read_file_columns(self, src: Source, i: int, cols: list[str]) -> pa.Table:
        """Pass 1's table (the answer columns and their flag columns): one file, read
        whole by :meth:`answer_columns`, which never hands this to a Ray task."""
        del i, cols
        return self._pass1(src)[0]

    def answer_columns(
        self, src: Source, need_rewards: bool, allow_nonfinite: bool, read: ReadColumns | None
    ) -> AnswerColumns:
        """The answers of the file, read here (one file, even on Ray), with notes on the
        samples left out, the groups and an all-zero logp."""
        del need_rewards, allow_nonfinite, read
        table, names, seen = self._pass1(src)
        notes = []
        if seen.dropped:
            some = ", ".join(map(str, seen.dropped_idx)) + (" ..." if seen.dropped > 5 else "")
            notes.append(
                f"{seen.dropped} sample(s) without a loss token (sample_loss_mask 0, or no "
                f"token_loss_mask 1 after position 0; idx {some}) left out, as NeMo-RL's "
                "loss leaves them out"
            )
        if names.get("group") == PROMPT and seen.groups is not None:
            note = _group_note(seen.groups)
            if note:
                notes.append(note)
        if src.has("logp") and seen.logp_tokens and not seen.logp_nonzero:
            notes.append(
                f"field {src.name('logp')!r} is 0 at every loss token (what NeMo-RL writes when "
                "loss_fn.force_on_policy_ratio skips the pre-update log-probs): the "
                "objective's ratio is 1 either way, but for the policy's log-probs pass "
                "--column logp=generation_logprobs"
            )
        return AnswerColumns([table], names, table.num_rows, notes=tuple(notes))

    # ---- units and token batches
    def units(self, src: Source) -> list[Unit]:
        return [Unit(0, -1, 0, -1, file_size(self.path) // 64)]

    def raw_batches(
        self,
        src: Source,
        units: Sequence[Unit] | None,
        fields: Sequence[str],
        batch_tokens: int,
    ) -> Iterator[RawBatch]:
        """Every sample with a loss token, in order, as grpo-cli's rows (see
        :meth:`_samples`); rows count those samples."""
        del units  # one unit, read in order
        wanted = [f for f in fields if src.has(f)]
        if not wanted:
            return
        answer_fields = [f for f in ANSWER_FIELDS if src.has(f)]
        keys = self._keys(src, [*wanted, *answer_fields])
        schema = self._schema(keys)
        names = [src.name(f) for f in wanted]
        label, line, row = str(self.path), 0, 0
        for buf in chunks(self.path, chunk_bytes(batch_tokens)):
            try:
                rb = parse(buf, schema, label, line, self.what)
                if not rb.num_rows:
                    continue
                out, _, mname, gname, _ = self._samples(src, rb, keys, line)
                line += rb.num_rows
                if not out.num_rows:
                    continue
                answer = {f: src.name(f) for f in answer_fields}
                if gname is not None:
                    answer["group"] = gname
                raw = raw_record_batch(
                    out, wanted, names, mname, row, label, answer, 0, what=self.what
                )
            except InputError as exc:
                raise BatchError(row, exc) from None
            yield raw
            row += raw.n


# ------------------------------------------------------------------------ helpers
def _same_length(label: str, row0: int, name: str, got: I64, ref: str | None, lengths: I64) -> None:
    """Each sample's ``name`` has the positions of its ``ref`` field (after position 0),
    as NeMo-RL's tensors of one batch do; else one line naming the row and the field."""
    if np.array_equal(got, lengths):
        return
    i = int(np.flatnonzero(got != lengths)[0])
    raise InputError(
        f"{label}: row {row0 + i}: field {name!r} has {int(got[i]) + 1} positions but "
        f"{ref!r} has {int(lengths[i]) + 1}: every per-token field of a sample has the "
        "same length"
    )


def _unwrap(arr: pa.Array, label: str, name: str, row0: int) -> pa.Array:
    """NeMo-RL's one-sample batches: each line's value is a list of one; its element."""
    if not is_list(arr.type):
        return arr
    if arr.null_count:
        i = int(np.flatnonzero(numpy_of(arr.is_null()))[0])
        raise InputError(f"{label}: field {name!r} is missing or null at row {row0 + i}")
    lengths = np.asarray(numpy_of(pc.list_value_length(arr)))
    bad = np.flatnonzero(lengths != 1)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{label}: field {name!r} holds {int(lengths[i])} values at row {row0 + i}, "
            "expected a list of one (NeMo-RL writes one sample a line)"
        )
    return arr.flatten()


def _flat(arr: pa.Array) -> tuple[I64, np.ndarray]:
    """A list array's offsets (from 0) and values (nulls as 0, as a list of nulls alone
    is: JSON gives it Arrow's null type, whose nulls no number fills)."""
    off = numpy_of(arr.offsets).astype(np.int64)
    values = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    if pa.types.is_null(values.type):
        values = values.cast(pa.float64())
    return off - off[0], numpy_of(values.fill_null(0)) if values.null_count else numpy_of(values)


def _drop_first(arr: pa.Array) -> pa.Array:
    """Each list without its first value (position 0: no token before it to predict
    from): ``x[:, 1:]``."""
    if not is_list(arr.type):
        return arr
    off = numpy_of(arr.offsets).astype(np.int64)
    values = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    off = off - off[0]
    lengths = np.diff(off)
    keep = np.ones(int(off[-1]), dtype=np.bool_)
    keep[off[:-1][lengths > 0]] = False
    new = np.zeros(off.shape[0], dtype=np.int64)
    np.cumsum(np.maximum(lengths - 1, 0), out=new[1:])
    kept = values.filter(flag_array(keep))
    if new[-1] < 2**31:
        return pa.ListArray.from_arrays(arrow_of(new.astype(np.int32)), kept)
    return pa.LargeListArray.from_arrays(arrow_of(new), kept)


def _prompt_ids(ids: pa.Array, mask: pa.Array | None, n: int) -> pa.Array:
    """Each sample's group id: a hash of its prompt, the token ids before its first
    ``token_loss_mask`` 1 (every id when it has none: it is left out anyway)."""
    ioff, ivals = _flat(ids)
    tokens = np.asarray(ivals, dtype=np.int64)
    first = np.diff(ioff)
    if mask is not None:
        moff, mvals = _flat(mask)
        ones = np.flatnonzero(np.asarray(mvals) == 1)
        if ones.size:
            at = np.minimum(np.searchsorted(ones, moff[:-1]), ones.shape[0] - 1)
            here = (ones[at] >= moff[:-1]) & (ones[at] < moff[1:])
            first = np.where(here, ones[at] - moff[:-1], first)
    out = []
    for i in range(n):
        lo = int(ioff[i])
        prompt = tokens[lo : lo + int(first[i])]
        out.append(hashlib.blake2b(prompt.astype("<i8").tobytes(), digest_size=8).hexdigest())
    return arrow_of(np.array(out, dtype=np.str_)) if out else pa.array([], pa.string())


def _group_note(ids: pa.ChunkedArray) -> str | None:
    """A note when the prompt groups are not contiguous blocks of one size (a prompt
    drawn twice in the step, dynamic sampling's partial batches)."""
    enc = ids.combine_chunks().dictionary_encode()
    codes = np.asarray(numpy_of(enc.indices), dtype=np.int64)
    if codes.size == 0:
        return None
    sizes = np.bincount(codes)
    runs = 1 + int(np.count_nonzero(codes[1:] != codes[:-1]))
    if runs == sizes.shape[0] and sizes.min() == sizes.max():
        return None
    shape = (
        f"sizes {int(sizes.min())} to {int(sizes.max())}"
        if sizes.min() != sizes.max()
        else f"{int(sizes[0])} each"
    )
    where = "" if runs == sizes.shape[0] else f", in {runs} runs (not contiguous)"
    return (
        f"groups: the {sizes.shape[0]} distinct prompts (the tokens before each sample's "
        f"first token_loss_mask 1), {shape}{where}: NeMo-RL groups identical prompts the "
        "same way for its baseline; --column group=KEY takes group ids from a key instead"
    )
