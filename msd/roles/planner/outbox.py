"""What a socket-free core decided to send, in order, for its loop to put on the wire."""

from __future__ import annotations

from msd.wire.protocol import Message


class Outbox:
    """Messages waiting to be sent: (peer identity, message), in the order they were decided."""

    def __init__(self) -> None:
        self._items: list[tuple[bytes, Message]] = []

    def send(self, to: bytes, msg: Message) -> None:
        self._items.append((to, msg))

    def take(self) -> list[tuple[bytes, Message]]:
        """Everything decided since the last call; the outbox is empty after it."""
        items, self._items = self._items, []
        return items
