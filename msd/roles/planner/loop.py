"""The Planner process: one ROUTER socket feeding a ``PlannerCore``, and the clocks that drive
it (planning, heartbeats, the status view, autoscale). Only this module touches sockets."""

from __future__ import annotations

import time

import zmq

from msd.control.metrics import MetricsServer
from msd.jobdir import REWIND_EXIT, JobDir
from msd.recipe.schema import Recipe
from msd.roles.planner import status
from msd.roles.planner.core import PlannerCore
from msd.sources.index import open_source
from msd.wire import transport

TICK_S = 1.0  # how often the Planner refreshes its view (status, metrics)
# Metadata only: a row group's sample lengths are a few MB at most.
MAX_MESSAGE_BYTES = 256 << 20


def source_rows(recipe: Recipe) -> tuple[int, ...]:
    return tuple(open_source(s, f"sources[{i}]").num_rows for i, s in enumerate(recipe.sources))


class Planner:
    """The loop: receive, let the core decide, send what it decided."""

    def __init__(self, job: JobDir, recipe: Recipe) -> None:
        self.job = job
        self.recipe = recipe
        self.core = PlannerCore(job, recipe, source_rows(recipe))
        keys = job.keys()
        ctx = transport.context()
        self.auth = transport.admit_only(ctx, keys)  # only holders of the job's key get in
        self.sock, endpoint = transport.bind(ctx, zmq.ROUTER, keys, MAX_MESSAGE_BYTES)
        self.metrics: MetricsServer | None = None
        if recipe.metrics.port is not None:
            host, advertised = transport.bind_host()
            self.metrics = MetricsServer(host, recipe.metrics.port, advertised)
            job.publish("metrics", self.metrics.endpoint)
        self.next_tick = self.next_line = self.next_scale = 0.0
        job.publish("planner", endpoint)

    def run(self) -> None:
        core = self.core
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while True:
            if dict(poller.poll(50)) and not self._drain():
                return
            if core.phase.rewind_to is not None:
                return
            # Heartbeats are judged on what was just drained, not after planning: a Planner
            # slow to plan must not take its loaders' queued messages for silence.
            now = time.monotonic()
            if now >= self.next_tick:
                self._tick(now)
            if core.phase.running:
                core.advance()
                self._flush()
            if core.scaling.settings is not None and core.phase.running and now >= self.next_scale:
                self.next_scale = now + self.recipe.loader.autoscale.every_s
                core.autoscale()
                self._flush()

    def _drain(self) -> bool:
        """Handle every queued message; False once the job is told to stop."""
        while self.sock.poll(0):
            received = transport.recv_or_drop(self.sock, self.core.rejects)
            if received is None:
                continue
            identity, msg, _ = received
            assert identity is not None  # a ROUTER socket always names the sender
            self.core.handle(identity, msg)
            self._flush()
            if self.core.phase.stopped:
                return False
        return True

    def _flush(self) -> None:
        for to, msg in self.core.out.take():
            transport.send(self.sock, msg, to=to)

    def _tick(self, now: float) -> None:
        """Refresh the view: heartbeats, the metrics endpoint, a line of ``metrics.jsonl``."""
        core = self.core
        self.next_tick = now + TICK_S
        if core.phase.running:
            core.check_heartbeats()
            self._flush()
        current = status.view(core)
        if self.metrics is not None:
            self.metrics.update(current, core.wait_hist.snapshot(), core.plan_hist.snapshot())
        if now >= self.next_line and core.phase.running:
            self.next_line = now + self.recipe.metrics.every_s
            status.append_metrics_line(self.job, current)

    def close(self) -> None:
        self.core.close()
        self.sock.close(linger=1000)  # replies sent last (a rewind's) still go out
        if self.metrics is not None:
            self.metrics.close()
        self.auth.stop()


def main(job: JobDir) -> None:
    planner = Planner(job, job.recipe())
    try:
        planner.run()
    finally:
        planner.close()
    if planner.core.phase.rewind_to is not None:
        raise SystemExit(REWIND_EXIT)
