"""Per-sample cost from metadata: attention is quadratic in a sequence's length.

Default ``attn·len² + lin·len`` (the linear term stands for MLP and embedding work per token, in
units of one attention token pair); or a user ``module:function`` mapping an int64 array of
lengths to an array of costs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from msd.errors import RecipeError

LINEAR_COEF = 256.0
CostFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class CostModel:
    attn: float = 1.0
    lin: float = LINEAR_COEF
    function: str | None = None

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        if self.function is not None:
            return _user_cost(self.function, lengths)
        lens = lengths.astype(np.float64)
        return self.attn * lens * lens + self.lin * lens


def sample_cost(lengths: np.ndarray) -> np.ndarray:
    """The default cost model."""
    return CostModel()(lengths)


def _user_cost(spec: str, lengths: np.ndarray) -> np.ndarray:
    fn = load_cost_function(spec)
    costs = np.asarray(fn(lengths.astype(np.int64)), dtype=np.float64)
    if costs.shape != lengths.shape or not np.all(np.isfinite(costs)) or np.any(costs < 0):
        raise RecipeError(f"cost.function {spec!r} must return one finite cost >= 0 per length")
    return costs


def load_cost_function(spec: str) -> CostFn:
    module, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise RecipeError(f"cost.function {spec!r} cannot be imported ({exc})") from None
    if not callable(fn):
        raise RecipeError(f"cost.function {spec!r} is not callable")
    result: CostFn = fn
    return result
