"""A local cache of what sources on an object store read (a source's ``cache``: dir, max_bytes).

* Blocks: a file is read in aligned blocks of ``block_bytes`` (the last one short); a block
  held on local disk is read from there, a missing one is fetched whole with one ranged GET,
  kept and served. A file's bytes are the same whichever way each block came.
* Identity: a file's blocks are named by a hash of its URL, its store's endpoint, and the size
  and modification time `storage.stat` finds when it is opened. An object rewritten since
  (a new size or modification time) has other names: its old blocks are never served for it.
* Integrity: a block is written to a temporary file beside it and renamed into place (atomic),
  so no reader sees half a block; a block file of the wrong length (a crash, a truncation) is
  fetched again and replaced, never served.
* Size: ``max_bytes`` bounds the blocks held. A write that would pass it first deletes the least
  recently used blocks (reading a block touches its modification time) down to 90% of it.
* Sharing: the processes of a node may share a ``dir``. Byte-range locks (``fcntl``) on one
  lock file guard each block while it is fetched, so two processes that miss it fetch it once,
  and guard the count of bytes held that the lock file keeps. A block deleted while a reader
  has it open stays readable to that reader; one deleted before is fetched again; a block
  another process deleted first is simply gone (eviction ignores it). On a filesystem without
  locks the cache works unlocked: a block may be fetched twice, and the count is corrected by
  the next eviction, which recounts the blocks.

Nothing here knows a store: `open_cached` is given the file's identity and how to open it on
its store. Counts of this process's blocks found and fetched are in `COUNTS` (a loader
reports them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from msd.sources.storage import Listed

BLOCK_BYTES = 4 << 20
LAYOUT = "msd-blocks-v1"  # the folder of ``dir`` the cache owns (eviction touches nothing else)
EVICT_TO = 0.9  # an eviction deletes down to this share of max_bytes
STALE_TEMP_S = 3600.0  # a temporary block file this old was left by a process that died
_COUNT_BYTES = 24  # the count of bytes held: decimal, at the start of the lock file
_COUNT_LOCK = 0  # the byte of the lock file locked while the count changes
_BLOCK_LOCKS = 1 << 20  # block locks lie past here (and never on the count's bytes)
_UNSET_VAR = re.compile(r"\$(\w+|\{[^}]*\})")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheConfig:
    """Where a store's reads are kept (``dir``, ``~`` and ``$VARS`` expanded where the file is
    read) and how many bytes of blocks it may hold."""

    dir: str
    max_bytes: int
    block_bytes: int = BLOCK_BYTES


@dataclass
class Counts:
    """This process's blocks read from the cache (``hits``), fetched from the store
    (``misses``) and the bytes those fetches brought."""

    hits: int = 0
    misses: int = 0
    fetched_bytes: int = 0


COUNTS = Counts()


class CacheError(OSError):
    """The cache's folder cannot be used (one sentence naming it)."""


def counts() -> Counts:
    """A copy of this process's counts."""
    return dataclasses.replace(COUNTS)


def open_cached(
    config: CacheConfig,
    found: Listed,
    where: str,
    open_origin: Callable[[], pa.NativeFile],
    failure: Callable[[BaseException], BaseException],
) -> pa.NativeFile:
    """``found`` (a file of the store at ``where``) for random access through the cache:
    ``open_origin`` opens it on its store on the first block missing (``failure`` says what a
    failed read of it means). A `CacheError` if ``config.dir`` cannot be used."""
    origin = _Origin(open_origin, failure)
    blocks = CachedFile(folder(config.dir), config, block_key(found, where), found.size, origin)
    return pa.PythonFile(blocks, mode="r")


def block_key(found: Listed, where: str) -> str:
    """The name of a file's blocks: changes with its URL, store, size and modification time."""
    text = f"{found.path}\0{where}\0{found.size}\0{found.mtime_ns}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def resolve(dir: str) -> Path:
    """``dir`` with ``~`` and environment variables expanded; a `CacheError` if it names a
    variable that is not set here."""
    expanded = os.path.expandvars(os.path.expanduser(dir))
    unset = _UNSET_VAR.search(expanded)
    if unset:
        raise CacheError(
            f"cache.dir '{dir}' names {unset.group(0)}, which is not set on this machine; set "
            "it where the loaders run, or give cache.dir a folder"
        )
    return Path(expanded).absolute()


