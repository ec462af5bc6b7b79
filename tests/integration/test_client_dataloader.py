"""``torch.utils.data.DataLoader(client)``: read in the trainer's process (``num_workers=0``) it
hands out the Client's batches and its ``state_dict()`` follows them; a worker process is
refused in one sentence, before it reads anything."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
import torch
import yaml

from msd.client import Client
from msd.errors import LaunchError
from msd.launch import procs
from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe
from tests.conftest import base_recipe, processes_of_launcher

STEPS = 4


def test_a_dataloader_reads_the_client_in_its_own_process_and_refuses_workers(
    small_data: Path, tmp_path: Path
) -> None:
    recipe = base_recipe(small_data, steps=STEPS, distribute={"dp": 1}, global_batch_tokens=1024)
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    parsed = load_recipe(recipe_path)
    # A trainer that never reads: this test reads the one rank's stream itself.
    idle = msgspec.structs.replace(parsed.trainer, command="sleep 60")
    job = LocalJob(
        msgspec.structs.replace(parsed, trainer=idle), recipe_path.read_text(), tmp_path / "runs"
    )
    job.start()
    try:
        client = Client(job=job.job.root, rank=0, world_size=1, local_rank=0, timeout_s=120)
        workers = torch.utils.data.DataLoader(client, batch_size=None, num_workers=1)
        with pytest.raises(LaunchError, match=r"DataLoader worker.*use .*num_workers=0"):
            next(iter(workers))
        assert client.state_dict()["step"] == 0
        steps = []
        for batch in torch.utils.data.DataLoader(client, batch_size=None, num_workers=0):
            assert batch["input_ids"].shape == (2, 512)
            steps.append(client.state_dict()["step"])
        assert steps == list(range(1, STEPS + 1))
        client.close()
    finally:
        procs.stop_all(job.children)
    assert processes_of_launcher(os.getpid()) == []
