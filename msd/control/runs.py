"""``msd ls``: the job folders of a run folder, what state each is in and how far it got.

Read from the files alone (``job.json``, the tail of ``metrics.jsonl``), so listing never
connects to a Planner. A local job whose ``job.json`` still says it runs but whose launcher
process is gone (killed, machine rebooted) is shown as ``dead``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from msd.errors import LaunchError

UNREADABLE = "unreadable"  # job.json exists but is not a JSON object
DEAD = "dead"  # a local job marked running whose launcher is gone
_LIVE_STATES = ("starting", "running")
_TAIL_BYTES = 64 * 1024  # enough for the last metrics line, however long the run
# NAME-YYYYmmdd-HHMMSS[-n], stamped in UTC (msd.launch.local.new_job_dir)
_STAMP = re.compile(r"-(\d{8}-\d{6})(?:-(\d+))?$")


@dataclass(frozen=True)
class RunInfo:
    name: str
    path: Path
    cluster: str
    state: str
    age_s: float
    step: int | None  # the last step in metrics.jsonl; None before the first line
    started: float  # unix seconds: the stamp in the folder's name, else the folder's ctime

    def as_json(self) -> dict[str, Any]:
        """The object ``msd ls --json`` prints for this run."""
        return {
            "name": self.name,
            "path": str(self.path),
            "cluster": self.cluster,
            "state": self.state,
            "age_s": round(self.age_s, 3),
            "step": self.step,
        }


def list_runs(root: Path, now: float) -> list[RunInfo]:
    """Every job folder directly under ``root`` (those holding a job.json), newest first."""
    if not root.is_dir():
        raise LaunchError(f"{root} is not a folder; name the run folder with --runs")
    runs = [_run(folder, now) for folder in root.iterdir() if (folder / "job.json").is_file()]
    return sorted(runs, key=_newest_first, reverse=True)


def _newest_first(run: RunInfo) -> tuple[float, int, str]:
    match = _STAMP.search(run.name)
    return run.started, int(match[2] or 1) if match else 0, run.name  # -2 came after -1


def _run(folder: Path, now: float) -> RunInfo:
    started = _started(folder)
    info = _read_job(folder / "job.json")
    return RunInfo(
        name=folder.name,
        path=folder.resolve(),
        cluster=str(info.get("cluster", "-")) if info is not None else "-",
        state=job_state(info, pid_alive),
        age_s=max(0.0, now - started),
        step=last_step(folder / "metrics.jsonl"),
        started=started,
    )


def _started(folder: Path) -> float:
    """When the job started: the stamp in its name, else the folder's ctime."""
    match = _STAMP.search(folder.name)
    try:
        if match is not None:
            stamp = datetime.strptime(match[1], "%Y%m%d-%H%M%S")
            return stamp.replace(tzinfo=timezone.utc).timestamp()
    except ValueError:  # digits that are no date, e.g. month 13
        pass
    return folder.stat().st_ctime


def _read_job(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def job_state(info: Mapping[str, Any] | None, alive: Callable[[int], bool]) -> str:
    """The state to show: job.json's, or ``dead`` for a local job whose launcher is gone."""
    if info is None:
        return UNREADABLE
    state = str(info.get("state", "-"))
    pid = info.get("launcher_pid")
    local = info.get("cluster") == "local"
    if state in _LIVE_STATES and local and isinstance(pid, int) and pid > 0 and not alive(pid):
        return DEAD
    return state


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (signal 0 only checks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, but belongs to someone else
        return True
    return True


def last_step(metrics: Path) -> int | None:
    """The ``step`` of the last complete line of a metrics file; None if it has none."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # a line being written, or the cut first line of the tail
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def human_age(seconds: float) -> str:
    """``5s``, ``3m``, ``2h`` or ``4d``: the largest whole unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(max(seconds, 0))}s"
