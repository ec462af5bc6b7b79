"""Hybrid parallelism end to end: 16 trainer ranks = dp 2 × pp 2 × cp 2 × tp 2, real processes.

The jobs read a third of the small sources' samples (``SOURCES``): the tests check a whole
epoch, 22 steps instead of 67, which takes a fifth off the 16-rank run (each rank saves every
batch it gets)."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from msd.batch.cp_slice import unzigzag
from msd.launch.job import Outcome
from msd.launch.local import LocalJob
from msd.plan.topology import Coords, Topology
from msd.recipe.load import load_recipe
from msd.synth.text import synth, synth_table
from tests.conftest import SMALL_SOURCES, base_recipe, processes_of_launcher, read_rank_logs

SEQ = 512
# The small sources' shapes (and names: ``base_recipe`` names them), a third of their samples:
# books (median 300 tokens, up to 700) still has samples longer than SEQ, split across
# sequences (``test_every_piece_reaches_every_role_once`` checks that some are).
SOURCES = tuple(dataclasses.replace(s, num_samples=s.num_samples // 3) for s in SMALL_SOURCES)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hybrid-data")
    synth(root, SOURCES, seed=5, files_per_source=2, rows_per_row_group=16)
    return root


def run(data: Path, tmp: Path, name: str, **distribute: int) -> Outcome:
    """One finite epoch of the small sources on a dp 2 × ``distribute`` job."""
    recipe = base_recipe(
        data,
        seq_len=SEQ,
        global_batch_tokens=2 * 2 * SEQ,
        micro_batch_size=1,
        distribute={"dp": 2, **distribute},
    )
    for source in recipe["sources"]:
        source["loaders"] = 1
    recipe["trainer"]["demo"]["save_batches"] = True
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    outcome = LocalJob(load_recipe(path), path.read_text(), tmp / "runs").run(lambda status: None)
    assert processes_of_launcher(os.getpid()) == []
    assert outcome.ok, outcome.message
    return outcome


@pytest.fixture(scope="module")
def hybrid(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Outcome, Outcome]:
    tmp = tmp_path_factory.mktemp("hybrid")
    full = run(data, tmp, "full", pp=2, cp=2, tp=2)
    no_tp = run(data, tmp, "no-tp", pp=2, cp=2, tp=1)
    return full, no_tp


def test_middle_pipeline_stages_get_no_token_tensors(data, tmp_path):
    outcome = run(data, tmp_path, "pp3", pp=3)
    topo = Topology(dp=2, pp=3)
    for rank, records in read_rank_logs(outcome.job.root).items():
        names = set(records[0]["tensors"])
        if topo.coords(rank).pp == 1:
            assert not names & {"input_ids", "labels", "position_ids"}
            assert {"cu_seqlens", "sample_ids"} <= names


def batches(job_root: Path, rank: int) -> list[dict[str, np.ndarray]]:
    folder = job_root / "trainer" / f"rank-{rank}"
    steps = sorted(folder.glob("step-*.npz"), key=lambda p: int(p.stem.split("-")[1]))
    return [dict(np.load(p)) for p in steps]


TOPO = Topology(dp=2, pp=2, cp=2, tp=2)


def test_tp_peers_receive_identical_tensors(hybrid):
    logs = read_rank_logs(hybrid[0].job.root)
    assert len(logs) == 16
    for rank in range(16):
        c = TOPO.coords(rank)
        if c.tp == 1:
            peer = TOPO.rank(Coords(c.dp, c.pp, c.cp, 0))
            assert [r["digest"] for r in logs[rank]] == [r["digest"] for r in logs[peer]]


def test_pipeline_stages_get_only_their_tensors(hybrid):
    logs = read_rank_logs(hybrid[0].job.root)
    for rank, records in logs.items():
        stage = TOPO.coords(rank).pp
        names = set(records[0]["tensors"])
        assert ("input_ids" in names) == (stage == 0)
        assert ("labels" in names) == (stage == 1)
        assert "cu_seqlens" in names and "sample_ids" in names


def test_cp_slices_reassemble_the_packed_sequences(hybrid):
    texts = {i: synth_table(s, seed=5).column("text").to_pylist() for i, s in enumerate(SOURCES)}
    root = hybrid[0].job.root
    for dp in range(2):
        halves = [batches(root, TOPO.rank(Coords(dp, 0, cp, 0))) for cp in range(2)]
        assert len(halves[0]) == len(halves[1]) > 0
        for left, right in zip(*halves, strict=True):
            cu = left["cu_seqlens"].astype(np.int64) * 2
            ids = unzigzag([left["input_ids"].ravel(), right["input_ids"].ravel()], cu, 2)
            pos = unzigzag([left["position_ids"].ravel(), right["position_ids"].ravel()], cu, 2)
            segments = [(a, b) for a, b in itertools.pairwise(cu) if ids[a:b].any()]
            pieces = zip(
                left["source_ids"], left["sample_ids"], left["sample_offsets"], strict=True
            )
            for (a, b), (src, sid, off) in zip(segments, pieces, strict=True):
                want = np.frombuffer(texts[int(src)][int(sid)].encode()[off : off + SEQ], np.uint8)
                assert ids[a : a + len(want)].tolist() == want.tolist()
                assert not ids[a + len(want) : b].any(), "padding to a multiple of 2·cp"
                assert pos[a:b].tolist() == list(range(b - a))


def test_every_piece_reaches_every_role_once(hybrid):
    logs = read_rank_logs(hybrid[0].job.root)
    expected = Counter()
    for i, s in enumerate(SOURCES):
        for j, text in enumerate(synth_table(s, seed=5).column("text").to_pylist()):
            for off in range(0, max(1, len(text.encode())), SEQ):
                expected[(i, j, off)] += 1
    assert any(off > 0 for _, _, off in expected), "no sample is split: the data is too short"
    for pp in range(2):
        for cp in range(2):
            for tp in range(2):
                got = Counter()
                for dp in range(2):
                    for r in logs[TOPO.rank(Coords(dp, pp, cp, tp))]:
                        got.update(
                            zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True)
                        )
                assert got == expected, (pp, cp, tp)


def test_the_constructor_holds_one_copy_whatever_the_tp_size(hybrid):
    full, no_tp = hybrid
    assert full.status is not None and no_tp.status is not None
    held_tp2, held_tp1 = full.status.constructor_step_bytes, no_tp.status.constructor_step_bytes
    assert held_tp2 == held_tp1 > 0
    logs = read_rank_logs(full.job.root)
    assert len(logs) == 2 * len(read_rank_logs(no_tp.job.root))
