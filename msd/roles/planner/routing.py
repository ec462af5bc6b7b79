"""Where each sample is and where it goes: the lengths loaders reported (and which loader holds
each sample), the positions asked for, and what each loader was told to send to the steps not
built yet, so that a lost loader's replacement can send it again."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from msd.checkpoint.resume import needed
from msd.plan.delivery import (
    Fanout,
    Placed,
    RouteTable,
    by_constructor,
    placed,
    route_table,
    shared,
)
from msd.plan.step import NeedData, PlannerState, StepPlan
from msd.roles.planner.images import ImageBook
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.registry import Peer
from msd.wire.protocol import DISCARD, Meta, Plan, Route, Want

Key = tuple[int, int]  # (source, gpos)
# A step's loaders (in order), their Route entries, and the destinations of the samples sent to
# several Constructors in the order a set of them iterates (what a lost loader's replacement is
# told to send again follows it).
Sent = tuple[list[bytes], RouteTable, dict[Key, tuple[int, ...]]]


def route_message(step: int, entries: list[tuple[int, int, int]]) -> Route:
    """A Route of ``(source, gpos, constructor)`` entries."""
    return Route(
        step=step,
        source=tuple(e[0] for e in entries),
        gpos=tuple(e[1] for e in entries),
        constructor=tuple(e[2] for e in entries),
    )


def _numbered(identities: list[bytes]) -> tuple[list[bytes], np.ndarray]:
    """The distinct identities in order of first appearance, and the number of each entry."""
    numbers: dict[bytes, int] = {}
    each = [numbers.setdefault(i, len(numbers)) for i in identities]
    return list(numbers), np.array(each, dtype=np.int64)


def _spread(
    pieces: Placed, candidates: np.ndarray, dp_constructors: dict[int, set[int]]
) -> dict[Key, tuple[int, ...]]:
    """The samples of these pieces sent to several Constructors → those Constructors, as a set
    of them updated piece by piece iterates."""
    dests: dict[Key, set[int]] = {}
    columns = (pieces.source[candidates], pieces.gpos[candidates], pieces.dp[candidates])
    for source, gpos, dp in zip(*(c.tolist() for c in columns), strict=True):
        dests.setdefault((source, gpos), set()).update(dp_constructors[dp])
    return {key: tuple(ds) for key, ds in dests.items() if len(ds) > 1}


class StepFigures:
    """What a planned step delivers per source: samples started and tokens."""

    def __init__(self, sources: int) -> None:
        self.samples = np.zeros(sources, dtype=np.int64)
        self.tokens = np.zeros(sources, dtype=np.int64)
        self.images = np.zeros(sources, dtype=np.int64)  # delivered
        self.skipped = np.zeros(sources, dtype=np.int64)  # images left out of delivered samples


class Routing:
    """State: ``known`` (source → gpos → (length, sample id, loader) reported and not routed
    yet), ``inflight`` (step not built everywhere → its Routes), ``reroute`` (a lost loader's
    samples → the step and Constructors they are for), ``wanted`` (source → the furthest
    position asked for), ``blocked`` (the sample planning waits for)."""

    def __init__(
        self,
        sources: int,
        out: Outbox,
        encoder: Callable[[np.ndarray], float],
        seq_len: int,
    ) -> None:
        """``encoder``: the vision encoder's cost of a sample's images (their patch counts)."""
        self.out = out
        self.known: dict[int, dict[int, tuple[int, int, bytes]]] = {i: {} for i in range(sources)}
        self.images = ImageBook(sources, encoder, seq_len)  # of the samples in ``known``
        self.inflight: dict[int, Sent] = {}
        self.reroute: dict[Key, tuple[int, tuple[int, ...]]] = {}
        self.wanted: dict[int, int] = {}
        self.blocked: Key | None = None

    def lookup(self, source: int, gpos: int) -> int | None:
        """A sample's length, if a loader reported it."""
        entry = self.known[source].get(gpos)
        return None if entry is None else entry[0]

    def encoder_costs(
        self, sources: np.ndarray, gpos: np.ndarray, lengths: np.ndarray
    ) -> np.ndarray:
        """The encoder's cost of each piece ``lengths`` long of a (source, gpos) sample: the
        sample's, shared out over its pieces by length; 0 for samples without images."""
        known = self.known
        full = np.array(
            [known[s][g][0] for s, g in zip(sources.tolist(), gpos.tolist(), strict=True)]
        )
        return self.images.encoder_costs(sources, gpos, lengths, full)

    def still_blocked(self) -> bool:
        """Planning stopped at a sample that is still not reported: it would stop again."""
        if self.blocked is None:
            return False
        source, gpos = self.blocked
        if gpos not in self.known[source]:
            return True
        self.blocked = None
        return False

    def on_meta(self, identity: bytes, msg: Meta, state: PlannerState, start_step: int) -> None:
        """Keep what planning needs; route a lost loader's samples to where they were going;
        tell the loader to discard what was placed already (before a restart, or by a lost
        loader)."""
        known = self.known[msg.source]
        kept: list[int] = []
        unneeded = []
        rerouted: dict[int, list[tuple[int, int, int]]] = {}
        for offset, (length, sample_id) in enumerate(zip(msg.lengths, msg.sample_ids, strict=True)):
            gpos = msg.gpos_start + offset
            if (msg.source, gpos) in self.reroute:
                step, dests = self.reroute.pop((msg.source, gpos))
                rerouted.setdefault(step, []).extend((msg.source, gpos, d) for d in dests)
            elif not needed(state, msg.source, gpos):
                unneeded.append(gpos)
            else:
                known[gpos] = (length, sample_id, identity)
                kept.append(offset)
        self.images.add(msg, kept)
        for step, entries in rerouted.items():
            self.out.send(identity, route_message(step, entries))
        if unneeded:
            discard = [(msg.source, g, DISCARD) for g in unneeded]
            self.out.send(identity, route_message(start_step, discard))

    def want(self, need: NeedData, serving: Callable[[int], list[Peer]]) -> None:
        """Tell the loaders of every source planning waits for (or soon will) which position
        it needs, once per position: all at once, not one round trip each."""
        furthest: dict[int, int] = {}
        for source, gpos in ((need.source, need.gpos), *need.soon):
            furthest[source] = max(gpos, furthest.get(source, -1))
        for source, gpos in furthest.items():
            if self.wanted.get(source, -1) >= gpos:
                continue
            self.wanted[source] = gpos
            for peer in serving(source):
                self.out.send(peer.identity, Want(source=source, gpos=gpos))

    def dispatch(
        self, plan: StepPlan, dp_constructors: dict[int, set[int]], constructors: list[Peer]
    ) -> StepFigures:
        """Each Constructor its DP ranks' rows; each loader where to send what it holds."""
        pieces = placed(plan.pieces, plan.rows_per_rank)
        figures = self._figures(pieces)  # before the images of the samples are forgotten
        known = self.known
        keys = zip(pieces.source.tolist(), pieces.gpos.tolist(), strict=True)
        held = [known[s][g] for s, g in keys]  # (length, sample id, loader) of each piece
        fanout = Fanout.of(dp_constructors, (len(plan.pieces.bounds) - 1) // plan.rows_per_rank)
        loaders, table = self._route_table(plan.dropped, pieces, held, fanout)
        spread = _spread(
            pieces, shared(pieces.source, pieces.gpos, pieces.dp, fanout), dp_constructors
        )
        self.inflight[plan.step] = (loaders, table, spread)  # a lost loader's are sent again
        self._send_routes(plan.step, loaders, table)
        grouped = by_constructor(pieces.dp, fanout, len(constructors))
        self._send_plans(plan.step, pieces, [e[1] for e in held], grouped, constructors)
        return figures

    def _route_table(
        self,
        dropped: tuple[tuple[int, int], ...],
        pieces: Placed,
        held: list[tuple[int, int, bytes]],
        fanout: Fanout,
    ) -> tuple[list[bytes], RouteTable]:
        """The loaders, in order of the first piece (then sample dropped) each holds, and the
        Route entries of each."""
        owners = [e[2] for e in held] + [self.known[s][g][2] for s, g in dropped]
        loaders, number = _numbered(owners)
        at, gone = len(held), np.array(dropped, dtype=np.int64).reshape(-1, 2)
        columns = (number[:at], pieces.source, pieces.gpos, pieces.dp, fanout)
        table = route_table(*columns, (number[at:], gone[:, 0], gone[:, 1]), len(loaders))
        return loaders, table

    def _figures(self, pieces: Placed) -> StepFigures:
        figures = StepFigures(len(self.known))
        starts = pieces.offset == 0
        np.add.at(figures.samples, pieces.source[starts], 1)
        np.add.at(figures.tokens, pieces.source, pieces.length)
        if self.images.any():  # text jobs look nothing up
            first = zip(pieces.source[starts].tolist(), pieces.gpos[starts].tolist(), strict=True)
            for source, gpos in first:
                counted = self.images.get(source, gpos)
                if counted is not None:
                    figures.images[source] += counted.kept
                    figures.skipped[source] += counted.skipped
        return figures

    def _send_routes(self, step: int, loaders: list[bytes], table: RouteTable) -> None:
        """One Route per loader process; what it is told to send is no longer known here."""
        for i, loader in enumerate(loaders):
            source, gpos, dest = (c.tolist() for c in table.entries(i))
            self.out.send(
                loader,
                Route(step=step, source=tuple(source), gpos=tuple(gpos), constructor=tuple(dest)),
            )
        forget = self.images.forget if self.images.any() else None
        known = self.known
        for source, gpos in zip(*(c.tolist() for c in table.samples()), strict=True):
            known[source].pop(gpos)
            if forget is not None:
                forget(source, gpos)

    def _send_plans(
        self,
        step: int,
        pieces: Placed,
        sample_ids: list[int],
        grouped: tuple[np.ndarray, np.ndarray],
        constructors: list[Peer],
    ) -> None:
        """Each Constructor a Plan of its ranks' pieces (none: an empty one)."""
        index, bounds = grouped
        ids = [sample_ids[i] for i in index.tolist()]
        gathered = (c[index].tolist() for c in (pieces.dp, pieces.row, pieces.source, pieces.gpos))
        tail = (c[index].tolist() for c in (pieces.length, pieces.offset, pieces.padded))
        columns = [*gathered, ids, *tail]
        b = bounds.tolist()
        for c, peer in enumerate(constructors):
            own = (tuple(column[b[c] : b[c + 1]]) for column in columns)
            self.out.send(peer.identity, Plan(step, *own))

    def on_built(self, step: int) -> None:
        """Every Constructor built the steps before ``step``: their Routes are not needed."""
        for done in [s for s in self.inflight if s < step]:
            del self.inflight[done]

    def take_over(self, lost: bytes, sources: Iterable[int]) -> None:
        """A lost loader's samples: what it was told to send goes to those steps again (by its
        replacement), what it reported and held is gone with it."""
        for step, (loaders, table, spread) in self.inflight.items():
            if lost in loaders:
                for key, dests in table.by_sample(loaders.index(lost)).items():
                    kept = dests if dests == (DISCARD,) else spread.get(key, dests)
                    self.reroute[key] = (step, kept)
        for source in sources:
            known = self.known[source]
            for gpos in [g for g, entry in known.items() if entry[2] == lost]:
                del known[gpos]
                self.images.forget(source, gpos)
        self.blocked = None

    def first_needed(self, state: PlannerState, sources: Iterable[int]) -> tuple[int, ...]:
        """Per source, the first position a replacement loader must read from."""
        return tuple(
            min(
                [
                    state.cursors[s],
                    *(g for src, g in state.carry if src == s),
                    *(g for src, g in self.reroute if src == s),
                ]
            )
            for s in sources
        )

    def reported(self) -> int:
        """Samples reported and not routed yet."""
        return sum(len(k) for k in self.known.values())
