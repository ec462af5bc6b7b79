"""What runs inside each SLURM allocation (submitted by ``msd.launch.slurm`` through submitit).

Each data role runs under a supervisor (``msd.launch.supervise``) that restarts the data plane
when a role dies. Every role binds on all interfaces and publishes its node's name, so peers on
other nodes can reach it.

Both tasks are submitit ``Checkpointable``: near the time limit (SIGUSR2) or on preemption,
submitit requeues the job with the same arguments; a requeued data role starts the data plane's
next incarnation, requeued trainer ranks resume from their own checkpoints.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import submitit

from msd import logs
from msd.errors import LaunchError
from msd.jobdir import JobDir


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _network_env() -> None:
    os.environ["MSD_BIND_HOST"] = "0.0.0.0"
    os.environ["MSD_ADVERTISE_HOST"] = _node()


def supervise(role: str, job: str, name: str, *args: str) -> None:
    """Run one data role under a supervisor until the run ends; raise if it failed."""
    from msd.launch.procs import role_argv
    from msd.launch.supervise import Supervisor

    _network_env()
    folder = JobDir(job)
    supervisor = Supervisor(folder, role, name, role_argv(role, folder.root, *args))
    if threading.current_thread() is threading.main_thread():
        supervisor.stop_on_sigterm()
    code = supervisor.run()
    if code != 0:
        raise LaunchError(f"{role} {name} exited with code {code}; see this job's log")


class RoleTask(submitit.helpers.Checkpointable):
    """A Planner or loader job: ``msd.roles`` arguments ``[ROLE, --job, DIR, ...]``."""

    def __call__(self, argv: list[str]) -> None:
        role, job, extra = argv[0], argv[2], argv[3:]
        name = extra[1] if role == "loader" else role
        logs.setup(role, name)  # the supervisor's lines go to the SLURM job's stderr
        supervise(role, job, name, *extra)


class TrainerTask(submitit.helpers.Checkpointable):
    """One task of the trainer job: a trainer rank, or (the last task on each node) the
    node's Constructor."""

    def __call__(self, job: str, per_node: int, command: str, master_port: int) -> None:
        run_trainer_task(job, per_node, command, master_port)


def run_trainer_task(job: str, per_node: int, command: str, master_port: int) -> None:
    """One task of the trainer job: the node's Constructor (last local task) or a trainer rank."""
    # submitit's job process ignores SIGTERM (it waits for SLURM's SIGKILL, seconds later);
    # a rank that is cancelled should just go.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    env = submitit.JobEnvironment()
    node, local = env.node, env.local_rank
    os.environ["MSD_NODE"] = _node()
    if local == per_node:
        ranks = ",".join(str(node * per_node + r) for r in range(per_node))
        logs.setup("constructor", _node())
        supervise("constructor", job, _node(), "--node", _node(), "--ranks", ranks)
        return
    rank = node * per_node + local
    os.environ.update(
        {
            "MSD_JOB": job,
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(per_node * env.num_nodes),
            "LOCAL_WORLD_SIZE": str(per_node),
            "MASTER_ADDR": env.hostnames[0],
            "MASTER_PORT": str(master_port),
        }
    )
    # The launcher stops the data plane (and so the Constructor tasks) once every rank is done;
    # SLURM cannot tell it, since the job ends only when all of its tasks do. A rank killed by a
    # signal is reported as such (the launcher restarts the trainers); one stopped by SIGTERM
    # (scancel) or by submitit requeueing the job (SystemExit) is not reported at all.
    try:
        code = _run_trainer(command)
    except Exception:
        _write_exit(job, rank, 1)
        raise
    if code is None:
        return
    _write_exit(job, rank, code)
    if code != 0:
        raise LaunchError(f"trainer rank {rank} exited with code {code}")


def _write_exit(job: str, rank: int, code: int) -> None:
    """The rank's exit code, for the launcher, with the SLURM job and its restart count it is
    of: a rank whose peer left because the job is being requeued or replaced fails, and that is
    not the run's failure."""
    folder = JobDir(job)
    record = {
        "rank": rank,
        "code": code,
        "node": _node(),
        "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    }
    folder.write_json(folder.trainer / f"exit-{rank}.json", record)


def _run_trainer(command: str) -> int | None:
    """The rank's trainer as a child process, so a death by a signal is seen (it ignores
    SIGUSR2: near the time limit that is for submitit, which requeues the job); None when this
    task was told to stop (SIGTERM)."""
    from msd.launch.procs import command_argv, die_with_parent_deaf_to_usr2

    argv = (
        [sys.executable, "-m", "msd.trainer.demo"] if command == "demo" else command_argv(command)
    )
    child = subprocess.Popen(argv, preexec_fn=die_with_parent_deaf_to_usr2)
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        child.terminate()

    signal.signal(signal.SIGTERM, stop)
    code = child.wait()
    return None if stopped else code


if __name__ == "__main__":  # pragma: no cover - for manual use inside an allocation
    RoleTask()(sys.argv[1:])  # type: ignore[no-untyped-call]
