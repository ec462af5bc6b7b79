"""`msd launch --cluster slurm` on the real test cluster (2 emulated nodes), against local."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from tests.conftest import base_recipe, read_rank_logs, run_msd, start_launch, wait_for_file


def recipe(data: Path, cluster: str, steps: int = 200) -> dict:
    r = base_recipe(data, steps=steps, distribute={"dp": 4})
    for s in r["sources"]:
        s["repeat"] = True
    r["cluster"] = cluster
    r["trainer"]["nodes"] = 2
    r["slurm"] = {"partition": "debug", "time_min": 10}
    return r


def msd(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_msd(*args, cwd=cwd, timeout=timeout)  # SLURM start-up takes longer


def job_folder(cwd: Path, name: str) -> Path:
    (folder,) = (cwd / "runs").glob(f"{name}-*")
    return folder


def squeue_ids() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()


def test_slurm_run_places_roles_and_matches_the_local_stream(slurm_cluster, small_data, tmp_path):
    """On SLURM, payloads relayed from one node's Constructor to the other's (fan-out 1);
    locally, sent straight to each (two simulated nodes): the same batches."""
    for cluster in ("slurm", "local"):
        r = recipe(small_data, cluster)
        r["name"] = cluster
        if cluster == "slurm":
            r["constructor"] = {"fanout": 1}
        (tmp_path / f"{cluster}.yaml").write_text(yaml.safe_dump(r))
        started = time.monotonic()
        result = msd("launch", f"{cluster}.yaml", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert ("SLURM jobs: planner planner " in result.stdout) == (cluster == "slurm")
        print(f"{cluster}: {time.monotonic() - started:.1f} s")
    slurm_root, local_root = job_folder(tmp_path, "slurm"), job_folder(tmp_path, "local")
    slurm_logs, local_logs = read_rank_logs(slurm_root), read_rank_logs(local_root)
    assert sorted(slurm_logs) == [0, 1, 2, 3]
    for rank in range(4):
        assert [r["digest"] for r in slurm_logs[rank]] == [r["digest"] for r in local_logs[rank]]
        assert {r["node"] for r in slurm_logs[rank]} == {"n1" if rank < 2 else "n2"}
    for node in ("n1", "n2"):
        assert (slurm_root / "endpoints" / f"constructor-{node}").exists()
    said = [p.read_text() for p in slurm_root.glob("logs/constructor-*.log")]
    assert sum("of 2; relays to [1]" in log for log in said) == 1, said  # and 0 to none
    local = [p.read_text() for p in local_root.glob("logs/constructor-*.log")]
    assert len(local) == 2 and not any("relays" in log for log in local)  # sent straight
    jobs = json.loads((slurm_root / "job.json").read_text())["slurm_jobs"]
    loader_jobs = {v for k, v in jobs.items() if k.startswith("loader ")}
    assert len(loader_jobs) == 6, "each loader is its own SLURM job"
    assert not set(jobs.values()) & set(squeue_ids())


def test_an_impossible_request_fails_at_submission(slurm_cluster, small_data, tmp_path):
    r = recipe(small_data, "slurm")
    r["slurm"]["planner"] = {"cpus": 512}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(r))
    result = msd("launch", "big.yaml", cwd=tmp_path, timeout=60)
    assert result.returncode != 0
    assert "SLURM refused the planner job" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_cancelled_loader_is_reported_not_hung(slurm_cluster, small_data, tmp_path):
    r = recipe(small_data, "slurm", steps=100000)
    r["trainer"]["demo"]["step_ms"] = 20
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(r))
    launcher = start_launch(tmp_path, "long.yaml")
    try:
        log = wait_for_file(tmp_path, "runs/*/trainer/rank-0.jsonl", launcher, lines=5)
        jobs = json.loads((log.parents[1] / "job.json").read_text())["slurm_jobs"]
        subprocess.run(["scancel", jobs["loader web/0"]], check=True)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode != 0
        assert "loader web/0" in err and "CANCELLED" in err
        assert not set(jobs.values()) & set(squeue_ids())
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_msd_stop_leaves_no_job_and_no_process(slurm_cluster, small_data, tmp_path):
    import psutil

    r = recipe(small_data, "slurm", steps=100000)
    r["trainer"]["demo"]["step_ms"] = 20
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(r))
    launcher = start_launch(tmp_path, "long.yaml")
    try:
        wait_for_file(tmp_path, "runs/*/trainer/rank-3.jsonl", launcher)
        (job,) = tmp_path.glob("runs/*")
        jobs = json.loads((job / "job.json").read_text())["slurm_jobs"]
        stopped = msd("stop", str(job), cwd=tmp_path, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert not set(jobs.values()) & set(squeue_ids())
        launcher.communicate(timeout=60)
        left = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(job) in cmdline or f"{job.name}/slurm" in cmdline:
                left.append(cmdline)
        assert left == []
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_rescale_on_slurm_submits_new_loader_jobs_and_keeps_the_stream(
    slurm_cluster, small_data, tmp_path
):
    for cluster in ("local", "slurm"):
        r = recipe(small_data, cluster, steps=300)
        r["name"] = cluster
        r["trainer"]["demo"]["step_ms"] = 60
        (tmp_path / f"{cluster}.yaml").write_text(yaml.safe_dump(r))
    local = msd("launch", "local.yaml", cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    launcher = start_launch(tmp_path, "slurm.yaml")
    try:
        log = wait_for_file(tmp_path, "runs/slurm-*/trainer/rank-0.jsonl", launcher, lines=5)
        root = log.parent.parent
        scaled = msd("rescale", str(root), "--source", "web", "--loaders", "1", cwd=tmp_path)
        status = msd("status", str(root), "--json", cwd=tmp_path)
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert scaled.returncode == 0, scaled.stderr
    assert launcher.returncode == 0, out + err
    view = json.loads(status.stdout)
    assert view["cluster"] == "slurm" and view["job"]["step"] < 300
    assert {j["role"] for j in view["slurm"]} >= {"planner planner", "trainer trainer"}
    jobs = json.loads((root / "job.json").read_text())["slurm_jobs"]
    assert "loader web@1/0" in jobs, "the new loader is a new SLURM job"
    assert {p.name for p in (root / "retired").iterdir()} >= {"web-0", "web-1"}
    slurm_logs, local_logs = read_rank_logs(root), read_rank_logs(job_folder(tmp_path, "local"))
    for rank in range(4):
        assert [r["digest"] for r in slurm_logs[rank]] == [r["digest"] for r in local_logs[rank]]
    assert not set(jobs.values()) & set(squeue_ids())


def test_restore_on_slurm_continues_a_local_runs_stream(slurm_cluster, small_data, tmp_path):
    """A local run's checkpoint restored on SLURM: the same batches from its step on."""
    r = recipe(small_data, "local", steps=120)
    r["checkpoint"] = {"every_steps": 40}
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(r))
    result = msd("launch", "local.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    local_root = job_folder(tmp_path, "t")
    snapshot = local_root / "checkpoints" / "step-00000080.json"
    result = msd(
        "restore", str(snapshot), "--cluster", "slurm", "--run-dir", "restored", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (restored,) = (tmp_path / "restored").iterdir()
    before, after = read_rank_logs(local_root), read_rank_logs(restored)
    assert sorted(after) == [0, 1, 2, 3]
    for rank in range(4):
        assert [r["step"] for r in after[rank]] == list(range(80, 120))
        assert [r["digest"] for r in after[rank]] == [r["digest"] for r in before[rank][80:]]
    assert not set(json.loads((restored / "job.json").read_text())["slurm_jobs"].values()) & set(
        squeue_ids()
    )
