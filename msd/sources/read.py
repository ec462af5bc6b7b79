"""Reading single row groups, one column at a time, with a bounded set of open files.

A loader walks shuffled row groups spread over many files; keeping every file open would
exhaust file descriptors, and reopening per read re-parses the footer, so a small LRU of
handles sits in between.
"""

from __future__ import annotations

from collections import OrderedDict
from types import TracebackType

import pyarrow as pa
import pyarrow.parquet as pq

from msd.errors import SourceError
from msd.sources.index import RowGroup

READ_BUFFER_BYTES = 1 << 20


class RowGroupReader:
    """Reads one column of one row group at a time; keeps at most ``max_open_files`` open."""

    def __init__(self, max_open_files: int = 4) -> None:
        if max_open_files < 1:
            raise ValueError(f"max_open_files must be at least 1, got {max_open_files}")
        self.max_open_files = max_open_files
        self._files: OrderedDict[str, pq.ParquetFile] = OrderedDict()

    def read(self, rg: RowGroup, column: str) -> pa.Array:
        """The ``column`` of row group ``rg`` as one `pyarrow.Array` (chunks combined)."""
        try:
            table = self._file(rg.file).read_row_group(rg.index, columns=[column])
            return table.column(0).combine_chunks()
        except (pa.ArrowException, OSError, KeyError, IndexError) as exc:
            raise SourceError(
                f"cannot read column '{column}' of row group {rg.index} of '{rg.file}' "
                f"({type(exc).__name__}: {str(exc).strip()[:200]}); check that it was not "
                "changed or removed after the source was indexed"
            ) from exc

    def close(self) -> None:
        """Close every open file; the reader stays usable and reopens files on demand."""
        while self._files:
            _, pf = self._files.popitem(last=False)
            pf.close()

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

    def _file(self, path: str) -> pq.ParquetFile:
        pf = self._files.get(path)
        if pf is not None:
            self._files.move_to_end(path)
            return pf
        while len(self._files) >= self.max_open_files:
            _, old = self._files.popitem(last=False)
            old.close()
        # Unbuffered pre-reads would keep each open file's last column chunk (about a row
        # group, compressed) alive; a buffered stream keeps nothing once the read is done.
        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
        self._files[path] = pf
        return pf
