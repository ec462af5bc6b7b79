from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from msd.errors import LaunchError
from msd.jobdir.history import load_history
from msd.launch.auto_loaders import AutoPlan
from msd.launch.job import INTERRUPTED, Job, summary
from msd.launch.prepare import auto_loaders_line, new_job, prepare_launch
from msd.launch.slurm_plan import submissions
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe
from msd.wire.protocol import Status

from .common import RunsOption, console, err_console, user_errors

SOURCES_SHOWN = 12  # rows of the progress view; the largest weights first beyond that


def progress_view(status: Status, weights: dict[str, float]) -> Group:
    """One screen: step, throughput, trainer data-wait, each source's share against its weight."""
    s = summary(status)
    header = Text.assemble(
        ("step ", "dim"),
        (f"{status.consumed}", "bold"),
        (f"/{status.steps}" if status.steps is not None else "", "dim"),
        ("  ·  ", "dim"),
        (f"{s['tokens_per_s']:,.0f}", "bold"),
        (" tokens/s", "dim"),
        ("  ·  data-wait p50 ", "dim"),
        (f"{s['wait_p50_ms']:.2f} ms", "bold"),
        (" p99 ", "dim"),
        (f"{s['wait_p99_ms']:.2f} ms", "bold"),
    )
    bar = Table.grid()  # a grid row ends the bar's line
    bar.add_row(
        ProgressBar(total=float(status.steps or 0) or None, completed=status.consumed, width=60)
    )
    table = Table(box=None, pad_edge=False)
    table.add_column("source")
    table.add_column("weight", justify="right")
    table.add_column("share of samples", justify="right")
    shares: dict[str, float] = s["sources"]
    shown = sorted(shares, key=lambda n: -weights[n])[:SOURCES_SHOWN]
    for name in shares:
        if name in shown:
            table.add_row(name, f"{weights[name]:.3f}", f"{shares[name]:.3f}")
    if len(shares) > len(shown):
        more = Text(f"and {len(shares) - len(shown)} more sources (--json has them all)", "dim")
        return Group(header, bar, table, more)
    return Group(header, bar, table)


def _final_table(status: Status) -> Table:
    s = summary(status)
    table = Table(title="run summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "steps",
        "tokens",
        "elapsed_s",
        "tokens_per_s",
        "wait_p50_ms",
        "wait_p99_ms",
        "split_samples",
        "truncated_samples",
        "dropped_samples",
        "truncated_tokens",
        "empty_samples",
        "images",
        "skipped_images",
    ):
        table.add_row(key, f"{s[key]:,}" if isinstance(s[key], int) else f"{s[key]:,.3f}")
    return table


@user_errors
def launch(
    recipe: Annotated[Path, typer.Argument(help="The recipe YAML file.")],
    cluster: Annotated[str | None, typer.Option(help="local (default) or slurm.")] = None,
    run_dir: RunsOption = Path("runs"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the SLURM jobs that would be submitted.")
    ] = False,
    mix_history: Annotated[
        Path | None,
        typer.Option(help="Replay the mix changes of a job (its JOB/mix-history.json)."),
    ] = None,
) -> None:
    """Start a job: Planner, Source Loaders, Data Constructors and trainer ranks."""
    parsed = load_recipe(recipe)
    if mix_history is not None and not mix_history.is_file():
        raise LaunchError(f"--mix-history {mix_history} is not a file")
    changes = load_history(mix_history, parsed) if mix_history is not None else ()
    ready = prepare_launch(parsed, cluster, recipe)
    show_auto_loaders(ready.recipe, ready.auto, json_out)
    for warning in ready.warnings:
        err_console.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if dry_run:
        _print_submissions(ready.recipe, json_out)
        return
    job = new_job(ready.recipe, recipe.read_text(), run_dir, ready.cluster, changes)
    run_job(job, ready.recipe, ready.cluster, json_out)


def show_auto_loaders(parsed: Recipe, auto: AutoPlan | None, json_out: bool) -> None:
    """What ``loaders: auto`` decided (unless --json)."""
    if auto is not None and not json_out:
        console.print(auto_loaders_line(parsed, auto), highlight=False)


def run_job(job: Job, parsed: Recipe, chosen: str, json_out: bool) -> None:
    """Run a prepared job to its end with live progress; the summary, or an exit code ≠ 0."""
    weights = {s.name: s.weight / sum(x.weight for x in parsed.sources) for s in parsed.sources}
    if not json_out:
        # one line whatever the width: scripts read the folder from it
        console.print(f"job folder: {job.job.root}", highlight=False, soft_wrap=True, markup=False)
    live = (
        Live(console=console, transient=False, auto_refresh=False) if console.is_terminal else None
    )
    with live or _Null():
        outcome = job.run(
            lambda st: live.update(progress_view(st, weights), refresh=True) if live else None,
            on_started=_print_slurm_ids if chosen == "slurm" and not json_out else None,
        )
    if not outcome.ok:
        err_console.print(f"[bold red]error:[/] {outcome.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(130 if outcome.message == INTERRUPTED else 1)
    if outcome.status is None:
        raise LaunchError(f"the job ended without a status from its planner; see {job.job.logs}")
    if json_out:
        print(json.dumps({"job": str(job.job.root), **summary(outcome.status)}, indent=2))
    else:
        if live is None:
            console.print(progress_view(outcome.status, weights))
        console.print(_final_table(outcome.status))


def _print_slurm_ids(ids: dict[str, str]) -> None:
    console.print("SLURM jobs: " + ", ".join(f"{name} {i}" for name, i in ids.items()))


def _print_submissions(recipe: Recipe, json_out: bool) -> None:
    subs = submissions(recipe)
    if json_out:
        rows = [{"role": s.role, "name": s.name, "parameters": s.parameters} for s in subs]
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="would submit (submitit parameters)")
    for column in ("role", "name", "parameters"):
        table.add_column(column)
    for s in subs:
        table.add_row(s.role, s.name, json.dumps(s.parameters, sort_keys=True))
    console.print(table)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
