"""What ``msd launch --cluster slurm`` submits: one pure function from a recipe to submissions.

    planner   one small CPU job
    loaders   one CPU job per loader process (they scale and fail separately)
    trainer   one job of ``trainer.nodes`` nodes; on each node ``tasks_per_node`` trainer
              ranks plus one more task: that node's Data Constructor, the ranks' sidecar

Kept pure (no submitit, no SLURM) so ``--dry-run`` and a snapshot test show exactly what goes
to sbatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msd.errors import LaunchError
from msd.plan.partition import Generation, loader_processes
from msd.recipe.schema import Recipe, SlurmRole, Trainer


@dataclass(frozen=True)
class Submission:
    role: str
    name: str
    parameters: dict[str, Any]
    task: tuple[str, ...]


def ranks_per_node(recipe: Recipe) -> int:
    trainer = recipe.trainer or Trainer()
    per_node = recipe.ranks_per_node
    if per_node * trainer.nodes != recipe.world_size:
        raise LaunchError(
            f"trainer: {trainer.nodes} nodes × {per_node} tasks per node is not the "
            f"{recipe.world_size} ranks of distribute; set trainer.nodes and tasks_per_node "
            "to match"
        )
    return per_node


def _common(recipe: Recipe, role: str, spec: SlurmRole) -> dict[str, Any]:
    slurm = recipe.slurm
    params: dict[str, Any] = {
        "name": f"msd-{recipe.name}-{role}",
        "timeout_min": slurm.time_min,
        "cpus_per_task": spec.cpus,
        "slurm_partition": spec.partition or slurm.partition,
        "slurm_account": slurm.account,
        "slurm_qos": slurm.qos,
        "slurm_constraint": slurm.constraint,
        "slurm_additional_parameters": dict(slurm.additional),
        "mem_gb": spec.mem_gb,
    }
    return {k: v for k, v in params.items() if v not in (None, {})}


def submissions(
    recipe: Recipe, rescales: Sequence[Generation] = (), shadows_used: Sequence[int] = ()
) -> list[Submission]:
    """Every job of the run; with ``rescales``, their loader jobs too (``msd rescale``), and a
    new shadow's for each shadow that took a loader's place (``shadows_used``)."""
    slurm = recipe.slurm
    subs = [
        Submission(
            "planner",
            "planner",
            {**_common(recipe, "planner", slurm.planner), "nodes": 1, "tasks_per_node": 1},
            ("planner",),
        )
    ]
    for process in loader_processes(recipe, rescales, shadows_used):
        params = {**_common(recipe, "loader", slurm.loader), "nodes": 1, "tasks_per_node": 1}
        task = ("loader", "--name", process.name)
        subs.append(Submission("loader", process.name, params, task))
    if recipe.trainer is None:
        return subs  # attached: the user's job runs the trainers and `msd sidecar` per node
    per_node = ranks_per_node(recipe)
    trainer = {
        **_common(recipe, "trainer", slurm.constructor),
        "nodes": recipe.trainer.nodes,
        "tasks_per_node": per_node + 1,
    }
    if recipe.trainer.gpus_per_node:
        trainer["gpus_per_node"] = recipe.trainer.gpus_per_node
    subs.append(Submission("trainer", "trainer", trainer, ("trainer", str(per_node))))
    return subs
