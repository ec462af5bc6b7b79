"""A vision-language sample's cost: the vision encoder's over its images plus the language
backbone's over its fused sequence (text tokens and image placeholder tokens together).

The encoder runs attention per image (NaViT / Qwen2-VL: an image's patches attend to each
other only), so an image of ``p`` patches costs ``enc_attn·p² + enc_lin·p``; a video's patches
attend within each of its ``t`` temporal patches (Qwen2-VL's vision ``cu_seqlens``), so a video
of ``p = t·h·w`` patches costs ``enc_attn·p²/t + enc_lin·p``. The backbone's
cost is the text model's (``msd.plan.cost.CostModel``) over the fused length. Which of them the
balancer weighs is the objective: ``sum`` (encoder and backbone run on the same ranks, one after
the other), or ``backbone`` (what balancing by tokens alone gives). Pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from msd.plan.cost import CostModel

Objective = Literal["sum", "backbone"]
OBJECTIVES: tuple[Objective, ...] = ("sum", "backbone")


@dataclass(frozen=True)
class HybridCost:
    """``enc_attn``/``enc_lin``: the encoder's cost per patch pair and per patch, in the units
    of ``backbone`` (one attention token pair of the language model)."""

    backbone: CostModel = field(default_factory=CostModel)
    enc_attn: float = 1.0
    enc_lin: float = 256.0

    def item_costs(self, patches: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray:
        """The encoder's cost of each image or video: ``patches`` each, attending within
        ``frames`` groups each (None: one group each, images)."""
        p = np.asarray(patches, dtype=np.float64)
        groups = 1.0 if frames is None else np.asarray(frames, dtype=np.float64)
        return np.asarray(self.enc_attn * p * p / groups + self.enc_lin * p)

    def images(self, patches: np.ndarray, frames: np.ndarray | None = None) -> float:
        """The encoder's cost of one sample's images and videos (``patches``: each one's patch
        count; ``frames``: each one's temporal patches, None for images only)."""
        return float(np.sum(self.item_costs(patches, frames)))

    def encoder(
        self,
        patches: np.ndarray,
        owner: np.ndarray,
        samples: int,
        frames: np.ndarray | None = None,
    ) -> np.ndarray:
        """Each sample's encoder cost: the sum over its images (``patches[i]`` patches in
        ``frames[i]`` groups, of sample ``owner[i]``); 0 for a sample without images."""
        if len(patches) != len(owner) or (len(owner) and int(np.min(owner)) < 0):
            raise ValueError("every image needs a patch count and a sample index >= 0")
        per_image = self.item_costs(patches, frames)
        return np.bincount(np.asarray(owner, dtype=np.int64), per_image, minlength=samples)[
            :samples
        ]

    def costs(
        self,
        fused_lengths: np.ndarray,
        patches: np.ndarray,
        owner: np.ndarray,
        objective: Objective = "sum",
    ) -> np.ndarray:
        """Per sample, what the balancer weighs under ``objective``."""
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
        lengths = np.asarray(fused_lengths, dtype=np.int64)
        backbone = self.backbone(lengths)
        if objective == "backbone":
            return backbone
        return np.asarray(backbone + self.encoder(patches, owner, len(lengths)))
