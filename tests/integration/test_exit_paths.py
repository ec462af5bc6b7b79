"""How `msd launch` ends when it is interrupted, killed, or one of its roles raises.

Each test runs the real CLI as a subprocess (cwd=tmp_path) and checks that it exits the way the
user expects and that no process it started is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import base_recipe, processes_of_launcher, restore_sigint

STARTUP_S = 60.0  # generous: four torch imports on a loaded 2-core machine


def _long_recipe(data: Path) -> dict[str, Any]:
    """Repeating sources and many steps: the job runs until something stops it."""
    recipe = base_recipe(data, steps=100000)
    for s in recipe["sources"]:
        s["repeat"] = True
    recipe["trainer"]["demo"]["step_ms"] = 20
    return recipe


def _expected_children(recipe: dict[str, Any]) -> int:
    """Planner + one Constructor + every loader + every trainer rank."""
    return 2 + sum(s["loaders"] for s in recipe["sources"]) + recipe["distribute"]["dp"]


@contextmanager
def launch(
    tmp_path: Path, recipe: dict[str, Any], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """`python -m msd.cli launch recipe.yaml` in tmp_path; whatever happens, nothing is left."""
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "msd.cli", "launch", "recipe.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=restore_sigint,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        for child in processes_of_launcher(proc.pid):
            with suppress(psutil.NoSuchProcess):
                child.kill()


def _wait_for_steps(tmp_path: Path, proc: subprocess.Popen[str], lines: int) -> None:
    """Poll until rank 0 of the (single) job has logged ``lines`` steps."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"launcher ended early: {proc.communicate()}"
        logs = list(tmp_path.glob("runs/*/trainer/rank-0.jsonl"))
        if logs and len(logs[0].read_text().splitlines()) >= lines:
            return
        time.sleep(0.05)
    pytest.fail(f"rank 0 did not log {lines} steps in {STARTUP_S:.0f} s")


def _wait_until_gone(launcher_pid: int, timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_of_launcher(launcher_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() not in (
            psutil.STATUS_ZOMBIE,
            psutil.STATUS_DEAD,
        )
    except psutil.NoSuchProcess:
        return False


def _wait_until_dead(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Processes that are still alive (not exited, not a zombie) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in procs if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _describe(procs: list[psutil.Process]) -> list[str]:
    described = []
    for p in procs:
        try:
            described.append(f"{p.pid}: {' '.join(p.cmdline())}")
        except psutil.Error:
            described.append(str(p.pid))
    return described


def test_ctrl_c_stops_every_process_and_says_so(small_data, tmp_path):
    recipe = _long_recipe(small_data)
    with launch(tmp_path, recipe) as proc:
        _wait_for_steps(tmp_path, proc, 3)
        children = processes_of_launcher(proc.pid)
        assert len(children) == _expected_children(recipe)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
        left = _wait_until_gone(proc.pid, 5.0)
        alive = _wait_until_dead(children, 5.0)
    output = out + err
    assert proc.returncode == 130, output
    assert took < 10
    assert "Traceback" not in output
    assert "interrupted (Ctrl-C)" in err
    assert left == [], _describe(left)
    assert alive == [], _describe(alive)
    job_json = json.loads(next(tmp_path.glob("runs/*/job.json")).read_text())
    assert job_json["state"] == "stopped"


def test_killing_the_launcher_takes_every_child_with_it(small_data, tmp_path):
    recipe = _long_recipe(small_data)
    with launch(tmp_path, recipe) as proc:
        _wait_for_steps(tmp_path, proc, 3)
        children = processes_of_launcher(proc.pid)
        assert len(children) == _expected_children(recipe)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
        left = _wait_until_gone(proc.pid, 5.0)
        assert left == [], _describe(left)
        alive = _wait_until_dead(children, 5.0)
        assert alive == [], _describe(alive)
    assert proc.returncode == -signal.SIGKILL


POISONED_MODULE = '''
def tokenize(text):
    """Bytes as ids, but a row longer than 60 characters is "corrupt"."""
    if len(text) > 60:
        raise ValueError(f"poisoned row of {len(text)} characters")
    return list(text.encode())
'''


def test_a_role_that_raises_stops_the_job_with_its_name(small_data, tmp_path):
    (tmp_path / "poisoned_transform.py").write_text(POISONED_MODULE)
    recipe = base_recipe(small_data, steps=50)
    web = recipe["sources"][0]
    web["transform"] = {"kind": "function", "function": "poisoned_transform:tokenize"}
    web["loaders"] = 1  # a single reader of web rows, so exactly one loader can fail
    pythonpath = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    with launch(tmp_path, recipe, env={"PYTHONPATH": pythonpath}) as proc:
        out, err = proc.communicate(timeout=60)
        left = _wait_until_gone(proc.pid, 5.0)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err, "the CLI prints one line; tracebacks go to the log"
    error_lines = [line for line in err.splitlines() if line.strip()]
    assert len(error_lines) == 1, err
    (job,) = tmp_path.glob("runs/*")
    log = job.resolve() / "logs" / "loader-web-0.log"
    assert error_lines[0].startswith("error: loader web/0 (pid ")
    assert "exited with code 1" in error_lines[0]
    assert "it reported: loader web/0: transform.function" in error_lines[0]
    assert f"Log: {log}" in error_lines[0]
    text = log.read_text()
    assert "ValueError: poisoned row of" in text
    assert "transform.function 'poisoned_transform:tokenize' failed on a cell" in text
    assert left == [], _describe(left)
