"""The index of a source cut into clips: how many clips (samples) each stored row holds.

A source's samples must be known before anything is read (the epoch order shuffles them), so a
source with ``clip:`` reads each of its videos' headers once (`msd.sources.video.probe`: the
container's header and packet index, no frame decoded) and counts its clips
(`msd.sources.clips.clip_count`). A row with one video is as many samples as that video has
clips; a row with none, several, or a video whose header does not read is one sample, as
without ``clip`` (its damage is found and counted when it is decoded).

The counts of a file are cached (``$MSD_CACHE_DIR/clips``, else ``~/.cache/msd/clips``) under
the file's identity (path, size, modification time) and the clip rule, so the Planner, the
loaders and every restart read them from the cache, and a changed file is counted anew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
from collections.abc import Iterable
from pathlib import Path

import msgspec
import numpy as np

from msd.errors import SourceError
from msd.jobdir import atomic_write
from msd.recipe.schema import Source
from msd.sources.clips import ClipRule, clip_count
from msd.sources.formats.base import cache_dir, file_key
from msd.sources.image_rows import ImageRowReader
from msd.sources.index import RowGroup, SourceIndex
from msd.sources.read import RowGroupReader, Unavailable
from msd.sources.storage import retrying
from msd.sources.video import probe
from msd.sources.vision import DecodeFailure

log = logging.getLogger(__name__)

CACHE_VERSION = 1


class _Cached(msgspec.Struct, frozen=True):
    version: int
    counts: list[list[int]]  # per row group of the file, per stored row


def clips_of(videos: list[bytes | None] | None, rule: ClipRule) -> int:
    """The samples a stored row with these videos is: its video's clips when it has exactly
    one whose header reads, else 1."""
    if not videos or len(videos) != 1 or not videos[0]:
        return 1
    header = probe(bytes(videos[0]))
    return 1 if isinstance(header, DecodeFailure) else clip_count(header, rule)


def clipped(index: SourceIndex, source: Source, key: str) -> SourceIndex:
    """``index`` with each row group's ``num_rows`` counting samples (clips), not stored rows."""
    assert source.clip is not None
    rule = ClipRule(source.clip.length_s, source.clip.stride)
    reader = ImageRowReader(source, index, RowGroupReader())
    counts: list[np.ndarray] = []
    try:
        for file, of_file in itertools.groupby(index.row_groups, key=lambda rg: rg.file):
            counts += _file_counts(reader, source, key, file, list(of_file), rule)
    finally:
        reader.close()
    cut = tuple(
        dataclasses.replace(rg, num_rows=int(c.sum()), stored_rows=rg.rows_stored)
        for rg, c in zip(index.row_groups, counts, strict=True)
    )
    starts = tuple(itertools.accumulate((g.num_rows for g in cut), initial=0))
    return dataclasses.replace(
        index,
        row_groups=cut,
        row_starts=starts[:-1],
        num_rows=starts[-1],
        clips=tuple(counts),
    )


def _file_counts(
    reader: ImageRowReader,
    source: Source,
    key: str,
    file: str,
    groups: list[RowGroup],
    rule: ClipRule,
) -> list[np.ndarray]:
    """The clips of each stored row of each of ``groups`` (all of one file): cached, else read."""
    store = groups[0].store
    cache = _cache_path(source, file, rule, retrying(lambda: file_key(file, store), file, store))
    found = _load(cache, groups)
    if found is not None:
        return found
    counts = [
        np.array([clips_of(v, rule) for v in _videos(reader, key, rg)], dtype=np.int32)
        for rg in groups
    ]
    _save(cache, counts)
    return counts


def _videos(reader: ImageRowReader, key: str, rg: RowGroup) -> Iterable[list[bytes | None]]:
    try:
        return retrying(lambda: reader.videos(rg), rg.file, rg.store)
    except Unavailable as exc:
        raise SourceError(
            f"{key}.clip: cannot read the videos of '{rg.file}' to count their clips "
            f"({exc.reason}); try again when the store answers"
        ) from exc


def _cache_path(source: Source, file: str, rule: ClipRule, identity: str) -> Path:
    """Where a file's counts are cached: its identity, the rule, and which videos are read."""
    what = f"{identity}\0{rule.length_s!r}\0{rule.stride_s!r}\0{source.video_column}"
    what += "\0" + ",".join(source.video_exts)
    digest = hashlib.blake2b(what.encode("utf-8", "surrogateescape"), digest_size=16)
    return cache_dir("clips") / f"{Path(file).name}.{digest.hexdigest()}.json"


def _load(cache: Path, groups: list[RowGroup]) -> list[np.ndarray] | None:
    """The cached counts, if ``cache`` holds a valid set for these row groups."""
    try:
        cached = msgspec.json.decode(cache.read_bytes(), type=_Cached)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.info("counting clips again: the cache '%s' is damaged (%s)", cache, exc)
        return None
    rows = [rg.rows_stored for rg in groups]
    if cached.version != CACHE_VERSION or [len(c) for c in cached.counts] != rows:
        log.info("counting clips again: the cache '%s' is stale", cache)
        return None
    if any(n < 1 for c in cached.counts for n in c):
        log.info("counting clips again: the cache '%s' holds a count under 1", cache)
        return None
    return [np.array(c, dtype=np.int32) for c in cached.counts]


def _save(cache: Path, counts: list[np.ndarray]) -> None:
    text = json.dumps(
        msgspec.to_builtins(_Cached(CACHE_VERSION, [c.tolist() for c in counts])),
        separators=(",", ":"),
    )
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, text.encode("utf-8"), durable=False)
    except OSError as exc:
        log.warning("cannot cache clip counts in '%s' (%s); they will be counted again", cache, exc)
