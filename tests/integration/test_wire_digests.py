"""Every batch byte as the release before the compact wire delivered it: per rank and step,
the demo trainer's digests of text (with a vocabulary above 65,536 and split samples),
context-parallel and pipeline-stage batches, and image batches (tests/wire_digests.py)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests import wire_digests

RECORDED = Path(__file__).with_name("wire_digests.json")


def test_every_rank_gets_the_batches_the_previous_wire_delivered(tmp_path):
    wire_digests.make_data(tmp_path / "data")
    cases = wire_digests.recipes(tmp_path / "data")
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = {
            name: pool.submit(wire_digests.run_case, recipe, tmp_path / name)
            for name, recipe in cases.items()
        }
        found = {name: run.result() for name, run in runs.items()}
    recorded = json.loads(RECORDED.read_text())
    assert set(found) == set(recorded)
    for name, ranks in recorded.items():
        assert found[name].keys() == ranks.keys(), name
        for rank, digests in ranks.items():
            assert found[name][rank] == digests, f"{name}: rank {rank} got other batches"
