"""What one connection costs to open: msd's CURVE handshake and ZAP check, against a plain one.

    python -m benchmarks.handshake [--connections 512,2048,4096] [--clients 4] [--rounds 2]

One server process binds a ROUTER with msd's own ``transport.bind`` (a CURVE server whose
authenticator thread admits the job's client key only, as every msd role's bound socket);
``--clients`` processes open the connections with ``transport.connect`` (as the job's CURVE
client), each socket sends one frame, and the server answers each. A point is done when every
socket has its answer. The same is run with CURVE but no authenticator (ZeroMQ then admits any
CURVE client: not what msd runs, only to tell the two costs apart) and with plain sockets: the
differences are what each part of the security costs per connection.

Measured per point: wall-clock seconds from the first connect to the last answer; the CPU time
(user + system, every thread: ZeroMQ's I/O thread and the authenticator included) the server
and the clients spent in that time. Rounds alternate the three. Writes
``benchmarks/results/handshake.json``; ``docs/scale.md`` reads it against the start-up phases
of ``benchmarks.scale``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from benchmarks.quickstart import machine
from msd.wire import transport
from msd.wire.keys import JobKeys, create_keys, load_keys

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "handshake.json"
HELLO, ANSWER = b"hello", b"answer"
TIMEOUT_S = 300.0


def cpu_s() -> float:
    """This process's CPU time so far, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


MODES = ("msd", "curve", "plain")  # CURVE + authenticator (msd's), CURVE only, neither


def server_socket(ctx: zmq.Context[Any], mode: str, keys: JobKeys | None) -> tuple[Any, str]:
    """The bound ROUTER: msd's own (``transport.bind``), or the same without the authenticator
    (ZeroMQ then admits any CURVE client), or without CURVE."""
    if mode == "msd":
        assert keys is not None
        return transport.bind(ctx, zmq.ROUTER, keys)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.BACKLOG, transport.LISTEN_BACKLOG)  # as msd's bound sockets
    if mode == "curve":
        assert keys is not None
        sock.curve_secretkey, sock.curve_publickey = keys.server_secret, keys.server_public
        sock.curve_server = True
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def serve(mode: str, keys: JobKeys | None, connections: int) -> dict[str, float]:
    """Bind, print the endpoint, answer ``connections`` peers once each; this side's figures."""
    sock, endpoint = server_socket(transport.context(), mode, keys)
    cpu_bound = cpu_s()  # idle from here until the clients connect
    print(endpoint, flush=True)
    for answered in range(connections):
        if not sock.poll(TIMEOUT_S * 1000):
            raise SystemExit(
                f"handshake server: {answered} of {connections} peers in {TIMEOUT_S} s"
            )
        identity, _ = sock.recv_multipart()
        sock.send_multipart([identity, ANSWER])
    return {"cpu_s": cpu_s() - cpu_bound}


def open_connections(keys: JobKeys | None, endpoint: str, count: int) -> dict[str, float]:
    """Open ``count`` sockets to ``endpoint``, each sends a hello; until each has its answer."""
    ctx = transport.context()
    poller = zmq.Poller()
    start_wall, start_cpu = time.monotonic(), cpu_s()
    sockets = []
    for _ in range(count):
        sock = transport.connect(ctx, zmq.DEALER, endpoint, keys=keys)
        sock.send(HELLO)
        poller.register(sock, zmq.POLLIN)
        sockets.append(sock)
    waiting = set(sockets)
    deadline = time.monotonic() + TIMEOUT_S
    while waiting:
        if time.monotonic() > deadline:
            raise SystemExit(f"handshake client: {len(waiting)} of {count} not answered")
        for sock, _ in poller.poll(1000):
            if sock.recv() == ANSWER and sock in waiting:
                waiting.discard(sock)
                poller.unregister(sock)
    return {
        "start": start_wall,
        "wall_s": time.monotonic() - start_wall,
        "cpu_s": cpu_s() - start_cpu,
    }


def point(connections: int, clients: int, mode: str, folder: Path) -> dict[str, Any]:
    """One server and ``clients`` processes opening ``connections`` in all."""
    key_file = folder / "job.key"
    if not key_file.exists():
        create_keys(key_file)
    keyed = str(key_file) if mode != "plain" else ""
    role = [sys.executable, "-m", "benchmarks.handshake", "--key", keyed, "--mode", mode]
    server = subprocess.Popen(
        [*role, "--serve", str(connections)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert server.stdout is not None
    endpoint = server.stdout.readline().strip()
    shares = [connections // clients + (k < connections % clients) for k in range(clients)]
    procs = [
        subprocess.Popen(
            [*role, "--connect", endpoint, "--count", str(n)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for n in shares
    ]
    reports = [json.loads(p.communicate(timeout=TIMEOUT_S)[0]) for p in procs]
    served = json.loads(server.communicate(timeout=TIMEOUT_S)[0].splitlines()[-1])
    if server.returncode or any(p.returncode for p in procs):
        raise SystemExit("handshake: a process failed")
    begin = min(r["start"] for r in reports)
    end = max(r["start"] + r["wall_s"] for r in reports)
    client_cpu = sum(r["cpu_s"] for r in reports)
    return {
        "connections": connections,
        "clients": clients,
        "mode": mode,
        "wall_s": end - begin,
        "server_cpu_s": served["cpu_s"],
        "clients_cpu_s": client_cpu,
        "server_cpu_ms_per_connection": 1e3 * served["cpu_s"] / connections,
        "clients_cpu_ms_per_connection": 1e3 * client_cpu / connections,
    }


FIGURES = ("wall_s", "server_cpu_ms_per_connection", "clients_cpu_ms_per_connection")


def per_connection(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each number of connections and mode: the median of each figure over the rounds."""
    out = []
    for n in sorted({p["connections"] for p in points}):
        row: dict[str, Any] = {"connections": n}
        for mode in MODES:
            mine = [p for p in points if p["connections"] == n and p["mode"] == mode]
            for key in FIGURES:
                row[f"{mode}_{key}"] = statistics.median(p[key] for p in mine) if mine else None
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    def cells(row: dict[str, Any], key: str, fmt: str) -> str:
        return " / ".join(
            "-" if row[f"{m}_{key}"] is None else format(row[f"{m}_{key}"], fmt) for m in MODES
        )

    lines = [
        "Each cell: msd (CURVE and its authenticator) / CURVE alone / plain.",
        "",
        "| connections | wall s | server CPU ms a connection | clients CPU ms a connection |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['connections']:,} | {cells(r, 'wall_s', '.2f')} "
            f"| {cells(r, 'server_cpu_ms_per_connection', '.3f')} "
            f"| {cells(r, 'clients_cpu_ms_per_connection', '.3f')} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--connections", default="512,2048,4096")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--key", default=None, help=argparse.SUPPRESS)  # the roles below
    p.add_argument("--mode", choices=MODES, default="msd", help=argparse.SUPPRESS)
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--connect", default="", help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.key is not None:  # one of a point's processes
        keys = load_keys(Path(args.key)) if args.key else None
        report = (
            serve(args.mode, keys, args.serve)
            if args.serve
            else open_connections(keys, args.connect, args.count)
        )
        print(json.dumps(report), flush=True)
        return
    counts = [int(n) for n in args.connections.split(",")]
    points = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for n in counts:
                for mode in MODES:
                    points.append(point(n, args.clients, mode, Path(folder)))
                    print(json.dumps(points[-1]), flush=True)
    rows = per_connection(points)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine(), "points": points, "per_connection": rows}, indent=1)
        + "\n"
    )
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
