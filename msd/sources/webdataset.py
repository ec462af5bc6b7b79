"""WebDataset shards: one scan of a ``.tar`` finds each sample's members; reads then seek to them.

A shard is an uncompressed tar whose members ``<key>.<ext>`` form samples (``dir/000123.jpg`` and
``dir/000123.txt`` are the sample ``dir/000123``). `index_tar` scans it once with tarfile's
streaming reader and records each member's data offset and size, so that `read_members` later
needs one read per run of members close together. Damage is data: a cut-short shard keeps the
samples wholly before the cut, odd members are skipped, and each problem is a short string naming
the member; only a file that cannot be opened, or is not a tar at all, raises a `SourceError`.
`load_or_build_index` caches the scan in a small JSON file keyed by the tar's size and
modification time.

A shard may be a local file or an object (``s3://bucket/key``, ``msd.sources.storage``): its scan
then reads it front to back once, in ranged GETs of `SCAN_CHUNK_BYTES`, and `read_members` reads
each run of wanted members (a sample's members are adjacent in the tar, and so are consecutive
samples) with one ranged GET.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tarfile
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgspec
import pyarrow as pa

from msd.errors import SourceError
from msd.jobdir import atomic_write
from msd.sources import storage
from msd.sources.storage import LOCAL, Store

log = logging.getLogger(__name__)

TEXT_EXTS = ("txt", "text", "caption", "json")
CACHE_VERSION = 1
# One read of a remote shard reads through up to this many unwanted bytes (tar headers, members
# not asked for) rather than start another GET; a local one reads only what is asked for.
REMOTE_GAP_BYTES = 1 << 20
LOCAL_GAP_BYTES = 0
# A read never grows past this by joining members (one member may be larger).
MAX_SPAN_BYTES = 64 << 20
# A remote shard is scanned in reads of this many bytes (each may be a request of its own).
SCAN_CHUNK_BYTES = 16 << 20
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


def index_tar(
    path: str | Path, text_exts: Collection[str] = TEXT_EXTS, store: Store = LOCAL
) -> TarIndex:
    """Scan the tar at ``path`` once; a sample with none of ``text_exts`` is kept but flagged."""
    return _flag_missing_text(_scan(_name(path), store), text_exts)


def load_or_build_index(
    path: str | Path,
    cache_dir: Path | None,
    text_exts: Collection[str] = TEXT_EXTS,
    store: Store = LOCAL,
) -> TarIndex:
    """The index of ``path``, from ``cache_dir`` while the tar is unchanged, else scanned anew.

    A missing, stale or damaged cache file is rebuilt, written to a temporary file and renamed;
    a cache that cannot be written only costs a scan next time.
    """
    if cache_dir is None:
        return index_tar(path, text_exts, store)
    tar = _name(path)
    cache = cache_dir / _cache_name(tar, store)
    index = _load_cache(cache, tar, store)
    if index is None:
        index = _scan(tar, store)
        if _stat(tar, store) == (index.size_bytes, index.mtime_ns):  # unchanged while read
            _write_cache(cache, index)
    return _flag_missing_text(index, text_exts)


def read_member(path: str | Path, offset: int, size: int, store: Store = LOCAL) -> bytes:
    """The ``size`` bytes at ``offset`` of ``path`` (one member; see `read_members`)."""
    return read_members(path, [(offset, size)], store)[0]


def read_members(
    path: str | Path, where: Sequence[tuple[int, int]], store: Store = LOCAL
) -> list[bytes]:
    """The bytes of each (offset, size) of ``where``, in that order, from ``path`` opened once
    (see `OpenShards.read`, which keeps remote shards open between calls)."""
    return OpenShards(max_open=0).read(path, where, store)


class OpenShards:
    """Reads members of shards; the ``max_open`` remote shards read most recently stay open
    between reads (opening an object costs a request, for its size). A local shard is opened
    for each read."""

    def __init__(self, max_open: int = 4) -> None:
        self.max_open = max_open
        self._files: OrderedDict[tuple[str, Store], Any] = OrderedDict()

    def read(
        self, path: str | Path, where: Sequence[tuple[int, int]], store: Store = LOCAL
    ) -> list[bytes]:
        """The bytes of each (offset, size) of ``where``, in that order, from one open ``path``.

        Members close together are read at once and sliced (`REMOTE_GAP_BYTES`): for a remote
        shard a sample, or a run of consecutive samples, costs one ranged GET.

        A short read means the file changed after it was indexed, which no retry repairs, so it
        raises a `SourceError` naming the file, as does a local file that cannot be read or a
        remote one that is gone. Any other failure of an object store is a `storage.StoreError`
        (its ``transient`` says whether a retry may succeed).
        """
        for offset, size in where:
            if offset < 0 or size < 0:
                raise ValueError(
                    f"a member needs a non-negative offset and size, got {offset}, {size}"
                )
        name = _name(path)
        if not storage.is_remote(name):
            try:
                with storage.open_input(name) as file:
                    return _read_spans(file, name, where, LOCAL_GAP_BYTES)
            except (OSError, pa.ArrowException) as exc:
                raise SourceError(f"cannot read the WebDataset shard '{name}' ({exc})") from exc
        key = (name, store)
        file = self._files.pop(key, None)
        try:
            if file is None:
                file = storage.open_input(name, store)
            out = _read_spans(file, name, where, REMOTE_GAP_BYTES)
        except SourceError:
            _close(file)
            raise
        except (OSError, pa.ArrowException) as exc:
            _close(file)  # a file that failed is not reused
            error = _read_failure(exc, name, store)
            if error is exc:
                raise
            raise error from exc
        self._files[key] = file
        while len(self._files) > self.max_open:
            _close(self._files.popitem(last=False)[1])
        return out

    def close(self) -> None:
        """Close every open shard (this stays usable)."""
        while self._files:
            _close(self._files.popitem(last=False)[1])


def _read_spans(file: Any, name: str, where: Sequence[tuple[int, int]], gap: int) -> list[bytes]:
    out: list[bytes] = [b""] * len(where)
    for start, end, picked in _spans(where, gap):
        data = file.read_at(end - start, start)
        _check_span(name, data, start, [where[i] for i in picked])
        for i in picked:
            offset, size = where[i]
            out[i] = data[offset - start : offset - start + size]
    return out


def _read_failure(exc: BaseException, name: str, store: Store) -> BaseException:
    """A remote shard's read failure: a `SourceError` if it is gone, else a `StoreError`."""
    if isinstance(exc, FileNotFoundError):
        return SourceError(
            f"the WebDataset shard '{name}' is gone ({exc}); it was removed after it was "
            "indexed, so restore it or index the source again"
        )
    if isinstance(exc, storage.StoreError):
        return exc
    return storage.store_error(exc, name, store)


