"""A block of a source being tokenized in visiting order, one window of its rows held at a
time (``Visit``), and what a row costs to tokenize (``cell_sizes``)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msd.sources.formats.base import is_text
from msd.sources.image_rows import row_sizes

# Of an open block, a loader holds a window of at most this much text (in visiting order)...
WINDOW_BYTES = 256 * 1024
# ... and, for a source that reads ahead little (one of many), about four times its read-ahead
# in tokens (a tokenizer's text is about 4 bytes a token), but at least this much: each window
# decodes the block's row groups again (a few ms for 2 MB of text), so a smaller one costs
# CPU for every byte it saves.
MIN_WINDOW_BYTES = 128 * 1024


def cell_sizes(column: pa.Array) -> np.ndarray:
    """Bytes (text) or ids (token lists) of each cell: what tokenizing it will cost; of a
    conversation (a list of messages), the bytes of its strings."""
    if pa.types.is_struct(column.type):
        return row_sizes(column)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        if not pa.types.is_integer(column.type.value_type):
            return nested_bytes(column)
        sizes = pc.list_value_length(column)
    else:
        sizes = pc.binary_length(column)
    return np.asarray(sizes.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def nested_bytes(array: pa.Array) -> np.ndarray:
    """Bytes of the strings inside each element of ``array`` (lists and structs of them), and
    8 a value of anything else."""
    typ = array.type
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        inner = nested_bytes(array.flatten())
        owner = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return np.bincount(owner, inner.astype(np.float64), minlength=len(array)).astype(np.int64)
    if pa.types.is_struct(typ):
        total = np.zeros(len(array), dtype=np.int64)
        for field in array.flatten():
            total += nested_bytes(field)
        return total
    if is_text(typ):
        return np.asarray(
            pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64
        )
    return np.full(len(array), 8, dtype=np.int64)


def window_bytes(budget_tokens: int) -> int:
    """The window of a text source that holds up to ``budget_tokens`` tokens read ahead."""
    return min(WINDOW_BYTES, max(MIN_WINDOW_BYTES, 4 * budget_tokens))


def chunk_end(sizes: np.ndarray, start: int, budget: int) -> int:
    """End of the chunk that starts at ``start``: at least one cell, at most ``budget`` in all."""
    if start >= len(sizes):
        return start
    fits = int(np.searchsorted(np.cumsum(sizes[start:]), budget, side="right"))
    return start + max(1, fits)


@dataclass
class Visit:
    """A block being tokenized chunk by chunk, in visiting order.

    Of its rows only one window is held: the next rows in visiting order, about
    ``window_bytes``. Once a window is tokenized the next is read (``read``: the block's rows
    asked for, in that order; a Parquet row group comes from the page cache, decoded, the
    rows taken, the rest let go). A light source keeps its block open for thousands of steps;
    it costs a window, not a row group, and a text block is decoded ``size / WINDOW_BYTES``
    times instead of once (a few ns per token). Positions are global: ``gpos_start + k`` for
    the k-th row of the visit, block row ``rows[k]``.
    """

    gpos_start: int
    first_row: int
    rows: np.ndarray
    sizes: np.ndarray
    bounds: list[int]  # window w holds visit rows bounds[w] .. bounds[w + 1]
    read: Callable[[np.ndarray], pa.Array]
    window: pa.Array | None = None
    current: int = -1  # the window held
    at: int = 0
    reads: int = 0

    @staticmethod
    def of(
        gpos_start: int,
        first_row: int,
        rows: np.ndarray,
        block_sizes: np.ndarray,
        read: Callable[[np.ndarray], pa.Array],
        column: pa.Array | None = None,
        window_bytes: int | None = None,
    ) -> Visit:
        """The visit of ``rows`` (block-local, in visiting order) of a block whose rows cost
        ``block_sizes`` (bytes: what tokenizing each will cost); ``read(rows)`` reads rows;
        ``column``: the whole block, just read (its first window is taken from it)."""
        # An empty cell costs its row: a column of null cells is read in bounded chunks too.
        # int32, as ``rows``: these two are the one per-row state of an open block.
        sizes = np.clip(block_sizes[rows], 1, np.iinfo(np.int32).max).astype(np.int32)
        bounds = [0]
        while bounds[-1] < len(rows):
            bounds.append(chunk_end(sizes, bounds[-1], window_bytes or WINDOW_BYTES))
        visit = Visit(gpos_start, first_row, rows, sizes, bounds, read)
        if column is not None:
            visit.window = column.take(pa.array(rows[: bounds[1]]))
            visit.current, visit.reads = 0, 1
            del column
            pa.default_memory_pool().release_unused()
        return visit

    @property
    def done(self) -> bool:
        return self.at >= len(self.rows)

    def held_bytes(self) -> int:
        return 0 if self.window is None else self.window.nbytes

    def next_chunk(self, budget: int) -> tuple[int, np.ndarray, pa.Array]:
        """The next rows, at most ``budget`` in size (at least one), within one window: their
        visit position, block rows and text."""
        w = bisect.bisect_right(self.bounds, self.at) - 1
        if w != self.current or self.window is None:
            self.reads += 1
            self.window = self.read(self.rows[self.bounds[w] : self.bounds[w + 1]])
            self.current = w
            pa.default_memory_pool().release_unused()  # the block as read: about 1 ms to return
        assert self.window is not None
        start, end = self.at, min(chunk_end(self.sizes, self.at, budget), self.bounds[w + 1])
        text = self.window.slice(start - self.bounds[w], end - start)
        self.at = end
        if end == self.bounds[w + 1]:
            self.window = None  # tokenized: let it go
        return start, self.rows[start:end], text
