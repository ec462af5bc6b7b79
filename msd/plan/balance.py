"""Split one global batch over data-parallel ranks and pack each rank's share into rows.

Each rank has ``micro_batches × rows_per_micro_batch`` rows of ``row_tokens`` tokens; row j
belongs to micro-batch ``j // rows_per_micro_batch``. A step waits for its slowest rank, and a
rank's pipeline for its slowest micro-batch, so the goal is the smallest maximum rank cost, then
even micro-batches inside each rank. Three methods:

* ``greedy`` — longest processing time first: samples in decreasing cost go to the least-loaded
  rank with a row that holds them; inside it, to the least-loaded micro-batch with room, then
  to the best-fit row.
* ``karmarkar_karp`` — the k-way largest differencing method splits the costs over ranks; each
  rank then packs its share like ``greedy``, and what does not fit tries the other ranks.
* ``none`` — what per-rank loaders give: samples in order fill rank 0, then rank 1, … .

``greedy`` and ``karmarkar_karp`` also compute ``none``, and return it instead unless their own
result places at least as many samples at no higher maximum rank cost: balancing never makes a
step worse (fewer samples placed, or a slower slowest rank).
A sample that fits nowhere is left over for the caller to carry; nothing is dropped.
Pure and deterministic: ties break on sample index, then rank id.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np

Method = Literal["greedy", "karmarkar_karp", "none"]
METHODS: tuple[Method, ...] = ("greedy", "karmarkar_karp", "none")

# ``greedy`` places whole batches in numpy from this many ranks on (below, the heap loop is
# faster), and goes back to the heap loop once batches average fewer than PHASE_MIN_BATCH.
PHASE_MIN_RANKS = 256
PHASE_MIN_BATCH = 64


@dataclass(frozen=True)
class Assignment:
    """``rows[r][j]`` lists the samples (indices into the input, ascending) in row j of rank r.

    ``leftover`` (sorted) holds the samples placed nowhere; the caller carries them forward.
    """

    rows: tuple[tuple[tuple[int, ...], ...], ...]
    leftover: tuple[int, ...]


def balance(
    lengths: np.ndarray,
    costs: np.ndarray,
    num_ranks: int,
    micro_batches: int,
    rows_per_micro_batch: int,
    row_tokens: int,
    method: Method = "greedy",
) -> Assignment:
    """Assign samples to ``num_ranks`` ranks of ``micro_batches × rows_per_micro_batch`` rows."""
    _check(lengths, costs, num_ranks, micro_batches, rows_per_micro_batch, row_tokens, method)
    shape = _Shape(num_ranks, micro_batches, rows_per_micro_batch, row_tokens)
    lens = np.asarray(lengths, dtype=np.int64)
    cost = np.asarray(costs, dtype=np.float64)
    unbalanced = _pack_in_order(shape, lens)
    if method == "none":
        return _assignment(shape, unbalanced)
    pack = _pack_greedy if method == "greedy" else _pack_karmarkar_karp
    return _assignment(shape, _better(shape, pack(shape, lens, cost), unbalanced, cost))


def balance_greedy(
    lengths: np.ndarray, costs: np.ndarray, num_ranks: int, rows_per_rank: int, row_tokens: int
) -> Assignment:
    """``balance`` with one micro-batch of ``rows_per_rank`` rows and the ``greedy`` method."""
    return balance(lengths, costs, num_ranks, 1, rows_per_rank, row_tokens, "greedy")


def rank_costs(assignment: Assignment, costs: np.ndarray) -> np.ndarray:
    """The summed cost of each rank's samples."""
    rank_of = np.full(len(costs), -1, dtype=np.int64)
    for r, rank in enumerate(assignment.rows):
        for row in rank:
            rank_of[list(row)] = r
    return _sum_by_rank(rank_of, np.asarray(costs, dtype=np.float64), len(assignment.rows))


def lower_bound(costs: np.ndarray, num_ranks: int) -> float:
    """No split beats ``max(mean rank cost, largest sample)``; 0 for no samples."""
    if len(costs) == 0:
        return 0.0
    return max(float(np.sum(costs)) / num_ranks, float(np.max(costs)))


