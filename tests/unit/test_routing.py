"""``Routing.dispatch`` builds every Plan and Route of a step from the plan's columns (numpy,
``msd.plan.delivery``). On random plans it sends exactly what the per-piece builder it replaced
sent (kept below as the reference): the same messages, to the same peers, in the same order,
the same figures, and, once a loader is lost, the same entries sent again by its replacement."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest

from msd.checkpoint.resume import needed
from msd.plan import delivery
from msd.plan.step import Pieces, PlannerState, StepPlan
from msd.roles.planner.images import ImageBook
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.reported import BLOCK
from msd.roles.planner.routing import Routing, StepFigures, route_message
from msd.wire.protocol import DISCARD, Meta, Plan

LOADERS = [b"web/0", b"web/1", b"code/0", b"books/0"]
SEQ_LEN = 64


class Peer(NamedTuple):
    identity: bytes


# -- the reference: the per-sample intake and per-piece builder they replaced -----------------


class Reference:
    """The Routing state and methods as they were: dicts of samples, a dict of sets per loader."""

    def __init__(self, sources: int) -> None:
        self.known: dict[int, dict[int, tuple[int, int, bytes]]] = {i: {} for i in range(sources)}
        self.images = ImageBook(sources, lambda patches, _: float(np.sum(patches)), SEQ_LEN)
        self.out = Outbox()
        self.reroute: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}
        self.inflight: dict[int, dict[bytes, dict[tuple[int, int], set[int]]]] = {}

    def on_meta(self, identity: bytes, msg: Meta, state: PlannerState, start_step: int) -> None:
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

    def take_over(self, lost: bytes, sources: list[int]) -> None:
        for step, routes in self.inflight.items():
            for key, dests in routes.get(lost, {}).items():
                self.reroute[key] = (step, tuple(dests))
        for source in sources:
            known = self.known[source]
            for gpos in [g for g, entry in known.items() if entry[2] == lost]:
                del known[gpos]
                self.images.forget(source, gpos)

    def dispatch(
        self, plan: StepPlan, dp_constructors: dict[int, set[int]], constructors: list[Any]
    ) -> StepFigures:
        per_constructor: dict[int, list[tuple[int, ...]]] = {}
        routes: dict[bytes, dict[tuple[int, int], set[int]]] = {}
        figures = StepFigures(len(self.known))
        images = self.images if self.images.any() else None
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
        self.inflight[plan.step] = routes
        for loader, by_key in routes.items():
            for source, gpos in by_key:
                self.known[source].pop(gpos)
                self.images.forget(source, gpos)
            entries = [(*key, d) for key, ds in sorted(by_key.items()) for d in sorted(ds)]
            self.out.send(loader, route_message(plan.step, entries))
        for index, c in enumerate(constructors):
            entries = per_constructor.get(index, [])
            self.out.send(c.identity, reference_plan_message(plan.step, entries))
        return figures


def reference_plan_message(step: int, entries: list[tuple[int, ...]]) -> Plan:
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


# -- random steps ----------------------------------------------------------------------------


def _routing(sources: int) -> Routing:
    return Routing(sources, Outbox(), lambda patches, _: float(np.sum(patches)), SEQ_LEN)


def _metas(
    rng: np.random.Generator, sources: int, count: int, loaders: list[bytes]
) -> list[tuple[bytes, Meta]]:
    """Every source's positions up to ``count`` in blocks of random sizes from random
    loaders, some with images, in a random order."""
    metas = []
    for source in range(sources):
        start = 0
        while start < count:
            n = min(int(rng.integers(1, 80)), count - start)
            images = rng.integers(0, 3, n) * (rng.random() < 0.5)
            meta = Meta(
                source=source,
                gpos_start=start,
                lengths=tuple(rng.integers(0, 4 * SEQ_LEN, n).tolist()),
                sample_ids=tuple(rng.integers(0, 2**64, n, dtype=np.uint64).tolist()),
                images=tuple(images.tolist()) if images.any() else (),
                patches=tuple(rng.integers(1, 9, int(images.sum())).tolist()),
                skipped=tuple(rng.integers(0, 2, n).tolist()) if images.any() else (),
            )
            metas.append((loaders[int(rng.integers(len(loaders)))], meta))
            start += n
    return [metas[i] for i in rng.permutation(len(metas))]


def _state(rng: np.random.Generator, sources: int, count: int) -> PlannerState:
    """A restart's state: positions below the cursors were placed, but those carried."""
    cursors = tuple(int(c) for c in rng.integers(0, count // 4, sources))
    carry = tuple(
        (s, int(rng.integers(0, cursors[s])))
        for s in range(sources)
        if cursors[s] and rng.random() < 0.5
    )
    return PlannerState(0, cursors, carry)


def _same_held(new: Routing, old: Reference, sources: int, count: int) -> None:
    assert new.reported() == sum(len(k) for k in old.known.values())
    for source in range(sources):
        for gpos in [*range(count + 10), BLOCK, 5 * BLOCK + 3]:
            entry = old.known[source].get(gpos)
            assert new.lookup(source, gpos) == (None if entry is None else entry[0])
    keys = np.array([(s, g) for s in old.known for g in old.known[s]], dtype=np.int64)
    keys = keys.reshape(-1, 2)
    ids, owners = new.held.held(keys[:, 0], keys[:, 1])
    expected = [old.known[s][g] for s, g in keys.tolist()]
    assert ids.tolist() == [e[1] for e in expected]
    assert [new.held.loaders[o] for o in owners.tolist()] == [e[2] for e in expected]
    for few in (len(keys), 9):  # grouped by block, and one by one
        found = new.lookup.many(keys[:few, 0], keys[:few, 1])
        assert found.tolist() == [e[0] for e in expected[:few]]
    assert {s: set(b) for s, b in new.images.by_source.items()} == {
        s: set(b) for s, b in old.images.by_source.items()
    }


def _plan(
    rng: np.random.Generator, step: int, sources: int, count: int, state: PlannerState
) -> StepPlan:
    """A step of random held pieces over random ranks and rows: some samples split over
    several rows (anywhere), some dropped, some rows empty."""
    ranks, per_rank = int(rng.integers(1, 24)), int(rng.integers(1, 4))
    keys = [(s, g) for s in range(sources) for g in range(count) if needed(state, s, g)]
    chosen = rng.permutation(len(keys))[: int(rng.integers(1, min(len(keys), 200)))]
    drop = int(rng.integers(0, 4))
    dropped = tuple(keys[i] for i in chosen[:drop])
    rows: list[tuple[int, int, int, int, int, int]] = []  # global row, source, gpos, ...
    for i in chosen[drop:].tolist():
        source, gpos = keys[i]
        for k in range(int(rng.choice([1, 1, 1, 2, 3]))):
            length = int(rng.integers(0, SEQ_LEN))
            rows.append(
                (int(rng.integers(ranks * per_rank)), source, gpos, length, k * SEQ_LEN, length)
            )
    rows.sort(key=lambda r: r[0])  # stable: inside a row, as listed
    table = np.array(rows, dtype=np.int64).reshape(-1, 6)
    bounds = np.searchsorted(table[:, 0], np.arange(ranks * per_rank + 1))
    pieces = Pieces(tuple(np.ascontiguousarray(table[:, c]) for c in range(1, 6)), bounds)
    return StepPlan(step, pieces, per_rank, dropped=dropped)


def _serving(rng: np.random.Generator, ranks: int) -> tuple[dict[int, set[int]], int]:
    """Each DP rank's Constructors: mostly one, some several, numbers past 8 (so a set of them
    is not always in ascending order)."""
    count = int(rng.integers(1, 20))
    serving: dict[int, set[int]] = {}
    for dp in range(ranks):
        for c in rng.integers(0, count, int(rng.choice([1, 1, 2, 3]))).tolist():
            serving.setdefault(dp, set()).add(c)
    return serving, count


@pytest.mark.parametrize("seed", range(60))
def test_dispatch_sends_what_the_per_piece_builder_sent(seed):
    rng = np.random.default_rng(seed)
    sources, count = int(rng.integers(1, 5)), int(rng.integers(60, 200))
    new, old = _routing(sources), Reference(sources)
    state = _state(rng, sources, count)
    for loader, meta in _metas(rng, sources, count, LOADERS):
        new.on_meta(loader, meta, state, 2)
        old.on_meta(loader, meta, state, 2)
    assert new.out.take() == old.out.take()  # discards of what was placed before
    _same_held(new, old, sources, count)
    plan = _plan(rng, 3, sources, count, state)
    serving, constructors = _serving(rng, len(plan.rows))
    peers = [Peer(f"node-{c}".encode()) for c in range(constructors)]
    figures = new.dispatch(plan, serving, peers)  # type: ignore[arg-type]
    expected = old.dispatch(plan, serving, peers)
    assert new.out.take() == old.out.take()
    for name in ("samples", "tokens", "images", "skipped"):
        assert np.array_equal(getattr(figures, name), getattr(expected, name)), name
    _same_held(new, old, sources, count)
    lost = LOADERS[int(rng.integers(len(LOADERS)))]
    new.take_over(lost, list(range(sources)))
    old.take_over(lost, list(range(sources)))
    assert new.reroute == old.reroute  # what the replacement sends again, to whom, in order
    _same_held(new, old, sources, count)
    for _, meta in _metas(rng, sources, count, [b"shadow"]):  # the replacement reports
        new.on_meta(b"shadow", meta, state, 2)
        old.on_meta(b"shadow", meta, state, 2)
    assert new.out.take() == old.out.take()
    assert new.reroute == old.reroute == {}
    _same_held(new, old, sources, count)


def test_the_pure_module_discards_with_the_protocols_destination():
    assert delivery.DISCARD == DISCARD
