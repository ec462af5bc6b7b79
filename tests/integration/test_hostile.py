"""Peers that are not the job's own, on every socket a running job listens on.

A peer without the job's key completes no handshake with any of them: it gets no byte and
changes nothing. A peer with the key that sends garbage (random bytes, mangled headers,
impossible fields, payloads for positions nobody planned, requests for ranks or steps that do
not exist) has it dropped and counted. A flood of unplanned payloads keeps the Constructor's
memory bounded. In every case each rank's batches stay byte-identical to an undisturbed run.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import yaml
import zmq
from zmq.utils.monitor import recv_monitor_message

from msd.control.planner_connection import request
from msd.errors import LaunchError, ProtocolError
from msd.jobdir import JobDir
from msd.wire import transport
from msd.wire.keys import JobKeys, create_keys
from msd.wire.protocol import (
    CutAt,
    Failure,
    Get,
    Hello,
    Meta,
    Payload,
    Progress,
    Stats,
    Status,
    StatusRequest,
    Want,
    decode,
    encode,
)
from tests.conftest import (
    Launcher,
    LaunchFailed,
    base_recipe,
    processes_of_launcher,
    read_rank_logs,
    start_launch,
    wait_for_file,
)

STEPS = 120
FAR = 10**9  # a position no source has: a payload for it was routed by nobody


def recipe(data: Path, step_ms: int = 40) -> dict[str, Any]:
    """The trainer's pace changes no batch: a slower one only keeps the job running longer."""
    doc = base_recipe(data, steps=STEPS)
    doc["trainer"]["demo"]["step_ms"] = step_ms
    for s in doc["sources"]:
        s["repeat"] = True
    return doc


def digests(job: Path) -> dict[tuple[int, int], str]:
    return {(rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(job).items() for r in rs}


def finish(launcher: Launcher, timeout_s: float = 180) -> Path:
    """Wait for the launcher; the job folder once it exited 0."""
    _, err = launcher.communicate(timeout=timeout_s)
    if launcher.returncode != 0:
        raise LaunchFailed(f"the launcher failed: {err.strip()[-500:]}", launcher)
    (job,) = launcher_cwd(launcher).glob("runs/*")
    return job


_CWD: dict[int, Path] = {}


def launcher_cwd(launcher: Launcher) -> Path:
    return _CWD[launcher.pid]


def launch(cwd: Path, data: Path, step_ms: int = 40) -> Launcher:
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "r.yaml").write_text(yaml.safe_dump(recipe(data, step_ms), sort_keys=False))
    launcher = start_launch(cwd, "r.yaml")
    _CWD[launcher.pid] = cwd
    return launcher


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> dict:
    job = finish(launch(tmp_path_factory.mktemp("reference"), small_data))
    found = digests(job)
    assert len(found) == 4 * STEPS
    return found


def running(launcher: Launcher, steps: int = 5) -> JobDir:
    """The job folder once rank 0 has taken ``steps`` steps."""
    log = wait_for_file(launcher_cwd(launcher), "runs/*/trainer/rank-0.jsonl", launcher, steps)
    return JobDir(log.parent.parent)


def step_now(job: JobDir) -> int:
    return len(read_rank_logs(job.root).get(0, []))


