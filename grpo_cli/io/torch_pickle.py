"""Read a ``torch.save`` file without torch and without running code from its pickle.

A ``.pt`` file written by ``torch.save`` (torch ≥ 1.6, the default zip format) is a zip
archive: ``<prefix>/data.pkl`` is a pickle of the saved object whose tensors point, by a
persistent id ``("storage", torch.<Type>Storage, key, location, numel)``, at raw
little-endian storages ``<prefix>/data/<key>``; ``<prefix>/byteorder`` says the byte order
(absent: little). A tensor is ``torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, requires_grad, backward_hooks[, metadata])``: a strided view of its storage.

:func:`load` unpickles ``data.pkl`` with a :class:`pickle.Unpickler` whose ``find_class``
knows only what a dump of tensors and plain data holds (the model of
``torch.load(weights_only=True)``'s allow-list and of safetensors' "no code in the
format"): the tensor rebuild, the typed storage classes, ``collections.OrderedDict``, the
``bytes`` reconstruction of pickle protocol 2, NumPy scalars, dtypes and arrays of
numbers. Each is answered by a function of this module, never by the named global itself;
any other global is refused in one line naming the file and the global, before anything
is built. Tensors come back as independent NumPy arrays of their shape: float16/32/64,
int8–64, uint8–64, bool and complex keep their dtype; **bfloat16 is widened to float32**
(exactly: a bfloat16 is the upper half of a float32).

Bounded: only a regular file is opened (a FIFO would block, ``/dev/zero`` never ends);
the pickle (``data.pkl``) may hold at most ``max_pickle_bytes`` (default 512 MiB; Python
objects take several times their pickled size in memory) and the storages read plus the
arrays built at most ``max_array_bytes`` (default 4 GiB) and at most
:data:`MAX_EXPANSION` times the file's size on disk (64 MiB at least): ``torch.save``
stores its entries uncompressed, so a real dump's arrays are about twice its size, while
a deflated entry of zeros (a zip bomb: 1 MB on disk, 1 GiB read) is refused before it
is read; containers nested deeper than 64 levels, holding themselves or shared past
16 times the pickle's bytes are refused (:func:`_check_shape`). The zip entries' sizes
are read from the archive's directory, so a compressed entry cannot expand past the
bound; an entry whose bytes end before the size its directory claims is named, as
damaged.

The legacy non-zip format (torch < 1.6, or ``_use_new_zipfile_serialization=False``) is
not read: slime's dump writers call ``torch.save(obj, path)`` with the defaults
(``slime/observability/train_data_utils.py:242``, ``rollout_data_utils.py:153``).
"""

from __future__ import annotations

import io
import pickle
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from grpo_cli.errors import InputError

from .bounded import MAX_DEPTH, regular

__all__ = ["MAX_ARRAY_BYTES", "MAX_EXPANSION", "MAX_PICKLE_BYTES", "load"]

MAX_PICKLE_BYTES = 512 * 2**20
MAX_ARRAY_BYTES = 4 * 2**30
MAX_EXPANSION = 16
"""The storages read plus the arrays built: at most this many times the file's size."""
_EXPANSION_FLOOR = 64 * 2**20
# what reading a damaged or hostile zip entry raises (a CRC or size mismatch, a bad
# deflate stream, an encrypted entry or an unknown compression method)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError,
               NotImplementedError)  # fmt: skip

# torch.<Name>Storage -> the NumPy dtype of one element (bfloat16: its raw 16 bits).
_STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}

# torch.<dtype> of a tensor saved by _rebuild_tensor_v3 (an untyped storage of bytes):
# the dtypes torch.storage._new_dtypes() lists that NumPy has.
_V3_DTYPES = {"uint16": "uint16", "uint32": "uint32", "uint64": "uint64"}

# NumPy dtypes an array or scalar inside the pickle may have (no object, no void).
_NUMPY_KINDS = frozenset("biufc")


