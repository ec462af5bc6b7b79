"""JSON Lines files (``.jsonl``, ``.ndjson``, ``.json``; plain, ``.gz`` or ``.zst``): one scan
finds each usable line's bytes; reads then take one row group's byte range.

A line is a JSON object; the source's column is a key path into it (``text``, ``meta.content``:
dots nest). `load_index` streams the (decompressed) file once, in bounded memory, and records
where each kept line starts and ends. A line that is not JSON, not an object, or whose value
has the wrong type (text: a string; tokens: a list of integers; missing or null is a null cell)
is left out, the same on every run, and listed in ``problems``; blank lines are skipped. Runs
of kept lines up to `GROUP_BYTES` form the row groups. The scan is cached as a ``.npz`` of
offsets (loaded without pickle, checked before use, rebuilt when damaged or stale) under
``cache_dir("jsonl")``, keyed by the file's `file_key` and the column.

A `JsonlReader` reads a plain file's group with one ``pread``; a compressed file is decompressed
forward from where the last read stopped (from the start again only for an earlier group), and
the last group's bytes and cells are kept, since a loader reads one group several times in a row.
"""

from __future__ import annotations

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
from typing import Annotated, Any, BinaryIO, Protocol

import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from msd.errors import SourceError
from msd.jobdir import atomic_write
from msd.recipe.schema import Source
from msd.sources.formats.base import (
    ColumnKind,
    FileIndex,
    cache_dir,
    file_key,
    glob_files,
    reason,
)

log = logging.getLogger(__name__)

GROUP_BYTES = 1 << 20  # a row group: consecutive kept lines spanning about this many bytes
MAX_PROBLEMS = 20  # lines left out that are described one by one; then one summary line
CACHE_VERSION = 1
SUFFIXES = (".jsonl", ".ndjson", ".json")
CODECS = {".gz": "gzip", ".zst": "zstd"}

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
        field_key = f"{key}.{'text_column' if kind == 'text' else 'token_column'}"
        if not _valid_key_path(column):
            raise SourceError(
                f"source '{source.name}' ({field_key}): '{column}' is not a key path; "
                "name a key, with dots between nested keys (e.g. meta.content)"
            )
        index = load_index(path, column, kind, where=f"source '{source.name}' ({key}.path): ")
        if index.num_groups == 0 and index.problems:
            where = f"source '{source.name}' ({field_key})"
            what = "a string" if kind == "text" else "a list of integers"
            other = "token_column for token lists" if kind == "text" else "text_column for text"
            raise SourceError(
                f"{where}: no line of '{path}' holds {what} at '{column}' ({index.problems[0]}); "
                f"check the key path, use {other}, or fix or remove the file"
            )
        return index.file_index()

    def open(self, path: str, kind: ColumnKind | None = None) -> JsonlReader:
        """A reader of ``path``; ``kind`` is the column's (None: whichever index is cached)."""
        return JsonlReader(path, kind)


FORMAT = JsonlFormat()


def is_jsonl(path: str) -> bool:
    """Whether ``path`` is named like a JSON Lines file, compressed or not."""
    name = path.lower()
    for suffix in CODECS:
        name = name.removesuffix(suffix)
    return name.endswith(SUFFIXES)


def load_index(path: str, column: str, kind: ColumnKind, where: str = "") -> LineIndex:
    """The index of ``column`` in ``path``: cached while the file is unchanged, else scanned.

    A missing, stale or damaged cache file is rebuilt (written to a temporary file, then
    renamed); one that cannot be written only costs a scan next time. ``where`` starts the
    message of a `SourceError` (e.g. ``source 'web' (sources[0].path): ``).
    """
    if not _valid_key_path(column):
        raise SourceError(f"{where}'{column}' is not a key path of '{path}'")
    path = os.path.abspath(path)
    try:
        cache = _cache_path(path, column, kind)
    except OSError as exc:
        raise SourceError(f"{where}cannot open '{path}' ({reason(exc)}); check the path") from exc
    index = _load_cache(cache, path, column, kind)
    if index is None:
        index = _scan_file(path, column, kind, where)
        _write_cache(cache, index)
    return index


def cached_index(path: str, column: str, kind: ColumnKind) -> LineIndex | None:
    """The cached, current index of ``column`` in ``path``, or None (nothing is scanned)."""
    path = os.path.abspath(path)
    try:
        cache = _cache_path(path, column, kind)
    except OSError:
        return None
    return _load_cache(cache, path, column, kind)


