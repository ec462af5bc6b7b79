from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from msd.control.shortlist import SHOWN, shortlist
from msd.errors import MsdError
from msd.launch.auto_loaders import prepared
from msd.launch.check import SourceSummary, check_sources
from msd.launch.long_sample_warnings import long_sample_warnings
from msd.plan.advice import count_processes, too_many_loaders
from msd.recipe.hints import missing_eos
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe
from msd.sources.first_samples import check_first_samples
from msd.sources.profile import SourceProfile

from .common import console, err_console, user_errors


def warn_if_many_loaders(processes: int, cluster: str) -> None:
    """A warning on stderr when the job would start too many loader processes."""
    advice = too_many_loaders(processes, os.cpu_count() or 1, cluster)
    if advice is not None:
        err_console.print(f"[bold yellow]warning:[/] {advice}", highlight=False, soft_wrap=True)


def warn_long_samples(recipe: Recipe, profiles: Sequence[SourceProfile] | None = None) -> None:
    """A warning on stderr for each source whose samples lose tokens to long_samples."""
    for warning in long_sample_warnings(recipe, profiles):
        err_console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)


@user_errors
def validate(
    recipe: Annotated[Path, typer.Argument(help="The recipe YAML file.")],
    every_row: Annotated[
        bool, typer.Option("--all", help="Every source (by default the 12 largest weights).")
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print {valid, errors, warnings, sources} as JSON (warnings on stderr too).",
        ),
    ] = False,
) -> None:
    """Check a recipe and open every source (schemas, columns, files, the header of each file's
    first video) without starting anything."""
    try:
        parsed = prepared(load_recipe(recipe))
        summaries = check_sources(parsed, recipe, probe_videos=True)
        check_first_samples(parsed, recipe)
    except MsdError as exc:
        if json_out:  # the verdict for scripts; the sentence goes to stderr as without --json
            print(json.dumps({"valid": False, "errors": [str(exc)], "warnings": []}, indent=2))
        raise
    warnings = _warnings(parsed, summaries)
    if json_out:
        sources = [_source_json(s) for s in summaries]
        found = {"valid": True, "errors": [], "warnings": warnings, "sources": sources}
        print(json.dumps(found, indent=2))
    else:
        _print_table(recipe, summaries, every_row)
    for warning in warnings:
        err_console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)


def _print_table(recipe: Path, summaries: list[SourceSummary], every_row: bool) -> None:
    table = Table(title=f"{recipe}: valid")
    for column in ("source", "files", "row groups", "rows", "column", "weight", "loaders"):
        table.add_column(column)
    shown, rest = shortlist(summaries, _heaviest_first, None if every_row else SHOWN)
    for s in shown:
        table.add_row(
            s.name,
            str(s.files),
            str(s.row_groups),
            str(s.rows),
            s.column,
            f"{s.weight:g}",
            str(s.loaders),
        )
    console.print(table)
    if rest:
        files = sum(s.files for s in rest)
        rows_left = sum(s.rows for s in rest)
        line = f"and {len(rest):,} more sources: {files:,} files, {rows_left:,} rows (--all)"
        console.print(Text(line, "dim"))


def _warnings(parsed: Recipe, summaries: list[SourceSummary]) -> list[str]:
    """Every warning about the recipe and its sources, in the order they are printed."""
    found = [
        w
        for s in summaries
        for w in (s.left_out_warning(), *s.video_warnings(), *s.conversation_warnings())
        if w is not None
    ]
    cpus = os.cpu_count() or 1
    many = too_many_loaders(count_processes(parsed, cpus), cpus, parsed.cluster)
    return [*found, *([many] if many else []), *long_sample_warnings(parsed), *missing_eos(parsed)]


def _source_json(s: SourceSummary) -> dict[str, object]:
    """A row of the table as ``--json`` prints it."""
    return {
        "name": s.name,
        "files": s.files,
        "row_groups": s.row_groups,
        "rows": s.rows,
        "column": s.column,
        "weight": s.weight,
        "loaders": s.loaders,
    }


def _heaviest_first(summary: SourceSummary) -> tuple[float, str]:
    return (-summary.weight, summary.name)
