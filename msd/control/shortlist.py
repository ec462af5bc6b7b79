"""Which rows a screen shows when a job has hundreds of sources, loaders or nodes: the ones that
most need a look, and one line summing up the rest (``--all`` and ``--json`` list every row)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

SHOWN = 12  # rows of a table on one screen

Row = dict[str, Any]
T = TypeVar("T")


def shortlist(
    rows: Sequence[T], key: Callable[[T], Any], limit: int | None = SHOWN
) -> tuple[list[T], list[T]]:
    """(rows to show, rows left out): every row when there are at most ``limit`` (or ``limit``
    is None), in their own order; else the first ``limit`` by ``key``, in that order."""
    if limit is None or len(rows) <= limit:
        return list(rows), []
    ranked = sorted(rows, key=key)
    return ranked[:limit], ranked[limit:]


def source_first(s: Row) -> tuple[bool, bool, float, str]:
    """Sources with read retries, then drawn sources with nothing queued, then by weight."""
    starving = s["weight"] > 0 and s["queue_samples"] == 0
    return (s["errors"] == 0, not starving, -s["weight"], s["name"])


def process_first(p: Row) -> tuple[bool, float, str]:
    """Processes that are not running, then the busiest."""
    return (p["state"] == "running", -p["cpu_percent"], p["name"])


def sources_left(rest: list[Row]) -> str:
    errors = sum(s["errors"] for s in rest)
    return (
        f"and {len(rest):,} more sources: weight {sum(s['weight'] for s in rest):.3f}, "
        f"{sum(s['samples_per_s'] for s in rest):,.1f} samples/s, "
        f"{sum(s['tokens_per_s'] for s in rest):,.0f} tokens/s, "
        f"{sum(s['queue_samples'] for s in rest):,} samples queued, {errors:,} read retries "
        "(--all or --json lists every one)"
    )


def processes_left(rest: list[Row], what: str) -> str:
    running = sum(p["state"] == "running" for p in rest)
    pss_mib = sum(p["pss_bytes"] for p in rest) / 2**20
    return (
        f"and {len(rest):,} more {what}: {running:,} running, "
        f"CPU {sum(p['cpu_percent'] for p in rest):,.0f} %, PSS {pss_mib:,.0f} MiB "
        "(--all or --json lists every one)"
    )
