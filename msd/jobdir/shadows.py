"""The job's shadow take-overs: ``JOB/shadows.json``.

``{"version": 1, "takeovers": [{"lost": LOADER, "shadow": SHADOW, "source": NAME, "step": K,
"time": T}]}``: the shadow process ``SHADOW`` became loader ``LOADER`` (it died or hung) when
every rank had consumed K steps. The Planner writes it (atomically) when it hands a loader's
work to a shadow; the launcher starts one more shadow per take-over and knows, from it, which
loader a shadow process now is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from msd.errors import LaunchError
from msd.jobdir import atomic_write
from msd.plan.partition import Generation, find_process
from msd.recipe.schema import Recipe

SHADOWS_VERSION = 1


@dataclass(frozen=True)
class Takeover:
    lost: str
    shadow: str
    source: int
    step: int
    time: float


def write_takeovers(path: Path, recipe: Recipe, takeovers: Sequence[Takeover]) -> None:
    entries = [
        {
            "lost": t.lost,
            "shadow": t.shadow,
            "source": recipe.sources[t.source].name,
            "step": t.step,
            "time": t.time,
        }
        for t in takeovers
    ]
    atomic_write(path, json.dumps({"version": SHADOWS_VERSION, "takeovers": entries}).encode())


def load_takeovers(path: Path, recipe: Recipe) -> tuple[Takeover, ...]:
    """The take-overs recorded in ``path`` (none if it does not exist)."""
    if not path.exists():
        return ()
    names = [s.name for s in recipe.sources]
    try:
        data = json.loads(path.read_text())
        return tuple(
            Takeover(e["lost"], e["shadow"], names.index(e["source"]), int(e["step"]), e["time"])
            for e in data["takeovers"]
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"{path} is not a readable record of shadow take-overs ({exc})") from None


def shadows_used(recipe: Recipe, takeovers: Sequence[Takeover]) -> tuple[int, ...]:
    """Per source, how many of its shadows took a loader's place."""
    used = [0] * len(recipe.sources)
    for t in takeovers:
        used[t.source] += 1
    return tuple(used)


def acting_as(takeovers: Sequence[Takeover]) -> dict[str, str]:
    """Shadow process name → the loader it now is (the latest take-over of each)."""
    return {t.shadow: t.lost for t in takeovers}


@dataclass(frozen=True)
class Fate:
    """What follows the death of a loader process of a source with shadows."""

    standby: bool  # it was a shadow standing by: start another in its place
    loader: str  # else: the loader it was (a shadow that had taken over is that loader)


def fate_of_dead_loader(
    recipe: Recipe,
    process_name: str,
    takeovers: Sequence[Takeover],
    rescales: Sequence[Generation] = (),
) -> Fate | None:
    """None when none of the dead process's sources has shadows (the data plane restarts)."""
    name = acting_as(takeovers).get(process_name, process_name)
    process = find_process(recipe, name, rescales, shadows_used(recipe, takeovers))
    if not any(recipe.sources[s].shadows for s in process.sources):
        return None
    return Fate(process.standby is not None, name)
