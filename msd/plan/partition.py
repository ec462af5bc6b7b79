"""Which loader process serves which share of which source: a pure function of the recipe and
the job's rescales.

Each source's visits (``v = epoch × blocks + k``: the k-th block an epoch visits) are read in
generations. Generation 0 is the recipe's: a source with ``loaders: L`` is read by L shards,
shard i owning visits v ≡ i (mod L). ``msd rescale`` adds a generation: from a visit ``start``
no shard of the generation before it has opened, N new shards own the visits
``start + i, start + i + N, ...``; the old ones finish what lies before ``start`` and retire.
Each visit is read by exactly one shard, so no sample is lost or read twice, and the stream
never depends on any of this: only who reads what.

A source read by several shards gets one process per shard (it is heavy: that is why it has
several). Sources with ``loaders: 1`` (or unset) are light ones: up to
``loader.sources_per_process`` of them, in recipe order, share one process, so a thousand
sources need not mean a thousand processes. A rescale's shards each get their own process,
named ``SOURCE@GENERATION/INDEX``.

A source with ``shadows: K`` (always in processes of its own) also gets K hot-standby processes,
``SOURCE~shadow-k``: each opens the source and waits; when a loader of the source dies, one of
them takes its place (it becomes that loader, by name) and one more shadow is started, so the
job's ``JOB/shadows.json`` (how many were used per source) adds to the processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from msd.errors import LaunchError
from msd.recipe.schema import Recipe


@dataclass(frozen=True)
class Generation:
    """``loaders`` shards of source ``source`` read its visits from ``start`` on (``None``:
    not decided yet, the new loaders are starting), until the next generation's start."""

    source: int
    number: int
    loaders: int
    start: int | None
    decided_at: int | None = None  # the step every rank had consumed when it was decided
    reason: str = ""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of generation ``generation`` of source ``source``."""

    source: int
    index: int
    generation: int = 0


@dataclass(frozen=True)
class LoaderProcess:
    """``standby``: a shadow of that source (no shards until it takes a loader's place)."""

    name: str
    shards: tuple[Shard, ...]
    standby: int | None = None

    @property
    def sources(self) -> tuple[int, ...]:
        if self.standby is not None:
            return (self.standby,)
        return tuple(sorted({shard.source for shard in self.shards}))


def shadow_name(source: str, k: int) -> str:
    return f"{source}~shadow-{k}"


def loader_name(source: str, index: int, generation: int = 0) -> str:
    return f"{source}/{index}" if generation == 0 else f"{source}@{generation}/{index}"


def loaders_of(recipe: Recipe, source: int) -> int:
    """The recipe's loaders for a source (unset: 1; ``msd launch`` shares unset sources out as
    ``auto`` when there are many); ``auto`` is resolved at launch (``msd plan``)."""
    loaders = recipe.sources[source].loaders
    if loaders is None:
        return 1
    if loaders == "auto":
        raise LaunchError(
            f"sources[{source}].loaders is auto: resolve it first (msd launch does; "
            "msd plan shows how)"
        )
    return loaders


def generations(recipe: Recipe, rescales: Sequence[Generation] = ()) -> list[list[Generation]]:
    """Every source's generations, in order: the recipe's, then its rescales."""
    table = [[Generation(s, 0, loaders_of(recipe, s), 0)] for s in range(len(recipe.sources))]
    for g in rescales:
        table[g.source].append(g)
    return table


def generations_of(
    recipe: Recipe, source: int, rescales: Sequence[Generation] = ()
) -> list[Generation]:
    """One source's generations, in order (``generations(...)[source]``, without the others)."""
    first = Generation(source, 0, loaders_of(recipe, source), 0)
    return [first, *(g for g in rescales if g.source == source)]


def span(table: list[list[Generation]], shard: Shard) -> tuple[int | None, int | None, int]:
    """The visits of a shard's generation: (start, stop, loaders); ``stop`` None: open-ended."""
    gens = table[shard.source]
    gen = gens[shard.generation]
    stop = gens[shard.generation + 1].start if shard.generation + 1 < len(gens) else None
    return gen.start, stop, gen.loaders


def loader_processes(
    recipe: Recipe, rescales: Sequence[Generation] = (), shadows_used: Sequence[int] = ()
) -> tuple[LoaderProcess, ...]:
    """Every loader process of the job, in a fixed order: the recipe's (each source's first
    shard in recipe order), then each rescale's, then the shadows (``shadows_used[s]``: how
    many of source s's took a loader's place: as many more were started)."""
    per_process = max(1, recipe.loader.sources_per_process or 1)
    names = [s.name for s in recipe.sources]
    grouped = {names.index(n): g for g, group in enumerate(recipe.loader.groups) for n in group}
    processes: list[LoaderProcess] = []
    group: list[int] = []

    def close_group() -> None:
        if group:
            processes.append(_shared(recipe, tuple(group)))
            group.clear()

    for s, source in enumerate(recipe.sources):
        loaders = loaders_of(recipe, s)
        if s in grouped:
            if s == min(i for i, g in grouped.items() if g == grouped[s]):  # the group's first
                close_group()
                members = tuple(sorted(i for i, g in grouped.items() if g == grouped[s]))
                processes.append(_shared(recipe, members))
            continue
        if loaders > 1 or per_process == 1 or source.shadows:
            close_group()
            processes += [
                LoaderProcess(loader_name(source.name, i), (Shard(s, i),)) for i in range(loaders)
            ]
            continue
        group.append(s)
        if len(group) == per_process:
            close_group()
    close_group()
    for g in rescales:
        name = recipe.sources[g.source].name
        processes += [
            LoaderProcess(loader_name(name, i, g.number), (Shard(g.source, i, g.number),))
            for i in range(g.loaders)
        ]
    for s, source in enumerate(recipe.sources):
        used = shadows_used[s] if s < len(shadows_used) else 0
        processes += [
            LoaderProcess(shadow_name(source.name, k), (), standby=s)
            for k in range(source.shadows + used)
        ]
    return tuple(processes)


@dataclass(frozen=True)
class Placement:
    """Where a source is read: by ``own`` processes that read it alone, or by the one it shares
    with ``others`` sources, ``shared`` (its index among the job's loader processes)."""

    own: int = 0
    shared: int | None = None
    others: int = 0


def placements(sources: int, processes: Sequence[LoaderProcess]) -> list[Placement]:
    """Each of the ``sources`` sources' `Placement` among ``processes`` (shadows aside)."""
    own = [0] * sources
    shared: dict[int, tuple[int, int]] = {}
    for p, process in enumerate(processes):
        if process.standby is not None:
            continue
        if len(process.sources) == 1:
            own[process.sources[0]] += 1
            continue
        for s in process.sources:
            shared[s] = (p, len(process.sources) - 1)
    return [Placement(own[s], *shared.get(s, (None, 0))) for s in range(sources)]


def _shared(recipe: Recipe, sources: tuple[int, ...]) -> LoaderProcess:
    first = recipe.sources[sources[0]].name
    name = loader_name(first, 0) if len(sources) == 1 else f"{first}+{len(sources) - 1}"
    return LoaderProcess(name, tuple(Shard(s, 0) for s in sources))


def find_process(
    recipe: Recipe,
    name: str,
    rescales: Sequence[Generation] = (),
    shadows_used: Sequence[int] = (),
) -> LoaderProcess:
    """The loader process called ``name``; KeyError names the ones there are."""
    processes = loader_processes(recipe, rescales, shadows_used)
    for process in processes:
        if process.name == name:
            return process
    known = ", ".join(p.name for p in processes)
    raise KeyError(f"no loader process named {name!r} in this job (there are: {known})")