def _close(file: Any) -> None:
    if file is not None:
        with contextlib.suppress(OSError, pa.ArrowException):
            file.close()


def _spans(
    where: Sequence[tuple[int, int]], gap: int, limit: int = MAX_SPAN_BYTES
) -> list[tuple[int, int, list[int]]]:
    """Runs of ``where``'s members to read at once: (start, end, indexes into ``where``), each
    joining members whose gap is at most ``gap`` bytes, while the run stays within ``limit``."""
    spans: list[tuple[int, int, list[int]]] = []
    for i in sorted(range(len(where)), key=lambda i: where[i]):
        offset, size = where[i]
        end = offset + size
        if spans:
            start, last, picked = spans[-1]
            if offset - last <= gap and max(end, last) - start <= limit:
                picked.append(i)
                spans[-1] = (start, max(end, last), picked)
                continue
        spans.append((offset, end, [i]))
    return spans


def _check_span(path: str, data: bytes, start: int, members: list[tuple[int, int]]) -> None:
    got = start + len(data)
    short = [offset + size for offset, size in members if offset + size > got]
    if short:
        raise SourceError(
            f"the WebDataset shard '{path}' ends before byte {min(short)}, which its index "
            "names; it changed after it was indexed, so index it again"
        )


def _name(path: str | Path) -> str:
    """``path`` as the functions of `storage` take it (a URL stays as it is)."""
    return path if isinstance(path, str) and storage.is_remote(path) else str(Path(path))


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

    def index(self, path: str, found: tuple[int, int]) -> TarIndex:
        samples = tuple(
            TarSample(key, members, tuple(self.flags.get(key, ())))
            for key, members in self.members.items()
        )
        size_bytes, mtime_ns = found
        return TarIndex(path, size_bytes, mtime_ns, samples, tuple(self.problems))


def _scan(path: str, store: Store) -> TarIndex:
    """Scan ``path``, read front to back once (an object in reads of `SCAN_CHUNK_BYTES`: pyarrow's
    S3 stream sends a ranged GET per read)."""
    try:
        if not storage.is_remote(path):
            with open(path, "rb") as file:
                stat = os.fstat(file.fileno())
                return _scan_file(
                    file, path, (stat.st_size, stat.st_mtime_ns), lambda at: _read_at(file, at)
                )
        found = _stat(path, store)
        if found[0] == 0:  # nothing to stream
            return _empty(path, found)
        with storage.open_stream(path, store) as raw:
            stream = pa.BufferedInputStream(raw, SCAN_CHUNK_BYTES)
            return _scan_file(
                stream, path, found, lambda at: storage.read_range(path, at, _BLOCK, store)
            )
    except SourceError:
        raise
    except (OSError, pa.ArrowException) as exc:
        cause = _cause(exc, path, store)
        raise SourceError(f"cannot read the WebDataset shard '{path}' ({cause})") from cause


