"""A data role's supervisor on SLURM: the role runs as its child; when a role dies, the data
plane restarts.

Locally the launcher sees every role and restarts the data plane itself. On SLURM each role is
its own job (the Planner, each loader) or a task of the trainer job (each node's Constructor),
so each runs under a supervisor in its job, and the supervisors agree through the job folder
(``msd.launch.incarnations``):

- its role killed (by a signal), or the Planner going back to an earlier step (exit 75): the
  supervisor starts the data plane's next incarnation (a kill counts against
  ``recovery.restarts``);
- a loader of a source with shadows killed: a shadow standing by is started again in its place;
  a loader is reported to the Planner (``LoaderLost``), which hands its place to a shadow (the
  launcher submits a new shadow); its supervisor then waits for the next incarnation;
- a new incarnation, whoever started it: the supervisor stops its role and starts it again;
  every role continues from the job's checkpoints at the step every rank has consumed;
- its SLURM job requeued (time limit or preemption: submitit checkpoints and requeues the job):
  once the job runs again, it starts the next incarnation;
- its role exits by itself (the run ended, a loader retired): it returns the role's code. A
  role's error (a non-zero exit) is not retried: the job fails and the launcher names it.

A role other than the Planner is started only once the Planner of its incarnation has
published its endpoint, however long that takes (``_await_planner``).
"""

from __future__ import annotations

import logging
import os
import signal
import time

from msd.control.planner_connection import planner_socket
from msd.jobdir import REWIND_EXIT, JobDir
from msd.jobdir.rescales import load_rescales
from msd.jobdir.shadows import fate_of_dead_loader, load_takeovers
from msd.launch import incarnations, procs
from msd.wire import transport
from msd.wire.protocol import LoaderLost

log = logging.getLogger(__name__)

POLL_S = 0.1
STOP_GRACE_S = 2.0


class Supervisor:
    def __init__(self, job: JobDir, role: str, name: str, argv: list[str]) -> None:
        self.job = job
        self.role = role
        self.name = name
        self.argv = argv
        self.recipe = job.recipe()
        self.incarnation = incarnations.current(job)
        self.child: procs.Child | None = None
        self.stopping = False
        self.standby_restarts = 0

    def run(self) -> int:
        """Supervise until the role exits by itself or cannot be restarted; its exit code."""
        self._follow_requeue()
        try:
            while True:
                code = self._run_role()
                if code is None:
                    continue  # a new incarnation
                if code == 0 or self.stopping:
                    return 0
                code = self._recover(code)
                if code is not None:
                    return code
        finally:
            self._stop_child()

    def stop_on_sigterm(self) -> None:
        """``scancel``: stop the role and return (submitit's own handler ignores SIGTERM)."""

        def handler(signum: int, frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, handler)

    # -- the role -----------------------------------------------------------------------------
    def _start(self) -> procs.Child:
        env = {
            **os.environ,
            "MSD_INCARNATION": str(self.incarnation),
            "MSD_LAUNCHER_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
        }
        log = self.job.log_path(self.role, self.name)
        self.child = procs.start(self.role, self.name, self.argv, env, log, deaf_to_usr2=True)
        return self.child

    def _stop_child(self) -> None:
        if self.child is not None:
            procs.stop_all([self.child], grace_s=STOP_GRACE_S)
            self.child = None

    def _run_role(self) -> int | None:
        """Run the role until it exits (its code) or a new incarnation starts (None)."""
        if self.role != "planner" and not self._await_planner():
            return 0  # stopped while waiting
        child = self._start()
        while (code := child.popen.poll()) is None:
            if self.stopping:
                return 0
            if self._restarted():
                return None
            time.sleep(POLL_S)
        self.child = None
        return None if self._restarted() else code

    def _await_planner(self) -> bool:
        """Wait, as long as it takes, until the Planner of this incarnation (or a later one) has
        published its endpoint; False if stopped meanwhile. A requeued Planner job may pend
        for minutes (its BeginTime, a busy partition) while the other jobs run on: a role
        started before it would give up after its own bounded wait and fail the run."""
        while not self.stopping:
            published = self.job.read_endpoint("planner")
            if published is not None and published.incarnation >= self.incarnation:
                return True
            self._restarted()  # a newer incarnation began: wait for its Planner instead
            time.sleep(POLL_S)
        return False

    def _restarted(self) -> bool:
        now = incarnations.current(self.job)
        if now <= self.incarnation:
            return False
        self.incarnation = now
        self._stop_child()
        return True

    # -- recovering ---------------------------------------------------------------------------
    def _recover(self, code: int) -> int | None:
        """After the role ended with ``code``: None to go on (started again), or the code this
        supervisor exits with."""
        rewind = self.role == "planner" and code == REWIND_EXIT
        if code >= 0 and not rewind:
            return code  # an error, reported by the role itself: not retried
        cause = "went back to an earlier step" if rewind else f"killed by {procs.signal_name(code)}"
        if self.role == "loader" and not rewind:
            takeovers = load_takeovers(self.job.shadows, self.recipe)
            rescales = load_rescales(self.job.rescales, self.recipe)
            fate = fate_of_dead_loader(self.recipe, self.name, takeovers, rescales)
            if fate is not None:
                return self._to_shadow(fate.standby, fate.loader, code)
        limit = self.recipe.recovery.restarts
        if not rewind and incarnations.counted(self.job) >= limit:
            self._give_up(cause, f"no restarts left (recovery.restarts: {limit})")
            return code
        self.incarnation = incarnations.start_next(
            self.job, self.incarnation, self.role, self.name, cause, counted=not rewind
        )
        return None

    def _to_shadow(self, standby: bool, loader: str, code: int) -> int | None:
        if standby:  # a shadow standing by: start it again
            self.standby_restarts += 1
            if self.standby_restarts > self.recipe.recovery.restarts:
                self._give_up(f"killed by {procs.signal_name(code)}", "it keeps dying")
                return code
            return None
        sock = planner_socket(self.job, identity=f"supervisor/{self.name}", timeout_s=10.0)
        try:
            transport.send(sock, LoaderLost(name=loader))
        finally:
            sock.close(linger=2000)
        while not self.stopping:  # a shadow has its place now, until the data plane restarts
            if incarnations.current(self.job) > self.incarnation:
                self.incarnation = incarnations.current(self.job)
                return None
            time.sleep(POLL_S)
        return 0

    def _give_up(self, cause: str, why: str) -> None:
        path = self.job.log_path(self.role, self.name)
        log.error(
            "%s %s was %s; %s. Log: %s\n%s",
            self.role,
            self.name,
            cause,
            why,
            path,
            procs.tail(path, 8),
        )

    def _follow_requeue(self) -> None:
        """A requeued SLURM job (SLURM_RESTART_COUNT > 0) starts the next incarnation once;
        the several tasks of one job agree on it by the job's id and restart count."""
        count = os.environ.get("SLURM_RESTART_COUNT", "0")
        if count.isdigit() and int(count) > 0:
            key = f"{os.environ.get('SLURM_JOB_ID', '')}.{count}"
            self.incarnation = incarnations.start_next(
                self.job,
                self.incarnation,
                self.role,
                self.name,
                "requeued by SLURM",
                counted=False,
                key=key,
            )
