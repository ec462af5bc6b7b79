"""The simulated cost of a vision-language batch and its calibration (pure: arrays in, numbers out).

A rank's step costs what the text benchmark charges (``attn·Σlen² + lin·Σlen`` over every
sequence ``cu_seqlens`` marks, padding runs included) plus the vision encoder's
``enc_attn·Σp² + enc_lin·Σp`` over its images (``vision_cu_seqlens``: each image is its own
sequence in the encoder), msd's hybrid cost with the ``sum`` objective. The smallest unit
either system can place is a sample: its fused sequence and its images, so the balancing bound
uses the costliest sample's backbone + encoder cost (``max_sequence_cost`` in the rank logs).

Calibration packs samples of the data's fused lengths (text tokens + placeholders, from the
manifest's image sizes and the geometry; cut at ``seq_len`` as ``truncate`` cuts) the way the
baseline packs them, so ``seconds_per_cost`` depends on the data, never on a measured run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from benchmarks.dataloader.cost import CostModel, sequence_lengths
from benchmarks.dataloader.packing import Item, MicroBatchPacker, segment_lengths
from benchmarks.dataloader.vlm_data import VlmSource
from msd.batch.pack import PAD_ID
from msd.sources.vision import ImageGeometry, grid_thw


def sample_shapes(
    source: VlmSource, geometry: ImageGeometry, seq_len: int
) -> list[tuple[int, tuple[int, ...]]]:
    """(fused length, patches of each image kept) of every sample of ``source``: images in order
    while their placeholders end within ``seq_len``, the text cut at it. Close to what
    ``truncate`` keeps, not exact for documents (the text before an image counts there too):
    good enough to calibrate with."""
    shapes = []
    merge = geometry.merge_size**2
    for text, sizes in zip(source.text_tokens, source.image_sizes, strict=True):
        kept, length = [], 0
        for h, w in sizes:
            t, gh, gw = grid_thw(h, w, geometry)
            patches = t * gh * gw
            if length + patches // merge > seq_len:
                break
            kept.append(patches)
            length += patches // merge
        shapes.append((min(seq_len, length + text), tuple(kept)))
    return shapes


def batch_costs(batch: Mapping[str, npt.NDArray[np.int64]], model: CostModel) -> dict[str, float]:
    """A rank's batch (numpy arrays as delivered): its cost, its costliest sample's (backbone
    over the sample's sequence + encoder over its images and videos), its images and patches
    (and, when it carries videos, its videos and their patches)."""
    lengths = sequence_lengths(batch["cu_seqlens"])
    backbone = model.cost(lengths)
    if "vision_cu_seqlens" not in batch and "video_cu_seqlens" not in batch:
        largest = max((model.cost([n]) for n in lengths.tolist()), default=0.0)
        return {"cost": backbone, "max_sequence_cost": largest, "images": 0, "patches": 0}
    items = encoder_items(batch, model)
    images = [p for kind, _, p, _ in items if kind == "image"]
    costs = {
        "cost": backbone + sum(c for _, _, _, c in items),
        "max_sequence_cost": max(sample_unit_costs(batch, model), default=0.0),
        "images": len(images),
        "patches": int(sum(images)),
    }
    if "video_cu_seqlens" in batch:
        videos = [p for kind, _, p, _ in items if kind == "video"]
        costs |= {"videos": len(videos), "video_patches": int(sum(videos))}
    return costs


_VISUALS = (("image", "vision_cu_seqlens", "image"), ("video", "video_cu_seqlens", "video"))


def encoder_items(
    batch: Mapping[str, npt.NDArray[np.int64]], model: CostModel
) -> list[tuple[str, tuple[int, int], int, float]]:
    """(``image`` or ``video``, its owner (source, sample), its patches, its encoder cost) of
    each image and video of the batch; a video's patches attend within its temporal patches."""
    items: list[tuple[str, tuple[int, int], int, float]] = []
    for kind, bounds, prefix in _VISUALS:
        if bounds not in batch:
            continue
        patches = sequence_lengths(batch[bounds]).tolist()
        groups = batch[f"{prefix}_grid_thw"][:, 0].tolist() if kind == "video" else None
        sources, samples = (batch[f"{prefix}_{k}_ids"].tolist() for k in ("source", "sample"))
        for k, p in enumerate(patches):
            cost = model.encoder([p], None if groups is None else [groups[k]])
            items.append((kind, (sources[k], samples[k]), p, cost))
    return items


def sample_unit_costs(batch: Mapping[str, npt.NDArray[np.int64]], model: CostModel) -> list[float]:
    """Backbone + encoder cost of each sample sequence of the batch (padding runs left out).

    A sequence is padding when its first token is ``PAD_ID`` (a sample's first token never is:
    text bytes are >= 1 and placeholders are the image or video token; ``truncate`` puts no
    fillers); the others are the pieces in ``sample_ids`` order."""
    bounds = np.asarray(batch["cu_seqlens"], dtype=np.int64)
    flat = np.asarray(batch["input_ids"]).reshape(-1)
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
    keys = list(
        zip(batch["source_ids"].tolist(), batch["sample_ids"].tolist(), strict=True)
    )  # row order
    encoder: dict[tuple[int, int], float] = {}
    for _, owner, _, cost in encoder_items(batch, model):
        encoder[owner] = encoder.get(owner, 0.0) + cost
    costs = []
    pieces = iter(keys)
    for start, n in zip(starts.tolist(), lengths.tolist(), strict=True):
        if n == 0 or flat[start] == PAD_ID:
            continue
        key = next(pieces, None)
        costs.append(model.cost([n]) + (encoder.get(key, 0.0) if key is not None else 0.0))
    return costs


def mean_rank_cost(
    sources: Sequence[VlmSource],
    geometry: ImageGeometry,
    seq_len: int,
    rows: int,
    patience: int,
    model: CostModel,
    batches: int = 400,
    seed: int = 0,
) -> float:
    """Mean cost of a micro-batch packed from the sources' samples, as the baseline packs."""
    units = [
        [(n, model.encoder(patches)) for n, patches in sample_shapes(s, geometry, seq_len)]
        for s in sources
    ]
    return packed_mean_cost(units, seq_len, rows, patience, model, batches, seed)


def packed_mean_cost(
    units: list[list[tuple[int, float]]],
    seq_len: int,
    rows: int,
    patience: int,
    model: CostModel,
    batches: int = 400,
    seed: int = 0,
) -> float:
    """Mean cost of a micro-batch packed, as the baseline packs, from samples of these
    (fused length, encoder cost) per source, sources drawn evenly, samples at random."""
    packer = MicroBatchPacker(rows, seq_len, patience)
    items = _shape_items(units, np.random.default_rng(seed), seq_len)
    costs = []
    for _ in range(batches):
        packed = packer.next_rows(items)
        backbone = model.cost(segment_lengths(packed, seq_len))
        encoder = sum(units[p.source][p.sample_id][1] for row in packed for p in row)
        costs.append(backbone + encoder)
    return float(np.mean(costs))


def _shape_items(
    units: list[list[tuple[int, float]]], rng: np.random.Generator, seq_len: int
) -> Iterator[Item]:
    """Zero-token items of the samples' fused lengths, sources drawn evenly, samples at random."""
    zeros = np.zeros(seq_len, dtype=np.int32)
    while True:
        s = int(rng.integers(len(units)))
        i = int(rng.integers(len(units[s])))
        yield Item(s, i, zeros[: units[s][i][0]])
