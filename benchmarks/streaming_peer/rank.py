"""A simulated trainer rank fed by MosaicML Streaming.

    python -m benchmarks.streaming_peer.rank --log-dir DIR --config PEER.json --seconds-per-cost X

The rank of ``benchmarks/dataloader/trainer.py`` (same ``train`` loop, same logs, same idle-PSS
record before any data is touched), with its batches from
``DataLoader(PackedStreamingDataset(streams=[Stream(remote=s3://..., local=..., proportion=w)
...], batch_size=b, shuffle=True, epoch_size=e), num_workers=W, batch_size=None,
prefetch_factor=2, persistent_workers=True)`` — the baseline's DataLoader settings. Rank, world
size and node-local rank come from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE`` (Streaming reads them too; all ranks of this benchmark are on one node and
share each stream's local cache), the store from the AWS variables and ``S3_ENDPOINT_URL``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from benchmarks.dataloader.cost import CostModel
from benchmarks.dataloader.trainer import Batches, train, write_idle
from benchmarks.streaming_peer.config import PeerConfig
from benchmarks.streaming_peer.lib import Stream
from benchmarks.streaming_peer.packed import PackedStreamingDataset
from msd.roles.footprint import keep_pandas_out


def make_dataset(config: PeerConfig) -> PackedStreamingDataset:
    streams = [
        Stream(remote=remote, local=local, proportion=proportion)
        for remote, local, proportion in zip(
            config.remotes, config.locals, config.proportions, strict=True
        )
    ]
    return PackedStreamingDataset(
        streams=streams,
        batch_size=config.batch_size,
        shuffle=True,
        shuffle_seed=config.shuffle_seed,
        epoch_size=config.epoch_size,
        seq_len=config.seq_len,
        rows=config.rows,
        patience=config.patience,
    )


def endless(loader: DataLoader[dict[str, torch.Tensor]]) -> Batches:
    """The loader's batches, epoch after epoch (a run stays within one: see config.py)."""

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        while True:
            yield from loader

    return batches()


def streaming_batches(log_dir: Path, config: PeerConfig) -> Batches:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    write_idle(log_dir, rank)  # before Streaming makes its shared memory or reads an index
    torch.multiprocessing.set_sharing_strategy(config.sharing_strategy)  # type: ignore[no-untyped-call]
    loader: DataLoader[dict[str, torch.Tensor]] = DataLoader(
        make_dataset(config),
        num_workers=config.workers,
        batch_size=None,
        prefetch_factor=2,
        persistent_workers=True,
    )
    return endless(loader)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--seconds-per-cost", type=float, required=True)
    parser.add_argument("--attn", type=float, default=CostModel.attn)
    parser.add_argument("--lin", type=float, default=CostModel.lin)
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    keep_pandas_out()  # as the harness's ranks
    config = PeerConfig.load(args.config)
    batches = streaming_batches(args.log_dir, config)
    rank = dist.get_rank()
    try:
        with open(args.log_dir / f"rank-{rank}.jsonl", "w") as log:
            train(batches, config.steps, CostModel(args.attn, args.lin), args.seconds_per_cost, log)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
