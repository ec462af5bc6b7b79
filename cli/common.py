"""What every command shares: one console, and the one place user errors become exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

from msd.errors import MsdError

console = Console()
err_console = Console(stderr=True)

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
