"""Train a tiny Hugging Face Qwen2-VL on msd's packed image-text batches, data-parallel.

    msd synth demo-vlm --kind vlm && msd launch recipes/examples-vlm.yaml

The recipe's ``trainer.command`` runs this script once per rank with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` and ``MSD_JOB`` set. Each rank:

* builds ``Qwen2VLForConditionalGeneration`` from a small ``Qwen2VLConfig`` (random init from
  ``--seed``) whose patch size, temporal patch size, merge size and ``image_token_id`` are the
  recipe's ``vision:`` section, and whose vocabulary holds the sources' token ids (256 for the
  bytes transform, a tokenizer's size) and the image token; wrapped in DDP (gloo on CPU;
  data-parallel only: no TP, CP or PP);
* feeds it msd's rows with ``pixel_values`` normalised by the Client (``pixels="float"``) and
  ``image_grid_thw``. A row packs several samples, and transformers would see it as one: the
  script gives every packed sequence its own M-RoPE positions (``mrope_position_ids``: each
  sample's text and images numbered as ``get_rope_index`` numbers the sample alone) and passes
  them as ``[4, rows, seq_len]`` position ids whose first row is msd's restarting 1-D
  ``position_ids``: from that row transformers builds a block-diagonal causal mask, so samples
  never attend to each other (``use_cache=False``: with a cache it would not);
* computes the loss itself from msd's labels, which are already shifted (``labels=`` would make
  the model shift them again): the sum over the rank's predicted tokens divided by the count
  over all ranks. A rank can get a step without images, even without samples (a step may
  hold fewer samples than there are ranks): its vision tower then gets zero gradients, so
  DDP's all-reduce still sees every parameter;
* logs one JSON line per step to ``JOB/trainer/vlm-rank-R.jsonl``: step, global mean loss,
  predicted tokens, samples, images and patches the rank fed the vision tower, data-wait and
  compute time.

``tests/integration/test_example_vlm.py`` runs it under ``msd launch`` and checks the positions
and the packing against the model's own ``get_rope_index`` and unpacked forward passes.
"""

import argparse
import itertools
import json
import logging
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

import msd
from msd.errors import MsdError
from msd.recipe.schema import Recipe, Source, Vision

log = logging.getLogger("qwen2_vl")

IGNORE_INDEX = -100  # msd's label where nothing is predicted (a sample's end, padding, images)
BYTES_VOCAB = 256  # msd's bytes transform: token ids are UTF-8 bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a tiny Qwen2-VL on msd's image-text batches.")
    size = p.add_argument_group("model size")
    size.add_argument("--hidden-size", type=int, default=64)
    size.add_argument("--layers", type=int, default=2)
    size.add_argument("--heads", type=int, default=4)
    size.add_argument("--kv-heads", type=int, default=2)
    size.add_argument("--intermediate-size", type=int, default=128)
    size.add_argument("--vision-depth", type=int, default=1)
    size.add_argument("--vision-dim", type=int, default=32, help="the vision tower's width")
    size.add_argument("--vision-heads", type=int, default=2)
    size.add_argument(
        "--vocab-size", type=int, help="default: from the recipe's transforms and image token"
    )
    p.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager"))
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    p.add_argument("--seed", type=int, default=0, help="the model's initialisation")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank on CPU")
    return p.parse_args(argv)


# -- the model ----------------------------------------------------------------------------------
def source_vocab_size(source: Source) -> int | None:
    """How many token ids a text source's transform yields; None when the script cannot tell
    (stored token ids, a custom function)."""
    if source.token_column is not None or source.data_format == "megatron":
        return None
    if source.transform.kind == "bytes":
        return BYTES_VOCAB
    if source.transform.kind == "tokenizer" and source.transform.path:
        from tokenizers import Tokenizer  # only where a recipe uses one

        size: int = Tokenizer.from_file(source.transform.path).get_vocab_size(
            with_added_tokens=True
        )
        return size
    return None


def check_recipe(recipe: Recipe) -> None:
    """What this script does not do: tensor, context or pipeline parallelism (a CP rank gets
    slices of sequences, whose positions it could not number alone)."""
    d = recipe.distribute
    if (d.tp, d.cp, d.pp) != (1, 1, 1):
        raise ValueError("examples/qwen2_vl.py trains data-parallel only; set tp, cp, pp to 1")


def vocab_size(recipe: Recipe, override: int | None) -> int:
    """Every text token id and the image placeholder fit below it."""
    if override is not None:
        text = override
    else:
        sizes = [source_vocab_size(s) for s in recipe.sources]
        if None in sizes:
            raise ValueError("the recipe's token ids have no known range; pass --vocab-size")
        text = max(s for s in sizes if s is not None)
    image = recipe.vision.image_token_id
    if image >= 4 * text:
        log.warning(
            "vision.image_token_id %d makes the vocabulary %d rows for %d text ids; "
            "set it to %d in the recipe for a smaller model",
            image,
            image + 1,
            text,
            text,
        )
    return max(text, image + 1)