def listening(launcher: Launcher) -> dict[str, list[int]]:
    """Every TCP port each data role of the job listens on, by role."""
    ports: dict[str, list[int]] = {}
    for proc in processes_of_launcher(launcher.pid):
        with suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            argv = proc.cmdline()
            if "msd.roles" not in argv:
                continue
            role = argv[argv.index("msd.roles") + 1]
            for conn in proc.net_connections("tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    ports.setdefault(role, []).append(conn.laddr.port)
    return ports


def _port(job: JobDir, name: str) -> int:
    published = job.read_endpoint(name)
    assert published is not None, f"nothing published as {name}"
    return int(published.address.rsplit(":", 1)[1].split("/")[0])  # tcp://h:p or http://h:p/m


def data_ports(launcher: Launcher, job: JobDir) -> dict[str, list[int]]:
    """The ZeroMQ ports of the job's roles: every port they listen on but the Planner's
    Prometheus endpoint (HTTP, read-only figures; docs/security.md)."""
    ports = listening(launcher)
    metrics = _port(job, "metrics")
    assert sorted(ports) == ["constructor", "planner"] and len(ports["constructor"]) == 2
    assert sorted(ports["planner"]) == sorted([_port(job, "planner"), metrics])
    return {"planner": [_port(job, "planner")], "constructor": ports["constructor"]}


def role_pid(launcher: Launcher, role: str) -> int:
    for proc in processes_of_launcher(launcher.pid):
        with suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            argv = proc.cmdline()
            if "msd.roles" in argv and argv[argv.index("msd.roles") + 1] == role:
                return proc.pid
    raise AssertionError(f"no {role} process")


# -- a peer without the key ----------------------------------------------------------------------
def stranger_frames(step: int) -> list[list[bytes]]:
    rng = random.Random(7)
    return [
        encode(Get(rank=0, step=step, consumed=step)),
        encode(Get(rank=1, step=step + 2, consumed=step + 2)),
        encode(Payload(step=step + 2, source=(0,), gpos=(0,), lengths=(4,)), [b"\x07" * 16]),
        encode(StatusRequest()),
        [rng.randbytes(64)],
    ]


def handshake_events(sock: zmq.Socket[Any], wait_s: float) -> set[int]:
    """The ZeroMQ connection events a socket's monitor saw within ``wait_s``."""
    monitor = sock.get_monitor_socket()
    seen: set[int] = set()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if monitor.poll(50):
            seen.add(recv_monitor_message(monitor)["event"])
    sock.disable_monitor()
    monitor.close(linger=0)
    return seen


def test_a_peer_without_the_key_gets_nothing_from_any_socket_and_changes_nothing(
    tmp_path: Path, small_data: Path, reference: dict
) -> None:
    launcher = launch(tmp_path, small_data)
    job = running(launcher)
    ports = data_ports(launcher, job)
    ctx = zmq.Context()
    wrong_keys = create_keys(tmp_path / "other.key")
    step = step_now(job)
    answered, handshakes = [], []
    for port in [p for role in sorted(ports) for p in ports[role]]:
        endpoint = f"tcp://127.0.0.1:{port}"
        for kind, keys in ((zmq.DEALER, None), (zmq.DEALER, wrong_keys), (zmq.PUSH, None)):
            sock = transport.connect(ctx, kind, endpoint, keys=keys)
            for frames in stranger_frames(step):
                with suppress(zmq.Again):
                    sock.send_multipart(frames, flags=zmq.NOBLOCK)
            handshakes.append(handshake_events(sock, 0.5))
            answered.append(kind == zmq.DEALER and bool(sock.poll(500)))
            sock.close(linger=0)
    ctx.term()
    job_root = finish(launcher)
    assert not any(answered)  # not a byte came back
    assert all(zmq.EVENT_HANDSHAKE_SUCCEEDED not in seen for seen in handshakes)
    assert any(
        seen
        & {
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.EVENT_HANDSHAKE_FAILED_AUTH,
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
        }
        for seen in handshakes
    )
    assert digests(job_root) == reference


# -- a key holder sending garbage ----------------------------------------------------------------
# What a mangled frame must never decode to for this test: a message a key holder may send on
# purpose (a rank's real request, a plausible payload, a registration, a control request).
def _harmless(frames: list[bytes]) -> bool:
    try:
        msg, _ = decode(frames)
    except ProtocolError:
        return True
    if isinstance(msg, Payload):
        return all(g >= FAR for g in msg.gpos) or msg.step > 10**6
    if isinstance(msg, Get):
        return not 0 <= msg.rank < 4 or msg.step > 10**6
    return isinstance(msg, (Meta, Progress, Stats, Want, CutAt, Failure))


def _mangled(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    header = bytearray(frames[0])
    for _ in range(rng.randint(1, 3)):
        header[rng.randrange(len(header))] ^= rng.randint(1, 255)
    cut = rng.randint(0, max(0, len(header) - 1))
    header = header[: len(header) - cut] if rng.random() < 0.3 else header
    return [bytes(header), *frames[1:]]


def garbage(rng: random.Random, valid: list[list[bytes]], n: int) -> Iterator[list[bytes]]:
    """``n`` messages: random bytes, mangled valid ones, and the ``valid`` ones themselves
    (each impossible for this job), never one that ``_harmless`` rejects."""
    made = 0
    while made < n:
        choice = rng.random()
        if choice < 0.3:
            frames = [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 3))]
        elif choice < 0.7:
            frames = _mangled(rng, rng.choice(valid))
        else:
            frames = rng.choice(valid)
        if frames and _harmless(frames):
            made += 1
            yield frames


