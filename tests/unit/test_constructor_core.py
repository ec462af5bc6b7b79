"""The Data Constructor's decision core without sockets: messages in, the messages it decides to
send out.

Each test builds a ``ConstructorCore`` from a recipe, hands it plans, payloads and trainers'
requests as the wire would (every message it sends goes through ``encode`` / ``decode``), and
checks what it sends and what it holds: a step built whatever the order its plan and payloads
came in, a parked request answered once its batch is built, a relayed payload passed on once,
a plan for ranks it does not serve dropped and counted, a batch freed once its ranks consumed it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import msgspec
import numpy as np
import pytest

from msd.recipe.schema import Recipe
from msd.roles.constructor.core import ConstructorCore
from msd.roles.constructor.outbox import Child, Sent, Trainer
from msd.wire import compact
from msd.wire import protocol as proto

SEQ_LEN = 16


def make_recipe(**overrides: Any) -> Recipe:
    """Two DP ranks of two rows of ``SEQ_LEN`` tokens each (``distribute`` may add TP)."""
    spec: dict[str, Any] = {
        "name": "core",
        "seed": 5,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 4 * SEQ_LEN,
        "steps": 10,
        "distribute": {"dp": 2},
        "sources": [
            {"name": "web", "path": "x", "text_column": "t", "weight": 1},
            {"name": "code", "path": "x", "text_column": "t", "weight": 1},
        ],
        "constructor": {"prefetch_steps": 2},
    }
    spec.update(overrides)
    return msgspec.convert(spec, Recipe)


# (dp, row, source, gpos, tokens) of each piece of a step; one whole sample a piece
Piece = tuple[int, int, int, int, tuple[int, ...]]
PIECES: list[Piece] = [
    (0, 0, 0, 10, (11, 12, 13, 14, 15)),
    (0, 0, 1, 20, (21, 22, 23)),
    (0, 1, 0, 11, (31, 32, 33, 34, 35, 36, 37)),
    (1, 0, 1, 21, (41, 42, 43, 44)),
    (1, 1, 0, 12, (51, 52)),
]


def plan_of(step: int, pieces: list[Piece]) -> proto.Plan:
    lengths = tuple(len(p[4]) for p in pieces)
    return proto.Plan(
        step=step,
        dp=tuple(p[0] for p in pieces),
        row=tuple(p[1] for p in pieces),
        source=tuple(p[2] for p in pieces),
        gpos=tuple(p[3] for p in pieces),
        sample_id=tuple(p[3] + 1000 for p in pieces),
        length=lengths,
        offset=(0,) * len(pieces),
        padded=lengths,
    )


def payload_of(step: int, pieces: list[Piece], to: tuple[int, ...] = ()) -> Any:
    """A loader's payload of the samples of ``pieces``, as the wire delivers it."""
    tokens = np.array([t for p in pieces for t in p[4]], dtype=np.uint16)
    msg = proto.Payload(
        step=step,
        source=tuple(p[2] for p in pieces),
        gpos=tuple(p[3] for p in pieces),
        lengths=tuple(len(p[4]) for p in pieces),
        token_dtype="uint16",
        to=to,
    )
    return wire(msg, [tokens])


def wire(msg: proto.Message, buffers: list[Any] | None = None) -> Any:
    """``msg`` and its buffers as a socket hands them over: encoded, then decoded."""
    return proto.decode(proto.encode(msg, buffers or []))


def take(core: ConstructorCore) -> list[Sent]:
    """What the core decided to send; each message must survive the wire."""
    sent = core.out.take()
    for _, msg, buffers in sent:
        wire(msg, buffers)
    return sent


def get(core: ConstructorCore, rank: int, step: int, consumed: int) -> list[Sent]:
    identity = b"rank-%d" % rank
    core.on_request(identity, wire(proto.Get(rank=rank, step=step, consumed=consumed))[0])
    return take(core)


def tensors(sent: Sent) -> dict[str, np.ndarray]:
    """The tensors a trainer gets from a ``Batch`` the core sent (as ``msd.client.base`` reads
    it)."""
    _, batch, buffers = sent
    assert isinstance(batch, proto.Batch)
    data = np.asarray(buffers[0]).view(np.uint8)
    frames = {
        spec.name: np.frombuffer(data, spec.dtype, math.prod(spec.shape), at).reshape(spec.shape)
        for spec, at in zip(batch.frames, proto.frame_offsets(batch.frames), strict=False)
    }
    return compact.decode(frames, {t.name: (t.shape, t.dtype) for t in batch.tensors})


def deliver(core: ConstructorCore, step: int, order: list[str]) -> None:
    """Step ``step``'s plan and its payloads (one per source), in ``order``."""
    messages = {
        "plan": lambda: core.on_planner(wire(plan_of(step, PIECES))[0]),
        "web": lambda: core.on_payload(*payload_of(step, PIECES[0::2])),
        "code": lambda: core.on_payload(*payload_of(step, PIECES[1::2])),
    }
    for name in order:
        messages[name]()


