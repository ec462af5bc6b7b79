"""One process of simulated nodes for ``benchmarks.scale``: a real ``Constructor`` per node, each
on its own thread, and the nodes' trainer ranks, simulated on one more thread.

    python -m benchmarks.scale_nodes --job JOB --first 0 --count 128 --ranks-per-node 8 --out F

A simulated rank does what ``msd.NumpyClient`` does, without torch or compute: over its own
CURVE DEALER socket to its node's Constructor it sends ``Get`` for step s, waits for the
``Batch`` and at once asks for s + 1 (reporting s consumed), until the Constructor answers
``Ended``. Every message the Constructors and the ranks send or receive is counted by type, with
its bytes, where ``msd.wire.transport`` encodes and decodes it. The process ends once every
Constructor has returned (the Planner's ``Stop``), or at once on SIGUSR1 from the harness, and
writes what it saw to ``--out`` as JSON: when each step reached every rank here, the message
counts, the errors, and how many Constructors had not yet returned.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from msd import logs
from msd.jobdir import JobDir, constructor_endpoint_name
from msd.recipe.schema import Recipe
from msd.roles.constructor import loop as constructor_loop
from msd.roles.constructor.loop import Constructor
from msd.wire import transport
from msd.wire.protocol import Batch, Ended, Get

MAX_SOCKETS = 65536  # ZeroMQ's default (1,023 per context) is below a few hundred nodes' sockets
ENDPOINT_WAIT_S = 300.0
NICE = 10
STOP_WAIT_S = 30.0  # for the Constructors to return once the Planner said Stop
WRITE_NOW = signal.SIGUSR1  # the harness: stop waiting for the Constructors, write the figures

log = logging.getLogger("msd.bench.scale")
_BUILDING = threading.Lock()
Counts = dict[str, list[int]]  # "sent:Batch" -> [messages, bytes]
_local = threading.local()
_all_counts: list[tuple[str, Counts]] = []  # (role, counts) of every thread that sent or received


def _counts() -> Counts:
    counts: Counts | None = getattr(_local, "counts", None)
    if counts is None:
        counts = _local.counts = {}
        _all_counts.append((threading.current_thread().name.split("-")[0], counts))
    return counts


def _nbytes(frame: Any) -> int:
    nbytes = getattr(frame, "nbytes", None)
    return int(nbytes) if nbytes is not None else len(frame)


def _count(kind: str, frames: Sequence[Any]) -> None:
    entry = _counts().setdefault(kind, [0, 0])
    entry[0] += 1
    entry[1] += sum(_nbytes(f) for f in frames)


def install_counting() -> None:
    """Count every message encoded or decoded in this process, per thread (no lock needed)."""
    encode, decode = transport.encode, transport.decode

    def counted_encode(msg: Any, buffers: Sequence[Any] = ()) -> list[Any]:
        frames = encode(msg, buffers)
        _count(f"sent:{type(msg).__name__}", frames)
        return frames

    def counted_decode(frames: Sequence[Any]) -> tuple[Any, list[memoryview]]:
        msg, buffers = decode(frames)
        _count(f"received:{type(msg).__name__}", frames)
        return msg, buffers

    transport.encode = counted_encode  # type: ignore[assignment]
    transport.decode = counted_decode  # type: ignore[assignment]


def counts_by_role() -> dict[str, Counts]:
    total: dict[str, Counts] = {}
    for role, counts in list(_all_counts):
        mine = total.setdefault(role, {})
        for kind, (n, size) in list(counts.items()):
            entry = mine.setdefault(kind, [0, 0])
            entry[0] += n
            entry[1] += size
    return total


def share_usage_reading() -> None:
    """Read this process's CPU time and PSS once a second for all its Constructors.

    Each Constructor reads ``/proc/self/smaps_rollup`` for its Stats every second: once per
    node on a real cluster, but dozens of times a second in a process hosting dozens of nodes,
    where the kernel walks the whole address space each time. The figures are the process's
    either way, so one reading a second is shared."""
    read = constructor_loop.process_usage
    cached: list[tuple[float, tuple[float, int]]] = []
    lock = threading.Lock()

    def shared() -> tuple[float, int]:
        with lock:
            now = time.monotonic()
            if not cached or now - cached[0][0] >= 1.0:
                cached[:] = [(now, read())]
            return cached[0][1]

    constructor_loop.process_usage = shared  # type: ignore[assignment]


def serve(
    job: JobDir, recipe: Recipe, node: str, ranks: tuple[int, ...], errors: list[str]
) -> None:
    """One node's Constructor, built and run on this thread (its sockets stay on it)."""
    try:
        with _BUILDING:  # one at a time: set-up is not meant to run on many threads at once
            constructor = Constructor(job, recipe, node, ranks)
        constructor.run()
    except Exception:  # reported in the output; the other nodes go on
        errors.append(f"constructor {node}: {traceback.format_exc()}")
        log.error("constructor %s failed:\n%s", node, errors[-1])


