"""Socket set-up and the send/receive helpers every role uses. No role opens a socket elsewhere."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.auth.thread

from msd.errors import ProtocolError
from msd.wire.keys import JobKeys
from msd.wire.protocol import Message, decode, encode
from msd.wire.rejects import Rejects

LINGER_MS = 1000
# ZeroMQ's default is 1,023 sockets per context: a loader sending straight to a thousand
# Constructors (``constructor.fanout: null``) opens one each.
MAX_SOCKETS = 65536
# Connections a bound socket lets wait to be accepted (the kernel caps it at
# net.core.somaxconn). ZeroMQ's default of 100 drops the rest of a burst, such as hundreds of
# Constructors registering with the Planner at once, and each dropped one waits for TCP to try
# again: 1 s, then 3 s, 7 s ...
LISTEN_BACKLOG = 4096


def context() -> zmq.Context[Any]:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    if ctx.get(zmq.MAX_SOCKETS) < MAX_SOCKETS:
        ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)  # takes effect before the first socket only
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
    ctx: zmq.Context[Any],
    kind: int,
    keys: JobKeys,
    max_message_bytes: int = -1,
    queue_per_peer: int = 1000,
) -> tuple[zmq.Socket[Any], str]:
    """A socket bound to a free port; returns it with the endpoint peers should connect to.

    Every bound socket is a CURVE server that admits only peers holding the job's client key:
    a peer without ``JOB/job.key`` completes no handshake, so it can neither send nor receive
    a byte. ``max_message_bytes`` bounds one message from an admitted peer (ZeroMQ drops the
    connection of a peer that sends more); -1 for no bound. ``queue_per_peer`` bounds the
    messages queued from each peer (ZeroMQ reads no more from a peer whose queue is full, so
    one peer's flood waits in its own process and the others are still read in turn).
    """
    host, advertised = bind_host()
    sock = _server(ctx, kind, keys, max_message_bytes, queue_per_peer)
    port = sock.bind_to_random_port(f"tcp://{host}")
    return sock, f"tcp://{advertised}:{port}"


def bind_at(
    ctx: zmq.Context[Any], kind: int, keys: JobKeys, host: str, port: int, max_message_bytes: int
) -> zmq.Socket[Any]:
    """A socket bound to ``host:port`` (a port agreed on beforehand, e.g. ``MASTER_PORT``),
    admitting the job's peers only, like ``bind``."""
    sock = _server(ctx, kind, keys, max_message_bytes, queue_per_peer=1000)
    sock.bind(f"tcp://{host}:{port}")
    return sock


def _server(
    ctx: zmq.Context[Any], kind: int, keys: JobKeys, max_message_bytes: int, queue_per_peer: int
) -> zmq.Socket[Any]:
    admit_only(ctx, keys)
    sock = _socket(ctx, kind, None)
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True
    sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.RCVHWM, queue_per_peer)
    return sock


_AUTHENTICATORS: dict[int, zmq.auth.thread.ThreadAuthenticator] = {}
_AUTHENTICATORS_LOCK = threading.Lock()


def admit_only(ctx: zmq.Context[Any], keys: JobKeys) -> zmq.auth.thread.ThreadAuthenticator:
    """The context's authenticator (started once per context, whichever thread asks first):
    CURVE servers admit the job's client key only."""
    with _AUTHENTICATORS_LOCK:
        auth = _AUTHENTICATORS.get(id(ctx))
        if auth is not None and auth.is_alive():
            return auth
        auth = zmq.auth.thread.ThreadAuthenticator(ctx, log=_QUIET)
        auth.start()
        provider = _OneKey(keys.client_public)
        auth.configure_curve_callback(domain="*", credentials_provider=provider)
        _AUTHENTICATORS[id(ctx)] = auth
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
    """A socket connected to ``endpoint``, as the job's CURVE client (every msd server is a
    CURVE server; ``keys=None`` only to show that a keyless peer gets nothing)."""
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


def recv_or_drop(
    sock: zmq.Socket[Any], rejects: Rejects
) -> tuple[bytes | None, Message, list[memoryview]] | None:
    """Receive one message; None (counted as ``malformed``) when it cannot be decoded."""
    try:
        return recv(sock)
    except ProtocolError as exc:
        rejects.count("malformed", str(exc))
        return None
