"""The Planner's decision core without sockets: messages in, the messages it decides to send out.

Each test builds a ``PlannerCore`` from a recipe (sources' row counts given, no files read),
registers loaders and a Constructor by their ``Hello``s, reports sample lengths, and checks what
the core sends: the plans and routes of a step, a lost loader's work re-sent by its shadow, a
rescale's cut, a rewind, a mix change, a checkpoint at the consumed step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from msd.jobdir import JobDir
from msd.plan.partition import LoaderProcess, loader_processes
from msd.recipe.schema import Recipe
from msd.roles.planner.core import PlannerCore
from msd.wire.keys import create_keys
from msd.wire.protocol import (
    DISCARD,
    PROTOCOL_VERSION,
    Adopt,
    CheckpointTaken,
    Cut,
    CutAt,
    GenerationStart,
    Hello,
    LoaderLost,
    Message,
    Meta,
    MixSet,
    Plan,
    Progress,
    Refused,
    Rescale,
    Rescaling,
    Rewind,
    Rewinding,
    Route,
    SetMix,
    TakeCheckpoint,
    Welcome,
)

NUM_ROWS = (2000, 2000)
CONSTRUCTOR = b"constructor/local"
T = TypeVar("T")
Sent = list[tuple[bytes, Message]]


def make_recipe(**overrides: Any) -> Recipe:
    spec: dict[str, Any] = {
        "name": "core",
        "seed": 5,
        "seq_len": 64,
        "global_batch_tokens": 512,
        "steps": 200,
        "distribute": {"dp": 2},
        "sources": [
            {"name": "web", "path": "x", "text_column": "t", "weight": 1, "shadows": 1},
            {"name": "code", "path": "x", "text_column": "t", "weight": 1},
        ],
        "constructor": {"prefetch_steps": 4},
        "checkpoint": {"every_steps": 2},
    }
    spec.update(overrides)
    return msgspec.convert(spec, Recipe)


def length_of(source: int, gpos: int) -> int:
    return 3 + (gpos * 7 + source * 11) % 40


class Harness:
    """A core in a job folder of its own, and the peers that talk to it."""

    def __init__(self, tmp_path: Path, recipe: Recipe) -> None:
        self.recipe = recipe
        self.job = JobDir(tmp_path / "job")
        self.job.create()
        create_keys(self.job.key_file)
        self.now = 0.0
        self.core = PlannerCore(self.job, recipe, NUM_ROWS, clock=lambda: self.now)

    def send(self, identity: bytes, msg: Message) -> Sent:
        self.core.handle(identity, msg)
        return self.core.out.take()

    def hello(self, process: LoaderProcess) -> Sent:
        standby = -1 if process.standby is None else process.standby
        gens = tuple(
            next(sh.generation for sh in process.shards if sh.source == s)
            for s in (process.sources if standby < 0 else ())
        )
        msg = Hello(
            role="loader",
            name=process.name,
            version=PROTOCOL_VERSION,
            pid=1,
            sources=process.sources,
            generations=gens,
            standby=standby,
        )
        return self.send(process.name.encode(), msg)

    def register(self) -> Sent:
        """Every loader of the recipe (shadows too), then the Constructor of both ranks."""
        for process in loader_processes(self.recipe):
            assert self.hello(process) == []  # nothing is sent before everyone is in
        ranks = tuple(range(self.core.registry.topology.world_size))
        msg = Hello(
            role="constructor",
            name="local",
            version=PROTOCOL_VERSION,
            pid=1,
            ranks=ranks,
            endpoints={"payload": "tcp://127.0.0.1:1"},
        )
        return self.send(CONSTRUCTOR, msg)

    def report(self, identity: bytes, source: int, first: int, count: int) -> Sent:
        gpos = range(first, first + count)
        meta = Meta(
            source=source,
            gpos_start=first,
            lengths=tuple(length_of(source, g) for g in gpos),
            sample_ids=tuple(gpos),
        )
        return self.send(identity, meta)

    def advance(self) -> Sent:
        self.core.advance()
        return self.core.out.take()

    def progress(self, consumed: int, built: int) -> Sent:
        return self.send(CONSTRUCTOR, Progress(consumed=consumed, built=built))


def of_type(sent: Sent, kind: type[T]) -> list[tuple[bytes, T]]:
    return [(to, msg) for to, msg in sent if isinstance(msg, kind)]


def only(sent: Sent, kind: type[T]) -> T:
    found = of_type(sent, kind)
    assert len(found) == 1, sent
    return found[0][1]


def routed(sent: Sent, loader: bytes) -> dict[int, set[tuple[int, int, int]]]:
    """Per step, the (source, gpos, constructor) a loader was told to send."""
    steps: dict[int, set[tuple[int, int, int]]] = {}
    for to, route in of_type(sent, Route):
        if to == loader:
            entries = zip(route.source, route.gpos, route.constructor, strict=True)
            steps.setdefault(route.step, set()).update(entries)
    return steps


@pytest.fixture
def planned(tmp_path: Path) -> tuple[Harness, Sent]:
    """A core with every peer registered, 400 lengths per source reported, and the first
    ``prefetch_steps`` steps planned."""
    h = Harness(tmp_path, make_recipe())
    welcomes = h.register()
    assert {to for to, _ in of_type(welcomes, Welcome)} == {b"web/0", b"code/0"}
    assert h.core.phase.running
    assert h.report(b"web/0", 0, 0, 400) == []
    assert h.report(b"code/0", 1, 0, 400) == []
    return h, h.advance()


def test_each_planned_piece_is_routed_from_the_loader_that_holds_it(planned):
    _, sent = planned
    plans = [msg for to, msg in of_type(sent, Plan) if to == CONSTRUCTOR]
    assert [p.step for p in plans] == [0, 1, 2, 3]  # prefetch_steps ahead of consumed 0
    holder = {0: b"web/0", 1: b"code/0"}
    for plan in plans:
        assert len(plan.dp) == len(plan.gpos) == len(plan.padded) > 0
        assert set(plan.dp) == {0, 1}  # both DP ranks get rows
        for source, gpos, length, offset in zip(
            plan.source, plan.gpos, plan.length, plan.offset, strict=True
        ):
            assert (source, gpos, 0) in routed(sent, holder[source])[plan.step]
            assert offset + length <= length_of(source, gpos)
    starts = [t for p in plans for t in zip(p.source, p.gpos, p.offset, strict=True)]
    starts = [(s, g) for s, g, o in starts if o == 0]
    assert len(starts) == len(set(starts))  # no sample starts in two steps


def test_a_lost_loaders_unbuilt_work_is_sent_again_by_its_shadow(planned):
    h, sent = planned
    before = routed(sent, b"web/0")
    assert h.progress(consumed=1, built=2) == []  # steps 0 and 1 are built: theirs are done
    taken = h.send(b"launcher", LoaderLost(name="web/0"))
    to, adopt = of_type(taken, Adopt)[0]
    assert to == b"web~shadow-0" and adopt.name == "web/0"
    first = adopt.first[0]
    assert first <= min(g for step in (2, 3) for _, g, _ in before[step])
    again = routed(h.report(b"web~shadow-0", 0, first, 400 - first), b"web~shadow-0")
    sends = {step: {e for e in es if e[2] != DISCARD} for step, es in again.items()}
    assert {step: es for step, es in sends.items() if es} == {2: before[2], 3: before[3]}
    assert h.send(b"web/0", Progress(consumed=3)) == []  # the lost one is not heard any more
    assert json.loads(h.job.shadows.read_text())  # the take-over is recorded for the launcher


def test_a_rescale_cuts_the_new_generation_in_after_the_furthest_visit(planned):
    h, _ = planned
    reply = only(h.send(b"cli", Rescale(source="code", loaders=2)), Rescaling)
    assert (reply.generation, reply.loaders) == (1, 2)
    assert only(h.send(b"cli", Rescale(source="code", loaders=3)), Refused).reason.startswith(
        "code is being rescaled already"
    )
    new = [p for p in loader_processes(h.recipe, h.core.scaling.rescales) if "@1/" in p.name]
    assert [p.name for p in new] == ["code@1/0", "code@1/1"]
    assert of_type(h.hello(new[0]), Cut) == []  # not all of the new generation is up
    cut = of_type(h.hello(new[1]), Cut)
    assert cut == [(b"code/0", Cut(source=1))]
    h.send(b"code@1/0", CutAt(source=1, visit=3))  # not asked: dropped and counted
    assert h.core.rejects.snapshot()
    started = h.send(b"code/0", CutAt(source=1, visit=7))
    expected = GenerationStart(source=1, generation=1, start=7)
    assert sorted(started) == sorted((p, expected) for p in (b"code/0", b"code@1/0", b"code@1/1"))
    assert h.core.scaling.rescales[-1].start == 7
    assert json.loads(h.job.rescales.read_text())


def test_a_checkpoint_is_of_the_consumed_step_and_a_rewind_goes_back_to_one(planned):
    h, _ = planned
    h.progress(consumed=3, built=4)
    state_at_3 = h.core.ledger.states[3]
    taken = only(h.send(b"cli", TakeCheckpoint()), CheckpointTaken)
    assert taken.step == h.core.consumed == 3
    assert h.core.ledger.store.find(3).snapshot.state == state_at_3
    refused = only(h.send(b"trainer", Rewind(step=9)), Refused)
    assert "not reached yet" in refused.reason
    assert h.core.phase.rewind_to is None
    assert only(h.send(b"trainer", Rewind(step=2)), Rewinding).step == 2
    assert h.core.phase.rewind_to == 2
    assert h.core.ledger.store.find().snapshot.state.step == 2  # the latest now


def test_a_mix_change_applies_from_the_first_step_not_planned(planned):
    h, _ = planned
    refused = only(h.send(b"cli", SetMix(weights={"web": 0.0}, at_step=1)), Refused)
    assert "already planned" in refused.reason
    mix = only(h.send(b"cli", SetMix(weights={"web": 0.0})), MixSet)
    assert mix.at_step == h.core.state.step == 4
    h.progress(consumed=4, built=4)
    plans = [msg for _, msg in of_type(h.advance(), Plan)]
    assert [p.step for p in plans] == [4, 5, 6, 7]
    carried = {(s, g) for s, g in h.core.ledger.states[4].carry}
    for plan in plans:
        fresh = {(s, g) for s, g in zip(plan.source, plan.gpos, strict=True)} - carried
        assert {s for s, _ in fresh} == {1}  # web's weight is 0 from step 4
    assert json.loads(h.job.mix_history.read_text())


def test_samples_placed_before_a_restart_are_discarded_not_planned(tmp_path):
    h = Harness(tmp_path, make_recipe())
    h.register()
    assert of_type(h.report(b"code/0", 1, 0, 400), Route) == []  # all needed: none placed
    h.report(b"web/0", 0, 0, 400)
    h.advance()
    cursor = h.core.state.cursors[1]
    carry = {g for s, g in h.core.state.carry if s == 1}
    again = h.report(b"code/0", 1, 0, cursor)  # a loader restarted and reads from 0 again
    discarded = {g for _, g, c in routed(again, b"code/0")[0] if c == DISCARD}
    assert discarded == set(range(cursor)) - carry
