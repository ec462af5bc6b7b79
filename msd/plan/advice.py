"""Advice on a recipe's loader processes: how many it starts, when that is too many, and a
short account of which sources they serve (pure: the CLI prints it).

By default every source gets a loader process of its own, so a recipe of 10,000 sources
would start 10,000 processes. A loader is a whole Python process (pyarrow, a ZeroMQ context,
its read-ahead: tens of MiB each); past a few per CPU they only take turns on the CPUs, and on
SLURM each is a job of its own in the queue. Hence a warning above ``max(64, 4 × CPUs)``
processes locally and above 64 on SLURM, pointing to ``loader.sources_per_process`` and
``loaders: auto``.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from msd.plan.autopartition import with_default_loaders
from msd.plan.partition import LoaderProcess, loader_processes
from msd.recipe.schema import Recipe

WARN_ABOVE = 64  # loader processes, at the least
PER_CPU = 4  # loader processes per CPU before they only take turns
SHOWN = 3  # sources named in the summary


def process_limit(cpus: int, cluster: str) -> int:
    """The most loader processes a job starts without a warning."""
    return WARN_ABOVE if cluster == "slurm" else max(WARN_ABOVE, PER_CPU * cpus)


def too_many_loaders(processes: int, cpus: int, cluster: str) -> str | None:
    """One sentence of advice when ``processes`` loader processes are too many, else None."""
    limit = process_limit(cpus, cluster)
    if processes <= limit:
        return None
    why = (
        "each one a SLURM job"
        if cluster == "slurm"
        else f"{processes / max(1, cpus):.0f} per CPU of this machine"
    )
    return (
        f"this recipe starts {processes} loader processes ({why}), more than {limit}; "
        "let light sources share processes with `loader: {sources_per_process: N}` or "
        "`loaders: auto` (`msd plan` shows how auto shares them out)"
    )


def count_processes(recipe: Recipe, cpus: int) -> int:
    """The loader processes the recipe starts; sources with ``loaders: auto`` (or unset, when
    many) are counted at the most they share at launch (the CPUs the fixed sources leave, at
    least one)."""
    recipe = with_default_loaders(recipe, recipe.loader.cpus or cpus)
    auto = {s.name for s in recipe.sources if s.loaders == "auto"}
    if not auto:
        return len(loader_processes(recipe))
    fixed = tuple(s for s in recipe.sources if s.name not in auto)
    groups = tuple(g for g in recipe.loader.groups if not auto.intersection(g))
    rest = msgspec.structs.replace(
        recipe, sources=fixed, loader=msgspec.structs.replace(recipe.loader, groups=groups)
    )
    budget = recipe.loader.cpus or cpus
    fixed_loaders = sum(int(s.loaders or 1) for s in fixed)
    return (len(loader_processes(rest)) if fixed else 0) + max(1, budget - fixed_loaders)


def summary(recipe: Recipe, processes: Sequence[LoaderProcess]) -> str:
    """E.g. ``256 sources on 12 loader processes: 250 sources share 5; own processes: web 4,
    code 2, books 2 and 3 more sources``."""
    names = [s.name for s in recipe.sources]
    own: dict[int, int] = {}
    shared: list[LoaderProcess] = []
    for p in processes:
        if p.standby is None and len(p.sources) == 1:
            own[p.sources[0]] = own.get(p.sources[0], 0) + 1
        elif p.standby is None:
            shared.append(p)
    parts = []
    if shared:
        members = sum(len(p.sources) for p in shared)
        parts.append(f"{members} sources share {len(shared)} of them")
    if own:
        largest = sorted(own, key=lambda s: (-own[s], s))
        shown = ", ".join(f"{names[s]} {own[s]}" for s in largest[:SHOWN])
        more = f" and {len(own) - SHOWN} more sources" if len(own) > SHOWN else ""
        parts.append(f"own processes: {shown}{more}")
    standby = len(processes) - sum(own.values()) - len(shared)
    if standby:
        parts.append(f"{standby} shadow{'s' if standby > 1 else ''} standing by")
    return f"{len(names)} sources on {len(processes)} loader processes: " + "; ".join(parts)


def listing(recipe: Recipe, processes: Sequence[LoaderProcess]) -> str:
    """Every loader process and the sources it serves, one a line (``JOB/loaders.txt``)."""
    names = [s.name for s in recipe.sources]
    lines = []
    for p in processes:
        served = ", ".join(names[s] for s in p.sources)
        lines.append(f"{p.name}\t{'shadow of ' if p.standby is not None else ''}{served}")
    return "\n".join(lines) + "\n"
