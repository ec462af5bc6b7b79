"""The Planner's decisions, without sockets: decoded messages in, messages to send out.

``PlannerCore.handle`` takes one message from a peer; ``advance`` plans the steps the ranks
will need next and logs what they consumed; ``check_heartbeats`` and ``autoscale`` run on the
loop's clock. Everything each decides to send waits in ``out`` (an ``Outbox``) for the loop.
Each kind of state has one owner: ``registry`` (who is in the job), ``routing`` (where each
sample is and goes), ``ledger`` (what was consumed: the checkpoint log and the totals),
``stream`` (the spec and its mix changes), ``scaling`` (loader generations), ``failover``
(shadows taking lost loaders' places); the core itself holds the planning cursor (``state``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from msd import logs
from msd.control.metrics import Histogram
from msd.control.view import JobObserver
from msd.errors import ProtocolError, SourceError
from msd.jobdir import JobDir
from msd.jobdir.rescales import load_rescales
from msd.plan.fanout import Tree
from msd.plan.hybrid_cost import HybridCost
from msd.plan.lifecycle import SampleGraph
from msd.plan.partition import loader_processes
from msd.plan.spec import topology_of
from msd.plan.step import EndOfStream, NeedData, Resume, StepPlan, plan_step
from msd.recipe.schema import Recipe
from msd.roles.admission import refusal
from msd.roles.common import FAILURE_PREFIX
from msd.roles.planner import judging, status
from msd.roles.planner.failover import Failover
from msd.roles.planner.ledger import Ledger
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.phase import Phase
from msd.roles.planner.registry import Registry
from msd.roles.planner.routing import Routing
from msd.roles.planner.scaling import Scaling
from msd.roles.planner.stream import Stream
from msd.wire.protocol import (
    CheckpointTaken,
    ConstructorInfo,
    CutAt,
    End,
    Failure,
    Hello,
    LoaderLost,
    Message,
    Meta,
    Progress,
    Refused,
    Rescale,
    Retired,
    Rewind,
    Rewinding,
    SetMix,
    Stats,
    StatusRequest,
    Stop,
    TakeCheckpoint,
    Want,
    Welcome,
)
from msd.wire.rejects import Rejects

log = logging.getLogger(__name__)


class PlannerCore:
    """State it owns: ``state`` (the planner state after the last step planned), ``start``
    (the state it started from: positions below its cursors were placed before it),
    ``num_steps`` (once the stream's end is planned), ``phase`` (starting or running, and why
    the loop must end: ``Phase``)."""

    def __init__(
        self,
        job: JobDir,
        recipe: Recipe,
        num_rows: tuple[int, ...],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job, self.recipe, self.clock = job, recipe, clock
        self.out = Outbox()
        self.stream = Stream(job, recipe, num_rows)
        self.ledger = Ledger(job, recipe, self.stream)
        self.state = self.start = self.ledger.state
        self.resume: Resume | None = None  # the step's selection where it waited for data
        self.observer = JobObserver(tuple(s.name for s in recipe.sources))
        rescales = load_rescales(job.rescales, recipe)
        expected = {p.name for p in loader_processes(recipe, rescales) if p.standby is None}
        self.registry = Registry(expected, topology_of(recipe), self.start.step)
        hybrid = HybridCost(enc_attn=recipe.cost.enc_attn, enc_lin=recipe.cost.enc_lin)
        self.routing = Routing(len(recipe.sources), self.out, hybrid.images, recipe.seq_len)
        self.balance_encoder = recipe.has_images and recipe.balance.objective == "sum"
        self.scaling = Scaling(job, recipe, self.out, self.registry, self.observer, rescales)
        self.failover = Failover(job, recipe, self.out, self.registry, self.routing, self.observer)
        self.graph = SampleGraph(window=max(64, 4 * recipe.constructor.prefetch_steps))
        self.wait_hist, self.plan_hist = Histogram(), Histogram()
        self.rejects = Rejects("planner")
        self.warned_truncated: set[int] = set()  # sources whose truncation was logged
        self.num_steps: int | None = None
        self.phase = Phase(started=clock())
        self._handlers: dict[type, Callable[[bytes, Any], None]] = {
            Meta: self._on_meta,
            Progress: self._on_progress,
            Hello: self._on_hello,
            Stats: self._on_stats,
            LoaderLost: self._on_loader_lost,
            CutAt: self._on_cut_at,
            Retired: self._on_retired,
            Failure: self._on_failure,
        }
        self._replies: dict[type, Callable[[Any], Message]] = {
            StatusRequest: lambda _: status.status(self),
            SetMix: lambda m: self.stream.set_mix(m, self.state.step, self.num_steps),
            Rescale: lambda m: self.scaling.rescale(m, self.consumed),
            TakeCheckpoint: lambda _: self._take_checkpoint(),
            Rewind: self._rewind,
        }
        if self.ledger.enabled:
            self.ledger.snapshot()  # the log goes on after it

    @property
    def consumed(self) -> int:
        """Steps that every rank has consumed."""
        return self.registry.consumed

    # -- messages -----------------------------------------------------------------------------
    def handle(self, identity: bytes, msg: Message) -> None:
        """Act on one message from peer ``identity``; what fails admission is counted."""
        if isinstance(msg, Stop):
            self._on_stop(msg)
            return
        if identity in self.registry.lost:
            return  # a loader taken for lost (hung) that woke up: a shadow has its place
        sender = self.registry.roles.get(identity)
        if sender is None and isinstance(msg, Failure) and identity.startswith(FAILURE_PREFIX):
            # a role reports its crash on a socket of its own: ``failure/`` + its identity
            sender = self.registry.roles.get(identity[len(FAILURE_PREFIX) :])
        why = refusal(msg, sender, len(self.recipe.sources), self.registry.topology.world_size)
        if why is not None:
            self.rejects.count("unexpected" if sender is None else "invalid", why)
            return
        self.registry.heard(identity, self.clock())
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(identity, msg)
            return
        reply = self._replies.get(type(msg))
        if reply is None:
            raise ProtocolError(f"the planner got an unexpected {type(msg).__name__}")
        self.out.send(identity, reply(msg))

    def _on_hello(self, identity: bytes, msg: Hello) -> None:
        self.registry.register(identity, msg)
        self.observer.on_hello(identity.hex(), msg)
        if msg.role == "loader" and msg.standby < 0 and self.phase.running:
            # a rescale's new loader, or a shadow taking a lost one's place
            self.out.send(identity, self._welcome())
            for source in msg.sources:
                self.scaling.maybe_cut(source)
                if source in self.routing.wanted:
                    self.out.send(identity, Want(source=source, gpos=self.routing.wanted[source]))
        if not self.phase.running and self.registry.complete():
            self._start()

    def _welcome(self) -> Welcome:
        infos = tuple(
            ConstructorInfo(c.hello.name, c.hello.endpoints["payload"])
            for c in self.registry.constructors
        )
        return Welcome(constructors=infos)

    def _start(self) -> None:
        welcome = self._welcome()
        constructors = self.registry.constructors
        if Tree(len(constructors), self.recipe.constructor.fanout).relays:
            for index, peer in enumerate(constructors):  # where each relays payloads on
                self.out.send(peer.identity, msgspec.structs.replace(welcome, index=index))
        for peer in self.registry.loaders.values():
            self.out.send(peer.identity, welcome)
        self.phase.running = True
        self.phase.started = self.clock()
        log.info(
            "%d loaders, %d constructors",
            len(self.registry.loaders),
            len(self.registry.constructors),
        )
        for source in range(len(self.recipe.sources)):
            self.scaling.maybe_cut(source)  # a rescale still starting when the plane restarted

    def _on_meta(self, identity: bytes, msg: Meta) -> None:
        self.routing.on_meta(identity, msg, self.state, self.start.step)

    def _on_progress(self, identity: bytes, msg: Progress) -> None:
        self.registry.on_progress(identity, msg)
        self.graph.on_delivered(self.registry.built_by.low or 0)
        everywhere = self.registry.built_everywhere()
        if everywhere is not None:
            self.routing.on_built(everywhere)
        self.observer.on_waits(msg.waits_s)
        self.wait_hist.observe_many(msg.waits_s)
        self._record_consumed()

    def _on_stats(self, identity: bytes, msg: Stats) -> None:
        self.observer.on_stats(identity.hex(), msg, self.clock())

    def _on_loader_lost(self, identity: bytes, msg: LoaderLost) -> None:
        self.failover.lose(msg.name, "its process died", self.state, self.consumed)

    def _on_cut_at(self, identity: bytes, msg: CutAt) -> None:
        why = self.scaling.on_cut_at(identity, msg)
        if why is not None:
            self.rejects.count("invalid", why)

    def _on_retired(self, identity: bytes, msg: Retired) -> None:
        self.registry.loaders.pop(msg.name, None)
        self.observer.on_retired(identity.hex())

    def _on_failure(self, identity: bytes, msg: Failure) -> None:
        self.phase.failure = f"{msg.role} {msg.name}: {msg.error}"
        log.error("failure reported by %s %s:\n%s", msg.role, msg.name, msg.traceback)

    def _on_stop(self, msg: Stop) -> None:
        for peer in self.registry.everyone():
            self.out.send(peer.identity, msg)
        if self.phase.running:
            status.append_metrics_line(self.job, status.view(self))  # the last step, for ls
        self.phase.stopped = True

    def _take_checkpoint(self) -> CheckpointTaken | Refused:
        why = self.ledger.checkpoint_refusal()
        if why is not None:
            return Refused(reason=why)
        try:
            path, size, seconds = self.ledger.snapshot()
        except OSError as exc:
            return Refused(reason=f"cannot write a checkpoint in {self.ledger.store.root}: {exc}")
        step = self.ledger.logged
        log.info("checkpoint of step %d at %s", step, path)
        return CheckpointTaken(step=step, path=str(path), bytes=size, seconds=seconds)

    def _rewind(self, msg: Rewind) -> Rewinding | Refused:
        """A trainer restored an earlier checkpoint: make the state at ``msg.step`` the latest
        and end, for the launcher to restart the data plane there."""
        if self.phase.rewind_to is not None:
            return Rewinding(step=self.phase.rewind_to)
        why = self.ledger.rewind(msg.step)
        if why is not None:
            return Refused(reason=why)
        log.info("a trainer went back to step %d; restarting there", msg.step)
        self.phase.rewind_to = msg.step
        return Rewinding(step=msg.step)

    # -- on the loop's clock ------------------------------------------------------------------
    def advance(self) -> None:
        """Plan up to ``prefetch_steps`` ahead of the slowest rank; log what all consumed."""
        self._plan_ahead()
        if self.ledger.logged < self.consumed:
            self._record_consumed()

    def _record_consumed(self) -> None:
        consumed = self.consumed
        due = self.ledger.log_consumed(consumed)
        self.graph.on_consumed(consumed)
        self.ledger.count_consumed(consumed)  # the snapshot's totals are those of its step
        if due:
            self.ledger.snapshot(wait=False)
        logs.set_step(consumed)

    def _plan_ahead(self) -> None:
        if self.routing.still_blocked():  # planning would stop at the same sample again
            return
        limit = self.consumed + self.recipe.constructor.prefetch_steps
        while self.num_steps is None and self.state.step < limit:
            started = time.perf_counter()
            encoder = self.routing.encoder_costs if self.balance_encoder else None
            patches = self.routing.images.patch_counts if self.stream.spec.max_patches else None
            result = plan_step(
                self.stream.spec, self.state, self.routing.lookup, encoder, patches, self.resume
            )
            if isinstance(result, NeedData):
                self.resume = result.resume  # the retry continues from there
                self.routing.blocked = (result.source, result.gpos)
                self.routing.want(result, self.registry.serving)
                return
            self.resume = None
            if isinstance(result, EndOfStream):
                self.num_steps = result.step
                for c in self.registry.constructors:
                    self.out.send(c.identity, End(num_steps=result.step))
                return
            plan, self.state = result
            self._deliver(plan)
            seconds = time.perf_counter() - started
            self.observer.on_plan(seconds, judging.rank_costs(self.stream.spec, plan))
            self.plan_hist.observe(seconds)

    def _deliver(self, plan: StepPlan) -> None:
        """Send a planned step out and keep what its checkpoint and figures need."""
        if not plan.pieces.columns[2].any():
            raise SourceError(judging.no_tokens(self.recipe, plan))
        registry = self.registry
        figures = self.routing.dispatch(plan, registry.dp_constructors, registry.constructors)
        self.ledger.on_planned(plan, self.state, figures)
        self.graph.on_assigned(plan.step, plan.pieces.keys(), self.state.carry)
        truncated = plan.counts.truncated_tokens
        judging.warn_truncated(self.recipe, self.stream.spec, truncated, self.warned_truncated)

    def check_heartbeats(self) -> None:
        """A loader silent for ``loader.heartbeat_s`` is replaced by a shadow (or waited for,
        with none); a shadow silent that long is forgotten."""
        heartbeat_s = self.recipe.loader.heartbeat_s
        limit = self.clock() - heartbeat_s
        silent = self.registry.silent_loaders(limit)
        self.failover.silent(silent, f"silent for {heartbeat_s:g} s", self.state, self.consumed)
        self.registry.forget_silent_shadows(limit)

    def autoscale(self) -> None:
        """Give each source the loaders its demand over the next seconds needs."""
        self.scaling.autoscale(self.stream.spec.schedule, self.consumed)

    def close(self) -> None:
        self.ledger.close()
