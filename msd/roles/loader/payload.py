"""What a loader sends for the samples of a routed step, apart from sockets: their tokens back to
back (`token_buffer`), the payload's fields for their images and videos (`image_fields`) and
their patches back to back (`patches_of`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from msd.batch.sample import SampleImages
from msd.sources.fuse import Held
from msd.wire import compact


def token_buffer(tokens: list[np.ndarray]) -> np.ndarray:
    """The tokens of routed samples back to back, as they travel: in the narrowest type that
    holds them (``compact.narrowed``, whatever type they were held in); none, as int32."""
    buffer = np.concatenate(tokens) if tokens else np.empty(0, np.int32)
    return compact.narrowed(buffer) if buffer.size else np.empty(0, np.int32)


def image_fields(held: Sequence[Held | None], patch_values: int) -> dict[str, Any]:
    """The payload's fields for the images of these samples (none where no sample has any):
    each sample's count, every item's grid, and, where any item is a video, a flag for every
    item, those of images held as bytes included."""
    items = [p for p in held if p is not None]
    if not items:
        return {}
    fields: dict[str, Any] = {
        "images": tuple(0 if p is None else len(p.grids) for p in held),
        "grids": tuple(n for p in items for grid in p.grids for n in grid),
        "patch_values": patch_values,
    }
    decoded = [p for p in items if isinstance(p, SampleImages)]
    if any(any(p.videos) for p in decoded):
        fields["videos"] = tuple(
            int(isinstance(p, SampleImages) and p.is_video(k))
            for p in items
            for k in range(len(p.grids))
        )
        fields["video_rows"] = next(p.video_rows for p in decoded if any(p.videos))
    return fields


def patches_of(
    held: Sequence[Held], patch_values: int, write: Callable[[int, np.ndarray], None]
) -> np.ndarray:
    """The samples' patches back to back: ``write(i, rows)`` puts sample ``i``'s into its rows
    (decoding them there if they are held as bytes). One decoded sample's go as they are (a
    video's can be tens of MB): no copy to join."""
    if len(held) == 1 and isinstance(held[0], SampleImages):
        return np.ascontiguousarray(held[0].patches)
    rows = [sum(p.rows) if isinstance(p, SampleImages) else sum(p.counts) for p in held]
    out = np.empty((sum(rows), patch_values), dtype=np.uint8)
    at = 0
    for i, n in enumerate(rows):
        write(i, out[at : at + n])
        at += n
    return out
