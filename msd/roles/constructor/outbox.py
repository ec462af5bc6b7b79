"""What the Constructor's core decided to send, in order, for its loop to put on the wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from msd.wire.protocol import Message


@dataclass(frozen=True)
class Trainer:
    """A trainer rank's Client, by its identity on the Constructor's ROUTER socket."""

    identity: bytes


@dataclass(frozen=True)
class Child:
    """The Constructor numbered ``index`` in the relay tree (``msd.plan.fanout``)."""

    index: int


# "planner": the Planner. "outlets": the payload sockets to the children in the relay tree,
# which a Welcome re-aims before anything is relayed along them.
Destination = Literal["planner", "outlets"] | Trainer | Child
Sent = tuple[Destination, Message, list[Any]]  # where, what, and the buffers it carries


class Outbox:
    """Messages waiting to be sent, in the order they were decided."""

    def __init__(self) -> None:
        self._items: list[Sent] = []

    def send(self, to: Destination, msg: Message, buffers: list[Any] | None = None) -> None:
        self._items.append((to, msg, [] if buffers is None else buffers))

    def take(self) -> list[Sent]:
        """Everything decided since the last call; the outbox is empty after it."""
        items, self._items = self._items, []
        return items
