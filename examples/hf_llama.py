"""Train a small Hugging Face Llama on msd's packed batches, data-parallel, and resume it.

    msd synth demo-data && msd launch recipes/examples-hf-llama.yaml
    msd synth demo-chat --kind chat && msd launch recipes/examples-sft.yaml   # conversations

The recipe's ``trainer.command`` runs this script once per rank with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` and ``MSD_JOB`` set. Each rank:

* builds ``LlamaForCausalLM`` from a small ``LlamaConfig`` (random init from ``--seed``; the
  size flags make it larger; the vocabulary the recipe's: 256 for msd's bytes transform, the
  tokenizer's size for a tokenizer), wrapped in DDP: gloo on CPU (one thread a rank), nccl on
  GPUs (one rank a GPU), where the Client hands each batch out already on the rank's GPU
  (``msd.Client(device=...)``: copied on a side stream while the previous step computes);
* feeds it msd's rows as they come. ``position_ids`` restart at every packed sample, and from
  them transformers builds a block-diagonal causal mask for ``sdpa`` and ``eager`` attention,
  but only without a KV cache: ``use_cache=False`` is what keeps samples apart. Flash attention
  gets msd's ``cu_seqlens`` as its varlen offsets instead;
* computes the loss itself from msd's labels, which are already shifted (``labels=`` would make
  the model shift them again): the sum over the rank's predicted tokens divided by the count
  over all ranks, so the gradient does not depend on how the tokens are spread over ranks.
  Where the batch has a ``loss_mask`` (a job with conversation sources) only its tokens count:
  the assistant's replies, not the prompts;
* every ``--save-every`` steps, checkpoints the model, the optimizer and every rank's
  ``client.state_dict()`` in one file (rank 0 writes it atomically), and at start resumes from
  the latest one. When a rank dies, ``msd launch`` restarts every rank: they load that
  checkpoint, and their Clients take the data plane back to its step;
* logs one JSON line per step to ``JOB/trainer/hf-rank-R.jsonl``: step, global mean loss,
  predicted tokens, data-wait and compute time (``--log-samples``: also the batch's sample ids
  and a digest of its tensors).

On CPU a run is deterministic: a resumed run continues the loss curve of an uninterrupted one
exactly (``tests/integration/test_example_hf.py`` checks it).
"""

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

import msd
from msd.errors import MsdError
from msd.jobdir import atomic_write
from msd.recipe.schema import Recipe, Source

log = logging.getLogger("hf_llama")

IGNORE_INDEX = -100  # msd's label where no loss is taken (a sample's end, padding, a prompt)
BYTES_VOCAB = 256  # msd's bytes transform: token ids are UTF-8 bytes
FLASH = ("flash_attention_2", "flash_attention_3")
CHECKPOINT_VERSION = 1
DIGESTED = ("input_ids", "labels", "position_ids", "cu_seqlens")  # what the model is fed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a small Llama on msd's packed batches.")
    size = p.add_argument_group("model size (by default ~20 ms a step of 2 × 256 tokens on a core)")
    size.add_argument("--hidden-size", type=int, default=64)
    size.add_argument("--layers", type=int, default=2)
    size.add_argument("--heads", type=int, default=4)
    size.add_argument("--kv-heads", type=int, default=2)
    size.add_argument("--intermediate-size", type=int, default=256)
    size.add_argument(
        "--vocab-size", type=int, help="default: the recipe's (256 for msd's bytes transform)"
    )
    p.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager", *FLASH))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    p.add_argument("--seed", type=int, default=0, help="the model's initialisation")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps; 0: never")
    p.add_argument("--checkpoint-dir", type=Path, help="default: JOB/trainer/hf-checkpoints")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    p.add_argument("--log-samples", action="store_true", help="log sample ids and a digest")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank on CPU")
    return p.parse_args(argv)


# -- the model and one step ---------------------------------------------------------------------
def source_vocab_size(source: Source) -> int | None:
    """How many token ids a text source's transform yields; None when the script cannot tell
    (stored token ids, a custom function)."""
    if source.token_column is not None or source.data_format == "megatron":
        return None
    if source.transform.kind == "bytes":
        return BYTES_VOCAB
    if source.transform.kind == "tokenizer" and source.transform.path:
        from tokenizers import Tokenizer  # only where a recipe uses one

        tokenizer = Tokenizer.from_file(source.transform.path)
        return int(tokenizer.get_vocab_size(with_added_tokens=True))
    return None


def recipe_vocab_size(recipe: Recipe) -> int:
    """Every token id of the recipe's sources fits below it."""
    sizes = [source_vocab_size(s) for s in recipe.sources]
    if None in sizes:
        raise ValueError("the recipe's token ids have no known range; pass --vocab-size")
    return max(s for s in sizes if s is not None)


