"""Drawing which source the next sample of a step comes from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The generator for one step: random access by step, so a resume needs no RNG state."""
    return np.random.default_rng([seed, step, 0x6D7364])


def draw_source(rng: np.random.Generator, weights: Sequence[float], active: Sequence[bool]) -> int:
    """One categorical draw over the active sources, in proportion to their weights.

    The caller guarantees that some active source has a positive weight.
    """
    w = np.where(np.asarray(active), np.asarray(weights, dtype=np.float64), 0.0)
    cum = np.cumsum(w)
    u = rng.random() * cum[-1]
    return min(int(np.searchsorted(cum, u, side="right")), len(w) - 1)
