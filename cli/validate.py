from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from msd.launch.check import check_sources
from msd.recipe.load import load_recipe

from .common import console, user_errors


@user_errors
def validate(
    recipe: Annotated[Path, typer.Argument(help="The recipe YAML file.")],
) -> None:
    """Check a recipe and open every source (schemas, columns, files) without starting anything."""
    parsed = load_recipe(recipe)
    summaries = check_sources(parsed, recipe)
    table = Table(title=f"{recipe}: valid")
    for column in ("source", "files", "row groups", "rows", "column", "weight", "loaders"):
        table.add_column(column)
    for s in summaries:
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