def payload(step: int, gpos: tuple[int, ...], lengths: tuple[int, ...], source: int = 0) -> Any:
    tokens = np.arange(sum(lengths), dtype=np.int32).tobytes()
    return encode(
        Payload(step=step, source=(source,) * len(gpos), gpos=gpos, lengths=lengths), [tokens]
    )


def to_constructor_payloads(step: int) -> list[list[bytes]]:
    return [
        payload(step + 2, (FAR, FAR + 1), (5, 3)),  # positions nobody planned
        payload(step + 6, (FAR + 2,), (7,)),  # a step not planned yet: held, then dropped
        payload(10**9, (FAR,), (2,)),  # a step that will never be built
        payload(step + 2, (FAR,), (2,), source=7),  # a source the job does not have
        [encode(Payload(step=step + 2, source=(0,), gpos=(FAR,), lengths=(9,)))[0], b"\x00" * 8],
        encode(Get(rank=99, step=1, consumed=0)),  # a request on the payload socket
    ]


def to_constructor_clients(step: int) -> list[list[bytes]]:
    return [
        encode(Get(rank=99, step=step, consumed=step)),  # a rank it does not serve
        encode(Get(rank=-1, step=step, consumed=step)),
        encode(Get(rank=2, step=10**12, consumed=0)),  # a step that will never be built
        encode(Get(rank=2, step=10**7, consumed=10**7 + 5)),  # consumed beyond the step
        payload(step, (FAR,), (3,)),  # a payload on the trainer socket
    ]


def to_planner(step: int) -> list[list[bytes]]:
    return [
        encode(Meta(source=0, gpos_start=FAR, lengths=(5,), sample_ids=(1,))),  # unregistered
        encode(Meta(source=9, gpos_start=0, lengths=(5, 1), sample_ids=(1,))),
        encode(Progress(consumed=step + 50)),  # not a constructor
        encode(Stats("loader", "web/0", "n", 1, 0.0, 0)),
        encode(Want(source=0, gpos=FAR)),  # a kind the planner never receives
        encode(CutAt(source=0, visit=3)),
        encode(Failure(role="loader", name="web/0", error="forged", traceback="")),
        encode(Hello(role="trainer", name="x", version=4, pid=1)),
    ]


def rejected(view: Any) -> tuple[int, int]:
    """Messages the Planner and the Constructors dropped, by the job's own count."""
    return sum(view.planner.rejected.values()), sum(
        sum(c.rejected.values()) for c in view.constructors
    )


def test_garbage_from_a_key_holder_is_dropped_counted_and_changes_nothing(
    tmp_path: Path, small_data: Path, reference: dict
) -> None:
    launcher = launch(tmp_path, small_data)
    job = running(launcher)
    with trainers_paused(launcher):  # the job cannot end while it is checked
        ports = data_ports(launcher, job)
        keys = job.keys()
        step = step_now(job)
        rng = random.Random(20261201)
        ctx = zmq.Context()
        (planner_port,) = ports["planner"]
        sent = 0
        for port in ports["constructor"] + [planner_port]:
            endpoint = f"tcp://127.0.0.1:{port}"
            payloads = port != planner_port and _is_payload_port(job, port)
            # the kind the port takes is connected once its handshake succeeded; the other
            # kind is refused in the handshake
            dealer = (transport.connect if payloads else handshaken)(
                ctx, zmq.DEALER, endpoint, keys=keys
            )
            pusher = (handshaken if payloads else transport.connect)(
                ctx, zmq.PUSH, endpoint, keys=keys
            )
            valid = (
                to_planner(step)
                if port == planner_port
                else (to_constructor_payloads(step) + to_constructor_clients(step))
            )
            for frames in garbage(rng, valid, 150):
                sock = pusher if rng.random() < 0.5 else dealer
                sock.send_multipart(frames)
                sent += 1
            time.sleep(0.2)
            for sock in (dealer, pusher):
                sock.close(linger=10_000)
        ctx.term()
        counts = wait_for(
            lambda: rejected(request(job, StatusRequest(), Status).view),
            lambda c: c[0] > 0 and c[1] > 0,
            launcher,
            timeout_s=30,
        )
    job_root = finish(launcher)
    assert sent == 450
    assert counts[0] > 0 and counts[1] > 0  # both counted what they dropped
    logs = "\n".join(p.read_text() for p in (job_root / "logs").glob("*"))
    assert "dropped a message (malformed" in logs
    assert digests(job_root) == reference


