"""Sampling a run's processes every ~0.5 s: PSS and CPU time of the data plane, PSS of the ranks.

A ``discover`` callable says which processes are the data plane (DataLoader workers; or
Planner, loaders, Constructor) and which are trainer ranks, at each sample, since workers and
roles come and go; ``kind_of``, if given, names each data process's kind (``loader``, ...), and
a sample then holds CPU and PSS by kind too. CPU time is kept per process as last seen, so a
process that exits between samples keeps what it used. Nothing here imports torch: the sampling
process stays small.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

Discover = Callable[[], tuple[list[psutil.Process], list[psutil.Process]]]
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


@dataclass(frozen=True)
class Sample:
    """One sample: when, the data plane's summed PSS and CPU seconds, each rank's PSS by pid."""

    time: float
    data_pss: int
    data_cpu_s: float
    data_processes: int
    rank_pss: dict[int, int]
    cpu_by_kind: dict[str, float] = field(default_factory=dict)
    pss_by_kind: dict[str, int] = field(default_factory=dict)
    count_by_kind: dict[str, int] = field(default_factory=dict)


@dataclass
class ProcessSampler:
    """Samples ``discover()``'s processes on a thread until ``stop``."""

    discover: Discover
    interval_s: float = 0.5
    kind_of: Callable[[psutil.Process], str] | None = None
    samples: list[Sample] = field(default_factory=list)
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    kind_by_pid: dict[int, str] = field(default_factory=dict)
    _done: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._done.wait(self.interval_s):
            with contextlib.suppress(*_GONE):
                self.samples.append(self.sample())

    def sample(self) -> Sample:
        data, ranks = self.discover()
        data_pss = 0
        pss_by_kind: dict[str, int] = {}
        count_by_kind: dict[str, int] = {}
        for proc in data:
            with contextlib.suppress(*_GONE):
                info = proc.memory_full_info()
                cpu = proc.cpu_times()
                data_pss += info.pss
                self.cpu_by_pid[proc.pid] = cpu.user + cpu.system
                if self.kind_of is not None:
                    kind = self.kind_by_pid.setdefault(proc.pid, self.kind_of(proc))
                    pss_by_kind[kind] = pss_by_kind.get(kind, 0) + info.pss
                    count_by_kind[kind] = count_by_kind.get(kind, 0) + 1
        rank_pss = {}
        for proc in ranks:
            with contextlib.suppress(*_GONE):
                rank_pss[proc.pid] = proc.memory_full_info().pss
        total_cpu = sum(self.cpu_by_pid.values())
        cpu_by_kind: dict[str, float] = {}
        for pid, kind in self.kind_by_pid.items():
            cpu_by_kind[kind] = cpu_by_kind.get(kind, 0.0) + self.cpu_by_pid.get(pid, 0.0)
        return Sample(
            time.time(),
            data_pss,
            total_cpu,
            len(data),
            rank_pss,
            cpu_by_kind,
            pss_by_kind,
            count_by_kind,
        )


def children_of(pids: list[int]) -> list[psutil.Process]:
    """Every live descendant of ``pids``."""
    found = []
    for pid in pids:
        with contextlib.suppress(*_GONE):
            found += psutil.Process(pid).children(recursive=True)
    return found


def command_kind(proc: psutil.Process, kinds: dict[str, str], cache: dict[int, str]) -> str | None:
    """The kind whose marker appears in ``proc``'s command line (``kinds``: marker -> kind),
    cached by pid; None while the process has not exec'd its command yet (or is gone)."""
    if proc.pid not in cache:
        try:
            command = " ".join(proc.cmdline())
        except _GONE:
            return None
        kind = next((k for marker, k in kinds.items() if marker in command), None)
        if kind is None:
            return None
        cache[proc.pid] = kind
    return cache[proc.pid]
