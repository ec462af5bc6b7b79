"""msd: a multi-source data plane for large-model training.

``msd.Client`` (torch tensors) and ``msd.NumpyClient`` (numpy arrays, no torch) are imported
lazily: the Planner and Source Loaders import ``msd`` too and must not pay for them. So is
``msd.launch(recipe, ...)`` (`msd.launch.api.launch`): start a job from Python.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the one place it is written: the build reads it from here too

if TYPE_CHECKING:
    from msd.client.numpy import NumpyClient
    from msd.client.torch import Client

__all__ = ["Client", "NumpyClient", "__version__", "launch"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from msd.client.torch import Client

        return Client
    if name == "NumpyClient":
        from msd.client.numpy import NumpyClient

        return NumpyClient
    if name == "launch":  # the callable package: its import makes it this module's attribute
        return importlib.import_module("msd.launch")
    raise AttributeError(f"module 'msd' has no attribute {name!r}")
