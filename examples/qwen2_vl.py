"""Train a tiny Hugging Face Qwen2-VL on msd's packed image-text and video-text batches,
data-parallel.

    msd synth demo-vlm --kind vlm && msd launch recipes/examples-vlm.yaml
    msd synth demo-video --kind video && msd launch recipes/examples-video.yaml

The recipe's ``trainer.command`` runs this script once per rank with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` and ``MSD_JOB`` set. Each rank:

* builds ``Qwen2VLForConditionalGeneration`` (``--model qwen2.5-vl``: Qwen2.5-VL's) from a
  small config (random init from ``--seed``) whose patch size, merge size and
  ``image_token_id`` are the recipe's ``vision:`` section, whose ``video_token_id`` and
  temporal patch size are its ``video:`` section's when it reads videos (``vision:``'s
  otherwise), and whose vocabulary holds the sources' token ids (256 for the bytes transform, a
  tokenizer's size) and the placeholder tokens; wrapped in DDP (gloo on CPU; data-parallel
  only: no TP, CP or PP);
* feeds it msd's rows with ``pixel_values`` normalised by the Client (``pixels="float"``) and
  ``image_grid_thw``, and with videos ``pixel_values_videos`` and ``video_grid_thw`` (and, to
  Qwen2.5-VL, ``second_per_grid_ts``). One patch embedding takes both, so where the video
  temporal patch is longer than the image one each image patch's frame is repeated to fill it,
  as Qwen2-VL's image processor repeats an image. A row packs several samples, and
  transformers would see it as one: the script gives every packed sequence its own M-RoPE
  positions (``mrope_position_ids``: each sample's text, images and videos numbered as
  ``get_rope_index`` numbers the sample alone; a video's temporal patches take temporal
  positions, spaced by ``tokens_per_second × second_per_grid_ts`` for Qwen2.5-VL) and passes
  them as ``[4, rows, seq_len]`` position ids whose first row is msd's restarting 1-D
  ``position_ids``: from that row transformers builds a block-diagonal causal mask, so samples
  never attend to each other (``use_cache=False``: with a cache it would not);
* computes the loss itself from msd's labels, which are already shifted (``labels=`` would make
  the model shift them again): the sum over the rank's predicted tokens divided by the count
  over all ranks. A rank can get a step without images or videos, even without samples (a step
  may hold fewer samples than there are ranks): its vision tower then gets zero gradients, so
  DDP's all-reduce still sees every parameter;
* logs one JSON line per step to ``JOB/trainer/vlm-rank-R.jsonl``: step, global mean loss,
  predicted tokens, samples, images, videos and the patches the rank fed the vision tower,
  data-wait and compute time.

``tests/integration/test_example_vlm.py`` (images) and ``test_example_video.py`` (videos) run it
under ``msd launch`` and check the positions and the packing against the model's own
``get_rope_index`` and unpacked forward passes.
"""

