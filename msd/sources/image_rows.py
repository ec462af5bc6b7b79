"""Image-text (and video-text) sources: their index (WebDataset shards or Parquet with an image
or video column) and their rows, read as one Arrow struct per sample: ``text`` (binary, null
when missing), ``images`` and ``videos`` (lists of binary, an element null when its bytes are
missing) and ``clip`` (which clip of its video the sample is, 0 unless the source is cut into
clips: then a stored row is as many samples as its video has clips, ``msd.sources.clip_index``).

A WebDataset shard is one "row group" of the source's index: its samples in the tar's order,
found by scanning member headers once (then cached, ``MSD_CACHE_DIR`` or
``~/.cache/msd/webdataset``); the rows asked for are read at their members' offsets, from one
open shard, a run of members close together at once (for a remote shard, one ranged GET per
run of consecutive samples). A Parquet image source reads the text and image columns of a row
group.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources import storage
from msd.sources.formats.base import bytes_field
from msd.sources.index import RowGroup, SourceIndex, tar_index, text_ext
from msd.sources.read import RowGroupReader, Unavailable
from msd.sources.webdataset import OpenShards, TarIndex

_BYTES_LIST = pa.list_(pa.large_binary())
ROW_TYPE = pa.struct(
    [
        ("text", pa.large_binary()),
        ("images", _BYTES_LIST),
        ("videos", _BYTES_LIST),
        ("clip", pa.int32()),
    ]
)
MAX_CACHED_TARS = 16


class ImageRowReader:
    """Reads samples of an image source as `ROW_TYPE` structs (see the module docstring)."""

    def __init__(self, source: Source, src: SourceIndex, reader: RowGroupReader) -> None:
        self.source, self.src, self.reader = source, src, reader
        self._tars: OrderedDict[str, TarIndex] = OrderedDict()
        self._shards = OpenShards()  # remote shards stay open between reads
        self._clips: dict[tuple[str, int], np.ndarray] = {}
        if src.clips is not None:
            for rg, counts in zip(src.row_groups, src.clips, strict=True):
                self._clips[(rg.file, rg.index)] = np.concatenate(
                    ([0], np.cumsum(counts, dtype=np.int64))
                )

    def close(self) -> None:
        """Close the remote shards kept open (the reader stays usable)."""
        self._shards.close()

    def sizes(self, rg: RowGroup) -> np.ndarray | None:
        """Bytes of each sample of a shard, from its index (None: a Parquet row group, whose
        sizes are known once read; a Parquet source cut into clips reads them here, so that
        its samples are read a few at a time, as a shard's are)."""
        starts = self._clips.get((rg.file, rg.index))
        if self.src.format != "webdataset":
            if starts is None:
                return None
            return np.repeat(row_sizes(self._read_stored(rg, None)), np.diff(starts))
        index = self._tar(rg.file)
        stored = np.array(
            [sum(size for _, size in s.members.values()) for s in index.samples], dtype=np.int64
        )
        return stored if starts is None else np.repeat(stored, np.diff(starts))

    def read(self, rg: RowGroup, rows: np.ndarray | None = None) -> pa.StructArray:
        """Samples ``rows`` (all when None) of row group ``rg``, in that order."""
        starts = self._clips.get((rg.file, rg.index))
        if starts is None:
            return self._read_stored(rg, rows)
        samples = np.arange(rg.num_rows) if rows is None else np.asarray(rows, dtype=np.int64)
        stored = np.searchsorted(starts, samples, side="right") - 1
        # Each stored row read once, however many of its clips are asked for.
        once, back = np.unique(stored, return_inverse=True)
        table = self._read_stored(rg, once).take(pa.array(back.reshape(-1)))
        clip = pa.array((samples - starts[stored]).astype(np.int32))
        return rows_of(table.field("text"), table.field("images"), table.field("videos"), clip)

    def videos(self, rg: RowGroup) -> list[list[bytes | None]]:
        """The videos of each stored row of ``rg`` (what counting its clips reads)."""
        videos: list[list[bytes | None]] = (
            self._read_stored(rg, None, text=False).field("videos").to_pylist()
        )
        return videos

    def _read_stored(
        self, rg: RowGroup, rows: np.ndarray | None, text: bool = True
    ) -> pa.StructArray:
        """Stored rows ``rows`` (all when None) of ``rg``, in that order (``text``: False, only
        their videos are read)."""
        if self.src.format == "webdataset":
            return self._read_tar(rg, rows, text)
        n = rg.rows_stored
        column = self.reader.read(rg, self.src.column) if text else pa.nulls(n)
        images, videos = (
            None if c is None else as_image_lists(self.reader.read(rg, c))
            for c in (self.source.image_column if text else None, self.source.video_column)
        )
        table = rows_of(_as_text(column), images, videos)
        return table if rows is None else table.take(pa.array(rows))

    def _tar(self, path: str) -> TarIndex:
        index = self._tars.get(path)
        if index is None:
            try:
                index = tar_index(self.source, path)
            except SourceError as exc:  # a store that failed to say whether it changed
                cause = exc.__cause__
                if isinstance(cause, storage.StoreError) and cause.transient:
                    raise Unavailable(path, str(cause)) from exc
                raise
            self._tars[path] = index
            while len(self._tars) > MAX_CACHED_TARS:
                self._tars.popitem(last=False)
        self._tars.move_to_end(path)
        return index

    def _read_tar(self, rg: RowGroup, rows: np.ndarray | None, text: bool = True) -> pa.StructArray:
        index = self._tar(rg.file)
        if len(index.samples) != rg.rows_stored:
            raise SourceError(
                f"the WebDataset shard '{rg.file}' holds {len(index.samples):,} samples, not the "
                f"{rg.rows_stored:,} it held when the source was indexed; it was changed after "
                "the job started: restore it, or start a new job"
            )
        wanted = range(len(index.samples)) if rows is None else rows.tolist()
        ext = text_ext(self.source) if text else None
        exts = [e.strip(".").lower() for e in self.source.image_exts] if text else []
        video_exts = [e.strip(".").lower() for e in self.source.video_exts]
        where: list[tuple[int, int]] = []  # every member to read, row by row
        layout: list[tuple[bool, int, int]] = []  # of each row: has it a text, images, videos
        for r in wanted:
            members = index.samples[r].members
            member = None if ext is None else members.get(ext)
            found = [members[e] for e in exts if e in members]
            clips = [members[e] for e in video_exts if e in members]
            where += ([] if member is None else [member]) + found + clips
            layout.append((member is not None, len(found), len(clips)))
        data = iter(self._read_members(rg, where))
        texts: list[bytes | None] = []
        images: list[list[bytes]] = []
        videos: list[list[bytes]] = []
        for has_text, count, clips_count in layout:
            texts.append(next(data) if has_text else None)
            images.append([next(data) for _ in range(count)])
            videos.append([next(data) for _ in range(clips_count)])
        return rows_of(
            pa.array(texts, pa.large_binary()),
            pa.array(images, _BYTES_LIST),
            pa.array(videos, _BYTES_LIST),
        )

    def _read_members(self, rg: RowGroup, where: list[tuple[int, int]]) -> list[bytes]:
        """The members ``where`` of a shard; an object store's failure as the loader takes it:
        `Unavailable` when a retry may succeed, else a `SourceError` naming the shard."""
        if not where:
            return []
        try:
            return self._shards.read(rg.file, where, rg.store)
        except storage.StoreError as exc:
            if exc.transient:
                raise Unavailable(rg.file, str(exc)) from exc
            raise SourceError(f"cannot read the WebDataset shard '{rg.file}': {exc}") from exc


def row_sizes(rows: pa.StructArray) -> np.ndarray:
    """Bytes of each sample: its text, its images and its videos."""
    text = pc.fill_null(pc.binary_length(rows.field("text")), 0)
    sizes = np.array(text.to_numpy(zero_copy_only=False), dtype=np.int64)
    for name in ("images", "videos"):
        lists = rows.field(name)
        flat = pc.fill_null(pc.binary_length(lists.flatten()), 0).to_numpy(zero_copy_only=False)
        owner = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        sizes += np.bincount(owner, flat.astype(np.float64), minlength=len(rows)).astype(np.int64)
    return sizes


def _as_text(column: pa.Array) -> pa.Array:
    """A text column as ``large_binary``; a column of conversations (lists of messages) as the
    JSON of each (what ``msd.sources.chat`` reads)."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        cells = [None if c is None else msgspec.json.encode(c) for c in column.to_pylist()]
        return pa.array(cells, pa.large_binary())
    return column.cast(pa.large_binary())


def rows_of(
    text: pa.Array,
    images: pa.Array | None,
    videos: pa.Array | None = None,
    clip: pa.Array | None = None,
) -> pa.StructArray:
    """Rows of `ROW_TYPE` from a ``large_binary`` text column, ``list<large_binary>`` image
    and video columns (None: no images, or videos, in any row) and an int32 clip column (None:
    each row its video's first clip, or its videos whole)."""
    n = len(text)
    return pa.StructArray.from_arrays(
        [
            text,
            _none(n) if images is None else images,
            _none(n) if videos is None else videos,
            pa.array(np.zeros(n, dtype=np.int32)) if clip is None else clip,
        ],
        fields=list(ROW_TYPE),
    )


def _none(n: int) -> pa.Array:
    """``n`` empty lists: a Parquet source without an image (or video) column."""
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.large_binary())
    )


