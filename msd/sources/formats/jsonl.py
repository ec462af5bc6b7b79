"""JSON Lines files (``.jsonl``, ``.ndjson``, ``.json``; plain, ``.gz`` or ``.zst``; local or
remote): one scan finds each usable line's bytes; reads then take one row group's byte range.

A line is a JSON object; the source's column is a key path into it (``text``, ``meta.content``:
dots nest). `load_index` streams the (decompressed) file once, in bounded memory, and records
where each kept line starts and ends. A line that is not JSON, not an object, or whose value
has the wrong type (text: a string; tokens: a list of integers; missing or null is a null cell)
is left out, the same on every run, and listed in ``problems``; blank lines are skipped. Runs
of kept lines up to `GROUP_BYTES` form the row groups. The scan is cached as a ``.npz`` of
offsets (loaded without pickle, checked before use, rebuilt when damaged or stale) under
``cache_dir("jsonl")``, keyed by the file's `file_key` and the column.

A `JsonlReader` reads a plain file's group with one ``pread`` (a remote file's with one
``read_at``: one ranged GET); a compressed file is decompressed forward from where the last read
stopped (from the start again only for an earlier group), and the last group's bytes and cells
are kept, since a loader reads one group several times in a row.

A remote file (``msd.sources.storage``) is scanned and decompressed front to back through
`storage.open_input` in reads of `REMOTE_CHUNK` bytes: pyarrow's S3 files send one ranged GET per
``read``, however small, so the small reads gzip and zstd make are served from that buffer. Its
size and modification time are the store's (a HEAD); a reader checks a remote file's size, which
its open handle knows, before each read, and its modification time when it loads an index. An
object store's failure while reading is raised as the `storage.StoreError` it is
(``transient``: the loader retries); while indexing (`load_index`) it is a `SourceError`.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import logging
import os
import zipfile
import zlib
from array import array
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Protocol, cast

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from msd.errors import SourceError
from msd.jobdir import atomic_write
from msd.recipe.schema import Source
from msd.sources import storage
from msd.sources.formats.base import (
    ColumnKind,
    FileIndex,
    cache_dir,
    file_key,
    glob_files,
    reason,
    store_of,
)
from msd.sources.storage import LOCAL, Store

log = logging.getLogger(__name__)

GROUP_BYTES = 1 << 20  # a row group: consecutive kept lines spanning about this many bytes
MAX_PROBLEMS = 20  # lines left out that are described one by one; then one summary line
CACHE_VERSION = 1
SUFFIXES = (".jsonl", ".ndjson", ".json")
CODECS = {".gz": "gzip", ".zst": "zstd"}
REMOTE_CHUNK = 8 << 20  # bytes one read of a remote file's stream asks for (one GET on S3)

_CHUNK = 1 << 20  # decompressed bytes a scan takes at a time
_ZSTD_CHUNK = 1 << 16  # compressed bytes fed to zstd at a time (bounds each step's output)
_BOM = b"\xef\xbb\xbf"
_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}
_LARGE = (1 << 31) - 1  # a group spanning more bytes needs 64-bit Arrow offsets

Offsets = npt.NDArray[np.int64]
_Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]


@dataclass(frozen=True, eq=False)  # arrays do not compare to one bool
class LineIndex:
    """The kept lines of one file for one column, and the row groups they form.

    Line ``i`` is bytes ``starts[i]:ends[i]`` of the decompressed stream (no newline); row group
    ``g`` is lines ``groups[g]:groups[g + 1]``. ``size_bytes`` and ``mtime_ns`` are the file's
    when it was scanned, ``stream_bytes`` the length of its decompressed stream.
    """

    path: str
    column: str
    kind: ColumnKind
    size_bytes: int
    mtime_ns: int
    stream_bytes: int
    starts: Offsets
    ends: Offsets
    groups: Offsets
    holds_text: bool
    problems: tuple[str, ...] = ()

    @property
    def num_groups(self) -> int:
        return len(self.groups) - 1

    @property
    def group_rows(self) -> tuple[int, ...]:
        return tuple(np.diff(self.groups).tolist())

    def lines(self, group: int) -> tuple[Offsets, Offsets]:
        """The starts and ends of the lines of row group ``group``."""
        first, stop = int(self.groups[group]), int(self.groups[group + 1])
        return self.starts[first:stop], self.ends[first:stop]

    def span(self, group: int) -> tuple[int, int]:
        """The byte range of the stream that holds row group ``group``."""
        starts, ends = self.lines(group)
        return int(starts[0]), int(ends[-1])

    def file_index(self) -> FileIndex:
        return FileIndex(self.group_rows, self.holds_text, self.problems)


class JsonlFormat:
    """The ``jsonl`` source format (see the module docstring)."""

    name = "jsonl"

    def files(self, source: Source, key: str) -> tuple[str, ...]:
        """The JSON Lines files ``source.path`` matches, sorted; other files are skipped."""
        matched = glob_files(source, key)
        files = tuple(path for path in matched if is_jsonl(path))
        if not files:
            raise SourceError(
                f"source '{source.name}' ({key}.path): none of the {len(matched)} file(s) "
                f"matching '{source.path}' is named *.jsonl, *.ndjson or *.json (optionally "
                "followed by .gz or .zst); rename them or point the path at JSON Lines files"
            )
        if len(files) < len(matched):
            log.info(
                "source '%s': skipped %d file(s) matching '%s' that are not JSON Lines",
                source.name,
                len(matched) - len(files),
                source.path,
            )
        return files

    def index(
        self, source: Source, key: str, path: str, column: str, kind: ColumnKind
    ) -> FileIndex:
        """Scan ``path`` once (then read the cached scan); a file none of whose lines can be
        used is refused, since that is a wrong column or not JSON Lines at all."""
        field_key = f"{key}.{'token_column' if kind == 'tokens' else 'text_column'}"
        if not _valid_key_path(column):
            raise SourceError(
                f"source '{source.name}' ({field_key}): '{column}' is not a key path; "
                "name a key, with dots between nested keys (e.g. meta.content)"
            )
        where = f"source '{source.name}' ({key}.path): "
        index = load_index(path, column, kind, where=where, store=store_of(source))
        if index.num_groups == 0 and index.problems:
            where = f"source '{source.name}' ({field_key})"
            what = {"text": "a string", "tokens": "a list of integers", "chat": "a value"}[kind]
            other = "token_column for token lists" if kind != "tokens" else "text_column for text"
            raise SourceError(
                f"{where}: no line of '{path}' holds {what} at '{column}' ({index.problems[0]}); "
                f"check the key path, use {other}, or fix or remove the file"
            )
        return regrouped(index, source.group_rows).file_index()

    def open(
        self,
        path: str,
        kind: ColumnKind | None = None,
        store: Store = LOCAL,
        group_rows: int | None = None,
    ) -> JsonlReader:
        """A reader of ``path`` (on ``store`` where it is a URL); ``kind`` is the column's
        (None: whichever index is cached); ``group_rows``: the source's (`regrouped`)."""
        return JsonlReader(path, kind, store, group_rows)


