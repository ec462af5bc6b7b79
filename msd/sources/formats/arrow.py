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
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pyarrow as pa

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats.base import ColumnKind, FileIndex, check_column, glob_files, reason

log = logging.getLogger(__name__)

FILE_MAGIC = b"ARROW1"  # the IPC file format starts (and ends) with it; a stream does not
STATE_FILE = "state.json"  # what save_to_disk writes next to its data files
DATASET_DICT_FILE = "dataset_dict.json"  # what DatasetDict.save_to_disk writes above its splits


class ArrowFormat:
    """Arrow IPC stream and file format files; one row group per record batch."""

    name = "arrow"

    def files(self, source: Source, key: str) -> tuple[str, ...]:
        """A ``save_to_disk`` folder's data files in ``state.json`` order, else the sorted
        ``.arrow`` files the glob matches."""
        folder = os.path.expanduser(source.path)
        if os.path.isdir(folder):
            return _saved_files(source, key, os.path.abspath(folder))
        return glob_files(source, key)

    def index(
        self, source: Source, key: str, path: str, column: str, kind: ColumnKind
    ) -> FileIndex:
        """The rows of each record batch; the column checked against the file's schema."""
        try:
            with pa.memory_map(path) as mapped:
                batches = _Batches(mapped)
                check_column(source, key, path, batches.schema, column, kind)
                rows: list[int] = []
                holds_text = False
                for i in range(batches.count):
                    batch = batches.get(i)
                    rows.append(batch.num_rows)
                    if not holds_text:
                        holds_text = not _null_or_empty(batch.column(column))
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(
                f"source '{source.name}' ({key}.path): '{path}' is not a readable Arrow IPC "
                f"file ({reason(exc)}); fix or remove it, or narrow the path"
            ) from exc
        log.debug("indexed %s: %d batches, %d rows", path, len(rows), sum(rows))
        return FileIndex(group_rows=tuple(rows), holds_text=holds_text)

    def open(self, path: str, kind: ColumnKind = "text") -> ArrowReader:
        """A reader of ``path``'s record batches, the file kept memory-mapped until closed."""
        return ArrowReader(path)


class ArrowReader:
    """One memory-mapped Arrow file; ``read`` returns a column of one record batch, zero-copy."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._closed = False
        try:
            self._map = pa.memory_map(path)
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(
                f"cannot open '{path}' ({reason(exc)}); check that it was not changed or "
                "removed after the source was indexed"
            ) from exc
        try:
            self._batches = _Batches(self._map)
        except (pa.ArrowException, OSError) as exc:
            self._map.close()
            raise SourceError(
                f"'{path}' is no longer a readable Arrow IPC file ({reason(exc)}); check that "
                "it was not changed after the source was indexed"
            ) from exc

    def read(self, group: int, column: str) -> pa.Array:
        """The ``column`` of record batch ``group`` as one `pyarrow.Array` (a view of the map)."""
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
            raise SourceError(
                f"cannot read column '{column}' of row group {group} of '{self.path}' "
                f"({type(exc).__name__}: {reason(exc)}); check that it was not changed after "
                "the source was indexed"
            ) from exc

    def close(self) -> None:
        """Unmap the file; arrays already returned stay valid (they hold the mapping)."""
        self._closed = True
        self._batches.release()
        self._map.close()


class _Batches:
    """The record batches of a memory-mapped IPC file or stream, by index.

    The file format is random access (its footer lists the batches). A stream has no footer,
    so its batches are read once, in order, and kept: zero-copy views of the map, holding them
    costs only their headers.
    """

    def __init__(self, mapped: pa.MemoryMappedFile) -> None:
        magic = mapped.read(len(FILE_MAGIC))
        mapped.seek(0)
        self._file: pa.ipc.RecordBatchFileReader | None = None
        self._kept: list[pa.RecordBatch] = []
        if magic == FILE_MAGIC:
            self._file = pa.ipc.open_file(mapped)
            self.schema: pa.Schema = self._file.schema
            self.count: int = self._file.num_record_batches
        else:
            stream = pa.ipc.open_stream(mapped)
            self.schema = stream.schema
            self._kept = list(stream)
            self.count = len(self._kept)

    def get(self, i: int) -> pa.RecordBatch:
        """Batch ``i`` (``0 <= i < count``)."""
        return self._file.get_batch(i) if self._file is not None else self._kept[i]

    def release(self) -> None:
        self._file = None
        self._kept = []
        self.count = 0


def _saved_files(source: Source, key: str, folder: str) -> tuple[str, ...]:
    """The data files of a ``Dataset.save_to_disk`` folder, in its ``state.json`` order."""
    where = f"source '{source.name}' ({key}.path): '{folder}'"
    if os.path.isfile(os.path.join(folder, DATASET_DICT_FILE)):
        splits = _splits(folder)
        example = os.path.join(folder, splits[0]) if splits else os.path.join(folder, "train")
        named = f" (splits: {', '.join(splits)})" if splits else ""
        raise SourceError(
            f"{where} is a DatasetDict folder{named}; point the path at one split's folder, "
            f"such as '{example}', with one source per split you want"
        )
    state_path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(state_path):
        raise SourceError(
            f"{where} is a folder without {STATE_FILE}, so not one written by "
            "Dataset.save_to_disk; point the path at such a folder, or at a glob of its "
            f"Arrow files such as '{os.path.join(folder, '*.arrow')}'"
        )
    names = _state_data_files(source, key, state_path)
    files = []
    for name in names:
        path = os.path.abspath(os.path.join(folder, name))
        if not os.path.isfile(path):
            raise SourceError(
                f"source '{source.name}' ({key}.path): '{state_path}' lists data file '{name}' "
                f"but '{path}' does not exist; save the dataset again with save_to_disk, or "
                "restore the missing file"
            )
        files.append(path)
    return tuple(files)


def _state_data_files(source: Source, key: str, state_path: str) -> list[str]:
    """The ``filename`` of each entry of a ``state.json``'s ``_data_files``, in order."""
    try:
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
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


def _splits(folder: str) -> list[str]:
    """The split names a ``dataset_dict.json`` lists (none if it cannot be read)."""
    try:
        with open(os.path.join(folder, DATASET_DICT_FILE), encoding="utf-8") as f:
            splits = json.load(f).get("splits")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
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
