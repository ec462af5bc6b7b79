"""One point of ``benchmarks.scale``: a real job of N simulated nodes, run and measured.

The job folder is made with the calls ``msd launch`` makes (``pin_files``, ``prepare_job``,
``write_job_state``), with no ``trainer`` (attached): the Planner and the loader processes are
started as ``msd launch`` starts them (``python -m msd.roles ROLE``, each in its own process
group, dying with this process), and the nodes by ``benchmarks.scale_nodes`` processes. Every
process is stopped on the way out, whatever the way.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from benchmarks import scale_nodes
from benchmarks import scale_proc as proc
from msd.control.planner_connection import planner_socket
from msd.jobdir import JobDir
from msd.launch import procs
from msd.launch.job import final_status
from msd.launch.jobfolder import prepare_job, write_job_state
from msd.launch.listing import pin_files
from msd.plan.partition import loader_processes
from msd.recipe.load import load_recipe
from msd.recipe.schema import ConstructorOptions, Recipe
from msd.synth.text import SynthSource, synth
from msd.wire import transport
from msd.wire.protocol import Status, StatusRequest, Stop

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_PER_SOURCE = 400
STATUS_EVERY_S = 1.0
END_WAIT_S = 60.0  # for the nodes' processes to write their figures after Stop
WRITE_WAIT_S = 30.0  # for a late one to write them once told to (scale_nodes.WRITE_NOW)
Fanout = int | None  # None: direct transfer


@dataclass(frozen=True)
class Point:
    nodes: int
    sources: int
    fanout: Fanout
    ranks_per_node: int = 8
    steps: int = 200
    warmup: int = 5
    seq_len: int = 256
    loaders: int = 4
    nodes_per_process: int = 32
    measure_s: float = 30.0
    max_s: float = 240.0

    @property
    def mode(self) -> str:
        return "direct" if self.fanout is None else f"tree-{self.fanout}"

    @property
    def node_processes(self) -> int:
        return math.ceil(self.nodes / self.nodes_per_process)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def fanout_supported() -> bool:
    """Whether this msd's recipe has ``constructor.fanout`` (hierarchical delivery)."""
    return "fanout" in ConstructorOptions.__struct_fields__


def make_data(root: Path, sources: int, seq_len: int) -> Path:
    """``sources`` tiny Parquet sources (median 100 tokens, at most ``seq_len``), written once."""
    data = root / f"sources-{sources}-{seq_len}"
    if not (data / "done").exists():
        tiny = [
            SynthSource(f"s{i:04d}", median_tokens=100, sigma=0.6, max_tokens=seq_len,
                        num_samples=SAMPLES_PER_SOURCE)
            for i in range(sources)
        ]  # fmt: skip
        synth(data, tiny, seed=1, files_per_source=1, rows_per_row_group=100)
        (data / "done").write_text("")
    return data


def recipe_spec(point: Point, data: Path) -> dict[str, Any]:
    """The job: every rank its own DP rank, one row of ``seq_len`` tokens each per step."""
    spec: dict[str, Any] = {
        "name": f"scale-{point.nodes}n-{point.sources}s-{point.mode}",
        "steps": point.warmup + point.steps,
        "seq_len": point.seq_len,
        "global_batch_tokens": point.ranks * point.seq_len,
        "distribute": {"dp": point.ranks},
        "sources": [
            {
                "name": f"s{i:04d}",
                "path": str(data / f"s{i:04d}" / "*.parquet"),
                "text_column": "text",
                "weight": 1 + i % 3,
            }
            for i in range(point.sources)
        ],
        "loader": {"sources_per_process": math.ceil(point.sources / point.loaders)},
        "metrics": {"port": None, "every_s": 1.0},
    }
    if fanout_supported():  # its default is a tree: direct transfer must be asked for
        spec["constructor"] = {"fanout": point.fanout}
    elif point.fanout is not None:
        raise SystemExit("this msd has no constructor.fanout yet: only --fanout direct runs")
    return spec


def prepare(point: Point, run_root: Path, data: Path) -> tuple[Path, Recipe]:
    """A job folder as ``msd launch`` makes it, with no trainer (the nodes are simulated)."""
    run_root.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(recipe_spec(point, data), sort_keys=False)
    path = run_root / f"scale-{point.nodes}n-{point.sources}s-{point.mode}.yaml"
    path.write_text(text)
    recipe = pin_files(load_recipe(path))
    job = prepare_job(recipe, text, run_root)
    write_job_state(job, recipe, "local", "running")
    return job.root, recipe