@pytest.mark.parametrize("order", list(itertools.permutations(["plan", "web", "code"])))
def test_a_plan_and_its_payloads_in_any_order_build_the_planned_rows(order):
    core = ConstructorCore(make_recipe(), "n0", (0, 1), start=0)
    deliver(core, 0, list(order))
    assert core.built_upto == 1 and core.plans == {} and core.intake.held_bytes == 0
    [batch] = get(core, rank=1, step=0, consumed=0)  # DP rank 1
    assert batch[0] == Trainer(b"rank-1") and batch[1].step == 0
    ids = tensors(batch)["input_ids"]
    assert ids[0, :4].tolist() == [41, 42, 43, 44] and ids[1, :2].tolist() == [51, 52]
    [batch] = get(core, rank=0, step=0, consumed=0)
    ids = tensors(batch)["input_ids"]
    assert ids[0, :8].tolist() == [11, 12, 13, 14, 15, 21, 22, 23]
    assert ids[1, :7].tolist() == [31, 32, 33, 34, 35, 36, 37]


def test_a_parked_request_is_answered_when_its_step_is_built():
    core = ConstructorCore(make_recipe(), "n0", (0, 1), start=0)
    assert get(core, rank=0, step=0, consumed=0) == []  # nothing built: held
    deliver(core, 0, ["plan", "web"])
    assert take(core) == [] and len(core.parked) == 1
    deliver(core, 0, ["code"])  # the step's last payload builds it
    [(to, batch, _)] = take(core)
    assert to == Trainer(b"rank-0") and isinstance(batch, proto.Batch) and batch.step == 0
    assert len(core.parked) == 0
    # step 1 is not planned: held (and no proto.Progress: rank 1 has consumed nothing yet)
    assert get(core, rank=0, step=1, consumed=1) == [] and len(core.parked) == 1
    core.on_planner(wire(proto.End(num_steps=1))[0])  # the stream ends before it
    assert take(core) == [(Trainer(b"rank-0"), proto.Ended(num_steps=1), [])]
    assert len(core.parked) == 0


def test_a_relayed_payload_is_passed_on_once_and_the_own_samples_are_kept():
    core = ConstructorCore(make_recipe(constructor={"fanout": 1}), "n0", (0, 1), start=0)
    core.on_planner(wire(plan_of(0, PIECES))[0])
    # samples for Constructors 0 (this one), 1 and 2; with fan-out 1, 2 hangs under 1
    to = (0, 1, 0, 2, 0)
    core.on_payload(*payload_of(0, PIECES, to))
    assert take(core) == [] and core.relay.held_bytes > 0  # held until the proto.Welcome
    infos = tuple(proto.ConstructorInfo(f"n{i}", f"tcp://n{i}:1") for i in range(3))
    welcome = proto.Welcome(constructors=infos, index=0)
    core.on_planner(wire(welcome)[0])
    sent = take(core)
    assert [to for to, _, _ in sent] == ["outlets", Child(1)]  # re-aimed, then relayed
    part, buffers = wire(sent[1][1], sent[1][2])
    assert part.gpos == (20, 21) and part.to == (1, 2)
    assert np.frombuffer(buffers[0], np.uint16).tolist() == [21, 22, 23, 41, 42, 43, 44]
    assert (core.relay.relayed, core.relay.held_bytes) == (1, 0)
    core.on_planner(wire(welcome)[0])  # a proto.Welcome again relays nothing again
    assert [to for to, _, _ in take(core)] == ["outlets"]
    assert core.stats(0.0, 0).relayed == 1
    assert core.intake.missing[0] == {(1, 20), (1, 21)}  # its own three samples are in


def test_a_plan_for_ranks_it_does_not_serve_is_dropped_and_counted():
    core = ConstructorCore(make_recipe(), "n0", (0,), start=0)  # DP rank 0 only
    core.on_planner(wire(plan_of(0, PIECES))[0])  # names DP rank 1 too
    assert core.plans == {} and not core.intake.planned(0)
    assert core.rejects.counts == {"invalid": 1}
    assert core.stats(0.0, 0).rejected == {"invalid": 1}
    core.on_payload(*payload_of(0, PIECES))
    assert core.built_upto == 0 and take(core) == []  # never built


def test_a_batch_is_freed_once_every_rank_reading_it_consumed_it():
    recipe = make_recipe(distribute={"dp": 2, "tp": 2})  # ranks 0, 1: DP 0; 2, 3: DP 1
    core = ConstructorCore(recipe, "n0", (0, 1, 2, 3), start=0)
    for step in (0, 1):
        deliver(core, step, ["plan", "web", "code"])
    held = core.stats(0.0, 0).ready_bytes
    assert held > 0 and len(core.ready) == 4  # two steps of two groups
    for rank in (0, 1, 2, 3):
        assert get(core, rank, step=0, consumed=0)[0][1].step == 0
    get(core, rank=0, step=1, consumed=1)
    assert (0, 0, 0) in core.ready  # rank 1, a TP peer, still reads it
    get(core, rank=1, step=1, consumed=1)
    assert (0, 0, 0) not in core.ready and (1, 0, 0) in core.ready
    assert core.stats(0.0, 0).ready_bytes < held
    get(core, rank=2, step=1, consumed=1)
    sent = get(core, rank=3, step=1, consumed=1)
    assert set(core.ready) == {(0, 0, 1), (1, 0, 1)}
    progress = proto.Progress(consumed=1, waits_s=(0.0,) * 4, step_bytes=core.step_bytes, built=2)
    assert ("planner", progress, []) in sent  # every rank consumed step 0
