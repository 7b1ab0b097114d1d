"""npz: padded ``(N, L)`` token arrays with a mask, rewards ``(P, G)`` (a group a row) or
``(N,)`` with a ``group`` array, optional ``advantages (N,)``; verl's per-token layouts too:
rewards ``(N, L)`` with a group array (``token_level_scores``: summed over each row, as
verl sums them) and advantages ``(N, L)`` (one value per answer when constant over its
valid tokens, else per token). One local file, read whole (its declared sizes are checked
in the ``.npy`` headers before anything is decompressed)."""

from __future__ import annotations

import dataclasses
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from ...batch import RawBatch, mask_values
from ...errors import InputError
from ..arrow import arrow_of, why
from ..fields import ANSWER_FIELDS, FLAG_FIELDS
from ..lists import (
    OUTSIDE,
    TOKEN_ADVANTAGE,
    VARIES,
    constant_advantages,
    flag_array,
    list_array,
    score_sums,
)
from ..paths import InputPath, RemoteFile
from .base import AnswerColumns, ReadColumns, Unit

if TYPE_CHECKING:
    from .base import Source

__all__ = ["NPZ_MAX_BYTES", "NpzReader", "npz_declared"]

# An npz is read whole (padded (N, L) arrays): its declared sizes are checked before any
# member is decompressed, so a small file that inflates to gigabytes is refused, not loaded.
NPZ_MAX_BYTES = 1 << 30
# Where the groups of (P, G) rewards are, in pass 1's table (no array holds them).
_ROWS = "(rows of the rewards)"
# verl's names of per-token rewards: (N, L), never (P, G)
TOKEN_SCORES = ("token_level_scores", "token_level_rewards")


def _padded_offsets(shape: tuple[int, ...]) -> NDArray[np.int64]:
    N, L = shape[0], shape[1]
    return np.arange(N + 1, dtype=np.int64) * L


def npz_declared(path: Path, name: str) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """The shape and dtype an npz member declares in its .npy header (None: no such
    member), read without decompressing its data."""
    try:
        with zipfile.ZipFile(path) as zf:
            try:
                fh = zf.open(name + ".npy")
            except KeyError:
                return None
            with fh:
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: array {name!r} is unreadable ({why(exc)})") from None
    return tuple(shape), dtype


