"""``group_rows``: a JSONL source cut into row groups of a set size, e.g. the size of Parquet
files holding the same rows (then the shuffle's blocks, and the stream, are the same)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from msd.errors import RecipeError
from msd.recipe.load import load_recipe
from msd.recipe.schema import Source
from msd.sources.index import open_source
from msd.sources.read import RowGroupReader


def source(path: Path, group_rows: int | None) -> Source:
    return Source(
        name="notes", path=str(path), weight=1.0, text_column="text", group_rows=group_rows
    )


def test_jsonl_row_groups_of_a_set_size_read_the_rows_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "notes.jsonl"
    lines = [json.dumps({"text": f"note {i}"}) for i in range(70)]
    lines.insert(10, "{broken")  # left out: the groups count kept lines
    path.write_text("\n".join(lines) + "\n")
    as_scanned = open_source(source(path, None), "sources[0]")
    assert [g.num_rows for g in as_scanned.row_groups] == [70]  # one ~1 MiB group
    index = open_source(source(path, 32), "sources[0]")
    assert [g.num_rows for g in index.row_groups] == [32, 32, 6]
    reader = RowGroupReader()
    rows = [t for rg in index.row_groups for t in reader.read(rg, "text").to_pylist()]
    assert rows == [f"note {i}" for i in range(70)]
    assert reader.read(index.row_groups[1], "text").to_pylist()[0] == "note 32"


def test_group_rows_is_refused_where_files_have_their_own_row_groups(tmp_path: Path) -> None:
    doc = {
        "seq_len": 128,
        "global_batch_tokens": 512,
        "sources": [
            {"name": "web", "path": "d/*.parquet", "text_column": "text", "weight": 1.0},
            {"name": "n", "path": "d/*.jsonl", "text_column": "t", "weight": 1.0, "group_rows": 0},
        ],
    }
    doc["sources"][0]["group_rows"] = 32
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert "sources[0].group_rows: is for JSONL and Megatron sources" in str(caught.value)
    assert "sources[1].group_rows: must be >= 1" in str(caught.value)
