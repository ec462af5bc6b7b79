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

import numpy as np

STATES = ("loaded", "planned", "assigned", "delivered", "consumed")

Key = tuple[int, int]  # (source, global position)


@dataclass
class _Step:
    keys: np.ndarray  # (source, gpos) rows, distinct, sorted
    state: str = "assigned"

    def holds(self, key: Key) -> bool:
        return bool(np.any((self.keys[:, 0] == key[0]) & (self.keys[:, 1] == key[1])))


def _distinct(keys: np.ndarray | Iterable[Key]) -> np.ndarray:
    """(source, gpos) rows, once each, sorted."""
    rows = np.asarray(keys if isinstance(keys, np.ndarray) else list(keys), dtype=np.int64)
    rows = rows.reshape(-1, 2)
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    return rows[new]


class SampleGraph:
    """Where each recent sample is. Keys: (source, gpos); a step's as an array (one per sample,
    tens of thousands a step at thousands of ranks)."""

    def __init__(self, window: int = 64) -> None:
        self.window = window
        self.steps: OrderedDict[int, _Step] = OrderedDict()
        self.planned: frozenset[Key] = frozenset()

    def on_assigned(
        self, step: int, keys: np.ndarray | Iterable[Key], carried: Iterable[Key]
    ) -> None:
        """``step`` is planned with ``keys`` ((source, gpos) pairs, or rows of an array);
        ``carried`` were drawn but wait for the next."""
        self.steps[step] = _Step(_distinct(keys))
        self.planned = frozenset(carried)

    def on_delivered(self, upto: int) -> None:
        """Every step before ``upto`` is built."""
        self._advance(upto, "assigned", "delivered")

    def on_consumed(self, upto: int) -> None:
        """Every rank moved past every step before ``upto``; forget what left the window."""
        self._advance(upto, "delivered", "consumed")
        self._advance(upto, "assigned", "consumed")
        while self.steps and next(iter(self.steps)) < upto - self.window:
            self.steps.popitem(last=False)

    def _advance(self, upto: int, old: str, new: str) -> None:
        for step, record in self.steps.items():
            if step < upto and record.state == old:
                record.state = new

    def state_of(self, key: Key) -> str | None:
        """The state of a sample, or None if it is outside the window (or not loaded yet)."""
        if key in self.planned:
            return "planned"
        for record in reversed(self.steps.values()):  # the latest step that holds it
            if record.holds(key):
                return record.state
        return None

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
