"""Train a small Hugging Face Llama with transformers' ``Trainer`` on msd's batches.

    msd synth demo-data && msd launch recipes/examples-hf-trainer.yaml

The recipe's ``trainer.command`` runs this script once per rank with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and ``MSD_JOB`` set (from which the Trainer
starts its process group: gloo on CPU, nccl on GPUs). ``msd.integrations.transformers.MsdTrainer``
is the stock Trainer with msd's data:

* each rank trains on its own ``msd.Client`` batches as they come (no sampler, no re-batching;
  the batch size is the recipe's ``global_batch_tokens``);
* the loss is computed from msd's already shifted ``labels``, and the model gets the restarting
  ``position_ids`` with ``use_cache=False``, which keeps packed samples apart;
* every ``--save-steps`` steps the Trainer checkpoints into ``--output-dir`` (default
  ``JOB/trainer/hf-trainer``), the data plane's state beside it as ``msd_data.json``. Every start
  resumes from the latest checkpoint there: kill a rank and ``msd launch`` restarts them all,
  and they go on with the batches and losses of an uninterrupted run.

Each rank logs one JSON line per step to ``JOB/trainer/hf-trainer-rank-R.jsonl``: the step,
the global mean loss, this rank's trained tokens, the step this process started at and, with
``--log-samples``, a digest of the batch (``msd.trainer.demo.batch_digest``).
"""

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import msd
from msd.batch.pack import IGNORE_INDEX
from msd.errors import MsdError
from msd.integrations.transformers import MsdTrainer, load_data_state, trained_labels
from msd.trainer.demo import batch_digest

log = logging.getLogger("hf_trainer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="transformers' Trainer on msd's packed batches.")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=256, help="256: msd's bytes transform")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=-1, help="default: the recipe's steps")
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument("--output-dir", type=Path, help="default: JOB/trainer/hf-trainer")
    p.add_argument("--seed", type=int, default=0, help="the model's initialisation")
    p.add_argument("--log-samples", action="store_true", help="log a digest of every batch")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank on CPU")
    return p.parse_args(argv)


def build_model(args: argparse.Namespace, max_positions: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=4 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads // 2,
        max_position_embeddings=max_positions,
        use_cache=False,  # with a cache, transformers ignores the packing in position_ids
        attn_implementation="sdpa",
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config)


def training_arguments(args: argparse.Namespace, output_dir: Path) -> TrainingArguments:
    """Those of hf_llama.py: AdamW (0.9, 0.95), warm-up then a constant rate, clipping at 1."""
    return TrainingArguments(
        output_dir=str(output_dir),
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=args.warmup_steps,
        weight_decay=0.1,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=2,
        logging_steps=10,
        report_to="none",
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        ddp_backend=None if torch.cuda.is_available() else "gloo",
        seed=args.seed,
    )


class LoggedTrainer(MsdTrainer):
    """MsdTrainer writing one line per step to ``steps`` (every rank its own file)."""

    def __init__(self, *a: Any, steps: TextIO, log_samples: bool, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.steps, self.log_samples = steps, log_samples
        self.start_step: int | None = None  # the first step this process trains

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        if self.start_step is None:
            self.start_step = self.client.step - 1
        record: dict[str, Any] = {"step": self.client.step - 1, "start_step": self.start_step}
        if self.log_samples:
            record["digest"] = batch_digest(inputs)
        record["tokens"] = int((trained_labels(inputs) != IGNORE_INDEX).sum())
        loss = super().training_step(model, inputs, num_items_in_batch)
        mean = loss.detach().clone().double()  # this rank's share, times the world size
        dist.all_reduce(mean)
        record["loss"] = mean.item() / dist.get_world_size()
        self.steps.write(json.dumps(record) + "\n")
        self.steps.flush()
        return loss


def open_step_log(path: Path, start: int) -> TextIO:
    """The rank's step log, keeping only the lines of steps before ``start``."""
    kept = []
    for line in path.read_text().splitlines() if start and path.exists() else []:
        try:
            if json.loads(line)["step"] < start:
                kept.append(line + "\n")
        except json.JSONDecodeError:  # a line being written when killed
            continue
    path.write_text("".join(kept))
    return open(path, "a")


def train(args: argparse.Namespace, client: msd.Client) -> None:
    output_dir = args.output_dir or client.job.trainer / "hf-trainer"
    training = training_arguments(args, output_dir)  # starts the process group
    last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    start = int(load_data_state(Path(last))["step"]) if last else 0  # msd's step to go on from
    model = build_model(args, client.job.recipe().seq_len)
    log_path = client.job.trainer / f"hf-trainer-rank-{client.rank}.jsonl"
    with open_step_log(log_path, start) as steps:
        trainer = LoggedTrainer(
            model=model, args=training, client=client, steps=steps, log_samples=args.log_samples
        )
        trainer.train(resume_from_checkpoint=last)  # None: from the start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = os.environ.get("RANK", "-")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank}: %(message)s")
    if not torch.cuda.is_available():
        torch.set_num_threads(args.threads)  # the ranks of a node share its cores
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else None
        client = msd.Client(device=device)  # job, rank and world size from the environment
        train(args, client)
    except MsdError as exc:  # msd's one sentence (a checkpoint without msd_data.json, ...)
        log.error("%s", exc)
        return 1
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
