"""The one way to reach a job's Planner: a CURVE-authenticated DEALER socket.

Roles, launchers and commands all connect through ``planner_socket``; a command's request and
its reply go through ``request``, which turns silence into a clear error.
"""

from __future__ import annotations

from typing import Any

import zmq

from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.wire import transport
from msd.wire.protocol import Message, Refused


def planner_socket(
    job: JobDir, identity: str | None = None, timeout_s: float = 60.0
) -> zmq.Socket[Any]:
    """A socket to the job's Planner, authenticated with the job's key."""
    keys = job.keys()
    endpoint = job.wait_endpoint("planner", timeout_s=timeout_s)
    return transport.connect(transport.context(), zmq.DEALER, endpoint, identity, keys=keys)


def request(job: JobDir, msg: Message, reply_type: type[Any], timeout_s: float = 5.0) -> Any:
    """Send one control request to the job's Planner and return its reply of ``reply_type``.

    A ``Refused`` reply becomes a LaunchError carrying the Planner's reason.
    """
    if not job.endpoint_file("planner").exists():
        raise LaunchError(f"{job.root} has no running planner (no endpoints/planner)")
    sock = planner_socket(job, timeout_s=1.0)
    try:
        transport.send(sock, msg)
        if not sock.poll(int(timeout_s * 1000)):
            raise LaunchError(
                f"the planner of {job.root.name} did not answer within {timeout_s:.0f} s "
                "(the job has ended, or its planner is not reachable from here)"
            )
        reply = transport.recv(sock)[1]
    finally:
        sock.close(linger=0)
    if isinstance(reply, Refused):
        raise LaunchError(reply.reason)
    if not isinstance(reply, reply_type):
        raise LaunchError(f"the planner answered with a {type(reply).__name__}")
    return reply