@functools.cache
def folder(dir: str) -> Folder:
    """The cache folder ``dir`` names (made if missing), opened once per process."""
    root = resolve(dir)
    try:
        return Folder(root / LAYOUT)
    except OSError as exc:
        raise CacheError(
            f"cache.dir '{dir}': cannot use '{root}' ({exc.strerror or exc}); give cache.dir a "
            "folder this machine can write"
        ) from exc


class Folder:
    """A cache folder on local disk: block files in 256 subfolders, and a lock file."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self._lock_fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._locking = True

    def path(self, name: str) -> Path:
        return self.root / name[:2] / name

    def open_block(self, name: str, length: int) -> _OnDisk | None:
        """The block ``name`` if it is held whole (``length`` bytes), touched as just used;
        None if it is not (missing, or of another length: it will be replaced)."""
        try:
            fd = os.open(self.path(name), os.O_RDONLY)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_size != length:
            os.close(fd)
            return None
        with contextlib.suppress(OSError):
            os.utime(fd)
        return _OnDisk(fd)

    def put(self, name: str, data: bytes, max_bytes: int) -> None:
        """Keep ``data`` as the block ``name``, evicting what ``max_bytes`` needs; a block
        that cannot be kept (a full disk) is logged, not raised: the read has its bytes."""
        if len(data) > max_bytes:
            return
        final = self.path(name)
        tmp = None
        try:
            self._reserve(len(data), max_bytes)
            final.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, final)
        except OSError as exc:
            _warn_once(f"cannot keep blocks in '{self.root}' ({exc.strerror or exc})")
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    @contextlib.contextmanager
    def locked(self, at: int) -> Iterator[None]:
        """Hold the lock on byte ``at`` of the lock file (shared by every process)."""
        held = self._lock(fcntl.LOCK_EX, at)
        try:
            yield
        finally:
            if held:
                self._lock(fcntl.LOCK_UN, at)

    def _lock(self, op: int, at: int) -> bool:
        if not self._locking:
            return False
        try:
            fcntl.lockf(self._lock_fd, op, 1, at)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            self._locking = False
            _warn_once(f"'{self.root}' has no file locks: processes may fetch a block twice")
            return False
        return True

    def _reserve(self, size: int, max_bytes: int) -> None:
        """Count ``size`` more bytes held, deleting least recently used blocks first if the
        count would pass ``max_bytes``."""
        with self.locked(_COUNT_LOCK):
            used = self._count()
            if used is None or used + size > max_bytes:
                used = self.evict(int(max_bytes * EVICT_TO) - size)
            self._set_count(used + size)

    def evict(self, target: int) -> int:
        """Delete least recently used blocks until at most ``target`` bytes are held (and
        temporary files left by dead processes); the bytes held after."""
        blocks, total = [], 0
        now = time.time()
        for entry in self._files():
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if entry.name.startswith(".tmp-"):
                if now - st.st_mtime > STALE_TEMP_S:
                    _unlink(entry.path)
                continue
            blocks.append((st.st_mtime_ns, st.st_size, entry.path))
            total += st.st_size
        blocks.sort()
        for _, size, path in blocks:
            if total <= target:
                break
            _unlink(path)
            total -= size
        return total

    def _files(self) -> Iterator[os.DirEntry[str]]:
        for sub in os.scandir(self.root):
            if sub.is_dir(follow_symlinks=False) and len(sub.name) == 2:
                with contextlib.suppress(FileNotFoundError):
                    yield from (e for e in os.scandir(sub.path) if e.is_file(follow_symlinks=False))

    def _count(self) -> int | None:
        text = os.pread(self._lock_fd, _COUNT_BYTES, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None

    def _set_count(self, used: int) -> None:
        os.pwrite(self._lock_fd, str(max(0, used)).rjust(_COUNT_BYTES).encode(), 0)


class _OnDisk:
    """A block held in the cache, open (a reader keeps it even if it is deleted meanwhile)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self, at: int, size: int) -> bytes:
        return os.pread(self.fd, size, at)

    def close(self) -> None:
        os.close(self.fd)


