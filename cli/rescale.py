from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from msd.control.planner_connection import request
from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.jobdir.rescales import load_rescales
from msd.jobdir.runs import is_live
from msd.recipe.schema import Recipe
from msd.wire.protocol import Rescale, Rescaling

from .common import console, user_errors

# How long `msd rescale` waits by default for the new generation to read (it stops sooner when
# the job ends); --timeout-s changes it.
RESCALE_WAIT_S = 120.0


@user_errors
def rescale(
    job: Annotated[Path, typer.Argument(help="The job folder.")],
    source: Annotated[str, typer.Option(help="The source whose loaders change.")],
    loaders: Annotated[int, typer.Option(help="Loader processes for it from now on.")],
    wait: Annotated[
        bool, typer.Option(help="Wait until the new loaders read (--no-wait: return at once).")
    ] = True,
    timeout_s: Annotated[float, typer.Option(help="How long --wait waits.")] = RESCALE_WAIT_S,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print {source, loaders, generation, start} as JSON once done "
            "(start: the visit it reads from; null with --no-wait).",
        ),
    ] = False,
) -> None:
    """Start or retire loaders of one source while the job runs; the stream does not change."""
    folder = JobDir(job)
    if not folder.job_json.exists():
        raise LaunchError(f"{job} is not an msd job folder (no job.json)")
    if loaders < 1:
        raise LaunchError(f"--loaders must be at least 1, got {loaders}")
    reply: Rescaling = request(folder, Rescale(source=source, loaders=loaders), Rescaling)
    if not json_out:
        console.print(
            f"{source}: generation {reply.generation} of {reply.loaders} loader(s) is starting"
        )
    start = _wait_for_start(folder, job, reply, timeout_s) if wait else None
    if json_out:
        done = {"source": source, "loaders": reply.loaders, "generation": reply.generation}
        print(json.dumps({**done, "start": start}))
    elif start is not None:
        console.print(f"{source}: generation {reply.generation} reads from visit {start}")


def _wait_for_start(folder: JobDir, job: Path, reply: Rescaling, timeout_s: float) -> int:
    """The visit the new generation reads from, once it reads; a LaunchError if the job ends
    first or ``timeout_s`` passes."""
    source = reply.source
    recipe = folder.recipe()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = is_live(folder.root)  # asked first: a generation may start as the job ends
        start = _start(folder, recipe, source, reply.generation)
        if start is not None:
            return start
        if not live:
            raise LaunchError(
                f"the job in {job} ended before generation {reply.generation} of {source} read; "
                "its stream was not changed"
            )
        time.sleep(0.2)
    raise LaunchError(
        f"generation {reply.generation} of {source} did not start within {timeout_s:.0f} s; "
        f"see {folder.logs}"
    )


def _start(folder: JobDir, recipe: Recipe, source: str, generation: int) -> int | None:
    """The visit generation ``generation`` of ``source`` reads from; None before it reads."""
    for g in load_rescales(folder.rescales, recipe):
        if recipe.sources[g.source].name == source and g.number == generation:
            return g.start
    return None
