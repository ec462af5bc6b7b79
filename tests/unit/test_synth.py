"""The demo data generator: determinism, exact lengths, declared distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from msd.recipe.schema import Source
from msd.sources.index import open_source
from msd.synth.text import DEFAULT_SOURCES, SynthSource, sample_lengths, synth

SMALL = (
    SynthSource("short", median_tokens=64, sigma=1.0, max_tokens=512, num_samples=3000),
    SynthSource("long", median_tokens=1500, sigma=0.5, max_tokens=4096, num_samples=1000),
)


def _read(paths: list[Path]) -> tuple[np.ndarray, list[str], np.ndarray]:
    tables = [pq.read_table(p) for p in paths]
    ids = np.concatenate([t.column("id").to_numpy() for t in tables])
    texts = [s for t in tables for s in t.column("text").to_pylist()]
    lengths = np.concatenate([pc.binary_length(t.column("text")).to_numpy() for t in tables])
    return ids, texts, lengths


def test_same_arguments_give_byte_identical_files(tmp_path: Path) -> None:
    first = synth(tmp_path / "a", SMALL, seed=7)
    second = synth(tmp_path / "b", SMALL, seed=7)
    other_seed = synth(tmp_path / "c", SMALL, seed=8)
    assert [p.relative_to(tmp_path / "a") for p in first] == [
        p.relative_to(tmp_path / "b") for p in second
    ]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(first, second, strict=True))
    assert first[0].read_bytes() != other_seed[0].read_bytes()


def test_layout_ids_and_row_groups(tmp_path: Path) -> None:
    paths = synth(tmp_path, SMALL, files_per_source=3, rows_per_row_group=100)
    assert paths == [tmp_path / s.name / f"part-{i:05d}.parquet" for s in SMALL for i in range(3)]
    for source, files in zip(SMALL, [paths[:3], paths[3:]], strict=True):
        ids, _, _ = _read(files)
        assert ids.tolist() == list(range(source.num_samples))
        meta = pq.ParquetFile(files[0]).metadata
        assert meta.row_group(0).num_rows == 100
        assert pq.read_schema(files[0]).field("text").type == "string"


def test_text_has_exactly_the_sampled_lengths(tmp_path: Path) -> None:
    paths = synth(tmp_path, SMALL, seed=3)
    for i, source in enumerate(SMALL):
        _, texts, lengths = _read(paths[2 * i : 2 * i + 2])
        assert lengths.tolist() == sample_lengths(source, seed=3).tolist()
        assert [len(t.encode()) for t in texts[:50]] == lengths[:50].tolist()
        joined = "".join(texts)
        assert set(joined) <= set("abcdefghijklmnopqrstuvwxyz ")
        assert " " in joined and all(t[0] != " " and t[-1] != " " for t in texts)


@pytest.mark.parametrize("source", [*SMALL, *DEFAULT_SOURCES], ids=lambda s: s.name)
def test_lengths_follow_the_declared_distribution(source: SynthSource) -> None:
    lengths = sample_lengths(source, seed=0)
    assert len(lengths) == source.num_samples
    assert abs(np.median(lengths) / source.median_tokens - 1) < 0.1
    assert lengths.min() >= 16 and lengths.max() <= source.max_tokens
    # Long-tailed: the mean sits well above the median.
    assert lengths.mean() > 1.05 * np.median(lengths)


def test_sources_are_independent_of_each_other(tmp_path: Path) -> None:
    alone = synth(tmp_path / "alone", SMALL[1:])
    together = synth(tmp_path / "together", SMALL)
    assert alone[0].read_bytes() == together[2].read_bytes()


def test_default_demo_set_is_tens_of_megabytes_and_indexable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = synth(tmp_path)
    size = sum(p.stat().st_size for p in paths)
    assert 20e6 <= size <= 40e6
    assert len({np.median(sample_lengths(s)) for s in DEFAULT_SOURCES}) == len(DEFAULT_SOURCES)
    monkeypatch.chdir(tmp_path)
    for i, source in enumerate(DEFAULT_SOURCES):
        recipe_source = Source(
            name=source.name, path=f"{source.name}/*.parquet", weight=1.0, text_column="text"
        )
        assert open_source(recipe_source, f"sources[{i}]").num_rows == source.num_samples


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        synth(tmp_path, SMALL, files_per_source=0)
    with pytest.raises(ValueError):
        synth(tmp_path, [SynthSource("x", 10, 1.0, 100, num_samples=0)])
