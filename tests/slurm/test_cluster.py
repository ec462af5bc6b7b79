"""The test cluster places a submitit job's ranks node by node, and accounting reports its end."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import submitit

# The first job after a cold start once took ~8 s to start: wait generously, poll often.
JOB_TIMEOUT_S = 180
STATE_TIMEOUT_S = 60
POLL_S = 0.5


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def test_two_nodes_run_ranks_node_by_node(slurm_cluster: tuple[str, ...], tmp_path: Path) -> None:
    def where_am_i() -> tuple[str, int]:
        # Defined here so that cloudpickle sends it by value: the job cannot import this module.
        import os

        return os.environ["SLURMD_NODENAME"], int(os.environ["SLURM_PROCID"])

    first, second = slurm_cluster
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(slurm_partition="debug", nodes=2, tasks_per_node=2, timeout_min=5)
    job = executor.submit(where_am_i)

    assert wait_until(job.done, JOB_TIMEOUT_S), (
        f"job {job.job_id} not done after {JOB_TIMEOUT_S} s (state {job.state}); "
        f"stderr: {job.stderr()}"
    )
    assert job.results() == [(first, 0), (first, 1), (second, 2), (second, 3)]
    # sacct lags squeue by a few seconds.
    assert wait_until(
        lambda: job.get_info(mode="force").get("State") == "COMPLETED", STATE_TIMEOUT_S
    ), f"job {job.job_id} not COMPLETED in sacct after {STATE_TIMEOUT_S} s: {job.state}"
    assert job.state == "COMPLETED"
