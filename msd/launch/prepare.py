"""What every launch does before its first process starts, whoever asks (``msd launch``,
``msd restore``, ``msd.launch``): choose where the job runs, open every source, decide the
loaders (``loaders: auto`` measured), gather the warnings, and make the job of that placement.

Nothing here prints: the CLI shows the sentences, the Python API logs or returns them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from msd.checkpoint.snapshot import Snapshot
from msd.errors import LaunchError
from msd.jobdir import atomic_write, full_message, is_full
from msd.launch.auto_loaders import AutoPlan, plan_loaders, prepared, resolve
from msd.launch.check import check_sources
from msd.launch.job import Job
from msd.launch.local import LocalJob
from msd.launch.long_sample_warnings import long_sample_warnings
from msd.launch.slurm import SlurmJob
from msd.plan.advice import listing, summary, too_many_loaders
from msd.plan.partition import loader_processes
from msd.plan.schedule import MixChange
from msd.recipe.schema import Recipe

CLUSTERS = ("local", "slurm")


@dataclass(frozen=True)
class Prepared:
    """A recipe ready to launch: its loaders decided, where it runs, and what to warn of."""

    recipe: Recipe
    cluster: str
    auto: AutoPlan | None  # the measured plan when some source has ``loaders: auto``
    warnings: tuple[str, ...]


def prepare_launch(
    recipe: Recipe, cluster: str | None, recipe_path: str | os.PathLike[str] | None = None
) -> Prepared:
    """Check ``recipe`` as ``msd launch`` does: `LaunchError`/`SourceError` on the first
    problem (with the file and line of the source when ``recipe_path`` is given)."""
    chosen = cluster_of(recipe, cluster)
    check_sources(recipe, recipe_path)
    recipe, auto = decide_loaders(recipe)
    return Prepared(recipe, chosen, auto, launch_warnings(recipe, chosen))


def cluster_of(recipe: Recipe, cluster: str | None) -> str:
    """Where the job runs: ``cluster`` when given, else the recipe's ``cluster``."""
    chosen = cluster or recipe.cluster
    if chosen not in CLUSTERS:
        raise LaunchError(f"--cluster must be local or slurm, got {chosen!r}")
    return chosen


def decide_loaders(recipe: Recipe) -> tuple[Recipe, AutoPlan | None]:
    """The recipe with unset ``loaders`` decided and ``loaders: auto`` replaced by measured
    counts, and the measured plan (None: no source asked for ``auto``)."""
    recipe = prepared(recipe)
    if not any(s.loaders == "auto" for s in recipe.sources):
        return recipe, None
    auto = plan_loaders(recipe)
    return resolve(recipe, auto), auto


def auto_loaders_line(recipe: Recipe, auto: AutoPlan) -> str:
    """The sentence that shows what ``loaders: auto`` decided."""
    shown = summary(recipe, loader_processes(recipe))
    return f"loaders (auto, {auto.cpus} CPUs): {shown} (each process: JOB/loaders.txt)"


def launch_warnings(recipe: Recipe, cluster: str) -> tuple[str, ...]:
    """Too many loader processes for the placement, and sources losing tokens to
    ``long_samples``: one sentence each."""
    many = too_many_loaders(len(loader_processes(recipe)), os.cpu_count() or 1, cluster)
    return (*([many] if many is not None else []), *long_sample_warnings(recipe))


def new_job(
    recipe: Recipe,
    recipe_text: str,
    run_root: Path,
    cluster: str,
    mix_history: tuple[MixChange, ...] = (),
    resume: Snapshot | None = None,
) -> Job:
    """The job folder made and the job of ``cluster``'s placement, not started yet; its
    ``JOB/loaders.txt`` written."""
    placement = SlurmJob if cluster == "slurm" else LocalJob
    job = placement(recipe, recipe_text, run_root, mix_history, resume)
    write_loaders(job.job.root / "loaders.txt", recipe)
    return job


def write_loaders(path: Path, recipe: Recipe) -> None:
    """Every loader process and the sources it serves, one a line."""
    try:
        atomic_write(path, listing(recipe, loader_processes(recipe)).encode())
    except OSError as exc:
        if is_full(exc):
            raise LaunchError(full_message(path.parent, path.name)) from None
        raise
