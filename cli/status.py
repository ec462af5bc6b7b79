from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from msd.control.job_status import fetch_view, resolve_job, status_json
from msd.control.shortlist import (
    SHOWN,
    process_first,
    processes_left,
    shortlist,
    source_first,
    sources_left,
)
from msd.jobdir import JobDir

from .common import RunsOption, console, user_errors

RANKS_SHOWN = 8  # the ranks with the highest p99 data-wait; --json has them all


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def render(data: dict[str, Any], every_row: bool = False) -> Group:
    """One screen answering "is data keeping up, and if not, why"; with many sources, loaders
    or Constructors, the rows that most need a look and a line summing up the rest
    (``every_row``: all of them)."""
    limit = None if every_row else SHOWN
    job, planner = data["job"], data["planner"]
    steps = f"/{job['steps']}" if job["steps"] is not None else ""
    header = Text.assemble(
        (f"{data['name']} ", "bold"),
        (f"[{job['state']}] ", "bold green" if job["state"] == "running" else "bold"),
        (f"step {job['step']}{steps}  ·  {job['steps_per_s']:.2f} steps/s  ·  ", ""),
        (f"{job['tokens_per_s']:,.0f} tokens/s  ·  up {job['uptime_s']:.0f} s  ·  ", ""),
        (f"data-wait p50 {data['wait_p50_ms']:.2f} ms p99 {data['wait_p99_ms']:.2f} ms", "bold"),
    )
    parts: list[Any] = [header]
    if job["failure"]:
        parts.append(Text(f"failure: {job['failure']}", style="bold red"))
    images = any(s.get("skipped_images") for s in data["sources"])
    columns = ["source", "weight", "samples/s", "tokens/s", "loaders", "queue", "queue tok"]
    sources = _table(
        "sources", [*columns, "read retries", *(["images left out"] if images else [])]
    )
    shown_sources, other_sources = shortlist(data["sources"], source_first, limit)
    for s in shown_sources:
        extra = [f"{s.get('skipped_images', 0):,}"] if images else []
        sources.add_row(
            s["name"],
            f"{s['weight']:.3f}",
            f"{s['samples_per_s']:,.1f}",
            f"{s['tokens_per_s']:,.0f}",
            str(s["loaders"]),
            f"{s['queue_samples']:,}",
            f"{s['queue_tokens']:,}",
            str(s["errors"]),
            *extra,
        )
    loaders = _table("loaders", ["loader", "node", "pid", "state", "CPU %", "PSS", "samples/s"])
    shown_loaders, other_loaders = shortlist(data["loaders"], process_first, limit)
    for lo in shown_loaders:
        loaders.add_row(
            lo["name"],
            lo["node"],
            str(lo["pid"]),
            lo["state"],
            f"{lo['cpu_percent']:.0f}",
            _mib(lo["pss_bytes"]),
            f"{lo['samples_per_s']:,.1f}",
        )
    ranks = _table(
        "ranks (highest p99 first)", ["rank", "constructor", "step", "ahead", "p50 ms", "p99 ms"]
    )
    for r in sorted(data["ranks"], key=lambda r: -r["wait_p99_ms"])[:RANKS_SHOWN]:
        ranks.add_row(
            str(r["rank"]),
            r["constructor"],
            str(r["step"]),
            str(r["ahead"]),
            f"{r['wait_p50_ms']:.2f}",
            f"{r['wait_p99_ms']:.2f}",
        )
    constructors = _table(
        "constructors",
        ["constructor", "node", "pid", "state", "CPU %", "PSS", "ready", "relayed", "rejected"],
    )
    shown_constructors, other_constructors = shortlist(data["constructors"], process_first, limit)
    for c in shown_constructors:
        constructors.add_row(
            c["name"],
            c["node"],
            str(c["pid"]),
            c["state"],
            f"{c['cpu_percent']:.0f}",
            _mib(c["pss_bytes"]),
            _mib(c["ready_bytes"]),
            _mib(c.get("relayed_bytes", 0)),
            _rejected(c.get("rejected", {})),
        )
    lifecycle = ", ".join(f"{k} {v:,}" for k, v in sorted(planner["lifecycle"].items()))
    plan = Text(
        f"planner pid {planner['pid']}: plan p50 {planner['plan_ms_p50']:.1f} ms "
        f"p99 {planner['plan_ms_p99']:.1f} ms · balance max/mean "
        f"{planner['balance_max_over_mean']:.3f} · {planner['planned_ahead']} steps ahead · "
        f"samples: {lifecycle or '-'} · rejected: {_rejected(planner.get('rejected', {}))}"
    )
    parts.append(sources)
    if other_sources:
        parts.append(Text(sources_left(other_sources), "dim"))
    parts.append(loaders)
    if other_loaders:
        parts.append(Text(processes_left(other_loaders, "loader processes"), "dim"))
    parts.append(constructors)
    if other_constructors:
        parts.append(Text(processes_left(other_constructors, "Constructors"), "dim"))
    parts += [ranks, plan]
    if data["slurm"]:
        slurm = _table("SLURM jobs", ["role", "job", "state"])
        for j in data["slurm"]:
            slurm.add_row(j["role"], j["job_id"], j["state"])
        parts.append(slurm)
    return Group(*parts)


def _rejected(counts: dict[str, int]) -> str:
    """Messages a role dropped, by reason (docs/security.md): ``0``, or ``12 (malformed 12)``."""
    total = sum(counts.values())
    if not total:
        return "0"
    return f"{total:,} (" + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) + ")"


def _snapshot(folder: JobDir) -> dict[str, Any]:
    return status_json(folder, fetch_view(folder))


@user_errors
def status(
    job: Annotated[
        Path | None, typer.Argument(help="The job folder (default: the newest in --runs).")
    ] = None,
    runs: RunsOption = Path("runs"),
    watch: Annotated[bool, typer.Option("--watch", help="Refresh in place until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the status as JSON (docs/status.md).")
    ] = False,
    every_row: Annotated[
        bool,
        typer.Option("--all", help="Every source, loader and Constructor (by default 12 each)."),
    ] = False,
) -> None:
    """Is data keeping up, and if not, why: job, sources, loaders, Constructors, ranks."""
    folder = resolve_job(job, runs)
    if json_out and not watch:
        print(json.dumps(_snapshot(folder), indent=2))
        return
    if not watch:
        console.print(render(_snapshot(folder), every_row))
        return
    try:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                data = _snapshot(folder)
                if json_out:
                    print(json.dumps(data), flush=True)
                else:
                    live.update(render(data, every_row), refresh=True)
                if data["job"]["state"] == "done":
                    return
                time.sleep(interval)
    except KeyboardInterrupt:
        return
