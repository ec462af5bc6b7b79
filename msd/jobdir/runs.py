"""``msd ls``: the job folders of a run folder, what state each is in and how far it got.

Read from the files alone (``job.json``, the tails of ``metrics.jsonl`` and of the checkpoint
log), so listing never connects to a Planner. The state is ``job.json``'s (``starting``,
``running``, ``done``, ``failed``, ``stopped``) unless the job cannot be running any more: a job
recorded as running whose launcher process is gone (kill -9, the machine rebooted) is ``lost``.
The step is the last step every rank consumed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from msd.checkpoint.format import decode_delta
from msd.errors import LaunchError

UNREADABLE = "unreadable"  # job.json exists but is not a JSON object
LOST = "lost"  # marked running, but its launcher is gone: nothing will finish it
_LIVE_STATES = ("starting", "running")
_PID_REUSE_SLACK_S = 2.0  # a process at the launcher's pid started later is another one
_LOG = re.compile(r"^log-(\d+)\.jsonl$")
_SNAPSHOT = re.compile(r"^step-(\d+)\.json$")
_TAIL_BYTES = 64 * 1024  # enough for the last metrics line, however long the run
# NAME-YYYYmmdd-HHMMSS[-n], stamped in UTC (msd.launch.jobfolder.new_job_dir)
_STAMP = re.compile(r"-(\d{8}-\d{6})(?:-(\d+))?$")


@dataclass(frozen=True)
class RunInfo:
    name: str
    path: Path
    cluster: str
    state: str
    age_s: float
    step: int | None  # the last step every rank consumed; None before the first
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
        state=_state_of(folder, info),
        age_s=max(0.0, now - started),
        step=consumed_step(folder),
        started=started,
    )


def _state_of(folder: Path, info: Mapping[str, Any] | None) -> str:
    return job_state(info, lambda pid: launcher_alive(pid, _stamp(folder)), slurm_jobs_live)


def is_live(folder: Path) -> bool:
    """Whether the job in ``folder`` is starting or running (its launcher still alive)."""
    return _state_of(folder, _read_job(folder / "job.json")) in _LIVE_STATES


def consumed_step(folder: Path) -> int | None:
    """The last step every rank of the job consumed: the later of the metrics' last line
    (written once a second and when the job stops) and the checkpoint log's last line."""
    steps = [s for s in (last_step(folder / "metrics.jsonl"), logged_step(folder)) if s is not None]
    return max(steps, default=None)


def logged_step(folder: Path) -> int | None:
    """The step the job's checkpoints reach: the newest log's last good line, else the step of
    that log's snapshot; None without checkpoints."""
    try:
        names = os.listdir(folder / "checkpoints")
    except OSError:
        return None
    found = [int(m[1]) for n in names if (m := _LOG.match(n) or _SNAPSHOT.match(n))]
    if not found:
        return None
    newest = max(found)
    for line in reversed(_tail(folder / "checkpoints" / f"log-{newest:08d}.jsonl").splitlines()):
        delta = decode_delta(line)
        if delta is not None:
            return max(newest, delta.step)
    return newest


def _tail(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            return f.read()
    except OSError:
        return b""


def _started(folder: Path) -> float:
    """When the job started: the stamp in its name, else the folder's ctime."""
    stamp = _stamp(folder)
    return stamp if stamp is not None else folder.stat().st_ctime


def _stamp(folder: Path) -> float | None:
    """The UTC time stamped in the folder's name (unix seconds), if it has one."""
    match = _STAMP.search(folder.name)
    try:
        if match is not None:
            stamp = datetime.strptime(match[1], "%Y%m%d-%H%M%S")
            return stamp.replace(tzinfo=timezone.utc).timestamp()
    except ValueError:  # digits that are no date, e.g. month 13
        pass
    return None


def _read_job(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def job_state(
    info: Mapping[str, Any] | None,
    alive: Callable[[int], bool],
    slurm_live: Callable[[list[str]], bool | None] = lambda ids: None,
) -> str:
    """The state to show: job.json's, or ``lost`` for a job recorded as running that nothing
    runs any more: its launcher is gone and, on SLURM, none of its jobs is queued or running
    (``slurm_live``: None when that cannot be asked). A launcher recorded on another machine
    cannot be checked from here: its state is kept."""
    if info is None:
        return UNREADABLE
    state = str(info.get("state", "-"))
    pid = info.get("launcher_pid")
    host = info.get("launcher_host")
    here = host is None or host == socket.gethostname()
    if state not in _LIVE_STATES or not here or not isinstance(pid, int) or pid <= 0:
        return state
    if alive(pid):
        return state
    if info.get("cluster") == "slurm":
        ids = [str(i) for i in dict(info.get("slurm_jobs") or {}).values()]
        return state if ids and slurm_live(ids) else LOST
    return LOST


def slurm_jobs_live(ids: list[str]) -> bool | None:
    """Whether any of these SLURM jobs is pending or running; None without ``squeue``."""
    try:
        done = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(done.stdout.split()) if done.returncode == 0 else None


def launcher_alive(pid: int, started: float | None) -> bool:
    """Whether the launcher ``pid`` still runs: a process with that pid exists and, when the
    job's start is known, started before it (not a later process given the same pid)."""
    if not pid_alive(pid):
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # dead, not reaped yet
            return False
        return started is None or process.create_time() <= started + _PID_REUSE_SLACK_S
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


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
