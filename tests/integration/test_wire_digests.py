"""Every batch byte as the release before the compact wire delivered it: per rank and step,
the demo trainer's digests of text (with a vocabulary above 65,536 and split samples),
context-parallel and pipeline-stage batches, and image batches (tests/wire_digests.py). The
image batches were recorded again when JPEGs came to be decoded at full size by default; with
``vision.decode: fast`` they are the earlier bytes (``vlm-fast``)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests import wire_digests

RECORDED = Path(__file__).with_name("wire_digests.json")


def run_all(cases: dict[str, dict[str, Any]], root: Path) -> dict[str, wire_digests.Digests]:
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = {
            name: pool.submit(wire_digests.run_case, recipe, root / name)
            for name, recipe in cases.items()
        }
        return {name: run.result() for name, run in runs.items()}


def test_every_rank_gets_the_batches_the_previous_wire_delivered(tmp_path):
    wire_digests.make_data(tmp_path / "data")
    found = run_all(wire_digests.recipes(tmp_path / "data"), tmp_path)
    recorded = json.loads(RECORDED.read_text())
    assert set(found) == set(recorded)
    for name, ranks in recorded.items():
        assert found[name].keys() == ranks.keys(), name
        for rank, digests in ranks.items():
            assert found[name][rank] == digests, f"{name}: rank {rank} got other batches"


def test_payloads_relayed_through_constructors_change_no_batch(tmp_path):
    """Text, context-parallel and image jobs on 2–4 simulated nodes, every payload relayed
    along a chain of Constructors (fan-out 1): each rank gets the one-node run's batches."""
    wire_digests.make_data(tmp_path / "data")
    cases = wire_digests.relayed(wire_digests.recipes(tmp_path / "data"))
    found = run_all(cases, tmp_path)
    recorded = json.loads(RECORDED.read_text())
    for name, ranks in found.items():
        assert ranks.keys() == recorded[name].keys(), name
        for rank, digests in recorded[name].items():
            assert ranks[rank] == digests, f"{name}, relayed: rank {rank} got other batches"
    logs = [p.read_text() for p in tmp_path.glob("hybrid/runs/*/logs/constructor-*.log")]
    relaying = [log for log in logs if re.search(r"relays to \[\d", log)]
    assert len(logs) == 4 and len(relaying) == 3  # a chain: all but the last pass payloads on
