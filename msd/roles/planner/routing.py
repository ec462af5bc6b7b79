"""Where each sample is and where it goes: the lengths loaders reported (and which loader holds
each sample), the positions asked for, and what each loader was told to send to the steps not
built yet, so that a lost loader's replacement can send it again."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

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
from msd.roles.planner.images import EncoderCost, ImageBook
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.registry import Peer
from msd.roles.planner.reported import Reported
from msd.wire.protocol import DISCARD, Meta, Plan, Route, Want, trained_spans

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


def _renumbered(numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct numbers in order of first appearance, and each entry renumbered 0, 1, ...
    in that order."""
    distinct, first = np.unique(numbers, return_index=True)
    order = distinct[np.argsort(first)]
    local = np.zeros(int(distinct.max(initial=0)) + 1, dtype=np.int64)
    local[order] = np.arange(len(order))
    return order, local[numbers]


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
        self.trained = np.zeros(sources, dtype=np.int64)  # tokens trained on, of conversations


class Routing:
    """State: ``held`` (the length, sample id and loader of each sample reported and not
    routed yet; ``lookup`` reads it), ``inflight`` (step not built everywhere → its Routes),
    ``reroute`` (a lost loader's samples → the step and Constructors they are for),
    ``wanted`` (source → the furthest position asked for), ``blocked`` (the sample planning
    waits for)."""

    def __init__(
        self,
        sources: int,
        out: Outbox,
        encoder: EncoderCost,
        seq_len: int,
    ) -> None:
        """``encoder``: the vision encoder's cost of a sample's images and videos."""
        self.out = out
        self.sources = sources
        self.held = Reported()
        self.lookup = self.held  # plan_step's: one length, or many at once
        self.images = ImageBook(sources, encoder, seq_len)  # of the samples in ``held``
        # of the conversations in ``held``: the [start, end) spans of their tokens trained on
        self.trained: dict[tuple[int, int], np.ndarray] = {}
        self.inflight: dict[int, Sent] = {}
        self.reroute: dict[Key, tuple[int, tuple[int, ...]]] = {}
        self.wanted: dict[int, int] = {}
        self.blocked: Key | None = None

    def encoder_costs(
        self, sources: np.ndarray, gpos: np.ndarray, lengths: np.ndarray
    ) -> np.ndarray:
        """The encoder's cost of each piece ``lengths`` long of a (source, gpos) sample: the
        sample's, shared out over its pieces by length; 0 for samples without images."""
        full = self.held.many(sources, gpos)
        return self.images.encoder_costs(sources, gpos, lengths, full)

    def still_blocked(self) -> bool:
        """Planning stopped at a sample that is still not reported: it would stop again."""
        if self.blocked is None:
            return False
        source, gpos = self.blocked
        if self.held(source, gpos) is None:
            return True
        self.blocked = None
        return False

    def on_meta(self, identity: bytes, msg: Meta, state: PlannerState, start_step: int) -> None:
        """Keep what planning needs; route a lost loader's samples to where they were going;
        tell the loader to discard what was placed already (before a restart, or by a lost
        loader)."""
        source, start, count = msg.source, msg.gpos_start, len(msg.lengths)
        gpos = np.arange(start, start + count, dtype=np.int64)
        rerouted = self._rerouted(source, start, count)
        needed = gpos >= state.cursors[source]  # as msd.checkpoint.resume.needed
        needed[
            [g - start for s, g in state.carry if s == source and start <= g < start + count]
        ] = True
        keep, unneeded = needed.copy(), ~needed
        keep[[g - start for g in rerouted]] = unneeded[[g - start for g in rerouted]] = False
        lengths = np.array(msg.lengths, dtype=np.int64)[keep]
        ids = np.array(msg.sample_ids, dtype=np.uint64)[keep]
        self.held.add(source, gpos[keep], lengths, ids, identity)
        if msg.images or msg.skipped:
            self.images.add(msg, np.flatnonzero(keep).tolist())
        spans = trained_spans(msg)
        if spans is not None:
            for i in np.flatnonzero(keep).tolist():
                self.trained[(source, start + i)] = spans[i]
        self._send_rerouted(identity, source, rerouted)
        if unneeded.any():
            discard = [(source, g, DISCARD) for g in gpos[unneeded].tolist()]
            self.out.send(identity, route_message(start_step, discard))

    def _send_rerouted(self, identity: bytes, source: int, rerouted: list[int]) -> None:
        """A lost loader's samples, now reported by ``identity``: to the steps they were for."""
        by_step: dict[int, list[tuple[int, int, int]]] = {}
        for g in rerouted:
            step, dests = self.reroute.pop((source, g))
            by_step.setdefault(step, []).extend((source, g, d) for d in dests)
        for step, entries in by_step.items():
            self.out.send(identity, route_message(step, entries))

    def _rerouted(self, source: int, start: int, count: int) -> list[int]:
        """The positions among these that a lost loader was told to send, ascending."""
        if not self.reroute:
            return []
        return sorted(g for s, g in self.reroute if s == source and start <= g < start + count)

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
        sample_ids, owners = self.held.held(pieces.source, pieces.gpos)
        fanout = Fanout.of(dp_constructors, (len(plan.pieces.bounds) - 1) // plan.rows_per_rank)
        loaders, table = self._route_table(plan.dropped, pieces, owners, fanout)
        shared_pieces = shared(pieces.source, pieces.gpos, pieces.dp, fanout)
        spread = _spread(pieces, shared_pieces, dp_constructors)
        self.inflight[plan.step] = (loaders, table, spread)  # a lost loader's are sent again
        self._send_routes(plan.step, loaders, table)
        grouped = by_constructor(pieces.dp, fanout, len(constructors))
        self._send_plans(plan.step, pieces, sample_ids, grouped, constructors)
        return figures

    def _route_table(
        self,
        dropped: tuple[tuple[int, int], ...],
        pieces: Placed,
        owners: np.ndarray,
        fanout: Fanout,
    ) -> tuple[list[bytes], RouteTable]:
        """The loaders, in order of the first piece (then sample dropped) each holds, and the
        Route entries of each."""
        gone = np.array(dropped, dtype=np.int64).reshape(-1, 2)
        _, dropped_owners = self.held.held(gone[:, 0], gone[:, 1])
        order, number = _renumbered(np.concatenate((owners, dropped_owners)))
        at, loaders = len(owners), [self.held.loaders[n] for n in order.tolist()]
        columns = (number[:at], pieces.source, pieces.gpos, pieces.dp, fanout)
        table = route_table(*columns, (number[at:], gone[:, 0], gone[:, 1]), len(loaders))
        return loaders, table

    def _figures(self, pieces: Placed) -> StepFigures:
        figures = StepFigures(self.sources)
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
        if self.trained:  # jobs without conversations look nothing up
            columns = (pieces.source, pieces.gpos, pieces.offset, pieces.length)
            for source, gpos, offset, length in zip(*(c.tolist() for c in columns), strict=True):
                spans = self.trained.get((source, gpos))
                if spans is not None:
                    figures.trained[source] += _within(spans, offset, offset + length)
        return figures

    def _send_routes(self, step: int, loaders: list[bytes], table: RouteTable) -> None:
        """One Route per loader process; what it is told to send is no longer known here."""
        for i, loader in enumerate(loaders):
            source, gpos, dest = (c.tolist() for c in table.entries(i))
            self.out.send(
                loader,
                Route(step=step, source=tuple(source), gpos=tuple(gpos), constructor=tuple(dest)),
            )
        routed = table.samples()
        self.held.remove(*routed)
        if self.images.any() or self.trained:
            for source, gpos in zip(*(c.tolist() for c in routed), strict=True):
                self.images.forget(source, gpos)
                self.trained.pop((source, gpos), None)

    def _send_plans(
        self,
        step: int,
        pieces: Placed,
        sample_ids: np.ndarray,
        grouped: tuple[np.ndarray, np.ndarray],
        constructors: list[Peer],
    ) -> None:
        """Each Constructor a Plan of its ranks' pieces (none: an empty one)."""
        index, bounds = grouped
        ids = sample_ids[index].tolist()
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
            for gpos in self.held.remove_loader(source, lost):
                self.images.forget(source, gpos)
                self.trained.pop((source, gpos), None)
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
        return self.held.count


def _within(spans: np.ndarray, start: int, stop: int) -> int:
    """Tokens of ``spans`` ([k, 2] ``[start, end)``) that lie in ``start .. stop``."""
    if not len(spans):
        return 0
    lows, highs = np.maximum(spans[:, 0], start), np.minimum(spans[:, 1], stop)
    return int(np.clip(highs - lows, 0, None).sum())
