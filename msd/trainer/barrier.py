"""The demo trainer's barrier: every rank waits until all ranks have finished the step, as a
data-parallel gradient all-reduce makes them wait (so a slow rank slows every rank).

Rank 0 binds ``MASTER_ADDR:MASTER_PORT`` (the port the launcher chose for the trainers'
rendezvous) and the other ranks connect to it, with the job's keys like every msd socket: a
peer without ``JOB/job.key`` can neither arrive nor be released. Each rank sends ``Arrive``;
once rank 0 has one from every other rank it sends each a ``Release``. ZeroMQ and no torch:
the demo trainer starts in a fraction of a second, where torch's import takes seconds of CPU.
"""

from __future__ import annotations

import os
import time
from typing import Any

import zmq

from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.wire import transport
from msd.wire.protocol import Arrive, Release
from msd.wire.rejects import Rejects

MAX_MESSAGE_BYTES = 1024  # an Arrive or a Release is a few bytes
TIMEOUT_S = 1800.0  # as gloo's default: a rank that never arrives stops the others then
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Barrier:
    """``wait(step)`` returns on every rank once all ``world_size`` ranks called it."""

    def __init__(
        self,
        job: JobDir,
        rank: int,
        world_size: int,
        address: str,
        port: int,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.rejects = Rejects(f"trainer rank {rank}")
        self.sock: zmq.Socket[Any] | None = None
        if world_size == 1:
            return
        ctx, keys = transport.context(), job.keys()
        if rank == 0:
            host = os.environ.get("MSD_BIND_HOST") or (
                address if address in _LOOPBACK else "0.0.0.0"
            )
            self.sock = transport.bind_at(ctx, zmq.ROUTER, keys, host, port, MAX_MESSAGE_BYTES)
        else:
            self.sock = transport.connect(ctx, zmq.DEALER, f"tcp://{address}:{port}", keys=keys)

    @staticmethod
    def from_env(job: JobDir, rank: int, world_size: int) -> Barrier:
        """The barrier at ``MASTER_ADDR:MASTER_PORT``, which the launchers set for trainers."""
        if world_size == 1:
            return Barrier(job, 0, 1, "", 0)
        address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not address or not port or not port.isdigit():
            raise LaunchError("the demo trainer needs MASTER_ADDR and MASTER_PORT to be set")
        return Barrier(job, rank, world_size, address, int(port))

    def wait(self, step: int) -> None:
        if self.sock is None:
            return
        if self.rank == 0:
            self._gather(self.sock, step)
        else:
            transport.send(self.sock, Arrive(rank=self.rank, step=step))
            self._released(self.sock, step)

    def _gather(self, sock: zmq.Socket[Any], step: int) -> None:
        """Rank 0: one ``Arrive`` from every other rank, then release them all."""
        arrived: dict[int, bytes] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(arrived) < self.world_size - 1:
            if not _poll(sock, deadline):
                self._timed_out(f"ranks {self._missing(arrived)} to arrive at step {step}")
            received = transport.recv_or_drop(sock, self.rejects)
            if received is None:
                continue
            identity, msg, _ = received
            if not isinstance(msg, Arrive) or not 0 < msg.rank < self.world_size:
                self.rejects.count("unexpected", f"{type(msg).__name__} at the barrier")
                continue
            arrived[msg.rank] = identity or b""
        for identity in arrived.values():
            transport.send(sock, Release(step=step), to=identity)

    def _released(self, sock: zmq.Socket[Any], step: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if not _poll(sock, deadline):
                self._timed_out(f"rank 0 to release step {step}")
            received = transport.recv_or_drop(sock, self.rejects)
            if received is not None and isinstance(received[1], Release):
                return
            if received is not None:
                self.rejects.count("unexpected", f"{type(received[1]).__name__} at the barrier")

    def _timed_out(self, what: str) -> None:
        raise LaunchError(
            f"trainer rank {self.rank} waited {self.timeout_s:.0f} s for {what} at the barrier"
        )

    def _missing(self, arrived: dict[int, bytes]) -> list[int]:
        return [r for r in range(1, self.world_size) if r not in arrived]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=1000)  # the last Release still goes out
            self.sock = None


def _poll(sock: zmq.Socket[Any], deadline: float) -> bool:
    """Whether a message arrived before ``deadline``."""
    left_ms = int((deadline - time.monotonic()) * 1000)
    return left_ms > 0 and bool(sock.poll(left_ms))
