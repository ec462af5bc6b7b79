"""examples/torchrun_ddp.py on SLURM as its docstring runs it: `msd launch` of a recipe with
``cluster: slurm`` and no ``trainer:`` section, then `sbatch examples/torchrun_ddp.sbatch JOB`
(one `msd sidecar` per node, the ranks under srun) on the two-node test cluster. Every rank
must read the stream the demo trainer reads on the same recipe locally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.conftest import (
    assert_launch_ok,
    base_recipe,
    read_rank_logs,
    run_msd,
    start_launch,
    wait_for_file,
)

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "torchrun_ddp.sbatch"
RANKS = 4
JOB_END_TIMEOUT_S = 60
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def slurm_state(job_id: str) -> str:
    """The job's state as squeue shows it (finished jobs too, for a while); sacct lags."""
    done = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True
    )
    return done.stdout.strip()


def wait_for_end(job_id: str) -> str:
    deadline = time.monotonic() + JOB_END_TIMEOUT_S
    while (state := slurm_state(job_id)) not in FINAL_STATES and time.monotonic() < deadline:
        time.sleep(0.5)
    return state


def digests(folder: Path) -> dict[int, list[str]]:
    found = {}
    for path in sorted(folder.glob("rank-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert [d["step"] for d in lines] == list(range(len(lines))), path
        found[int(path.stem.split("-")[1])] = [d["digest"] for d in lines]
    return found


def test_the_example_under_srun_reads_the_demo_trainers_stream(
    slurm_cluster: tuple[str, ...], small_data: Path, tmp_path: Path
) -> None:
    recipe = base_recipe(small_data, steps=40, distribute={"dp": RANKS})
    recipe["slurm"] = {"partition": "debug", "time_min": 5}
    demo = recipe.pop("trainer")
    (tmp_path / "attach.yaml").write_text(yaml.safe_dump({**recipe, "cluster": "slurm"}))
    (tmp_path / "local.yaml").write_text(yaml.safe_dump({**recipe, "trainer": demo, "name": "d"}))
    out = tmp_path / "out"
    out.mkdir()

    launcher = start_launch(tmp_path, "attach.yaml")
    job: Path | None = None
    job_id: str | None = None
    try:
        wait_for_file(tmp_path, "runs/*/job.json", launcher)
        listed = run_msd("ls", "--json", cwd=tmp_path)
        (run,) = json.loads(listed.stdout)
        job = Path(run["path"])
        submitted = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--nodes=2",
                f"--ntasks-per-node={RANKS // 2}",
                "--partition=debug",
                "--time=5",
                f"--output={out}/slurm-%j.out",
                str(SBATCH),
                str(job),
                "--digests",
                str(out / "digests"),
            ],
            cwd=REPO,  # the script names the example by its path in the repository
            env={
                **os.environ,
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            },
            check=True,
            capture_output=True,
            text=True,
        )
        job_id = submitted.stdout.strip().split(";")[0]
        launch_out, launch_err = launcher.communicate(timeout=180)
    finally:
        if launcher.poll() is None:  # the test failed: stop the data plane and the user's job
            if job is not None:
                run_msd("stop", str(job), cwd=tmp_path, timeout=30)
            if job_id is not None:
                subprocess.run(["scancel", job_id], check=False)
            launcher.kill()
    assert_launch_ok(launcher, launch_out, launch_err)
    state = wait_for_end(job_id)
    if state not in FINAL_STATES:
        subprocess.run(["scancel", job_id], check=False)
    assert state == "COMPLETED", (state, *(p.read_text() for p in out.glob("slurm-*.out")))

    local = run_msd("launch", "local.yaml", cwd=tmp_path, timeout=180)
    assert local.returncode == 0, local.stderr
    (local_job,) = tmp_path.glob("runs/d-*")
    expected = {
        rank: [r["digest"] for r in lines] for rank, lines in read_rank_logs(local_job).items()
    }
    assert sorted(expected) == list(range(RANKS)) and all(expected.values())
    assert digests(out / "digests") == expected
    assert {p.name for p in job.glob("logs/constructor-*.log")} == {
        f"constructor-{node}.log" for node in slurm_cluster
    }
