"""The simulated trainer rank both systems feed.

    python -m benchmarks.dataloader.trainer msd --log-dir DIR --seconds-per-cost X [--attn A]
    python -m benchmarks.dataloader.trainer baseline --log-dir DIR --config STREAM.json ...
    python -m benchmarks.dataloader.trainer baseline-vlm --log-dir DIR --config STREAM.json ...
    python -m benchmarks.dataloader.trainer baseline-video --log-dir DIR --config STREAM.json ...

Rank and world size come from ``RANK`` / ``WORLD_SIZE`` (``MASTER_ADDR`` / ``MASTER_PORT`` for
gloo), set by ``msd launch`` for msd and by ``run_baseline`` for the baseline. Each step a rank
gets its batch (``msd.Client`` or its own ``DataLoader``), "computes" by sleeping for the batch's
cost (``cost.py``; a VLM or video batch adds its vision encoder's, ``vlm_cost.py``) and meets
the other ranks at a gloo barrier, as data-parallel training does at its gradient all-reduce.
It writes ``DIR/rank-R.jsonl`` (one line per step: data-wait, CPU time spent fetching, compute,
barrier, cost, real tokens, images and videos, time) and, before it asks for its first batch,
``DIR/rank-R.idle.json`` with its PSS (what the data plane's memory is counted above).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import psutil
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from benchmarks.dataloader.baseline import MixedParquetStream, StreamConfig
from benchmarks.dataloader.cost import CostModel, sequence_lengths
from benchmarks.dataloader.video_baseline import MixedVideoStream, VideoStreamConfig
from benchmarks.dataloader.vlm_baseline import MixedImageStream, VlmStreamConfig
from benchmarks.dataloader.vlm_cost import batch_costs
from msd.client import Client
from msd.roles.footprint import keep_pandas_out
from msd.trainer.demo import real_tokens

Batches = Iterator[dict[str, torch.Tensor]]


def write_idle(log_dir: Path, rank: int) -> None:
    """This rank's PSS before any data is read (its DataLoader or Client not started yet)."""
    pss = psutil.Process().memory_full_info().pss
    record = {"rank": rank, "pid": os.getpid(), "idle_pss": pss, "time": time.time()}
    (log_dir / f"rank-{rank}.idle.json").write_text(json.dumps(record))


def run_delay_s() -> float:
    """Time this thread has spent runnable but waiting for a CPU (``/proc`` schedstat)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def train(
    batches: Batches, steps: int | None, model: CostModel, seconds_per_cost: float, log: TextIO
) -> None:
    """Fetch, sleep for the batch's cost, barrier; one JSON line per step."""
    step = 0
    while steps is None or step < steps:
        delay_started = run_delay_s()
        started, cpu_started = time.perf_counter(), time.process_time()
        batch = next(batches, None)
        got, fetch_cpu = time.perf_counter(), time.process_time() - cpu_started
        run_delay = run_delay_s() - delay_started
        if batch is None:
            return
        record = {
            "step": step,
            "wait_ms": (got - started) * 1000,
            "fetch_cpu_ms": fetch_cpu * 1000,
            "run_delay_ms": run_delay * 1000,
            **step_cost(batch, model),
            "tokens": real_tokens(batch),
            "samples": len(batch["sample_ids"]),
        }
        cost = record["cost"]
        time.sleep(max(0.0, cost * seconds_per_cost - (time.perf_counter() - got)))
        record["compute_ms"] = (time.perf_counter() - got) * 1000
        barrier_started = time.perf_counter()
        dist.barrier()
        record["barrier_ms"] = (time.perf_counter() - barrier_started) * 1000
        record["time"] = time.time()
        log.write(json.dumps(record) + "\n")
        step += 1


def step_cost(batch: dict[str, torch.Tensor], model: CostModel) -> dict[str, float]:
    """The batch's cost and its costliest unit's: a sequence (text), or a sample's sequence and
    its images' and videos' encoder cost (``vlm_cost.py``), with its images, videos, patches."""
    if "vision_cu_seqlens" in batch or "video_cu_seqlens" in batch:
        return batch_costs({k: v.numpy() for k, v in batch.items()}, model)
    lengths = sequence_lengths(batch["cu_seqlens"].numpy())
    return {
        "cost": model.cost(lengths),
        "max_sequence_cost": max(model.cost([n]) for n in lengths.tolist()),
    }


def msd_batches(log_dir: Path) -> tuple[Batches, int | None, Client | None]:
    client = Client()  # job, rank and world size from the launcher's environment
    dist.init_process_group("gloo", rank=client.rank, world_size=client.world_size)
    write_idle(log_dir, client.rank)
    return iter(client), None, client


def baseline_batches(log_dir: Path, config_path: Path) -> tuple[Batches, int | None, Client | None]:
    config = StreamConfig.load(config_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    write_idle(log_dir, rank)
    torch.multiprocessing.set_sharing_strategy(config.sharing_strategy)  # type: ignore[no-untyped-call]
    loader = DataLoader(
        MixedParquetStream(config, rank, world),
        num_workers=config.workers,
        batch_size=None,
        prefetch_factor=2,
        persistent_workers=True,
    )
    return iter(loader), config.steps, None


def baseline_vlm_batches(
    log_dir: Path, config_path: Path
) -> tuple[Batches, int | None, Client | None]:
    config = VlmStreamConfig.load(config_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    write_idle(log_dir, rank)
    torch.multiprocessing.set_sharing_strategy(config.sharing_strategy)  # type: ignore[no-untyped-call]
    loader = DataLoader(
        MixedImageStream(config, rank, world),
        num_workers=config.workers,
        batch_size=None,
        prefetch_factor=2,
        persistent_workers=True,
    )
    return iter(loader), config.steps, None


def baseline_video_batches(
    log_dir: Path, config_path: Path
) -> tuple[Batches, int | None, Client | None]:
    config = VideoStreamConfig.load(config_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    write_idle(log_dir, rank)
    torch.multiprocessing.set_sharing_strategy(config.sharing_strategy)  # type: ignore[no-untyped-call]
    loader = DataLoader(
        MixedVideoStream(config, rank, world),
        num_workers=config.workers,
        batch_size=None,
        prefetch_factor=2,
        persistent_workers=True,
    )
    return iter(loader), config.steps, None


BASELINES = {
    "baseline": baseline_batches,
    "baseline-vlm": baseline_vlm_batches,
    "baseline-video": baseline_video_batches,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("system", choices=("msd", *BASELINES))
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, help="the baseline's StreamConfig JSON")
    parser.add_argument("--seconds-per-cost", type=float, required=True)
    parser.add_argument("--attn", type=float, default=CostModel.attn)
    parser.add_argument("--lin", type=float, default=CostModel.lin)
    parser.add_argument("--enc-attn", type=float, default=CostModel.enc_attn)
    parser.add_argument("--enc-lin", type=float, default=CostModel.enc_lin)
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    # As in msd's roles: where pandas is installed, pyarrow would import it in every rank and
    # (forked from it) DataLoader worker; the comparison is of the data planes, not of pandas.
    keep_pandas_out()
    if args.system == "msd":
        batches, steps, client = msd_batches(args.log_dir)
    else:
        if args.config is None:
            parser.error("baseline needs --config")
        batches, steps, client = BASELINES[args.system](args.log_dir, args.config)
    rank = dist.get_rank()
    try:
        with open(args.log_dir / f"rank-{rank}.jsonl", "w") as log:
            train(
                batches,
                steps,
                CostModel(args.attn, args.lin, args.enc_attn, args.enc_lin),
                args.seconds_per_cost,
                log,
            )
    finally:
        if client is not None:
            client.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
