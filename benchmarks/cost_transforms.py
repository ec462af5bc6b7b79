"""Transforms with a set cost per sample, in wall time: ``slow`` is 20× ``fast``.

Loaders call them per cell; the time is slept in batches of a few milliseconds so the
average cost is exact even though each cell's is far below the sleep granularity. Sleeping
(not spinning) keeps the test about loader counts, not about this machine's two cores.
"""

from __future__ import annotations

import time

import numpy as np

FAST_S = 0.0002  # per sample
_debt = [0.0]


def _cost(text: str, seconds: float) -> np.ndarray:
    _debt[0] += seconds
    if _debt[0] >= 0.002:
        started = time.perf_counter()
        time.sleep(_debt[0])
        _debt[0] -= time.perf_counter() - started
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)


def fast(text: str) -> np.ndarray:
    return _cost(text, FAST_S)


def slow(text: str) -> np.ndarray:
    return _cost(text, 20 * FAST_S)
