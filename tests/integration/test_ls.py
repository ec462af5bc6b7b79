"""`msd ls` on real local jobs: a finished, a failed, a stopped (`msd stop`) and a lost job (its
launcher killed with kill -9), each with its state and the last step every rank consumed; and a
running job, told from a lost one, then stopped with Ctrl-C.

The jobs run at once, one loader per source: `msd ls` reads job folders and launchers, not
loaders, and each loader fewer is a process fewer to start per job."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import yaml

from msd.roles.common import ORPHAN_EXIT_S
from tests.conftest import (
    assert_launch_ok,
    base_recipe,
    processes_of_launcher,
    run_msd,
    start_launch,
    wait_for_file,
)

# Time for a role to be scheduled and run its SIGTERM handler on a busy machine.
SCHEDULING_S = 30


def listed(cwd: Path) -> dict[str, dict[str, Any]]:
    """`msd ls --json` of cwd's runs, by the recipe name each job folder starts with."""
    result = run_msd("ls", "--json", cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return {r["name"].split("-")[0]: r for r in json.loads(result.stdout)}


def write(cwd: Path, name: str, doc: dict[str, Any]) -> str:
    (cwd / f"{name}.yaml").write_text(yaml.safe_dump({**doc, "name": name}, sort_keys=False))
    return f"{name}.yaml"


def recipe(data: Path, **overrides: Any) -> dict[str, Any]:
    doc = base_recipe(data, **overrides)
    for s in doc["sources"]:
        s["loaders"] = 1
    return doc


def long_recipe(data: Path) -> dict[str, Any]:
    doc = recipe(data, steps=100_000, checkpoint={"every_steps": 10})
    for s in doc["sources"]:
        s["repeat"] = True
    doc["trainer"]["demo"]["step_ms"] = 20
    return doc


def logged_steps(cwd: Path, name: str) -> int:
    """How many steps rank 0 of job ``name`` logged."""
    (log,) = cwd.glob(f"runs/{name}-*/trainer/rank-0.jsonl")
    return len(log.read_text().splitlines())


def wait_until_gone(launcher_pid: int) -> None:
    """Until no process of the launcher lives: each ends within ``ORPHAN_EXIT_S`` of its death
    (the kernel's timer), once it ran its SIGTERM handler (``SCHEDULING_S`` on a busy machine)."""
    deadline = time.monotonic() + ORPHAN_EXIT_S + SCHEDULING_S
    while processes_of_launcher(launcher_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of_launcher(launcher_pid) == []


def test_ls_shows_each_jobs_honest_state_and_last_consumed_step(
    small_data: Path, tmp_path: Path
) -> None:
    finished = recipe(small_data, steps=37, checkpoint={"every_steps": 10})
    for source in finished["sources"]:
        source["repeat"] = True  # the run ends at its steps, not when the data does
    failing = recipe(small_data, steps=20)
    failing["trainer"] = {"command": "python -c 'import sys; sys.exit(3)'"}
    # The five jobs start at once (each its own name, so its own folder).
    launched = {
        name: start_launch(tmp_path, write(tmp_path, name, doc))
        for name, doc in (
            ("finished", finished),
            ("failing", failing),
            ("stopped", long_recipe(small_data)),
            ("killed", long_recipe(small_data)),
            ("live", long_recipe(small_data)),
        )
    }
    try:
        for name in ("stopped", "killed", "live"):
            wait_for_file(tmp_path, f"runs/{name}-*/trainer/rank-0.jsonl", launched[name], lines=5)
        running = listed(tmp_path)  # running, not lost: their launchers live
        assert {name: running[name]["state"] for name in ("stopped", "killed", "live")} == {
            "stopped": "running",
            "killed": "running",
            "live": "running",
        }
        proc = launched["live"]
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.communicate(timeout=30)

        proc = launched["stopped"]
        wait_for_file(tmp_path, "runs/stopped-*/trainer/rank-0.jsonl", proc, lines=15)
        (job,) = tmp_path.glob("runs/stopped-*")
        stopped = run_msd("stop", str(job), cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        proc.communicate(timeout=60)
        stopped_at = logged_steps(tmp_path, "stopped")

        proc = launched["finished"]
        out, err = proc.communicate(timeout=180)
        assert_launch_ok(proc, out, err)

        proc = launched["failing"]
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 1, err

        # the last, so that nothing else is starting or stopping while its processes die
        proc = launched["killed"]
        wait_for_file(tmp_path, "runs/killed-*/trainer/rank-0.jsonl", proc, lines=15)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        wait_until_gone(proc.pid)  # every child dies with its launcher
        killed_at = logged_steps(tmp_path, "killed")
    finally:  # a failed step leaves none running (their children die with them)
        for proc in launched.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    jobs = listed(tmp_path)
    assert {name: r["state"] for name, r in jobs.items()} == {
        "finished": "done",
        "failing": "failed",
        "stopped": "stopped",
        "killed": "lost",
        "live": "stopped",
    }
    assert jobs["finished"]["step"] == 37  # every step, not the last metrics line's
    assert jobs["failing"]["step"] in (None, 0)
    # Every rank consumed the steps before the one rank 0 logged last (ranks run a step or
    # so apart, and each logs a step once it received it).
    for name, at in (("stopped", stopped_at), ("killed", killed_at)):
        assert at - 3 <= jobs[name]["step"] <= at, (name, jobs[name], at)
