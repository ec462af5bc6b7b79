"""Packing a step's pieces into the global batch's rows under two budgets: a row's tokens, and
a micro-batch's image patches (``balance.max_patches``: what a rank's vision encoder takes at
once). Used instead of ``msd.plan.rows.RowPacker`` when a recipe sets ``max_patches``.

Micro-batch ``m`` of the global batch is rows ``m × rows_per_micro_batch ...``: the grouping
does not depend on how many ranks share the step (the global rows and the micro-batch size do
not), so neither does which samples fit. Best fit as ``RowPacker``: each piece goes to the row
with the least room that holds it, in a micro-batch with patch room for it (ties: the lower
row); a group of pieces fits all or none. The row of every piece placed is kept: when the
balancer's split breaks a patch budget, these rows, dealt to ranks a micro-batch at a time,
are the step's split instead (``deal_micro_batches``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from msd.plan.rows import deal_rows


class PatchRowPacker:
    def __init__(
        self, num_rows: int, row_tokens: int, rows_per_micro_batch: int, max_patches: int
    ) -> None:
        self.num_rows, self.row_tokens = num_rows, row_tokens
        self.free = np.full(num_rows, row_tokens, dtype=np.int64)
        self.micro_of = np.arange(num_rows) // rows_per_micro_batch
        self.patch_room = np.full(max(1, num_rows // rows_per_micro_batch), max_patches)
        self.rows: list[int] = []  # the row of each piece placed, in order
        self.count = 0

    def free_tokens(self) -> int:
        return int(self.free.sum())

    def _best(self, length: int, patches: int) -> int:
        fits = (self.free >= length) & (self.patch_room[self.micro_of] >= patches)
        if not fits.any():
            return -1
        return int(np.argmin(np.where(fits, self.free, self.row_tokens + 1)))

    def _put(self, row: int, length: int, patches: int) -> None:
        self.free[row] -= length
        self.patch_room[self.micro_of[row]] -= patches
        self.rows.append(row)

    def place(self, lengths: Sequence[int], patches: Sequence[int]) -> bool:
        """Place every piece (as ``count, count+1, ...``) or none of them."""
        placed: list[tuple[int, int, int]] = []
        for length, p in zip(lengths, patches, strict=True):
            row = self._best(length, p)
            if row < 0:
                for r, n, q in reversed(placed):
                    self.free[r] += n
                    self.patch_room[self.micro_of[r]] += q
                    self.rows.pop()
                return False
            self._put(row, length, p)
            placed.append((row, length, p))
        self.count += len(lengths)
        return True

    def place_each(
        self,
        lengths: list[int],
        groups: dict[int, list[int]],
        misfits: int,
        patches: list[int],
        group_patches: dict[int, list[int]],
    ) -> tuple[int, list[int]]:
        """``RowPacker.place_each`` with each position's patches (a group's: per piece)."""
        missed: list[int] = []
        for j, length in enumerate(lengths):
            group = groups.get(j)
            if group is not None:
                fitted = bool(group) and self.place(group, group_patches[j])
            else:
                row = self._best(length, patches[j])
                fitted = row >= 0
                if fitted:
                    self._put(row, length, patches[j])
                    self.count += 1
            if not fitted and (group is None or group):
                missed.append(j)
                if len(missed) == misfits:
                    return j + 1, missed
        return len(lengths), missed


def micro_batch_patches(
    row_of: np.ndarray, patches: np.ndarray, rows_per_micro_batch: int, num_rows: int
) -> np.ndarray:
    """Patches in each micro-batch of the global batch under a placement (``row_of``, -1: not
    placed)."""
    placed = row_of >= 0
    micro = row_of[placed] // rows_per_micro_batch
    return np.bincount(micro, patches[placed], minlength=num_rows // rows_per_micro_batch)


def deal_micro_batches(
    rows: Sequence[int],
    costs: np.ndarray,
    num_ranks: int,
    rows_per_rank: int,
    rows_per_micro_batch: int,
    num_rows: int,
) -> np.ndarray:
    """The global row of each piece when the packer's micro-batches (``rows``: each piece's
    row) are dealt whole to ranks, heaviest first to the lightest rank with a free slot."""
    per_micro: list[list[int]] = [[] for _ in range(num_rows // rows_per_micro_batch)]
    for piece, row in enumerate(rows):
        per_micro[row // rows_per_micro_batch].append(piece)
    micro_batches = rows_per_rank // rows_per_micro_batch
    dealt = deal_rows(per_micro, costs, num_ranks, micro_batches, 1)
    row_of = np.full(len(rows), -1, dtype=np.int64)
    rows_arr = np.asarray(rows, dtype=np.int64)
    for rank, micros in enumerate(dealt):
        for slot, members in enumerate(micros):
            if not members:
                continue
            old_micro = int(rows_arr[members[0]]) // rows_per_micro_batch
            new_first = rank * rows_per_rank + slot * rows_per_micro_batch
            picked = np.asarray(members, dtype=np.int64)
            row_of[picked] = new_first + rows_arr[picked] - old_micro * rows_per_micro_batch
    return row_of
