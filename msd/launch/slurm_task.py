"""What runs inside each SLURM allocation (submitted by ``msd.launch.slurm`` through submitit).

Roles run in the job's own process, so their SIGTERM handler (drain, exit) is what ``scancel``
reaches, not submitit's, which ignores the signal. Every role binds on all interfaces and
publishes its node's name, so peers on other nodes can reach it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from msd.errors import LaunchError
from msd.jobdir import JobDir


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _network_env() -> None:
    os.environ["MSD_BIND_HOST"] = "0.0.0.0"
    os.environ["MSD_ADVERTISE_HOST"] = _node()


def run_role(argv: list[str]) -> None:
    """A Planner or loader job: one role process for the whole job."""
    from msd.roles.__main__ import main

    _network_env()
    code = main(argv)
    if code != 0:
        raise LaunchError(f"{argv[0]} exited with code {code}; see this job's log")


def run_trainer_task(job: str, per_node: int, command: str, master_port: int) -> None:
    """One task of the trainer job: the node's Constructor (last local task) or a trainer rank."""
    import submitit

    # submitit's job process ignores SIGTERM (it waits for SLURM's SIGKILL, seconds later);
    # a rank that is cancelled should just go.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    env = submitit.JobEnvironment()
    node, local = env.node, env.local_rank
    os.environ["MSD_NODE"] = _node()
    if local == per_node:
        ranks = ",".join(str(node * per_node + r) for r in range(per_node))
        run_role(["constructor", "--job", job, "--node", _node(), "--ranks", ranks])
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
    code = 1
    try:
        code = _run_trainer(command)
    finally:
        # The launcher stops the data plane (and so the Constructor tasks) once every rank is
        # done; SLURM cannot tell it, since the job ends only when all of its tasks do.
        folder = JobDir(job)
        exit_file = folder.trainer / f"exit-{rank}.json"
        folder.write_json(exit_file, {"rank": rank, "code": code, "node": _node()})
    if code != 0:
        raise LaunchError(f"trainer rank {rank} exited with code {code}")


def _run_trainer(command: str) -> int:
    if command == "demo":
        from msd.trainer.demo import main

        main()
        return 0
    from msd.launch.procs import command_argv

    child = subprocess.Popen(command_argv(command))
    signal.signal(signal.SIGTERM, lambda signum, frame: child.terminate())
    return child.wait()


if __name__ == "__main__":  # pragma: no cover - for manual use inside an allocation
    run_role(sys.argv[1:])
