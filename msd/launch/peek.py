"""One step's batch of one data-parallel rank, for ``msd peek``.

msd has no way to build a step's batch without its roles: the stream comes from the Planner,
the loaders and a Constructor together. So a recipe is peeked by running its data plane here,
without trainers, for just the steps needed, in a folder of the caller's choosing: every rank
is read up to the step (the Planner plans only a few steps past what every rank consumed), the
wanted batch is kept, and every process is stopped. A running job is never asked for batches:
a request for a rank's step takes that step's answer from the rank's own trainer, and one for a
step it consumed makes the data plane rewind. What a job's demo trainer saved
(``trainer.demo.save_batches``) is read instead.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from msd.client.numpy import NumpyClient
from msd.errors import LaunchError, MsdError
from msd.jobdir import JobDir
from msd.launch.job import logged_error
from msd.launch.local import LocalJob
from msd.plan.spec import topology_of
from msd.plan.topology import Coords
from msd.recipe.schema import Recipe

Batch = dict[str, np.ndarray]


def dp_ranks(recipe: Recipe, dp: int) -> list[int]:
    """The trainer ranks whose tensors together are DP rank ``dp``'s whole batch: its first
    pipeline stage (inputs, images) and its last (labels), of TP and CP rank 0."""
    d = recipe.distribute
    if not 0 <= dp < d.dp:
        raise LaunchError(f"--rank {dp} is not a data-parallel rank: the recipe has dp {d.dp}")
    if d.cp > 1:
        raise LaunchError(
            f"the recipe splits every sequence over cp {d.cp} ranks; msd peek shows whole rows"
        )
    topology = topology_of(recipe)
    stages = sorted({0, d.pp - 1})
    return [topology.rank(Coords(dp=dp, pp=pp, cp=0, tp=0)) for pp in stages]


def merged(batches: list[Batch]) -> Batch:
    """The tensors of several ranks of one DP rank as one batch (they share the metadata)."""
    out: Batch = {}
    for batch in batches:
        out.update(batch)
    return out


def peek_recipe(
    recipe: Recipe, recipe_text: str, step: int, dp: int, run_root: Path, timeout_s: float = 300
) -> Batch:
    """DP rank ``dp``'s batch of step ``step``, from this recipe's data plane run here (job
    folder under ``run_root``) for steps 0 … ``step``, then stopped."""
    if step < 0:
        raise LaunchError(f"--step {step} is negative")
    if recipe.steps is not None and step >= recipe.steps:
        raise LaunchError(f"--step {step} is past the recipe's last step, {recipe.steps - 1}")
    wanted = dp_ranks(recipe, dp)
    job = LocalJob(_data_plane_only(recipe, step + 1), recipe_text, run_root)
    job.start()
    try:
        return merged(_read_up_to(job, recipe.world_size, step, wanted, timeout_s))
    finally:
        job.shut_down()


def _data_plane_only(recipe: Recipe, steps: int) -> Recipe:
    """The recipe without trainers, for ``steps`` steps, one loader a source where it says
    ``auto`` (how many loaders read a source never changes its stream), and no metrics
    endpoint (a fixed port may be the running job's)."""
    sources = tuple(
        msgspec.structs.replace(s, loaders=1) if s.loaders == "auto" else s for s in recipe.sources
    )
    metrics = msgspec.structs.replace(recipe.metrics, port=None)
    return msgspec.structs.replace(
        recipe, trainer=None, steps=steps, sources=sources, metrics=metrics
    )


def _read_up_to(
    job: LocalJob, world_size: int, step: int, wanted: list[int], timeout_s: float
) -> list[Batch]:
    root = job.job.root
    clients = [
        NumpyClient(job=root, rank=r, world_size=world_size, local_rank=r, timeout_s=timeout_s)
        for r in range(world_size)
    ]
    kept: list[Batch] = []
    try:
        for s in range(step + 1):
            for rank, client in enumerate(clients):
                batch = _next(job, client)
                if batch is None:
                    raise LaunchError(f"the recipe's stream ends before step {step}, at step {s}")
                if s == step and rank in wanted:
                    kept.append(batch)
    finally:
        for client in clients:
            client.close()
    return kept


def _next(job: LocalJob, client: NumpyClient) -> Batch | None:
    try:
        return client.next_batch()
    except MsdError as exc:
        raise LaunchError(_why_failed(job) or str(exc)) from None


def _why_failed(job: LocalJob) -> str | None:
    """A sentence on the first role that exited, with what its log says, or None."""
    for child in job.children:
        if child.popen.poll() is not None:
            said = logged_error(child.log)
            return f"{child.label} stopped ({child.describe_exit()}){': ' + said if said else ''}"
    return None


def peek_job(root: Path, step: int, dp: int) -> Batch:
    """DP rank ``dp``'s batch of step ``step`` as the job's demo trainer saved it."""
    job = JobDir(root)
    recipe = job.recipe()
    files = [job.trainer / f"rank-{r}" / f"step-{step}.npz" for r in dp_ranks(recipe, dp)]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise LaunchError(
            f"{missing[0]} does not exist: a running job's batches are read only from what its "
            "demo trainer saves (trainer.demo.save_batches), since asking its data plane would "
            f"take them from its trainers; peek its recipe instead (msd peek {root}/recipe.yaml)"
        )
    batches = []
    for path in files:
        with np.load(path, allow_pickle=False) as saved:
            batches.append({name: saved[name] for name in saved.files})
    return merged(batches)
