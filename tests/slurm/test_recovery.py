"""Failures survived on the real SLURM test cluster (2 emulated nodes): kill -9 of the Planner, a
node's Constructor and a loader whose source has a shadow; a time-limit signal to the Planner's
job and to the trainer job (submitit checkpoints and requeues them). Every rank's stream must
equal the run without failure, and nothing of the job may be left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import (
    LaunchFailed,
    assert_launch_ok,
    base_recipe,
    read_rank_logs,
    start_launch,
)

STEPS = 200


def recipe(data: Path, cluster: str) -> dict[str, Any]:
    doc = base_recipe(data, steps=STEPS, distribute={"dp": 4}, checkpoint={"every_steps": 25})
    for s in doc["sources"]:
        s["repeat"] = True
    doc["sources"][0]["shadows"] = 1
    doc["loader"] = {"heartbeat_s": 2}
    doc["cluster"] = cluster
    doc["name"] = cluster
    doc["trainer"]["nodes"] = 2
    doc["trainer"]["demo"]["step_ms"] = 20
    doc["slurm"] = {"partition": "debug", "time_min": 10}
    return doc


def digests(job: Path) -> dict[tuple[int, int], set[str]]:
    """Per rank and step, every digest the rank logged (a requeued rank logs a step again)."""
    found: dict[tuple[int, int], set[str]] = {}
    for rank, records in read_rank_logs(job).items():
        for r in records:
            found.setdefault((rank, r["step"]), set()).add(r["digest"])
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> dict:
    """The same stream without failures (the local launcher gives SLURM's, tests/slurm/
    test_launch.py shows)."""
    root = tmp_path_factory.mktemp("reference")
    (root / "r.yaml").write_text(yaml.safe_dump(recipe(small_data, "local")))
    proc = start_launch(root, "r.yaml")
    out, err = proc.communicate(timeout=240)
    assert_launch_ok(proc, out, err)
    (job,) = (root / "runs").iterdir()
    found = digests(job)
    assert len(found) == 4 * STEPS
    return found


def role_pid(job: Path, *marks: str) -> int:
    """The running role process of ``job`` whose command line has every mark."""
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or []) + " "
        if "msd.roles" in line and f"--job {job} " in line and all(m in line for m in marks):
            return p.pid
    raise AssertionError(f"no running {' '.join(marks)} of {job}")


def trainer_pid(job: Path, rank: int) -> int:
    """Rank ``rank``'s demo trainer process of ``job``."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        line = " ".join(p.info["cmdline"] or [])
        mine = env.get("MSD_JOB") == str(job) and env.get("RANK") == str(rank)
        if "msd.trainer.demo" in line and mine:
            return p.pid
    raise AssertionError(f"no running trainer rank {rank} of {job}")


def job_processes(job: Path) -> list[str]:
    left = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if str(job) in line and p.pid != os.getpid():
            left.append(line)
    return left


def wait_for_step(cwd: Path, step: int, launcher: subprocess.Popen[str]) -> Path:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and launcher.poll() is None:
        for log in cwd.glob("runs/*/trainer/rank-3.jsonl"):
            if len(log.read_text().splitlines()) > step:
                return log.parents[1]
        time.sleep(0.1)
    raise LaunchFailed(f"step {step} was not reached", launcher)


# How long after the requeue the job is let start again. Not at once: slurmd refuses to start a
# job whose new credential is dated the same second (whole seconds) as the revocation of its
# previous run's ("error: Job N already killed, do not launch batch job"; slurmctld: "Killing
# non-startable batch JobId=N: Job credential revoked"), and the job ends FAILED, which stops
# the run. SLURM's own BeginTime (~2 minutes) never meets it.
RELEASE_AFTER_S = 2.0