def model_config(
    args: argparse.Namespace, vision: Vision, vocab: int, max_positions: int
) -> Qwen2VLConfig:
    """A small Qwen2-VL whose vision geometry is the recipe's: the patch embedding takes msd's
    ``3·t·p²`` patch values, the merger joins ``merge_size²`` patches into one placeholder."""
    head_dim = args.hidden_size // args.heads
    # M-RoPE splits each head's rotary frequencies over (time, height, width), in Qwen2-VL's
    # proportions (16, 24, 24 of 64); the three must add up to head_dim / 2.
    half = head_dim // 2
    mrope_section = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    text = {
        "vocab_size": vocab,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "max_position_embeddings": max_positions,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": mrope_section,
        },
        "attention_dropout": 0.0,
        "use_cache": False,  # with a cache, transformers ignores the packing in position_ids
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    visual = {
        "depth": args.vision_depth,
        "embed_dim": args.vision_dim,
        "num_heads": args.vision_heads,
        "mlp_ratio": 2,
        "hidden_size": args.hidden_size,  # the merger's output: the text model's width
        "in_channels": 3,
        "patch_size": vision.patch_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "spatial_merge_size": vision.merge_size,
    }
    return Qwen2VLConfig(
        text_config=text,
        vision_config=visual,
        image_token_id=vision.image_token_id,
        # Set on every sub-config; a PreTrainedConfig argument its typed signature leaves out.
        attn_implementation=args.attn_implementation,  # type: ignore[call-arg]
    )


def build_model(
    args: argparse.Namespace, vision: Vision, vocab: int, max_positions: int
) -> Qwen2VLForConditionalGeneration:
    """Randomly initialised; every rank builds the same weights from ``args.seed``."""
    torch.manual_seed(args.seed)
    return Qwen2VLForConditionalGeneration(model_config(args, vision, vocab, max_positions))


# -- positions of packed samples ----------------------------------------------------------------
def image_positions(grid_thw: list[int], merge_size: int, start: int) -> torch.Tensor:
    """[3, tokens] (time, height, width) positions of one image's placeholders, in the order
    the merger emits them (row-major over the merged grid), offset by ``start``."""
    t, h, w = grid_thw[0], grid_thw[1] // merge_size, grid_thw[2] // merge_size
    grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(grid).reshape(3, -1) + start


def sample_mrope_positions(
    input_ids: torch.Tensor, grids: list[list[int]], image_token_id: int, merge_size: int
) -> torch.Tensor:
    """[3, len] M-RoPE positions of one sample alone, as Qwen2-VL's ``get_rope_index`` gives
    them: text runs count on by one on all three axes; an image's placeholders get (time, row,
    column) of its merged grid from where the text stopped, and the text after it goes on from
    there plus the grid's longer side. ``grids`` are the sample's images in order. Adjacent
    images are each their own image (``get_rope_index`` would take a run of placeholders for one
    image: Qwen2-VL's processor never writes two without a vision start token between them)."""
    is_image = (input_ids == image_token_id).tolist()
    out = torch.empty(3, len(is_image), dtype=torch.int64)
    images = iter(grids)
    at, position = 0, 0
    for image, run in itertools.groupby(is_image):
        stop = at + len(list(run))
        if not image:
            out[:, at:stop] = torch.arange(position, position + stop - at)
            position += stop - at
            at = stop
        while at < stop:  # a run of placeholders: one image after another
            grid = next(images, None)
            tokens = 0 if grid is None else grid[0] * grid[1] * grid[2] // merge_size**2
            if grid is None or at + tokens > stop:
                raise ValueError("the image placeholders do not match image_grid_thw")
            out[:, at : at + tokens] = image_positions(grid, merge_size, position)
            position += max(grid[1], grid[2]) // merge_size
            at += tokens
    if next(images, None) is not None:
        raise ValueError("image_grid_thw has more images than the placeholders")
    return out


