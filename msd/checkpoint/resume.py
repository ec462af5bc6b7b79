"""Where a continuation starts: the state every role of a (re)started data plane begins from."""

from __future__ import annotations

from msd.checkpoint.store import CheckpointStore
from msd.jobdir import JobDir
from msd.plan.step import PlannerState


def latest_state(job: JobDir) -> PlannerState | None:
    """The state at the last step the job's checkpoints reach; None for a job without any."""
    store = CheckpointStore(job.checkpoints)
    if not store.snapshots():
        return None
    return store.find().snapshot.state


def first_positions(state: PlannerState) -> tuple[int, ...]:
    """Per source, the first position the stream still needs from this state on: its oldest
    carried sample's, or its cursor."""
    first = list(state.cursors)
    for source, gpos in state.carry:
        first[source] = min(first[source], gpos)
    return tuple(first)


def needed(state: PlannerState, source: int, gpos: int) -> bool:
    """Whether the stream from ``state`` on reads sample ``gpos`` of ``source`` (a position
    below the cursor was placed already, unless it is carried)."""
    return gpos >= state.cursors[source] or (source, gpos) in state.carry
