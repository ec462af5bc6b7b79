"""Real role processes over real ZeroMQ sockets, on tiny Parquet sources."""

from __future__ import annotations

import itertools
import os
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pytest

from msd.launch import procs
from msd.launch.job import Outcome
from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe
from msd.synth.text import synth_table
from tests.conftest import SMALL_SOURCES, base_recipe, processes_of_launcher, read_rank_logs


def run_job(recipe_path: Path, run_root: Path) -> Outcome:
    recipe = load_recipe(recipe_path)
    job = LocalJob(recipe, recipe_path.read_text(), run_root)
    job.start()
    outcome = job.watch(lambda status: None)
    assert processes_of_launcher(os.getpid()) == []
    return outcome


def test_one_epoch_delivers_every_sample_exactly_once(small_data, write_recipe, tmp_path):
    outcome = run_job(write_recipe(base_recipe(small_data)), tmp_path / "runs")
    assert outcome.ok, outcome.message
    logs = read_rank_logs(outcome.job.root)
    assert sorted(logs) == [0, 1, 2, 3]
    steps = {len(records) for records in logs.values()}
    assert len(steps) == 1, "every rank sees the same number of steps"
    delivered = Counter(
        (src, sid)
        for records in logs.values()
        for r in records
        for src, sid in zip(r["source_ids"], r["sample_ids"], strict=True)
    )
    # A sample longer than seq_len is split (the default): each piece is listed once.
    expected = {
        (i, j): -(-len(text.encode()) // 512)
        for i, s in enumerate(SMALL_SOURCES)
        for j, text in enumerate(synth_table(s, seed=5).column("text").to_pylist())
    }
    assert dict(delivered) == expected
    assert max(expected.values()) > 1, "the data has samples to split"
    lifecycle = outcome.status.lifecycle if outcome.status else {}
    assert lifecycle["consumed"] > 0 and min(lifecycle.values()) >= 0
    assert outcome.status is not None and outcome.status.split > 0


def test_packed_rows_never_mix_two_samples(small_data, write_recipe, tmp_path):
    from msd.client import Client
    from msd.client.numpy import NumpyClient

    recipe = base_recipe(small_data, steps=6, constructor={"prefetch_steps": 8})
    recipe_path = write_recipe(recipe)
    parsed = load_recipe(recipe_path)
    # Trainers that never read: this test reads rank 2's stream itself.
    idle = msgspec.structs.replace(parsed.trainer, command="sleep 60")
    job = LocalJob(
        msgspec.structs.replace(parsed, trainer=idle), recipe_path.read_text(), tmp_path / "runs"
    )
    job.start()
    texts = {
        i: synth_table(s, seed=5).column("text").to_pylist() for i, s in enumerate(SMALL_SOURCES)
    }
    try:
        client = Client(job=job.job.root, rank=2, world_size=4, local_rank=2)
        # rank 3 read as numpy arrays (what the demo trainer reads): the same tensors, as numpy
        arrays = NumpyClient(job=job.job.root, rank=3, world_size=4, local_rank=3)
        for batch in client:
            other = arrays.next_batch()
            assert other is not None and sorted(other) == sorted(batch)
            for name, array in other.items():
                assert isinstance(array, np.ndarray)
                assert array.dtype == batch[name].numpy().dtype, name
            assert other["input_ids"].shape == batch["input_ids"].shape
            ids = batch["input_ids"].numpy().reshape(-1)
            pos = batch["position_ids"].numpy().reshape(-1)
            labels = batch["labels"].numpy().reshape(-1)
            cu = batch["cu_seqlens"].numpy()
            segments = [(int(a), int(b)) for a, b in itertools.pairwise(cu)]
            samples = [(a, b) for a, b in segments if ids[a:b].any()]
            assert all((labels[a:b] == -100).all() for a, b in segments if not ids[a:b].any())
            assert all(b % 512 == 0 or pos[b] == 0 for _, b in segments if b < len(pos))
            pairs = zip(
                batch["source_ids"].tolist(),
                batch["sample_ids"].tolist(),
                batch["sample_offsets"].tolist(),
                strict=True,
            )
            for (a, b), (src, sid, off) in zip(samples, pairs, strict=True):
                want = np.frombuffer(texts[src][sid].encode()[off : off + 512], dtype=np.uint8)
                assert ids[a:b].tolist() == want.tolist()
                assert pos[a:b].tolist() == list(range(b - a))
                assert labels[a : b - 1].tolist() == want[1:].tolist() and labels[b - 1] == -100
                assert a // 512 == (b - 1) // 512, "a sample never crosses a row"
        assert client.step == 6 and arrays.next_batch() is None
        client.close()
    finally:
        procs.stop_all(job.children)
    assert processes_of_launcher(os.getpid()) == []


def test_streams_are_identical_across_runs_and_loader_counts(small_data, write_recipe, tmp_path):
    recipe = base_recipe(small_data, steps=25)
    for s in recipe["sources"]:
        s["repeat"] = True
    first = run_job(write_recipe(recipe, "a.yaml"), tmp_path / "runs")
    second = run_job(write_recipe(recipe, "b.yaml"), tmp_path / "runs")
    for s, n in zip(recipe["sources"], (1, 3, 2), strict=True):
        s["loaders"] = n
    rescaled = run_job(write_recipe(recipe, "c.yaml"), tmp_path / "runs")
    # One process serving two sources, a third alone; read-ahead of one row per source, so
    # the Planner's Wants drive the reading.
    for s in recipe["sources"]:
        s["loaders"] = 1
    recipe["loader"] = {"sources_per_process": 2, "buffer_tokens": 512}
    shared = run_job(write_recipe(recipe, "d.yaml"), tmp_path / "runs")
    assert first.ok and second.ok and rescaled.ok and shared.ok
    assert sorted(p.name for p in (shared.job.root / "logs").glob("loader-*")) == [
        "loader-books-0.log",
        "loader-web+1.log",
    ]
    digests = [
        {
            rank: [r["digest"] for r in records]
            for rank, records in read_rank_logs(o.job.root).items()
        }
        for o in (first, second, rescaled, shared)
    ]
    assert len(digests[0][0]) == 25
    assert digests[0] == digests[1] == digests[2] == digests[3]


def test_mix_shares_hold_over_2000_steps(small_data, write_recipe, tmp_path):
    recipe = base_recipe(
        small_data, steps=2000, seq_len=128, global_batch_tokens=256, distribute={"dp": 2}
    )
    for s in recipe["sources"]:
        s["repeat"] = True
        s["loaders"] = 1
    outcome = run_job(write_recipe(recipe), tmp_path / "runs")
    assert outcome.ok, outcome.message
    counts = Counter(  # samples, not the pieces of split ones
        src
        for records in read_rank_logs(outcome.job.root).values()
        for r in records
        for src, offset in zip(r["source_ids"], r["sample_offsets"], strict=True)
        if offset == 0
    )
    total = sum(counts.values())
    for i, weight in enumerate((0.5, 0.3, 0.2)):
        assert abs(counts[i] / total - weight) < 0.02, (i, counts[i] / total)
    assert outcome.status is not None and outcome.status.consumed == 2000


@pytest.mark.parametrize("victim", ["loader", "planner", "constructor", "trainer"])
def test_with_recovery_off_killing_a_role_stops_the_job_with_its_name(
    victim, small_data, write_recipe, tmp_path
):
    import signal
    import threading
    import time

    recipe = base_recipe(small_data, steps=100000, recovery={"restarts": 0})
    for s in recipe["sources"]:
        s["repeat"] = True
    recipe["trainer"]["demo"]["step_ms"] = 20
    recipe_path = write_recipe(recipe)
    job = LocalJob(load_recipe(recipe_path), recipe_path.read_text(), tmp_path / "runs")
    job.start()
    seen: list[int] = []

    def kill_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not seen or seen[-1] < 5):
            time.sleep(0.05)
        child = next(c for c in job.children if c.role == victim)
        os.kill(child.popen.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    outcome = job.watch(lambda status: seen.append(status.consumed))
    killer.join()
    assert not outcome.ok
    assert victim in outcome.message and "SIGKILL" in outcome.message
    assert processes_of_launcher(os.getpid()) == []