FORMAT = JsonlFormat()


def regrouped(index: LineIndex, group_rows: int | None) -> LineIndex:
    """``index`` with row groups of ``group_rows`` kept lines each (the last holds the rest),
    e.g. the row-group size of Parquet files holding the same rows; None: as scanned."""
    if group_rows is None:
        return index
    n = len(index.starts)
    groups = np.append(np.arange(0, n, group_rows, dtype=np.int64), np.int64(n))
    return dataclasses.replace(index, groups=groups if n else np.zeros(1, dtype=np.int64))


def is_jsonl(path: str) -> bool:
    """Whether ``path`` is named like a JSON Lines file, compressed or not."""
    name = path.lower()
    for suffix in CODECS:
        name = name.removesuffix(suffix)
    return name.endswith(SUFFIXES)


def load_index(
    path: str, column: str, kind: ColumnKind, where: str = "", store: Store = LOCAL
) -> LineIndex:
    """The index of ``column`` in ``path``: cached while the file is unchanged, else scanned.

    A missing, stale or damaged cache file is rebuilt (written to a temporary file, then
    renamed); one that cannot be written only costs a scan next time. ``where`` starts the
    message of a `SourceError` (e.g. ``source 'web' (sources[0].path): ``); an object store's
    failure (``store``: how a URL ``path`` is reached) is one too.
    """
    try:
        return _load_index(path, column, kind, where, store)
    except storage.StoreError as exc:
        message = str(exc)
        if path not in message:
            message = f"cannot read '{path}': {message}"
        raise SourceError(f"{where}{message}") from exc


