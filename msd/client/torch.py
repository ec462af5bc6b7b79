"""The trainer-side reader: ``for batch in msd.Client(): ...`` hands out torch tensors.

A Client holds nothing but its step. It asks the Data Constructor on its node for the batch of
that step and reports, with the next request, how long the trainer waited. A background thread
owns the socket: it asks for the next step as soon as a batch is handed out, and receives it and
turns it into tensors while the trainer computes (``msd.client.base``, shared
with ``msd.NumpyClient``). It is also a ``torch.utils.data.IterableDataset`` (batches are already
formed), so ``DataLoader(client, batch_size=None)`` works too, with ``num_workers=0``: the data
plane does the work in its own processes, and a worker process would read the stream apart from
the Client whose ``state_dict()`` a checkpoint saves, so iterating in one is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

import torch

from msd.client import device as devices
from msd.client.base import STATE_VERSION, Reader, node_name
from msd.client.device import normalised
from msd.errors import LaunchError
from msd.wire import compact

__all__ = ["STATE_VERSION", "Client", "node_name", "normalised"]

IN_A_WORKER = (
    "msd.Client cannot be read in a DataLoader worker process (its step, and so its "
    "state_dict(), would not advance in the trainer's): use DataLoader(client, batch_size=None, "
    "num_workers=0), as the data plane already does the work in its own processes"
)


class Client(Reader[torch.Tensor], torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """Batches for one trainer rank. State keys: ``version``, ``step``, ``fingerprint``."""

    def __init__(
        self,
        job: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        timeout_s: float = 600.0,
        pixels: Literal["uint8", "float"] = "uint8",
        pin_memory: bool = False,
        device: str | torch.device | None = None,
    ) -> None:
        """``pixels="float"``: ``pixel_values`` come as float32, scaled to [0, 1] and normalised
        with the recipe's ``vision.mean``/``std`` (by default they stay uint8, 4× smaller, for
        a GPU-side step to normalise).

        ``device="cuda"`` (or ``"cuda:N"``, a ``torch.device``): batches come on that GPU,
        copied from pinned memory on a side stream while the trainer computes
        (``msd.client.device``).
        ``pin_memory=True``: CPU batches come in pinned memory (nothing without CUDA).
        """
        self.placement = devices.placement(device, pin_memory)
        super().__init__(job, rank, world_size, local_rank, timeout_s, pixels)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if torch.utils.data.get_worker_info() is not None:
            raise LaunchError(IN_A_WORKER)
        return super().__iter__()

    def _convert(self, frames: compact.Arrays, shapes: compact.Shapes) -> devices.Pending:
        if self.placement is not None:
            return self.placement.place(frames, shapes, self.normalise)
        return devices.Pending(devices.cpu_tensors(frames, shapes, self.normalise))
