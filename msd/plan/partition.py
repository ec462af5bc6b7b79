"""Which loader process serves which share of which source: a pure function of the recipe.

A source with ``loaders: L`` is read by L shards: shard i owns every L-th block its epochs visit.
A source read by several shards gets one process per shard (it is heavy: that is why it has
several). Sources with ``loaders: 1`` are light ones: up to ``loader.sources_per_process`` of
them, in recipe order, share one process, so a thousand sources need not mean a thousand
processes. The stream never depends on this: only who reads what.
"""

from __future__ import annotations

from dataclasses import dataclass

from msd.recipe.schema import Recipe


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of source ``source`` (of ``recipe.sources[source].loaders``)."""

    source: int
    index: int


@dataclass(frozen=True)
class LoaderProcess:
    name: str
    shards: tuple[Shard, ...]

    @property
    def sources(self) -> tuple[int, ...]:
        return tuple(sorted({shard.source for shard in self.shards}))


def loader_name(source: str, index: int) -> str:
    return f"{source}/{index}"


def loader_processes(recipe: Recipe) -> tuple[LoaderProcess, ...]:
    """Every loader process of the job, in a fixed order (each source's first shard in recipe
    order)."""
    per_process = max(1, recipe.loader.sources_per_process)
    processes: list[LoaderProcess] = []
    group: list[int] = []

    def close_group() -> None:
        if group:
            processes.append(_shared(recipe, tuple(group)))
            group.clear()

    for s, source in enumerate(recipe.sources):
        if source.loaders > 1 or per_process == 1:
            close_group()
            processes += [
                LoaderProcess(loader_name(source.name, i), (Shard(s, i),))
                for i in range(source.loaders)
            ]
            continue
        group.append(s)
        if len(group) == per_process:
            close_group()
    close_group()
    return tuple(processes)


def _shared(recipe: Recipe, sources: tuple[int, ...]) -> LoaderProcess:
    first = recipe.sources[sources[0]].name
    name = loader_name(first, 0) if len(sources) == 1 else f"{first}+{len(sources) - 1}"
    return LoaderProcess(name, tuple(Shard(s, 0) for s in sources))


def find_process(recipe: Recipe, name: str) -> LoaderProcess:
    """The loader process called ``name``; KeyError names the ones there are."""
    processes = loader_processes(recipe)
    for process in processes:
        if process.name == name:
            return process
    known = ", ".join(p.name for p in processes)
    raise KeyError(f"no loader process named {name!r} in this job (there are: {known})")
