"""What every command shares: one console, and the one place user errors become exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console

from msd.errors import MsdError

console = Console()
err_console = Console(stderr=True)

# The run folder, one option for every command that takes one: `--runs` and `--run-dir` are
# the same option (`msd launch` and `msd restore` said --run-dir, `msd ls` and `msd status`
# --runs).
RunsOption = Annotated[
    Path,
    typer.Option(
        "--runs",
        "--run-dir",
        help="The run folder: where msd launch and msd restore create job folders, and where "
        "msd ls and msd status find them.",
    ),
]

P = ParamSpec("P")
R = TypeVar("R")


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Print an MsdError as one line, without a traceback, and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except MsdError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper
