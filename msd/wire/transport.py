"""Socket set-up and the send/receive helpers every role uses. No role opens a socket elsewhere."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import zmq

from msd.wire.protocol import Message, decode, encode

LINGER_MS = 1000


def context() -> zmq.Context[Any]:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    return ctx


def _socket(ctx: zmq.Context[Any], kind: int, identity: str | None) -> zmq.Socket[Any]:
    sock: zmq.Socket[Any] = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    # The Planner bounds what is in flight (prefetch_steps); a socket-level bound would only
    # turn back-pressure into a blocked role loop.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    return sock


def bind(ctx: zmq.Context[Any], kind: int) -> tuple[zmq.Socket[Any], str]:
    """A socket bound to a free port; returns it with the endpoint peers should connect to.

    Locally everything stays on loopback; under SLURM a role binds on all interfaces and
    advertises its node's name (``MSD_BIND_HOST`` / ``MSD_ADVERTISE_HOST``).
    """
    host = os.environ.get("MSD_BIND_HOST", "127.0.0.1")
    advertised = os.environ.get("MSD_ADVERTISE_HOST", host)
    sock = _socket(ctx, kind, None)
    port = sock.bind_to_random_port(f"tcp://{host}")
    return sock, f"tcp://{advertised}:{port}"


def connect(
    ctx: zmq.Context[Any], kind: int, endpoint: str, identity: str | None = None
) -> zmq.Socket[Any]:
    sock = _socket(ctx, kind, identity)
    sock.connect(endpoint)
    return sock


def send(
    sock: zmq.Socket[Any], msg: Message, buffers: Sequence[Any] = (), to: bytes | None = None
) -> None:
    """Send one message; ``to`` is the peer identity on a ROUTER socket."""
    frames = encode(msg, buffers)
    if to is not None:
        frames.insert(0, to)
    sock.send_multipart(frames, copy=len(buffers) == 0)


def recv(sock: zmq.Socket[Any]) -> tuple[bytes | None, Message, list[memoryview]]:
    """Receive one message; the identity is set for ROUTER sockets, None otherwise."""
    frames = sock.recv_multipart(copy=False)
    if sock.type == zmq.ROUTER:
        identity = bytes(frames[0].buffer)
        msg, buffers = decode(frames[1:])
        return identity, msg, buffers
    msg, buffers = decode(frames)
    return None, msg, buffers
