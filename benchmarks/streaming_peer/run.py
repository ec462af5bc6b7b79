"""One point: the same sources on the S3 server, read by Streaming (MDS) and by msd (Parquet).

* Streaming: R rank processes (``rank.py``), each with its own DataLoader of W workers over a
  ``StreamingDataset`` of one ``Stream`` per source; the data plane sampled is every descendant
  of the ranks (the workers: they download, decode and pack), plus the ranks' PSS growth over
  their idle size. All ranks share one local cache folder per stream, fresh for every run.
* msd: ``msd launch`` as ``benchmarks.dataloader.msd_run.run_msd`` runs it, on the same recipe
  (``recipe_dict``) with each source's path the ``s3://`` URL of its Parquet file; the data
  plane sampled is the launcher's ``msd.roles`` children plus the ranks' growth.

Both feed the harness's trainer (``benchmarks/dataloader/trainer.py``'s ``train``) and are
measured by its ``metrics.measure``; the S3 server's CPU (sampled the same way) and the requests
it logged during the run are added, as is what Streaming's cache holds at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.dataloader.config import Point, Settings
from benchmarks.dataloader.data import ROOT, BenchSource, Dataset
from benchmarks.dataloader.metrics import cpu, measure, read_rank_logs
from benchmarks.dataloader.msd_run import (
    KINDS,
    recipe_dict,
    start_launcher,
    trainer_command,
    wait_launcher,
)
from benchmarks.dataloader.packing import patience_of
from benchmarks.dataloader.procmon import ProcessSampler, Sample, children_of, command_kind
from benchmarks.dataloader.run_baseline import wait_ranks
from benchmarks.streaming_peer import store
from benchmarks.streaming_peer.config import PeerConfig, epoch_samples, samples_per_micro_batch
from benchmarks.streaming_peer.lib import clean_stale_shared_memory
from benchmarks.streaming_peer.mds import MdsSource, downloaded
from msd.launch import procs
from msd.launch.ports import free_port
from tests.s3.server import S3Server

RANK_MODULE = "benchmarks.streaming_peer.rank"
SYSTEMS = ("streaming", "msd")  # the default; "msd-local" reads the Parquet from local disk


@dataclass(frozen=True)
class Remote:
    """A point's data on the server: Parquet URL per source, MDS prefix per source."""

    dataset: Dataset
    mds: list[MdsSource]
    parquet_urls: tuple[str, ...]
    mds_urls: tuple[str, ...]
    sizes: dict[str, int]  # bucket/key -> bytes, of every object on the server


def peer_config(
    point: Point, remote: Remote, settings: Settings, cache: Path, workers: int
) -> PeerConfig:
    sources = remote.dataset.sources
    weights = remote.dataset.weights
    return PeerConfig(
        remotes=remote.mds_urls,
        locals=tuple(str(cache / s.name) for s in sources),
        proportions=tuple(w / sum(weights) for w in weights),
        seq_len=point.seq_len,
        rows=point.rows,
        patience=patience_of(point.ranks * point.rows),
        batch_size=samples_per_micro_batch(sources, point.seq_len, point.rows),
        epoch_size=epoch_samples(sources, point.seq_len, point.rows, point.ranks, settings.steps),
        workers=workers,
        steps=settings.steps,
        sharing_strategy=settings.sharing_strategy,
    )


def rank_argv(run_dir: Path, settings: Settings, seconds_per_cost: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        RANK_MODULE,
        "--log-dir",
        str(run_dir / "ranks"),
        "--config",
        str(run_dir / "peer.json"),
        "--seconds-per-cost",
        repr(seconds_per_cost),
        "--attn",
        repr(settings.cost.attn),
        "--lin",
        repr(settings.cost.lin),
    ]


