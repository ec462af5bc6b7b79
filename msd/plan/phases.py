"""``greedy`` in numpy, a batch of samples at a time (see docs/balance.md, "Speed").

With many ranks, samples in decreasing cost mostly go one each to distinct ranks, lightest first.
A phase lists the ranks in the order the one-by-one rule would take them if each took at most one
sample, then keeps the longest prefix where that is provably what the one-by-one rule does. The
result is exactly the one-by-one result.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from msd.plan.placement import Shape


class Phases:
    """``greedy`` in numpy, a batch of samples at a time (samples already in greedy order).

    A phase gives the next samples one each to distinct ranks, lightest first (``_queue``), for
    as long as that is provably what the one-by-one rule does. Samples come in decreasing
    cost, so a phase places hundreds or thousands of samples at once.
    """

    def __init__(self, shape: Shape, lengths: np.ndarray, costs: np.ndarray) -> None:
        self.lengths, self.costs = lengths, costs
        self.shape = shape
        self.free = np.full((shape.ranks, shape.rows_per_rank), shape.row_tokens, dtype=np.int64)
        self.room = np.full(shape.ranks, shape.row_tokens, dtype=np.int64)
        self.mb_cost = np.zeros((shape.ranks, shape.micro_batches))
        self.loads = np.zeros(shape.ranks)
        self.rows = np.full(len(lengths), -1, dtype=np.int64)  # the global row of each sample
        self.done = 0

    def run(self, min_batch: int) -> None:
        """Phases while they place ``min_batch`` samples or more, on average (a phase costs
        about as much as the heap loop spends on that many samples)."""
        window, recent = len(self.loads), float(len(self.loads))
        while self.done < len(self.lengths) and recent >= min_batch:
            size = self._phase(window)
            self.done += size
            recent = (recent + size) / 2
            # A batch seldom outgrows twice the last one: look no further (saves work).
            window = min(len(self.loads), max(2 * size, window // 2, min_batch))

    def _phase(self, window: int) -> int:
        """Place (or leave over) the next samples, at most ``window``; how many."""
        h, most = self.done, int(self.room.max())
        if most < self.lengths[h]:  # too long for every rank: left over, like every longer
            too_long = self.lengths[h:] > most  # one right after it
            return len(too_long) if too_long.all() else int(np.argmin(too_long))
        ranks = self._queue(window)
        lengths, costs = self.lengths[h : h + len(ranks)], self.costs[h : h + len(ranks)]
        row, room_after = self._fit(ranks, lengths)
        ok = self.room[ranks] >= lengths
        ok &= self._lighter_than_earlier(ranks, lengths, costs, room_after)
        size = len(ok) if ok.all() else int(np.argmin(ok))  # >= 1: sample h always fits
        ranks, row = ranks[:size], row[:size]
        self.free[ranks, row] -= lengths[:size]
        self.room[ranks] = room_after[:size]
        self.mb_cost[ranks, row // self.shape.rows_per_micro_batch] += costs[:size]
        self.loads[ranks] += costs[:size]
        self.rows[h : h + size] = ranks * self.shape.rows_per_rank + row
        return size

    def _queue(self, window: int) -> np.ndarray:
        """The ranks for the next ``window`` samples (``_queue``), from the lightest ranks that
        have room for the shortest of them (no other rank can take any)."""
        lengths = self.lengths[self.done : self.done + window]
        usable = np.flatnonzero(self.room >= lengths.min())
        for count in (2 * window, len(usable)):
            lightest = usable[_lightest(self.loads[usable], count)]
            ranks: np.ndarray = lightest[_queue(self.room[lightest], lengths)]
            if 2 * len(ranks) >= window or count >= len(usable):
                break
        return ranks

    def _fit(self, ranks: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The row of ``ranks[j]`` sample j would go to (least-loaded micro-batch with room,
        then best fit), and the rank's room after it."""
        free = self.free[ranks]  # a copy, (samples, rows)
        fits = free >= lengths[:, None]
        at, never = np.arange(len(ranks)), np.iinfo(np.int64).max
        if self.shape.micro_batches == 1:
            row = np.argmin(np.where(fits, free, never), axis=1)
        else:
            per_mb = self.shape.rows_per_micro_batch
            has_room = fits.reshape(len(ranks), -1, per_mb).any(axis=2)
            mb = np.argmin(np.where(has_room, self.mb_cost[ranks], np.inf), axis=1)
            cols = mb[:, None] * per_mb + np.arange(per_mb)
            in_mb = np.where(
                np.take_along_axis(fits, cols, 1), np.take_along_axis(free, cols, 1), never
            )
            row = mb * per_mb + np.argmin(in_mb, axis=1)
        free[at, row] -= lengths
        return row, _row_max(free)

    def _lighter_than_earlier(
        self, ranks: np.ndarray, lengths: np.ndarray, costs: np.ndarray, room_after: np.ndarray
    ) -> np.ndarray:
        """Is ``ranks[j]`` lighter than every rank given an earlier sample that still holds j?

        Strictly lighter: a tie ends the batch. A rank given sample i competes for sample j
        from the first j > i that is short enough for its room (prefix minimum of lengths).
        """
        size = len(ranks)
        load = self.loads[ranks]
        shortest = np.minimum.accumulate(lengths)
        start = np.searchsorted(-shortest, -room_after)  # first j with shortest[j] <= room
        start = np.maximum(start, np.arange(1, size + 1))
        rival = np.full(size + 1, np.inf)
        np.minimum.at(rival, start, load + costs)
        lighter: np.ndarray = load < np.minimum.accumulate(rival)[:size]
        return lighter


