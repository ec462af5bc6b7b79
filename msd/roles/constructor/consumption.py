"""What the ranks a Data Constructor serves have consumed, and what it tells the Planner of
it (no sockets): ``Progress`` when all moved on, their data-waits, each rank's load."""

from __future__ import annotations

from collections import deque

import numpy as np

from msd.wire.protocol import Progress, RankLoad

RANK_WAITS = 100  # a rank's data-wait percentiles in its Stats are over this many steps
REPORT_WAITS = 64  # data-waits sent in a Progress at the latest, even if no step was consumed


class Consumption:
    """State: ``consumed`` (each rank's first step not consumed), ``reported`` (the steps the
    last ``Progress`` said every rank consumed), ``waits`` (data-waits not reported yet),
    ``rank_waits`` (each rank's last ``RANK_WAITS``)."""

    def __init__(self, ranks: tuple[int, ...], start: int) -> None:
        self.consumed = {rank: start for rank in ranks}
        self.reported = start
        self.waits: list[float] = []
        self.rank_waits: dict[int, deque[float]] = {r: deque(maxlen=RANK_WAITS) for r in ranks}

    def advance(self, rank: int, consumed: int, wait_s: float) -> bool:
        """Rank ``rank`` consumed every step before ``consumed``, having waited ``wait_s`` for
        its data; whether that is news."""
        if consumed <= self.consumed[rank]:
            return False
        self.consumed[rank] = consumed
        self.waits.append(wait_s)
        self.rank_waits[rank].append(wait_s)
        return True

    def done(self, ranks: list[int]) -> int:
        """The first step one of ``ranks`` has not consumed."""
        return min(self.consumed[r] for r in ranks)

    def progress(self, step_bytes: int, built: int) -> Progress | None:
        """What to tell the Planner, when every rank consumed more or enough waits are in."""
        consumed = min(self.consumed.values())
        if consumed <= self.reported and len(self.waits) < REPORT_WAITS:
            return None
        self.reported = max(self.reported, consumed)
        waits, self.waits = tuple(self.waits), []
        return Progress(consumed=self.reported, waits_s=waits, step_bytes=step_bytes, built=built)

    def loads(self, built: int) -> tuple[RankLoad, ...]:
        """Each rank's consumed steps, steps built ahead of it and data-wait percentiles."""
        ranks = []
        for rank, waits in self.rank_waits.items():
            ms = np.array(waits) * 1000 if waits else np.zeros(1)
            p50, p99 = np.percentile(ms, [50, 99])
            ahead = max(0, built - self.consumed[rank])
            ranks.append(RankLoad(rank, self.consumed[rank], ahead, float(p50), float(p99)))
        return tuple(ranks)
