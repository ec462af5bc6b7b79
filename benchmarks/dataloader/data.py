"""The benchmark's sources: S synthetic Parquet sources ``s0000, s0001, ...``, long-tail lengths.

Sources cycle through the three shapes of ``msd.synth.text.DEFAULT_SOURCES`` (log-normal lengths
with median 200, 1000 and 4000 tokens), since real mixtures differ mostly in their length
distributions. A row group holds about ``rg_bytes`` of decoded text (its row count comes from the
shape's mean length), and every source holds about ``source_bytes`` in one file, so S=1024 stays
a few GB on disk. All sources have weight 1 (an equal mix), the same for both systems.

The folder (``benchmarks/runs/dataloader-data/S{S}-rg{bytes}`` by default) is reused when its
``manifest.json`` matches; the manifest is written last, so an interrupted write is redone.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from msd.synth.text import DEFAULT_SOURCES, SynthSource, sample_lengths, synth

ROOT = Path(__file__).resolve().parents[2]
DATA_ROOT = ROOT / "benchmarks" / "runs" / "dataloader-data"
DEFAULT_RG_BYTES = 2 * 2**20
SMALL_RG_BYTES = 64 * 2**10
DEFAULT_SOURCE_BYTES = 4 * 2**20
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class DataSpec:
    """What decides the files: source count, row-group size, bytes per source, seed."""

    num_sources: int
    rg_bytes: int = DEFAULT_RG_BYTES
    source_bytes: int = DEFAULT_SOURCE_BYTES
    seed: int = 0

    @property
    def folder_name(self) -> str:
        return f"S{self.num_sources}-rg{self.rg_bytes}"


@dataclass(frozen=True)
class BenchSource:
    """One written source: its file, shape, row-group layout and mixing weight."""

    name: str
    path: str
    median_tokens: int
    sigma: float
    rows_per_row_group: int
    num_row_groups: int
    weight: float = 1.0


@dataclass(frozen=True)
class Dataset:
    """The sources of one ``DataSpec`` as written under ``folder``."""

    spec: DataSpec
    folder: Path
    sources: tuple[BenchSource, ...]

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(s.weight for s in self.sources)


@cache
def mean_tokens(shape: SynthSource) -> float:
    """Mean length of ``shape``'s clipped log-normal, from 100k draws (deterministic)."""
    return float(sample_lengths(replace(shape, num_samples=100_000), seed=12345).mean())


def shape_of(index: int) -> SynthSource:
    """Source ``index`` takes the demo shapes in turn: web, code, books, web, ..."""
    return DEFAULT_SOURCES[index % len(DEFAULT_SOURCES)]


def plan_sources(spec: DataSpec, folder: Path) -> tuple[tuple[BenchSource, SynthSource], ...]:
    """Each source's layout and the ``SynthSource`` that writes it."""
    planned = []
    num_rgs = max(1, spec.source_bytes // spec.rg_bytes)
    for i in range(spec.num_sources):
        shape = shape_of(i)
        rows = max(1, round(spec.rg_bytes / mean_tokens(shape)))
        name = f"s{i:04d}"
        synth_source = replace(shape, name=name, num_samples=rows * num_rgs)
        path = folder / name / "part-00000.parquet"
        bench = BenchSource(name, str(path), shape.median_tokens, shape.sigma, rows, num_rgs)
        planned.append((bench, synth_source))
    return tuple(planned)


def ensure_data(spec: DataSpec, root: Path = DATA_ROOT) -> Dataset:
    """The sources of ``spec`` under ``root``, written unless a matching manifest is there."""
    folder = root / spec.folder_name
    planned = plan_sources(spec, folder)
    sources = tuple(bench for bench, _ in planned)
    manifest = folder / MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()).get("spec") == asdict(spec):
        return Dataset(spec, folder, sources)
    if folder.exists():
        shutil.rmtree(folder)
    for _, synth_source in planned:
        synth(
            folder,
            [synth_source],
            seed=spec.seed,
            files_per_source=1,
            rows_per_row_group=_rows_of(sources, synth_source.name),
        )
    stats = {
        "spec": asdict(spec),
        "rg_text_bytes_mean": rg_text_bytes(sources),
        "sources": [asdict(s) for s in sources],
    }
    manifest.write_text(json.dumps(stats, indent=1))
    return Dataset(spec, folder, sources)


def _rows_of(sources: tuple[BenchSource, ...], name: str) -> int:
    return next(s.rows_per_row_group for s in sources if s.name == name)


def rg_text_bytes(sources: tuple[BenchSource, ...]) -> float:
    """Mean uncompressed size of the ``text`` column of a row group, from the footers."""
    sizes = []
    for source in sources:
        meta = pq.ParquetFile(source.path).metadata
        column = meta.schema.names.index("text")
        sizes += [
            meta.row_group(i).column(column).total_uncompressed_size
            for i in range(meta.num_row_groups)
        ]
    return float(np.mean(sizes))


def measured_rg_bytes(dataset: Dataset) -> float:
    """The mean decoded text bytes of a row group, as measured when the data was written."""
    manifest = json.loads((dataset.folder / MANIFEST).read_text())
    return float(manifest["rg_text_bytes_mean"])
