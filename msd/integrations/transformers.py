"""``MsdTrainer``: a Hugging Face ``transformers.Trainer`` that trains on msd's batches.

msd hands each rank its already-formed share of every global step, with ``labels`` already
shifted (``labels[t]`` is the token after ``input_ids[t]``, -100 where nothing is trained) and
``position_ids`` restarting at every packed sample. The stock Trainer would shard and batch the
stream again, shift the labels a second time and, on resume, skip batches the data plane
no longer sends. This subclass:

* trains on ``client`` as it comes: no sampler, no re-batching, no accelerate sharding;
* computes the loss itself from msd's labels (and ``loss_mask`` where the job has one): the
  sum over the rank's trained tokens over the count on all ranks, so the gradient DDP averages
  is that of the global mean; the model gets ``position_ids`` with ``use_cache=False``, which
  keeps packed samples apart (flash attention gets ``cu_seqlens`` as its varlen offsets);
* writes ``client.state_dict()`` as ``msd_data.json`` into every checkpoint folder, and on
  ``train(resume_from_checkpoint=...)`` loads it back, with the Trainer's own batch skipping
  off: a resumed run reads the batches an uninterrupted one would.

One msd step is one optimizer step: the batch size is the recipe's ``global_batch_tokens``,
``per_device_train_batch_size`` and gradient accumulation do not apply.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
from torch.utils.data import DataLoader
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from msd.batch.pack import IGNORE_INDEX
from msd.client import Client
from msd.errors import CheckpointError, LaunchError
from msd.jobdir import atomic_write

__all__ = [
    "DATA_STATE_NAME",
    "MsdTrainer",
    "load_data_state",
    "model_inputs",
    "next_token_loss",
    "trained_labels",
]

log = logging.getLogger(__name__)

DATA_STATE_NAME = "msd_data.json"  # the data plane's state in a Trainer checkpoint folder
FLASH = ("flash_attention_2", "flash_attention_3")


def trained_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The batch's labels, ``IGNORE_INDEX`` wherever its ``loss_mask`` (jobs with conversation
    sources) says no loss is taken."""
    labels = batch["labels"]
    if "loss_mask" not in batch:
        return labels
    return labels.masked_fill(~batch["loss_mask"].to(labels.device), IGNORE_INDEX)


