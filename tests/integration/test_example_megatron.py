"""examples/megatron_pretrain.py under `msd launch`: two ranks (gloo, CPU) train megatron-core's
GPTModel on msd's batches through ``msd.integrations.megatron.get_batch``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_recipe, run_msd

pytest.importorskip("megatron.core")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "megatron_pretrain.py"
STEPS = 40
RANKS = 2
SEQ_LEN = 128


def test_the_megatron_example_trains_every_rank_on_the_whole_stream(
    small_data: Path, tmp_path: Path
) -> None:
    doc = base_recipe(
        small_data,
        steps=STEPS,
        seq_len=SEQ_LEN,
        global_batch_tokens=RANKS * 2 * SEQ_LEN,
        distribute={"dp": RANKS},
        loader={"sources_per_process": 3},  # one loader process: the CPUs go to the ranks
    )
    for source in doc["sources"]:
        source["repeat"], source["loaders"] = True, 1
    doc["trainer"] = {"command": f"python {EXAMPLE} --lr 3e-3"}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = run_msd("launch", "r.yaml", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    (job,) = (tmp_path / "runs").iterdir()
    logs = {}
    for rank in range(RANKS):
        lines = (job / "trainer" / f"megatron-rank-{rank}.jsonl").read_text().splitlines()
        logs[rank] = [json.loads(line) for line in lines]
    losses = [r["loss"] for r in logs[0]]
    for records in logs.values():
        assert [r["step"] for r in records] == list(range(STEPS))
        assert [r["loss"] for r in records] == losses  # the global mean: one number per step
        assert all(r["tokens"] > 0 for r in records)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, losses