def start_ranks(ranks: int, run_dir: Path, argv: list[str]) -> list[procs.Child]:
    """The ranks, as ``run_baseline`` starts them, plus the node-local variables Streaming
    reads (every rank is on this one node)."""
    env = {
        **os.environ,
        "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(ranks),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    children = []
    for rank in range(ranks):
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        log = run_dir / f"rank-{rank}.log"
        children.append(procs.start("trainer", f"rank {rank}", argv, rank_env, log, cwd=ROOT))
    return children


def _store_sampler(server: S3Server, interval_s: float) -> ProcessSampler:
    moto = store.process(server)
    return ProcessSampler(lambda: ([moto], []), interval_s)


@contextlib.contextmanager
def watching_store(
    server: S3Server, interval_s: float
) -> Iterator[tuple[ProcessSampler, list[dict[str, Any]]]]:
    """The S3 server's process sampled and its requests recorded while the block runs."""
    sampler = _store_sampler(server, interval_s)
    sampler.start()
    try:
        with store.recording(server) as requests:
            yield sampler, requests
    finally:
        sampler.stop()


def _store_metrics(
    samples: list[Sample], requests: list[dict[str, Any]], remote: Remote, result: dict[str, Any]
) -> dict[str, Any]:
    counts = store.summarize(requests, remote.sizes)
    out: dict[str, Any] = {"store_requests": counts, "store_sent_bytes": counts.get("get_bytes", 0)}
    if "window_start" in result:
        moto = cpu(samples, result["window_start"], result["window_end"], result["tokens_per_s"])
        out["store_cpu_s_per_mtok"] = moto["cpu_s_per_mtok"]
        out["store_cpu_cores_busy"] = moto["cpu_cores_busy"]
        out["store_pss_peak_mib"] = max((s.data_pss for s in samples), default=0) / 2**20
    return out


def run_streaming(
    point: Point,
    remote: Remote,
    settings: Settings,
    run_dir: Path,
    seconds_per_cost: float,
    server: S3Server,
) -> dict[str, Any]:
    """Every metric of Streaming at ``point`` (``error`` set if the run failed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cache = run_dir / "cache"
    if cache.exists():
        shutil.rmtree(cache)
    config = peer_config(point, remote, settings, cache, point.workers)
    config.save(run_dir / "peer.json")
    clean_stale_shared_memory()
    with watching_store(server, settings.sample_interval_s) as (store_sampler, requests):
        started = time.time()
        ranks = start_ranks(point.ranks, run_dir, rank_argv(run_dir, settings, seconds_per_cost))
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
            _reap(ranks)
    if error is not None:
        return {"error": error, "run_dir": str(run_dir)}
    result = measure(run_dir / "ranks", sampler.samples, settings.warmup)
    result |= whole_run(run_dir / "ranks", sampler.samples)
    result |= {
        "run_dir": str(run_dir),
        "wall_s": time.time() - started,
        "startup_s": result["first_step_end"] - started,
        "streaming_batch_size": config.batch_size,
        "streaming_epoch_size": config.epoch_size,
        **downloaded([cache / s.name for s in remote.dataset.sources]),
    }
    result |= _store_metrics(store_sampler.samples, requests, remote, result)
    shutil.rmtree(cache, ignore_errors=True)  # measured; the next run starts cold
    return result


def whole_run(log_dir: Path, samples: list[Sample]) -> dict[str, Any]:
    """The data plane's CPU over the whole run, start-up included, per 1M tokens of every step
    (what the warm window leaves out: Streaming downloads most shards before the first step)."""
    tokens = sum(r["tokens"] for records in read_rank_logs(log_dir).values() for r in records)
    cpu_s = samples[-1].data_cpu_s if samples else float("nan")
    return {
        "run_tokens": tokens,
        "run_cpu_s": cpu_s,
        "run_cpu_s_per_mtok": cpu_s / tokens * 1e6 if tokens else float("nan"),
    }


def _reap(ranks: list[procs.Child]) -> None:
    """Whatever is left of the ranks' process groups (their DataLoader workers) once they
    exited: stopped, so that the next run starts alone."""
    for child in ranks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.popen.pid, signal.SIGKILL)
        child.popen.wait()


def s3_dataset(remote: Remote) -> Dataset:
    """The point's dataset with each source's path its Parquet file's ``s3://`` URL."""
    sources: tuple[BenchSource, ...] = tuple(
        replace(s, path=u) for s, u in zip(remote.dataset.sources, remote.parquet_urls, strict=True)
    )
    return replace(remote.dataset, sources=sources)


def run_msd_s3(
    point: Point,
    remote: Remote,
    settings: Settings,
    run_dir: Path,
    seconds_per_cost: float,
    server: S3Server,
    local: bool = False,
) -> dict[str, Any]:
    """Every metric of msd at ``point``, reading the Parquet files from the server (from local
    disk with ``local``, a reference): the dataloader benchmark's ``run_msd``, keeping its
    process samples for ``whole_run``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = run_dir / "ranks"
    command = trainer_command(log_dir, settings, seconds_per_cost)
    dataset = remote.dataset if local else s3_dataset(remote)
    recipe = recipe_dict(point, dataset, settings, command, settings.sources_per_process)
    recipe_path = run_dir / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    with watching_store(server, settings.sample_interval_s) as (store_sampler, requests):
        started = time.time()
        launcher = start_launcher(recipe_path, run_dir)
        cache: dict[int, str] = {}

        def discover() -> tuple[list[psutil.Process], list[psutil.Process]]:
            found: dict[str, list[psutil.Process]] = {"role": [], "trainer": []}
            for proc in children_of([launcher.pid]):
                kind = command_kind(proc, KINDS, cache)
                if kind is not None:
                    found[kind].append(proc)
            return found["role"], found["trainer"]

        sampler = ProcessSampler(discover, settings.sample_interval_s)
        sampler.start()
        try:
            error = wait_launcher(launcher, settings.timeout_s)
        finally:
            sampler.stop()
    if error is not None:
        tail = (run_dir / "launch.err").read_text(errors="replace")[-1500:]
        return {"error": f"{error}: {tail}", "run_dir": str(run_dir)}
    result = measure(log_dir, sampler.samples, settings.warmup)
    result |= whole_run(log_dir, sampler.samples)
    summary = json.loads((run_dir / "launch.out").read_text())
    result |= {
        "run_dir": str(run_dir),
        "job": summary.get("job"),
        "wall_s": time.time() - started,
        "startup_s": result["first_step_end"] - started,
    }
    return result | _store_metrics(store_sampler.samples, requests, remote, result)
