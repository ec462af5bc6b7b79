"""A tokenized chunk of samples as a shard holds it (``packed``) and as it reports it to the
Planner: their trained spans (``flat_spans``) and, of an image source, their images
(``image_meta``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from msd.recipe.schema import Recipe
from msd.sources.fuse import Held


def packed(tokens: list[np.ndarray]) -> list[np.ndarray]:
    """A chunk's samples as views of one buffer of the narrowest of uint8, uint16 and int32
    that holds their ids: held tokens cost a byte each with the ``bytes`` transform, two with
    most vocabularies (the payload narrows them the same way whatever they are held in)."""
    flat = np.concatenate(tokens) if tokens else np.empty(0, np.int32)
    if flat.size and int(flat.min()) >= 0:
        high = int(flat.max())
        flat = flat.astype(np.uint8 if high <= 0xFF else np.uint16) if high <= 0xFFFF else flat
    ends = np.cumsum([len(t) for t in tokens]).tolist()
    return [flat[start:end] for start, end in zip([0, *ends][: len(ends)], ends, strict=True)]


def flat_spans(trained: list[np.ndarray | None]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Samples' trained spans as a message carries them: a count each, the bounds back to
    back (both empty for samples of a source that trains every token)."""
    if not trained:
        return (), ()
    own = [np.zeros((0, 2), np.int64) if t is None else t for t in trained]
    return tuple(len(t) for t in own), tuple(int(b) for t in own for b in t.reshape(-1))


def image_meta(
    recipe: Recipe,
    tokens: Sequence[np.ndarray],
    pixels: Sequence[Held | None],
    skipped: Sequence[int],
) -> dict[str, tuple[int, ...]]:
    """The ``Meta`` fields of a chunk of an image source's samples: each sample's images and
    those left out (``skipped``), each image's patches and the piece of its sample it lies
    in, and, where any is a video, each item's frames."""
    fields = {
        "images": tuple(0 if p is None else len(p.grids) for p in pixels),
        "patches": tuple(n for p in pixels if p is not None for n in p.counts),
        "skipped": tuple(skipped),
        "image_rows": tuple(
            r
            for t, p in zip(tokens, pixels, strict=True)
            if p is not None
            for r in image_rows(recipe, t, p)
        ),
        "frames": (),
    }
    if any(p is not None and any(p.videos) for p in pixels):
        fields["frames"] = tuple(t for p in pixels if p is not None for t, _, _ in p.grids)
    return fields


def image_rows(recipe: Recipe, tokens: np.ndarray, images: Held) -> list[int]:
    """The piece each image lies in once the Planner cuts the sample into rows."""
    seq_len, vision = recipe.seq_len, recipe.vision
    if len(tokens) <= seq_len:
        return [0] * len(images.grids)
    video = recipe.video.video_token_id
    starts = images.starts(tokens, vision.image_token_id, vision.merge_size, video)
    return [int(r) for r in starts // seq_len]
