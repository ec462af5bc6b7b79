from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from msd.control.planner_connection import request
from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.wire.protocol import CheckpointTaken, TakeCheckpoint

from .common import console, user_errors


@user_errors
def checkpoint(
    job: Annotated[Path, typer.Argument(help="The job folder.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Snapshot a running job's data plane at the step every rank has consumed."""
    folder = JobDir(job)
    if not folder.job_json.exists():
        raise LaunchError(f"{job} is not an msd job folder (no job.json)")
    reply: CheckpointTaken = request(folder, TakeCheckpoint(), CheckpointTaken, timeout_s=30.0)
    if json_out:
        print(json.dumps({"step": reply.step, "path": reply.path, "bytes": reply.bytes}))
        return
    console.print(
        f"checkpoint of step {reply.step}: {reply.path} ({reply.bytes:,} bytes, "
        f"{reply.seconds * 1000:.1f} ms); continue with: msd restore {reply.path}",
        highlight=False,
    )
