"""The job as ``msd status``, the metrics endpoint and ``metrics.jsonl`` show it, read from a
Planner core (read only: nothing here changes the job)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from msd.control.view import metrics_line
from msd.jobdir import JobDir
from msd.wire.protocol import Status
from msd.wire.views import StatusView

if TYPE_CHECKING:
    from msd.roles.planner.core import PlannerCore


def state_name(core: PlannerCore) -> str:
    done = core.num_steps is not None and core.consumed >= core.num_steps
    return "done" if done else "running" if core.phase.running else "starting"


def counts(core: PlannerCore) -> dict[str, int]:
    c = core.ledger.counters
    return {
        "split": c.split,
        "truncated": c.truncated,
        "dropped": c.dropped,
        "empty": c.empty,
        "images": c.images,
        "skipped_images": sum(n for _, n in c.skipped_images),
    }


def trained_tokens(core: PlannerCore) -> tuple[int, ...]:
    """Per source, the delivered tokens the loss is taken on: of a conversation source, those
    its chat section trains; of any other, all of them."""
    ledger, sources = core.ledger, core.recipe.sources
    counted = ledger.counters.trained_per_source(len(sources))
    return tuple(
        n if s.chat is not None else int(t)
        for s, n, t in zip(sources, counted, ledger.source_tokens, strict=True)
    )


def view(core: PlannerCore) -> StatusView:
    """The job as of now."""
    now = core.clock()
    ledger = core.ledger
    core.observer.on_tick(
        now, core.consumed, ledger.tokens_consumed, ledger.source_samples, ledger.source_tokens
    )
    step = min(core.consumed, core.num_steps or core.consumed)
    return core.observer.view(
        state=state_name(core),
        planned=core.state.step,
        steps=core.num_steps if core.num_steps is not None else core.recipe.steps,
        uptime_s=now - core.phase.started,
        failure=core.phase.failure,
        weights=core.stream.spec.schedule.weights_at(step),
        lifecycle=core.graph.counts(reported=core.routing.reported()),
        counts=counts(core),
        skipped_images=core.ledger.counters.skipped_per_source(len(core.recipe.sources)),
        trained_tokens=trained_tokens(core),
        planner_pid=os.getpid(),
        now=now,
        rejected=core.rejects.snapshot(),
    )


def status(core: PlannerCore) -> Status:
    """The answer to a ``StatusRequest``."""
    current = view(core)
    ledger, registry = core.ledger, core.registry
    roles = tuple(
        (p.hello.role, p.hello.name, p.hello.pid)
        for p in [*registry.constructors, *registry.loaders.values()]
    )
    return Status(
        state=current.job.state,
        planned=core.state.step,
        consumed=core.consumed,
        steps=core.num_steps if core.num_steps is not None else core.recipe.steps,
        elapsed_s=core.clock() - core.phase.started,
        tokens_consumed=ledger.tokens_consumed,
        source_names=tuple(s.name for s in core.recipe.sources),
        source_samples=tuple(int(x) for x in ledger.source_samples),
        wait_p50_ms=current.wait_p50_ms,
        wait_p99_ms=current.wait_p99_ms,
        truncated=ledger.counters.truncated,
        split=ledger.counters.split,
        dropped=ledger.counters.dropped,
        truncated_tokens=ledger.counters.per_source(len(core.recipe.sources)),
        empty=ledger.counters.empty,
        images=ledger.counters.images,
        skipped_images=ledger.counters.skipped_per_source(len(core.recipe.sources)),
        trained_tokens=trained_tokens(core),
        constructor_step_bytes=sum(registry.bytes_by.values()),
        lifecycle=current.planner.lifecycle,
        roles=(("planner", "planner", os.getpid()), *roles),
        failure=core.phase.failure,
        view=current,
    )


def append_metrics_line(job: JobDir, current: StatusView) -> None:
    """One line of ``metrics.jsonl``."""
    line = metrics_line(current, time.time())
    with open(job.metrics, "a") as f:
        f.write(json.dumps(line) + "\n")
