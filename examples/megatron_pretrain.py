"""Train a megatron-core GPTModel on msd's packed batches, the way Megatron-LM's loop does.

    msd synth demo-data && msd launch recipes/examples-megatron.yaml

The recipe's ``trainer.command`` runs this script once per rank with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` and ``MSD_JOB`` set. It is Megatron-LM's ``pretrain_gpt.py``
in small: each step calls ``get_batch(data_iterator)`` (here msd's adapter,
``msd.integrations.megatron.get_batch``, over ``iter(msd.Client())``), feeds the model
``tokens``, ``position_ids``, ``attention_mask`` and ``labels``, and takes Megatron's loss: the
per-token cross-entropy times ``loss_mask``, summed, over the global count of trained tokens.

* msd's labels are already the next tokens: the adapter does not shift them, and turns msd's
  ignored labels (-100) into ``loss_mask`` 0, so a conversation job's prompts carry no loss.
* Packed samples stay apart: by default the adapter gives a causal ``attention_mask`` blocked
  across the samples of a row (megatron-core's local attention, which runs anywhere). With
  ``--packed`` it gives ``PackedSeqParams`` (``thd``) instead, for Transformer Engine's fused
  attention on GPUs: the model is then built from the Transformer Engine layer spec, and
  the rows come flattened to one sequence of ``rows × seq_len`` tokens.
* Data parallelism only (tensor and pipeline sizes 1), so every rank is a DP rank and reads
  its own batches; torch's DDP averages the gradients.

On CPU (gloo) megatron-core's local attention still asks for two CUDA things, an RNG fork
around its dropout and a CUDA scratch buffer; ``cpu_stand_ins`` replaces both (dropout is 0).
Each rank logs one JSON line per step to ``JOB/trainer/megatron-rank-R.jsonl``: step, global
loss, trained tokens.
"""

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import msd
from msd.errors import MsdError
from msd.integrations.megatron import get_batch

log = logging.getLogger("megatron_pretrain")

BYTES_VOCAB = 256  # msd's bytes transform: token ids are UTF-8 bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a megatron-core GPT on msd's batches.")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=BYTES_VOCAB)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packed", action="store_true", help="thd PackedSeqParams (GPU, TE)")
    return p.parse_args(argv)


class _NoCudaRng:
    def fork(self, name: str = "") -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def cpu_stand_ins(rows: int, heads: int, seq_len: int) -> None:
    """Let megatron-core's local attention run without CUDA: no RNG fork (dropout is 0) and
    its score buffer ([rows · heads, seq_len, seq_len] float32) on the CPU."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._CUDA_RNG_STATE_TRACKER = _NoCudaRng()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    scores = torch.empty(rows * heads * seq_len * seq_len)
    parallel_state.get_global_memory_buffer().buffer[("mpu", torch.float32)] = scores


def build_model(args: argparse.Namespace, seq_len: int, device: torch.device) -> Any:
    """A GPTModel, the same weights on every rank (``args.seed``)."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.heads,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    spec = (
        gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
        if args.packed
        else gpt_layer_specs.get_gpt_layer_local_spec()
    )
    torch.manual_seed(args.seed)
    model = GPTModel(config, spec, vocab_size=args.vocab_size, max_sequence_length=seq_len)
    return model.to(device)


def forward_step(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, float, int]:
    """What to backpropagate, the global mean loss and the global trained-token count
    (Megatron's loss_func: the masked sum over the count, here over every DP rank)."""
    per_token = model(
        batch["tokens"],
        batch["position_ids"],
        batch["attention_mask"],
        labels=batch["labels"],
        packed_seq_params=batch["packed_seq_params"],
    )
    mask = batch["loss_mask"]
    local = (per_token.float() * mask).sum()
    totals = torch.stack([local.detach().double(), mask.sum().double()])
    dist.all_reduce(totals)
    loss_sum, count = totals.tolist()
    count = max(count, 1.0)
    return local * (dist.get_world_size() / count), loss_sum / count, int(count)


def train(args: argparse.Namespace, client: msd.Client, device: torch.device) -> None:
    from megatron.core import parallel_state, tensor_parallel

    recipe = client.job.recipe()
    rows = recipe.global_batch_tokens // (recipe.seq_len * client.world_size)
    parallel_state.initialize_model_parallel(1, 1)
    if device.type == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    else:
        cpu_stand_ins(rows, args.heads, recipe.seq_len)
    model = DistributedDataParallel(build_model(args, recipe.seq_len, device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    out = client.job.trainer / f"megatron-rank-{client.rank}.jsonl"
    data_iterator = iter(client)
    with open(out, "a") as logfile:
        while True:
            try:
                batch = get_batch(data_iterator, packed=args.packed)
            except StopIteration:
                break
            loss, mean, count = forward_step(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            record = {"step": client.step - 1, "loss": mean, "tokens": count}
            logfile.write(json.dumps(record) + "\n")
            logfile.flush()
    parallel_state.destroy_model_parallel()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"rank {os.environ.get('RANK', '-')}: %(message)s"
    )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    if args.packed and not cuda:
        log.error("--packed needs Transformer Engine on a GPU; leave it out on CPU")
        return 1
    try:
        client = msd.Client(device=device if cuda else None)
    except MsdError as exc:
        log.error("%s", exc)
        return 1
    dist.init_process_group(
        "nccl" if cuda else "gloo", rank=client.rank, world_size=client.world_size
    )
    try:
        train(args, client, device)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
