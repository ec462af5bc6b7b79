from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from msd.control.squeue import cancel_jobs, job_ids
from msd.errors import LaunchError
from msd.jobdir import JobDir

from .common import console, user_errors


@user_errors
def stop(
    job: Annotated[Path, typer.Argument(help="The job folder (runs/NAME-DATE-TIME).")],
) -> None:
    """Stop a running job: every SLURM job of the run, or the local launcher and its processes."""
    folder = JobDir(job)
    if not folder.job_json.exists():
        raise LaunchError(f"{job} is not an msd job folder (no job.json)")
    info = folder.read_json(folder.job_json)
    if info.get("cluster") == "slurm":
        ids = job_ids(folder)
        cancel_jobs(ids)
        console.print(f"cancelled SLURM jobs {', '.join(ids) or '(none)'}")
        return
    try:
        os.kill(int(info["launcher_pid"]), signal.SIGINT)  # the launcher stops its children
    except ProcessLookupError:
        console.print("the job's launcher is not running; nothing to stop")
        return
    console.print(f"asked the launcher (pid {info['launcher_pid']}) to stop the job")
