"""The Planner's long-sample counters: counted per step, carried by snapshots and log lines,
and rebuilt from them exactly; snapshots and log lines written before them read as zeros."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from msd.checkpoint.format import (
    Delta,
    decode_delta,
    decode_snapshot,
    encode_delta,
    encode_snapshot,
)
from msd.checkpoint.snapshot import Counters, Snapshot
from msd.checkpoint.store import CheckpointStore
from msd.plan.step import NeedData, PlannerState, pieces, plan_step
from tests.unit.test_checkpoint import snap
from tests.unit.test_step import lengths_table, spec


def test_counters_add_up_per_source() -> None:
    a = Counters(1, 2, 0, ((0, 5), (2, 7)))
    b = Counters(3, 0, 1, ((2, 1), (1, 4)))
    assert a + b == Counters(4, 2, 1, ((0, 5), (1, 4), (2, 8)))
    assert (a + b).per_source(4) == (5, 4, 8, 0)
    assert not Counters() and a


def test_a_snapshot_carries_its_counters() -> None:
    original = Snapshot(**{**snap(PlannerState(7, (3, 4, 5))).__dict__})
    with_counters = Snapshot(**{**original.__dict__, "counters": Counters(3, 2, 1, ((1, 40),))})
    decoded = decode_snapshot(encode_snapshot(with_counters), Path("x"))
    assert decoded.counters == Counters(3, 2, 1, ((1, 40),))


def test_a_snapshot_from_before_counters_loads_with_zeros() -> None:
    doc = json.loads(encode_snapshot(snap(PlannerState(7, (3, 4, 5)))))
    del doc["body"]["counters"]
    canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode()
    doc["sha256"] = hashlib.sha256(canonical).hexdigest()
    decoded = decode_snapshot(json.dumps(doc).encode(), Path("x"))
    assert decoded.counters == Counters()


def test_a_log_line_carries_what_its_step_delivered_and_old_lines_read_as_none() -> None:
    delta = Delta(8, ((0, 3),), (), 100, ((0, 3, 100),), Counters(1, 1, 0, ((0, 9),)))
    assert decode_delta(encode_delta(delta)) == delta
    old = encode_delta(Delta(8, ((0, 3),), (), 100))
    assert b"counters" not in old and b"sources" not in old
    assert decode_delta(old) == Delta(8, ((0, 3),), (), 100, (), Counters())


def test_the_state_at_a_step_adds_the_logged_steps_counters(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = snap(PlannerState(0, (0, 0, 0)))
    first = Snapshot(**{**first.__dict__, "counters": Counters(1, 0, 0, ())})
    store.write_snapshot(first)
    states = [PlannerState(i, (i, 0, 0)) for i in range(4)]
    for i in range(3):
        step = Counters(1, 1, 0, ((0, 10),))
        store.append(Delta.between(states[i], states[i + 1], 5, ((0, 1, 5),), step))
    store.close()
    found = store.find().snapshot
    assert found.step == 3
    assert found.counters == Counters(4, 3, 0, ((0, 30),))
    assert found.totals.tokens == 10 + 15
    assert found.totals.source_samples == (1 + 3, 2, 3)
    assert found.totals.source_tokens == (4 + 15, 5, 6)
    assert store.find(2).snapshot.counters == Counters(3, 2, 0, ((0, 20),))


def test_truncation_counts_the_tokens_cut_off() -> None:
    sp = spec(long_samples="truncate")
    _, counts = pieces(sp, 1, 0, 200)
    assert counts.truncated == 1 and counts.truncated_tokens == ((1, 200 - 64),)
    split = spec()  # 4 rows of 64: a sample of 300 keeps 256 tokens
    _, counts = pieces(split, 2, 0, 300)
    assert (counts.split, counts.truncated, counts.truncated_tokens) == (1, 1, ((2, 300 - 256),))
    _, counts = pieces(split, 2, 0, 200)
    assert (counts.split, counts.truncated, counts.truncated_tokens) == (1, 0, ())


def test_a_planned_step_counts_the_tokens_its_truncated_samples_lost() -> None:
    sp = spec(long_samples="truncate")
    table = lengths_table(3, 300, high=120)
    result = plan_step(sp, PlannerState.initial(3), lambda s, g: int(table[s][g]))
    assert not isinstance(result, NeedData)
    plan, _ = result  # type: ignore[misc]
    expected: dict[int, int] = {}
    for slot in plan.slots:
        length = int(table[slot.source][slot.gpos])
        if length > 64:
            expected[slot.source] = expected.get(slot.source, 0) + length - 64
    assert expected and dict(plan.counts.truncated_tokens) == expected
    assert plan.counts.truncated == sum(1 for s in plan.slots if table[s.source][s.gpos] > 64)
