"""A sample's images and videos as they travel from a Source Loader to a trainer (pure data, no
imaging library: a Data Constructor handles them without decoding anything)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A token that only holds a place: put before an image that would otherwise cross a row
# boundary of a sample split into rows. Trainers never see it: it becomes padding with
# ignored labels (``msd.batch.pack``). Token ids are never negative.
FILLER = -1
# The batch arrays that hold uint8 patches (images', videos'): what ``pixels="float"`` normalises.
PIXEL_KEYS = ("pixel_values", "pixel_values_videos")


@dataclass(frozen=True, eq=False)
class SampleImages:
    """The images and videos of one sample, in the order of their placeholders: ``patches``
    [Σ rows, patch_values] uint8, item after item; ``grids`` (frames, patch rows, patch columns)
    of each; ``videos`` which items are videos (empty: none are). A video's patch holds more
    frames than an image's: it takes ``video_rows`` rows of ``patch_values`` bytes."""

    patches: np.ndarray
    grids: tuple[tuple[int, int, int], ...]
    videos: tuple[bool, ...] = ()
    video_rows: int = 1

    @property
    def counts(self) -> tuple[int, ...]:
        """Patches of each item (what its encoder sees)."""
        return tuple(t * h * w for t, h, w in self.grids)

    @property
    def rows(self) -> tuple[int, ...]:
        """Rows of ``patches`` each item takes."""
        if not any(self.videos):
            return self.counts
        return tuple(
            n * (self.video_rows if video else 1)
            for n, video in zip(self.counts, self.videos, strict=True)
        )

    def is_video(self, k: int) -> bool:
        return bool(self.videos) and self.videos[k]

    @property
    def nbytes(self) -> int:
        return int(self.patches.nbytes)

    def starts(
        self,
        tokens: np.ndarray,
        image_token_id: int,
        merge_size: int,
        video_token_id: int | None = None,
    ) -> np.ndarray:
        """Where each item's placeholders begin in its sample's ``tokens`` (they are in order,
        ``patches / merge_size²`` each, ``image_token_id`` or ``video_token_id``)."""
        held = tokens == image_token_id
        if video_token_id is not None and any(self.videos):
            held |= tokens == video_token_id
        return placeholder_starts(held, self.counts, merge_size)

    def subset(self, first: int, stop: int) -> SampleImages:
        """Items ``first .. stop - 1``."""
        bounds = np.concatenate(([0], np.cumsum(self.rows))).tolist()
        return SampleImages(
            self.patches[bounds[first] : bounds[stop]],
            self.grids[first:stop],
            self.videos[first:stop],
            self.video_rows,
        )


@dataclass(frozen=True, eq=False)
class EncodedImages:
    """A sample's images not decoded yet (a loader holds them so until the sample is routed):
    each image's bytes as stored, and the grid (frames, patch rows, patch columns) its header
    declares, in the order of their placeholders. Images only: a sample with videos is decoded
    as it is read."""

    encoded: tuple[bytes, ...]
    grids: tuple[tuple[int, int, int], ...]
    videos: tuple[bool, ...] = ()

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(t * h * w for t, h, w in self.grids)

    @property
    def nbytes(self) -> int:
        return sum(len(data) for data in self.encoded)

    def starts(
        self,
        tokens: np.ndarray,
        image_token_id: int,
        merge_size: int,
        video_token_id: int | None = None,
    ) -> np.ndarray:
        """As `SampleImages.starts`."""
        return placeholder_starts(tokens == image_token_id, self.counts, merge_size)


def placeholder_starts(held: np.ndarray, counts: tuple[int, ...], merge_size: int) -> np.ndarray:
    """Where each item's placeholders begin, given which tokens are placeholders (``held``)
    and each item's patches (``patches / merge_size²`` placeholders each, in order)."""
    where = np.flatnonzero(held)
    per_item = np.array(counts, dtype=np.int64) // merge_size**2
    first = np.concatenate(([0], np.cumsum(per_item)[:-1]))
    return where[first] if len(where) else np.zeros(0, dtype=np.int64)
