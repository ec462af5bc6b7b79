"""Arrow IPC files: a Hugging Face ``save_to_disk`` folder, or a glob of ``.arrow`` files.

``source.path`` names either a folder written by ``datasets.Dataset.save_to_disk`` (its
``state.json`` lists the data files in the dataset's row order) or a glob of ``.arrow`` files
(taken in sorted order). Both Arrow IPC layouts are read: the *stream* format ``datasets``
writes, and the *file* format (magic ``ARROW1``, with a footer of batch offsets). A row group is
one record batch, empty ones included, so group ``i`` is always batch ``i`` of the file.

Files are memory-mapped and read zero-copy: indexing walks the batch headers (row and null
counts come from the IPC metadata, emptiness from two offsets per batch), and a reader's arrays
are slices of the map, so nothing is resident beyond the pages a loader touches. No
``datasets`` import: pyarrow alone reads what it writes.

Files in an object store (`msd.sources.storage`) are read by range instead. The file
format is random access: its footer, then each batch, is one ranged read. A stream has no
footer: indexing reads it once, front to back, a batch at a time; a reader opening one reads it
once too, keeping only where each record batch lies (cached on the machine, so a reopened
file is not read again), then reads batch ``i`` by range (`_Batches`; a stream with dictionary
batches is the exception, held in memory while open).
"""

from __future__ import annotations

import io
import json
import logging
import os
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from msd.errors import SourceError
from msd.jobdir import atomic_write
from msd.recipe.schema import Source
from msd.sources import storage
from msd.sources.formats.base import (
    ColumnKind,
    FileIndex,
    cache_dir,
    check_column,
    glob_files,
    listed_key,
    listing,
    reason,
    store_of,
)
from msd.sources.storage import LOCAL, Store

log = logging.getLogger(__name__)

FILE_MAGIC = b"ARROW1"  # the IPC file format starts (and ends) with it; a stream does not
STATE_FILE = "state.json"  # what save_to_disk writes next to its data files
DATASET_DICT_FILE = "dataset_dict.json"  # what DatasetDict.save_to_disk writes above its splits
# Reading a remote stream front to back: ranged reads of at least this many bytes, not one per
# message header and body.
SCAN_BUFFER_BYTES = 8 << 20
_WILDCARDS = ("*", "?", "[")


class ArrowFormat:
    """Arrow IPC stream and file format files; one row group per record batch."""

    name = "arrow"

    def files(self, source: Source, key: str) -> tuple[str, ...]:
        """A ``save_to_disk`` folder's data files in ``state.json`` order, else the sorted
        ``.arrow`` files the glob matches (local or a URL) — or, in a job, the files it
        named when the job started (``Source.files``)."""
        if source.files:
            return tuple(f.path for f in source.files)
        if storage.is_remote(source.path):
            folder = source.path.rstrip("/")
            if not any(c in folder for c in _WILDCARDS) and _remote_dir(source, key, folder):
                return _saved_files(source, key, folder)
            return glob_files(source, key)
        folder = os.path.expanduser(source.path)
        if os.path.isdir(folder):
            return _saved_files(source, key, os.path.abspath(folder))
        return glob_files(source, key)

    def index(
        self, source: Source, key: str, path: str, column: str, kind: ColumnKind
    ) -> FileIndex:
        """The rows of each record batch; the column checked against the file's schema."""
        try:
            if storage.is_remote(path):
                with storage.open_input(path, store_of(source)) as remote:
                    schema, batches = _each_batch(remote)
                    rows, holds_text = _count(source, key, path, schema, batches, column, kind)
            else:
                with pa.memory_map(path) as mapped:
                    local = _Batches(mapped)
                    each = (local.get(i) for i in range(local.count))
                    rows, holds_text = _count(source, key, path, local.schema, each, column, kind)
        except SourceError:
            raise
        except (pa.ArrowException, OSError) as exc:
            if storage.is_remote(path) and isinstance(exc, OSError):
                raise _store_failure(source, key, path, exc) from exc
            raise SourceError(
                f"source '{source.name}' ({key}.path): '{path}' is not a readable Arrow IPC "
                f"file ({reason(exc)}); fix or remove it, or narrow the path"
            ) from exc
        log.debug("indexed %s: %d batches, %d rows", path, len(rows), sum(rows))
        return FileIndex(group_rows=tuple(rows), holds_text=holds_text)

    def open(
        self,
        path: str,
        kind: ColumnKind = "text",
        store: Store = LOCAL,
        group_rows: int | None = None,
    ) -> ArrowReader:
        """A reader of ``path``'s record batches, the file kept memory-mapped (or, for a URL,
        open on its store) until closed; ``group_rows`` is ignored (a group is a batch)."""
        return ArrowReader(path, store)


