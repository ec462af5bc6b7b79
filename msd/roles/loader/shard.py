"""A loader's socket-free core: one shard of a source, read in visiting order, tokenized a
chunk at a time, holding what it reported until it is routed (``SourceShard``).

Memory is bounded per source, not per rank: a shard reads ahead only while it holds fewer
unrouted tokens than its share of ``buffer_tokens`` (the source's largest share of the mix)
and, for an image source, fewer bytes of images than its share of ``buffer_bytes`` (a sample's
images are held as their bytes, planned from their headers, and decoded when it is routed),
or up to a position the Planner waits for; and of a block's text it keeps only the rows not yet
tokenized next (``Visit``): a window of about 256 KiB, not a row group, per source.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import numpy as np
import pyarrow as pa

from msd.plan.order import EpochOrder, make_blocks
from msd.plan.partition import Shard
from msd.plan.schedule import peak_shares, schedule_of
from msd.recipe.schema import Recipe
from msd.roles.loader.outage import Outage
from msd.roles.loader.visit import Visit, cell_sizes, window_bytes
from msd.sources.chat_rows import ChatRows, tokenize_of
from msd.sources.fuse import Fuser, Held, fuse_spec
from msd.sources.image_rows import ImageRowReader, read_block, row_sizes
from msd.sources.index import RowGroup, SourceIndex, open_source, source_key
from msd.sources.read import RowGroupReader
from msd.sources.storage import is_remote
from msd.wire import compact
from msd.wire.protocol import (
    Meta,
    SourceLoad,
)

log = logging.getLogger(__name__)

# Text bytes tokenized per loop turn, at most: large enough that per-message costs stay small.
CHUNK_BYTES = 64 * 1024
# ... and fewer with a slow tokenizer: a turn takes about this long, so Routes (the payloads
# trainers wait for) are answered within milliseconds whatever the tokenizer costs.
CHUNK_SECONDS = 0.005
# Open Parquet files a loader process keeps (an LRU shared by its shards).
MAX_OPEN_FILES = 64


def _flat_spans(trained: list[np.ndarray | None]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Samples' trained spans as a message carries them: a count each, the bounds back to
    back (both empty for samples of a source that trains every token)."""
    if not trained:
        return (), ()
    own = [np.zeros((0, 2), np.int64) if t is None else t for t in trained]
    return tuple(len(t) for t in own), tuple(int(b) for t in own for b in t.reshape(-1))


def _held_cost(tokens: np.ndarray) -> int:
    """What a held sample counts against the read-ahead: its tokens, and at least 1, so that
    samples holding none (null or empty text) still fill it and reading stops."""
    return max(1, len(tokens))


def packed(tokens: list[np.ndarray]) -> list[np.ndarray]:
    """A chunk's samples as views of one buffer of the narrowest of uint8, uint16 and int32
    that holds their ids: held tokens cost a byte each with the ``bytes`` transform, two with
    most vocabularies (the payload narrows them the same way whatever they are held in)."""
    flat = np.concatenate(tokens) if tokens else np.empty(0, np.int32)
    if flat.size and int(flat.min()) >= 0:
        high = int(flat.max())
        flat = flat.astype(np.uint8 if high <= 0xFF else np.uint16) if high <= 0xFFFF else flat
    ends = np.cumsum([len(t) for t in tokens]).tolist()
    return [flat[start:end] for start, end in zip([0, *ends][: len(ends)], ends, strict=True)]


def token_buffer(tokens: list[np.ndarray]) -> np.ndarray:
    """The tokens of routed samples back to back, as they travel: in the narrowest type that
    holds them (``compact.narrowed``, whatever type they were held in); none, as int32."""
    buffer = np.concatenate(tokens) if tokens else np.empty(0, np.int32)
    return compact.narrowed(buffer) if buffer.size else np.empty(0, np.int32)


_peaks: list[tuple[Recipe, tuple[float, ...]]] = []  # the last recipe's, computed once


