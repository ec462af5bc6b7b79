"""The trainer-side reader: ``for batch in msd.Client(): ...``.

A Client holds nothing but its step. It asks the Data Constructor on its node for the batch of
that step, turns the received buffers into tensors and reports, with the next request, how long
the trainer waited. It is also a ``torch.utils.data.IterableDataset`` (batches are already
formed), so ``DataLoader(client, batch_size=None)`` works too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import zmq

from msd.errors import CheckpointError, LaunchError, ProtocolError
from msd.jobdir import JobDir
from msd.recipe.schema import stream_fingerprint
from msd.roles.constructor import constructor_endpoint_name
from msd.wire import transport
from msd.wire.protocol import Batch, Ended, Get, Refused

STATE_VERSION = 1
_SLURM_NAMES = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID"}


def _env_int(name: str, default: int | None = None) -> int:
    """An integer from the environment; under srun without torchrun, SLURM's own names."""
    value = os.environ.get(name) or os.environ.get(_SLURM_NAMES.get(name, ""))
    if value is None:
        if default is None:
            raise LaunchError(f"{name} is not set; pass it to msd.Client() or set the variable")
        return default
    return int(value)


def node_name() -> str:
    """The name of this node's Constructor: MSD_NODE, else SLURM's node name, else ``local``."""
    return os.environ.get("MSD_NODE") or os.environ.get("SLURMD_NODENAME") or "local"


class Client(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """Batches for one trainer rank. State keys: ``version``, ``step``, ``fingerprint``."""

    def __init__(
        self,
        job: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        super().__init__()
        root = job if job is not None else os.environ.get("MSD_JOB")
        if root is None:
            raise LaunchError("no job given: pass msd.Client(job=...) or set MSD_JOB")
        self.job = JobDir(root)
        recipe = self.job.recipe()
        self.rank = rank if rank is not None else _env_int("RANK", 0)
        self.world_size = world_size if world_size is not None else _env_int("WORLD_SIZE", 1)
        self.local_rank = local_rank if local_rank is not None else _env_int("LOCAL_RANK", 0)
        if self.world_size != recipe.world_size:
            raise LaunchError(
                f"WORLD_SIZE is {self.world_size} but the job's recipe has "
                f"{recipe.world_size} ranks"
            )
        self.fingerprint = stream_fingerprint(recipe)
        self.timeout_s = timeout_s
        self.step = 0
        self._sock: zmq.Socket[Any] | None = None
        self._inflight: int | None = None
        self._wait_s = 0.0

    # -- Stateful -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "step": self.step, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(f"client state has version {state.get('version')!r}, expected 1")
        if state.get("fingerprint") != self.fingerprint:
            raise CheckpointError("client state comes from a job with a different data stream")
        self.close()  # a request in flight was for another step
        self.step = int(state["step"])

    # -- iteration ----------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            endpoint = self.job.wait_endpoint(constructor_endpoint_name(node_name()))
            self._sock = transport.connect(transport.context(), zmq.DEALER, endpoint)
        return self._sock

    def _request(self, step: int, consumed: int) -> None:
        get = Get(rank=self.rank, step=step, consumed=consumed, wait_s=self._wait_s)
        transport.send(self._socket(), get)
        self._inflight = step

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while (batch := self.next_batch()) is not None:
            yield batch

    def next_batch(self) -> dict[str, torch.Tensor] | None:
        """The batch of the current step, or None once the stream has ended.

        Calling it means the previous batch is consumed. The request for the following step
        goes out before this returns, so its batch arrives while the trainer computes.
        """
        if self._inflight != self.step:
            self._request(self.step, consumed=self.step)
        started = time.perf_counter()
        msg, buffers = self._receive()
        self._wait_s = time.perf_counter() - started
        if isinstance(msg, Ended):
            self._request(msg.num_steps, consumed=self.step)  # report the last step consumed
            self._inflight = None
            return None
        if isinstance(msg, Refused):
            raise LaunchError(msg.reason)
        if not isinstance(msg, Batch) or msg.step != self.step:
            raise ProtocolError(f"rank {self.rank} expected the batch of step {self.step}")
        self._request(self.step + 1, consumed=self.step)
        self.step += 1
        return {
            spec.name: torch.from_numpy(
                np.frombuffer(buf, dtype=spec.dtype).reshape(spec.shape).copy()
            )
            for spec, buf in zip(msg.tensors, buffers, strict=True)
        }

    def _receive(self) -> tuple[Any, list[memoryview]]:
        sock = self._socket()
        if not sock.poll(int(self.timeout_s * 1000)):
            raise LaunchError(
                f"no batch for rank {self.rank} step {self.step} in {self.timeout_s:.0f} s"
            )
        _, msg, buffers = transport.recv(sock)
        return msg, buffers

    @property
    def last_wait_s(self) -> float:
        """How long the last ``next_batch`` waited for its data."""
        return self._wait_s

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._inflight = None