class _StorageType:
    """What ``torch.<Name>Storage`` resolves to: a tag carrying the element dtype."""

    __slots__ = ("dtype", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = "uint8" if name == "UntypedStorage" else _STORAGE_DTYPES[name]


class _TorchDtype:
    """What ``torch.uint16`` (…) resolves to: the dtype argument of ``_rebuild_tensor_v3``."""

    __slots__ = ("dtype",)

    def __init__(self, name: str) -> None:
        self.dtype = _V3_DTYPES[name]


class _Storage:
    """One storage of the archive, its raw elements read once (shared by every view)."""

    __slots__ = ("data", "dtype", "key")

    def __init__(self, key: str, dtype: str, data: np.ndarray) -> None:
        self.key, self.dtype, self.data = key, dtype, data


class _Refused(Exception):
    """A global or a value the allow-list does not admit (becomes one InputError)."""


class _Loader:
    """The state of one :func:`load`: the archive, its storages read so far, the bytes
    spent against ``max_array_bytes``."""

    def __init__(
        self, path: Path, archive: zipfile.ZipFile, prefix: str, limit: int, size: int
    ) -> None:
        self.path, self.archive, self.prefix = path, archive, prefix
        expansion = max(MAX_EXPANSION * size, _EXPANSION_FLOOR)
        self.limit = min(limit, expansion)
        self.bound = (
            "max_array_bytes" if limit <= expansion
            else f"{MAX_EXPANSION} times the file's {size} bytes: torch.save stores its "
            "storages uncompressed, so this archive expands as a zip bomb does"
        )  # fmt: skip
        self.spent = 0
        self.numpy_named = False
        self.storages: dict[str, _Storage] = {}
        order = _read_text(archive, f"{prefix}byteorder")
        if order not in (None, "little", "big"):
            raise InputError(f"{path}: byteorder record {order!r} is neither 'little' nor 'big'")
        self.byteorder: Literal["<", ">"] = "<" if order in (None, "little") else ">"

    def spend(self, nbytes: int, what: str) -> None:
        self.spent += nbytes
        if self.spent > self.limit:
            raise _Refused(
                f"{what} brings the arrays read to {self.spent} bytes, over the limit of "
                f"{self.limit} ({self.bound})"
            )

    def storage(self, saved_id: Any) -> _Storage:
        if not (isinstance(saved_id, tuple) and len(saved_id) == 5 and saved_id[0] == "storage"):
            raise _Refused(f"persistent id {_short(saved_id)} is not a tensor storage")
        _, kind, key, _location, numel = saved_id
        if not isinstance(kind, _StorageType):
            raise _Refused(f"persistent id names storage type {_short(kind)}")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise _Refused(f"persistent id {_short(saved_id)} has a bad key or size")
        if key in self.storages:
            return self.storages[key]
        name = f"{self.prefix}data/{key}"
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            raise _Refused(f"storage {key!r} is not in the archive (no entry {name})") from None
        dtype = np.dtype("uint16" if kind.dtype == "bfloat16" else kind.dtype)
        nbytes = numel * dtype.itemsize
        if info.file_size < nbytes:
            raise _Refused(f"storage {key!r} holds {info.file_size} bytes, {nbytes} expected")
        self.spend(nbytes, f"storage {key!r}")
        try:
            with self.archive.open(info) as f:
                raw = f.read(nbytes)
        except _ZIP_ERRORS as exc:
            raise _Refused(
                f"storage {key!r} cannot be read from the archive "
                f"({str(exc) or type(exc).__name__}): the file is damaged"
            ) from None
        if len(raw) < nbytes:
            raise _Refused(f"storage {key!r} ends after {len(raw)} bytes, {nbytes} expected")
        data = np.frombuffer(raw, dtype=dtype.newbyteorder(self.byteorder), count=numel)
        storage = _Storage(key, kind.dtype, data)
        self.storages[key] = storage
        return storage

    def tensor(self, storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> np.ndarray:
        """``_rebuild_tensor_v2``: the view ``storage[offset + Σ index_d·stride_d]``."""
        if not isinstance(storage, _Storage):
            raise _Refused(f"a tensor is rebuilt from {_short(storage)}, not from a storage")
        return self._view(storage, offset, size, stride)

    def tensor_v3(
        self,
        storage: Any,
        offset: Any,
        size: Any,
        stride: Any,
        requires_grad: Any,
        hooks: Any,
        dtype: Any,
        *_rest: Any,
    ) -> np.ndarray:
        """``_rebuild_tensor_v3``: a tensor of a dtype without a typed storage (uint16,
        uint32, uint64), its untyped storage's bytes read as that dtype."""
        if not isinstance(storage, _Storage) or storage.dtype != "uint8":
            raise _Refused(f"a tensor is rebuilt from {_short(storage)}, not from a storage")
        if not isinstance(dtype, _TorchDtype):
            raise _Refused(f"a tensor of dtype {_short(dtype)}")
        data = storage.data
        item = np.dtype(dtype.dtype).itemsize
        usable = data.size - data.size % item
        typed = data[:usable].view(np.dtype(dtype.dtype).newbyteorder(self.byteorder))
        return self._view(_Storage(storage.key, dtype.dtype, typed), offset, size, stride)

    def _view(self, storage: _Storage, offset: Any, size: Any, stride: Any) -> np.ndarray:
        shape, strides = _ints(size), _ints(stride)
        if not isinstance(offset, int) or offset < 0 or shape is None or strides is None:
            raise _Refused(f"a tensor of storage {storage.key!r} has a bad offset, size or stride")
        if len(shape) != len(strides) or any(n < 0 for n in shape) or any(s < 0 for s in strides):
            raise _Refused(
                f"a tensor of storage {storage.key!r} has size {size} and stride {stride}"
            )
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        item = storage.data.dtype.itemsize
        if count:
            last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
            if last >= storage.data.size:
                raise _Refused(
                    f"a tensor of size {tuple(shape)} at offset {offset} with stride "
                    f"{tuple(strides)} reaches past the {storage.data.size} elements of "
                    f"storage {storage.key!r}"
                )
        out_item = 4 if storage.dtype == "bfloat16" else item
        self.spend(count * out_item, f"a tensor of size {tuple(shape)}")
        if count:
            view = np.lib.stride_tricks.as_strided(
                storage.data[offset:],
                shape=tuple(shape),
                strides=tuple(s * item for s in strides),
                writeable=False,
            )
            out = np.array(view, dtype=storage.data.dtype.newbyteorder("="))
        else:
            out = np.empty(tuple(shape), dtype=storage.data.dtype.newbyteorder("="))
        if storage.dtype == "bfloat16":
            out = (out.astype(np.uint32) << 16).view(np.float32)
        elif storage.dtype == "bool":
            out = out.astype(bool)
        return out


def load(
    path: str | Path,
    *,
    max_pickle_bytes: int = MAX_PICKLE_BYTES,
    max_array_bytes: int = MAX_ARRAY_BYTES,
) -> Any:
    """The object a ``torch.save`` file holds, its tensors as NumPy arrays.

    Nothing in the file is executed: only the globals listed in this module's docstring
    are admitted, each answered by this module's own code.

    Args:
      path: a file written by ``torch.save`` (the zip format, torch ≥ 1.6).
      max_pickle_bytes: refuse a pickle (``data.pkl``) larger than this.
      max_array_bytes: refuse once the storages read plus the arrays built exceed this.

    Returns:
      The saved object: dicts, lists, tuples, str, int, float, bool, None, bytes, sets,
      NumPy scalars, and one independent ``np.ndarray`` per tensor (bfloat16 as float32).

    Raises:
      InputError: the file is missing, not a torch.save zip archive, over a bound, or its
        pickle names a global or holds a value outside the allow-list (one line naming
        the file and the global).
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a torch.save file")
    st = regular(path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise InputError(
            f"{path}: not a zip archive as torch.save writes ({e}); the legacy format "
            "(torch < 1.6 or _use_new_zipfile_serialization=False) is not read: save it "
            "again with a newer torch"
        ) from None
    with archive:
        pkl = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
        if len(pkl) != 1:
            raise InputError(
                f"{path}: a torch.save archive holds one <prefix>/data.pkl, this one {len(pkl)}"
            )
        name = pkl[0]
        prefix = name[: -len("data.pkl")]
        size = archive.getinfo(name).file_size
        if size > max_pickle_bytes:
            raise InputError(
                f"{path}: its pickle ({name}) is {size} bytes, over the limit of "
                f"{max_pickle_bytes} (max_pickle_bytes)"
            )
        try:
            with archive.open(name) as f:
                data = f.read(size + 1)
        except _ZIP_ERRORS as e:
            raise InputError(
                f"{path}: {name} cannot be read ({str(e) or type(e).__name__}): the file is damaged"
            ) from None
        if len(data) != size:
            raise InputError(
                f"{path}: {name} holds {len(data)} bytes, its archive's directory says {size}: "
                "the file is damaged"
            )
        loader = _Loader(path, archive, prefix, max_array_bytes, st.st_size)
        unpickler = _Unpickler(io.BytesIO(data), loader)
        try:
            obj = unpickler.load()
            _check_shape(obj, size)  # before anything recurses into it (repr, _finish)
            # NumPy objects are placeholders until their state is set: swap in the values
            return _finish(obj) if loader.numpy_named else obj
        except _Refused as e:
            raise InputError(f"{path}: refused: {e}; grpo-cli runs no code from a pickle") from None
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
                RecursionError) as e:  # fmt: skip
            raise InputError(f"{path}: {name} is not a readable pickle ({e})") from None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, loader: _Loader) -> None:
        super().__init__(file)
        self.loader = loader

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name, self.loader)
        if found is None:
            raise _Refused(
                f"the pickle names the global {module}.{name}, which a dump of tensors and "
                "plain data does not hold"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        return self.loader.storage(pid)


def _allowed(module: str, name: str, loader: _Loader) -> Any:
    """What an admitted global resolves to (always this module's own code), or None."""
    if module == "torch" and name in _STORAGE_DTYPES:
        return _StorageType(name)
    if module in ("torch", "torch.storage") and name == "UntypedStorage":
        return _StorageType(name)
    if module == "torch" and name in _V3_DTYPES:
        return _TorchDtype(name)
    if module == "torch._utils" and name == "_rebuild_tensor_v2":
        return loader.tensor
    if module == "torch._utils" and name == "_rebuild_tensor_v3":
        return loader.tensor_v3
    if module == "collections" and name == "OrderedDict":
        return _ordered_dict
    if module == "_codecs" and name == "encode":
        return _latin1_bytes
    if module in ("builtins", "__builtin__"):
        return _BUILTINS.get(name)
    found: Any = None
    if module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found = {"scalar": _numpy_scalar, "_reconstruct": _numpy_reconstruct}.get(name)
    elif module == "numpy" and name == "dtype":
        found = _numpy_dtype
    elif module == "numpy" and name == "ndarray":
        found = _NdarrayTag
    loader.numpy_named = loader.numpy_named or found is not None
    return found


def _ordered_dict(*args: Any) -> OrderedDict[Any, Any]:
    if args and not (len(args) == 1 and isinstance(args[0], list)):
        raise _Refused("collections.OrderedDict is built from something other than a list")
    return OrderedDict(*args)


def _latin1_bytes(text: Any, encoding: Any = "utf-8") -> bytes:
    """``_codecs.encode(str, 'latin1')``: how pickle protocol 2 spells a bytes object."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused(f"_codecs.encode is called on {_short(text)}, {_short(encoding)}")
    return text.encode("latin1")


def _data_builtin(kind: type) -> Callable[..., Any]:
    def build(*args: Any) -> Any:
        sized = kind in (bytes, bytearray) and any(isinstance(a, int) for a in args)
        if sized or any(not isinstance(a, _PLAIN) for a in args):
            raise _Refused(f"builtins.{kind.__name__} is built from {_short(args)}")
        return kind(*args)

    return build


_PLAIN = (str, bytes, int, float, complex, bool, list, tuple, set, frozenset, dict, type(None))
_BUILTINS: dict[str, Any] = {
    k.__name__: _data_builtin(k)
    for k in (set, frozenset, bytes, bytearray, complex, slice, list, tuple, dict, int, float, str)
}


class _NdarrayTag:
    """``numpy.ndarray`` as the first argument of ``_reconstruct``: a tag, never called."""


class _PendingArray:
    """What ``_reconstruct`` returns; ``__setstate__`` (pickle's BUILD) fills it in."""

    def __init__(self) -> None:
        self.value: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise _Refused(f"a NumPy array's state is {_short(state)}")
        _version, shape, pending, fortran, raw = state
        dims = _ints(shape)
        dtype = pending.value if isinstance(pending, _PendingDtype) else None
        if not isinstance(dtype, np.dtype) or dims is None or not isinstance(raw, bytes):
            raise _Refused("a NumPy array of numbers is expected (no object arrays)")
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if len(raw) != count * dtype.itemsize:
            raise _Refused(f"a NumPy array of shape {tuple(dims)} holds {len(raw)} bytes")
        flat = np.frombuffer(raw, dtype=dtype, count=count).copy()
        self.value = flat.reshape(tuple(dims), order="F" if fortran else "C")


def _numpy_reconstruct(kind: Any, shape: Any, typecode: Any) -> _PendingArray:
    if kind is not _NdarrayTag:
        raise _Refused(f"numpy _reconstruct of {_short(kind)}")
    return _PendingArray()


class _PendingDtype:
    """``numpy.dtype(code, align, copy)``, its state (the byte order) set by BUILD."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.value = _numeric_dtype(code)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) >= 2 and state[1] in ("<", ">", "|", "="):
            self.value = self.value.newbyteorder(state[1])


def _numeric_dtype(code: Any) -> np.dtype:
    if not isinstance(code, str) or len(code) > 8:
        raise _Refused(f"numpy.dtype of {_short(code)}")
    try:
        dtype = np.dtype(code)
    except TypeError:
        raise _Refused(f"numpy.dtype of {code!r}") from None
    if dtype.kind not in _NUMPY_KINDS:
        raise _Refused(f"a NumPy dtype {code!r} (only numbers and bool are read)")
    return dtype


def _numpy_dtype(code: Any, *_flags: Any) -> _PendingDtype:
    return _PendingDtype(code)


def _numpy_scalar(dtype: Any, raw: Any = None) -> Any:
    dt = dtype.value if isinstance(dtype, _PendingDtype) else None
    if dt is None or not isinstance(raw, bytes) or len(raw) != dt.itemsize:
        raise _Refused(f"a NumPy scalar of {_short(dtype)}")
    return np.frombuffer(raw, dtype=dt, count=1)[0]


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _kids(v: Any) -> list[Any]:
    if isinstance(v, dict):
        return [x for kv in v.items() for x in kv if isinstance(x, _CONTAINERS)]
    return [x for x in v if isinstance(x, _CONTAINERS)]


def _check_shape(value: Any, pickled: int) -> None:
    """Refuse what no recursive walk (``repr``, :func:`_finish`, a reader) survives:
    containers nested deeper than :data:`~grpo_cli.io.bounded.MAX_DEPTH` (200,000 nested
    lists are 400 KB of pickle), a container holding itself, and containers shared so
    often that, expanded, they hold over :data:`MAX_EXPANSION` times the pickle's bytes
    (a "billion laughs": 60 levels of a list of two references to the next). One
    depth-first walk with a stack, each container once."""
    budget = MAX_EXPANSION * pickled + (1 << 20)
    size: dict[int, int] = {}  # a finished container's elements, expanded
    height: dict[int, int] = {}
    open_: set[int] = set()  # the containers on the current path
    stack: list[tuple[Any, bool]] = [(value, False)] if isinstance(value, _CONTAINERS) else []
    while stack:
        v, finished = stack.pop()
        i = id(v)
        if finished:
            kids = _kids(v)
            size[i] = len(v) + sum(size[id(k)] for k in kids)
            height[i] = 1 + max((height[id(k)] for k in kids), default=0)
            open_.discard(i)
            if height[i] > MAX_DEPTH:
                raise _Refused(
                    f"containers nested deeper than {MAX_DEPTH} levels (grpo-cli's limit)"
                )
            if size[i] > budget:
                raise _Refused(
                    f"containers shared so often that they expand to over {budget} elements "
                    f"({MAX_EXPANSION} times the pickle's bytes)"
                )
            continue
        if i in size:
            continue
        if i in open_:
            raise _Refused("a container holds itself")
        open_.add(i)
        stack.append((v, True))
        stack.extend((k, False) for k in _kids(v) if id(k) not in size)


def _finish(value: Any) -> Any:
    """Replace the placeholders of NumPy objects by their values, everywhere."""
    if isinstance(value, (_PendingArray, _PendingDtype)):
        return value.value
    if isinstance(value, OrderedDict):
        return OrderedDict((_finish(k), _finish(v)) for k, v in value.items())
    if isinstance(value, dict):
        return {_finish(k): _finish(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finish(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_finish(v) for v in value)
    return value


def _ints(value: Any) -> list[int] | None:
    if not isinstance(value, (tuple, list)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return None
    return list(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read_text(archive: zipfile.ZipFile, name: str) -> str | None:
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    if info.file_size > 64:
        return None
    with archive.open(info) as f:
        return f.read(64).decode("ascii", "replace").strip()
