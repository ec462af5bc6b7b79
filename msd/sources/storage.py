"""Where a source's files live: the local filesystem, or an object store (``s3://``) through
pyarrow's filesystems.

pyarrow's S3 filesystem rather than fsspec/s3fs: pyarrow is already how msd reads Parquet and
Arrow, its S3 client is C++ (reads run without the GIL, no event loop in every loader), and a
`pyarrow.NativeFile` it opens reads byte ranges (``read_at``), so a row group, a tar member or a
line range is one ranged GET — no file is ever downloaded whole. Credentials and region come
from the standard AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
``~/.aws/config``, instance roles); a source's ``endpoint_url`` (else ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``) names an S3-compatible store.

pyarrow's own retries are turned off: a loader retries a failed read itself (``loader.
read_retry_s``), between its other work, and counts every retry (``msd.roles.loader``).

Every function takes a path that is either local or a URL; `is_remote` tells which.
"""

from __future__ import annotations

import dataclasses
import functools
import glob as globmod
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from msd.sources.cache import CacheConfig, CacheError, open_cached

SCHEMES = ("s3://",)
# One attempt per request: msd's loaders retry, counted (see the module docstring).
# A request whose transfer stalls this long fails (curl's low-speed time, not a total: a large
# read that keeps moving is never cut); under ``loader.heartbeat_s``, so a loader waiting on a
# store that stopped answering is not taken for dead.
CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 2.0
DEFAULT_REGION = "us-east-1"
_WILDCARD = re.compile(r"[*?\[]")
# Opening a source (listing, footers, indexes) tries a store's transient failure again for up
# to this long, blocking: it happens before a role serves anyone.
OPEN_RETRY_S = 30.0

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Store:
    """How to reach an object store: an S3-compatible endpoint (None: AWS's, or the AWS
    environment's ``AWS_ENDPOINT_URL``), and whether to sign requests (``anonymous``: a public
    bucket); ``cache``: keep what is read on local disk (`msd.sources.cache`)."""

    endpoint_url: str | None = None
    anonymous: bool = False
    cache: CacheConfig | None = None


LOCAL = Store()


@dataclass(frozen=True)
class Listed:
    """A file as it was found: its path (absolute, or a URL), size and modification time."""

    path: str
    size: int
    mtime_ns: int


class StoreError(OSError):
    """An object store refused or did not answer; ``transient``: retrying may help."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


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


def filesystem(path: str, store: Store) -> tuple[pafs.FileSystem, str]:
    """The filesystem ``path`` lives on, and the path to give it (``bucket/key`` for S3)."""
    if not is_remote(path):
        return pafs.LocalFileSystem(), path
    return _s3(store), path[len("s3://") :]


@functools.lru_cache(maxsize=16)
def _s3(store: Store) -> pafs.S3FileSystem:
    endpoint = _endpoint(store)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    scheme = None
    if endpoint is not None:
        scheme = "http" if endpoint.startswith("http://") else "https"
        region = region or DEFAULT_REGION
    return pafs.S3FileSystem(
        anonymous=store.anonymous,
        region=region,
        endpoint_override=endpoint,
        scheme=scheme or "https",
        connect_timeout=CONNECT_TIMEOUT_S,
        request_timeout=REQUEST_TIMEOUT_S,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )


def endpoint_of(store: Store) -> str:
    """The store's endpoint, in words, for messages."""
    return _endpoint(store) or "AWS S3"


