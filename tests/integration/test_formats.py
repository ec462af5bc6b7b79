"""One finite epoch from each source format (JSONL, gzip and zstd JSONL, Arrow, Megatron):
every sample exactly once, through real role processes; and the stream is the same on every run."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from msd.launch.job import Outcome
from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe
from msd.synth.text import SynthSource, synth_table
from tests.conftest import processes_of_launcher, read_rank_logs
from tests.s3.server import S3Bucket

SOURCES = (
    SynthSource("notes", median_tokens=40, sigma=0.8, max_tokens=700, num_samples=300),
    SynthSource("papers", median_tokens=120, sigma=0.8, max_tokens=700, num_samples=200),
    SynthSource("books", median_tokens=300, sigma=0.6, max_tokens=700, num_samples=120),
    SynthSource("tokens", median_tokens=200, sigma=0.6, max_tokens=700, num_samples=100),
)
SEQ_LEN = 512


def texts(source: SynthSource) -> list[str]:
    return [str(t) for t in synth_table(source, seed=3).column("text").to_pylist()]


def write_jsonl(root: Path) -> str:
    """Two gzip files and one zstd file; nested key; a malformed line and a blank one."""
    folder = root / "notes"
    folder.mkdir()
    lines = [json.dumps({"id": i, "doc": {"body": t}}) for i, t in enumerate(texts(SOURCES[0]))]
    lines.insert(50, '{"id": broken')  # left out of the index, the same on every run
    lines.insert(120, "")
    thirds = [lines[:100], lines[100:200], lines[200:]]
    for k, part in enumerate(thirds[:2]):
        with gzip.open(folder / f"part-{k}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(part) + "\n")
    zstandard = pytest.importorskip("zstandard")
    data = ("\n".join(thirds[2]) + "\n").encode()
    (folder / "part-2.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    return str(folder / "part-*")


def write_arrow(root: Path) -> str:
    """Arrow IPC streams (what datasets.save_to_disk writes), batches of 64 rows."""
    folder = root / "papers"
    folder.mkdir()
    rows = texts(SOURCES[1])
    for k, start in enumerate((0, 120)):
        table = pa.table({"text": rows[start : start + 120 if k == 0 else None]})
        path = str(folder / f"data-{k:05d}-of-00002.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=64):
                writer.write_batch(batch)
    return str(folder / "*.arrow")


def write_plain_jsonl(root: Path) -> str:
    folder = root / "books"
    folder.mkdir()
    with open(folder / "books.jsonl", "w", encoding="utf-8") as f:
        for t in texts(SOURCES[2]):
            f.write(json.dumps({"text": t}) + "\n")
    return str(folder / "books.jsonl")


def write_megatron(root: Path) -> str:
    """The documents' UTF-8 bytes as uint16 token ids, by megatron-core's own builder."""
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    torch = pytest.importorskip("torch")
    folder = root / "tokens"
    folder.mkdir()
    prefix = str(folder / "corpus_text_document")
    builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for t in texts(SOURCES[3]):
        builder.add_document(torch.tensor(list(t.encode()), dtype=torch.int64), [len(t.encode())])
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("formats")
    return {
        "notes": write_jsonl(root),
        "papers": write_arrow(root),
        "books": write_plain_jsonl(root),
        "tokens": write_megatron(root),
    }


def recipe_of(data: dict[str, str]) -> dict[str, Any]:
    columns: dict[str, dict[str, Any]] = {
        "notes": {"text_column": "doc.body", "format": "jsonl"},
        "papers": {"text_column": "text"},
        "books": {"text_column": "text"},
        "tokens": {"format": "megatron"},
    }
    return {
        "name": "formats",
        "seed": 7,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 4096,
        "distribute": {"dp": 4},
        "sources": [
            {
                "name": s.name,
                "path": data[s.name],
                "weight": w,
                "repeat": False,
                "loaders": n,
                **columns[s.name],
            }
            for s, w, n in zip(SOURCES, (0.3, 0.3, 0.2, 0.2), (2, 1, 1, 2), strict=True)
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }


def run(recipe: dict[str, Any], root: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    import yaml

    monkeypatch.setenv("MSD_CACHE_DIR", str(root / "cache"))
    root.mkdir(parents=True, exist_ok=True)
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    job = LocalJob(load_recipe(path), path.read_text(), root / "runs")
    job.start()
    outcome = job.watch(lambda status: None)
    assert processes_of_launcher(os.getpid()) == []
    return outcome


def delivered(outcome: Outcome) -> tuple[Counter[tuple[int, int]], list[list[str]]]:
    logs = read_rank_logs(outcome.job.root)
    assert sorted(logs) == [0, 1, 2, 3]
    pieces = Counter(
        (src, sid)
        for records in logs.values()
        for r in records
        for src, sid in zip(r["source_ids"], r["sample_ids"], strict=True)
    )
    return pieces, [[r["digest"] for r in logs[rank]] for rank in sorted(logs)]


@pytest.fixture(scope="module")
def local_streams(
    data: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Counter[tuple[int, int]], list[list[str]]]:
    """What the run of every format from local files delivered: pieces, per-rank digests."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        outcome = run(recipe_of(data), tmp_path_factory.mktemp("local"), monkeypatch)
    assert outcome.ok, outcome.message
    return delivered(outcome)


def test_each_format_delivers_every_sample_exactly_once(
    data: dict[str, str],
    local_streams: tuple[Counter[tuple[int, int]], list[list[str]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pieces, streams = local_streams
    expected = {
        (i, j): -(-len(t.encode()) // SEQ_LEN)
        for i, s in enumerate(SOURCES)
        for j, t in enumerate(texts(s))
    }
    assert dict(pieces) == expected
    assert {src for src, _ in pieces} == {0, 1, 2, 3}
    # The same files again, the index now from the cache: the same stream, batch for batch.
    again = run(recipe_of(data), tmp_path / "b", monkeypatch)
    assert again.ok, again.message
    assert delivered(again)[1] == streams


def test_each_format_from_s3_is_the_stream_from_local_files(
    data: dict[str, str],
    local_streams: tuple[Counter[tuple[int, int]], list[list[str]]],
    s3: S3Bucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same files in a bucket (compressed JSONL, Arrow, plain JSONL, Megatron): the same
    stream, batch for batch, so every sample exactly once."""
    root = Path(data["notes"]).parents[1]
    s3.upload(root, "formats")
    remote = {name: path.replace(str(root), s3.url("formats")) for name, path in data.items()}
    outcome = run(recipe_of(remote), tmp_path, monkeypatch)
    assert outcome.ok, outcome.message
    assert delivered(outcome) == local_streams


def test_a_planner_that_cannot_open_a_source_fails_the_launch_at_once_with_its_error(
    data: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files changed between `msd validate` and the start (here: no check at all, the job is
    started directly): the Planner's error ends the launch, with no wait for its endpoint."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{]\n")
    recipe = recipe_of(data)
    recipe["sources"][2]["path"] = str(bad)
    started = time.monotonic()
    outcome = run(recipe, tmp_path / "run", monkeypatch)
    assert not outcome.ok
    assert "planner" in outcome.message and str(bad) in outcome.message, outcome.message
    assert time.monotonic() - started < 30
