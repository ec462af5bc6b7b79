"""What every balance method shares: the shape of a step's rows, placing samples in them one by
one, the ``none`` method, and the least-loaded fill.

A placement is ``row_of``: an int64 array, the global row of each sample or -1 (left over).
Rows are numbered rank by rank and micro-batch by micro-batch (see ``Shape``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

IN_ORDER_CHUNK = 2048  # samples ``pack_in_order`` turns into Python numbers at once


@dataclass(frozen=True)
class Shape:
    """Row g is in rank ``g // rows_per_rank`` and in (global) micro-batch
    ``g // rows_per_micro_batch``; every row holds ``row_tokens`` tokens."""

    ranks: int
    micro_batches: int
    rows_per_micro_batch: int
    row_tokens: int

    @property
    def rows_per_rank(self) -> int:
        return self.micro_batches * self.rows_per_micro_batch

    @property
    def num_rows(self) -> int:
        return self.ranks * self.rows_per_rank


def sum_by_rank(rank_of: np.ndarray, costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """Summed in sample order, so every caller gets bit-identical sums."""
    placed = rank_of >= 0
    return np.bincount(rank_of[placed], weights=costs[placed], minlength=num_ranks)


def rank_loads(shape: Shape, row_of: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """The summed cost of each rank under a placement."""
    rank_of = np.where(row_of >= 0, row_of // shape.rows_per_rank, -1)
    return sum_by_rank(rank_of, costs, shape.ranks)


class Packer:
    """Rows filled one sample at a time (Python lists: fastest for single updates)."""

    def __init__(self, shape: Shape, lengths: list[int], costs: list[float]) -> None:
        self.shape, self.lengths, self.costs = shape, lengths, costs
        self.per_rank, self.per_mb = shape.rows_per_rank, shape.rows_per_micro_batch
        self.free = [shape.row_tokens] * shape.num_rows
        self.mb_cost = [0.0] * (shape.ranks * shape.micro_batches)
        self.row_of = [-1] * len(lengths)
        if self.per_rank == 1:
            self.pick_row = self._only_row
        elif shape.micro_batches == 1:
            self.pick_row = self._best_fit_row
        else:
            self.pick_row = self._balanced_row

    def put(self, sample: int, row: int) -> None:
        self.row_of[sample] = row
        self.free[row] -= self.lengths[sample]
        self.mb_cost[row // self.per_mb] += self.costs[sample]

    def room(self, rank: int) -> int:
        """The most free tokens in any row of ``rank``."""
        return max(self.free[rank * self.per_rank : (rank + 1) * self.per_rank])

    # pick_row(rank, length): the least-loaded micro-batch of ``rank`` with room, then its
    # best-fit row (least room that holds ``length``); -1 if none. Specialised by shape.

    def _only_row(self, rank: int, length: int) -> int:
        return rank if self.free[rank] >= length else -1

    def _best_fit_row(self, rank: int, length: int) -> int:
        return self._best_fit(rank * self.per_rank, (rank + 1) * self.per_rank, length)

    def _balanced_row(self, rank: int, length: int) -> int:
        mb_cost, per_mb, micro_batches = self.mb_cost, self.per_mb, self.shape.micro_batches
        best, best_cost = -1, 0.0
        for mb in range(rank * micro_batches, (rank + 1) * micro_batches):
            if best < 0 or mb_cost[mb] < best_cost:
                row = self._best_fit(mb * per_mb, (mb + 1) * per_mb, length)
                if row >= 0:
                    best, best_cost = row, mb_cost[mb]
        return best

    def _best_fit(self, start: int, stop: int, length: int) -> int:
        free, best, best_free = self.free, -1, 0
        for row in range(start, stop):
            room = free[row]
            if room >= length and (best < 0 or room < best_free):
                best, best_free = row, room
        return best


def pack_in_order(
    shape: Shape, lengths: np.ndarray, costs: np.ndarray | None = None, stop_at: float = np.inf
) -> np.ndarray | None:
    """``none``: samples in order, first fit over the current rank's rows; a sample that does not
    fit moves on to the next rank for good. Samples left when ranks run out are left over.

    With ``costs`` (all >= 0), stops and returns None as soon as one rank's cost reaches
    ``stop_at``: then ``none``'s slowest rank is at least that slow.
    """
    row_tokens, per_rank = shape.row_tokens, shape.rows_per_rank
    free = [row_tokens] * shape.num_rows
    row_of = np.full(len(lengths), -1, dtype=np.int64)
    first, end = 0, per_rank  # the current rank's rows: [first, end)
    load = 0.0  # of the current rank, summed in sample order like ``sum_by_rank``
    # A chunk of samples at a time: with ``stop_at``, usually only the first ranks are walked.
    for start in range(0, len(lengths), IN_ORDER_CHUNK):
        chunk = lengths[start : start + IN_ORDER_CHUNK].tolist()
        cost = [0.0] * len(chunk) if costs is None else costs[start : start + len(chunk)].tolist()
        rows = [-1] * len(chunk)
        for i, length in enumerate(chunk):
            if length > row_tokens:  # fits no rank: must not use them all up
                continue
            row = first
            while row < end and free[row] < length:
                row += 1
            if row == end:
                if end == len(free):
                    row_of[start : start + i] = rows[:i]
                    return row_of
                first, end, load = end, end + per_rank, 0.0
            free[row] -= length
            rows[i] = row
            load += cost[i]
            if load >= stop_at:
                return None
        row_of[start : start + len(rows)] = rows
    return row_of


def fill_least_loaded(
    p: Packer,
    order: list[int],
    heap: list[tuple[float, int]],
    aside: list[tuple[int, int, float]] | None = None,
) -> None:
    """Place each sample of ``order`` on the least-loaded rank with room, ties by rank id.

    ``heap`` holds (load, rank) of every rank but those in ``aside``, (-room, rank, load) of
    ranks too full for the first sample (both heaps). A rank too full for the current sample
    waits aside, keyed by its room, until a sample short enough comes. With samples in decreasing
    length, and since a rank's room only shrinks when it takes a sample, each sample costs
    O(log ranks) amortised.
    """
    aside = [] if aside is None else aside
    lengths, costs, pick_row = p.lengths, p.costs, p.pick_row
    row_of, free, mb_cost, per_mb = p.row_of, p.free, p.mb_cost, p.per_mb
    for i in order:
        length = lengths[i]
        if aside and -aside[0][0] >= length:
            _bring_back(aside, heap, length)
        while heap:
            load, rank = heap[0]
            row = pick_row(rank, length)
            if row >= 0:
                break
            heapq.heappop(heap)
            heapq.heappush(aside, (-p.room(rank), rank, load))
        else:
            continue  # no rank has room: left over
        row_of[i] = row  # p.put, inlined: this loop is the hot path
        free[row] -= length
        mb_cost[row // per_mb] += costs[i]
        heapq.heapreplace(heap, (load + costs[i], rank))


def _bring_back(
    aside: list[tuple[int, int, float]], heap: list[tuple[float, int]], length: int
) -> None:
    """Back to ``heap``: the ranks set aside that have room for ``length`` tokens."""
    while aside and -aside[0][0] >= length:
        _, rank, load = heapq.heappop(aside)
        heapq.heappush(heap, (load, rank))
