"""The stream as a pure function: plan one global step from the Planner's state.

``plan_step(state, spec, lookup)`` draws, with the step's own generator, which source each next
sample comes from, takes that source's next position in its epoch order, and stops when the
token budget is full. The samples are then balanced over data-parallel ranks and packed into
rows. The result depends on (spec, state, sample lengths) only — never on timing or on how many
loaders there are — which is what makes exact resume and rescaling possible.

``lookup(source, gpos)`` returns the length of a sample once its loader has reported it, or
None; then planning answers ``NeedData`` and is simply retried later with the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from msd.plan.balance import balance_greedy
from msd.plan.cost import sample_cost
from msd.plan.mix import draw_source, step_rng

Lookup = Callable[[int, int], "int | None"]


@dataclass(frozen=True)
class StreamSpec:
    """What decides the stream, reduced to numbers."""

    seed: int
    weights: tuple[float, ...]
    num_rows: tuple[int, ...]
    repeat: tuple[bool, ...]
    dp: int
    rows_per_rank: int
    seq_len: int
    steps: int | None

    @property
    def budget(self) -> int:
        return self.dp * self.rows_per_rank * self.seq_len


@dataclass(frozen=True)
class PlannerState:
    """The whole stream state. Keys: step, cursors (next global position per source), carry.

    ``carry`` holds samples already taken from their source but not yet placed (the sample that
    overflowed the last step's budget, or one that fit no row); the next step places them first.
    """

    step: int
    cursors: tuple[int, ...]
    carry: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def initial(num_sources: int) -> PlannerState:
        return PlannerState(0, (0,) * num_sources, ())


@dataclass(frozen=True)
class Slot:
    """One sample of a step: which source, which global position, how many tokens."""

    source: int
    gpos: int
    length: int


@dataclass(frozen=True)
class StepPlan:
    """``rows[r][j]``: the samples packed, in order, in row j of data-parallel rank r."""

    step: int
    rows: tuple[tuple[tuple[Slot, ...], ...], ...]

    @property
    def slots(self) -> list[Slot]:
        return [slot for rank in self.rows for row in rank for slot in row]


@dataclass(frozen=True)
class NeedData:
    source: int
    gpos: int


@dataclass(frozen=True)
class EndOfStream:
    step: int


def _active(spec: StreamSpec, cursors: list[int]) -> list[bool]:
    return [
        spec.weights[s] > 0 and (spec.repeat[s] or cursors[s] < spec.num_rows[s])
        for s in range(len(cursors))
    ]


def _select(
    spec: StreamSpec, state: PlannerState, lookup: Lookup
) -> tuple[list[Slot], list[int], list[tuple[int, int]]] | NeedData:
    """Carry first, then fresh draws until the next sample would overflow the budget."""
    taken: list[Slot] = []
    for source, gpos in state.carry:
        length = lookup(source, gpos)
        if length is None:
            return NeedData(source, gpos)
        taken.append(Slot(source, gpos, length))
    total = sum(s.length for s in taken)
    cursors = list(state.cursors)
    rng = step_rng(spec.seed, state.step)
    while any(active := _active(spec, cursors)):
        source = draw_source(rng, spec.weights, active)
        gpos = cursors[source]
        length = lookup(source, gpos)
        if length is None:
            return NeedData(source, gpos)
        cursors[source] += 1
        if total + length > spec.budget:
            return taken, cursors, [(source, gpos)]
        taken.append(Slot(source, gpos, length))
        total += length
    return taken, cursors, []


def plan_step(
    spec: StreamSpec, state: PlannerState, lookup: Lookup
) -> tuple[StepPlan, PlannerState] | NeedData | EndOfStream:
    """Plan ``state.step``; returns the plan and the state after it."""
    if spec.steps is not None and state.step >= spec.steps:
        return EndOfStream(state.step)
    selected = _select(spec, state, lookup)
    if isinstance(selected, NeedData):
        return selected
    taken, cursors, overflow = selected
    if not taken:
        return EndOfStream(state.step)
    lengths = np.array([s.length for s in taken], dtype=np.int64)
    assignment = balance_greedy(
        lengths, sample_cost(lengths), spec.dp, spec.rows_per_rank, spec.seq_len
    )
    rows = tuple(tuple(tuple(taken[i] for i in row) for row in rank) for rank in assignment.rows)
    carry = [(taken[i].source, taken[i].gpos) for i in assignment.leftover] + overflow
    return StepPlan(state.step, rows), PlannerState(state.step + 1, tuple(cursors), tuple(carry))
