"""Writing the results: ``dataloader.json``, the ``dataloader.md`` table and PNG plots.

matplotlib is optional (not a dependency of msd); without it the plots are skipped with a note
and everything else is written.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from benchmarks.dataloader.data import DEFAULT_RG_BYTES
from benchmarks.dataloader.memfit import BASELINE_TERMS, MSD_TERMS, fit

Entry = dict[str, Any]


def machine() -> dict[str, Any]:
    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "missing"

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "torch": version("torch"),
        "pyarrow": version("pyarrow"),
        "numpy": version("numpy"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def is_default_baseline(entry: Entry) -> bool:
    """Whether the baseline ran with torch's default sharing strategy (not a tuning variant)."""
    return bool(entry.get("sharing_strategy", "file_descriptor") == "file_descriptor")


def measured(entry: Entry, system: str) -> Entry | None:
    result = entry.get(system) or {}
    return result if "steps_per_s" in result else None


def memory_fits(entries: Sequence[Entry]) -> dict[str, Any]:
    """The linear memory model of each system over its measured points with the default row
    groups (MiB): memory also grows with the row-group size, which the terms leave out."""
    fits: dict[str, Any] = {}
    for system, terms in (("baseline", BASELINE_TERMS), ("msd", MSD_TERMS)):
        rows = [
            (e["point"], m["data_plane_peak_mib"])
            for e in entries
            if (m := measured(e, system))
            and e["point"]["rg_bytes"] == DEFAULT_RG_BYTES
            and is_default_baseline(e)
        ]
        if len(rows) < len(terms) + 1:
            unknowns = len(terms) + 1
            fits[system] = {"note": f"{len(rows)} measured points < {unknowns} unknowns: no fit"}
            continue
        fits[system] = fit([p for p, _ in rows], [mib for _, mib in rows], terms)
        fits[system]["unit"] = "MiB"
    return fits


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _get(result: Entry | None, key: str) -> float | None:
    return None if result is None else result.get(key)


COLUMNS = (
    "S",
    "R",
    "W",
    "seq_len × rows",
    "row group",
    "memory MiB base / msd",
    "mem ratio",
    "steps/s base / msd",
    "msd speed-up",
    "perfect-balance speed-up base (bound)",
    "msd speed-up / allowed",
    "msd cost max/mean (max/bound)",
    "M tokens/s base / msd",
    "wait p50 ms base / msd",
    "wait p99 ms base / msd",
    "wait p99 less CPU queueing ms base / msd",
    "CPU s / 1M tok base / msd",
    "rank fetch CPU s / 1M tok base / msd",
    "start-up s base / msd",
)


LEGEND = (
    "Memory: peak summed PSS of the data processes (DataLoader workers; or msd's Planner, "
    "loaders and Constructor) plus each trainer rank's growth over its idle PSS; ratio = "
    "baseline / msd. Steps/s and tokens/s after the warm-up steps; msd speed-up = msd / "
    "baseline steps/s. Perfect-balance speed-up: Σ_steps max-rank cost / Σ_steps mean-rank cost"
    " on the baseline's own batches, and (in brackets) over Σ_steps max(mean-rank cost, "
    "costliest sequence), a bound no split of the step beats: the speed-up balancing allows. "
    "msd speed-up / allowed: the first over the second (≥ 0.95: balance gains arrive in full "
    "and the data plane adds no stall). msd cost: the same two ratios on msd's batches. Wait:"
    " time a rank blocked getting its batch, all ranks' warm steps; less CPU queueing: each "
    "wait minus the time the rank's thread was runnable but had no CPU (/proc schedstat; "
    "points measured before this column show –). CPU: the data processes' "
    "CPU seconds per 1M tokens delivered, in the warm window; rank fetch CPU: what the trainer "
    "ranks themselves spent getting batches (receiving, rebuilding tensors). Start-up: launch "
    "to the end of the first step. W applies to the baseline only; `W (file_system)`: the "
    "baseline with torch's file_system sharing strategy instead of its default. Weights: all "
    "sources equal. The memory model is fitted on the points with the default row groups and "
    "sharing strategy."
)