def cached_index(
    path: str, column: str, kind: ColumnKind, store: Store = LOCAL
) -> LineIndex | None:
    """The cached, current index of ``column`` in ``path``, or None (nothing is scanned); an
    object store's failure to tell whether it is current raises its `storage.StoreError`."""
    path = _absolute(path)
    try:
        cache = _cache_path(path, column, kind, store)
    except storage.StoreError:
        raise
    except OSError:
        return None
    return _load_cache(cache, path, column, kind, store)


def _load_index(path: str, column: str, kind: ColumnKind, where: str, store: Store) -> LineIndex:
    """`load_index`, an object store's failure raised as its `storage.StoreError`."""
    if not _valid_key_path(column):
        raise SourceError(f"{where}'{column}' is not a key path of '{path}'")
    path = _absolute(path)
    try:
        cache = _cache_path(path, column, kind, store)
    except storage.StoreError:
        raise
    except OSError as exc:
        raise SourceError(f"{where}cannot open '{path}' ({reason(exc)}); check the path") from exc
    index = _load_cache(cache, path, column, kind, store)
    if index is None:
        index, unchanged = _scan_file(path, column, kind, where, store)
        if unchanged:  # else a cache of it would be wrong
            _write_cache(cache, index)
    return index


def _absolute(path: str) -> str:
    """A local path made absolute; a URL as it is."""
    return path if storage.is_remote(path) else os.path.abspath(path)


class JsonlReader:
    """Reads one column of one row group of a JSON Lines file at a time (one file open; a
    remote file is opened on the first read).

    Each column's index is loaded (from the cache, or scanned) on its first read.
    """

    def __init__(
        self,
        path: str,
        kind: ColumnKind | None = None,
        store: Store = LOCAL,
        group_rows: int | None = None,
    ) -> None:
        self.path = _absolute(path)
        self.kind = kind
        self.store = store
        self.group_rows = group_rows
        self.codec = _codec(self.path)
        self.remote = storage.is_remote(self.path)
        self._file: _LocalFile | _RemoteFile = (
            _RemoteFile(self.path, store) if self.remote else _LocalFile(self.path)
        )
        self._indexes: dict[str, LineIndex] = {}
        self._stream: _Stream | None = None
        self._pos = 0  # where the stream is, in decompressed bytes
        self._last_span: tuple[int, int] | None = None
        self._last_bytes = b""
        self._last_cells: tuple[int, str, pa.Array] | None = None

    def read(self, group: int, column: str) -> pa.Array:
        """The cells of ``column`` in row group ``group``, in line order (nulls where null).

        An object store's failure raises its `storage.StoreError` (``transient``: the same read
        may succeed later); every other problem is a `SourceError`."""
        cells = self._last_cells
        if cells is not None and cells[0] == group and cells[1] == column:
            return cells[2]
        index = self._index(column)
        if not 0 <= group < index.num_groups:
            raise SourceError(
                f"the JSON Lines file '{self.path}' has no row group {group} (it has "
                f"{index.num_groups}); it changed after it was indexed, so index it again"
            )
        span = index.span(group)
        data = self._bytes(index, span)
        starts, ends = index.lines(group)
        result = _cells(data, span[0], starts, ends, index, span[1] - span[0] > _LARGE)
        self._last_cells = (group, column, result)
        return result

    def close(self) -> None:
        """Close the file and drop what is kept; a later read raises."""
        self._close_stream()
        self._file.close()
        self._last_span, self._last_bytes, self._last_cells = None, b"", None

    def _index(self, column: str) -> LineIndex:
        index = self._indexes.get(column)
        if index is not None:
            return index
        if self.kind is not None:
            index = _load_index(self.path, column, self.kind, "", self.store)
        else:
            index = cached_index(self.path, column, "text", self.store) or cached_index(
                self.path, column, "tokens", self.store
            )
            if index is None:
                raise SourceError(
                    f"the JSON Lines file '{self.path}' has no cached index of '{column}'; "
                    "index the source first, or open the file with the column's kind"
                )
        index = regrouped(index, self.group_rows)
        self._indexes[column] = index
        return index

    def _bytes(self, index: LineIndex, span: tuple[int, int]) -> bytes:
        if span == self._last_span:
            return self._last_bytes
        self._check_unchanged(index)
        start, stop = span
        try:
            if self.codec is None:
                data = self._file.read_range(start, stop - start)
            else:
                data = self._decompress(start, stop - start)
        except storage.StoreError:
            raise
        except _BadStream as exc:
            raise SourceError(
                f"cannot read the JSON Lines file '{self.path}' ({reason(exc)}); check that it "
                "was not changed or removed after the source was indexed"
            ) from exc
        except (OSError, pa.ArrowException) as exc:
            if self.remote:
                raise storage.store_error(exc, self.path, self.store) from exc
            if not isinstance(exc, OSError):
                raise
            raise SourceError(
                f"cannot read the JSON Lines file '{self.path}' ({reason(exc)}); check that it "
                "was not changed or removed after the source was indexed"
            ) from exc
        if len(data) != stop - start:
            raise SourceError(
                f"the JSON Lines file '{self.path}' ends before byte {stop:,}, which its index "
                "names; it changed after it was indexed, so index it again"
            )
        self._last_span, self._last_bytes = span, data
        return data

    def _decompress(self, start: int, size: int) -> bytes:
        """``size`` decompressed bytes from ``start``, going forward from the last read (a
        failure drops the stream: the next read starts it again)."""
        try:
            if self._stream is None or start < self._pos:
                self._close_stream()
                self._stream = _open_stream(self._file.start(), self.codec, self.path)
            while self._pos < start:
                skipped = len(self._stream.read(min(_CHUNK, start - self._pos)))
                if not skipped:
                    return b""
                self._pos += skipped
            data = _read_exactly(self._stream, size)
        except BaseException:
            self._close_stream()
            raise
        self._pos += len(data)
        return data

    def _close_stream(self) -> None:
        stream, self._stream, self._pos = self._stream, None, 0
        if stream is not None:
            stream.close()

    def _check_unchanged(self, index: LineIndex) -> None:
        try:
            size, mtime_ns = self._file.now()
        except storage.StoreError:
            raise
        except (OSError, ValueError) as exc:  # ValueError: the file was closed
            raise SourceError(f"cannot read the JSON Lines file '{self.path}' ({exc})") from exc
        if size != index.size_bytes or mtime_ns not in (None, index.mtime_ns):
            raise SourceError(
                f"the JSON Lines file '{self.path}' changed after it was indexed (now "
                f"{size:,} bytes, then {index.size_bytes:,}); index the source again"
            )


