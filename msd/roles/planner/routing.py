"""Where each sample is and where it goes: the lengths loaders reported (and which loader holds
each sample), the positions asked for, and what each loader was told to send to the steps not
built yet, so that a lost loader's replacement can send it again."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from msd.checkpoint.resume import needed
from msd.plan.step import NeedData, PlannerState, StepPlan
from msd.roles.planner.images import ImageBook
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.registry import Peer
from msd.wire.protocol import DISCARD, Meta, Plan, Route, Want

Key = tuple[int, int]  # (source, gpos)
Routes = dict[bytes, dict[Key, set[int]]]  # loader → what it sends → to which Constructors
# One piece of a row as a Plan carries it: dp, row, source, gpos, sample id, length, offset,
# padded length.
PlanEntry = tuple[int, int, int, int, int, int, int, int]


def route_message(step: int, entries: list[tuple[int, int, int]]) -> Route:
    """A Route of ``(source, gpos, constructor)`` entries."""
    return Route(
        step=step,
        source=tuple(e[0] for e in entries),
        gpos=tuple(e[1] for e in entries),
        constructor=tuple(e[2] for e in entries),
    )


def plan_message(step: int, entries: list[PlanEntry]) -> Plan:
    """A Plan of one Constructor's pieces, in packing order."""
    columns = list(zip(*entries, strict=True)) if entries else [()] * 8
    dp, row, source, gpos, sample_id, length, offset, padded = (tuple(c) for c in columns)
    return Plan(
        step=step,
        dp=dp,
        row=row,
        source=source,
        gpos=gpos,
        sample_id=sample_id,
        length=length,
        offset=offset,
        padded=padded,
    )


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
        self.inflight: dict[int, Routes] = {}
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
        per_constructor: dict[int, list[PlanEntry]] = {}
        routes: Routes = {}
        figures = StepFigures(len(self.known))
        images = self.images if self.images.any() else None  # text jobs look nothing up
        for dp, rank_rows in enumerate(plan.rows):
            dests = dp_constructors[dp]
            for row, slots in enumerate(rank_rows):
                for slot in slots:
                    _, sample_id, loader = self.known[slot.source][slot.gpos]
                    entry = (
                        dp,
                        row,
                        slot.source,
                        slot.gpos,
                        sample_id,
                        slot.length,
                        slot.offset,
                        slot.padded,
                    )
                    for dest in dests:
                        per_constructor.setdefault(dest, []).append(entry)
                    key = (slot.source, slot.gpos)
                    routes.setdefault(loader, {}).setdefault(key, set()).update(dests)
                    figures.samples[slot.source] += slot.offset == 0
                    figures.tokens[slot.source] += slot.length
                    counted = None if images is None else images.get(slot.source, slot.gpos)
                    if counted is not None and slot.offset == 0:
                        figures.images[slot.source] += counted.kept
                        figures.skipped[slot.source] += counted.skipped
        for source, gpos in plan.dropped:
            loader = self.known[source][gpos][2]
            routes.setdefault(loader, {})[(source, gpos)] = {DISCARD}
        self.inflight[plan.step] = routes  # kept as is: a lost loader's are sent again
        self._send_routes(plan.step, routes)
        for index, c in enumerate(constructors):
            self.out.send(c.identity, plan_message(plan.step, per_constructor.get(index, [])))
        return figures

    def _send_routes(self, step: int, routes: Routes) -> None:
        for loader, by_key in routes.items():  # one Route per loader process
            for source, gpos in by_key:
                self.known[source].pop(gpos)
                self.images.forget(source, gpos)
            entries = [(*key, d) for key, ds in sorted(by_key.items()) for d in sorted(ds)]
            self.out.send(loader, route_message(step, entries))

    def on_built(self, step: int) -> None:
        """Every Constructor built the steps before ``step``: their Routes are not needed."""
        for done in [s for s in self.inflight if s < step]:
            del self.inflight[done]

    def take_over(self, lost: bytes, sources: Iterable[int]) -> None:
        """A lost loader's samples: what it was told to send goes to those steps again (by its
        replacement), what it reported and held is gone with it."""
        for step, routes in self.inflight.items():
            for key, dests in routes.get(lost, {}).items():
                self.reroute[key] = (step, tuple(dests))
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
