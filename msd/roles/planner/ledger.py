"""What every rank consumed, as the checkpoint records it: the log line of each step consumed,
the snapshots, and the figures (tokens, samples per source, long-sample counts) of the steps
consumed so far."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from msd.checkpoint.format import Delta
from msd.checkpoint.signing import signing_key
from msd.checkpoint.snapshot import Counters, Snapshot, Totals
from msd.checkpoint.store import CheckpointStore
from msd.errors import CheckpointError
from msd.jobdir import JobDir
from msd.jobdir.history import change_json
from msd.plan.step import PlannerState, StepPlan
from msd.recipe.schema import Recipe, stream_fingerprint, to_json
from msd.roles.planner.routing import StepFigures
from msd.roles.planner.stream import Stream

log = logging.getLogger(__name__)


class Ledger:
    """State: ``states`` (step → the planner state at it, for each step planned and not
    logged yet), ``logged`` (the last step in the log), ``counted`` (the first step whose
    figures are not in the totals), the totals (``tokens_consumed``, ``source_samples``,
    ``source_tokens``, ``counters``) and each planned step's figures until it is counted."""

    def __init__(self, job: JobDir, recipe: Recipe, stream: Stream) -> None:
        self.recipe = recipe
        self.recipe_json = json.loads(to_json(recipe))  # in every snapshot: encoded once
        self.stream = stream
        self.enabled = recipe.checkpoint.enabled
        self.store = CheckpointStore(
            job.checkpoints, recipe.checkpoint.keep, signing_key(job.keys())
        )
        resumed = self.store.find() if self.store.snapshots() else None
        sources = len(recipe.sources)
        self.state = resumed.snapshot.state if resumed else PlannerState.initial(sources)
        self.states = {self.state.step: self.state}
        self.logged = self.counted = self.state.step
        totals = resumed.snapshot.totals if resumed else Totals()
        self.tokens_consumed = totals.tokens
        self.source_samples = np.zeros(sources, dtype=np.int64)
        self.source_tokens = np.zeros(sources, dtype=np.int64)
        if totals.source_samples:
            self.source_samples += np.array(totals.source_samples, dtype=np.int64)
            self.source_tokens += np.array(totals.source_tokens, dtype=np.int64)
        # The long-sample counters of the steps consumed (checkpointed), and of each step
        # planned but not consumed yet (counted once consumed: a restart plans them again).
        self.counters = resumed.snapshot.counters if resumed else Counters()
        self.step_counters: dict[int, Counters] = {}
        self.step_tokens: dict[int, int] = {}
        self.step_figures: dict[int, StepFigures] = {}
        if resumed is not None:
            log.info("continuing from step %d (%s)", self.state.step, resumed.path)
            for problem in resumed.passed_over:
                log.warning("passed over: %s", problem)

    def on_planned(self, plan: StepPlan, after: PlannerState, figures: StepFigures) -> None:
        """A step was planned: the state after it and what it delivers, until consumed."""
        self.states[after.step] = after
        self.step_tokens[plan.step] = int(figures.tokens.sum())
        self.step_figures[plan.step] = figures
        done = plan.counts
        skipped, trained = _nonzero(figures.skipped), _nonzero(figures.trained)
        self.step_counters[plan.step] = Counters(
            done.split,
            done.truncated,
            done.dropped,
            done.truncated_tokens,
            done.empty,
            int(figures.images.sum()),
            tuple(zip(skipped.tolist(), figures.skipped[skipped].tolist(), strict=True)),
            tuple(zip(trained.tolist(), figures.trained[trained].tolist(), strict=True)),
        )

    def log_consumed(self, consumed: int) -> bool:
        """A log line per step newly consumed by every rank; whether a snapshot is due."""
        if not self.enabled:  # nothing written; the states are not kept either
            for step in [s for s in self.states if s < consumed]:
                del self.states[step]
            self.logged = max(self.states)
            return False
        due = False
        every = self.recipe.checkpoint.every_steps
        # Ranks may be ahead of what this Planner has planned (it restarted behind them):
        # the log follows the steps as they are planned.
        while self.logged < consumed and self.logged + 1 in self.states:
            step = self.logged + 1
            before = self.states.pop(self.logged)
            tokens = self.step_tokens.get(self.logged, 0)
            counters = self.step_counters.get(self.logged)
            sources = self._step_sources(self.logged)
            self.store.append(Delta.between(before, self.states[step], tokens, sources, counters))
            self.logged = step
            due = due or (every > 0 and step % every == 0)
        return due

    def count_consumed(self, consumed: int) -> None:
        """Add the figures of the steps newly consumed to the totals."""
        while self.counted < consumed and self.counted in self.step_tokens:
            self.tokens_consumed += self.step_tokens.pop(self.counted)
            figures = self.step_figures.pop(self.counted)
            self.source_samples += figures.samples
            self.source_tokens += figures.tokens
            self.counters += self.step_counters.pop(self.counted, Counters())
            self.counted += 1

    def _step_sources(self, step: int) -> tuple[tuple[int, int, int], ...]:
        """(source, samples, tokens) a planned step delivers, sources with none left out."""
        figures = self.step_figures.get(step)
        if figures is None:
            return ()
        drawn = _nonzero(figures.samples | figures.tokens)
        columns = (drawn, figures.samples[drawn], figures.tokens[drawn])
        return tuple(zip(*(c.tolist() for c in columns), strict=True))

    def snapshot(self, wait: bool = True) -> tuple[Path, int, float]:
        """Write the state at the step every rank has consumed; (path, bytes, seconds).
        ``wait=False``: the file is written in the background (bytes then reads 0)."""
        started = time.perf_counter()
        snap = Snapshot(
            state=self.states[self.logged],
            fingerprint=stream_fingerprint(self.recipe),
            recipe=self.recipe_json,
            num_rows=self.stream.spec.num_rows,
            mix_history=tuple(change_json(self.recipe, c) for c in self.stream.changes),
            totals=Totals(
                self.tokens_consumed,
                tuple(int(x) for x in self.source_samples),
                tuple(int(x) for x in self.source_tokens),
            ),
            created=time.time(),
            counters=self.counters,
        )
        path = self.store.write_snapshot(snap, wait=wait)
        size = path.stat().st_size if wait else 0
        return path, size, time.perf_counter() - started

    def checkpoint_refusal(self) -> str | None:
        """Why ``msd checkpoint`` cannot be answered; None when it can."""
        if not self.enabled:
            return "this job's recipe has checkpoint.enabled: false"
        return None

    def rewind(self, step: int) -> str | None:
        """Make the snapshot at ``step`` the latest (a trainer went back to it); why it cannot
        be, otherwise."""
        if step > self.logged:
            return f"step {step} was not reached yet; nothing to go back to"
        try:
            self.store.rewind(self.store.find(step).snapshot)
        except (CheckpointError, OSError) as exc:
            return f"cannot go back to step {step}: {exc}"
        return None

    def close(self) -> None:
        self.store.close()


def _nonzero(per_source: np.ndarray) -> np.ndarray:
    """The sources with a figure (few of many, each step: looped over instead of all)."""
    return np.flatnonzero(per_source)
