"""A loader's payload sockets over real ZeroMQ: with a fan-out, the connections it opens do not
grow with the number of nodes (counted in ``/proc/net/tcp``); without one, one per node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from msd.jobdir import JobDir
from msd.roles.outlets import Outlets
from msd.wire import transport
from msd.wire.keys import JobKeys, create_keys
from msd.wire.protocol import ConstructorInfo, Payload, Welcome

FANOUT = 4


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> JobKeys:
    job = JobDir(tmp_path_factory.mktemp("outlets") / "job")
    job.root.mkdir()
    create_keys(job.key_file)
    return job.keys()


@pytest.fixture
def server_ctx(keys: JobKeys) -> Iterator[zmq.Context[Any]]:
    """The Constructors' side: a context of their own (its authenticator admits ``keys``)."""
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    transport.admit_only(ctx, keys).stop()
    ctx.term()


def _established_to(ports: set[int]) -> int:
    """TCP connections of this machine in state ESTABLISHED whose remote port is one of
    ``ports`` (the client ends of connections to those servers)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port, state = int(fields[2].split(":")[1], 16), fields[3]
            count += state == "01" and remote_port in ports
    return count


def _route_to_every_node(
    nodes: int, fanout: int | None, keys: JobKeys, ctx: zmq.Context[Any]
) -> tuple[int, int, dict[int, int]]:
    """A loader's Outlets sending one sample to each of ``nodes`` Constructors: its sockets,
    its connections counted on the machine, and samples received per Constructor."""
    servers = [transport.bind(ctx, zmq.PULL, keys) for _ in range(nodes)]
    infos = tuple(ConstructorInfo(f"n{i}", endpoint) for i, (_, endpoint) in enumerate(servers))
    out = Outlets(keys, fanout)
    out.welcome(Welcome(constructors=infos))
    entries = [(0, gpos, dest) for gpos, dest in enumerate(range(nodes))]
    for hop, group in out.tree.by_entry(entries).items():
        msg = Payload(
            step=0,
            source=(0,) * len(group),
            gpos=tuple(e[1] for e in group),
            lengths=(1,) * len(group),
            token_dtype="uint8",
            to=tuple(e[2] for e in group),
        )
        out.send(hop, msg, [np.zeros(len(group), np.uint8)])
    received: dict[int, int] = {}
    poller = zmq.Poller()
    for sock, _ in servers:
        poller.register(sock, zmq.POLLIN)
    sent = len(out.sockets)  # one payload to each Constructor sent to
    while sum(received.values()) < sent and (ready := dict(poller.poll(10_000))):
        for index, (sock, _) in enumerate(servers):
            if sock in ready:
                sock.recv_multipart()
                received[index] = received.get(index, 0) + 1
    ports = {int(endpoint.rsplit(":", 1)[1]) for _, endpoint in servers}
    counted = _established_to(ports)
    sockets = len(out.sockets)
    out.close()
    for sock, _ in servers:
        sock.close(linger=0)
    return sockets, counted, received


@pytest.mark.parametrize("nodes", [8, 32, 96])
def test_with_a_fanout_a_loaders_connections_do_not_grow_with_the_nodes(
    nodes: int, keys: JobKeys, server_ctx: zmq.Context[Any]
) -> None:
    sockets, connections, received = _route_to_every_node(nodes, FANOUT, keys, server_ctx)
    assert sockets == FANOUT and connections == FANOUT
    assert set(received) == set(range(FANOUT))  # only the roots hear from the loader


def test_without_a_fanout_a_loader_connects_to_every_node(
    keys: JobKeys, server_ctx: zmq.Context[Any]
) -> None:
    sockets, connections, received = _route_to_every_node(32, None, keys, server_ctx)
    assert sockets == connections == 32 and set(received) == set(range(32))
