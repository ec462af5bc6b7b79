"""What every role process shares: start-up, the Planner connection, failure reporting."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import zmq

from msd.jobdir import JobDir
from msd.wire import transport
from msd.wire.protocol import PROTOCOL_VERSION, Failure, Hello

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its launcher dies, so no role outlives it."""
    parent = os.environ.get("MSD_LAUNCHER_PID")
    if parent is None or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the launcher died before prctl took effect
        os._exit(1)


class StopRequested(Exception):
    """Raised inside a role loop when SIGTERM/SIGINT arrive: drain and exit cleanly."""


def stop_on_signals() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise StopRequested(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def connect_planner(job: JobDir, name: str) -> zmq.Socket[Any]:
    endpoint = job.wait_endpoint("planner")
    return transport.connect(transport.context(), zmq.DEALER, endpoint, identity=name)


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
        print(tb, file=sys.stderr, flush=True)
        sock = planner()
        if sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                transport.send(sock, Failure(role=role, name=name, error=str(exc), traceback=tb))
        return 1
