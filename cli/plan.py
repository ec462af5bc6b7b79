from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from msd.control.shortlist import SHOWN, shortlist
from msd.launch.auto_loaders import AutoPlan, plan_loaders, prepared, resolve
from msd.launch.check import check_sources
from msd.plan.partition import LoaderProcess, Placement, loader_processes, placements
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe

from .common import console, user_errors
from .validate import warn_long_samples


def plan_rows(
    recipe: Recipe, plan: AutoPlan, processes: Sequence[LoaderProcess]
) -> list[dict[str, object]]:
    """A row per source: its profile, share of the loader time (of the sources the plan
    shares out) and where ``processes`` (what `msd launch` starts) read it, and why."""
    chosen = plan.auto or tuple(range(len(recipe.sources)))
    places = placements(len(recipe.sources), processes)
    rows = []
    for i, source in enumerate(recipe.sources):
        p = plan.profiles[i]
        share = plan.allocation.need[chosen.index(i)] if i in chosen else None
        row: dict[str, object] = {
            "source": source.name,
            "recipe_loaders": source.loaders,
            "peak_token_share": round(plan.token_shares[i], 4),
            "tokens_per_sample": round(p.tokens_per_sample, 1),
            "us_per_token": round(1e6 * p.seconds_per_token, 3),
            "profiled_samples": p.samples,
            "loaders": places[i].own or None,
            "shared_process": places[i].shared,
        }
        if share is not None:
            row["loader_time_share"] = round(share, 4)
        row["why"] = _why(share if source.loaders == "auto" else None, places[i])
        rows.append(row)
    return rows


def _why(auto_share: float | None, place: Placement) -> str:
    """Why a source is read where it is: its share of the loader time (``loaders: auto``),
    else the recipe."""
    cause = "set in the recipe" if auto_share is None else f"{auto_share:.1%} of the loader time"
    if place.shared is None:
        return f"{cause}: {place.own} process(es) of its own"
    return f"{cause}: shares process {place.shared} with {place.others} other source(s)"


@user_errors
def plan(
    recipe: Annotated[Path, typer.Argument(help="The recipe YAML file.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    every_row: Annotated[
        bool, typer.Option("--all", help="Every source (by default the 12 with most tokens).")
    ] = False,
) -> None:
    """Profile each source briefly and show how `loaders: auto` shares the loader processes."""
    parsed = prepared(load_recipe(recipe))
    check_sources(parsed, recipe)
    result = plan_loaders(parsed)
    # What msd launch starts: the allocation where sources are auto, the recipe's elsewhere.
    launched = loader_processes(resolve(parsed, result))
    rows = plan_rows(parsed, result, launched)
    processes = len(launched)
    warn_long_samples(parsed, result.profiles)
    if json_out:
        print(json.dumps({"cpus": result.cpus, "processes": processes, "sources": rows}, indent=2))
        return
    scope = "sources with loaders: auto" if result.auto else "every source (none is auto)"
    table = Table(title=f"{result.cpus} loader CPUs over {scope}: {processes} processes")
    for column in (
        "source",
        "share of tokens",
        "tokens/sample",
        "µs/token",
        "loader time",
        "loaders",
        "why",
    ):
        table.add_column(column, justify="left" if column in ("source", "why") else "right")
    shown, rest = shortlist(rows, _most_tokens_first, None if every_row else SHOWN)
    for row in shown:
        table.add_row(
            str(row["source"]),
            f"{row['peak_token_share']:.3f}",
            f"{row['tokens_per_sample']:.0f}",
            f"{row['us_per_token']:.2f}",
            f"{row['loader_time_share']:.1%}" if "loader_time_share" in row else "-",
            str(row["loaders"] or "shared"),
            str(row["why"]),
        )
    console.print(table)
    if rest:
        share = sum(_share(row) for row in rest)
        more = f"and {len(rest):,} more sources: {share:.3f} of the tokens (--all or --json)"
        console.print(Text(more, "dim"))


def _share(row: dict[str, object]) -> float:
    share = row["peak_token_share"]
    return float(share) if isinstance(share, int | float) else 0.0


def _most_tokens_first(row: dict[str, object]) -> tuple[float, str]:
    return (-_share(row), str(row["source"]))
