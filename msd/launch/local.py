"""The embedded launcher: every role as a subprocess of this machine, wired over loopback.

It starts the Planner, a Constructor per node (the node's sidecar; a local run simulates the
``trainer.nodes`` nodes), the loaders and the trainer ranks, watches all of them, and stops every
one of them on every way out: success, a failed role, a failed trainer, Ctrl-C. The run itself
(job.json, the status loop, the outcome) is ``msd.launch.job``'s; the SLURM launcher places the
same role entry points elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from msd.control.planner_connection import planner_socket
from msd.errors import LaunchError
from msd.jobdir import REWIND_EXIT, constructor_endpoint_name, full_message, nearly_full
from msd.jobdir.rescales import load_rescales
from msd.jobdir.shadows import fate_of_dead_loader, load_takeovers, shadows_used
from msd.launch import procs
from msd.launch.job import Job, final_status, logged_error
from msd.launch.ports import free_port
from msd.launch.slurm_plan import ranks_per_node
from msd.plan.partition import loader_processes
from msd.recipe.schema import Recipe
from msd.wire import transport
from msd.wire.protocol import LoaderLost, Status

POLL_S = 0.1
PLANNER_START_S = 60.0  # from start to the Planner's endpoint: it indexes every source first


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


def local_nodes(recipe: Recipe) -> dict[str, tuple[int, ...]]:
    """The nodes a local run simulates (``trainer.nodes``), each with its Constructor and the
    ranks it serves: one node is ``local``; more are ``local-0``, ``local-1``, ..."""
    nodes = recipe.trainer.nodes if recipe.trainer is not None else 1
    per_node = ranks_per_node(recipe) if nodes > 1 else recipe.world_size
    names = ["local"] if nodes == 1 else [f"local-{i}" for i in range(nodes)]
    return {name: tuple(range(i * per_node, (i + 1) * per_node)) for i, name in enumerate(names)}


class LocalJob(Job):
    cluster = "local"
    poll_s = POLL_S
    check_every_s = 0.0
    finish_s = 5.0

    def _setup(self) -> None:
        self.children: list[procs.Child] = []
        self.trainers: list[procs.Child] = []
        self.loader_names: set[str] = set()
        self.env = {**os.environ, "MSD_LAUNCHER_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        self.restarts_left = self.recipe.recovery.restarts
        self.recoveries: list[dict[str, Any]] = []

    def _job_fields(self) -> dict[str, Any]:
        return {"recoveries": self.recoveries}

    # -- starting -----------------------------------------------------------------------------
    def _starting(self) -> contextlib.AbstractContextManager[None]:
        return _deferred_sigint()

    def _start_roles(self) -> None:
        self._start_data_plane()
        self._start_trainers()

    def started(self) -> dict[str, str]:
        return {c.label: str(c.popen.pid) for c in self.children}

    def _start_data_plane(self) -> None:
        root = self.job.root
        self._role("planner", "planner", procs.role_argv("planner", root))
        for node, ranks in local_nodes(self.recipe).items():
            listed = ",".join(map(str, ranks))
            argv = procs.role_argv("constructor", root, "--node", node, "--ranks", listed)
            self._role("constructor", node, argv)
        self._start_loaders()

    def _start_loaders(self) -> None:
        """Every loader process not started yet: the recipe's, and each rescale's (the Planner
        records a rescale in ``JOB/loaders.json`` and waits for its processes)."""
        rescales = load_rescales(self.job.rescales, self.recipe)
        used = shadows_used(self.recipe, load_takeovers(self.job.shadows, self.recipe))
        for process in loader_processes(self.recipe, rescales, used):
            if process.name not in self.loader_names:
                self.loader_names.add(process.name)
                self._loader(process.name)

    def _loader(self, name: str) -> None:
        self._role("loader", name, procs.role_argv("loader", self.job.root, "--name", name))

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
        base = self._trainer_env()
        for node, ranks in local_nodes(self.recipe).items():
            for local_rank, rank in enumerate(ranks):
                self._trainer(argv, base, node, rank, local_rank, len(ranks))

    def _trainer(
        self, argv: list[str], base: dict[str, str], node: str, rank: int, local: int, size: int
    ) -> None:
        """Trainer rank ``rank``, the ``local``-th of the ``size`` on its (simulated) node."""
        env = {
            **base,
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(size),
            "MSD_NODE": node,
        }
        log = self.job.log_path("trainer", f"rank-{rank}")
        child = procs.start("trainer", f"rank {rank}", argv, env, log, cwd=Path.cwd())
        self.trainers.append(child)
        self.children.append(child)

    def _trainer_env(self) -> dict[str, str]:
        """Every rank's environment, but its own RANK, LOCAL_RANK, LOCAL_WORLD_SIZE and
        MSD_NODE."""
        world = self.recipe.world_size
        bin_dir = str(Path(sys.executable).parent)  # `python` in a command means msd's interpreter
        return {
            **self.env,
            "PATH": os.pathsep.join([bin_dir, self.env.get("PATH", "")]),
            "MSD_JOB": str(self.job.root),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }

    # -- watching -----------------------------------------------------------------------------
    def _connect(self) -> None:
        """Connect once the Planner has published its endpoint; a Planner that ends before
        (its sources could not be opened) fails the launch with its error, at once."""
        planner = next(c for c in self.children if c.role == "planner")
        deadline = time.monotonic() + PLANNER_START_S
        while self.job.read_endpoint("planner") is None and planner.popen.poll() is None:
            if time.monotonic() > deadline:
                break  # planner_socket says so
            time.sleep(0.02)
        if planner.popen.poll() is not None and self.job.read_endpoint("planner") is None:
            raise LaunchError(self._describe_failure(planner, None))
        self.sock = planner_socket(self.job, timeout_s=1.0)

    def _check(self, status: Status | None) -> tuple[bool, str | None]:
        failed = self._failed_child()
        if failed is not None and not self._recover(failed):
            return True, self._describe_failure(failed, status)
        return failed is None and self._finished(status), None

    def _finished(self, status: Status | None) -> bool:
        """The trainers msd started have exited, or (attached) consumed the whole stream."""
        if self.trainers:
            return all(t.popen.poll() == 0 for t in self.trainers)
        return status is not None and status.state == "done"

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

    def _describe_failure(self, child: procs.Child, status: Status | None) -> str:
        """Name the failed process; add what a role reported, asking the Planner if it lives."""
        planner = next((c for c in self.children if c.role == "planner"), child)
        if planner.popen.poll() is None:
            status = final_status(self._planner(), timeout_s=1.0) or status
        reason = f"; it reported: {status.failure}" if status and status.failure else ""
        if not reason and child.role == "planner" and (error := logged_error(child.log)):
            reason = f"; it reported: {error}"  # a dead Planner answers no status
        ended = f"{child.label} (pid {child.popen.pid}) {child.describe_exit()}"
        if nearly_full(self.job.root):  # its log may be empty: nothing could be written
            return f"{ended}; " + full_message(self.job.root)
        return f"{ended}{reason}; the job was stopped. Log: {child.log}"

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
        how = self._restart_after(child)
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

    def _restart_after(self, child: procs.Child) -> str:
        """Restart what ``child``'s end calls for; how (``restarted`` or ``shadow``)."""
        if child.role == "trainer":
            self._restart_trainers()
        elif child.role == "loader" and self._to_shadow(child):
            return "shadow"
        else:
            self._restart_data_plane()
        return "restarted"

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
            self._loader(child.name)
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
        nodes = [constructor_endpoint_name(node) for node in local_nodes(self.recipe)]
        for name in ("planner", *nodes):
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

    # -- stopping -----------------------------------------------------------------------------
    def _wait_ended(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            with contextlib.suppress(Exception):
                child.popen.wait(max(0.0, deadline - time.monotonic()))

    def shut_down(self) -> None:
        procs.stop_all(self.children)
        if self.sock is not None:
            self.sock.close(linger=0)
