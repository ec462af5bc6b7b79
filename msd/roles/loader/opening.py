"""How a shard opens a block to visit (``Opener``): what it reads at once, and whether it keeps
the block for the visit or reads it again for each window.

Text and Parquet images are read whole once (the first window is taken from them), then again
for each window, from the page cache; from an object store a second read is a second download,
so there the block is kept for the visit (a block per source, not a window, is held).
WebDataset rows are read one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msd.roles.loader.visit import Visit, cell_sizes
from msd.sources.image_rows import ImageRowReader, read_block, row_sizes
from msd.sources.index import RowGroup
from msd.sources.read import RowGroupReader
from msd.sources.storage import is_remote


@dataclass(frozen=True)
class Opener:
    """Reads a source's blocks through ``reader``: its text ``column``, or its rows with their
    images (``images``); a text window holds about ``window_bytes``."""

    reader: RowGroupReader
    column: str
    images: ImageRowReader | None
    window_bytes: int

    def visit(
        self, groups: tuple[RowGroup, ...], gpos_start: int, first_row: int, rows: np.ndarray
    ) -> Visit:
        """The visit of ``rows`` (in visiting order) of the block of row groups ``groups``
        (may raise ``Unavailable``)."""
        if self.images is None:
            return self._text(groups, gpos_start, first_row, rows)
        images = self.images
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
        if any(is_remote(rg.file) for rg in groups):  # kept, as for text
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

    def _text(
        self, groups: tuple[RowGroup, ...], gpos_start: int, first_row: int, rows: np.ndarray
    ) -> Visit:
        """A row group's column, read again for each window (kept, from an object store)."""

        def read_text() -> pa.Array:
            return pa.concat_arrays([self.reader.read(rg, self.column) for rg in groups])

        column = read_text()
        sizes = cell_sizes(column)
        if any(is_remote(rg.file) for rg in groups):
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