class _LocalFile:
    """A local file a reader holds open: ``pread`` for a range, ``seek(0)`` to stream it."""

    def __init__(self, path: str) -> None:
        try:
            self._raw: BinaryIO = open(path, "rb")  # noqa: SIM115 (closed by close())
        except OSError as exc:
            raise SourceError(
                f"cannot open the JSON Lines file '{path}' ({reason(exc)}); check that it "
                "was not moved or removed after the source was indexed"
            ) from exc

    def read_range(self, offset: int, size: int) -> bytes:
        return _pread(self._raw, offset, size)

    def start(self) -> _Readable:
        """The file from its first byte."""
        self._raw.seek(0)
        return self._raw

    def now(self) -> tuple[int, int | None]:
        """The file's size and modification time."""
        stat = os.fstat(self._raw.fileno())
        return stat.st_size, stat.st_mtime_ns

    def close(self) -> None:
        self._raw.close()


class _RemoteFile:
    """A remote file a reader holds open (opened on first use: one HEAD on S3): ``read_at``
    for a range (one ranged GET), ``seek(0)`` and reads of `REMOTE_CHUNK` to stream it."""

    def __init__(self, path: str, store: Store) -> None:
        self.path, self.store = path, store
        self._handle: Any = None  # a pyarrow.NativeFile
        self._closed = False

    def read_range(self, offset: int, size: int) -> bytes:
        handle, pieces = self._open(), []
        while size > 0:
            piece = handle.read_at(size, offset)
            if not piece:
                break
            pieces.append(piece)
            offset, size = offset + len(piece), size - len(piece)
        return b"".join(pieces)

    def start(self) -> _Readable:
        handle = self._open()
        handle.seek(0)
        return _Buffered(handle)

    def now(self) -> tuple[int, int | None]:
        """The file's size as it was opened (the handle knows it; no request is made), and
        None: the modification time would take a request (the index load checked it)."""
        return int(self._open().size()), None

    def close(self) -> None:
        handle, self._handle, self._closed = self._handle, None, True
        if handle is not None:
            handle.close()

    def _open(self) -> Any:
        if self._closed:
            raise ValueError("I/O operation on closed file")
        if self._handle is None:
            try:
                self._handle = storage.open_input(self.path, self.store)
            except FileNotFoundError as exc:
                raise SourceError(
                    f"cannot open the JSON Lines file '{self.path}' ({reason(exc)}); check that "
                    "it was not moved or removed after the source was indexed"
                ) from exc
        return self._handle


