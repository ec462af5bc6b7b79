"""The job's rescales: ``JOB/loaders.json``, the loader generations added while it runs.

``{"version": 1, "generations": [{"source": NAME, "generation": G, "loaders": N,
"start": V}]}``: from visit V on, N loaders read the source (``start`` null while the new
loaders start). The Planner writes it (atomically) before each step of a rescale; launchers
start the processes it names; loaders read their generation from it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from msd.errors import LaunchError
from msd.jobdir import atomic_write
from msd.plan.partition import Generation
from msd.recipe.schema import Recipe

RESCALES_VERSION = 1


def write_rescales(path: Path, recipe: Recipe, rescales: Sequence[Generation]) -> None:
    entries = [
        {
            "source": recipe.sources[g.source].name,
            "generation": g.number,
            "loaders": g.loaders,
            "start": g.start,
            "decided_at": g.decided_at,
            "reason": g.reason,
        }
        for g in rescales
    ]
    data = {"version": RESCALES_VERSION, "generations": entries}
    atomic_write(path, json.dumps(data, indent=2).encode())


def load_rescales(path: Path, recipe: Recipe) -> tuple[Generation, ...]:
    """The rescales recorded in ``path`` (none if it does not exist)."""
    if not path.exists():
        return ()
    names = [s.name for s in recipe.sources]
    data = _read(path)
    try:
        return tuple(
            Generation(
                names.index(e["source"]),
                int(e["generation"]),
                int(e["loaders"]),
                None if e["start"] is None else int(e["start"]),
                e.get("decided_at"),
                str(e.get("reason", "")),
            )
            for e in data["generations"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"{path} is not a valid loader-generation file ({exc})") from None


def _read(path: Path) -> dict[str, Any]:
    """The file's JSON object, once its version is the one this msd writes."""
    try:
        data = json.loads(path.read_text())
        version = data["version"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"{path} is not a valid loader-generation file ({exc})") from None
    if version != RESCALES_VERSION:
        raise LaunchError(
            f"{path} is a loader-generation file of version {version!r}, written by another msd "
            f"version; this one reads version {RESCALES_VERSION}"
        )
    return data  # type: ignore[no-any-return]
