"""The least of values that only rise, kept up to date as they rise.

The Planner learns each Constructor's progress one message at a time and needs the least of
them after every message (what every rank consumed, what every Constructor built). Taking the
minimum of all of them each time costs O(nodes) a message, O(nodes²) a step. Here the minimum
is counted again only when the last value at it rises: once a step when the Constructors move
on a step at a time, O(nodes) a step in all.
"""

from __future__ import annotations


class Lowest:
    """Values by key, each of which only rises (a lower value for a key is ignored), and their
    minimum (``low``; ``None`` while there are none)."""

    def __init__(self) -> None:
        self.values: dict[int, int] = {}
        self.low: int | None = None
        self._at_low = 0  # how many keys have the value ``low``

    def __len__(self) -> int:
        return len(self.values)

    def get(self, key: int, default: int) -> int:
        return self.values.get(key, default)

    def rise(self, key: int, value: int) -> None:
        """``key``'s value becomes ``value`` if that is higher (or ``key`` is new)."""
        old = self.values.get(key)
        if old is not None and value <= old:
            return
        self.values[key] = value
        if old is None:
            if self.low is None or value < self.low:
                self.low, self._at_low = value, 1
            elif value == self.low:
                self._at_low += 1
        elif old == self.low:
            self._at_low -= 1
            if not self._at_low:
                self.low = min(self.values.values())
                self._at_low = sum(1 for v in self.values.values() if v == self.low)
