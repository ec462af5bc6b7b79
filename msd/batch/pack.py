"""Materialise one rank's packed rows as batch arrays (pure numpy, no torch).

Each row holds whole samples back to back, then padding. A sample may carry padding of its
own (``Piece.padded``): pad tokens that belong to its sequence, with ``IGNORE_INDEX`` labels.
A sample attends only to itself: ``position_ids`` restart at every sample and at the padding,
and ``cu_seqlens`` (the varlen attention convention, over the flattened ``rows × seq_len``
tokens) marks every sample and every padding run as its own sequence. ``labels`` are already
shifted: ``labels[t]`` is the next token of the same sample, and ``IGNORE_INDEX`` at a
sample's last token and on padding.

With images (``image_token_id`` given), ``labels`` are also ``IGNORE_INDEX`` wherever the next
token is an image placeholder (nothing learns to predict one), and the images of the pieces
come in the order their samples appear in the rows: ``pixel_values`` [patches, patch values]
uint8, ``image_grid_thw`` [images, 3] int64, ``vision_cu_seqlens`` [images + 1] int32 (patch
offsets: each image is its own sequence in the encoder) and ``image_sample_ids`` /
``image_source_ids`` [images] int64. With videos (``video`` given) the same for them:
``pixel_values_videos`` [patches, video patch values] uint8, ``video_grid_thw`` [videos, 3],
``video_cu_seqlens`` [videos + 1], ``second_per_grid_ts`` [videos] float32 (seconds one
temporal patch spans, for Qwen2.5-VL's time-aligned positions), ``video_sample_ids`` /
``video_source_ids``; ``labels`` are ``IGNORE_INDEX`` before a video placeholder too.

A piece with ``trained`` spans (a conversation's assistant turns) has ``IGNORE_INDEX`` labels
wherever the token a label predicts lies outside them; with ``loss_mask``, the batch also
carries ``loss_mask`` [rows, seq_len] bool: ``labels != IGNORE_INDEX``, what Megatron's
``get_batch`` calls the loss mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from msd.batch.sample import FILLER, SampleImages

IGNORE_INDEX = -100
PAD_ID = 0
LOSS_MASK = "loss_mask"


@dataclass(frozen=True)
class VideoOutput:
    """How a batch's videos are given: their placeholder token, the values of one video patch,
    the seconds one temporal patch spans."""

    token_id: int
    patch_values: int
    seconds_per_grid: float


@dataclass(frozen=True)
class Piece:
    """One sample (or piece of a split sample) placed in a row, occupying ``padded`` tokens
    (at least its own length: context parallelism pads every sequence to a multiple of 2·cp)."""

    source: int
    sample_id: int
    tokens: np.ndarray
    padded: int = 0
    offset: int = 0
    images: SampleImages | None = None
    # The [start, end) spans of its tokens the loss is taken on (None: every token).
    trained: np.ndarray | None = None


def pack_rows(
    rows: Sequence[Sequence[Piece]],
    seq_len: int,
    image_token_id: int | None = None,
    patch_values: int = 0,
    video: VideoOutput | None = None,
    loss_mask: bool = False,
) -> dict[str, np.ndarray]:
    """Arrays ``input_ids``, ``labels``, ``position_ids`` ([rows, seq_len] int64), ``cu_seqlens``
    (int32), ``sample_ids``, ``source_ids`` and ``sample_offsets`` (int64, in row order; the
    offset is where a piece of a split sample starts within it); with ``image_token_id``, the
    image tensors too (``patch_values`` wide); with ``video``, the video tensors."""
    num_rows = len(rows)
    input_ids = np.full((num_rows, seq_len), PAD_ID, dtype=np.int64)
    labels = np.full((num_rows, seq_len), IGNORE_INDEX, dtype=np.int64)
    position_ids = np.zeros((num_rows, seq_len), dtype=np.int64)
    bounds = [0]
    for r, row in enumerate(rows):
        at = 0
        for piece in row:
            n, span = len(piece.tokens), max(len(piece.tokens), piece.padded)
            if span == 0:
                continue  # delivered (its id is listed) but occupies no tokens
            input_ids[r, at : at + n] = piece.tokens
            labels[r, at : at + n - 1] = piece.tokens[1:]
            if piece.trained is not None:  # a label predicts the next token: its span decides
                labels[r, at : at + n - 1][~_trained(piece.trained, n)[1:]] = IGNORE_INDEX
            position_ids[r, at : at + span] = np.arange(span)
            at += span
            bounds.append(r * seq_len + at)
        if at < seq_len:
            position_ids[r, at:] = np.arange(seq_len - at)
            bounds.append((r + 1) * seq_len)
    pieces = [p for row in rows for p in row]
    vision = (
        {}
        if image_token_id is None
        else _images(pieces, input_ids, labels, image_token_id, patch_values, video)
    )
    mask = {LOSS_MASK: labels != IGNORE_INDEX} if loss_mask else {}
    return (
        vision
        | mask
        | {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": position_ids,
            "cu_seqlens": np.array(bounds, dtype=np.int32),
            "sample_ids": np.array([p.sample_id for p in pieces], dtype=np.int64),
            "source_ids": np.array([p.source for p in pieces], dtype=np.int64),
            "sample_offsets": np.array([p.offset for p in pieces], dtype=np.int64),
        }
    )


def _trained(spans: np.ndarray, n: int) -> np.ndarray:
    """A bool a token of a piece of ``n``: inside one of ``spans`` or not."""
    keep = np.zeros(n, dtype=bool)
    for start, end in spans.tolist():
        keep[max(0, start) : max(0, end)] = True
    return keep


def _images(
    pieces: list[Piece],
    input_ids: np.ndarray,
    labels: np.ndarray,
    image_token_id: int,
    values: int,
    video: VideoOutput | None = None,
) -> dict[str, np.ndarray]:
    labels[labels == image_token_id] = IGNORE_INDEX
    if video is not None:
        labels[labels == video.token_id] = IGNORE_INDEX
    # Fillers (before an image that would have crossed a row boundary) are padding.
    labels[(labels == FILLER) | (input_ids == FILLER)] = IGNORE_INDEX
    input_ids[input_ids == FILLER] = PAD_ID
    owned = [(p, p.images) for p in pieces if p.images is not None and p.images.grids]
    images = _visuals(owned, values, False, _IMAGE_NAMES)
    if video is None:
        return images
    clips = _visuals(owned, video.patch_values, True, _VIDEO_NAMES)
    seconds = np.full(len(clips["video_grid_thw"]), video.seconds_per_grid, dtype=np.float32)
    return images | clips | {"second_per_grid_ts": seconds}


# The tensors of a batch's images, and of its videos: pixels, grids, cu_seqlens, owners.
_IMAGE_NAMES = (
    "pixel_values",
    "image_grid_thw",
    "vision_cu_seqlens",
    "image_sample_ids",
    "image_source_ids",
)
_VIDEO_NAMES = (
    "pixel_values_videos",
    "video_grid_thw",
    "video_cu_seqlens",
    "video_sample_ids",
    "video_source_ids",
)


def _visuals(
    owned: list[tuple[Piece, SampleImages]],
    values: int,
    videos: bool,
    names: tuple[str, str, str, str, str],
) -> dict[str, np.ndarray]:
    """The tensors of the images (``videos``: the videos) of ``owned``, ``values`` wide."""
    grids: list[tuple[int, int, int]] = []
    patches: list[np.ndarray] = []
    samples: list[int] = []
    sources: list[int] = []
    for piece, images in owned:
        if not any(images.videos):  # images only: the piece's patches as they are
            if not videos:
                grids += images.grids
                patches.append(images.patches)
                samples += [piece.sample_id] * len(images.grids)
                sources += [piece.source] * len(images.grids)
            continue
        bounds = np.concatenate(([0], np.cumsum(images.rows))).tolist()
        for k, grid in enumerate(images.grids):
            if images.videos[k] == videos:
                grids.append(grid)
                patches.append(images.patches[bounds[k] : bounds[k + 1]].reshape(-1, values))
                samples.append(piece.sample_id)
                sources.append(piece.source)
    counts = [t * h * w for t, h, w in grids]
    pixels, thw, cu_seqlens, sample_ids, source_ids = names
    return {
        pixels: np.concatenate(patches) if patches else np.zeros((0, values), np.uint8),
        thw: np.array(grids, dtype=np.int64).reshape(-1, 3),
        cu_seqlens: np.concatenate(([0], np.cumsum(counts))).astype(np.int32),
        sample_ids: np.array(samples, dtype=np.int64),
        source_ids: np.array(sources, dtype=np.int64),
    }
