"""What a shard holds per source stays bounded: a window of text (smaller for a source that
reads ahead little), its read-ahead in the narrowest integer type, and an int32 row order of
the open block; and narrowing held tokens changes no payload."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msd.plan.partition import Shard
from msd.recipe.schema import Recipe
from msd.roles.loader.chunk import packed
from msd.roles.loader.payload import token_buffer
from msd.roles.loader.shard import SourceShard
from msd.roles.loader.visit import MIN_WINDOW_BYTES, WINDOW_BYTES, window_bytes
from msd.sources.read import RowGroupReader
from msd.synth.text import SynthSource, synth
from msd.wire import compact

ROW_GROUP_ROWS = 2000  # about 2 MB of text: a realistic row group


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mem")
    source = SynthSource("code", median_tokens=1000, sigma=1.0, max_tokens=8192, num_samples=4000)
    synth(root, [source], files_per_source=1, rows_per_row_group=ROW_GROUP_ROWS)
    return root


def recipe_of(root: Path, buffer_tokens: int) -> Recipe:
    doc = {
        "seq_len": 1024,
        "global_batch_tokens": 4096,
        "steps": 1,
        "sources": [
            {
                "name": "code",
                "path": str(root / "code" / "*.parquet"),
                "text_column": "text",
                "transform": {"kind": "bytes"},
                "weight": 1.0,
            }
        ],
        "loader": {"buffer_tokens": buffer_tokens},
    }
    return msgspec.convert(doc, Recipe)


def retained(shard: SourceShard) -> dict[str, int]:
    """Bytes of the shard's own buffers: held tokens (the buffers their views keep alive), the
    window of text, the open block's per-row arrays."""
    bases = {id(t.base if t.base is not None else t): t for t in shard.held.values()}
    visit = shard.visit
    assert visit is not None
    return {
        "held": sum((t.base if t.base is not None else t).nbytes for t in bases.values()),
        "window": visit.held_bytes(),
        "rows": visit.rows.nbytes + visit.sizes.nbytes,
    }


@pytest.mark.parametrize("buffer_tokens", [16384, 1 << 20])
def test_a_reading_shard_holds_a_window_and_its_read_ahead_not_a_row_group(
    root: Path, buffer_tokens: int
) -> None:
    shard = SourceShard(recipe_of(root, buffer_tokens), Shard(0, 0), RowGroupReader(), (0, None, 1))
    assert shard.opener.window_bytes == window_bytes(buffer_tokens)
    while shard.hungry:
        assert shard.read_next() is not None
    # tokenize about half of what it holds, oldest first, and read ahead again
    for gpos in sorted(shard.held)[: len(shard.held) // 2]:
        shard.forget(gpos)
    while shard.hungry:
        assert shard.read_next() is not None
    parts = retained(shard)
    longest = 8192
    assert parts["window"] <= shard.opener.window_bytes + longest + 4 * ROW_GROUP_ROWS
    # bytes ids are held as uint8: a byte a token, and at most a chunk beyond the budget
    assert all(t.dtype == np.uint8 for t in shard.held.values())
    assert parts["held"] <= shard.budget + 64 * 1024 + longest
    assert shard.visit is not None and shard.visit.rows.dtype == np.int32
    assert parts["rows"] == 8 * len(shard.visit.rows)
    row_group_bytes = 1000 * ROW_GROUP_ROWS
    if buffer_tokens == 16384:  # one of many sources: well under a row group in all
        assert shard.opener.window_bytes == MIN_WINDOW_BYTES
        assert sum(parts.values()) < row_group_bytes / 8
    else:
        assert shard.opener.window_bytes == WINDOW_BYTES


ids = st.lists(st.lists(st.integers(-5, 2**31 - 1) | st.integers(0, 300), max_size=6), max_size=5)


@given(ids)
def test_narrowed_held_tokens_make_the_same_payload(samples: list[list[int]]) -> None:
    tokens = [np.array(s, dtype=np.int32) for s in samples]
    held = packed(tokens)
    assert [t.tolist() for t in held] == samples
    assert all(t.dtype == held[0].dtype for t in held)
    sent, before = token_buffer(held), token_buffer(tokens)
    assert sent.dtype == before.dtype and sent.tobytes() == before.tobytes()
    # as the payload did before held tokens were narrowed
    flat = np.concatenate(tokens) if tokens else np.empty(0, np.int32)
    assert before.dtype == compact.narrowed(flat).dtype


def test_held_tokens_take_the_narrowest_type() -> None:
    def dtype_of(*values: int) -> np.dtype:
        return packed([np.array(values, dtype=np.int32), np.array([], dtype=np.int32)])[0].dtype

    assert dtype_of(0, 255) == np.uint8
    assert dtype_of(0, 256) == np.uint16
    assert dtype_of(65536) == np.int32
    assert dtype_of(-1, 3) == np.int32
    assert packed([]) == []
