"""The stream as it is planned now: the recipe's spec with the mix changes made to it since."""

from __future__ import annotations

import logging

from msd.errors import MsdError
from msd.jobdir import JobDir
from msd.jobdir.history import load_history, make_change, write_history
from msd.plan.spec import stream_spec
from msd.recipe.schema import Recipe
from msd.wire.protocol import MixSet, Refused, SetMix

log = logging.getLogger(__name__)


class Stream:
    """State: ``changes`` (the mix changes, as the job's history file has them) and ``spec``
    (what ``plan_step`` reads, with those changes in its schedule)."""

    def __init__(self, job: JobDir, recipe: Recipe, num_rows: tuple[int, ...]) -> None:
        self.job = job
        self.recipe = recipe
        self.changes = load_history(job.mix_history, recipe)
        self.spec = stream_spec(recipe, num_rows, self.changes)

    def set_mix(self, msg: SetMix, first_free: int, num_steps: int | None) -> MixSet | Refused:
        """Record a mix change in the job's history, then plan with it from its step on; steps
        before ``first_free`` are planned already (and may be delivered)."""
        at = first_free if msg.at_step < 0 else msg.at_step
        if at < first_free:
            return Refused(
                reason=f"step {at} is already planned (steps 0-{first_free - 1}); "
                f"choose --at-step {first_free} or later"
            )
        if num_steps is not None and at >= num_steps:
            return Refused(reason=f"the stream ends after step {num_steps - 1}")
        try:
            change = make_change(self.recipe, msg.weights, at)
            schedule = self.spec.schedule.with_change(change)
            if sum(schedule.weights_at(at)) <= 0:
                return Refused(reason=f"every source would have weight 0 from step {at}")
            write_history(self.job.mix_history, self.recipe, (*self.changes, change))
        except (MsdError, OSError) as exc:
            return Refused(reason=str(exc))
        self.changes = (*self.changes, change)
        self.spec = stream_spec(self.recipe, self.spec.num_rows, self.changes)
        log.info("mix %s from step %d", dict(msg.weights), at)
        return MixSet(at_step=at, weights=dict(msg.weights))
