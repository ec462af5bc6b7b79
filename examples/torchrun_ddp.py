"""A plain PyTorch DDP training loop fed by msd: copy it and put your model in.

msd runs the data plane; you run the trainers. Start the data plane (attach mode: the recipe
has no ``trainer:`` section) and note the job folder it prints::

    msd launch recipes/examples-attach.yaml     # prints "job folder: runs/examples-attach-..."

Then, in another shell, start the four ranks the recipe asks for (``msd ls --json`` lists the
job folders too)::

    export MSD_JOB=runs/examples-attach-...
    torchrun --standalone --nproc-per-node 4 examples/torchrun_ddp.py

On SLURM (``cluster: slurm`` in the recipe, or ``msd launch --cluster slurm``), submit the job
script beside this file with that folder; it starts one ``msd sidecar`` per node and the ranks
with srun (each rank reads SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID)::

    sbatch --nodes=2 --ntasks-per-node=2 examples/torchrun_ddp.sbatch runs/examples-attach-...

Every rank gets its share of each global step from ``msd.Client``: ``input_ids``, ``labels``
(already shifted, ``-100`` where nothing is to be predicted) and ``position_ids`` (restarting at
every packed sample) as ``[rows, seq_len]``. ``--checkpoint FILE`` saves the model, the optimizer
and ``client.state_dict()`` together and continues from them when FILE exists. ``--digests DIR``
writes, per rank, the digest of every batch received (``DIR/rank-R.jsonl``), to compare streams.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import IO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import msd
from msd.batch.pack import IGNORE_INDEX  # the label of "no next token here": sample ends, padding
from msd.errors import MsdError
from msd.trainer.demo import batch_digest

log = logging.getLogger("torchrun_ddp")
NO_MASTER = (
    "MASTER_ADDR and MASTER_PORT are not set: start the ranks with torchrun, or export them "
    "in the job script as examples/torchrun_ddp.sbatch does"
)


class TinyLM(nn.Module):
    """Token and position embeddings, one pre-norm transformer block, a vocabulary head.

    Packed samples must not attend to each other: a token attends to the earlier tokens of its
    own sample only, found from ``position_ids`` (they restart at 0 at every sample).
    """

    def __init__(self, vocab_size: int, seq_len: int, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(seq_len, dim)
        self.norm1, self.norm2, self.norm_out = (nn.LayerNorm(dim) for _ in range(3))
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(input_ids) + self.positions(position_ids)
        x = x + self.proj(self._attention(self.norm1(x), same_sample_causal(position_ids)))
        x = x + self.mlp(self.norm2(x))
        logits: torch.Tensor = self.head(self.norm_out(x))
        return logits

    def _attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows, length, dim = x.shape
        q, k, v = self.qkv(x).view(rows, length, 3, self.heads, dim // self.heads).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None]
        )
        return out.transpose(1, 2).reshape(rows, length, dim)


def same_sample_causal(position_ids: torch.Tensor) -> torch.Tensor:
    """[rows, L, L] bool: token i may attend to token j (j ≤ i, in the same packed sample)."""
    sample = torch.cumsum(position_ids == 0, dim=1)
    same = sample[:, :, None] == sample[:, None, :]
    length = position_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return same & causal


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the predicted tokens (0 for a batch that has none)."""
    total = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / (labels != IGNORE_INDEX).sum().clamp(min=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A plain PyTorch DDP training loop fed by msd.")
    p.add_argument("--vocab-size", type=int, default=256, help="256: msd's bytes tokenizer")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--checkpoint", type=Path, help="model, optimizer and data state (one file)")
    p.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--max-steps", type=int, help="stop after this many steps of this run")
    p.add_argument("--digests", type=Path, help="write each rank's batch digests here")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def setup_device() -> tuple[str, torch.device]:
    """nccl on this rank's GPU where there is one, else gloo on the CPU (one thread a rank).
    The rank's GPU is its LOCAL_RANK (torchrun), else its SLURM_LOCALID (srun)."""
    local_rank = int(os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID") or 0)
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK is {local_rank}, but this node has only "
                f"{torch.cuda.device_count()} GPUs: start one rank per GPU"
            )
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    torch.set_num_threads(1)  # ranks of a node share its cores
    return "gloo", torch.device("cpu")


def load_checkpoint(
    path: Path | None, model: nn.Module, optim: torch.optim.Optimizer, client: msd.Client
) -> None:
    if path is None or not path.exists():
        return
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optimizer"])
    client.load_state_dict(state["data"])  # the stream goes on from the step saved
    log.info("resumed from %s at step %d", path, client.step)


def save_checkpoint(
    path: Path, model: nn.Module, optim: torch.optim.Optimizer, client: msd.Client
) -> None:
    """Rank 0 writes one file for all ranks (their model and data states are the same)."""
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optim.state_dict()}
        tmp = path.with_name(path.name + ".tmp")
        torch.save({**state, "data": client.state_dict()}, tmp)
        os.replace(tmp, path)  # whole or not at all
    dist.barrier()  # no rank goes on before the checkpoint is complete


def digest_file(folder: Path | None, rank: int) -> AbstractContextManager[IO[str] | None]:
    if folder is None:
        return nullcontext()
    folder.mkdir(parents=True, exist_ok=True)
    return open(folder / f"rank-{rank}.jsonl", "a")  # appended: a resumed run adds to it


def check_vocab(input_ids: torch.Tensor, vocab_size: int) -> None:
    top = int(input_ids.max())
    if top >= vocab_size:
        raise ValueError(f"token id {top} in the batch; pass --vocab-size {top + 1} or more")


def train(args: argparse.Namespace, client: msd.Client, device: torch.device) -> None:
    recipe = client.job.recipe()
    model = TinyLM(args.vocab_size, recipe.seq_len).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    load_checkpoint(args.checkpoint, model, optim, client)
    ddp = DistributedDataParallel(
        model, device_ids=None if device.index is None else [device.index]
    )
    steps = 0
    with digest_file(args.digests, client.rank) as digests:
        for batch in client:
            if digests is not None:
                line = {"step": client.step - 1, "digest": batch_digest(batch)}
                digests.write(json.dumps(line) + "\n")
            check_vocab(batch["input_ids"], args.vocab_size)
            logits = ddp(batch["input_ids"].to(device), batch["position_ids"].to(device))
            loss = next_token_loss(logits, batch["labels"].to(device))
            optim.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # DDP averages gradients over ranks
            optim.step()
            steps += 1
            if client.rank == 0 and steps % args.log_every == 0:
                wait_ms = client.last_wait_s * 1e3
                log.info(
                    "step %d loss %.4f data-wait %.1f ms", client.step - 1, loss.item(), wait_ms
                )
            if args.checkpoint is not None and steps % args.save_every == 0:
                save_checkpoint(args.checkpoint, model, optim, client)
            if args.max_steps is not None and steps >= args.max_steps:
                break
    if args.checkpoint is not None:
        save_checkpoint(args.checkpoint, model, optim, client)
    client.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        backend, device = setup_device()
        # Rank and world size from torchrun (RANK, WORLD_SIZE) or srun (SLURM_PROCID, ...);
        # msd checks them against the recipe before any rank waits for another. On a GPU the
        # Client hands batches out on it, copied while the previous step computes.
        client = msd.Client(device=device if device.type == "cuda" else None)
    except (MsdError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        print(f"error: {NO_MASTER}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {client.rank}: %(message)s")
    dist.init_process_group(backend, rank=client.rank, world_size=client.world_size)
    try:
        train(args, client, device)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
