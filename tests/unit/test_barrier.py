"""The demo trainer's barrier over real ZeroMQ sockets, its ranks as threads of one process:
nobody passes a step before every rank arrived, a rank that never arrives is said in one
sentence, and a peer without the job's key releases nobody."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.launch.ports import free_port
from msd.trainer.barrier import Barrier
from msd.wire import transport
from msd.wire.keys import create_keys
from msd.wire.protocol import Arrive, Release


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> JobDir:
    """One job for the module: a process's ZeroMQ context admits one job's key (as a role's)."""
    folder = JobDir(tmp_path_factory.mktemp("barrier") / "job")
    folder.root.mkdir()
    create_keys(folder.key_file)
    return folder


def _ranks(job: JobDir, world: int, port: int, timeout_s: float = 30.0) -> list[Barrier]:
    return [Barrier(job, r, world, "127.0.0.1", port, timeout_s) for r in range(world)]


def test_no_rank_passes_a_step_before_every_rank_arrived(job: JobDir) -> None:
    barriers = _ranks(job, 3, free_port())
    passed: list[tuple[int, int, float]] = []
    arrived: dict[tuple[int, int], float] = {}

    def rank(b: Barrier) -> None:
        for step in range(5):
            time.sleep(0.01 * b.rank * (step % 2))  # a slow rank on odd steps
            arrived[(b.rank, step)] = time.monotonic()
            b.wait(step)
            passed.append((b.rank, step, time.monotonic()))

    threads = [threading.Thread(target=rank, args=(b,)) for b in barriers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for b in barriers:
        b.close()
    assert len(passed) == 15
    for r, step, at in passed:
        assert at >= max(arrived[(other, step)] for other in range(3)), (r, step)


def test_a_rank_that_never_arrives_is_named(job: JobDir) -> None:
    zero, _one, _two = _ranks(job, 3, free_port(), timeout_s=0.5)
    with pytest.raises(LaunchError, match=r"rank 0 waited 0 s for ranks \[1, 2\] to arrive"):
        zero.wait(0)
    for b in (zero, _one, _two):
        b.close()


def test_a_peer_without_the_key_cannot_release_a_rank(job: JobDir, tmp_path: Path) -> None:
    port = free_port()
    zero, one = _ranks(job, 2, port, timeout_s=1.0)
    stranger = JobDir(tmp_path / "other")
    stranger.root.mkdir()
    create_keys(stranger.key_file)
    ctx: zmq.Context[Any] = transport.context()
    intruder = transport.connect(ctx, zmq.DEALER, f"tcp://127.0.0.1:{port}", keys=stranger.keys())
    transport.send(intruder, Arrive(rank=1, step=0))  # never admitted: rank 0 sees nothing
    with pytest.raises(LaunchError, match="for ranks \\[1\\] to arrive at step 0"):
        zero.wait(0)
    intruder.close(linger=0)
    for b in (zero, one):
        b.close()


def test_a_wrong_message_is_dropped_and_counted(job: JobDir) -> None:
    zero, one = _ranks(job, 2, free_port(), timeout_s=1.0)
    assert one.sock is not None
    transport.send(one.sock, Release(step=7))  # not an Arrive: dropped
    transport.send(one.sock, Arrive(rank=5, step=0))  # no rank 5 in a world of 2: dropped
    with pytest.raises(LaunchError):
        zero.wait(0)
    assert zero.rejects.counts == {"unexpected": 2}
    for b in (zero, one):
        b.close()


def test_one_rank_needs_no_socket(job: JobDir) -> None:
    alone = Barrier(job, 0, 1, "", 0)
    alone.wait(0)
    assert alone.sock is None
