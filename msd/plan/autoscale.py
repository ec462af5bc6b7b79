"""How many loaders each source needs, ahead of the mix: the Planner's scaling decision.

A source's demand, in tokens per second, is its share of each step's tokens times the steps
the trainers would take per second if data were instant. Its share of tokens follows from the
schedule's share of samples and the source's mean sample length, so a ramp in the schedule is
seen before it happens: the decision looks at the highest demand over the next ``lead_s``
seconds of steps. A loader of the source supplies what it was measured to read per second of
being busy (tokenizing included); it is planned at ``headroom`` of that. A source read by
several loaders gets one more than that: it is consumed visit by visit, and the loader whose
visit is being consumed is not reading ahead for the others. Scaling up happens at
once; scaling down only after the need has stayed lower for ``calm`` decisions in a row, and
never below one loader. The total stays within the budget: sources short of it get what is
left in proportion to their need. Pure: no clock, no socket.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from msd.plan.schedule import Schedule


@dataclass(frozen=True)
class SourceLoad:
    """What the Planner measured for one source: loaders of its current generation, mean
    sample length (tokens), and tokens one loader reads per busy second (None: not measured)."""

    loaders: int
    mean_length: float | None
    tokens_per_busy_s: float | None


@dataclass(frozen=True)
class Need:
    """Loaders a source needs: its peak demand (tokens/s) over the supply one loader is
    planned at (tokens/s)."""

    loaders: int
    demand: float
    per_loader: float


@dataclass(frozen=True)
class Settings:
    max_loaders: int
    lead_s: float = 10.0
    headroom: float = 0.7
    calm: int = 5


def token_shares(schedule: Schedule, step: int, lengths: Sequence[float]) -> list[float]:
    """Each source's share of a step's tokens: sample share × mean length, normalised."""
    weights = schedule.weights_at(step)
    tokens = [w * n for w, n in zip(weights, lengths, strict=True)]
    total = sum(tokens) or 1.0
    return [t / total for t in tokens]


def peak_token_shares(
    schedule: Schedule, start: int, stop: int, lengths: Sequence[float]
) -> list[float]:
    """The largest token share of each source over steps [start, stop]: checked at every
    schedule breakpoint inside and at both ends (between them a share is monotone)."""
    steps = {start, stop} | {b for b in schedule.breakpoints() if start <= b <= stop}
    steps |= {b - 1 for b in schedule.breakpoints() if start < b <= stop}
    peaks = [0.0] * len(lengths)
    for step in sorted(steps):
        peaks = [
            max(p, s) for p, s in zip(peaks, token_shares(schedule, step, lengths), strict=True)
        ]
    return peaks


def needed_loaders(
    schedule: Schedule,
    loads: Sequence[SourceLoad],
    step: int,
    steps_per_s: float,
    tokens_per_step: int,
    settings: Settings,
) -> list[Need | None]:
    """Loaders each source needs over the next ``lead_s`` seconds (None: not measured yet)."""
    lengths = [load.mean_length or 1.0 for load in loads]
    horizon = step + max(1, math.ceil(steps_per_s * settings.lead_s))
    shares = peak_token_shares(schedule, step, horizon, lengths)
    needs: list[Need | None] = []
    for share, load in zip(shares, loads, strict=True):
        if not load.tokens_per_busy_s or load.mean_length is None:
            needs.append(None)
            continue
        demand = share * tokens_per_step * steps_per_s
        supply = load.tokens_per_busy_s * settings.headroom
        loaders = max(1, math.ceil(demand / supply))
        needs.append(Need(loaders + 1 if loaders > 1 else 1, demand, supply))
    return needs


def decide(
    loads: Sequence[SourceLoad],
    needs: Sequence[int | None],
    low_for: Sequence[int],
    settings: Settings,
) -> list[int]:
    """The loaders each source should have now: up at once, down after ``calm`` low
    decisions and only by a quarter or more (a rescale starts new processes: a loader too many
    costs less than the churn of going back and forth at the edge), within ``max_loaders``
    in all. ``low_for[s]``: decisions in a row (this one included) that source s needed fewer
    than it has."""
    targets = []
    for load, need, low in zip(loads, needs, low_for, strict=True):
        up = need is not None and need > load.loaders
        worth = need is not None and need <= load.loaders - math.ceil(load.loaders / 4)
        calm_down = worth and low >= settings.calm
        targets.append(need if need is not None and (up or calm_down) else load.loaders)
    total = sum(targets)
    if total <= settings.max_loaders:
        return targets
    # over budget: everyone keeps one; the rest is shared in proportion to what is asked above it
    spare = max(0, settings.max_loaders - len(targets))
    extra = [t - 1 for t in targets]
    asked = sum(extra) or 1
    shared = [math.floor(spare * e / asked) for e in extra]
    return [1 + s for s in shared]