class JsonlReader:
    """Reads one column of one row group of a JSON Lines file at a time (one file open).

    Each column's index is loaded (from the cache, or scanned) on its first read.
    """

    def __init__(self, path: str, kind: ColumnKind | None = None) -> None:
        self.path = os.path.abspath(path)
        self.kind = kind
        self.codec = _codec(self.path)
        try:
            self._raw: BinaryIO = open(self.path, "rb")  # noqa: SIM115 (closed by close())
        except OSError as exc:
            raise SourceError(
                f"cannot open the JSON Lines file '{self.path}' ({reason(exc)}); check that it "
                "was not moved or removed after the source was indexed"
            ) from exc
        self._indexes: dict[str, LineIndex] = {}
        self._stream: _Stream | None = None
        self._pos = 0  # where the stream is, in decompressed bytes
        self._last_span: tuple[int, int] | None = None
        self._last_bytes = b""
        self._last_cells: tuple[int, str, pa.Array] | None = None

    def read(self, group: int, column: str) -> pa.Array:
        """The cells of ``column`` in row group ``group``, in line order (nulls where null)."""
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
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._raw.close()
        self._last_span, self._last_bytes, self._last_cells = None, b"", None

    def _index(self, column: str) -> LineIndex:
        index = self._indexes.get(column)
        if index is not None:
            return index
        if self.kind is not None:
            index = load_index(self.path, column, self.kind)
        else:
            index = cached_index(self.path, column, "text") or cached_index(
                self.path, column, "tokens"
            )
            if index is None:
                raise SourceError(
                    f"the JSON Lines file '{self.path}' has no cached index of '{column}'; "
                    "index the source first, or open the file with the column's kind"
                )
        self._indexes[column] = index
        return index

    def _bytes(self, index: LineIndex, span: tuple[int, int]) -> bytes:
        if span == self._last_span:
            return self._last_bytes
        self._check_unchanged(index)
        start, stop = span
        try:
            if self.codec is None:
                data = _pread(self._raw, start, stop - start)
            else:
                data = self._decompress(start, stop - start)
        except (OSError, _BadStream) as exc:
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
        """``size`` decompressed bytes from ``start``, going forward from the last read."""
        if self._stream is None or start < self._pos:
            if self._stream is not None:
                self._stream.close()
            self._raw.seek(0)
            self._stream, self._pos = _open_stream(self._raw, self.codec, self.path), 0
        while self._pos < start:
            skipped = len(self._stream.read(min(_CHUNK, start - self._pos)))
            if not skipped:
                return b""
            self._pos += skipped
        data = _read_exactly(self._stream, size)
        self._pos += len(data)
        return data

    def _check_unchanged(self, index: LineIndex) -> None:
        try:
            stat = os.fstat(self._raw.fileno())
        except (OSError, ValueError) as exc:  # ValueError: the file was closed
            raise SourceError(f"cannot read the JSON Lines file '{self.path}' ({exc})") from exc
        if (stat.st_size, stat.st_mtime_ns) != (index.size_bytes, index.mtime_ns):
            raise SourceError(
                f"the JSON Lines file '{self.path}' changed after it was indexed (now "
                f"{stat.st_size:,} bytes, then {index.size_bytes:,}); index the source again"
            )


# Scanning ----------------------------------------------------------------------------------------


class _BadStream(Exception):
    """A compressed stream that is damaged or cut short."""


class _Stream(Protocol):
    def read(self, size: int) -> bytes: ...

    def close(self) -> None: ...


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
        what = "a string" if self.kind == "text" else "a list of integers"
        return f"'{self.column}' is not {what} ({_lower(message)})"

    def _leave_out(self, problem: str) -> None:
        self.left_out += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"line {self.number}: {problem}")


def _scan_file(path: str, column: str, kind: ColumnKind, where: str) -> LineIndex:
    codec = _codec(path)
    try:
        with open(path, "rb") as raw:
            before = os.fstat(raw.fileno())
            if codec is None:
                _refuse_compressed(raw, path, where)
            stream = _open_stream(raw, codec, path, where)
            try:
                lines, stream_bytes = _scan(stream, column, kind)
            finally:
                stream.close()
            after = os.fstat(raw.fileno())
    except OSError as exc:
        raise SourceError(
            f"{where}cannot read '{path}' ({reason(exc)}); check that it exists and is readable"
        ) from exc
    except _BadStream as exc:
        raise SourceError(
            f"{where}'{path}' is not a readable {codec} stream ({exc}); recompress or remove it, "
            "or narrow the glob"
        ) from exc
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        log.warning("'%s' changed while it was indexed; its index will not match it", path)
    groups = lines.groups
    if len(lines.starts) > groups[-1]:
        groups.append(len(lines.starts))
    index = LineIndex(
        path=path,
        column=column,
        kind=kind,
        size_bytes=before.st_size,
        mtime_ns=before.st_mtime_ns,
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
    return index


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
    leaf: Any = str if kind == "text" else list[_Int64]
    typ: Any = leaf | None
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


def _open_stream(raw: BinaryIO, codec: str | None, path: str, where: str = "") -> _Stream:
    if codec == "gzip":
        return _GzipStream(raw)
    if codec == "zstd":
        return _ZstdStream(raw, path, where)
    return _PlainStream(raw)


class _PlainStream:
    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw

    def read(self, size: int) -> bytes:
        return self._raw.read(size)

    def close(self) -> None:
        pass  # the raw file belongs to the caller


class _GzipStream:
    def __init__(self, raw: BinaryIO) -> None:
        self._file = gzip.GzipFile(fileobj=raw, mode="rb")

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

    def __init__(self, raw: BinaryIO, path: str, where: str = "") -> None:
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


def _refuse_compressed(raw: BinaryIO, path: str, where: str) -> None:
    head = raw.read(4)
    raw.seek(0)
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


def _cache_path(path: str, column: str, kind: ColumnKind) -> Path:
    text = f"{file_key(path)}\0{column}\0{kind}"
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    return cache_dir("jsonl") / f"{Path(path).name[:80]}.{digest}.npz"


def _load_cache(cache: Path, path: str, column: str, kind: ColumnKind) -> LineIndex | None:
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
        stat = os.stat(path)
    except OSError:
        return None
    fresh = (header.version, header.path, header.column, header.kind) == (
        CACHE_VERSION,
        path,
        column,
        kind,
    ) and (header.size_bytes, header.mtime_ns) == (stat.st_size, stat.st_mtime_ns)
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
    try:
        stat = os.stat(index.path)
    except OSError:
        return
    if (stat.st_size, stat.st_mtime_ns) != (index.size_bytes, index.mtime_ns):
        return  # changed while scanned: a cache of it would be wrong
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
