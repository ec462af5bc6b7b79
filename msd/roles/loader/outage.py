"""When a loader tries again a read an object store failed: backing off, within a budget.

A shard whose read failed is set aside (the loader keeps answering the Planner and reading its
other sources) and tried again after a delay that doubles, up to `MAX_DELAY_S`; once the store
has failed it for ``loader.read_retry_s`` the job stops, naming the source. Pure: the loader's
clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_DELAY_S = 0.1
MAX_DELAY_S = 5.0


@dataclass
class Outage:
    """A run of failed reads of one shard, from ``since``; ``retries``: reads tried again."""

    since: float
    budget_s: float
    retries: int = 0
    retry_at: float = 0.0

    def failed(self, now: float) -> bool:
        """Another read failed at ``now``: schedule the next try; False once the budget is
        spent (the next try would begin after it)."""
        left = self.since + self.budget_s - now
        if left <= 0:
            return False
        delay = min(MAX_DELAY_S, FIRST_DELAY_S * 2.0 ** min(self.retries, 32), left)
        self.retries += 1
        self.retry_at = now + delay
        return True
