"""A Constructor's part in hierarchical fan-out (``msd.plan.fanout``), without sockets: the
payloads it passes on to the Constructors below it, and those that came before it knew its
place in the tree (the Planner's ``Welcome``)."""

from __future__ import annotations

import logging

from msd.plan.fanout import Tree
from msd.roles.constructor.outbox import Child, Outbox
from msd.wire.protocol import Payload, Welcome
from msd.wire.rejects import Rejects
from msd.wire.relay import Part, split_payload

log = logging.getLogger(__name__)


class Relay:
    """State: ``index`` (this Constructor's number, once welcomed), ``tree``, ``held`` (relayed
    payloads that came before the Welcome, ``held_bytes`` of them, at most ``cap_bytes``),
    ``relayed`` / ``relayed_bytes`` (payloads passed on, and their bytes)."""

    def __init__(self, fanout: int | None, rejects: Rejects, cap_bytes: int) -> None:
        self.fanout = fanout
        self.rejects = rejects
        self.cap_bytes = cap_bytes
        self.index: int | None = None
        self.tree = Tree(0, fanout)
        self.held: list[Part] = []
        self.held_bytes = 0
        self.relayed = self.relayed_bytes = 0

    def hold(self, msg: Payload, buffers: list[memoryview]) -> None:
        """Keep a relayed payload until the Welcome says where it goes (counted when over
        ``cap_bytes``)."""
        size = sum(b.nbytes for b in buffers)
        if self.held_bytes + size > self.cap_bytes:
            self.rejects.count("over-capacity", f"a relayed payload for step {msg.step}")
            return
        self.held.append((msg, buffers))
        self.held_bytes += size

    def welcome(self, msg: Welcome) -> list[Part] | None:
        """Take this Constructor's place in the tree; the payloads held until now to pass on,
        or None (counted) when the Welcome numbers it outside the tree."""
        if not 0 <= msg.index < len(msg.constructors):
            self.rejects.count("invalid", f"a Welcome numbering this constructor {msg.index}")
            return None
        self.index = msg.index
        self.tree = Tree(len(msg.constructors), self.fanout)
        children = list(self.tree.children(msg.index))
        log.info("constructor %d of %d; relays to %s", msg.index, self.tree.size, children)
        held, self.held, self.held_bytes = self.held, [], 0
        return held

    def route(self, msg: Payload, buffers: list[memoryview], out: Outbox) -> Part | None:
        """Pass each sample on towards the Constructor it is for (into ``out``); this one's
        samples are returned. A payload with a sample off this Constructor's path is counted
        and dropped whole."""
        me, tree = self.index, self.tree
        assert me is not None
        hops = {d: tree.next_hop(me, d) if d < tree.size else None for d in set(msg.to)}
        route = {d: hop for d, hop in hops.items() if hop is not None}
        if len(route) < len(hops):
            self.rejects.count("invalid", f"a payload for step {msg.step} relayed off its path")
            return None
        parts = split_payload(msg, buffers, route.__getitem__)
        own = parts.pop(me, None)
        for hop, (part, part_buffers) in parts.items():
            out.send(Child(hop), part, part_buffers)
            self.relayed += 1
            self.relayed_bytes += sum(memoryview(b).nbytes for b in part_buffers)
        return own
