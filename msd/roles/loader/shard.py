"""A loader's socket-free core: one shard of a source, read in visiting order, tokenized a
chunk at a time, holding what it reported until it is routed (``SourceShard``).

Memory is bounded per source, not per rank: a shard reads ahead only while it holds fewer
unrouted tokens than its share of ``buffer_tokens`` and, for an image source, fewer bytes of
images than its share of ``buffer_bytes`` (``ReadAhead``; a sample's images are held as their
bytes, planned from their headers, and decoded when it is routed), or up to a position the
Planner waits for; and of a block's text it keeps only the rows not yet tokenized next
(``Visit``): a window of about 256 KiB, not a row group, per source. Which visit it opens next
is its ``Cursor``'s; how it reads a block, its ``Opener``'s.
"""

from __future__ import annotations

import time

import numpy as np

from msd.plan.order import make_blocks
from msd.plan.partition import Shard
from msd.recipe.schema import Recipe
from msd.roles.loader.budget import ReadAhead, held_cost, shard_budget, shard_bytes
from msd.roles.loader.chunk import flat_spans, image_meta, packed
from msd.roles.loader.counts import ReadCounts, source_load
from msd.roles.loader.cursor import Cursor
from msd.roles.loader.opening import Opener
from msd.roles.loader.outage import Outage
from msd.roles.loader.visit import Visit, window_bytes
from msd.sources.chat_rows import ChatRows, tokenize_of
from msd.sources.fuse import Fuser, Held, fuse_spec
from msd.sources.image_rows import ImageRowReader
from msd.sources.index import SourceIndex, open_source
from msd.sources.read import RowGroupReader
from msd.wire.protocol import Meta, SourceLoad

# Text bytes tokenized per loop turn, at most: large enough that per-message costs stay small.
CHUNK_BYTES = 64 * 1024
# ... and fewer with a slow tokenizer: a turn takes about this long, so Routes (the payloads
# trainers wait for) are answered within milliseconds whatever the tokenizer costs.
CHUNK_SECONDS = 0.005
# Open Parquet files a loader process keeps (an LRU shared by its shards).
MAX_OPEN_FILES = 64


