"""Socket set-up and the send/receive helpers every role uses. No role opens a socket elsewhere."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.auth.thread

from msd.wire.keys import JobKeys
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


def bind_host() -> tuple[str, str]:
    """The interface a role binds and the name it advertises: loopback locally; under SLURM
    all interfaces and the node's name (``MSD_BIND_HOST`` / ``MSD_ADVERTISE_HOST``)."""
    host = os.environ.get("MSD_BIND_HOST", "127.0.0.1")
    return host, os.environ.get("MSD_ADVERTISE_HOST", host)


def bind(
    ctx: zmq.Context[Any], kind: int, keys: JobKeys | None = None
) -> tuple[zmq.Socket[Any], str]:
    """A socket bound to a free port; returns it with the endpoint peers should connect to.

    With ``keys`` it is a CURVE server that admits only peers holding the job's client key
    (``admit_only`` must run first in this context).
    """
    host, advertised = bind_host()
    sock = _socket(ctx, kind, None)
    if keys is not None:
        sock.curve_secretkey = keys.server_secret
        sock.curve_publickey = keys.server_public
        sock.curve_server = True
    port = sock.bind_to_random_port(f"tcp://{host}")
    return sock, f"tcp://{advertised}:{port}"


def admit_only(ctx: zmq.Context[Any], keys: JobKeys) -> zmq.auth.thread.ThreadAuthenticator:
    """Start the context's authenticator: CURVE servers admit the job's client key only."""
    auth = zmq.auth.thread.ThreadAuthenticator(ctx, log=_QUIET)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_OneKey(keys.client_public))
    return auth


class _OneKey:
    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.allowed  # Z85, as pyzmq's authenticator passes it


class _QuietLog:
    def debug(self, *args: Any) -> None: ...

    def info(self, *args: Any) -> None: ...

    def warning(self, *args: Any) -> None: ...

    def error(self, *args: Any) -> None: ...


_QUIET: Any = _QuietLog()


def connect(
    ctx: zmq.Context[Any],
    kind: int,
    endpoint: str,
    identity: str | None = None,
    keys: JobKeys | None = None,
) -> zmq.Socket[Any]:
    """A socket connected to ``endpoint``; with ``keys``, as the job's CURVE client."""
    sock = _socket(ctx, kind, identity)
    if keys is not None:
        sock.curve_secretkey = keys.client_secret
        sock.curve_publickey = keys.client_public
        sock.curve_serverkey = keys.server_public
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
