"""What every role process shares: start-up, the Planner connection, failure reporting."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import zmq

from msd.control.planner_connection import planner_socket
from msd.jobdir import JobDir
from msd.wire import transport
from msd.wire.protocol import PROTOCOL_VERSION, Failure, Hello

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

# How long a role may drain once its launcher died (the SIGTERM of ``die_with_parent``) before
# the kernel ends it (SIGALRM's default action): no role outlives its launcher by more.
ORPHAN_EXIT_S = 5

# The identity a role reports its crash with: this prefix + its own (msd.roles.__main__).
FAILURE_PREFIX = b"failure/"


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its launcher dies, so no role outlives it."""
    parent = os.environ.get("MSD_LAUNCHER_PID")
    if parent is None or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if orphaned():  # the launcher died before prctl took effect
        os._exit(1)


class StopRequested(Exception):
    """Raised inside a role loop when SIGTERM/SIGINT arrive: drain and exit cleanly."""


def orphaned() -> bool:
    """Whether the launcher that started this role has died (the role was reparented)."""
    parent = os.environ.get("MSD_LAUNCHER_PID")
    return parent is not None and os.getppid() != int(parent)


def stop_on_signals() -> None:
    def handler(signum: int, frame: Any) -> None:
        if orphaned():  # nobody is left to wait for the drain: bound it
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(ORPHAN_EXIT_S)
        raise StopRequested(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def connect_planner(job: JobDir, name: str) -> zmq.Socket[Any]:
    return planner_socket(job, identity=name)


_SMAPS = "/proc/self/smaps_rollup"
STATS_EVERY_S = 1.0  # how often loaders and Constructors send the Planner their Stats


# Reading smaps_rollup walks every mapping of the process (milliseconds in a loader with
# pyarrow, Pillow and PyAV loaded): its PSS is read again at most this often.
PSS_EVERY_S = 5.0
_pss_read: list[float] = [-PSS_EVERY_S, 0.0]  # when it was last read, and what it was


def process_usage() -> tuple[float, int]:
    """CPU seconds this process has used, and its proportional set size in bytes as read at
    most ``PSS_EVERY_S`` ago (0 where ``/proc/self/smaps_rollup`` is not available)."""
    cpu = time.process_time()
    now = time.monotonic()
    if now - _pss_read[0] >= PSS_EVERY_S:
        _pss_read[:] = [now, float(_read_pss())]
    return cpu, int(_pss_read[1])


def _read_pss() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError), open(_SMAPS) as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def hello(role: str, name: str, **fields: Any) -> Hello:
    return Hello(role=role, name=name, version=PROTOCOL_VERSION, pid=os.getpid(), **fields)


def run_role(
    role: str, name: str, planner: Callable[[], zmq.Socket[Any] | None], body: Callable[[], None]
) -> int:
    """Run a role's loop; report a crash to the Planner as data, then exit non-zero."""
    try:
        body()
        return 0
    except StopRequested:
        return 0
    except Exception as exc:  # a role's failure must reach the Planner, whatever it is
        tb = traceback.format_exc()
        log.error("failed: %s\n%s", exc, tb.rstrip())
        sock = planner()
        if sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                transport.send(sock, Failure(role=role, name=name, error=str(exc), traceback=tb))
        return 1