class SourceShard:
    """One shard of one source: its visits (``cursor``), the samples it holds (``held``, and
    of those, ``pixels``: their images; ``trained``: a conversation's spans the loss is taken
    on), its read-ahead (``ahead``) and what it read so far (``counts``).

    It reads visits ``start + index``, every ``stride``-th after, before ``stop`` (``span``;
    ``Cursor``). ``want``: the position the Planner waits for; ``outage``: the store is
    failing its reads now.
    """

    def __init__(
        self,
        recipe: Recipe,
        shard: Shard,
        reader: RowGroupReader,
        span: tuple[int | None, int | None, int],
    ) -> None:
        self.recipe, self.source, self.generation = recipe, shard.source, shard.generation
        spec = recipe.sources[shard.source]
        self.src: SourceIndex = open_source(spec, f"sources[{shard.source}]")
        blocks = make_blocks(
            [rg.num_rows for rg in self.src.row_groups], recipe.loader.block_row_groups
        )
        self.cursor = Cursor.of(recipe, shard, blocks, span)
        self.tokenize = tokenize_of(spec, self.src.column_kind)
        self.chat = self.tokenize if isinstance(self.tokenize, ChatRows) else None
        images: ImageRowReader | None = None
        self.fuser: Fuser | None = None
        if self.src.has_images:
            images = ImageRowReader(spec, self.src, reader)
            fusing = fuse_spec(recipe, spec.has_videos, spec.clip)
            require_text = self.src.format == "webdataset"
            self.fuser = Fuser.of_source(
                spec, self.src.column_kind, fusing, require_text, defer=True
            )
        stride = self.cursor.stride
        mix_tokens = shard_budget(recipe, shard.source, stride)
        self.opener = Opener(reader, self.src.column, images, window_bytes(mix_tokens))
        self.ahead = ReadAhead(
            mix_tokens,
            shard_bytes(recipe, shard.source, stride),
            max(b.num_rows for b in blocks),
            siblings=stride != 1,
            images=self.fuser is not None,
        )
        self.counts = ReadCounts()
        self.visit: Visit | None = None
        self.want = -1
        self.held: dict[int, np.ndarray] = {}
        # of held samples that have images: as bytes until routed, where that is smaller
        self.pixels: dict[int, Held] = {}
        # of held conversations: the [start, end) spans of their tokens the loss is taken on
        self.trained: dict[int, np.ndarray] = {}
        self.outage: Outage | None = None
        self.chunk_bytes = 4096  # then CHUNK_SECONDS of tokenizing, up to CHUNK_BYTES

    def resume_at(self, gpos: int) -> None:
        """Read nothing before position ``gpos``: skip the visits that end before it and, in the
        one holding it, the rows before it."""
        self.cursor.resume_at(gpos, self.src.num_rows)

    @property
    def retired(self) -> bool:
        """Replaced by a newer generation, and nothing left to read or hold."""
        cursor = self.cursor
        return (
            cursor.stop is not None
            and cursor.upcoming() is None
            and not cursor.frozen
            and self.visit is None
            and not self.held
        )

    def next_gpos(self) -> int | None:
        if self.visit is not None:
            return self.visit.gpos_start + self.visit.at
        upcoming = self.cursor.upcoming()
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
        """Tokens this shard may hold unrouted (``ReadAhead.tokens``)."""
        return self.ahead.tokens(self.counts)

    @property
    def byte_budget(self) -> int:
        """Bytes of images this shard may hold unrouted (``ReadAhead.bytes``)."""
        return self.ahead.bytes(self.counts)

    @property
    def fill(self) -> float:
        """How full the read-ahead is (the emptiest hungry shard reads first)."""
        return self.ahead.fill(self.counts)

    @property
    def hungry(self) -> bool:
        """Reading ahead: from below half the budget up to all of it, while there is more."""
        return self.ahead.hungry(self.counts, lambda: self.next_gpos() is None)

    def read_next(self) -> Meta | None:
        """Tokenize the next chunk of the current block (opening the next block when needed);
        the lengths to report to the Planner."""
        if self.visit is None:
            self.visit = self._open_visit()
            if self.visit is None:
                return None
        visit = self.visit
        room = self.chunk_bytes if self.waited_for else self.budget - self.ahead.held_tokens
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
        trained = self._hold(gpos_start, tokens)
        images = {} if self.fuser is None else self._hold_images(gpos_start, tokens, pixels)
        counts, bounds = flat_spans(trained)
        return Meta(
            source=self.source,
            gpos_start=gpos_start,
            lengths=tuple(len(t) for t in tokens),
            sample_ids=tuple(visit.first_row + int(r) for r in rows),
            **images,
            trained=counts,
            spans=bounds,
        )

    def _hold(self, gpos_start: int, tokens: list[np.ndarray]) -> list[np.ndarray | None]:
        """Hold a chunk's samples from ``gpos_start`` on, and their trained spans; the spans."""
        for offset, t in enumerate(packed(tokens)):
            self.held[gpos_start + offset] = t
            self.ahead.held_tokens += held_cost(t)
            self.counts.tokens += len(t)
        trained = self._trained_of_last()
        for offset, spans in enumerate(trained):
            if spans is not None:
                self.trained[gpos_start + offset] = spans
        self.counts.samples += len(tokens)
        return trained

    def _hold_images(
        self, gpos_start: int, tokens: list[np.ndarray], pixels: list[Held | None]
    ) -> dict[str, tuple[int, ...]]:
        """Hold a chunk's images; the ``Meta`` fields that report them."""
        assert self.fuser is not None
        for offset, p in enumerate(pixels):
            if p is not None:
                self.pixels[gpos_start + offset] = p
                self.ahead.held_bytes += p.nbytes
                self.counts.image_bytes += p.nbytes
        return image_meta(self.recipe, tokens, pixels, self.fuser.skipped_per_sample)

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
        self.counts.busy_s += time.perf_counter() - started

    def load(self) -> SourceLoad:
        held = (len(self.held), self.ahead.held_tokens)
        return source_load(self.source, self.counts, held, self.fuser, self.chat)

    def forget(self, gpos: int) -> None:
        self.ahead.held_tokens -= held_cost(self.held.pop(gpos))
        self.trained.pop(gpos, None)
        images = self.pixels.pop(gpos, None)
        if images is not None:
            self.ahead.held_bytes -= images.nbytes

    def _open_visit(self) -> Visit | None:
        """Read (not yet tokenize) the column of this shard's next block."""
        cursor = self.cursor
        upcoming = cursor.upcoming()
        if upcoming is None or cursor.next_v is None:
            return None
        order, k = upcoming
        block = cursor.blocks[int(order.block_perm[k])]
        groups = self.src.row_groups[block.first_rg : block.first_rg + block.num_rg]
        rows = (order.rows_of_visit(k) - block.first_row).astype(np.int32)  # < a block's rows
        gpos_start = order.epoch * order.num_rows + int(order.block_starts[k])
        visit = self.opener.visit(groups, gpos_start, block.first_row, rows)  # or Unavailable
        cursor.next_v += cursor.stride
        if gpos_start < cursor.skip_below < gpos_start + len(rows):
            visit.at = cursor.skip_below - gpos_start
        return visit
