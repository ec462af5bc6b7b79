"""A port for the trainers' rendezvous (``MASTER_PORT``)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now for the trainers' rendezvous (MASTER_PORT), chosen below the kernel's
    ephemeral range: a port the kernel hands out (to a connection's local end, or to a bind
    to port 0) cannot take it between now and rank 0's bind."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(64):
        port = rng.randrange(max(1024, low - 12000), low) if low > 2048 else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
