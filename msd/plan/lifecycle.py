"""The sample lifecycle (the paper's SampleGraph), kept for a bounded window of steps.

    loaded     a loader has read and tokenized it and reported its length
    planned    drawn into a step but not placed yet (carried to the next step)
    assigned   placed in a step's plan: rank, row, and the route loader → Constructor
    delivered  its step's batches are built at every Constructor that needs them
    consumed   every rank that reads it has moved past its step

Steps are tracked from assignment until they fall ``window`` steps behind consumption, so the
memory is O(window × samples per step), whatever the length of the run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

STATES = ("loaded", "planned", "assigned", "delivered", "consumed")

Key = tuple[int, int]  # (source, global position)


@dataclass
class _Step:
    keys: frozenset[Key]
    state: str = "assigned"


class SampleGraph:
    """Where each recent sample is. Keys: (source, gpos)."""

    def __init__(self, window: int = 64) -> None:
        self.window = window
        self.steps: OrderedDict[int, _Step] = OrderedDict()
        self.where: dict[Key, int] = {}
        self.planned: frozenset[Key] = frozenset()

    def on_assigned(self, step: int, keys: Iterable[Key], carried: Iterable[Key]) -> None:
        """``step`` is planned with ``keys``; ``carried`` were drawn but wait for the next."""
        record = _Step(frozenset(keys))
        self.steps[step] = record
        self.planned = frozenset(carried)
        for key in record.keys:
            self.where[key] = step

    def on_delivered(self, upto: int) -> None:
        """Every step before ``upto`` is built."""
        self._advance(upto, "assigned", "delivered")

    def on_consumed(self, upto: int) -> None:
        """Every rank moved past every step before ``upto``; forget what left the window."""
        self._advance(upto, "delivered", "consumed")
        self._advance(upto, "assigned", "consumed")
        while self.steps and next(iter(self.steps)) < upto - self.window:
            _, old = self.steps.popitem(last=False)
            for key in old.keys:
                del self.where[key]

    def _advance(self, upto: int, old: str, new: str) -> None:
        for step, record in self.steps.items():
            if step < upto and record.state == old:
                record.state = new

    def state_of(self, key: Key) -> str | None:
        """The state of a sample, or None if it is outside the window (or not loaded yet)."""
        if key in self.planned:
            return "planned"
        step = self.where.get(key)
        return None if step is None else self.steps[step].state

    def counts(self, reported: int) -> dict[str, int]:
        """Samples per state; ``reported``: lengths known to the Planner and not yet assigned."""
        counts = dict.fromkeys(STATES, 0)
        counts["loaded"] = reported - len(self.planned)
        counts["planned"] = len(self.planned)
        for record in self.steps.values():
            counts[record.state] += len(record.keys)
        return counts

    def in_flight(self) -> list[int]:
        """Steps assigned or delivered but not yet consumed."""
        return [s for s, r in self.steps.items() if r.state != "consumed"]
