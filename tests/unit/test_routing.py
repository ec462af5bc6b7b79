"""``Routing.dispatch`` builds every Plan and Route of a step from the plan's columns (numpy,
``msd.plan.delivery``). On random plans it sends exactly what the per-piece builder it replaced
sent (kept below as the reference): the same messages, to the same peers, in the same order,
the same figures, and, once a loader is lost, the same entries sent again by its replacement."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest

from msd.plan import delivery
from msd.plan.step import Pieces, PlannerState, StepPlan
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.routing import Routing, StepFigures, route_message
from msd.wire.protocol import DISCARD, Meta, Plan

LOADERS = [b"web/0", b"web/1", b"code/0", b"books/0"]
SEQ_LEN = 64


class Peer(NamedTuple):
    identity: bytes


# -- the reference: the per-piece builder ``dispatch`` replaced ------------------------------


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


def reference_dispatch(
    routing: Routing, plan: StepPlan, dp_constructors: dict[int, set[int]], constructors: list[Any]
) -> tuple[StepFigures, dict[bytes, dict[tuple[int, int], set[int]]]]:
    per_constructor: dict[int, list[tuple[int, ...]]] = {}
    routes: dict[bytes, dict[tuple[int, int], set[int]]] = {}
    figures = StepFigures(len(routing.known))
    images = routing.images if routing.images.any() else None
    for dp, rank_rows in enumerate(plan.rows):
        dests = dp_constructors[dp]
        for row, slots in enumerate(rank_rows):
            for slot in slots:
                _, sample_id, loader = routing.known[slot.source][slot.gpos]
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
        loader = routing.known[source][gpos][2]
        routes.setdefault(loader, {})[(source, gpos)] = {DISCARD}
    for loader, by_key in routes.items():
        for source, gpos in by_key:
            routing.known[source].pop(gpos)
            routing.images.forget(source, gpos)
        entries = [(*key, d) for key, ds in sorted(by_key.items()) for d in sorted(ds)]
        routing.out.send(loader, route_message(plan.step, entries))
    for index, c in enumerate(constructors):
        routing.out.send(
            c.identity, reference_plan_message(plan.step, per_constructor.get(index, []))
        )
    return figures, routes


# -- random steps ----------------------------------------------------------------------------


def _routing(sources: int) -> Routing:
    return Routing(sources, Outbox(), lambda patches: float(np.sum(patches)), SEQ_LEN)


def _report(routing: Routing, rng: np.random.Generator, sources: int, count: int) -> None:
    """Every source's first ``count`` positions, in blocks from random loaders, some with
    images."""
    state = PlannerState.initial(sources)
    for source in range(sources):
        for start in range(0, count, 50):
            n = min(50, count - start)
            images = rng.integers(0, 3, n) * (rng.random() < 0.5)
            meta = Meta(
                source=source,
                gpos_start=start,
                lengths=tuple(rng.integers(1, 4 * SEQ_LEN, n).tolist()),
                sample_ids=tuple(rng.integers(0, 10**6, n).tolist()),
                images=tuple(images.tolist()) if images.any() else (),
                patches=tuple(rng.integers(1, 9, int(images.sum())).tolist()),
                skipped=tuple(rng.integers(0, 2, n).tolist()) if images.any() else (),
            )
            routing.on_meta(LOADERS[int(rng.integers(len(LOADERS)))], meta, state, 0)


def _plan(rng: np.random.Generator, step: int, sources: int, count: int) -> StepPlan:
    """A step of random pieces over random ranks and rows: some samples split over several
    rows (anywhere), some dropped, some rows empty."""
    ranks, per_rank = int(rng.integers(1, 24)), int(rng.integers(1, 4))
    keys = [(s, g) for s in range(sources) for g in range(count)]
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
    new, old = _routing(sources), _routing(sources)
    for routing in (new, old):
        _report(routing, np.random.default_rng(seed), sources, count)
    plan = _plan(rng, 3, sources, count)
    serving, constructors = _serving(rng, len(plan.rows))
    peers = [Peer(f"node-{c}".encode()) for c in range(constructors)]
    figures = new.dispatch(plan, serving, peers)  # type: ignore[arg-type]
    expected, routes = reference_dispatch(old, plan, serving, peers)
    assert new.out.take() == old.out.take()
    for name in ("samples", "tokens", "images", "skipped"):
        assert np.array_equal(getattr(figures, name), getattr(expected, name)), name
    assert new.known == old.known
    assert {s: set(b) for s, b in new.images.by_source.items()} == {
        s: set(b) for s, b in old.images.by_source.items()
    }
    for lost in LOADERS:  # what a replacement sends again, and to which Constructors in order
        new.take_over(lost, ())
        again = {key: (3, tuple(dests)) for key, dests in routes.get(lost, {}).items()}
        assert new.reroute == again
        new.reroute.clear()


def test_the_pure_module_discards_with_the_protocols_destination():
    assert delivery.DISCARD == DISCARD