def build_model(args: argparse.Namespace, max_positions: int) -> LlamaForCausalLM:
    """A randomly initialised Llama; every rank builds the same weights from ``args.seed``. Its
    vocabulary is ``args.vocab_size``, unset: the bytes transform's."""
    config = LlamaConfig(
        vocab_size=BYTES_VOCAB if args.vocab_size is None else args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max_positions,
        attention_dropout=0.0,
        use_cache=False,  # with a cache, transformers ignores the packing in position_ids
        attn_implementation=args.attn_implementation,
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config)


def model_inputs(
    batch: dict[str, torch.Tensor], attn_implementation: str, device: torch.device
) -> dict[str, Any]:
    """The model's arguments for one batch: the rows and their restarting positions; for flash
    attention also the varlen offsets of every packed sequence (msd's ``cu_seqlens`` are over
    the flattened rows, as flash attention's varlen kernels take them)."""
    inputs: dict[str, Any] = {
        "input_ids": batch["input_ids"].to(device),
        "position_ids": batch["position_ids"].to(device),
        "use_cache": False,  # also for a pretrained config that turns the cache on
    }
    if attn_implementation in FLASH:
        cu_seqlens = batch["cu_seqlens"].to(device)
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        inputs |= {
            "cu_seq_lens_q": cu_seqlens,
            "cu_seq_lens_k": cu_seqlens,
            "max_length_q": longest,
            "max_length_k": longest,
        }
    return inputs


def trained_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The batch's labels, ``IGNORE_INDEX`` wherever its ``loss_mask`` (a job with conversation
    sources has one) says no loss is taken. msd's labels are ignored there already; a batch
    built elsewhere, with every next token as its label, need not be."""
    labels = batch["labels"]
    if "loss_mask" not in batch:
        return labels
    return labels.masked_fill(~batch["loss_mask"].to(labels.device), IGNORE_INDEX)


def packed_loss(
    logits: torch.Tensor, labels: torch.Tensor, world_size: int
) -> tuple[torch.Tensor, float, int]:
    """What to backpropagate, the global mean loss, and the global count of predicted tokens.

    The rank's summed loss over the count of all ranks' predicted tokens, times ``world_size``
    because DDP averages gradients over ranks: the averaged gradient is that of the global
    mean, however the tokens are spread over ranks.
    """
    labels = labels.to(logits.device)
    local = F.cross_entropy(
        logits.flatten(0, -2).float(),
        labels.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    totals = torch.stack([local.detach().double(), (labels != IGNORE_INDEX).sum().double()])
    dist.all_reduce(totals)
    loss_sum, count = totals.tolist()
    count = max(count, 1.0)
    return local * (world_size / count), loss_sum / count, int(count)


def learning_rate(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then constant: a function of the step alone, so a resumed run needs no
    scheduler state."""
    return float(args.lr * min(1.0, (step + 1) / max(1, args.warmup_steps)))


def train_step(
    ddp: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    step: int,
    args: argparse.Namespace,
) -> tuple[float, int]:
    """One optimizer step on this rank's batch; the global mean loss and predicted tokens."""
    device = next(ddp.parameters()).device
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, args)
    # bf16 on GPUs (what flash attention needs); float32, bitwise reproducible, on CPU
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = ddp(**model_inputs(batch, args.attn_implementation, device)).logits
    loss, mean, count = packed_loss(logits, trained_labels(batch), dist.get_world_size())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.clip)
    optimizer.step()
    return mean, count


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay
    )