def as_image_lists(column: pa.Array) -> pa.Array:
    """An image column as ``list<large_binary>``: a single image becomes a list of one (a null
    cell a list of one null: an image without bytes), a struct its ``bytes``."""
    typ = column.type
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        values = _image_bytes(column.flatten())
        offsets = pc.fill_null(column.value_lengths(), 0).to_numpy(zero_copy_only=False)
        bounds = np.concatenate(([0], np.cumsum(offsets, dtype=np.int64))).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(bounds), values)
    values = _image_bytes(column)
    bounds = pa.array(np.arange(len(column) + 1, dtype=np.int32))
    return pa.ListArray.from_arrays(bounds, values)


def _image_bytes(values: pa.Array) -> pa.Array:
    if pa.types.is_struct(values.type):
        name = bytes_field(values.type)
        assert name is not None
        values = pc.struct_field(values, name)  # null where the struct or its bytes are null
    return values.cast(pa.large_binary())


def read_block(
    reader: ImageRowReader, groups: tuple[RowGroup, ...], rows: np.ndarray
) -> pa.StructArray:
    """Rows ``rows`` (block-local, in that order) of the block made of ``groups``, reading only
    those rows of a WebDataset shard."""
    starts = np.cumsum([0] + [g.num_rows for g in groups])
    owner = np.searchsorted(starts, rows, side="right") - 1
    parts, order = [], np.empty(len(rows), dtype=np.int64)
    done = 0
    for g in np.unique(owner).tolist():
        picked = np.flatnonzero(owner == g)
        parts.append(reader.read(groups[g], rows[picked] - starts[g]))
        order[picked] = np.arange(done, done + len(picked))
        done += len(picked)
    if not parts:
        return pa.array([], ROW_TYPE)
    joined = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
    return joined.take(pa.array(order))
