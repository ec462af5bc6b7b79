from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from msd.jobdir.runs import LOST, UNREADABLE, RunInfo, human_age, list_runs

from .common import RunsOption, console, user_errors

_STYLES = {
    "running": "green",
    "done": "blue",
    "failed": "red",
    "stopped": "yellow",
    LOST: "red",
    UNREADABLE: "yellow",
}


@user_errors
def ls(
    run_dir: RunsOption = Path("runs"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the jobs as JSON.")] = False,
) -> None:
    """List the jobs of a run folder, newest first: state (running, done, failed, stopped, or
    lost: its launcher is gone), age and the last step every rank consumed."""
    # no run folder yet (nothing launched here) lists no jobs; a file in its place is a typo
    runs = list_runs(run_dir, now=time.time()) if run_dir.exists() else []
    if json_out:
        print(json.dumps([r.as_json() for r in runs], indent=2))
    elif not runs:
        console.print(f"no jobs in {run_dir}", highlight=False, soft_wrap=True)
    else:
        console.print(_table(runs))


def _table(runs: list[RunInfo]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("name", "cluster", "state", "age", "step"):
        table.add_column(column, justify="right" if column in ("age", "step") else "left")
    for r in runs:
        step = "-" if r.step is None else f"{r.step:,}"
        state = Text(r.state, style=_STYLES.get(r.state, ""))
        table.add_row(Text(r.name), Text(r.cluster), state, human_age(r.age_s), step)
    return table