def _count(
    source: Source,
    key: str,
    path: str,
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
    column: str,
    kind: ColumnKind,
) -> tuple[list[int], bool]:
    """The column checked against ``schema``; each batch's rows, and whether any holds text."""
    check_column(source, key, path, schema, column, kind)
    rows: list[int] = []
    holds_text = False
    for batch in batches:
        rows.append(batch.num_rows)
        if not holds_text:
            holds_text = not _null_or_empty(batch.column(column))
    return rows, holds_text


def _each_batch(remote: pa.NativeFile) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema and record batches of a remote file, each read once: by range (the file
    format), or front to back through a buffer (a stream; a batch is dropped once used)."""
    if remote.read_at(len(FILE_MAGIC), 0) == FILE_MAGIC:
        reader = pa.ipc.open_file(remote)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    stream = pa.ipc.open_stream(_ahead(remote))
    return stream.schema, iter(stream)


class ArrowReader:
    """One Arrow file, memory-mapped (``read`` returns a column of one record batch,
    zero-copy), or open on an object store (each batch read by range)."""

    def __init__(self, path: str, store: Store = LOCAL) -> None:
        self.path = path
        self._closed = False
        self._remote = storage.is_remote(path)
        try:
            self._map = storage.open_input(path, store) if self._remote else pa.memory_map(path)
        except (pa.ArrowException, OSError) as exc:
            if self._remote:
                raise  # the caller tells an object store's transient failure from the rest
            raise SourceError(
                f"cannot open '{path}' ({reason(exc)}); check that it was not changed or "
                "removed after the source was indexed"
            ) from exc
        try:
            cache = _places_cache(path, store, self._map) if self._remote else None
            known = _load_places(cache) if cache is not None else None
            self._batches = _Batches(self._map, self._remote, known)
            if cache is not None and known is None and self._batches.places:
                _save_places(cache, self._batches.schema, self._batches.places)
        except (pa.ArrowException, OSError) as exc:
            self._map.close()
            if self._remote and isinstance(exc, OSError):
                raise
            raise SourceError(
                f"'{path}' is no longer a readable Arrow IPC file ({reason(exc)}); check that "
                "it was not changed after the source was indexed"
            ) from exc

    def read(self, group: int, column: str) -> pa.Array:
        """The ``column`` of record batch ``group`` as one `pyarrow.Array` (a view of the map;
        for a URL, of the bytes read). An object store's failure (``OSError``) is left to the
        caller, which tells a transient one from the rest (``msd.sources.read``)."""
        if self._closed:
            raise ValueError(f"the reader of '{self.path}' is closed")
        count = self._batches.count
        if not 0 <= group < count:
            raise SourceError(
                f"cannot read row group {group} of '{self.path}': it now holds {count} record "
                "batch(es); check that it was not changed after the source was indexed"
            )
        try:
            return self._batches.get(group).column(column)
        except (pa.ArrowException, OSError, KeyError) as exc:
            if self._remote and isinstance(exc, OSError):
                raise
            raise SourceError(
                f"cannot read column '{column}' of row group {group} of '{self.path}' "
                f"({type(exc).__name__}: {reason(exc)}); check that it was not changed after "
                "the source was indexed"
            ) from exc

    def close(self) -> None:
        """Unmap (or close) the file; arrays already returned stay valid (they hold the
        mapping, or their own bytes)."""
        self._closed = True
        self._batches.release()
        self._map.close()


class _Batches:
    """The record batches of an IPC file or stream, by index.

    The file format is random access (its footer lists the batches). A local stream has no
    footer, so its batches are read once, in order, and kept: zero-copy views of the map,
    holding them costs only their headers. A remote stream (``remote``) is read once at open,
    front to back, keeping only where each record batch message lies (``_places``), and batch
    ``i`` is then one ranged read — except a stream with dictionary batches (a batch read alone
    would lack them): its batches are kept as they are read, so it is held in memory while
    open.
    """

    def __init__(
        self,
        source: pa.NativeFile,
        remote: bool = False,
        known: tuple[pa.Schema, list[tuple[int, int]]] | None = None,
    ) -> None:
        """``known``: a remote stream's schema and batch places, as an earlier open found them
        (`_places_cache`)."""
        if remote:
            magic = source.read_at(len(FILE_MAGIC), 0)
        else:
            magic = source.read(len(FILE_MAGIC))
            source.seek(0)
        self._source = source
        self._file: pa.ipc.RecordBatchFileReader | None = None
        self._kept: list[pa.RecordBatch] = []
        self._places: list[tuple[int, int]] = []  # a remote stream's batches: offset, size
        if magic == FILE_MAGIC:
            self._file = pa.ipc.open_file(source)
            self.schema: pa.Schema = self._file.schema
            self.count: int = self._file.num_record_batches
            return
        placed = known or (_stream_places(source) if remote else None)
        if placed is not None:
            self.schema, self._places = placed
            self.count = len(self._places)
            return
        stream = pa.ipc.open_stream(_ahead(source) if remote else source)
        self.schema = stream.schema
        self._kept = list(stream)
        self.count = len(self._kept)

    @property
    def places(self) -> list[tuple[int, int]]:
        """A remote stream's batch places (offset, size); empty for any other file."""
        return self._places

    def get(self, i: int) -> pa.RecordBatch:
        """Batch ``i`` (``0 <= i < count``)."""
        if self._file is not None:
            return self._file.get_batch(i)
        if self._places:
            offset, size = self._places[i]
            message = pa.ipc.read_message(pa.py_buffer(self._source.read_at(size, offset)))
            return pa.ipc.read_record_batch(message, self.schema)
        return self._kept[i]

    def release(self) -> None:
        self._file = None
        self._kept = []
        self._places = []
        self.count = 0


