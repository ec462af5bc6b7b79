"""A sample's images as they travel from a Source Loader to a trainer (pure data, no imaging
library: a Data Constructor handles them without decoding anything)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A token that only holds a place: put before an image that would otherwise cross a row
# boundary of a sample split into rows. Trainers never see it: it becomes padding with
# ignored labels (``msd.pack``). Token ids are never negative.
FILLER = -1


@dataclass(frozen=True, eq=False)
class SampleImages:
    """The images of one sample: ``patches`` [Σ patches, patch_values] uint8, image after image;
    ``grids`` (frames, patch rows, patch columns) of each."""

    patches: np.ndarray
    grids: tuple[tuple[int, int, int], ...]

    @property
    def counts(self) -> tuple[int, ...]:
        """Patches of each image."""
        return tuple(t * h * w for t, h, w in self.grids)

    def starts(self, tokens: np.ndarray, image_token_id: int, merge_size: int) -> np.ndarray:
        """Where each image's placeholders begin in its sample's ``tokens`` (they are in order,
        ``patches / merge_size²`` each)."""
        where = np.flatnonzero(tokens == image_token_id)
        per_image = np.array(self.counts, dtype=np.int64) // merge_size**2
        first = np.concatenate(([0], np.cumsum(per_image)[:-1]))
        return where[first] if len(where) else np.zeros(0, dtype=np.int64)

    def subset(self, first: int, stop: int) -> SampleImages:
        """Images ``first .. stop - 1``."""
        bounds = np.concatenate(([0], np.cumsum(self.counts))).tolist()
        return SampleImages(self.patches[bounds[first] : bounds[stop]], self.grids[first:stop])
