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
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.webdataset import TarIndex, load_or_build_index

ColumnKind = Literal["text", "tokens"]
DEFAULT_TEXT_EXT = "txt"  # a WebDataset sample's text member, unless text_column names another


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
    format: str = "parquet"
    image_column: str | None = None
    problems: tuple[str, ...] = ()  # what the WebDataset shard indexes found (samples left out)

    @property
    def has_images(self) -> bool:
        return self.format == "webdataset" or self.image_column is not None


def source_key(name: str) -> int:
    """A stable unsigned 64-bit key of a source name; Python's hash() is salted per process."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def open_source(source: Source, key: str) -> SourceIndex:
    """Index ``source`` from Parquet footers (WebDataset: shard headers); ``key`` is its recipe
    path, e.g. ``sources[1]``."""
    if source.format == "webdataset":
        return _open_webdataset(source, key)
    column, kind = _column(source, key)
    files = _expand(source, key)
    groups: list[RowGroup] = []
    holds_text = source.image_column is not None  # an image-only row is a sample too
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
        image_column=source.image_column,
    )


def _open_webdataset(source: Source, key: str) -> SourceIndex:
    files = _expand(source, key)
    groups, problems = webdataset_groups(source, key, files)
    starts = tuple(itertools.accumulate((g.num_rows for g in groups), initial=0))
    return SourceIndex(
        name=source.name,
        column=text_ext(source),
        column_kind="text",
        files=files,
        row_groups=tuple(groups),
        row_starts=starts[:-1],
        num_rows=starts[-1],
        format="webdataset",
        problems=tuple(problems),
    )


def cache_dir() -> Path:
    """Where WebDataset shard indexes are cached."""
    root = os.environ.get("MSD_CACHE_DIR")
    return Path(root) / "webdataset" if root else Path.home() / ".cache" / "msd" / "webdataset"


def text_ext(source: Source) -> str:
    return (source.text_column or DEFAULT_TEXT_EXT).lower()


def tar_index(source: Source, path: str) -> TarIndex:
    return load_or_build_index(path, cache_dir(), (text_ext(source),))


def webdataset_groups(
    source: Source, key: str, files: tuple[str, ...]
) -> tuple[list[RowGroup], list[str]]:
    """One row group per shard (its samples), and the problems the shards' indexes found."""
    groups, problems = [], []
    for path in files:
        index = tar_index(source, path)
        problems += [f"{path}: {p}" for p in index.problems]
        problems += [f"{path}: {s.key}: {p}" for s in index.samples for p in s.problems]
        if index.samples:
            groups.append(RowGroup(path, 0, len(index.samples)))
    if not groups:
        raise SourceError(
            f"source '{source.name}' ({key}.path): the {len(files)} WebDataset shard(s) matching "
            f"'{source.path}' hold no samples; point the path at non-empty .tar files"
        )
    return groups, problems


def check_image_column(source: Source, key: str, path: str, schema: pa.Schema) -> None:
    """An image column holds binary, ``{bytes, ...}`` structs, or lists of either."""
    column = source.image_column
    assert column is not None
    if schema.get_field_index(column) < 0:
        names = ", ".join(schema.names) or "none"
        raise SourceError(
            f"source '{source.name}' ({key}.image_column): '{path}' has no column '{column}' "
            f"(it has: {names}); set image_column to one of them"
        )
    typ = schema.field(column).type
    inner = typ.value_type if pa.types.is_list(typ) or pa.types.is_large_list(typ) else typ
    if _is_binary(inner) or (pa.types.is_struct(inner) and bytes_field(inner) is not None):
        return
    raise SourceError(
        f"source '{source.name}' ({key}.image_column): '{path}' column "
        f"'{source.image_column}' is {typ}, not binary, an image struct with a binary 'bytes' "
        "field, or a list of those"
    )


def bytes_field(typ: pa.StructType) -> str | None:
    """The name of a struct's binary ``bytes`` field (the Hugging Face Image struct's)."""
    for i in range(typ.num_fields):
        field = typ.field(i)
        if field.name == "bytes" and _is_binary(field.type):
            return str(field.name)
    return None


def _is_binary(typ: pa.DataType) -> bool:
    return bool(pa.types.is_binary(typ) or pa.types.is_large_binary(typ))


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
    if source.image_column is not None:
        check_image_column(source, key, path, schema)
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
