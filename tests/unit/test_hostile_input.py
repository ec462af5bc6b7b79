"""Input that passes the first checks and would hurt later, unit by unit: ints beyond 64 bits,
YAML's exponent floats, samples without tokens, a snapshot out of range or edited, a log line
out of range, a full disk under the job folder."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msd.checkpoint.format import Delta, decode_snapshot, encode_delta, encode_snapshot
from msd.checkpoint.signing import signing_key
from msd.checkpoint.snapshot import Snapshot
from msd.checkpoint.store import CheckpointStore, open_checkpoint
from msd.checkpoint.validate import snapshot_recipe
from msd.errors import CheckpointError, LaunchError, RecipeError, SourceError
from msd.jobdir import JobDir
from msd.launch import jobfolder
from msd.plan.schedule import constant
from msd.plan.step import NeedData, PlannerState, StreamSpec, plan_step
from msd.recipe import load_recipe
from msd.recipe.schema import Recipe, Source, stream_fingerprint, to_json
from msd.sources.index import open_source
from msd.wire.keys import create_keys

RECIPE = """\
name: t
seed: 1
steps: 10
seq_len: 64
global_batch_tokens: 256
cost: {attn: 1.0}
sources:
  - {name: web, path: data/*.parquet, text_column: text, weight: 1.0}
"""


def recipe_error(tmp_path: Path, old: str, new: str) -> str:
    assert old in RECIPE, old  # guards the test itself
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.replace(old, new, 1))
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    return str(caught.value).removeprefix(f"{tmp_path}/")


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("steps: 10", "steps: 18446744073709551616", "r.yaml:3: steps: is 18446744073709551616"),
        ("seed: 1", "seed: 9223372036854775808", "r.yaml:2: seed: is 9223372036854775808"),
        ("steps: 10", "steps: 4611686018427387905", "r.yaml:3: steps: is 4611686018427387905"),
        ("seq_len: 64", "seq_len: -9223372036854775809", "r.yaml:4: seq_len: is -9223"),
    ],
)
def test_ints_beyond_64_bits_are_refused_naming_file_line_and_key(
    tmp_path: Path, old: str, new: str, needle: str
) -> None:
    message = recipe_error(tmp_path, old, new)
    assert message.startswith(needle), message
    assert "\n" not in message


def test_an_int_in_a_free_form_mapping_is_bounded_too(tmp_path: Path) -> None:
    message = recipe_error(
        tmp_path, "name: t", "name: t\nslurm: {additional: {mem: 99999999999999999999}}"
    )
    assert "slurm.additional.mem: is 99999999999999999999, beyond a 64-bit integer" in message


def test_a_float_yaml_reads_as_text_says_what_to_write(tmp_path: Path) -> None:
    message = recipe_error(tmp_path, "attn: 1.0", "attn: 1e308")
    assert message.startswith("r.yaml:6: cost.attn: expected float, got str; write 1.0e+308")
    path = tmp_path / "ok.yaml"
    path.write_text(RECIPE.replace("attn: 1.0", "attn: 1.0e+308"))
    assert load_recipe(path).cost.attn == 1.0e308  # what the message says to write works


# -- samples without tokens ---------------------------------------------------------------------


def one_source_spec(**kw: Any) -> StreamSpec:
    base: dict[str, Any] = dict(
        seed=3,
        schedule=constant((1.0,)),
        num_rows=(100_000,),
        repeat=(True,),
        dp=2,
        micro_batches=1,
        micro_batch_size=2,
        seq_len=64,
        steps=None,
    )
    return StreamSpec(**{**base, **kw})


def test_a_stream_of_empty_samples_closes_its_step_at_the_limit() -> None:
    sp = one_source_spec()
    result = plan_step(sp, PlannerState.initial(1), lambda s, g: 0)
    assert not isinstance(result, NeedData)
    plan, after = result  # type: ignore[misc]
    assert plan.counts.empty == sp.empty_limit == after.cursors[0]
    assert not plan.pieces.columns[2].any()


def test_empty_samples_are_placed_counted_and_take_no_room() -> None:
    sp = one_source_spec()
    lengths = [0 if g % 3 == 0 else 20 for g in range(2000)]
    result = plan_step(sp, PlannerState.initial(1), lambda s, g: lengths[g])
    plan, after = result  # type: ignore[misc]
    taken = range(after.cursors[0])
    placed = [g for g in taken if (0, g) not in after.carry]
    assert plan.counts.empty == sum(1 for g in placed if lengths[g] == 0)
    assert sum(plan.pieces.columns[2].tolist()) == sum(lengths[g] for g in placed)


def test_the_empty_limit_closes_the_same_step_however_lengths_arrive() -> None:
    sp = one_source_spec()
    known = {"upto": 10}
    first = plan_step(sp, PlannerState.initial(1), lambda s, g: 0)
    while True:  # lengths reported a few at a time, as loaders do
        result = plan_step(
            sp, PlannerState.initial(1), lambda s, g: 0 if g < known["upto"] else None
        )
        if not isinstance(result, NeedData):
            break
        known["upto"] += 97
    assert result == first


def write_texts(path: Path, texts: list[str | None], **options: Any) -> None:
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), path, **options)


@pytest.mark.parametrize("cells", [[None] * 50, [""] * 50, [None, ""] * 25])
def test_a_source_without_text_is_refused_at_open(tmp_path: Path, cells: list[Any]) -> None:
    write_texts(tmp_path / "a.parquet", cells, row_group_size=16)
    source = Source(name="web", path=str(tmp_path / "*.parquet"), weight=1.0, text_column="text")
    with pytest.raises(SourceError, match=r"sources\[0\].text_column.*null or empty in all 50"):
        open_source(source, "sources[0]")


def test_a_source_with_some_text_or_no_statistics_opens(tmp_path: Path) -> None:
    write_texts(tmp_path / "a.parquet", [None] * 40, row_group_size=16)
    write_texts(tmp_path / "b.parquet", [None, "x"], row_group_size=16)
    source = Source(name="web", path=str(tmp_path / "*.parquet"), weight=1.0, text_column="text")
    assert open_source(source, "sources[0]").num_rows == 42
    (tmp_path / "b.parquet").unlink()
    write_texts(tmp_path / "c.parquet", [None] * 8, write_statistics=False)
    assert open_source(source, "sources[0]").num_rows == 48  # nothing proves c is empty


# -- snapshots ----------------------------------------------------------------------------------


def good_recipe() -> Recipe:
    source = Source(name="web", path="data/*.parquet", weight=1.0, text_column="text")
    return Recipe(sources=(source,), seq_len=64, global_batch_tokens=256, steps=10)


def snapshot(step: int = 7) -> Snapshot:
    recipe = good_recipe()
    return Snapshot(
        state=PlannerState(step, (30,), ((0, 29),)),
        fingerprint=stream_fingerprint(recipe),
        recipe=json.loads(to_json(recipe)),
        num_rows=(300,),
        mix_history=({"step": 5, "weights": {"web": 0.5}},),
        created=1.5,
    )


def rewritten(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The snapshot with its body edited and its sha256 recomputed (its hmac kept)."""
    doc = json.loads(data)
    edit(doc["body"])
    canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode()
    doc["sha256"] = hashlib.sha256(canonical).hexdigest()
    return json.dumps(doc).encode()


def put(body: dict[str, Any], key: str, value: Any) -> None:
    body[key] = value


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda b: put(b, "step", -1), "step is -1, out of range"),
        (lambda b: put(b, "step", 2**70), f"step is {2**70}, out of range"),
        (lambda b: put(b, "cursors", [2**63]), "cursors[0] is 9223372036854775808"),
        (lambda b: put(b, "cursors", [1, 2]), "num_rows has 1 entries for 2 cursors"),
        (lambda b: put(b, "carry", [[4, 2]]), "carry[0] source is 4, out of range"),
        (lambda b: put(b, "carry", [[0, 1]] * 9), "carry holds 9 samples"),
        (lambda b: put(b, "cursors", ["3"]), "expected int, got str at body.cursors[0]"),
        (lambda b: put(b, "num_rows", [0]), "num_rows[0] is 0, out of range"),
        (lambda b: b.pop("recipe"), "missing required field recipe"),
        (lambda b: put(b, "created", True), "expected float, got bool at body.created"),
    ],
)
def test_a_snapshot_field_out_of_range_is_refused_naming_it(edit: Any, needle: str) -> None:
    data = rewritten(encode_snapshot(snapshot()), edit)
    with pytest.raises(CheckpointError) as caught:
        decode_snapshot(data, Path("step-7.json"))
    assert str(caught.value).startswith("step-7.json is malformed: ")
    assert needle in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda r: put(r, "seq_len", 0), "step-7.json: recipe.seq_len: must be >= 2"),
        (lambda r: put(r, "seq_len", "x"), "step-7.json: recipe.seq_len: expected int, got str"),
        (lambda r: put(r, "steps", 2**64), f"step-7.json: recipe.steps: is {2**64}"),
        (lambda r: put(r, "bogus", 1), "step-7.json: recipe: object contains unknown field bogus"),
        (lambda r: r["sources"].append(dict(r["sources"][0], name="b")), "cursors has 1 entries"),
        (lambda r: put(r, "seed", 5), "fingerprint"),
    ],
)
def test_the_recipe_a_snapshot_embeds_is_checked_as_a_recipe_file(edit: Any, needle: str) -> None:
    data = rewritten(encode_snapshot(snapshot()), lambda b: edit(b["recipe"]))
    snap = decode_snapshot(data, Path("step-7.json"))
    with pytest.raises(CheckpointError, match=r"step-7\.json") as caught:
        snapshot_recipe(snap, Path("step-7.json"))
    assert needle in str(caught.value), caught.value


def test_a_mix_history_naming_another_source_is_refused() -> None:
    edit = lambda b: put(b, "mix_history", [{"step": 1, "weights": {"nope": 1.0}}])  # noqa: E731
    snap = decode_snapshot(rewritten(encode_snapshot(snapshot()), edit), Path("s.json"))
    with pytest.raises(CheckpointError, match="mix_history\\[0\\] names 'nope'"):
        snapshot_recipe(snap, Path("s.json"))


def job_with_snapshot(tmp_path: Path) -> tuple[Path, bytes]:
    """A job folder with a key and one signed snapshot; (its path, the key)."""
    job = JobDir(tmp_path / "job")
    job.create()
    key = signing_key(create_keys(job.key_file))
    CheckpointStore(job.checkpoints, key=key).write_snapshot(snapshot())
    return job.checkpoints / "step-00000007.json", key


def test_a_signed_snapshot_verifies_and_an_edited_one_is_refused(tmp_path: Path) -> None:
    path, _ = job_with_snapshot(tmp_path)
    assert open_checkpoint(path).verified and open_checkpoint(path.parent.parent).verified
    command = lambda b: put(b["recipe"], "trainer", {"command": "rm -rf ~"})  # noqa: E731
    path.write_bytes(rewritten(path.read_bytes(), command))
    with pytest.raises(CheckpointError, match="was changed after it was written"):
        open_checkpoint(path)
    with pytest.raises(CheckpointError, match="was changed after it was written"):
        open_checkpoint(path.parent.parent)  # passed over; nothing before it


def test_a_snapshot_without_key_or_signature_is_not_verified(tmp_path: Path) -> None:
    path, _ = job_with_snapshot(tmp_path)
    away = tmp_path / "away.json"
    away.write_bytes(path.read_bytes())
    assert not open_checkpoint(away).verified  # no job key beside it
    unsigned = json.loads(path.read_bytes())
    del unsigned["hmac"]
    path.write_bytes(json.dumps(unsigned).encode())
    found = open_checkpoint(path)
    assert not found.verified and found.snapshot == decode_snapshot(away.read_bytes(), away)


def test_a_log_line_out_of_range_stops_the_replay_there(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.write_snapshot(snapshot())
    store.append(Delta(8, ((0, 4),), ()))
    line = encode_delta(Delta(9, ((5, 4),), ()))  # a source the job does not have; CRC good
    store.close()
    with open(tmp_path / "log-00000007.jsonl", "ab") as f:
        f.write(line)
    found = store.find()
    assert found.snapshot.state.step == 8 and found.snapshot.state.cursors == (34,)
    assert "line 2 moves source 5 by 4, out of range" in found.passed_over[0]


# -- the job folder -----------------------------------------------------------------------------


def test_a_job_folder_is_created_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        job = JobDir(tmp_path / "runs" / "j")
        job.create()
        create_keys(job.key_file)
    finally:
        os.umask(old)
    assert stat.S_IMODE(job.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(job.key_file.stat().st_mode) == 0o600
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in job.root.iterdir() if p.is_dir())


def no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_leaves_no_temporary_file(tmp_path: Path, monkeypatch: Any) -> None:
    job = JobDir(tmp_path / "j")
    job.create()
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError):
        job.write_json(job.job_json, {"state": "running"})
    assert not list(job.root.glob(".*.tmp"))


def test_job_json_is_marked_failed_in_place_on_a_full_disk(
    tmp_path: Path, monkeypatch: Any
) -> None:
    job = JobDir(tmp_path / "j")
    job.create()
    jobfolder.write_job_state(job, good_recipe(), "local", "running")
    monkeypatch.setattr(jobfolder.JobDir, "write_json", lambda self, path, data: no_space())
    jobfolder.write_job_state(job, good_recipe(), "local", "failed")
    assert json.loads(job.job_json.read_text())["state"] == "failed"
    monkeypatch.setattr(
        jobfolder.JobDir, "write_json_in_place", lambda self, path, data: no_space()
    )
    with pytest.raises(LaunchError, match=f"the job folder {job.root} is full") as caught:
        jobfolder.write_job_state(job, good_recipe(), "local", "failed")
    assert "\n" not in str(caught.value)


def test_a_job_that_cannot_be_prepared_on_a_full_disk_says_so(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(jobfolder, "create_keys", no_space)
    with pytest.raises(LaunchError, match=r"is full .*; free space there or use another --run-dir"):
        jobfolder.prepare_job(good_recipe(), RECIPE, tmp_path / "runs")
