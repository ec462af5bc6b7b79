"""Split one global batch over data-parallel ranks and pack each rank's share into rows.

Greedy longest-processing-time: samples in decreasing cost go to the least-loaded rank that has
a row with room (best fit). A sample that fits nowhere is left over for the next step; nothing is
dropped. Pure and deterministic: ties break on index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Assignment:
    """``rows[r][j]`` lists the samples (indices into the input) packed in row j of rank r."""

    rows: tuple[tuple[tuple[int, ...], ...], ...]
    leftover: tuple[int, ...]


def _best_fit(free: list[int], length: int) -> int | None:
    """The row with the least room that still holds ``length`` tokens."""
    best = None
    for j, room in enumerate(free):
        if room >= length and (best is None or room < free[best]):
            best = j
    return best


def balance_greedy(
    lengths: np.ndarray, costs: np.ndarray, num_ranks: int, rows_per_rank: int, row_tokens: int
) -> Assignment:
    """Assign samples to ``num_ranks`` ranks of ``rows_per_rank`` rows of ``row_tokens`` tokens."""
    rank_cost = [0.0] * num_ranks
    free = [[row_tokens] * rows_per_rank for _ in range(num_ranks)]
    rows: list[list[list[int]]] = [[[] for _ in range(rows_per_rank)] for _ in range(num_ranks)]
    leftover = []
    for i in sorted(range(len(lengths)), key=lambda i: (-costs[i], i)):
        length = int(lengths[i])
        for r in sorted(range(num_ranks), key=lambda r: (rank_cost[r], r)):
            j = _best_fit(free[r], length)
            if j is not None:
                rows[r][j].append(i)
                free[r][j] -= length
                rank_cost[r] += float(costs[i])
                break
        else:
            leftover.append(i)
    packed = tuple(tuple(tuple(row) for row in rank) for rank in rows)
    return Assignment(packed, tuple(sorted(leftover)))
