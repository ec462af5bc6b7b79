"""Checkpoint and restore on real processes: a restored job continues the identical stream, a
restore with another DP size re-splits the same global batches, a damaged checkpoint is refused
while the one before it still works, and an incompatible recipe is refused with what differs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from msd.jobdir import JobDir
from tests.conftest import base_recipe, read_rank_logs, run_msd, start_launch, wait_for_file

STEPS = 120
Piece = tuple[int, int, int]  # (source, sample id, offset): one piece of one sample


def recipe(data: Path, **overrides: Any) -> dict[str, Any]:
    defaults = {"steps": STEPS, "checkpoint": {"every_steps": 20, "keep": 10}}
    doc = base_recipe(data, **{**defaults, **overrides})
    for s in doc["sources"]:
        s["repeat"] = True
    return doc


def launch(tmp_path: Path, doc: dict[str, Any], name: str) -> Path:
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_msd("launch", f"{name}.yaml", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return Path(json.loads(result.stdout)["job"])


def restore(tmp_path: Path, *args: str) -> Path:
    result = run_msd("restore", *args, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return Path(json.loads(result.stdout)["job"])


def start_restore(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``restore`` in the background: `finish_restore` waits for it."""
    return subprocess.Popen(
        [sys.executable, "-m", "msd.cli", "restore", *args, "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_restore(proc: subprocess.Popen[str], timeout: float = 120) -> Path:
    """The job folder of a ``start_restore`` once it has ended (killed if it has not by
    ``timeout``)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    return Path(json.loads(out)["job"])


def digests(job: Path) -> dict[tuple[int, int], str]:
    """(rank, step) → the digest of the batch that rank received at that step."""
    return {(rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(job).items() for r in rs}


def global_batches(job: Path) -> dict[int, Counter[Piece]]:
    """step → every piece every rank received at that step (the global batch)."""
    steps: dict[int, Counter[Piece]] = {}
    for rs in read_rank_logs(job).values():
        for r in rs:
            pieces = zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True)
            steps.setdefault(r["step"], Counter()).update(pieces)
    return steps


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> Path:
    """A 120-step DP=4 run with a snapshot every 20 steps (a log line each step between)."""
    return launch(tmp_path_factory.mktemp("original"), recipe(small_data), "original")


def test_a_run_keeps_snapshots_and_a_line_per_step(original: Path) -> None:
    names = sorted(p.name for p in (original / "checkpoints").iterdir())
    assert [n for n in names if n.startswith("step-")] == [
        f"step-{s:08d}.json" for s in range(0, STEPS + 1, 20)
    ]
    lines = (original / "checkpoints" / "log-00000040.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(41, 61))
    # O(sources): the size does not depend on how much data went through.
    sizes = {p.stat().st_size for p in (original / "checkpoints").glob("step-*.json")}
    assert max(sizes) < 8192


@pytest.mark.parametrize("how", ["folder", "snapshot"])
def test_a_restored_job_continues_the_identical_stream(
    tmp_path: Path, original: Path, how: str
) -> None:
    if how == "folder":
        restored = restore(tmp_path, str(original), "--step", "57")  # snapshot 40 + log
        first = 57
    else:
        restored = restore(tmp_path, str(original / "checkpoints" / "step-00000080.json"))
        first = 80
    before, after = digests(original), digests(restored)
    assert sorted({step for _, step in after}) == list(range(first, STEPS))
    assert after == {key: d for key, d in before.items() if key[1] >= first}
    assert JobDir(restored).start_step() == first


@pytest.mark.parametrize("dp", [2, 8])
def test_restoring_with_another_dp_size_resplits_the_same_global_batches(
    tmp_path: Path, small_data: Path, original: Path, dp: int
) -> None:
    other = tmp_path / f"dp{dp}.yaml"
    other.write_text(yaml.safe_dump(recipe(small_data, distribute={"dp": dp}), sort_keys=False))
    restored = restore(tmp_path, str(original), "--step", "60", "--recipe", str(other))
    assert sorted(read_rank_logs(restored)) == list(range(dp))
    before, after = global_batches(original), global_batches(restored)
    assert sorted(after) == list(range(60, STEPS))
    for step in range(60, STEPS):
        assert after[step] == before[step], step
    # Equal global batches step by step: what the original delivered before step 60 plus what
    # the restored job delivered from it on is the original's stream, nothing lost or repeated;
    # and within a step each piece reaches exactly one rank.
    assert all(n == 1 for step in range(60, STEPS) for n in after[step].values())


def test_restoring_with_another_cp_size_resplits_the_same_global_batches(
    tmp_path: Path, small_data: Path
) -> None:
    """CP 2 × DP 2, restored at step 40 as DP 4 without CP: samples stay padded to multiples of
    4 as in the run, so each step holds the same samples, over other ranks."""
    run = launch(tmp_path, recipe(small_data, steps=80, distribute={"dp": 2, "cp": 2}), "cp2")
    (tmp_path / "dp4.yaml").write_text(
        yaml.safe_dump(recipe(small_data, steps=80, distribute={"dp": 4}), sort_keys=False)
    )
    result = run_msd(
        "restore", str(run), "--step", "40", "--recipe", "dp4.yaml", "--json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "padding samples to multiples of 4, as the checkpoint's run did" in result.stderr
    restored = Path(json.loads(result.stdout)["job"])
    before, after = global_batches(run), global_batches(restored)
    assert sorted(after) == list(range(40, 80))
    for step in range(40, 80):
        assert set(after[step]) == set(before[step]), step
        assert all(n == 2 for n in before[step].values())  # both CP ranks of one DP rank
        assert all(n == 1 for n in after[step].values())  # one rank each


def test_a_damaged_checkpoint_is_refused_and_the_one_before_still_works(
    tmp_path: Path, original: Path
) -> None:
    copy = tmp_path / "job"
    (copy / "checkpoints").mkdir(parents=True)
    for p in (original / "checkpoints").iterdir():
        (copy / "checkpoints" / p.name).write_bytes(p.read_bytes())
    (copy / "job.key").write_bytes((original / "job.key").read_bytes())  # its snapshots verify
    newest = copy / "checkpoints" / f"step-{STEPS:08d}.json"
    newest.write_bytes(newest.read_bytes()[:100])  # torn
    flipped = copy / "checkpoints" / "step-00000100.json"
    flipped.write_bytes(flipped.read_bytes().replace(b'"cursors":[', b'"cursors":[1'))
    for bad, why in ((newest, "not a complete checkpoint"), (flipped, "does not match")):
        result = run_msd("restore", str(bad), cwd=tmp_path)
        assert result.returncode != 0 and why in result.stderr, result.stderr
        assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started
    # The folder passes over both and rebuilds step 110 from snapshot 80 and the logs.
    restored = restore(tmp_path, str(copy), "--step", "110")
    assert digests(restored) == {k: d for k, d in digests(original).items() if k[1] >= 110}


def test_a_recipe_with_other_sources_or_tokens_per_step_is_refused(
    tmp_path: Path, small_data: Path, original: Path
) -> None:
    fewer = recipe(small_data)
    fewer["sources"] = fewer["sources"][:2]
    bigger = recipe(small_data, global_batch_tokens=8192)
    for doc, why in ((fewer, "sources: ['web', 'code', 'books']"), (bigger, "--allow-batch")):
        (tmp_path / "other.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        result = run_msd("restore", str(original), "--recipe", "other.yaml", cwd=tmp_path)
        assert result.returncode != 0 and why in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    # Allowed: the cursors carry over; no piece of the first 60 steps comes back early.
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(bigger, sort_keys=False))
    restored = restore(
        tmp_path, str(original), "--step", "60", "--recipe", "other.yaml", "--allow-batch-change"
    )
    assert min(global_batches(restored)) == 60


def test_msd_checkpoint_snapshots_a_running_job(tmp_path: Path, small_data: Path) -> None:
    doc = recipe(small_data, steps=400, trainer={"command": "demo", "demo": {"step_ms": 20}})
    doc["checkpoint"] = {"every_steps": 0}
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "slow.yaml")
    try:
        log = wait_for_file(tmp_path, "runs/*/trainer/rank-0.jsonl", proc, lines=30)
        job = log.parents[1]
        result = run_msd("checkpoint", str(job), "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        taken = json.loads(result.stdout)
        assert taken["step"] >= 29 and Path(taken["path"]).is_file()
        # The snapshot restores at once, while its run goes on: the restored job starts while
        # the run takes its last steps; the two are compared once both have ended.
        restoring = start_restore(tmp_path, taken["path"])
    finally:
        out, err = proc.communicate(timeout=120)
    restored = finish_restore(restoring)
    assert proc.returncode == 0, out + err
    first = taken["step"]
    assert digests(restored) == {k: d for k, d in digests(job).items() if k[1] >= first}
