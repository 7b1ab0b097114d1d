"""Input paths: local files, directories and globs, and files on pyarrow's filesystems
(``s3://``, ``gs://``, ``hdfs://``, ``file://``)."""

from __future__ import annotations

import glob as globlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from .arrow import why

__all__ = ["InputPath", "RemoteFile", "expand"]


@dataclass(frozen=True)
class RemoteFile:
    """A file on a pyarrow filesystem (``s3://``, ``gs://``, ``hdfs://``, ...): named by
    its URI in messages, read through ``fs``; picklable, so Ray tasks read it too."""

    fs: Any  # pyarrow.fs.FileSystem
    path: str  # within fs
    uri: str

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    @property
    def parent(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[0]


InputPath = Path | RemoteFile


def expand(spec: str, known: Callable[[InputPath], bool], listing: str) -> list[InputPath]:
    """The files ``spec`` names: a file, a directory (its files ``known`` says a reader
    takes; ``listing`` names them in the error of a directory without any), or a glob; a
    URI is listed on its filesystem."""
    if "://" in spec:
        return _expand_uri(spec, known, listing)
    return list(_expand_local(spec, known, listing))


def _expand_uri(spec: str, known: Callable[[InputPath], bool], listing: str) -> list[InputPath]:
    """A URI pyarrow's filesystems understand: a file, a directory (prefix) of files, or
    a pattern of file names in one directory. ``file://`` is the local path; options
    after ``?`` (``endpoint_override=...``) are the filesystem's."""
    import fnmatch

    import pyarrow.fs as pafs

    base, q, query = spec.partition("?")
    head, _, name = base.rpartition("/")
    pattern = any(ch in name for ch in "*?[")
    try:  # a pattern: the directory opens the filesystem, file names are matched
        fs, path = pafs.FileSystem.from_uri((head if pattern else base) + q + query)
    except Exception as exc:
        raise InputError(f"{spec}: cannot open ({why(exc)})") from None
    if isinstance(fs, pafs.LocalFileSystem):
        return list(_expand_local(f"{path}/{name}" if pattern else path, known, listing))
    scheme = base.split("://", 1)[0]

    def found(infos: list[Any], keep: Callable[[str], bool]) -> list[InputPath]:
        names = sorted(i.path for i in infos if i.type == pafs.FileType.File and keep(i.base_name))
        return [RemoteFile(fs, f, f"{scheme}://{f}") for f in names]

    try:
        if pattern:
            listed = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            files = found(listed, lambda n: fnmatch.fnmatch(n, name))
            if not files:
                raise InputError(f"{spec}: no file matches this pattern")
            return files
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            listed = fs.get_file_info(pafs.FileSelector(path))
            files = found(listed, lambda n: known(Path(n)))
            if not files:
                raise InputError(f"{spec}: directory holds no {listing} file")
            return files
        if info.type == pafs.FileType.File:
            return [RemoteFile(fs, path, f"{scheme}://{path}")]
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"{spec}: cannot list ({why(exc)})") from None
    raise InputError(f"{spec}: no such file")


def _expand_local(spec: str, known: Callable[[InputPath], bool], listing: str) -> list[Path]:
    p = Path(spec)
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.is_file() and known(q))
        if not files:
            raise InputError(f"{spec}: directory holds no {listing} file")
        return files
    if p.is_file():  # a file named like a pattern (run[1].parquet) is that file
        return [p]
    if any(ch in spec for ch in "*?["):
        files = sorted(Path(f) for f in globlib.glob(spec, recursive=True) if Path(f).is_file())
        if not files:
            raise InputError(f"{spec}: no file matches this pattern")
        return files
    if not p.exists():
        raise InputError(f"{spec}: no such file")
    if not p.is_file():
        raise InputError(f"{spec}: not a regular file")
    return [p]
