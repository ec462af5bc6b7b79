"""Data Constructor: the sidecar that builds and serves batches for the ranks on its node.

It receives each step's plan from the Planner and the payloads straight from loaders, packs every
served rank's rows once all payloads of the step are in (``msd.pack``), and answers each rank's
``Get`` from its buffer of ready batches. It reports consumption (and the trainers' data-wait)
back to the Planner, which is what lets the Planner plan ahead without running away.
"""

from __future__ import annotations

import numpy as np
import zmq

from msd.jobdir import JobDir
from msd.pack import Piece, pack_rows
from msd.recipe.schema import Recipe
from msd.roles.common import connect_planner, hello
from msd.wire import transport
from msd.wire.protocol import (
    Batch,
    End,
    Ended,
    Get,
    Payload,
    Plan,
    Progress,
    Refused,
    Stop,
    TensorSpec,
)

Built = tuple[Batch, list[np.ndarray]]


def constructor_endpoint_name(node: str) -> str:
    return f"constructor-{node}"


class Constructor:
    def __init__(self, job: JobDir, recipe: Recipe, node: str, ranks: tuple[int, ...]) -> None:
        self.recipe = recipe
        self.node = node
        self.ranks = ranks
        ctx = transport.context()
        self.clients, client_endpoint = transport.bind(ctx, zmq.ROUTER)
        self.payloads_in, payload_endpoint = transport.bind(ctx, zmq.PULL)
        self.planner = connect_planner(job, f"constructor/{node}")
        self.endpoints = {"client": client_endpoint, "payload": payload_endpoint}
        self.plans: dict[int, Plan] = {}
        self.missing: dict[int, int] = {}
        self.payloads: dict[tuple[int, int], np.ndarray] = {}
        self.ready: dict[tuple[int, int], Built] = {}
        self.parked: dict[tuple[int, int], bytes] = {}
        self.consumed = {rank: 0 for rank in ranks}
        self.reported = 0
        self.waits: list[float] = []
        self.num_steps: int | None = None
        job.publish(constructor_endpoint_name(node), client_endpoint)

    def run(self) -> None:
        transport.send(
            self.planner,
            hello(
                "constructor", self.node, node=self.node, endpoints=self.endpoints, ranks=self.ranks
            ),
        )
        poller = zmq.Poller()
        for sock in (self.planner, self.payloads_in, self.clients):
            poller.register(sock, zmq.POLLIN)
        while True:
            events = dict(poller.poll(100))
            if self.payloads_in in events:
                self._drain_payloads()
            if self.planner in events and not self._drain_planner():
                return
            if self.clients in events:
                self._drain_clients()

    # -- inputs -------------------------------------------------------------------------------
    def _drain_planner(self) -> bool:
        while self.planner.poll(0):
            _, msg, _ = transport.recv(self.planner)
            if isinstance(msg, Plan):
                self._on_plan(msg)
            elif isinstance(msg, End):
                self.num_steps = msg.num_steps
                self._answer_parked()
            elif isinstance(msg, Stop):
                return False
        return True

    def _drain_payloads(self) -> None:
        while self.payloads_in.poll(0):
            _, msg, buffers = transport.recv(self.payloads_in)
            if not isinstance(msg, Payload):
                continue
            tokens = np.frombuffer(buffers[0], dtype=np.int32)  # a view: no copy
            bounds = np.cumsum((0, *msg.lengths))
            for i, gpos in enumerate(msg.gpos):
                self.payloads[(msg.source, gpos)] = tokens[bounds[i] : bounds[i + 1]]
            if msg.step in self.missing:
                self.missing[msg.step] -= len(msg.gpos)
                self._maybe_build(msg.step)

    def _on_plan(self, plan: Plan) -> None:
        self.plans[plan.step] = plan
        present = sum((s[2], s[3]) in self.payloads for s in plan.slots)
        self.missing[plan.step] = len(plan.slots) - present
        self._maybe_build(plan.step)

    # -- building -----------------------------------------------------------------------------
    def _maybe_build(self, step: int) -> None:
        if self.missing.get(step) != 0:
            return
        plan = self.plans.pop(step)
        del self.missing[step]
        rows: dict[int, list[list[Piece]]] = {
            r: [[] for _ in range(self.recipe.rows_per_rank)] for r in self.ranks
        }
        for rank, row, source, gpos, sample_id, _length in plan.slots:
            tokens = self.payloads.pop((source, gpos))
            rows[rank][row].append(Piece(source, sample_id, tokens))
        for rank, rank_rows in rows.items():
            arrays = pack_rows(rank_rows, self.recipe.seq_len)
            specs = tuple(TensorSpec(k, str(v.dtype), v.shape) for k, v in arrays.items())
            self.ready[(rank, step)] = (Batch(step=step, tensors=specs), list(arrays.values()))
        self._answer_parked()

    # -- serving ------------------------------------------------------------------------------
    def _drain_clients(self) -> None:
        while self.clients.poll(0):
            identity, msg, _ = transport.recv(self.clients)
            assert identity is not None
            if isinstance(msg, Get) and msg.rank in self.consumed:
                self._on_get(identity, msg)
            else:
                reason = f"constructor {self.node} does not serve rank {getattr(msg, 'rank', '?')}"
                transport.send(self.clients, Refused(reason=reason), to=identity)

    def _on_get(self, identity: bytes, msg: Get) -> None:
        if msg.step < self.consumed[msg.rank]:
            reason = f"step {msg.step} of rank {msg.rank} was already consumed"
            transport.send(self.clients, Refused(reason=reason), to=identity)
            return
        if msg.consumed > self.consumed[msg.rank]:
            for step in range(self.consumed[msg.rank], msg.consumed):
                self.ready.pop((msg.rank, step), None)
            self.consumed[msg.rank] = msg.consumed
            self.waits.append(msg.wait_s)
        self.parked[(msg.rank, msg.step)] = identity
        self._answer_parked()
        self._report_progress()

    def _answer_parked(self) -> None:
        for key in list(self.parked):
            _rank, step = key
            if key in self.ready:
                batch, arrays = self.ready[key]
                transport.send(self.clients, batch, arrays, to=self.parked.pop(key))
            elif self.num_steps is not None and step >= self.num_steps:
                transport.send(
                    self.clients, Ended(num_steps=self.num_steps), to=self.parked.pop(key)
                )

    def _report_progress(self) -> None:
        consumed = min(self.consumed.values())
        if consumed > self.reported or len(self.waits) >= 64:
            self.reported = max(self.reported, consumed)
            transport.send(
                self.planner, Progress(consumed=self.reported, waits_s=tuple(self.waits))
            )
            self.waits.clear()


def main(job: JobDir, node: str, ranks: tuple[int, ...]) -> None:
    Constructor(job, job.recipe(), node, ranks).run()