def _check(
    lengths: np.ndarray,
    costs: np.ndarray,
    num_ranks: int,
    micro_batches: int,
    rows_per_micro_batch: int,
    row_tokens: int,
    method: str,
) -> None:
    if min(num_ranks, micro_batches, rows_per_micro_batch) < 1 or row_tokens < 0:
        raise ValueError("balance needs at least one rank, micro-batch and row, of >= 0 tokens")
    if np.ndim(lengths) != 1 or np.shape(lengths) != np.shape(costs):
        raise ValueError("lengths and costs must be 1-D arrays of the same length")
    if len(lengths) and (np.min(lengths) < 0 or not np.all(np.isfinite(costs))):
        raise ValueError("sample lengths must be >= 0 and costs finite")
    if method not in METHODS:
        raise ValueError(f"unknown balance method {method!r}; choose one of {METHODS}")


@dataclass(frozen=True)
class _Shape:
    """Rows are numbered globally, rank by rank and micro-batch by micro-batch: row g is in rank
    ``g // rows_per_rank`` and in (global) micro-batch ``g // rows_per_micro_batch``."""

    ranks: int
    micro_batches: int
    rows_per_micro_batch: int
    row_tokens: int

    @property
    def rows_per_rank(self) -> int:
        return self.micro_batches * self.rows_per_micro_batch


# A placement is ``row_of``: an int64 array, the global row of each sample or -1 (left over).


