"""Reading single row groups, one column at a time, with a bounded set of open files.

A loader walks shuffled row groups spread over many files; keeping every file open would
exhaust file descriptors, and reopening per read re-parses the footer (or the index), so a small
LRU of open files, in any format (``msd.sources.formats``), sits in between.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from types import TracebackType

import pyarrow as pa

from msd.errors import SourceError
from msd.sources import storage
from msd.sources.formats import FORMATS
from msd.sources.formats.base import FileReader
from msd.sources.index import RowGroup


class Unavailable(Exception):
    """An object store did not serve a read of ``file`` (throttled, unreachable, timed out):
    the same read may succeed later. ``reason``: one sentence."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(reason)
        self.file, self.reason = file, reason


class RowGroupReader:
    """Reads one column of one row group at a time; keeps at most ``max_open_files`` open."""

    def __init__(self, max_open_files: int = 4) -> None:
        if max_open_files < 1:
            raise ValueError(f"max_open_files must be at least 1, got {max_open_files}")
        self.max_open_files = max_open_files
        self._files: OrderedDict[str, FileReader] = OrderedDict()

    def read(self, rg: RowGroup, column: str) -> pa.Array:
        """The ``column`` of row group ``rg`` as one `pyarrow.Array` (chunks combined)."""
        try:
            array = self._file(rg).read(rg.index, column)
        except SourceError:
            raise
        except (pa.ArrowException, OSError, KeyError, IndexError, ValueError) as exc:
            if storage.is_remote(rg.file) and isinstance(exc, (pa.ArrowException, OSError)):
                raise self._store_failure(rg, exc) from exc
            raise SourceError(
                f"cannot read column '{column}' of row group {rg.index} of '{rg.file}' "
                f"({type(exc).__name__}: {str(exc).strip()[:200]}); check that it was not "
                "changed or removed after the source was indexed"
            ) from exc
        if len(array) != rg.rows_stored:
            raise SourceError(
                f"row group {rg.index} of '{rg.file}' holds {len(array):,} rows, not the "
                f"{rg.rows_stored:,} it held when the source was indexed; the file was changed "
                "after the job started: restore it, or start a new job"
            )
        return array

    def close(self) -> None:
        """Close every open file; the reader stays usable and reopens files on demand."""
        while self._files:
            _, reader = self._files.popitem(last=False)
            reader.close()

    def _store_failure(self, rg: RowGroup, exc: BaseException) -> Exception:
        """An object store's failure of a read: `Unavailable` if a retry may succeed."""
        self._drop(rg.file)  # a connection that failed is not reused
        error = exc if isinstance(exc, storage.StoreError) else None
        error = error or storage.store_error(exc, rg.file, rg.store)
        if error.transient:
            return Unavailable(rg.file, str(error))
        return SourceError(f"cannot read row group {rg.index} of '{rg.file}': {error}")

    def _drop(self, path: str) -> None:
        reader = self._files.pop(path, None)
        if reader is not None:
            with contextlib.suppress(pa.ArrowException, OSError):
                reader.close()

    def open_files(self) -> tuple[str, ...]:
        """Paths currently open, least recently used first."""
        return tuple(self._files)

    def __enter__(self) -> RowGroupReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _file(self, rg: RowGroup) -> FileReader:
        reader = self._files.get(rg.file)
        if reader is not None:
            self._files.move_to_end(rg.file)
            return reader
        while len(self._files) >= self.max_open_files:
            _, old = self._files.popitem(last=False)
            old.close()
        reader = FORMATS[rg.format].open(rg.file, rg.kind, rg.store, rg.group_rows)
        self._files[rg.file] = reader
        return reader
