"""The ``msd`` command: a thin typer layer over the ``msd`` library."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer

import msd
import msd.logs

from . import (
    checkpoint,
    init,
    launch,
    ls,
    mix,
    peek,
    plan,
    report,
    rescale,
    restore,
    sidecar,
    status,
    stop,
    synth,
    validate,
)

app = typer.Typer(
    name="msd",
    help="A multi-source data plane for large-model training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"msd {msd.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="Log more: -v what happens (INFO), -vv everything (DEBUG); roles log at it too.",
        ),
    ] = 0,
) -> None:
    """A multi-source data plane for large-model training."""
    level = msd.logs.level_from_verbosity(verbose)
    msd.logs.setup("msd", level=level)
    if verbose:  # the roles this command starts log at it too (else at INFO, their default)
        os.environ[msd.logs.LEVEL_ENV] = logging.getLevelName(level)


app.command("synth")(synth.synth)
app.command("init")(init.init)
app.command("validate")(validate.validate)
app.command("plan")(plan.plan)
app.command("launch")(launch.launch)
app.command("stop")(stop.stop)
app.command("status")(status.status)
app.command("mix")(mix.mix)
app.command("rescale")(rescale.rescale)
app.command("checkpoint")(checkpoint.checkpoint)
app.command("restore")(restore.restore)
app.command("ls")(ls.ls)
app.command("report")(report.report)
app.command("peek")(peek.peek)
app.command("sidecar")(sidecar.sidecar)


def main() -> None:
    app()
