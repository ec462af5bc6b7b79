"""A loader lost (its process died, or it went silent): a shadow of its source takes its place,
reading the lost loader's shards from the first position still needed, and what the lost one
was told to send to steps not built yet goes to those steps again."""

from __future__ import annotations

import logging
import time

from msd.control.view import JobObserver
from msd.jobdir import JobDir
from msd.jobdir.shadows import Takeover, load_takeovers, write_takeovers
from msd.plan.step import PlannerState
from msd.recipe.schema import Recipe
from msd.roles.planner.outbox import Outbox
from msd.roles.planner.registry import Registry
from msd.roles.planner.routing import Routing
from msd.wire.protocol import Adopt

log = logging.getLogger(__name__)


class Failover:
    """State: ``takeovers`` (every shadow that took a loader's place, as the job's shadows
    file has them)."""

    def __init__(
        self,
        job: JobDir,
        recipe: Recipe,
        out: Outbox,
        registry: Registry,
        routing: Routing,
        observer: JobObserver,
    ) -> None:
        self.job = job
        self.recipe = recipe
        self.out = out
        self.registry = registry
        self.routing = routing
        self.observer = observer
        self.takeovers = list(load_takeovers(job.shadows, recipe))
        self.waiting: set[str] = set()  # loaders silent too long that no shadow can replace

    def silent(self, names: list[str], why: str, state: PlannerState, consumed: int) -> None:
        """``names``: the loaders silent for too long. One a shadow can replace is lost to it;
        the others are waited for: a loader starved of CPU is slow, not gone, and a dead
        one's process end is what restarts the data plane (the launcher sees it)."""
        for name in names:
            peer = self.registry.loaders.get(name)
            if peer is None or self.registry.has_shadow(peer.hello.sources):
                self.lose(name, why, state, consumed)
            elif name not in self.waiting:
                log.warning("loader %s is %s and no shadow stands by; waiting for it", name, why)
        heard = self.waiting - set(names)
        for name in sorted(heard):
            log.info("loader %s is heard from again", name)
        self.waiting = {n for n in names if n in self.registry.loaders}

    def lose(self, name: str, why: str, state: PlannerState, consumed: int) -> None:
        """Loader ``name`` is gone: hand its place to a shadow, if one stands by."""
        peer = self.registry.lose(name)
        if peer is None:  # a shadow, or gone already
            return
        self.observer.on_retired(peer.identity.hex())
        sources = peer.hello.sources
        shadow = self.registry.take_shadow(sources)
        if shadow is None:
            log.warning("loader %s lost (%s); no shadow stands by", name, why)
            return
        self.routing.take_over(peer.identity, sources)
        first = self.routing.first_needed(state, sources)
        self.out.send(shadow.identity, Adopt(name=name, first=first))
        self.takeovers.append(Takeover(name, shadow.hello.name, sources[0], consumed, time.time()))
        write_takeovers(self.job.shadows, self.recipe, self.takeovers)
        log.warning("loader %s lost (%s); %s takes over", name, why, shadow.hello.name)
