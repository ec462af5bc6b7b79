"""The first video of each file of a video source, and whether its header makes a usable video:
what `msd validate` looks at before any job starts.

A WebDataset shard's first video is the first member named by ``video_exts`` (found in the
shard's index, read at its offset); a Parquet file's is the first video cell with bytes (its
video column read a few rows at a time, stopping there). Only the header is probed
(`msd.sources.video.probe`): nothing is decoded. A damaged video is data, as a loader takes it
(left out and counted), so it is a warning; a source none of whose files hold a video is a
recipe that names the wrong members or column, so it is an error.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats.base import store_of
from msd.sources.formats.parquet import ParquetReader
from msd.sources.image_rows import as_image_lists
from msd.sources.index import SourceIndex, tar_index
from msd.sources.storage import retrying
from msd.sources.video import VideoSpec, probe
from msd.sources.vision import DecodeFailure
from msd.sources.webdataset import read_member

ROWS_PER_READ = 8  # Parquet rows read at a time while looking for a file's first video


@dataclass(frozen=True)
class FirstVideo:
    """A file's first video: where it is (``"sample 'KEY', member 'KEY.mp4'"``, ``"row 12"``)
    and its bytes; ``data`` None where the file holds no video."""

    file: str
    where: str = ""
    data: bytes | None = None


def first_video_problems(
    source: Source, index: SourceIndex, key: str, spec: VideoSpec
) -> tuple[str, ...]:
    """One sentence for each file of ``source`` whose first video's header is not a usable
    video, or that holds no video; raises `SourceError` when no file holds one."""
    problems, holding = [], 0
    for first in first_videos(source, index):
        if first.data is None:
            problems.append(_holds_none(source, key, first.file))
            continue
        holding += 1
        header = probe(first.data, spec)
        if isinstance(header, DecodeFailure):
            problems.append(
                f"source '{source.name}' ({key}): '{first.file}' {first.where}: its first video "
                f"is not a usable video ({header.reason}); a job leaves such videos out and "
                "counts them"
            )
    if not holding:
        raise SourceError(_none_anywhere(source, key, index))
    return tuple(problems)


def first_videos(source: Source, index: SourceIndex) -> Iterator[FirstVideo]:
    """Each file's first video, in the index's file order."""
    store = store_of(source)
    read = _first_in_shard if source.data_format == "webdataset" else _first_in_parquet
    for path in index.files:
        yield retrying(functools.partial(read, source, path), path, store)


def _first_in_shard(source: Source, path: str) -> FirstVideo:
    exts = [e.strip(".").lower() for e in source.video_exts]
    for sample in tar_index(source, path).samples:
        for ext in exts:
            if ext in sample.members:
                offset, size = sample.members[ext]
                data = read_member(path, offset, size, store_of(source))
                where = f"sample '{sample.key}', member '{sample.key}.{ext}'"
                return FirstVideo(path, where, data)
    return FirstVideo(path)


def _first_in_parquet(source: Source, path: str) -> FirstVideo:
    assert source.video_column is not None  # a Parquet video source has one
    reader = ParquetReader(path, store_of(source))
    try:
        batches = reader.file.iter_batches(
            ROWS_PER_READ, columns=[source.video_column], use_threads=False
        )
        row = 0
        for batch in batches:
            found = _first_with_bytes(as_image_lists(batch.column(0)))
            if found is not None:
                at, data = found
                return FirstVideo(path, f"row {row + at}", data)
            row += batch.num_rows
    finally:
        reader.close()
    return FirstVideo(path)


def _first_with_bytes(lists: pa.ListArray) -> tuple[int, bytes] | None:
    """(row, bytes) of the first video with bytes in a batch of video lists, or None."""
    values = lists.flatten()
    if not len(values):
        return None
    first = pc.index(values.is_valid(), True).as_py()
    if first < 0:
        return None
    row = pc.list_parent_indices(lists)[first].as_py()
    data: bytes = values[first].as_py()
    return int(row), data


def _holds_none(source: Source, key: str, path: str) -> str:
    if source.data_format == "webdataset":
        exts = ", ".join(source.video_exts)
        return (
            f"source '{source.name}' ({key}.video_exts): '{path}' holds no member named by "
            f"video_exts ({exts}); its samples are read without videos"
        )
    return (
        f"source '{source.name}' ({key}.video_column): '{path}' holds no video in column "
        f"'{source.video_column}' (every cell is null or empty); its rows are read without videos"
    )


def _none_anywhere(source: Source, key: str, index: SourceIndex) -> str:
    where = f"the {len(index.files)} file(s) matching '{source.path}'"
    if source.data_format == "webdataset":
        exts = ", ".join(source.video_exts)
        held = sorted(
            {e for path in index.files for s in tar_index(source, path).samples for e in s.members}
        )
        return (
            f"source '{source.name}' ({key}.video_exts): none of {where} holds a member named by "
            f"video_exts ({exts}), only {', '.join(held) or 'no'} members; list the extensions "
            "of the videos' members, or remove video_exts"
        )
    return (
        f"source '{source.name}' ({key}.video_column): column '{source.video_column}' holds no "
        f"video in any of {where}; name a column that holds videos, or remove video_column"
    )
