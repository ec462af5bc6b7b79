"""Which of a loader's shards reads next (``NextRead``): one the Planner waits for first, else
the hungry one with the emptiest read-ahead.

A shard's wait, fill and hunger change only when something happens to it: it reads, samples
of it are routed, the Planner wants a position of it, or a generation of it begins, is cut or
ends. The loader says so (``changed``), and only those shards are looked at again, so a loader
serving thousands of sources does not look at every one of them for each chunk it reads.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from msd.roles.loader.shard import SourceShard


class NextRead:
    """The shards that may read, kept up to date from the ones that changed."""

    def __init__(self, shards: Iterable[SourceShard]) -> None:
        self.shards = {shard.source: shard for shard in shards}
        self.rank = {source: i for i, source in enumerate(self.shards)}  # ties: the first
        self.dirty: set[int] = set(self.shards)
        self.waited: set[int] = set()  # sources the Planner waits for a position of
        self.hungry: dict[int, float] = {}  # source: fill, of those reading ahead
        # (fill, rank, source) of the hungry shards, emptiest first; an entry whose fill is no
        # longer its source's in ``hungry`` is stale and dropped when it comes to the top
        self.heap: list[tuple[float, int, int]] = []

    def changed(self, source: int) -> None:
        self.dirty.add(source)

    def pick(self, now: float) -> SourceShard | None:
        """The shard to read a chunk of now, if any: the first the Planner waits for, else the
        emptiest hungry one; a shard whose store failed its last read only once its retry is
        due (``now``, monotonic seconds)."""
        for source in self.dirty:
            shard = self.shards[source]
            if shard.waited_for:
                self.waited.add(source)
            else:
                self.waited.discard(source)
            if not shard.hungry:
                self.hungry.pop(source, None)
            elif self.hungry.get(source) != (fill := shard.fill):
                self.hungry[source] = fill
                heapq.heappush(self.heap, (fill, self.rank[source], source))
        self.dirty.clear()
        for source in sorted(self.waited, key=self.rank.__getitem__):
            shard = self.shards[source]
            if _due(shard, now):
                return shard
        return self._emptiest(now)

    def _emptiest(self, now: float) -> SourceShard | None:
        heap, hungry = self.heap, self.hungry
        if len(heap) > 2 * len(hungry) + 64:  # mostly stale entries: rebuilt
            heap[:] = [(fill, self.rank[source], source) for source, fill in hungry.items()]
            heapq.heapify(heap)
        while heap and hungry.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        if not heap:
            return None
        top = self.shards[heap[0][2]]
        if _due(top, now):
            return top
        # the emptiest waits for its store to answer (rare): the emptiest of those that do not
        due = [(f, self.rank[s], s) for s, f in hungry.items() if _due(self.shards[s], now)]
        return self.shards[min(due)[2]] if due else None


def _due(shard: SourceShard, now: float) -> bool:
    return shard.outage is None or shard.outage.retry_at <= now
