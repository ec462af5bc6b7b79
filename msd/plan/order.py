"""The epoch order of one source: a seeded, block-shuffled permutation of its rows.

Rows are grouped into blocks of consecutive row groups. An epoch visits the blocks in a seeded
random order and, inside each block, the rows in a seeded random order, so that any stretch of
the stream touches few files while the whole epoch is well mixed. Everything is a pure function
of (seed, source key, epoch): no state, no I/O, and O(row groups) memory.

Position ``g`` in a source's stream ("global position") is ``epoch * num_rows + pos``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

_MASK63 = (1 << 63) - 1


@dataclass(frozen=True)
class Block:
    """Row groups ``first_rg ...`` (``num_rg`` of them), holding rows ``first_row ...``."""

    first_rg: int
    num_rg: int
    first_row: int
    num_rows: int


def make_blocks(rg_rows: Sequence[int], block_row_groups: int) -> tuple[Block, ...]:
    """Cut row groups, in file order, into blocks of ``block_row_groups``; the last may be short."""
    blocks = []
    first_row = 0
    for first_rg in range(0, len(rg_rows), block_row_groups):
        rows = sum(rg_rows[first_rg : first_rg + block_row_groups])
        num_rg = min(block_row_groups, len(rg_rows) - first_rg)
        blocks.append(Block(first_rg, num_rg, first_row, rows))
        first_row += rows
    return tuple(blocks)


@dataclass(frozen=True)
class EpochOrder:
    """Where each position of one epoch of one source points, as a global row index."""

    blocks: tuple[Block, ...]
    seed: int
    source_key: int
    epoch: int

    @cached_property
    def block_perm(self) -> np.ndarray:
        """Block ids in the order this epoch visits them."""
        rng = np.random.default_rng([self.seed, self.source_key & _MASK63, self.epoch])
        return rng.permutation(len(self.blocks))

    @cached_property
    def block_starts(self) -> np.ndarray:
        """Epoch position of the first row of the k-th visited block (plus the total at the end)."""
        sizes = np.array([self.blocks[b].num_rows for b in self.block_perm], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(sizes)])

    @property
    def num_rows(self) -> int:
        return int(self.block_starts[-1])

    def visit_of(self, pos: int) -> int:
        """Index k of the visited block that holds epoch position ``pos``."""
        return int(np.searchsorted(self.block_starts, pos, side="right")) - 1

    def rows_of_visit(self, k: int) -> np.ndarray:
        """Global row indices of the k-th visited block, in the order the epoch visits them."""
        block = self.blocks[int(self.block_perm[k])]
        key = [self.seed, self.source_key & _MASK63, self.epoch, int(self.block_perm[k])]
        return block.first_row + np.random.default_rng(key).permutation(block.num_rows)

    def row_at(self, pos: int) -> int:
        k = self.visit_of(pos)
        return int(self.rows_of_visit(k)[pos - int(self.block_starts[k])])
