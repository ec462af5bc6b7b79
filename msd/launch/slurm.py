"""The SLURM launcher: the same roles as the local launcher, placed by submitit.

Rendezvous is the job folder (on the shared filesystem): the Planner publishes its address
there, Constructors theirs (one per trainer node), and clients read them; no fixed port.
While the trainers run, the launcher watches every SLURM job (``squeue``, which is live, unlike
``sacct``) and the Planner's status; when the trainer job completes it stops the data plane;
when any job fails it cancels the rest and names the failed one with its log. The run itself
(job.json, the status loop, the outcome) is ``msd.launch.job``'s.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import zmq

from msd.control.planner_connection import planner_socket
from msd.control.squeue import cancel_jobs, restart_count, squeue_states
from msd.errors import LaunchError
from msd.jobdir import Published
from msd.jobdir.rescales import load_rescales
from msd.jobdir.shadows import load_takeovers, shadows_used
from msd.launch import incarnations
from msd.launch.job import Job
from msd.launch.ports import free_port
from msd.launch.procs import signal_name, tail
from msd.launch.slurm_plan import Submission, submissions
from msd.launch.slurm_task import RoleTask, TrainerTask
from msd.recipe.schema import Trainer
from msd.wire.protocol import Status

ENDED_BADLY = {
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}
LIVE = {"RUNNING", "PENDING", "COMPLETING", "CONFIGURING"}
POLL_S = 0.5
EXIT_GRACE_S = 3.0  # how long a rank's failure waits for a killed peer's record


class SlurmJob(Job):
    cluster = "slurm"
    poll_s = POLL_S
    check_every_s = POLL_S  # each check asks squeue
    finish_s = 30.0

    def _setup(self) -> None:
        self.plan = submissions(self.recipe)
        self.submitted: list[tuple[Submission, Any]] = []
        self.planner_seen: Published | None = None
        self.failed_since: float | None = None  # when a rank's failure was first seen

    def _job_fields(self) -> dict[str, Any]:
        recoveries = [
            {"role": r.role, "name": r.name, "cause": r.cause, "how": "restarted", "time": r.time}
            for r in incarnations.restarts(self.job)
        ]
        return {"slurm_jobs": self.started(), "recoveries": recoveries}

    # -- submitting ---------------------------------------------------------------------------
    def _start_roles(self) -> None:
        port = free_port("")
        try:
            for sub in self.plan:
                self.submitted.append((sub, self._submit_one(sub, port)))
        except Exception as exc:  # sbatch refusing a request arrives as various errors
            self.cancel()
            raise LaunchError(f"SLURM refused the {sub.role} job: {_first_line(exc)}") from None

    def started(self) -> dict[str, str]:
        return {f"{s.role} {s.name}": j.job_id for s, j in self.submitted}

    def _executor(self, sub: Submission) -> Any:
        import submitit

        executor = submitit.AutoExecutor(folder=self.job.root / "slurm", cluster="slurm")
        executor.update_parameters(**sub.parameters)
        return executor

    def _start_loaders(self) -> None:
        """Submit a job for each loader a rescale added and for each new shadow a shadow's
        take-over calls for."""
        rescales = load_rescales(self.job.rescales, self.recipe)
        used = shadows_used(self.recipe, load_takeovers(self.job.shadows, self.recipe))
        started = {(s.role, s.name) for s, _ in self.submitted}
        for sub in submissions(self.recipe, rescales, used):
            if sub.role == "loader" and (sub.role, sub.name) not in started:
                try:
                    self.submitted.append((sub, self._submit_one(sub, 0)))
                except Exception as exc:
                    raise LaunchError(
                        f"SLURM refused the loader job {sub.name}: {_first_line(exc)}"
                    ) from None
                self._write_job_json("running")

    def _submit_one(self, sub: Submission, port: int) -> Any:
        executor = self._executor(sub)
        root = str(self.job.root)
        if sub.role == "trainer":
            return executor.submit(
                TrainerTask(),  # type: ignore[no-untyped-call]  # submitit's __new__
                root,
                int(sub.task[1]),
                (self.recipe.trainer or Trainer()).command,
                port,
            )
        task = RoleTask()  # type: ignore[no-untyped-call]  # submitit's __new__
        return executor.submit(task, [sub.task[0], "--job", root, *sub.task[1:]])

    def cancel(self) -> None:
        cancel_jobs([j.job_id for _, j in self.submitted])

    # -- watching -----------------------------------------------------------------------------
    def _connect(self) -> None:
        self._wait_planner()

    def _planner(self) -> zmq.Socket[Any]:
        """A socket to the Planner, connected again when a restart published a new one."""
        now = self.job.read_endpoint("planner")
        if self.sock is None or (now is not None and now != self.planner_seen):
            if self.sock is not None:
                self.sock.close(linger=0)
                self._write_job_json("running")  # a restart: job.json lists it
            self.sock = planner_socket(self.job, timeout_s=5)
            self.planner_seen = now
        return self.sock

    def _wait_planner(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.job.endpoint_file("planner").exists():
            self._raise_if_failed(self._states())
            if time.monotonic() > deadline:
                raise LaunchError(f"the planner job did not start within {timeout_s:.0f} s")
            time.sleep(0.2)

    def _states(self) -> dict[str, str]:
        return squeue_states([j.job_id for _, j in self.submitted])

    def _check(self, status: Status | None) -> tuple[bool, str | None]:
        if self._trainers_done(status):
            return True, None
        self._raise_if_failed(self._states())
        return False, None

    def _raise_if_failed(self, states: dict[str, str]) -> None:
        for sub, job in self.submitted:
            state = states.get(job.job_id, "")
            # every role runs until the launcher stops it, but a loader a rescale replaced
            retired = sub.role == "loader" and self.job.retired(sub.name).exists()
            early = state == "COMPLETED" and not retired
            if state in ENDED_BADLY or early:
                raise LaunchError(
                    f"{sub.role} {sub.name} (SLURM job {job.job_id}) is {state}; the run was "
                    f"stopped. Log: {job.paths.stderr}\n{_log_tail(job)}"
                )

    # -- the trainers -------------------------------------------------------------------------
    def _trainers_done(self, status: Status | None) -> bool:
        """Every rank has written its exit code (a non-zero one is a failure, but a rank killed
        by a signal restarts the trainers); for trainers msd did not start, the Planner has seen
        every rank consume the whole stream."""
        if self.recipe.trainer is None:
            return status is not None and status.state == "done"
        exits = self._exits()
        failed = [e for e in exits if e["code"] != 0]
        if not failed:
            self.failed_since = None
            return len(exits) == self.recipe.world_size
        self._rank_failed(failed)
        return False

    def _rank_failed(self, failed: list[dict[str, Any]]) -> None:
        """Restart the trainers after a rank was killed (restarts left); raise for a rank's
        error, or a kill with no restarts left. A killed rank's peers fail too, maybe first:
        the killed one's record gets ``EXIT_GRACE_S`` to arrive."""
        if self.failed_since is None:
            self.failed_since = time.monotonic()
        killed = [e for e in failed if e["code"] < 0]
        if not killed and time.monotonic() - self.failed_since < EXIT_GRACE_S:
            return
        e = (killed or failed)[0]
        code = e["code"]
        if killed and incarnations.counted(self.job) < self.recipe.recovery.restarts:
            self._restart_trainers(f"rank {e['rank']}", f"killed by {signal_name(code)}")
            return
        how = f"was killed by {signal_name(code)}" if code < 0 else f"exited with code {code}"
        raise LaunchError(
            f"trainer rank {e['rank']} on {e['node']} {how}; the run was stopped. "
            f"Logs: {self.job.root / 'slurm'}"
        )

    def _exits(self) -> list[dict[str, Any]]:
        """The exit records of this run of the current trainer job (a requeue runs it again, a
        restart submits another)."""
        exits = [self.job.read_json(p) for p in self.job.trainer.glob("exit-*.json")]
        if not exits:
            return []
        trainer_job = next(j for s, j in self.submitted if s.role == "trainer")
        now = restart_count(trainer_job.job_id)
        return [
            e
            for e in exits
            if e.get("slurm_job") == str(trainer_job.job_id) and e.get("restart", 0) == now
        ]

    def _restart_trainers(self, name: str, cause: str) -> None:
        """A rank was killed: start the data plane's next incarnation and run the trainer job
        again as a new SLURM job; each rank resumes from its own checkpoint
        (``Client.load_state_dict``) and the node's Constructor starts with it."""
        index = next(i for i, (s, _) in enumerate(self.submitted) if s.role == "trainer")
        sub, old = self.submitted[index]
        incarnations.start_next(
            self.job, incarnations.current(self.job), "trainer", name, cause, counted=True
        )
        cancel_jobs([old.job_id])
        self.failed_since = None
        try:
            new = self._submit_one(sub, free_port(""))
        except Exception as exc:
            raise LaunchError(f"SLURM refused the trainer job again: {_first_line(exc)}") from None
        self.submitted[index] = (sub, new)
        self._write_job_json("running")

    # -- stopping -----------------------------------------------------------------------------
    def _wait_ended(self, timeout_s: float) -> None:
        """After Stop every job ends by itself; whatever does not is cancelled afterwards."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self._states()
            if not any(states.get(j.job_id) in LIVE for _, j in self.submitted):
                return
            time.sleep(0.3)

    def shut_down(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=200)
        self.cancel()


def _log_tail(job: Any) -> str:
    with contextlib.suppress(Exception):
        return tail(Path(job.paths.stderr), 8)
    return ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())[:300]