def _sum_by_rank(rank_of: np.ndarray, costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """Summed in sample order, so every caller gets bit-identical sums."""
    placed = rank_of >= 0
    return np.bincount(rank_of[placed], weights=costs[placed], minlength=num_ranks)


def _better(
    shape: _Shape, balanced: np.ndarray, unbalanced: np.ndarray, costs: np.ndarray
) -> np.ndarray:
    """``balanced`` if it places at least as many samples at no higher maximum rank cost;
    otherwise ``unbalanced``."""
    if np.count_nonzero(balanced >= 0) < np.count_nonzero(unbalanced >= 0):
        return unbalanced
    worst = [
        _sum_by_rank(
            np.where(row_of >= 0, row_of // shape.rows_per_rank, -1), costs, shape.ranks
        ).max(initial=0.0)
        for row_of in (balanced, unbalanced)
    ]
    return balanced if worst[0] <= worst[1] else unbalanced


def _assignment(shape: _Shape, row_of: np.ndarray) -> Assignment:
    """The nested tuples of a placement (samples of a row in index order)."""
    num_rows = shape.ranks * shape.rows_per_rank
    keys = row_of + 1
    if num_rows < 2**16:  # numpy radix-sorts 16-bit keys: several times faster
        keys = keys.astype(np.uint16)
    order = np.argsort(keys, kind="stable")
    starts = np.searchsorted(keys[order], np.arange(num_rows + 2)).tolist()
    flat = order.tolist()
    rows = [tuple(flat[starts[g] : starts[g + 1]]) for g in range(1, num_rows + 1)]
    per_rank = shape.rows_per_rank
    ranks = tuple(zip(*(rows[j::per_rank] for j in range(per_rank)), strict=True))
    return Assignment(ranks, tuple(flat[: starts[1]]))


class _Packer:
    """Rows filled one sample at a time (Python lists: fastest for single updates)."""

    def __init__(self, shape: _Shape, lengths: list[int], costs: list[float]) -> None:
        self.shape, self.lengths, self.costs = shape, lengths, costs
        self.per_rank, self.per_mb = shape.rows_per_rank, shape.rows_per_micro_batch
        self.free = [shape.row_tokens] * (shape.ranks * self.per_rank)
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


def _pack_in_order(shape: _Shape, lengths: np.ndarray) -> np.ndarray:
    """``none``: samples in order, first fit over the current rank's rows; a sample that does not
    fit moves on to the next rank for good. Samples left when ranks run out are left over."""
    row_tokens, per_rank = shape.row_tokens, shape.rows_per_rank
    free = [row_tokens] * (shape.ranks * per_rank)
    row_of = [-1] * len(lengths)
    first, end = 0, per_rank  # the current rank's rows: [first, end)
    for i, length in enumerate(lengths.tolist()):
        if length > row_tokens:  # fits no rank: must not use them all up
            continue
        row = first
        while row < end and free[row] < length:
            row += 1
        if row == end:
            if end == len(free):
                break
            first, end = end, end + per_rank
        free[row] -= length
        row_of[i] = row
    return np.fromiter(row_of, dtype=np.int64, count=len(row_of))


def _pack_greedy(shape: _Shape, lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """``greedy``: every sample, largest first, to the least-loaded rank that holds it.

    With many ranks, numpy places whole batches at once while batches are large (``_Phases``);
    the heap loop does the rest. Both place exactly as the one-by-one rule says.
    """
    order = np.argsort(-costs, kind="stable")
    phases = _Phases(shape, lengths[order], costs[order])
    if shape.ranks >= PHASE_MIN_RANKS:
        phases.run(PHASE_MIN_BATCH)
    row_of = np.full(len(order), -1, dtype=np.int64)
    row_of[order] = phases.rows
    if phases.done < len(order):  # the rest one by one (renumbered 0, 1, ... in ``p``)
        rest = order[phases.done :]
        p = _Packer(shape, lengths[rest].tolist(), costs[rest].tolist())
        p.free, p.mb_cost = phases.free.ravel().tolist(), phases.mb_cost.ravel().tolist()
        heap = [(load, r) for r, load in enumerate(phases.loads.tolist())]
        heapq.heapify(heap)
        _fill_least_loaded(p, list(range(len(rest))), heap)
        row_of[rest] = p.row_of
    return row_of


def _fill_least_loaded(p: _Packer, order: list[int], heap: list[tuple[float, int]]) -> None:
    """Place each sample of ``order`` on the least-loaded rank with room, ties by rank id.

    ``heap`` holds (load, rank) of every rank. A rank too full for the current sample waits
    aside, keyed by its room, until a sample short enough comes. With samples in decreasing
    length, and since a rank's room only shrinks when it takes a sample, each sample costs
    O(log ranks) amortised.
    """
    aside: list[tuple[int, int, float]] = []  # (-room, rank, load)
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


class _Phases:
    """``greedy`` in numpy, a batch of samples at a time (samples already in greedy order).

    A phase gives the next samples one each to distinct ranks, lightest first (``_queue``), for
    as long as that is provably what the one-by-one rule does. Samples come in decreasing
    cost, so a phase places hundreds or thousands of samples at once.
    """

    def __init__(self, shape: _Shape, lengths: np.ndarray, costs: np.ndarray) -> None:
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
        return row, free.max(axis=1)

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
    step, head, k = 0, 0, 0  # head: the next of ``pool``
    while (waiting or k < len(late)) and step < steps:
        next_join = joins[k] if k < len(late) else steps
        if waiting:
            at = step + max(0, bisect.bisect_left(pool, waiting[0]) - head)
            if at < next_join:
                head, step = head + at - step, at
                taken_at[step] = heapq.heappop(waiting)
                step += 1
                continue
        if head + next_join - step > len(pool):  # the pool runs dry before anyone joins
            break
        head, step = head + next_join - step, next_join
        while k < len(late) and joins[k] == next_join:
            heapq.heappush(waiting, late[k])
            k += 1
    return taken_at


def _pack_karmarkar_karp(shape: _Shape, lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """``karmarkar_karp``: split costs over ranks, pack each rank, spill what does not fit."""
    order = np.argsort(-costs, kind="stable").tolist()
    p = _Packer(shape, lengths.tolist(), costs.tolist())
    target = [-1] * len(order)
    for rank, samples in enumerate(_largest_differencing(p.costs, order, shape.ranks)):
        for i in samples:
            target[i] = rank
    spill = []  # in decreasing cost, like ``order``
    for i in order:
        row = p.pick_row(target[i], p.lengths[i])
        if row < 0:
            spill.append(i)
        else:
            p.put(i, row)
    rank_of = np.asarray(p.row_of, dtype=np.int64)
    rank_of = np.where(rank_of >= 0, rank_of // shape.rows_per_rank, -1)
    heap = [(load, r) for r, load in enumerate(_sum_by_rank(rank_of, costs, shape.ranks).tolist())]
    heapq.heapify(heap)
    _fill_least_loaded(p, spill, heap)
    return np.asarray(p.row_of, dtype=np.int64)


# A subset of a partial partition: a sample index, or the union of two subsets.
_Node: TypeAlias = "int | tuple[_Node, _Node]"


class _Partial:
    """A partial k-way partition: its non-empty subsets, largest sum first.

    ``keys`` are the negated sums (ascending), so the smallest subset is at the end.
    """

    __slots__ = ("keys", "nodes")

    def __init__(self, keys: list[float], nodes: list[_Node]) -> None:
        self.keys, self.nodes = keys, nodes

    def spread(self, k: int) -> float:
        """Largest minus smallest subset sum (empty subsets count as 0)."""
        smallest = -self.keys[-1] if len(self.keys) == k else 0.0
        return -self.keys[0] - smallest


def _largest_differencing(costs: list[float], order: list[int], k: int) -> list[list[int]]:
    """Karmarkar–Karp for k subsets: repeatedly combine the two partial partitions that differ
    most, largest subset with smallest. Single samples wait in ``order`` (decreasing cost), so
    only combined partitions go through the heap; ties break on creation order.
    """
    n = len(order)
    heap: list[tuple[float, int, _Partial]] = []
    head = 0
    for created in itertools.count(n):
        if (n - head) + len(heap) <= 1:
            break
        first, head = _pop_widest(heap, costs, order, head)
        second, head = _pop_widest(heap, costs, order, head)
        merged = _combine(_partial(first, costs), second, costs, k)
        heapq.heappush(heap, (-merged.spread(k), created, merged))
    groups: list[list[int]] = [[] for _ in range(k)]
    last = heap[0][2] if heap else _partial(order[0], costs) if n else None
    for rank, node in enumerate(last.nodes if last else []):
        groups[rank] = _flatten(node)
    return groups


def _pop_widest(
    heap: list[tuple[float, int, _Partial]], costs: list[float], order: list[int], head: int
) -> tuple[_Partial | int, int]:
    """The partial partition with the largest spread: the heap top, or the next single sample
    (returned as its index)."""
    if head < len(order):
        i = order[head]
        if not heap or (-costs[i], head) < heap[0][:2]:
            return i, head + 1
    return heapq.heappop(heap)[2], head


def _partial(part: _Partial | int, costs: list[float]) -> _Partial:
    return _Partial([-costs[part]], [part]) if isinstance(part, int) else part


def _combine(a: _Partial, b: _Partial | int, costs: list[float], k: int) -> _Partial:
    """Pair a's subsets, largest first, with b's, smallest first (empty subsets included)."""
    if isinstance(b, int):  # one sample: the common case, kept fast
        key: float = -costs[b]
        node: _Node = b
        if len(a.keys) == k:  # it joins the smallest subset
            key, node = key + a.keys.pop(), (a.nodes.pop(), b)
        at = bisect.bisect_right(a.keys, key)
        a.keys.insert(at, key)
        a.nodes.insert(at, node)
        return a
    if len(a.keys) < len(b.keys):
        a, b = b, a
    overlap = max(0, len(a.keys) + len(b.keys) - k)
    alone = len(b.keys) - overlap  # b's largest subsets meet a's empty ones
    added = [(b.keys[t], b.nodes[t]) for t in range(alone)]
    for t in range(alone, len(b.keys)):
        added.append((a.keys.pop() + b.keys[t], (a.nodes.pop(), b.nodes[t])))
    if len(added) > 32:  # many: re-sort once rather than insert one by one
        merged = sorted([*zip(a.keys, a.nodes, strict=True), *added], key=lambda e: e[0])
        return _Partial([e[0] for e in merged], [e[1] for e in merged])
    for key, node in added:
        at = bisect.bisect_right(a.keys, key)
        a.keys.insert(at, key)
        a.nodes.insert(at, node)
    return a


def _flatten(node: _Node) -> list[int]:
    samples, stack = [], [node]
    while stack:
        top = stack.pop()
        if isinstance(top, int):
            samples.append(top)
        else:
            stack.extend(top)
    return samples
