"""Shared fixtures: tiny Parquet sources made in tmp_path and recipes that point at them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from msd.synth import SynthSource, synth

SMALL_SOURCES = (
    SynthSource("web", median_tokens=40, sigma=0.8, max_tokens=700, num_samples=500),
    SynthSource("code", median_tokens=120, sigma=0.8, max_tokens=700, num_samples=300),
    SynthSource("books", median_tokens=300, sigma=0.6, max_tokens=700, num_samples=150),
)


@pytest.fixture(scope="session")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    synth(root, SMALL_SOURCES, seed=5, files_per_source=2, rows_per_row_group=32)
    return root


def base_recipe(data: Path, **overrides: Any) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "name": "t",
        "seed": 11,
        "seq_len": 512,
        "global_batch_tokens": 4096,
        "distribute": {"dp": 4},
        "sources": [
            {
                "name": s.name,
                "path": str(data / s.name / "*.parquet"),
                "text_column": "text",
                "weight": w,
                "repeat": False,
                "loaders": 2,
            }
            for s, w in zip(SMALL_SOURCES, (0.5, 0.3, 0.2), strict=True)
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }
    recipe.update(overrides)
    return recipe


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(recipe: dict[str, Any], name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    return write


def read_rank_logs(job_root: Path) -> dict[int, list[dict[str, Any]]]:
    logs = {}
    for path in sorted((job_root / "trainer").glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        logs[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return logs


def processes_of_launcher(launcher_pid: int) -> list[psutil.Process]:
    """Every live process started by the launcher with that pid (they carry it in their env)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("MSD_LAUNCHER_PID") == str(
                launcher_pid
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def run_msd(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`msd ARGS` as a user runs it, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "msd.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def restore_sigint() -> None:
    """For ``preexec_fn``: a shell without job control starts background commands with SIGINT
    ignored, and Python keeps it ignored; a user's terminal delivers Ctrl-C with the default
    action. Tests that send SIGINT start their commands this way."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_launch(cwd: Path, recipe_file: str) -> subprocess.Popen[str]:
    """`msd launch RECIPE` in the background, its output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "msd.cli", "launch", recipe_file],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_file(
    cwd: Path, pattern: str, launcher: subprocess.Popen[str], lines: int = 0, timeout_s: float = 120
) -> Path:
    """The first file matching ``pattern`` under ``cwd`` once it has ``lines`` lines, while the
    launcher still runs; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        found = sorted(cwd.glob(pattern))
        if found and len(found[0].read_text().splitlines()) >= lines:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"{pattern} did not appear (launcher exit code {launcher.poll()})")
