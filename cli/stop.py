from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from msd.control.squeue import cancel_jobs, job_ids
from msd.errors import LaunchError
from msd.jobdir import JobDir

from .common import console, user_errors

# what `msd stop --json` says happened: SLURM jobs cancelled, the local launcher asked to stop
# (it stops its children), or no launcher left to ask
CANCELLED, STOPPING, NOT_RUNNING = "cancelled", "stopping", "not_running"


@user_errors
def stop(
    job: Annotated[Path, typer.Argument(help="The job folder (runs/NAME-DATE-TIME).")],
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print {job, cluster, outcome, slurm_jobs, launcher_pid} as JSON "
            f"(outcome: {CANCELLED}, {STOPPING} or {NOT_RUNNING}).",
        ),
    ] = False,
) -> None:
    """Stop a running job: every SLURM job of the run, or the local launcher and its processes."""
    folder = JobDir(job)
    if not folder.job_json.exists():
        raise LaunchError(f"{job} is not an msd job folder (no job.json)")
    info = folder.read_json(folder.job_json)
    done: dict[str, Any] = {"job": str(folder.root), "cluster": info.get("cluster", "local")}
    if info.get("cluster") == "slurm":
        ids = job_ids(folder)
        cancel_jobs(ids)
        done |= {"outcome": CANCELLED, "slurm_jobs": ids, "launcher_pid": None}
        said = f"cancelled SLURM jobs {', '.join(ids) or '(none)'}"
    else:
        pid = int(info["launcher_pid"])
        done |= {"outcome": _interrupt(pid), "slurm_jobs": [], "launcher_pid": pid}
        said = (
            f"asked the launcher (pid {pid}) to stop the job"
            if done["outcome"] == STOPPING
            else "the job's launcher is not running; nothing to stop"
        )
    if json_out:
        print(json.dumps(done))
    else:
        console.print(said)


def _interrupt(launcher_pid: int) -> str:
    """Ctrl-C for the launcher, which stops its children."""
    try:
        os.kill(launcher_pid, signal.SIGINT)
    except ProcessLookupError:
        return NOT_RUNNING
    return STOPPING