def _stream_places(source: pa.NativeFile) -> tuple[pa.Schema, list[tuple[int, int]]] | None:
    """A remote stream's schema and where each record batch message lies (offset, size), read
    front to back; None where it holds dictionary batches."""
    ahead = _ReadAhead(source)
    reader = pa.ipc.MessageReader.open_stream(pa.PythonFile(ahead, mode="r"))
    try:
        first = reader.read_next_message()
    except StopIteration:
        raise pa.ArrowInvalid("the stream holds no schema") from None
    if first.type != "schema":
        raise pa.ArrowInvalid(f"the stream starts with a {first.type} message, not a schema")
    schema = pa.ipc.read_schema(first)
    places: list[tuple[int, int]] = []
    while True:
        offset = ahead.tell()
        try:
            message = reader.read_next_message()
        except StopIteration:
            return schema, places
        if message.type == "dictionary":
            return None
        if message.type == "record batch":
            places.append((offset, ahead.tell() - offset))


def _places_cache(path: str, store: Store, opened: pa.NativeFile) -> Path | None:
    """Where the batch places of the remote stream ``path`` are cached on this machine (keyed
    by its URL, endpoint, size and modification time): a loader reopening the file reads only
    the batches it wants, not the whole stream again."""
    try:
        found = storage.stat(path, store)
    except OSError:
        return None  # not cached: the stream is read to find them
    if found.size != opened.size():
        return None  # changed between the two requests
    digest = listed_key(found, store)
    return cache_dir("arrow") / f"{storage.cache_name(path)}.{digest}.npz"