def peak_share(recipe: Recipe, source: int) -> float:
    """``source``'s largest share of the mix: worked out once for all of a recipe's sources (a
    loader serving thousands asks once for each, and each answer looks at every source)."""
    if not _peaks or _peaks[0][0] is not recipe:
        _peaks[:] = [(recipe, peak_shares(schedule_of(recipe)))]
    return _peaks[0][1][source]


def shard_budget(recipe: Recipe, source: int, loaders: int) -> int:
    """Unrouted tokens one of ``loaders`` shards of ``source`` may hold: the read-ahead shared
    out by the source's largest share of the mix, over its shards; at least one row."""
    peak = peak_share(recipe, source)
    return max(recipe.seq_len, int(recipe.loader_buffer_tokens * peak / loaders))


def shard_bytes(recipe: Recipe, source: int, loaders: int) -> int:
    """Bytes of images one of ``loaders`` shards of ``source`` may hold unrouted:
    ``buffer_bytes`` shared out like the tokens (a shard holding nothing still reads: at least
    one sample is held whatever the share)."""
    peak = peak_share(recipe, source)
    return max(1, int(recipe.loader_buffer_bytes * peak / loaders))


class SourceShard:
    """One shard of one source: its visits, the tokens it holds, and how far it may read.

    It reads visits ``start + index``, every ``stride``-th after, before ``stop`` (``start``
    None: its generation waits for the Planner to say where it begins; ``stop`` None: until the
    source ends). ``frozen``: the Planner is cutting a new generation in; open nothing new.
    """

    def __init__(
        self,
        recipe: Recipe,
        shard: Shard,
        reader: RowGroupReader,
        span: tuple[int | None, int | None, int],
    ) -> None:
        self.recipe, self.source, self.index = recipe, shard.source, shard.index
        self.generation = shard.generation
        spec = recipe.sources[shard.source]
        self.src: SourceIndex = open_source(spec, f"sources[{shard.source}]")
        self.blocks = make_blocks(
            [rg.num_rows for rg in self.src.row_groups], recipe.loader.block_row_groups
        )
        self.key = source_key(spec.name)
        self.tokenize = tokenize_of(spec, self.src.column_kind)
        self.chat = self.tokenize if isinstance(self.tokenize, ChatRows) else None
        self.images: ImageRowReader | None = None
        self.fuser: Fuser | None = None
        if self.src.has_images:
            self.images = ImageRowReader(spec, self.src, reader)
            fusing = fuse_spec(recipe, spec.has_videos, spec.clip)
            require_text = self.src.format == "webdataset"
            self.fuser = Fuser.of_source(
                spec, self.src.column_kind, fusing, require_text, defer=True
            )
        # of held samples that have images: as bytes until routed, where that is smaller
        self.pixels: dict[int, Held] = {}
        # of held conversations: the [start, end) spans of their tokens the loss is taken on
        self.trained: dict[int, np.ndarray] = {}
        start, self.stop, self.stride = span
        self.next_v = None if start is None else start + self.index
        self.frozen = False
        self.skip_below = 0  # positions before it were placed before the step the job resumed at
        self.reader = reader
        self.mix_budget = shard_budget(recipe, shard.source, self.stride)
        self.mix_bytes = shard_bytes(recipe, shard.source, self.stride)
        self.window_bytes = window_bytes(self.mix_budget)
        self.block_rows = max(b.num_rows for b in self.blocks)
        self._order: EpochOrder | None = None
        self.visit: Visit | None = None
        self.want = -1
        self.held: dict[int, np.ndarray] = {}
        self.held_tokens = 0
        self.held_bytes = 0  # of images (patches, or bytes not decoded yet)
        self.bytes_read = 0
        self.filling = True
        self.samples_read = 0
        self.tokens_read = 0
        self.busy_s = 0.0
        self.retries = 0  # reads an object store failed that were tried again
        self.outage: Outage | None = None  # the store is failing reads now
        self.chunk_bytes = 4096  # then CHUNK_SECONDS of tokenizing, up to CHUNK_BYTES

    @property
    def upcoming(self) -> tuple[EpochOrder, int] | None:
        """The next visit to open: (its epoch's order, its index in the epoch)."""
        v = self.next_v
        if v is None or self.frozen or (self.stop is not None and v >= self.stop):
            return None
        epoch, k = divmod(v, len(self.blocks))
        if epoch > 0 and not self.recipe.sources[self.source].repeat:
            return None
        if self._order is None or self._order.epoch != epoch:
            self._order = EpochOrder(self.blocks, self.recipe.seed, self.key, epoch)
        return self._order, k

    def resume_at(self, gpos: int) -> None:
        """Read nothing before position ``gpos``: skip the visits that end before it and, in the
        one holding it, the rows before it."""
        self.skip_below = gpos
        num_rows = self.src.num_rows
        epoch, pos = divmod(gpos, num_rows)
        k = EpochOrder(self.blocks, self.recipe.seed, self.key, epoch).visit_of(pos)
        first = epoch * len(self.blocks) + k
        if self.next_v is not None:
            while self.next_v < first:
                self.next_v += self.stride

    def begin(self, start: int) -> None:
        """The Planner decided where this shard's generation begins."""
        self.next_v = start + self.index

    def cut(self) -> int:
        """Open no new visit until ``end_at``; the first visit not opened yet."""
        self.frozen = True
        assert self.next_v is not None
        return self.next_v

    def end_at(self, stop: int) -> None:
        """A new generation reads from visit ``stop`` on; this one finishes what lies before."""
        self.stop, self.frozen = stop, False

    @property
    def retired(self) -> bool:
        """Replaced by a newer generation, and nothing left to read or hold."""
        return (
            self.stop is not None
            and self.upcoming is None
            and not self.frozen
            and self.visit is None
            and not self.held
        )

    def next_gpos(self) -> int | None:
        if self.visit is not None:
            return self.visit.gpos_start + self.visit.at
        upcoming = self.upcoming
        if upcoming is None:
            return None
        order, k = upcoming
        return order.epoch * order.num_rows + int(order.block_starts[k])

    @property
    def waited_for(self) -> bool:
        """The Planner waits for a position this shard has not read yet."""
        position = self.next_gpos()
        return position is not None and position <= self.want

    @property
    def budget(self) -> int:
        """Tokens this shard may hold unrouted: its share of the read-ahead; and, when it has
        sibling shards, two blocks' worth: the trainers consume a source visit by visit, so
        each shard must hold the visit being consumed and read its next one whole while the
        others' visits are consumed, or the source is only ever as fast as one loader."""
        if self.stride == 1 or not self.samples_read:
            return self.mix_budget
        block_tokens = int(self.block_rows * self.tokens_read / self.samples_read)
        return max(self.mix_budget, 2 * block_tokens)

    @property
    def byte_budget(self) -> int:
        """Bytes of patches this shard may hold unrouted: like ``budget``, its share of the
        read-ahead, or two blocks' worth when it has sibling shards."""
        if self.stride == 1 or not self.samples_read:
            return self.mix_bytes
        return max(self.mix_bytes, 2 * int(self.block_rows * self.bytes_read / self.samples_read))

    @property
    def fill(self) -> float:
        """How full the read-ahead is (the emptiest hungry shard reads first)."""
        if self.fuser is None:
            return self.held_tokens / self.budget
        return max(self.held_tokens / self.budget, self.held_bytes / self.byte_budget)

    @property
    def hungry(self) -> bool:
        """Reading ahead: from below half the budget up to all of it (so a shard reads in
        chunks, not a sample each time one is routed)."""
        fill = self.fill
        if fill >= 1 or self.next_gpos() is None:
            self.filling = False
        elif 2 * fill < 1:
            self.filling = True
        return self.filling

    def read_next(self) -> Meta | None:
        """Tokenize the next chunk of the current block (opening the next block when needed);
        the lengths to report to the Planner."""
        if self.visit is None:
            self.visit = self._open_visit()
            if self.visit is None:
                return None
        visit = self.visit
        room = self.chunk_bytes if self.waited_for else self.budget - self.held_tokens
        start, rows, text = visit.next_chunk(min(self.chunk_bytes, room))
        started = time.perf_counter()
        pixels: list[Held | None] = []
        if self.fuser is not None:
            tokens, pixels = self.fuser(text)
        else:
            tokens = self.tokenize(text)
        per_byte = (time.perf_counter() - started) / max(
            1, int(visit.sizes[start : start + len(tokens)].sum())
        )
        self.chunk_bytes = int(min(CHUNK_BYTES, max(1, CHUNK_SECONDS / max(per_byte, 1e-12))))
        gpos_start = visit.gpos_start + start
        if visit.done:
            self.visit = None
        for offset, t in enumerate(packed(tokens)):
            self.held[gpos_start + offset] = t
            self.held_tokens += _held_cost(t)
            self.tokens_read += len(t)
        trained = self._trained_of_last()
        for offset, spans in enumerate(trained):
            if spans is not None:
                self.trained[gpos_start + offset] = spans
        self.samples_read += len(tokens)
        images: tuple[int, ...] = ()
        patches: tuple[int, ...] = ()
        skipped: tuple[int, ...] = ()
        image_rows: tuple[int, ...] = ()
        frames: tuple[int, ...] = ()
        if self.fuser is not None:
            for offset, p in enumerate(pixels):
                if p is not None:
                    self.pixels[gpos_start + offset] = p
                    self.held_bytes += p.nbytes
                    self.bytes_read += p.nbytes
            images = tuple(0 if p is None else len(p.grids) for p in pixels)
            patches = tuple(n for p in pixels if p is not None for n in p.counts)
            skipped = tuple(self.fuser.skipped_per_sample)
            image_rows = tuple(
                r
                for t, p in zip(tokens, pixels, strict=True)
                if p is not None
                for r in self._image_rows(t, p)
            )
            if any(p is not None and any(p.videos) for p in pixels):
                frames = tuple(t for p in pixels if p is not None for t, _, _ in p.grids)
        counts, bounds = _flat_spans(trained)
        return Meta(
            source=self.source,
            gpos_start=gpos_start,
            lengths=tuple(len(t) for t in tokens),
            sample_ids=tuple(visit.first_row + int(r) for r in rows),
            images=images,
            patches=patches,
            skipped=skipped,
            image_rows=image_rows,
            frames=frames,
            trained=counts,
            spans=bounds,
        )

    def _trained_of_last(self) -> list[np.ndarray | None]:
        """The trained spans of the samples the last chunk gave (conversations: None where the
        loss is taken on every token)."""
        if self.fuser is not None and self.fuser.chat is not None:
            return self.fuser.trained
        if self.chat is not None:
            return list(self.chat.trained)
        return []

    def write_images(self, gpos: int, out: np.ndarray) -> None:
        """Write a held sample's patches into ``out`` (its rows of a payload's buffer),
        decoding them now if they are held as bytes."""
        images = self.pixels[gpos]
        assert self.fuser is not None
        started = time.perf_counter()
        self.fuser.decoded(images, out)
        self.busy_s += time.perf_counter() - started

    def _image_rows(self, tokens: np.ndarray, images: Held) -> list[int]:
        """The piece each image lies in once the Planner cuts the sample into rows."""
        seq_len, vision = self.recipe.seq_len, self.recipe.vision
        if len(tokens) <= seq_len:
            return [0] * len(images.grids)
        video = self.recipe.video.video_token_id
        starts = images.starts(tokens, vision.image_token_id, vision.merge_size, video)
        return [int(r) for r in starts // seq_len]

    def load(self) -> SourceLoad:
        return SourceLoad(
            self.source,
            self.samples_read,
            self.tokens_read,
            len(self.held),
            self.held_tokens,
            errors=self.retries,
            busy_s=self.busy_s,
            images_read=0 if self.fuser is None else self.fuser.images_read,
            skipped=tuple(sorted(self._skips().items())),
            videos_read=0 if self.fuser is None else self.fuser.videos_read,
            video_s=0.0 if self.fuser is None else self.fuser.video_cost.seconds,
            video_cpu_s=0.0 if self.fuser is None else self.fuser.video_cost.cpu_s,
        )

    def _skips(self) -> Counter[str]:
        """What was left out as it was read, by reason: images, videos, conversations."""
        found: Counter[str] = Counter()
        for counts in (self.fuser.skips if self.fuser else None, self.chat and self.chat.skips):
            found.update(counts or {})
        return found

    def forget(self, gpos: int) -> None:
        self.held_tokens -= _held_cost(self.held.pop(gpos))
        self.trained.pop(gpos, None)
        images = self.pixels.pop(gpos, None)
        if images is not None:
            self.held_bytes -= images.nbytes

    def _open_visit(self) -> Visit | None:
        """Read (not yet tokenize) the column of this shard's next block."""
        upcoming = self.upcoming
        if upcoming is None or self.next_v is None:
            return None
        order, k = upcoming
        block = self.blocks[int(order.block_perm[k])]
        groups = self.src.row_groups[block.first_rg : block.first_rg + block.num_rg]
        rows = (order.rows_of_visit(k) - block.first_row).astype(np.int32)  # < a block's rows
        gpos_start = order.epoch * order.num_rows + int(order.block_starts[k])
        visit = self._visit(groups, gpos_start, block.first_row, rows)  # may raise Unavailable
        self.next_v += self.stride
        if gpos_start < self.skip_below < gpos_start + len(rows):
            visit.at = self.skip_below - gpos_start
        return visit

    def _visit(
        self, groups: tuple[RowGroup, ...], gpos_start: int, first_row: int, rows: np.ndarray
    ) -> Visit:
        images = self.images
        if images is None:  # text: a row group's column, read again for each window

            def read_text() -> pa.Array:
                return pa.concat_arrays([self.reader.read(rg, self.src.column) for rg in groups])

            column = read_text()
            sizes = cell_sizes(column)
            if any(is_remote(rg.file) for rg in groups):
                # From an object store a second read is a second download: the block's column
                # is kept for the visit (a block per source, not a window, is held).
                kept = column
                return Visit.of(
                    gpos_start,
                    first_row,
                    rows,
                    sizes,
                    lambda r: kept.take(pa.array(r)),
                    column,
                    self.window_bytes,
                )
            return Visit.of(
                gpos_start,
                first_row,
                rows,
                sizes,
                lambda r: read_text().take(pa.array(r)),
                column,
                self.window_bytes,
            )
        shard_sizes = [images.sizes(rg) for rg in groups]
        if all(size is not None for size in shard_sizes):  # WebDataset: rows read one by one
            sizes = np.concatenate([s for s in shard_sizes if s is not None])
            return Visit.of(
                gpos_start, first_row, rows, sizes, lambda r: read_block(images, groups, r)
            )
        # Parquet images: like text, the row group is read again for each window (from the
        # page cache: a few ms beside decoding the window's images), so a source holds a
        # window of images, not a row group of them.
        block = read_block(images, groups, np.arange(sum(rg.num_rows for rg in groups)))
        if any(is_remote(rg.file) for rg in groups):  # kept, as for text (above)
            kept = block
            return Visit.of(
                gpos_start,
                first_row,
                rows,
                row_sizes(block),
                lambda r: kept.take(pa.array(r)),
                block,
            )
        return Visit.of(
            gpos_start,
            first_row,
            rows,
            row_sizes(block),
            lambda r: read_block(images, groups, r),
            block,
        )
