"""The SLURM launcher: the same roles as the local launcher, placed by submitit.

Rendezvous is the job folder (on the shared filesystem): the Planner publishes its address
there, Constructors theirs (one per trainer node), and clients read them; no fixed port.
While the trainers run, the launcher watches every SLURM job (``squeue``, which is live, unlike
``sacct``) and the Planner's status; when the trainer job completes it stops the data plane;
when any job fails it cancels the rest and names the failed one with its log.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from msd.checkpoint.format import Snapshot
from msd.control.client import planner_socket
from msd.control.rescales import load_rescales
from msd.control.shadows import load_takeovers, shadows_used
from msd.errors import LaunchError
from msd.jobdir import JobDir, Published
from msd.launch import incarnations
from msd.launch.local import (
    INTERRUPTED,
    Outcome,
    final_state,
    final_status,
    free_port,
    prepare_job,
    receive_status,
    write_job_state,
)
from msd.launch.procs import signal_name, tail
from msd.launch.slurm_plan import Submission, submissions
from msd.launch.slurm_task import RoleTask, TrainerTask
from msd.plan.schedule import MixChange
from msd.recipe.schema import Recipe, Trainer
from msd.wire import transport
from msd.wire.protocol import Status, StatusRequest, Stop

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
POLL_S = 0.5
EXIT_GRACE_S = 3.0  # how long a rank's failure waits for a killed peer's record


def squeue_states(ids: list[str]) -> dict[str, str]:
    """Live state of each job (``squeue -t all`` knows finished jobs for a while)."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i %T"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    states: dict[str, str] = {}
    for line in out.splitlines():
        job_id, _, state = line.strip().partition(" ")
        states.setdefault(job_id.split("_")[0], state)
    return states