def rank_fetch_cpu(result: Entry | None, ranks: int) -> float | None:
    """CPU seconds the trainer ranks spent getting their batches, per 1M tokens."""
    if result is None:
        return None
    per_step_s = result["fetch_cpu_mean_ms"] / 1000 * ranks
    return float(per_step_s / result["tokens_per_step"] * 1e6)


def table_row(entry: Entry) -> str:
    b, m = measured(entry, "baseline"), measured(entry, "msd")
    p = entry["point"]
    rg = (
        f"{p['rg_bytes'] / 2**20:.2f} MB"
        if p["rg_bytes"] >= 2**20
        else f"{p['rg_bytes'] // 1024} KB"
    )

    def pair(key: str, scale: float = 1.0, digits: int = 2) -> str:
        vb, vm = _get(b, key), _get(m, key)
        return (
            f"{_fmt(vb / scale if vb is not None else None, digits)} / "
            f"{_fmt(vm / scale if vm is not None else None, digits)}"
        )

    cells = [
        str(p["S"]),
        str(p["R"]),
        str(p["W"]) + ("" if is_default_baseline(entry) else f" ({entry['sharing_strategy']})"),
        f"{p['seq_len']} × {p['rows']}",
        rg,
        pair("data_plane_peak_mib", digits=0),
        _fmt(_ratio(_get(b, "data_plane_peak_mib"), _get(m, "data_plane_peak_mib")), 1),
        pair("steps_per_s"),
        _fmt(_ratio(_get(m, "steps_per_s"), _get(b, "steps_per_s"))),
        f"{_fmt(_get(b, 'cost_max_over_mean'))} ({_fmt(_get(b, 'cost_max_over_bound'))})",
        _fmt(
            _ratio(
                _ratio(_get(m, "steps_per_s"), _get(b, "steps_per_s")),
                _get(b, "cost_max_over_bound"),
            )
        ),
        f"{_fmt(_get(m, 'cost_max_over_mean'))} ({_fmt(_get(m, 'cost_max_over_bound'))})",
        pair("tokens_per_s", 1e6),
        pair("wait_p50_ms"),
        pair("wait_p99_ms"),
        pair("wait_p99_less_cpu_queue_ms"),
        pair("cpu_s_per_mtok"),
        f"{_fmt(rank_fetch_cpu(b, p['R']))} / {_fmt(rank_fetch_cpu(m, p['R']))}",
        pair("startup_s", digits=0),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(results: Entry) -> str:
    entries = results["points"]
    lines = [
        "# msd vs per-rank DataLoaders",
        "",
        _machine_line(results["machine"]),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += [table_row(e) for e in entries]
    skipped = [
        (e["key"], s, e[s]["skipped"])
        for e in entries
        for s in ("baseline", "msd")
        if "skipped" in (e.get(s) or {})
    ]
    failed = [
        (e["key"], s, e[s]["error"])
        for e in entries
        for s in ("baseline", "msd")
        if "error" in (e.get(s) or {})
    ]
    if skipped or failed:
        lines += ["", "Not measured:", ""]
        lines += [f"- {key} {s}: skipped, {why}" for key, s, why in skipped]
        lines += [f"- {key} {s}: failed, {why[:200]}" for key, s, why in failed]
    lines += ["", "Memory model (peak data-plane PSS, MiB, least squares):", ""]
    for system, terms in results["memory_fit"].items():
        shown = ", ".join(f"{k} {v:,.3g}" for k, v in terms.items() if isinstance(v, float))
        lines.append(f"- {system}: {shown or terms.get('note', '')}")
    return "\n".join([*lines, "", LEGEND, ""])


def _machine_line(m: Entry) -> str:
    return (
        f"Machine: {m['platform']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
        f"{m['python']}, torch {m['torch']}, pyarrow {m['pyarrow']}; {m['date']}."
    )


def write(results: Entry, out: Path, stem: str) -> list[Path]:
    """Write ``stem.json``, ``stem.md`` and the plots; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    results["memory_fit"] = memory_fits(results["points"])
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(results, indent=1))
    paths[1].write_text(markdown(results))
    from benchmarks.dataloader.plots import plot_all

    return paths + plot_all(results["points"], out, stem)
