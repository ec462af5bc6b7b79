"""Checkpoint files: round trips, damage detected and passed over, the state at any step rebuilt
from snapshot + log, and which recipe changes a checkpoint may continue under."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msd.checkpoint.compat import differences, keeping_padding
from msd.checkpoint.format import (
    Delta,
    decode_delta,
    decode_snapshot,
    encode_delta,
    encode_snapshot,
)
from msd.checkpoint.resume import first_positions, needed
from msd.checkpoint.snapshot import Snapshot, Totals
from msd.checkpoint.store import CheckpointStore, open_checkpoint
from msd.errors import CheckpointError
from msd.plan.step import NeedData, PlannerState, plan_step
from msd.recipe.schema import from_json, pad_multiple
from tests.unit.test_step import lengths_table, spec


def snap(state: PlannerState) -> Snapshot:
    return Snapshot(
        state=state,
        fingerprint="f" * 16,
        recipe={"name": "t"},
        num_rows=(300, 300, 300),
        mix_history=({"step": 5, "weights": {"web": 0.0}},),
        totals=Totals(10, (1, 2, 3), (4, 5, 6)),
        created=1.5,
    )


def planned_states(steps: int) -> list[PlannerState]:
    """The states before each of ``steps`` real planned steps (state i is at step i)."""
    sp, table = spec(), lengths_table(3, 300)
    states = [PlannerState.initial(3)]
    for _ in range(steps):
        result = plan_step(sp, states[-1], lambda s, g: int(table[s][g]))
        assert not isinstance(result, NeedData)
        states.append(result[1])  # type: ignore[index]
    return states


def test_a_snapshot_round_trips_as_plain_json() -> None:
    original = snap(PlannerState(7, (3, 4, 5), ((1, 2), (0, 1))))
    data = encode_snapshot(original)
    assert json.loads(data)["format"] == "msd-checkpoint"  # JSON, nothing pickled
    assert decode_snapshot(data, Path("x")) == original


@pytest.mark.parametrize("key", [None, b"k" * 32])
def test_a_snapshot_is_the_document_dumped_whole_with_sorted_keys(key: bytes | None) -> None:
    """The body is encoded once and spliced in: the bytes are those of dumping the whole
    document, as checkpoints were always written."""
    data = encode_snapshot(snap(PlannerState(7, (3, 4, 5), ((1, 2), (0, 1)))), key)
    doc = json.loads(data)
    assert ("hmac" in doc) == (key is not None)
    assert data == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], "not a complete checkpoint"),
        (lambda b: b.replace(b'"cursors":[3', b'"cursors":[9'), "does not match its sha256"),
        (lambda b: b.replace(b'"version":1', b'"version":9'), "checkpoint version 9"),
        (lambda b: b"{}", "not an msd checkpoint"),
    ],
)
def test_a_damaged_snapshot_is_refused_with_what_is_wrong(damage, message) -> None:  # type: ignore[no-untyped-def]
    data = encode_snapshot(snap(PlannerState(7, (3, 4, 5), ())))
    with pytest.raises(CheckpointError, match=message):
        decode_snapshot(damage(data), Path("step-7.json"))


def test_log_lines_round_trip_and_a_torn_line_is_rejected() -> None:
    states = planned_states(3)
    delta = Delta.between(states[1], states[2], tokens=99)
    line = encode_delta(delta)
    assert decode_delta(line) == delta
    assert delta.apply(states[1]) == states[2]
    assert decode_delta(line[:-10]) is None
    assert decode_delta(line.replace(b'"tokens":99', b'"tokens":98')) is None
    with pytest.raises(CheckpointError, match="does not follow"):
        delta.apply(states[0])


def write_run(
    root: Path, states: list[PlannerState], every: int, keep: int = 10
) -> CheckpointStore:
    """What the Planner writes: a snapshot at step 0 and every ``every`` steps, a line a step."""
    store = CheckpointStore(root, keep=keep)
    store.write_snapshot(snap(states[0]))
    for step in range(1, len(states)):
        store.append(Delta.between(states[step - 1], states[step], tokens=step))
        if step % every == 0:
            store.write_snapshot(snap(states[step]))
    store.close()
    return store


def test_the_state_at_any_step_is_a_snapshot_plus_the_log(tmp_path: Path) -> None:
    states = planned_states(25)
    store = write_run(tmp_path, states, every=10)
    assert [s for s, _ in store.snapshots()] == [0, 10, 20]
    assert store.find().snapshot.state == states[25]
    for step in (0, 3, 10, 17, 20, 24):
        assert store.find(step).snapshot.state == states[step]
    assert store.find(17).path.name == "step-00000010.json"
    assert store.find(17).snapshot.totals.tokens == 10 + sum(range(11, 18))


def test_a_corrupt_newest_snapshot_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    states = planned_states(25)
    store = write_run(tmp_path, states, every=10)
    newest = tmp_path / "step-00000020.json"
    newest.write_bytes(newest.read_bytes()[:40])  # torn
    found = store.find()
    assert found.snapshot.state == states[25]  # step 10 + the logs after it
    assert found.path.name == "step-00000010.json"
    assert any("step-00000020.json" in p for p in found.passed_over)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        open_checkpoint(newest)


def test_a_torn_last_log_line_costs_that_step_only(tmp_path: Path) -> None:
    states = planned_states(15)
    write_run(tmp_path, states, every=10)
    log = tmp_path / "log-00000010.jsonl"
    log.write_bytes(log.read_bytes()[:-7])
    found = CheckpointStore(tmp_path).find()
    assert found.snapshot.state == states[14]
    assert "line 5 is damaged" in found.passed_over[0]


def test_only_the_newest_snapshots_are_kept(tmp_path: Path) -> None:
    states = planned_states(30)
    store = write_run(tmp_path, states, every=5, keep=2)
    assert [s for s, _ in store.snapshots()] == [25, 30]
    assert sorted(p.name for p in tmp_path.glob("log-*")) == [
        "log-00000025.jsonl",
        "log-00000030.jsonl",
    ]
    with pytest.raises(CheckpointError, match="at or before step 10"):
        store.find(10)


def test_a_folder_without_checkpoints_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        open_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path / "nope")


def test_planning_from_a_restored_state_continues_the_same_plans(tmp_path: Path) -> None:
    sp, table = spec(), lengths_table(3, 300)

    def lookup(s: int, g: int) -> int:
        return int(table[s][g])

    states = planned_states(12)
    write_run(tmp_path, states, every=5)
    state = CheckpointStore(tmp_path).find(7).snapshot.state
    expected = plan_step(sp, states[7], lookup)
    assert plan_step(sp, state, lookup) == expected


def test_resume_positions_cover_the_carried_samples() -> None:
    state = PlannerState(9, (10, 20, 30), ((1, 17), (1, 18), (2, 29)))
    assert first_positions(state) == (10, 17, 29)
    assert needed(state, 1, 17) and needed(state, 1, 20) and needed(state, 0, 12)
    assert not needed(state, 1, 19) and not needed(state, 0, 9)


def recipe(**changes):  # type: ignore[no-untyped-def]
    doc = {
        "seq_len": 512,
        "global_batch_tokens": 8192,
        "seed": 1,
        "distribute": {"dp": 4},
        "sources": [
            {"name": "web", "path": "/d/web/*.parquet", "weight": 0.6},
            {"name": "code", "path": "/d/code/*.parquet", "weight": 0.4},
        ],
    }
    doc.update(changes)
    return from_json(json.dumps(doc).encode())


def test_other_dp_tp_pp_sizes_may_continue_a_checkpoint() -> None:
    saved = recipe()
    for distribute in ({"dp": 2}, {"dp": 8}, {"dp": 2, "tp": 2, "pp": 2}):
        assert differences(saved, (10, 20), recipe(distribute=distribute), (10, 20)) == []


def test_what_differs_is_named() -> None:
    saved = recipe()
    other_sources = recipe(sources=[{"name": "web", "path": "/d/web/*.parquet", "weight": 1}])
    assert (
        "sources: ['web', 'code'] in the checkpoint, ['web']"
        in differences(saved, (10, 20), other_sources, (10,))[0]
    )
    assert differences(saved, (10, 20), recipe(), (10, 21)) == [
        "source 'code' has 21 rows; it had 20 at the checkpoint"
    ]
    assert differences(saved, (10, 20), recipe(seed=2), (10, 20)) == ["seed: 1 → 2"]
    cp = differences(saved, (10, 20), recipe(distribute={"dp": 2, "cp": 2}), (10, 20))
    assert len(cp) == 1 and cp[0].startswith("distribute.cp 2 pads samples to multiples of 4")
    assert "distribute.pad_to a multiple of 4" in cp[0]


@pytest.mark.parametrize(
    ("saved_distribute", "new_distribute", "pad_to"),
    [
        ({"dp": 2, "cp": 2}, {"dp": 4}, 4),  # CP 2 → 1: pad to 4 as before
        ({"dp": 1, "cp": 4}, {"dp": 2, "cp": 2}, 8),  # 8 is a multiple of 2 × 2
        ({"dp": 4, "pad_to": 8}, {"dp": 1, "cp": 4}, 8),  # launched ready for CP 4
        ({"dp": 4, "pad_to": 8}, {"dp": 2, "cp": 2}, 8),
    ],
)
def test_another_cp_size_continues_with_the_checkpoints_padding(
    saved_distribute: dict, new_distribute: dict, pad_to: int
) -> None:
    saved, new = recipe(distribute=saved_distribute), recipe(distribute=new_distribute)
    kept = keeping_padding(saved, new)
    assert pad_multiple(kept.distribute) == pad_to
    assert kept.distribute.cp == new.distribute.cp and kept.distribute.dp == new.distribute.dp
    assert differences(saved, (10, 20), kept, (10, 20)) == []


def test_a_cp_size_the_checkpoints_padding_cannot_serve_is_refused() -> None:
    """Launched without CP (no padding), restored with CP 2: samples would need padding to 4."""
    saved, new = recipe(distribute={"dp": 4}), recipe(distribute={"dp": 2, "cp": 2})
    kept = keeping_padding(saved, new)
    assert kept is new
    (refusal,) = differences(saved, (10, 20), kept, (10, 20))
    assert "multiples of 4, the checkpoint's run to multiples of 1" in refusal


def test_other_tokens_per_step_need_to_be_allowed() -> None:
    saved, bigger = recipe(), recipe(global_batch_tokens=16384)
    (refusal,) = differences(saved, (10, 20), bigger, (10, 20))
    assert "global_batch_tokens: 8192 → 16384" in refusal and "--allow-batch-change" in refusal
    assert differences(saved, (10, 20), bigger, (10, 20), allow_batch_change=True) == []
