"""Trainers' requests a Data Constructor holds until their batch is built (no sockets)."""

from __future__ import annotations

from msd.wire.rejects import Rejects

PARKED_PER_RANK = 4  # a Client has one request in flight (two as the stream ends)

Request = tuple[int, int]  # (rank, step)


class Parked:
    """Who asked for what: the requester's identity by (rank, step), in the order parked."""

    def __init__(self, rejects: Rejects) -> None:
        self.rejects = rejects
        self.requests: dict[Request, bytes] = {}

    def park(self, rank: int, step: int, identity: bytes) -> None:
        """Hold a request; a rank's oldest requests beyond ``PARKED_PER_RANK`` are forgotten
        (counted)."""
        self.requests[(rank, step)] = identity
        mine = sorted(s for r, s in self.requests if r == rank)
        for old in mine[: max(0, len(mine) - PARKED_PER_RANK)]:
            del self.requests[(rank, old)]
            self.rejects.count("over-capacity", f"rank {rank}: request for step {old} forgotten")

    def waiting(self) -> list[Request]:
        """Every request held, oldest first."""
        return list(self.requests)

    def pop(self, request: Request) -> bytes:
        """The identity to answer ``request``; it is held no longer."""
        return self.requests.pop(request)

    def __len__(self) -> int:
        return len(self.requests)
