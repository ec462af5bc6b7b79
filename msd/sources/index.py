"""The index of one source: which files and row groups it holds, in its format
(``msd.sources.formats``), read from metadata only.

Opening a source never reads data pages, so the Planner can index terabytes in seconds; every
problem a user can fix (bad glob, wrong column, wrong type) is reported here, before any
process is started, as one `SourceError` sentence naming the source, recipe key and file.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats import FORMATS
from msd.sources.formats.base import ColumnKind, check_cache, glob_files, store_of
from msd.sources.formats.base import cache_dir as format_cache_dir
from msd.sources.storage import LOCAL, Store, retrying
from msd.sources.webdataset import TarIndex, load_or_build_index

DEFAULT_TEXT_EXT = "txt"  # a WebDataset sample's text member, unless text_column names another


@dataclass(frozen=True)
class RowGroup:
    """One row group of a file (``msd.sources.formats.base``): the unit a Source Loader reads."""

    file: str
    index: int
    num_rows: int
    format: str = "parquet"
    kind: ColumnKind = "text"  # of the source's column
    store: Store = LOCAL  # where a URL ``file`` is read from
    group_rows: int | None = None  # the source's (Source.group_rows)
    # Rows the file holds in it, where they differ from its samples (a source cut into clips).
    stored_rows: int | None = None

    @property
    def rows_stored(self) -> int:
        """Rows of the file in this row group (``num_rows`` counts its samples)."""
        return self.num_rows if self.stored_rows is None else self.stored_rows


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
    video_column: str | None = None
    # Of a source cut into clips: each row group's clips per stored row (msd.sources.clip_index).
    clips: tuple[np.ndarray, ...] | None = field(default=None, compare=False)

    @property
    def has_images(self) -> bool:
        """Its rows are text with images or videos (``msd.sources.image_rows``)."""
        return (
            self.format == "webdataset"
            or self.image_column is not None
            or self.video_column is not None
        )


def source_key(name: str) -> int:
    """A stable unsigned 64-bit key of a source name; Python's hash() is salted per process."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def open_source(source: Source, key: str) -> SourceIndex:
    """Index ``source`` from its files' metadata (Parquet footers, WebDataset shard headers,
    Megatron ``.idx``; JSONL line indexes, built once and cached); ``key`` is its recipe path,
    e.g. ``sources[1]``. A source cut into clips counts each video's clips from its header
    (read once, then cached), so that its samples are known before any frame is decoded."""
    check_cache(source, key)
    index = _open(source, key)
    if source.clip is None:
        return index
    # Imported here: counting clips reads rows (msd.sources.image_rows reads through this index).
    from msd.sources.clip_index import clipped

    return clipped(index, source, key)


def _open(source: Source, key: str) -> SourceIndex:
    if source.data_format == "webdataset":
        return _open_webdataset(source, key)
    fmt = FORMATS[source.data_format]
    column, kind = _column(source, key)
    store = store_of(source)
    files = retrying(lambda: _files(source, key), source.path, store)
    groups: list[RowGroup] = []
    problems: list[str] = []
    # an image-only (video-only) row is a sample too
    holds_text = source.image_column is not None or source.video_column is not None
    for path in files:
        found = retrying(functools.partial(fmt.index, source, key, path, column, kind), path, store)
        groups += [
            RowGroup(path, i, n, fmt.name, kind, store_of(source), source.group_rows)
            for i, n in enumerate(found.group_rows)
        ]
        problems += [f"{path}: {p}" for p in found.problems]
        holds_text = holds_text or found.holds_text
    starts = tuple(itertools.accumulate((g.num_rows for g in groups), initial=0))
    if starts[-1] == 0:
        raise SourceError(
            f"source '{source.name}' ({key}.path): the {len(files)} file(s) matching "
            f"'{source.path}' hold no rows; point the path at non-empty data"
        )
    if not holds_text:
        where = f"the {len(files)} file(s) matching '{source.path}'"
        if source.data_format == "megatron":
            raise SourceError(
                f"source '{source.name}' ({key}.path): all {starts[-1]:,} documents of {where} "
                "are empty; point the path at a dataset that holds tokens, or remove the source"
            )
        raise SourceError(
            f"source '{source.name}' ({key}.text_column): column '{column}' is null or empty "
            f"in all {starts[-1]:,} rows of {where}; name a column that holds text, or remove "
            "the source"
        )
    return SourceIndex(
        name=source.name,
        column=column,
        column_kind=kind,
        files=files,
        row_groups=tuple(groups),
        row_starts=starts[:-1],
        num_rows=starts[-1],
        format=fmt.name,
        image_column=source.image_column,
        problems=tuple(problems),
        video_column=source.video_column,
    )


def _files(source: Source, key: str) -> tuple[str, ...]:
    """The files the job recorded when it started (``Source.files``), else those the path names
    now; of a Megatron dataset the ``.idx`` files (each ``.bin`` is found beside them)."""
    if not source.files:
        return FORMATS[source.data_format].files(source, key)
    paths = tuple(f.path for f in source.files)
    return (
        tuple(p for p in paths if p.endswith(".idx")) if source.data_format == "megatron" else paths
    )


def _open_webdataset(source: Source, key: str) -> SourceIndex:
    files = retrying(lambda: glob_files(source, key), source.path, store_of(source))
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
    return format_cache_dir("webdataset")


def text_ext(source: Source) -> str:
    return (source.text_column or DEFAULT_TEXT_EXT).lower()


def tar_index(source: Source, path: str) -> TarIndex:
    return load_or_build_index(path, cache_dir(), (text_ext(source),), store=store_of(source))


def webdataset_groups(
    source: Source, key: str, files: tuple[str, ...]
) -> tuple[list[RowGroup], list[str]]:
    """One row group per shard (its samples), and the problems the shards' indexes found."""
    groups, problems = [], []
    for path in files:
        index = retrying(functools.partial(tar_index, source, path), path, store_of(source))
        problems += [f"{path}: {p}" for p in index.problems]
        problems += [f"{path}: {s.key}: {p}" for s in index.samples for p in s.problems]
        if index.samples:
            groups.append(RowGroup(path, 0, len(index.samples), store=store_of(source)))
    if not groups:
        raise SourceError(
            f"source '{source.name}' ({key}.path): the {len(files)} WebDataset shard(s) matching "
            f"'{source.path}' hold no samples; point the path at non-empty .tar files"
        )
    return groups, problems


def _column(source: Source, key: str) -> tuple[str, ColumnKind]:
    if source.data_format == "megatron":
        return "tokens", "tokens"  # the documents' token ids: no column to name
    # The recipe loader checks this too; a Source built in code bypasses it.
    if (source.text_column is None) == (source.token_column is None):
        raise SourceError(
            f"source '{source.name}' ({key}): set exactly one of text_column and token_column"
        )
    if source.text_column is not None:
        return source.text_column, "text" if source.chat is None else "chat"
    assert source.token_column is not None
    return source.token_column, "tokens"
