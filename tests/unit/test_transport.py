"""msd's bound sockets: a burst of connections is queued for accepting, not dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

from msd.wire import transport
from msd.wire.keys import create_keys

BURST = 300  # more than ZeroMQ's default listen backlog of 100


def test_a_burst_of_key_holders_is_queued_and_each_is_answered(tmp_path: Path) -> None:
    keys = create_keys(tmp_path / "job.key")
    # a context of its own: a context's authenticator admits the first job's key it was given
    ctx: zmq.Context[Any] = zmq.Context()
    server, endpoint = transport.bind(ctx, zmq.ROUTER, keys)
    # the kernel takes the smaller of this and net.core.somaxconn
    assert server.getsockopt(zmq.BACKLOG) >= 1024
    clients = [transport.connect(ctx, zmq.DEALER, endpoint, keys=keys) for _ in range(BURST)]
    try:
        for client in clients:
            client.send(b"hello")
        seen = set()
        while len(seen) < BURST:
            assert server.poll(30_000), f"{len(seen)} of {BURST} hellos arrived"
            identity, hello = server.recv_multipart()
            assert hello == b"hello"
            seen.add(identity)
            server.send_multipart([identity, b"answer"])
        assert all(client.poll(30_000) and client.recv() == b"answer" for client in clients)
    finally:
        for sock in (*clients, server):
            sock.close(linger=0)
        transport.admit_only(ctx, keys).stop()
        ctx.term()
