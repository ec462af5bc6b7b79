"""Who is sent which pieces of a planned step, as index arrays over the plan's columns.

Each Constructor gets the pieces of the DP ranks it serves, rank by rank in packing order; each
loader gets the samples it holds, sorted by (source, gpos) and then Constructor, a sample once per
Constructor that needs it (``DISCARD`` alone for a sample dropped by the plan). Pure: numpy
sorts and splits, no per-piece Python, so the cost stays small at thousands of ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from msd.plan.step import Pieces

DISCARD = -1  # msd.wire.protocol.DISCARD: the loader forgets the sample


class Placed(NamedTuple):
    """The pieces that are in rows, in packing order, with their DP rank and row in it."""

    source: np.ndarray
    gpos: np.ndarray
    length: np.ndarray
    offset: np.ndarray
    padded: np.ndarray
    dp: np.ndarray
    row: np.ndarray


def placed(pieces: Pieces, rows_per_rank: int) -> Placed:
    """A plan's pieces in rows, with their rank and row: piece i of global row g has rank
    ``g // rows_per_rank`` and row ``g % rows_per_rank``."""
    bounds = pieces.bounds
    global_row = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    ranks, rows = np.divmod(global_row, rows_per_rank)
    source, gpos, length, offset, padded = pieces.in_rows()
    return Placed(source, gpos, length, offset, padded, ranks, rows)


class Fanout(NamedTuple):
    """DP rank r is served by ``dests[start[r] : start[r + 1]]``, in the iteration order of its
    set (the order a set built from them depends on)."""

    start: np.ndarray
    dests: np.ndarray

    @staticmethod
    def of(dp_constructors: Mapping[int, Iterable[int]], ranks: int) -> Fanout:
        served = [list(dp_constructors.get(dp, ())) for dp in range(ranks)]
        counts = np.fromiter(map(len, served), dtype=np.int64, count=ranks)
        flat = [c for cs in served for c in cs]
        start = np.concatenate(([0], np.cumsum(counts)))
        return Fanout(start, np.array(flat, dtype=np.int64))

    def counts(self) -> np.ndarray:
        return np.diff(self.start)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, counts)])``, without a loop."""
    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(
        int(ends[-1]) if len(ends) else 0
    )


def by_constructor(
    dp: np.ndarray, fanout: Fanout, constructors: int
) -> tuple[np.ndarray, np.ndarray]:
    """The pieces (``dp``: each one's rank, ascending) each Constructor is sent: indices, and
    Constructor c's are ``index[bounds[c] : bounds[c + 1]]``, its ranks in order."""
    ranks = len(fanout.start) - 1
    pair_dp = np.repeat(np.arange(ranks), fanout.counts())
    keep = (fanout.dests >= 0) & (fanout.dests < constructors)
    pair_dp, pair_c = pair_dp[keep], fanout.dests[keep]
    order = np.lexsort((pair_dp, pair_c))
    pair_dp, pair_c = pair_dp[order], pair_c[order]
    rank_bounds = np.searchsorted(dp, np.arange(ranks + 1))
    counts = rank_bounds[pair_dp + 1] - rank_bounds[pair_dp]
    index = _ranges(rank_bounds[pair_dp], counts)
    ends = np.concatenate(([0], np.cumsum(counts)))
    return index, ends[np.searchsorted(pair_c, np.arange(constructors + 1))]


class RouteTable:
    """A step's Route entries of every loader (loader i: number i in order of first appearance):
    rows ``bounds[i] : bounds[i + 1]``, sorted by (source, gpos, destination)."""

    def __init__(self, loader: np.ndarray, columns: list[np.ndarray], loaders: int) -> None:
        self.source, self.gpos, self.dest = columns
        self.bounds = np.searchsorted(loader, np.arange(loaders + 1))

    def entries(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Loader i's (source, gpos, destination) columns."""
        at = slice(int(self.bounds[i]), int(self.bounds[i + 1]))
        return self.source[at], self.gpos[at], self.dest[at]

    def samples(self) -> tuple[np.ndarray, np.ndarray]:
        """The (source, gpos) of every sample routed, once each."""
        new = np.ones(len(self.source), dtype=bool)
        new[1:] = (self.source[1:] != self.source[:-1]) | (self.gpos[1:] != self.gpos[:-1])
        return self.source[new], self.gpos[new]

    def by_sample(self, i: int) -> dict[tuple[int, int], tuple[int, ...]]:
        """Loader i's samples → their destinations, ascending."""
        found: dict[tuple[int, int], tuple[int, ...]] = {}
        for s, g, d in zip(*(c.tolist() for c in self.entries(i)), strict=True):
            found[(s, g)] = (*found.get((s, g), ()), d)
        return found


def route_table(
    loader: np.ndarray,
    source: np.ndarray,
    gpos: np.ndarray,
    dp: np.ndarray,
    fanout: Fanout,
    dropped: tuple[np.ndarray, np.ndarray, np.ndarray],
    loaders: int,
) -> RouteTable:
    """The Route entries of pieces (each one's loader number, key, rank; in packing order) and
    of the samples dropped (loader number, source, gpos), for ``loaders`` loaders: one per
    sample and destination."""
    counts = fanout.counts()[dp]
    piece = np.repeat(np.arange(len(dp)), counts)
    at = _ranges(fanout.start[dp], counts)
    columns = [
        np.concatenate((loader[piece], dropped[0])),
        np.concatenate((source[piece], dropped[1])),
        np.concatenate((gpos[piece], dropped[2])),
        np.concatenate((fanout.dests[at], np.full(len(dropped[0]), DISCARD, dtype=np.int64))),
    ]
    order = np.lexsort(columns[::-1])  # by loader, source, gpos, dest
    columns = [c[order] for c in columns]
    keep = _distinct(columns)
    return RouteTable(columns[0][keep], [c[keep] for c in columns[1:]], loaders)


def _distinct(columns: list[np.ndarray]) -> np.ndarray:
    """Which sorted rows to keep: the first of each (loader, key, dest); of a sample dropped,
    only its ``DISCARD`` (it replaces any other destination)."""
    loader, source, gpos, dest = columns
    if not len(dest):
        return np.zeros(0, dtype=bool)
    new_key = np.ones(len(dest), dtype=bool)
    new_key[1:] = (
        (loader[1:] != loader[:-1]) | (source[1:] != source[:-1]) | (gpos[1:] != gpos[:-1])
    )
    new_dest = new_key.copy()
    new_dest[1:] |= dest[1:] != dest[:-1]
    discarded = (dest[new_key] == DISCARD)[np.cumsum(new_key) - 1]
    keep: np.ndarray = new_dest & (new_key | ~discarded)
    return keep


def shared(source: np.ndarray, gpos: np.ndarray, dp: np.ndarray, fanout: Fanout) -> np.ndarray:
    """The pieces (indices, in packing order) whose sample may go to several Constructors:
    it has several pieces, or its rank has several Constructors."""
    order = np.lexsort((gpos, source))
    same = (source[order][1:] == source[order][:-1]) & (gpos[order][1:] == gpos[order][:-1])
    split = np.zeros(len(source), dtype=bool)
    split[order[1:][same]] = split[order[:-1][same]] = True
    return np.flatnonzero(split | (fanout.counts()[dp] > 1))
