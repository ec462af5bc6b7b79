"""The trainer-side reader for any kind of array: what ``msd.NumpyClient`` and ``msd.Client``
share.

A reader holds nothing but its step. It asks the Data Constructor on its node for the batch of
that step and reports, with the next request, how long the trainer waited. A background thread
owns the socket: it asks for the next step as soon as a batch is handed out, and receives it and
turns it into arrays while the trainer computes.

``Reader`` is that logic for any kind of array; ``NumpyClient`` (``msd/client/numpy.py``) hands
out numpy arrays (for JAX or numpy trainers, and msd's demo trainer, which then never imports
torch); ``msd.Client`` (``msd/client/torch.py``) hands out torch tensors, on the CPU or a GPU.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, Literal, Protocol, TypeVar, Union

import numpy as np
import zmq

from msd.errors import CheckpointError, LaunchError, ProtocolError
from msd.jobdir import JobDir, Published, constructor_endpoint_name
from msd.recipe.schema import stream_fingerprint
from msd.wire import compact, transport
from msd.wire.protocol import (
    Batch,
    Behind,
    Ended,
    Get,
    Refused,
    Rewind,
    Rewinding,
    frame_offsets,
)

log = logging.getLogger(__name__)

STATE_VERSION = 1
_SLURM_NAMES = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID"}

T = TypeVar("T")


class Pending(Protocol[T]):
    """A batch built on the reader's thread, handed out by ``ready`` on the trainer's."""

    def ready(self) -> dict[str, T]: ...


# frames (checked on decode) and the tensors they carry -> the batch on its way
Convert = Callable[[compact.Arrays, compact.Shapes], Pending[T]]


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


class Reader(Generic[T]):
    """Batches for one trainer rank, as arrays of type ``T`` (see ``NumpyClient`` and
    ``msd.Client``). State keys: ``version``, ``step``, ``fingerprint``."""

    def __init__(
        self,
        job: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        timeout_s: float = 600.0,
        pixels: Literal["uint8", "float"] = "uint8",
    ) -> None:
        """``pixels="float"``: ``pixel_values`` come as float32, scaled to [0, 1] and normalised
        with the recipe's ``vision.mean``/``std`` (by default they stay uint8, 4× smaller)."""
        if pixels not in ("uint8", "float"):
            raise ValueError(f"pixels must be 'uint8' or 'float', got {pixels!r}")
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
        self.normalise = (recipe.vision.mean, recipe.vision.std) if pixels == "float" else None
        self.timeout_s = timeout_s
        self.step = self.job.start_step()  # 0, or the step the job was restored at
        self._fetcher: _Fetcher[T] | None = None
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
    def __iter__(self) -> Iterator[dict[str, T]]:
        while (batch := self.next_batch()) is not None:
            yield batch

    def next_batch(self) -> dict[str, T] | None:
        """The batch of the current step, or None once the stream has ended.

        Calling it means the previous batch is consumed. The request for the following step
        goes out before this returns, and a background thread receives its batch and turns it
        into tensors while the trainer computes: a trainer that asks late finds it ready.
        """
        fetcher = self._fetcher_for_this_process()
        if fetcher.asked != self.step:
            fetcher.ask(self._get(self.step, consumed=self.step))
        started = time.perf_counter()
        result = fetcher.take(self.timeout_s)
        self._wait_s = time.perf_counter() - started
        if isinstance(result, Ended):
            # report the last step consumed, and let it reach the Constructor before returning
            fetcher.ask(self._get(result.num_steps, consumed=self.step), expect_reply=False)
            fetcher.finish()
            self._fetcher = None
            return None
        if isinstance(result, BaseException):
            self.close()
            raise result
        step, pending = result
        tensors = pending.ready()
        if step != self.step:
            self.close()
            raise ProtocolError(f"rank {self.rank} expected the batch of step {self.step}")
        self.step += 1
        fetcher.ask(self._get(self.step, consumed=self.step - 1), ahead=True)
        return tensors

    def _get(self, step: int, consumed: int) -> Get:
        return Get(rank=self.rank, step=step, consumed=consumed, wait_s=self._wait_s)

    def _fetcher_for_this_process(self) -> _Fetcher[T]:
        if self._fetcher is None or self._fetcher.pid != os.getpid():  # none yet, or forked
            self._fetcher = _Fetcher(self.job, self.rank, self._convert)
        return self._fetcher

    @property
    def last_wait_s(self) -> float:
        """How long the last ``next_batch`` waited for its data."""
        return self._wait_s

    def close(self) -> None:
        """Stop fetching (a batch in flight is dropped); iterating again starts afresh."""
        if self._fetcher is not None:
            if self._fetcher.pid == os.getpid():
                self._fetcher.stop()
            self._fetcher = None

    # -- what the arrays are (``NumpyClient``, ``msd.Client``) --------------------------------
    def _convert(self, frames: compact.Arrays, shapes: compact.Shapes) -> Pending[T]:
        """The batch ``frames`` carry, built on the reader's background thread, with
        ``pixel_values`` normalised there when ``self.normalise`` says so (``ProtocolError``
        if the frames do not hold the tensors ``shapes`` names)."""
        raise NotImplementedError


_Result = Union[tuple[int, Pending[T]], Ended, BaseException]  # noqa: UP007 (generic alias)


class _Reconnect:
    """The Constructor was restarted (a new endpoint): send the request again, there."""


RECONNECT = _Reconnect()


AHEAD_DELAY_S = 0.002


