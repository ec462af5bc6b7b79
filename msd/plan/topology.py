"""The trainer topology (the paper's ClientPlaceTree): where a global rank sits and what it needs.

A rank has coordinates (dp, pp, cp, tp). The order lists the axes from fastest-varying to
slowest; the default is Megatron's: TP fastest, then CP, then DP, then PP. From its coordinates
a rank knows which data-parallel batch it reads (``dp``), which slice of each packed sequence
(``cp``), and which tensors its pipeline stage needs (``pp``); TP peers share one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = ("tp", "cp", "dp", "pp")

INPUTS = ("input_ids", "position_ids")
LABELS = ("labels",)
LOSS_MASK = "loss_mask"  # with LABELS, in a job of conversations
METADATA = ("cu_seqlens", "sample_ids", "source_ids", "sample_offsets")
# What the vision encoder needs: it runs on the first pipeline stage only.
VISION = (
    "pixel_values",
    "image_grid_thw",
    "vision_cu_seqlens",
    "image_sample_ids",
    "image_source_ids",
)
# What it needs of the videos, in a job with video sources.
VIDEO = (
    "pixel_values_videos",
    "video_grid_thw",
    "video_cu_seqlens",
    "second_per_grid_ts",
    "video_sample_ids",
    "video_source_ids",
)


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class Topology:
    """Sizes of each parallel axis and their order (fastest first)."""

    dp: int = 1
    pp: int = 1
    cp: int = 1
    tp: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER
    vision: bool = False  # the job has image sources
    videos: bool = False  # the job has video sources
    masks: bool = False  # the job has conversation sources: its batches carry loss_mask

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    def size(self, axis: str) -> int:
        return int(getattr(self, axis))

    def coords(self, rank: int) -> Coords:
        """The (dp, pp, cp, tp) of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        found: dict[str, int] = {}
        for axis in self.order:
            rank, found[axis] = divmod(rank, self.size(axis))
        return Coords(found["dp"], found["pp"], found["cp"], found["tp"])

    def rank(self, coords: Coords) -> int:
        """The global rank at ``coords`` (inverse of ``coords``)."""
        rank, stride = 0, 1
        for axis in self.order:
            rank += getattr(coords, axis) * stride
            stride *= self.size(axis)
        return rank

    def tensors(self, coords: Coords) -> tuple[str, ...]:
        """What a rank receives: the first stage the inputs (and the images), the last the
        labels, every stage the metadata; a middle stage no token tensors at all."""
        names: list[str] = []
        if coords.pp == 0:
            names += INPUTS
            if self.vision:
                names += VISION
            if self.videos:
                names += VIDEO
        if coords.pp == self.pp - 1:
            names += LABELS
            if self.masks:
                names.append(LOSS_MASK)
            if "position_ids" not in names:
                names.append("position_ids")
        return (*names, *METADATA)
