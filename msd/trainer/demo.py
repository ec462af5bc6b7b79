"""The built-in demo trainer: reads batches with ``msd.Client`` and "computes" for a time
proportional to its batch's attention cost, then waits for every other rank (a gloo barrier,
as a data-parallel gradient all-reduce does), so a slow rank slows every rank.

Each step it appends one JSON line to ``JOB/trainer/rank-R.jsonl``: a digest of the batch's
tensors, the sample and source ids it got, its token count and how long it waited for data.
"""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import torch
import torch.distributed as dist

from msd.client import Client

_DIGESTED = ("input_ids", "labels", "position_ids", "cu_seqlens", "sample_ids", "source_ids")


def batch_digest(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in _DIGESTED:
        h.update(name.encode())
        h.update(batch[name].numpy().tobytes())
    return h.hexdigest()


def attention_cost(cu_seqlens: torch.Tensor, labels: torch.Tensor) -> float:
    """Σ len² over the real (non-padding) sequences of the batch."""
    lens = np.diff(cu_seqlens.numpy().astype(np.int64))
    starts = cu_seqlens.numpy()[:-1]
    real = labels.numpy().reshape(-1)[np.minimum(starts, labels.numel() - 1)] != -100
    return float(np.sum(lens[real & (lens > 1)] ** 2))


def run(client: Client, step_ms: float, rows: int, seq_len: int) -> None:
    full_cost = rows * float(seq_len) ** 2
    with open(client.job.rank_log(client.rank), "w") as log:
        for batch in client:
            wait_ms = client.last_wait_s * 1000
            started = time.perf_counter()
            cost = attention_cost(batch["cu_seqlens"], batch["labels"])
            record = {
                "step": client.step - 1,
                "digest": batch_digest(batch),
                "sample_ids": batch["sample_ids"].tolist(),
                "source_ids": batch["source_ids"].tolist(),
                "tokens": int((batch["labels"] != -100).sum()) + len(batch["sample_ids"]),
                "wait_ms": round(wait_ms, 3),
                "time": round(time.time(), 6),
                "cost": cost,
            }
            log.write(json.dumps(record) + "\n")
            remaining = step_ms / 1000 * cost / full_cost - (time.perf_counter() - started)
            if remaining > 0:
                time.sleep(remaining)
            if dist.is_initialized():
                dist.barrier()


def main() -> None:
    client = Client()
    recipe = client.job.recipe()
    if client.world_size > 1:  # MASTER_ADDR / MASTER_PORT come from the launcher
        dist.init_process_group("gloo", rank=client.rank, world_size=client.world_size)
    try:
        run(client, recipe.trainer.demo.step_ms, recipe.rows_per_rank, recipe.seq_len)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
