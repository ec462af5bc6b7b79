"""A source's format: named in the recipe or by its path, checked with the recipe, and part of
the stream's fingerprint only where it is not Parquet (Parquet recipes keep their hash)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from msd.recipe.checks import check_recipe
from msd.recipe.schema import Recipe, Source, stream_fingerprint


def source(**fields: Any) -> Source:
    return msgspec.convert({"name": "s", "weight": 1.0, **fields}, Source)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("data/*.parquet", "parquet"),
        ("data/*", "parquet"),
        ("shards/{000..009}.tar", "webdataset"),
        ("raw/*.jsonl", "jsonl"),
        ("raw/*.JSONL.GZ", "jsonl"),
        ("raw/part-*.ndjson.zst", "jsonl"),
        ("raw/*.json", "jsonl"),
        ("hf/train/*.arrow", "arrow"),
        ("megatron/*.idx", "megatron"),
        ("megatron/corpus_text_document.bin", "megatron"),
    ],
)
def test_the_path_names_the_format(path: str, expected: str) -> None:
    assert source(path=path, text_column="t").data_format == expected


def test_a_saved_datasets_folder_is_arrow_and_a_set_format_wins(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{}")
    assert source(path=str(tmp_path), text_column="t").data_format == "arrow"
    assert source(path=str(tmp_path) + "/", text_column="t").data_format == "arrow"
    prefix = str(tmp_path / "corpus_text_document")
    assert source(path=prefix, format="megatron").data_format == "megatron"
    assert source(path="x/*.jsonl", format="parquet", text_column="t").data_format == "parquet"


def recipe(*sources: dict[str, Any]) -> Recipe:
    doc = {"seq_len": 64, "global_batch_tokens": 256, "steps": 1, "sources": list(sources)}
    return msgspec.convert(doc, Recipe)


def messages(r: Recipe) -> list[str]:
    return [f"{p.key}: {p.message}" for p in check_recipe(r)]


def test_megatron_takes_no_column_and_other_formats_no_image_column() -> None:
    ok = recipe({"name": "m", "path": "m/*.idx", "weight": 1.0})
    assert messages(ok) == []
    named = recipe({"name": "m", "path": "m/*.idx", "weight": 1.0, "text_column": "text"})
    assert messages(named) == [
        "sources[0].text_column: is not used by format megatron; Megatron .bin/.idx data is "
        "already token ids, one sample per document; remove it"
    ]
    images = recipe(
        {"name": "j", "path": "j/*.jsonl", "weight": 1.0, "text_column": "t", "image_column": "i"}
    )
    assert messages(images) == [
        "sources[0].image_column: is not read from jsonl files; images come from Parquet "
        "image columns or WebDataset shards; remove image_column"
    ]
    empty = recipe({"name": "j", "path": "j/*.jsonl", "weight": 1.0, "text_column": ""})
    assert messages(empty) == [
        "sources[0].text_column: is empty; name a key of the JSON lines (dots for nesting)"
    ]


def test_an_unknown_format_is_refused_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="format"):
        source(path="x/*.csv", format="csv", text_column="t")


def test_only_a_format_other_than_parquet_changes_the_fingerprint() -> None:
    base = {"name": "s", "weight": 1.0, "text_column": "text"}
    implicit = recipe({**base, "path": "d/*.parquet"})
    explicit = recipe({**base, "path": "d/*.parquet", "format": "parquet"})
    unnamed = recipe({**base, "path": "d/*"})
    assert stream_fingerprint(implicit) == stream_fingerprint(explicit)
    assert stream_fingerprint(implicit) == stream_fingerprint(unnamed)
    jsonl = recipe({**base, "path": "d/*", "format": "jsonl"})
    assert stream_fingerprint(jsonl) != stream_fingerprint(implicit)
