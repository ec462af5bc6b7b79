"""`msd ls` on real local jobs: a finished, a failed, a stopped (`msd stop`) and a lost job (its
launcher killed with kill -9), each with its state and the last step every rank consumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import (
    assert_launch_ok,
    base_recipe,
    processes_of_launcher,
    run_msd,
    start_launch,
    wait_for_file,
)


def listed(cwd: Path) -> dict[str, dict[str, Any]]:
    """`msd ls --json` of cwd's runs, by the recipe name each job folder starts with."""
    result = run_msd("ls", "--json", cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return {r["name"].split("-")[0]: r for r in json.loads(result.stdout)}


def write(cwd: Path, name: str, doc: dict[str, Any]) -> str:
    (cwd / f"{name}.yaml").write_text(yaml.safe_dump({**doc, "name": name}, sort_keys=False))
    return f"{name}.yaml"


def long_recipe(data: Path) -> dict[str, Any]:
    doc = base_recipe(data, steps=100_000, checkpoint={"every_steps": 10})
    for s in doc["sources"]:
        s["repeat"] = True
    doc["trainer"]["demo"]["step_ms"] = 20
    return doc


def logged_steps(cwd: Path, name: str) -> int:
    """How many steps rank 0 of job ``name`` logged."""
    (log,) = cwd.glob(f"runs/{name}-*/trainer/rank-0.jsonl")
    return len(log.read_text().splitlines())


def wait_until_gone(launcher_pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while processes_of_launcher(launcher_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of_launcher(launcher_pid) == []


def test_ls_shows_each_jobs_honest_state_and_last_consumed_step(
    small_data: Path, tmp_path: Path
) -> None:
    finished = base_recipe(small_data, steps=37, checkpoint={"every_steps": 10})
    for source in finished["sources"]:
        source["repeat"] = True  # the run ends at its steps, not when the data does
    proc = start_launch(tmp_path, write(tmp_path, "finished", finished))
    out, err = proc.communicate(timeout=180)
    assert_launch_ok(proc, out, err)

    failing = base_recipe(small_data, steps=20)
    failing["trainer"] = {"command": "python -c 'import sys; sys.exit(3)'"}
    proc = start_launch(tmp_path, write(tmp_path, "failing", failing))
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err

    proc = start_launch(tmp_path, write(tmp_path, "stopped", long_recipe(small_data)))
    wait_for_file(tmp_path, "runs/stopped-*/trainer/rank-0.jsonl", proc, lines=15)
    (job,) = tmp_path.glob("runs/stopped-*")
    stopped = run_msd("stop", str(job), cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    proc.communicate(timeout=60)
    stopped_at = logged_steps(tmp_path, "stopped")

    proc = start_launch(tmp_path, write(tmp_path, "killed", long_recipe(small_data)))
    wait_for_file(tmp_path, "runs/killed-*/trainer/rank-0.jsonl", proc, lines=15)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_until_gone(proc.pid)  # every child dies with its launcher
    killed_at = logged_steps(tmp_path, "killed")

    jobs = listed(tmp_path)
    assert {name: r["state"] for name, r in jobs.items()} == {
        "finished": "done",
        "failing": "failed",
        "stopped": "stopped",
        "killed": "lost",
    }
    assert jobs["finished"]["step"] == 37  # every step, not the last metrics line's
    assert jobs["failing"]["step"] in (None, 0)
    # Every rank consumed the steps before the one rank 0 logged last (ranks run a step or
    # so apart, and each logs a step once it received it).
    for name, at in (("stopped", stopped_at), ("killed", killed_at)):
        assert at - 3 <= jobs[name]["step"] <= at, (name, jobs[name], at)


def test_ls_tells_a_running_job_from_a_lost_one(small_data: Path, tmp_path: Path) -> None:
    proc = start_launch(tmp_path, write(tmp_path, "live", long_recipe(small_data)))
    try:
        wait_for_file(tmp_path, "runs/live-*/trainer/rank-0.jsonl", proc, lines=5)
        assert listed(tmp_path)["live"]["state"] == "running"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert listed(tmp_path)["live"]["state"] == "stopped"