class _Buffered:
    """A remote file read front to back in reads of `REMOTE_CHUNK` bytes, whatever sizes its
    caller (gzip, zstd, a scan) asks for: pyarrow sends one ranged GET per ``read``."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw  # a pyarrow.NativeFile, at the position to read from
        self._buf = b""
        self._pos = 0  # the next byte of _buf to give

    def read(self, size: int = -1, /) -> bytes:
        have = len(self._buf) - self._pos
        if 0 <= size <= have:
            data = self._buf[self._pos : self._pos + size]
            self._pos += size
            return data
        pieces = [self._buf[self._pos :]] if have else []
        self._buf, self._pos = b"", 0
        need = size - have
        if size < 0:
            pieces.append(self._raw.read())
        elif need >= REMOTE_CHUNK:
            pieces.append(self._raw.read(need))
        else:
            chunk = self._raw.read(REMOTE_CHUNK)
            pieces.append(chunk[:need])
            self._buf, self._pos = chunk, min(need, len(chunk))
        return b"".join(pieces)

    def peek(self, size: int) -> bytes:
        """The next ``size`` bytes (fewer where the file ends first), left to be read."""
        if len(self._buf) - self._pos < size:
            self._buf, self._pos = self._buf[self._pos :] + self._raw.read(REMOTE_CHUNK), 0
        return self._buf[self._pos : self._pos + size]


# Scanning ----------------------------------------------------------------------------------------


class _BadStream(Exception):
    """A compressed stream that is damaged or cut short."""


class _Stream(Protocol):
    def read(self, size: int) -> bytes: ...

    def close(self) -> None: ...


class _Readable(Protocol):
    """A file read front to back: a local file, or a remote one through `_Buffered`."""

    def read(self, size: int, /) -> bytes: ...


class _Lines:
    """What a scan has found so far: kept lines, group boundaries, problems."""

    def __init__(self, column: str, kind: ColumnKind) -> None:
        self.column, self.kind = column, kind
        self.decoder, self.depth = _decoder(column, kind)
        self.starts, self.ends, self.groups = array("q"), array("q"), array("q", [0])
        self.holds_text = False
        self.problems: list[str] = []
        self.left_out = 0
        self.number = 0  # the line being looked at, from 1

    def add(self, line: bytes, start: int) -> None:
        self.number += 1
        if start == 0 and line.startswith(_BOM):
            line, start = line[len(_BOM) :], len(_BOM)
        if not line or line.isspace():
            return
        try:
            value = _value(self.decoder.decode(line), self.depth)
        except msgspec.ValidationError as exc:
            self._leave_out(self._wrong_type(str(exc)))
            return
        except msgspec.DecodeError as exc:
            self._leave_out(f"not valid JSON ({_lower(reason(exc))})")
            return
        end = start + len(line)
        group_start = self.groups[-1]
        if len(self.starts) > group_start and end - self.starts[group_start] > GROUP_BYTES:
            self.groups.append(len(self.starts))
        self.starts.append(start)
        self.ends.append(end)
        self.holds_text = self.holds_text or bool(value)

    def problem_list(self) -> tuple[str, ...]:
        if self.left_out <= MAX_PROBLEMS:
            return tuple(self.problems)
        summary = f"{self.left_out:,} lines left out in all; the first {MAX_PROBLEMS} are listed"
        return (*self.problems, summary)

    def _wrong_type(self, message: str) -> str:
        if message.startswith("Expected `object`, got") and " - at " not in message:
            return f"not a JSON object ({_lower(message)})"
        what = {"text": "a string", "tokens": "a list of integers", "chat": "JSON"}[self.kind]
        return f"'{self.column}' is not {what} ({_lower(message)})"

    def _leave_out(self, problem: str) -> None:
        self.left_out += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"line {self.number}: {problem}")


def _scan_file(
    path: str, column: str, kind: ColumnKind, where: str, store: Store
) -> tuple[LineIndex, bool]:
    """The index of ``path``, scanned, and whether the file stayed the same meanwhile."""
    codec = _codec(path)
    remote = storage.is_remote(path)
    try:
        if remote:
            before = _size_and_mtime(storage.stat(path, store))
            # open_input, not open_stream: the two make the same requests on S3 (a HEAD, then
            # one ranged GET per read), and pyarrow's input streams decompress a .gz or .zst
            # object themselves unless told not to.
            file: Any = storage.open_input(path, store)
        else:
            file = open(path, "rb")  # noqa: SIM115 (closed by the with below)
            before = _fstat(file)
        with file:
            raw: _Readable = _Buffered(file) if remote else file
            if codec is None:
                _refuse_compressed(raw, path, where)
            stream = _open_stream(raw, codec, path, where)
            try:
                lines, stream_bytes = _scan(stream, column, kind)
            finally:
                stream.close()
            after = _size_and_mtime(storage.stat(path, store)) if remote else _fstat(file)
    except storage.StoreError:
        raise
    except FileNotFoundError as exc:
        raise SourceError(
            f"{where}cannot read '{path}' ({reason(exc)}); check that it exists and is readable"
        ) from exc
    except (OSError, pa.ArrowException) as exc:
        if remote:
            raise storage.store_error(exc, path, store) from exc
        if not isinstance(exc, OSError):
            raise
        raise SourceError(
            f"{where}cannot read '{path}' ({reason(exc)}); check that it exists and is readable"
        ) from exc
    except _BadStream as exc:
        raise SourceError(
            f"{where}'{path}' is not a readable {codec} stream ({exc}); recompress or remove it, "
            "or narrow the glob"
        ) from exc
    unchanged = after == before
    if not unchanged:
        log.warning("'%s' changed while it was indexed; its index will not match it", path)
    groups = lines.groups
    if len(lines.starts) > groups[-1]:
        groups.append(len(lines.starts))
    index = LineIndex(
        path=path,
        column=column,
        kind=kind,
        size_bytes=before[0],
        mtime_ns=before[1],
        stream_bytes=stream_bytes,
        starts=np.array(lines.starts, dtype=np.int64),
        ends=np.array(lines.ends, dtype=np.int64),
        groups=np.array(groups, dtype=np.int64),
        holds_text=lines.holds_text,
        problems=lines.problem_list(),
    )
    log.debug(
        "indexed '%s': %d lines kept in %d row groups, %d left out",
        path,
        len(index.starts),
        index.num_groups,
        lines.left_out,
    )
    return index, unchanged


def _fstat(file: BinaryIO) -> tuple[int, int]:
    stat = os.fstat(file.fileno())
    return stat.st_size, stat.st_mtime_ns


def _size_and_mtime(found: storage.Listed) -> tuple[int, int]:
    return found.size, found.mtime_ns


def _scan(stream: _Stream, column: str, kind: ColumnKind) -> tuple[_Lines, int]:
    """Every line of ``stream``, looked at once; memory holds a chunk and the longest line."""
    lines = _Lines(column, kind)
    pending: list[bytes] = []  # the start of a line that no chunk has ended yet
    offset = 0  # where the first pending byte lies in the stream
    while chunk := stream.read(_CHUNK):
        if b"\n" not in chunk:
            pending.append(chunk)
            continue
        data = b"".join((*pending, chunk)) if pending else chunk
        parts = data.split(b"\n")
        tail = parts.pop()
        for line in parts:
            lines.add(line, offset)
            offset += len(line) + 1
        pending = [tail] if tail else []
    last = b"".join(pending)
    if last:
        lines.add(last, offset)
    return lines, offset + len(last)


@lru_cache(maxsize=64)
def _decoder(column: str, kind: ColumnKind) -> tuple[msgspec.json.Decoder[Any], int]:
    """A decoder of a line that keeps only the value at ``column`` (other keys are checked as
    JSON but not built), and how many levels it nests."""
    keys = column.split(".")
    leaf: Any = {"text": str, "tokens": list[_Int64], "chat": msgspec.Raw}[kind]
    typ: Any = leaf if kind == "chat" else leaf | None  # a Raw holds a null as it is
    for depth, key in enumerate(reversed(keys)):
        level = msgspec.defstruct(f"_Level{depth}", [("v", typ, None)], rename={"v": key})
        typ = level | None if depth < len(keys) - 1 else level
    return msgspec.json.Decoder(typ), len(keys)


def _value(obj: Any, depth: int) -> Any:
    for _ in range(depth):
        if obj is None:
            return None
        obj = obj.v
    return obj


def _valid_key_path(column: str) -> bool:
    return bool(column) and all(column.split("."))


def _lower(text: str) -> str:
    if text[1:2].isupper():  # an acronym: JSON
        return text
    return text[:1].lower() + text[1:]


# Streams -----------------------------------------------------------------------------------------


def _codec(path: str) -> str | None:
    return next((c for s, c in CODECS.items() if path.lower().endswith(s)), None)


def _open_stream(raw: _Readable, codec: str | None, path: str, where: str = "") -> _Stream:
    if codec == "gzip":
        return _GzipStream(raw)
    if codec == "zstd":
        return _ZstdStream(raw, path, where)
    return _PlainStream(raw)


class _PlainStream:
    def __init__(self, raw: _Readable) -> None:
        self._raw = raw

    def read(self, size: int) -> bytes:
        return self._raw.read(size)

    def close(self) -> None:
        pass  # the raw file belongs to the caller


class _GzipStream:
    def __init__(self, raw: _Readable) -> None:
        # gzip seeks its file only to rewind, which no stream here does.
        self._file = gzip.GzipFile(fileobj=cast(BinaryIO, raw), mode="rb")

    def read(self, size: int) -> bytes:
        try:
            return self._file.read(size)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise _BadStream(_lower(reason(exc))) from exc

    def close(self) -> None:
        self._file.close()  # leaves the raw file open


class _ZstdStream:
    """Zstandard frames one after another, fed in small pieces so that each step's output stays
    small; a stream that stops inside a frame is refused (the zstandard readers return what they
    have without a word)."""

    def __init__(self, raw: _Readable, path: str, where: str = "") -> None:
        zstandard = _zstandard(path, where)
        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = self._dctx.decompressobj()
        self._error: type[Exception] = zstandard.ZstdError
        self._in_frame = False
        self._done = False
        self._buf = b""
        self._pos = 0

    def read(self, size: int) -> bytes:
        while len(self._buf) - self._pos < size and not self._done:
            self._fill()
        data = self._buf[self._pos : self._pos + size]
        self._pos += len(data)
        return data

    def close(self) -> None:
        self._buf, self._pos = b"", 0

    def _fill(self) -> None:
        data = self._raw.read(_ZSTD_CHUNK)
        if not data:
            self._done = True
            if self._in_frame:
                raise _BadStream("the stream is cut short inside a frame")
            return
        out = []
        try:
            while data:
                out.append(self._frame.decompress(data))
                self._in_frame = True
                data = b""
                if self._frame.eof:
                    data = self._frame.unused_data
                    self._frame = self._dctx.decompressobj()
                    self._in_frame = False
        except self._error as exc:
            raise _BadStream(_lower(reason(exc))) from exc
        self._buf = self._buf[self._pos :] + b"".join(out)
        self._pos = 0


def _zstandard(path: str, where: str) -> Any:
    try:
        import zstandard  # imported lazily: only .zst sources need it
    except ImportError as exc:
        raise SourceError(
            f"{where}reading '{path}' needs the zstandard package; pip install zstandard"
        ) from exc
    return zstandard


def _refuse_compressed(raw: _Readable, path: str, where: str) -> None:
    if isinstance(raw, _Buffered):
        head = raw.peek(4)
    else:
        head = raw.read(4)
        cast(BinaryIO, raw).seek(0)
    for magic, codec in _MAGIC.items():
        if head.startswith(magic):
            suffix = next(s for s, c in CODECS.items() if c == codec)
            raise SourceError(
                f"{where}'{path}' is {codec}-compressed but not named so; add {suffix} to its name"
            )


def _pread(raw: BinaryIO, offset: int, size: int) -> bytes:
    pieces, fd = [], raw.fileno()
    while size > 0:
        piece = os.pread(fd, size, offset)
        if not piece:
            break
        pieces.append(piece)
        offset, size = offset + len(piece), size - len(piece)
    return b"".join(pieces)


def _read_exactly(stream: _Stream, size: int) -> bytes:
    pieces = []
    while size > 0:
        piece = stream.read(min(size, _CHUNK))
        if not piece:
            break
        pieces.append(piece)
        size -= len(piece)
    return b"".join(pieces)


# Reading -----------------------------------------------------------------------------------------


def _cells(
    data: bytes, base: int, starts: Offsets, ends: Offsets, index: LineIndex, large: bool
) -> pa.Array:
    decoder, depth = _decoder(index.column, index.kind)
    view = memoryview(data)
    values = []
    for start, end in zip((starts - base).tolist(), (ends - base).tolist(), strict=True):
        try:
            values.append(_value(decoder.decode(view[start:end]), depth))
        except msgspec.DecodeError as exc:  # a ValidationError too
            raise SourceError(
                f"the line at byte {start + base:,} of the JSON Lines file '{index.path}' no "
                f"longer reads as it did ({_lower(reason(exc))}); it changed after it was "
                "indexed, so index it again"
            ) from exc
    if index.kind == "text":
        return pa.array(values, type=pa.large_string() if large else pa.string())
    if index.kind == "chat":  # each value's JSON as it is in the line (null: a null cell)
        raw = [None if v is None or bytes(v) == b"null" else bytes(v) for v in values]
        return pa.array(raw, type=pa.large_binary())
    return pa.array(values, type=pa.list_(pa.int64()))


# The cache ---------------------------------------------------------------------------------------


class _Header(msgspec.Struct, frozen=True):
    version: int
    path: str
    column: str
    kind: str
    size_bytes: int
    mtime_ns: int
    stream_bytes: int
    holds_text: bool
    problems: tuple[str, ...]


def _cache_path(path: str, column: str, kind: ColumnKind, store: Store = LOCAL) -> Path:
    """Where the index of ``column`` in ``path`` as it is now is cached (`file_key`: a remote
    file's names its store too)."""
    text = f"{file_key(path, store)}\0{column}\0{kind}"
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    return cache_dir("jsonl") / f"{storage.cache_name(path)}.{digest}.npz"


def _load_cache(
    cache: Path, path: str, column: str, kind: ColumnKind, store: Store = LOCAL
) -> LineIndex | None:
    """The index ``cache`` holds for ``path`` as it is now, or None (missing, stale, damaged)."""
    try:
        with np.load(cache, allow_pickle=False) as npz:
            header = msgspec.json.decode(npz["header"].tobytes(), type=_Header)
            starts, ends, groups = npz["starts"], npz["ends"], npz["groups"]
    except FileNotFoundError:
        return None
    except (
        OSError,
        ValueError,
        KeyError,
        EOFError,
        zipfile.BadZipFile,
        msgspec.MsgspecError,
    ) as exc:
        log.info("rebuilding the damaged index cache '%s' (%s)", cache, reason(exc))
        return None
    try:
        found = storage.stat(path, store)
    except storage.StoreError:
        raise
    except OSError:
        return None
    fresh = (header.version, header.path, header.column, header.kind) == (
        CACHE_VERSION,
        path,
        column,
        kind,
    ) and (header.size_bytes, header.mtime_ns) == (found.size, found.mtime_ns)
    if not fresh:
        log.info("rebuilding the stale index cache '%s'", cache)
        return None
    index = LineIndex(
        path=path,
        column=column,
        kind=kind,
        size_bytes=header.size_bytes,
        mtime_ns=header.mtime_ns,
        stream_bytes=header.stream_bytes,
        starts=starts,
        ends=ends,
        groups=groups,
        holds_text=header.holds_text,
        problems=header.problems,
    )
    if not _consistent(index, plain=_codec(path) is None):
        log.info("rebuilding the index cache '%s': its offsets do not fit the file", cache)
        return None
    return index


def _consistent(index: LineIndex, plain: bool) -> bool:
    """Whether the offsets can be an index of the file: ordered, inside it, groups non-empty."""
    arrays = (index.starts, index.ends, index.groups)
    if any(a.dtype != np.int64 or a.ndim != 1 for a in arrays):
        return False
    starts, ends, groups = arrays
    n = len(starts)
    if len(ends) != n or len(groups) < 1 or groups[0] != 0 or groups[-1] != n:
        return False
    if plain and index.stream_bytes != index.size_bytes:
        return False
    if not bool(np.all(np.diff(groups) > 0)):
        return False
    if n == 0:
        return len(groups) == 1
    return bool(
        starts[0] >= 0
        and ends[-1] <= index.stream_bytes
        and np.all(starts < ends)
        and np.all(ends[:-1] < starts[1:])
    )


def _write_cache(cache: Path, index: LineIndex) -> None:
    """Cache ``index`` (of a file that did not change while it was scanned)."""
    header = _Header(
        CACHE_VERSION,
        index.path,
        index.column,
        index.kind,
        index.size_bytes,
        index.mtime_ns,
        index.stream_bytes,
        index.holds_text,
        index.problems,
    )
    buffer = io.BytesIO()
    np.savez(
        buffer,
        header=np.frombuffer(msgspec.json.encode(header), dtype=np.uint8),
        starts=index.starts,
        ends=index.ends,
        groups=index.groups,
    )
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, buffer.getvalue())
    except OSError as exc:
        log.warning(
            "cannot write the index cache '%s' (%s); the file will be scanned again", cache, exc
        )
