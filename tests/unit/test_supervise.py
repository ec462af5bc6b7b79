"""A SLURM supervisor starts its data role only once the Planner of the role's incarnation has
published its endpoint: a requeued Planner job may pend for minutes while the rest runs on."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import yaml

from msd.jobdir import JobDir
from msd.launch import incarnations
from msd.launch.supervise import Supervisor
from msd.recipe.load import load_recipe
from msd.recipe.schema import to_json
from tests.conftest import base_recipe

QUICK_ROLE = [sys.executable, "-c", "pass"]  # a role that exits 0 at once


def job_folder(tmp_path: Path) -> JobDir:
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(base_recipe(tmp_path, steps=10)))
    job = JobDir(tmp_path / "job")
    job.create()
    job.recipe_json.write_bytes(to_json(load_recipe(tmp_path / "r.yaml")))
    return job


def publish_planner(job: JobDir, incarnation: int) -> None:
    job.endpoint_file("planner").write_text(f"tcp://n1:5555\n{incarnation}\n")


def test_a_role_waits_for_the_planner_of_its_incarnation(tmp_path: Path) -> None:
    job = job_folder(tmp_path)
    publish_planner(job, 0)  # the Planner before its job was requeued
    incarnations.start_next(job, 0, "planner", "planner", "requeued by SLURM", False)
    supervisor = Supervisor(job, "loader", "web/0", QUICK_ROLE)
    result: list[int | None] = []
    thread = threading.Thread(target=lambda: result.append(supervisor._run_role()))
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive() and supervisor.child is None  # not started: no Planner of 1 yet
    publish_planner(job, 1)
    thread.join(timeout=10)
    assert result == [0]  # started once it was published; the role exited 0


def test_a_supervisor_stopped_while_waiting_starts_nothing(tmp_path: Path) -> None:
    job = job_folder(tmp_path)
    supervisor = Supervisor(job, "constructor", "n1", QUICK_ROLE)
    result: list[int | None] = []
    thread = threading.Thread(target=lambda: result.append(supervisor._run_role()))
    thread.start()
    time.sleep(0.3)
    supervisor.stopping = True  # scancel's SIGTERM
    thread.join(timeout=10)
    assert result == [0] and supervisor.child is None


def test_the_planner_itself_does_not_wait(tmp_path: Path) -> None:
    job = job_folder(tmp_path)
    supervisor = Supervisor(job, "planner", "planner", QUICK_ROLE)
    assert supervisor._run_role() == 0
