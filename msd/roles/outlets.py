"""Where a loader or a Constructor sends payloads: a PUSH socket per Constructor it sends to,
opened on first use, and the relay tree (``msd.plan.fanout``) that says which those are.

A loader sends a sample meant for Constructor ``d`` to ``tree.entry(d)``; with more nodes than
the fan-out that is one of at most ``fanout`` Constructors, so its sockets do not grow with the
nodes. A relaying Constructor opens sockets only to its children.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from msd.plan.fanout import Tree
from msd.wire import transport
from msd.wire.keys import JobKeys
from msd.wire.protocol import Payload, Welcome

log = logging.getLogger(__name__)


class Outlets:
    def __init__(self, keys: JobKeys, fanout: int | None) -> None:
        self.keys = keys
        self.fanout = fanout
        self.endpoints: tuple[str, ...] = ()
        self.tree = Tree(0, fanout)
        self.sockets: dict[int, zmq.Socket[Any]] = {}

    def welcome(self, msg: Welcome) -> None:
        """The Constructors of this incarnation, in the Planner's numbering."""
        self.close()
        self.endpoints = tuple(c.payload_endpoint for c in msg.constructors)
        self.tree = Tree(len(self.endpoints), self.fanout)

    def send(self, index: int, payload: Payload, buffers: list[Any]) -> None:
        sock = self.sockets.get(index)
        if sock is None:
            ctx = transport.context()
            sock = transport.connect(ctx, zmq.PUSH, self.endpoints[index], keys=self.keys)
            self.sockets[index] = sock
        transport.send(sock, payload, buffers)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()
