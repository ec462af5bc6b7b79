"""Who is in the job: loaders and their shadows, Constructors and the ranks they serve, what
each Constructor reported, and when each peer was last heard from."""

from __future__ import annotations

from typing import NamedTuple

from msd.errors import ProtocolError
from msd.plan.topology import Topology
from msd.roles.planner.lowest import Lowest
from msd.wire.protocol import PROTOCOL_VERSION, Hello, Progress


class Peer(NamedTuple):
    identity: bytes
    hello: Hello


class Registry:
    """The job's peers. State: ``loaders`` (name → peer), ``standby`` (source → shadows),
    ``constructors`` (in registration order: their index is their number in ``Plan``s and
    ``Route``s), ``dp_constructors`` (DP rank → the Constructors serving it), ``consumed_by``
    / ``built_by`` / ``bytes_by`` (Constructor index → its latest report), ``last_seen``,
    ``lost`` (loaders taken for lost: their messages are ignored)."""

    def __init__(self, expected_loaders: set[str], topology: Topology, start_step: int) -> None:
        self.expected_loaders = expected_loaders
        self.topology = topology
        self.start_step = start_step
        self.seen_loaders: set[str] = set()
        self.loaders: dict[str, Peer] = {}
        self.standby: dict[int, list[Peer]] = {}
        self.constructors: list[Peer] = []
        self.constructor_index: dict[bytes, int] = {}
        self.ranks: set[int] = set()
        self.dp_constructors: dict[int, set[int]] = {}
        self.roles: dict[bytes, str] = {}
        self.last_seen: dict[bytes, float] = {}
        self.lost: set[bytes] = set()
        self.consumed_by = Lowest()
        self.built_by = Lowest()
        self.bytes_by: dict[int, int] = {}

    # -- registration -------------------------------------------------------------------------
    def register(self, identity: bytes, msg: Hello) -> None:
        """Add a peer that said hello; a version or rank conflict stops the job."""
        if msg.version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"{msg.role} {msg.name} speaks protocol {msg.version}, "
                f"the planner {PROTOCOL_VERSION}"
            )
        self.roles[identity] = msg.role
        if msg.role == "loader" and msg.standby >= 0:
            self.standby.setdefault(msg.standby, []).append(Peer(identity, msg))
        elif msg.role == "loader":
            self.loaders[msg.name] = Peer(identity, msg)
            self.seen_loaders.add(msg.name)
        elif msg.role == "constructor":
            self._add_constructor(identity, msg)

    def _add_constructor(self, identity: bytes, msg: Hello) -> None:
        taken = self.ranks & set(msg.ranks)
        if taken:
            raise ProtocolError(
                f"constructor {msg.name} offers ranks {sorted(taken)} that another "
                "constructor serves; start one constructor per node"
            )
        index = len(self.constructors)
        for rank in msg.ranks:
            self.dp_constructors.setdefault(self.topology.coords(rank).dp, set()).add(index)
        self.ranks.update(msg.ranks)
        self.consumed_by.rise(index, self.start_step)
        self.constructor_index[identity] = index
        self.constructors.append(Peer(identity, msg))

    def complete(self) -> bool:
        """Every loader the job expects and a Constructor for every rank have said hello."""
        everyone = set(range(self.topology.world_size))
        return self.expected_loaders <= self.seen_loaders and self.ranks == everyone

    def everyone(self) -> list[Peer]:
        """Loaders, shadows and Constructors: whom a Stop goes to."""
        shadows = [p for peers in self.standby.values() for p in peers]
        return [*self.loaders.values(), *shadows, *self.constructors]

    def serving(self, source: int) -> list[Peer]:
        """The loaders that read ``source``."""
        return [p for p in self.loaders.values() if source in p.hello.sources]

    def of_generation(self, source: int, number: int) -> list[Peer]:
        """The loaders reading ``source`` as generation ``number``."""
        return [
            p
            for p in self.serving(source)
            if p.hello.generations[p.hello.sources.index(source)] == number
        ]

    # -- liveness -----------------------------------------------------------------------------
    def heard(self, identity: bytes, now: float) -> None:
        self.last_seen[identity] = now

    def silent_loaders(self, limit: float) -> list[str]:
        """Loaders not heard from since ``limit``."""
        return [
            name
            for name, peer in self.loaders.items()
            if self.last_seen.get(peer.identity, limit + 1) < limit
        ]

    def forget_silent_shadows(self, limit: float) -> None:
        """Shadows not heard from since ``limit`` take no loader's place."""
        for source, peers in self.standby.items():
            self.standby[source] = [p for p in peers if self.last_seen.get(p.identity, 0) >= limit]

    def lose(self, name: str) -> Peer | None:
        """Take loader ``name`` for lost; its peer, or None if it was a shadow (or gone)."""
        peer = self.loaders.pop(name, None)
        if peer is None:
            for source, peers in self.standby.items():
                self.standby[source] = [p for p in peers if p.hello.name != name]
            return None
        self.lost.add(peer.identity)
        return peer

    def take_shadow(self, sources: tuple[int, ...]) -> Peer | None:
        """A shadow standing by for a loader of these sources (only single-source loaders
        have one), removed from the standby list."""
        shadows = self._shadows(sources)
        return shadows.pop(0) if shadows else None

    def has_shadow(self, sources: tuple[int, ...]) -> bool:
        return bool(self._shadows(sources))

    def _shadows(self, sources: tuple[int, ...]) -> list[Peer]:
        return self.standby.get(sources[0], []) if len(sources) == 1 else []

    # -- Constructor progress -----------------------------------------------------------------
    def on_progress(self, identity: bytes, msg: Progress) -> None:
        index = self.constructor_index[identity]
        self.consumed_by.rise(index, msg.consumed)
        self.bytes_by[index] = max(self.bytes_by.get(index, 0), msg.step_bytes)
        self.built_by.rise(index, max(msg.built, 0))  # ``rise`` keeps the highest

    @property
    def consumed(self) -> int:
        """Steps that every rank has consumed."""
        return 0 if self.consumed_by.low is None else self.consumed_by.low

    def built_everywhere(self) -> int | None:
        """Steps every Constructor has built, once each has said; None before."""
        if len(self.built_by) < len(self.constructors):
            return None
        return self.built_by.low