def model_inputs(batch: dict[str, torch.Tensor], attn_implementation: str) -> dict[str, Any]:
    """The model's arguments for one msd batch: the rows and their restarting positions (from
    which transformers masks packed samples apart, without a KV cache); for flash attention
    also msd's ``cu_seqlens`` as the varlen offsets."""
    inputs: dict[str, Any] = {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "use_cache": False,  # with a cache, transformers ignores the packing in position_ids
    }
    if attn_implementation in FLASH:
        cu_seqlens = batch["cu_seqlens"]
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        inputs |= {
            "cu_seq_lens_q": cu_seqlens,
            "cu_seq_lens_k": cu_seqlens,
            "max_length_q": longest,
            "max_length_k": longest,
        }
    return inputs


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What to backpropagate on this rank: its summed cross-entropy over the count of trained
    tokens on all ranks, times the world size because DDP averages gradients over ranks. The
    mean of this over ranks is the global mean loss per trained token."""
    labels = labels.to(logits.device)
    local = F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    count = (labels != IGNORE_INDEX).sum().to(torch.float64)
    world_size = 1
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
        world_size = dist.get_world_size()
    return local * (world_size / count.clamp(min=1.0).item())


class MsdTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` fed by ``client`` (an ``msd.Client`` of this process's rank);
    every other argument is the Trainer's. ``train_dataset`` and ``data_collator`` are msd's.

    Unset ``max_steps`` (``-1``) trains to the end of the recipe's ``steps``.
    """

    def __init__(self, *args: Any, client: Client, **kwargs: Any) -> None:
        for name in ("train_dataset", "data_collator"):
            if kwargs.get(name) is not None:
                raise ValueError(f"MsdTrainer takes no {name}: the batches are msd's (client=)")
        super().__init__(*args, **kwargs)
        self.client = client
        self._check_arguments()
        self.step_zero = client.step  # msd's step of the Trainer's global step 0
        self.args.ignore_data_skip = True  # the Client goes back to its step itself
        self.model_accepts_loss_kwargs = False  # compute_loss counts the trained tokens
        if self.args.max_steps <= 0 and (steps := client.job.recipe().steps) is not None:
            self.args.max_steps = steps - client.step

    def _check_arguments(self) -> None:
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError(
                "MsdTrainer trains one msd step per optimizer step: set gradient_accumulation_steps"
                " to 1 and the recipe's global_batch_tokens to the batch you want"
            )
        rank, world_size = self.args.process_index, self.args.world_size
        if (self.client.rank, self.client.world_size) != (rank, world_size):
            raise LaunchError(
                f"the msd Client is rank {self.client.rank} of {self.client.world_size} but this "
                f"Trainer process is rank {rank} of {world_size}"
            )

    # -- the data -------------------------------------------------------------------------------
    def get_train_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        """This rank's batches as msd forms them: no sampler, no collation, no sharding."""
        return DataLoader(self.client, batch_size=None, num_workers=0, pin_memory=False)

    def get_resumed_dataloader(
        self, dataloader: DataLoader[dict[str, torch.Tensor]], num_batches: int
    ) -> DataLoader[dict[str, torch.Tensor]]:
        return dataloader  # never skip: the Client resumes at its checkpointed step

    # -- the loss -------------------------------------------------------------------------------
    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        """The global mean cross-entropy over trained tokens, from msd's already shifted
        labels (``num_items_in_batch`` is not used: the count comes from all ranks here)."""
        config = getattr(self.model, "config", None)
        attention = getattr(config, "_attn_implementation", None) or "sdpa"
        outputs = model(**model_inputs(inputs, attention))
        loss = next_token_loss(outputs.logits, trained_labels(inputs))
        return (loss, outputs) if return_outputs else loss

    # -- checkpoints ----------------------------------------------------------------------------
    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """The data plane's state first: a folder with ``trainer_state.json`` (written last by
        the Trainer) then always has it. Its step is that of the steps trained, not of the
        batches fetched: a dataloader reading ahead does not move it."""
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial))
            folder /= f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            state = self.client.state_dict() | {"step": self.step_zero + self.state.global_step}
            atomic_write(folder / DATA_STATE_NAME, json.dumps(state, indent=1).encode())
        super()._save_checkpoint(model, trial)

    def train(  # type: ignore[override]
        self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any
    ) -> transformers.trainer_utils.TrainOutput:
        """The Trainer's ``train``; resuming also takes the Client back to the checkpoint's step."""
        if resume_from_checkpoint is True:
            last: str | None = get_last_checkpoint(self.args.output_dir)  # type: ignore[no-untyped-call]
            if last is None:
                raise CheckpointError(f"no checkpoint-N folder in {self.args.output_dir}")
            resume_from_checkpoint = last
        if isinstance(resume_from_checkpoint, str | os.PathLike):
            resume_from_checkpoint = str(resume_from_checkpoint)
            self.client.load_state_dict(load_data_state(Path(resume_from_checkpoint)))
            trained = TrainerState.load_from_json(
                os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME)
            ).global_step
            self.step_zero = self.client.step - trained
            log.info("msd resumes at step %d from %s", self.client.step, resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint or None, **kwargs)


def load_data_state(checkpoint: Path) -> dict[str, Any]:
    """The Client state saved in a Trainer checkpoint folder."""
    path = checkpoint / DATA_STATE_NAME
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing: the checkpoint was not written by MsdTrainer"
        ) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} cannot be read: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds no msd client state")
    return state
