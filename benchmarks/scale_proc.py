"""What ``benchmarks.scale`` reads about processes and how it sums them up: TCP connections,
memory and I/O from ``/proc``, and the figures of a run from what its simulated ranks recorded.

Plain functions over files and numbers, no sockets: ``tests/unit/test_bench_scale.py`` runs them.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ESTABLISHED = "01"
LISTEN = "0A"
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


@dataclass(frozen=True)
class Conn:
    """One TCP socket: its local and remote ports, and its state (``/proc/net/tcp``'s hex)."""

    local_port: int
    remote_port: int
    state: str


def tcp_table(paths: Iterable[str] = TCP_TABLES) -> dict[int, Conn]:
    """Every TCP socket of this network namespace, by inode."""
    table: dict[int, Conn] = {}
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            table[inode] = Conn(_port(local), _port(remote), state)
    return table


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open (empty once it has ended)."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def sockets(pid: int, table: Mapping[int, Conn]) -> list[Conn]:
    """The TCP sockets process ``pid`` holds, in any state."""
    found = (table.get(inode) for inode in socket_inodes(pid))
    return [c for c in found if c is not None]


def established(conns: Iterable[Conn]) -> list[Conn]:
    """The open connections among ``conns`` (listening sockets left out)."""
    return [c for c in conns if c.state == ESTABLISHED]


def inbound(conns: Iterable[Conn]) -> int:
    """How many of the open connections among ``conns`` peers opened to one of the process's
    own listening ports (a bound ZeroMQ socket's)."""
    listed = list(conns)
    ports = {c.local_port for c in listed if c.state == LISTEN}
    return sum(c.local_port in ports for c in established(listed))


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` (0 if it cannot be read)."""
    return _kib_field(f"/proc/{pid}/smaps_rollup", "Pss:")


def rss_bytes(pid: int) -> int:
    return _kib_field(f"/proc/{pid}/status", "VmRSS:")


def _kib_field(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- a run's figures --------------------------------------------------------------------------
def step_done_at(per_worker: Iterable[Mapping[int, float]]) -> dict[int, float]:
    """When every rank had each step: the latest of the workers' times, for the steps every
    worker reported (a step only some workers reached is not done)."""
    workers = list(per_worker)
    if not workers:
        return {}
    common = set.intersection(*(set(w) for w in workers))
    return {s: max(w[s] for w in workers) for s in sorted(common)}


def steps_per_s(done_at: Mapping[int, float], warmup: int) -> float:
    """Steps per second from the end of step ``warmup - 1`` to the last step done (start-up and
    the first steps left out); 0.0 when fewer than two steps are past the warm-up."""
    steps = sorted(s for s in done_at if s >= warmup - 1)
    if len(steps) < 2:
        return 0.0
    first, last = steps[0], steps[-1]
    elapsed = done_at[last] - done_at[first]
    return (last - first) / elapsed if elapsed > 0 else 0.0


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; 0.0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    if len(ordered) == 1:
        return ordered[0]
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def step_gaps_ms(done_at: Mapping[int, float], warmup: int) -> list[float]:
    """The time between consecutive steps done, in ms, from the warm-up on."""
    steps = sorted(s for s in done_at if s >= warmup - 1)
    return [1000 * (done_at[b] - done_at[a]) for a, b in itertools.pairwise(steps)]


def add_counts(
    total: dict[str, dict[str, list[int]]], more: Mapping[str, Mapping[str, list[int]]]
) -> None:
    """Add ``more``'s message counts (role → ``dir:kind`` → [messages, bytes]) into ``total``."""
    for role, kinds in more.items():
        mine = total.setdefault(role, {})
        for kind, (n, size) in kinds.items():
            old = mine.setdefault(kind, [0, 0])
            old[0] += n
            old[1] += size


def per_step(counts: Mapping[str, list[int]], steps: int) -> dict[str, dict[str, float]]:
    """Messages and bytes per step of each ``dir:kind``."""
    steps = max(1, steps)
    return {k: {"messages": n / steps, "bytes": size / steps} for k, (n, size) in counts.items()}


def median_or_zero(values: Iterable[float]) -> float:
    listed = list(values)
    return statistics.median(listed) if listed else 0.0


# -- start-up ---------------------------------------------------------------------------------
def log_time(line: str) -> float | None:
    """The wall time of one of msd's log lines (``logs.FORMAT``: local time, milliseconds)."""
    try:
        stamp, millis = line[:23].split(",")
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
    except ValueError:
        return None


def logged(paths: Iterable[Path], marker: str, latest: bool = True) -> float | None:
    """The latest (else the earliest) time a line holding ``marker`` was logged in any of
    these files (a file that is not there: none)."""
    times = []
    for path in paths:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        times += [t for line in lines if marker in line and (t := log_time(line)) is not None]
    return (max if latest else min)(times, default=None)


def startup_phases(
    started: float,
    planner_up: float | None,
    logs: Path,
    nodes_started: Iterable[float],
    first_step: float | None,
) -> dict[str, float | None]:
    """Seconds from a point's start (wall times) to: the Planner's endpoint published; the last
    loader ready (its sources open); the last nodes process running its Constructors (its
    imports done); the Planner holding every role's Hello (it logs the loaders and
    Constructors it starts with); the first step at every simulated rank."""

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - started, 2)

    return {
        "planner_up": since(planner_up),
        "loaders_ready": since(logged(logs.glob("loader-*.log"), ") ready in ")),
        "nodes_up": since(max(nodes_started, default=None)),
        "registered": since(logged([logs / "planner-planner.log"], " constructors", False)),
        "first_step": since(first_step),
    }
