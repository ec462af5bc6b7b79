"""``msd status`` as data: the job's view from its Planner, plus what only the job folder and
SLURM know (folder, cluster, SLURM job states). The ``--json`` shape is documented in
docs/status.md and versioned by ``StatusView.version``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgspec

from msd.control.planner_connection import request
from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.wire.protocol import Status, StatusRequest
from msd.wire.views import StatusView


def resolve_job(job: Path | None, runs: Path) -> JobDir:
    """The job folder given, or the newest one in ``runs``."""
    if job is not None:
        folder = JobDir(job)
        if not folder.job_json.exists():
            raise LaunchError(f"{job} is not an msd job folder (no job.json)")
        return folder
    candidates = sorted(
        (p for p in runs.glob("*/job.json")), key=lambda p: p.stat().st_mtime, reverse=True
    )
    if not candidates:
        raise LaunchError(f"no job folders in {runs}; pass the job folder, or --runs DIR")
    return JobDir(candidates[0].parent)


def fetch_view(job: JobDir, timeout_s: float = 5.0) -> StatusView:
    """The Planner's current view of the job (authenticated with the job's key)."""
    info = job.read_json(job.job_json)
    try:
        status: Status = request(job, StatusRequest(), Status, timeout_s)
    except LaunchError as exc:
        state = info.get("state", "unknown")
        if state not in ("starting", "running"):
            raise LaunchError(
                f"{job.root.name} is not running (state: {state}); "
                f"`msd report {job.root}` plots its history"
            ) from None
        raise exc
    if status.view is None:
        raise LaunchError("the planner sent no view; is it an older msd?")
    return status.view


def status_json(job: JobDir, view: StatusView) -> dict[str, Any]:
    """The ``--json`` document: the view, with the folder, cluster and SLURM job states."""
    info = job.read_json(job.job_json)
    data: dict[str, Any] = msgspec.to_builtins(view)
    data["folder"] = str(job.root)
    data["name"] = info.get("name", job.root.name)
    data["cluster"] = info.get("cluster", "local")
    data["slurm"] = slurm_states(job) if data["cluster"] == "slurm" else []
    return data


def slurm_states(job: JobDir) -> list[dict[str, str]]:
    """Each SLURM job of the run with its state (empty if squeue cannot be asked)."""
    from msd.control.squeue import squeue_states

    jobs = job.read_json(job.job_json).get("slurm_jobs", {})
    states: dict[str, str] = {}
    with contextlib.suppress(Exception):
        states = squeue_states([str(i) for i in jobs.values()])
    return [
        {"role": name, "job_id": str(i), "state": states.get(str(i), "UNKNOWN")}
        for name, i in jobs.items()
    ]
