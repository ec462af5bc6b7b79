"""A trainer the user launches with their own sbatch script attaches to an msd data plane."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.conftest import base_recipe, read_rank_logs, start_launch, wait_for_file

TRAIN = """
import json, os, sys
import msd
from msd.trainer.demo import batch_digest

client = msd.Client()
digests = [batch_digest(batch) for batch in client]
out = os.path.join(sys.argv[1], f"rank-{client.rank}.json")
with open(out, "w") as f:
    json.dump({"node": os.environ["SLURMD_NODENAME"], "digests": digests}, f)
"""

SBATCH = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --partition=debug
#SBATCH --time=5
#SBATCH --output={out}/attach-%j.out
export MSD_JOB="$1"
srun --nodes=2 --ntasks=2 --overlap {python} -m msd.cli sidecar "$MSD_JOB" &
srun --overlap {python} train.py {out}
wait
"""


def test_a_user_sbatch_job_reads_the_same_stream(slurm_cluster, small_data, tmp_path):
    recipe = base_recipe(small_data, steps=40, distribute={"dp": 4})
    recipe["slurm"] = {"partition": "debug", "time_min": 5}
    demo = dict(recipe.pop("trainer"))
    (tmp_path / "attach.yaml").write_text(yaml.safe_dump({**recipe, "cluster": "slurm"}))
    (tmp_path / "local.yaml").write_text(
        yaml.safe_dump({**recipe, "trainer": demo, "name": "local"})
    )
    (tmp_path / "train.py").write_text(TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "job.sh").write_text(SBATCH.format(out=out, python=sys.executable))

    cmd = [sys.executable, "-m", "msd.cli"]
    launcher = start_launch(tmp_path, "attach.yaml")
    try:
        wait_for_file(tmp_path, "runs/*/endpoints/planner", launcher)
        (job,) = tmp_path.glob("runs/t-*")
        subprocess.run(
            ["sbatch", "job.sh", str(job)], cwd=tmp_path, check=True, capture_output=True
        )
        _, err = launcher.communicate(timeout=180)
        assert launcher.returncode == 0, err
    finally:
        if launcher.poll() is None:
            subprocess.run([*cmd, "stop", str(next(tmp_path.glob("runs/t-*")))], check=False)
            launcher.kill()
    local = subprocess.run(
        [*cmd, "launch", "local.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert local.returncode == 0, local.stderr
    (local_job,) = tmp_path.glob("runs/local-*")
    expected = read_rank_logs(local_job)
    for rank in range(4):
        got = json.loads((out / f"rank-{rank}.json").read_text())
        assert got["node"] == ("n1" if rank < 2 else "n2")
        assert got["digests"] == [r["digest"] for r in expected[rank]]
