"""Counting what a role refused to act on.

Every role treats what arrives on its sockets as untrusted, even from peers that hold the
job's key: a message that cannot be decoded, carries impossible fields, or was not meant for
this role (a payload nobody routed here, a request for a step that will never be built) is
dropped and counted by reason. The counts travel in the role's ``Stats`` and show in
``msd status`` and the Prometheus metrics; the first drop of each reason is logged, then one
line per ``LOG_EVERY`` more, so a flood cannot fill the log.
"""

from __future__ import annotations

import logging

LOG_EVERY = 1000

log = logging.getLogger("msd.wire")


class Rejects:
    """Drops by reason (``malformed``, ``unexpected``, ``unplanned``, ``out-of-window``, ...)."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.counts: dict[str, int] = {}

    def count(self, reason: str, detail: str = "") -> None:
        n = self.counts.get(reason, 0) + 1
        self.counts[reason] = n
        if n == 1 or n % LOG_EVERY == 0:
            log.warning("%s: dropped a message (%s, %d so far): %s", self.role, reason, n, detail)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)
