"""Data Constructor: the sidecar that builds and serves batches for the ranks on its node.

It receives each step's plan from the Planner and the payloads straight from loaders, packs each
data-parallel rank's rows once all payloads of the step are in (``msd.pack``), cuts the context-
parallel slices (``msd.shard``), and answers each trainer rank's ``Get`` from its buffer of ready
batches: one copy per (DP rank, CP rank) and step, shared by every TP peer and pipeline stage
that reads it (a stage gets only the tensors it uses). It reports consumption (and the trainers'
data-wait) back to the Planner, which is what lets the Planner plan ahead without running away.
"""

from __future__ import annotations

import os
import time
from collections import deque

import numpy as np
import zmq

from msd.checkpoint.resume import latest_state
from msd.jobdir import JobDir
from msd.pack import Piece, pack_rows
from msd.recipe.schema import Recipe
from msd.roles.common import STATS_EVERY_S, connect_planner, hello, process_usage
from msd.roles.planner import topology_of
from msd.shard import cp_slice
from msd.wire import transport
from msd.wire.protocol import (
    Batch,
    Behind,
    End,
    Ended,
    Get,
    Payload,
    Plan,
    Progress,
    RankLoad,
    Refused,
    Stats,
    Stop,
    TensorSpec,
)

RANK_WAITS = 100  # a rank's data-wait percentiles in its Stats are over this many steps

Arrays = dict[str, np.ndarray]


def constructor_endpoint_name(node: str) -> str:
    return f"constructor-{node}"


