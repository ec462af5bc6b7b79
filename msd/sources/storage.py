"""Where a source's files live: the local filesystem, or an object store (``s3://``, ``gs://``,
``az://``/``abfs[s]://``) through pyarrow's own filesystems, one module a store
(`msd.sources.stores`).

pyarrow's filesystems rather than fsspec: pyarrow is already how msd reads Parquet and Arrow,
its S3, GCS and Azure clients are C++ (reads run without the GIL, no event loop in every
loader), and a `pyarrow.NativeFile` it opens reads byte ranges (``read_at``), so a row group, a
tar member or a line range is one ranged GET — no file is ever downloaded whole. Credentials
come from each cloud's standard chain; a source's ``endpoint_url`` names a compatible store or
an emulator (`msd.sources.stores.s3`, `.gcs`, `.azure` say how).

A store's client retries little or not at all: a loader retries a failed read itself (``loader.
read_retry_s``), between its other work, and counts every retry (``msd.roles.loader``).

Every function takes a path that is either local or a URL; `is_remote` tells which.
"""

from __future__ import annotations

import dataclasses
import glob as globmod
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from msd.sources import stores
from msd.sources.cache import CacheConfig, CacheError, open_cached
from msd.sources.stores import Meaning, ObjectStore, Place, azure, gcs, s3
from msd.sources.stores import StoreError as StoreError  # where callers have always found it

SCHEMES = tuple(stores.SCHEMES)
_MODULES: dict[str, ObjectStore] = {"s3": s3, "gcs": gcs, "azure": azure}
_WILDCARD = re.compile(r"[*?\[]")
# Opening a source (listing, footers, indexes) tries a store's transient failure again for up
# to this long, blocking: it happens before a role serves anyone.
OPEN_RETRY_S = 30.0

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Store:
    """How to reach an object store: its endpoint (None: the cloud's own, or the one its
    environment names: an S3-compatible store, an emulator), and whether to sign requests
    (``anonymous``: a public bucket or container); ``cache``: keep what is read on local disk
    (`msd.sources.cache`); ``listed``: the size and modification time the job recorded for
    each of its files (``msd.launch.listing``), which a file read through the cache must
    still have."""

    endpoint_url: str | None = None
    anonymous: bool = False
    cache: CacheConfig | None = None
    listed: Mapping[str, tuple[int, int]] | None = field(default=None, compare=False)


LOCAL = Store()


@dataclass(frozen=True)
class Listed:
    """A file as it was found: its path (absolute, or a URL), size and modification time."""

    path: str
    size: int
    mtime_ns: int


def retrying(fn: Callable[[], T], path: str, store: Store, budget_s: float | None = None) -> T:
    """``fn()``, tried again while it fails with a store's transient failure (anywhere in its
    exception's chain), backing off, for up to ``budget_s`` (`OPEN_RETRY_S` as it is when
    called); local paths are not retried."""
    if not is_remote(path):
        return fn()
    budget_s = OPEN_RETRY_S if budget_s is None else budget_s
    started, delay = time.monotonic(), 0.2
    while True:
        try:
            return fn()
        except Exception as exc:
            if not transient(exc, path, store) or time.monotonic() - started + delay > budget_s:
                raise
            log.info("'%s': the store failed (%s); trying again", path, str(exc)[:200])
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


def transient(exc: BaseException, path: str, store: Store) -> bool:
    """Whether ``exc``, or an exception it was raised from, is a store's transient failure."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StoreError):
            return seen.transient
        if isinstance(seen, OSError | pa.ArrowException) and not isinstance(
            seen, FileNotFoundError
        ):
            return store_error(seen, path, store).transient
        seen = seen.__cause__
    return False


def is_remote(path: str) -> bool:
    return path.startswith(SCHEMES)


def store_of_url(url: str) -> ObjectStore:
    """The module of the store ``url`` is in (by its scheme)."""
    scheme = url[: url.index("://") + 3]
    return _MODULES[stores.SCHEMES[scheme]]


def filesystem(path: str, store: Store) -> tuple[pafs.FileSystem, str]:
    """The filesystem ``path`` lives on, and the path to give it (``bucket/key`` for a URL)."""
    if not is_remote(path):
        return pafs.LocalFileSystem(), path
    kind = store_of_url(path)
    where = kind.place(path)
    return kind.filesystem(where, store), where.inner


def endpoint_of(store: Store, path: str) -> str:
    """Where the store's requests for ``path`` go, in words, for messages and cache keys."""
    kind = store_of_url(path)
    try:
        return kind.endpoint(kind.place(path), store)
    except StoreError:
        return store.endpoint_url or "an object store"


