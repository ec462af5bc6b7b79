"""The index of one source: which Parquet files and row groups it holds, read from footers only.

Opening a source never reads data pages, so the Planner can index terabytes in seconds; every
problem a user can fix (bad glob, wrong column, wrong type) is reported here, before any
process is started, as one `SourceError` sentence naming the source, recipe key and file.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import os
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from msd.errors import SourceError
from msd.recipe.schema import Source

ColumnKind = Literal["text", "tokens"]


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: the unit a Source Loader reads."""

    file: str
    index: int
    num_rows: int


@dataclass(frozen=True)
class SourceIndex:
    """Every row group of a source, in a fixed order (sorted absolute paths, then row groups)."""

    name: str
    column: str
    column_kind: ColumnKind
    files: tuple[str, ...]
    row_groups: tuple[RowGroup, ...]
    row_starts: tuple[int, ...]
    num_rows: int


def source_key(name: str) -> int:
    """A stable unsigned 64-bit key of a source name; Python's hash() is salted per process."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def open_source(source: Source, key: str) -> SourceIndex:
    """Index ``source`` from Parquet footers; ``key`` is its recipe path, e.g. ``sources[1]``."""
    column, kind = _column(source, key)
    files = _expand(source, key)
    groups: list[RowGroup] = []
    holds_text = False
    for path in files:
        found, text = _file_row_groups(source, key, path, column, kind)
        groups.extend(found)
        holds_text = holds_text or text
    starts = tuple(itertools.accumulate((g.num_rows for g in groups), initial=0))
    if starts[-1] == 0:
        raise SourceError(
            f"source '{source.name}' ({key}.path): the {len(files)} file(s) matching "
            f"'{source.path}' hold no rows; point the path at non-empty data"
        )
    if not holds_text:
        raise SourceError(
            f"source '{source.name}' ({key}.text_column): column '{column}' is null or empty "
            f"in all {starts[-1]:,} rows of the {len(files)} file(s) matching '{source.path}' "
            "(their Parquet statistics say so); name a column that holds text, or remove the "
            "source"
        )
    return SourceIndex(
        name=source.name,
        column=column,
        column_kind=kind,
        files=files,
        row_groups=tuple(groups),
        row_starts=starts[:-1],
        num_rows=starts[-1],
    )


def _column(source: Source, key: str) -> tuple[str, ColumnKind]:
    # The recipe loader checks this too; a Source built in code bypasses it.
    if (source.text_column is None) == (source.token_column is None):
        raise SourceError(
            f"source '{source.name}' ({key}): set exactly one of text_column and token_column"
        )
    if source.text_column is not None:
        return source.text_column, "text"
    assert source.token_column is not None
    return source.token_column, "tokens"


def _expand(source: Source, key: str) -> tuple[str, ...]:
    pattern = os.path.expanduser(source.path)
    matches = glob.glob(pattern, recursive=True)
    files = sorted({os.path.abspath(m) for m in matches if os.path.isfile(m)})
    if not files:
        raise SourceError(
            f"source '{source.name}' ({key}.path): no file matches '{source.path}'; "
            "check the path, relative paths are taken from the current directory"
        )
    return tuple(files)


def _file_row_groups(
    source: Source, key: str, path: str, column: str, kind: ColumnKind
) -> tuple[list[RowGroup], bool]:
    """The file's row groups, and whether its column may hold text (False: its statistics
    show every cell null or empty)."""
    try:
        with pq.ParquetFile(path) as pf:
            meta, schema = pf.metadata, pf.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(
            f"source '{source.name}' ({key}.path): '{path}' is not a readable Parquet file "
            f"({_reason(exc)}); fix or remove it, or narrow the glob"
        ) from exc
    _check_column(source, key, path, schema, column, kind)
    groups = [RowGroup(path, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return groups, kind == "tokens" or _may_hold_text(meta, column)


def _may_hold_text(meta: pq.FileMetaData, column: str) -> bool:
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


def _check_column(
    source: Source, key: str, path: str, schema: pa.Schema, column: str, kind: ColumnKind
) -> None:
    field_key = f"{key}.{'text_column' if kind == 'text' else 'token_column'}"
    where = f"source '{source.name}' ({field_key}): '{path}'"
    if schema.get_field_index(column) < 0:
        names = ", ".join(schema.names) or "none"
        raise SourceError(
            f"{where} has no column '{column}' (it has: {names}); set {field_key} to one of them"
        )
    typ = schema.field(column).type
    if kind == "text" and not _is_text(typ):
        raise SourceError(
            f"{where} column '{column}' is {typ}, not string or binary; "
            "use token_column for pre-tokenized lists"
        )
    if kind == "tokens" and not _is_tokens(typ):
        raise SourceError(
            f"{where} column '{column}' is {typ}, not a list of integers; use text_column for text"
        )


def _is_text(typ: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )


def _is_tokens(typ: pa.DataType) -> bool:
    is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    return bool(is_list and pa.types.is_integer(typ.value_type))


def _reason(exc: BaseException) -> str:
    # Keep the message one sentence: Arrow's errors run to several.
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return first.split(". ")[0].rstrip(".")
