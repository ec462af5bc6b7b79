"""Data Constructor: the sidecar that builds and serves batches for the ranks on its node.

It receives each step's plan from the Planner and the payloads from loaders (straight, or relayed
by other Constructors: ``msd.plan.fanout``; it relays in turn what is meant for those below it),
packs each data-parallel rank's rows once all payloads of the step are in (``msd.pack``), cuts
the context-parallel slices (``msd.shard``), and answers each trainer rank's ``Get`` from its
buffer of ready batches: one copy per (DP rank, CP rank) and step, shared by every TP peer and
pipeline stage that reads it (a stage gets only the tensors it uses). It reports consumption (and
the trainers' data-wait) back to the Planner, which is what lets the Planner plan ahead without
running away.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque

import numpy as np
import zmq

from msd import logs
from msd.checkpoint.resume import latest_state
from msd.jobdir import JobDir, constructor_endpoint_name
from msd.pack import Piece, VideoOutput, pack_rows
from msd.plan.spec import topology_of
from msd.recipe.schema import Recipe
from msd.roles.common import STATS_EVERY_S, connect_planner, hello, process_usage
from msd.roles.intake import Intake, Key, Sample
from msd.roles.outlets import Outlets
from msd.roles.ready import Names, Ready
from msd.sample import SampleImages
from msd.shard import cp_slice
from msd.wire import transport
from msd.wire.protocol import (
    Batch,
    Behind,
    End,
    Ended,
    Get,
    Payload,
    PayloadLayout,
    Plan,
    Progress,
    RankLoad,
    Refused,
    Stats,
    Stop,
    Welcome,
    trained_spans,
)
from msd.wire.rejects import Rejects
from msd.wire.relay import split_payload

log = logging.getLogger(__name__)

RANK_WAITS = 100  # a rank's data-wait percentiles in its Stats are over this many steps
GET_MAX_BYTES = 1 << 16  # a trainer's request is a few dozen bytes
PARKED_PER_RANK = 4  # a Client has one request in flight (two as the stream ends)
EARLY_CAP_MIN_BYTES = 64 << 20
PAYLOADS_PER_PEER = 64  # payloads queued from one loader before ZeroMQ reads it no further


class Constructor:
    def __init__(self, job: JobDir, recipe: Recipe, node: str, ranks: tuple[int, ...]) -> None:
        self.recipe = recipe
        self.node = node
        self.ranks = ranks
        self.topology = topology_of(recipe)
        self.vision = recipe.has_images
        self.image_token = recipe.vision.image_token_id if self.vision else None
        v = recipe.vision
        self.patch_values = 3 * v.temporal_patch_size * v.patch_size**2
        self.video = (
            VideoOutput(
                recipe.video.video_token_id,
                self.patch_values * recipe.video_rows_per_patch,
                recipe.video.seconds_per_grid,
            )
            if recipe.has_videos
            else None
        )
        self.coords = {rank: self.topology.coords(rank) for rank in ranks}
        self.groups: dict[tuple[int, int], list[int]] = {}
        for rank, c in self.coords.items():
            self.groups.setdefault((c.dp, c.cp), []).append(rank)
        self.readers = {  # what each group's ranks read (its pipeline stages differ)
            group: tuple(dict.fromkeys(self.topology.tensors(self.coords[r]) for r in ranks))
            for group, ranks in self.groups.items()
        }
        ctx, keys = transport.context(), job.keys()
        self.clients, client_endpoint = transport.bind(ctx, zmq.ROUTER, keys, GET_MAX_BYTES)
        self.payloads_in, payload_endpoint = transport.bind(
            ctx, zmq.PULL, keys, queue_per_peer=PAYLOADS_PER_PEER
        )
        self.planner = connect_planner(job, f"constructor/{node}")
        self.endpoints = {"client": client_endpoint, "payload": payload_endpoint}
        self.rejects = Rejects(f"constructor {node}")
        self.out = Outlets(keys, recipe.constructor.fanout)
        self.index: int | None = None  # this Constructor's number, once payloads are relayed
        self.unrelayed: list[tuple[Payload, list[memoryview]]] = []  # until the Welcome
        self.unrelayed_bytes = 0
        self.relayed = self.relayed_bytes = 0  # payloads passed on, and their bytes
        self.plans: dict[int, Plan] = {}
        self.intake = Intake(self.rejects, early_cap_bytes(recipe, len(self.groups)))
        self.ready: dict[tuple[int, int, int], Ready] = {}
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
        log.info("serving ranks %s", ", ".join(map(str, self.ranks)))
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
            received = transport.recv_or_drop(self.planner, self.rejects)
            if received is None:
                continue
            msg = received[1]
            if isinstance(msg, Plan):
                self._on_plan(msg)
            elif isinstance(msg, Welcome):
                self._on_welcome(msg)
            elif isinstance(msg, End):
                self.num_steps = msg.num_steps
                log.info("the stream has %d steps", msg.num_steps)
                self._answer_parked()
            elif isinstance(msg, Stop):
                return False
        return True

    def _drain_payloads(self) -> None:
        while self.payloads_in.poll(0):
            received = transport.recv_or_drop(self.payloads_in, self.rejects)
            if received is not None:
                self._on_payload(received[1], received[2])

    def _on_payload(self, msg: object, buffers: list[memoryview]) -> None:
        if not isinstance(msg, Payload):
            self.rejects.count("unexpected", f"a {type(msg).__name__} on the payload socket")
            return
        if not self._admissible(msg):
            return
        if not msg.to:
            self._take(msg, buffers)
        elif self.index is None:  # the Planner's Welcome is still on its way
            size = sum(b.nbytes for b in buffers)
            if self.unrelayed_bytes + size > self.intake.early_cap_bytes:
                self.rejects.count("over-capacity", f"a relayed payload for step {msg.step}")
                return
            self.unrelayed.append((msg, buffers))
            self.unrelayed_bytes += size
        else:
            self._relay(msg, buffers)

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
        if msg.images and (not self.vision or msg.patch_values != self.patch_values):
            self.rejects.count("invalid", "a payload carries images this job cannot have")
            return False
        return True

    def _on_welcome(self, msg: Welcome) -> None:
        """Where relayed payloads go on: to this Constructor's children in the tree."""
        if not 0 <= msg.index < len(msg.constructors):
            self.rejects.count("invalid", f"a Welcome numbering this constructor {msg.index}")
            return
        self.out.welcome(msg)
        self.index = msg.index
        children = list(self.out.tree.children(msg.index))
        log.info("constructor %d of %d; relays to %s", msg.index, self.out.tree.size, children)
        held, self.unrelayed, self.unrelayed_bytes = self.unrelayed, [], 0
        for payload, buffers in held:
            if self._admissible(payload):
                self._relay(payload, buffers)

    def _relay(self, msg: Payload, buffers: list[memoryview]) -> None:
        """Pass each sample on towards the Constructor it is for; keep this one's."""
        me, tree = self.index, self.out.tree
        assert me is not None
        hops = {d: tree.next_hop(me, d) if d < tree.size else None for d in set(msg.to)}
        route = {d: hop for d, hop in hops.items() if hop is not None}
        if len(route) < len(hops):
            self.rejects.count("invalid", f"a payload for step {msg.step} relayed off its path")
            return
        parts = split_payload(msg, buffers, route.__getitem__)
        own = parts.pop(me, None)
        for hop, (part, part_buffers) in parts.items():
            self.out.send(hop, part, part_buffers)
            self.relayed += 1
            self.relayed_bytes += sum(memoryview(b).nbytes for b in part_buffers)
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
        ahead = max(self.built_upto, max(self.consumed.values()), max(self.plans, default=0))
        return ahead + 2 * self.recipe.constructor.prefetch_steps + 8

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
        if not set(plan.dp) <= {dp for dp, _ in self.groups}:
            return f"a plan for step {plan.step} names DP ranks this constructor does not serve"
        if plan.row and max(plan.row) >= self.recipe.rows_per_rank:
            return f"a plan for step {plan.step} names row {max(plan.row)}"
        if plan.source and max(plan.source) >= len(self.recipe.sources):
            return f"a plan for step {plan.step} names source {max(plan.source)}"
        return None

    # -- building -----------------------------------------------------------------------------
    def _maybe_build(self, step: int) -> None:
        if not self.intake.complete(step):
            return
        plan = self.plans.pop(step)
        rows = self._rows(plan, self.intake.take(step))
        size = 0
        for dp, cp_rank in self.groups:
            packed = pack_rows(
                rows[dp],
                self.recipe.seq_len,
                self.image_token,
                self.patch_values,
                self.video,
                self.recipe.has_masks,
            )
            sliced = cp_slice(packed, self.topology.cp, cp_rank)
            ready = Ready.of(sliced, self.readers[(dp, cp_rank)])
            self.ready[(dp, cp_rank, step)] = ready
            size += ready.nbytes
        self.step_bytes = max(self.step_bytes, size)
        self.built.add(step)
        logs.set_step(step)
        while self.built_upto in self.built:
            self.built.remove(self.built_upto)
            self.built_upto += 1
        self.intake.forget_below(self.built_upto)
        self._answer_parked()

    def _rows(self, plan: Plan, payloads: dict[Key, Sample]) -> dict[int, list[list[Piece]]]:
        rows: dict[int, list[list[Piece]]] = {
            dp: [[] for _ in range(self.recipe.rows_per_rank)] for dp, _ in self.groups
        }
        pieces = zip(
            plan.dp,
            plan.row,
            plan.source,
            plan.gpos,
            plan.sample_id,
            plan.length,
            plan.offset,
            plan.padded,
            strict=True,
        )
        for dp, row, source, gpos, sample_id, length, offset, padded in pieces:
            tokens, images, trained = payloads[(source, gpos)]
            piece = tokens[offset : offset + length]
            if images is not None and len(piece) < len(tokens):  # a piece of a split sample
                images = self._images_within(tokens, images, offset, offset + length)
            own = None if trained is None else trained - offset  # the piece's own positions
            rows[dp][row].append(Piece(source, sample_id, piece, padded, offset, images, own))
        return rows

    def _images_within(
        self, tokens: np.ndarray, images: SampleImages, start: int, stop: int
    ) -> SampleImages | None:
        """The images whose placeholders lie in tokens ``start .. stop`` of their sample (an
        image is never cut: its sample was split at text positions)."""
        assert self.image_token is not None
        video = self.recipe.video.video_token_id
        begins = images.starts(tokens, self.image_token, self.recipe.vision.merge_size, video)
        first, last = np.searchsorted(begins, [start, stop]).tolist()
        return images.subset(first, last) if last > first else None

    # -- serving ------------------------------------------------------------------------------
    def _drain_clients(self) -> None:
        while self.clients.poll(0):
            received = transport.recv_or_drop(self.clients, self.rejects)
            if received is None:
                continue
            identity, msg, _ = received
            assert identity is not None  # a ROUTER socket always names the sender
            self._on_request(identity, msg)

    def _on_request(self, identity: bytes, msg: object) -> None:
        """Serve a trainer's ``Get``; refuse anything else, or a request out of range."""
        if not isinstance(msg, Get):
            self.rejects.count("unexpected", f"a {type(msg).__name__} on the trainer socket")
            refused = Refused(reason=f"constructor {self.node} serves only batch requests")
            transport.send(self.clients, refused, to=identity)
        elif (reason := self._refuse_get(msg)) is not None:
            transport.send(self.clients, Refused(reason=reason), to=identity)
        else:
            self._on_get(identity, msg)

    def _refuse_get(self, msg: Get) -> str | None:
        """Why a trainer's request cannot be served (counted), or None."""
        if msg.rank not in self.consumed:
            self.rejects.count("invalid", f"a request for rank {msg.rank}")
            return f"constructor {self.node} does not serve rank {msg.rank}"
        if not 0 <= msg.consumed <= msg.step or msg.step >= self.horizon():
            self.rejects.count("invalid", f"rank {msg.rank}: step {msg.step}, {msg.consumed}")
            return f"rank {msg.rank} asked for step {msg.step} having consumed {msg.consumed}"
        return None

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
        self._park(msg.rank, msg.step, identity)
        self._answer_parked()
        self._report_progress()

    def _park(self, rank: int, step: int, identity: bytes) -> None:
        """Hold a request until its batch is built; a rank's oldest requests beyond
        ``PARKED_PER_RANK`` are forgotten (a Client has one in flight)."""
        self.parked[(rank, step)] = identity
        mine = sorted(s for r, s in self.parked if r == rank)
        for old in mine[: max(0, len(mine) - PARKED_PER_RANK)]:
            del self.parked[(rank, old)]
            self.rejects.count("over-capacity", f"rank {rank}: request for step {old} forgotten")

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
            ready = self.ready.get((c.dp, c.cp, step))
            if ready is not None:
                self._send_batch(self.parked.pop(key), step, ready, self.topology.tensors(c))
            elif self.num_steps is not None and step >= self.num_steps:
                transport.send(
                    self.clients, Ended(num_steps=self.num_steps), to=self.parked.pop(key)
                )

    def _send_batch(self, identity: bytes, step: int, ready: Ready, names: Names) -> None:
        frames, buffer = ready.joined(names)
        batch = Batch(step=step, tensors=tuple(ready.tensors[n] for n in names), frames=frames)
        transport.send(self.clients, batch, [buffer], to=identity)

    def close(self) -> None:
        """Close its sockets (what was sent last still goes out, for ``LINGER_MS``)."""
        self.out.close()
        for sock in (self.clients, self.payloads_in, self.planner):
            sock.close()

    def _stats(self) -> Stats:
        cpu_s, pss = process_usage()
        ranks = []
        for rank, waits in self.rank_waits.items():
            ms = np.array(waits) * 1000 if waits else np.zeros(1)
            p50, p99 = np.percentile(ms, [50, 99])
            ahead = max(0, self.built_upto - self.consumed[rank])
            ranks.append(RankLoad(rank, self.consumed[rank], ahead, float(p50), float(p99)))
        ready = sum(r.nbytes for r in self.ready.values())
        return Stats(
            "constructor",
            self.node,
            self.node,
            os.getpid(),
            cpu_s,
            pss,
            ranks=tuple(ranks),
            ready_bytes=ready,
            rejected=self.rejects.snapshot(),
            relayed=self.relayed,
            relayed_bytes=self.relayed_bytes,
            payload_bytes=self.intake.held_bytes + self.unrelayed_bytes,
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


def payload_samples(msg: Payload, buffers: list[memoryview]) -> list[Sample]:
    """Each sample of a payload: views on its frames (no copy), its images if it has any."""
    tokens = np.frombuffer(buffers[0], dtype=msg.token_dtype)  # checked on decode
    layout = PayloadLayout.of(msg)
    bounds, first, rows, grids = layout.bounds, layout.first, layout.rows, layout.grids
    images: list[SampleImages | None] = [None] * len(msg.gpos)
    if msg.images:
        patches = np.frombuffer(buffers[1], dtype=np.uint8).reshape(-1, msg.patch_values)
        for i, n in enumerate(msg.images):
            if n:
                own = grids[first[i] : first[i] + n]
                span = patches[rows[first[i]] : rows[first[i] + n]]
                videos = tuple(map(bool, msg.videos[first[i] : first[i] + n]))
                images[i] = SampleImages(
                    span,
                    tuple((t, h, w) for t, h, w in own.tolist()),
                    videos if any(videos) else (),
                    msg.video_rows,
                )
    spans = trained_spans(msg)
    return [
        (tokens[bounds[i] : bounds[i + 1]], images[i], None if spans is None else spans[i])
        for i in range(len(msg.gpos))
    ]


def early_cap_bytes(recipe: Recipe, groups: int) -> int:
    """How many bytes of payloads a Constructor keeps for steps not planned yet: the tokens (and
    at most the patches they stand for) of its rows over the whole planning window, eight times
    over, and at least 64 MiB."""
    window = 2 * recipe.constructor.prefetch_steps + 8
    per_token = 4
    if recipe.has_images:  # a placeholder token brings merge_size² patches with it
        per_token += recipe.bytes_per_visual_token
    step_bytes = groups * recipe.rows_per_rank * recipe.seq_len * per_token
    return max(EARLY_CAP_MIN_BYTES, 8 * window * step_bytes)


def main(job: JobDir, node: str, ranks: tuple[int, ...]) -> None:
    constructor = Constructor(job, job.recipe(), node, ranks)
    try:
        constructor.run()
    finally:
        constructor.close()