def _cause(exc: BaseException, path: str, store: Store) -> BaseException:
    """What went wrong: a remote shard's failure as a `storage.StoreError` (its ``transient``
    tells a reader whether to retry), caused by ``exc``."""
    if not storage.is_remote(path) or isinstance(exc, (storage.StoreError, FileNotFoundError)):
        return exc
    error = storage.store_error(exc, path, store)
    error.__cause__ = exc
    return error


def _read_at(file: Any, offset: int) -> bytes:
    file.seek(offset)
    data: bytes = file.read(_BLOCK)
    return data


def _scan_file(
    file: Any, path: str, found: tuple[int, int], block_at: Callable[[int], bytes]
) -> TarIndex:
    """Scan the tar streamed from ``file`` (only its ``read`` is called), of (size,
    mtime) ``found``; ``block_at(offset)`` reads the block there, for the end-of-archive check."""
    size_bytes = found[0]
    if size_bytes == 0:
        return _empty(path, found)
    samples = _Samples()
    stream = _refuse_compressed(file, path)
    with _open_tar(stream, path) as tar:
        end = _walk(tar, samples, size_bytes)
    if end is not None:
        _check_end(block_at(end), end, samples)
    return samples.index(path, found)


def _empty(path: str, found: tuple[int, int]) -> TarIndex:
    samples = _Samples()
    samples.problems.append("empty file")
    return samples.index(path, found)


class _Replay:
    """``stream`` with ``head``, already read from it, served again first (tarfile's streaming
    reader only calls ``read``, and an object's stream cannot seek back)."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self._head, self._stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if not self._head:
            data: bytes = self._stream.read() if size < 0 else self._stream.read(size)
            return data
        if size < 0:
            data = self._head + self._stream.read()
            self._head = b""
            return data
        data, self._head = self._head[:size], self._head[size:]
        return data


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


def _check_end(block: bytes, end: int, samples: _Samples) -> None:
    """Report a tar that stops without its end-of-archive block (tarfile takes that as the end):
    ``block`` is what the file holds at ``end``, up to one block."""
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


def _open_tar(file: _Replay, path: str) -> tarfile.TarFile:
    """A streaming reader of the uncompressed tar in ``file``; a `SourceError` if it is none."""
    try:
        return tarfile.open(fileobj=cast(BinaryIO, file), mode="r|")
    except tarfile.TarError as exc:
        raise SourceError(
            f"the WebDataset shard '{path}' is not a tar file ({exc}); check the source's files"
        ) from exc


def _refuse_compressed(file: Any, path: str) -> _Replay:
    """``file`` from its start again, unless it is compressed (a `SourceError`)."""
    head: bytes = file.read(8)
    for magic, name in _COMPRESSED.items():
        if head.startswith(magic):
            raise SourceError(
                f"the WebDataset shard '{path}' is {name}-compressed; msd reads members by "
                "offset, which needs an uncompressed .tar, so decompress it first"
            )
    return _Replay(head, file)


# The cache ---------------------------------------------------------------------------------------


def _cache_name(tar: str, store: Store) -> str:
    """A file name of the cached scan of ``tar``: its name, and a digest of its absolute path
    (or of its URL and the store's endpoint)."""
    if not storage.is_remote(tar):
        local = Path(tar)
        digest = hashlib.sha256(str(local.resolve()).encode("utf-8", "surrogateescape"))
        return f"{local.name}.{digest.hexdigest()[:16]}.index.json"
    where = f"{storage.endpoint_of(store, tar)}\0{tar}"
    digest = hashlib.sha256(where.encode("utf-8", "surrogateescape"))
    return f"{storage.cache_name(tar)}.{digest.hexdigest()[:16]}.index.json"


def _same_file(indexed: str, tar: str) -> bool:
    if storage.is_remote(tar) or storage.is_remote(indexed):
        return indexed == tar
    return Path(indexed).resolve() == Path(tar).resolve()


def _load_cache(cache: Path, tar: str, store: Store) -> TarIndex | None:
    """The cached scan of ``tar`` if ``cache`` holds a valid one for its current size and mtime."""
    try:
        cached = msgspec.convert(json.loads(cache.read_text(encoding="utf-8")), type=_Cache)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, msgspec.ValidationError) as exc:
        log.info("rebuilding the damaged index cache '%s' (%s)", cache, exc)
        return None
    index = cached.index
    fresh = cached.version == CACHE_VERSION and _same_file(index.path, tar)
    if not fresh or (index.size_bytes, index.mtime_ns) != _stat(tar, store):
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


def _stat(path: str, store: Store) -> tuple[int, int]:
    """(size, modification time) of ``path``; a `SourceError` naming it if there is none."""
    try:
        found = storage.stat(path, store)
    except (OSError, pa.ArrowException) as exc:
        cause = _cause(exc, path, store)
        raise SourceError(f"cannot open the WebDataset shard '{path}' ({cause})") from cause
    return found.size, found.mtime_ns