def restart_count(job_id: str) -> int:
    """How many times SLURM has requeued the job (``scontrol show job``'s ``Restarts``)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=False
    ).stdout
    for field in out.split():
        if field.startswith("Restarts="):
            return int(field.partition("=")[2])
    return 0


def cancel_jobs(ids: list[str], timeout_s: float = 30.0) -> None:
    """scancel, then wait until the jobs have left the queue (roles exit on SIGTERM at once)."""
    if not ids:
        return
    subprocess.run(["scancel", *ids], capture_output=True, check=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%i"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if not out.strip():
            return
        time.sleep(0.2)


class SlurmJob:
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
        self.plan = submissions(recipe)
        self.submitted: list[tuple[Submission, Any]] = []
        self.rescales_seen = (0.0, 0.0)  # mtimes of JOB/loaders.json, JOB/shadows.json
        self.sock: zmq.Socket[Any] | None = None
        self.planner_seen: Published | None = None
        self.failed_since: float | None = None  # when a rank's failure was first seen

    def _write_job_json(self, state: str) -> None:
        ids = {f"{s.role} {s.name}": j.job_id for s, j in self.submitted}
        recoveries = [
            {"role": r.role, "name": r.name, "cause": r.cause, "how": "restarted", "time": r.time}
            for r in incarnations.restarts(self.job)
        ]
        write_job_state(
            self.job, self.recipe, "slurm", state, slurm_jobs=ids, recoveries=recoveries
        )

    # -- submitting ---------------------------------------------------------------------------
    def submit(self) -> None:
        port = free_port("")
        try:
            for sub in self.plan:
                self.submitted.append((sub, self._submit_one(self._executor(sub), sub, port)))
        except Exception as exc:  # sbatch refusing a request arrives as various errors
            self.cancel()
            raise LaunchError(f"SLURM refused the {sub.role} job: {_first_line(exc)}") from None
        finally:
            self._write_job_json("running")

    def _executor(self, sub: Submission) -> Any:
        import submitit

        executor = submitit.AutoExecutor(folder=self.job.root / "slurm", cluster="slurm")
        executor.update_parameters(**sub.parameters)
        return executor

    def _follow_rescales(self) -> None:
        """Submit a job for each loader a rescale added (``JOB/loaders.json``) and for each
        new shadow a shadow's take-over calls for (``JOB/shadows.json``)."""
        mtimes = tuple(
            path.stat().st_mtime if path.exists() else 0.0
            for path in (self.job.rescales, self.job.shadows)
        )
        if mtimes == self.rescales_seen:
            return
        self.rescales_seen = (mtimes[0], mtimes[1])
        rescales = load_rescales(self.job.rescales, self.recipe)
        used = shadows_used(self.recipe, load_takeovers(self.job.shadows, self.recipe))
        started = {(s.role, s.name) for s, _ in self.submitted}
        for sub in submissions(self.recipe, rescales, used):
            if sub.role == "loader" and (sub.role, sub.name) not in started:
                try:
                    self.submitted.append((sub, self._submit_one(self._executor(sub), sub, 0)))
                except Exception as exc:
                    raise LaunchError(
                        f"SLURM refused the loader job {sub.name}: {_first_line(exc)}"
                    ) from None
                self._write_job_json("running")

    def _submit_one(self, executor: Any, sub: Submission, port: int) -> Any:
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
    def run(
        self,
        on_status: Callable[[Status], None],
        on_started: Callable[[dict[str, str]], None] | None = None,
    ) -> Outcome:
        """Submit every job (``on_started`` gets role → SLURM job id), then ``watch``."""
        try:
            self.submit()
        except KeyboardInterrupt:
            self.cancel()
            return Outcome(False, INTERRUPTED, None, self.job)
        if on_started is not None:
            on_started({f"{s.role} {s.name}": j.job_id for s, j in self.submitted})
        return self.watch(on_status)

    def watch(self, on_status: Callable[[Status], None]) -> Outcome:
        status: Status | None = None
        failure: str | None = None
        try:
            self._wait_planner()
            status, failure = self._watch_loop(on_status)
            if failure is None:
                sock = self._planner()
                status = final_status(sock) or status
                transport.send(sock, Stop(reason="trainers finished"))
                self._wait_finished(timeout_s=30)
        except KeyboardInterrupt:
            failure = INTERRUPTED
        except LaunchError as exc:
            failure = str(exc)
        finally:
            if self.sock is not None:
                self.sock.close(linger=200)
            self.cancel()
        self._write_job_json(final_state(failure))
        return Outcome(failure is None, failure or "done", status, self.job)

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

    def _wait_finished(self, timeout_s: float) -> None:
        """After Stop every job ends by itself; whatever does not is cancelled afterwards."""
        live = {"RUNNING", "PENDING", "COMPLETING", "CONFIGURING"}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self._states()
            if not any(states.get(j.job_id) in live for _, j in self.submitted):
                return
            time.sleep(0.3)

    def _wait_planner(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.job.endpoint_file("planner").exists():
            self._raise_if_failed(self._states())
            if time.monotonic() > deadline:
                raise LaunchError(f"the planner job did not start within {timeout_s:.0f} s")
            time.sleep(0.2)

    def _states(self) -> dict[str, str]:
        return squeue_states([j.job_id for _, j in self.submitted])

    def _watch_loop(self, on_status: Callable[[Status], None]) -> tuple[Status | None, str | None]:
        status: Status | None = None
        next_check = 0.0
        while True:
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + POLL_S
                try:
                    if self._trainers_done(status):
                        return status, None
                    self._follow_rescales()
                    self._raise_if_failed(self._states())
                except LaunchError as exc:
                    return status, str(exc)
                transport.send(self._planner(), StatusRequest())
            reply = receive_status(self._planner(), POLL_S)
            if reply is not None:
                status = reply
                on_status(reply)

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
        # A killed rank's peers fail too, maybe first: let the killed one's record arrive.
        if self.failed_since is None:
            self.failed_since = time.monotonic()
        killed = [e for e in failed if e["code"] < 0]
        if not killed and time.monotonic() - self.failed_since < EXIT_GRACE_S:
            return False
        e = (killed or failed)[0]
        code = e["code"]
        how = f"was killed by {signal_name(code)}" if code < 0 else f"exited with code {code}"
        limit = self.recipe.recovery.restarts
        if killed and incarnations.counted(self.job) < limit:
            self._restart_trainers(f"rank {e['rank']}", f"killed by {signal_name(code)}")
            return False
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
            new = self._submit_one(self._executor(sub), sub, free_port(""))
        except Exception as exc:
            raise LaunchError(f"SLURM refused the trainer job again: {_first_line(exc)}") from None
        self.submitted[index] = (sub, new)
        self._write_job_json("running")

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


def _log_tail(job: Any) -> str:
    with contextlib.suppress(Exception):
        return tail(Path(job.paths.stderr), 8)
    return ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())[:300]


def job_ids(job: JobDir) -> list[str]:
    return [str(v) for v in job.read_json(job.job_json).get("slurm_jobs", {}).values()]
