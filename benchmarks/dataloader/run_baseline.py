"""Running the baseline at one point: R rank processes, each with its own DataLoader.

The ranks are started like msd starts trainers (own session, killed if this process dies), with
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` for their gloo barrier. The data
plane sampled is every descendant of the ranks (their DataLoader workers), plus the ranks'
growth over their idle PSS.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.dataloader.baseline import StreamConfig
from benchmarks.dataloader.config import Point, Settings
from benchmarks.dataloader.data import Dataset
from benchmarks.dataloader.metrics import measure
from benchmarks.dataloader.packing import patience_of
from benchmarks.dataloader.procmon import ProcessSampler, children_of
from msd.launch import procs
from msd.launch.ports import free_port

TRAINER_MODULE = "benchmarks.dataloader.trainer"


def stream_config(point: Point, dataset: Dataset, settings: Settings) -> StreamConfig:
    return StreamConfig(
        paths=tuple(s.path for s in dataset.sources),
        weights=dataset.weights,
        seq_len=point.seq_len,
        rows=point.rows,
        patience=patience_of(point.ranks * point.rows),
        seed=settings.seed,
        workers=point.workers,
        steps=settings.steps,
        sharing_strategy=settings.sharing_strategy,
    )


def rank_argv(run_dir: Path, settings: Settings, seconds_per_cost: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        TRAINER_MODULE,
        "baseline",
        "--log-dir",
        str(run_dir / "ranks"),
        "--config",
        str(run_dir / "stream.json"),
        "--seconds-per-cost",
        repr(seconds_per_cost),
        "--attn",
        repr(settings.cost.attn),
        "--lin",
        repr(settings.cost.lin),
    ]


def start_ranks(point: Point, run_dir: Path, argv: list[str]) -> list[procs.Child]:
    env = {
        **os.environ,
        "WORLD_SIZE": str(point.ranks),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    cwd = Path(__file__).resolve().parents[2]
    ranks = []
    for rank in range(point.ranks):
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        log = run_dir / f"rank-{rank}.log"
        ranks.append(procs.start("trainer", f"rank {rank}", argv, rank_env, log, cwd=cwd))
    return ranks


def wait_ranks(ranks: list[procs.Child], timeout_s: float) -> str | None:
    """None once every rank exited 0; otherwise what went wrong (every rank is stopped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        codes = [r.popen.poll() for r in ranks]
        failed = next((r for r, c in zip(ranks, codes, strict=True) if c not in (None, 0)), None)
        if failed is not None:
            procs.stop_all(ranks)
            return f"{failed.label} {failed.describe_exit()}: {procs.tail(failed.log, 8)}"
        if all(c == 0 for c in codes):
            return None
        time.sleep(0.2)
    procs.stop_all(ranks)
    return f"timed out after {timeout_s:.0f} s"


def run_baseline(
    point: Point, dataset: Dataset, settings: Settings, run_dir: Path, seconds_per_cost: float
) -> dict[str, Any]:
    """Every metric of the baseline at ``point`` (``error`` set if the run failed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stream_config(point, dataset, settings).save(run_dir / "stream.json")
    started = time.time()
    ranks = start_ranks(point, run_dir, rank_argv(run_dir, settings, seconds_per_cost))
    pids = [r.popen.pid for r in ranks]

    def discover() -> tuple[list[psutil.Process], list[psutil.Process]]:
        alive = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
        return children_of(pids), alive

    sampler = ProcessSampler(discover, settings.sample_interval_s)
    sampler.start()
    try:
        error = wait_ranks(ranks, settings.timeout_s)
    finally:
        sampler.stop()
    if error is not None:
        return {"error": error, "run_dir": str(run_dir)}
    result = measure(run_dir / "ranks", sampler.samples, settings.warmup)
    return result | {
        "run_dir": str(run_dir),
        "wall_s": time.time() - started,
        "startup_s": result["first_step_end"] - started,
    }
