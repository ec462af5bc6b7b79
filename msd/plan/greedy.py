"""``greedy``: longest processing time first (every sample, largest cost first, goes to the
least-loaded rank with a row that holds it; inside that rank, to the least-loaded micro-batch
with room, then to the best-fit row; ties: lower sample index, then lower rank id), then the
``exchange`` pass relieves the slowest rank.
"""

from __future__ import annotations

import heapq

import numpy as np

from msd.plan.exchange import exchange
from msd.plan.phases import Phases
from msd.plan.placement import Packer, Shape, fill_least_loaded

# Whole batches are placed in numpy from this many ranks on (below, the heap loop is faster),
# and the heap loop takes over once batches average fewer than PHASE_MIN_BATCH samples.
PHASE_MIN_RANKS = 256
PHASE_MIN_BATCH = 64


def pack_greedy(shape: Shape, lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """The ``greedy`` placement (``row_of``): longest first, then ``exchange``."""
    row_of = longest_first(shape, lengths, costs)
    exchange(shape, lengths, costs, row_of)
    return row_of


def longest_first(shape: Shape, lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """Every sample, largest cost first, to the least-loaded rank with room.

    With many ranks, numpy places whole batches at once while batches are large (``Phases``);
    the heap loop does the rest. Both place exactly as the one-by-one rule says.
    """
    order = largest_first(lengths, costs)
    phases = Phases(shape, lengths[order], costs[order])
    if shape.ranks >= PHASE_MIN_RANKS:
        phases.run(PHASE_MIN_BATCH)
    row_of = np.full(len(order), -1, dtype=np.int64)
    row_of[order] = phases.rows
    if phases.done < len(order):  # the rest one by one (renumbered 0, 1, ... in ``p``)
        rest = order[phases.done :]
        p = Packer(shape, lengths[rest].tolist(), costs[rest].tolist())
        p.free, p.mb_cost = phases.free.ravel().tolist(), phases.mb_cost.ravel().tolist()
        heap, aside = _split_by_room(phases, int(lengths[rest[0]]))
        fill_least_loaded(p, list(range(len(rest))), heap, aside)
        row_of[rest] = p.row_of
    return row_of


def _split_by_room(
    phases: Phases, length: int
) -> tuple[list[tuple[float, int]], list[tuple[int, int, float]]]:
    """The heaps ``fill_least_loaded`` starts from: (load, rank) of the ranks with room for
    ``length`` tokens, and (-room, rank, load) of the others (set aside until a sample short
    enough comes; sorting them out here is much faster than one by one in the loop)."""
    fits = phases.room >= length
    ranks, others = np.flatnonzero(fits), np.flatnonzero(~fits)
    heap = list(zip(phases.loads[ranks].tolist(), ranks.tolist(), strict=True))
    columns = (-phases.room[others], others, phases.loads[others])
    aside = list(zip(*(c.tolist() for c in columns), strict=True))
    heapq.heapify(heap)
    heapq.heapify(aside)
    return heap, aside


def largest_first(lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """The samples by decreasing cost, ties by index (a stable sort).

    Where costs rise with length (the default cost model), a radix sort of 16-bit lengths gives
    the same order several times faster; it is checked, and used only then.
    """
    if len(lengths) > 1 and lengths.min() >= 0 and lengths.max() < 2**16:
        order = np.argsort((lengths.max() - lengths).astype(np.uint16), kind="stable")
        falls = np.diff(costs[order])
        # the same order iff costs never rise, and are equal only between equal lengths
        if np.all(falls <= 0) and np.all((falls < 0) | (np.diff(lengths[order]) == 0)):
            return order
    return np.argsort(-costs, kind="stable")
