"""An image source's read-ahead is bounded by the bytes of images it holds (each image's bytes
as stored until its sample is routed, or its patches where those are fewer), not only by
tokens: a placeholder token stands for merge² patches (2.3 KB with Qwen2-VL's geometry)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from msd.plan.partition import Shard
from msd.recipe.checks import check_recipe
from msd.recipe.schema import Recipe
from msd.roles.loader.budget import shard_bytes
from msd.roles.loader.shard import SourceShard
from msd.sources.read import RowGroupReader
from msd.synth.vlm import INTERLEAVED_SOURCE, write_vlm_sources


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vlm")
    write_vlm_sources(root, samples=40, files_per_source=1, rows_per_row_group=40)
    return root


def recipe_of(root: Path, **loader: int) -> Recipe:
    doc = {
        "seq_len": 4096,
        "global_batch_tokens": 8192,
        "steps": 1,
        "sources": [
            {
                "name": "docs",
                "path": str(root / INTERLEAVED_SOURCE / "*.parquet"),
                "text_column": "text",
                "image_column": "images",
                "weight": 1.0,
            },
            {
                "name": "other",
                "path": str(root / INTERLEAVED_SOURCE / "*.parquet"),
                "text_column": "text",
                "weight": 3.0,
            },
        ],
        "loader": loader,
    }
    return msgspec.convert(doc, Recipe)


def test_the_default_is_a_global_batch_of_image_tokens_shared_by_the_mix(root: Path) -> None:
    recipe = recipe_of(root)
    per_token = 2 * 2 * 3 * 14 * 14  # merge² patches of 3·14² values
    assert recipe.loader_buffer_bytes == 8192 * per_token
    assert shard_bytes(recipe, 0, 1) == 8192 * per_token // 4  # a quarter of the mix
    assert shard_bytes(recipe, 0, 2) == 8192 * per_token // 8  # two shards split it
    assert shard_bytes(recipe_of(root, buffer_bytes=2**22), 0, 1) == 2**20


def test_a_shard_stops_reading_at_its_patch_budget_and_reads_again_when_routed(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path))
    recipe = recipe_of(root, buffer_bytes=4 * 2**20)  # 1 MiB for this source
    shard = SourceShard(recipe, Shard(0, 0), RowGroupReader(), (0, None, 1))
    assert shard.byte_budget == 2**20
    # tokens alone would let it read far more: 2 global batches, a quarter each = 4096 (a row)
    while shard.hungry:
        assert shard.read_next() is not None
    held = [p.nbytes for p in shard.pixels.values()]
    assert shard.ahead.held_bytes == sum(held) >= 2**20
    largest = max(held)
    assert shard.ahead.held_bytes < 2**20 + largest * 8  # the last chunk's images, at most
    assert shard.ahead.held_tokens < shard.budget  # the patches stopped it, not the tokens
    # routing what it holds (oldest first) lets it read again once below half
    for gpos in sorted(shard.held):
        if not shard.hungry:
            shard.forget(gpos)
    assert shard.hungry and 2 * shard.ahead.held_bytes < 2**20
    assert shard.ahead.held_bytes == sum(p.nbytes for p in shard.pixels.values())


def test_a_budget_under_a_mebibyte_is_refused_with_the_key(root: Path) -> None:
    problems = check_recipe(recipe_of(root, buffer_bytes=1000))
    assert [(p.key, p.message) for p in problems] == [
        (
            "loader.buffer_bytes",
            "must be >= 1048576, got 1000; hold at least 1 MiB of patches, or omit it for a "
            "global batch of image tokens",
        )
    ]
