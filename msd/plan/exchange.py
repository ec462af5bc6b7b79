"""``greedy``'s improvement pass: relieve the slowest rank by exchanges with lighter ranks.

Longest-processing-time-first leaves the slowest rank slower than it need be when its last
samples came while lighter ranks had no room. One exchange moves a sample ``a`` of the slowest
rank ``h`` into row ``k`` of a lighter rank ``r`` and moves ``B``, samples of row k, into ``a``'s
old row: first B = the fewest shortest samples of row k that leave room for ``a`` (none if row k
has room: a plain move), then B = each sample of row k on its own that does (a swap). It is
taken when ``a``'s old row holds B and ``d = cost(a) - cost(B)`` satisfies ``0 < d < load(h) -
load(r)``: rank h gets cheaper and rank r stays below h's old load, so the pair's maximum drops.

Candidates are tried in a fixed order and the first that qualifies is taken: samples of h by
decreasing cost (ties: lower index), the ``LIGHT_RANKS`` lightest ranks (ties: lower id), their
rows in order, the sets B in the order above. Then the new slowest rank is relieved, up to
``MAX_EXCHANGES`` times; the pass stops at the first slowest rank no exchange relieves, or after
``STALL`` exchanges in a row that hardly lowered the maximum (a plateau of near-equal ranks, too
wide to lower this way), or when a search would look at more than ``TRIES`` candidates in all
(a candidate: a, row k and a set B whose tokens fit both rows); that bounds the pass's cost when
ranks hold many samples. Deterministic; every sample stays placed; micro-batches are not
rebalanced (a sample takes its predecessor's row).
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from msd.plan.placement import Shape, rank_loads

MAX_EXCHANGES = 64
STALL = 4  # exchanges in a row that hardly lower the maximum: a plateau, give up
HARDLY = 1e-4  # a drop of the maximum by less than this share of it
LIGHT_RANKS = 8
TRIES = 4096  # candidate exchanges looked at in one pass, at most: bounds its cost


def exchange(shape: Shape, lengths: np.ndarray, costs: np.ndarray, row_of: np.ndarray) -> None:
    """Improve the placement ``row_of`` in place (rows are global, see ``Shape``)."""
    if shape.ranks < 2 or not np.any(row_of >= 0):
        return
    rows = _Rows(shape, lengths, costs, row_of)
    loads = rank_loads(shape, row_of, costs)
    worst, stalled = loads.max(), 0
    for _ in range(MAX_EXCHANGES):
        heavy = int(np.argmax(loads))
        found = rows.find(heavy, _lightest(loads, loads[heavy]), loads.tolist())
        if found is None:
            break
        a, k, taken, d = found
        rows.swap(a, k, taken)
        loads[heavy] -= d
        loads[k // shape.rows_per_rank] += d
        stalled = 0 if loads.max() < worst * (1 - HARDLY) else stalled + 1
        worst = min(worst, loads.max())
        if stalled == STALL:
            break


def _lightest(loads: np.ndarray, below: float) -> list[int]:
    """The ``LIGHT_RANKS`` lightest ranks lighter than ``below``, lightest first (ties: lower
    id)."""
    count = min(LIGHT_RANKS, len(loads))
    some = np.argpartition(loads, count - 1)[:count] if count < len(loads) else np.arange(count)
    cut = loads[some].max()
    chosen = np.flatnonzero(loads <= cut)  # every rank tied with the last one, too
    chosen = chosen[np.argsort(loads[chosen], kind="stable")][:count]
    return [r for r in chosen.tolist() if loads[r] < below]


class _Rows:
    """The samples of each row, shortest first (ties: lower index), and each row's free room.

    A row's sample list (and its samples' lengths and costs) is read when first needed: the
    pass looks at a few ranks only.
    """

    def __init__(
        self, shape: Shape, lengths: np.ndarray, costs: np.ndarray, row_of: np.ndarray
    ) -> None:
        self.shape, self.all_lengths, self.all_costs = shape, lengths, costs
        self.lengths: dict[int, int] = {}
        self.costs: dict[int, float] = {}
        self.row_of = row_of
        placed = row_of >= 0
        used = np.bincount(row_of[placed], weights=lengths[placed], minlength=shape.num_rows)
        self.free = (shape.row_tokens - used.astype(np.int64)).tolist()
        keys = row_of + 1
        if shape.num_rows < 2**16:  # numpy radix-sorts 16-bit keys: several times faster
            keys = keys.astype(np.uint16)
        self.order = np.argsort(keys, kind="stable")
        self.bounds = np.searchsorted(keys[self.order], np.arange(1, shape.num_rows + 2))
        self.lists: dict[int, list[int]] = {}
        self.views: dict[int, tuple[list[int], list[int], list[int]]] = {}
        self.tries = TRIES

    def members(self, row: int) -> list[int]:
        if row not in self.lists:
            samples = self.order[self.bounds[row] : self.bounds[row + 1]]
            self.lengths.update(
                zip(samples.tolist(), self.all_lengths[samples].tolist(), strict=True)
            )
            self.costs.update(zip(samples.tolist(), self.all_costs[samples].tolist(), strict=True))
            self.lists[row] = sorted(samples.tolist(), key=lambda i: (self.lengths[i], i))
        return self.lists[row]

    def find(
        self, heavy: int, light: list[int], loads: list[float]
    ) -> tuple[int, int, list[int], float] | None:
        """The first exchange that relieves rank ``heavy``: (a, row k, B, cost(a) - cost(B))."""
        per_rank, lengths, costs = self.shape.rows_per_rank, self.lengths, self.costs
        mine = [i for g in range(heavy * per_rank, (heavy + 1) * per_rank) for i in self.members(g)]
        targets = [
            (loads[heavy] - loads[rank], k, self._row_view(k))
            for rank in light
            for k in range(rank * per_rank, (rank + 1) * per_rank)
        ]
        for a in sorted(mine, key=lambda i: (-costs[i], i)):
            length, cost = lengths[a], costs[a]
            room_for_b = self.free[int(self.row_of[a])] + length
            for gap, k, (members, lens, sums) in targets:
                need = length - self.free[k]  # tokens B must free in row k
                first = bisect.bisect_left(sums, need)  # the shortest samples that free them
                if first < len(sums) and sums[first] <= room_for_b:
                    if not self.tries:
                        return None
                    self.tries -= 1
                    taken = members[:first]
                    d = cost - sum(costs[b] for b in taken)
                    if 0 < d < gap:
                        return a, k, taken, d
                # each sample on its own that frees them and fits a's row, shortest first
                lo, hi = bisect.bisect_left(lens, need), bisect.bisect_right(lens, room_for_b)
                for b in members[max(lo, 0) : hi]:
                    if [b] != members[:first]:
                        if not self.tries:
                            return None
                        self.tries -= 1
                        d = cost - costs[b]
                        if 0 < d < gap:
                            return a, k, [b], d
        return None

    def _row_view(self, row: int) -> tuple[list[int], list[int], list[int]]:
        """A row's samples (shortest first), their lengths, and the lengths summed from the
        start, beginning with 0 (taking the first n frees ``sums[n]`` tokens)."""
        if row not in self.views:
            members = self.members(row)
            lens = [self.lengths[b] for b in members]
            self.views[row] = members, lens, [0, *itertools.accumulate(lens)]
        return self.views[row]

    def swap(self, a: int, k: int, taken: list[int]) -> None:
        """Sample ``a`` into row ``k``; the samples ``taken`` from row k into a's old row."""
        j = int(self.row_of[a])
        self.views.pop(j, None)
        self.views.pop(k, None)
        self._remove(j, a)
        for b in taken:
            self._remove(k, b)
            self._add(j, b)
        self._add(k, a)

    def _remove(self, row: int, i: int) -> None:
        self.members(row).remove(i)
        self.free[row] += self.lengths[i]

    def _add(self, row: int, i: int) -> None:
        members, key = self.members(row), (self.lengths[i], i)
        at = 0
        while at < len(members) and (self.lengths[members[at]], members[at]) < key:
            at += 1
        members.insert(at, i)
        self.free[row] -= self.lengths[i]
        self.row_of[i] = row
