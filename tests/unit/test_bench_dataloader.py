"""The DataLoader baseline of ``benchmarks/dataloader``: disjoint reads, the mix, the tensors;
and the memory model's fit. Real Parquet files in tmp_path, no subprocess trainers."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from benchmarks.dataloader.baseline import MixedParquetStream, StreamConfig
from benchmarks.dataloader.data import Dataset, DataSpec, ensure_data
from benchmarks.dataloader.memfit import BASELINE_TERMS, fit, term_value
from benchmarks.dataloader.packing import Item, MicroBatchPacker
from msd.batch.pack import Piece, pack_rows

Batch = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    # 3 sources (web, code, books shapes), row groups of ~16 KB, 4 row groups each.
    spec = DataSpec(num_sources=3, rg_bytes=16 * 1024, source_bytes=64 * 1024)
    return ensure_data(spec, tmp_path_factory.mktemp("sources"))


def config_of(dataset: Dataset, weights: tuple[float, ...], seq_len: int = 2048) -> StreamConfig:
    paths = tuple(s.path for s in dataset.sources)
    return StreamConfig(paths, weights, seq_len=seq_len, rows=2, patience=2, seed=3)


def row_group_of(dataset: Dataset) -> list[tuple[np.ndarray, int]]:
    """Per source: the row starts of its row groups and its row count."""
    out = []
    for source in dataset.sources:
        meta = pq.ParquetFile(source.path).metadata
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        out.append((np.cumsum([0, *counts]), sum(counts)))
    return out


def read_groups(batches: list[Batch], layout: list[tuple[np.ndarray, int]]) -> set[tuple[int, ...]]:
    """(source, epoch, row group) of every sample the batches hold."""
    seen: set[tuple[int, ...]] = set()
    for batch in batches:
        ids = zip(batch["source_ids"].tolist(), batch["sample_ids"].tolist(), strict=True)
        for source, sample in ids:
            starts, rows = layout[source]
            epoch, row = divmod(sample, rows)
            group = int(np.searchsorted(starts, row, side="right")) - 1
            seen.add((source, epoch, group))
    return seen


def take(stream: object, count: int) -> list[Batch]:
    return list(itertools.islice(stream, count))  # type: ignore[call-overload]


def test_workers_of_all_ranks_read_disjoint_row_groups(dataset: Dataset) -> None:
    config = config_of(dataset, (1.0, 1.0, 1.0))
    layout = row_group_of(dataset)
    ranks, workers = 2, 2
    groups = [
        read_groups(take(MixedParquetStream(config, r, ranks).stream(w, workers), 40), layout)
        for r in range(ranks)
        for w in range(workers)
    ]
    for a, b in itertools.combinations(groups, 2):
        assert not a & b
    # Each stream went through several row groups of each source (so the check has teeth).
    assert all(len(g) > 2 * len(dataset.sources) for g in groups)


def test_dataloader_workers_split_the_row_groups(dataset: Dataset) -> None:
    stream = MixedParquetStream(config_of(dataset, (1.0, 1.0, 1.0)), rank=0, world_size=1)
    loader = DataLoader(stream, num_workers=2, batch_size=None, prefetch_factor=2)
    batches = take(iter(loader), 40)  # workers take turns: even batches from worker 0
    layout = row_group_of(dataset)
    first, second = read_groups(batches[0::2], layout), read_groups(batches[1::2], layout)
    assert first and second and not first & second


def test_sources_are_mixed_by_weight(dataset: Dataset) -> None:
    weights = (0.5, 0.3, 0.2)
    stream = MixedParquetStream(config_of(dataset, weights, seq_len=4096), 0, 1).stream(0, 1)
    counts: Counter[int] = Counter()
    for batch in take(stream, 800):
        firsts = batch["sample_offsets"] == 0  # one per sample, however it was split
        counts.update(batch["source_ids"][firsts].tolist())
    total = sum(counts.values())
    assert total > 3000
    for source, weight in enumerate(weights):
        assert abs(counts[source] / total - weight) < 0.03


def test_rows_fit_and_tensors_are_msd_s(dataset: Dataset) -> None:
    config = config_of(dataset, (1.0, 1.0, 1.0))
    expected = pack_rows([[Piece(0, 0, np.arange(3, dtype=np.int32))]], config.seq_len)
    split = False
    for batch in take(MixedParquetStream(config, 0, 1).stream(0, 1), 60):
        assert {k: v.numpy().dtype for k, v in batch.items()} == {
            k: v.dtype for k, v in expected.items()
        }
        assert tuple(batch["input_ids"].shape) == (config.rows, config.seq_len)
        lengths = np.diff(batch["cu_seqlens"].numpy())
        assert lengths.min() > 0 and lengths.max() <= config.seq_len
        assert int(batch["cu_seqlens"][-1]) == config.rows * config.seq_len
        split |= bool((batch["sample_offsets"] > 0).any())
    assert split  # books samples run past seq_len 2048 and were cut into pieces


def test_packer_fills_rows_until_samples_stop_fitting() -> None:
    lengths = [600, 500, 300, 700, 100, 900, 50, 400, 400]
    items = iter(Item(0, i, np.zeros(n, np.int32)) for i, n in enumerate(lengths))
    packer = MicroBatchPacker(rows=2, seq_len=1000, patience=2)
    rows = packer.next_rows(items)
    assert [[len(p.tokens) for p in row] for row in rows] == [[600, 300, 100], [500]]
    assert [len(i.tokens) for i in packer.carry] == [700, 900]
    again = packer.next_rows(items)  # the carried misfits open the next micro-batch
    assert [[len(p.tokens) for p in row] for row in again] == [[700, 50], [900]]


def test_memory_fit_recovers_the_terms() -> None:
    truth = {"S·R·W": 2.0, "R·W": 50.0, "S": 0.5, "R": 300.0, "intercept": 80.0}
    grid = [{"S": s, "R": r, "W": w} for s in (16, 64, 256) for r in (4, 8, 16) for w in (1, 2, 4)]
    memory = [
        sum(truth[t] * term_value(t, p) for t in BASELINE_TERMS) + truth["intercept"] for p in grid
    ]
    fitted = fit(grid, memory, BASELINE_TERMS)
    for term, value in truth.items():
        assert fitted[term] == pytest.approx(value, rel=1e-6, abs=1e-6)
    assert fitted["r2"] == pytest.approx(1.0)
    assert fitted["identifiable"] == 1.0


def test_the_data_folder_is_reused(dataset: Dataset, tmp_path: Path) -> None:
    again = ensure_data(dataset.spec, dataset.folder.parent)
    assert again == dataset
    assert all(Path(s.path).exists() for s in again.sources)