def _row_max(values: np.ndarray) -> np.ndarray:
    """``values.max(axis=1)``; a rank's few rows a column at a time, which numpy does several
    times faster than reducing along the short axis."""
    if values.shape[1] > 8 or not values.shape[1]:
        return values.max(axis=1)  # type: ignore[no-any-return]
    most = values[:, 0].copy()
    for j in range(1, values.shape[1]):
        np.maximum(most, values[:, j], out=most)
    return most


def _lightest(loads: np.ndarray, count: int) -> np.ndarray:
    """Positions of at least ``count`` of the lightest (all if fewer), sorted by (load,
    position): a prefix of that order, found in O(len(loads)) before the sort."""
    if count < len(loads):
        cut = np.partition(loads, count - 1)[count - 1]
        chosen = np.flatnonzero(loads <= cut)
    else:
        chosen = np.arange(len(loads))
    return chosen[np.argsort(loads[chosen], kind="stable")]  # stable: ties by position


def _queue(room: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Which rank (a position in ``room``, listed lightest first) each next sample gets when
    each rank takes at most one: the lightest rank not yet taken that holds it. Stops early
    when the ranks listed run out (a heavier one might be next).

    A rank joins from the first sample no longer than its room. Samples are mostly in
    decreasing length, so the ranks with room for the first one come in order and the few
    that join later are merged in.
    """
    shortest = np.minimum.accumulate(lengths[: len(room)])
    joins = np.searchsorted(-shortest, -room)  # first sample each rank could hold
    pool = np.flatnonzero(joins == 0)
    late = np.flatnonzero((joins > 0) & (joins < len(shortest)))
    late = late[np.argsort(joins[late], kind="stable")]
    taken_at = _merge_late(pool.tolist(), late.tolist(), joins[late].tolist(), len(shortest))
    queue = np.empty(min(len(shortest), len(pool) + len(taken_at)), dtype=np.int64)
    steps = np.fromiter(taken_at, dtype=np.int64, count=len(taken_at))
    steps = steps[steps < len(queue)]
    from_pool = np.ones(len(queue), dtype=bool)
    from_pool[steps] = False
    queue[steps] = [taken_at[t] for t in steps.tolist()]
    queue[from_pool] = pool[: len(queue) - len(steps)]
    return queue


def _merge_late(pool: list[int], late: list[int], joins: list[int], steps: int) -> dict[int, int]:
    """At which step each late rank is taken: at each step the lightest available rank (any of
    ``pool`` not yet taken, a late one from its join step) is taken. Loops over late ranks only:
    the steps between take ``pool`` in order."""
    taken_at: dict[int, int] = {}
    waiting: list[int] = []  # late ranks that have joined (smaller position = lighter)
    step = head = k = 0  # head: the next of ``pool``
    push, pop, first_at = heapq.heappush, heapq.heappop, bisect.bisect_left
    while step < steps:
        next_join = joins[k] if k < len(late) else steps
        while waiting:  # each the step it comes first at, if before the next join
            at = step + first_at(pool, waiting[0], head) - head
            if at >= next_join:
                break
            head, step = head + at - step, at
            taken_at[step] = pop(waiting)
            step += 1
        else:
            if k == len(late):
                break
        if head + next_join - step > len(pool):  # the pool runs dry before anyone joins
            break
        head, step = head + next_join - step, next_join
        while k < len(late) and joins[k] == next_join:
            push(waiting, late[k])
            k += 1
    return taken_at