def ordered_allreduce(
    group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's average of a gradient bucket, summed in rank order.

    gloo's ring all-reduce adds up each element in an order that depends on where it lies in
    the bucket, and DDP lays its buckets out again after its first step, so a resumed process
    (whose first step has the first layout) would get gradients a few bits off those of the run
    it continues. Gathering the buckets and adding them in rank order gives the same bits
    whatever the layout: the resumed run's loss curve is exactly the uninterrupted one's.
    """
    grads = bucket.buffer()
    parts = [torch.empty_like(grads) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, grads, group=group)
    total = parts[0]
    for part in parts[1:]:
        total += part
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(total.div_(len(parts)))
    return future


def data_parallel(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    ddp = DistributedDataParallel(model, device_ids=None if device.index is None else [device])
    ddp.register_comm_hook(None, ordered_allreduce)
    return ddp


def batch_digest(batch: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors the model is fed (to compare two runs' batches)."""
    h = hashlib.sha256()
    for name in DIGESTED:
        h.update(batch[name].cpu().numpy().tobytes())
    return h.hexdigest()


# -- checkpoints --------------------------------------------------------------------------------
class Checkpoints:
    """``step-SSSSSSSS.pt`` files in one folder, each whole or absent (written to a temporary
    file, then renamed): ``version``, ``step`` (the next step to train), ``world_size``,
    ``model``, ``optimizer`` and ``clients`` (every rank's ``Client.state_dict()``)."""

    def __init__(self, folder: Path, keep: int) -> None:
        self.folder, self.keep = folder, max(1, keep)

    def all(self) -> list[Path]:
        return sorted(self.folder.glob("step-*.pt"))

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"step-{step:08d}.pt"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            torch.save({"version": CHECKPOINT_VERSION, "step": step, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        for old in self.all()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path

    @staticmethod
    def load(path: Path) -> dict[str, Any]:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"{path} has version {state.get('version')!r}, not 1")
        return state


def save_checkpoint(
    checkpoints: Checkpoints,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    client: msd.Client,
) -> None:
    """Every rank's data state to rank 0, which writes it with the model and the optimizer
    (the same on every rank: DDP keeps them so)."""
    clients: list[Any] = [None] * client.world_size
    dist.all_gather_object(clients, client.state_dict())
    if client.rank == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        path = checkpoints.save(
            client.step, {**state, "world_size": client.world_size, "clients": clients}
        )
        log.info("saved %s", path)


def resume(
    checkpoints: Checkpoints,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    client: msd.Client,
) -> int:
    """Load the latest checkpoint (rank 0 picks it, so every rank loads the same); the step to
    go on from, 0 when there is none."""
    chosen = [str(checkpoints.latest() or "") if client.rank == 0 else ""]
    dist.broadcast_object_list(chosen, src=0)
    if not chosen[0]:
        return 0
    state = Checkpoints.load(Path(chosen[0]))
    if state["world_size"] != client.world_size:
        raise ValueError(f"{chosen[0]} is of {state['world_size']} ranks, not {client.world_size}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    client.load_state_dict(state["clients"][client.rank])  # the data plane goes back there
    log.info("resumed from %s at step %d", chosen[0], state["step"])
    return int(state["step"])


def open_step_log(path: Path, start: int) -> TextIO:
    """The rank's step log, keeping only the lines of steps before ``start``."""
    kept = []
    for line in path.read_text().splitlines() if start and path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):  # a line being written when killed
            if json.loads(line)["step"] < start:
                kept.append(line + "\n")
    atomic_write(path, "".join(kept).encode())
    return open(path, "a")


# -- the loop -----------------------------------------------------------------------------------
def step_record(
    batch: dict[str, torch.Tensor], step: int, start: int, result: tuple[float, int]
) -> dict[str, Any]:
    loss, global_tokens = result
    return {
        "step": step,
        "loss": loss,
        "tokens": int((trained_labels(batch) != IGNORE_INDEX).sum()),  # this rank's trained
        "global_tokens": global_tokens,
        "start_step": start,  # where this process began: 0, or the step it resumed at
    }


def train(args: argparse.Namespace, client: msd.Client, device: torch.device) -> None:
    model = build_model(args, client.job.recipe().seq_len).to(device)
    optimizer = make_optimizer(model, args)
    checkpoints = Checkpoints(
        args.checkpoint_dir or client.job.trainer / "hf-checkpoints", args.keep
    )
    start = resume(checkpoints, model, optimizer, client)
    ddp = data_parallel(model, device)
    with open_step_log(client.job.trainer / f"hf-rank-{client.rank}.jsonl", start) as steps:
        for batch in client:
            wait_ms = client.last_wait_s * 1e3
            started = time.perf_counter()
            step = client.step - 1
            record = step_record(batch, step, start, train_step(ddp, optimizer, batch, step, args))
            record |= {"wait_ms": wait_ms, "step_ms": (time.perf_counter() - started) * 1e3}
            if args.log_samples:
                record |= {
                    "sample_ids": batch["sample_ids"].tolist(),
                    "source_ids": batch["source_ids"].tolist(),
                    "sample_offsets": batch["sample_offsets"].tolist(),
                    "digest": batch_digest(batch),
                }
            steps.write(json.dumps(record | {"time": time.time()}) + "\n")
            steps.flush()
            if args.save_every and client.step % args.save_every == 0:
                save_checkpoint(checkpoints, model, optimizer, client)
            if step % 10 == 0 and client.rank == 0:
                log.info("step %d loss %.4f data-wait %.1f ms", step, record["loss"], wait_ms)
    client.close()


def setup_device(local_rank: int, threads: int) -> tuple[str, torch.device]:
    """nccl on this rank's GPU where there is one, else gloo on the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    torch.set_num_threads(threads)  # the ranks of a node share its cores
    return "gloo", torch.device("cpu")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = os.environ.get("RANK", "-")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank}: %(message)s")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and local_rank >= torch.cuda.device_count():
        log.error("local rank %d but %d GPU(s) here: one rank per GPU", local_rank,
                  torch.cuda.device_count())  # fmt: skip
        return 1
    backend, device = setup_device(local_rank, args.threads)
    try:
        # Job, rank and world size from the launcher's environment. On a GPU the Client hands
        # batches out on it, copied while the previous step computes.
        client = msd.Client(device=device if device.type == "cuda" else None)
        if args.vocab_size is None:
            args.vocab_size = recipe_vocab_size(client.job.recipe())
    except (MsdError, ValueError) as exc:  # ValueError: a recipe this script cannot size
        log.error("%s", exc)
        return 1
    if args.attn_implementation in FLASH and device.type != "cuda":
        log.error("%s needs a GPU; use sdpa on CPU", args.attn_implementation)
        return 1
    dist.init_process_group(backend, rank=client.rank, world_size=client.world_size)
    try:
        train(args, client, device)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
