"""What `msd status` shows of a job with many sources and loader processes: the rows that most
need a look, and one line summing up the rest; `--all` shows every row."""

from __future__ import annotations

from typing import Any

from msd.cli.status import render
from rich.console import Console

from msd.control.shortlist import SHOWN, shortlist, source_first


def _source(i: int, **over: Any) -> dict[str, Any]:
    row = {
        "name": f"src{i:04d}",
        "weight": 1.0 / (i + 1),
        "samples_per_s": 10.0,
        "tokens_per_s": 1000.0,
        "loaders": 1,
        "queue_samples": 5,
        "queue_tokens": 500,
        "errors": 0,
    }
    return {**row, **over}


def _process(name: str, cpu: float, state: str = "running") -> dict[str, Any]:
    return {
        "name": name,
        "node": "local",
        "pid": 1,
        "state": state,
        "cpu_percent": cpu,
        "pss_bytes": 2**20,
        "samples_per_s": 1.0,
        "ready_bytes": 0,
    }


def _status(sources: list[dict[str, Any]], loaders: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "many",
        "job": {
            "state": "running",
            "step": 5,
            "steps": 10,
            "steps_per_s": 1.0,
            "tokens_per_s": 1.0,
            "uptime_s": 1.0,
            "failure": None,
        },
        "wait_p50_ms": 0.1,
        "wait_p99_ms": 0.2,
        "sources": sources,
        "loaders": loaders,
        "constructors": [_process("constructor/local", 5.0)],
        "ranks": [],
        "planner": {
            "pid": 1,
            "plan_ms_p50": 1.0,
            "plan_ms_p99": 1.0,
            "balance_max_over_mean": 1.0,
            "planned_ahead": 2,
            "lifecycle": {},
        },
        "slurm": [],
    }


def _screen(data: dict[str, Any], every_row: bool = False) -> str:
    console = Console(width=250, record=True)
    console.print(render(data, every_row))
    return console.export_text()


def test_a_few_rows_are_all_shown_in_their_order() -> None:
    rows = [_source(i) for i in range(5)]
    assert shortlist(rows, source_first) == (rows, [])


def test_sources_in_trouble_come_first_then_the_heaviest() -> None:
    rows = [_source(i) for i in range(100)]
    rows[70]["errors"] = 3  # read retries
    rows[80]["queue_samples"] = 0  # drawn, nothing queued
    rows[90].update(weight=0.0, queue_samples=0)  # not drawn: nothing to wait for
    shown, rest = shortlist(rows, source_first)
    assert [s["name"] for s in shown[:2]] == ["src0070", "src0080"]
    assert [s["name"] for s in shown[2:]] == [f"src{i:04d}" for i in range(SHOWN - 2)]
    assert len(rest) == 100 - SHOWN and rows[90] in rest


def test_status_of_1000_sources_fits_a_screen_and_all_lists_every_row() -> None:
    sources = [_source(i) for i in range(1000)]
    loaders = [_process(f"group{i}", cpu=i % 7) for i in range(200)]
    loaders[150]["state"] = "exited"
    screen = _screen(_status(sources, loaders))
    assert len(screen.splitlines()) < 60
    assert sum(f"src{i:04d}" in screen for i in range(1000)) == SHOWN
    assert "and 988 more sources: weight" in screen and "--all or --json" in screen
    assert "and 188 more loader processes: 188 running" in screen
    assert "group150" in screen  # not running: shown first
    everything = _screen(_status(sources, loaders), every_row=True)
    assert all(f"src{i:04d}" in everything for i in range(1000))
    assert "more sources" not in everything
