"""Semantic checks of the declarative primitives: distribute, micro-batches, mix, cost.

Pure, no I/O; `msd.recipe.checks.check_recipe` runs them with the rest.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from msd.recipe.schema import Recipe

AXES = ("tp", "cp", "dp", "pp")


class Problem(NamedTuple):
    key: str
    message: str


def check_plan(recipe: Recipe) -> list[Problem]:
    return (
        _check_distribute(recipe)
        + _check_micro_batches(recipe)
        + _check_mix(recipe)
        + _check_cost(recipe)
    )


def _check_distribute(recipe: Recipe) -> list[Problem]:
    d = recipe.distribute
    problems = [
        Problem(f"distribute.{axis}", f"must be >= 1, got {getattr(d, axis)}; use at least 1")
        for axis in ("pp", "cp", "tp")
        if getattr(d, axis) < 1
    ]
    if sorted(d.order) != sorted(AXES):
        problems.append(
            Problem(
                "distribute.order",
                (
                    f"must list each of {', '.join(AXES)} once, got {list(d.order)}; "
                    "e.g. [tp, cp, dp, pp] (fastest first)"
                ),
            )
        )
    unit = 2 * d.cp
    fit = recipe.seq_len // unit * unit or unit
    if d.cp > 1 and recipe.seq_len % unit:
        problems.append(
            Problem(
                "seq_len",
                (
                    f"must be a multiple of 2 * distribute.cp = {unit} for context "
                    f"parallelism, got {recipe.seq_len}; use {fit}"
                ),
            )
        )
    return problems


def _check_micro_batches(recipe: Recipe) -> list[Problem]:
    mbs = recipe.micro_batch_size
    if mbs < 1:
        return [Problem("micro_batch_size", f"must be >= 1, got {mbs}; use 1 or more rows")]
    if recipe.distribute.dp < 1 or recipe.seq_len < 1:
        return []  # reported by the batch checks
    rows = recipe.rows_per_rank
    if rows >= 1 and rows % mbs:
        return [
            Problem(
                "micro_batch_size",
                (
                    f"must divide the {rows} rows each DP rank gets per step "
                    f"(global_batch_tokens / (dp * seq_len)), got {mbs}; use a divisor of {rows}"
                ),
            )
        ]
    return []


def _check_mix(recipe: Recipe) -> list[Problem]:
    names = [s.name for s in recipe.sources]
    problems: list[Problem] = []
    last = -1
    for i, milestone in enumerate(recipe.mix.milestones):
        key = f"mix.milestones[{i}]"
        if milestone.step <= last:
            problems.append(
                Problem(
                    f"{key}.step",
                    (
                        f"must be greater than the previous milestone's step {last}, got "
                        f"{milestone.step}; list milestones in increasing step order"
                    ),
                )
            )
        last = max(last, milestone.step)
        for name, weight in milestone.weights.items():
            if name not in names:
                problems.append(
                    Problem(
                        f"{key}.weights.{name}", (f"is not a source; use one of {', '.join(names)}")
                    )
                )
            elif not math.isfinite(weight) or weight < 0:
                problems.append(
                    Problem(
                        f"{key}.weights.{name}",
                        (f"must be a finite number >= 0, got {weight}; set a non-negative weight"),
                    )
                )
    return problems + _check_mix_not_empty(recipe)


def _check_mix_not_empty(recipe: Recipe) -> list[Problem]:
    """At every milestone some source must still have a positive weight."""
    current = {s.name: s.weight for s in recipe.sources}
    for i, milestone in enumerate(recipe.mix.milestones):
        current.update(milestone.weights)
        if not any(w > 0 for w in current.values()):
            return [
                Problem(
                    f"mix.milestones[{i}].weights",
                    ("leaves every source at weight 0; give one source a weight > 0"),
                )
            ]
    return []


def _check_cost(recipe: Recipe) -> list[Problem]:
    cost = recipe.cost
    problems = [
        Problem(f"cost.{name}", f"must be a finite number >= 0, got {value}; use e.g. 1.0")
        for name, value in (
            ("attn", cost.attn),
            ("lin", cost.lin),
            ("enc_attn", cost.enc_attn),
            ("enc_lin", cost.enc_lin),
        )
        if not math.isfinite(value) or value < 0
    ]
    if cost.function is not None and ":" not in cost.function:
        problems.append(
            Problem(
                "cost.function",
                (f"must be module:function, got {cost.function!r}; e.g. mycosts:flops"),
            )
        )
    return problems
