"""Building one step's batches from its plan and payloads (no sockets): each data-parallel rank's
rows packed (``msd.batch.pack``), the context-parallel slices cut (``msd.batch.cp_slice``), and
the frames laid out once per (DP rank, CP rank) for the ranks that read them (``ready``)."""

from __future__ import annotations

import numpy as np

from msd.batch.cp_slice import cp_slice
from msd.batch.pack import Piece, VideoOutput, pack_rows
from msd.batch.sample import SampleImages
from msd.plan.spec import topology_of
from msd.recipe.schema import Recipe
from msd.roles.constructor.intake import Key, Sample
from msd.roles.constructor.ready import Ready
from msd.wire.protocol import Plan

Group = tuple[int, int]  # (DP rank, CP rank): the ranks that read one copy of a step's batch


class Builder:
    """What the served ranks are (``coords``), the groups they form (``groups``, ranks of each)
    and what each group's ranks read (``readers``: its pipeline stages differ), and the
    recipe's image and video layout."""

    def __init__(self, recipe: Recipe, ranks: tuple[int, ...]) -> None:
        self.recipe = recipe
        self.topology = topology_of(recipe)
        self.vision = recipe.has_images
        self.image_token = recipe.vision.image_token_id if self.vision else None
        v = recipe.vision
        self.patch_values = 3 * v.temporal_patch_size * v.patch_size**2
        self.video = (
            VideoOutput(
                recipe.video.video_token_id,
                self.patch_values * recipe.video_rows_per_patch,
                recipe.video.seconds_per_grid,
            )
            if recipe.has_videos
            else None
        )
        self.coords = {rank: self.topology.coords(rank) for rank in ranks}
        self.groups: dict[Group, list[int]] = {}
        for rank, c in self.coords.items():
            self.groups.setdefault((c.dp, c.cp), []).append(rank)
        self.readers = {
            group: tuple(dict.fromkeys(self.topology.tensors(self.coords[r]) for r in ranks))
            for group, ranks in self.groups.items()
        }

    def group_of(self, rank: int) -> Group:
        c = self.coords[rank]
        return c.dp, c.cp

    def build(self, plan: Plan, payloads: dict[Key, Sample]) -> dict[Group, Ready]:
        """Each group's batch of the step ``plan`` lays out, from its samples ``payloads``."""
        rows = self._rows(plan, payloads)
        built = {}
        for dp, cp_rank in self.groups:
            packed = pack_rows(
                rows[dp],
                self.recipe.seq_len,
                self.image_token,
                self.patch_values,
                self.video,
                self.recipe.has_masks,
            )
            sliced = cp_slice(packed, self.topology.cp, cp_rank)
            built[(dp, cp_rank)] = Ready.of(sliced, self.readers[(dp, cp_rank)])
        return built

    def _rows(self, plan: Plan, payloads: dict[Key, Sample]) -> dict[int, list[list[Piece]]]:
        rows: dict[int, list[list[Piece]]] = {
            dp: [[] for _ in range(self.recipe.rows_per_rank)] for dp, _ in self.groups
        }
        pieces = zip(
            plan.dp,
            plan.row,
            plan.source,
            plan.gpos,
            plan.sample_id,
            plan.length,
            plan.offset,
            plan.padded,
            strict=True,
        )
        for dp, row, source, gpos, sample_id, length, offset, padded in pieces:
            tokens, images, trained = payloads[(source, gpos)]
            piece = tokens[offset : offset + length]
            if images is not None and len(piece) < len(tokens):  # a piece of a split sample
                images = self._images_within(tokens, images, offset, offset + length)
            own = None if trained is None else trained - offset  # the piece's own positions
            rows[dp][row].append(Piece(source, sample_id, piece, padded, offset, images, own))
        return rows

    def _images_within(
        self, tokens: np.ndarray, images: SampleImages, start: int, stop: int
    ) -> SampleImages | None:
        """The images whose placeholders lie in tokens ``start .. stop`` of their sample (an
        image is never cut: its sample was split at text positions)."""
        assert self.image_token is not None
        video = self.recipe.video.video_token_id
        begins = images.starts(tokens, self.image_token, self.recipe.vision.merge_size, video)
        first, last = np.searchsorted(begins, [start, stop]).tolist()
        return images.subset(first, last) if last > first else None
