"""WebDataset shards: one scan of a ``.tar`` finds each sample's members; reads then seek to them.

A shard is an uncompressed tar whose members ``<key>.<ext>`` form samples (``dir/000123.jpg`` and
``dir/000123.txt`` are the sample ``dir/000123``). `index_tar` scans it once with tarfile's
streaming reader and records each member's data offset and size, so that `read_member` later
needs one seek and one read. Damage is data: a cut-short shard keeps the samples wholly before the
cut, odd members are skipped, and each problem is a short string naming the member; only a file
that cannot be opened, or is not a tar at all, raises a `SourceError`. `load_or_build_index`
caches the scan in a small JSON file keyed by the tar's size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tarfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from msd.errors import SourceError
from msd.jobdir import atomic_write

log = logging.getLogger(__name__)

TEXT_EXTS = ("txt", "text", "caption", "json")
CACHE_VERSION = 1
_BLOCK = tarfile.BLOCKSIZE
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


class TarSample(msgspec.Struct, frozen=True):
    """One sample: its ``key``, ``members`` as {extension: (data offset, size)}, its problems."""

    key: str
    members: dict[str, tuple[int, int]]
    problems: tuple[str, ...] = ()


class TarIndex(msgspec.Struct, frozen=True):
    """The samples of one shard in the tar's order, and the problems of the shard as a whole."""

    path: str
    size_bytes: int
    mtime_ns: int
    samples: tuple[TarSample, ...]
    problems: tuple[str, ...] = ()


class _Cache(msgspec.Struct, frozen=True):
    version: int
    index: TarIndex


def index_tar(path: str | Path, text_exts: Collection[str] = TEXT_EXTS) -> TarIndex:
    """Scan the tar at ``path`` once; a sample with none of ``text_exts`` is kept but flagged."""
    return _flag_missing_text(_scan(Path(path)), text_exts)


def load_or_build_index(
    path: str | Path, cache_dir: Path | None, text_exts: Collection[str] = TEXT_EXTS
) -> TarIndex:
    """The index of ``path``, from ``cache_dir`` while the tar is unchanged, else scanned anew.

    A missing, stale or damaged cache file is rebuilt, written to a temporary file and renamed;
    a cache that cannot be written only costs a scan next time.
    """
    if cache_dir is None:
        return index_tar(path, text_exts)
    tar = Path(path)
    cache = cache_dir / _cache_name(tar)
    index = _load_cache(cache, tar)
    if index is None:
        index = _scan(tar)
        if _stat_key(_stat(tar)) == (index.size_bytes, index.mtime_ns):  # unchanged while read
            _write_cache(cache, index)
    return _flag_missing_text(index, text_exts)


def read_member(path: str | Path, offset: int, size: int) -> bytes:
    """The ``size`` bytes at ``offset`` of ``path``.

    A short read means the file changed after it was indexed, which no retry of one sample
    repairs, so it raises a `SourceError` naming the file rather than returning a failure value.
    """
    if offset < 0 or size < 0:
        raise ValueError(f"a member needs a non-negative offset and size, got {offset}, {size}")
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read(size)
    except OSError as exc:
        raise SourceError(f"cannot read the WebDataset shard '{path}' ({exc})") from exc
    if len(data) != size:
        raise SourceError(
            f"the WebDataset shard '{path}' ends before byte {offset + size}, which its index "
            "names; it changed after it was indexed, so index it again"
        )
    return data