def _load_places(cache: Path) -> tuple[pa.Schema, list[tuple[int, int]]] | None:
    try:
        with np.load(cache, allow_pickle=False) as npz:
            schema = pa.ipc.read_schema(pa.py_buffer(npz["schema"].tobytes()))
            places = npz["places"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, pa.ArrowException):
        log.info("reading again the damaged batch places '%s'", cache)
        return None
    if places.dtype != np.int64 or places.ndim != 2 or places.shape[1:] != (2,):
        return None
    return schema, [(int(o), int(n)) for o, n in places.tolist()]


def _save_places(cache: Path, schema: pa.Schema, places: list[tuple[int, int]]) -> None:
    buffer = io.BytesIO()
    np.savez(
        buffer,
        schema=np.frombuffer(schema.serialize().to_pybytes(), dtype=np.uint8),
        places=np.array(places, dtype=np.int64).reshape(-1, 2),
    )
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, buffer.getvalue())
    except OSError as exc:
        log.warning("cannot cache batch places in %s (%s)", cache.parent, exc)


def _ahead(source: pa.NativeFile) -> pa.NativeFile:
    """``source`` (a remote file) to be read front to back by pyarrow's stream readers."""
    return pa.PythonFile(_ReadAhead(source), mode="r")


class _ReadAhead:
    """A remote file read front to back, as a Python file: ranged reads of at least
    `SCAN_BUFFER_BYTES`, never past the end — a damaged length makes pyarrow ask for far more
    than there is, and a buffered stream would allocate it all — and the file left open."""

    closed = False

    def __init__(self, source: pa.NativeFile) -> None:
        self._source = source
        self._size = int(source.size())
        self._pos = 0  # where the next read starts
        self._buf = b""  # bytes read ahead: _buf[_off:] lies at _pos
        self._off = 0

    def read(self, nbytes: int | None = -1) -> bytes:
        left = self._size - self._pos
        n = left if nbytes is None or nbytes < 0 else min(nbytes, left)
        held = len(self._buf) - self._off
        if held < n:
            start = self._pos + held
            more = self._source.read_at(min(max(n - held, SCAN_BUFFER_BYTES), left - held), start)
            self._buf, self._off = self._buf[self._off :] + more, 0
        out = self._buf[self._off : self._off + n]
        self._off += len(out)
        self._pos += len(out)
        return out

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        pass  # the file is its reader's to close


def _remote_dir(source: Source, key: str, folder: str) -> bool:
    """``folder`` (a URL) is a prefix holding objects; an object store's refusal a
    `SourceError`."""
    try:
        return storage.is_dir(folder, store_of(source))
    except OSError as exc:
        raise _store_failure(source, key, folder, exc) from exc


def _store_failure(source: Source, key: str, path: str, exc: OSError) -> SourceError:
    """An object store's failure to serve ``path`` while indexing, as one sentence naming the
    source, its recipe key and the file."""
    where = f"source '{source.name}' ({key}.path)"
    if isinstance(exc, FileNotFoundError):
        return SourceError(
            f"{where}: '{path}' does not exist; check the path, or index the source again if "
            "the file was removed after it was listed"
        )
    error = exc if isinstance(exc, storage.StoreError) else None
    error = error or storage.store_error(exc, path, store_of(source))
    named = str(error) if path in str(error) else f"cannot read '{path}': {error}"
    return SourceError(f"{where}: {named}")