def mrope_position_ids(
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    image_grid_thw: torch.Tensor,
    image_token_id: int,
    merge_size: int,
) -> torch.Tensor:
    """[3, rows, seq_len] positions: every packed sequence of the rows (msd's ``cu_seqlens``,
    over the flattened rows) numbered as if alone. Images come in row order, so each sequence
    takes the next ones until its placeholders are covered."""
    flat = input_ids.reshape(-1)
    out = torch.empty(3, flat.numel(), dtype=torch.int64)
    grids = image_grid_thw.tolist()
    per_image = [t * h * w // merge_size**2 for t, h, w in grids]
    taken = 0
    for start, stop in itertools.pairwise(cu_seqlens.tolist()):
        ids = flat[start:stop]
        placeholders, first = int((ids == image_token_id).sum()), taken
        while placeholders > 0 and taken < len(grids):
            placeholders -= per_image[taken]
            taken += 1
        if placeholders != 0:
            raise ValueError(f"the placeholders of tokens {start}..{stop} match no whole images")
        out[:, start:stop] = sample_mrope_positions(
            ids, grids[first:taken], image_token_id, merge_size
        )
    if taken != len(grids):
        raise ValueError("image_grid_thw has more images than the rows' placeholders")
    return out.view(3, *input_ids.shape)


def model_inputs(
    batch: dict[str, torch.Tensor], vision: Vision, device: torch.device
) -> dict[str, Any]:
    """The model's arguments for one batch.

    Position ids go in as ``[4, rows, seq_len]``: row 0 is msd's 1-D ``position_ids``, which
    restart at every packed sequence. Qwen2-VL's text model takes such a row 0 as the text
    positions and, with no attention mask and no cache, finds the packed sequences where it
    does not count on by one and masks attention to stay within each (transformers'
    ``find_packed_sequence_indices``). Rows 1–3 are the M-RoPE positions it rotates with,
    computed per sequence here: left to itself the model would number a row's samples as one
    sequence, and with 3-D positions alone it would not see the packing at all.
    """
    input_ids = batch["input_ids"]
    grids = batch.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    mrope = mrope_position_ids(
        input_ids, batch["cu_seqlens"], grids, vision.image_token_id, vision.merge_size
    )
    inputs: dict[str, Any] = {
        "input_ids": input_ids.to(device),
        "position_ids": torch.cat([batch["position_ids"][None], mrope]).to(device),
        "use_cache": False,
    }
    if len(grids):  # a rank whose rows hold no image skips the vision tower
        inputs["pixel_values"] = batch["pixel_values"].to(device)
        inputs["image_grid_thw"] = grids.to(device)
    return inputs


# -- one step -----------------------------------------------------------------------------------
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
        logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    totals = torch.stack([local.detach().double(), (labels != IGNORE_INDEX).sum().double()])
    dist.all_reduce(totals)
    loss_sum, count = totals.tolist()
    count = max(count, 1.0)
    return local * (world_size / count), loss_sum / count, int(count)


def learning_rate(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then constant."""
    return float(args.lr * min(1.0, (step + 1) / max(1, args.warmup_steps)))


def train_step(
    ddp: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    inputs: dict[str, Any],
    labels: torch.Tensor,
    lr: float,
    clip: float,
) -> tuple[float, int]:
    """One optimizer step on this rank's batch; the global mean loss and predicted tokens."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    logits = ddp(**inputs).logits
    loss, mean, count = packed_loss(logits, labels, dist.get_world_size())
    if "pixel_values" not in inputs:
        # DDP waits for a gradient of every parameter from every rank: a rank whose rows hold
        # no image gives the vision tower zeros (cheaper than find_unused_parameters=True).
        visual = ddp.module.model.visual.parameters()
        loss = loss + 0.0 * sum(p.sum() for p in visual)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)
    optimizer.step()
    return mean, count


def step_record(
    batch: dict[str, torch.Tensor], step: int, result: tuple[float, int]
) -> dict[str, Any]:
    loss, global_tokens = result
    grids = batch.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
    return {
        "step": step,
        "loss": loss,
        "tokens": int((batch["labels"] != IGNORE_INDEX).sum()),  # this rank's predicted tokens
        "global_tokens": global_tokens,
        "samples": len(batch["sample_ids"]),  # 0 happens: a step may hold fewer samples than ranks
        "images": len(grids),  # what this rank fed its vision tower
        "patches": int(grids.prod(-1).sum()),
    }


# -- the loop -----------------------------------------------------------------------------------
def train(args: argparse.Namespace, client: msd.Client, vocab: int) -> None:
    recipe = client.job.recipe()
    model = build_model(args, recipe.vision, vocab, recipe.seq_len)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay
    )
    ddp = DistributedDataParallel(model)
    if client.rank == 0:
        log.info("%d parameters, vocabulary %d", sum(p.numel() for p in model.parameters()), vocab)
    with open(client.job.trainer / f"vlm-rank-{client.rank}.jsonl", "w") as steps:
        for batch in client:
            wait_ms = client.last_wait_s * 1e3
            started = time.perf_counter()
            step = client.step - 1
            inputs = model_inputs(batch, recipe.vision, torch.device("cpu"))
            lr = learning_rate(step, args)
            result = train_step(ddp, optimizer, inputs, batch["labels"], lr, args.clip)
            record = step_record(batch, step, result)
            record |= {"wait_ms": wait_ms, "step_ms": (time.perf_counter() - started) * 1e3}
            steps.write(json.dumps(record) + "\n")
            steps.flush()
            if step % 10 == 0 and client.rank == 0:
                log.info("step %d loss %.4f images %d", step, record["loss"], record["images"])
    client.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = os.environ.get("RANK", "-")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank}: %(message)s")
    try:
        client = msd.Client(pixels="float")  # job, rank and world size from the environment
    except MsdError as exc:
        log.error("%s", exc)
        return 1
    try:
        check_recipe(client.job.recipe())
        vocab = vocab_size(client.job.recipe(), args.vocab_size)
    except ValueError as exc:  # a recipe this script cannot train on
        log.error("%s", exc)
        return 1
    torch.set_num_threads(args.threads)  # the ranks of a node share its cores
    dist.init_process_group("gloo", rank=client.rank, world_size=client.world_size)
    try:
        train(args, client, vocab)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
