"""The Data Constructor's decisions, without sockets: decoded messages in, messages to send out.

``on_planner`` takes what the Planner sends (plans, the relay tree's ``Welcome``, the stream's
``End``, ``Stop``), ``on_payload`` a loader's or a parent Constructor's payload, ``on_request``
a trainer's ``Get``; ``stats`` is read on the loop's clock. What each decides to send waits in
``out`` (an ``Outbox``) for the loop. Each kind of state has one owner: ``intake`` (payloads of
steps not built), ``relay`` (payloads passed on), ``builder`` (the served ranks and how a step
is built), ``parked`` (requests waiting for their batch), ``consumption`` (what the ranks
consumed); the core holds the plans, the ready batches and which steps are built.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from msd import logs
from msd.recipe.schema import Recipe
from msd.roles.constructor.build import Builder, Group
from msd.roles.constructor.consumption import Consumption
from msd.roles.constructor.intake import Intake, early_cap_bytes, payload_samples
from msd.roles.constructor.outbox import Outbox, Trainer
from msd.roles.constructor.parked import Parked
from msd.roles.constructor.ready import Names, Ready
from msd.roles.constructor.relay import Relay
from msd.wire.protocol import (
    Batch,
    Behind,
    End,
    Ended,
    Get,
    Message,
    Payload,
    Plan,
    Refused,
    Stats,
    Stop,
    Welcome,
)
from msd.wire.rejects import Rejects

log = logging.getLogger(__name__)


class ConstructorCore:
    """State it owns: ``plans`` (planned steps not built), ``ready`` (built batches by DP rank,
    CP rank and step, until every rank of the group consumed them), ``built`` / ``built_upto``
    (steps built past, and the first not built), ``step_bytes`` (the most one step's batches
    took), ``num_steps`` (once the stream's end is known), ``stopped`` (the Planner said stop)."""

    def __init__(self, recipe: Recipe, node: str, ranks: tuple[int, ...], start: int) -> None:
        self.recipe = recipe
        self.node = node
        self.ranks = ranks
        self.out = Outbox()
        self.rejects = Rejects(f"constructor {node}")
        self.builder = Builder(recipe, ranks)
        cap = early_cap_bytes(recipe, len(self.builder.groups))
        self.intake = Intake(self.rejects, cap)
        self.relay = Relay(recipe.constructor.fanout, self.rejects, cap)
        self.parked = Parked(self.rejects)
        self.consumption = Consumption(ranks, start)
        self.plans: dict[int, Plan] = {}
        self.ready: dict[tuple[int, int, int], Ready] = {}
        self.built: set[int] = set()
        self.built_upto = start
        self.step_bytes = 0
        self.num_steps: int | None = None
        self.stopped = False
        self._from_planner: dict[type, Callable[[Any], None]] = {
            Plan: self._on_plan,
            Welcome: self._on_welcome,
            End: self._on_end,
            Stop: self._on_stop,
        }

    # -- the Planner ----------------------------------------------------------------------------
    def on_planner(self, msg: Message) -> None:
        """Act on a message from the Planner (any other kind it might send is ignored)."""
        handler = self._from_planner.get(type(msg))
        if handler is not None:
            handler(msg)

    def _on_plan(self, plan: Plan) -> None:
        reason = self._refuse_plan(plan)
        if reason is not None:
            self.rejects.count("invalid", reason)
            return
        self.plans[plan.step] = plan
        self.intake.plan(plan.step, set(zip(plan.source, plan.gpos, strict=True)))
        self._maybe_build(plan.step)

    def _refuse_plan(self, plan: Plan) -> str | None:
        """Why a plan names rows this Constructor cannot build (its columns' lengths and signs
        are checked on decode), or None."""
        if not set(plan.dp) <= {dp for dp, _ in self.builder.groups}:
            return f"a plan for step {plan.step} names DP ranks this constructor does not serve"
        if plan.row and max(plan.row) >= self.recipe.rows_per_rank:
            return f"a plan for step {plan.step} names row {max(plan.row)}"
        if plan.source and max(plan.source) >= len(self.recipe.sources):
            return f"a plan for step {plan.step} names source {max(plan.source)}"
        return None

    def _on_welcome(self, msg: Welcome) -> None:
        """Where relayed payloads go on: to this Constructor's children in the tree."""
        held = self.relay.welcome(msg)
        if held is None:
            return
        self.out.send("outlets", msg)
        for payload, buffers in held:
            if self._admissible(payload):
                self._route(payload, buffers)

    def _on_end(self, msg: End) -> None:
        self.num_steps = msg.num_steps
        log.info("the stream has %d steps", msg.num_steps)
        self._answer_parked()

    def _on_stop(self, msg: Stop) -> None:
        self.stopped = True

    # -- payloads -------------------------------------------------------------------------------
    def on_payload(self, msg: Message, buffers: list[memoryview]) -> None:
        """Take a payload's samples meant for this Constructor; pass the others on (held until
        the Welcome says where)."""
        if not isinstance(msg, Payload):
            self.rejects.count("unexpected", f"a {type(msg).__name__} on the payload socket")
            return
        if not self._admissible(msg):
            return
        if not msg.to:
            self._take(msg, buffers)
        elif self.relay.index is None:  # the Planner's Welcome is still on its way
            self.relay.hold(msg, buffers)
        else:
            self._route(msg, buffers)

    def _admissible(self, msg: Payload) -> bool:
        """A payload for a step in the window, of sources and images this job has (counted
        when not)."""
        if msg.step >= self.horizon() or (
            self.num_steps is not None and msg.step >= self.num_steps
        ):
            self.rejects.count("out-of-window", f"a payload for step {msg.step}")
            return False
        if any(not 0 <= s < len(self.recipe.sources) for s in msg.source):
            self.rejects.count("invalid", "a payload names a source the job does not have")
            return False
        builder = self.builder
        if msg.images and (not builder.vision or msg.patch_values != builder.patch_values):
            self.rejects.count("invalid", "a payload carries images this job cannot have")
            return False
        return True

    def _route(self, msg: Payload, buffers: list[memoryview]) -> None:
        own = self.relay.route(msg, buffers, self.out)
        if own is not None:
            self._take(own[0], own[1])

    def _take(self, msg: Payload, buffers: list[memoryview]) -> None:
        """A payload's samples meant for this Constructor."""
        if msg.step < self.built_upto or msg.step in self.built:
            return  # built already: a shadow sent again what a lost loader had sent
        keys = list(zip(msg.source, msg.gpos, strict=True))
        size = sum(b.nbytes for b in buffers)
        self.intake.add(msg.step, keys, payload_samples(msg, buffers), size)
        self._maybe_build(msg.step)

    def horizon(self) -> int:
        """The first step no payload or request can be for yet: the Planner plans at most
        ``prefetch_steps`` past what every rank consumed; twice that and some slack."""
        consumed = max(self.consumption.consumed.values())
        ahead = max(self.built_upto, consumed, max(self.plans, default=0))
        return ahead + 2 * self.recipe.constructor.prefetch_steps + 8

    # -- building -------------------------------------------------------------------------------
    def _maybe_build(self, step: int) -> None:
        if not self.intake.complete(step):
            return
        plan = self.plans.pop(step)
        built = self.builder.build(plan, self.intake.take(step))
        for (dp, cp_rank), ready in built.items():
            self.ready[(dp, cp_rank, step)] = ready
        self.step_bytes = max(self.step_bytes, sum(r.nbytes for r in built.values()))
        self.built.add(step)
        logs.set_step(step)
        while self.built_upto in self.built:
            self.built.remove(self.built_upto)
            self.built_upto += 1
        self.intake.forget_below(self.built_upto)
        self._answer_parked()

    # -- serving --------------------------------------------------------------------------------
    def on_request(self, identity: bytes, msg: Message) -> None:
        """Serve a trainer's ``Get``; refuse anything else, or a request out of range."""
        if not isinstance(msg, Get):
            self.rejects.count("unexpected", f"a {type(msg).__name__} on the trainer socket")
            refused = Refused(reason=f"constructor {self.node} serves only batch requests")
            self.out.send(Trainer(identity), refused)
        elif (reason := self._refuse_get(msg)) is not None:
            self.out.send(Trainer(identity), Refused(reason=reason))
        else:
            self._on_get(identity, msg)

    def _refuse_get(self, msg: Get) -> str | None:
        """Why a trainer's request cannot be served (counted), or None."""
        if msg.rank not in self.consumption.consumed:
            self.rejects.count("invalid", f"a request for rank {msg.rank}")
            return f"constructor {self.node} does not serve rank {msg.rank}"
        if not 0 <= msg.consumed <= msg.step or msg.step >= self.horizon():
            self.rejects.count("invalid", f"rank {msg.rank}: step {msg.step}, {msg.consumed}")
            return f"rank {msg.rank} asked for step {msg.step} having consumed {msg.consumed}"
        return None

    def _on_get(self, identity: bytes, msg: Get) -> None:
        group = self.builder.group_of(msg.rank)
        first = self.consumption.consumed[msg.rank]
        if msg.step < first and (*group, msg.step) not in self.ready:
            self.out.send(Trainer(identity), Behind(step=msg.step, first=first))
            return
        if self.consumption.advance(msg.rank, msg.consumed, msg.wait_s):
            self._free(group)
        self.parked.park(msg.rank, msg.step, identity)
        self._answer_parked()
        progress = self.consumption.progress(self.step_bytes, self.built_upto)
        if progress is not None:
            self.out.send("planner", progress)

    def _free(self, group: Group) -> None:
        """Drop a group's batches of the steps every rank of the group has consumed."""
        done = self.consumption.done(self.builder.groups[group])
        for key in [k for k in self.ready if k[:2] == group and k[2] < done]:
            del self.ready[key]

    def _answer_parked(self) -> None:
        for request in self.parked.waiting():
            rank, step = request
            c = self.builder.coords[rank]
            ready = self.ready.get((c.dp, c.cp, step))
            if ready is not None:
                names = self.builder.topology.tensors(c)
                self._send_batch(self.parked.pop(request), step, ready, names)
            elif self.num_steps is not None and step >= self.num_steps:
                ended = Ended(num_steps=self.num_steps)
                self.out.send(Trainer(self.parked.pop(request)), ended)

    def _send_batch(self, identity: bytes, step: int, ready: Ready, names: Names) -> None:
        frames, buffer = ready.joined(names)
        batch = Batch(step=step, tensors=tuple(ready.tensors[n] for n in names), frames=frames)
        self.out.send(Trainer(identity), batch, [buffer])

    # -- on the loop's clock --------------------------------------------------------------------
    def stats(self, cpu_s: float, pss: int) -> Stats:
        """This Constructor's figures for the Planner, with the process's CPU time and PSS."""
        return Stats(
            "constructor",
            self.node,
            self.node,
            os.getpid(),
            cpu_s,
            pss,
            ranks=self.consumption.loads(self.built_upto),
            ready_bytes=sum(r.nbytes for r in self.ready.values()),
            rejected=self.rejects.snapshot(),
            relayed=self.relay.relayed,
            relayed_bytes=self.relay.relayed_bytes,
            payload_bytes=self.intake.held_bytes + self.relay.held_bytes,
        )