def _real(label: str, what: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.bool_:
        return arr.astype(np.float64)
    if arr.dtype.kind in "fiu":  # not timedelta64 (a numpy integer subtype) nor datetime64
        return arr.astype(np.float64, copy=False)
    raise InputError(f"{label}: {what} has dtype {arr.dtype}, expected numbers")


def _group_array(values: np.ndarray, label: str, what: str) -> pa.Array:
    """Group ids of an npz array as an Arrow array (integers as int64: one id type
    whatever the array's width)."""
    if values.dtype.kind not in "iuUSO":
        raise InputError(f"{label}: {what} has dtype {values.dtype}, expected integers or strings")
    if values.dtype.byteorder not in ("=", "|"):  # big-endian ids: valid, stored swapped
        values = values.astype(values.dtype.newbyteorder("="))
    try:
        arr = arrow_of(values)
    except (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        UnicodeEncodeError,
    ) as exc:
        raise InputError(f"{label}: {what} cannot be read as group ids ({exc})") from None
    if pa.types.is_integer(arr.type) and arr.type != pa.uint64():
        arr = arr.cast(pa.int64())
    return arr


@dataclasses.dataclass(frozen=True)
class NpzReader:
    """One local ``.npz`` file."""

    format: ClassVar[str] = "npz"
    suffixes: ClassVar[tuple[str, ...]] = (".npz",)
    what: ClassVar[str] = "array"
    unit: ClassVar[str] = "answer"
    datasets: ClassVar[bool] = False
    remote: ClassVar[bool] = False

    paths: tuple[InputPath, ...]
    arrays: tuple[str, ...] = ()

    @classmethod
    def open(cls, paths: Sequence[InputPath]) -> NpzReader:
        if len(paths) > 1:
            raise InputError(
                f"{len(paths)} .npz files given: one .npz at a time (use parquet for datasets)"
            )
        if isinstance(paths[0], RemoteFile):
            raise InputError(
                f"{paths[0]}: .npz is read from local files only (copy it here, or write parquet)"
            )
        try:
            with np.load(paths[0], allow_pickle=False) as z:
                names = list(z.files)
        except Exception as exc:  # zipfile/OSError/ValueError: all mean the same to a user
            raise InputError(f"{paths[0]}: cannot read as .npz ({why(exc)})") from None
        return cls(tuple(paths), tuple(names))

    @property
    def path(self) -> Path:
        p = self.paths[0]
        assert isinstance(p, Path)
        return p

    def names(self) -> list[str]:
        return list(self.arrays)

    def default_name(self, field: str) -> str:
        if field in ("reward", "advantage"):
            return field + "s"  # npz arrays: rewards (P, G) or (N,), advantages (N,)
        return field

    def rows_per_file(self) -> list[int] | None:
        return None

    def _get(self, z: Any, src: Source, field: str) -> np.ndarray | None:
        if not src.has(field):
            return None
        name = src.name(field)
        try:
            return np.asarray(z[name])
        except ValueError as exc:  # object arrays need pickle: refuse
            raise InputError(f"{self.path}: array {name!r} cannot be loaded ({why(exc)})") from None
        except Exception as exc:
            raise InputError(f"{self.path}: array {name!r} is unreadable ({why(exc)})") from None

    # ---- pass 1
    def read_file_columns(self, src: Source, i: int, cols: list[str]) -> pa.Table:
        raise InputError(f"{self.path}: an npz is read whole, not by columns")

    def answer_columns(
        self, src: Source, need_rewards: bool, allow_nonfinite: bool, read: ReadColumns | None
    ) -> AnswerColumns:
        """Rewards ``(P, G)`` (groups are the rows) or ``(N,)`` with a group array, and the
        advantages, as one table; the token arrays' row count from their header (pass 1
        decompresses no token array)."""
        del allow_nonfinite, read  # finiteness is checked on the table, like any format's
        path = self.path
        with np.load(path, allow_pickle=False) as z:
            reward = self._get(z, src, "reward")
            group = self._get(z, src, "group")
            adv = self._get(z, src, "advantage")
        declared = npz_declared(path, src.name("logp")) if src.has("logp") else None
        if declared is not None and len(declared[0]) != 2:
            raise InputError(
                f"{path}: array {src.name('logp')!r} has shape {declared[0]}, expected (N, L): "
                "one row of token log-probs per answer (padded, with a mask)"
            )
        n_tokens = declared[0][0] if declared is not None else None
        rname, gname, aname = src.name("reward"), src.name("group"), src.name("advantage")
        cols: dict[str, pa.Array] = {}
        shape, n = self._reward_columns(src, reward, group, cols)
        n = n_tokens if n is None else n
        if adv is not None:
            n = self._advantage_columns(src, adv, shape, n, declared, cols)
        if n is None and not (need_rewards and reward is None):
            raise InputError(f"{path}: no {rname!r}, {aname!r} or {src.name('logp')!r} array found")
        if n_tokens is not None and n is not None and n_tokens != n:
            raise InputError(
                f"{path}: array {src.name('logp')!r} has {n_tokens} rows but there are {n} answers"
            )
        names = {
            f: c
            for f, c in (
                ("group", _ROWS if shape else gname),
                ("reward", rname),
                ("advantage", aname),
            )
            if c in cols
        }
        tables = [pa.table(cols)] if cols else []
        notes: tuple[str, ...] = ()
        if shape is not None and shape[1] == 1 and shape[0] > 1:
            notes = (
                f"array {rname!r} has shape {shape}: read as {shape[0]} groups of one answer "
                "each (P, G with G = 1), whose advantages are all 0; one reward per answer is "
                f"an (N,) array with a group array {gname!r}",
            )
        return AnswerColumns(tables, names, n, shape, notes=notes)

    def _reward_columns(
        self, src: Source, reward: np.ndarray | None, group: np.ndarray | None,
        cols: dict[str, pa.Array],
    ) -> tuple[tuple[int, int] | None, int | None]:  # fmt: skip
        """The rewards (and group ids) into ``cols``: ``(P, G)`` a group a row, ``(N,)`` with
        a group array, or ``(N, L)`` per-token scores summed per answer; returns the
        ``(P, G)`` shape (None otherwise) and the answers (None: no rewards)."""
        if reward is None:
            return None, None
        path = self.path
        rname, gname = src.name("reward"), src.name("group")
        shape: tuple[int, int] | None = None
        r2 = _real(f"{path}", f"array {rname!r}", reward)
        if r2.ndim == 2 and group is None:
            if rname in TOKEN_SCORES:
                raise InputError(
                    f"{path}: array {rname!r} holds per-token rewards (N, L): give each "
                    f"answer's group id as an (N,) array {gname!r} (or --column "
                    "group=NAME)"
                )
            P, G = r2.shape
            shape = (P, G)
            cols[_ROWS] = arrow_of(np.repeat(np.arange(P, dtype=np.int64), G))
            r = r2.reshape(-1)
        elif r2.ndim == 2:  # (N, L) per-token rewards, each answer's group given
            assert group is not None
            if group.ndim != 1 or group.shape[0] != r2.shape[0]:
                raise InputError(
                    f"{path}: array {rname!r} is 2-D {r2.shape} and {gname!r} has shape "
                    f"{group.shape}: per-token rewards (N, L) need {gname!r} of shape "
                    f"({r2.shape[0]},); rewards (P, G), a group a row, take no "
                    f"{gname!r} array"
                )
            cols[gname] = _group_array(group, str(path), f"array {gname!r}")
            r, outside = score_sums(
                r2.reshape(-1), _padded_offsets(r2.shape), self._mask(src, r2.shape, rname)
            )
            cols[rname + OUTSIDE] = flag_array(outside)
        elif r2.ndim == 1:
            r = r2
            if group is None:
                raise InputError(
                    f"{path}: array {rname!r} is 1-D, so an array {gname!r} (N,) of group "
                    f"ids is required (or give {rname!r} as (P, G))"
                )
            if group.ndim != 1 or group.shape[0] != r.shape[0]:
                raise InputError(
                    f"{path}: array {gname!r} has shape {group.shape}, expected "
                    f"({r.shape[0]},) like {rname!r}"
                )
            cols[gname] = _group_array(group, str(path), f"array {gname!r}")
        else:
            raise InputError(
                f"{path}: array {rname!r} has shape {reward.shape}, expected (P, G) or (N,)"
            )
        cols[rname] = arrow_of(r)
        return shape, int(r.shape[0])

    def _advantage_columns(
        self, src: Source, adv: np.ndarray, shape: tuple[int, int] | None, n: int | None,
        declared: tuple[tuple[int, ...], np.dtype[Any]] | None, cols: dict[str, pa.Array],
    ) -> int:  # fmt: skip
        """The advantages into ``cols``: one an answer (``(N,)``, or ``(P, G)`` like the
        rewards), or ``(N, L)`` one a token (read as the answer's when constant over its
        valid tokens); returns the answers."""
        path = self.path
        aname = src.name("advantage")
        a = _real(str(path), f"array {aname!r}", adv)
        if a.ndim == 2 and shape is not None and a.shape == shape:
            a = a.reshape(-1)
        elif a.ndim == 2 and (n is None or a.shape[0] == n):  # (N, L): one a token
            if declared is not None and tuple(declared[0]) != a.shape:
                raise InputError(
                    f"{path}: array {aname!r} has shape {a.shape}, but "
                    f"{src.name('logp')!r} has {tuple(declared[0])}: per-token "
                    "advantages are (N, L) like the token arrays"
                )
            a, varies, _, _ = constant_advantages(
                a.reshape(-1), _padded_offsets(a.shape), self._mask(src, a.shape, aname)
            )
            cols[aname + VARIES] = flag_array(varies)
        if a.ndim != 1 or (n is not None and a.shape[0] != n):
            raise InputError(
                f"{path}: array {aname!r} has shape {adv.shape}, expected ({n},)"
                + ("" if n is None else f" or ({n}, L), one value per token")
            )
        cols[aname] = arrow_of(a)
        n = a.shape[0]
        return n

    def _mask(self, src: Source, shape: tuple[int, ...], of: str) -> NDArray[np.bool_] | None:
        """The file's mask, flat, for a per-token answer array of ``shape`` (``of``
        names it); None when the file has none (every position valid)."""
        if not src.has("mask"):
            return None
        with np.load(self.path, allow_pickle=False) as z:
            m = self._get(z, src, "mask")
        assert m is not None
        mname = src.name("mask")
        if m.shape != shape:
            raise InputError(
                f"{self.path}: array {mname!r} has shape {m.shape}, but {of!r} has {shape}"
            )
        return mask_values(m, str(self.path), f"array {mname!r}").reshape(-1)

    # ---- units and token batches
    def units(self, src: Source) -> list[Unit]:
        return [Unit(0, -1, 0, -1, 0)]

    def _check_size(self, src: Source, fields: Sequence[str]) -> None:
        """Refuse an npz whose token arrays declare more than :data:`NPZ_MAX_BYTES`."""
        total = 0.0
        sizes: list[tuple[float, str, tuple[int, ...]]] = []
        for f in fields:
            if not src.has(f):
                continue
            declared = npz_declared(self.path, src.name(f))
            if declared is None:
                continue
            shape, dtype = declared
            size = float(np.prod(shape, dtype=np.float64)) * max(dtype.itemsize, 1)
            sizes.append((size, src.name(f), shape))
            total += size
        if total > NPZ_MAX_BYTES:
            _, name, shape = max(sizes)
            raise InputError(
                f"{self.path}: its token arrays declare {total / 2**30:.1f} GiB once "
                f"decompressed (array {name!r} alone declares shape {shape}), more than "
                f"{NPZ_MAX_BYTES / 2**30:.0f} GiB read at once: give the rollouts as parquet, "
                "which is streamed"
            )

    def raw_batches(
        self,
        src: Source,
        units: Sequence[Unit] | None,
        fields: Sequence[str],
        batch_tokens: int,
    ) -> Iterator[RawBatch]:
        """The whole file as one padded batch: the requested ``(N, L)`` arrays and the mask
        (all True when absent), shapes and dtypes checked."""
        del units, batch_tokens  # one unit, read whole
        wanted = [f for f in fields if src.has(f)]
        if not wanted:
            return
        path = self.path
        self._check_size(src, [*wanted, "mask"])
        raw: dict[str, np.ndarray] = {}
        with np.load(path, allow_pickle=False) as z:
            for f in wanted:
                got = self._get(z, src, f)
                assert got is not None
                raw[f] = got
            mask_raw = self._get(z, src, "mask")
        ref_name = src.name(wanted[0])
        ref_shape = raw[wanted[0]].shape
        for f, arr in raw.items():
            if arr.ndim != 2:
                raise InputError(
                    f"{path}: array {src.name(f)!r} has shape {arr.shape}, expected (N, L)"
                )
            if arr.shape != ref_shape:
                raise InputError(
                    f"{path}: array {src.name(f)!r} has shape {arr.shape}, "
                    f"but {ref_name!r} has {ref_shape}"
                )
            if f in FLAG_FIELDS:  # 0/1 per token: booleans or numbers
                raw[f] = mask_values(arr, str(path), f"array {src.name(f)!r}")
            elif arr.dtype.kind not in "fiu":  # numpy counts timedelta64 as an integer
                raise InputError(
                    f"{path}: array {src.name(f)!r} has dtype {arr.dtype}, expected floats"
                )
        if mask_raw is None:
            mask = np.ones(ref_shape, dtype=np.bool_)
        else:
            mname = src.name("mask")
            if mask_raw.shape != ref_shape:
                raise InputError(
                    f"{path}: array {mname!r} has shape {mask_raw.shape}, but {ref_name!r} has "
                    f"{ref_shape}"
                )
            mask = mask_values(mask_raw, str(path), f"array {mname!r}")
        shape: tuple[int, ...] = np.shape(mask)
        N, L = shape[0], shape[1]
        offsets = np.arange(N + 1, dtype=np.int64) * L
        names = {f: src.name(f) for f in wanted}
        if mask_raw is not None:
            names["mask"] = src.name("mask")
        yield RawBatch(
            start=0,
            label=str(path),
            unit="answer",
            offsets={f: offsets for f in raw},
            values={f: a.reshape(-1) for f, a in raw.items()},
            mask=mask.reshape(-1),
            answer=self._answer_columns(src, mask.reshape(-1), ref_shape),
            names=names,
            what="array",
            padded=True,
        )

    def _answer_columns(
        self, src: Source, mask: NDArray[np.bool_], shape: tuple[int, ...]
    ) -> dict[str, pa.Array]:
        """The answer fields of the file (group ids per answer, rewards, advantages) as
        columns, as parquet batches carry them; per-token advantages ``(N, L)`` (``shape``)
        also as their valid tokens' values (under the flat ``mask``)."""
        from ..answers import load_answers

        if not any(src.has(f) for f in ANSWER_FIELDS):
            return {}
        a = load_answers(src, need_rewards=False, allow_nonfinite=True)
        out: dict[str, pa.Array] = {}
        if a.codes is not None and a.group_ids is not None:
            out["group"] = a.group_ids.take(arrow_of(a.codes))
        if a.reward is not None:
            out["reward"] = arrow_of(a.reward)
        if a.advantage is not None:
            out["advantage"] = arrow_of(a.advantage)
            with np.load(self.path, allow_pickle=False) as z:
                adv = self._get(z, src, "advantage")
            if adv is not None and adv.ndim == 2 and adv.shape == shape:
                values = _real(str(self.path), "advantages", adv).reshape(-1)
                _, _, valid, off = constant_advantages(values, _padded_offsets(shape), mask)
                out[TOKEN_ADVANTAGE] = list_array(valid, off)
        return out
