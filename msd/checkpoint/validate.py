"""A snapshot's content checked like a recipe: every field typed and in range, before any of it
touches state. Its sha256 (and signature) say only that the file is as written; a file edited
by hand, or written by a faulty process, must still be refused with the field that is wrong.

``check_body``: what needs no recipe (types, ranges, lengths that agree with each other), at
every read. ``snapshot_recipe``: the embedded recipe through the recipe checks, and the state
against it (what ``msd restore`` continues from). ``delta_problem``: a log line's delta.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec

from msd.checkpoint.snapshot import Snapshot
from msd.errors import CheckpointError, RecipeError
from msd.recipe.load import recipe_from_data
from msd.recipe.schema import Recipe, stream_fingerprint

# Positions and counts travel as 64-bit ints (numpy, msgpack); the stream never comes near.
POSITION_MAX = 2**62
MAX_CARRY = 8  # ``StreamSpec.carry_limit`` is at most 8


class _Change(msgspec.Struct, forbid_unknown_fields=True):
    step: int
    weights: dict[str, float]


class _Totals(msgspec.Struct, forbid_unknown_fields=True):
    tokens: int
    source_samples: list[int]
    source_tokens: list[int]


class _Body(msgspec.Struct):
    """The snapshot body's fields (others, added by later versions, are checked by their
    readers)."""

    step: int
    cursors: list[int]
    carry: list[tuple[int, int]]
    fingerprint: str
    recipe: dict[str, Any]
    num_rows: list[int]
    mix_history: list[_Change]
    totals: _Totals
    created: float


def check_body(body: Any, where: Path) -> None:
    """A ``CheckpointError`` naming ``where`` and the field if the body is not well formed."""
    try:
        parsed = msgspec.convert(body, _Body)
    except msgspec.ValidationError as e:
        text = str(e).replace("`", "").replace(" - at $", " at body")
        raise CheckpointError(f"{where} is malformed: {text[:1].lower()}{text[1:]}") from None
    problem = _body_problem(parsed)
    if problem:
        raise CheckpointError(f"{where} is malformed: {problem}")


def _body_problem(body: _Body) -> str:
    sources = len(body.cursors)
    checks: list[tuple[str, Any, bool]] = [
        ("step", body.step, 0 <= body.step <= POSITION_MAX),
        ("created", body.created, math.isfinite(body.created) and body.created >= 0),
        ("totals.tokens", body.totals.tokens, 0 <= body.totals.tokens <= 2**63 - 1),
    ]
    checks += [(f"cursors[{i}]", c, 0 <= c <= POSITION_MAX) for i, c in enumerate(body.cursors)]
    checks += [(f"num_rows[{i}]", n, 1 <= n <= POSITION_MAX) for i, n in enumerate(body.num_rows)]
    for i, (source, gpos) in enumerate(body.carry):
        checks.append((f"carry[{i}] source", source, 0 <= source < sources))
        checks.append((f"carry[{i}] position", gpos, 0 <= gpos <= POSITION_MAX))
    for name in ("source_samples", "source_tokens"):
        values = getattr(body.totals, name)
        checks += [(f"totals.{name}[{i}]", v, 0 <= v < 2**63) for i, v in enumerate(values)]
    for i, change in enumerate(body.mix_history):
        checks.append((f"mix_history[{i}].step", change.step, 0 <= change.step <= POSITION_MAX))
        checks += [
            (f"mix_history[{i}].weights.{name}", w, math.isfinite(w) and w >= 0)
            for name, w in change.weights.items()
        ]
    for key, value, ok in checks:
        if not ok:
            return f"{key} is {value!r}, out of range"
    return _lengths_problem(body)


def _lengths_problem(body: _Body) -> str:
    sources = len(body.cursors)
    if not sources:
        return "cursors is empty: a job has at least one source"
    if len(body.num_rows) != sources:
        return f"num_rows has {len(body.num_rows)} entries for {sources} cursors"
    if len(body.carry) > MAX_CARRY:
        return f"carry holds {len(body.carry)} samples; a step carries at most {MAX_CARRY}"
    for name in ("source_samples", "source_tokens"):
        n = len(getattr(body.totals, name))
        if n not in (0, sources):
            return f"totals.{name} has {n} entries for {sources} cursors"
    return ""


def snapshot_recipe(snap: Snapshot, where: Path) -> Recipe:
    """The recipe a decoded snapshot embeds, checked as a recipe file is, with the state
    checked against it: what ``msd restore`` may continue."""
    try:
        recipe = recipe_from_data(snap.recipe, str(where))
    except RecipeError as exc:
        raise CheckpointError(f"{exc} (in the recipe the checkpoint embeds)") from None
    problem = _against_recipe(recipe, snap)
    if problem:
        raise CheckpointError(f"{where} is malformed: {problem}")
    return recipe


def _against_recipe(recipe: Recipe, snap: Snapshot) -> str:
    names = [s.name for s in recipe.sources]
    cursors = snap.state.cursors
    if len(cursors) != len(names):
        return f"cursors has {len(cursors)} entries; its recipe has {len(names)} sources"
    if snap.fingerprint != stream_fingerprint(recipe):
        return f"fingerprint {snap.fingerprint!r} is not that of its recipe"
    for i, source in enumerate(recipe.sources):
        if not source.repeat and cursors[i] > snap.num_rows[i]:
            return (
                f"cursors[{i}] is {cursors[i]}, beyond the {snap.num_rows[i]} rows of {names[i]!r}"
            )
    for i, change in enumerate(snap.mix_history):
        unknown = sorted(set(change.get("weights", {})) - set(names))
        if unknown:
            return f"mix_history[{i}] names {unknown[0]!r}, not a source of its recipe"
    return ""


def delta_problem(moved: Any, carry: Any, tokens: int, sources: int) -> str:
    """What is out of range in a log line's delta over ``sources`` sources ("" if nothing)."""
    for source, n in moved:
        if not (0 <= source < sources and 0 <= n <= POSITION_MAX):
            return f"moves source {source} by {n}, out of range"
    if len(carry) > MAX_CARRY:
        return f"carries {len(carry)} samples, more than {MAX_CARRY}"
    for source, gpos in carry:
        if not (0 <= source < sources and 0 <= gpos <= POSITION_MAX):
            return f"carries position {gpos} of source {source}, out of range"
    if not 0 <= tokens < 2**63:
        return f"holds {tokens} tokens, out of range"
    return ""
