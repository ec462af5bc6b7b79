"""A job's sources are listed once (msd.launch.listing): every role and every restore reads the
files recorded then; a restore refuses a file changed or gone since, naming it."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msd.errors import CheckpointError, RecipeError
from msd.launch.listing import pin_files
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe, Source
from msd.sources.index import open_source


def write(path: Path, rows: int) -> None:
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(rows)]}), path)


def recipe_of(folder: Path) -> Recipe:
    source = Source(name="web", path=str(folder / "*.parquet"), weight=1.0, text_column="text")
    return Recipe(sources=(source,), seq_len=128, global_batch_tokens=512)


def test_a_job_reads_the_files_listed_when_it_started(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", 10)
    write(tmp_path / "b.parquet", 20)
    pinned = pin_files(recipe_of(tmp_path))
    (source,) = pinned.sources
    assert [Path(f.path).name for f in source.files] == ["a.parquet", "b.parquet"]
    assert [f.size for f in source.files] == [
        os.path.getsize(tmp_path / f"{n}.parquet") for n in "ab"
    ]
    write(tmp_path / "c.parquet", 30)  # arrives after the start: not read
    assert open_source(source, "sources[0]").num_rows == 30
    assert open_source(recipe_of(tmp_path).sources[0], "sources[0]").num_rows == 60
    # A restore carries the checkpoint's list over, unchanged files accepted.
    again = pin_files(recipe_of(tmp_path), saved=pinned)
    assert again.sources[0].files == source.files


def test_a_restore_refuses_a_file_changed_or_gone_since_by_name(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", 10)
    write(tmp_path / "b.parquet", 20)
    pinned = pin_files(recipe_of(tmp_path))
    write(tmp_path / "b.parquet", 21)
    with pytest.raises(CheckpointError, match=r"source 'web'.*b\.parquet.*changed after"):
        pin_files(recipe_of(tmp_path), saved=pinned)
    (tmp_path / "b.parquet").unlink()
    with pytest.raises(CheckpointError, match=r"b\.parquet.*is gone"):
        pin_files(recipe_of(tmp_path), saved=pinned)


def test_a_source_moved_elsewhere_is_listed_anew(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    write(tmp_path / "old" / "a.parquet", 10)
    write(tmp_path / "new" / "x.parquet", 5)
    pinned = pin_files(recipe_of(tmp_path / "old"))
    moved = pin_files(recipe_of(tmp_path / "new"), saved=pinned)
    assert [Path(f.path).name for f in moved.sources[0].files] == ["x.parquet"]


def test_a_recipe_may_not_set_the_files_msd_records(tmp_path: Path) -> None:
    write(tmp_path / "a.parquet", 10)
    pinned = pin_files(recipe_of(tmp_path))
    data = msgspec.to_builtins(pinned)
    path = tmp_path / "r.yaml"
    path.write_text(msgspec.json.encode(data).decode())  # JSON is YAML
    with pytest.raises(RecipeError, match=r"sources\[0\]\.files: is written by msd launch"):
        load_recipe(path)