def _endpoint(store: Store) -> str | None:
    """The store's ``endpoint_url``, else the AWS environment's; None: AWS's own."""
    env = os.environ
    return store.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")


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
    plain = dataclasses.replace(store, cache=None)
    try:
        return open_cached(
            store.cache,
            stat(path, plain),
            endpoint_of(plain),
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
    """A local folder; for S3, a prefix holding objects (``s3://bucket/prefix``)."""
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
    bucket, _, key = inner.partition("/")
    literal = _WILDCARD.split(key, maxsplit=1)[0]
    if literal == key:  # no wildcard: one object (a folder is not matched, like glob)
        info = _call(lambda: fs.get_file_info(inner), pattern, store)
        if info.type != pafs.FileType.File:
            _check_bucket(fs, bucket, pattern, store)
            return ()
        return (Listed(pattern, int(info.size or 0), int(info.mtime_ns or 0)),)
    prefix = literal.rpartition("/")[0]
    rest = key[len(prefix) :].lstrip("/")
    selector = pafs.FileSelector(
        f"{bucket}/{prefix}".rstrip("/"),
        recursive="/" in rest or "**" in rest,
        allow_not_found=True,
    )
    infos = _call(lambda: fs.get_file_info(selector), pattern, store)
    if not infos:
        _check_bucket(fs, bucket, pattern, store)
    match = _glob_regex(key).fullmatch
    listed = [
        Listed(f"s3://{info.path}", int(info.size or 0), int(info.mtime_ns or 0))
        for info in infos
        if info.type == pafs.FileType.File and match(info.path.partition("/")[2])
    ]
    return tuple(sorted(listed, key=lambda item: item.path))


def _check_bucket(fs: pafs.FileSystem, bucket: str, path: str, store: Store) -> None:
    """A `StoreError` if ``bucket`` does not exist (listing a missing one finds nothing)."""
    if _call(lambda: fs.get_file_info(bucket), path, store).type == pafs.FileType.NotFound:
        raise StoreError(
            f"the bucket '{bucket}' does not exist at {endpoint_of(store)}; check the bucket "
            "name in the path, and endpoint_url for an S3-compatible store",
            transient=False,
        )


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


# An object store's answers (pyarrow's AWS error names, HTTP statuses), by what they mean.
_MISSING_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket")
_DENIED = (
    "ACCESS_DENIED",
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "HTTP status 403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "ExpiredToken",
    "MISSING_AUTHENTICATION_TOKEN",
)
_TRANSIENT = (
    "NETWORK_CONNECTION",
    "SLOW_DOWN",
    "THROTTL",
    "SERVICE_UNAVAILABLE",
    "INTERNAL_FAILURE",
    "REQUEST_TIMEOUT",
    "REQUEST_TIME_TOO_SKEWED",
    "HTTP status 5",
    "HTTP status 429",
    "curlCode",
    "imed out",
    "Connection reset",
    "Broken pipe",
    "Couldn't connect",
    "Could not connect",
)


def store_error(exc: BaseException, path: str, store: Store) -> StoreError:
    """What an object store's failure means, in one sentence naming ``path``."""
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    detail = first.split(": ", 1)[-1][:200] if "AWS Error" in first else first[:200]
    bucket = path[len("s3://") :].partition("/")[0]
    where = endpoint_of(store)
    if any(t in text for t in _MISSING_BUCKET):
        return StoreError(
            f"the bucket '{bucket}' does not exist at {where}; check the bucket name in the "
            "path, and endpoint_url for an S3-compatible store",
            transient=False,
        )
    if any(t in text for t in _DENIED):
        return StoreError(
            f"{where} refused access to '{path}' ({detail}); check the credentials "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and that they may read the "
            "bucket",
            transient=False,
        )
    transient = any(t in text for t in _TRANSIENT)
    if transient and not store.anonymous and not credentials_found():
        # An unsigned request failed: the missing credentials are the likely cause, and
        # trying again would only delay saying so.
        return StoreError(
            f"{where} did not serve '{path}' ({detail}) and no AWS credentials were found; set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or `anonymous: "
            "true` on the source for a public bucket",
            transient=False,
        )
    return StoreError(f"{where} did not serve '{path}' ({detail})", transient=transient)


def credentials_found() -> bool:
    """Whether the standard AWS chain has somewhere to take credentials from, short of an
    instance role (which only asking can tell)."""
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return True
    if any(
        env.get(name)
        for name in (
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        )
    ):
        return True
    files = (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
        env.get("AWS_CONFIG_FILE") or "~/.aws/config",
    )
    if any(os.path.isfile(os.path.expanduser(f)) for f in files):
        return True
    return env.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true" and _on_cloud_instance()


def _on_cloud_instance() -> bool:
    """An instance role may answer (the machine looks like a cloud VM)."""
    try:
        vendor = Path("/sys/class/dmi/id/sys_vendor").read_text().strip().lower()
    except OSError:
        return False
    return any(v in vendor for v in ("amazon", "google", "microsoft"))