class Run:
    """The processes of one point and what was measured of them."""

    def __init__(self, point: Point, root: Path, recipe: Recipe) -> None:
        self.point, self.root, self.recipe = point, root, recipe
        self.children: list[procs.Child] = []
        self.env = {
            **os.environ,
            "MSD_LAUNCHER_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.outs: list[Path] = []

    def _start(self, role: str, name: str, argv: list[str]) -> None:
        log = self.root / "logs" / f"{role}-{name.replace('/', '-')}.log"
        self.children.append(procs.start(role, name, argv, self.env, log))

    def start(self) -> None:
        self._start("planner", "planner", procs.role_argv("planner", self.root))
        for process in loader_processes(self.recipe):
            argv = procs.role_argv("loader", self.root, "--name", process.name)
            self._start("loader", process.name, argv)
        for first, count in shares(self.point.nodes, self.point.node_processes):
            out = self.root / f"nodes-{first}.json"
            self.outs.append(out)
            argv = [sys.executable, "-m", "benchmarks.scale_nodes", "--job", str(self.root)]
            argv += ["--first", str(first), "--count", str(count), "--out", str(out)]
            argv += ["--ranks-per-node", str(self.point.ranks_per_node)]
            self._start("nodes", str(first), argv)

    @property
    def nodes(self) -> list[procs.Child]:
        """The nodes processes, in the order of ``outs``."""
        return [c for c in self.children if c.role == "nodes"]

    def pids(self, role: str) -> list[int]:
        return [c.popen.pid for c in self.children if c.role == role]

    def failed(self) -> str | None:
        for child in self.children:
            if child.popen.poll() is not None:
                return f"{child.label} {child.describe_exit()}:\n{procs.tail(child.log)}"
        return None

    def stop(self) -> None:
        procs.stop_all(self.children, grace_s=2.0)


def shares(nodes: int, workers: int) -> list[tuple[int, int]]:
    """(first node, count) for each nodes process: as even as can be, none empty."""
    workers = max(1, min(workers, nodes))
    base, extra = divmod(nodes, workers)
    out, first = [], 0
    for w in range(workers):
        count = base + (w < extra)
        out.append((first, count))
        first += count
    return out


def snapshot(run: Run) -> dict[str, Any]:
    """Connections, memory and CPU time of every process of the run, now."""
    table = proc.tcp_table()
    roles: dict[str, list[dict[str, Any]]] = {}
    for child in run.children:
        pid = child.popen.pid
        conns = proc.sockets(pid, table)
        roles.setdefault(child.role, []).append(
            {
                "name": child.name,
                "pid": pid,
                "connections": len(proc.established(conns)),
                "inbound": proc.inbound(conns),
                "pss": proc.pss_bytes(pid),
                "rss": proc.rss_bytes(pid),
                "cpu_s": proc.cpu_seconds(pid),
            }
        )
    return {"time": time.time(), "roles": roles}


def ask_status(sock: Any) -> Status | None:
    transport.send(sock, StatusRequest())
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and sock.poll(100):
        msg = transport.recv(sock)[1]
        if isinstance(msg, Status):
            return msg
    return None


def run_point(point: Point, run_root: Path, data_root: Path, say: Any = print) -> dict[str, Any]:
    """Run one point to its last step or its time cap; everything it started is stopped."""
    data = make_data(data_root, point.sources, point.seq_len)
    root, recipe = prepare(point, run_root, data)
    run = Run(point, root, recipe)
    started, started_wall = time.monotonic(), time.time()
    sock = None
    try:
        run.start()
        sock = planner_socket_when_up(run)
        planner_up = time.time()
        result = watch(run, sock, started, say)
        result |= {"started_at": started_wall, "planner_up_at": planner_up}
        transport.send(sock, Stop(reason="benchmark done"))
        result["nodes_out"] = collect(run)
    finally:
        if sock is not None:
            sock.close(linger=0)
        run.stop()
    result["job"] = str(root)
    return result


def planner_socket_when_up(run: Run) -> Any:
    job = JobDir(run.root)
    deadline = time.monotonic() + 120
    while job.read_endpoint("planner") is None:
        if (why := run.failed()) is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the planner did not start: {why}")
        time.sleep(0.1)
    return planner_socket(job, timeout_s=5.0)


def watch(run: Run, sock: Any, started: float, say: Any) -> dict[str, Any]:
    """Ask the Planner its status each second until ``steps`` steps or ``measure_s`` seconds
    past the warm-up, the stream's end, or ``max_s`` in all; take the processes' figures once
    warm and at the end."""
    point = run.point
    warm: dict[str, Any] | None = None
    status: Status | None = None
    running_at: float | None = None
    peak_pss: dict[int, int] = {}
    while True:
        if (why := run.failed()) is not None:
            raise RuntimeError(why)
        status = ask_status(sock) or status
        consumed = status.consumed if status is not None else 0
        now = time.monotonic()
        if running_at is None and consumed > 0:
            running_at = now
        for pid in [c.popen.pid for c in run.children]:
            peak_pss[pid] = max(peak_pss.get(pid, 0), proc.pss_bytes(pid))
        if warm is None and consumed >= point.warmup:
            warm = snapshot(run) | {"step": consumed, "at": now}
        done = status is not None and status.state == "done"
        measured = warm is not None and (
            consumed - warm["step"] >= point.steps or now - warm["at"] >= point.measure_s
        )
        capped = now - started > point.max_s
        if done or measured or capped:
            break
        say(f"  step {consumed}  {now - started:.0f} s", end="\r", flush=True)
        time.sleep(STATUS_EVERY_S)
    end = snapshot(run) | {"step": consumed, "at": time.monotonic()}
    last = final_status(sock, timeout_s=5.0) or status
    return {
        "capped": capped and not (done or measured),
        "wall_s": time.monotonic() - started,
        "startup_s": (running_at - started) if running_at else None,
        "warm": warm,
        "end": end,
        "peak_pss": {str(k): v for k, v in peak_pss.items()},
        "status": msgspec.to_builtins(last.view) if last is not None and last.view else None,
        "consumed": last.consumed if last is not None else 0,
    }


def collect(run: Run) -> list[dict[str, Any]]:
    """What each nodes process wrote once its Constructors returned (after Stop). A process
    whose Constructors are still busy after ``END_WAIT_S`` (the 2 cores can be that far behind)
    is told to write what it has at once; one that still writes nothing is missing from the
    list, which the figures then say."""
    _wait_for(run.outs, END_WAIT_S)
    late = [child for child, out in zip(run.nodes, run.outs, strict=True) if not out.exists()]
    for child in late:
        if child.popen.poll() is None:
            child.popen.send_signal(scale_nodes.WRITE_NOW)
    _wait_for(run.outs, WRITE_WAIT_S)
    return [json_load(out) for out in run.outs if out.exists()]


def _wait_for(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.1)


def json_load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
