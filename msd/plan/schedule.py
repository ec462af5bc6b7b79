"""The mix as a schedule: each source's weight as a function of the step.

Each source starts at its recipe ``weight``; milestones set new weights from (``step``
interpolation) or reached at (``linear`` interpolation) their step. Sources a milestone does not
name keep their course. Changes made while a job runs (``msd mix``, recorded in the job's mix
history) then hold the sources they name at a weight from their step on. A pure function of
(recipe, mix history, step): part of the stream's definition.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from msd.recipe.schema import Recipe

Points = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class MixChange:
    """From ``step`` on, source ``s`` has weight ``w`` for each (s, w) of ``weights``, whatever
    the recipe's milestones say after it."""

    step: int
    weights: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Schedule:
    """``points[s]``: (step, weight) milestones of source s, sorted, starting at step 0;
    ``changes``: the job's mix history, in the order it was made."""

    points: tuple[Points, ...]
    linear: bool
    changes: tuple[MixChange, ...] = ()

    def weights_at(self, step: int) -> tuple[float, ...]:
        # Between breakpoints the weights hold still (with ``linear``, after the last one):
        # each stretch is worked out once, not once a step for every source.
        segment = bisect.bisect_right(self._breaks, step)
        if self.linear and segment < len(self._breaks):
            return self._weights_at(step)
        if segment not in self._held:
            self._held[segment] = self._weights_at(step)
        return self._held[segment]

    @cached_property
    def _breaks(self) -> list[int]:
        return self.breakpoints()

    @cached_property
    def _held(self) -> dict[int, tuple[float, ...]]:
        return {}

    def _weights_at(self, step: int) -> tuple[float, ...]:
        weights = [_weight_at(p, step, self.linear) for p in self.points]
        for change in self.changes:
            if change.step <= step:
                for source, weight in change.weights:
                    weights[source] = weight
        return tuple(weights)

    def with_change(self, change: MixChange) -> Schedule:
        return Schedule(self.points, self.linear, (*self.changes, change))

    def breakpoints(self) -> list[int]:
        """Every step where a weight starts or stops changing course."""
        steps = {step for points in self.points for step, _ in points}
        return sorted(steps | {c.step for c in self.changes})

    def window_mean(self, start: int, stop: int) -> tuple[float, ...]:
        """Mean normalised share of each source over steps [start, stop)."""
        totals = [0.0] * len(self.points)
        for step in range(start, stop):
            weights = self.weights_at(step)
            norm = sum(weights) or 1.0
            totals = [t + w / norm for t, w in zip(totals, weights, strict=True)]
        return tuple(t / max(1, stop - start) for t in totals)


def _weight_at(points: Points, step: int, linear: bool) -> float:
    i = bisect.bisect_right([s for s, _ in points], step) - 1
    s0, w0 = points[i]
    if not linear or i + 1 == len(points):
        return w0
    s1, w1 = points[i + 1]
    return w0 + (w1 - w0) * (step - s0) / (s1 - s0)


def schedule_of(recipe: Recipe, changes: Sequence[MixChange] = ()) -> Schedule:
    names = [s.name for s in recipe.sources]
    points: list[list[tuple[int, float]]] = [[(0, s.weight)] for s in recipe.sources]
    for milestone in sorted(recipe.mix.milestones, key=lambda m: m.step):
        for name, weight in milestone.weights.items():
            _set(points[names.index(name)], milestone.step, weight)
    linear = recipe.mix.interpolate == "linear"
    return Schedule(tuple(tuple(p) for p in points), linear, tuple(changes))


def _set(points: list[tuple[int, float]], step: int, weight: float) -> None:
    if points[-1][0] == step:
        points[-1] = (step, weight)
    else:
        points.append((step, weight))


def constant(weights: Sequence[float]) -> Schedule:
    return Schedule(tuple(((0, float(w)),) for w in weights), linear=False)


def peak_shares(schedule: Schedule) -> tuple[float, ...]:
    """Each source's largest normalised share over the whole schedule.

    Between breakpoints a share is a ratio of linear functions, so it is largest at one:
    looking at every breakpoint (and the step before each) is enough.
    """
    steps = sorted({s for b in schedule.breakpoints() for s in (max(0, b - 1), b)})
    peaks = [0.0] * len(schedule.points)
    for step in steps:
        weights = schedule.weights_at(step)
        norm = sum(weights) or 1.0
        peaks = [max(p, w / norm) for p, w in zip(peaks, weights, strict=True)]
    return tuple(peaks)
