"""``loaders: auto`` at launch: profile the sources, share the loader processes out, and write
the result into the job's recipe (``loaders`` per source, ``loader.groups``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import msgspec

from msd.plan.autopartition import Allocation, allocate, with_default_loaders
from msd.plan.autoscale import peak_token_shares
from msd.plan.schedule import schedule_of
from msd.recipe.schema import LoaderOptions, Recipe, Source
from msd.sources.profile import SourceProfile, profile_recipe_source


@dataclass(frozen=True)
class AutoPlan:
    """What ``msd plan`` prints: each source's profile, peak token share and allocation
    (over the sources with ``loaders: auto``; the others keep theirs)."""

    auto: tuple[int, ...]
    profiles: tuple[SourceProfile, ...]
    token_shares: tuple[float, ...]
    cpus: int
    allocation: Allocation


# Seconds of tokenizing (and decoding) spent profiling all of a recipe's sources, at most one
# each: many sources are each profiled briefly, so starting a job of hundreds stays quick.
PROFILE_BUDGET_S = 8.0


def loader_cpus(recipe: Recipe) -> int:
    """The CPUs loader processes are planned on: ``loader.cpus``, else this machine's."""
    return recipe.loader.cpus or os.cpu_count() or 1


def prepared(recipe: Recipe) -> Recipe:
    """``recipe`` with its unset ``loaders`` decided as `msd launch` decides them."""
    return with_default_loaders(recipe, loader_cpus(recipe))


def plan_loaders(recipe: Recipe) -> AutoPlan:
    # an image or video source is profiled as its loaders read it: decoding included
    max_s = min(1.0, PROFILE_BUDGET_S / max(1, len(recipe.sources)))
    profiles = tuple(
        profile_recipe_source(recipe, i, max_s=max_s) for i in range(len(recipe.sources))
    )
    schedule = schedule_of(recipe)
    lengths = [p.tokens_per_sample for p in profiles]
    # over the whole schedule: after its last breakpoint nothing changes
    shares = tuple(peak_token_shares(schedule, 0, max(schedule.breakpoints()), lengths))
    auto = tuple(i for i, s in enumerate(recipe.sources) if s.loaders == "auto")
    fixed = sum(s.loaders or 1 for s in recipe.sources if s.loaders != "auto")
    cpus = loader_cpus(recipe)
    budget = max(1, cpus - fixed) if auto else cpus
    chosen = auto or tuple(range(len(recipe.sources)))
    allocation = allocate(
        [shares[i] for i in chosen], [profiles[i].seconds_per_token for i in chosen], budget
    )
    return AutoPlan(auto, profiles, shares, budget, allocation)


def resolve(recipe: Recipe, plan: AutoPlan) -> Recipe:
    """The recipe with ``loaders: auto`` replaced by the plan's numbers and groups."""
    if not plan.auto:
        return recipe
    sources = list(recipe.sources)
    groups = [tuple(recipe.sources[plan.auto[k]].name for k in g) for g in plan.allocation.groups]
    for k, i in enumerate(plan.auto):
        loaders = plan.allocation.loaders[k] or 1
        sources[i] = msgspec.structs.replace(sources[i], loaders=loaders)
    loader: LoaderOptions = msgspec.structs.replace(
        recipe.loader, groups=(*recipe.loader.groups, *[g for g in groups if len(g) > 1])
    )
    resolved_sources: tuple[Source, ...] = tuple(sources)
    return msgspec.structs.replace(recipe, sources=resolved_sources, loader=loader)
