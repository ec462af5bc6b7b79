from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.launch.slurm_task import supervise

from .common import user_errors


def _ranks_of_this_node(world_size: int) -> str:
    """Ranks of this node when the job spreads ``world_size`` ranks evenly over its nodes."""
    try:
        nodes = int(os.environ["SLURM_JOB_NUM_NODES"])
        node = int(os.environ["SLURM_NODEID"])
    except (KeyError, ValueError):
        raise LaunchError(
            "not inside a SLURM job (no SLURM_JOB_NUM_NODES / SLURM_NODEID); pass --ranks"
        ) from None
    per_node = world_size // nodes
    return ",".join(str(node * per_node + r) for r in range(per_node))


@user_errors
def sidecar(
    job: Annotated[Path, typer.Argument(help="The job folder (MSD_JOB).")],
    ranks: Annotated[
        str | None,
        typer.Option(help="Global ranks this node runs, e.g. 0,1 (default: from SLURM)."),
    ] = None,
) -> None:
    """Run this node's Data Constructor for trainers you launch yourself (one per node).

    In an sbatch script, one per node:
    srun -N "$SLURM_JOB_NUM_NODES" -n "$SLURM_JOB_NUM_NODES" --overlap msd sidecar "$MSD_JOB" &
    """
    folder = JobDir(job)
    served = ranks or _ranks_of_this_node(folder.recipe().world_size)
    node = os.environ.get("SLURMD_NODENAME") or os.environ.get("MSD_NODE") or "local"
    supervise("constructor", str(folder.root), node, "--node", node, "--ranks", served)
