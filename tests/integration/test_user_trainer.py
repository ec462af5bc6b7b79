"""A user's own trainer command, launched once per rank by `msd launch`, reading `msd.Client`.

The trainer scripts are written into tmp_path and launched through the real CLI
(``trainer: {command: "python train.py ..."}``); each rank records what it saw in a JSON file.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import base_recipe, processes_of_launcher

PATH = os.environ.get("PATH", "")
KEYS = {
    "input_ids",
    "labels",
    "position_ids",
    "cu_seqlens",
    "sample_ids",
    "source_ids",
    "sample_offsets",
}
ENV_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MSD_JOB",
)

TRAIN_PY = '''
"""A user trainer: gloo process group from env://, the whole stream from msd.Client."""
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

import msd

ENV_VARS = __ENV_VARS__


def main() -> int:
    tag, mode = sys.argv[1], sys.argv[2]          # mode: direct | dataloader
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
    exit_code = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")               # MASTER_ADDR/PORT, RANK, WORLD_SIZE
    client = msd.Client()
    stream = (
        torch.utils.data.DataLoader(client, batch_size=None) if mode == "dataloader" else client
    )
    batches, keys, digests = 0, set(), []
    for batch in stream:
        batches += 1
        keys.update(batch)
        digests.append(hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest())
        if limit is not None and batches >= limit:
            break
    counts = torch.tensor([batches, -batches])
    if exit_code == 0:
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)  # the group really works
    record = {
        "env": {name: os.environ.get(name) for name in ENV_VARS},
        "batches": batches,
        "max_batches": int(counts[0]),
        "min_batches": -int(counts[1]),
        "keys": sorted(keys),
        "digests": digests,
        "dist_rank": dist.get_rank(),
        "dist_world": dist.get_world_size(),
    }
    os.makedirs("out", exist_ok=True)
    with open(f"out/{tag}-rank-{rank}.json", "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()
    return exit_code if rank == 1 else 0


if __name__ == "__main__":
    sys.exit(main())
'''.replace("__ENV_VARS__", repr(ENV_VARS))


def msd_launch(tmp_path: Path, recipe: dict[str, Any], name: str = "recipe.yaml") -> tuple:
    """Run `msd launch` to the end; return (process, stdout, stderr, processes left)."""
    (tmp_path / "train.py").write_text(TRAIN_PY)
    (tmp_path / name).write_text(yaml.safe_dump(recipe, sort_keys=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "msd.cli", "launch", name],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As in an activated virtualenv: `python` in the trainer command is this interpreter.
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        },
    )
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    deadline = time.monotonic() + 5
    while (left := processes_of_launcher(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    return proc, out, err, left


def trainer_logs(tmp_path: Path) -> str:
    """The trainer ranks' logs, for a failed launch's message."""
    return "".join(
        f"\n--- {log.name}\n{log.read_text()[-3000:]}"
        for log in sorted((tmp_path / "runs").glob("*/logs/trainer-*.log"))
    )


def job_folder(tmp_path: Path) -> Path:
    """The one job folder the launch created under runs/."""
    (root,) = (tmp_path / "runs").iterdir()
    return root.resolve()


def rank_records(tmp_path: Path, tag: str) -> dict[int, dict[str, Any]]:
    records = {}
    for path in sorted((tmp_path / "out").glob(f"{tag}-rank-*.json")):
        records[int(path.stem.rsplit("-", 1)[1])] = json.loads(path.read_text())
    return records


def user_recipe(data: Path, command: str, dp: int, **overrides: Any) -> dict[str, Any]:
    recipe = base_recipe(data, distribute={"dp": dp}, **overrides)
    recipe["trainer"] = {"command": command}
    return recipe


@pytest.mark.parametrize("dp", [2, 4])
def test_user_command_gets_the_rank_environment_and_the_whole_stream(small_data, tmp_path, dp):
    recipe = user_recipe(small_data, "python train.py env direct", dp, steps=5)
    proc, out, err, left = msd_launch(tmp_path, recipe)
    assert proc.returncode == 0, out + err + trainer_logs(tmp_path)
    assert left == []
    job = job_folder(tmp_path)
    records = rank_records(tmp_path, "env")
    assert sorted(records) == list(range(dp))
    ports = {r["env"]["MASTER_PORT"] for r in records.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, r in records.items():
        env = r["env"]
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == str(dp) and env["LOCAL_WORLD_SIZE"] == str(dp)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert Path(env["MSD_JOB"]) == job
        assert (r["dist_rank"], r["dist_world"]) == (rank, dp)
        assert r["batches"] == r["max_batches"] == r["min_batches"] == 5
        assert set(r["keys"]) == KEYS
    # The ranks got different shares of each step.
    assert len({r["digests"][0] for r in records.values()}) == dp


def test_run_ends_when_trainers_exit_before_the_stream_does(small_data, tmp_path):
    recipe = user_recipe(small_data, "python train.py early direct 3", 2, steps=100000)
    for s in recipe["sources"]:
        s["repeat"] = True
    started = time.monotonic()
    proc, out, err, left = msd_launch(tmp_path, recipe)
    took = time.monotonic() - started
    assert proc.returncode == 0, out + err
    assert "Traceback" not in out + err and err == ""
    assert left == []
    assert took < 30
    records = rank_records(tmp_path, "early")
    assert sorted(records) == [0, 1]
    assert all(r["batches"] == 3 for r in records.values())
    job = json.loads((job_folder(tmp_path) / "job.json").read_text())
    assert job["state"] == "done"


def test_a_trainer_exiting_non_zero_fails_the_launch(small_data, tmp_path):
    # Both ranks read two batches of a long stream; then rank 1 exits with 3, rank 0 with 0.
    recipe = user_recipe(small_data, "python train.py bad direct 2 3", 2, steps=100000)
    for s in recipe["sources"]:
        s["repeat"] = True
    proc, out, err, left = msd_launch(tmp_path, recipe)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err
    assert left == []
    assert "error: trainer rank 1 (pid " in err
    assert "exited with code 3" in err
    job = job_folder(tmp_path)
    assert f"Log: {job / 'logs' / 'trainer-rank-1.log'}" in err


def test_client_as_a_dataloader_dataset_gives_the_same_batches(small_data, tmp_path):
    direct = user_recipe(small_data, "python train.py direct direct", 2, steps=6)
    proc, out, err, left = msd_launch(tmp_path, direct, "direct.yaml")
    assert proc.returncode == 0, out + err
    loader = user_recipe(small_data, "python train.py loader dataloader", 2, steps=6)
    proc, out, err, left = msd_launch(tmp_path, loader, "loader.yaml")
    assert proc.returncode == 0, out + err
    assert left == []
    first, second = rank_records(tmp_path, "direct"), rank_records(tmp_path, "loader")
    assert sorted(first) == sorted(second) == [0, 1]
    for rank in (0, 1):
        assert len(first[rank]["digests"]) == 6
        assert second[rank]["digests"] == first[rank]["digests"]
        assert set(second[rank]["keys"]) == KEYS