class Constructor:
    def __init__(self, job: JobDir, recipe: Recipe, node: str, ranks: tuple[int, ...]) -> None:
        self.recipe = recipe
        self.node = node
        self.ranks = ranks
        self.topology = topology_of(recipe)
        self.coords = {rank: self.topology.coords(rank) for rank in ranks}
        self.groups: dict[tuple[int, int], list[int]] = {}
        for rank, c in self.coords.items():
            self.groups.setdefault((c.dp, c.cp), []).append(rank)
        ctx = transport.context()
        self.clients, client_endpoint = transport.bind(ctx, zmq.ROUTER)
        self.payloads_in, payload_endpoint = transport.bind(ctx, zmq.PULL)
        self.planner = connect_planner(job, f"constructor/{node}")
        self.endpoints = {"client": client_endpoint, "payload": payload_endpoint}
        self.plans: dict[int, Plan] = {}
        self.missing: dict[int, int] = {}
        self.payloads: dict[tuple[int, int], np.ndarray] = {}
        self.ready: dict[tuple[int, int, int], Arrays] = {}
        self.parked: dict[tuple[int, int], bytes] = {}
        resumed = latest_state(job)
        start = resumed.step if resumed is not None else 0  # the step the stream goes on from
        self.consumed = {rank: start for rank in ranks}
        self.reported = start
        self.step_bytes = 0
        self.built: set[int] = set()
        self.built_upto = start
        self.waits: list[float] = []
        self.rank_waits: dict[int, deque[float]] = {r: deque(maxlen=RANK_WAITS) for r in ranks}
        self.num_steps: int | None = None
        job.publish(constructor_endpoint_name(node), client_endpoint)

    def run(self) -> None:
        hi = hello(
            "constructor", self.node, node=self.node, endpoints=self.endpoints, ranks=self.ranks
        )
        transport.send(self.planner, hi)
        poller = zmq.Poller()
        for sock in (self.planner, self.payloads_in, self.clients):
            poller.register(sock, zmq.POLLIN)
        next_stats = 0.0
        while True:
            if time.monotonic() >= next_stats:
                next_stats = time.monotonic() + STATS_EVERY_S
                transport.send(self.planner, self._stats())
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
            if msg.step < self.built_upto or msg.step in self.built:
                continue  # built already: a shadow sent again what a lost loader had sent
            tokens = np.frombuffer(buffers[0], dtype=np.int32)  # a view: no copy
            bounds = np.cumsum((0, *msg.lengths))
            new = 0
            for i, key in enumerate(zip(msg.source, msg.gpos, strict=True)):
                new += key not in self.payloads
                self.payloads[key] = tokens[bounds[i] : bounds[i + 1]]
            if msg.step in self.missing:  # else its plan has not come yet: counted then
                self.missing[msg.step] -= new
                self._maybe_build(msg.step)

    def _on_plan(self, plan: Plan) -> None:
        self.plans[plan.step] = plan
        needed = {(s[2], s[3]) for s in plan.slots}
        self.missing[plan.step] = len(needed) - sum(key in self.payloads for key in needed)
        self._maybe_build(plan.step)

    # -- building -----------------------------------------------------------------------------
    def _maybe_build(self, step: int) -> None:
        if self.missing.get(step) != 0:
            return
        plan = self.plans.pop(step)
        del self.missing[step]
        rows = self._rows(plan)
        size = 0
        for dp, cp_rank in self.groups:
            arrays = cp_slice(pack_rows(rows[dp], self.recipe.seq_len), self.topology.cp, cp_rank)
            self.ready[(dp, cp_rank, step)] = arrays
            size += sum(a.nbytes for a in arrays.values())
        self.step_bytes = max(self.step_bytes, size)
        self.built.add(step)
        while self.built_upto in self.built:
            self.built.remove(self.built_upto)
            self.built_upto += 1
        for slot in plan.slots:
            self.payloads.pop((slot[2], slot[3]), None)
        self._answer_parked()

    def _rows(self, plan: Plan) -> dict[int, list[list[Piece]]]:
        rows: dict[int, list[list[Piece]]] = {
            dp: [[] for _ in range(self.recipe.rows_per_rank)] for dp, _ in self.groups
        }
        for dp, row, source, gpos, sample_id, length, offset, padded in plan.slots:
            tokens = self.payloads[(source, gpos)][offset : offset + length]
            rows[dp][row].append(Piece(source, sample_id, tokens, padded, offset))
        return rows

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
        c = self.coords[msg.rank]
        if msg.step < self.consumed[msg.rank] and (c.dp, c.cp, msg.step) not in self.ready:
            first = self.consumed[msg.rank]
            transport.send(self.clients, Behind(step=msg.step, first=first), to=identity)
            return
        if msg.consumed > self.consumed[msg.rank]:
            self.consumed[msg.rank] = msg.consumed
            self.waits.append(msg.wait_s)
            self.rank_waits[msg.rank].append(msg.wait_s)
            self._free(msg.rank)
        self.parked[(msg.rank, msg.step)] = identity
        self._answer_parked()
        self._report_progress()

    def _free(self, rank: int) -> None:
        """Drop a group's batches of the steps every rank of the group has consumed."""
        c = self.coords[rank]
        done = min(self.consumed[r] for r in self.groups[(c.dp, c.cp)])
        for key in [k for k in self.ready if k[:2] == (c.dp, c.cp) and k[2] < done]:
            del self.ready[key]

    def _answer_parked(self) -> None:
        for key in list(self.parked):
            rank, step = key
            c = self.coords[rank]
            arrays = self.ready.get((c.dp, c.cp, step))
            if arrays is not None:
                self._send_batch(self.parked.pop(key), step, arrays, self.topology.tensors(c))
            elif self.num_steps is not None and step >= self.num_steps:
                transport.send(
                    self.clients, Ended(num_steps=self.num_steps), to=self.parked.pop(key)
                )

    def _send_batch(
        self, identity: bytes, step: int, arrays: Arrays, names: tuple[str, ...]
    ) -> None:
        specs = tuple(TensorSpec(n, str(arrays[n].dtype), arrays[n].shape) for n in names)
        transport.send(
            self.clients, Batch(step=step, tensors=specs), [arrays[n] for n in names], to=identity
        )

    def _stats(self) -> Stats:
        cpu_s, pss = process_usage()
        ranks = []
        for rank, waits in self.rank_waits.items():
            ms = np.array(waits) * 1000 if waits else np.zeros(1)
            p50, p99 = np.percentile(ms, [50, 99])
            ahead = max(0, self.built_upto - self.consumed[rank])
            ranks.append(RankLoad(rank, self.consumed[rank], ahead, float(p50), float(p99)))
        ready = sum(a.nbytes for arrays in self.ready.values() for a in arrays.values())
        return Stats(
            "constructor",
            self.node,
            self.node,
            os.getpid(),
            cpu_s,
            pss,
            ranks=tuple(ranks),
            ready_bytes=ready,
        )

    def _report_progress(self) -> None:
        consumed = min(self.consumed.values())
        if consumed > self.reported or len(self.waits) >= 64:
            self.reported = max(self.reported, consumed)
            progress = Progress(
                consumed=self.reported,
                waits_s=tuple(self.waits),
                step_bytes=self.step_bytes,
                built=self.built_upto,
            )
            transport.send(self.planner, progress)
            self.waits.clear()


def main(job: JobDir, node: str, ranks: tuple[int, ...]) -> None:
    Constructor(job, job.recipe(), node, ranks).run()
