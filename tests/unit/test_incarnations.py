"""The data plane's incarnations on SLURM (``JOB/restarts/``): one per failure, however many
roles report it, and endpoints that say which incarnation published them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from msd.jobdir import JobDir
from msd.launch import incarnations


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    folder = JobDir(tmp_path / "job")
    folder.create()
    return folder


def test_a_new_job_is_incarnation_0_and_each_failure_starts_the_next(job: JobDir) -> None:
    assert incarnations.current(job) == 0
    assert incarnations.start_next(job, 0, "planner", "planner", "killed by SIGKILL", True) == 1
    assert incarnations.start_next(job, 1, "loader", "web/0", "went back", False) == 2
    assert [(r.incarnation, r.role, r.counted) for r in incarnations.restarts(job)] == [
        (1, "planner", True),
        (2, "loader", False),
    ]
    assert incarnations.counted(job) == 1


def test_roles_failing_together_start_one_incarnation(job: JobDir) -> None:
    """Eight supervisors that all saw incarnation 0 end and report it at once."""
    got: list[int] = []
    barrier = threading.Barrier(8)

    def report(i: int) -> None:
        barrier.wait()
        got.append(incarnations.start_next(job, 0, "loader", f"web/{i}", "killed", True))

    threads = [threading.Thread(target=report, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [1] * 8
    assert len(incarnations.restarts(job)) == 1
    assert not list((job.root / "restarts").glob(".*"))  # no temporary file left


def test_the_tasks_of_one_requeued_job_start_one_incarnation(job: JobDir) -> None:
    """Each node's task of a requeued trainer job reports the requeue, one after another."""
    first = incarnations.start_next(job, 0, "constructor", "n1", "requeued", False, key="7.1")
    second = incarnations.start_next(job, first, "constructor", "n2", "requeued", False, key="7.1")
    assert first == second == 1
    assert incarnations.start_next(job, 1, "constructor", "n1", "requeued", False, key="7.2") == 2


def test_an_endpoint_says_which_incarnation_published_it(
    job: JobDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    job.publish("planner", "tcp://n1:5000")
    assert job.read_endpoint("planner") == ("tcp://n1:5000", 0)
    monkeypatch.setenv("MSD_INCARNATION", "1")
    with pytest.raises(Exception, match="no planner endpoint"):
        job.wait_published("planner", timeout_s=0.2)  # a stopped Planner's address
    job.publish("planner", "tcp://n2:6000")
    assert job.wait_endpoint("planner", timeout_s=1) == "tcp://n2:6000"
    monkeypatch.delenv("MSD_INCARNATION")
    assert job.wait_published("planner", timeout_s=1) == ("tcp://n2:6000", 1)
