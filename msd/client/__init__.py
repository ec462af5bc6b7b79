"""The trainer side: what a training rank imports to read its batches.

``base`` is the socket thread and the step, for any kind of array; ``numpy`` hands them out as
numpy arrays (``msd.NumpyClient``, no torch); ``torch`` as torch tensors (``msd.Client``), copied
to a GPU by ``device``. The clients are imported lazily, so that ``NumpyClient`` never pays for
torch: ``from msd.client import Client`` loads torch, ``import msd.client`` alone does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from msd.client.base import STATE_VERSION, node_name
    from msd.client.device import normalised
    from msd.client.numpy import NumpyClient
    from msd.client.torch import Client

__all__ = ["STATE_VERSION", "Client", "NumpyClient", "node_name", "normalised"]

_HOMES = {
    "Client": "msd.client.torch",
    "NumpyClient": "msd.client.numpy",
    "STATE_VERSION": "msd.client.base",
    "node_name": "msd.client.base",
    "normalised": "msd.client.device",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'msd.client' has no attribute {name!r}")
