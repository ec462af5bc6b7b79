"""Drawing which source the next sample of a step comes from.

Draw k of a step uses the k-th uniform of the step's generator: it picks the active source whose
cumulative weight interval holds ``u_k × total weight``. ``SourceDraws`` computes many draws at
once (uniforms are generated in chunks, and the cumulative weights only when the set of active
sources changes); ``draw_source`` is the same rule for one draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

UNIFORM_CHUNK = 1024  # uniforms generated per call to the step's generator


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The generator for one step: random access by step, so a resume needs no RNG state."""
    return np.random.default_rng([seed, step, 0x6D7364])


def draw_source(rng: np.random.Generator, weights: Sequence[float], active: Sequence[bool]) -> int:
    """One categorical draw over the active sources, in proportion to their weights.

    The caller guarantees that some active source has a positive weight.
    """
    cum = _cumulative(weights, active)
    return int(_pick(cum, np.array([rng.random()]))[0])


class SourceDraws:
    """The sources of a step's draws, in order, many at a time.

    ``peek(n)`` gives the sources of the next n draws under the current active set without
    taking them; ``advance(n)`` takes them. Draws give exactly what one ``draw_source`` call per
    draw would (a generator yields the same uniforms one by one or in chunks).
    """

    def __init__(self, rng: np.random.Generator, weights: Sequence[float] | np.ndarray) -> None:
        self.rng, self.weights = rng, weights
        self.uniforms = np.empty(0)  # generated, not yet taken
        self.cum = np.zeros(len(weights))

    def set_active(self, active: Sequence[bool] | np.ndarray) -> None:
        """Which sources can be drawn from now on (some with a positive weight)."""
        self.cum = _cumulative(self.weights, active)

    def peek(self, count: int) -> np.ndarray:
        if len(self.uniforms) < count:
            more = self.rng.random(
                -(-(count - len(self.uniforms)) // UNIFORM_CHUNK) * UNIFORM_CHUNK
            )
            self.uniforms = np.concatenate([self.uniforms, more])
        return _pick(self.cum, self.uniforms[:count])

    def advance(self, count: int) -> None:
        self.uniforms = self.uniforms[count:]


def _cumulative(
    weights: Sequence[float] | np.ndarray, active: Sequence[bool] | np.ndarray
) -> np.ndarray:
    return np.cumsum(np.where(np.asarray(active), np.asarray(weights, dtype=np.float64), 0.0))


def _pick(cum: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """The source of each uniform (an int64 array)."""
    picked = np.searchsorted(cum, uniforms * cum[-1], side="right")
    sources: np.ndarray = np.minimum(picked, len(cum) - 1).astype(np.int64)
    return sources
