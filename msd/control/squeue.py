"""What SLURM says about a run's jobs, and cancelling them: ``squeue``, ``scontrol``, ``scancel``.

Low enough for every layer: the launcher watches and cancels with it, ``msd status`` shows the
states, ``msd stop`` cancels.
"""

from __future__ import annotations

import subprocess
import time

from msd.jobdir import JobDir


def squeue_states(ids: list[str]) -> dict[str, str]:
    """Live state of each job (``squeue -t all`` knows finished jobs for a while)."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i %T"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    states: dict[str, str] = {}
    for line in out.splitlines():
        job_id, _, state = line.strip().partition(" ")
        states.setdefault(job_id.split("_")[0], state)
    return states


def restart_count(job_id: str) -> int:
    """How many times SLURM has requeued the job (``scontrol show job``'s ``Restarts``)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=False
    ).stdout
    for field in out.split():
        if field.startswith("Restarts="):
            return int(field.partition("=")[2])
    return 0


def cancel_jobs(ids: list[str], timeout_s: float = 30.0) -> None:
    """scancel, then wait until the jobs have left the queue (roles exit on SIGTERM at once)."""
    if not ids:
        return
    subprocess.run(["scancel", *ids], capture_output=True, check=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _queued(ids):
            return
        time.sleep(0.2)


def _queued(ids: list[str]) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-j", ",".join(ids), "-o", "%i"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return bool(out.strip())


def job_ids(job: JobDir) -> list[str]:
    """The SLURM job ids a run's ``job.json`` lists."""
    return [str(v) for v in job.read_json(job.job_json).get("slurm_jobs", {}).values()]
