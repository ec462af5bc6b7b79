"""Parquet: a row group is the file's own; indexed from footers only, read one column at a time.

Opening never reads data pages, so the Planner indexes terabytes in seconds. The footer's
statistics can prove a column null or empty in every row (``holds_text`` False).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats.base import (
    ColumnKind,
    FileIndex,
    check_column,
    check_image_column,
    glob_files,
    reason,
    store_of,
)
from msd.sources.storage import LOCAL, Store, is_remote, open_input

# A buffered stream keeps nothing once a read is done; unbuffered pre-reads would keep each
# open file's last column chunk (about a row group, compressed) alive.
READ_BUFFER_BYTES = 1 << 20


class ParquetFormat:
    name = "parquet"

    def files(self, source: Source, key: str) -> tuple[str, ...]:
        return glob_files(source, key)

    def index(
        self, source: Source, key: str, path: str, column: str, kind: ColumnKind
    ) -> FileIndex:
        try:
            with pq.ParquetFile(_source_of(path, store_of(source))) as pf:
                meta, schema = pf.metadata, pf.schema_arrow
        except SourceError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(
                f"source '{source.name}' ({key}.path): '{path}' is not a readable Parquet file "
                f"({reason(exc)}); fix or remove it, or narrow the glob"
            ) from exc
        check_column(source, key, path, schema, column, kind)
        if source.image_column is not None:
            check_image_column(source, key, path, schema)
        if source.video_column is not None:
            check_image_column(source, key, path, schema, "video_column")
        rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        return FileIndex(rows, kind != "text" or may_hold_text(meta, column))

    def open(
        self,
        path: str,
        kind: ColumnKind = "text",
        store: Store = LOCAL,
        group_rows: int | None = None,
    ) -> ParquetReader:
        return ParquetReader(path, store)  # the file's own row groups, whatever group_rows


class ParquetReader:
    def __init__(self, path: str, store: Store = LOCAL) -> None:
        self.file = pq.ParquetFile(
            _source_of(path, store), pre_buffer=False, buffer_size=READ_BUFFER_BYTES
        )

    def read(self, group: int, column: str) -> pa.Array:
        # One column: threads would gain nothing, and each would keep an allocator arena of
        # freed pages (megabytes) alive.
        table = self.file.read_row_group(group, columns=[column], use_threads=False)
        return table.column(0).combine_chunks()

    def close(self) -> None:
        self.file.close()


def _source_of(path: str, store: Store) -> str | pa.NativeFile:
    """A local path as it is (pyarrow opens it); a URL opened on its store (ranged reads)."""
    return open_input(path, store) if is_remote(path) else path


def may_hold_text(meta: pq.FileMetaData, column: str) -> bool:
    """False only when every row group's statistics show the column all null or all empty
    strings (absent statistics prove nothing)."""
    leaf = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == column), None)
    if leaf is None:
        return True
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        stats = group.column(leaf).statistics
        if group.num_rows == 0:
            continue
        if stats is None:
            return True
        all_null = stats.has_null_count and stats.null_count >= group.num_rows
        all_empty = stats.has_min_max and stats.max in ("", b"")
        if not (all_null or all_empty):
            return True
    return False


FORMAT = ParquetFormat()
