"""Running points: data, calibration, the memory check, then baseline and msd one after the other.

Every point gets its own calibration (``cost.py``) so that an average rank computes for about
100 ms at its ``seq_len``. A run whose estimated memory (``memfit.py``) passes the limit, or
what the machine has free, is skipped with the estimate recorded; so is msd past
``NO_KEY_MAX_SOURCES`` sources while its recipe lacks ``loader.sources_per_process`` (it would
start one loader process per source).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.dataloader.config import ROWS, Point, Settings
from benchmarks.dataloader.cost import mean_rank_cost, seconds_per_cost
from benchmarks.dataloader.data import (
    DATA_ROOT,
    ROOT,
    Dataset,
    DataSpec,
    ensure_data,
    measured_rg_bytes,
)
from benchmarks.dataloader.memfit import baseline_estimate_bytes, msd_estimate_bytes
from benchmarks.dataloader.msd_run import run_msd
from benchmarks.dataloader.packing import patience_of
from benchmarks.dataloader.run_baseline import run_baseline

NO_KEY_MAX_SOURCES = 64
SYSTEMS = ("baseline", "msd")
_GIB = 2**30


def calibrate(point: Point, dataset: Dataset, settings: Settings) -> dict[str, float]:
    patience = patience_of(point.ranks * point.rows)
    cost = mean_rank_cost(
        dataset.sources, point.seq_len, point.rows, patience, settings.cost, seed=settings.seed
    )
    return {
        "mean_rank_cost": cost,
        # More rows per rank, proportionally longer steps: the same tokens/s is asked of both.
        "seconds_per_cost": seconds_per_cost(settings.target_step_s * point.rows / ROWS, cost),
    }


def estimates(point: Point, rg_bytes: float, settings: Settings, with_key: bool) -> dict[str, Any]:
    per_process = settings.sources_per_process if with_key else None
    return {
        "rg_text_bytes": rg_bytes,
        "baseline_gib": baseline_estimate_bytes(point.sources, point.ranks, point.workers, rg_bytes)
        / _GIB,
        "msd_gib": msd_estimate_bytes(
            point.sources, point.global_batch_tokens, rg_bytes, per_process
        )
        / _GIB,
        "available_gib": psutil.virtual_memory().available / _GIB,
    }


def skip_reason(
    system: str, point: Point, estimate: dict[str, Any], settings: Settings, with_key: bool
) -> str | None:
    need = estimate[f"{system}_gib"]
    if need > settings.max_memory_gib:
        return f"estimated {need:.1f} GiB > limit {settings.max_memory_gib:.0f} GiB"
    if need > estimate["available_gib"] - 2:
        return f"estimated {need:.1f} GiB > {estimate['available_gib']:.1f} GiB free - 2"
    if system == "msd" and not with_key and point.sources > NO_KEY_MAX_SOURCES:
        return (
            f"this msd has no loader.sources_per_process yet: {point.sources} sources "
            f"would start {point.sources} loader processes"
        )
    return None


def msd_digest() -> str:
    """A hash of msd's source files as they are now: which msd a run measured."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "msd").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def entry_key(point: Point, settings: Settings) -> str:
    """The point's key, marked when the baseline hands tensors over differently."""
    default = settings.sharing_strategy == Settings.sharing_strategy
    return point.key if default else f"{point.key}-{settings.sharing_strategy}"


def run_point(
    point: Point,
    settings: Settings,
    with_key: bool,
    systems: tuple[str, ...] = SYSTEMS,
    data_root: Path = DATA_ROOT,
) -> dict[str, Any]:
    """One point's entry: calibration, estimates and each system's metrics (or why skipped)."""
    dataset = ensure_data(DataSpec(point.sources, point.rg_bytes, seed=settings.seed), data_root)
    rg_bytes = measured_rg_bytes(dataset)
    entry: dict[str, Any] = {
        "key": entry_key(point, settings),
        "sharing_strategy": settings.sharing_strategy,
        "point": point.as_dict(),
        "steps": settings.steps,
        "warmup": settings.warmup,
        "sources_per_process": settings.sources_per_process if with_key else None,
        "msd_source_digest": msd_digest(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    entry |= calibrate(point, dataset, settings)
    entry["estimates"] = estimates(point, rg_bytes, settings, with_key)
    run_dir = settings.run_root / time.strftime("%Y%m%d-%H%M%S") / entry["key"]
    for system in systems:
        reason = skip_reason(system, point, entry["estimates"], settings, with_key)
        print(
            f"[{entry['key']}] {system}: " + (f"skipped ({reason})" if reason else "running"),
            flush=True,
        )
        if reason is not None:
            entry[system] = {"skipped": reason}
            continue
        load_before, cpu_before = os.getloadavg()[0], _own_cpu_s()
        entry[system] = _run(
            system, point, dataset, settings, run_dir / system, entry["seconds_per_cost"], with_key
        )
        entry[system] |= {
            "load_average_1m": [load_before, os.getloadavg()[0]],
            "sampler_cpu_s": _own_cpu_s() - cpu_before,
        }
        print(f"[{entry['key']}] {system}: {_brief(entry[system])}", flush=True)
    return entry


def _run(
    system: str,
    point: Point,
    dataset: Dataset,
    settings: Settings,
    run_dir: Path,
    spc: float,
    with_key: bool,
) -> dict[str, Any]:
    if system == "baseline":
        return run_baseline(point, dataset, settings, run_dir, spc)
    per_process = settings.sources_per_process if with_key else None
    return run_msd(point, dataset, settings, run_dir, spc, per_process)


def _own_cpu_s() -> float:
    """CPU time of this process (mostly the sampler's) — it shares the machine with the run."""
    times = os.times()
    return times.user + times.system


def _brief(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED: {result['error'][:300]}"
    return (
        f"{result['steps_per_s']:.2f} steps/s, {result['tokens_per_s'] / 1e6:.2f} M tok/s, "
        f"wait p50 {result['wait_p50_ms']:.1f} / p99 {result['wait_p99_ms']:.1f} ms, "
        f"data plane {result['data_plane_peak_mib']:.0f} MiB, "
        f"{result['cpu_s_per_mtok']:.2f} CPU s/Mtok, "
        f"max/mean cost {result['cost_max_over_mean']:.2f}"
    )