class Ranks:
    """The simulated trainer ranks of this process's nodes, all on one thread."""

    def __init__(self, job: JobDir, nodes: dict[str, tuple[int, ...]]) -> None:
        keys, ctx = job.keys(), transport.context()
        self.rank_of: dict[zmq.Socket[Any], int] = {}
        for node, ranks in nodes.items():
            endpoint = job.wait_endpoint(constructor_endpoint_name(node), ENDPOINT_WAIT_S)
            for rank in ranks:
                sock = transport.connect(ctx, zmq.DEALER, endpoint, keys=keys)
                self.rank_of[sock] = rank
        self.arrived: dict[int, list[float]] = {}  # step -> [ranks that have it, latest time]
        self.asked_at: dict[int, float] = {}
        self.errors: list[str] = []

    def run(self, alive: Callable[[], bool]) -> None:
        """Ask, receive, ask again, until every rank's stream ended or ``alive`` says stop."""
        poller = zmq.Poller()
        for sock, rank in self.rank_of.items():
            poller.register(sock, zmq.POLLIN)
            self._ask(sock, rank, step=0, consumed=0)
        waiting = len(self.rank_of)
        while waiting and alive():
            for sock, _ in poller.poll(100):
                if not self._receive(sock):
                    poller.unregister(sock)
                    waiting -= 1

    def _ask(self, sock: zmq.Socket[Any], rank: int, step: int, consumed: int) -> None:
        now = time.monotonic()
        wait_s = now - self.asked_at.get(rank, now)
        transport.send(sock, Get(rank=rank, step=step, consumed=consumed, wait_s=wait_s))
        self.asked_at[rank] = now

    def _receive(self, sock: zmq.Socket[Any]) -> bool:
        """Handle one reply; False once this rank is done."""
        rank = self.rank_of[sock]
        _, msg, _ = transport.recv(sock)
        if isinstance(msg, Batch):
            seen = self.arrived.setdefault(msg.step, [0, 0.0])
            seen[0] += 1
            seen[1] = time.time()
            self._ask(sock, rank, step=msg.step + 1, consumed=msg.step)
            return True
        if isinstance(msg, Ended):  # report the whole stream consumed, as a Client does
            self._ask(sock, rank, step=msg.num_steps, consumed=msg.num_steps)
            return False
        self.errors.append(f"rank {rank}: {msg!r}")
        return False

    def done_at(self) -> dict[int, float]:
        """When every rank here had each step."""
        n = len(self.rank_of)
        return {step: at for step, (count, at) in self.arrived.items() if count == n}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_nodes")
    parser.add_argument("--job", required=True)
    parser.add_argument("--first", type=int, required=True, help="the first node's number")
    parser.add_argument("--count", type=int, required=True, help="nodes in this process")
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def node_name(number: int) -> str:
    return f"n{number:04d}"


def main(argv: list[str] | None = None) -> None:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logs.setup("constructor", f"nodes{args.first}")
    # On a cluster every node has its own CPUs; here the simulated nodes share them with the
    # Planner and the loaders, and yield to them, so those run as they would on their own.
    os.nice(NICE)
    transport.context().set(zmq.MAX_SOCKETS, MAX_SOCKETS)  # before any socket exists
    install_counting()
    share_usage_reading()
    job = JobDir(args.job)
    transport.admit_only(transport.context(), job.keys())  # one authenticator, started here
    recipe = job.recipe()
    per = args.ranks_per_node
    nodes = {
        node_name(n): tuple(range(n * per, (n + 1) * per))
        for n in range(args.first, args.first + args.count)
    }
    errors: list[str] = []
    threads = [
        threading.Thread(
            target=serve, args=(job, recipe, node, ranks, errors), name=f"constructor-{node}"
        )
        for node, ranks in nodes.items()
    ]
    for thread in threads:
        thread.daemon = True
        thread.start()
    started = time.time()
    threading.current_thread().name = "ranks"  # what its messages are counted under
    write_now = threading.Event()
    signal.signal(WRITE_NOW, lambda *_: write_now.set())
    ranks = Ranks(job, nodes)
    ranks.run(alive=lambda: not write_now.is_set() and any(t.is_alive() for t in threads))
    deadline = time.monotonic() + STOP_WAIT_S
    for thread in threads:
        if write_now.is_set():
            break
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    result = {
        "pid": os.getpid(),
        "nodes": len(nodes),
        "ranks": len(ranks.rank_of),
        "started": started,
        "done_at": ranks.done_at(),
        "counts": counts_by_role(),
        "errors": errors + ranks.errors,
        "constructors_running": sum(t.is_alive() for t in threads),  # at the time of writing
    }
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.out)
    sys.stdout.flush()
    os._exit(0)  # the Constructors' sockets were never closed: do not wait on them


if __name__ == "__main__":
    main()