def bucket_word(path: str) -> str:
    """What holds a URL's objects, in its store's words: ``bucket``, ``container``."""
    return store_of_url(path).NOUN


def open_input(path: str, store: Store = LOCAL) -> pa.NativeFile:
    """``path`` opened for random access (``read_at``, ``size``); for S3 every read is a ranged
    GET."""
    if not is_remote(path):
        return pa.OSFile(path, "rb")
    if store.cache is not None:
        return _cached(path, store)
    fs, inner = filesystem(path, store)
    return _call(lambda: fs.open_input_file(inner), path, store)


def _cached(path: str, store: Store) -> pa.NativeFile:
    """``path`` read through ``store.cache``: the blocks it holds from local disk, the others
    from the store (and kept); an object changed since it was cached is read anew."""
    assert store.cache is not None
    plain = dataclasses.replace(store, cache=None, listed=None)
    now = stat(path, plain)
    then = None if store.listed is None else store.listed.get(path)
    if then is not None and then != (now.size, now.mtime_ns):
        raise StoreError(
            f"'{path}' changed after the job listed it ({then[0]:,} bytes then, {now.size:,} "
            "now, or a newer modification time); put the old object back, or start a new job",
            transient=False,
        )
    try:
        return open_cached(
            store.cache,
            now,
            endpoint_of(plain, path),
            lambda: open_input(path, plain),
            lambda exc: _failure(exc, path, plain),
        )
    except CacheError as exc:
        raise StoreError(str(exc), transient=False) from None


def open_stream(path: str, store: Store = LOCAL) -> pa.NativeFile:
    """``path`` opened for reading front to back, its bytes as stored (a ``.gz`` is not
    decompressed). For S3 every ``read`` is one ranged GET: read in large pieces."""
    if not is_remote(path):
        return pa.OSFile(path, "rb")
    if store.cache is not None:
        return _cached(path, store)
    fs, inner = filesystem(path, store)
    return _call(lambda: fs.open_input_stream(inner, compression=None), path, store)


def read_bytes(path: str, store: Store = LOCAL) -> bytes:
    """The whole of a small file (an index, a ``state.json``)."""
    with open_stream(path, store) as f:
        data: bytes = _call(f.read, path, store)
        return data


def read_range(path: str, offset: int, size: int, store: Store = LOCAL) -> bytes:
    """``size`` bytes at ``offset`` (fewer where the file ends first)."""
    with open_input(path, store) as f:
        data: bytes = _call(lambda: f.read_at(size, offset), path, store)
        return data


def stat(path: str, store: Store = LOCAL) -> Listed:
    """``path``'s size and modification time; FileNotFoundError if it is not a file."""
    if not is_remote(path):
        st = os.stat(path)
        return Listed(path, st.st_size, st.st_mtime_ns)
    fs, inner = filesystem(path, store)
    info = _call(lambda: fs.get_file_info(inner), path, store)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"no object '{path}'")
    return Listed(path, int(info.size or 0), int(info.mtime_ns or 0))


def is_file(path: str, store: Store = LOCAL) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    fs, inner = filesystem(path, store)
    return bool(_call(lambda: fs.get_file_info(inner), path, store).type == pafs.FileType.File)


def is_dir(path: str, store: Store = LOCAL) -> bool:
    """A local folder; for a URL, a prefix holding objects (``s3://bucket/prefix``)."""
    if not is_remote(path):
        return os.path.isdir(path)
    fs, inner = filesystem(path, store)
    info = _call(lambda: fs.get_file_info(inner.rstrip("/")), path, store)
    return bool(info.type == pafs.FileType.Directory)


def join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if is_remote(folder) else os.path.join(folder, name)


def sibling(path: str, ext: str) -> str:
    """``path`` with its extension replaced by ``ext`` (``a/b.idx`` → ``a/b.bin``)."""
    head, _, name = path.rpartition("/")
    stem = os.path.splitext(name)[0]
    return f"{head}/{stem}{ext}" if head else stem + ext


def name_of(path: str) -> str:
    return path.rstrip("/").rpartition("/")[2]


