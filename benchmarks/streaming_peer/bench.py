"""A whole invocation: one S3 server, then per point the data, its upload, and each system.

The Parquet sources are the dataloader benchmark's (``benchmarks.dataloader.data.ensure_data``,
shared with it under ``benchmarks/runs/dataloader-data``), the MDS shards are made from them
(``mds.py``, under ``benchmarks/runs/streaming_peer-data``), and both are uploaded to the same
server. Each point is calibrated as the dataloader benchmark calibrates it, so an average
rank's step computes for ``--target-step-ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.dataloader.config import Point, Settings
from benchmarks.dataloader.data import DATA_ROOT, ROOT, Dataset, DataSpec, ensure_data
from benchmarks.dataloader.msd_run import key_supported
from benchmarks.dataloader.report import machine
from benchmarks.dataloader.sweep import calibrate, msd_digest
from benchmarks.streaming_peer import store
from benchmarks.streaming_peer.lib import describe
from benchmarks.streaming_peer.mds import COMPRESSION, MdsSource, convert
from benchmarks.streaming_peer.report import write
from benchmarks.streaming_peer.run import SYSTEMS, Remote, run_msd_s3, run_streaming
from tests.s3.server import S3Server

RUN_ROOT = ROOT / "benchmarks" / "runs" / "streaming_peer"
MDS_ROOT = ROOT / "benchmarks" / "runs" / "streaming_peer-data"
SOURCES_PER_PROCESS = 64  # as the dataloader benchmark


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(
        steps=args.steps,
        warmup=args.warmup,
        target_step_s=args.target_step_ms / 1000,
        sources_per_process=SOURCES_PER_PROCESS if key_supported() else None,
        timeout_s=args.timeout_s,
        run_root=RUN_ROOT,
    )


def data_stats(dataset: Dataset, mds: list[MdsSource]) -> dict[str, Any]:
    tokens = 0
    for source in dataset.sources:
        column = pq.read_table(source.path, columns=["text"]).column(0)
        tokens += int(pc.sum(pc.binary_length(column)).as_py())
    return {
        "tokens": tokens,
        "samples": sum(m.samples for m in mds),
        "parquet_bytes": sum(Path(s.path).stat().st_size for s in dataset.sources),
        "parquet_row_groups": sum(s.num_row_groups for s in dataset.sources),
        "mds_stored_bytes": sum(m.zip_bytes for m in mds),
        "mds_raw_bytes": sum(m.raw_bytes for m in mds),
        "mds_shards": sum(m.shards for m in mds),
        "mds_compression": COMPRESSION,
    }


def upload(server: S3Server, dataset: Dataset, mds: list[MdsSource], tag: str) -> Remote:
    """Both copies of the data onto the server; their URLs."""
    folder = dataset.spec.folder_name
    server.upload(dataset.folder, store.url("parquet", folder))
    parquet_urls = tuple(
        store.url("parquet", folder, Path(s.path).relative_to(dataset.folder).as_posix())
        for s in dataset.sources
    )
    mds_urls = []
    for source in mds:
        mds_urls.append(store.url("mds", tag, source.name))
        server.upload(source.folder, mds_urls[-1])
    return Remote(dataset, mds, parquet_urls, tuple(mds_urls), store.object_sizes(server))


def run_point(
    point: Point,
    settings: Settings,
    server: S3Server,
    run_root: Path,
    systems: tuple[str, ...],
    shard_bytes: int,
) -> dict[str, Any]:
    dataset = ensure_data(DataSpec(point.sources, point.rg_bytes, seed=settings.seed), DATA_ROOT)
    tag = f"{dataset.spec.folder_name}-shard{shard_bytes}"
    mds = convert(dataset, MDS_ROOT / tag, shard_bytes)
    began = time.time()
    remote = upload(server, dataset, mds, tag)
    entry: dict[str, Any] = {
        "key": point.key,
        "point": point.as_dict(),
        "steps": settings.steps,
        "warmup": settings.warmup,
        "sources_per_process": settings.sources_per_process,
        "shard_bytes": shard_bytes,
        "msd_source_digest": msd_digest(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "data": data_stats(dataset, mds) | {"upload_s": time.time() - began},
    }
    entry |= calibrate(point, dataset, settings)
    for system in systems:
        print(f"[{point.key}] {system}: running", flush=True)
        run_dir = run_root / point.key / system
        spc = entry["seconds_per_cost"]
        load_before = os.getloadavg()[0]
        if system == "streaming":
            entry[system] = run_streaming(point, remote, settings, run_dir, spc, server)
        else:
            local = system == "msd-local"
            entry[system] = run_msd_s3(point, remote, settings, run_dir, spc, server, local)
        # Other work on the machine shows here (the sampler's own share is small).
        entry[system]["load_average_1m"] = [load_before, os.getloadavg()[0]]
        print(f"[{point.key}] {system}: {brief(entry[system])}", flush=True)
    return entry


def brief(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED: {result['error'][:600]}"
    return (
        f"{result['steps_per_s']:.2f} steps/s, wait p50 {result['wait_p50_ms']:.1f} / p99 "
        f"{result['wait_p99_ms']:.1f} ms, data plane {result['data_plane_peak_mib']:.0f} MiB, "
        f"{result['cpu_s_per_mtok']:.2f} CPU s/Mtok (+ store "
        f"{result.get('store_cpu_s_per_mtok', float('nan')):.2f}), "
        f"requests {result.get('store_requests')}"
    )


def run(args: argparse.Namespace) -> None:
    settings = settings_of(args)
    systems = tuple(args.systems or SYSTEMS)
    run_root = settings.run_root / time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {
        "machine": machine() | {"streaming_peer": describe()},
        "settings": {
            "steps": settings.steps,
            "warmup": settings.warmup,
            "target_step_s": settings.target_step_s,
            "cost": {"attn": settings.cost.attn, "lin": settings.cost.lin},
            "sources_per_process": settings.sources_per_process,
            "weights": "equal (1.0 per source)",
            "transform": "bytes (UTF-8 bytes as ids), both systems",
            "store": "moto server (tests/s3/server.py) on this machine, auth on",
        },
        "points": [],
    }
    previous = args.out / "streaming_peer.json"
    if args.append:  # this invocation's points go beside the existing results, not over them
        results = json.loads(previous.read_text())
        results.setdefault("extra_runs", [])
    with store.running(run_root / "s3") as server:
        for sources in args.sources:
            point = Point(sources, args.ranks, args.workers, args.seq_len, args.rg_bytes, args.rows)
            shard_bytes = args.shard_bytes or args.rg_bytes
            entry = run_point(point, settings, server, run_root, systems, shard_bytes)
            results["extra_runs" if args.append else "points"].append(entry)
            write(results, args.out)  # after every point: a stopped run keeps what it did
    print("\n".join(str(p) for p in write(results, args.out)))
    print((args.out / "streaming_peer.md").read_text())
