"""``msd report``: a job's figures over time, read from ``JOB/metrics.jsonl`` and drawn as a PNG.

The Planner appends one JSON object a second (version 1)::

    {"time", "uptime_s", "state", "step", "planned", "steps_per_s", "tokens_per_s", "tokens",
     "wait_p50_ms", "wait_p99_ms", "balance_max_over_mean", "plan_ms_p99", "loaders",
     "sources": {NAME: {"weight", "tokens_per_s", "queue_samples"}}}

A job may be read while it runs, or after it was killed mid-write, so a malformed *last* line is
a line still being written and is skipped; a malformed line before it is a damaged file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msd.errors import LaunchError

# the figures a plot needs from every line
_NUMBERS = (
    "time",
    "steps_per_s",
    "tokens_per_s",
    "wait_p50_ms",
    "wait_p99_ms",
    "balance_max_over_mean",
)


@dataclass(frozen=True)
class Series:
    """One value per metrics line; a source's weight is NaN on lines that do not name it."""

    minutes: tuple[float, ...]  # since the first line
    steps_per_s: tuple[float, ...]
    tokens_per_s: tuple[float, ...]
    wait_p50_ms: tuple[float, ...]
    wait_p99_ms: tuple[float, ...]
    balance: tuple[float, ...]
    source_weights: Mapping[str, tuple[float, ...]]


def load_series(path: Path) -> Series:
    """The figures of a job's ``metrics.jsonl`` file."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise LaunchError(f"{path} does not exist; is {path.parent} a job folder?") from None
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    records: list[dict[str, Any]] = []
    for i, (number, line) in enumerate(numbered):
        try:
            records.append(_record(line))
        except ValueError as exc:
            if i == len(numbered) - 1:
                break  # still being written, or cut short by a crash
            raise LaunchError(f"{path} line {number} is malformed ({exc})") from None
    if not records:
        raise LaunchError(f"{path} has no complete line yet; the job writes one a second")
    return _series(records)


def _record(line: str) -> dict[str, Any]:
    """One parsed line; ValueError (naming what is wrong) if it is not a metrics record."""
    record = json.loads(line)  # json.JSONDecodeError is a ValueError
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    for key in _NUMBERS:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key!r} is {value!r}, not a number")
    if not isinstance(record.get("sources", {}), dict):
        raise ValueError("'sources' is not an object")
    return record


def _series(records: Sequence[dict[str, Any]]) -> Series:
    start = records[0]["time"]

    def column(key: str) -> tuple[float, ...]:
        return tuple(float(r[key]) for r in records)

    names = sorted({name for r in records for name in r.get("sources", {})})
    return Series(
        minutes=tuple((r["time"] - start) / 60.0 for r in records),
        steps_per_s=column("steps_per_s"),
        tokens_per_s=column("tokens_per_s"),
        wait_p50_ms=column("wait_p50_ms"),
        wait_p99_ms=column("wait_p99_ms"),
        balance=column("balance_max_over_mean"),
        source_weights={name: _weights(records, name) for name in names},
    )


def _weights(records: Sequence[dict[str, Any]], name: str) -> tuple[float, ...]:
    def weight(record: dict[str, Any]) -> float:
        entry = record.get("sources", {}).get(name)
        value = entry.get("weight") if isinstance(entry, dict) else None
        return float(value) if isinstance(value, int | float) else math.nan

    return tuple(weight(r) for r in records)


def plot(series: Series, out: Path, title: str = "") -> Path:
    """Draw ``series`` into the PNG ``out``: throughput, data-wait, balance and (if any) mix."""
    try:
        from matplotlib.figure import Figure  # a plotting library only `msd report` needs
    except ImportError:
        raise LaunchError("msd report needs matplotlib; run `pip install matplotlib`") from None
    panels = 4 if series.source_weights else 3
    fig = Figure(figsize=(9, 2.4 * panels), layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    _throughput(axes[0], series)
    _wait(axes[1], series)
    _balance(axes[2], series)
    if series.source_weights:
        _mix(axes[3], series)
    axes[-1].set_xlabel("minutes since start")
    if title:
        fig.suptitle(title)
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise LaunchError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


# Axes are typed Any: matplotlib is optional, so mypy may not see its types.
def _throughput(ax: Any, s: Series) -> None:
    ax.plot(s.minutes, s.tokens_per_s, color="tab:blue")
    ax.set_ylabel("tokens/s", color="tab:blue")
    twin = ax.twinx()
    twin.plot(s.minutes, s.steps_per_s, color="tab:orange", linewidth=0.8)
    twin.set_ylabel("steps/s", color="tab:orange")
    ax.set_title("throughput", loc="left")


def _wait(ax: Any, s: Series) -> None:
    ax.plot(s.minutes, s.wait_p50_ms, label="p50")
    ax.plot(s.minutes, s.wait_p99_ms, label="p99")
    ax.set_ylabel("ms")
    ax.set_title("trainer data-wait", loc="left")
    ax.legend(loc="upper right")


def _balance(ax: Any, s: Series) -> None:
    ax.plot(s.minutes, s.balance, color="tab:green")
    ax.axhline(1.0, color="grey", linewidth=0.6, linestyle="--")
    ax.set_ylabel("max / mean")
    ax.set_title("token balance across DP ranks", loc="left")


def _mix(ax: Any, s: Series) -> None:
    for name, weights in s.source_weights.items():
        ax.plot(s.minutes, weights, label=name)
    ax.set_ylabel("weight")
    ax.set_title("source weights", loc="left")
    ax.legend(loc="upper right", fontsize="small", ncol=min(4, len(s.source_weights)))
