"""The benchmark's Parquet sources as MDS shards, one folder per source (one Stream each).

Each source's ``text`` column goes, row by row in file order, into ``MDSWriter(columns={"text":
"str"}, compression="zstd:3", size_limit=shard_bytes)``: the same text, compressed as the
Parquet files are (zstd level 3), in shards of about a row group's size by default, so that a
shard download and a row-group read move about as much data. A folder is reused when its
``index.json`` exists (written last by the writer) and a marker says it came from the same
source and settings.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.dataloader.data import Dataset
from benchmarks.streaming_peer.lib import MDSWriter

COMPRESSION = "zstd:3"
MARKER = "made-from.json"


@dataclass(frozen=True)
class MdsSource:
    """One source's MDS folder and what is in it."""

    name: str
    folder: Path
    shards: int
    samples: int
    raw_bytes: int  # the shards as Streaming keeps them on local disk (decompressed)
    zip_bytes: int  # as stored, and downloaded


def convert(dataset: Dataset, root: Path, shard_bytes: int) -> list[MdsSource]:
    """Every source of ``dataset`` as MDS under ``root/<name>``."""
    out = []
    for source in dataset.sources:
        folder = root / source.name
        made_from = {
            "parquet": source.path,
            "bytes": Path(source.path).stat().st_size,
            "compression": COMPRESSION,
            "size_limit": shard_bytes,
        }
        marker = folder / MARKER
        fresh = (folder / "index.json").exists() and marker.exists()
        if not (fresh and json.loads(marker.read_text()) == made_from):
            _write(Path(source.path), folder, shard_bytes)
            marker.write_text(json.dumps(made_from))
        out.append(describe(source.name, folder))
    return out


def _write(parquet: Path, folder: Path, shard_bytes: int) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    file = pq.ParquetFile(parquet)
    with MDSWriter(
        out=str(folder),
        columns={"text": "str"},
        compression=COMPRESSION,
        size_limit=shard_bytes,
        progress_bar=False,
    ) as writer:
        for group in range(file.num_row_groups):
            for text in file.read_row_group(group, columns=["text"]).column(0).to_pylist():
                writer.write({"text": text})


def shard_sizes(index: dict[str, Any]) -> list[tuple[str, int, str | None, int]]:
    """(raw basename, raw bytes, zip basename, zip bytes) of each shard of an ``index.json``."""
    sizes: list[tuple[str, int, str | None, int]] = []
    for shard in index["shards"]:
        raw, zipped = shard["raw_data"], shard.get("zip_data")
        if zipped is None:
            sizes.append((raw["basename"], raw["bytes"], None, raw["bytes"]))
        else:
            sizes.append((raw["basename"], raw["bytes"], zipped["basename"], zipped["bytes"]))
    return sizes


def describe(name: str, folder: Path) -> MdsSource:
    index = json.loads((folder / "index.json").read_text())
    sizes = shard_sizes(index)
    return MdsSource(
        name=name,
        folder=folder,
        shards=len(sizes),
        samples=sum(int(s["samples"]) for s in index["shards"]),
        raw_bytes=sum(raw for _, raw, _, _ in sizes),
        zip_bytes=sum(z for _, _, _, z in sizes),
    )


def downloaded(local_roots: list[Path]) -> dict[str, int]:
    """What a run's Streaming cache holds: bytes on local disk, and the stored (compressed)
    bytes of the shards it downloaded (every shard present, raw or zipped, plus the index)."""
    disk = fetched = shards = 0
    for local in local_roots:
        for path in local.rglob("*"):
            if path.is_file():
                disk += path.stat().st_size
        index_path = local / "index.json"
        if not index_path.exists():
            continue
        fetched += index_path.stat().st_size
        for raw, _, zipped, zip_bytes in shard_sizes(json.loads(index_path.read_text())):
            if (local / raw).exists() or (zipped is not None and (local / zipped).exists()):
                fetched += zip_bytes
                shards += 1
    return {"local_disk_bytes": disk, "downloaded_bytes": fetched, "shards_downloaded": shards}
