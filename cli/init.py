from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Annotated

import typer

from msd.errors import MsdError

from .common import console, user_errors


@user_errors
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the starter recipe.")] = Path(
        "recipe.yaml"
    ),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter recipe."""
    if path.exists() and not force:
        raise MsdError(f"{path} already exists; pass --force to overwrite it")
    path.write_text(files("msd.templates").joinpath("recipe.yaml").read_text())
    console.print(f"wrote {path}; edit its sources, then: msd validate {path} && msd launch {path}")