def release_when_requeued(job_id: str) -> None:
    """SLURM makes a requeued job wait ~2 minutes before it may start again (its BeginTime);
    as the cluster's admin, let it start ``RELEASE_AFTER_S`` after the requeue."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shown = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True
        ).stdout
        if "Restarts=1 " in shown and "JobState=PENDING" in shown:
            time.sleep(RELEASE_AFTER_S)
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
            return
        time.sleep(0.2)
    raise AssertionError(f"SLURM job {job_id} was not requeued: {shown}")


def slurm_job(job: Path, label: str) -> str:
    return str(json.loads((job / "job.json").read_text())["slurm_jobs"][label])


def run_with_faults(cwd: Path, data: Path, faults: list[tuple[int, Any]]) -> Path:
    """Launch on SLURM; at each (step, fault) apply fault(job folder); return the job folder
    once the launcher has finished the run."""
    (cwd / "slurm.yaml").write_text(yaml.safe_dump(recipe(data, "slurm")))
    launcher = start_launch(cwd, "slurm.yaml")
    try:
        for step, fault in faults:
            fault(wait_for_step(cwd, step, launcher))
        out, err = launcher.communicate(timeout=300)
    except LaunchFailed:
        raise
    except (AssertionError, subprocess.SubprocessError) as exc:  # a fault failed, or a timeout
        raise LaunchFailed(f"the run failed: {exc}", launcher) from None
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for job_json in cwd.glob("runs/*/job.json"):  # a killed launcher cannot cancel its jobs
            if launcher.returncode != 0:
                ids = json.loads(job_json.read_text()).get("slurm_jobs", {}).values()
                subprocess.run(["scancel", *map(str, ids)], check=False)
    assert_launch_ok(launcher, out, err)
    job = next(iter(cwd.glob("runs/*/job.json"))).parent
    assert job is not None
    return job


def assert_same_stream_and_nothing_left(job: Path, reference: dict) -> None:
    got = digests(job)
    assert got.keys() == reference.keys()
    assert all(got[k] == reference[k] for k in reference), "a rank received other batches"
    ids = set(json.loads((job / "job.json").read_text())["slurm_jobs"].values())
    queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    assert not ids & set(queued.stdout.split())
    assert job_processes(job) == []


def test_killed_roles_are_recovered_on_slurm(slurm_cluster, small_data, reference, tmp_path):
    """The Planner (step 40), node n2's Constructor (90), a shadowed loader (140) and trainer
    rank 1 (170) of one run."""
    job = run_with_faults(
        tmp_path,
        small_data,
        [
            (40, lambda job: os.kill(role_pid(job, "planner"), signal.SIGKILL)),
            (90, lambda job: os.kill(role_pid(job, "constructor", "--node n2 "), signal.SIGKILL)),
            (140, lambda job: os.kill(role_pid(job, "loader", "--name web/0 "), signal.SIGKILL)),
            (170, lambda job: os.kill(trainer_pid(job, 1), signal.SIGKILL)),
        ],
    )
    assert_same_stream_and_nothing_left(job, reference)
    restarts = [json.loads(p.read_text()) for p in sorted((job / "restarts").glob("*.json"))]
    assert [(r["role"], r["cause"]) for r in restarts if r["counted"]] == [
        ("planner", "killed by SIGKILL"),
        ("constructor", "killed by SIGKILL"),
        ("trainer", "killed by SIGKILL"),
    ]
    # After the trainers' restart, ranks a step apart go back to the step they all finished.
    others = [(r["role"], r["cause"]) for r in restarts if not r["counted"]]
    assert set(others) <= {("planner", "went back to an earlier step")}, restarts
    (takeover,) = json.loads((job / "shadows.json").read_text())["takeovers"]
    assert takeover["lost"] == "web/0"
    jobs = json.loads((job / "job.json").read_text())["slurm_jobs"]
    assert "loader web~shadow-1" in jobs, "a new shadow was submitted for the one that took over"


def test_a_time_limit_requeues_the_job_and_the_run_resumes(
    slurm_cluster, small_data, reference, tmp_path
):
    """SIGUSR2 (what SLURM sends before the time limit) to the Planner's job at step 40 and to
    the trainer job at step 110: submitit requeues each; the run continues where it was."""

    def time_limit(label: str) -> Any:
        def send(job: Path) -> None:
            job_id = slurm_job(job, label)
            subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
            release_when_requeued(job_id)

        return send

    job = run_with_faults(
        tmp_path,
        small_data,
        [(40, time_limit("planner planner")), (110, time_limit("trainer trainer"))],
    )
    assert_same_stream_and_nothing_left(job, reference)
    restarts = [json.loads(p.read_text()) for p in sorted((job / "restarts").glob("*.json"))]
    requeued = [r for r in restarts if r["cause"] == "requeued by SLURM"]
    assert [r["role"] for r in requeued] == ["planner", "constructor"], restarts
    assert not any(r["counted"] for r in restarts)
