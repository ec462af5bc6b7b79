"""How many loaders each source has: ``msd rescale`` and autoscale start a new generation of a
source's loaders; once all of them are up, the current ones say where they are and the new
generation reads on from the furthest (each visit is read by exactly one shard)."""

from __future__ import annotations

import dataclasses
import logging
import os

from msd.control.view import JobObserver
from msd.jobdir import JobDir
from msd.jobdir.rescales import write_rescales
from msd.plan import autoscale as autoscaling
from msd.plan.partition import Generation, generations, generations_of
from msd.plan.schedule import Schedule
from msd.recipe.schema import Recipe
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.registry import Registry
from msd.wire.protocol import Cut, CutAt, GenerationStart, Refused, Rescale, Rescaling

log = logging.getLogger(__name__)
MAX_LOADERS = 256  # a rescale's ceiling per source


def autoscale_settings(recipe: Recipe) -> autoscaling.Settings | None:
    auto = recipe.loader.autoscale
    if not auto.enabled:
        return None
    return autoscaling.Settings(
        max_loaders=auto.max_loaders or os.cpu_count() or 1,
        lead_s=auto.lead_s,
        headroom=auto.headroom,
    )


class Scaling:
    """State: ``rescales`` (every generation started since launch, as the job's loaders file
    has them), ``cut_at`` (source → its current shards' replies to a ``Cut``), ``low_for``
    (per source, how many autoscale rounds in a row wanted fewer loaders)."""

    def __init__(
        self,
        job: JobDir,
        recipe: Recipe,
        out: Outbox,
        registry: Registry,
        observer: JobObserver,
        rescales: list[Generation] | tuple[Generation, ...],
    ) -> None:
        self.job = job
        self.recipe = recipe
        self.out = out
        self.registry = registry
        self.observer = observer
        self.rescales = list(rescales)
        self.cut_at: dict[int, dict[bytes, int | None]] = {}
        self.settings = autoscale_settings(recipe)
        self.low_for = [0] * len(recipe.sources)

    def rescale(self, msg: Rescale, consumed: int) -> Rescaling | Refused:
        """Start a new generation of a source's loaders: record it (the launcher starts its
        processes); once they are all up, cut it in (``maybe_cut``)."""
        names = [s.name for s in self.recipe.sources]
        if msg.source not in names:
            return Refused(reason=f"no source named {msg.source!r} (sources: {', '.join(names)})")
        if not 1 <= msg.loaders <= MAX_LOADERS:
            return Refused(reason=f"--loaders must be from 1 to {MAX_LOADERS}, got {msg.loaders}")
        new = self.new_generation(names.index(msg.source), msg.loaders, "msd rescale", consumed)
        if isinstance(new, str):
            return Refused(reason=new)
        return Rescaling(source=msg.source, generation=new.number, loaders=msg.loaders)

    def new_generation(
        self, source: int, loaders: int, reason: str, consumed: int
    ) -> Generation | str:
        """Record a new generation of a source's loaders (the launcher starts them); a reason
        it cannot be, otherwise."""
        name = self.recipe.sources[source].name
        gens = generations_of(self.recipe, source, self.rescales)
        if gens[-1].start is None:
            return f"{name} is being rescaled already (generation {gens[-1].number}); wait"
        new = Generation(source, len(gens), loaders, None, consumed, reason)
        try:
            write_rescales(self.job.rescales, self.recipe, [*self.rescales, new])
        except OSError as exc:
            return f"cannot record the rescale in {self.job.rescales}: {exc}"
        self.rescales.append(new)
        log.info("%s → %d loaders (generation %d, %s)", name, loaders, new.number, reason)
        return new

    def autoscale(self, schedule: Schedule, consumed: int) -> None:
        """Give each source the loaders its demand over the next seconds needs."""
        settings = self.settings
        pace = self.observer.trainer_pace()
        if settings is None or pace <= 0:
            return
        table = generations(self.recipe, self.rescales)
        loads = self._loads(table)
        needs = autoscaling.needed_loaders(
            schedule, loads, consumed, pace, self.recipe.global_batch_tokens, settings
        )
        counts = [None if n is None else n.loaders for n in needs]
        self.low_for = [
            low + 1 if need is not None and need < load.loaders else 0
            for low, need, load in zip(self.low_for, counts, loads, strict=True)
        ]
        targets = autoscaling.decide(loads, counts, self.low_for, settings)
        for s, (target, load, need) in enumerate(zip(targets, loads, needs, strict=True)):
            if target != load.loaders and table[s][-1].start is not None and need is not None:
                why = (
                    f"autoscale: {need.demand:,.0f} tokens/s needed within "
                    f"{settings.lead_s:g} s (pace {pace:.1f} steps/s), "
                    f"{need.per_loader:,.0f} per loader"
                )
                if not isinstance(self.new_generation(s, target, why, consumed), str):
                    self.low_for[s] = 0

    def _loads(self, table: list[list[Generation]]) -> list[autoscaling.SourceLoad]:
        """Each source's loaders now and what they were measured to deliver."""
        totals = self.observer.source_totals(len(self.recipe.sources))
        loads = []
        for s, (samples, tokens, busy) in enumerate(totals):
            current = next(g for g in reversed(table[s]) if g.start is not None)
            loads.append(
                autoscaling.SourceLoad(
                    current.loaders,
                    tokens / samples if samples else None,
                    tokens / busy if busy > 0.5 else None,  # half a second busy: measured
                )
            )
        return loads

    def maybe_cut(self, source: int) -> None:
        """Once every loader of a source's pending generation is up, ask the current ones
        where they are (``Cut``)."""
        gens = generations_of(self.recipe, source, self.rescales)
        pending = gens[-1]
        if pending.start is not None or source in self.cut_at:
            return
        if len(self.registry.of_generation(source, pending.number)) < pending.loaders:
            return
        current = next(g for g in reversed(gens) if g.start is not None)
        peers = self.registry.of_generation(source, current.number)
        self.cut_at[source] = {p.identity: None for p in peers}
        for p in peers:
            self.out.send(p.identity, Cut(source=source))

    def on_cut_at(self, identity: bytes, msg: CutAt) -> str | None:
        """When every current shard has said where it stands, the new generation starts after
        the furthest. Why the reply is not acted on, if it is not."""
        replies = self.cut_at.get(msg.source)
        if replies is None or identity not in replies:
            return f"a cut position for source {msg.source}, not asked"
        replies[identity] = msg.visit
        if any(v is None for v in replies.values()):
            return None
        start = max(v for v in replies.values() if v is not None)
        del self.cut_at[msg.source]
        index = next(
            i for i, g in enumerate(self.rescales) if g.source == msg.source and g.start is None
        )
        g = self.rescales[index] = dataclasses.replace(self.rescales[index], start=start)
        write_rescales(self.job.rescales, self.recipe, self.rescales)
        for p in self.registry.serving(msg.source):
            start_msg = GenerationStart(source=msg.source, generation=g.number, start=start)
            self.out.send(p.identity, start_msg)
            older = p.hello.generations[p.hello.sources.index(msg.source)] < g.number
            if older and len(p.hello.sources) == 1:
                self.observer.on_retiring(p.identity.hex())
        name = self.recipe.sources[msg.source].name
        log.info("%s generation %d reads from visit %d", name, g.number, start)
        return None