class _Fetcher(Generic[T]):
    """The Client's socket and the thread that owns it: sends each ``Get``, receives the reply
    and turns a batch into tensors, one request at a time (ZeroMQ sockets stay in one thread)."""

    POLL_MS = 100  # how often a waiting thread checks whether it should stop
    ENDPOINT_CHECK_S = 0.5  # how often a waiting thread checks for a restarted Constructor
    RESTART_TIMEOUT_S = 300.0  # how long it waits for a restarted data plane

    def __init__(self, job: JobDir, rank: int, convert: Convert[T]) -> None:
        self.job, self.rank, self.pid = job, rank, os.getpid()
        self.convert = convert
        self.keys = job.keys()  # the Constructor admits only holders of the job's key
        self.asked: int | None = None  # the step of the request in flight
        self.requests: queue.Queue[tuple[Get, bool, bool] | None] = queue.Queue()
        self.results: queue.Queue[_Result[T]] = queue.Queue()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"msd-client-{rank}", daemon=True)
        self.thread.start()

    def ask(self, get: Get, expect_reply: bool = True, ahead: bool = False) -> None:
        """Send ``get`` (from the thread); ``ahead``: the trainer is not waiting for it yet."""
        self.asked = get.step if expect_reply else None
        self.requests.put((get, expect_reply, ahead))

    def take(self, timeout_s: float) -> _Result[T]:
        try:
            result = self.results.get(timeout=timeout_s)
        except queue.Empty:
            step = self.asked
            return LaunchError(f"no batch for rank {self.rank} step {step} in {timeout_s:.0f} s")
        self.asked = None
        return result

    def stop(self) -> None:
        """Stop now: a request in flight is dropped."""
        self.stopping.set()
        self.requests.put(None)
        self.thread.join(timeout=5)

    def finish(self) -> None:
        """Stop once every request asked is sent (the socket lingers until they are out)."""
        self.requests.put(None)
        self.thread.join(timeout=5)

    def _run(self) -> None:
        sock: zmq.Socket[Any] | None = None
        endpoint = Published("", -1)
        name = constructor_endpoint_name(node_name())
        try:
            while (request := self.requests.get()) is not None:
                get, expect_reply, ahead = request
                if ahead:
                    # Let the trainer's thread get back to work first: the reply is often
                    # already built, and turning it into tensors holds the interpreter lock.
                    time.sleep(AHEAD_DELAY_S)
                while True:
                    if sock is None:
                        endpoint = self.job.wait_published(name, self.RESTART_TIMEOUT_S)
                        sock = transport.connect(
                            transport.context(), zmq.DEALER, endpoint.address, keys=self.keys
                        )
                    transport.send(sock, get)
                    if not expect_reply:
                        break
                    result = self._receive(sock, endpoint)
                    if result is RECONNECT:
                        sock.close(linger=0)
                        sock = None
                        continue
                    self.results.put(result)  # type: ignore[arg-type]
                    break
        except Exception as exc:  # reaches the trainer on its next call
            self.results.put(exc)
        finally:
            if sock is not None:
                sock.close(linger=0 if self.stopping.is_set() else 1000)

    def _restarted(self, endpoint: Published) -> bool:
        now = self.job.read_endpoint(constructor_endpoint_name(node_name()))
        return now is not None and now != endpoint

    def _receive(self, sock: zmq.Socket[Any], endpoint: Published) -> _Result[T] | _Reconnect:
        checked = time.monotonic()
        while not sock.poll(self.POLL_MS):
            if self.stopping.is_set():
                return LaunchError("the client was closed")
            if time.monotonic() - checked >= self.ENDPOINT_CHECK_S:
                checked = time.monotonic()
                if self._restarted(endpoint):  # the data plane was restarted: ask it
                    log.info("rank %d: the data plane restarted; asking it again", self.rank)
                    return RECONNECT
        _, msg, buffers = transport.recv(sock)
        if isinstance(msg, Ended):
            return msg
        if isinstance(msg, Behind):
            return self._rewind(msg.step, endpoint)
        if isinstance(msg, Refused):
            return LaunchError(msg.reason)
        if not isinstance(msg, Batch):
            return ProtocolError(f"rank {self.rank} got a {type(msg).__name__}, not a batch")
        offsets = frame_offsets(msg.frames)  # the buffer's size was checked on decode
        frames = {
            spec.name: np.frombuffer(
                buffers[0], dtype=spec.dtype, count=math.prod(spec.shape), offset=at
            ).reshape(spec.shape)
            for spec, at in zip(msg.frames, offsets, strict=False)
        }
        shapes = {spec.name: (spec.shape, spec.dtype) for spec in msg.tensors}
        try:
            return msg.step, self.convert(frames, shapes)
        except ProtocolError as exc:
            return ProtocolError(f"rank {self.rank} got a batch it cannot read: {exc}")

    def _rewind(self, step: int, endpoint: Published) -> _Result[T] | _Reconnect:
        """Step ``step`` was consumed already (the trainer restored an earlier checkpoint): ask
        the Planner to restart the data plane there, and wait for it."""
        from msd.control.planner_connection import (
            planner_socket,  # the control plane, on this rare path
        )

        log.info("rank %d: step %d was consumed already; rewinding the data plane", self.rank, step)
        sock = planner_socket(self.job, timeout_s=10.0)
        try:
            transport.send(sock, Rewind(step=step))
            if sock.poll(10_000):  # no answer: another rank's request is restarting it
                reply = transport.recv(sock)[1]
                if isinstance(reply, Refused):
                    return LaunchError(reply.reason)
                if not isinstance(reply, Rewinding):
                    return ProtocolError(f"the planner answered a rewind with {reply!r}")
        finally:
            sock.close(linger=0)
        deadline = time.monotonic() + self.RESTART_TIMEOUT_S
        while not self._restarted(endpoint):
            if self.stopping.is_set() or time.monotonic() > deadline:
                return LaunchError(f"the data plane did not restart at step {step}")
            time.sleep(0.05)
        return RECONNECT