import argparse
import itertools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import (
    PreTrainedModel,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

import msd
from msd.errors import MsdError
from msd.recipe.schema import Recipe, Source, Video, Vision

log = logging.getLogger("qwen2_vl")

IGNORE_INDEX = -100  # msd's label where nothing is predicted (a sample's end, padding, images)
BYTES_VOCAB = 256  # msd's bytes transform: token ids are UTF-8 bytes
QWEN2_VL, QWEN2_5_VL = "qwen2-vl", "qwen2.5-vl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a tiny Qwen2-VL on msd's vision-text batches.")
    p.add_argument("--model", default=QWEN2_VL, choices=(QWEN2_VL, QWEN2_5_VL))
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
        "--vocab-size", type=int, help="default: from the recipe's transforms and placeholders"
    )
    size.add_argument(
        "--tokens-per-second",
        type=int,
        default=2,
        help="Qwen2.5-VL: temporal positions per second of video (its checkpoints' 2)",
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


def videos_of(recipe: Recipe) -> Video | None:
    """The recipe's ``video:`` section where it reads videos."""
    return recipe.video if recipe.has_videos else None


def vocab_size(recipe: Recipe, override: int | None) -> int:
    """Every text token id and the placeholder tokens fit below it."""
    if override is not None:
        text = override
    else:
        sizes = [source_vocab_size(s) for s in recipe.sources]
        if None in sizes:
            raise ValueError("the recipe's token ids have no known range; pass --vocab-size")
        text = max(s for s in sizes if s is not None)
    video = videos_of(recipe)
    placeholders = {"vision.image_token_id": recipe.vision.image_token_id}
    if video is not None:
        placeholders["video.video_token_id"] = video.video_token_id
    for key, token in placeholders.items():
        if token >= 4 * text:
            log.warning(
                "%s %d makes the vocabulary %d rows for %d text ids; "
                "set it to %d or so in the recipe for a smaller model",
                key,
                token,
                token + 1,
                text,
                text,
            )
    return max(text, *(token + 1 for token in placeholders.values()))


def temporal_patch_size(vision: Vision, video: Video | None) -> int:
    """The model's frames per patch: the videos' (a multiple of the images', msd checks)."""
    return vision.temporal_patch_size if video is None else video.temporal_patch_size


def model_config(
    args: argparse.Namespace,
    vision: Vision,
    vocab: int,
    max_positions: int,
    video: Video | None = None,
) -> Qwen2VLConfig | Qwen2_5_VLConfig:
    """A small Qwen2-VL (or Qwen2.5-VL) whose vision geometry is the recipe's: the patch
    embedding takes ``3·t·p²`` patch values, the merger joins ``merge_size²`` patches into one
    placeholder."""
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
    geometry = {
        "in_channels": 3,
        "patch_size": vision.patch_size,
        "temporal_patch_size": temporal_patch_size(vision, video),
        "spatial_merge_size": vision.merge_size,
    }
    video_token_id = (video or Video()).video_token_id  # msd's default is Qwen2-VL's
    if args.model == QWEN2_5_VL:
        return Qwen2_5_VLConfig(
            text_config=text,
            vision_config=geometry | qwen2_5_vision(args, vision),
            image_token_id=vision.image_token_id,
            video_token_id=video_token_id,
            attn_implementation=args.attn_implementation,  # type: ignore[call-arg]
        )
    visual = geometry | {
        "depth": args.vision_depth,
        "embed_dim": args.vision_dim,
        "num_heads": args.vision_heads,
        "mlp_ratio": 2,
        "hidden_size": args.hidden_size,  # the merger's output: the text model's width
    }
    return Qwen2VLConfig(
        text_config=text,
        vision_config=visual,
        image_token_id=vision.image_token_id,
        video_token_id=video_token_id,
        # Set on every sub-config; a PreTrainedConfig argument its typed signature leaves out.
        attn_implementation=args.attn_implementation,  # type: ignore[call-arg]
    )


def qwen2_5_vision(args: argparse.Namespace, vision: Vision) -> dict[str, Any]:
    """Qwen2.5-VL's vision tower: windows of 4×4 merged patches (its 112 px at patch 14), the
    last block attending over the whole image."""
    return {
        "depth": args.vision_depth,
        "hidden_size": args.vision_dim,
        "intermediate_size": 2 * args.vision_dim,
        "num_heads": args.vision_heads,
        "out_hidden_size": args.hidden_size,  # the merger's output: the text model's width
        "window_size": 4 * vision.patch_size * vision.merge_size,
        "fullatt_block_indexes": [args.vision_depth - 1],
        "tokens_per_second": args.tokens_per_second,
    }


def build_model(
    args: argparse.Namespace,
    vision: Vision,
    vocab: int,
    max_positions: int,
    video: Video | None = None,
) -> PreTrainedModel:
    """Randomly initialised; every rank builds the same weights from ``args.seed``."""
    torch.manual_seed(args.seed)
    config = model_config(args, vision, vocab, max_positions, video)
    if isinstance(config, Qwen2_5_VLConfig):
        return Qwen2_5_VLForConditionalGeneration(config)
    return Qwen2VLForConditionalGeneration(config)


# -- positions of packed samples ----------------------------------------------------------------
@dataclass(frozen=True)
class Placed:
    """A batch's images (or videos), in row order: ``kind`` ("image", "video"), the placeholder
    token, each one's (t, h, w) patch grid and the step between its temporal patches'
    positions (1; a Qwen2.5-VL video's ``tokens_per_second × second_per_grid_ts``)."""

    kind: str
    token_id: int
    grids: list[list[int]]
    steps: list[Any]  # an int, or a 0-d float32 tensor: the model's own arithmetic

    def tokens(self, k: int, merge_size: int) -> int:
        t, h, w = self.grids[k]
        return t * h * w // merge_size**2

    def part(self, first: int, stop: int) -> "Placed":
        return Placed(self.kind, self.token_id, self.grids[first:stop], self.steps[first:stop])


def vision_positions(grid: list[int], merge_size: int, start: int, step: Any = 1) -> torch.Tensor:
    """[3, tokens] (time, height, width) positions of one image's or video's placeholders, in
    the order the merger emits them (row-major over each temporal patch's merged grid), from
    ``start``; the temporal patches ``step`` apart (truncated, as ``get_rope_index`` does)."""
    t, h, w = grid[0], grid[1] // merge_size, grid[2] // merge_size
    times = (torch.arange(t) * step).long()
    axes = torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(axes).reshape(3, -1) + start


def sample_mrope_positions(
    input_ids: torch.Tensor, placed: list[Placed], merge_size: int
) -> torch.Tensor:
    """[3, len] M-RoPE positions of one sample alone, as Qwen2-VL's ``get_rope_index`` gives
    them: text runs count on by one on all three axes; an image's or a video's placeholders get
    (time, row, column) of its merged grid from where the text stopped, and the text after it
    goes on from there plus the grid's longer side. ``placed``: the sample's images and videos
    in order. Adjacent images (or videos) are each their own (``get_rope_index`` would take a
    run of placeholders for one: Qwen2-VL's processor never writes two without a vision start
    token between them)."""
    by_token = {p.token_id: p for p in placed}
    left = {p.token_id: iter(range(len(p.grids))) for p in placed}
    out = torch.empty(3, len(input_ids), dtype=torch.int64)
    at, position = 0, 0
    ids: list[int] = input_ids.tolist()
    for token, run in itertools.groupby(ids, lambda i: i if i in by_token else None):
        stop = at + len(list(run))
        if token is None:
            out[:, at:stop] = torch.arange(position, position + stop - at)
            position += stop - at
            at = stop
            continue
        while at < stop:  # a run of placeholders: one image (video) after another
            p = by_token[token]
            k = next(left[token], None)
            tokens = 0 if k is None else p.tokens(k, merge_size)
            if k is None or at + tokens > stop:
                raise ValueError(f"the {p.kind} placeholders do not match {p.kind}_grid_thw")
            out[:, at : at + tokens] = vision_positions(
                p.grids[k], merge_size, position, p.steps[k]
            )
            position += max(p.grids[k][1], p.grids[k][2]) // merge_size
            at += tokens
    for p in placed:
        if next(left[p.token_id], None) is not None:
            raise ValueError(f"{p.kind}_grid_thw has more {p.kind}s than the placeholders")
    return out


def mrope_position_ids(
    input_ids: torch.Tensor, cu_seqlens: torch.Tensor, placed: list[Placed], merge_size: int
) -> torch.Tensor:
    """[3, rows, seq_len] positions: every packed sequence of the rows (msd's ``cu_seqlens``,
    over the flattened rows) numbered as if alone. Images and videos come in row order, so each
    sequence takes the next ones until its placeholders are covered."""
    flat = input_ids.reshape(-1)
    out = torch.empty(3, flat.numel(), dtype=torch.int64)
    taken = [0] * len(placed)
    for start, stop in itertools.pairwise(cu_seqlens.tolist()):
        ids = flat[start:stop]
        mine = []
        for i, p in enumerate(placed):
            first, placeholders = taken[i], int((ids == p.token_id).sum())
            while placeholders > 0 and taken[i] < len(p.grids):
                placeholders -= p.tokens(taken[i], merge_size)
                taken[i] += 1
            if placeholders != 0:
                raise ValueError(
                    f"the placeholders of tokens {start}..{stop} match no whole {p.kind}s"
                )
            mine.append(p.part(first, taken[i]))
        out[:, start:stop] = sample_mrope_positions(ids, mine, merge_size)
    for i, p in enumerate(placed):
        if taken[i] != len(p.grids):
            raise ValueError(f"{p.kind}_grid_thw has more {p.kind}s than the rows' placeholders")
    return out.view(3, *input_ids.shape)


def placed_in(
    batch: dict[str, torch.Tensor],
    vision: Vision,
    video: Video | None = None,
    tokens_per_second: int | None = None,
) -> list[Placed]:
    """The batch's images, and its videos where the recipe reads them; ``tokens_per_second``:
    Qwen2.5-VL's, which spaces a video's temporal positions by its ``second_per_grid_ts``."""
    none = torch.zeros(0, 3, dtype=torch.int64)
    grids = batch.get("image_grid_thw", none)
    placed = [Placed("image", vision.image_token_id, grids.tolist(), [1] * len(grids))]
    if video is not None:
        grids = batch.get("video_grid_thw", none)
        steps: list[Any] = [1] * len(grids)
        if tokens_per_second is not None and len(grids):
            steps = list(tokens_per_second * batch["second_per_grid_ts"])
        placed.append(Placed("video", video.video_token_id, grids.tolist(), steps))
    return placed


def image_patches(pixel_values: torch.Tensor, vision: Vision, frames: int) -> torch.Tensor:
    """msd's image patches (``vision.temporal_patch_size`` frames each, channel-major) with
    their frames repeated to ``frames``: what a patch embedding of that temporal size takes."""
    repeat = frames // vision.temporal_patch_size
    if repeat == 1:
        return pixel_values
    shaped = pixel_values.view(len(pixel_values), 3, vision.temporal_patch_size, -1)
    return shaped.repeat_interleave(repeat, dim=2).flatten(1)


def model_inputs(
    batch: dict[str, torch.Tensor],
    vision: Vision,
    device: torch.device,
    video: Video | None = None,
    tokens_per_second: int | None = None,
) -> dict[str, Any]:
    """The model's arguments for one batch (``tokens_per_second``: Qwen2.5-VL's).

    Position ids go in as ``[4, rows, seq_len]``: row 0 is msd's 1-D ``position_ids``, which
    restart at every packed sequence. Qwen2-VL's text model takes such a row 0 as the text
    positions and, with no attention mask and no cache, finds the packed sequences where it
    does not count on by one and masks attention to stay within each (transformers'
    ``find_packed_sequence_indices``). Rows 1–3 are the M-RoPE positions it rotates with,
    computed per sequence here: left to itself the model would number a row's samples as one
    sequence, and with 3-D positions alone it would not see the packing at all.
    """
    input_ids = batch["input_ids"]
    placed = placed_in(batch, vision, video, tokens_per_second)
    mrope = mrope_position_ids(input_ids, batch["cu_seqlens"], placed, vision.merge_size)
    inputs: dict[str, Any] = {
        "input_ids": input_ids.to(device),
        "position_ids": torch.cat([batch["position_ids"][None], mrope]).to(device),
        "use_cache": False,
    }
    images, frames = batch.get("image_grid_thw"), temporal_patch_size(vision, video)
    if images is not None and len(images):  # a rank whose rows hold none skips the tower
        pixels = image_patches(batch["pixel_values"], vision, frames)
        inputs |= {"pixel_values": pixels.to(device), "image_grid_thw": images.to(device)}
    clips = batch.get("video_grid_thw")
    if video is not None and clips is not None and len(clips):
        inputs["pixel_values_videos"] = batch["pixel_values_videos"].to(device)
        inputs["video_grid_thw"] = clips.to(device)
        if tokens_per_second is not None:  # Qwen2.5-VL's time-aligned temporal positions
            inputs["second_per_grid_ts"] = batch["second_per_grid_ts"].to(device)
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
    if "pixel_values" not in inputs and "pixel_values_videos" not in inputs:
        # DDP waits for a gradient of every parameter from every rank: a rank whose rows hold
        # no image and no video gives the vision tower zeros (cheaper than
        # find_unused_parameters=True).
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
    none = torch.zeros(0, 3, dtype=torch.int64)
    images = batch.get("image_grid_thw", none)
    videos = batch.get("video_grid_thw", none)
    return {
        "step": step,
        "loss": loss,
        "tokens": int((batch["labels"] != IGNORE_INDEX).sum()),  # this rank's predicted tokens
        "global_tokens": global_tokens,
        "samples": len(batch["sample_ids"]),  # 0 happens: a step may hold fewer samples than ranks
        "images": len(images),  # what this rank fed its vision tower
        "patches": int(images.prod(-1).sum()),
        "videos": len(videos),
        "video_patches": int(videos.prod(-1).sum()),
    }


# -- the loop -----------------------------------------------------------------------------------
def train(args: argparse.Namespace, client: msd.Client, vocab: int) -> None:
    recipe = client.job.recipe()
    video = videos_of(recipe)
    tokens_per_second = args.tokens_per_second if args.model == QWEN2_5_VL else None
    model = build_model(args, recipe.vision, vocab, recipe.seq_len, video)
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
            cpu = torch.device("cpu")
            inputs = model_inputs(batch, recipe.vision, cpu, video, tokens_per_second)
            lr = learning_rate(step, args)
            result = train_step(ddp, optimizer, inputs, batch["labels"], lr, args.clip)
            record = step_record(batch, step, result)
            record |= {"wait_ms": wait_ms, "step_ms": (time.perf_counter() - started) * 1e3}
            steps.write(json.dumps(record) + "\n")
            steps.flush()
            if step % 10 == 0 and client.rank == 0:
                log.info(
                    "step %d loss %.4f images %d videos %d",
                    step,
                    record["loss"],
                    record["images"],
                    record["videos"],
                )
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
