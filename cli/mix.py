from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from msd.control.planner_connection import request
from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.wire.protocol import MixSet, SetMix

from .common import console, user_errors


def parse_weights(pairs: list[str]) -> dict[str, float]:
    """``["web=0.6", "code=0.4"]`` → ``{"web": 0.6, "code": 0.4}``, with a clear error."""
    weights: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise LaunchError(f"--set {pair!r} is not SOURCE=WEIGHT")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise LaunchError(f"--set {pair!r}: {value!r} is not a number") from None
    return weights


@user_errors
def mix(
    job: Annotated[Path, typer.Argument(help="The job folder.")],
    set_: Annotated[
        list[str], typer.Option("--set", help="SOURCE=WEIGHT (repeat for several sources).")
    ],
    at_step: Annotated[
        int | None,
        typer.Option(help="The first step with the new weights (default: the next unplanned)."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print {at_step, weights, history} as JSON.")
    ] = False,
) -> None:
    """Change the mix of a running job from a future step on (recorded in its mix history)."""
    folder = JobDir(job)
    if not folder.job_json.exists():
        raise LaunchError(f"{job} is not an msd job folder (no job.json)")
    if at_step is not None and at_step < 0:
        raise LaunchError(f"--at-step must be >= 0, got {at_step}")
    weights = parse_weights(set_)
    reply: MixSet = request(
        folder, SetMix(weights=weights, at_step=-1 if at_step is None else at_step), MixSet
    )
    if json_out:
        history = str(folder.mix_history)
        print(json.dumps({"at_step": reply.at_step, "weights": reply.weights, "history": history}))
        return
    shown = ", ".join(f"{k}={v:g}" for k, v in reply.weights.items())
    console.print(f"from step {reply.at_step}: {shown} (recorded in {folder.mix_history})")
