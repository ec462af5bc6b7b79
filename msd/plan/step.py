"""The stream as a pure function: plan one global step from the Planner's state.

``plan_step(spec, state, lookup)`` draws, with the step's own generator, which source each next
sample comes from (weights from the mix schedule at this step), takes that source's next
position in its epoch order, and packs it into the step's rows; it stops once a few drawn
samples no longer fit. Which samples form a step therefore depends on (spec, state, sample
lengths) only — never on timing, on how many loaders there are, or on how many ranks share it.
The step's samples are then balanced over data-parallel ranks and micro-batches.

``lookup(source, gpos)`` returns the length of a sample once its loader has reported it, or
None; then planning answers ``NeedData`` and is simply retried later with the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from msd.plan.balance import Method, balance
from msd.plan.cost import CostModel
from msd.plan.mix import draw_source, step_rng
from msd.plan.rows import RowPacker, deal_rows
from msd.plan.schedule import Schedule

Lookup = Callable[[int, int], "int | None"]
LongSamples = str  # "split" | "truncate" | "drop"


@dataclass(frozen=True)
class StreamSpec:
    """What decides the stream, reduced to numbers (see ``msd.roles.planner.stream_spec``)."""

    seed: int
    schedule: Schedule
    num_rows: tuple[int, ...]
    repeat: tuple[bool, ...]
    dp: int
    micro_batches: int
    micro_batch_size: int
    seq_len: int
    steps: int | None
    pad_multiple: int = 1
    long_samples: LongSamples = "split"
    method: Method = "greedy"
    cost: CostModel = field(default_factory=CostModel)

    @property
    def rows_per_rank(self) -> int:
        return self.micro_batches * self.micro_batch_size

    @property
    def global_rows(self) -> int:
        return self.dp * self.rows_per_rank

    @property
    def carry_limit(self) -> int:
        """Drawn samples that did not fit before a step is closed (they open the next one)."""
        return max(1, min(self.global_rows, 8))


@dataclass(frozen=True)
class PlannerState:
    """The whole stream state. Keys: step, cursors (next global position per source), carry.

    ``carry`` holds samples already drawn but not placed (they did not fit the last step); the
    next step places them first.
    """

    step: int
    cursors: tuple[int, ...]
    carry: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def initial(num_sources: int) -> PlannerState:
        return PlannerState(0, (0,) * num_sources, ())


@dataclass(frozen=True)
class Slot:
    """One piece of a sample in a step: tokens ``[offset, offset + length)`` of the sample at
    global position ``gpos`` of ``source``; ``padded`` is what it occupies in its row."""

    source: int
    gpos: int
    length: int
    offset: int = 0
    padded: int = 0


@dataclass(frozen=True)
class Counts:
    split: int = 0
    truncated: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class StepPlan:
    """``rows[r][j]``: the pieces packed, in order, in row j of data-parallel rank r (row j is in
    micro-batch ``j // micro_batch_size``)."""

    step: int
    rows: tuple[tuple[tuple[Slot, ...], ...], ...]
    counts: Counts = Counts()
    dropped: tuple[tuple[int, int], ...] = ()

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


def pieces(spec: StreamSpec, source: int, gpos: int, length: int) -> tuple[list[Slot], Counts]:
    """A sample as the pieces it is planned as: whole, split, truncated, or none (dropped)."""
    if length <= spec.seq_len:
        return [_slot(spec, source, gpos, length, 0)], Counts()
    if spec.long_samples == "drop":
        return [], Counts(dropped=1)
    if spec.long_samples == "truncate":
        return [_slot(spec, source, gpos, spec.seq_len, 0)], Counts(truncated=1)
    n = min(-(-length // spec.seq_len), spec.global_rows)  # a step holds at most its rows
    cut = Counts(split=1, truncated=int(n * spec.seq_len < length))
    return [
        _slot(spec, source, gpos, min(spec.seq_len, length - k * spec.seq_len), k * spec.seq_len)
        for k in range(n)
    ], cut


def _slot(spec: StreamSpec, source: int, gpos: int, length: int, offset: int) -> Slot:
    m = spec.pad_multiple
    return Slot(source, gpos, length, offset, -(-length // m) * m)


def _active(spec: StreamSpec, weights: tuple[float, ...], cursors: list[int]) -> list[bool]:
    return [
        weights[s] > 0 and (spec.repeat[s] or cursors[s] < spec.num_rows[s])
        for s in range(len(cursors))
    ]


@dataclass
class _Selection:
    packer: RowPacker
    placed: list[Slot] = field(default_factory=list)
    misfits: list[tuple[int, int]] = field(default_factory=list)
    split: int = 0
    truncated: int = 0
    dropped: list[tuple[int, int]] = field(default_factory=list)

    def offer(self, spec: StreamSpec, source: int, gpos: int, length: int) -> None:
        group, counts = pieces(spec, source, gpos, length)
        if not group:
            self.dropped.append((source, gpos))
            return
        if self.packer.place([s.padded for s in group]):
            self.placed += group
            self.split += counts.split
            self.truncated += counts.truncated
        else:
            self.misfits.append((source, gpos))


def _select(
    spec: StreamSpec, state: PlannerState, lookup: Lookup
) -> tuple[_Selection, list[int]] | NeedData:
    """Carry first, then fresh draws, until ``carry_limit`` samples did not fit."""
    sel = _Selection(RowPacker(spec.global_rows, spec.seq_len))
    for source, gpos in state.carry:
        length = lookup(source, gpos)
        if length is None:
            return NeedData(source, gpos)
        sel.offer(spec, source, gpos, length)
    cursors = list(state.cursors)
    rng = step_rng(spec.seed, state.step)
    weights = spec.schedule.weights_at(state.step)
    while len(sel.misfits) < spec.carry_limit and any(active := _active(spec, weights, cursors)):
        source = draw_source(rng, weights, active)
        gpos = cursors[source]
        length = lookup(source, gpos)
        if length is None:
            return NeedData(source, gpos)
        cursors[source] += 1
        sel.offer(spec, source, gpos, length)
    return sel, cursors


def plan_step(
    spec: StreamSpec, state: PlannerState, lookup: Lookup
) -> tuple[StepPlan, PlannerState] | NeedData | EndOfStream:
    """Plan ``state.step``; returns the plan and the state after it."""
    if spec.steps is not None and state.step >= spec.steps:
        return EndOfStream(state.step)
    selected = _select(spec, state, lookup)
    if isinstance(selected, NeedData):
        return selected
    sel, cursors = selected
    if not sel.placed:
        return EndOfStream(state.step)
    counts = Counts(sel.split, sel.truncated, len(sel.dropped))
    plan = StepPlan(state.step, _split_over_ranks(spec, sel), counts, tuple(sel.dropped))
    return plan, PlannerState(state.step + 1, tuple(cursors), tuple(sel.misfits))


def _split_over_ranks(
    spec: StreamSpec, sel: _Selection
) -> tuple[tuple[tuple[Slot, ...], ...], ...]:
    """Balance the placed pieces; if the balancer cannot place them all, deal the packed rows."""
    padded = np.array([s.padded for s in sel.placed], dtype=np.int64)
    costs = spec.cost(padded)
    result = balance(
        padded, costs, spec.dp, spec.micro_batches, spec.micro_batch_size, spec.seq_len, spec.method
    )
    rows = result.rows
    if result.leftover:
        rows = deal_rows(
            sel.packer.members, costs, spec.dp, spec.rows_per_rank, spec.micro_batch_size
        )
    return tuple(tuple(tuple(sel.placed[i] for i in row) for row in rank) for rank in rows)
