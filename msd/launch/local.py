"""The embedded launcher: every role as a subprocess of this machine, wired over loopback.

It starts the Planner, one Constructor (the node's sidecar), the loaders and the trainer ranks,
watches all of them, and stops every one of them on every way out: success, a failed role, a
failed trainer, Ctrl-C. The SLURM launcher places the same role entry points elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import zmq

from msd.checkpoint.format import Snapshot
from msd.checkpoint.signing import signing_key
from msd.checkpoint.store import CheckpointStore
from msd.control.client import planner_socket
from msd.control.history import write_history
from msd.control.rescales import load_rescales
from msd.control.shadows import fate_of_dead_loader, load_takeovers, shadows_used
from msd.errors import LaunchError, MsdError
from msd.jobdir import (
    REWIND_EXIT,
    JobDir,
    constructor_endpoint_name,
    full_message,
    is_full,
    nearly_full,
)
from msd.launch import procs
from msd.plan.partition import loader_processes
from msd.plan.schedule import MixChange
from msd.recipe.schema import Recipe, stream_fingerprint, to_json
from msd.wire import transport
from msd.wire.keys import create_keys
from msd.wire.protocol import LoaderLost, Status, StatusRequest, Stop

POLL_S = 0.1
STATUS_EVERY_S = 0.5
INTERRUPTED = "interrupted (Ctrl-C); every process of the job was stopped"


@contextlib.contextmanager
def _deferred_sigint() -> Iterator[None]:
    """Hold a Ctrl-C back while children are forked, then raise it.

    A KeyboardInterrupt raised inside ``fork`` hooks is swallowed by Python, which would leave
    the launcher running a job the user asked to stop.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hits: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: hits.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hits:
        raise KeyboardInterrupt


@dataclass
class Outcome:
    ok: bool
    message: str
    status: Status | None
    job: JobDir


def new_job_dir(recipe: Recipe, run_root: Path) -> JobDir:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = run_root / f"{recipe.name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return JobDir(path)


def prepare_job(
    recipe: Recipe,
    recipe_text: str,
    run_root: Path,
    mix_history: tuple[MixChange, ...] = (),
    resume: Snapshot | None = None,
) -> JobDir:
    """A new job folder holding the recipe as written and as validated (what roles read), the
    job's key, the mix history to replay (``msd launch --mix-history``) and, for ``msd
    restore``, the checkpoint it continues from (its first snapshot)."""
    job = new_job_dir(recipe, run_root.resolve())
    try:
        job.create()
        keys = create_keys(job.key_file)
        (job.root / "recipe.yaml").write_text(recipe_text)
        job.recipe_json.write_bytes(to_json(recipe))
        if mix_history:
            write_history(job.mix_history, recipe, mix_history)
        if resume is not None:
            CheckpointStore(job.checkpoints, key=signing_key(keys)).write_snapshot(resume)
        job.write_json(job.job_json, {"start_step": resume.step if resume is not None else 0})
    except OSError as exc:
        if not is_full(exc):
            raise
        raise LaunchError(full_message(job.root, exc.filename or "")) from None
    return job


def write_job_state(job: JobDir, recipe: Recipe, cluster: str, state: str, **extra: Any) -> None:
    """``job.json``: what ``msd stop`` and ``msd status`` read about a run. On a full disk it
    is overwritten in place (a new file cannot be written); a ``LaunchError`` if even that
    fails."""
    data = {
        "name": recipe.name,
        "fingerprint": stream_fingerprint(recipe),
        "cluster": cluster,
        "state": state,
        "launcher_pid": os.getpid(),
        "launcher_host": socket.gethostname(),  # where launcher_pid can be checked
        "start_step": job.start_step(),
        **extra,
    }
    try:
        job.write_json(job.job_json, data)
    except OSError as exc:
        if not is_full(exc):
            raise
        try:
            job.write_json_in_place(job.job_json, data)
        except OSError:
            raise LaunchError(full_message(job.root, str(job.job_json))) from None


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


