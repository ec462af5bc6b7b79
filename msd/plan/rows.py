"""Packing a step's samples into the global batch's rows, and dealing whole rows to ranks.

Selection packs samples best-fit into the step's ``dp × rows_per_rank`` rows as they are drawn,
so which samples form a global step never depends on how many ranks will share it. If the
sample-level balancer cannot place every sample (fragmentation), ``deal_rows`` hands out these
rows whole instead, which always fits.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

LIST_ROOMS = 1 << 17  # rows up to this many tokens count rooms in a list


class RowPacker:
    """Best fit into ``num_rows`` rows of ``row_tokens``: each piece goes to the row with the least
    room that holds it (ties: the lower row id). A group of pieces fits all or none.

    Whether a piece fits depends only on the multiset of free rooms, so that is all placing
    tracks: the distinct rooms, sorted, with how many rows have each (best fit keeps them few:
    tens, even for thousands of rows). Which row took which piece, ``best_fit_rows`` works out
    again from the lengths placed, when it is needed.
    """

    def __init__(self, num_rows: int, row_tokens: int) -> None:
        self.num_rows, self.row_tokens = num_rows, row_tokens
        self.rooms = [row_tokens] if num_rows else []  # distinct free rooms, ascending
        # rows_with[room]: how many rows have that room (a list is faster; a dict for long rows)
        self.rows_with: list[int] | defaultdict[int, int] = (
            [0] * (row_tokens + 1) if row_tokens <= LIST_ROOMS else defaultdict(int)
        )
        self.rows_with[row_tokens] = num_rows
        self.count = 0  # pieces placed

    def free_rooms(self) -> list[int]:
        """The free room of every row, ascending."""
        return [room for room in self.rooms for _ in range(self.rows_with[room])]

    def free_tokens(self) -> int:
        return sum(room * self.rows_with[room] for room in self.rooms)

    def place(self, lengths: Sequence[int]) -> bool:
        """Place every length (as pieces ``count, count+1, ...``) or none of them."""
        whole = len(lengths) - 1  # a split sample: pieces that each fill an empty row, mostly
        if whole > 0 and lengths[:-1].count(self.row_tokens) == whole:
            return self._place_split(whole, lengths[-1])
        rooms = self.rooms
        moved: list[tuple[int, int]] = []  # (room before, room after) of each piece's row
        for length in lengths:
            k = bisect.bisect_left(rooms, length)
            if k == len(rooms):
                for before, after in reversed(moved):
                    self._move(after, before)
                return False
            moved.append((rooms[k], rooms[k] - length))
            self._move(rooms[k], rooms[k] - length, k)
        self.count += len(lengths)
        return True

    def _place_split(self, whole: int, last: int) -> bool:
        """``place`` of ``whole`` pieces of ``row_tokens`` then one of ``last``: each whole one
        takes an empty row (best fit has no other choice), all at once; the last goes best
        fit."""
        full = self.row_tokens
        if self.rows_with[full] < whole:  # the empty rows run out first
            return False
        self._move(full, 0, count=whole)
        k = bisect.bisect_left(self.rooms, last)
        if k == len(self.rooms):
            self._move(0, full, count=whole)
            return False
        self._move(self.rooms[k], self.rooms[k] - last, k)
        self.count += whole + 1
        return True

    def place_each(
        self, lengths: list[int], groups: dict[int, list[int]], misfits: int
    ) -> tuple[int, list[int]]:
        """Place each length on its own, in order, until ``misfits`` of them did not fit; the
        lengths at positions in ``groups`` are placed as that group instead (all or none; an
        empty group is passed over). A length placed as a group must not fit on its own.

        Returns how many lengths were looked at and the positions of those that did not fit.
        """
        rooms, rows_with = self.rooms, self.rows_with
        best_fit, insert = bisect.bisect_left, bisect.insort
        missed: list[int] = []
        grouped = 0  # positions placed as a group (``place`` counts their pieces)
        largest = rooms[-1] if rooms else -1
        for j, length in enumerate(lengths):
            if length > largest:  # rare: check for a group only here
                group = groups.get(j)
                if group is None or (group and not self.place(group)):
                    missed.append(j)
                    if len(missed) == misfits:
                        self.count += j + 1 - len(missed) - grouped
                        return j + 1, missed
                else:
                    grouped += 1
                largest = rooms[-1] if rooms else -1
                continue
            k = best_fit(rooms, length)  # the least room >= length
            room = rooms[k]
            left = rows_with[room] - 1
            rows_with[room] = left
            if not left:
                del rooms[k]
            room -= length
            left = rows_with[room]
            if not left:
                insert(rooms, room)
            rows_with[room] = left + 1
            if room + length == largest:  # the largest room may have gone
                largest = rooms[-1]
        self.count += len(lengths) - len(missed) - grouped
        return len(lengths), missed

    def _move(self, room: int, to: int, k: int = -1, count: int = 1) -> None:
        """``count`` rows' free room changes from ``room`` (at ``k`` in ``rooms``, if known) to
        ``to``."""
        if room == to:
            return
        rows_with = self.rows_with
        rows_with[room] -= count
        if not rows_with[room]:
            del self.rooms[bisect.bisect_left(self.rooms, room) if k < 0 else k]
        if not rows_with[to]:
            bisect.insort(self.rooms, to)
        rows_with[to] += count


def best_fit_rows(lengths: Sequence[int], num_rows: int, row_tokens: int) -> list[list[int]]:
    """The row of each piece when ``lengths`` are placed in order, best fit, ties to the lower
    row id (every piece must fit): the pieces in each row."""
    # A row is the int room * num_rows + row: sorted by room, then row id.
    keys = [row_tokens * num_rows + row for row in range(num_rows)]
    members: list[list[int]] = [[] for _ in range(num_rows)]
    for i, length in enumerate(lengths):
        k = bisect.bisect_left(keys, length * num_rows)
        key = keys.pop(k)
        members[key % num_rows].append(i)
        bisect.insort(keys, key - length * num_rows)
    return members


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