class _Held:
    """A block just fetched, held in memory."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, at: int, size: int) -> bytes:
        return self.data[at : at + size]

    def close(self) -> None:
        pass


class _Origin:
    """The file on its store, opened on the first block the cache does not hold."""

    def __init__(
        self,
        open_file: Callable[[], pa.NativeFile],
        failure: Callable[[BaseException], BaseException],
    ) -> None:
        self._open, self._failure = open_file, failure
        self._file: pa.NativeFile | None = None

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``: all of them, or the store's failure."""
        try:
            if self._file is None:
                self._file = self._open()
            data: bytes = self._file.read_at(size, offset)
        except (OSError, pa.ArrowException) as exc:
            raise self._failure(exc) from exc
        if len(data) != size:
            raise self._failure(
                OSError(
                    f"{len(data):,} bytes at offset {offset:,}, not the {size:,} its size "
                    "promised: the object changed while it was read"
                )
            )
        return data

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class CachedFile:
    """A remote file read block by block through a cache `Folder` (what `pa.PythonFile`
    wraps: ``read``, ``seek``, ``tell``, ``size``)."""

    def __init__(
        self, where: Folder, config: CacheConfig, key: str, size: int, origin: _Origin
    ) -> None:
        self.folder, self.config, self.key = where, config, key
        self.size_bytes, self.origin = size, origin
        self.closed = False
        self._pos = 0
        self._index = -1
        self._block: _OnDisk | _Held | None = None

    def read(self, nbytes: int | None = -1) -> bytes:
        end = self.size_bytes
        if nbytes is not None and nbytes >= 0:
            end = min(end, self._pos + nbytes)
        pieces = []
        while self._pos < end:
            index, at = divmod(self._pos, self.config.block_bytes)
            size = min(end - self._pos, self._length(index) - at)
            pieces.append(self._piece(index, at, size))
            self._pos += size
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _piece(self, index: int, at: int, size: int) -> bytes:
        data = self._enter(index).read(at, size)
        if len(data) != size:  # the block file shrank under us: never serve it
            data = self._enter(index, fetch=True).read(at, size)
        return data

    def _enter(self, index: int, fetch: bool = False) -> _OnDisk | _Held:
        if index == self._index and self._block is not None and not fetch:
            return self._block
        self._leave()
        name, length = f"{self.key}-{index}", self._length(index)
        held = None if fetch else self.folder.open_block(name, length)
        if held is not None:
            COUNTS.hits += 1
        block = held or self._fetch(index, name, length, again=fetch)
        self._index, self._block = index, block
        return block

    def _fetch(self, index: int, name: str, length: int, again: bool) -> _OnDisk | _Held:
        """The block from the store, kept; or, if another process kept it while this one
        waited for its lock, from the cache."""
        at = _BLOCK_LOCKS + int(name[:12], 16) + index
        with self.folder.locked(at):
            held = None if again else self.folder.open_block(name, length)
            if held is not None:
                COUNTS.hits += 1
                return held
            data = self.origin.read(index * self.config.block_bytes, length)
            COUNTS.misses += 1
            COUNTS.fetched_bytes += len(data)
            self.folder.put(name, data, self.config.max_bytes)
        return _Held(data)

    def _length(self, index: int) -> int:
        return min(self.config.block_bytes, self.size_bytes - index * self.config.block_bytes)

    def _leave(self) -> None:
        if self._block is not None:
            self._block.close()
        self._index, self._block = -1, None

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size_bytes}[whence]
        if base + offset < 0:
            raise ValueError(f"cannot seek to {base + offset}, before the file's start")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self.size_bytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._leave()
            self.origin.close()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # another process deleted it first
        os.unlink(path)


@functools.lru_cache(maxsize=32)
def _warn_once(message: str) -> None:
    log.warning("the local cache: %s", message)