class LocalJob:
    def __init__(
        self,
        recipe: Recipe,
        recipe_text: str,
        run_root: Path,
        mix_history: tuple[MixChange, ...] = (),
        resume: Snapshot | None = None,
    ) -> None:
        self.recipe = recipe
        self.job = prepare_job(recipe, recipe_text, run_root, mix_history, resume)
        self.children: list[procs.Child] = []
        self.trainers: list[procs.Child] = []
        self.loader_names: set[str] = set()
        self.rescales_seen = (0.0, 0.0)  # mtimes of JOB/loaders.json, JOB/shadows.json
        self.env = {**os.environ, "MSD_LAUNCHER_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        self.restarts_left = recipe.recovery.restarts
        self.recoveries: list[dict[str, Any]] = []
        self.sock: zmq.Socket[Any] | None = None
        self._write_job_json("starting")

    def _write_job_json(self, state: str) -> None:
        write_job_state(self.job, self.recipe, "local", state, recoveries=self.recoveries)

    # -- starting -----------------------------------------------------------------------------
    def start(self) -> None:
        self._start_data_plane()
        self._start_trainers()
        self._write_job_json("running")

    def _start_data_plane(self) -> None:
        root = self.job.root
        self._role("planner", "planner", procs.role_argv("planner", root))
        ranks = ",".join(str(r) for r in range(self.recipe.world_size))
        self._role(
            "constructor",
            "local",
            procs.role_argv("constructor", root, "--node", "local", "--ranks", ranks),
        )
        self._start_loaders()

    def _start_loaders(self) -> None:
        """Every loader process not started yet: the recipe's, and each rescale's (the Planner
        records a rescale in ``JOB/loaders.json`` and waits for its processes)."""
        rescales = load_rescales(self.job.rescales, self.recipe)
        used = shadows_used(self.recipe, load_takeovers(self.job.shadows, self.recipe))
        for process in loader_processes(self.recipe, rescales, used):
            if process.name not in self.loader_names:
                self.loader_names.add(process.name)
                argv = procs.role_argv("loader", self.job.root, "--name", process.name)
                self._role("loader", process.name, argv)

    def _role(self, role: str, name: str, argv: list[str]) -> None:
        self.children.append(procs.start(role, name, argv, self.env, self.job.log_path(role, name)))

    def _start_trainers(self) -> None:
        if self.recipe.trainer is None:
            return  # attached: the user starts the trainers with MSD_JOB set
        command = self.recipe.trainer.command
        argv = (
            [sys.executable, "-m", "msd.trainer.demo"]
            if command == "demo"
            else procs.command_argv(command)
        )
        world = self.recipe.world_size
        bin_dir = str(Path(sys.executable).parent)  # `python` in a command means msd's interpreter
        base = {
            **self.env,
            "PATH": os.pathsep.join([bin_dir, self.env.get("PATH", "")]),
            "MSD_JOB": str(self.job.root),
            "MSD_NODE": "local",
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
        for rank in range(world):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            log = self.job.log_path("trainer", f"rank-{rank}")
            child = procs.start("trainer", f"rank {rank}", argv, env, log, cwd=Path.cwd())
            self.trainers.append(child)
            self.children.append(child)

    # -- watching -----------------------------------------------------------------------------
    def run(
        self,
        on_status: Callable[[Status], None],
        on_started: Callable[[dict[str, str]], None] | None = None,
    ) -> Outcome:
        """Start every process (``on_started`` gets role → pid), then ``watch``; a Ctrl-C
        during start-up stops what started."""
        try:
            with _deferred_sigint():
                self.start()
        except KeyboardInterrupt:
            procs.stop_all(self.children)
            self._write_job_json(final_state(INTERRUPTED))
            return Outcome(False, INTERRUPTED, None, self.job)
        except (MsdError, OSError) as exc:
            if isinstance(exc, OSError) and not is_full(exc):
                raise
            procs.stop_all(self.children)
            message = full_message(self.job.root) if isinstance(exc, OSError) else str(exc)
            with contextlib.suppress(MsdError):
                self._write_job_json("failed")
            return Outcome(False, message, None, self.job)
        if on_started is not None:
            on_started({c.label: str(c.popen.pid) for c in self.children})
        return self.watch(on_status)

    def watch(self, on_status: Callable[[Status], None]) -> Outcome:
        """Run until the trainers finish or something fails; always stop every child."""
        status: Status | None = None
        try:
            self.sock = planner_socket(self.job)
            status, failed = self._watch_loop(on_status)
            if failed is None:
                status = final_status(self.sock) or status
                transport.send(self.sock, Stop(reason="trainers finished"))
                self._wait_roles(5.0)
                failure = None
            else:
                failure = self._describe_failure(failed, self.sock, status)
        except KeyboardInterrupt:
            failure = INTERRUPTED
        except MsdError as exc:
            failure = str(exc)
        except OSError as exc:  # the launcher's own writes (job.json, a restarted role's log)
            if not is_full(exc):
                raise
            failure = full_message(self.job.root)
        finally:
            procs.stop_all(self.children)
            if self.sock is not None:
                self.sock.close(linger=0)
        try:
            self._write_job_json(final_state(failure))
        except LaunchError as exc:
            failure = failure or str(exc)
        return Outcome(failure is None, failure or "done", status, self.job)

    def _watch_loop(
        self, on_status: Callable[[Status], None]
    ) -> tuple[Status | None, procs.Child | None]:
        status: Status | None = None
        next_ask = 0.0
        while True:
            failed = self._failed_child()
            if failed is not None and not self._recover(failed):
                return status, failed
            if failed is None and self._finished(status):
                return status, None
            self._follow_rescales()
            assert self.sock is not None
            if time.monotonic() >= next_ask:
                transport.send(self.sock, StatusRequest())
                next_ask = time.monotonic() + STATUS_EVERY_S
            reply = receive_status(self.sock, POLL_S)
            if reply is not None:
                status = reply
                on_status(reply)

    # -- recovering ---------------------------------------------------------------------------
    def _recover(self, child: procs.Child) -> bool:
        """Restart after ``child`` ended: the data plane (from its checkpoints) when a data role
        was killed or the Planner went back to an earlier step; every trainer rank when one
        was killed. False when it should not be restarted (an error, or no restarts left)."""
        code = child.popen.returncode
        rewind = child.role == "planner" and code == REWIND_EXIT
        if not rewind and not (code is not None and code < 0 and self.restarts_left > 0):
            return False
        if not rewind:
            self.restarts_left -= 1
        started = time.monotonic()
        how = "restarted"
        if child.role == "trainer":
            self._restart_trainers()
        elif child.role == "loader" and self._to_shadow(child):
            how = "shadow"
        else:
            self._restart_data_plane()
        self.recoveries.append(
            {
                "role": child.role,
                "name": child.name,
                "cause": "rewind" if rewind else child.describe_exit(),
                "how": how,
                "time": time.time(),
                "restart_s": round(time.monotonic() - started, 3),
            }
        )
        self._write_job_json("running")
        return True

    def _to_shadow(self, child: procs.Child) -> bool:
        """A dead loader process of a source with shadows: a dead shadow is started again; a
        dead loader (or a shadow that had become one) is reported to the Planner, which hands
        its place to a shadow (and records it: a new shadow starts). False: no shadows."""
        takeovers = load_takeovers(self.job.shadows, self.recipe)
        rescales = load_rescales(self.job.rescales, self.recipe)
        fate = fate_of_dead_loader(self.recipe, child.name, takeovers, rescales)
        if fate is None:
            return False
        self.children.remove(child)
        if fate.standby:
            self._role(
                "loader", child.name, procs.role_argv("loader", self.job.root, "--name", child.name)
            )
        elif self.sock is not None:
            transport.send(self.sock, LoaderLost(name=fate.loader))
        return True

    def _restart_data_plane(self) -> None:
        """Stop the Planner, loaders and Constructor and start them again: they continue from
        the job's checkpoints at the step every rank has consumed; the trainers' Clients find
        the new Constructor and ask it again."""
        data = [c for c in self.children if c.role != "trainer"]
        procs.stop_all(data, grace_s=1.0)
        self.children = [c for c in self.children if c.role == "trainer"]
        for name in ("planner", constructor_endpoint_name("local")):
            self.job.endpoint_file(name).unlink(missing_ok=True)
        self.loader_names.clear()
        self._start_data_plane()
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = planner_socket(self.job)

    def _restart_trainers(self) -> None:
        procs.stop_all(self.trainers, grace_s=1.0)
        self.children = [c for c in self.children if c not in self.trainers]
        self.trainers = []
        self._start_trainers()

    def _finished(self, status: Status | None) -> bool:
        """The trainers msd started have exited, or (attached) consumed the whole stream."""
        if self.trainers:
            return all(t.popen.poll() == 0 for t in self.trainers)
        return status is not None and status.state == "done"

    def _follow_rescales(self) -> None:
        """Start the loaders a rescale or a shadow's take-over added."""
        mtimes = tuple(
            path.stat().st_mtime if path.exists() else 0.0
            for path in (self.job.rescales, self.job.shadows)
        )
        if mtimes != self.rescales_seen:
            self.rescales_seen = (mtimes[0], mtimes[1])
            self._start_loaders()

    def _failed_child(self) -> procs.Child | None:
        """A child that ended when it should not have; one killed by a signal first (the
        others may have failed because of it: trainer ranks lose their peer)."""
        failed = []
        for child in list(self.children):
            code = child.popen.poll()
            if code is None or (child in self.trainers and code == 0):
                continue
            if child.role == "loader" and code == 0 and self.job.retired(child.name).exists():
                self.children.remove(child)  # replaced by a rescale, and done
                continue
            failed.append(child)
        killed = [c for c in failed if (c.popen.returncode or 0) < 0]
        return (killed or failed)[0] if failed else None

    def _describe_failure(
        self, child: procs.Child, sock: zmq.Socket[Any], status: Status | None
    ) -> str:
        """Name the failed process; add what a role reported, asking the Planner if it lives."""
        planner = next((c for c in self.children if c.role == "planner"), child)
        if planner.popen.poll() is None:
            status = final_status(sock, timeout_s=1.0) or status
        reason = f"; it reported: {status.failure}" if status and status.failure else ""
        if not reason and child.role == "planner" and (error := logged_error(child.log)):
            reason = f"; it reported: {error}"  # a dead Planner answers no status
        if nearly_full(self.job.root):  # its log may be empty: nothing could be written
            return f"{child.label} (pid {child.popen.pid}) {child.describe_exit()}; " + (
                full_message(self.job.root)
            )
        return (
            f"{child.label} (pid {child.popen.pid}) {child.describe_exit()}{reason}; "
            f"the job was stopped. Log: {child.log}"
        )

    def _wait_roles(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            with contextlib.suppress(Exception):
                child.popen.wait(max(0.0, deadline - time.monotonic()))


_LOGGED_ERROR = re.compile(r"^msd\.errors\.\w+: (?P<message>.+)$")


def logged_error(log: Path, tail_bytes: int = 64 * 1024) -> str:
    """The last user error (an ``MsdError``'s sentence) a role's log ends with, or ""."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    found = [m["message"] for line in lines if (m := _LOGGED_ERROR.match(line))]
    return found[-1] if found else ""


def receive_status(sock: zmq.Socket[Any], timeout_s: float) -> Status | None:
    """The Planner's next ``Status`` reply if one arrives within ``timeout_s``."""
    if not sock.poll(int(timeout_s * 1000)):
        return None
    msg = transport.recv(sock)[1]
    return msg if isinstance(msg, Status) else None


def final_status(sock: zmq.Socket[Any], timeout_s: float = 2.0) -> Status | None:
    """Ask the Planner for its status once more and wait for the answer."""
    transport.send(sock, StatusRequest())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sock.poll(100):
        msg = transport.recv(sock)[1]
        if isinstance(msg, Status):
            return msg
    return None


def final_state(failure: str | None) -> str:
    """``job.json``'s state once the launcher is done: ``done``, ``stopped`` (``msd stop``,
    Ctrl-C) or ``failed``."""
    return "done" if failure is None else "stopped" if failure == INTERRUPTED else "failed"


def summary(status: Status) -> dict[str, Any]:
    """The run's figures as plain data (the CLI renders them; ``--json`` prints them)."""
    total = max(1, sum(status.source_samples))
    return {
        "steps": status.consumed,
        "tokens": status.tokens_consumed,
        "elapsed_s": round(status.elapsed_s, 3),
        "tokens_per_s": round(status.tokens_consumed / max(status.elapsed_s, 1e-9), 1),
        "wait_p50_ms": round(status.wait_p50_ms, 3),
        "wait_p99_ms": round(status.wait_p99_ms, 3),
        "split_samples": status.split,
        "truncated_samples": status.truncated,
        "dropped_samples": status.dropped,
        "empty_samples": status.empty,
        "truncated_tokens": sum(status.truncated_tokens),
        "truncated_tokens_by_source": {
            n: t for n, t in zip(status.source_names, status.truncated_tokens, strict=True) if t
        },
        "constructor_step_bytes": status.constructor_step_bytes,
        "lifecycle": dict(status.lifecycle),
        "sources": {
            n: c / total for n, c in zip(status.source_names, status.source_samples, strict=True)
        },
    }


def dumps_summary(status: Status) -> str:
    return json.dumps(summary(status), indent=2)
