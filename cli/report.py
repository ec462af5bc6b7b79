from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from msd.control.report import load_series, plot
from msd.jobdir import JobDir

from .common import console, user_errors


@user_errors
def report(
    job: Annotated[Path, typer.Argument(help="The job folder (runs/NAME-DATE-TIME).")],
    out: Annotated[
        Path | None, typer.Option(help="The PNG to write (default: JOB/report.png).")
    ] = None,
) -> None:
    """Plot a job's throughput, data-wait, balance and mix over time, from JOB/metrics.jsonl."""
    folder = JobDir(job)
    series = load_series(folder.metrics)
    written = plot(series, out or folder.root / "report.png", title=folder.root.name)
    console.print(str(written), highlight=False, soft_wrap=True)
