"""The Data Constructor process: its sockets feeding a ``ConstructorCore`` and the clock of its
``Stats``. Only this module touches sockets: the Planner's DEALER, the payloads' PULL, the
trainers' ROUTER, and the PUSH sockets to its children in the relay tree (``Outlets``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from msd.checkpoint.resume import latest_state
from msd.jobdir import JobDir, constructor_endpoint_name
from msd.recipe.schema import Recipe
from msd.roles.common import STATS_EVERY_S, connect_planner, hello, process_usage
from msd.roles.constructor.core import ConstructorCore
from msd.roles.constructor.outbox import Child, Destination, Trainer
from msd.roles.outlets import Outlets
from msd.wire import transport
from msd.wire.protocol import Message, Payload, Welcome

log = logging.getLogger(__name__)

GET_MAX_BYTES = 1 << 16  # a trainer's request is a few dozen bytes
PAYLOADS_PER_PEER = 64  # payloads queued from one loader before ZeroMQ reads it no further

Handler = Callable[[bytes | None, Message, list[memoryview]], None]  # identity, message, buffers


class Constructor:
    """The loop: receive, let the core decide, send what it decided."""

    def __init__(self, job: JobDir, recipe: Recipe, node: str, ranks: tuple[int, ...]) -> None:
        self.node = node
        self.ranks = ranks
        resumed = latest_state(job)
        start = resumed.step if resumed is not None else 0  # the step the stream goes on from
        self.core = ConstructorCore(recipe, node, ranks, start)
        ctx, keys = transport.context(), job.keys()
        self.clients, client_endpoint = transport.bind(ctx, zmq.ROUTER, keys, GET_MAX_BYTES)
        self.payloads_in, payload_endpoint = transport.bind(
            ctx, zmq.PULL, keys, queue_per_peer=PAYLOADS_PER_PEER
        )
        self.planner = connect_planner(job, f"constructor/{node}")
        self.endpoints = {"client": client_endpoint, "payload": payload_endpoint}
        self.out = Outlets(keys, recipe.constructor.fanout)
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
                transport.send(self.planner, self.core.stats(*process_usage()))
            events = dict(poller.poll(100))
            if self.payloads_in in events:
                self._drain(self.payloads_in, self._payload)
            if self.planner in events and not self._drain(self.planner, self._from_planner):
                return
            if self.clients in events:
                self._drain(self.clients, self._request)

    def _drain(self, sock: zmq.Socket[Any], handle: Handler) -> bool:
        """Hand every message queued on ``sock`` to the core, sending what it decides after
        each; False once the Planner said stop."""
        while sock.poll(0):
            received = transport.recv_or_drop(sock, self.core.rejects)
            if received is None:
                continue
            handle(*received)
            self._flush()
            if self.core.stopped:
                return False
        return True

    def _from_planner(self, _: bytes | None, msg: Message, buffers: list[memoryview]) -> None:
        self.core.on_planner(msg)

    def _payload(self, _: bytes | None, msg: Message, buffers: list[memoryview]) -> None:
        self.core.on_payload(msg, buffers)

    def _request(self, identity: bytes | None, msg: Message, _: list[memoryview]) -> None:
        assert identity is not None  # a ROUTER socket always names the sender
        self.core.on_request(identity, msg)

    def _flush(self) -> None:
        for to, msg, buffers in self.core.out.take():
            self._send(to, msg, buffers)

    def _send(self, to: Destination, msg: Message, buffers: list[Any]) -> None:
        match to:
            case Trainer(identity):
                transport.send(self.clients, msg, buffers, to=identity)
            case Child(index):
                assert isinstance(msg, Payload)  # only payloads are relayed
                self.out.send(index, msg, buffers)
            case "outlets":
                assert isinstance(msg, Welcome)
                self.out.welcome(msg)
            case "planner":
                transport.send(self.planner, msg, buffers)

    def close(self) -> None:
        """Close its sockets (what was sent last still goes out, for ``LINGER_MS``)."""
        self.out.close()
        for sock in (self.clients, self.payloads_in, self.planner):
            sock.close()


def main(job: JobDir, node: str, ranks: tuple[int, ...]) -> None:
    constructor = Constructor(job, job.recipe(), node, ranks)
    try:
        constructor.run()
    finally:
        constructor.close()
