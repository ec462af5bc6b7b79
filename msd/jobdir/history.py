"""The job's mix history: every ``msd mix`` change, in the order it was made.

``JOB/mix-history.json`` = ``{"version": 1, "changes": [{"step": K, "weights": {NAME: W}}]}``.
The Planner writes it (atomically) before a change takes effect, and reads it when it starts,
so the stream stays a pure function of (recipe, seed, mix history): ``msd launch
--mix-history FILE`` replays a job's changes exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from msd.errors import RecipeError
from msd.jobdir import atomic_write
from msd.plan.schedule import MixChange
from msd.recipe.schema import Recipe

HISTORY_VERSION = 1


def make_change(recipe: Recipe, weights: Mapping[str, float], step: int) -> MixChange:
    """A change of the named sources' weights from ``step`` on; a clear error for a name the
    recipe does not have or a weight that is not a finite number ≥ 0."""
    names = [s.name for s in recipe.sources]
    if not weights:
        raise RecipeError("a mix change names no source")
    if step < 0:
        raise RecipeError(f"a mix change starts at step {step}; steps start at 0")
    pairs = []
    for name, weight in weights.items():
        if name not in names:
            known = ", ".join(names)
            raise RecipeError(f"no source named {name!r} in this job (sources: {known})")
        if not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
            raise RecipeError(f"the weight of {name!r} must be a finite number >= 0: {weight!r}")
        pairs.append((names.index(name), float(weight)))
    return MixChange(step, tuple(sorted(pairs)))


def change_json(recipe: Recipe, change: MixChange) -> dict[str, object]:
    names = [s.name for s in recipe.sources]
    return {"step": change.step, "weights": {names[s]: w for s, w in change.weights}}


def write_history(path: Path, recipe: Recipe, changes: Sequence[MixChange]) -> None:
    data = {"version": HISTORY_VERSION, "changes": [change_json(recipe, c) for c in changes]}
    atomic_write(path, json.dumps(data, indent=2).encode())


def load_history(path: Path, recipe: Recipe) -> tuple[MixChange, ...]:
    """The changes recorded in ``path`` (none if it does not exist), checked against the
    recipe."""
    if not path.exists():
        return ()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecipeError(f"{path} is not a readable mix history ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != HISTORY_VERSION:
        raise RecipeError(f"{path} is not a mix history of version {HISTORY_VERSION}")
    changes = []
    for i, entry in enumerate(data.get("changes", [])):
        try:
            changes.append(make_change(recipe, entry["weights"], int(entry["step"])))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise RecipeError(f"{path}: change {i} is malformed ({exc})") from None
        except RecipeError as exc:
            raise RecipeError(f"{path}: change {i}: {exc}") from None
    return tuple(changes)