def glob(pattern: str, store: Store = LOCAL) -> tuple[Listed, ...]:
    """The regular files ``pattern`` matches (``~`` expanded, ``**`` any folders, ``*``/``?``/
    ``[...]`` within one), sorted by path; local paths made absolute."""
    if not is_remote(pattern):
        found = globmod.glob(os.path.expanduser(pattern), recursive=True)
        paths = sorted({os.path.abspath(m) for m in found if os.path.isfile(m)})
        return tuple(stat(p) for p in paths)
    fs, inner = filesystem(pattern, store)
    where = store_of_url(pattern).place(pattern)
    key = where.key
    literal = _WILDCARD.split(key, maxsplit=1)[0]
    if literal == key:  # no wildcard: one object (a folder is not matched, like glob)
        info = _call(lambda: fs.get_file_info(inner), pattern, store)
        if info.type != pafs.FileType.File:
            _check_bucket(fs, where, pattern, store)
            return ()
        return (Listed(pattern, int(info.size or 0), int(info.mtime_ns or 0)),)
    prefix = literal.rpartition("/")[0]
    rest = key[len(prefix) :].lstrip("/")
    selector = pafs.FileSelector(
        f"{where.bucket}/{prefix}".rstrip("/"),
        recursive="/" in rest or "**" in rest,
        allow_not_found=True,
    )
    infos = _call(lambda: fs.get_file_info(selector), pattern, store)
    if not infos:
        _check_bucket(fs, where, pattern, store)
    match = _glob_regex(key).fullmatch
    listed = []
    for info in infos:
        found = info.path.partition("/")[2]
        if info.type == pafs.FileType.File and match(found):
            listed.append(
                Listed(f"{where.root}/{found}", int(info.size or 0), int(info.mtime_ns or 0))
            )
    return tuple(sorted(listed, key=lambda item: item.path))


def _check_bucket(fs: pafs.FileSystem, where: Place, path: str, store: Store) -> None:
    """A `StoreError` if ``where``'s bucket does not exist (listing a missing one finds
    nothing)."""
    info = _call(lambda: fs.get_file_info(where.bucket), path, store)
    if info.type == pafs.FileType.NotFound:
        raise _missing_bucket(path, store)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex of a glob over ``/``-separated keys: ``**/`` any folders (or none), ``*`` and
    ``?`` within one, ``[...]`` a class (``[!...]`` negated)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def cache_name(path: str) -> str:
    """A file name for a local cache of something derived from ``path``."""
    return Path(name_of(path)).name[:80]


def _failure(exc: BaseException, path: str, store: Store) -> BaseException:
    """What a failed read of ``path`` raises (as `_call` would)."""
    if isinstance(exc, FileNotFoundError | StoreError):
        return exc
    return store_error(exc, path, store)


def _call(fn, path: str, store: Store):  # type: ignore[no-untyped-def]
    """``fn()``, with an object store's failures turned into a `StoreError` of one sentence."""
    try:
        return fn()
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        if not is_remote(path):
            raise
        raise store_error(exc, path, store) from exc


def store_error(exc: BaseException, path: str, store: Store) -> StoreError:
    """What an object store's failure means, in one sentence naming ``path``."""
    kind = store_of_url(path)
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    detail = kind.detail(first)[:200]
    try:
        where = kind.endpoint(kind.place(path), store)
    except StoreError as unplaced:
        return unplaced
    meaning = kind.meaning(text)
    if meaning is Meaning.MISSING_BUCKET:
        return _missing_bucket(path, store)
    no_credentials = kind.signs(store) and not kind.credentials_found()
    if meaning in (Meaning.DENIED, Meaning.TRANSIENT) and no_credentials:
        # A request without credentials failed: their absence is the likely cause, and trying
        # again would only delay saying so.
        return StoreError(
            f"{where} did not serve '{path}' ({detail}) and no {kind.NAME} credentials were "
            f"found; set {kind.SET_CREDENTIALS}, or `anonymous: true` on the source for a "
            f"public {kind.NOUN}",
            transient=False,
        )
    if meaning is Meaning.DENIED:
        return StoreError(
            f"{where} refused access to '{path}' ({detail}); check the credentials "
            f"{kind.CREDENTIALS} and that they may read the {kind.NOUN}",
            transient=False,
        )
    return StoreError(
        f"{where} did not serve '{path}' ({detail})", transient=meaning is Meaning.TRANSIENT
    )


def _missing_bucket(path: str, store: Store) -> StoreError:
    kind = store_of_url(path)
    where = kind.place(path)
    return StoreError(
        f"the {kind.NOUN} '{where.bucket}' does not exist at {kind.endpoint(where, store)}; "
        f"check the {kind.NOUN} name in the path{kind.ENDPOINT_HINT}",
        transient=False,
    )
