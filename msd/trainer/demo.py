"""The built-in demo trainer: reads batches with ``msd.NumpyClient`` and "computes" for a time
proportional to its batch's attention cost (and its vision encoder's), then waits for every
other rank (``msd.trainer.barrier``, as a data-parallel gradient all-reduce does), so a slow rank
slows every rank. Its numpy arrays are the bytes ``msd.Client`` hands out as tensors, and it
never imports torch, so its ranks start in a fraction of a second.

Each step it appends one JSON line to ``JOB/trainer/rank-R.jsonl``: a digest of the batch's
tensors, the sample and source ids it got, its token count and how long it waited for data;
with ``save_batches`` also the tensors themselves, as ``JOB/trainer/rank-R/step-S.npz``.

Like a real trainer it checkpoints, after every step: its ``Client.state_dict()`` goes to
``JOB/trainer/rank-R.state.json``. A restarted rank loads it (``Client.load_state_dict``), drops
the lines its log holds for steps after it, and goes on from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from msd.client.base import Reader, node_name
from msd.client.numpy import NumpyClient
from msd.jobdir import atomic_write
from msd.recipe.schema import Trainer
from msd.trainer.barrier import Barrier

# A batch as numpy arrays, or as CPU torch tensors (this module's helpers read both: a torch
# trainer's digests equal the demo trainer's).
Batch = dict[str, Any]


def host_array(tensor: Any) -> np.ndarray:
    """``tensor`` (a numpy array, or a torch tensor on any device) as a numpy array."""
    if hasattr(tensor, "cpu"):
        tensor = tensor.cpu().numpy()
    return np.asarray(tensor)


def batch_digest(batch: Batch) -> str:
    """One hash over every tensor the rank received (names included)."""
    h = hashlib.sha256()
    for name in sorted(batch):
        h.update(name.encode())
        h.update(host_array(batch[name]).tobytes())
    return h.hexdigest()


def attention_cost(cu_seqlens: Any) -> float:
    """Σ len² over the batch's sequences (what varlen attention computes)."""
    lens = np.diff(host_array(cu_seqlens).astype(np.float64))
    return float(np.square(lens).sum())


def encoder_cost(batch: Batch) -> float:
    """Σ patches² over the batch's images, and Σ frames·(patches per frame)² over its videos
    (the vision encoder's attention: per image, per temporal patch of a video); 0 for a rank
    that gets neither."""
    cost = 0.0
    if "vision_cu_seqlens" in batch:
        cost += attention_cost(batch["vision_cu_seqlens"])
    if "video_grid_thw" in batch:
        grids = host_array(batch["video_grid_thw"]).astype(np.float64).reshape(-1, 3)
        cost += float(np.sum(grids[:, 0] * (grids[:, 1] * grids[:, 2]) ** 2))
    return cost


def real_tokens(batch: Batch) -> int:
    """Sample tokens in the batch (padding excluded when the rank has the labels to tell)."""
    if "labels" in batch:
        return int((batch["labels"] != -100).sum()) + len(batch["sample_ids"])
    return int(batch["cu_seqlens"][-1])


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the rank's checkpoint (rename: whole or not at all; no fsync, a demo's)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def resume(client: Reader[Any]) -> None:
    """Continue from the last step every rank checkpointed (as a trainer restores one global
    checkpoint: ranks killed between the barrier and their save are one step apart); keep
    this rank's log up to it."""
    log = client.job.rank_log(client.rank)
    states = [
        json.loads((client.job.trainer / f"rank-{rank}.state.json").read_text())
        for rank in range(client.world_size)
        if (client.job.trainer / f"rank-{rank}.state.json").exists()
    ]
    if len(states) < client.world_size:  # a rank never finished a step: start afresh
        log.write_bytes(b"")
        return
    state = min(states, key=lambda st: int(st["step"]))
    client.load_state_dict(state)
    lines = log.read_text().splitlines() if log.exists() else []
    kept = [line for line in lines if json.loads(line)["step"] < state["step"]]
    atomic_write(log, "".join(line + "\n" for line in kept).encode())


def run(
    client: NumpyClient,
    barrier: Barrier,
    step_ms: float,
    rows: int,
    seq_len: int,
    save: bool,
) -> None:
    full_cost = rows * float(seq_len) ** 2
    saved = client.job.trainer / f"rank-{client.rank}"
    state_file = client.job.trainer / f"rank-{client.rank}.state.json"
    resume(client)
    with open(client.job.rank_log(client.rank), "a") as log:
        for batch in client:
            wait_ms = client.last_wait_s * 1000
            started = time.perf_counter()
            cost = attention_cost(batch["cu_seqlens"]) + encoder_cost(batch)
            record = {
                "step": client.step - 1,
                "node": node_name(),
                "digest": batch_digest(batch),
                "tensors": sorted(batch),
                "sample_ids": host_array(batch["sample_ids"]).tolist(),
                "source_ids": host_array(batch["source_ids"]).tolist(),
                "sample_offsets": host_array(batch["sample_offsets"]).tolist(),
                "tokens": real_tokens(batch),
                "wait_ms": round(wait_ms, 3),
                "time": round(time.time(), 6),
                "cost": cost,
            }
            if "image_sample_ids" in batch:
                record["image_sample_ids"] = host_array(batch["image_sample_ids"]).tolist()
                record["image_source_ids"] = host_array(batch["image_source_ids"]).tolist()
                record["patches"] = int(batch["pixel_values"].shape[0])
            if "video_sample_ids" in batch:
                record["video_sample_ids"] = host_array(batch["video_sample_ids"]).tolist()
                record["video_source_ids"] = host_array(batch["video_source_ids"]).tolist()
                record["video_patches"] = int(batch["pixel_values_videos"].shape[0])
            log.write(json.dumps(record) + "\n")
            log.flush()  # a line per step, as it happens: `tail -f` and tests read it live
            if save:
                saved.mkdir(exist_ok=True)
                arrays: dict[str, Any] = dict(batch)
                np.savez(saved / f"step-{client.step - 1}.npz", **arrays)
            remaining = step_ms / 1000 * cost / full_cost - (time.perf_counter() - started)
            if remaining > 0:
                time.sleep(remaining)
            barrier.wait(client.step - 1)
            save_state(state_file, client.state_dict())


def main() -> None:
    client = NumpyClient()
    recipe = client.job.recipe()
    # MASTER_ADDR / MASTER_PORT come from the launcher; every rank starts together, as at a
    # process group's rendezvous
    barrier = Barrier.from_env(client.job, client.rank, client.world_size)
    try:
        barrier.wait(-1)
        demo = (recipe.trainer or Trainer()).demo
        run(client, barrier, demo.step_ms, recipe.rows_per_rank, recipe.seq_len, demo.save_batches)
    finally:
        barrier.close()


if __name__ == "__main__":
    main()
