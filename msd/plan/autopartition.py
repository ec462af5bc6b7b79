"""``loaders: auto``: how many loader processes each source gets from a CPU budget.

Each source needs loader time in proportion to its share of the tokens (its largest over the
schedule: its sample share weighted by its mean length) times what a token costs to read and
tokenize (measured by ``msd.sources.profile``). The budget's ``cpus`` processes are shared
out in that proportion, at two levels: a source needing at least one whole process is heavy
and gets several, its own (split by visits, ``msd.plan.partition``); the light ones are packed
together, heaviest first, into processes that each carry about one process's worth, so a
thousand light sources do not mean a thousand processes. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from msd.recipe.schema import Recipe

# Sources without ``loaders`` each get a process of their own while there are at most this many
# of them (or the loader CPUs, if more); beyond, they are shared out as ``loaders: auto``.
OWN_PROCESSES_AT_LEAST = 4


@dataclass(frozen=True)
class Allocation:
    """``loaders[s]``: processes of heavy source s (0: it is light, in one of ``groups``);
    ``groups``: the light sources each shared process serves; ``need[s]``: its share of the
    loader time."""

    loaders: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    need: tuple[float, ...]


def allocate(
    token_shares: Sequence[float], seconds_per_token: Sequence[float], cpus: int
) -> Allocation:
    work = [s * c for s, c in zip(token_shares, seconds_per_token, strict=True)]
    total = sum(work) or 1.0
    need = [w / total for w in work]
    unit = 1.0 / max(1, cpus)  # one process's share of the loader time
    heavy = [s for s, n in enumerate(need) if n >= unit]
    light = sorted((s for s, n in enumerate(need) if n < unit), key=lambda s: (-need[s], s))
    loaders = [0] * len(need)
    for s in heavy:
        loaders[s] = max(1, round(need[s] / unit))
    groups: list[list[int]] = []
    loads: list[float] = []
    for s in light:  # first fit, heaviest first
        for g, load in enumerate(loads):
            if load + need[s] <= unit * 1.0001:
                groups[g].append(s)
                loads[g] += need[s]
                break
        else:
            groups.append([s])
            loads.append(need[s])
    ordered = tuple(tuple(sorted(g)) for g in sorted(groups, key=min))
    return Allocation(tuple(loaders), ordered, tuple(need))


def with_default_loaders(recipe: Recipe, cpus: int) -> Recipe:
    """``recipe`` with each source's unset ``loaders`` decided for ``cpus`` loader CPUs: 1 while
    the unset sources are at most ``max(OWN_PROCESSES_AT_LEAST, cpus)``, or when the recipe
    says how many share a process (``loader.sources_per_process``); else ``auto``."""
    unset = [s for s in recipe.sources if s.loaders is None]
    if not unset:
        return recipe
    few = len(unset) <= max(OWN_PROCESSES_AT_LEAST, cpus)
    value: int | str = 1 if few or recipe.loader.sources_per_process is not None else "auto"
    sources = tuple(
        msgspec.structs.replace(s, loaders=value) if s.loaders is None else s
        for s in recipe.sources
    )
    return msgspec.structs.replace(recipe, sources=sources)
