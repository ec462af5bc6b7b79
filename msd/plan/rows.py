"""Packing a step's samples into the global batch's rows, and dealing whole rows to ranks.

Selection packs samples first-fit into the step's ``dp × rows_per_rank`` rows as they are drawn,
so which samples form a global step never depends on how many ranks will share it. If the
sample-level balancer cannot place every sample (fragmentation), ``deal_rows`` hands out these
rows whole instead, which always fits.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

import numpy as np


class RowPacker:
    """Best fit into ``num_rows`` rows of ``row_tokens``; a group of pieces fits all or none.

    Rows are kept sorted by free room, so a placement costs O(log rows) comparisons.
    """

    def __init__(self, num_rows: int, row_tokens: int) -> None:
        self.rooms = [(row_tokens, j) for j in range(num_rows)]
        self.members: list[list[int]] = [[] for _ in range(num_rows)]
        self.count = 0

    def place(self, lengths: Sequence[int]) -> bool:
        """Place every length (as indices ``count, count+1, ...``) or none of them."""
        taken: list[tuple[int, int]] = []
        for length in lengths:
            k = bisect.bisect_left(self.rooms, (length, -1))
            if k == len(self.rooms):
                self._undo(taken, lengths)
                return False
            room, row = self.rooms.pop(k)
            taken.append((room, row))
            bisect.insort(self.rooms, (room - length, row))
        for _, row in taken:
            self.members[row].append(self.count)
            self.count += 1
        return True

    def _undo(self, taken: list[tuple[int, int]], lengths: Sequence[int]) -> None:
        for (room, row), length in reversed(list(zip(taken, lengths, strict=False))):
            self.rooms.remove((room - length, row))
            bisect.insort(self.rooms, (room, row))


def deal_rows(
    members: Sequence[Sequence[int]],
    costs: np.ndarray,
    num_ranks: int,
    rows_per_rank: int,
    rows_per_micro_batch: int,
) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Whole rows to ranks (exactly ``rows_per_rank`` each), heaviest row to the lightest rank
    with a free slot; inside a rank, rows to micro-batches the same way."""
    row_costs = [float(sum(costs[i] for i in row)) for row in members]
    ranks = _deal(row_costs, num_ranks, rows_per_rank)
    result = []
    for rank_rows in ranks:
        by_micro = _deal(
            [row_costs[j] for j in rank_rows],
            rows_per_rank // rows_per_micro_batch,
            rows_per_micro_batch,
        )
        ordered = [rank_rows[k] for micro in by_micro for k in micro]
        result.append(tuple(tuple(members[j]) for j in ordered))
    return tuple(result)


def _deal(weights: Sequence[float], bins: int, per_bin: int) -> list[list[int]]:
    """Longest-first into ``bins`` bins of exactly ``per_bin`` items each."""
    heap = [(0.0, b) for b in range(bins)]
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, b = heapq.heappop(heap)
        out[b].append(i)
        if len(out[b]) < per_bin:
            heapq.heappush(heap, (load + weights[i], b))
    return out