def split_name(name: str) -> tuple[str, str] | None:
    """(key, lower-cased extension) of a member name, or None when it has no ``key.ext`` form."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not stem or not dot or not ext:
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


# Scanning ----------------------------------------------------------------------------------------


class _Samples:
    """The samples found so far, by key in order of first appearance, and the problems met."""

    def __init__(self) -> None:
        self.members: dict[str, dict[str, tuple[int, int]]] = {}
        self.flags: dict[str, list[str]] = {}
        self.problems: list[str] = []

    def add(self, info: tarfile.TarInfo) -> None:
        parts = split_name(info.name)
        if parts is None:
            self.problems.append(f"member '{info.name}' has no key.extension name; skipped")
            return
        key, ext = parts
        members = self.members.setdefault(key, {})
        if ext in members:
            flag = f"duplicate member '{info.name}'; the first is kept"
            self.flags.setdefault(key, []).append(flag)
            return
        members[ext] = (info.offset_data, info.size)

    def drop(self, name: str) -> None:
        parts = split_name(name)
        if parts is not None:
            self.members.pop(parts[0], None)
            self.flags.pop(parts[0], None)

    def drop_last(self) -> None:
        """The shard stops early: its last sample may lack members after the cut, so it goes."""
        if self.members:
            key = next(reversed(self.members))
            del self.members[key]
            self.flags.pop(key, None)
            self.problems.append(f"sample '{key}' may be cut short with the shard; dropped")

    def index(self, path: Path, stat: os.stat_result) -> TarIndex:
        samples = tuple(
            TarSample(key, members, tuple(self.flags.get(key, ())))
            for key, members in self.members.items()
        )
        size_bytes, mtime_ns = _stat_key(stat)
        return TarIndex(str(path), size_bytes, mtime_ns, samples, tuple(self.problems))


def _scan(path: Path) -> TarIndex:
    try:
        with open(path, "rb") as file:
            return _scan_file(file, path)
    except OSError as exc:
        raise SourceError(f"cannot read the WebDataset shard '{path}' ({exc})") from exc


def _scan_file(file: BinaryIO, path: Path) -> TarIndex:
    samples = _Samples()
    stat = os.fstat(file.fileno())
    if stat.st_size == 0:
        samples.problems.append("empty file")
        return samples.index(path, stat)
    _refuse_compressed(file, path)
    with _open_tar(file, path) as tar:
        end = _walk(tar, samples, stat.st_size)
    if end is not None:
        _check_end(file, end, samples)
    return samples.index(path, stat)


def _walk(tar: tarfile.TarFile, samples: _Samples, size_bytes: int) -> int | None:
    """Record every member; the offset after the last one, or None if the tar is damaged."""
    last = "the start"
    try:
        for info in _members(tar):
            if info.offset_data + info.size > size_bytes:
                samples.drop(info.name)
                samples.problems.append(
                    f"member '{info.name}' is cut short at byte {size_bytes}; its sample and "
                    "everything after it are dropped"
                )
                return None
            _record(info, samples)
            last = f"member '{info.name}'"
    except tarfile.TarError as exc:
        samples.problems.append(f"unreadable tar data after {last} ({exc}); the rest is dropped")
        samples.drop_last()
        return None
    return tar.offset


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while (info := tar.next()) is not None:
        yield info


def _record(info: tarfile.TarInfo, samples: _Samples) -> None:
    if info.isdir():
        return  # `tar -c` writes folders; they hold no sample
    if info.issparse() or not info.isreg():
        samples.problems.append(f"member '{info.name}' is {_kind(info)}; skipped")
        return
    samples.add(info)


def _kind(info: tarfile.TarInfo) -> str:
    if info.issparse():
        return "a sparse file, which cannot be read by offset"
    if info.issym() or info.islnk():
        return "a link, not a regular file"
    return "a device or fifo, not a regular file"


def _check_end(file: BinaryIO, end: int, samples: _Samples) -> None:
    """Report a tar that stops without its end-of-archive block (tarfile takes that as the end)."""
    file.seek(end)
    block = file.read(_BLOCK)
    if len(block) == _BLOCK and not block.strip(b"\0"):
        return
    if not block:
        samples.problems.append(
            f"no end-of-archive block at byte {end}; the file may be cut short between members"
        )
    elif len(block) < _BLOCK:
        samples.problems.append(f"the file is cut inside the member header at byte {end}")
    else:
        samples.problems.append(f"unreadable member header at byte {end}; the rest is dropped")
    samples.drop_last()


def _flag_missing_text(index: TarIndex, text_exts: Collection[str]) -> TarIndex:
    wanted = set(text_exts)
    if not wanted:
        return index
    flag = f"no text member ({', '.join(sorted(wanted))})"
    samples = tuple(
        sample
        if wanted & sample.members.keys()
        else msgspec.structs.replace(sample, problems=(*sample.problems, flag))
        for sample in index.samples
    )
    return msgspec.structs.replace(index, samples=samples)


def _open_tar(file: BinaryIO, path: Path) -> tarfile.TarFile:
    """A streaming reader of the uncompressed tar in ``file``; a `SourceError` if it is none."""
    try:
        return tarfile.open(fileobj=file, mode="r|")
    except tarfile.TarError as exc:
        raise SourceError(
            f"the WebDataset shard '{path}' is not a tar file ({exc}); check the source's files"
        ) from exc


def _refuse_compressed(file: BinaryIO, path: Path) -> None:
    head = file.read(8)
    file.seek(0)
    for magic, name in _COMPRESSED.items():
        if head.startswith(magic):
            raise SourceError(
                f"the WebDataset shard '{path}' is {name}-compressed; msd reads members by "
                "offset, which needs an uncompressed .tar, so decompress it first"
            )


# The cache ---------------------------------------------------------------------------------------


def _cache_name(tar: Path) -> str:
    digest = hashlib.sha256(str(tar.resolve()).encode("utf-8", "surrogateescape")).hexdigest()
    return f"{tar.name}.{digest[:16]}.index.json"


def _load_cache(cache: Path, tar: Path) -> TarIndex | None:
    """The cached scan of ``tar`` if ``cache`` holds a valid one for its current size and mtime."""
    try:
        cached = msgspec.convert(json.loads(cache.read_text(encoding="utf-8")), type=_Cache)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, msgspec.ValidationError) as exc:
        log.info("rebuilding the damaged index cache '%s' (%s)", cache, exc)
        return None
    index = cached.index
    fresh = cached.version == CACHE_VERSION and Path(index.path).resolve() == tar.resolve()
    if not fresh or (index.size_bytes, index.mtime_ns) != _stat_key(_stat(tar)):
        log.info("rebuilding the stale index cache '%s'", cache)
        return None
    if not _in_bounds(index):
        log.info("rebuilding the index cache '%s': a member lies outside the tar", cache)
        return None
    return index


def _in_bounds(index: TarIndex) -> bool:
    return all(
        offset >= 0 and size >= 0 and offset + size <= index.size_bytes
        for sample in index.samples
        for offset, size in sample.members.values()
    )


def _write_cache(cache: Path, index: TarIndex) -> None:
    text = json.dumps(msgspec.to_builtins(_Cache(CACHE_VERSION, index)), separators=(",", ":"))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, text.encode("utf-8"))
    except OSError as exc:
        log.warning(
            "cannot write the index cache '%s' (%s); the tar will be scanned again", cache, exc
        )


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError as exc:
        raise SourceError(f"cannot open the WebDataset shard '{path}' ({exc})") from exc


def _stat_key(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_size, stat.st_mtime_ns