def _saved_files(source: Source, key: str, folder: str) -> tuple[str, ...]:
    """The data files of a ``Dataset.save_to_disk`` folder (local, or a URL prefix), in
    its ``state.json`` order."""
    where = f"source '{source.name}' ({key}.path): '{folder}'"
    remote = storage.is_remote(folder)
    join = storage.join
    if remote:  # one listing tells which files are there
        held = {found.path for found in listing(source, key, join(folder, "**"))}
        exists: Callable[[str], bool] = held.__contains__
    else:
        exists = os.path.isfile
    if exists(join(folder, DATASET_DICT_FILE)):
        splits = _splits(source, join(folder, DATASET_DICT_FILE))
        example = join(folder, splits[0]) if splits else join(folder, "train")
        named = f" (splits: {', '.join(splits)})" if splits else ""
        raise SourceError(
            f"{where} is a DatasetDict folder{named}; point the path at one split's folder, "
            f"such as '{example}', with one source per split you want"
        )
    state_path = join(folder, STATE_FILE)
    if not exists(state_path):
        raise SourceError(
            f"{where} is a folder without {STATE_FILE}, so not one written by "
            "Dataset.save_to_disk; point the path at such a folder, or at a glob of its "
            f"Arrow files such as '{join(folder, '*.arrow')}'"
        )
    names = _state_data_files(source, key, state_path)
    files = []
    for name in names:
        path = join(folder, name) if remote else os.path.abspath(join(folder, name))
        if not exists(path):
            raise SourceError(
                f"source '{source.name}' ({key}.path): '{state_path}' lists data file '{name}' "
                f"but '{path}' does not exist; save the dataset again with save_to_disk, or "
                "restore the missing file"
            )
        files.append(path)
    return tuple(files)


def _read_json(source: Source, path: str) -> object:
    """The JSON document at ``path`` (UTF-8; local, or read from the source's store)."""
    if storage.is_remote(path):
        return json.loads(storage.read_bytes(path, store_of(source)).decode("utf-8"))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _state_data_files(source: Source, key: str, state_path: str) -> list[str]:
    """The ``filename`` of each entry of a ``state.json``'s ``_data_files``, in order."""
    try:
        state = _read_json(source, state_path)
    except storage.StoreError as exc:
        raise _store_failure(source, key, state_path, exc) from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(
            f"source '{source.name}' ({key}.path): '{state_path}' is not readable JSON "
            f"({reason(exc)}); save the dataset again with save_to_disk"
        ) from exc
    entries = state.get("_data_files") if isinstance(state, dict) else None
    names = (
        [e.get("filename") for e in entries if isinstance(e, dict)]
        if isinstance(entries, list)
        else []
    )
    if (
        not names
        or len(names) != len(entries or ())
        or not all(isinstance(n, str) and n for n in names)
    ):
        raise SourceError(
            f"source '{source.name}' ({key}.path): '{state_path}' has no list of data files "
            "('_data_files' entries with a 'filename'); save the dataset again with save_to_disk"
        )
    return [str(n) for n in names]


def _splits(source: Source, path: str) -> list[str]:
    """The split names the ``dataset_dict.json`` at ``path`` lists (none if it cannot be
    read)."""
    try:
        document = _read_json(source, path)
        splits = document.get("splits") if isinstance(document, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    return [str(s) for s in splits] if isinstance(splits, list) else []


def _null_or_empty(array: pa.Array) -> bool:
    """Every cell null, or every string, binary or list empty; reads two offsets at most."""
    if len(array) == 0 or array.null_count == len(array):
        return True
    typ = array.type
    large = (
        pa.types.is_large_string(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_large_list(typ)
    )
    variable = large or pa.types.is_string(typ) or pa.types.is_binary(typ)
    variable = variable or pa.types.is_list(typ)
    if not variable:
        return False
    offsets_buf = array.buffers()[1]
    dtype = np.dtype(np.int64 if large else np.int32)
    first, last = array.offset, array.offset + len(array)
    if offsets_buf is None or offsets_buf.size < (last + 1) * dtype.itemsize:
        return False  # not the layout expected: prove nothing
    offsets = np.frombuffer(offsets_buf, dtype=dtype, count=last + 1)
    return bool(offsets[first] == offsets[last])


FORMAT = ArrowFormat()