@contextmanager
def trainers_paused(launcher: Launcher) -> Iterator[None]:
    """The job's trainer ranks stopped (SIGSTOP) meanwhile: the data plane runs on, a step or
    two ahead, and waits for them."""
    trainers = [p for p in processes_of_launcher(launcher.pid) if _is_trainer(p)]
    assert trainers
    for p in trainers:
        p.suspend()
    try:
        yield
    finally:
        for p in trainers:
            with suppress(psutil.NoSuchProcess):
                p.resume()


def _is_trainer(proc: psutil.Process) -> bool:
    with suppress(psutil.NoSuchProcess):
        return "msd.trainer.demo" in " ".join(proc.cmdline())
    return False


def handshaken(
    ctx: zmq.Context[Any], kind: int, endpoint: str, keys: JobKeys, timeout_s: float = 30
) -> zmq.Socket[Any]:
    """A socket of ``kind`` connected to ``endpoint`` as the job's CURVE client, returned once
    its handshake succeeded (what it sends is then read). Its monitor is attached before it
    connects: a handshake that succeeds at once is not missed.

    A PUSH socket meets the ROUTERs and a DEALER the PULL too: ZeroMQ refuses those pairs in
    the handshake, so what goes that way reaches no role, as a peer of the wrong kind finds."""
    sock = ctx.socket(kind)
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = keys.server_public
    monitor = sock.get_monitor_socket()
    sock.connect(endpoint)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if monitor.poll(100) and (
                recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            ):
                return sock
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
    sock.close(linger=0)
    raise AssertionError(f"no CURVE handshake with {endpoint} in {timeout_s} s")


def wait_for(
    get: Callable[[], Any], ok: Callable[[Any], bool], launcher: Launcher, timeout_s: float = 20
) -> Any:
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline and launcher.poll() is None:
        with suppress(LaunchError):  # a reply slower than the request's timeout: ask again
            value = get()
            if ok(value):
                return value
        time.sleep(0.3)
    raise LaunchFailed(f"not seen in {timeout_s} s (last: {value})", launcher)


# -- a flood -------------------------------------------------------------------------------------
FLOOD_MESSAGES = 600
FLOOD_SAMPLE_TOKENS = 1 << 18  # 1 MiB a payload: 600 MiB in all
MEMORY_BOUND_BYTES = 256 << 20  # the early cap (64 MiB), one peer's queue (64 MiB), and slack


def test_a_flood_of_unplanned_payloads_keeps_the_constructors_memory_bounded(
    tmp_path: Path, small_data: Path, reference: dict
) -> None:
    launcher = launch(tmp_path, small_data)
    job = running(launcher)
    constructor = psutil.Process(role_pid(launcher, "constructor"))
    (port,) = [p for p in listening(launcher)["constructor"] if _is_payload_port(job, p)]
    before = constructor.memory_info().rss
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with suppress(psutil.NoSuchProcess):
                peak[0] = max(peak[0], constructor.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ctx = zmq.Context()
    sock = transport.connect(ctx, zmq.PUSH, f"tcp://127.0.0.1:{port}", keys=job.keys())
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    tokens = np.zeros(FLOOD_SAMPLE_TOKENS, dtype=np.int32)
    sent = 0
    with suppress(zmq.Again):
        for i in range(FLOOD_MESSAGES):
            # the furthest steps the Constructor accepts, at positions nobody planned
            step = step_now(job) + 14
            msg = Payload(step=step, source=(0,), gpos=(FAR + i,), lengths=(FLOOD_SAMPLE_TOKENS,))
            sock.send_multipart(encode(msg, [tokens]))
            sent += 1
    sock.close(linger=0)
    ctx.term()
    time.sleep(1.0)
    stop.set()
    sampler.join()
    job_root = finish(launcher)
    assert sent * FLOOD_SAMPLE_TOKENS * 4 >= 2 * MEMORY_BOUND_BYTES  # far more than the bound
    assert peak[0] - before < MEMORY_BOUND_BYTES, f"grew {(peak[0] - before) >> 20} MiB"
    assert digests(job_root) == reference


def _is_payload_port(job: JobDir, port: int) -> bool:
    """The Constructor's trainer socket is the one it publishes; the other takes payloads."""
    published = job.read_endpoint("constructor-local")
    return published is None or not published.address.endswith(f":{port}")
